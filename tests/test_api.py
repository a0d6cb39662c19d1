"""The Python API: the CLI's settings as keyword arguments, the same defaults, the same summaries,
and a `Summarizer` that loads its model once for many calls."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import summarize
from summarize import SummarizeError, Summarizer, Summary, summarize_file, summarize_text
from tiny_models import tiny_released_layout

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
PDF = SAMPLES / "target-tier-policy.pdf"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "summarize", *args], capture_output=True, text=True, timeout=300)


def test_a_file_summary_is_the_one_the_cli_prints():
    summary = summarize_file(PDF, words=60, extractive=True)
    assert isinstance(summary, Summary) and summary.method == "extractive" and summary.words <= 60
    assert summary.text + "\n" == cli(str(PDF), "-n", "60", "--extractive").stdout


def test_the_defaults_are_the_clis():
    text = (SAMPLES / "target-tier-policy.txt").read_text()
    summary = summarize_text(text, extractive=True)
    proc = subprocess.run([sys.executable, "-m", "summarize", "-", "--extractive"], input=text,
                          capture_output=True, text=True, timeout=300)
    assert summary.text + "\n" == proc.stdout


def test_a_summarizer_loads_its_model_once_for_many_calls(tmp_path, monkeypatch):
    import summarize.summarizers.session as session

    folder = tiny_released_layout(tmp_path / "tiny")
    loads = []
    real = session.load_session
    monkeypatch.setattr(session, "load_session", lambda *args: loads.append(1) or real(*args))
    text = (SAMPLES / "target-tier-policy.txt").read_text()[:3000]
    with Summarizer(model=str(folder), words=30, temperature=0, chunk_tokens=512) as summarizer:
        first = summarizer.summarize_text(text, name="a")
        second = summarizer.summarize_text(text, name="b")
    assert loads == [1]
    assert first.text == second.text and first.words <= 30  # greedy: the same text twice


def test_notes_reach_notify_and_failures_raise_one_line():
    notes: list[str] = []
    summary = summarize_text("One sentence here. Another sentence here.", model="/no/such/model", notify=notes.append)
    assert summary.method == "extractive"
    assert notes == ["/no/such/model: no such model folder, and not a hub id (owner/name); writing an extractive summary instead"]
    with pytest.raises(SummarizeError, match="unknown setting"):
        Summarizer(wrods=3)
    with pytest.raises(SummarizeError, match="no text to summarize"):
        summarize_text("  \n")
    with pytest.raises(SummarizeError):
        summarize_file("/no/such/file.pdf", extractive=True)


def test_the_package_says_its_version():
    assert cli("--version").stdout == f"summarize {summarize.__version__}\n"
