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

import hashlib
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from summarize.engine.model import EAGER_STEPS, Steps

ENV = "SUMMARIZE_COMPILE"  # "0": never compile, "1": always (where the device allows)
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"  # where inductor keeps the kernels it built
MIN_WEIGHT_BYTES = 200 * 2**20  # below this, compiling takes longer than it saves
# Tokens of the prefill warm-up: a length that equals no other dimension, so that the graph
# keeps the length symbolic rather than tying it to a model size
WARM_UP_TOKENS = 17
COMPILER_THREAD = "summarize-compile"  # a first run's compiler (`compile_in_background`)


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
    compiled = _compiled_or_none(model)
    if compiled is not None:
        model.steps = model.compiled = compiled
    return compiled is not None


def compile_in_background(model, notify: Callable[[str], None]) -> None:
    """Compile `model`'s steps without making the reader wait where it need not.

    Where this machine has built these graphs before, compile now: inductor's disk cache makes it
    quick, and the run reads compiled from its first token, so its text is every later run's. A
    first run instead compiles on a thread while the model reads eagerly: prefill (large GEMMs,
    little Python) runs beside the compiler, and the first decode step waits for it, because an
    eager decode step is Python-bound and would crawl beside the compiler's Python. Once ready,
    the compiled steps take over at the next span (`notify` says when). Rounding then differs a
    little from later runs' in the spans read eagerly.
    """
    stamp = _warm_stamp(model)
    if stamp is None or stamp.exists():  # no folder for stamps: as before, compile first
        compile_steps(model)
        return
    waiting = CompilingSteps(model, notify)
    model.steps = waiting
    waiting.thread.start()


def compiler_running() -> bool:
    """Whether a first run's compiler thread is still at work."""
    return any(thread.name == COMPILER_THREAD and thread.is_alive() for thread in threading.enumerate())


class CompilingSteps(Steps):
    """The steps while a first run compiles on a thread: prefill eagerly, and at the first decode
    step wait for the compiled steps (or stay eager, if compiling failed)."""

    def __init__(self, model, notify: Callable[[str], None]) -> None:
        self.model, self.notify = model, notify
        self.started = time.perf_counter()
        self.thread = threading.Thread(target=self._compile, name=COMPILER_THREAD, daemon=True)

    def _compile(self) -> None:
        compiled = _compiled_or_none(self.model)
        if compiled is None:
            self.model.steps = EAGER_STEPS
            return
        self.model.steps = self.model.compiled = compiled  # the next span runs compiled
        stamp = _warm_stamp(self.model)
        if stamp is not None:
            stamp.touch()
        seconds = ", ".join(f"{s:.0f} s {kind}" for kind, s in compiled.seconds.items())
        self.notify(f"compiled steps ready after {time.perf_counter() - self.started:.0f} s ({seconds})")

    def decode(self, model, token_ids: Tensor, state, with_stats: bool):
        self.await_decode()
        return model.steps.decode(model, token_ids, state, with_stats)

    def await_decode(self) -> None:
        if self.thread.is_alive():
            self.notify(f"waiting for the compiled decode step (compiling for {time.perf_counter() - self.started:.0f} s)")
            self.thread.join()


def _compiled_or_none(model) -> CompiledSteps | None:
    """The model's compiled steps, warmed up on scratch states; None (said once on stderr) when
    the compiler fails. The model's own steps and listener are left alone."""
    # One compiled function serves every layer of a kind; variants: kind × batch size ×
    # diagnostics on/off × stacked rows. The default limit (8) would be reached.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    compiled = CompiledSteps(model)
    try:
        from torch._inductor import inductor_prims  # noqa: F401 - registers the prim `ops.linear` uses (1 s to import)

        with torch.no_grad():
            zeros = torch.zeros(1, WARM_UP_TOKENS, dtype=torch.long, device=model.device)
            started = time.perf_counter()
            model.run_layers(zeros, model.new_state(1), with_stats=True, steps=compiled)  # as `prefill` runs a block
            prefilled = time.perf_counter()
            compiled.decode(model, zeros[:, 0], model.new_state(1), with_stats=False)
        compiled.seconds = {"prefill": prefilled - started, "decode": time.perf_counter() - prefilled}
    except Exception as e:  # noqa: BLE001 - any compiler failure means: run eagerly
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        print(f"summarize: running without torch.compile ({first_line[:200]})", file=sys.stderr)
        return None
    return compiled


def _warm_stamp(model) -> Path | None:
    """A file in inductor's cache folder saying that this torch has compiled steps for a model of
    these weight names, shapes and dtypes: emptying the cache empties the stamps with it. None
    where the folder cannot be made."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir  # after `keep_kernels_across_reboots`

    layout = [(name, tuple(t.shape), str(t.dtype)) for name, t in model.state_dict().items()]
    key = hashlib.sha256(repr((torch.__version__, type(model).__name__, str(model.device), layout)).encode()).hexdigest()
    folder = Path(cache_dir()) / "summarize-compiled"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return folder / key[:32]


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
