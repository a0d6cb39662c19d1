"""summarize under a memory limit, given a hostile input of each kind: one line, exit 1, and a
bounded peak resident memory (never the input's size, never a MemoryError)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ADDRESS_SPACE = 2 << 30  # bytes: the extractive path needs far less; a whole 20 GB read would not fit
PEAK_RSS = 400 << 20  # bytes: a plain run on a small file stays well under this


# The child reports its own peak (VmHWM of its own address space) when it exits: the peak that
# wait4 gives a forked child also counts the parent's memory at the fork (Linux carries the old
# address space's high-water mark across exec), and a pytest process that has run the model tests
# holds a gigabyte.
REPORTING_CHILD = """
import atexit, os, runpy, sys

def report():
    with open("/proc/self/status") as status:
        peak_kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    with open(os.environ["PEAK_RSS_FILE"], "w") as out:
        out.write(str(peak_kb * 1024))

atexit.register(report)
sys.argv[0] = "summarize"
runpy.run_module("summarize", run_name="__main__")
"""


def _limited(*args: str, stdin=subprocess.DEVNULL, cwd: Path) -> tuple[int, str, int]:
    """summarize's exit code, stderr and peak RSS in bytes, run under ADDRESS_SPACE."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))

    peak_file = cwd / "peak-rss"
    proc = subprocess.Popen([sys.executable, "-c", REPORTING_CHILD, *args], stdin=stdin, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, preexec_fn=limit, cwd=cwd,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PEAK_RSS_FILE": str(peak_file)})
    stderr = proc.stderr.read().decode()
    proc.wait()
    assert peak_file.is_file(), f"the child did not report its peak (exit {proc.returncode}): {stderr}"
    return proc.returncode, stderr, int(peak_file.read_text())


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


HOSTILE = {
    "sparse-20G.txt": lambda d: ["--extractive", str(_sparse(d / "big.txt", 20 << 30))],
    "sparse-3G.pdf": lambda d: ["--extractive", str(_sparse(d / "big.pdf", 3 << 30))],
    "dev-zero": lambda d: ["--extractive", "/dev/zero"],
    "binary-head": lambda d: ["--extractive", str((d / "x.md").write_bytes(b"\x7fELF" + bytes(4 << 20)) and d / "x.md")],
    "over-the-limit": lambda d: ["--extractive", "--max-input-size", "1M", str(_sparse(d / "a.txt", 2 << 20))],
}


@pytest.mark.parametrize("make", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_inputs_end_in_one_line_with_bounded_memory(tmp_path: Path, make):
    code, stderr, peak = _limited(*make(tmp_path), cwd=tmp_path)
    assert code == 1, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "MemoryError" not in stderr and "unexpected" not in stderr
    assert peak < PEAK_RSS, f"peak RSS {peak >> 20} MB"


def test_an_endless_pipe_ends_at_the_size_limit(tmp_path: Path):
    yes = subprocess.Popen(["yes", "All work and no play makes a dull day."], stdout=subprocess.PIPE)
    try:
        code, stderr, peak = _limited("-", "--extractive", "--max-input-size", "32M", stdin=yes.stdout, cwd=tmp_path)
    finally:
        yes.kill()
        yes.wait()
    assert code == 1 and "--max-input-size" in stderr
    assert peak < PEAK_RSS, f"peak RSS {peak >> 20} MB"
