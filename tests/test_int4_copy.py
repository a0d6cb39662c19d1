"""An int4 copy to generate tokens with: a full-precision model reads its prompts with its own
weights and writes with an int4 copy of them (`quantize="auto"`, where the calibration found
torch's int4 kernel faster for one row; the policy is installed by hand here).

Tolerances:
- outside `generating_tokens` a projection with a copy computes exactly what it did without one;
  inside, x @ (the copy's dequantized weight)ᵀ to 1e-2 of the largest output (the kernel reads x
  in bf16: tests/test_quantize.py);
- the model: prefill logits equal the full model's bit for bit (the same code reads the same
  weights); decode logits are the full model's given the copy's dequantized weights, to 2e-2 of
  the largest logit (the kernel's bf16 input, amplified by the tiny random model: as int4's own
  decode in tests/test_quantize.py);
- greedy output with and without speculation: the same tokens, exactly (tests/test_speculative.py
  runs its own test on a model with copies).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from summarize.engine import load_model, loading
from summarize.engine.ops import machine
from summarize.engine.ops.linear import INT4_GROUP, Projection, dequantize_int4, generating_tokens, int4_kernel, int8_activations
from tiny_models import RWKV_TINY, blinkdl_checkpoint, dense_reference, save_checkpoint

VOCAB = 384


def copy_dequantized(projection: Projection) -> torch.Tensor:
    return dequantize_int4(projection.int4_copy, projection.int4_copy_scale_and_zero, projection.int4_copy_group, torch.float32)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A head of its own: the embedding is read by row only, so it keeps no copy."""
    return save_checkpoint(dense_reference(tie_word_embeddings=False), tmp_path_factory.mktemp("dense"))


@pytest.fixture
def copies_pay(monkeypatch):
    """The policy of a machine whose calibration found one row of int4 faster than the full weight."""
    monkeypatch.setattr(machine, "POLICY", replace(machine.POLICY, int4_copy_generates=1))


def test_a_projection_reads_its_int4_copy_only_while_generating_tokens():
    gen = torch.Generator().manual_seed(0)
    projection = Projection(torch.randn(128, 256, generator=gen))
    x = torch.randn(3, 256, generator=gen)
    before = projection(x)
    assert projection.add_int4_copy()
    assert torch.equal(projection(x), before)
    with generating_tokens(1):
        got = projection(x)
    want = F.linear(x, copy_dequantized(projection))
    assert (got - want).abs().max() <= 1e-2 * want.abs().max()
    assert (got - before).abs().max() > 1e-2 * before.abs().max()  # the copy is int4: it reads otherwise
    assert torch.equal(projection(x), before)  # the switch ends with the steps


def test_a_batch_past_the_copys_reads_the_weight_as_stored(monkeypatch):
    """The policy's `int4_copy_max_batch` sequences generate from the copy; a larger batch reads the
    weight as a prompt's rows do: full precision exactly as outside, auto's int8 with x rounded to
    int8 too. Decided by the batch, whatever the rows of the product (a verify span's tokens)."""
    monkeypatch.setattr(machine, "POLICY", replace(machine.POLICY, int4_copy_generates=1, int8_activations=1, int4_copy_max_batch=2))
    gen = torch.Generator().manual_seed(0)
    projection = Projection(torch.randn(128, 256, generator=gen).bfloat16())
    assert projection.add_int4_copy()
    span = torch.randn(3, 4, 256, generator=gen).bfloat16()  # 3 sequences, 4 tokens each
    outside = projection(span)
    with generating_tokens(2):
        two = projection(span[:2])
    assert torch.equal(two, int4_kernel(span[:2].reshape(8, 256), projection.int4_copy, projection.int4_copy_scale_and_zero,
                                        projection.int4_copy_group).view(2, 4, 128))
    with generating_tokens(3):
        assert torch.equal(projection(span), outside)
    projection.quantize_int8()  # as quantize="auto" stores it where int8 reads win
    with generating_tokens(3):
        three = projection(span)
        one_token = projection(span[:, :1])
    assert torch.equal(three, int8_activations(span.reshape(12, 256), projection.weight, projection.scale).view(3, 4, 128))
    assert torch.equal(one_token, three[:, :1])  # a decode step computes each token as the span does


def test_only_full_precision_weights_the_int4_kernel_takes_get_a_copy():
    quantized = Projection(torch.randn(128, 256))
    quantized.quantize_int8()
    assert not quantized.add_int4_copy() and quantized.int4_copy is None
    assert not Projection(torch.randn(50, 256)).add_int4_copy()  # rows not a multiple of the packing's block
    assert not Projection(torch.randn(128, INT4_GROUP + 8)).add_int4_copy()  # input channels not in whole groups


