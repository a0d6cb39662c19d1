"""--diagnostics-file: a path that cannot work is a usage error before any work (its folder must
exist and be writable; it must be no input or output of the run), and a file that fails while
being written is named once and costs no summary."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from summarize.inputs.words import count_words

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
TEXT = ("Bees visit flowers to collect nectar and pollen. Pollen sticks to their bodies and travels "
        "to the next flower. Many crops depend on this service for a good harvest.\n")


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "a.txt"
    path.write_text(TEXT)
    return path


def unusable(tmp_path: Path, source: Path) -> dict[str, tuple[str, list[str]]]:
    """name: (the --diagnostics-file, more arguments)."""
    return {
        "missing folder": (str(tmp_path / "gone" / "d.jsonl"), []),
        "an input": (str(source), []),
        "an input, spelled otherwise": (str(tmp_path / "." / "a.txt"), []),
        "the output": (str(tmp_path / "a.summary.md"), ["-o", str(tmp_path / "a.summary.md")]),
    }


@pytest.mark.parametrize("case", ["missing folder", "an input", "an input, spelled otherwise", "the output"])
def test_an_unusable_diagnostics_file_is_a_usage_error_before_any_work(tmp_path: Path, source: Path, case: str, run_cli):
    path, more = unusable(tmp_path, source)[case]
    result = run_cli(str(source), "--diagnostics-file", path, *more)  # asks for a model: none is loaded
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: --diagnostics-file ")
    assert source.read_text() == TEXT
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]
    assert result.stdout == ""


def test_a_diagnostics_file_that_fills_up_is_named_once_and_costs_no_summary(tmp_path: Path):
    from tiny_models import tiny_released_layout

    model = tiny_released_layout(tmp_path / "tiny")
    pdf = sorted(SAMPLES.glob("*.pdf"))[0]
    proc = subprocess.run(
        [sys.executable, "-m", "summarize", str(pdf), "-m", str(model), "-n", "40", "--dtype", "float32",
         "--chunk-tokens", "2000", "--diagnostics-file", "/dev/full"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    assert 0 < count_words(proc.stdout) <= 40
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: /dev/full: No space left on device; no more diagnostics are written"]
