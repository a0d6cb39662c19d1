"""A batch run on a Ray cluster (`--ray`), with every promise of the single-machine run (`batch`).

The driver plans as `batch` does and drops the outputs already up to date for these settings. It
reads each remaining input itself and sends its bytes to a pool of workers (`ray_pool`), biggest
documents first (the run does not end waiting on one long document), with at most a few documents
per worker in flight, so a folder of 50,000 files never sits in memory. Summaries come back to the
driver, which writes them with `batch`'s atomic writes and fingerprints: a worker needs no access
to the inputs or to -o, and a dead worker cannot leave a partial file.

Faults: the documents of a worker that dies go to another worker, up to MAX_ATTEMPTS tries in all;
a document that fails by itself (a bad PDF) fails once, with its line; Ctrl-C ends the workers, and
what was being written is removed (the CLI exits 130). A re-run does the rest.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from summarize.cluster.address import ClusterAddress, WorkerResources, connected, require_ray
from summarize.cluster.pool import Worker, WorkerPool
from summarize.cluster.progress import Throughput
from summarize.cluster.worker import Outcome
from summarize.errors import SummarizeError, first_line
from summarize.inputs.extract import read_input
from summarize.records import Job, Result
from summarize.run.local import StdoutPrinter
from summarize.run.outcomes import ModelNotLoaded, failed_result, in_plan_order, settled_before_reading, written_result
from summarize.run.plan import Plan
from summarize.settings import Settings
from summarize.ui.reporter import Reporter

# A document is tried on this many workers in all when the worker running it dies (killed, out of
# memory, its node lost); a document that kills every worker it meets then fails alone.
MAX_ATTEMPTS = 3
WAIT_SECONDS = 1.0  # the longest the driver waits for a result before it looks at the clock again


@dataclass
class _Dispatched:
    index: int  # in the plan
    job: Job
    size: int  # bytes on disk, for the order: biggest first
    attempts: int = 0  # workers that died running it
    data: bytes | None = None  # read once, kept while in flight: stdin cannot be read again for a retry


def run(
    plan: Plan,
    settings: Settings,
    *,
    cluster: ClusterAddress,
    resources: WorkerResources = WorkerResources(),
    ui: Reporter,
    force: bool = False,
    json_lines: bool = False,
    stdout: TextIO | None = None,
) -> list[Result]:
    """Summarize every job of `plan` on the cluster; a failure is reported and the run goes on.

    Raises ClusterError, before any document is sent, when the cluster cannot be used, and
    StdoutError as the local run does. No cluster is reached when every output is up to date.
    """
    printer = StdoutPrinter(stdout or sys.stdout, plan, json_lines=json_lines)
    results: dict[int, Result] = {}
    announced = 0

    def announce(job: Job) -> None:
        nonlocal announced
        announced += 1
        ui.file_started(job.label, announced, len(plan.jobs))

    def finish(index: int, result: Result) -> None:
        results[index] = result
        printer.print_ready(results)
        ui.file_finished(result)

    to_send: list[_Dispatched] = []
    for index, job in enumerate(plan.jobs):
        try:
            settled = settled_before_reading(job, settings, force=force)
        except Exception as exc:  # a problem known from planning: the job fails alone
            settled = failed_result(job, exc, ui=ui, start=time.perf_counter())
        if settled is None:
            to_send.append(_Dispatched(index, job, _size(job)))
        else:
            announce(job)
            finish(index, settled)
    if to_send:
        to_send.sort(key=lambda doc: doc.size, reverse=True)
        with connected(cluster, resources) as capacity:
            pool = WorkerPool(require_ray(), settings, min(capacity, len(to_send)), resources)
            _Dispatch(pool, settings, ui, announce, finish, force=force).run(deque(to_send))
    return in_plan_order(results, plan, ui=ui)


def _size(job: Job) -> int:
    """The input's bytes on disk; 0 for stdin, and for a file that cannot be read (it fails when it is)."""
    if job.is_stdin:
        return 0
    try:
        return os.stat(job.input).st_size
    except OSError:
        return 0


