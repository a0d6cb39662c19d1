"""Weight-only int8: what it stores, what it computes, and how far it moves the logits.

Tolerances: an int8 projection equals x @ (its dequantized weight)ᵀ to fp32 rounding (1e-5
relative); compiled and eager int8 decode agree to 1e-4 of the largest logit; the int8 model's
logits stay within 10% of the largest fp32 logit (measured: 5%; random weights give flat
logits, the worst case for a relative error), and pick the same argmax on ≥ 90% of positions.
"""

from __future__ import annotations

import pytest
import torch

from summarize.engine import load_model
from summarize.engine.ops.linear import INT8_MAX, Projection
from summarize.errors import SummarizeError
from tiny_models import dense_reference, save_checkpoint

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


@pytest.mark.parametrize("rows", [1, 3, 40])  # the packed GEMV (few rows) and dequantize-then-GEMM
def test_int8_projection_computes_with_its_dequantized_weight(rows):
    projection = Projection(torch.randn(96, 64))
    projection.quantize_int8()
    x = torch.randn(2, rows, 64)
    want = x @ dequantized(projection).t()
    got = projection(x)
    assert got.shape == (2, rows, 96)
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


def test_compiled_int8_decode_equals_eager_int8_decode(folder):
    eager = load_model(folder, device="cpu", dtype=torch.float32, compile=False, quantize="int8")
    compiled = load_model(folder, device="cpu", dtype=torch.float32, compile=True, quantize="int8")
    assert compiled.compiled is not None
    logits = {}
    for name, model in (("eager", eager), ("compiled", compiled)):
        state = model.new_state(1)
        model.prefill(torch.arange(30)[None] % VOCAB, state)
        logits[name] = torch.stack([model.decode(torch.tensor([t]), state) for t in (7, 1, 8)])
    scale = logits["eager"].abs().max()
    assert (logits["compiled"] - logits["eager"]).abs().max() <= 1e-4 * scale


def test_unknown_quantization_is_a_clear_error(folder):
    with pytest.raises(SummarizeError, match="unknown quantization 'int4'"):
        load_model(folder, device="cpu", quantize="int4")
