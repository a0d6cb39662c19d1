"""How a cluster run is going, for stderr: documents done of the total and each worker's
throughput, as one note every PROGRESS_EVERY seconds and one at the end. (On a terminal the
files bar moves with every document too: the `Reporter`'s file events.)
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

# Often enough to see a stalled worker in a log, rarely enough that a day-long run stays readable.
PROGRESS_EVERY = 60.0


class Throughput:
    """Counts the documents each worker finishes and says so through `note`."""

    def __init__(self, total: int, note: Callable[[str], None], *, every: float = PROGRESS_EVERY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self._note = note
        self._every = every
        self._clock = clock
        self._started = self._last_said = clock()
        self._done: Counter[str] = Counter()  # by worker, in the order they first finished one

    def finished(self, worker: str) -> None:
        self._done[worker] += 1

    def tick(self) -> None:
        """Say how it goes when the last note is old enough."""
        if self._clock() - self._last_said >= self._every:
            self.say()

    def say(self) -> None:
        self._last_said = now = self._clock()
        minutes = max(now - self._started, 1e-9) / 60
        workers = ", ".join(f"{name}: {count} ({count / minutes:.1f}/min)" for name, count in self._done.items())
        self._note(f"{sum(self._done.values())}/{self.total} documents on the cluster" + (f"; {workers}" if workers else ""))
