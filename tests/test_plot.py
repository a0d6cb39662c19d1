"""`summarize plot FILE -o OUT`: a --diagnostics-file drawn as heatmaps of layers × spans, one per
number (state_norm, gate_mean, delta_norm) and phase, for each input, with axes, a colour scale and
the input's name; an SVG or an HTML page that opens offline. Bad input is one error line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest

from summarize.diagnostics.log import DiagnosticsLog
from summarize.diagnostics.plot import MAX_COLUMNS, charts, read_spans
from summarize.records import ModelProgress

ROOT = Path(__file__).resolve().parents[1]
SVG = "{http://www.w3.org/2000/svg}"
TITLES = [f"{metric}, {phase}" for phase in ("prefill", "decode") for metric in ("state_norm", "gate_mean", "delta_norm")]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def span(phase: str, sequence: int = 0, norm: float = 1.0) -> SimpleNamespace:
    """What the engine reports after a span: two recurrent layers and an attention layer."""
    layers = [SimpleNamespace(layer=i, kind="recurrent", state_norm=norm + i, gate_mean=0.5, delta_norm=0.25, kv_tokens=None)
              for i in (0, 1)]
    layers.append(SimpleNamespace(layer=2, kind="attention", state_norm=None, gate_mean=None, delta_norm=None, kv_tokens=9))
    return SimpleNamespace(sequence=sequence, phase=phase, tokens=1, layers=layers)


def write_run(path: Path, *, decode_steps: int = 5, name: str = "report.pdf") -> Path:
    """A map-reduce run's log: the instruction, two chunks read, their notes decoded together."""
    with DiagnosticsLog(str(path)) as log:
        log(ModelProgress(input=name, chunk=None, phase="prefill"), span("prefill", norm=0.5))
        for chunk in (0, 1):
            log(ModelProgress(input=name, chunk=chunk, phase="prefill"), span("prefill", norm=chunk + 2.0))
        rows = ModelProgress(input=name, rows=[(name, 0), (name, 1)], phase="notes")
        for step in range(decode_steps):
            log(rows, span("decode", 0, norm=step))
            log(rows, span("decode", 1, norm=-step))
    return path


