"""The model's steps through `torch.compile`, swapped in from outside the model, with a clean fall
back to eager execution.

Decoding one token is memory-bound: compiled, each layer becomes a few fused loops around its
projections (in bf16 each a streaming reduction, where torch's bf16 GEMM reads the weights slowly
for one row; in fp32 torch's GEMM, `ops.linear`), where eagerly the small ops around each layer add
their own passes. One compiled
function serves every layer of a kind (its weights are the graph's inputs), so a model compiles
a handful of small graphs, not one per layer. Prefill compiles with dynamic shapes, so one graph
per layer kind serves every length; the delta rule stays one opaque op. Decode graphs are
specialised on the batch size and compiled when a batch of that size first decodes. Nothing is
compiled at load: the prefill graphs are built when the model first reads a full block
(`PREFILL_COMPILE_TOKENS`), and shorter reads run eagerly until then, so a run that reads little
(a summary written from cached notes) does not pay for a compile that would cost more than it
saves. The graphs that verify drafted tokens (dynamic shapes, recording what lands each prefix)
are built at a batch size's `EAGER_VERIFIES + 1`-th verify pass: where drafts do not pay, the
planner stops after a probe or two, and nothing is compiled for them.
`announce` hears of each compile while it runs. Every graph (the layers' and the head's) is kept on disk whole
(`compiled_store`), so a later process loads them rather than tracing them again; inductor caches
its kernels there too (`~/.cache/summarize/torchinductor`, or under `XDG_CACHE_HOME`;
`TORCHINDUCTOR_CACHE_DIR` wins). If compiling a step fails (tried on a scratch state at its first
use), that step runs eagerly from there and says so on stderr, once; where the calibration found no
working compiler at the load, no step is compiled. Figures: docs/performance.md.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from summarize.engine.compiled_store import StepStore, StoredGraph, call, default_store, own_call
from summarize.engine.model import Steps
from summarize.engine.ops import machine
from summarize.errors import first_line
from summarize.files import user_cache_folder

ENV = "SUMMARIZE_COMPILE"  # "0": never compile, "1": always (where the device allows)
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"  # where inductor keeps the kernels it built
ISA_CHECK_ENV = "TORCHINDUCTOR_VEC_ISA_OK"  # set: inductor's own choice about probing the CPU's vector ISAs
MIN_WEIGHT_BYTES = 200 * 2**20  # below this, compiling takes longer than it saves
# Tokens of the prefill warm-up past the rows int4 switches kernels at (the largest switch), and at
# least this many, so that the graph it builds is the one a full block runs; 3 more makes a length
# that equals no other dimension (67 by default), so that the graph keeps the length symbolic rather
# than tying it to a size
WARM_UP_MIN_ROWS = 64
WARM_UP_EXTRA_TOKENS = 3
# A read of this many tokens builds the prefill graphs (a prefill block is at most 1,024 tokens):
# shorter reads before it run eagerly
PREFILL_COMPILE_TOKENS = 1024
# A batch size's first verify passes run eagerly (slower than compiled ones, but a compile costs
# more than a few of them), its graphs are compiled at the next
EAGER_VERIFIES = 8
# The shortest span a compiled verify runs: a shorter draft is padded to it. With two tokens and one
# row, the projections would stream the weights as a decode step does (`ops.linear`), a graph of
# its own to compile.
VERIFY_MIN_TOKENS = 3


def _head(model, hidden: Tensor) -> Tensor:
    return model.logits(hidden)


class Graphs(NamedTuple):
    """What runs the layers in one kind of step (decode, prefill, verify), each called as
    `graph(callable, *args)`: `layer` whole layers, `before` and `after` the halves of a layer that
    reads a cache (`_run`). Compiled, each has code of its own, where dynamo keeps its graphs: a
    shorter list to look up at every call."""

    layer: Callable
    before: Callable
    after: Callable


EAGER = Graphs(call, call, call)


def _graphs(step: str, dynamic: bool, store: StepStore | None) -> Graphs:
    """A kind of step's graphs: kept in `store` (`compiled_store`), else traced in every process."""
    if store is not None:
        return Graphs(*(StoredGraph(store, f"{step} {role}", dynamic) for role in Graphs._fields))
    return Graphs(*(torch.compile(own_call(), dynamic=dynamic) for _ in Graphs._fields))


