"""RWKV-6's state update ("wkv6"): one entry point and its tiers.

- ``rwkv6_wkv``: what a layer calls. It runs the chunked form for a span and the single step for
  one token, updates the state in place and returns ``(o, stats or None)``.
- ``naive_recurrent_rwkv6``: a plain per-token loop in fp32, the oracle.
- ``chunk_rwkv6``: the chunked parallel form, for prefill.
- ``recurrent_step_rwkv6``: one token, state updated in place, for decode.
- ``verify_rwkv6``: a short span read from the state without changing it, for verifying drafted
  tokens; what it returns lands the state after any prefix of the span.

Shared conventions (B batch, T tokens, H heads, K = V = head size):

    r, k    [B, T, H, K]  receptance and key
    v       [B, T, H, V]
    log_w   [B, T, H, K]  log-space per-channel decay, <= 0 and not bounded below (w = exp(-exp(.))
                          reaches exp(-12) per token and less; values below LOG_DECAY_FLOOR count as it)
    u       [H, K]        the bonus of the current token (BlinkDL's time_faaaa)
    state   [B, H, K, V]  fp32; row i belongs to key channel i, column j to value channel j (the
                          layout of the `rwkv` package's v6 state)

    o_t = S_{t-1}^T r_t + (r_t . (u * k_t)) v_t
    S_t = diag(w_t) S_{t-1} + k_t v_t^T,          w_t = exp(log_w_t)

Why the chunk form stays exact with unbounded decays: RWKV-7's form splits the decay between two
tokens into exp(c_t) exp(-c_s), which overflows once a chunk's decays sum below about -88. Here, as
in flash-linear-attention's chunk_rwkv6, a chunk is cut into sub-chunks of SUB_CHUNK tokens with a
pivot at each sub-chunk's start. Between sub-chunks the decay from s to t is split at the pivot of
t's sub-chunk (r's side: from the pivot to t; k's side: from s to the pivot, the rest of s's
sub-chunk times the sub-chunks between): every exponent is <= 0 and every factor lies in [0, 1].
Inside a sub-chunk (the diagonal blocks, the bonus on their diagonal) the split is at the same
pivot but taken in fp64, whose range (e^±709) holds 16 tokens of decays floored at e^-40 both ways;
fla takes these 16 x 16 pairs element-wise instead, which made the whole op several times slower
on a CPU for the same result. Each sum of log decays is added up directly (or in fp64), never as the
difference of two fp32 running sums, which would lose a small decay next to a large one: the
result is as exact as the token-by-token loop.

Every tier also reports the diagnostics of docs/design.md §4 as ``RecurrenceStats``: gate_mean is the
mean decay w over tokens, heads and channels; delta_norm is the mean over tokens of what a token
writes into the state, ||k_t v_t^T||_F = |k_t| |v_t|, heads summed in quadrature.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from summarize.engine.diagnostics import RecurrenceStats
from summarize.engine.ops.chunk_blocks import block_tokens
from summarize.engine.state import Recurrence

__all__ = ["RWKV6_WKV", "chunk_rwkv6", "naive_recurrent_rwkv6", "recurrent_step_rwkv6", "rwkv6_wkv", "verify_rwkv6"]

SUB_CHUNK = 16  # tokens whose pairwise decays are split in fp64: 16 x LOG_DECAY_FLOOR stays within e^±709
# Tokens per step of the loop over the carried state, a multiple of SUB_CHUNK: the fastest on a CPU
# (with 64 the blocks between sub-chunks cost more than the fewer steps save; docs/kernel-policy.md)
DEFAULT_CHUNK_SIZE = 16
# A decay below e^-40 per token counts as e^-40: what it multiplies shrinks by 4e-18 or more either
# way, far below fp32's precision, and the sums stay finite (w = 0 would give log_w = -inf, and
# -inf - -inf is NaN) and within fp64's range over a sub-chunk
LOG_DECAY_FLOOR = -40.0


def rwkv6_wkv(
    *, r: Tensor, log_w: Tensor, k: Tensor, v: Tensor, u: Tensor, state: Tensor, with_stats: bool = False
) -> tuple[Tensor, RecurrenceStats | None]:
    """The recurrence over a span from ``state``, which it advances in place.

    Args:
        r, k: [B, T, H, K].
        log_w: [B, T, H, K], log-space decay <= 0.
        v: [B, T, H, V].
        u: [H, K], the current token's bonus.
        state: [B, H, K, V] fp32, updated in place.
        with_stats: also measure the span's ``RecurrenceStats``.

    Returns:
        o: [B, T, H, V] fp32; the stats, or None.
    """
    if k.shape[1] == 1:
        o, stats = recurrent_step_rwkv6(r=r[:, 0], log_w=log_w[:, 0], k=k[:, 0], v=v[:, 0], u=u, state=state, with_stats=with_stats)
        return o[:, None], stats
    o, final, stats = chunk_rwkv6(r=r, log_w=log_w, k=k, v=v, u=u, initial_state=state, with_stats=with_stats)
    state.copy_(final)
    return o, stats


def naive_recurrent_rwkv6(
    *, r: Tensor, log_w: Tensor, k: Tensor, v: Tensor, u: Tensor, initial_state: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Reference recurrence, one token at a time, in fp32 (as BlinkDL's: out = r (u a + S), S = a + w S
    with a = k v^T). Slow; for tests.

    Args:
        r, k: [B, T, H, K].  log_w: [B, T, H, K], log-space decay <= 0.  v: [B, T, H, V].  u: [H, K].
        initial_state: [B, H, K, V] or None (zeros); not modified.

    Returns:
        o: [B, T, H, V] fp32; final_state: [B, H, K, V] fp32.
    """
    _check_shapes(r, log_w, k, v, u)
    B, T, H, K = k.shape
    r, log_w, k, v, u = (x.float() for x in (r, log_w, k, v, u))
    S = v.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.float().clone()
    o = torch.empty_like(v)
    for t in range(T):
        a = k[:, t, ..., None] * v[:, t, ..., None, :]  # [B, H, K, V]
        o[:, t] = torch.einsum("bhk,bhkv->bhv", r[:, t], S + u[..., None] * a)
        S = a + log_w[:, t].exp()[..., None] * S
    return o, S