class _Dispatch:
    """Sends documents to the pool's workers and handles what comes back."""

    def __init__(self, pool: WorkerPool, settings: Settings, ui: Reporter, announce: Callable[[Job], None],
                 finish: Callable[[int, Result], None], *, force: bool) -> None:
        self.pool = pool
        self.ray = pool.ray
        self.settings = settings
        self.ui = ui
        self.announce = announce
        self.finish = finish
        self.force = force
        self.worker_died = (self.ray.exceptions.RayActorError, self.ray.exceptions.WorkerCrashedError,
                            self.ray.exceptions.NodeDiedError, self.ray.exceptions.ObjectLostError)
        self.notes_said: set[str] = set()
        self.model_error_said = False
        self.last_death = ""

    def run(self, queue: deque[_Dispatched]) -> None:
        progress = Throughput(len(queue), self.ui.note)
        in_flight: dict[Any, tuple[_Dispatched, Worker]] = {}
        try:
            while queue or in_flight:
                self._send(queue, in_flight)
                if not in_flight:  # every worker is dead, and the pool stopped replacing them
                    self._fail_all(queue, f"no worker left: they kept dying ({self.last_death})")
                    break
                ready, _ = self.ray.wait(list(in_flight), num_returns=1, timeout=WAIT_SECONDS)
                for ref in ready:
                    doc, worker = in_flight.pop(ref)
                    self._received(ref, doc, worker, queue, progress)
                progress.tick()
            progress.say()
        finally:  # Ctrl-C, or a closed stdout: the work still out is dropped with its workers
            self.pool.stop()

    def _send(self, queue: deque[_Dispatched], in_flight: dict) -> None:
        while queue and (worker := self.pool.with_room()) is not None:
            doc = queue.popleft()
            if doc.data is None:
                self.announce(doc.job)
                try:
                    doc.data = read_input(doc.job.input, max_bytes=self.settings.max_input_size)
                except Exception as exc:  # a file that cannot be read fails here, on the driver
                    self.finish(doc.index, failed_result(doc.job, exc, ui=self.ui, start=time.perf_counter()))
                    continue
            in_flight[self.pool.submit(worker, doc.data, doc.job.input, doc.job.label)] = (doc, worker)

    def _received(self, ref: Any, doc: _Dispatched, worker: Worker, queue: deque[_Dispatched], progress: Throughput) -> None:
        try:
            outcome: Outcome = self.ray.get(ref)
        except self.worker_died as exc:
            self.pool.died(worker, ref)
            self.last_death = first_line(exc)
            if worker.was_running(ref):
                doc.attempts += 1
            if doc.attempts < MAX_ATTEMPTS:
                queue.appendleft(doc)  # next to be sent, to a live worker
            else:
                self._fail(doc, SummarizeError(f"its worker died {doc.attempts} times ({self.last_death})"))
            return
        except self.ray.exceptions.RayTaskError as exc:  # raised past the worker's own handling
            cause = exc.cause if isinstance(getattr(exc, "cause", None), Exception) else exc
            outcome = Outcome(None, cause, worker.where, 0.0)
        self.pool.answered(worker, ref, where=outcome.worker)
        progress.finished(f"worker {worker.number} ({worker.where})")
        for note in outcome.notes:
            if note not in self.notes_said:  # each worker says that it loaded the model, ...
                self.notes_said.add(note)
                self.ui.note(note)
        if isinstance(outcome.error, ModelNotLoaded) and not self.model_error_said:
            self.model_error_said = True  # why is said once; each document then points at it
            self.ui.error(str(outcome.error))
        # the result's seconds are the worker's reading and summarizing, plus the write here
        start = time.perf_counter() - outcome.seconds
        self.finish(doc.index, written_result(doc.job, outcome.error or outcome.summary, self.settings, ui=self.ui,
                                              start=start, force=self.force))
        doc.data = None

    def _fail(self, doc: _Dispatched, exc: Exception) -> None:
        self.finish(doc.index, failed_result(doc.job, exc, ui=self.ui, start=time.perf_counter()))

    def _fail_all(self, queue: deque[_Dispatched], reason: str) -> None:
        while queue:
            doc = queue.popleft()
            if doc.data is None:
                self.announce(doc.job)
            self._fail(doc, SummarizeError(reason))

