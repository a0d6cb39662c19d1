"""File names reach the terminal escaped: a control character in a name is shown as `\\xNN`
wherever the name is printed (stdout headers, error lines, the results table, the progress bar,
the live view), and rich markup in a name stays those characters. JSON keeps the exact name."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from summarize.records import ModelProgress, Result
from summarize.ui.escape import printable
from summarize.ui.terminal import RichUI

TEXT = ("Bees visit flowers to collect nectar and pollen. Pollen sticks to their bodies and travels "
        "to the next flower. Many crops depend on this service for a good harvest.\n")
RETITLE = "bad\x1b]0;T"  # an OSC sequence: sets the terminal window's title
RAW_CONTROLS = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0))]


def assert_no_raw_controls(text: str) -> None:
    assert not [c for c in text if c in RAW_CONTROLS and c != "\n"], repr(text)


@pytest.mark.parametrize(("name", "shown"), [
    (RETITLE + ".pdf", "bad\\x1b]0;T.pdf"),
    ("tab\there\nnewline", "tab\\x09here\\x0anewline"),
    ("del\x7f csi\x9b", "del\\x7f csi\\x9b"),
    ("undecodable \udcff byte", "undecodable \\xff byte"),  # os.fsdecode(b"undecodable \xff byte")
    ("café 日本 [bold]", "café 日本 [bold]"),
])
def test_printable_escapes_control_characters_only(name: str, shown: str):
    assert printable(name) == shown


@pytest.fixture
def hostile(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A readable file whose name retitles the terminal, one whose name is rich markup, and a
    missing one whose name would turn the terminal red."""
    retitling, marked = tmp_path / f"{RETITLE}.txt", tmp_path / "[bold red]x.txt"
    retitling.write_text(TEXT)
    marked.write_text(TEXT)
    return retitling, marked, tmp_path / "gone\x1b[31m[bold].txt"


def test_names_are_escaped_in_headers_errors_and_the_table(hostile, run_cli):
    retitling, marked, gone = hostile
    result = run_cli(str(retitling), str(marked), str(gone), "--extractive", "-n", "40", env={"NO_COLOR": "1"})
    assert result.exit_code == 1, result.output
    assert_no_raw_controls(result.stdout)
    assert_no_raw_controls(result.stderr)
    assert result.stdout.startswith(f"==> {printable(str(retitling))} <==\n")
    assert f"\n==> {marked} <==\n" in result.stdout
    assert f"error: {printable(str(gone))}: " in result.stderr
    table = result.stderr.split("status", 1)[1]
    assert printable(str(retitling)) in table and str(marked) in table


def test_json_keeps_the_exact_name_and_escapes_what_a_terminal_would_obey(tmp_path: Path, run_cli):
    source = tmp_path / "csi\x9b2J del\x7f.txt"
    source.write_text(TEXT)
    result = run_cli(str(source), "--json", "--extractive", "-n", "40", env={"NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    assert_no_raw_controls(result.stdout)
    assert json.loads(result.stdout)["input"] == str(source)


def terminal() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=True, width=200, color_system=None), buffer


def test_the_progress_bar_shows_names_escaped_and_without_markup():
    console, buffer = terminal()
    ui = RichUI(console=console)
    ui.file_started(f"[bold]{RETITLE}[/bold].txt", 1, 2)
    ui.close()
    assert f"[bold]{printable(RETITLE)}[/bold].txt" in buffer.getvalue()
    assert RETITLE not in buffer.getvalue()


def test_error_lines_and_the_table_escape_what_they_are_given():
    console, buffer = terminal()
    ui = RichUI(console=console)
    ui.error(f"{RETITLE}.txt: no such file")
    ui.results_table([Result(f"{RETITLE}.txt", "failed", f"cannot read {RETITLE}")])
    assert RETITLE not in buffer.getvalue()
    assert buffer.getvalue().count(printable(RETITLE)) == 3


def test_the_live_view_shows_the_input_escaped():
    from summarize.ui.live_view import StateView

    view = StateView()
    view.set_phase(ModelProgress(input=f"{RETITLE}.pdf", chunk=0, chunks=2, phase="prefill"))
    console, buffer = terminal()
    console.print(view)
    assert printable(RETITLE) in buffer.getvalue() and RETITLE not in buffer.getvalue()
