"""The live view of the model's state while it reads: one row per layer, updated per span, with a
sparkline of each recurrent layer's state_norm after every chunk of the input read so far.

It only keeps the latest numbers; rich's Live redraws it a few times a second on its own
thread, so a decode step costs a dictionary update, not a redraw.
"""

from __future__ import annotations

import time

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from summarize.engine.diagnostics import SpanReport
from summarize.ui.escape import printable

SPARK_BLOCKS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 24  # the latest chunks only: a row stays on one line of a narrow terminal


def sparkline(values: list[float]) -> str:
    """One block character per value, ▁ for the lowest to █ for the highest; all equal: ▄ each."""
    low, high = min(values, default=0.0), max(values, default=0.0)
    if high == low:
        return SPARK_BLOCKS[3] * len(values)
    top = len(SPARK_BLOCKS) - 1
    return "".join(SPARK_BLOCKS[round((v - low) / (high - low) * top)] for v in values)


class StateView:
    """Renders the latest `SpanReport` (sequence 0) with chunk i/n, phase, tokens/s and state bytes."""

    def __init__(self) -> None:
        self.report: SpanReport | None = None
        self.input = ""
        self.chunk: int | None = None
        self.chunks = 0
        self.phase = ""
        self.started = time.perf_counter()
        self._rate_start = time.perf_counter()
        self._rate_tokens = 0
        self._rate = 0.0
        self._drafted = self._kept = 0  # drafts offered to and kept by sequence 0 in this phase
        self._chunk_norms: dict[int, dict[int, float]] = {}  # chunk: {layer: state_norm after reading it}

    def set_phase(self, progress) -> None:
        if progress.phase != self.phase:
            self._rate_start, self._rate_tokens = time.perf_counter(), 0
            self._drafted = self._kept = 0
        if progress.input != self.input:
            self._chunk_norms = {}
        self.input, self.chunk, self.chunks, self.phase = progress.input, progress.chunk, progress.chunks, progress.phase

    def update(self, report: SpanReport) -> None:
        if report.sequence != 0:
            return
        self.report = report
        if report.phase == "prefill" and self.phase == "prefill" and self.chunk is not None:
            self._chunk_norms[self.chunk] = {layer.layer: layer.state_norm for layer in report.layers
                                             if layer.state_norm is not None}
        self._rate_tokens += report.tokens
        if report.drafted:
            self._drafted += report.drafted
            self._kept += report.tokens - 1
        elapsed = time.perf_counter() - self._rate_start
        if elapsed > 0:
            self._rate = self._rate_tokens / elapsed

    def __rich__(self) -> Group:
        chunk = "-" if self.chunk is None else f"{self.chunk + 1}/{self.chunks}"
        report = self.report
        state_mb = report.state_bytes / 2**20 if report else 0.0
        header = Text(
            f"{printable(self.input)}  chunk {chunk}  {self.phase}  {self._rate:,.0f} tok/s  "
            f"state {state_mb:,.1f} MiB  {time.perf_counter() - self.started:,.0f} s"
            + (f"  drafts kept {self._kept / self._drafted:.0%}" if self._drafted else ""),
            style="bold",
        )
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        for name in ("layer", "kind", "state_norm", "gate_mean", "delta_norm", "kv tokens"):
            table.add_column(name, justify="right")
        table.add_column("state_norm by chunk", justify="left")
        for layer in report.layers if report else ():
            if layer.kind == "recurrent":
                table.add_row(str(layer.layer), "recurrent", f"{layer.state_norm:.3g}", f"{layer.gate_mean:.3f}",
                              f"{layer.delta_norm:.3g}", "", self._sparkline(layer.layer))
            else:
                table.add_row(str(layer.layer), "attention", "", "", "", str(layer.kv_tokens), "")
        return Group(header, table)

    def _sparkline(self, layer: int) -> str:
        """`layer`'s state_norm after each of the latest chunks read, in chunk order."""
        latest = sorted(self._chunk_norms)[-SPARK_WIDTH:]
        return sparkline([self._chunk_norms[c][layer] for c in latest if layer in self._chunk_norms[c]])
