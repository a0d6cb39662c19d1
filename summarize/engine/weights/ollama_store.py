"""The GGUF file of a model Ollama pulled, found in Ollama's own store: `ollama:NAME[:TAG]`.

The store (`OLLAMA_MODELS`, else `~/.ollama/models`; on Linux also `/usr/share/ollama/.ollama/models`,
the home of the `ollama` user the install script's service runs as) holds one manifest per model at
`manifests/<host>/<namespace>/<model>/<tag>`: JSON in the OCI image layout (schemaVersion 2, `layers`
each with a `mediaType`, a `digest` `sha256:<hex>` and a `size`), and the layers' files at
`blobs/sha256-<hex>` (`sha256:<hex>` before Ollama 0.1.x). The layer of media type
`application/vnd.ollama.image.model` is the GGUF file. A name is filled in as Ollama fills it:
host `registry.ollama.ai`, namespace `library`, tag `latest`.

The blob is checked against the manifest's size, not its sha256: hashing gigabytes would cost as
much as reading them, and a file of the right size that is no GGUF is still a one-line error when
it is opened.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from summarize.errors import ModelNotAvailable, SummarizeError

PREFIX = "ollama:"
DEFAULT_HOST, DEFAULT_NAMESPACE, DEFAULT_TAG = "registry.ollama.ai", "library", "latest"
MODEL_LAYER = "application/vnd.ollama.image.model"
SERVICE_STORE = Path("/usr/share/ollama/.ollama/models")  # Linux: the service user's home
DIGEST = re.compile(r"sha256:(?P<hex>[0-9a-f]{64})")
# [HOST/][NAMESPACE/]MODEL[:TAG]; parts of letters, digits, _ . - (a namespace has no dot), as Ollama's
NAME = re.compile(r"(?:(?:(?P<host>[\w.-]+)/)?(?P<namespace>[\w-]+)/)?(?P<model>[\w.-]+)(?::(?P<tag>[\w.-]+))?", re.ASCII)


@dataclass(frozen=True)
class OllamaName:
    host: str
    namespace: str
    model: str
    tag: str
    given: str  # as the user wrote it, after the prefix: what `ollama pull` takes

    def manifest_parts(self) -> tuple[str, str, str, str]:
        return self.host, self.namespace, self.model, self.tag


def is_ollama_name(source: str | os.PathLike) -> bool:
    return isinstance(source, str) and source.startswith(PREFIX)


def parse_name(source: str) -> OllamaName:
    given = source.removeprefix(PREFIX)
    match = NAME.fullmatch(given)
    if match is None or ".." in given:  # `..` would climb out of the store
        raise SummarizeError(f"{source}: not an Ollama model name (ollama:[HOST/][NAMESPACE/]NAME[:TAG])")
    return OllamaName(match["host"] or DEFAULT_HOST, match["namespace"] or DEFAULT_NAMESPACE, match["model"],
                      match["tag"] or DEFAULT_TAG, given)


def store_folders() -> list[Path]:
    """Where Ollama keeps its models: OLLAMA_MODELS alone where set (trimmed of spaces and quotes,
    as Ollama trims it), else the user's folder and, on Linux, the system service's."""
    named = _named_store()
    if named:
        return [Path(named).expanduser()]
    user = Path.home() / ".ollama" / "models"
    return [user, SERVICE_STORE] if sys.platform.startswith("linux") else [user]


def _named_store() -> str:
    return os.environ.get("OLLAMA_MODELS", "").strip().strip("\"'")


def ollama_model_file(source: str) -> Path:
    """The GGUF blob of the model `source` (`ollama:NAME[:TAG]`) names; a one-line error when the
    store, the manifest or the blob is missing (ModelNotAvailable) or the manifest is unusable."""
    name = parse_name(source)
    folders = store_folders()
    stores = [folder for folder in folders if folder.is_dir()]
    pull = f"`ollama pull {name.given}` would fetch it"
    if not stores:
        where = " nor ".join(str(folder) for folder in folders)
        hint = " (OLLAMA_MODELS)" if _named_store() else " (set OLLAMA_MODELS to name another)"
        raise ModelNotAvailable(f"{source}: no Ollama models folder at {where}{hint}; {pull}")
    for store in stores:
        manifest = _manifest(store, name)
        if manifest is not None:
            return _model_blob(store, manifest, name, source)
    raise ModelNotAvailable(f"{source} not found in {' or '.join(str(store) for store in stores)}; {pull}")


def _manifest(store: Path, name: OllamaName) -> Path | None:
    # as written; older Ollama versions wrote every name lowercased
    for parts in (name.manifest_parts(), tuple(part.lower() for part in name.manifest_parts())):
        path = store.joinpath("manifests", *parts)
        if path.is_file():
            return path
    return None


def _model_blob(store: Path, manifest_path: Path, name: OllamaName, source: str) -> Path:
    try:
        manifest = json.loads(manifest_path.read_bytes())
    except OSError as exc:
        raise SummarizeError(f"{source}: its manifest {manifest_path} cannot be read ({exc.strerror or exc})") from None
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deep
        raise SummarizeError(f"{source}: its manifest {manifest_path} is not an Ollama manifest (not valid JSON)") from None
    layers = manifest.get("layers") if isinstance(manifest, dict) else None
    if not isinstance(layers, list):
        raise SummarizeError(f"{source}: its manifest {manifest_path} is not an Ollama manifest (no list of layers)")
    models = [layer for layer in layers if isinstance(layer, dict) and layer.get("mediaType") == MODEL_LAYER]
    if not models:
        raise SummarizeError(f"{source}: its manifest {manifest_path} has no GGUF model layer ({MODEL_LAYER})")
    if len(models) > 1:
        raise SummarizeError(f"{source}: its model is split into {len(models)} GGUF files; split models are not supported")
    layer = models[0]
    digest = DIGEST.fullmatch(str(layer.get("digest")))
    if digest is None:
        raise SummarizeError(f"{source}: its manifest {manifest_path} gives the model layer's digest as "
                             f"{layer.get('digest')!r}, not sha256:<64 hex digits>")
    blobs = [store / "blobs" / f"sha256-{digest['hex']}", store / "blobs" / f"sha256:{digest['hex']}"]
    blob = next((path for path in blobs if path.is_file()), None)
    if blob is None:
        raise ModelNotAvailable(f"{source}: its model file {blobs[0]} is missing; `ollama pull {name.given}` would fetch it again")
    size, found = layer.get("size"), blob.stat().st_size
    if type(size) is int and found != size:
        raise SummarizeError(f"{source}: its model file {blob} has {found:,} bytes where its manifest says {size:,} "
                             f"(incomplete or corrupt); `ollama pull {name.given}` would fetch it again")
    return blob