@torch.no_grad()  # inference only: the in-place and out= products are not differentiable
def chunk_rwkv6(
    *,
    r: Tensor,
    log_w: Tensor,
    k: Tensor,
    v: Tensor,
    u: Tensor,
    initial_state: Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    output_final_state: bool = True,
    with_stats: bool = True,
) -> tuple[Tensor, Tensor | None, RecurrenceStats | None]:
    """Chunked parallel form of the recurrence, for prefill. Computes in fp32 whatever the input dtype.

    Per chunk of C tokens (see the module docstring for how the decays are split):

        O = Q S_0 + A V                  Q: r scaled by the decay from the chunk start to before t;
                                         A [C, C]: the chunk's own tokens (strictly earlier ones
                                         decayed, the bonus on the diagonal)
        S_C = diag(d) S_0 + K_end^T V    d: the chunk's whole decay; K_end: k scaled by the decay
                                         from s to the chunk end

    Everything but the carried state is computed for a block of chunks at once in batched
    products; two products per chunk run in the loop over chunks. The last chunk is zero-padded
    (k = 0, log_w = 0), which leaves the state unchanged.

    Args:
        r, k: [B, T, H, K].
        log_w: [B, T, H, K], log-space decay <= 0, any magnitude.
        v: [B, T, H, V].
        u: [H, K].
        initial_state: [B, H, K, V] or None (zeros); not modified.
        chunk_size: C, tokens per chunk, a positive multiple of SUB_CHUNK.
        output_final_state: return the state after the span (else None).
        with_stats: return ``RecurrenceStats`` for the span (else None).

    Returns:
        o: [B, T, H, V] fp32; final_state: [B, H, K, V] fp32 or None; stats or None.
    """
    _check_shapes(r, log_w, k, v, u)
    B, T, H, K = k.shape
    V = v.shape[-1]
    if T == 0:
        raise ValueError("chunk_rwkv6 needs at least one token")
    if chunk_size <= 0 or chunk_size % SUB_CHUNK:
        raise ValueError(f"chunk_size must be a positive multiple of {SUB_CHUNK}, got {chunk_size}")
    if initial_state is None:
        S = torch.zeros(B * H, K, V, dtype=torch.float32, device=v.device)
    else:
        S = initial_state.to(torch.float32, copy=True).reshape(B * H, K, V)
    out = torch.empty(B, T, H, V, dtype=torch.float32, device=v.device)
    block = block_tokens(v.device, B * H, chunk_size)
    for t0 in range(0, T, block):
        span = slice(t0, min(T, t0 + block))
        _chunk_block(r[:, span], log_w[:, span], k[:, span], v[:, span], u, S=S, out=out[:, span], C=chunk_size)
    final = S.view(B, H, K, V)
    stats = _span_stats(final, log_w=log_w, k=k, v=v) if with_stats else None
    return out, (final if output_final_state else None), stats


