"""The RWKV-7 engine equals BlinkDL's reference (the `rwkv` package); its layouts and its wkv7 op.
What every family keeps (one call vs many, prefill vs decode, the State, diagnostics, bf16, the
CLI from a `.pth`) is checked in test_family_contract.py.

Tolerances (fp32):
- logits vs the reference: 1e-5 relative to the largest logit (measured: ~1e-6; the two sides sum
  in different orders, and the reference runs the state update token by token);
- wkv7 ops: chunked / step vs the naive oracle atol 2e-5, rtol 1e-5; at the decay's lower bound
  (the hardest case for the chunk form) the same, for the default chunk, 64 and the largest, 128.

Tiny models run on one thread: on a shared two-core machine two threads mostly wait for each other.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from summarize.engine import ModelNotAvailable, load_model
from summarize.engine.models.rwkv7 import RWKV7Model
from summarize.engine.ops.rwkv7_wkv import (
    DEFAULT_CHUNK_SIZE,
    LOG_DECAY_MIN,
    MAX_CHUNK_SIZE,
    chunk_rwkv7,
    naive_recurrent_rwkv7,
    recurrent_step_rwkv7,
)
from summarize.errors import SummarizeError
from tiny_models import RWKV_TINY as TINY
from tiny_models import blinkdl_checkpoint, hf_layout

REL_TOL = 1e-5
VOCAB = TINY["vocab"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return blinkdl_checkpoint(tmp_path_factory.mktemp("rwkv7") / "tiny.pth", **TINY)


@pytest.fixture(scope="module")
def model(checkpoint) -> RWKV7Model:
    return load_model(checkpoint, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def reference(checkpoint):
    """BlinkDL's RWKV_x070 from the `rwkv` package, pure PyTorch on the CPU, fp32."""
    pytest.importorskip("rwkv")
    with mock.patch.dict(os.environ, {"RWKV_V7_ON": "1", "RWKV_JIT_ON": "0", "RWKV_CUDA_ON": "0"}), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # it scripts its functions with torch.jit
        import rwkv.model

        if not hasattr(rwkv.model, "RWKV_x070"):
            pytest.skip("rwkv.model was imported before without RWKV_V7_ON")
        return rwkv.model.RWKV_x070(str(checkpoint.with_suffix("")), "cpu fp32")  # it appends ".pth"


def reference_logits(reference, ids: list[int]) -> torch.Tensor:
    """[T, V]: every position, from one call."""
    logits, _ = reference.forward(ids, None, full_output=True)
    return logits.reshape(len(ids), -1)


def assert_logits_close(got: torch.Tensor, want: torch.Tensor, rel: float = REL_TOL) -> None:
    scale = want.abs().max().item()
    err = (got.float() - want.float()).abs().max().item()
    assert err <= rel * scale, f"max |diff| {err:.3g} > {rel} x {scale:.3g}"


def random_ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


# -- logits equal the reference -------------------------------------------------------------


@pytest.mark.parametrize("length", [1, 17, 64, 150])  # below, at and above multiples of the chunk
def test_logits_equal_reference_in_one_call(model, reference, length):
    ids = random_ids(2, length, seed=length)
    got = model.forward(ids, model.new_state(2))
    for row in range(2):  # the reference reads one sequence at a time
        assert_logits_close(got[row], reference_logits(reference, ids[row].tolist()))


def test_logits_equal_reference_token_by_token(model, reference):
    ids = random_ids(1, 24, seed=3)[0].tolist()
    ref_state, want = None, []
    for token in ids:
        logits, ref_state = reference.forward([token], ref_state)
        want.append(logits)
    state = model.new_state(1)
    got = [model.forward(torch.tensor([[token]]), state)[0, 0] for token in ids]
    assert_logits_close(torch.stack(got), torch.stack(want))
    state = model.new_state(1)
    got = [model.decode(torch.tensor([token]), state)[0] for token in ids]
    assert_logits_close(torch.stack(got), torch.stack(want))


def test_state_equals_reference_state(model, reference):
    ids = random_ids(1, 100, seed=4)[0].tolist()
    _, ref_state = reference.forward(ids, None)  # per layer: time-mix shift, wkv [H, V, K], channel-mix shift
    state = model.new_state(1)
    model.prefill(torch.tensor([ids]), state)
    for i, layer in enumerate(state.layers):
        assert torch.allclose(layer.matrix[0].transpose(-1, -2), ref_state[3 * i + 1], atol=1e-5, rtol=1e-5)
        assert torch.allclose(layer.shift[0, 0], ref_state[3 * i], atol=1e-5)
        assert torch.allclose(layer.shift[0, 1], ref_state[3 * i + 2], atol=1e-5)


def test_config_is_read_from_the_tensors(model):
    cfg = model.cfg
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.head_size) == (VOCAB, 64, 3, 2, 32)
    assert (cfg.decay_rank, cfg.iclr_rank, cfg.value_rank, cfg.gate_rank, cfg.ffn_size) == (16, 12, 8, 24, 160)


# -- loading ------------------------------------------------------------------------------------


