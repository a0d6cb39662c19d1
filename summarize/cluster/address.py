"""Where a cluster run's workers live (`--ray ADDRESS`): the address read, Ray imported only when it
is asked for, and the connection, which starts a local cluster for `local[:N]` and stops only what
it started.
"""

from __future__ import annotations

import logging
import math
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType

from summarize.errors import SummarizeError, first_line

RAY_EXTRA = "pip install 'summarize[ray]'"
ADDRESS_FORMS = "auto, local, local:N or ray://host:port"


class ClusterError(SummarizeError):
    """The cluster cannot be used as asked (Ray missing, no such address, too few resources): a
    usage error, found before any document is sent."""


@dataclass(frozen=True)
class ClusterAddress:
    """What `--ray` names: a running cluster, or a local one to start with `local_workers` workers."""

    text: str  # as given, for messages
    ray_address: str | None = None  # for ray.init; None: start a local cluster
    local_workers: int | None = None  # local[:N]: N, or None for one worker per CPU


def parse_address(text: str) -> ClusterAddress:
    """`auto` (a running cluster, or RAY_ADDRESS), `local[:N]` or `ray://host:port`."""
    if text == "auto":
        return ClusterAddress(text, ray_address=os.environ.get("RAY_ADDRESS") or "auto")
    if text == "local" or text.startswith("local:"):
        count = text.removeprefix("local").removeprefix(":")
        if not count:
            return ClusterAddress(text)
        if not count.isdigit() or int(count) < 1:
            raise ClusterError(f"--ray {text}: N in local:N is a number of workers, 1 or more")
        return ClusterAddress(text, local_workers=int(count))
    if text.startswith("ray://") and len(text) > len("ray://"):
        return ClusterAddress(text, ray_address=text)
    raise ClusterError(f"--ray {text}: expected {ADDRESS_FORMS}")


def require_ray() -> ModuleType:
    """The `ray` module, or ClusterError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ClusterError(f"--ray needs Ray, which is not installed: {RAY_EXTRA}") from None
    return ray


@dataclass(frozen=True)
class WorkerResources:
    """What one worker (one actor holding a summarizer) reserves on the cluster."""

    cpus: float = 1.0
    gpus: float = 0.0


@contextmanager
def connected(address: ClusterAddress, resources: WorkerResources) -> Iterator[int]:
    """Connected to the cluster for the block; yields how many workers of `resources` it holds.

    A process already connected (a host application, a test) stays connected afterwards; a
    cluster started here is stopped, and a connection made here is closed, however the block ends.
    """
    ray = require_ray()
    if ray.is_initialized():
        yield _capacity(ray, address, resources)
        return
    options = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    if address.ray_address is None:
        workers = address.local_workers or max(1, int((os.cpu_count() or 1) // resources.cpus))
        # exactly the CPUs of N workers: a local cluster takes what it is told, not the whole machine
        options |= dict(num_cpus=math.ceil(workers * resources.cpus))
    else:
        options |= dict(address=address.ray_address)
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        ray.init(**options)
    except Exception as exc:  # ConnectionError, a version mismatch, no cluster at "auto", ...
        raise ClusterError(f"--ray {address.text}: cannot connect ({first_line(exc)})") from exc
    finally:
        _restore(signal.SIGTERM, sigterm)
    try:
        yield _capacity(ray, address, resources)
    finally:
        ray.shutdown()


def _restore(signum: int, handler: object) -> None:
    """Put back a Python handler that Ray's own replaced when it connected (its SIGTERM handler
    prints a stack and exits 1, where the CLI cleans up and exits 143)."""
    if handler is None:  # not set from Python: nothing of ours to keep
        return
    try:
        signal.signal(signum, handler)
    except ValueError:  # not the main thread: its signals are the host application's
        pass


def _capacity(ray: ModuleType, address: ClusterAddress, resources: WorkerResources) -> int:
    """How many workers the cluster's resources hold at once (local:N: at most N)."""
    total = ray.cluster_resources()
    fits = [total.get("CPU", 0.0) / resources.cpus]
    if resources.gpus:
        fits.append(total.get("GPU", 0.0) / resources.gpus)
    workers = int(min(fits))
    if address.local_workers is not None:
        workers = min(workers, address.local_workers)
    if workers < 1:
        raise ClusterError(
            f"--ray {address.text}: the cluster has {total.get('CPU', 0.0):g} CPUs and {total.get('GPU', 0.0):g} GPUs, "
            f"too few for one worker of {resources.cpus:g} CPUs and {resources.gpus:g} GPUs (--ray-cpus, --ray-gpus)")
    return workers
