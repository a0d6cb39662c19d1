"""llama.cpp's own converter (`convert_hf_to_gguf.py` and its gguf-py), for tests that read GGUF files.

It ships inside the `llama-cpp-python` source package on PyPI (`vendor/llama.cpp`). The package is
found in `SUMMARIZE_LLAMA_CPP_SDIST` (a path to the .tar.gz) or in the test cache, else fetched
once with `pip download`; the converter's files are unpacked into the cache. Converted files are
cached too, keyed by the checkpoint's bytes, the converter's version and the arguments, so a second
run converts nothing. When the package cannot be had, the tests that need it are skipped, saying why.

`llama-quantize` (K-quants such as Q4_K_M have no Python quantizer) is used where a built one is
named by `SUMMARIZE_LLAMA_QUANTIZE` or found on PATH; see reference/benchmarks.md for building it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

VERSION = "0.3.36"  # the newest llama-cpp-python here; its llama.cpp converts qwen35, qwen35moe and rwkv7
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "summarize-tests"
PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "models/templates/")
CONVERT_TIMEOUT_S = 600


def converter() -> Path:
    """The folder holding `convert_hf_to_gguf.py` (with `conversion/` and `gguf-py/` beside it)."""
    folder = CACHE / f"llama.cpp-{VERSION}"
    if (folder / "convert_hf_to_gguf.py").is_file():
        return folder
    archive = _sdist()
    prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
    scratch = folder.with_name(folder.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name.startswith(prefix)
                   and m.name[len(prefix):].startswith(PARTS)]
        for member in members:
            member.name = member.name[len(prefix):]
            tar.extract(member, scratch, filter="data")
    scratch.rename(folder)
    return folder


_unavailable: list[str] = []  # why the package could not be had: said once, not fetched again per test


def _sdist() -> Path:
    named = os.environ.get("SUMMARIZE_LLAMA_CPP_SDIST")
    if named:
        return Path(named)
    cached = CACHE / SDIST
    if cached.is_file():
        return cached
    if not _unavailable:
        CACHE.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", f"llama-cpp-python=={VERSION}",
             "-d", str(CACHE)], capture_output=True, text=True, timeout=900,
        )
        if proc.returncode == 0 and cached.is_file():
            return cached
        _unavailable.append(next(iter(proc.stderr.strip().splitlines()[-1:]), "no output"))
    pytest.skip(f"llama.cpp's converter is not available: pip download llama-cpp-python=={VERSION} failed ({_unavailable[0]}); "
                "set SUMMARIZE_LLAMA_CPP_SDIST to the source package")


def convert(checkpoint: Path, outtype: str, *extra: str) -> Path:
    """`convert_hf_to_gguf.py checkpoint --outtype outtype *extra`, cached; the GGUF file's path."""
    script = converter()
    digest = hashlib.sha256(f"{VERSION} {outtype} {' '.join(extra)}".encode())
    for path in sorted(checkpoint.iterdir()):
        digest.update(path.name.encode())
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    out = CACHE / "converted" / f"{checkpoint.name}-{outtype}-{digest.hexdigest()[:16]}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    proc = subprocess.run(
        [sys.executable, str(script / "convert_hf_to_gguf.py"), str(checkpoint), "--outtype", outtype, "--outfile", str(partial),
         *extra], capture_output=True, text=True, timeout=CONVERT_TIMEOUT_S, cwd=script,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    if proc.returncode != 0:
        raise AssertionError(f"llama.cpp's converter failed on {checkpoint}:\n{proc.stderr[-3000:]}")
    partial.rename(out)
    return out


def quantize_tool() -> Path | None:
    named = os.environ.get("SUMMARIZE_LLAMA_QUANTIZE")
    found = Path(named) if named else shutil.which("llama-quantize")
    return Path(found) if found else None


def quantize(source: Path, kind: str) -> Path:
    """`llama-quantize source kind` (e.g. Q4_K_M), cached beside the source; skips without the tool."""
    tool = quantize_tool()
    if tool is None:
        pytest.skip("llama-quantize is not built here (set SUMMARIZE_LLAMA_QUANTIZE; reference/benchmarks.md says how)")
    out = source.with_name(f"{source.stem}-{kind}.gguf")
    if not out.is_file():
        partial = out.with_suffix(".partial")
        proc = subprocess.run([str(tool), str(source), str(partial), kind, "1"], capture_output=True, text=True,
                              timeout=CONVERT_TIMEOUT_S)
        if proc.returncode != 0:
            raise AssertionError(f"llama-quantize failed:\n{proc.stderr[-3000:]}")
        partial.rename(out)
    return out