def _run(graphs: Graphs, layer, x: Tensor, layer_state, context, with_stats: bool):
    """One layer through `graphs`. A layer that reads a cache (`model.Steps.layer`) reads it
    eagerly between two graphs: a graph break inside one compiled call would trace every frame
    around it twice, in every process."""
    if not getattr(layer, "reads_cache", False):
        return graphs.layer(layer, x, layer_state, context, with_stats)
    parts = graphs.before(layer.before_cache, x, context)
    return graphs.after(layer.after_cache, x, layer.read_cache(parts, layer_state), with_stats)


class CompiledSteps(Steps):
    """A model's layers and head through torch.compile: one graph per layer kind for decode
    (T = 1, per batch size), one with dynamic shapes for prefill, one for verifying drafts."""

    def __init__(self, store: StepStore | None = None) -> None:
        self.seconds: dict[str, float] = {}  # what compiling took, by step ("prefill", "decode B=8")
        # Told what is being compiled while it is (a str), then that it is done (None).
        self.announce: Callable[[str | None], None] | None = None
        self.prefill_from = PREFILL_COMPILE_TOKENS  # the read that builds the prefill graphs
        self.eager_verifies = EAGER_VERIFIES  # per batch size, before its verify graphs are built
        self.prefill_ready = False  # whether prefill runs through its graphs (or they failed: eager)
        self.verified: dict[int, int] = {}  # batch size -> verify passes run
        self.said_eager = False
        self.decode_graphs = _graphs("decode", dynamic=False, store=store)
        self.prefill_graphs = _graphs("prefill", dynamic=True, store=store)
        self.verify_graphs = _graphs("verify", dynamic=True, store=store)
        self.head_step = StoredGraph(store, "head", dynamic=False) if store is not None else torch.compile(own_call(), dynamic=False)

    def layer(self, layer, x: Tensor, layer_state, context, with_stats: bool):
        verifying = x.shape[1] > 1 and layer_state.drafting
        if x.shape[1] == 1:
            graphs = self.decode_graphs
        elif not verifying:
            graphs = self.prefill_graphs if self.prefill_ready else EAGER
        else:
            graphs = self.verify_graphs if self.compiles_verify(x.shape[0]) else EAGER
        if not verifying:
            return _run(graphs, layer, x, layer_state, context, with_stats)
        # A draft's first length may equal a state dimension (the conv window's 3); left to
        # itself, dynamo would tie the two and compile again for the next length.
        with torch.fx.experimental._config.patch(use_duck_shape=False):
            return _run(graphs, layer, x, layer_state, context, with_stats)

    def will_read(self, model, tokens: int) -> None:
        if self.prefill_ready or tokens < self.prefill_from:
            return
        self.prefill_ready = True

        def on_scratch():
            from torch._inductor import inductor_prims  # noqa: F401 - registers the prim `ops.linear` uses (slow to import)

            tokens = max(machine.POLICY.int4_kernel_max_rows, WARM_UP_MIN_ROWS) + WARM_UP_EXTRA_TOKENS
            model.run_layers(torch.zeros(1, tokens, dtype=torch.long, device=model.device), model.new_state(1), True)

        self._first_use("prefill", "compiling the prefill step", {"prefill_graphs": EAGER}, on_scratch)

    def head(self, model, hidden: Tensor) -> Tensor:
        return self.head_step(_head, model, hidden)

    def decode(self, model, token_ids: Tensor, state, with_stats: bool):
        rows = token_ids.shape[0]
        step = f"decode B={rows}" + (" with diagnostics" if with_stats else "")
        if step not in self.seconds:
            self._first_use(step, f"compiling the decode step for {_rows(rows)}", {"decode_graphs": EAGER, "head_step": call},
                            lambda: super(CompiledSteps, self).decode(model, token_ids, model.new_state(rows), with_stats))
        return super().decode(model, token_ids, state, with_stats)

    def compiles_verify(self, rows: int) -> bool:
        """Whether verify passes of `rows` rows run through their graphs (past the eager ones)."""
        return self.verified.get(rows, 0) > self.eager_verifies

    def verify(self, model, token_ids: Tensor, state) -> Tensor:
        rows = token_ids.shape[0]
        self.verified[rows] = self.verified.get(rows, 0) + 1
        if not self.compiles_verify(rows):
            return super().verify(model, token_ids, state)
        if f"verify B={rows}" not in self.seconds:
            def on_scratch():
                scratch = model.new_state(rows)
                self._verify_padded(model, token_ids, scratch)
                scratch.accept(torch.ones(rows, dtype=torch.long, device=token_ids.device))

            self._first_use(f"verify B={rows}", f"compiling the verify step for {_rows(rows)}", {"verify_graphs": EAGER}, on_scratch)
        return self._verify_padded(model, token_ids, state)

    def _verify_padded(self, model, token_ids: Tensor, state) -> Tensor:
        """One graph for every length: a span shorter than VERIFY_MIN_TOKENS is padded with its
        last token, and the padding's logits dropped (it is never accepted)."""
        rows, tokens = token_ids.shape
        if tokens < VERIFY_MIN_TOKENS:
            padding = token_ids[:, -1:].expand(rows, VERIFY_MIN_TOKENS - tokens)
            return super().verify(model, torch.cat([token_ids, padding], dim=1), state)[:, :tokens]
        return super().verify(model, token_ids, state)

    def _first_use(self, step: str, what: str, graphs: dict[str, Callable], on_scratch: Callable[[], object]) -> None:
        """A step's first call at a shape compiles its graphs (or reads them from disk): run it once
        on a scratch state, so that should compiling fail, the real state is untouched and each of
        `graphs` (attribute -> what runs eagerly instead) runs eagerly from then on."""
        self.say(what)
        started = time.perf_counter()
        try:
            on_scratch()
        except Exception as e:  # noqa: BLE001 - any compiler failure means: run this step eagerly
            for attribute, eager in graphs.items():
                setattr(self, attribute, eager)
            if not self.said_eager:
                self.said_eager = True
                _say_eager(e)
        finally:
            self.seconds[step] = time.perf_counter() - started
            self.say(None)

    def say(self, what: str | None) -> None:
        if self.announce is not None:
            self.announce(what)


