"""The paths a run reads and writes: no output may be one of its inputs, however spelled; inputs
that cannot be followed or read (a symlink loop, a locked folder) fail alone; a failed write names
the output, not our temporary file."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from summarize import files

TEXT = ("Bees visit flowers to collect nectar and pollen. Pollen sticks to their bodies and travels "
        "to the next flower. Many crops depend on this service for a good harvest.\n")


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


@pytest.fixture
def folder(tmp_path: Path, monkeypatch) -> Path:
    """tmp_path as the working folder, holding a.txt."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_text(TEXT)
    return tmp_path


# --- no output is an input -----------------------------------------------------------------


def _symlink(folder: Path) -> str:
    os.symlink("a.txt", folder / "link.md")
    return "link.md"


def _hard_link(folder: Path) -> str:
    os.link(folder / "a.txt", folder / "hard.txt")
    return "hard.txt"


def _another_spelling(folder: Path) -> str:
    (folder / "sub").mkdir()
    return "sub/../a.txt"


@pytest.mark.parametrize("spell", [lambda folder: "a.txt", lambda folder: str(folder / "a.txt"),
                                   _another_spelling, _symlink, _hard_link],
                         ids=["same", "absolute", "dotdot", "symlink", "hard-link"])
def test_an_output_file_that_is_the_input_is_a_usage_error(folder: Path, spell, run_cli):
    target = spell(folder)
    result = run_cli("a.txt", "-o", target, "--extractive")
    assert result.exit_code == 2, result.output
    (line,) = error_lines(result.stderr)
    assert "would overwrite the input" in line
    assert (folder / "a.txt").read_text() == TEXT
    assert result.stdout == ""


def test_a_folder_output_that_would_overwrite_an_input_refuses_before_reading(folder: Path, run_cli):
    # a.txt's summary would be ./a.summary.md, which is the second input
    (folder / "a.summary.md").write_text("mine, not a summary\n")
    result = run_cli("a.txt", "a.summary.md", "-o", ".", "--extractive")
    assert result.exit_code == 2, result.output
    (line,) = error_lines(result.stderr)
    assert "a.summary.md" in line
    assert (folder / "a.summary.md").read_text() == "mine, not a summary\n"
    assert sorted(p.name for p in folder.iterdir()) == ["a.summary.md", "a.txt"]


def test_an_output_beside_its_input_is_fine(folder: Path, run_cli):
    result = run_cli("a.txt", "-o", "a.summary.md", "--extractive", "-n", "40")
    assert result.exit_code == 0, result.output
    assert (folder / "a.txt").read_text() == TEXT
    assert (folder / "a.summary.md").is_file()


# --- inputs that cannot be followed or read fail alone -------------------------------------


def test_a_symlink_loop_in_a_folder_is_one_failed_input(tmp_path: Path, run_cli):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "good.txt").write_text(TEXT)
    os.symlink("self.txt", docs / "self.txt")
    result = run_cli(str(docs), "--extractive", "-n", "40")
    assert result.exit_code == 1, result.output
    assert result.stdout.startswith(f"==> {docs / 'good.txt'} <==\n")
    (line,) = error_lines(result.stderr)
    assert line.startswith(f"error: {docs / 'self.txt'}: ")
    assert "unexpected" not in result.stderr


def test_a_symlink_loop_named_on_the_command_line_is_one_failed_input(tmp_path: Path, run_cli):
    os.symlink("loop.txt", tmp_path / "loop.txt")
    (tmp_path / "good.txt").write_text(TEXT)
    result = run_cli(str(tmp_path / "loop.txt"), str(tmp_path / "good.txt"), "--extractive", "-n", "40")
    assert result.exit_code == 1, result.output
    assert f"==> {tmp_path / 'good.txt'} <==" in result.stdout
    assert len(error_lines(result.stderr)) == 1 and "unexpected" not in result.stderr


@pytest.fixture
def locked(tmp_path: Path, monkeypatch) -> Path:
    """docs/good.txt beside docs/locked/, a folder that cannot be listed (mode 000; root reads
    anything, so for root listing it is refused as it would be for anyone else)."""
    docs = tmp_path / "docs"
    (docs / "locked").mkdir(parents=True)
    (docs / "locked" / "hidden.txt").write_text(TEXT)
    (docs / "good.txt").write_text(TEXT)
    real_scandir = os.scandir

    def scandir(path="."):
        if Path(path) == docs / "locked":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    (docs / "locked").chmod(0)
    yield docs
    (docs / "locked").chmod(0o755)


def test_an_unreadable_subfolder_is_a_failed_input(locked: Path, run_cli):
    result = run_cli(str(locked), "--extractive", "-n", "40")
    assert result.exit_code == 1, result.output
    assert result.stdout.startswith(f"==> {locked / 'good.txt'} <==\n")
    (line,) = error_lines(result.stderr)
    assert line == f"error: {locked / 'locked'}: cannot read this folder (Permission denied)"
    table = result.stderr.split(line, 1)[1]
    assert "locked" in table and "failed" in table


def test_an_unreadable_folder_argument_is_one_failed_input(locked: Path, run_cli):
    result = run_cli(str(locked / "locked"), "--extractive")
    assert result.exit_code == 1, result.output
    (line,) = error_lines(result.stderr)
    assert "cannot read this folder" in line and "no .pdf" not in line


# --- a failed write names the output -------------------------------------------------------


def test_a_failed_write_names_the_output_not_its_temporary_file(monkeypatch, tmp_path: Path, run_cli):
    def refused(src, dst):  # as os.replace reports it: the temporary file first
        raise PermissionError(errno.EACCES, "Permission denied", src, None, dst)

    monkeypatch.setattr(files.os, "replace", refused)
    (tmp_path / "a.txt").write_text(TEXT)
    out = tmp_path / "out" / "a.summary.md"
    result = run_cli(str(tmp_path / "a.txt"), "-o", str(out), "--extractive")
    assert result.exit_code == 1, result.output
    (line,) = error_lines(result.stderr)
    assert line == f"error: {tmp_path / 'a.txt'}: Permission denied: {out}"
    assert list(out.parent.iterdir()) == []
