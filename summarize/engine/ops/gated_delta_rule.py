"""The Gated Delta Rule (Gated DeltaNet's recurrence): one entry point and its three tiers.

- ``gated_delta_rule``: what a layer calls. It chooses the kernel (flash-linear-attention's on
  CUDA when installed, else the chunked form for a span, the single step for one token), groups
  the heads, updates the state in place and returns ``(o, stats or None)``.
- ``naive_recurrent_gated_delta_rule``: a plain per-token loop in fp32, the oracle.
- ``chunk_gated_delta_rule``: the chunked parallel (WY) form, for prefill.
- ``recurrent_step_gated_delta_rule``: one token, state updated in place, for decode.
- ``verify_gated_delta_rule``: a short span read from the state without changing it, for
  verifying drafted tokens; what it returns lands the state after any prefix of the span.

Shared conventions (B batch, T tokens, H value heads, K key dim, V value dim):

    q, k   [B, T, H, K]  L2-normalised over K; k heads already repeated to the H value heads
    v      [B, T, H, V]
    g      [B, T, H]     log-space decay, g <= 0 (alpha_t = exp(g_t) in (0, 1])
    beta   [B, T, H]     write strength, in (0, 1)
    state  [B, H, K, V]  fp32
    scale  float         q is multiplied by it inside the op; default K ** -0.5

    S_t = alpha_t S_{t-1} + k_t u_t^T,   u_t = beta_t (v_t - (alpha_t S_{t-1})^T k_t),
    o_t = S_t^T (scale q_t)

Every tier also reports the diagnostics of docs/design.md §4 as ``RecurrenceStats``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from summarize.engine.diagnostics import RecurrenceStats
from summarize.engine.ops.chunk_blocks import block_tokens
from summarize.engine.ops.gated_delta_rule_fla import fla_chunk_gated_delta_rule, fla_usable
from summarize.engine.state import Recurrence

__all__ = [
    "GATED_DELTA_RULE",
    "chunk_gated_delta_rule",
    "gated_delta_rule",
    "naive_recurrent_gated_delta_rule",
    "recurrent_step_gated_delta_rule",
    "verify_gated_delta_rule",
]

DEFAULT_CHUNK_SIZE = 64
# Tokens per chunk when a layer prefills: smaller chunks keep the solve in cache on a CPU
PREFILL_CHUNK_SIZE = 32


def gated_delta_rule(
    *, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, with_stats: bool = False
) -> tuple[Tensor, RecurrenceStats | None]:
    """The recurrence over a span from ``state``, which it advances in place.

    Args:
        q, k: [B, T, H_k, K], L2-normalised over K, their own heads: value head h reads key head
            h // (H / H_k).
        v: [B, T, H, V], H a multiple of H_k.
        g: [B, T, H], log-space decay <= 0.
        beta: [B, T, H], in (0, 1).
        state: [B, H, K, V] fp32, updated in place.
        with_stats: also measure the span's ``RecurrenceStats``.

    Returns:
        o: [B, T, H, V] in v.dtype; the stats, or None.
    """
    T = q.shape[1]
    if T > 1 and fla_usable(q.device):
        result = fla_chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, initial_state=state, with_stats=with_stats)
        if result is not None:  # None: the kernels failed here, and the torch path runs instead
            o, final, stats = result
            state.copy_(final)
            return o, stats
    groups = v.shape[2] // k.shape[2]
    if groups > 1:  # each q/k head serves consecutive v heads
        q, k = q.repeat_interleave(groups, dim=2), k.repeat_interleave(groups, dim=2)
    if T == 1:
        o, stats = recurrent_step_gated_delta_rule(
            q=q[:, 0], k=k[:, 0], v=v[:, 0], g=g[:, 0], beta=beta[:, 0], state=state, with_stats=with_stats
        )
        return o[:, None], stats
    o, final, *stats = _chunk_rule_op(q, k, v, g, beta, state, PREFILL_CHUNK_SIZE, with_stats)
    state.copy_(final)
    return o, RecurrenceStats(*stats) if with_stats else None


def verify_gated_delta_rule(
    *, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor
) -> tuple[Tensor, PendingDeltaRule]:
    """The outputs of a short span read from ``state``, which is left as it is, and what lands the
    state after any prefix of the span (docs/design.md §8).

    One chunk of the WY form: the state is read once for all the span's tokens, and the writes
    u_t come out of the same pass. Accepting the first n tokens is then one rank-n update of the
    state, S_n = exp(G_n) S_0 + sum_{t<n} exp(G_n - G_t) k_t u_t^T: no token is run again.

    Args:
        q, k: [B, T, H_k, K], L2-normalised over K (heads grouped as in ``gated_delta_rule``).
        v: [B, T, H, V].
        g: [B, T, H], log-space decay <= 0.
        beta: [B, T, H], in (0, 1).
        state: [B, H, K, V] fp32; only read.

    Returns:
        o: [B, T, H, V] in v.dtype; the ``PendingDeltaRule`` that lands a prefix.
    """
    groups = v.shape[2] // k.shape[2]
    if groups > 1:
        q, k = q.repeat_interleave(groups, dim=2), k.repeat_interleave(groups, dim=2)
    _check_shapes(q, k, v, g, beta)
    T, K = k.shape[1], k.shape[-1]
    qf, kf, vf, gf, bf = (x.float().transpose(1, 2) for x in (q, k, v, g, beta))  # heads first: [B, H, T, *]
    qf = qf * K**-0.5
    gcum = gf.cumsum(-1)
    upper = torch.ones(T, T, dtype=torch.bool, device=k.device).triu_(1)
    decay = (gcum[..., :, None] - gcum[..., None, :]).masked_fill_(upper, float("-inf")).exp_()  # [B, H, T, T]
    gexp = gcum.exp()[..., None]
    read = torch.matmul(torch.cat((qf * gexp, kf * (bf[..., None] * gexp)), dim=-2), state)  # [B, H, 2T, V]
    lower = torch.matmul(kf, kf.transpose(-1, -2)).mul_(decay).mul_(bf[..., None])
    eye = torch.eye(T, dtype=torch.float32, device=k.device).expand_as(lower)
    t_inv = torch.linalg.solve_triangular(lower, eye, upper=False, unitriangular=True)
    u = torch.matmul(t_inv, vf * bf[..., None] - read[..., T:, :])  # [B, H, T, V]: what each token writes
    o = read[..., :T, :] + torch.matmul(torch.matmul(qf, kf.transpose(-1, -2)).mul_(decay), u)
    return o.transpose(1, 2).to(v.dtype), PendingDeltaRule(k=kf, u=u, g=gf, gcum=gcum)


@dataclass
class PendingDeltaRule:
    """What ``verify_gated_delta_rule`` read: k [B, H, T, K], the writes u [B, H, T, V], the log
    decays g and their running sums gcum [B, H, T], all fp32."""

    k: Tensor
    u: Tensor
    g: Tensor
    gcum: Tensor

    def land(self, state: Tensor, counts: Tensor, with_stats: bool) -> RecurrenceStats | None:
        """Advance ``state`` [B, H, K, V] in place by the first counts[b] tokens of row b
        (counts [B], 1 <= counts <= T); the stats are those of the accepted tokens."""
        B, H, T = self.gcum.shape
        taken = torch.arange(T, device=counts.device) < counts[:, None]  # [B, T]
        g_last = self.gcum.gather(-1, (counts - 1).view(B, 1, 1).expand(B, H, 1))  # [B, H, 1]
        # exp(G_n - G_t) for the accepted tokens, 0 for the others (masked before exp: no overflow)
        carry = (g_last - self.gcum).masked_fill_(~taken[:, None], float("-inf")).exp_()
        state.mul_(g_last.exp()[..., None]).add_(torch.matmul((self.k * carry[..., None]).transpose(-1, -2), self.u))
        if not with_stats:
            return None
        n = counts.float()
        delta = (self.k.norm(dim=-1) * self.u.norm(dim=-1)).square().sum(1).sqrt()  # [B, T], heads in quadrature
        return RecurrenceStats(
            state_norm=state.reshape(B, -1).norm(dim=-1),
            gate_mean=(self.g.exp() * taken[:, None]).sum(dim=(1, 2)) / (n * H),
            delta_norm=(delta * taken).sum(-1) / n,
        )


# how a layer state runs it (state.Recurrence): advancing, or verifying a draft
GATED_DELTA_RULE = Recurrence(advance=gated_delta_rule, verify=verify_gated_delta_rule)


def naive_recurrent_gated_delta_rule(
    *,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Reference recurrence, one token at a time, in fp32. Slow; for tests.

    Args:
        q, k: [B, T, H, K], L2-normalised over K.
        v: [B, T, H, V].
        g: [B, T, H], log-space decay <= 0.
        beta: [B, T, H], in (0, 1).
        scale: multiplies q; default K ** -0.5.
        initial_state: [B, H, K, V] or None (zeros); not modified.

    Returns:
        o: [B, T, H, V] in v.dtype; final_state: [B, H, K, V] fp32.
    """
    _check_shapes(q, k, v, g, beta)
    B, T, H, K = k.shape
    V = v.shape[-1]
    scale = K**-0.5 if scale is None else scale
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    if initial_state is None:
        S = q.new_zeros(B, H, K, V)
    else:
        S = initial_state.float().clone()
    o = q.new_empty(B, T, H, V)
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None]
        kv = torch.einsum("bhk,bhkv->bhv", k[:, t], S)
        u = beta[:, t, :, None] * (v[:, t] - kv)
        S = S + k[:, t, :, :, None] * u[:, :, None, :]
        o[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S)
    return o.to(v.dtype), S