def _rows(rows: int) -> str:
    return f"{rows} row{'s' if rows > 1 else ''}"


def _say_eager(error: Exception) -> None:
    why = first_line(error)
    print(f"summarize: running without torch.compile ({why[:200]})", file=sys.stderr)


def wanted(model, device: torch.device, weight_bytes: int) -> bool:
    """Whether to compile this model's steps: asked for by the environment, or worth it."""
    setting = os.environ.get(ENV, "").strip()
    if setting == "0" or device.type != "cpu" or not model.compiles:
        return False
    return setting == "1" or weight_bytes >= MIN_WEIGHT_BYTES


def compile_steps(model, announce: Callable[[str | None], None] | None = None) -> None:
    """Run `model`'s steps compiled from now on; each is built at its first use (see the module
    docstring). `announce`: `CompiledSteps.announce`."""
    prepare_compiler()
    steps = CompiledSteps(default_store())
    steps.announce = announce
    model.steps = model.compiled = steps


def prepare_compiler() -> None:
    """Set torch.compile up as the engine's steps need it, before anything is compiled in this
    process (the calibration's compiled candidates too): inductor's kernels kept in the user's
    cache folder, the CPU's vector flags trusted."""
    # One compiled function serves every layer of a kind; variants: kind × batch size ×
    # diagnostics on/off × stacked rows. The default limit (8) would be reached.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    # A layer's float constants (norm epsilons, scales) taken as they are: traced as symbols, each
    # graph that holds one is traced twice, every process, its first trace missing the cache
    torch._dynamo.config.specialize_float = True
    keep_kernels_across_reboots()
    trust_the_cpus_vector_flags()


def trust_the_cpus_vector_flags() -> None:
    """Let inductor take the vector ISAs the CPU reports (/proc/cpuinfo) without proving each one
    by compiling and loading a probe program, which every process would pay for. Should the
    compiler fail to build for the ISA after all, each step's first compile fails and it runs
    eagerly."""
    if os.environ.get(ISA_CHECK_ENV) is None:
        torch._inductor.config.cpp.vec_isa_ok = True


def keep_kernels_across_reboots() -> None:
    """Point inductor's on-disk cache at the user's cache folder, unless the environment chose
    one or the folder cannot be made (then torch's default under /tmp serves).

    Inductor reads the variable each time it opens a cache, so this holds from the next compile on.
    Importing torch._dynamo writes torch's default folder into it: that value counts as unchosen.
    """
    chosen = os.environ.get(CACHE_ENV)
    if chosen and chosen != os.path.abspath(default_cache_dir()):
        return
    folder = user_cache_folder() / "torchinductor"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return
    if os.access(folder, os.W_OK):
        os.environ[CACHE_ENV] = str(folder)
