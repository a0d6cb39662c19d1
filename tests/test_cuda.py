"""On a GPU the engine equals the reference, with or without flash-linear-attention's kernels
(Qwen3.5's Gated DeltaNet and RWKV-7's state update).

Skipped where torch sees no CUDA device; the tests of fla's kernels also where fla-core is not
installed (the optional extra `fla`). `bench/device_check.sh` runs this file on a lent GPU.

Tolerances, relative to the largest value compared:
- the torch path in fp32: 1e-4, as on the CPU (the same products, summed in other orders), against
  transformers for Qwen3.5 and against our CPU engine for RWKV-7 (itself checked to 1e-5 against
  BlinkDL's reference in test_rwkv7.py);
- fla's kernels: 1e-2 in fp32 (Triton's products of fp32 inputs round them to tf32, 10 bits of
  mantissa) and 3e-2 in bf16 inputs (8 bits; the state is carried in fp32 either way).
A wrong layout or head grouping is off by the size of the values themselves.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from summarize.engine import load_model
from summarize.engine.ops import gated_delta_rule, rwkv7_wkv, rwkv7_wkv_fla
from summarize.engine.ops.gated_delta_rule import chunk_gated_delta_rule, naive_recurrent_gated_delta_rule
from summarize.engine.ops.gated_delta_rule_fla import fla_chunk_gated_delta_rule, fla_usable
from summarize.engine.ops.rwkv7_wkv import LOG_DECAY_MIN, chunk_rwkv7, naive_recurrent_rwkv7
from tiny_models import RWKV_TINY, blinkdl_checkpoint, dense_reference, save_checkpoint

CUDA = torch.device("cuda")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
needs_fla = pytest.mark.skipif(
    not (torch.cuda.is_available() and fla_usable(CUDA)), reason="needs CUDA and fla-core"
)
pytestmark = needs_cuda
VOCAB = 384


def assert_close(got: torch.Tensor, want: torch.Tensor, rel: float) -> None:
    scale = want.abs().max().item()
    err = (got.float().cpu() - want.float().cpu()).abs().max().item()
    assert err <= rel * scale, f"max |diff| {err:.3g} > {rel} x {scale:.3g}"


def random_ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def rule_inputs(B=2, T=150, Hk=2, H=4, K=32, V=48, seed=0):
    """Inputs of the delta rule on the GPU: odd length, a v head per two k heads, a carried state."""
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, Hk, K, generator=gen), dim=-1)
    k = F.normalize(torch.randn(B, T, Hk, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, H, generator=gen) + 2)
    beta = torch.rand(B, T, H, generator=gen)
    state = torch.randn(B, H, K, V, generator=gen) * 0.1
    return [x.to(CUDA) for x in (q, k, v, g, beta, state)]


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    reference = dense_reference()
    folder = save_checkpoint(reference, tmp_path_factory.mktemp("dense"))
    with torch.no_grad():
        want = reference(input_ids=random_ids(2, 130)).logits
    return folder, want


@pytest.fixture
def torch_path(monkeypatch):
    monkeypatch.setattr(gated_delta_rule, "fla_usable", lambda device: False)


# -- fla's kernels equal the recurrence ---------------------------------------------------------


@needs_fla
@pytest.mark.parametrize("dtype, rel", [(torch.float32, 1e-2), (torch.bfloat16, 3e-2)])
def test_fla_rule_equals_the_token_by_token_recurrence(dtype, rel):
    q, k, v, g, beta, state = rule_inputs()
    o, final, _ = fla_chunk_gated_delta_rule(q=q, k=k, v=v.to(dtype), g=g, beta=beta, initial_state=state, with_stats=False)
    groups = v.shape[2] // k.shape[2]
    want_o, want_state = naive_recurrent_gated_delta_rule(
        q=q.repeat_interleave(groups, 2), k=k.repeat_interleave(groups, 2), v=v.to(dtype).float(),
        g=g, beta=beta, initial_state=state,
    )
    assert o.dtype == dtype and final.dtype == torch.float32
    assert_close(o, want_o, rel)
    assert_close(final, want_state, rel)


@needs_fla
def test_fla_rule_diagnostics_equal_the_torch_rules():
    q, k, v, g, beta, state = rule_inputs(seed=1)
    _, _, stats = fla_chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, initial_state=state)
    state_norm, gate_mean, delta_norm = stats.state_norm, stats.gate_mean, stats.delta_norm
    groups = v.shape[2] // k.shape[2]
    _, _, want = chunk_gated_delta_rule(
        q=q.repeat_interleave(groups, 2), k=k.repeat_interleave(groups, 2), v=v, g=g, beta=beta, initial_state=state
    )
    assert_close(state_norm, want.state_norm, 1e-2)
    assert_close(gate_mean, want.gate_mean, 1e-5)
    assert_close(delta_norm, want.delta_norm, 1e-2)


# -- the model on the GPU equals the reference ---------------------------------------------------


def test_torch_path_logits_equal_reference(dense, torch_path):
    folder, want = dense
    model = load_model(folder, device="cuda", dtype=torch.float32)
    assert_close(model.forward(random_ids(2, 130).to(CUDA), model.new_state(2)), want, 1e-4)


@needs_fla
def test_fla_path_logits_equal_reference(dense):
    folder, want = dense
    model = load_model(folder, device="cuda", dtype=torch.float32)
    assert_close(model.forward(random_ids(2, 130).to(CUDA), model.new_state(2)), want, 1e-2)


@needs_fla
def test_fla_prefill_equals_decode_steps(dense):
    """Chunked prefill in fla's kernels, then the same tokens one step at a time (torch's step)."""
    folder, _ = dense
    model = load_model(folder, device="cuda", dtype=torch.float32)
    ids = random_ids(1, 100, seed=3).to(CUDA)
    chunked = model.new_state(1)
    last = model.prefill(ids, chunked)
    stepped = model.new_state(1)
    for t in range(ids.shape[1]):
        step = model.forward(ids[:, t : t + 1], stepped)[:, -1]
    assert_close(last, step, 1e-2)
    for a, b in zip(chunked.layers, stepped.layers):
        if hasattr(a, "matrix"):
            assert_close(a.matrix, b.matrix, 1e-2)


@needs_fla
def test_bf16_fla_path_stays_close_to_fp32(dense):
    folder, _ = dense
    ids = random_ids(2, 130).to(CUDA)
    exact = load_model(folder, device="cuda", dtype=torch.float32)
    fast = load_model(folder, device="cuda", dtype=torch.bfloat16)
    want = exact.forward(ids, exact.new_state(2))
    assert_close(fast.forward(ids, fast.new_state(2)), want, 5e-2)


# -- RWKV-7 -------------------------------------------------------------------------------------


def rwkv7_inputs(B=2, T=150, H=3, N=32, seed=0) -> dict:
    """The model's domains (a = -kk, b = kk * iclr with kk unit, log w in [-e^-1/2, 0]), on the GPU."""
    gen = torch.Generator().manual_seed(seed)
    kk = F.normalize(torch.randn(B, T, H, N, generator=gen), dim=-1)
    iclr = torch.rand(B, T, H, N, generator=gen)
    x = dict(
        r=torch.randn(B, T, H, N, generator=gen),
        log_w=LOG_DECAY_MIN * torch.sigmoid(torch.randn(B, T, H, N, generator=gen) * 2),
        k=torch.randn(B, T, H, N, generator=gen) * 0.5, v=torch.randn(B, T, H, N, generator=gen),
        a=-kk, b=kk * iclr, initial_state=torch.randn(B, H, N, N, generator=gen) * 0.1,
    )
    return {name: t.to(CUDA) for name, t in x.items()}


