"""The chunked Gated Delta Rule on a GPU through flash-linear-attention's Triton kernels.

Optional: used for prefill on CUDA when the extra is installed (`pip install '.[fla]'`, which
brings fla-core), else the torch path of ``gated_delta_rule`` runs there as everywhere. Same
conventions as that module (q, k L2-normalised, g log-space, beta in (0, 1), state [B, H, K, V]
fp32), except that q and k keep their own heads: the kernels map value head h to key head
h // (H_v / H_k), as the model's grouping does.

The kernels are called piece by piece, as fla's own ``chunk_gated_delta_rule_fwd`` does, because
its public function does not return u_t, what each token writes into the state, which the
diagnostics need (docs/design.md §4: delta_norm). The pieces are those of fla-core 0.5.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from summarize.engine.diagnostics import RecurrenceStats
from summarize.engine.ops.fla_support import on_device, turn_off, usable

__all__ = ["fla_chunk_gated_delta_rule", "fla_usable"]

FLA_CHUNK_TOKENS = 64  # the kernels' fused intra-chunk solve is written for 64


@functools.cache
def _kernels():
    """fla's forward pieces, or None when fla-core (or Triton) is not importable."""
    try:
        from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
        from fla.ops.common.chunk_o import chunk_fwd_o
        from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
        from fla.ops.utils import chunk_local_cumsum
        from fla.ops.utils.constant import RCP_LN2
    except Exception:  # ImportError, or Triton failing to find a backend at import
        return None
    return chunk_local_cumsum, RCP_LN2, chunk_gated_delta_rule_fwd_intra, chunk_gated_delta_rule_fwd_h, chunk_fwd_o


def fla_usable(device: torch.device) -> bool:
    """True on a CUDA device with fla-core importable, until one of fla's kernels fails."""
    return usable(device, _kernels)


@torch.no_grad()
def fla_chunk_gated_delta_rule(
    *, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial_state: Tensor, with_stats: bool = True
) -> tuple[Tensor, Tensor, RecurrenceStats | None] | None:
    """The recurrence over a span from ``initial_state`` (not modified), in fla's kernels; None if
    they fail (fla is then turned off for the process: the caller runs the torch path).

    Args:
        q, k: [B, T, H_k, K], L2-normalised over K (any float dtype; the kernels read v's).
        v: [B, T, H, V], H a multiple of H_k.
        g: [B, T, H], log-space decay <= 0.  beta: [B, T, H], in (0, 1).
        initial_state: [B, H, K, V] fp32.

    Returns:
        o: [B, T, H, V] in v.dtype; final_state: [B, H, K, V] fp32; stats or None.
    """
    try:
        return _chunk(q, k, v, g, beta, initial_state, with_stats)
    except Exception as error:  # noqa: BLE001 - a kernel that cannot run here: the torch path can
        turn_off(error)
        return None


def _chunk(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, with_stats: bool):
    local_cumsum, rcp_ln2, intra, recurrence, output = _kernels()
    B, T, Hk, K = k.shape
    H = v.shape[2]
    C = FLA_CHUNK_TOKENS
    dtype = v.dtype
    q_in, k_in, v = (x.to(dtype).contiguous() for x in (q, k, v))
    with on_device(v.device):
        # the kernels work in base 2: g is summed within each chunk and scaled by 1/ln 2
        g_cum = local_cumsum(g.float().contiguous(), chunk_size=C, scale=rcp_ln2)
        w, u, _ = intra(k=k_in, v=v, g=g_cum, beta=beta.to(dtype).contiguous(), chunk_size=C)
        chunk_states, u, final = recurrence(
            k=k_in, w=w, u=u, g=g_cum, initial_state=state.float().contiguous(), output_final_state=True, chunk_size=C
        )
        o = output(q=q_in, k=k_in, v=u, h=chunk_states, g=g_cum, scale=K**-0.5, chunk_size=C)
    if not with_stats:
        return o, final, None
    # u here is u_t = beta_t (v_t - (alpha_t S_{t-1})^T k_t), token by token
    k_sq = k.float().square().sum(-1).repeat_interleave(H // Hk, dim=2)  # [B, T, H]
    u_sq = u.float().square().sum(-1)
    delta_norm = (k_sq * u_sq).sum(-1).sqrt().mean(-1)
    state_norm = final.reshape(B, -1).norm(dim=-1)
    gate_mean = g.float().exp().mean(dim=(1, 2))
    return o, final, RecurrenceStats(state_norm=state_norm, gate_mean=gate_mean, delta_norm=delta_norm)