@torch.no_grad()  # inference only: the in-place and out= products are not differentiable
def chunk_gated_delta_rule(
    *,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    output_final_state: bool = True,
    with_stats: bool = True,
) -> tuple[Tensor, Tensor | None, RecurrenceStats | None]:
    """Chunked parallel form of the recurrence, for prefill. Computes in fp32 whatever the input dtype.

    Within a chunk of C tokens the C delta-rule updates are folded into a few matrix products and one
    unit-lower-triangular solve (the WY / UT representation). What does not depend on the carried
    state (decay masks, (I + L)^-1, the intra-chunk q.k attention, decayed q and k) is computed in
    batched products for a block of chunks at once; the loop over chunks keeps only the products
    with the state or with u. Blocks (a few thousand token x head rows on CPU) keep the working set
    in cache, which measured faster than one batch over the whole span. The last chunk is
    zero-padded (k = 0, beta = 0, g = 0), which leaves the state unchanged.

    Args:
        q, k: [B, T, H, K], L2-normalised over K; k heads already repeated to H.
        v: [B, T, H, V].
        g: [B, T, H], log-space decay <= 0.
        beta: [B, T, H], in (0, 1).
        scale: multiplies q; default K ** -0.5.
        initial_state: [B, H, K, V] or None (zeros); not modified.
        chunk_size: C, tokens per chunk.
        output_final_state: return the state after the span (else None).
        with_stats: return ``RecurrenceStats`` for the span (else None).

    Returns:
        o: [B, T, H, V] in v.dtype; final_state: [B, H, K, V] fp32 or None; stats or None.
    """
    _check_shapes(q, k, v, g, beta)
    B, T, H, K = k.shape
    V = v.shape[-1]
    if T == 0:
        raise ValueError("chunk_gated_delta_rule needs at least one token")
    scale = K**-0.5 if scale is None else scale
    C = chunk_size
    if initial_state is None:
        S = torch.zeros(B * H, K, V, dtype=torch.float32, device=v.device)
    else:
        S = initial_state.to(torch.float32, copy=True).reshape(B * H, K, V)
    out = torch.empty(B, T, H, V, dtype=v.dtype, device=v.device)
    block = block_tokens(v.device, B * H, C)  # bounded working set: on CPU it stays in cache
    delta_sum = torch.zeros(B, dtype=torch.float32, device=v.device) if with_stats else None
    for t0 in range(0, T, block):
        span = slice(t0, min(T, t0 + block))
        _chunk_block(
            q[:, span], k[:, span], v[:, span], g[:, span], beta[:, span],
            S=S, out=out[:, span], scale=scale, C=C, delta_sum=delta_sum,
        )
    final = S.view(B, H, K, V)
    stats = None
    if with_stats:
        stats = RecurrenceStats(
            state_norm=final.reshape(B, -1).norm(dim=-1),
            gate_mean=g.float().exp().mean(dim=(1, 2)),
            delta_norm=delta_sum / T,
        )
    return out, (final if output_final_state else None), stats