def _chunk_block(r: Tensor, log_w: Tensor, k: Tensor, v: Tensor, u: Tensor, *, S: Tensor, out: Tensor, C: int) -> None:
    """Runs the chunked recurrence over one block of tokens ([B, Tb, H, *] inputs).

    Advances S ([B*H, K, V] fp32) in place and writes o into ``out`` ([B, Tb, H, V] fp32).
    """
    B, Tb, H, K = k.shape
    V = v.shape[-1]
    pad = -Tb % C
    N = (Tb + pad) // C
    M = N * B * H  # (chunk, batch, head) triples, chunk-major

    def chunks(x: Tensor) -> Tensor:  # [B, Tb, H, D] -> [M, C, D] fp32, zero-padded
        x = F.pad(x.float(), (0, 0, 0, 0, 0, pad)) if pad else x.float()
        return x.unflatten(1, (N, C)).permute(1, 0, 3, 2, 4).reshape(M, C, x.shape[-1])

    rc, kc, vc, lw = (chunks(x) for x in (r, k, v, log_w))
    bonus = u.float().repeat(N * B, 1)  # [M, K]: each row's head's u
    q, p, k_end, decay = _chunk_terms(rc, kc, vc, lw.clamp(min=LOG_DECAY_FLOOR), bonus)
    kv_write = torch.bmm(k_end.transpose(1, 2), vc).view(N, B * H, K, V)
    q, p, decay = q.view(N, B * H, C, K), p.view(N, B * H, C, V), decay.view(N, B * H, K, 1)

    o = torch.empty(N, B * H, C, V, dtype=torch.float32, device=k.device)
    for i in range(N):
        torch.baddbmm(p[i], q[i], S, out=o[i])
        S.mul_(decay[i]).add_(kv_write[i])
    o = o.view(N, B, H, C, V).permute(1, 0, 3, 2, 4).reshape(B, N * C, H, V)
    out.copy_(o[:, :Tb])


