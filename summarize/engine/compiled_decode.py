"""The decode step through `torch.compile`, with a clean fall back to eager execution.

Decoding one token is memory-bound: it should cost the time to read the weights once. Eagerly,
torch's CPU GEMM reads bf16 weights at about half the machine's memory speed when there is one
input row, and the few dozen small ops around each layer add their own passes and dispatch.
Compiled, each layer becomes a few fused loops and every projection a streaming reduction
(`ops.linear`). Measured on a 2-core Zen 4, Qwen3.5-0.8B shape, bf16: see the README's
Performance table.

Only single-token steps are compiled; prefill stays eager (it is compute-bound, and its lengths
vary). Graphs are specialised on the batch size, so each new batch size compiles once; inductor
caches what it built on disk, so later processes start faster. If compiling fails (no C++
compiler, an unsupported platform) the model stays eager and says so once on stderr.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Callable

import torch

ENV = "SUMMARIZE_COMPILE"  # "0": never compile, "1": always (where the device allows)
MIN_WEIGHT_BYTES = 200 * 2**20  # below this, compiling takes longer than it saves


@dataclass
class CompiledDecode:
    layer: Callable  # (layer, x, layer_state, rotary, with_stats) -> (x, stats)
    head: Callable  # (model, hidden [B, H]) -> logits [B, V]


def wanted(model, device: torch.device, weight_bytes: int) -> bool:
    """Whether to compile this model's decode step: asked for by the environment, or worth it."""
    setting = os.environ.get(ENV, "").strip()
    if setting == "0" or device.type != "cpu" or not hasattr(model, "compiled"):
        return False
    return setting == "1" or weight_bytes >= MIN_WEIGHT_BYTES


def compile_decode(model, layer_step: Callable, head: Callable) -> bool:
    """Compile `layer_step` and `head` for `model.decode`, check them on a scratch state.

    Returns whether the model now decodes compiled; on any failure it stays eager.
    """
    # One compiled function serves every layer of a kind; variants: kind × batch size ×
    # diagnostics on/off × stacked rows. The default limit (8) would be reached.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    model.compiled = CompiledDecode(
        layer=torch.compile(layer_step, dynamic=False), head=torch.compile(head, dynamic=False)
    )
    try:
        model.decode(torch.zeros(1, dtype=torch.long, device=model.device), model.new_state(1))
    except Exception as e:  # noqa: BLE001 - any compiler failure means: run eagerly
        model.compiled = None
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        print(f"summarize: decoding without torch.compile ({first_line[:200]})", file=sys.stderr)
        return False
    return True
