"""RWKV-7's state update (the generalised delta rule, "wkv7"): one entry point and its three tiers.

- ``rwkv7_wkv``: what a layer calls. It chooses the kernel (flash-linear-attention's on CUDA when
  installed, else the chunked form for a span, the single step for one token), updates the state
  in place and returns ``(o, stats or None)``.
- ``naive_recurrent_rwkv7``: a plain per-token loop in fp32, the oracle.
- ``chunk_rwkv7``: the chunked parallel form, for prefill.
- ``recurrent_step_rwkv7``: one token, state updated in place, for decode.
- ``verify_rwkv7``: a short span read from the state without changing it, for verifying drafted
  tokens; what it returns lands the state after any prefix of the span.

Shared conventions (B batch, T tokens, H heads, K = V = head size):

    r, k, a, b  [B, T, H, K]  receptance, key, and the two vectors of the low-rank transition
                              (in RWKV-7: a = -kk, b = kk * iclr with kk unit-norm, iclr in (0, 1))
    v           [B, T, H, V]
    log_w       [B, T, H, K]  log-space per-channel decay, in [-exp(-1/2), 0]
    state       [B, H, K, V]  fp32; row i belongs to key channel i, column j to value channel j

    u_t = S_{t-1}^T a_t                                   what a_t reads from the old state
    S_t = diag(w_t) S_{t-1} + b_t u_t^T + k_t v_t^T,      w_t = exp(log_w_t)
    o_t = S_t^T r_t

BlinkDL's reference keeps the transposed matrix ([H, V, K]: S_ref = S^T); so does the `rwkv` package.

Why the chunk form is safe here: within a chunk of C tokens the decays are folded into cumulative
log-decays c_t, and the form multiplies exp(c_t) by exp(-c_s). RWKV-7's decay is bounded below
(log w >= -exp(-1/2) ~ -0.607), so |c| <= 0.607 C: for C <= MAX_CHUNK_SIZE every factor stays far
inside the fp32 range, and every product that is kept equals a decay between two tokens, <= 1.

Every tier also reports the diagnostics of docs/design.md §4 as ``RecurrenceStats``: gate_mean is the mean
decay w over tokens, heads and channels; delta_norm is the mean over tokens of what a token writes
into the state, ||b_t u_t^T + k_t v_t^T||_F, heads summed in quadrature.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from summarize.engine.diagnostics import RecurrenceStats
from summarize.engine.ops.chunk_blocks import block_tokens
from summarize.engine.ops.rwkv7_wkv_fla import fla_chunk_rwkv7, fla_usable
from summarize.engine.state import Recurrence

__all__ = ["RWKV7_WKV", "chunk_rwkv7", "naive_recurrent_rwkv7", "recurrent_step_rwkv7", "rwkv7_wkv", "verify_rwkv7"]

DEFAULT_CHUNK_SIZE = 32  # measured on CPU: 16-32 beat 64 (fewer wasted upper-triangle products)
LOG_DECAY_MIN = -math.exp(-0.5)  # log w >= this (w = exp(-e^{-1/2} sigmoid(.))): keeps the chunk form finite
# exp(0.607 * 128) ~ 1e34 < fp32 max ~ 3e38: the largest factor the chunk form ever builds.
MAX_CHUNK_SIZE = 128


def rwkv7_wkv(
    *, r: Tensor, log_w: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, state: Tensor,
    dtype: torch.dtype, with_stats: bool = False,
) -> tuple[Tensor, RecurrenceStats | None]:
    """The recurrence over a span from ``state``, which it advances in place.

    Args:
        r, k, a, b: [B, T, H, K].
        log_w: [B, T, H, K], log-space decay in [-exp(-1/2), 0].
        v: [B, T, H, V].
        state: [B, H, K, V] fp32, updated in place.
        dtype: the model's dtype, in which a GPU kernel reads r, k, v, a, b (decays stay fp32).
        with_stats: also measure the span's ``RecurrenceStats``.

    Returns:
        o: [B, T, H, V] fp32; the stats, or None.
    """
    inputs = dict(r=r, log_w=log_w, k=k, v=v, a=a, b=b)
    if k.shape[1] == 1:
        o, stats = recurrent_step_rwkv7(**{name: x[:, 0] for name, x in inputs.items()}, state=state, with_stats=with_stats)
        return o[:, None], stats
    result = None
    if fla_usable(k.device):  # None: the kernels failed here, and the torch path runs instead
        result = fla_chunk_rwkv7(**inputs, initial_state=state, dtype=dtype, with_stats=with_stats)
    o, final, stats = result or chunk_rwkv7(**inputs, initial_state=state, with_stats=with_stats)
    state.copy_(final)
    return o, stats


def verify_rwkv7(
    *, r: Tensor, log_w: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, state: Tensor, dtype: torch.dtype | None = None
) -> tuple[Tensor, PendingRWKV7]:
    """The outputs of a short span read from ``state``, which is left as it is, and what lands the
    state after any prefix of the span (docs/design.md §8).

    One chunk of the chunked form (see ``chunk_rwkv7``): the state is read once for the reads u_t
    and the outputs of every token. Accepting the first n tokens is then one update of the state,
    S_n = diag(exp(c_n)) S_0 + sum_{t<=n} diag(exp(c_n - c_t)) (b_t u_t^T + k_t v_t^T).

    Args:
        r, k, a, b: [B, T, H, K], T <= MAX_CHUNK_SIZE.
        log_w: [B, T, H, K], log-space decay in [-exp(-1/2), 0].
        v: [B, T, H, V].
        state: [B, H, K, V] fp32; only read.
        dtype: unused (the entry point's signature).

    Returns:
        o: [B, T, H, V] fp32; the ``PendingRWKV7`` that lands a prefix.
    """
    _check_shapes(r, log_w, k, v, a, b)
    T = k.shape[1]
    if T > MAX_CHUNK_SIZE:
        raise ValueError(f"verify_rwkv7 reads at most {MAX_CHUNK_SIZE} tokens, got {T}")
    rf, lw, kf, vf, af, bf = (x.float().transpose(1, 2) for x in (r, log_w, k, v, a, b))  # [B, H, T, *]
    c = lw.cumsum(dim=2)
    grow = c.exp()
    shrink = grow.reciprocal()  # finite: |c| <= 0.61 T
    a_dec = af * (c - lw).exp()  # a_t exp(c_{t-1}): a reads the state before token t decays it
    strict = torch.ones(T, T, dtype=torch.bool, device=k.device).tril_(-1)
    incl = torch.ones(T, T, dtype=torch.bool, device=k.device).tril_()
    b_sh, k_sh = (bf * shrink).transpose(-1, -2), (kf * shrink).transpose(-1, -2)
    a_b = torch.matmul(a_dec, b_sh).masked_fill_(~strict, 0)
    a_k = torch.matmul(a_dec, k_sh).masked_fill_(~strict, 0)
    r_grow = rf * grow
    r_b = torch.matmul(r_grow, b_sh).masked_fill_(~incl, 0)
    r_k = torch.matmul(r_grow, k_sh).masked_fill_(~incl, 0)
    eye = torch.eye(T, dtype=torch.float32, device=k.device).expand_as(a_b)
    t_inv = torch.linalg.solve_triangular(eye - a_b, eye, upper=False, unitriangular=True)
    read = torch.matmul(torch.cat((a_dec, r_grow), dim=2), state)  # [B, H, 2T, V]: one read of the state
    u = torch.matmul(t_inv, read[:, :, :T] + torch.matmul(a_k, vf))  # [B, H, T, V]
    o = read[:, :, T:] + torch.matmul(r_b, u) + torch.matmul(r_k, vf)
    return o.transpose(1, 2), PendingRWKV7(b=bf, k=kf, u=u, v=vf, log_w=lw, c=c)


@dataclass
class PendingRWKV7:
    """What ``verify_rwkv7`` read, fp32, heads first: b, k and the log decays log_w [B, H, T, K],
    their running sums c, the reads u and the values v [B, H, T, V]."""

    b: Tensor
    k: Tensor
    u: Tensor
    v: Tensor
    log_w: Tensor
    c: Tensor

    def land(self, state: Tensor, counts: Tensor, with_stats: bool) -> RecurrenceStats | None:
        """Advance ``state`` [B, H, K, V] in place by the first counts[b] tokens of row b
        (counts [B], 1 <= counts <= T); the stats are those of the accepted tokens."""
        B, H, T, K = self.c.shape
        taken = torch.arange(T, device=counts.device) < counts[:, None]  # [B, T]
        c_last = self.c.gather(2, (counts - 1).view(B, 1, 1, 1).expand(B, H, 1, K))  # [B, H, 1, K]
        # exp(c_n - c_t) for the accepted tokens, 0 for the others (masked before exp: no overflow)
        carry = (c_last - self.c).masked_fill_(~taken[:, None, :, None], float("-inf")).exp_()
        written = torch.cat((self.b * carry, self.k * carry), dim=2).transpose(-1, -2)  # [B, H, K, 2T]
        state.mul_(c_last.exp().transpose(-1, -2)).add_(torch.matmul(written, torch.cat((self.u, self.v), dim=2)))
        if not with_stats:
            return None
        n = counts.float()
        # ||b u^T + k v^T||_F^2 = |b|^2 |u|^2 + |k|^2 |v|^2 + 2 (b.k)(u.v), per token and head
        sq = (
            self.b.square().sum(-1) * self.u.square().sum(-1) + self.k.square().sum(-1) * self.v.square().sum(-1)
            + 2 * (self.b * self.k).sum(-1) * (self.u * self.v).sum(-1)
        )
        delta = sq.clamp_(min=0).sum(1).sqrt()  # [B, T]
        return RecurrenceStats(
            state_norm=state.reshape(B, -1).norm(dim=-1),
            gate_mean=(self.log_w.exp() * taken[:, None, :, None]).sum(dim=(1, 2, 3)) / (n * H * K),
            delta_norm=(delta * taken).sum(-1) / n,
        )


# how a layer state runs it (state.Recurrence): advancing, or verifying a draft
RWKV7_WKV = Recurrence(advance=rwkv7_wkv, verify=verify_rwkv7)


def naive_recurrent_rwkv7(
    *,
    r: Tensor,
    log_w: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Reference recurrence, one token at a time, in fp32. Slow; for tests.

    Args:
        r, k, a, b: [B, T, H, K].
        log_w: [B, T, H, K], log-space decay in [-exp(-1/2), 0].
        v: [B, T, H, V].
        initial_state: [B, H, K, V] or None (zeros); not modified.

    Returns:
        o: [B, T, H, V] fp32; final_state: [B, H, K, V] fp32.
    """
    _check_shapes(r, log_w, k, v, a, b)
    B, T, H, K = k.shape
    r, log_w, k, v, a, b = (x.float() for x in (r, log_w, k, v, a, b))
    S = v.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.float().clone()
    o = torch.empty_like(v)
    for t in range(T):
        u = torch.einsum("bhk,bhkv->bhv", a[:, t], S)
        write = b[:, t, ..., None] * u[..., None, :] + k[:, t, ..., None] * v[:, t, ..., None, :]
        S = S * log_w[:, t].exp()[..., None] + write
        o[:, t] = torch.einsum("bhk,bhkv->bhv", r[:, t], S)
    return o, S


@torch.no_grad()  # inference only: the in-place and out= products are not differentiable
def chunk_rwkv7(
    *,
    r: Tensor,
    log_w: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    initial_state: Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    output_final_state: bool = True,
    with_stats: bool = True,
) -> tuple[Tensor, Tensor | None, RecurrenceStats | None]:
    """Chunked parallel form of the recurrence, for prefill. Computes in fp32 whatever the input dtype.

    Within a chunk, with c_t the inclusive cumulative log-decay from the chunk start, ~ for a vector
    scaled by exp(c_{t-1}) (a) or exp(c_t) (r) and ^ for one scaled by exp(-c_t) (b, k):

        U = (I - tril(A~ B^T, -1))^-1 (A~ S_0 + tril(A~ K^T, -1) V)        the reads u_t, [C, V]
        O = R~ S_0 + tril(R~ B^T) U + tril(R~ K^T) V
        S_C = diag(exp(c_C)) S_0 + (B exp(c_C - c))^T U + (K exp(c_C - c))^T V

    Everything that does not depend on the carried state is computed for a block of chunks at once
    in batched products; only two products per chunk run in the loop over chunks. The last chunk is
    zero-padded (a = b = k = 0, log_w = 0), which leaves the state unchanged.

    Args:
        r, k, a, b: [B, T, H, K].
        log_w: [B, T, H, K], log-space decay in [-exp(-1/2), 0].
        v: [B, T, H, V].
        initial_state: [B, H, K, V] or None (zeros); not modified.
        chunk_size: C, tokens per chunk, at most MAX_CHUNK_SIZE.
        output_final_state: return the state after the span (else None).
        with_stats: return ``RecurrenceStats`` for the span (else None).

    Returns:
        o: [B, T, H, V] fp32; final_state: [B, H, K, V] fp32 or None; stats or None.
    """
    _check_shapes(r, log_w, k, v, a, b)
    B, T, H, K = k.shape
    V = v.shape[-1]
    if T == 0:
        raise ValueError("chunk_rwkv7 needs at least one token")
    if not 1 <= chunk_size <= MAX_CHUNK_SIZE:
        raise ValueError(f"chunk_size must be in [1, {MAX_CHUNK_SIZE}], got {chunk_size}")
    if initial_state is None:
        S = torch.zeros(B * H, K, V, dtype=torch.float32, device=v.device)
    else:
        S = initial_state.to(torch.float32, copy=True).reshape(B * H, K, V)
    out = torch.empty(B, T, H, V, dtype=torch.float32, device=v.device)
    block = block_tokens(v.device, B * H, chunk_size)
    delta_sum = torch.zeros(B, dtype=torch.float32, device=v.device) if with_stats else None
    for t0 in range(0, T, block):
        span = slice(t0, min(T, t0 + block))
        _chunk_block(
            r[:, span], log_w[:, span], k[:, span], v[:, span], a[:, span], b[:, span],
            S=S, out=out[:, span], C=chunk_size, delta_sum=delta_sum,
        )
    final = S.view(B, H, K, V)
    stats = None
    if with_stats:
        stats = RecurrenceStats(
            state_norm=final.reshape(B, -1).norm(dim=-1),
            gate_mean=log_w.float().exp().mean(dim=(1, 2, 3)),
            delta_norm=delta_sum / T,
        )
    return out, (final if output_final_state else None), stats


def _chunk_block(
    r: Tensor, log_w: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, *,
    S: Tensor, out: Tensor, C: int, delta_sum: Tensor | None,
) -> None:
    """Runs the chunked recurrence over one block of tokens ([B, Tb, H, *] inputs).

    Advances S ([B*H, K, V] fp32) in place, writes o into ``out`` ([B, Tb, H, V] fp32) and adds the
    block's per-token write norms to delta_sum.
    """
    B, Tb, H, K = k.shape
    V = v.shape[-1]
    pad = -Tb % C
    N = (Tb + pad) // C
    M = N * B * H  # (chunk, batch, head) triples, chunk-major

    def chunks(x: Tensor) -> Tensor:  # [B, Tb, H, D] -> [M, C, D] fp32, zero-padded
        x = F.pad(x.float(), (0, 0, 0, 0, 0, pad)) if pad else x.float()
        return x.unflatten(1, (N, C)).permute(1, 0, 3, 2, 4).reshape(M, C, x.shape[-1])

    rc, kc, vc, ac, bc, lw = (chunks(x) for x in (r, k, v, a, b, log_w))
    c = lw.cumsum(dim=1)  # [M, C, K] inclusive cumulative log-decay, in [-0.61 C, 0]

    # --- State-independent part, all chunks of the block at once -----------------------------
    grow = torch.exp(c)  # exp(c_t) <= 1
    shrink = torch.reciprocal(grow)  # exp(-c_t) <= exp(0.61 C): finite for C <= MAX_CHUNK_SIZE
    a_dec = ac * torch.exp(c - lw)  # a_t exp(c_{t-1}): a reads the state before token t decays it
    # [a~; r~] [2C, K] against [b^; k^] [2C, K]: one product gives the four C x C blocks
    left = torch.cat((a_dec, rc * grow), dim=1)
    right = torch.cat((bc * shrink, kc * shrink), dim=1)
    blocks = torch.bmm(left, right.transpose(1, 2))  # [M, 2C, 2C]
    strict = torch.ones(C, C, dtype=torch.bool, device=k.device).tril_(-1)
    incl = torch.ones(C, C, dtype=torch.bool, device=k.device).tril_()
    zero = torch.zeros((), device=k.device)
    a_b = torch.where(strict, blocks[:, :C, :C], zero)
    a_k = torch.where(strict, blocks[:, :C, C:], zero)
    r_b = torch.where(incl, blocks[:, C:, :C], zero)
    r_k = torch.where(incl, blocks[:, C:, C:], zero)
    del blocks, left, right

    # (I - a_b)^-1, solved once against the identity (much faster on CPU than per right-hand side)
    eye = torch.eye(C, dtype=torch.float32, device=k.device).expand(M, C, C)
    t_inv = torch.linalg.solve_triangular(eye - a_b, eye, upper=False, unitriangular=True)
    # U = W1 S_0 + W2 and O = Q S_0 + P, with W1, W2, Q, P free of the state
    w1 = torch.bmm(t_inv, a_dec)  # [M, C, K]
    w2 = torch.bmm(t_inv, torch.bmm(a_k, vc))  # [M, C, V]
    q = torch.baddbmm(rc * grow, r_b, w1)  # [M, C, K]
    p = torch.baddbmm(torch.bmm(r_k, vc), r_b, w2)  # [M, C, V]
    to_end = shrink * grow[:, -1:]  # exp(c_C - c_t): the decay from token t to the chunk end, <= 1
    b_write = (bc * to_end).transpose(1, 2)  # [M, K, C]
    kv_write = torch.bmm((kc * to_end).transpose(1, 2), vc)  # [M, K, V]
    chunk_decay = grow[:, -1:].transpose(1, 2)  # [M, K, 1]

    lhs = torch.cat((w1, q), dim=1).view(N, B * H, 2 * C, K)
    rhs = torch.cat((w2, p), dim=1).view(N, B * H, 2 * C, V)
    b_write, kv_write, chunk_decay = (x.view(N, B * H, *x.shape[1:]) for x in (b_write, kv_write, chunk_decay))

    # --- State-dependent part, one chunk at a time ----------------------------------------------
    uo = torch.empty(N, B * H, 2 * C, V, dtype=torch.float32, device=k.device)
    for i in range(N):
        torch.baddbmm(rhs[i], lhs[i], S, out=uo[i])  # [U; O] of chunk i
        S.mul_(chunk_decay[i]).baddbmm_(b_write[i], uo[i, :, :C]).add_(kv_write[i])

    o = uo[:, :, C:].reshape(N, B, H, C, V).permute(1, 0, 3, 2, 4).reshape(B, N * C, H, V)
    out.copy_(o[:, :Tb])
    if delta_sum is not None:
        u = uo[:, :, :C].reshape(M, C, V)
        # ||b u^T + k v^T||_F^2 = |b|^2 |u|^2 + |k|^2 |v|^2 + 2 (b.k)(u.v), per token and head
        sq = (
            bc.square().sum(-1) * u.square().sum(-1)
            + kc.square().sum(-1) * vc.square().sum(-1)
            + 2 * (bc * kc).sum(-1) * (u * vc).sum(-1)
        )
        delta_sum += sq.clamp_(min=0).view(N, B, H, C).sum(2).sqrt_().sum(dim=(0, 2))


@torch.no_grad()  # updates the state in place
def recurrent_step_rwkv7(
    *,
    r: Tensor,
    log_w: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    state: Tensor,
    with_stats: bool = False,
) -> tuple[Tensor, RecurrenceStats | None]:
    """One decode step: updates ``state`` in place and returns this token's output.

    Args:
        r, k, a, b: [B, H, K].
        log_w: [B, H, K], log-space decay in [-exp(-1/2), 0].
        v: [B, H, V].
        state: [B, H, K, V] fp32, updated in place.
        with_stats: also measure the step's ``RecurrenceStats`` (one extra pass over the state).

    Returns:
        o: [B, H, V] fp32; the stats, or None.
    """
    _check_shapes(r, log_w, k, v, a, b)
    r, log_w, k, v, a, b = (x.float() for x in (r, log_w, k, v, a, b))
    w = log_w.exp()
    # Both reads of the old state in one product: o_t = (w r)^T S + (r.b) u + (r.k) v
    read = torch.matmul(torch.stack((a, w * r), dim=-2), state)  # [B, H, 2, V]: [u; (w r)^T S]
    u = read[..., 0, :]
    o = read[..., 1, :] + (r * b).sum(-1, keepdim=True) * u + (r * k).sum(-1, keepdim=True) * v
    write = torch.matmul(torch.stack((b, k), dim=-1), torch.stack((u, v), dim=-2))  # b u^T + k v^T
    state.mul_(w.unsqueeze(-1)).add_(write)
    if not with_stats:
        return o, None
    B = state.shape[0]
    stats = RecurrenceStats(
        state_norm=state.reshape(B, -1).norm(dim=-1),
        gate_mean=w.view(B, -1).mean(dim=-1),
        delta_norm=write.square().sum(dim=(1, 2, 3)).sqrt(),
    )
    return o, stats


def _check_shapes(r: Tensor, log_w: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor) -> None:
    """r, log_w, k, a, b: [*lead, K]; v: [*lead, V] (lead = B, T, H or B, H)."""
    if not (r.shape == log_w.shape == k.shape == a.shape == b.shape) or v.shape[:-1] != k.shape[:-1]:
        raise ValueError(
            f"rwkv7 shapes disagree: r {tuple(r.shape)}, log_w {tuple(log_w.shape)}, k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}, a {tuple(a.shape)}, b {tuple(b.shape)}"
        )
