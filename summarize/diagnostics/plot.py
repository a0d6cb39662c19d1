"""`summarize plot`: a --diagnostics-file drawn as heatmaps of layers × spans, one for each of
state_norm, gate_mean and delta_norm, in prefill (a column per span: the instruction, each chunk)
and in decode (a column per step, the steps of each chunk's notes together), for each input.

The picture is an SVG file, or an HTML page holding it inline: it opens offline, without scripts.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from summarize.diagnostics.heatmap import Heatmap, document, heading, heatmap, text
from summarize.errors import SummarizeError
from summarize.files import write_atomic

METRICS = ("state_norm", "gate_mean", "delta_norm")
PHASES = ("prefill", "decode")
FORMATS = (".html", ".svg")
MAX_COLUMNS = 360  # wider heatmaps average runs of neighbouring spans: a cell stays 2 pixels wide
NO_CHUNK = "–"  # the label of spans that belong to no single chunk (the instruction, merging notes)
CAPTIONS = {
    "prefill": f"prefill spans, by chunk ({NO_CHUNK}: in no single chunk: the instruction, the notes to merge)",
    "decode": f"decode steps, by chunk ({NO_CHUNK}: in no single chunk: merged notes, the summary)",
}


@dataclass
class Span:
    """One span of one input: each recurrent layer's (state_norm, gate_mean, delta_norm)."""

    phase: str
    chunk: int | None
    values: dict[int, tuple[float | None, ...]] = field(default_factory=dict)


def write_plot(diagnostics: Path, output: Path) -> None:
    """Draw `diagnostics` into `output` (.html or .svg), atomically; SummarizeError names what is wrong."""
    spans = read_spans(diagnostics)
    blocks = []
    for name, input_spans in spans.items():
        blocks.append(heading(f"input: {name}"))
        blocks += [heatmap(chart) for chart in charts(input_spans)]
    svg = document(f"summarize diagnostics: {diagnostics.name}", blocks)
    if output.suffix.lower() == ".html":
        svg = _page(f"summarize diagnostics: {diagnostics.name}", svg)
    try:
        write_atomic(output, svg)
    except OSError as exc:
        raise SummarizeError(f"{output}: {exc.strerror or exc}") from exc


def read_spans(path: Path) -> dict[str, list[Span]]:
    """The recurrent layers' numbers of each input, span by span, in the order the run wrote them.

    The log writes a span as one record per layer, in layer order: a record for a layer already
    seen, or for another chunk or phase, starts the input's next span.
    """
    spans: dict[str, list[Span]] = {}
    try:
        with path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                record = _record(path, number, line)
                if record is None or record["kind"] != "recurrent":
                    continue
                runs = spans.setdefault(record["input"], [])
                layer, chunk = record["layer"], record["chunk"]
                if not runs or (runs[-1].phase, runs[-1].chunk) != (record["phase"], chunk) or layer <= max(runs[-1].values):
                    runs.append(Span(record["phase"], chunk))
                runs[-1].values[layer] = tuple(_number(record[name]) for name in METRICS)
    except UnicodeDecodeError:
        raise SummarizeError(f"{path}: not UTF-8 text, so not a --diagnostics-file") from None
    except OSError as exc:
        raise SummarizeError(f"{path}: {exc.strerror or exc}") from exc
    if not spans:
        raise SummarizeError(f"{path}: no diagnostics of recurrent layers in it (summarize --diagnostics-file writes them)")
    return spans


def _record(path: Path, number: int, line: str) -> dict | None:
    """Line `number` as a diagnostics record; None for a last line cut short (a killed run)."""
    try:
        record = json.loads(line)
    except ValueError:
        if not line.endswith("\n"):
            return None
        raise SummarizeError(f"{path}, line {number}: not JSON, so not a --diagnostics-file") from None
    if not _is_record(record):
        raise SummarizeError(f"{path}, line {number}: not a diagnostics record (summarize --diagnostics-file writes them)")
    return record


def _is_record(record: object) -> bool:
    """Whether `record` has the fields the plot reads, of the types DiagnosticsLog writes."""
    return (isinstance(record, dict) and all(name in record for name in ("input", "chunk", "phase", "layer", "kind", *METRICS))
            and isinstance(record["input"], str) and (record["chunk"] is None or isinstance(record["chunk"], int))
            and record["phase"] in PHASES and isinstance(record["layer"], int) and record["kind"] in ("recurrent", "attention"))


def _number(value: object) -> float | None:
    """A number to draw; None (no value) for null, NaN or infinity."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def charts(spans: list[Span]) -> list[Heatmap]:
    """The heatmaps of one input: per phase it has, one per metric; rows are its recurrent layers."""
    layers = sorted({layer for span in spans for layer in span.values})
    found = []
    for phase in PHASES:
        ordered = [span for span in spans if span.phase == phase]
        if phase == "decode":  # a batch decodes several chunks' notes step by step, interleaved
            order = _first_seen([span.chunk for span in ordered])
            ordered.sort(key=lambda span: order[span.chunk])  # stable: each chunk's steps stay in order
        if not ordered:
            continue
        every = math.ceil(len(ordered) / MAX_COLUMNS)
        ticks = _ticks(ordered, phase, every)
        caption = CAPTIONS[phase] + (f"; each column the mean of {every}" if every > 1 else "")
        for m, metric in enumerate(METRICS):
            cells = [[span.values.get(layer, (None,) * len(METRICS))[m] for layer in layers] for span in ordered]
            found.append(Heatmap(title=f"{metric}, {phase}", rows=[str(layer) for layer in layers],
                                 row_caption="layer", cells=_average_runs(cells, every), ticks=ticks, caption=caption))
    return found


def _first_seen(chunks: list[int | None]) -> dict[int | None, int]:
    order: dict[int | None, int] = {}
    for chunk in chunks:
        order.setdefault(chunk, len(order))
    return order


def _label(chunk: int | None) -> str:
    return NO_CHUNK if chunk is None else str(chunk)


def _ticks(spans: list[Span], phase: str, every: int) -> list[tuple[int, str]]:
    """Prefill: every column's chunk; decode: where each chunk's steps begin."""
    ticks, previous = [], object()
    for i, span in enumerate(spans):
        if phase == "prefill" or span.chunk != previous:
            ticks.append((i // every, _label(span.chunk)))
        previous = span.chunk
    return ticks


def _average_runs(cells: list[list[float | None]], every: int) -> list[list[float | None]]:
    """Each run of `every` neighbouring columns as one column of their means (None where none has a value)."""
    if every == 1:
        return cells
    averaged = []
    for start in range(0, len(cells), every):
        run = cells[start : start + every]
        column = []
        for row in zip(*run):
            values = [v for v in row if v is not None]
            column.append(sum(values) / len(values) if values else None)
        averaged.append(column)
    return averaged


def _page(title: str, svg: str) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\">"
            f"<title>{text(title)}</title></head>\n<body style=\"margin:16px;background:white\">\n{svg}</body>\n</html>\n")
