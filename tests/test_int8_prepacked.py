"""int8 weights held prepacked for oneDNN's int8 kernel (`Projection.prepack_int8`, where the
calibration found it faster than `_int_mm` on plain weights; the policy is installed by hand here).

A prepacked weight is read with x rounded to int8, a scale per row, as `int8_activations` reads a
plain one: the same integer sums, scaled in fp32 in another order.

Tolerances:
- the product against `int8_activations` on the same weight: 1e-6 of the largest output in fp32
  (the scaling's order), one bf16 rounding (2⁻⁸ of the largest) in bf16;
- compiled against eager: the same tolerances;
- a model against the same model with plain int8 weights: 2e-2 of the largest logit (x rounded to
  int8 in the few-row products a plain weight reads with x in bf16: int8 activations' tolerance,
  tests/test_quantize.py).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from summarize.engine import load_model
from summarize.engine.ops import machine
from summarize.engine.ops.linear import Projection, can_prepack_int8, int8_activations, int8_prepacked
from tiny_models import dense_reference, save_checkpoint

pytestmark = pytest.mark.skipif(not can_prepack_int8(), reason="this torch has no oneDNN int8 kernel for prepacked weights")

VOCAB = 384
TOLERANCE = {torch.float32: 1e-6, torch.bfloat16: 2**-8}


def int8_projection(dtype: torch.dtype) -> Projection:
    projection = Projection(torch.randn(192, 256, generator=torch.Generator().manual_seed(5)).to(dtype))
    projection.quantize_int8()
    return projection


def close(got: torch.Tensor, want: torch.Tensor, tolerance: float) -> bool:
    return bool((got.float() - want.float()).abs().max() <= tolerance * want.float().abs().max())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 6, 300])
def test_a_prepacked_weight_gives_the_sums_int8_activations_give(rows, dtype):
    plain = int8_projection(dtype)
    packed = int8_projection(dtype)
    assert packed.prepack_int8(keep_rows=False) and packed.weight is None
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)).to(dtype)
    got = packed(x)
    assert got.dtype == dtype and got.shape == (rows, 192)
    assert close(got, int8_activations(x, plain.weight, plain.scale), TOLERANCE[dtype])


def test_a_prepacked_projection_reads_every_row_count_with_x_rounded():
    """Whatever the rows (a plain int8 weight reads a few with x in bf16), and in any leading shape."""
    projection = int8_projection(torch.bfloat16)
    projection.prepack_int8(keep_rows=False)
    for shape in ((1, 1, 256), (2, 3, 256), (40, 256)):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape)), dtype=torch.bfloat16)
        want = int8_prepacked(x.reshape(-1, 256), projection.int8_prepacked, projection.int8_prepacked_scale)
        assert torch.equal(projection(x), want.reshape(*shape[:-1], 192))


def test_a_table_read_by_row_keeps_its_plain_rows():
    plain = int8_projection(torch.bfloat16)
    packed = int8_projection(torch.bfloat16)
    packed.prepack_int8(keep_rows=True)
    ids = torch.tensor([[3, 0, 191]])
    assert packed.int8_prepacked is not None and torch.equal(packed.rows(ids), plain.rows(ids))
    assert packed.shape == plain.shape == (192, 256)


def test_only_int8_weights_with_a_scale_per_row_are_prepacked():
    full = Projection(torch.randn(64, 128))
    assert not full.prepack_int8(keep_rows=False) and full.int8_prepacked is None
    int4 = Projection(torch.randn(64, 128))
    int4.quantize_int4()
    assert not int4.prepack_int8(keep_rows=False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_compiled_prepacked_products_equal_eager_ones(dtype):
    """Inside a compiled step the kernel is an op of ours (inductor lowers oneDNN's own only for
    weights frozen into the graph); the rows are symbolic, as in a prefill graph."""
    projection = int8_projection(dtype)
    projection.prepack_int8(keep_rows=False)
    compiled = torch.compile(lambda x: projection(x * 2), dynamic=True)
    for rows in (3, 70):
        x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)).to(dtype)
        assert close(compiled(x), projection(x * 2), TOLERANCE[dtype])


@pytest.fixture
def prepacks(monkeypatch):
    """The policy of a machine whose calibration found int8 reads, the int4 copy and prepacked
    int8 weights faster."""
    monkeypatch.setattr(machine, "POLICY", replace(machine.POLICY, int8_activations=1, int8_prepacked=1,
                                                   int4_copy_generates=1, int4_copy_max_batch=1))


def test_auto_prepacks_its_int8_weights_and_a_tied_head_keeps_its_rows(tmp_path, prepacks, monkeypatch):
    folder = save_checkpoint(dense_reference(tie_word_embeddings=True), tmp_path)
    auto = load_model(folder, device="cpu", dtype=torch.bfloat16, compile=False, quantize="auto")
    projections = [p for p in auto.modules() if isinstance(p, Projection)]
    copied = [p for p in projections if p.int4_copy is not None]
    assert copied and all(p.int8_prepacked is not None for p in copied)
    # without a copy, one row goes through torch's int8 kernel, which reads the plain weight
    assert all(p.int8_prepacked is None and p.weight.dtype == torch.int8 for p in projections if p.int4_copy is None)
    assert auto.lm_head is auto.embed_tokens and auto.embed_tokens.weight is not None  # read by row
    assert all(p.weight is None for p in copied if p is not auto.embed_tokens)
    monkeypatch.setattr(machine, "POLICY", replace(machine.POLICY, int8_prepacked=0))
    plain = load_model(folder, device="cpu", dtype=torch.bfloat16, compile=False, quantize="auto")
    ids = torch.arange(40)[None] % VOCAB
    auto_state, plain_state = auto.new_state(2), plain.new_state(2)
    assert close(auto.prefill(ids.repeat(2, 1), auto_state), plain.prefill(ids.repeat(2, 1), plain_state), 2e-2)
    # a batch of two, past the copy's one: the int8 weights, prepacked or plain, x rounded either way
    assert close(auto.decode(torch.tensor([7, 9]), auto_state), plain.decode(torch.tensor([7, 9]), plain_state), 2e-2)


def test_a_compiled_model_reads_its_prepacked_weights_as_the_eager_one_does(tmp_path, prepacks):
    folder = save_checkpoint(dense_reference(tie_word_embeddings=True), tmp_path)
    eager = load_model(folder, device="cpu", dtype=torch.float32, compile=False, quantize="auto")
    compiled = load_model(folder, device="cpu", dtype=torch.float32, compile=True, quantize="auto")
    compiled.compiled.prefill_from = 1  # the short prompt below through the prefill graphs too
    got = {}
    for name, model in (("eager", eager), ("compiled", compiled)):
        state = model.new_state(2)
        prefilled = model.prefill(torch.arange(30)[None].repeat(2, 1) % VOCAB, state)
        got[name] = torch.cat([prefilled, model.decode(torch.tensor([7, 1]), state)])
    assert compiled.compiled.prefill_ready
    assert close(got["compiled"], got["eager"], 1e-4)
