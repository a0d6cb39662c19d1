"""The workers of a cluster run: Ray actors running `DocumentWorker`, each given at most
IN_FLIGHT_PER_WORKER documents at a time, a dead one replaced by a new one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from summarize.cluster.address import WorkerResources
from summarize.cluster.worker import DocumentWorker
from summarize.settings import Settings

# One document being summarized and one waiting: a worker never idles while the driver reads the
# next file, and the driver holds the bytes of at most two documents per worker.
IN_FLIGHT_PER_WORKER = 2

# Workers that keep dying with no document finished in between (a node without summarize
# installed, a model too big for a worker's memory) are not replaced forever: after this many
# deaths per worker of the pool, the pool stops starting new ones.
GIVE_UP_AFTER_DEATHS_PER_WORKER = 3


@dataclass
class Worker:
    number: int  # 1, 2, ...; a replacement gets the next number
    actor: Any  # the Ray actor handle
    # the ObjectRefs of the documents sent and not answered, oldest first: an actor runs its
    # calls in the order they were sent, so the first is the one being summarized
    in_flight: list[Any] = field(default_factory=list)
    alive: bool = True
    where: str = "not heard from yet"  # its host and process id, once it answered
    running_when_it_died: Any = None

    def was_running(self, ref: Any) -> bool:
        """Whether the document of `ref` was being summarized when this worker died: only that one
        counts the death against itself (those waiting behind it did nothing wrong)."""
        return ref is self.running_when_it_died


class WorkerPool:
    """`size` workers of `resources` each; they load the model on their first document."""

    def __init__(self, ray: ModuleType, settings: Settings, size: int, resources: WorkerResources) -> None:
        self.ray = ray
        self._settings = settings
        # No restarts and no task retries by Ray: the driver decides what a dead worker's
        # documents become (another worker, up to a bound), so that it can count the attempts.
        self._actor_class = ray.remote(DocumentWorker).options(
            num_cpus=resources.cpus, num_gpus=resources.gpus, max_restarts=0, max_task_retries=0)
        self._started = 0
        self._deaths_in_a_row = 0  # workers that died since a document last finished
        self.workers = [self._start() for _ in range(size)]

    def _start(self) -> Worker:
        self._started += 1
        return Worker(self._started, self._actor_class.remote(self._settings))

    def with_room(self) -> Worker | None:
        """The least busy live worker that can take another document, if any."""
        open_workers = [w for w in self.workers if w.alive and len(w.in_flight) < IN_FLIGHT_PER_WORKER]
        return min(open_workers, key=lambda w: len(w.in_flight), default=None)

    def submit(self, worker: Worker, data: bytes, source: str, label: str) -> Any:
        """Send a document to `worker`; the ObjectRef of its `Outcome`."""
        ref = worker.actor.summarize.remote(data, source, label)
        worker.in_flight.append(ref)
        return ref

    def answered(self, worker: Worker, ref: Any, *, where: str) -> None:
        """`worker`, running `where` (host and process), sent back what became of the document of `ref`."""
        worker.where = where
        worker.in_flight.remove(ref)
        self._deaths_in_a_row = 0

    def died(self, worker: Worker, ref: Any) -> None:
        """`worker` died with the document of `ref` in flight. The first such news starts a new
        worker in its place, unless workers keep dying; the others find it replaced already."""
        if worker.alive:
            worker.alive = False
            worker.running_when_it_died = worker.in_flight[0]
            self.ray.kill(worker.actor)  # it may be half alive (its node unreachable): make sure
            self._deaths_in_a_row += 1
            if self._deaths_in_a_row < GIVE_UP_AFTER_DEATHS_PER_WORKER * len(self.workers):
                self.workers[self.workers.index(worker)] = self._start()
        worker.in_flight.remove(ref)

    def stop(self) -> None:
        """End every worker now, with whatever it was doing (the driver writes nothing of it)."""
        for worker in self.workers:
            if worker.alive:
                worker.alive = False
                self.ray.kill(worker.actor)
