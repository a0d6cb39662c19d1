"""The live view's sparkline: each recurrent layer's state_norm after every chunk of the input read
so far, as block characters from ▁ (its lowest) to █ (its highest)."""

from __future__ import annotations

import io

from rich.console import Console

from summarize.engine.diagnostics import LayerReport, SpanReport
from summarize.records import ModelProgress
from summarize.ui.live_view import SPARK_WIDTH, StateView, sparkline


def test_a_sparkline_spans_the_values_own_range():
    assert sparkline([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]) == "▁▂▃▄▅▆▇█"
    assert sparkline([0.2, 0.9, 0.2]) == "▁█▁"
    assert sparkline([3.0, 3.0]) == "▄▄"  # flat: neither low nor high
    assert sparkline([]) == ""


def report(phase: str, norms: tuple[float, float]) -> SpanReport:
    layers = (LayerReport(0, "recurrent", state_norm=norms[0], gate_mean=0.9, delta_norm=0.1),
              LayerReport(1, "attention", kv_tokens=12),
              LayerReport(2, "recurrent", state_norm=norms[1], gate_mean=0.8, delta_norm=0.2))
    return SpanReport(phase, 0, 64, layers, 1000)


def read(view: StateView, name: str, chunk: int | None, norms: tuple[float, float], phase: str = "prefill") -> None:
    view.set_phase(ModelProgress(input=name, chunk=chunk, chunks=40, phase=phase))
    view.update(report("prefill" if phase in ("prefill", "prefix") else "decode", norms))


def rows(view: StateView) -> dict[str, str]:
    """Layer number: the row's last cell (the sparkline)."""
    buffer = io.StringIO()
    Console(file=buffer, width=200).print(view)
    lines = [line.split() for line in buffer.getvalue().splitlines()[3:] if line.strip()]
    return {cells[0]: cells[-1] if cells[1] == "recurrent" else "" for cells in lines}


def test_each_recurrent_layer_shows_its_state_norm_after_each_chunk_read():
    view = StateView()
    read(view, "a.pdf", None, (9.0, 9.0), phase="prefix")  # the instruction: no chunk
    for chunk, norms in enumerate([(1.0, 4.0), (2.0, 3.0), (3.0, 2.0), (4.0, 1.0)]):
        read(view, "a.pdf", chunk, norms)
        read(view, "a.pdf", chunk, (7.0, 7.0), phase="notes")  # decode steps are not chunks read
    assert rows(view) == {"0": "▁▃▆█", "1": "", "2": "█▆▃▁"}


def test_a_new_input_starts_a_new_sparkline_and_only_the_latest_chunks_are_shown():
    view = StateView()
    read(view, "a.pdf", 0, (5.0, 5.0))
    read(view, "b.pdf", 0, (1.0, 1.0))
    read(view, "b.pdf", 1, (2.0, 2.0))
    assert rows(view)["0"] == "▁█"
    for chunk in range(2, SPARK_WIDTH + 10):
        read(view, "b.pdf", chunk, (float(chunk), 0.0))
    assert len(rows(view)["0"]) == SPARK_WIDTH


def test_a_wait_is_shown_with_its_seconds_until_it_is_over():
    from summarize.ui.terminal import RichUI

    buffer = io.StringIO()
    ui = RichUI(console=Console(file=buffer, force_terminal=True, width=200, color_system=None))
    ui.waiting("compiling the decode step for 8 rows")
    shown = io.StringIO()
    Console(file=shown, width=200).print(ui)
    assert "compiling the decode step for 8 rows…  0 s" in shown.getvalue()
    ui.waiting(None)
    shown = io.StringIO()
    Console(file=shown, width=200).print(ui)
    assert "compiling" not in shown.getvalue()
    ui.close()


def test_off_a_terminal_a_wait_shows_nothing():
    from summarize.ui.terminal import RichUI

    buffer = io.StringIO()
    ui = RichUI(console=Console(file=buffer, width=200))
    ui.waiting("loading the model")
    ui.waiting(None)
    ui.close()
    assert buffer.getvalue() == ""
