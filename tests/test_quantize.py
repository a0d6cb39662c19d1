"""Weight-only int8 and int4: what they store, what they compute, and how far they move the logits.

Tolerances:
- an int8 projection equals x @ (its dequantized weight)ᵀ to fp32 rounding (1e-5 relative); so
  does an int4 one with many rows (dequantize, then GEMM); with up to INT4_KERNEL_MAX_ROWS rows
  torch's int4 kernel reads x in bf16: 1e-2 of the largest output (bf16 keeps 8 bits);
- compiled and eager decode agree to 1e-4 of the largest logit (int8), 2e-2 (int4: the kernel's
  bf16 input, amplified by the tiny random model);
- the int8 model's logits stay within 10% of the largest fp32 logit (measured: 5%; random weights
  give flat logits, the worst case for a relative error), and pick the same argmax on ≥ 90% of
  positions;
- int4 moves each weight by at most half its group's step, (max − min) / 15, which on Gaussian
  weights is ~9% noise on a projection's output (≤ 11% asserted) against int8's ~0.6%; the tiny
  random model amplifies either about 14× (int8: 5% of the largest logit), so int4's model-level
  check is against the same model with the dequantized weights, to the kernel's bf16 rounding.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch._dynamo.utils import counters

from summarize.engine import load_model
from summarize.engine.compiled import PREFILL_COMPILE_TOKENS
from summarize.engine.ops import machine
from summarize.engine.ops.int4_packing import int4_codes, pack_int4_codes
from summarize.engine.ops.linear import INT4_GROUP, INT4_LEVELS, INT8_MAX, Projection, dequantize_int4, int8_activations
from summarize.errors import SummarizeError
from tiny_models import RWKV6_TINY, RWKV_TINY, blinkdl_checkpoint, dense_reference, rwkv6_checkpoint, save_checkpoint

INT4_KERNEL_MAX_ROWS = machine.POLICY.int4_kernel_max_rows  # int4's switch of kernels on this CPU

VOCAB = 384


def dequantized(projection: Projection) -> torch.Tensor:
    return projection.weight.float() * projection.scale.float()[:, None]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_checkpoint(dense_reference(), tmp_path_factory.mktemp("dense"))


def test_int8_weights_are_within_half_a_step_of_the_original():
    weight = torch.randn(300, 64, dtype=torch.bfloat16) * torch.linspace(0.01, 3, 300, dtype=torch.bfloat16)[:, None]
    projection = Projection(weight.clone())
    projection.quantize_int8()
    assert projection.weight.dtype == torch.int8 and projection.scale.dtype == torch.bfloat16
    assert projection.weight.abs().max() <= INT8_MAX
    step = projection.scale.float()[:, None]
    assert ((dequantized(projection) - weight.float()).abs() <= step / 2 * 1.0001).all()
    # each row's largest weight lands on ±127 or next to it (the scale was rounded to bf16)
    assert (projection.weight.abs().amax(dim=1) >= INT8_MAX - 1).all()


@pytest.mark.parametrize("rows", [1, 3, 40])  # a few rows (widened in blocks, in fp32) and dequantize-then-GEMM
@pytest.mark.parametrize("outputs", [96, machine.POLICY.widen_block_rows * 2 + 76])  # one block, and three
def test_int8_projection_computes_with_its_dequantized_weight(rows, outputs):
    projection = Projection(torch.randn(outputs, 64))
    projection.quantize_int8()
    x = torch.randn(2, rows, 64)
    want = x @ dequantized(projection).t()
    got = projection(x)
    assert got.shape == (2, rows, outputs)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_int8_embedding_rows_are_the_dequantized_rows():
    projection = Projection(torch.randn(50, 16))
    projection.quantize_int8()
    ids = torch.tensor([[3, 49, 0]])
    assert torch.equal(projection.rows(ids), dequantized(projection)[ids])


def test_int8_model_stays_close_to_the_full_precision_model(folder):
    full = load_model(folder, device="cpu", dtype=torch.float32, compile=False)
    int8 = load_model(folder, device="cpu", dtype=torch.float32, compile=False, quantize="int8")
    full_bytes = sum(b.nbytes for b in full.buffers())
    int8_bytes = sum(b.nbytes for b in int8.buffers())
    assert int8_bytes < 0.35 * full_bytes  # fp32 → int8: about a quarter, plus norms and scales
    ids = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(0))
    want = full(ids, full.new_state(2))
    got = int8(ids, int8.new_state(2))
    assert (got - want).abs().max() <= 0.10 * want.abs().max()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize("mode, tolerance", [("int8", 1e-4), ("int4", 2e-2)])  # int4: the kernel's bf16 input
def test_compiled_decode_equals_eager_decode(folder, mode, tolerance):
    eager = load_model(folder, device="cpu", dtype=torch.float32, compile=False, quantize=mode)
    compiled = load_model(folder, device="cpu", dtype=torch.float32, compile=True, quantize=mode)
    assert compiled.compiled is not None
    compiled.compiled.prefill_from = 1  # the short prompt below through the prefill graphs too
    logits = {}
    for name, model in (("eager", eager), ("compiled", compiled)):
        state = model.new_state(1)
        model.prefill(torch.arange(30)[None] % VOCAB, state)
        logits[name] = torch.stack([model.decode(torch.tensor([t]), state) for t in (7, 1, 8)])
    scale = logits["eager"].abs().max()
    assert (logits["compiled"] - logits["eager"]).abs().max() <= tolerance * scale


def test_the_prefill_warm_up_builds_the_graph_a_full_block_runs(folder):
    """int4 switches kernels at INT4_KERNEL_MAX_ROWS rows: the warm-up that builds the prefill
    graphs reads more than that, so the full block read after it compiles no second graph."""
    after_warm_up = []  # graphs compiled when the announced compile ends
    model = load_model(folder, device="cpu", dtype=torch.float32, compile=True, quantize="int4",
                       announce=lambda what: what or after_warm_up.append(counters["stats"]["unique_graphs"]))
    assert any(part.scale_and_zero is not None for part in model.modules() if isinstance(part, Projection))
    model.prefill(torch.arange(PREFILL_COMPILE_TOKENS)[None] % VOCAB, model.new_state(1))
    assert len(after_warm_up) == 1 and counters["stats"]["unique_graphs"] == after_warm_up[0]


def test_unknown_quantization_is_a_clear_error(folder):
    with pytest.raises(SummarizeError, match="unknown quantization 'int3'"):
        load_model(folder, device="cpu", quantize="int3")


# -- int4 --------------------------------------------------------------------------------------


def int4_dequantized(projection: Projection) -> torch.Tensor:
    return dequantize_int4(projection.weight, projection.scale_and_zero, projection.group, torch.float32)


def int4_projection(rows: int = 192, columns: int = 256) -> tuple[Projection, torch.Tensor]:
    weight = torch.randn(rows, columns) * torch.linspace(0.01, 3, rows)[:, None]
    projection = Projection(weight.clone())
    assert projection.quantize_int4()
    return projection, weight


def test_int4_codes_read_back_as_torch_packed_them_whatever_block_this_cpu_uses():
    codes = torch.randint(0, INT4_LEVELS + 1, (256, 128), dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    block_rows = machine.POLICY.int4_block_rows
    assert block_rows in (32, 64)  # AVX2, AVX-512
    assert torch.equal(int4_codes(packed, block_rows), codes.to(torch.uint8))
    ids = torch.tensor([0, 17, 31, 32, 63, 64, 200, 255])
    assert torch.equal(int4_codes(packed, block_rows, ids), codes[ids].to(torch.uint8))


@pytest.mark.parametrize("shape", [(64, 64), (256, 128), (1024, 3584)])
def test_our_int4_packing_lays_codes_out_as_torchs_does(shape):
    codes = torch.randint(0, INT4_LEVELS + 1, shape, dtype=torch.int32)
    want = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    assert torch.equal(pack_int4_codes(codes.float(), machine.POLICY.int4_block_rows), want)


def test_int4_weights_are_within_half_a_step_of_the_original():
    projection, weight = int4_projection()
    assert projection.weight.dtype == torch.uint8 and projection.weight.shape == (192, 128)  # two codes a byte
    assert projection.scale_and_zero.shape == (256 // INT4_GROUP, 192, 2)
    groups = weight.view(192, -1, INT4_GROUP)
    step = (groups.amax(-1) - groups.amin(-1)) / INT4_LEVELS
    error = (int4_dequantized(projection) - weight).view(192, -1, INT4_GROUP).abs().amax(-1)
    assert (error <= step / 2 * 1.01 + 1e-6).all()  # 1%: scale and zero are rounded to bf16


@pytest.mark.parametrize("rows", [1, 3, INT4_KERNEL_MAX_ROWS])  # torch's int4 kernel (few rows) and dequantize-then-GEMM
def test_int4_projection_computes_with_its_dequantized_weight(rows):
    projection, _ = int4_projection()
    x = torch.randn(2, rows, 256)
    want = x @ int4_dequantized(projection).t()
    got = projection(x)
    assert got.shape == (2, rows, 192) and got.dtype == x.dtype
    assert (got - want).abs().max() <= (1e-2 if 2 * rows <= INT4_KERNEL_MAX_ROWS else 1e-5) * want.abs().max()


def test_int4_embedding_rows_are_the_dequantized_rows():
    projection, _ = int4_projection()
    ids = torch.tensor([[0, 31, 32, 63], [64, 100, 191, 5]])  # both halves of a 64-row packed block
    assert torch.equal(projection.rows(ids), int4_dequantized(projection)[ids])


def test_int4_noise_on_gaussian_weights_is_about_nine_percent():
    weight = torch.randn(1024, 1024)
    projection = Projection(weight.clone())
    projection.quantize_int4()
    x = torch.randn(64, 1024)
    want = x @ weight.t()
    noise = (projection(x) - want).norm() / want.norm()
    assert 0.05 < noise <= 0.11


def test_shapes_the_int4_kernel_cannot_take_become_int8():
    projection = Projection(torch.randn(50, 64))  # rows not a multiple of the int4 packing's block
    projection.quantize("int4")
    assert projection.weight.dtype == torch.int8 and projection.scale_and_zero is None


def test_int4_model_computes_with_its_dequantized_weights(folder):
    full = load_model(folder, device="cpu", dtype=torch.float32, compile=False)
    int4 = load_model(folder, device="cpu", dtype=torch.float32, compile=False, quantize="int4")
    assert sum(b.nbytes for b in int4.buffers()) < 0.2 * sum(b.nbytes for b in full.buffers())
    for mine, theirs in zip(int4.modules(), full.modules()):  # the full model, given int4's weights
        if isinstance(mine, Projection) and mine.scale_and_zero is not None:
            theirs.weight = int4_dequantized(mine)
        elif isinstance(mine, Projection):
            theirs.weight = dequantized(mine)
    ids = torch.randint(0, VOCAB, (2, INT4_KERNEL_MAX_ROWS), generator=torch.Generator().manual_seed(0))
    want = full(ids, full.new_state(2))
    assert (int4(ids, int4.new_state(2)) - want).abs().max() <= 1e-4 * want.abs().max()  # many rows: GEMM
    decoded = []
    for model in (full, int4):  # decode: int4's kernel reads x in bf16
        state = model.new_state(1)
        model.prefill(ids[:1], state)
        decoded.append(model.decode(torch.tensor([7]), state))
    assert (decoded[1] - decoded[0]).abs().max() <= 2e-2 * decoded[0].abs().max()


def test_int4_runs_on_the_cpu_only(folder):
    with pytest.raises(SummarizeError, match="int4 runs on the CPU"):
        load_model(folder, device="meta", quantize="int4")


RWKV_CHECKPOINTS = {"rwkv7": (blinkdl_checkpoint, RWKV_TINY), "rwkv6": (rwkv6_checkpoint, RWKV6_TINY)}


@pytest.mark.parametrize("family", RWKV_CHECKPOINTS)
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_rwkv_quantizes_through_the_same_projections(tmp_path, mode, family):
    write, sizes = RWKV_CHECKPOINTS[family]
    path = write(tmp_path / "tiny.pth", **sizes)
    full = load_model(path, device="cpu", dtype=torch.float32, compile=False)
    quantized = load_model(path, device="cpu", dtype=torch.float32, compile=False, quantize=mode)
    stored = set()
    for mine, theirs in zip(quantized.modules(), full.modules()):
        if isinstance(mine, Projection):
            stored.add(mine.weight.dtype)
            theirs.weight = int4_dequantized(mine) if mine.scale_and_zero is not None else dequantized(mine)
    # int4 where the kernel takes the shape (the 160-wide FFN's down projection does not: int8)
    assert full.family == quantized.family == family
    assert stored == ({torch.uint8, torch.int8} if mode == "int4" else {torch.int8})
    ids = torch.randint(0, RWKV_TINY["vocab"], (1, INT4_KERNEL_MAX_ROWS + 1), generator=torch.Generator().manual_seed(0))  # GEMM
    want = full(ids, full.new_state(1))
    assert (quantized(ids, quantized.new_state(1)) - want).abs().max() <= 1e-4 * want.abs().max()


# -- int8 activations ---------------------------------------------------------------------------
# x rounded to int8 with a scale per row, multiplied in int8: each product within 2e-2 of the
# largest output of x @ (the dequantized weight)ᵀ (`calibration.INT8_ACTIVATIONS_TOLERANCE`;
# measured about 1e-2 on these Gaussian inputs, twice bf16's rounding)


def int8_projection(dtype: torch.dtype = torch.bfloat16) -> Projection:
    projection = Projection(torch.randn(192, 256, generator=torch.Generator().manual_seed(5)).to(dtype))
    projection.quantize_int8()
    return projection


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [17, 64, 300])
def test_int8_activations_compute_the_product_to_their_tolerance(rows, dtype):
    projection = int8_projection(dtype)
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)).to(dtype)
    want = x.float() @ dequantized(projection).t()
    got = int8_activations(x, projection.weight, projection.scale)
    assert got.dtype == dtype and (got.float() - want).abs().max() <= 2e-2 * want.abs().max()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("on", [0, 1])
def test_many_rows_by_int8_weights_take_int8_activations_where_the_policy_says(on, dtype, monkeypatch):
    monkeypatch.setattr(machine, "POLICY", replace(machine.POLICY, int8_activations=on))
    projection = int8_projection(dtype)
    few, many = machine.POLICY.int8_packed_max_rows, machine.POLICY.int8_packed_max_rows + 1
    for rows in (few, many):
        x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)).to(dtype)
        reads_int8 = torch.equal(projection(x), int8_activations(x, projection.weight, projection.scale))
        assert reads_int8 == bool(on and rows == many), rows


def test_auto_reads_as_int8_does_and_writes_from_its_int4_copy(monkeypatch, tmp_path):
    """Where both pay (the policy installed by hand), quantize="auto" stores the weights as int8,
    which prefill reads with int8 activations exactly as an int8 model does, and decodes from int4
    copies made from the weights before that."""
    monkeypatch.setattr(machine, "POLICY", replace(machine.POLICY, int8_activations=1, int4_copy_generates=1))
    folder = save_checkpoint(dense_reference(tie_word_embeddings=False), tmp_path)
    auto = load_model(folder, device="cpu", dtype=torch.bfloat16, compile=False, quantize="auto")
    int8 = load_model(folder, device="cpu", dtype=torch.bfloat16, compile=False, quantize="int8")
    assert auto.reads_int8 and auto.int4_copy_bytes
    assert all(p.scale is not None for p in auto.modules() if isinstance(p, Projection))
    ids = torch.arange(40)[None] % VOCAB
    auto_state, int8_state = auto.new_state(1), int8.new_state(1)
    assert torch.equal(auto.prefill(ids, auto_state), int8.prefill(ids, int8_state))
    assert not torch.equal(auto.decode(torch.tensor([7]), auto_state), int8.decode(torch.tensor([7]), int8_state))
