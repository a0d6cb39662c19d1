"""The depthwise causal convolution (with SiLU) that Gated DeltaNet runs over its q, k, v channels."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def causal_conv_silu(x: Tensor, window: Tensor, taps: Tensor) -> Tensor:
    """SiLU(depthwise causal conv) of x [B, T, C] after window [B, kernel-1, C]; taps [kernel, C],
    kernel ≥ 2 (Qwen3.5: 4).

    Summed in fp32 as `kernel` shifted products, which a compiled step fuses into one pass: the
    new tokens shifted over zeros, then the window's share added to the first kernel-1 outputs
    (output t < kernel-1 reads window[t + j] through tap j < kernel-1-t).
    """
    kernel, T = taps.shape[0], x.shape[1]
    taps = taps.float()
    padded = F.pad(x, (0, 0, kernel - 1, 0))  # output t reads padded[t : t + kernel]
    out = padded[:, :T].float() * taps[0]
    for j in range(1, kernel):
        out = out + padded[:, j : j + T].float() * taps[j]
    window_share = torch.stack(
        [sum(window[:, t + j].float() * taps[j] for j in range(kernel - 1 - t)) for t in range(kernel - 1)], dim=1
    )
    out = out + F.pad(window_share, (0, 0, 0, T - (kernel - 1)))  # T < kernel-1: cropped
    return F.silu(out).to(x.dtype)
