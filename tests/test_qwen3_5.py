"""The Qwen3.5 engine equals the reference (transformers), and what is Qwen3.5's own: its checkpoint
layouts, prefill blocks, the KV cache beside the recurrent state. What every family keeps (one call
vs many, prefill vs decode, the State, diagnostics, bf16) is checked in test_family_contract.py.

Tolerances: fp32 logits agree with the reference to 1e-4 relative to the largest logit (the two
sides sum in different orders).
"""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from summarize.engine import load_model, memory
from summarize.engine.models.qwen3_5 import Qwen35Model
from summarize.errors import SummarizeError
from tiny_models import dense_reference, moe_reference, save_checkpoint, vlm_reference

REL_TOL = 1e-4
VOCAB = 384


def assert_logits_close(got: torch.Tensor, want: torch.Tensor, rel: float = REL_TOL) -> None:
    scale = want.abs().max().item()
    err = (got.float() - want.float()).abs().max().item()
    assert err <= rel * scale, f"max |diff| {err:.3g} > {rel} x {scale:.3g}"


def random_ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    reference = dense_reference()
    folder = save_checkpoint(reference, tmp_path_factory.mktemp("dense"))
    return reference, load_model(folder, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    reference = vlm_reference()
    folder = save_checkpoint(reference, tmp_path_factory.mktemp("vlm"), mtp_tensors=True)
    return reference, load_model(folder, device="cpu", dtype=torch.float32)


def reference_logits(reference, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return reference(input_ids=ids).logits


# -- logits equal the reference -------------------------------------------------------------


@pytest.mark.parametrize("length", [1, 17, 64, 130])  # below, at and above the 64-token chunk
def test_dense_logits_equal_reference(dense, length):
    reference, model = dense
    ids = random_ids(2, length)
    assert_logits_close(model.forward(ids, model.new_state(2)), reference_logits(reference, ids))


@pytest.mark.parametrize("length", [5, 64, 100])
def test_vlm_checkpoint_logits_equal_reference(vlm, length):
    reference, model = vlm
    ids = random_ids(1, length, seed=1)
    assert_logits_close(model.forward(ids, model.new_state(1)), reference_logits(reference, ids))


def test_vlm_checkpoint_reads_no_vision_or_mtp_tensors(vlm):
    _, model = vlm
    shapes = {tuple(t.shape) for t in model.buffers()}
    assert (64, 128) not in shapes  # the mtp.fc tensor planted in the file
    assert not any("visual" in name or "mtp" in name for name, _ in model.named_buffers())


@pytest.mark.parametrize("fused_experts", [False, True])
def test_moe_logits_equal_reference(tmp_path, fused_experts):
    reference = moe_reference()
    folder = save_checkpoint(reference, tmp_path)
    if fused_experts:
        fuse_experts(folder / "model.safetensors", num_layers=4, num_experts=6)
    model = load_model(folder, device="cpu", dtype=torch.float32)
    ids = random_ids(2, 70, seed=2)
    assert_logits_close(model.forward(ids, model.new_state(2)), reference_logits(reference, ids))


def fuse_experts(file, *, num_layers: int, num_experts: int) -> None:
    """Rewrite per-expert tensors as the fused [E, 2I, H] / [E, H, I] layout some checkpoints use."""
    tensors = load_file(str(file))
    for i in range(num_layers):
        p = f"model.layers.{i}.mlp.experts."
        gate_up, down = [], []
        for e in range(num_experts):
            gate, up = tensors.pop(f"{p}{e}.gate_proj.weight"), tensors.pop(f"{p}{e}.up_proj.weight")
            gate_up.append(torch.cat([gate, up]))
            down.append(tensors.pop(f"{p}{e}.down_proj.weight"))
        tensors[p + "gate_up_proj"], tensors[p + "down_proj"] = torch.stack(gate_up), torch.stack(down)
    save_file(tensors, str(file))


# -- prefill is forward's last row; batch rows are single sequences -------------------------


def test_prefill_equals_last_row_of_forward(dense, monkeypatch):
    _, model = dense
    ids = random_ids(2, 90, seed=4)
    monkeypatch.setattr(Qwen35Model, "prefill_block_tokens", 32)  # three blocks, the last one short
    assert_logits_close(model.prefill(ids, model.new_state(2)), model.forward(ids, model.new_state(2))[:, -1], rel=1e-5)


def test_batch_rows_equal_single_sequences(dense):
    _, model = dense
    ids = random_ids(3, 40, seed=6)
    batched = model.prefill(ids, model.new_state(3))
    for b in range(3):
        assert_logits_close(batched[b : b + 1], model.prefill(ids[b : b + 1], model.new_state(1)), rel=1e-5)


# -- State -----------------------------------------------------------------------------------


def test_load_of_a_file_that_is_no_state_is_a_clear_error(dense, tmp_path):
    _, model = dense
    (tmp_path / "notes.safetensors").write_text("not tensors")
    with pytest.raises(SummarizeError, match="not a saved state"):
        model.new_state(1).load(tmp_path / "notes.safetensors")


def test_load_rejects_another_models_state(dense, vlm, tmp_path):
    _, model = dense
    other = vlm[1].new_state(2)  # batch 2: shapes differ
    other.save(tmp_path / "other.safetensors")
    with pytest.raises(SummarizeError, match="shape"):
        model.new_state(1).load(tmp_path / "other.safetensors")


def test_loading_bounds_the_cpu_kernel_caches(dense, tmp_path, monkeypatch):
    """oneDNN and ideep keep one kernel per matmul shape: unbounded, every chunk of a new length
    grew resident memory for good. Loading caps both, and leaves a user's own setting alone."""
    reference, _ = dense
    folder = save_checkpoint(reference, tmp_path)
    for setting in memory.KERNEL_CACHE_SETTINGS:
        monkeypatch.delenv(setting, raising=False)
    monkeypatch.setenv(memory.KERNEL_CACHE_SETTINGS[1], "7")
    load_model(folder, device="cpu", dtype=torch.float32)
    assert os.environ[memory.KERNEL_CACHE_SETTINGS[0]] == str(memory.KERNEL_CACHE_ENTRIES)
    assert os.environ[memory.KERNEL_CACHE_SETTINGS[1]] == "7"


def test_loading_on_a_cpu_flushes_subnormal_values_to_zero(dense, tmp_path):
    """The chunked delta rule's decays pass through the subnormal range, where x86 arithmetic is
    many times slower; loading sets flush-to-zero, so 1e-39 (subnormal in fp32) counts as 0."""
    reference, _ = dense
    folder = save_checkpoint(reference, tmp_path)
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush subnormal values")
    subnormal = torch.tensor([1e-39], dtype=torch.float64).float()
    assert (subnormal * 2).item() != 0.0
    load_model(folder, device="cpu", dtype=torch.float32)
    assert (subnormal * 2).item() == 0.0


# -- diagnostics -----------------------------------------------------------------------------


def test_diagnostics_equal_values_recomputed_from_the_reference(dense):
    """state_norm from the reference's cache; gate_mean and delta_norm from its layer inputs."""
    reference, model = dense
    ids = random_ids(1, 70, seed=17)
    reports = []
    model.listener = reports.append
    try:
        model.prefill(ids, model.new_state(1))
    finally:
        model.listener = None
    (report,) = reports
    assert report.phase == "prefill" and report.tokens == 70

    captured = {}
    hooks = [
        layer.linear_attn.register_forward_pre_hook(lambda mod, args, kw, i=i: captured.__setitem__(i, kw["hidden_states"]), with_kwargs=True)
        for i, layer in enumerate(reference.model.layers)
        if layer.block_type == "linear_attention"
    ]
    with torch.no_grad():
        out = reference(input_ids=ids, use_cache=True)
    cache = getattr(out, "cache", None) or out.past_key_values
    for h in hooks:
        h.remove()
    for i, row in enumerate(report.layers):
        if row.kind == "attention":
            assert row.kv_tokens == 70 and row.state_norm is None
            continue
        want_norm = cache.get_recurrent_state(i).norm().item()
        gate, delta = recompute_gate_and_delta(reference.model.layers[i].linear_attn, captured[i])
        assert row.state_norm == pytest.approx(want_norm, rel=1e-4)
        assert row.gate_mean == pytest.approx(gate, rel=1e-5)
        assert row.delta_norm == pytest.approx(delta, rel=1e-4)
        assert 0 < row.gate_mean < 1


def recompute_gate_and_delta(gdn, x: torch.Tensor) -> tuple[float, float]:
    """The GDN recurrence written out token by token from the reference layer's own modules."""
    import torch.nn.functional as F
    from transformers.models.qwen3_5.modeling_qwen3_5 import l2norm

    with torch.no_grad():
        T = x.shape[1]
        qkv = F.silu(gdn.conv1d(gdn.in_proj_qkv(x).transpose(1, 2))[..., :T]).transpose(1, 2)
        _, k, v = qkv.split([gdn.key_dim, gdn.key_dim, gdn.value_dim], dim=-1)
        k = l2norm(k.reshape(1, T, gdn.num_k_heads, gdn.head_k_dim)).repeat_interleave(gdn.num_v_heads // gdn.num_k_heads, 2)
        v = v.reshape(1, T, gdn.num_v_heads, gdn.head_v_dim)
        beta = gdn.in_proj_b(x).sigmoid()
        g = -gdn.A_log.exp() * F.softplus(gdn.in_proj_a(x) + gdn.dt_bias)
        S = torch.zeros(gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim)
        deltas = []
        for t in range(T):
            alpha = g[0, t].exp()[:, None, None]
            u = beta[0, t, :, None] * (v[0, t] - torch.einsum("hkv,hk->hv", alpha * S, k[0, t]))
            write = torch.einsum("hk,hv->hkv", k[0, t], u)
            S = alpha * S + write
            deltas.append(write.norm().item())
        return g.exp().mean().item(), sum(deltas) / T


# -- loading ---------------------------------------------------------------------------------


def test_missing_tensor_is_named(dense, tmp_path):
    reference, _ = dense
    folder = save_checkpoint(reference, tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["model.layers.2.linear_attn.A_log"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(SummarizeError, match=r"layers\.2\.linear_attn\.A_log"):
        load_model(folder, device="cpu", dtype=torch.float32)


def test_misshaped_tensor_is_named(dense, tmp_path):
    reference, _ = dense
    folder = save_checkpoint(reference, tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.layers.3.self_attn.o_proj.weight"] = torch.zeros(3, 3)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(SummarizeError, match=r"o_proj\.weight has shape \(3, 3\)"):
        load_model(folder, device="cpu", dtype=torch.float32)


def test_unknown_model_type_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(SummarizeError, match="unsupported model_type 'llama'"):
        load_model(tmp_path, device="cpu")


def test_unreachable_hub_id_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(SummarizeError, match="not available"):
        load_model("nobody/no-such-model", device="cpu")


def test_model_is_the_qwen_class(dense):
    assert isinstance(dense[1], Qwen35Model)


def test_greedy_generation_equals_transformers_generate(dense):
    from summarize.engine.generation.generate import GenerationRequest, generate

    reference, model = dense
    prompt = random_ids(1, 23, seed=19)
    with torch.no_grad():
        want = reference.generate(prompt, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    got = generate(model, model.new_state(1), GenerationRequest(
        prompts=prompt[0].tolist(), tokenizer=_NoText(), stop_ids=(), max_new_tokens=20))
    assert got.token_ids == want[0, 23:].tolist()


class _NoText:
    """The random model's ids are not text; generation only needs decode() for the final string."""

    def decode(self, ids, skip_special_tokens=True):
        return ""


def test_states_of_different_lengths_decode_as_one_batch(dense):
    """Chunks read one by one (different lengths) then decode together, as map-reduce does."""
    _, model = dense
    prompts = [random_ids(1, n, seed=20 + n) for n in (9, 31, 20)]
    singles, firsts = [], []
    for prompt in prompts:
        state = model.new_state(1)
        firsts.append(model.prefill(prompt, state))
        singles.append(state)
    batch = type(singles[0]).stack(singles)
    # reference: each sequence decoded alone from a copy of its own state
    alone = []
    for prompt in prompts:
        state = model.new_state(1)
        model.prefill(prompt, state)
        alone.append([model.decode(torch.tensor([t]), state) for t in (3, 4, 5)])
    for step, token in enumerate((3, 4, 5)):
        rows = model.decode(torch.tensor([token] * 3), batch)
        for b in range(3):
            assert_logits_close(rows[b : b + 1], alone[b][step], rel=1e-5)


def test_truncated_weights_file_is_a_clear_error(dense, tmp_path):
    reference, _ = dense
    folder = save_checkpoint(reference, tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(SummarizeError, match="truncated"):
        load_model(folder, device="cpu", dtype=torch.float32)


def test_a_single_state_stacks_as_itself(dense):
    """One row is already a batch: no copy, no padding, no per-row positions."""
    _, model = dense
    state = model.new_state(1)
    model.prefill(random_ids(1, 7), state)
    assert type(state).stack([state]) is state
    assert state.row_positions is None
