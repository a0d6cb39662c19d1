"""End to end through the command line: what lands on stdout, stderr and the exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from summarize import files
from summarize.inputs.extract import extract_text
from summarize.inputs.words import count_words
from summarize.run import local
from summarize.summarizers.extractive_selection import extractive_summary

ROOT = Path(__file__).resolve().parents[1]
SENTENCE_END = (".", "!", "?", "…", "。", "！", "？", '"', "”", "’", ")")
FALLBACK_NOTE = "writing an extractive summary instead"

RIVERS = """Rivers shape the land they cross. Over thousands of years, flowing water carves valleys,
moves sediment and builds wide fertile plains. Early farming towns grew along their banks
because the floods left rich soil behind every spring.

Engineers later tamed many rivers with dams and levees. The dams store water for dry seasons
and turn its fall into electricity. Levees keep floods away from cities, but they also stop
the silt that once renewed the fields. Downstream deltas now shrink in many parts of the world.

Scientists measure river health in several ways. They count fish and insects, test the water
for nitrogen and metals, and track how much sediment reaches the sea. A healthy river moves
both water and sediment, and it floods from time to time.

Restoration projects try to give rivers back some room. Some old dams have been removed, and
the fish returned within a few years. Other projects reconnect floodplains so that high water
spreads out slowly instead of rushing through towns. The results suggest that working with a
river often costs less than fighting it.
"""


def run_subprocess(*args: str, input: str | bytes | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "summarize", *args], input=input, capture_output=True,
        text=isinstance(input, str) or input is None, env=env, cwd=ROOT, timeout=120,
    )


def assert_one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


def sample(pattern: str) -> Path:
    found = sorted((ROOT / "samples").glob(pattern))
    if not found:
        pytest.skip(f"samples/{pattern} not there yet")
    return found[0]


@pytest.fixture
def rivers_txt(tmp_path: Path) -> Path:
    path = tmp_path / "rivers.txt"
    path.write_text(RIVERS, encoding="utf-8")
    return path


# --- the happy paths ---------------------------------------------------------------------------


def test_sample_pdf_prints_only_the_summary(run_cli):
    pdf = sample("*.pdf")
    result = run_cli(str(pdf), "-n", "120", "--extractive")
    assert result.exit_code == 0, result.stderr
    summary = result.stdout.strip()
    assert 0 < count_words(summary) <= 120
    assert summary.endswith(SENTENCE_END)
    # stdout is exactly the summary: no notes, headers or progress mixed in
    assert result.stdout == extractive_summary(extract_text(pdf), 120).rstrip("\n") + "\n"
    assert result.stderr == ""


def test_sample_pdf_through_python_m():
    pdf = sample("*.pdf")
    proc = run_subprocess(str(pdf), "-n", "120")
    assert proc.returncode == 0, proc.stderr
    assert 0 < count_words(proc.stdout) <= 120
    assert proc.stdout.strip().endswith(SENTENCE_END)
    # the fallback is announced on stderr, never on stdout
    assert FALLBACK_NOTE in proc.stderr
    assert FALLBACK_NOTE not in proc.stdout


def test_stdin_pipe():
    txt = sample("*.txt")
    proc = run_subprocess("-", "-n", "80", input=txt.read_text(encoding="utf-8"))
    assert proc.returncode == 0, proc.stderr
    assert 0 < count_words(proc.stdout) <= 80
    assert proc.stdout.strip().endswith(SENTENCE_END)
    assert "==>" not in proc.stdout


def test_stdin_json_is_one_object(rivers_txt: Path, run_cli):
    result = run_cli("-", "-n", "80", "--json", "--extractive", input=rivers_txt.read_text())
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert {"input", "summary", "words", "method", "seconds"} <= record.keys()
    assert record["input"] == "-"
    assert record["method"] == "extractive"
    assert record["words"] == count_words(record["summary"]) <= 80
    assert record["seconds"] >= 0


def test_sample_txt_json_through_python_m():
    txt = sample("*.txt")
    proc = run_subprocess(str(txt), "--json", "-n", "80", "-q")
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    assert json.loads(line)["words"] <= 80
    assert proc.stderr == ""


def test_fallback_note_once_and_quiet_silences_it(tmp_path: Path, rivers_txt: Path, run_cli):
    other = tmp_path / "other.md"
    other.write_text(RIVERS.replace("river", "stream"), encoding="utf-8")
    result = run_cli(str(rivers_txt), str(other), "-n", "60")
    assert result.exit_code == 0
    assert result.stderr.count(FALLBACK_NOTE) == 1
    assert run_cli(str(rivers_txt), "-n", "60", "--extractive").stderr == ""
    assert run_cli(str(rivers_txt), "-n", "60", "-q").stderr == ""


def test_several_inputs_have_tail_headers(tmp_path: Path, rivers_txt: Path, run_cli):
    other = tmp_path / "other.md"
    other.write_text(RIVERS.replace("river", "canal"), encoding="utf-8")
    result = run_cli(str(rivers_txt), str(other), "-n", "50", "--extractive")
    assert result.exit_code == 0
    blocks = result.stdout.split("\n\n==> ")
    assert len(blocks) == 2
    assert blocks[0].startswith(f"==> {rivers_txt} <==\n")
    assert blocks[1].startswith(f"{other} <==\n")
    # the results table is on stderr
    assert "status" in result.stderr and str(other) in result.stderr


def test_output_file_for_one_input(tmp_path: Path, rivers_txt: Path, run_cli):
    out = tmp_path / "summary.txt"
    result = run_cli(str(rivers_txt), "-n", "50", "-o", str(out), "--extractive")
    assert result.exit_code == 0
    assert result.stdout == ""
    text = out.read_text()
    assert not text.startswith("<!--")  # plain text: no fingerprint comment
    assert 0 < count_words(text) <= 50


def test_encrypted_pdf_with_password(encrypted_pdf: Path, pdf_password: str, run_cli):
    result = run_cli(str(encrypted_pdf), "--password", pdf_password, "-n", "50", "--extractive")
    assert result.exit_code == 0, result.stderr
    assert 0 < count_words(result.stdout) <= 50
    by_env = run_cli(str(encrypted_pdf), "-n", "50", "-q", env={"SUMMARIZE_PASSWORD": pdf_password})
    assert by_env.exit_code == 0 and by_env.stdout == result.stdout
    wrong = run_cli(str(encrypted_pdf), "--password", "wrong")
    assert wrong.exit_code == 1
    assert "password" in assert_one_error_line(wrong.stderr)


def test_options_reach_the_settings(monkeypatch, rivers_txt: Path, run_cli):
    seen = {}

    def fake_run(plan, settings, **kwargs):
        seen["settings"], seen["kwargs"] = settings, kwargs
        return []

    monkeypatch.setattr(local, "run", fake_run)
    result = run_cli(
        str(rivers_txt), "-n", "42", "--strategy", "stream", "--top-p", "0.9", "--top-k", "5",
        "--temperature", "0.7", "--seed", "3", "--dtype", "bfloat16", "--force", "--json",
        env={"SUMMARIZE_MODEL": "some/model", "SUMMARIZE_PASSWORD": "pw"},
    )
    assert result.exit_code == 0, result.stderr
    s = seen["settings"]
    assert (s.words, s.model, s.strategy, s.top_p, s.top_k) == (42, "some/model", "stream", 0.9, 5)
    assert (s.temperature, s.seed, s.dtype, s.password) == (0.7, 3, "bfloat16", "pw")
    assert seen["kwargs"]["force"] and seen["kwargs"]["json_lines"]
    assert "pw" not in repr(s)


def test_help(run_cli):
    result = run_cli("--help")
    assert result.exit_code == 0
    for option in ("--words", "--model", "--output", "--strategy", "--json", "--password"):
        assert option in result.stdout


# --- failures: one line on stderr, the right exit code -------------------------------------


@pytest.fixture
def empty_txt(tmp_path: Path) -> Path:
    path = tmp_path / "empty.txt"
    path.write_text("")
    return path


@pytest.fixture
def binary_txt(tmp_path: Path) -> Path:
    path = tmp_path / "blob.txt"
    path.write_bytes(bytes(range(256)) * 64)
    return path


@pytest.fixture
def binary_unknown(tmp_path: Path) -> Path:
    path = tmp_path / "blob.bin"
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(1000))
    return path


@pytest.fixture
def missing(tmp_path: Path) -> Path:
    return tmp_path / "nope.pdf"


@pytest.mark.parametrize(
    "fixture", ["missing", "encrypted_pdf", "image_only_pdf", "truncated_pdf", "empty_txt",
                "binary_txt", "binary_unknown"])
def test_bad_input_fails_with_one_line(request, fixture: str, run_cli):
    path: Path = request.getfixturevalue(fixture)
    result = run_cli(str(path), "-n", "50")
    assert result.exit_code == 1, result.output
    line = assert_one_error_line(result.stderr)
    assert path.name in line
    assert result.stdout == ""


@pytest.mark.parametrize("fixture", ["missing", "image_only_pdf", "binary_txt"])
def test_bad_input_through_python_m(request, fixture: str):
    path: Path = request.getfixturevalue(fixture)
    proc = run_subprocess(str(path))
    assert proc.returncode == 1
    assert_one_error_line(proc.stderr)
    assert proc.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        ["-n", "0"],
        ["-n", "many"],
        ["--strategy", "bogus"],
        ["--dtype", "float8"],
        ["--top-p", "0"],
        ["--chunk-tokens", "100", "--overlap", "100"],
        ["--no-such-option"],
    ],
)
def test_usage_errors_exit_2(rivers_txt: Path, args: list[str], run_cli):
    result = run_cli(str(rivers_txt), *args)
    assert result.exit_code == 2, result.output
    assert_one_error_line(result.stderr)
    assert result.stdout == ""


def test_no_inputs_is_a_usage_error(run_cli):
    result = run_cli("-n", "10")
    assert result.exit_code == 2
    assert "INPUT" in assert_one_error_line(result.stderr)


def test_output_file_with_several_inputs_is_a_usage_error(tmp_path: Path, rivers_txt: Path, run_cli):
    out = tmp_path / "out.md"
    out.write_text("mine\n")
    result = run_cli(str(rivers_txt), str(rivers_txt.with_name("x.txt")), "-o", str(out))
    assert result.exit_code == 2
    assert_one_error_line(result.stderr)
    assert out.read_text() == "mine\n"


def test_usage_error_through_python_m(rivers_txt: Path):
    proc = run_subprocess(str(rivers_txt), "--strategy", "bogus")
    assert proc.returncode == 2
    assert_one_error_line(proc.stderr)


def test_one_missing_among_good_inputs_exits_1(tmp_path: Path, rivers_txt: Path, run_cli):
    result = run_cli(str(rivers_txt), str(tmp_path / "gone.txt"), "-n", "40", "--extractive")
    assert result.exit_code == 1
    assert result.stdout.startswith(f"==> {rivers_txt} <==\n")
    assert "gone.txt" not in result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert errors[0].startswith(f"error: {tmp_path / 'gone.txt'}: no such file")


def test_unexpected_exception_is_one_line_unless_verbose(monkeypatch, rivers_txt: Path, run_cli):
    def broken(*args, **kwargs):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(local, "extract_document", broken)
    result = run_cli(str(rivers_txt))
    assert result.exit_code == 1
    line = assert_one_error_line(result.stderr)
    assert "RuntimeError: boom" in line
    verbose = run_cli(str(rivers_txt), "--verbose")
    assert verbose.exit_code == 1
    assert "Traceback" in verbose.stderr and "second line" in verbose.stderr


def test_keyboard_interrupt_while_writing_leaves_nothing(monkeypatch, tmp_path, rivers_txt, run_cli):
    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "replace", interrupted)
    out = tmp_path / "out"
    result = run_cli(str(rivers_txt), "-o", str(out / "rivers.summary.md"), "--extractive")
    assert result.exit_code == 130
    assert_one_error_line(result.stderr)
    assert list(out.iterdir()) == []
    assert result.stdout == ""


def test_keyboard_interrupt_while_summarizing(monkeypatch, rivers_txt: Path, run_cli):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(local, "extract_document", interrupted)
    result = run_cli(str(rivers_txt))
    assert result.exit_code == 130
    assert_one_error_line(result.stderr)
