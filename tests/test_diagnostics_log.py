"""The diagnostics log: one JSON line per layer per span, naming each batch row's input and chunk,
and a file that is complete once the log is closed."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from summarize.diagnostics.log import DiagnosticsLog
from summarize.records import ModelProgress

FIELDS = {"input", "chunk", "phase", "layer", "kind", "state_norm", "gate_mean", "delta_norm", "kv_tokens", "tokens"}


def layer(index: int, kind: str) -> SimpleNamespace:
    recurrent = kind == "recurrent"
    return SimpleNamespace(layer=index, kind=kind, state_norm=1.5 if recurrent else None,
                           gate_mean=0.5 if recurrent else None, delta_norm=0.25 if recurrent else None,
                           kv_tokens=None if recurrent else 7)


def span(sequence: int, phase: str) -> SimpleNamespace:
    return SimpleNamespace(sequence=sequence, phase=phase, tokens=1, layers=[layer(0, "recurrent"), layer(1, "attention")])


def test_records_name_the_row_of_a_batch_and_the_file_is_closed(tmp_path: Path):
    path = tmp_path / "d.jsonl"
    with DiagnosticsLog(str(path)) as log:
        log(ModelProgress(input="a", chunk=2, phase="prefill"), span(0, "prefill"))
        log(ModelProgress(input="a", rows=[("a", 3), ("b", 0)]), span(1, "decode"))
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(set(r) == FIELDS for r in records)
    assert [(r["input"], r["chunk"], r["layer"]) for r in records] == [("a", 2, 0), ("a", 2, 1), ("b", 0, 0), ("b", 0, 1)]
    assert records[0]["state_norm"] == 1.5 and records[1]["kv_tokens"] == 7
    assert log._file.closed


def test_a_file_that_cannot_be_written_is_said_once_and_never_raises():
    said: list[str] = []
    log = DiagnosticsLog("/dev/full", on_error=said.append)  # every write: No space left on device
    for chunk in range(200):  # enough records to fill the write buffer many times over
        log(ModelProgress(input="a", chunk=chunk), span(0, "prefill"))
        log.flush()
    log.close()
    assert said == ["/dev/full: No space left on device; no more diagnostics are written"]
    assert not log.writing


def test_a_file_that_cannot_be_opened_is_said_once_and_never_raises(tmp_path: Path):
    said: list[str] = []
    path = tmp_path / "gone" / "d.jsonl"
    with DiagnosticsLog(str(path), on_error=said.append) as log:
        log(ModelProgress(input="a", chunk=0), span(0, "prefill"))
    assert said == [f"{path}: No such file or directory; no more diagnostics are written"]
