"""The `--diagnostics-file`: one JSON line per layer per span the engine reports, naming the input
and chunk each batch row belongs to. It owns the file and closes it.
"""

from __future__ import annotations

import json
from typing import Any

from summarize.types import ModelProgress


class DiagnosticsLog:
    """A span listener (`log(progress, report)`) writing JSON lines; a context manager."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "w", encoding="utf-8")

    def __call__(self, progress: ModelProgress, report: Any) -> None:
        """Write `report` (the engine's SpanReport), one record per layer."""
        row = progress.rows[report.sequence] if progress.rows else (progress.input, progress.chunk)
        for layer in report.layers:
            record = {
                "input": row[0],
                "chunk": row[1],
                "phase": report.phase,
                "layer": layer.layer,
                "kind": layer.kind,
                "state_norm": layer.state_norm,
                "gate_mean": layer.gate_mean,
                "delta_norm": layer.delta_norm,
                "kv_tokens": layer.kv_tokens,
                "tokens": report.tokens,
            }
            self._file.write(json.dumps(record) + "\n")

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> DiagnosticsLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
