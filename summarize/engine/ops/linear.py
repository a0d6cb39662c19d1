"""`linear`: x @ wᵀ, written so that a compiled decode step streams the weights at memory speed.

Eagerly it is `F.linear`. Inside `torch.compile` it is a multiply-and-sum over the input
dimension, which inductor turns into one pass over the weight rows with the bf16 → fp32
conversion fused in. With one or a few input rows (decode) that reads the weights about 1.5× as
fast as torch's GEMM does on the CPU (measured on a 2-core Zen 4, 0.8B shape: the 248K × 1024
head 32.8 → 12.9 ms; all layers and the head 80 → 51 ms), because the GEMM is built for many
rows. Prefill never goes through the compiled path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """x [..., K] times weight [N, K] transposed → [..., N] in x's dtype, accumulated in fp32."""
    if not torch.compiler.is_compiling():
        return F.linear(x, weight)
    rows = x.reshape(-1, x.shape[-1]).float()
    # [N, rows, K] summed over K: the loop runs over weight rows outermost, so each one is read
    # from memory once however many input rows there are.
    out = (weight.float()[:, None, :] * rows[None]).sum(-1)
    return out.t().reshape(*x.shape[:-1], weight.shape[0]).to(x.dtype)
