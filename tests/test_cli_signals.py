"""The process's surroundings, in a real child process: SIGTERM cleans up as Ctrl-C does (no
temporary file is left, exit 143); a closed stdout is one line, not a crash."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT = ("Bees visit flowers to collect nectar and pollen. Pollen sticks to their bodies and travels "
        "to the next flower. Many crops depend on this service for a good harvest.\n")

# The CLI in a child whose writes stall at fsync (after touching `ready`), so that the signal
# lands while a temporary file exists.
STALLING_CHILD = """
import os, sys, time
from pathlib import Path
from summarize import cli

ready = Path(sys.argv[1])

def stalled_fsync(fd):
    ready.touch()
    time.sleep(120)

os.fsync = stalled_fsync
sys.argv = ["summarize", *sys.argv[2:]]
cli.main()
"""


def child_env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "HF_HUB_OFFLINE": "1"}


def wait_for(path: Path, proc: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the child never reached the write: {proc.communicate()}")
        time.sleep(0.05)


def test_sigterm_while_writing_leaves_no_temporary_file_and_exits_143(tmp_path: Path):
    source, out, ready = tmp_path / "a.txt", tmp_path / "out", tmp_path / "ready"
    source.write_text(TEXT)
    proc = subprocess.Popen(
        [sys.executable, "-c", STALLING_CHILD, str(ready), str(source), "-o", str(out / "a.summary.md"),
         "--extractive"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=ROOT)
    wait_for(ready, proc)
    assert [p.name for p in out.iterdir()][0].startswith("a.summary.md.tmp")  # caught mid-write
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    assert stderr.strip().splitlines() == ["error: terminated"]
    assert list(out.iterdir()) == []
    assert stdout == ""


def run_with_stdout_closed(*args: str) -> subprocess.CompletedProcess:
    # `>&-` in the shell: the child starts with file descriptor 1 closed (sys.stdout is None)
    command = '"$0" -m summarize "$@" >&-'
    return subprocess.run(["sh", "-c", command, sys.executable, *args], capture_output=True, text=True,
                          env=child_env(), cwd=ROOT, timeout=120)


def test_a_closed_stdout_is_one_line_unless_the_summaries_go_to_files(tmp_path: Path):
    source = tmp_path / "a.txt"
    source.write_text(TEXT)
    proc = run_with_stdout_closed(str(source), "--extractive", "-n", "40")
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: standard output is closed")

    to_file = run_with_stdout_closed(str(source), "--extractive", "-n", "40", "-o", str(tmp_path / "a.summary.md"))
    assert to_file.returncode == 0, to_file.stderr
    assert (tmp_path / "a.summary.md").is_file()
