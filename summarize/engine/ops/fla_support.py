"""What the two fla adapters share: whether their kernels can run, the device they launch on, and
the switch that turns fla off for the rest of the process once one of its kernels has failed (the
torch path runs instead, as compiled steps fall back to eager code)."""

from __future__ import annotations

import contextlib
import sys
from typing import Callable

import torch

from summarize.errors import first_line

_failure: list[str] = []  # the first failure, once there was one


def on_device(device: torch.device):
    """Make `device` the current CUDA device, where Triton launches its kernels."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def usable(device: torch.device, kernels: Callable[[], object]) -> bool:
    """True on a CUDA device where `kernels()` imports fla's pieces, until one of fla's kernels fails."""
    return device.type == "cuda" and not turned_off() and kernels() is not None


def turned_off() -> bool:
    return bool(_failure)


def turn_off(error: Exception) -> None:
    """Stop using fla's kernels in this process, and say why once on stderr."""
    if not _failure:
        why = first_line(error)
        _failure.append(why)
        print(f"summarize: running without flash-linear-attention's kernels ({why[:200]})", file=sys.stderr)