def test_a_model_reads_prompts_with_its_weights_and_generates_from_its_copy(folder, copies_pay):
    full = load_model(folder, device="cpu", dtype=torch.float32, compile=False)
    auto = load_model(folder, device="cpu", dtype=torch.float32, compile=False, quantize="auto")
    copied = [p for p in auto.modules() if isinstance(p, Projection) and p.int4_copy is not None]
    assert auto.embed_tokens.int4_copy is None and auto.lm_head in copied
    assert auto.int4_copy_bytes == sum(p.int4_copy.nbytes + p.int4_copy_scale_and_zero.nbytes for p in copied)
    ids = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(1))
    auto_state, full_state, plain_state = auto.new_state(1), full.new_state(1), full.new_state(1)
    assert torch.equal(auto.prefill(ids, auto_state), full.prefill(ids, full_state))
    full.prefill(ids, plain_state)
    plain = full.decode(torch.tensor([7]), plain_state)
    for mine, theirs in zip(auto.modules(), full.modules()):  # the full model, given the copies' weights
        if isinstance(mine, Projection) and mine.int4_copy is not None:
            theirs.weight = copy_dequantized(mine)
    want = full.decode(torch.tensor([7]), full_state)
    got = auto.decode(torch.tensor([7]), auto_state)
    assert (got - want).abs().max() <= 2e-2 * want.abs().max()
    assert (got - plain).abs().max() > 2e-2 * plain.abs().max()


def test_compiled_steps_read_the_copy_where_eager_ones_do(folder, copies_pay):
    """The switch holds inside compiled graphs: the prefill graph reads the full weights, the decode
    graph the copies (to the tolerance of int4's compiled and eager decode, tests/test_quantize.py)."""
    eager = load_model(folder, device="cpu", dtype=torch.float32, compile=False, quantize="auto")
    compiled = load_model(folder, device="cpu", dtype=torch.float32, compile=True, quantize="auto")
    compiled.compiled.prefill_from = 1  # the short prompt below through the prefill graphs too
    prefilled, decoded = {}, {}
    for name, model in (("eager", eager), ("compiled", compiled)):
        state = model.new_state(1)
        prefilled[name] = model.prefill(torch.arange(30)[None] % VOCAB, state)
        decoded[name] = torch.stack([model.decode(torch.tensor([t]), state) for t in (7, 1, 8)])
    assert compiled.compiled.prefill_ready
    assert (prefilled["compiled"] - prefilled["eager"]).abs().max() <= 1e-4 * prefilled["eager"].abs().max()
    assert (decoded["compiled"] - decoded["eager"]).abs().max() <= 2e-2 * decoded["eager"].abs().max()


def test_an_rwkv_file_takes_the_same_forms(tmp_path, monkeypatch):
    """A BlinkDL `.pth` loads through the same calibration and forms as a folder: its head gets a
    copy and is stored as int8, its embedding (read by row) is stored as int8 only."""
    monkeypatch.setattr(machine, "POLICY", replace(machine.POLICY, int4_copy_generates=1, int8_activations=1))
    model = load_model(blinkdl_checkpoint(tmp_path / "tiny.pth", **RWKV_TINY), device="cpu", dtype=torch.float32,
                       compile=False, quantize="auto")
    assert model.head.int4_copy is not None and model.embedding.int4_copy is None
    assert model.head.weight.dtype == model.embedding.weight.dtype == torch.int8 and model.reads_int8
    assert model.int4_copy_bytes > 0


def test_auto_keeps_the_weights_alone_where_the_copy_does_not_pay(folder):
    """The portable policy (nothing timed: the tests' own) keeps no copy."""
    model = load_model(folder, device="cpu", dtype=torch.float32, compile=False, quantize="auto")
    assert model.int4_copy_bytes == 0
    assert all(p.int4_copy is None for p in model.modules() if isinstance(p, Projection))


def test_no_copy_where_it_would_take_half_the_available_memory(folder, copies_pay, monkeypatch):
    monkeypatch.setattr(loading, "available_bytes", lambda: 1000)
    model = load_model(folder, device="cpu", dtype=torch.float32, compile=False, quantize="auto")
    assert model.int4_copy_bytes == 0 and all(p.int4_copy is None for p in model.modules() if isinstance(p, Projection))
    assert any(note.startswith("no int4 copy to generate with") for note in model.load_notes)


def test_a_copy_that_storing_int8_makes_room_for_is_made(folder, monkeypatch):
    """Where the weights are stored as int8 too, what that frees counts against the copy's bytes."""
    monkeypatch.setattr(machine, "POLICY", replace(machine.POLICY, int4_copy_generates=1))
    needed = load_model(folder, device="cpu", dtype=torch.float32, compile=False, quantize="auto").int4_copy_bytes
    monkeypatch.setattr(loading, "available_bytes", lambda: needed)  # alone, the copy would take all of it
    assert load_model(folder, device="cpu", dtype=torch.float32, compile=False, quantize="auto").int4_copy_bytes == 0
    monkeypatch.setattr(machine, "POLICY", replace(machine.POLICY, int8_activations=1))
    model = load_model(folder, device="cpu", dtype=torch.float32, compile=False, quantize="auto")
    assert model.int4_copy_bytes == needed and model.reads_int8