def svg_of(path: Path) -> ET.Element:
    """The picture in an .svg file or an .html page, parsed (so it is well-formed XML)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".html":
        text = text[text.index("<svg"): text.index("</svg>") + len("</svg>")]
    return ET.fromstring(text)


def texts(svg: ET.Element) -> list[str]:
    return ["".join(t.itertext()) for t in svg.iter(f"{SVG}text")]


def cells(svg: ET.Element) -> list[ET.Element]:
    """The coloured cells: the rects filled with a colour (not the background, the grey or the scale)."""
    return [r for r in svg.iter(f"{SVG}rect") if r.get("fill", "").startswith("#") and r.get("fill") != "#e4e4e4"]


@pytest.mark.parametrize("suffix", [".svg", ".html"])
def test_each_number_and_phase_is_a_heatmap_with_axes_a_colour_scale_and_the_input(tmp_path: Path, suffix: str, run_cli):
    out = tmp_path / f"d{suffix}"
    result = run_cli("plot", str(write_run(tmp_path / "d.jsonl")), "-o", str(out), env={"NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    assert result.stdout == result.stderr == ""
    svg = svg_of(out)
    labels = texts(svg)
    assert [t for t in labels if t in TITLES] == TITLES
    assert "input: report.pdf" in labels and "summarize diagnostics: d.jsonl" in labels
    assert labels.count("layer") == 6 and labels.count("0") >= 6 and "2" not in labels  # rows: recurrent layers only
    assert sum(t.startswith("prefill spans") for t in labels) == 3 and sum(t.startswith("decode steps") for t in labels) == 3
    assert svg.find(f"{SVG}defs/{SVG}linearGradient") is not None
    assert len([r for r in svg.iter(f"{SVG}rect") if r.get("fill") == "url(#scale)"]) == 6
    # prefill: 3 spans × 2 layers × 3 numbers; decode: 2 chunks × 5 steps × 2 layers × 3 numbers
    assert len(cells(svg)) == 3 * 2 * 3 + 10 * 2 * 3


def test_the_picture_needs_no_network_and_no_script(tmp_path: Path, run_cli):
    out = tmp_path / "d.html"
    assert run_cli("plot", str(write_run(tmp_path / "d.jsonl")), "-o", str(out), env={"NO_COLOR": "1"}).exit_code == 0
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page.lower()
    assert page.replace('xmlns="http://www.w3.org/2000/svg"', "").count("http") == 0


def test_prefill_has_a_column_per_span_and_decode_groups_a_batch_s_steps_by_chunk(tmp_path: Path):
    (spans,) = read_spans(write_run(tmp_path / "d.jsonl")).values()
    state_norm_prefill, state_norm_decode = charts(spans)[0], charts(spans)[3]
    assert (state_norm_prefill.title, state_norm_decode.title) == ("state_norm, prefill", "state_norm, decode")
    assert state_norm_prefill.rows == ["0", "1"]
    assert [column[0] for column in state_norm_prefill.cells] == [0.5, 2.0, 3.0]
    assert state_norm_prefill.ticks == [(0, "–"), (1, "0"), (2, "1")]  # –: the instruction, in no chunk
    # the two chunks' notes were decoded together, their steps interleaved in the log
    assert [column[0] for column in state_norm_decode.cells] == [0, 1, 2, 3, 4, 0, -1, -2, -3, -4]
    assert state_norm_decode.ticks == [(0, "0"), (5, "1")]


def test_more_spans_than_fit_are_averaged_in_runs_and_the_caption_says_so(tmp_path: Path, run_cli):
    out = tmp_path / "d.svg"
    run_cli("plot", str(write_run(tmp_path / "d.jsonl", decode_steps=MAX_COLUMNS)), "-o", str(out), env={"NO_COLOR": "1"})
    svg = svg_of(out)
    assert len(cells(svg)) == 3 * 2 * 3 + MAX_COLUMNS * 2 * 3  # 2 × MAX_COLUMNS steps, two a column
    assert sum("each column the mean of 2" in t for t in texts(svg)) == 3


def test_names_are_escaped_and_held_as_text(tmp_path: Path, run_cli):
    name = 'a <script>alert("x")</script> & \x1b[31m.pdf'
    out = tmp_path / "d.html"
    assert run_cli("plot", str(write_run(tmp_path / "d.jsonl", name=name)), "-o", str(out), env={"NO_COLOR": "1"}).exit_code == 0
    assert "<script" not in out.read_text(encoding="utf-8")
    assert 'input: a <script>alert("x")</script> & \\x1b[31m.pdf' in texts(svg_of(out))


def test_a_last_line_cut_short_by_a_killed_run_is_left_out(tmp_path: Path, run_cli):
    path = write_run(tmp_path / "d.jsonl")
    path.write_text(path.read_text() + '{"input": "report.pdf", "chunk": 1, "pha')
    assert run_cli("plot", str(path), "-o", str(tmp_path / "d.svg"), env={"NO_COLOR": "1"}).exit_code == 0


def test_a_file_named_plot_is_summarized_as_dot_slash_plot(tmp_path: Path, monkeypatch, run_cli):
    monkeypatch.chdir(tmp_path)
    Path("plot").write_text("Bees visit flowers to collect nectar. Pollen sticks to their bodies and travels on.\n")
    summarized = run_cli("./plot", "--extractive", "-n", "20", env={"NO_COLOR": "1"})
    assert summarized.exit_code == 0 and "nectar" in summarized.stdout
    assert run_cli("plot", "--extractive", env={"NO_COLOR": "1"}).exit_code == 2  # `plot` first: the plot command, which has no such option


def test_help_says_how_plot_is_reached(run_cli):
    assert "summarize plot" in " ".join(run_cli("--help", env={"NO_COLOR": "1"}).stdout.split())
    shown = run_cli("plot", "--help", env={"NO_COLOR": "1"})
    assert shown.exit_code == 0 and "summarize plot" in shown.stdout and "--output" in shown.stdout


# --- bad input: one line, nothing written ----------------------------------------------------


def bad_inputs(tmp_path: Path) -> dict[str, tuple[list[str], int]]:
    """case: (the arguments after `plot`, the exit code); -o is tmp_path/d.svg unless given."""
    good = write_run(tmp_path / "good.jsonl")
    (tmp_path / "prose.txt").write_text("Not JSON at all.\n")
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "summaries.jsonl").write_text('{"input": "a.pdf", "summary": "Bees.", "ok": true}\n')
    (tmp_path / "attention.jsonl").write_text(
        '{"input": "a", "chunk": 0, "phase": "prefill", "layer": 3, "kind": "attention", "state_norm": null, '
        '"gate_mean": null, "delta_norm": null, "kv_tokens": 5, "tokens": 5}\n')
    (tmp_path / "odd.jsonl").write_text(
        '{"input": ["a"], "chunk": "0", "phase": "prefill", "layer": 0, "kind": "recurrent", "state_norm": 1, '
        '"gate_mean": 1, "delta_norm": 1, "kv_tokens": null, "tokens": 5}\n')
    (tmp_path / "latin1.jsonl").write_bytes(b"caf\xe9\n")
    (tmp_path / "a.file").write_text("")
    out = str(tmp_path / "d.svg")
    return {
        "missing file": ([str(tmp_path / "gone.jsonl"), "-o", out], 1),
        "a folder": ([str(tmp_path), "-o", out], 1),
        "not JSON": ([str(tmp_path / "prose.txt"), "-o", out], 1),
        "empty": ([str(tmp_path / "empty.jsonl"), "-o", out], 1),
        "JSON of another kind": ([str(tmp_path / "summaries.jsonl"), "-o", out], 1),
        "attention layers only": ([str(tmp_path / "attention.jsonl"), "-o", out], 1),
        "fields of other types": ([str(tmp_path / "odd.jsonl"), "-o", out], 1),
        "not UTF-8": ([str(tmp_path / "latin1.jsonl"), "-o", out], 1),
        "an output that cannot be written": ([str(good), "-o", str(tmp_path / "a.file" / "d.svg")], 1),
        "unknown output suffix": ([str(good), "-o", str(tmp_path / "d.png")], 2),
        "no output": ([str(good)], 2),
        "no input": (["-o", out], 2),
        "an unknown option": ([str(good), "-o", out, "--colour"], 2),
    }


CASES = ["missing file", "a folder", "not JSON", "empty", "JSON of another kind", "attention layers only",
         "fields of other types", "not UTF-8", "an output that cannot be written", "unknown output suffix", "no output", "no input",
         "an unknown option"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_error_line_and_writes_nothing(tmp_path: Path, case: str, run_cli):
    args, code = bad_inputs(tmp_path)[case]
    before = sorted(p.name for p in tmp_path.rglob("*"))
    result = run_cli("plot", *args, env={"NO_COLOR": "1"})
    assert result.exit_code == code, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and "Traceback" not in result.output
    assert result.stdout == ""
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_the_output_may_not_be_the_diagnostics_file(tmp_path: Path, run_cli):
    path = write_run(tmp_path / "d.html")  # a log with an unlikely name
    kept = path.read_text()
    result = run_cli("plot", str(path), "-o", str(tmp_path / "." / "d.html"), env={"NO_COLOR": "1"})
    assert result.exit_code == 2 and result.stderr.startswith("error: ")
    assert path.read_text() == kept


def test_ctrl_c_leaves_no_file_and_exits_130(tmp_path: Path, monkeypatch, run_cli):
    def interrupted(source: str, target: Path) -> None:  # Ctrl-C just before the picture lands
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    result = run_cli("plot", str(write_run(tmp_path / "d.jsonl")), "-o", str(tmp_path / "d.svg"), env={"NO_COLOR": "1"})
    assert (result.exit_code, result.stderr) == (130, "error: interrupted\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl"]


def test_an_existing_output_is_replaced_whole(tmp_path: Path, run_cli):
    out = tmp_path / "d.svg"
    out.write_text("old picture\n")
    assert run_cli("plot", str(write_run(tmp_path / "d.jsonl")), "-o", str(out), env={"NO_COLOR": "1"}).exit_code == 0
    assert out.read_text().startswith("<svg") and sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl", "d.svg"]


# --- a real run, drawn, shown in a real browser ----------------------------------------------


@pytest.fixture(scope="module")
def run_log(tmp_path_factory) -> Path:
    """The diagnostics of a real map-reduce run of a tiny random model over three chunks."""
    from tiny_models import tiny_released_layout

    folder = tmp_path_factory.mktemp("run")
    model = tiny_released_layout(folder / "tiny")
    text = folder / "policy.txt"
    text.write_text((ROOT / "samples" / "target-tier-policy.txt").read_text(encoding="utf-8")[:2500], encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "summarize", str(text), "-m", str(model), "-n", "20", "--dtype", "float32",
         "--chunk-tokens", "256", "--overlap", "16", "--temperature", "0", "--diagnostics-file", str(folder / "d.jsonl")],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    return folder / "d.jsonl"


def test_a_real_run_is_drawn_with_its_recurrent_layers_and_chunks(run_log: Path, tmp_path: Path, run_cli):
    out = tmp_path / "d.svg"
    result = run_cli("plot", str(run_log), "-o", str(out), env={"NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    labels = texts(svg_of(out))
    assert [t for t in labels if t in TITLES] == TITLES
    assert f"input: {run_log.parent / 'policy.txt'}" in labels
    assert {"0", "1", "2"} <= set(labels) and "3" not in labels  # layer 3 is the attention layer (and no chunk 3)


def test_a_browser_shows_the_page(run_log: Path, tmp_path: Path, run_cli):
    browser = next(filter(None, map(shutil.which, BROWSERS)), None)
    if browser is None:
        pytest.skip(f"no headless browser installed ({', '.join(BROWSERS)})")
    from PIL import Image

    page, shot = tmp_path / "d.html", tmp_path / "shot.png"
    assert run_cli("plot", str(run_log), "-o", str(page), env={"NO_COLOR": "1"}).exit_code == 0
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                    "--window-size=1200,900", page.as_uri()], capture_output=True, timeout=120, check=True)
    with Image.open(shot) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert len(colours) > 50  # white, text and a few hundred shades of the scale: not a blank page
