"""RWKV-7's chunked state update on a GPU through flash-linear-attention's Triton kernels.

Optional, as ``gated_delta_rule_fla``: used for prefill on CUDA when fla-core is installed (the
extra `fla`), else ``rwkv7_wkv.chunk_rwkv7`` runs there as everywhere. Same conventions as that
module; fla's diagonal-plus-low-rank rule is the same recurrence, with q = r, gk = log_w, scale 1:
S_t = diag(w_t) S_{t-1} + b_t (S_{t-1}^T a_t)^T + k_t v_t^T.

fla's ``chunk_dplr_fwd`` is called rather than its public ``chunk_rwkv7`` because only the former
hands back u_t = S_{t-1}^T a_t (its ``v_new``), which the diagnostics need (docs/design.md §4).
fla-core 0.5.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from summarize.engine.diagnostics import RecurrenceStats
from summarize.engine.ops.fla_support import on_device, turn_off, usable

__all__ = ["fla_chunk_rwkv7", "fla_usable"]

FLA_CHUNK_TOKENS = 16  # fla's own choice for this rule


@functools.cache
def _forward():
    """fla's chunked forward of the diagonal-plus-low-rank rule, or None without fla-core (or Triton)."""
    try:
        from fla.ops.generalized_delta_rule.dplr.chunk import chunk_dplr_fwd
    except Exception:  # ImportError, or Triton failing to find a backend at import
        return None
    return chunk_dplr_fwd


def fla_usable(device: torch.device) -> bool:
    """True on a CUDA device with fla-core importable, until one of fla's kernels fails."""
    return usable(device, _forward)


@torch.no_grad()
def fla_chunk_rwkv7(
    *, r: Tensor, log_w: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor,
    initial_state: Tensor, dtype: torch.dtype, with_stats: bool = True,
) -> tuple[Tensor, Tensor, RecurrenceStats | None] | None:
    """As ``rwkv7_wkv.chunk_rwkv7`` from ``initial_state`` (not modified), in fla's kernels; None if
    they fail (fla is then turned off for the process: the caller runs the torch path).

    Args:
        r, k, a, b: [B, T, H, K].  log_w: [B, T, H, K], log-space decay.  v: [B, T, H, V].
        initial_state: [B, H, K, V] fp32.
        dtype: what the kernels read r, k, v, a, b in (the model's dtype); decays stay fp32.

    Returns:
        o: [B, T, H, V] fp32; final_state: [B, H, K, V] fp32; stats or None.
    """
    B, T = k.shape[:2]
    r_in, k_in, v_in, a_in, b_in = (x.to(dtype).contiguous() for x in (r, k, v, a, b))
    try:
        with on_device(v.device):
            o, final, _, pieces = _forward()(
                q=r_in, k=k_in, v=v_in, a=a_in, b=b_in, gk=log_w.float().contiguous(), scale=1.0,
                initial_state=initial_state.float().contiguous(), output_final_state=True,
                chunk_size=FLA_CHUNK_TOKENS, disable_recompute=True,  # keeps the intermediates, u among them
            )
    except Exception as error:  # noqa: BLE001 - a kernel that cannot run here: the torch path can
        turn_off(error)
        return None
    o = o.float()
    if not with_stats:
        return o, final, None
    *_, u, _ = pieces  # (gi, ge, A_qk, A_qb, A_ak, qg, kg, ag, bg, w, h, v_new, A_ab_inv)
    k32, v32, b32, u32 = (x.float() for x in (k_in, v_in, b_in, u))
    # ||b u^T + k v^T||_F^2 = |b|^2 |u|^2 + |k|^2 |v|^2 + 2 (b.k)(u.v), per token and head
    sq = (
        b32.square().sum(-1) * u32.square().sum(-1)
        + k32.square().sum(-1) * v32.square().sum(-1)
        + 2 * (b32 * k32).sum(-1) * (u32 * v32).sum(-1)
    )
    stats = RecurrenceStats(
        state_norm=final.reshape(B, -1).norm(dim=-1),
        gate_mean=log_w.float().exp().mean(dim=(1, 2, 3)),
        delta_norm=sq.clamp(min=0).sum(-1).sqrt().mean(-1),
    )
    return o, final, stats
