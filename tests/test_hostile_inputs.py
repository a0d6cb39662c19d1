"""Hostile inputs, outputs and options: nothing a user has is lost, nothing grows without bound,
and every refusal is one line with the documented exit code."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from summarize import cli
from summarize.run.output import HEADER

TEXT = ("Bees visit flowers to collect nectar and pollen. Pollen sticks to their bodies and travels "
        "to the next flower. Many crops depend on this service for a good harvest. Rivers carry water "
        "from the hills to the sea, and towns grew beside them for trade and for fields.\n")


def invoke(*args: str, **kwargs):
    return CliRunner().invoke(cli.app, list(args), **kwargs)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


# --- 1. only a file summarize wrote is replaced ----------------------------------------------

FOREIGN = {
    "notes": "my own notes, not a summary\n",
    "markdown": "# Title\n\nSome text.\n",
    "almost-a-header": "<!-- summarize by hand -->\nmine\n",
    "binary": "\x00\x01\x02 not text",
}


@pytest.fixture
def tree(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in ("a.txt", "b.md", "sub/c.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(TEXT)
    return tmp_path


@pytest.mark.parametrize("content", FOREIGN.values(), ids=FOREIGN.keys())
@pytest.mark.parametrize("victim", ["a.summary.md", "sub/c.summary.md"])
def test_a_foreign_output_in_the_output_folder_is_kept_and_the_rest_goes_on(tree: Path, victim: str,
                                                                              content: str):
    (tree / victim).write_text(content)
    result = invoke(".", "-o", ".", "--extractive", "-n", "20")
    assert result.exit_code == 1, result.output
    (line,) = error_lines(result.stderr)
    assert victim in line and "--force" in line
    assert (tree / victim).read_text() == content
    others = {"a.summary.md", "b.summary.md", "sub/c.summary.md"} - {victim}
    for name in others:
        assert (tree / name).read_text().startswith("<!-- summarize ")


@pytest.mark.parametrize("name", ["out.md", "notes.markdown", "deep/x.summary.md"])
def test_an_explicit_output_file_summarize_did_not_write_is_kept(tree: Path, name: str):
    (tree / name).parent.mkdir(parents=True, exist_ok=True)
    (tree / name).write_text("keep me\n")
    result = invoke("a.txt", "-o", name, "--extractive", "-n", "20")
    assert result.exit_code == 1, result.output
    assert name in error_lines(result.stderr)[0]
    assert (tree / name).read_text() == "keep me\n"
    forced = invoke("a.txt", "-o", name, "--extractive", "-n", "20", "--force")
    assert forced.exit_code == 0, forced.output
    assert (tree / name).read_text().startswith("<!-- summarize ")


@pytest.mark.parametrize("make", ["dangling-link", "fifo", "folder"])
def test_an_output_that_is_not_a_file_is_refused(tree: Path, make: str):
    target = tree / "a.summary.md"
    if make == "dangling-link":
        os.symlink(tree / "nowhere" / "x.md", target)
    elif make == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    result = invoke("a.txt", "b.md", "-o", ".", "--extractive", "-n", "20")
    assert result.exit_code == 1, result.output
    assert "a.summary.md" in error_lines(result.stderr)[0]
    assert (tree / "b.summary.md").is_file()
    assert target.is_symlink() or not target.is_file()


def test_its_own_outputs_and_empty_files_are_replaced(tree: Path):
    (tree / "a.summary.md").write_text(HEADER.format(fingerprint="0123abcd", method="extractive") + "\nold\n")
    (tree / "b.summary.md").write_text("")
    result = invoke("a.txt", "b.md", "-o", ".", "--extractive", "-n", "20")
    assert result.exit_code == 0, result.output
    assert "old" not in (tree / "a.summary.md").read_text()
    assert (tree / "b.summary.md").read_text().startswith("<!-- summarize ")


def test_a_users_own_summary_md_among_the_inputs_is_neither_read_nor_replaced(tree: Path):
    (tree / "a.summary.md").write_text("my summary, by hand\n")
    result = invoke(".", "-o", ".", "--extractive", "-n", "20")
    assert result.exit_code == 1
    assert (tree / "a.summary.md").read_text() == "my summary, by hand\n"
    assert not (tree / "a.summary.summary.md").exists()  # not taken for a document either
    rerun = invoke(".", "-o", ".", "--extractive", "-n", "20")  # its own outputs are skipped as inputs
    assert rerun.exit_code == 1 and len(error_lines(rerun.stderr)) == 1
