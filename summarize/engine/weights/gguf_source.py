"""Which GGUF file a `--model` names: a `.gguf` path, a folder holding one, `owner/name:QUANT`, or
`ollama:NAME[:TAG]` (a model Ollama pulled, read in its store: `ollama_store`).

`owner/name:Q4_K_M` is the convention of llama.cpp's `-hf` and ollama: the file of that
quantization in the hub repository (a name like `Qwen3.5-0.8B-Q4_K_M.gguf`, the tag matched
whole and in any case), downloaded into the standard Hugging Face cache with huggingface_hub's
progress bar, or found there offline. Vision projectors (`mmproj-*.gguf`) are never the model.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from summarize.engine.weights.gguf_file import SUFFIX
from summarize.engine.weights.ollama_store import is_ollama_name, ollama_model_file
from summarize.errors import ModelNotAvailable, SummarizeError

HUB_TAG = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+):(?P<tag>[\w.-]+)$")
SPLIT_PART = re.compile(r"-\d{5}-of-\d{5}$")  # llama.cpp's split files: name-00001-of-00003.gguf


def gguf_file_for(source: str | os.PathLike) -> Path | None:
    """The GGUF file `source` names (downloading it if it names one on the hub), or None when it
    names something else (a safetensors folder, a hub id, a `.pth`)."""
    if is_ollama_name(source):
        return ollama_model_file(source)
    path = Path(source).expanduser()
    if path.suffix.lower() == SUFFIX:
        if not path.is_file():
            raise ModelNotAvailable(f"{source}: no such GGUF file")
        return path
    if path.is_dir():
        if (path / "config.json").exists():
            return None
        return _the_one(path, sorted(path.glob("*" + SUFFIX)) + sorted(path.glob("*" + SUFFIX.upper())))
    match = HUB_TAG.match(str(source))
    if match and not path.exists():
        return _from_hub(match["repo"], match["tag"])
    return None


def _is_model(name: str) -> bool:
    return name.lower().endswith(SUFFIX) and not Path(name).name.lower().startswith("mmproj")


def _the_one(folder: Path, files: list[Path]) -> Path | None:
    models = [f for f in files if _is_model(f.name)]
    if not models:
        return None
    if len(models) > 1:
        names = ", ".join(f.name for f in models[:4]) + (", ..." if len(models) > 4 else "")
        raise SummarizeError(f"{folder}: {len(models)} GGUF files ({names}); name one with -m {folder}/FILE.gguf")
    return _not_split(models[0])


def _not_split(path: Path) -> Path:
    if SPLIT_PART.search(path.stem):
        raise SummarizeError(f"{path}: one part of a split GGUF model; merge the parts first (llama-gguf-split --merge)")
    return path


def pick_quantization(names: list[str], tag: str, repo: str) -> str:
    """The one model file among a repository's `names` whose name carries `tag` as a whole word."""
    # a whole tag: Q4_K is not Q4_K_M (tags hold underscores, so none may follow)
    pattern = re.compile(rf"(?:^|[-_.]){re.escape(tag)}(?:[-.]|$)", re.IGNORECASE)
    models = [n for n in names if _is_model(n)]
    found = [n for n in models if pattern.search(Path(n).name[: -len(SUFFIX)])]
    if not found:
        tags = sorted({Path(n).name for n in models})
        listing = f" (it has: {', '.join(tags[:8])}{', ...' if len(tags) > 8 else ''})" if tags else " (it has no GGUF files)"
        raise ModelNotAvailable(f"{repo}: no {tag} GGUF file{listing}")
    if len(found) > 1:
        whole = [n for n in found if not SPLIT_PART.search(Path(n).stem)]
        if not whole:
            raise SummarizeError(f"{repo}: its {tag} model is split into {len(found)} files; split models are not supported")
        if len(whole) > 1:
            raise SummarizeError(f"{repo}: {len(whole)} files match {tag} ({', '.join(whole[:4])}); download the one you want "
                                 "and give its path")
        found = whole
    return _not_split(Path(found[0])).as_posix()


def _from_hub(repo: str, tag: str) -> Path:
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
    try:
        from huggingface_hub import HfApi, hf_hub_download, snapshot_download

        if offline:  # the files of the cached snapshot stand in for the repository's listing
            folder = Path(snapshot_download(repo_id=repo, allow_patterns=["*" + SUFFIX]))
            names = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.suffix.lower() == SUFFIX]
        else:
            names = HfApi().list_repo_files(repo)
    except Exception as exc:  # offline and not cached, no such repo, no network: all mean "not available"
        why = "offline and not in the local cache" if offline else "its files could not be listed"
        raise ModelNotAvailable(f"model {repo}:{tag} is not available ({why})") from exc
    name = pick_quantization(names, tag, repo)
    try:
        return Path(hf_hub_download(repo_id=repo, filename=name))
    except Exception as exc:
        why = "offline and not in the local cache" if offline else "the download failed"
        raise ModelNotAvailable(f"model {repo}:{tag} ({name}) is not available ({why})") from exc
