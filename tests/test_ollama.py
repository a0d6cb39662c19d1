"""`-m ollama:NAME[:TAG]`: a model Ollama pulled, read from a store laid out as Ollama lays it out
(manifests/<host>/<namespace>/<model>/<tag> and blobs/sha256-<hex>) around a GGUF file made by
llama.cpp's converter (test_gguf's RWKV-7 checkpoint: it needs no tokenizer file beside it)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from summarize.engine import ModelNotAvailable, load_model, load_tokenizer
from summarize.engine.weights import ollama_store
from summarize.engine.weights.ollama_store import MODEL_LAYER, ollama_model_file, store_folders
from summarize.errors import SummarizeError
from test_gguf import rwkv  # noqa: F401 (the fixture: llama.cpp's converter run on a tiny RWKV-7 checkpoint)

DOCUMENT = "The harbour froze in January. Ships waited a month at sea. Trade fell by half that winter.\n"


@pytest.fixture(scope="module")
def gguf_file(rwkv) -> tuple[Path, str]:  # noqa: F811 (the fixture imported above)
    path = rwkv[1].gguf("q8_0")
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def make_store(root: Path, gguf_file: tuple[Path, str], *, manifest: dict | str | None = None,
               where: tuple[str, ...] = ("registry.ollama.ai", "library", "tiny", "latest"), blob_name: str | None = None) -> Path:
    """An Ollama models folder holding one model: its manifest at `where` and its GGUF blob."""
    path, digest = gguf_file
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / (blob_name or f"sha256-{digest}")).symlink_to(path)
    if manifest is None:
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                    "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                               "digest": "sha256:" + "0" * 64, "size": 2},
                    "layers": [{"mediaType": MODEL_LAYER, "digest": f"sha256:{digest}", "size": path.stat().st_size},
                               {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "1" * 64, "size": 9}]}
    folder = root.joinpath("manifests", *where[:-1])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / where[-1]).write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    return root


def logits(source) -> torch.Tensor:
    model = load_model(source, device="cpu", dtype=torch.float32, compile=False)
    tokenizer, _ = load_tokenizer(model)
    ids = torch.tensor([tokenizer.encode(DOCUMENT)])
    return model.forward(ids, model.new_state(1))


# -- what loads ----------------------------------------------------------------------------------------


def test_an_ollama_model_computes_what_its_gguf_file_computes(gguf_file, tmp_path, monkeypatch):
    monkeypatch.setenv("OLLAMA_MODELS", str(make_store(tmp_path / "models", gguf_file)))
    want = logits(gguf_file[0])
    for name in ("ollama:tiny:latest", "ollama:tiny", "ollama:library/tiny", "ollama:registry.ollama.ai/library/tiny:latest"):
        assert torch.equal(logits(name), want), name


def test_names_with_another_host_namespace_or_tag(gguf_file, tmp_path, monkeypatch):
    store = make_store(tmp_path / "models", gguf_file, where=("registry.ollama.ai", "library", "qwen3.5", "0.8b"))
    make_store(store, gguf_file, where=("registry.ollama.ai", "someone", "tiny", "q8"), blob_name="unused")
    make_store(store, gguf_file, where=("hf.co", "someone", "Tiny-GGUF", "Q8_0"), blob_name="unused2")
    monkeypatch.setenv("OLLAMA_MODELS", f' "{store}" ')  # trimmed of spaces and quotes, as Ollama trims it
    blob = store / "blobs" / f"sha256-{gguf_file[1]}"
    for name in ("ollama:qwen3.5:0.8b", "ollama:someone/tiny:q8", "ollama:hf.co/someone/Tiny-GGUF:Q8_0"):
        assert ollama_model_file(name) == blob, name


def test_the_layouts_of_older_ollama_versions(gguf_file, tmp_path, monkeypatch):
    """Blobs named sha256:<hex>, and names written lowercased."""
    store = make_store(tmp_path / "models", gguf_file, blob_name=f"sha256:{gguf_file[1]}")
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    assert ollama_model_file("ollama:Tiny:Latest") == store / "blobs" / f"sha256:{gguf_file[1]}"


def test_the_cli_summarizes_with_an_ollama_model_as_with_its_file(gguf_file, tmp_path, run_cli):
    store = make_store(tmp_path / "models", gguf_file)
    document = tmp_path / "doc.txt"
    document.write_text(DOCUMENT)
    env = {"NO_COLOR": "1", "OLLAMA_MODELS": str(store)}
    common = [str(document), "-n", "20", "--temperature", "0", "--no-cache", "--json"]
    by_name = run_cli(*common, "-m", "ollama:tiny:latest", env=env)
    by_file = run_cli(*common, "-m", str(gguf_file[0]), env=env)
    assert by_name.exit_code == by_file.exit_code == 0, by_name.stderr
    assert "model ollama:tiny:latest on cpu" in by_name.stderr

    def record(result) -> dict:  # what was read and written, not how long it took
        return {k: v for k, v in json.loads(result.stdout).items() if k not in ("seconds", "phase_seconds")}

    assert record(by_name) == record(by_file) and record(by_name)["tokens_out"] > 0
    pulled = run_cli("--pull", "-m", "ollama:tiny", env=env)
    assert pulled.exit_code == 0 and f"sha256-{gguf_file[1]}" in pulled.stderr, pulled.stderr


# -- where the store is --------------------------------------------------------------------------------


@pytest.mark.parametrize("platform, service", [("linux", True), ("darwin", False), ("win32", False)])
def test_the_default_folder_by_platform(tmp_path, monkeypatch, platform, service):
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("USERPROFILE", str(tmp_path))
    monkeypatch.setattr(ollama_store.sys, "platform", platform)
    user = Path.home() / ".ollama" / "models"
    assert store_folders() == ([user, ollama_store.SERVICE_STORE] if service else [user])


def test_on_linux_the_user_folder_then_the_service_folder(gguf_file, tmp_path, monkeypatch):
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(ollama_store.sys, "platform", "linux")
    service = make_store(tmp_path / "usr-share-ollama" / ".ollama" / "models", gguf_file)
    monkeypatch.setattr(ollama_store, "SERVICE_STORE", service)
    assert ollama_model_file("ollama:tiny") == service / "blobs" / f"sha256-{gguf_file[1]}"
    user = make_store(tmp_path / "home" / ".ollama" / "models", gguf_file)
    assert ollama_model_file("ollama:tiny") == user / "blobs" / f"sha256-{gguf_file[1]}"
    with pytest.raises(ModelNotAvailable, match=f"ollama:other not found in {user} or {service}; "
                                                "`ollama pull other` would fetch it"):
        ollama_model_file("ollama:other")


# -- what cannot be had, each one line and, from the CLI, exit 2 before any work -----------------------


def check_refused(run_cli, tmp_path, store: Path, name: str, message: str, kind=SummarizeError) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OLLAMA_MODELS", str(store))
        with pytest.raises(kind, match=message):
            load_model(name, device="cpu", compile=False)
    document = tmp_path / "doc.txt"
    document.write_text(DOCUMENT)
    result = run_cli(str(document), "-m", name, env={"NO_COLOR": "1", "OLLAMA_MODELS": str(store)})
    assert result.exit_code == 2, result.stderr
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error: Invalid value for '-m': ") and name in result.stderr


@pytest.mark.parametrize("name, pull", [("ollama:other", "other"), ("ollama:tiny:7b", "tiny:7b"),
                                        ("ollama:someone/tiny", "someone/tiny"),
                                        ("ollama:example.com/library/tiny:latest", "example.com/library/tiny:latest")])
def test_a_model_not_pulled(gguf_file, tmp_path, run_cli, name, pull):
    store = make_store(tmp_path / "models", gguf_file)
    check_refused(run_cli, tmp_path, store, name, f"^{name} not found in {store}; `ollama pull {pull}` would fetch it$",
                  ModelNotAvailable)


def test_no_store(tmp_path, run_cli):
    check_refused(run_cli, tmp_path, tmp_path / "nowhere", "ollama:qwen3.5:0.8b",
                  f"no Ollama models folder at {tmp_path / 'nowhere'} .*`ollama pull qwen3.5:0.8b` would fetch it",
                  ModelNotAvailable)


def test_a_missing_blob(gguf_file, tmp_path, run_cli):
    store = make_store(tmp_path / "models", gguf_file)
    (store / "blobs" / f"sha256-{gguf_file[1]}").unlink()
    check_refused(run_cli, tmp_path, store, "ollama:tiny", f"sha256-{gguf_file[1]} is missing; `ollama pull tiny`",
                  ModelNotAvailable)


def test_a_blob_of_another_size(gguf_file, tmp_path, run_cli):
    store = make_store(tmp_path / "models", gguf_file)
    blob = store / "blobs" / f"sha256-{gguf_file[1]}"
    blob.unlink()
    blob.write_bytes(b"GGUF cut short")
    check_refused(run_cli, tmp_path, store, "ollama:tiny", "has 14 bytes where its manifest says .*incomplete or corrupt")


MODEL = {"mediaType": MODEL_LAYER, "digest": "sha256:" + "a" * 64, "size": 1}


@pytest.mark.parametrize("manifest, message", [
    ("{not json", "not an Ollama manifest \\(not valid JSON\\)"),
    ("[1, 2]", "not an Ollama manifest \\(no list of layers\\)"),
    ({"schemaVersion": 2, "layers": {"a": 1}}, "not an Ollama manifest \\(no list of layers\\)"),
    ({"schemaVersion": 2, "layers": [{"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "1" * 64}]},
     "has no GGUF model layer"),
    ({"schemaVersion": 2, "layers": [MODEL | {"digest": "md5:abc"}]}, "digest as 'md5:abc', not sha256:<64 hex digits>"),
    ({"schemaVersion": 2, "layers": [MODEL, MODEL | {"digest": "sha256:" + "b" * 64}]}, "split into 2 GGUF files"),
])
def test_a_manifest_that_names_no_model_file(gguf_file, tmp_path, run_cli, manifest, message):
    store = make_store(tmp_path / "models", gguf_file, manifest=manifest)
    check_refused(run_cli, tmp_path, store, "ollama:tiny", message)


@pytest.mark.parametrize("name", ["ollama:", "ollama:../../etc/passwd", "ollama:a/b/c/d", "ollama:tiny:7b:x", "ollama:na me"])
def test_what_is_no_ollama_name(tmp_path, run_cli, name):
    check_refused(run_cli, tmp_path, tmp_path, name, "not an Ollama model name")
