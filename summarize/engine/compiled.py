"""The model's steps through `torch.compile`, swapped in from outside the model, with a clean fall
back to eager execution.

Decoding one token is memory-bound: compiled, each layer becomes a few fused loops and every
projection a streaming reduction (`ops.linear`), where eagerly torch's CPU GEMM reads the weights
slowly for one row and the small ops around each layer add their own passes. Prefill compiles
with dynamic shapes, so one graph per layer kind serves every length; the delta rule stays one
opaque op. A family with `whole_decode_step` decodes one sequence as one graph (every layer and
the head), which saves the per-layer calls' overhead. Decode graphs are specialised on the batch
size. Inductor caches what it built on disk (`~/.cache/summarize/torchinductor`, or under
`XDG_CACHE_HOME`; `TORCHINDUCTOR_CACHE_DIR` wins), so later processes start faster. If compiling
fails, the model stays eager and says so once on stderr. Figures: docs/performance.md.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from torch import Tensor

from summarize.engine.model import Steps

ENV = "SUMMARIZE_COMPILE"  # "0": never compile, "1": always (where the device allows)
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"  # where inductor keeps the kernels it built
MIN_WEIGHT_BYTES = 200 * 2**20  # below this, compiling takes longer than it saves
# Tokens of the prefill warm-up: a length that equals no other dimension, so that the graph
# keeps the length symbolic rather than tying it to a model size
WARM_UP_TOKENS = 17


def _layer_step(layer, x: Tensor, layer_state, context, with_stats: bool):
    return layer(x, layer_state, context, with_stats)


def _head(model, hidden: Tensor) -> Tensor:
    return model.logits(hidden)


class CompiledSteps(Steps):
    """A model's layers and head through torch.compile: one graph per layer kind for decode
    (T = 1) and one with dynamic shapes for prefill; and, where the family has one, the whole
    one-sequence decode step as one graph."""

    def __init__(self, model) -> None:
        self.seconds: dict[str, float] = {}  # what compiling took, by kind of step (filled by `compile_steps`)
        self.decode_layer = torch.compile(_layer_step, dynamic=False)
        # a code object of its own: compiled graphs are cached per code object
        self.prefill_layer = torch.compile(lambda *args: _layer_step(*args), dynamic=True)
        self.head_step = torch.compile(_head, dynamic=False)
        whole = model.whole_decode_step
        self.decode_step = torch.compile(whole, dynamic=False) if whole is not None else None

    def layer(self, layer, x: Tensor, layer_state, context, with_stats: bool):
        step = self.decode_layer if x.shape[1] == 1 else self.prefill_layer
        return step(layer, x, layer_state, context, with_stats)

    def head(self, model, hidden: Tensor) -> Tensor:
        return self.head_step(model, hidden)

    def decode(self, model, token_ids: Tensor, state, with_stats: bool):
        if self.decode_step is None or token_ids.shape[0] != 1:
            return super().decode(model, token_ids, state, with_stats)
        logits, stats = model.decode_through(self.decode_step, token_ids, state)
        return logits, stats if with_stats else None  # as layer by layer: unread stats are not checked


def wanted(model, device: torch.device, weight_bytes: int) -> bool:
    """Whether to compile this model's steps: asked for by the environment, or worth it."""
    setting = os.environ.get(ENV, "").strip()
    if setting == "0" or device.type != "cpu" or not model.compiles:
        return False
    return setting == "1" or weight_bytes >= MIN_WEIGHT_BYTES


def compile_steps(model) -> bool:
    """Run `model`'s steps compiled from now on, checked first on scratch states.

    Returns whether the model now runs compiled; on any failure it stays eager.
    """
    # One compiled function serves every layer of a kind; variants: kind × batch size ×
    # diagnostics on/off × stacked rows. The default limit (8) would be reached.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    eager = model.steps
    model.steps = model.compiled = CompiledSteps(model)
    try:
        from torch._inductor import inductor_prims  # noqa: F401 - registers the prim `ops.linear` uses (1 s to import)

        zeros = torch.zeros(1, WARM_UP_TOKENS, dtype=torch.long, device=model.device)
        started = time.perf_counter()
        model.prefill(zeros, model.new_state(1))
        prefilled = time.perf_counter()
        model.decode(zeros[:, 0], model.new_state(1))
        model.compiled.seconds = {"prefill": prefilled - started, "decode": time.perf_counter() - prefilled}
    except Exception as e:  # noqa: BLE001 - any compiler failure means: run eagerly
        model.steps, model.compiled = eager, None
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        print(f"summarize: running without torch.compile ({first_line[:200]})", file=sys.stderr)
        return False
    return True


def keep_kernels_across_reboots() -> None:
    """Point inductor's on-disk cache at the user's cache folder, unless the environment chose
    one or the folder cannot be made (then torch's default under /tmp serves).

    Takes effect only before torch._dynamo is imported, which sets the variable to its default.
    """
    if os.environ.get(CACHE_ENV):
        return
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = Path(base) / "summarize" / "torchinductor"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return
    if os.access(folder, os.W_OK):
        os.environ[CACHE_ENV] = str(folder)