@torch.library.custom_op("summarize::chunk_gated_delta_rule", mutates_args=())
def _chunk_rule_op(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, chunk_size: int, with_stats: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``chunk_gated_delta_rule`` from ``state``, as one opaque op: a compiled prefill step keeps
    its graph whole around it, and the loop over chunks runs as it does eagerly. Returns o, the
    final state, then state_norm, gate_mean and delta_norm ([B] each; empty without stats).
    """
    o, final, stats = chunk_gated_delta_rule(
        q=q, k=k, v=v, g=g, beta=beta, initial_state=state, chunk_size=chunk_size, with_stats=with_stats
    )
    if stats is None:
        none = final.new_empty(0)
        return o, final, none, none.clone(), none.clone()
    return o, final, stats.state_norm, stats.gate_mean, stats.delta_norm


@_chunk_rule_op.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, chunk_size: int, with_stats: bool):
    per_row = q.new_empty((q.shape[0] if with_stats else 0,), dtype=torch.float32)
    return (
        v.new_empty(v.shape), state.new_empty(state.shape, dtype=torch.float32),
        per_row, torch.empty_like(per_row), torch.empty_like(per_row),
    )


def _chunk_block(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *,
    S: Tensor, out: Tensor, scale: float, C: int, delta_sum: Tensor | None,
) -> None:
    """Runs the chunked recurrence over one block of tokens.

    Reads q, k, v, g, beta for the block ([B, Tb, H, *]); advances S ([B*H, K, V] fp32) in place,
    writes o into ``out`` ([B, Tb, H, V]) and adds the block's per-token delta norms to delta_sum.
    """
    B, Tb, H, K = k.shape
    V = v.shape[-1]
    pad = -Tb % C
    if pad:  # k = 0, beta = 0, g = 0: the padding tokens leave the state unchanged
        q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, 0, 0, pad)) for x in (g, beta))
    N = (Tb + pad) // C
    M = N * B * H  # (chunk, batch, head) triples, chunk-major
    f32 = dict(dtype=torch.float32, device=k.device)

    def chunks(x: Tensor) -> Tensor:  # [B, N*C, H, *D] -> [N, B, H, C, *D] view, no copy
        x = x.unflatten(1, (N, C))
        return x.permute(1, 0, 3, 2, *range(4, x.dim()))

    # fp32 chunk-major buffers; each fill below is the one pass that also converts the layout.
    gcum = torch.empty(N, B, H, C, **f32).copy_(chunks(g)).view(M, C).cumsum_(-1)  # log decay in chunk
    bc = torch.empty(N, B, H, C, **f32).copy_(chunks(beta)).view(M, C, 1)
    kc = torch.empty(N, B, H, C, K, **f32).copy_(chunks(k)).view(M, C, K)
    # q exp(gcum) and beta k exp(gcum) stacked as [M, 2C, K]: one product per chunk reads S for both
    qk_dec = torch.empty(M, 2 * C, K, **f32)
    q_s, kb_dec = qk_dec[:, :C], qk_dec[:, C:]
    q_s.view(N, B, H, C, K).copy_(chunks(q)).mul_(scale)  # scaled in fp32, not in the input dtype
    v_beta = torch.empty(N, B, H, C, V, **f32)
    torch.mul(chunks(v), bc.view(N, B, H, C, 1), out=v_beta)

    # --- State-independent part, all chunks of the block at once -----------------------------
    # decay[i, j] = exp(gcum_i - gcum_j) for j <= i, else 0 (masked before exp: no overflow)
    decay = gcum.unsqueeze(-1) - gcum.unsqueeze(-2)
    upper = torch.ones(C, C, dtype=torch.bool, device=decay.device).triu_(1)
    decay = decay.masked_fill_(upper, float("-inf")).exp_()
    gexp = gcum.exp().unsqueeze(-1)  # [M, C, 1]
    k_t = kc.transpose(-1, -2)

    # WY form: within a chunk u = (I + L)^-1 (beta v - beta k exp(gcum) S_prev) with
    # L = strictly-lower(beta k k^T * decay). Solving against the identity once and multiplying is
    # much faster on CPU than solving against each chunk's right-hand side.
    lower = torch.bmm(kc, k_t).mul_(decay).mul_(bc)
    eye = torch.eye(C, **f32).expand_as(lower)
    t_inv = torch.linalg.solve_triangular(lower, eye, upper=False, unitriangular=True)
    del lower
    attn = torch.bmm(q_s, k_t).mul_(decay)  # causal, decayed q.k within a chunk (q is scaled)
    del decay
    # o = q exp(gcum) S_prev + attn u;  S_next = exp(gcum_C) S_prev + (k exp(gcum_C - gcum))^T u
    q_s.mul_(gexp)
    torch.mul(kc, bc.mul_(gexp), out=kb_dec)
    glast = gcum[:, -1:]
    k_sq = torch.linalg.vector_norm(kc, dim=-1).square_() if delta_sum is not None else None  # [M, C]
    k_write = kc.mul_((glast - gcum).exp_().unsqueeze(-1)).transpose(-1, -2)  # [M, K, C]
    chunk_decay = glast.exp().view(N, B * H, 1, 1)

    qk_dec, v_beta, t_inv, attn, k_write = (
        x.view(N, B * H, *x.shape[-2:]) for x in (qk_dec, v_beta, t_inv, attn, k_write)
    )

    # --- State-dependent part, one chunk at a time ----------------------------------------------
    # (I + L)^-1 and attn multiply u here, C^2 V each, rather than being folded into precomputed
    # terms outside the loop, which would cost C^2 (V + K) each: fewer flops, measured faster.
    read = torch.empty(B * H, 2 * C, V, **f32)
    u = torch.empty(N, B * H, C, V, **f32)
    o = torch.empty(N, B * H, C, V, **f32)
    for i in range(N):
        torch.bmm(qk_dec[i], S, out=read)  # [q exp(gcum) S; beta k exp(gcum) S]
        torch.bmm(t_inv[i], v_beta[i].sub_(read[:, C:]), out=u[i])
        torch.baddbmm(read[:, :C], attn[i], u[i], out=o[i])
        S.mul_(chunk_decay[i]).baddbmm_(k_write[i], u[i])

    _from_chunks(o, out)
    if delta_sum is not None:
        u_sq = torch.linalg.vector_norm(u, dim=-1).square_().view(M, C)
        delta_sum += (k_sq * u_sq).view(N, B, H, C).sum(2).sqrt_().sum(dim=(0, 2))


def recurrent_step_gated_delta_rule(
    *,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor,
    scale: float | None = None,
    with_stats: bool = False,
) -> tuple[Tensor, RecurrenceStats | None]:
    """One decode step: updates ``state`` in place and returns this token's output.

    Args:
        q, k: [B, H, K], L2-normalised over K; k heads already repeated to H.
        v: [B, H, V].
        g: [B, H], log-space decay <= 0.
        beta: [B, H], in (0, 1).
        state: [B, H, K, V] fp32, updated in place.
        scale: multiplies q; default K ** -0.5.
        with_stats: also measure the step's ``RecurrenceStats`` (one extra pass over the state).

    Returns:
        o: [B, H, V] in v.dtype; the stats, or None.
    """
    _check_shapes(q, k, v, g, beta)
    K = k.shape[-1]
    scale = K**-0.5 if scale is None else scale
    out_dtype = v.dtype
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    alpha = g.exp()[..., None, None]  # [B, H, 1, 1]
    # Both reads of the old state in one product: o_t = alpha q^T S + (q.k) u needs no second read
    qk = torch.stack((q, k), dim=-2)  # [B, H, 2, K]
    if torch.compiler.is_compiling():  # a sum inductor fuses into one pass over the state
        read = (qk[..., None] * state[:, :, None]).sum(-2).mul_(alpha)
    else:
        read = torch.matmul(qk, state).mul_(alpha)  # [B, H, 2, V]: alpha [q^T S; k^T S]
    u = torch.sub(v, read[..., 1, :]).mul_(beta.unsqueeze(-1))  # [B, H, V]
    qk_dot = torch.linalg.vecdot(q, k).unsqueeze(-1)  # [B, H, 1]
    o = read[..., 0, :].addcmul_(qk_dot, u).mul_(scale)
    state.mul_(alpha).addcmul_(k.unsqueeze(-1), u.unsqueeze(-2))
    o = o.to(out_dtype)
    if not with_stats:
        return o, None
    B = state.shape[0]
    delta_per_head = torch.linalg.vector_norm(k, dim=-1).mul_(torch.linalg.vector_norm(u, dim=-1))
    stats = RecurrenceStats(
        state_norm=torch.linalg.vector_norm(state.reshape(B, -1), dim=-1),
        gate_mean=alpha.view(B, -1).mean(dim=-1),
        delta_norm=torch.linalg.vector_norm(delta_per_head, dim=-1),  # heads in quadrature
    )
    return o, stats


def _check_shapes(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor) -> None:
    """q, k: [*lead, K]; v: [*lead, V]; g, beta: [*lead] (lead = B, T, H or B, H)."""
    lead = k.shape[:-1]
    if q.shape != k.shape or v.shape[:-1] != lead or g.shape != lead or beta.shape != lead:
        raise ValueError(
            f"gated delta rule shapes disagree: q {tuple(q.shape)}, k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}, g {tuple(g.shape)}, beta {tuple(beta.shape)} "
            "(k heads must already be repeated to the value heads)"
        )


def _from_chunks(o: Tensor, out: Tensor) -> None:
    """Chunk-major [N, B * H, C, D] -> ``out`` [B, T, H, D] (any dtype), padding dropped (one copy)."""
    N, _, C, D = o.shape
    B, T, H, _ = out.shape
    src = o.view(N, B, H, C, D).permute(1, 0, 3, 2, 4)  # [B, N, C, H, D]
    full = T // C
    if full:
        out[:, : full * C].unflatten(1, (full, C)).copy_(src[:, :full])
    rest = T - full * C
    if rest:
        out[:, full * C :].copy_(src[:, full, :rest])