@pytest.fixture(scope="module")
def rwkv7_checkpoint(tmp_path_factory):
    return blinkdl_checkpoint(tmp_path_factory.mktemp("rwkv7") / "tiny.pth", **RWKV_TINY)


@needs_fla
@pytest.mark.parametrize("dtype, rel", [(torch.float32, 1e-2), (torch.bfloat16, 3e-2)])
def test_fla_rwkv7_equals_the_token_by_token_recurrence(dtype, rel):
    x = rwkv7_inputs()
    o, final, _ = rwkv7_wkv_fla.fla_chunk_rwkv7(**x, dtype=dtype, with_stats=False)
    rounded = {name: t if name in ("log_w", "initial_state") else t.to(dtype).float() for name, t in x.items()}
    want_o, want_state = naive_recurrent_rwkv7(**rounded)
    assert o.dtype == final.dtype == torch.float32
    assert_close(o, want_o, rel)
    assert_close(final, want_state, rel)


@needs_fla
def test_fla_rwkv7_diagnostics_equal_the_torch_rules():
    x = rwkv7_inputs(seed=1)
    _, _, got = rwkv7_wkv_fla.fla_chunk_rwkv7(**x, dtype=torch.float32)
    _, _, want = chunk_rwkv7(**x)
    assert_close(got.state_norm, want.state_norm, 1e-2)
    assert_close(got.gate_mean, want.gate_mean, 1e-5)
    assert_close(got.delta_norm, want.delta_norm, 1e-2)


@pytest.mark.parametrize("kernels, rel", [("torch", 1e-4), ("fla", 1e-2)])
def test_rwkv7_on_the_gpu_equals_the_cpu(rwkv7_checkpoint, monkeypatch, kernels, rel):
    if kernels == "fla" and not rwkv7_wkv_fla.fla_usable(CUDA):
        pytest.skip("needs fla-core")
    if kernels == "torch":
        monkeypatch.setattr(rwkv7_wkv, "fla_usable", lambda device: False)
    ids = random_ids(2, 130, seed=4) % RWKV_TINY["vocab"]
    cpu = load_model(rwkv7_checkpoint, device="cpu", dtype=torch.float32)
    gpu = load_model(rwkv7_checkpoint, device="cuda", dtype=torch.float32)
    want = cpu.forward(ids, cpu.new_state(2))
    assert_close(gpu.forward(ids.to(CUDA), gpu.new_state(2)), want, rel)
