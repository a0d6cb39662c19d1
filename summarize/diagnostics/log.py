"""The `--diagnostics-file`: one JSON line per layer per span the engine reports, naming the input
and chunk each batch row belongs to. It owns the file and closes it.

Diagnostics are a by-product: a file that cannot be opened or written (a full disk) is said once,
through `on_error`, naming the file, and the log goes quiet; it never raises into the summarizer,
so it never costs a summary.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import IO, Any

from summarize.records import ModelProgress


class DiagnosticsLog:
    """A span listener (`log(progress, report)`) writing JSON lines; a context manager."""

    def __init__(self, path: str, *, on_error: Callable[[str], None] = lambda msg: None) -> None:
        self.path = path
        self._on_error = on_error
        self._file: IO[str] | None = None
        try:
            self._file = open(path, "w", encoding="utf-8")
        except OSError as exc:
            self._give_up(exc)

    def __call__(self, progress: ModelProgress, report: Any) -> None:
        """Write `report` (the engine's SpanReport), one record per layer."""
        if not self.writing:
            return
        row = progress.rows[report.sequence] if progress.rows else (progress.input, progress.chunk)
        lines = []
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
            lines.append(json.dumps(record) + "\n")
        try:
            self._file.writelines(lines)
        except OSError as exc:
            self._give_up(exc)

    @property
    def writing(self) -> bool:
        """False once the log is closed, or the file could not be opened or written."""
        return self._file is not None and not self._file.closed

    def flush(self) -> None:
        if not self.writing:
            return
        try:
            self._file.flush()
        except OSError as exc:
            self._give_up(exc)

    def close(self) -> None:
        if not self.writing:
            return
        try:
            self._file.close()  # flushes what is buffered: a full disk shows up here too
        except OSError as exc:
            self._give_up(exc)

    def _give_up(self, exc: OSError) -> None:
        """Say once what went wrong, naming the file, and write no more."""
        self._on_error(f"{self.path}: {exc.strerror or exc}; no more diagnostics are written")
        if self._file is not None:
            try:
                self._file.close()  # marked closed even when flushing the rest fails again
            except OSError:  # the same failure, already said
                pass

    def __enter__(self) -> DiagnosticsLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
