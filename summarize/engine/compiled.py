"""The model's steps through `torch.compile`, swapped in from outside the model, with a clean fall
back to eager execution.

Decoding one token is memory-bound: compiled, each layer becomes a few fused loops and every
projection a streaming reduction (`ops.linear`), where eagerly torch's CPU GEMM reads the weights
slowly for one row and the small ops around each layer add their own passes. One compiled
function serves every layer of a kind (its weights are the graph's inputs), so a model compiles
a handful of small graphs, not one per layer. Prefill compiles with dynamic shapes, so one graph
per layer kind serves every length; the delta rule stays one opaque op. Decode graphs are
specialised on the batch size and compiled when a batch of that size first decodes: loading
compiles the prefill graphs only, so a first run starts reading as soon as they are built.
`announce` hears of each compile while it runs. Inductor caches what it built on disk
(`~/.cache/summarize/torchinductor`, or under `XDG_CACHE_HOME`; `TORCHINDUCTOR_CACHE_DIR` wins),
so later processes start faster. If compiling fails (the prefill graphs at load, a decode graph at
its first step, tried on a scratch state), the model runs eagerly from there and says so on stderr. Figures: docs/performance.md.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import torch
from torch import Tensor

from summarize.engine.model import Steps
from summarize.user_cache import user_cache_folder

ENV = "SUMMARIZE_COMPILE"  # "0": never compile, "1": always (where the device allows)
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"  # where inductor keeps the kernels it built
ISA_CHECK_ENV = "TORCHINDUCTOR_VEC_ISA_OK"  # set: inductor's own choice about probing the CPU's vector ISAs
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
    (T = 1, per batch size) and one with dynamic shapes for prefill."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}  # what compiling took, by step ("prefill", "decode B=8")
        # Told what is being compiled while it is (a str), then that it is done (None).
        self.announce: Callable[[str | None], None] | None = None
        self.decode_layer = torch.compile(_layer_step, dynamic=False)
        # a code object of its own: compiled graphs are cached per code object
        self.prefill_layer = torch.compile(lambda *args: _layer_step(*args), dynamic=True)
        self.head_step = torch.compile(_head, dynamic=False)

    def layer(self, layer, x: Tensor, layer_state, context, with_stats: bool):
        step = self.decode_layer if x.shape[1] == 1 else self.prefill_layer
        return step(layer, x, layer_state, context, with_stats)

    def head(self, model, hidden: Tensor) -> Tensor:
        return self.head_step(model, hidden)

    def decode(self, model, token_ids: Tensor, state, with_stats: bool):
        rows = token_ids.shape[0]
        step = f"decode B={rows}" + (" with diagnostics" if with_stats else "")
        if step not in self.seconds:
            # This batch size's first step compiles its graphs (or reads them from disk), on a
            # scratch state: should compiling fail, the real state is untouched and runs eagerly.
            self.say(f"compiling the decode step for {rows} row{'s' if rows > 1 else ''}")
            started = time.perf_counter()
            try:
                super().decode(model, token_ids, model.new_state(rows), with_stats)
            except Exception as e:  # noqa: BLE001 - any compiler failure means: decode eagerly
                self.decode_layer = _layer_step
                _say_eager(e)
            finally:
                self.seconds[step] = time.perf_counter() - started
                self.say(None)
        return super().decode(model, token_ids, state, with_stats)

    def say(self, what: str | None) -> None:
        if self.announce is not None:
            self.announce(what)


def _say_eager(error: Exception) -> None:
    first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    print(f"summarize: running without torch.compile ({first_line[:200]})", file=sys.stderr)


def wanted(model, device: torch.device, weight_bytes: int) -> bool:
    """Whether to compile this model's steps: asked for by the environment, or worth it."""
    setting = os.environ.get(ENV, "").strip()
    if setting == "0" or device.type != "cpu" or not model.compiles:
        return False
    return setting == "1" or weight_bytes >= MIN_WEIGHT_BYTES


def compile_steps(model, announce: Callable[[str | None], None] | None = None) -> bool:
    """Run `model`'s steps compiled from now on: the prefill graphs are built (and checked) now
    on a scratch state, the decode graphs on first use.

    Returns whether the model now runs compiled; on any failure it stays eager. `announce`:
    `CompiledSteps.announce`.
    """
    # One compiled function serves every layer of a kind; variants: kind × batch size ×
    # diagnostics on/off × stacked rows. The default limit (8) would be reached.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    trust_the_cpus_vector_flags()
    eager, steps = model.steps, CompiledSteps()
    model.steps = model.compiled = steps
    steps.announce = announce
    steps.say("compiling the prefill step")
    try:
        from torch._inductor import inductor_prims  # noqa: F401 - registers the prim `ops.linear` uses (1 s to import)

        zeros = torch.zeros(1, WARM_UP_TOKENS, dtype=torch.long, device=model.device)
        started = time.perf_counter()
        model.prefill(zeros, model.new_state(1))  # decode graphs compile on first use
        steps.seconds["prefill"] = time.perf_counter() - started
    except Exception as e:  # noqa: BLE001 - any compiler failure means: run eagerly
        model.steps, model.compiled = eager, None
        _say_eager(e)
        return False
    finally:
        steps.say(None)
    return True


def trust_the_cpus_vector_flags() -> None:
    """Let inductor take the vector ISAs the CPU reports (/proc/cpuinfo) without proving each one
    by compiling and loading a probe program: the probes cost a first run ~7 s and every later
    process ~1 s. Should the compiler fail to build for the ISA after all, the prefill compile at
    load fails and the model runs eagerly (`compile_steps`)."""
    if os.environ.get(ISA_CHECK_ENV) is None:
        torch._inductor.config.cpp.vec_isa_ok = True


def keep_kernels_across_reboots() -> None:
    """Point inductor's on-disk cache at the user's cache folder, unless the environment chose
    one or the folder cannot be made (then torch's default under /tmp serves).

    Takes effect only before torch._dynamo is imported, which sets the variable to its default.
    """
    if os.environ.get(CACHE_ENV):
        return
    folder = user_cache_folder() / "torchinductor"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return
    if os.access(folder, os.W_OK):
        os.environ[CACHE_ENV] = str(folder)
