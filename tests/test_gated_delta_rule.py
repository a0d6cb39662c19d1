"""The Gated Delta Rule ops: chunked and single-step forms against the naive oracle and transformers.

Tolerances (fp32 unless stated):
- chunked / step vs naive oracle: atol 2e-5, rtol 1e-5 (outputs are O(1), states O(1..10)).
- vs transformers' torch_* reference functions: atol 2e-5, rtol 1e-5.
- stats vs an independent naive recomputation: rtol 1e-5.
- bf16 inputs vs the same values upcast to fp32: outputs atol 5e-3 / rtol 1e-2 (the bf16 rounding
  of the output, outputs are O(0.5)), state atol/rtol 1e-5 (fp32 throughout); vs the original fp32
  inputs before rounding: atol/rtol 2e-2 on both.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from summarize.engine.diagnostics import RecurrenceStats
from summarize.engine.ops.gated_delta_rule import (
    chunk_gated_delta_rule,
    naive_recurrent_gated_delta_rule,
    recurrent_step_gated_delta_rule,
)

B, H, K, V = 2, 3, 16, 24
CHUNK = 64
ATOL, RTOL = 2e-5, 1e-5


def make_inputs(T: int, *, seed: int = 0, b: int = B, h: int = H, k_dim: int = K, v_dim: int = V):
    """Realistic domains: unit q/k, beta = sigmoid(.), g = -exp(A_log) * softplus(. + dt_bias)."""
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(b, T, h, k_dim, generator=gen), dim=-1)
    k = F.normalize(torch.randn(b, T, h, k_dim, generator=gen), dim=-1)
    v = torch.randn(b, T, h, v_dim, generator=gen)
    a_log = torch.rand(h, generator=gen) * 2.0 - 1.0
    dt_bias = torch.randn(h, generator=gen)
    g = -a_log.exp() * F.softplus(torch.randn(b, T, h, generator=gen) + dt_bias)
    beta = torch.sigmoid(torch.randn(b, T, h, generator=gen))
    state = torch.randn(b, h, k_dim, v_dim, generator=gen)
    return dict(q=q, k=k, v=v, g=g, beta=beta), state


def assert_close(actual, expected, atol=ATOL, rtol=RTOL):
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)


def naive_with_u(x, initial_state, scale=None):
    """Independent loop that keeps u_t, for the stats: returns (state, [B, T, H, V] u, o)."""
    q, k, v, g, beta = (x[n].double() for n in ("q", "k", "v", "g", "beta"))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    S = initial_state.double().clone()
    us, os_ = [], []
    for t in range(q.shape[1]):
        S = S * g[:, t].exp()[:, :, None, None]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhk,bhkv->bhv", k[:, t], S))
        S = S + torch.einsum("bhk,bhv->bhkv", k[:, t], u)
        us.append(u)
        os_.append(torch.einsum("bhk,bhkv->bhv", scale * q[:, t], S))
    return S, torch.stack(us, 1), torch.stack(os_, 1)


@pytest.mark.parametrize("T", [1, 17, 63, 64, 100, 130])
@pytest.mark.parametrize("with_initial", [False, True])
def test_chunked_matches_naive(T, with_initial):
    x, state = make_inputs(T, seed=T)
    init = state if with_initial else None
    o_ref, s_ref = naive_recurrent_gated_delta_rule(**x, initial_state=init)
    o, s, stats = chunk_gated_delta_rule(**x, initial_state=init, chunk_size=CHUNK)
    assert o.shape == (B, T, H, V) and o.dtype == torch.float32
    assert s.shape == (B, H, K, V) and s.dtype == torch.float32
    assert isinstance(stats, RecurrenceStats)
    assert_close(o, o_ref)
    assert_close(s, s_ref)


@pytest.mark.parametrize("chunk_size", [16, 32, 128])
def test_chunk_sizes_agree(chunk_size):
    x, state = make_inputs(100, seed=1)
    o_ref, s_ref = naive_recurrent_gated_delta_rule(**x, initial_state=state)
    o, s, _ = chunk_gated_delta_rule(**x, initial_state=state, chunk_size=chunk_size)
    assert_close(o, o_ref)
    assert_close(s, s_ref)


def test_many_blocks_match_naive():
    """Enough batch x heads x tokens to span several blocks of chunks inside one call."""
    x, state = make_inputs(300, seed=2, b=2, h=16, k_dim=8, v_dim=8)
    o_ref, s_ref = naive_recurrent_gated_delta_rule(**x, initial_state=state)
    o, s, _ = chunk_gated_delta_rule(**x, initial_state=state, chunk_size=32)
    assert_close(o, o_ref)
    assert_close(s, s_ref)


def test_custom_scale():
    x, state = make_inputs(40, seed=3)
    o_ref, s_ref = naive_recurrent_gated_delta_rule(**x, initial_state=state, scale=0.5)
    o, s, _ = chunk_gated_delta_rule(**x, initial_state=state, scale=0.5, chunk_size=16)
    assert_close(o, o_ref)
    assert_close(s, s_ref)


@pytest.mark.parametrize("with_initial", [False, True])
def test_step_matches_naive(with_initial):
    T = 20
    x, state = make_inputs(T, seed=4)
    init = state if with_initial else None
    o_ref, s_ref = naive_recurrent_gated_delta_rule(**x, initial_state=init)
    S = state.clone() if with_initial else torch.zeros(B, H, K, V)
    for t in range(T):
        o, _ = recurrent_step_gated_delta_rule(
            q=x["q"][:, t], k=x["k"][:, t], v=x["v"][:, t], g=x["g"][:, t], beta=x["beta"][:, t], state=S
        )
        assert o.shape == (B, H, V)
        assert_close(o, o_ref[:, t])
    assert_close(S, s_ref)


def test_step_updates_state_in_place():
    x, state = make_inputs(1, seed=5)
    S = state.clone()
    ptr = S.data_ptr()
    step = {n: t[:, 0] for n, t in x.items()}
    recurrent_step_gated_delta_rule(**step, state=S)
    assert S.data_ptr() == ptr
    assert not torch.equal(S, state)


def test_chunked_prefill_then_steps():
    """Prefill with the chunked form, continue with single steps: the same as one naive pass."""
    T, split = 90, 70
    x, state = make_inputs(T, seed=6)
    o_ref, s_ref = naive_recurrent_gated_delta_rule(**x, initial_state=state)
    o, S, _ = chunk_gated_delta_rule(**{n: t[:, :split] for n, t in x.items()}, initial_state=state)
    assert_close(o, o_ref[:, :split])
    for t in range(split, T):
        o_t, _ = recurrent_step_gated_delta_rule(**{n: x[n][:, t] for n in x}, state=S)
        assert_close(o_t, o_ref[:, t])
    assert_close(S, s_ref)


@pytest.mark.parametrize("split", [30, 64, 77])
def test_two_halves_carry_state(split):
    T = 150
    x, state = make_inputs(T, seed=7)
    o_full, s_full, _ = chunk_gated_delta_rule(**x, initial_state=state)
    first = {n: t[:, :split] for n, t in x.items()}
    second = {n: t[:, split:] for n, t in x.items()}
    o1, s1, _ = chunk_gated_delta_rule(**first, initial_state=state)
    o2, s2, _ = chunk_gated_delta_rule(**second, initial_state=s1)
    assert_close(torch.cat([o1, o2], dim=1), o_full)
    assert_close(s2, s_full)


def test_initial_state_not_modified():
    x, state = make_inputs(50, seed=8)
    before = state.clone()
    chunk_gated_delta_rule(**x, initial_state=state)
    naive_recurrent_gated_delta_rule(**x, initial_state=state)
    assert torch.equal(state, before)


def test_padding_does_not_change_state():
    """Explicit no-op tokens (k = 0, beta = 0, g = 0) leave the state exactly as it was."""
    T = 37
    x, state = make_inputs(T, seed=9)
    _, s, _ = chunk_gated_delta_rule(**x, initial_state=state, chunk_size=16)
    pad = 11
    padded = {n: F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for n, t in x.items()}
    _, s_pad, _ = chunk_gated_delta_rule(**padded, initial_state=state, chunk_size=16)
    assert_close(s_pad, s, atol=1e-6, rtol=1e-6)
    # and the internal padding of a partial chunk equals running on a full one
    _, s_ref = naive_recurrent_gated_delta_rule(**x, initial_state=state)
    assert_close(s, s_ref)


def test_output_final_state_flag_and_no_stats():
    x, state = make_inputs(10, seed=10)
    o, s, stats = chunk_gated_delta_rule(**x, initial_state=state, output_final_state=False, with_stats=False)
    assert s is None and stats is None
    o_ref, _ = naive_recurrent_gated_delta_rule(**x, initial_state=state)
    assert_close(o, o_ref)


def test_unrepeated_k_heads_are_rejected():
    x, state = make_inputs(8, seed=15)
    x["k"] = x["k"][:, :, :1]
    with pytest.raises(ValueError, match="repeated"):
        chunk_gated_delta_rule(**x, initial_state=state)
    with pytest.raises(ValueError, match="repeated"):
        recurrent_step_gated_delta_rule(**{n: t[:, 0] for n, t in x.items()}, state=state.clone())


def test_strided_inputs():
    """q, k, v sliced out of one fused projection (non-contiguous) give the same result."""
    T = 45
    x, state = make_inputs(T, seed=16)
    fused = torch.cat([x["q"], x["k"], x["v"]], dim=-1)  # [B, T, H, 2K + V]
    strided = dict(x, q=fused[..., :K], k=fused[..., K : 2 * K], v=fused[..., 2 * K :])
    assert not strided["q"].is_contiguous()
    o_ref, s_ref = naive_recurrent_gated_delta_rule(**x, initial_state=state)
    o, s, _ = chunk_gated_delta_rule(**strided, initial_state=state, chunk_size=16)
    assert_close(o, o_ref)
    assert_close(s, s_ref)


def test_inputs_requiring_grad():
    """Called outside no_grad / inference_mode with parameters upstream: still runs."""
    x, state = make_inputs(20, seed=17)
    xg = {n: t.clone().requires_grad_() for n, t in x.items()}
    o, s, _ = chunk_gated_delta_rule(**xg, initial_state=state)
    o_ref, s_ref = naive_recurrent_gated_delta_rule(**x, initial_state=state)
    assert_close(o, o_ref)
    assert_close(s, s_ref)


def _expected_stats(x, state):
    S, u, _ = naive_with_u(x, state)
    k = x["k"].double()
    per_token = (k.square().sum(-1) * u.square().sum(-1)).sum(-1).sqrt()  # [B, T]
    return (
        S.reshape(S.shape[0], -1).norm(dim=-1),
        x["g"].double().exp().mean(dim=(1, 2)),
        per_token.mean(dim=1),
    )


@pytest.mark.parametrize("T", [1, 17, 64, 130])
def test_chunk_stats_match_naive(T):
    x, state = make_inputs(T, seed=11 + T)
    # unnormalised k, so that the ||k_t|| factor of delta_norm is exercised too
    x["k"] = x["k"] * torch.linspace(0.5, 1.5, T)[None, :, None, None]
    _, _, stats = chunk_gated_delta_rule(**x, initial_state=state)
    state_norm, gate_mean, delta_norm = _expected_stats(x, state)
    got_all = (stats.state_norm, stats.gate_mean, stats.delta_norm)
    for got, want in zip(got_all, (state_norm, gate_mean, delta_norm)):
        assert got.shape == (B,) and got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_step_stats_match_naive():
    x, state = make_inputs(1, seed=12)
    S = state.clone()
    o, stats = recurrent_step_gated_delta_rule(**{n: t[:, 0] for n, t in x.items()}, state=S, with_stats=True)
    state_norm, gate_mean, delta_norm = _expected_stats(x, state)
    torch.testing.assert_close(stats.state_norm.double(), state_norm, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats.gate_mean.double(), gate_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats.delta_norm.double(), delta_norm, rtol=1e-5, atol=1e-6)


def test_naive_matches_float64_loop():
    x, state = make_inputs(50, seed=13)
    o, s = naive_recurrent_gated_delta_rule(**x, initial_state=state)
    s64, _, o64 = naive_with_u(x, state)
    assert_close(o.double(), o64)
    assert_close(s.double(), s64)


def test_bf16_inputs_close_to_fp32():
    T = 100
    x, state = make_inputs(T, seed=14)
    x16 = {n: t.bfloat16() for n, t in x.items()}
    x32 = {n: t.float() for n, t in x16.items()}  # the same values, upcast
    o16, s16, _ = chunk_gated_delta_rule(**x16, initial_state=state)
    o32, s32, _ = chunk_gated_delta_rule(**x32, initial_state=state)
    assert o16.dtype == torch.bfloat16 and s16.dtype == torch.float32
    # computed in fp32 inside: only the output's rounding to bf16 differs
    torch.testing.assert_close(o16.float(), o32, atol=5e-3, rtol=1e-2)
    torch.testing.assert_close(s16, s32, atol=1e-5, rtol=1e-5)
    # and against the original fp32 inputs, before their rounding to bf16
    o, s, _ = chunk_gated_delta_rule(**x, initial_state=state)
    torch.testing.assert_close(o16.float(), o, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(s16, s, atol=2e-2, rtol=2e-2)
    S = state.clone()
    o_step, _ = recurrent_step_gated_delta_rule(**{n: t[:, 0] for n, t in x16.items()}, state=S)
    assert o_step.dtype == torch.bfloat16 and S.dtype == torch.float32
    torch.testing.assert_close(o_step.float(), o32[:, 0], atol=5e-3, rtol=1e-2)


# --- transformers' reference implementation (test-only dependency) --------------------------------

qwen3_5 = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")


def _reference_args(x):
    # transformers takes the same [B, T, H, D] layout, positionally; it scales q by K ** -0.5 itself
    return x["q"], x["k"], x["v"]


@pytest.mark.parametrize("T", [1, 17, 64, 100, 130])
def test_matches_transformers_chunked(T):
    x, state = make_inputs(T, seed=20 + T)
    o_ref, s_ref = qwen3_5.torch_chunk_gated_delta_rule(
        *_reference_args(x), g=x["g"], beta=x["beta"], chunk_size=CHUNK, initial_state=state,
        output_final_state=True, use_qk_l2norm_in_kernel=False,
    )
    o, s, _ = chunk_gated_delta_rule(**x, initial_state=state)
    assert_close(o, o_ref)
    assert_close(s, s_ref)


def test_matches_transformers_recurrent():
    T = 33
    x, state = make_inputs(T, seed=40)
    o_ref, s_ref = qwen3_5.torch_recurrent_gated_delta_rule(
        *_reference_args(x), g=x["g"], beta=x["beta"], initial_state=state,
        output_final_state=True, use_qk_l2norm_in_kernel=False,
    )
    o_naive, s_naive = naive_recurrent_gated_delta_rule(**x, initial_state=state)
    assert_close(o_naive, o_ref)
    assert_close(s_naive, s_ref)
    S = state.clone()
    for t in range(T):
        o_t, _ = recurrent_step_gated_delta_rule(**{n: x[n][:, t] for n in x}, state=S)
        assert_close(o_t, o_ref[:, t])
    assert_close(S, s_ref)


def test_matches_transformers_with_grouped_heads():
    """transformers repeats k heads itself; ours expects them repeated (repeat_interleave)."""
    T, h_k, groups = 70, 2, 3
    x, state = make_inputs(T, seed=41, h=h_k * groups)
    q_k = {n: F.normalize(torch.randn(B, T, h_k, K, generator=torch.Generator().manual_seed(i)), dim=-1)
           for i, n in enumerate(("q", "k"))}
    o_ref, s_ref = qwen3_5.torch_chunk_gated_delta_rule(
        q_k["q"], q_k["k"], x["v"], g=x["g"], beta=x["beta"], initial_state=state,
        output_final_state=True, use_qk_l2norm_in_kernel=False,
    )
    x["q"], x["k"] = (q_k[n].repeat_interleave(groups, dim=2) for n in ("q", "k"))
    o, s, _ = chunk_gated_delta_rule(**x, initial_state=state)
    assert_close(o, o_ref)
    assert_close(s, s_ref)