def _chunk_terms(r: Tensor, k: Tensor, v: Tensor, lw: Tensor, u: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """What each chunk contributes, apart from the state it starts from.

    Args:
        r, k, lw: [M, C, K] fp32 (lw >= LOG_DECAY_FLOOR, C a multiple of SUB_CHUNK).
        v: [M, C, V] fp32.
        u: [M, K], the bonus of each row's head.

    Returns:
        q: [M, C, K], r_t times the decay from the chunk start to just before t (reads S_0);
        p: [M, C, V], the output made by the chunk's own tokens;
        k_end: [M, C, K], k_s times the decay from just after s to the chunk end (writes S_C);
        decay: [M, K], the decay over the whole chunk.
    """
    M, C, K = k.shape
    L, n = SUB_CHUNK, C // SUB_CHUNK
    device = k.device
    r, k, lw = (x.view(M, n, L, K) for x in (r, k, lw))
    # within each sub-chunk, running sums taken directly: from its start to before t, after s to its end
    before = F.pad(lw[:, :, :-1].cumsum(2), (0, 0, 1, 0))  # [M, n, L, K]
    after = F.pad(lw[:, :, 1:].flip(2).cumsum(2).flip(2), (0, 0, 0, 1))
    whole = lw.sum(2)  # [M, n, K], each sub-chunk's decay
    r_piv = r * before.exp()  # r_t from the pivot (its sub-chunk's start) to before t
    k_piv = k * after.exp()  # k_s from after s to the end of its sub-chunk

    # the diagonal blocks: the decay strictly between s and t split at the sub-chunk's start, in fp64,
    # whose range (e^±709) holds a sub-chunk's decays (>= SUB_CHUNK x LOG_DECAY_FLOOR = -640) both ways
    lw64 = lw.double()
    upto = lw64.cumsum(2)  # through s
    diagonal = torch.matmul(r.double() * (upto - lw64).exp(), (k.double() * (-upto).exp()).transpose(-1, -2))
    t = torch.arange(L, device=device)
    diagonal = diagonal.masked_fill_(t[:, None] <= t[None, :], 0.0).float()  # s < t only: exp(...) <= 1 there
    diagonal += torch.diag_embed((r * u[:, None, None, :] * k).sum(-1))  # the bonus: t's own value

    q, k_end, decay = r_piv.reshape(M, C, K), k_piv.reshape(M, C, K), whole.sum(1).exp()
    if n == 1:
        return q, torch.bmm(diagonal.view(M, C, C), v), k_end, decay

    # across sub-chunks: before sub-chunk i, after sub-chunk j, and strictly between j and i
    before_sub = F.pad(whole[:, :-1].cumsum(1), (0, 0, 1, 0))  # [M, n, K]
    after_sub = F.pad(whole[:, 1:].flip(1).cumsum(1).flip(1), (0, 0, 0, 1))
    m = torch.arange(n, device=device)
    between = (m[None, :, None] < m[None, None, :]) & (m[None, None, :] < m[:, None, None])  # [i, j, m]: j < m < i
    gap = torch.einsum("ijm,xmk->xijk", between.float(), whole)  # [M, n(i), n(j), K]
    earlier = (m[None, :] < m[:, None])[None, :, :, None]  # sub-chunk j before sub-chunk i
    # blocks of earlier sub-chunks, every factor <= 1: (r_piv * decay between) @ k_piv^T  -> [M, n, n, L, L]
    cross = torch.where(earlier, gap.exp(), 0.0)
    blocks = torch.matmul(r_piv[:, :, None] * cross[:, :, :, None, :], k_piv[:, None].transpose(-1, -2))
    blocks.diagonal(dim1=1, dim2=2).copy_(diagonal.permute(0, 2, 3, 1))
    p = torch.bmm(blocks.transpose(2, 3).reshape(M, C, C), v)  # rows (i, t), columns (j, s)
    q = (r_piv * before_sub.exp()[:, :, None, :]).reshape(M, C, K)
    k_end = (k_piv * after_sub.exp()[:, :, None, :]).reshape(M, C, K)
    return q, p, k_end, decay


@torch.no_grad()  # updates the state in place
def recurrent_step_rwkv6(
    *, r: Tensor, log_w: Tensor, k: Tensor, v: Tensor, u: Tensor, state: Tensor, with_stats: bool = False
) -> tuple[Tensor, RecurrenceStats | None]:
    """One decode step: updates ``state`` in place and returns this token's output.

    Args:
        r, k: [B, H, K].  log_w: [B, H, K], log-space decay <= 0.  v: [B, H, V].  u: [H, K].
        state: [B, H, K, V] fp32, updated in place.
        with_stats: also measure the step's ``RecurrenceStats`` (one extra pass over the state).

    Returns:
        o: [B, H, V] fp32; the stats, or None.
    """
    _check_shapes(r, log_w, k, v, u)
    r, log_w, k, v = (x.float() for x in (r, log_w, k, v))
    o = torch.matmul(r[..., None, :], state)[..., 0, :] + (r * u * k).sum(-1, keepdim=True) * v
    state.mul_(log_w.exp()[..., None]).add_(k[..., :, None] * v[..., None, :])
    if not with_stats:
        return o, None
    return o, _span_stats(state, log_w=log_w[:, None], k=k[:, None], v=v[:, None])


def verify_rwkv6(*, r: Tensor, log_w: Tensor, k: Tensor, v: Tensor, u: Tensor, state: Tensor) -> tuple[Tensor, PendingRWKV6]:
    """The outputs of a short span read from ``state``, which is left as it is, and what lands the
    state after any prefix of the span (docs/design.md §8).

    One chunk of the chunked form (``chunk_rwkv6``), the span zero-padded to whole sub-chunks: the
    state is read once, for the outputs of every token. Accepting the first n tokens is then one
    update, S_n = diag(exp(c_n)) S_0 + sum_{t<n} diag(exp(c_n - c_t)) k_t v_t^T, each decay summed
    directly over its tokens.

    Args:
        r, k: [B, T, H, K].  log_w: [B, T, H, K], log-space decay <= 0.  v: [B, T, H, V].  u: [H, K].
        state: [B, H, K, V] fp32; only read.

    Returns:
        o: [B, T, H, V] fp32; the ``PendingRWKV6`` that lands a prefix.
    """
    _check_shapes(r, log_w, k, v, u)
    B, T, H, K = k.shape
    V = v.shape[-1]
    lw = log_w.float().clamp(min=LOG_DECAY_FLOOR)
    rf, kf, vf, lwf = (x.float().transpose(1, 2) for x in (r, k, v, lw))  # [B, H, T, *]
    pad = -T % SUB_CHUNK

    def rows(x: Tensor) -> Tensor:  # [B, H, T, D] -> [B*H, T + pad, D], zero-padded
        return F.pad(x, (0, 0, 0, pad)).reshape(B * H, T + pad, x.shape[-1])

    q, p, _, _ = _chunk_terms(rows(rf), rows(kf), rows(vf), rows(lwf), u.float().repeat(B, 1))
    o = torch.baddbmm(p, q, state.reshape(B * H, K, V))[:, :T]
    return o.view(B, H, T, V).transpose(1, 2), PendingRWKV6(k=kf, v=vf, log_w=lwf)


@dataclass
class PendingRWKV6:
    """What ``verify_rwkv6`` read, fp32, heads first: k and the log decays log_w (floored)
    [B, H, T, K], the values v [B, H, T, V]."""

    k: Tensor
    v: Tensor
    log_w: Tensor

    def land(self, state: Tensor, counts: Tensor, with_stats: bool) -> RecurrenceStats | None:
        """Advance ``state`` [B, H, K, V] in place by the first counts[b] tokens of row b
        (counts [B], 1 <= counts <= T); the stats are those of the accepted tokens."""
        B, H, T, K = self.k.shape
        s = torch.arange(T, device=counts.device)
        taken = s[None, :] < counts[:, None]  # [B, T]
        later = (s[None, None, :] > s[None, :, None]) & taken[:, None, :]  # [B, T(t), T(q)]: t < q < n
        # the decay from after t to the last accepted token, 0 for tokens not accepted
        carry = torch.einsum("btq,bhqk->bhtk", later.float(), self.log_w)
        carry = carry.masked_fill_(~taken[:, None, :, None], float("-inf")).exp_()
        whole = torch.einsum("bq,bhqk->bhk", taken.float(), self.log_w)
        state.mul_(whole.exp()[..., None]).add_(torch.matmul((self.k * carry).transpose(-1, -2), self.v))
        if not with_stats:
            return None
        n = counts.float()
        written = (self.k.square().sum(-1) * self.v.square().sum(-1)).sum(1).sqrt()  # [B, T]
        return RecurrenceStats(
            state_norm=state.reshape(B, -1).norm(dim=-1),
            gate_mean=(self.log_w.exp() * taken[:, None, :, None]).sum(dim=(1, 2, 3)) / (n * H * K),
            delta_norm=(written * taken).sum(-1) / n,
        )


# how a layer state runs it (state.Recurrence): advancing, or verifying a draft
RWKV6_WKV = Recurrence(advance=rwkv6_wkv, verify=verify_rwkv6)


def _span_stats(state: Tensor, *, log_w: Tensor, k: Tensor, v: Tensor) -> RecurrenceStats:
    """state [B, H, K, V] after a span of log_w, k [B, T, H, K] and v [B, T, H, V]."""
    B = state.shape[0]
    written = (k.float().square().sum(-1) * v.float().square().sum(-1)).sum(-1).sqrt()  # [B, T]: |k||v|, heads in quadrature
    return RecurrenceStats(
        state_norm=state.reshape(B, -1).norm(dim=-1),
        gate_mean=log_w.float().exp().mean(dim=(1, 2, 3)),
        delta_norm=written.mean(-1),
    )


def _check_shapes(r: Tensor, log_w: Tensor, k: Tensor, v: Tensor, u: Tensor) -> None:
    """r, log_w, k: [*lead, K]; v: [*lead, V] (lead = B, T, H or B, H); u: [H, K]."""
    if not (r.shape == log_w.shape == k.shape) or v.shape[:-1] != k.shape[:-1] or u.shape != k.shape[-2:]:
        raise ValueError(
            f"rwkv6 shapes disagree: r {tuple(r.shape)}, log_w {tuple(log_w.shape)}, k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}, u {tuple(u.shape)}"
        )