def test_hugging_face_layout_gives_the_same_logits(tmp_path):
    # one head of 64: flash-linear-attention's group-norm eps (head_dim x norm_eps) is then BlinkDL's
    pth = blinkdl_checkpoint(tmp_path / "one-head.pth", **TINY | dict(head_size=64, layers=2))
    model = load_model(pth, device="cpu", dtype=torch.float32)
    hf_model = load_model(hf_layout(pth, tmp_path / "hf"), device="cpu", dtype=torch.float32)
    assert hf_model.cfg == model.cfg
    ids = random_ids(1, 70, seed=13)
    assert_logits_close(hf_model.forward(ids, hf_model.new_state(1)), model.forward(ids, model.new_state(1)), rel=1e-6)


def test_unknown_tensors_and_bad_files_are_refused(tmp_path):
    deep_embed = {"blocks.0.ffn.s_emb.weight": torch.zeros(VOCAB, 32)}  # an rwkv7a (DeepEmbed) tensor
    path = blinkdl_checkpoint(tmp_path / "variant.pth", **TINY, extra=deep_embed)
    with pytest.raises(SummarizeError, match="s_emb"):
        load_model(path, device="cpu", dtype=torch.float32)
    with pytest.raises(ModelNotAvailable):
        load_model(tmp_path / "missing.pth", device="cpu")
    pickled = tmp_path / "code.pth"
    torch.save({"emb.weight": torch.zeros(2, 2), "hook": Path("x")}, pickled)  # not a tensor: refused unread
    with pytest.raises(SummarizeError, match="not a readable PyTorch checkpoint") as refused:
        load_model(pickled, device="cpu")
    assert "summarize will not run" in str(refused.value) and "weights_only" not in str(refused.value)


# -- the wkv7 ops -------------------------------------------------------------------------------

ATOL, RTOL = 2e-5, 1e-5


def op_inputs(T: int, *, B: int = 2, H: int = 3, N: int = 16, seed: int = 0, lowest_decay: bool = False) -> dict:
    """The model's domains: a = -kk, b = kk * iclr with kk unit, log w in [-e^-1/2, 0]."""
    gen = torch.Generator().manual_seed(seed)
    kk = F.normalize(torch.randn(B, T, H, N, generator=gen), dim=-1)
    iclr = torch.rand(B, T, H, N, generator=gen)
    log_w = LOG_DECAY_MIN * torch.sigmoid(torch.randn(B, T, H, N, generator=gen) * 2)
    if lowest_decay:  # every channel forgets as fast as it can: the widest cumulative decays
        log_w = torch.full_like(log_w, LOG_DECAY_MIN)
    return dict(
        r=torch.randn(B, T, H, N, generator=gen), log_w=log_w, k=torch.randn(B, T, H, N, generator=gen) * 0.5,
        v=torch.randn(B, T, H, N, generator=gen), a=-kk, b=kk * iclr,
    )


@pytest.mark.parametrize("T", [1, DEFAULT_CHUNK_SIZE - 1, DEFAULT_CHUNK_SIZE, 2 * DEFAULT_CHUNK_SIZE + 1, 200])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunk_op_equals_naive(T, with_state):
    x = op_inputs(T, seed=T)
    s0 = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)) if with_state else None
    want_o, want_s = naive_recurrent_rwkv7(**x, initial_state=s0)
    o, s, _ = chunk_rwkv7(**x, initial_state=s0)
    assert torch.allclose(o, want_o, atol=ATOL, rtol=RTOL)
    assert torch.allclose(s, want_s, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("chunk_size", [DEFAULT_CHUNK_SIZE, 64, MAX_CHUNK_SIZE])
def test_chunk_op_is_accurate_at_the_lowest_decay(chunk_size):
    """Cumulative decays reach exp(-0.61 C) within a chunk; the bound on w keeps them finite."""
    x = op_inputs(300, seed=2, lowest_decay=True)
    s0 = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    want_o, want_s = naive_recurrent_rwkv7(**x, initial_state=s0)
    o, s, stats = chunk_rwkv7(**x, initial_state=s0, chunk_size=chunk_size)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    assert torch.allclose(o, want_o, atol=ATOL, rtol=RTOL)
    assert torch.allclose(s, want_s, atol=ATOL, rtol=RTOL)
    assert torch.allclose(stats.gate_mean, torch.full((2,), math.exp(LOG_DECAY_MIN)))


def test_step_op_and_stats_equal_naive():
    T = 12
    x = op_inputs(T, seed=4)
    s0 = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(5))
    want_o, want_s = naive_recurrent_rwkv7(**x, initial_state=s0)
    state, outs, deltas = s0.clone(), [], []
    for t in range(T):
        before = state.clone()
        o, stats = recurrent_step_rwkv7(**{n: v[:, t] for n, v in x.items()}, state=state, with_stats=True)
        outs.append(o)
        # what the token wrote: the new state minus the decayed old one
        written = state - before * x["log_w"][:, t].exp()[..., None]
        assert torch.allclose(stats.delta_norm, written.flatten(1).norm(dim=-1), rtol=1e-4)
        deltas.append(stats.delta_norm)
    assert torch.allclose(torch.stack(outs, dim=1), want_o, atol=ATOL, rtol=RTOL)
    assert torch.allclose(state, want_s, atol=ATOL, rtol=RTOL)
    _, _, chunk_stats = chunk_rwkv7(**x, initial_state=s0)
    assert torch.allclose(chunk_stats.delta_norm, torch.stack(deltas).mean(0), rtol=1e-4)
    assert torch.allclose(chunk_stats.state_norm, want_s.flatten(1).norm(dim=-1), rtol=1e-5)
    assert torch.allclose(chunk_stats.gate_mean, x["log_w"].exp().mean(dim=(1, 2, 3)))
