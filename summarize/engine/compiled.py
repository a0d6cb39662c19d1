"""The model's steps through `torch.compile`, with a clean fall back to eager execution.

Decoding one token is memory-bound: it should cost the time to read the weights once. Eagerly,
torch's CPU GEMM reads bf16 weights at about half the machine's memory speed when there is one
input row, and the few dozen small ops around each layer add their own passes and dispatch.
Compiled, each layer becomes a few fused loops and every projection a streaming reduction
(`ops.linear`).

Prefill is compute-bound in its projections, but around them each layer makes a dozen passes
over activations of tokens × thousands of channels (conversions, the causal conv, norms, gates),
which eagerly cost about as much again as the matmuls of a Gated DeltaNet layer. Compiled with
dynamic shapes, one graph per layer kind serves every length; the delta rule itself stays one
opaque op (`ops.gated_delta_rule.chunk_rule_op`). Measured on a 2-core Zen 4, Qwen3.5-0.8B
shape, bf16: see the README's Performance table.

Decoding one sequence runs every layer and the head as one graph (Qwen3.5 dense): per-layer
graphs cost their calls' overhead ~30 times a token (0.8B shape, bf16, measured side by side:
56.8 → 50.2 ms/token while the machine read memory at ~34 GB/s). Batches decode layer by layer.
Decode graphs are specialised on the batch size, so each new batch size compiles once; prefill
graphs compile once for one row and once for several. Inductor caches what it built on disk, so
later processes start faster (0.8B shape: 76 s cold, 18 s warm). The cache lives in the user's
cache folder (`~/.cache/summarize/torchinductor`, or under `XDG_CACHE_HOME`), not in torch's
default under /tmp, which a reboot empties; `TORCHINDUCTOR_CACHE_DIR` still wins. If compiling
fails (no C++ compiler, an unsupported platform) the model stays eager and says so once on stderr.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

ENV = "SUMMARIZE_COMPILE"  # "0": never compile, "1": always (where the device allows)
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"  # where inductor keeps the kernels it built
MIN_WEIGHT_BYTES = 200 * 2**20  # below this, compiling takes longer than it saves
# Tokens of the prefill warm-up: a length that equals no other dimension, so that the graph
# keeps the length symbolic rather than tying it to a model size
WARM_UP_TOKENS = 17


@dataclass
class CompiledSteps:
    decode_layer: Callable  # (layer, x [B, 1, H], layer_state, rotary, with_stats) -> (x, stats)
    prefill_layer: Callable  # the same over [B, T, H], T > 1, any T
    head: Callable  # (model, hidden [B, H]) -> logits [B, V]
    # (model, x [1, 1, H], layer_states, rotary, slot, with_stats) -> (logits [1, V], stats):
    # every layer and the head at once, for one sequence; None: decode layer by layer
    decode_step: Callable | None = None


def wanted(model, device: torch.device, weight_bytes: int) -> bool:
    """Whether to compile this model's steps: asked for by the environment, or worth it."""
    setting = os.environ.get(ENV, "").strip()
    if setting == "0" or device.type != "cpu" or not hasattr(model, "compiled"):
        return False
    return setting == "1" or weight_bytes >= MIN_WEIGHT_BYTES


def compile_steps(model, layer_step: Callable, head: Callable, decode_step: Callable | None = None) -> bool:
    """Compile `layer_step` for decode and for prefill, `head`, and `decode_step` (a whole
    one-sequence decode step) where given; check them on scratch states.

    Returns whether the model now runs compiled; on any failure it stays eager.
    """
    # One compiled function serves every layer of a kind; variants: kind × batch size ×
    # diagnostics on/off × stacked rows. The default limit (8) would be reached.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    model.compiled = CompiledSteps(
        decode_layer=torch.compile(layer_step, dynamic=False),
        # a code object of its own: compiled graphs are cached per code object
        prefill_layer=torch.compile(lambda *args: layer_step(*args), dynamic=True),
        head=torch.compile(head, dynamic=False),
        decode_step=torch.compile(decode_step, dynamic=False) if decode_step is not None else None,
    )
    try:
        from torch._inductor import inductor_prims  # noqa: F401 - registers the prim `ops.linear` uses (1 s to import)

        zeros = torch.zeros(1, WARM_UP_TOKENS, dtype=torch.long, device=model.device)
        model.prefill(zeros, model.new_state(1))
        model.decode(zeros[:, 0], model.new_state(1))
    except Exception as e:  # noqa: BLE001 - any compiler failure means: run eagerly
        model.compiled = None
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
