"""A GGUF file's quantized projections stay in the file's own codes and group scales
(docs/models.md, "GGUF files"): Q4_0, Q4_1 and Q4_K on torch's int4 kernel in groups of 32; Q8_0
and Q6_K as int8 with a scale per group of 32 or 16 input channels; every other kind widened, and
named in the load note.

Tolerances:
- a tensor read compact is the file's values, compared with our dequantization of its blocks
  (`gguf_quants`): int8 groups bit for bit, also as the projection keeps them; int4 as read bit for
  bit, and as the int4 kernel keeps it (scale and zero = 8 · scale + offset rounded to bf16) within
  31/15 · 2⁻⁸ of each group's largest value: bf16 moves the zero (the value of code 8, inside the
  group's range) by 2⁻⁸ of it and the scale, times |code − 8| ≤ 8, by 2⁻⁸ of 16/15 of that value.
  On llama-quantize's files of the model below the largest error is 0.31% (Q4_0), 0.37% (Q4_1) and
  0.33% (Q4_K) of a tensor's largest value.
- a Q8_0 file's model against the same file read exactly into fp32: prefill and decode to 1e-5 of
  the largest logit eagerly (the same weights, the GEMM asked in blocks of rows), 1e-4 compiled (the
  streamed loop sums in another order); measured 7e-7 both.
- a Q4_K_M or Q4_0 file's model: with many rows (dequantized, then the GEMM) to 1e-5 of the same
  model given the int4 projections' kept weights; prefill and decode, eager and compiled, to 3e-2
  of the file read exactly into fp32 (measured 1.8% and 1.9%: about 1% from the bf16 scale and
  zero, amplified by the tiny random model as test_quantize.py says, the rest from the kernel's
  reading x in bf16).
"""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest
import torch

import llama_cpp
from summarize.engine import load_model
from summarize.engine.ops import machine
from summarize.engine.ops.linear import Int4Groups, Int8Groups, Projection, StackedProjections, dequantize_int4, widen_int8
from summarize.engine.weights.gguf_checkpoint import take_columns, take_rows
from summarize.engine.weights.gguf_file import DENSE, Form, GGUFFile
from summarize.engine.weights.gguf_quants import GGML_TYPES
from tiny_models import dense_reference, save_checkpoint

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 248320  # the converter writes the real tokenizer, so the models have its vocabulary
INT4_BOUND = 31 / 15 * 2**-8  # of a group's largest value: the bf16 rounding of its scale and zero
INT4_KINDS, INT8_KINDS = ("Q4_0", "Q4_1", "Q4_K"), ("Q8_0", "Q6_K")
FP16_AT = {"Q4_0": (0,), "Q4_1": (0, 2), "Q4_K": (0, 2), "Q8_0": (0,), "Q6_K": (208,)}  # each kind's fp16 scales
ROWS, COLUMNS = 128, 512  # a matrix torch's int4 kernel takes (rows: any packing block up to 64)


# -- tensors: a file of random blocks ------------------------------------------------------------


def kind(name: str):
    return next(t for t in GGML_TYPES.values() if t.name == name)


def random_blocks(name: str, rows: int, columns: int, seed: int) -> np.ndarray:
    """[rows, bytes of a row]: random bytes, each fp16 scale finite."""
    k, rng = kind(name), np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * columns // k.elements, k.nbytes), dtype=np.uint8)
    for at in FP16_AT[name]:
        blocks[:, at : at + 2] = rng.uniform(-2, 2, size=(blocks.shape[0], 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


def write_gguf(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> Path:
    """A GGUF file of quantized matrices: name → (kind, blocks [rows, bytes of a row])."""
    writer = gguf.GGUFWriter(path, "test")
    for name, (kind_name, blocks) in tensors.items():
        writer.add_tensor(name, blocks, raw_dtype=gguf.GGMLQuantizationType[kind_name])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def kinds_file(tmp_path_factory) -> GGUFFile:
    """One ROWS × COLUMNS matrix of each kind kept compact, two of 8 rows and one Q5_0."""
    tensors = {name: (name, random_blocks(name, ROWS, COLUMNS, seed)) for seed, name in enumerate(INT4_KINDS + INT8_KINDS)}
    tensors |= {f"{name}-8": (name, random_blocks(name, 8, COLUMNS, 10 + seed)) for seed, name in enumerate(("Q4_0", "Q4_K"))}
    tensors["Q5_0"] = ("Q5_0", np.ascontiguousarray(random_blocks("Q8_0", ROWS, COLUMNS, 20)[:, : COLUMNS // 32 * 22]))
    return GGUFFile(write_gguf(tmp_path_factory.mktemp("kinds") / "kinds.gguf", tensors))


def exact(file: GGUFFile, name: str) -> torch.Tensor:
    """The file's values, through our dequantizer (tests/test_gguf_quants.py: gguf-py's, block for block)."""
    return file.read(name, dtype=torch.float32)


def kept(projection: Projection) -> torch.Tensor:
    """The weight a projection computes with, in fp32."""
    if projection.scale_and_zero is not None:
        return dequantize_int4(projection.weight, projection.scale_and_zero, projection.group, torch.float32)
    if projection.scale is not None:
        return widen_int8(projection.weight, projection.scale, torch.float32)
    return projection.weight.float()


def assert_within_the_int4_bound(got: torch.Tensor, want: torch.Tensor) -> None:
    groups = want.view(want.shape[0], -1, 32).abs().amax(-1, keepdim=True)
    error = (got - want).view(want.shape[0], -1, 32).abs()
    assert (error <= INT4_BOUND * groups * 1.001).all()  # 1.001: the fp32 sum 8 · scale + offset


@pytest.mark.parametrize("name", INT4_KINDS)
def test_a_4_bit_kind_is_read_as_its_codes_and_kept_on_the_int4_kernel(kinds_file, name):
    form = kinds_file.form_of([name])
    record = kinds_file.read(name, dtype=torch.float32, form=form)
    assert form.name == "int4" and isinstance(record, Int4Groups) and record.group == 32
    assert record.codes.dtype == torch.uint8 and int(record.codes.max()) <= 15
    want = exact(kinds_file, name)
    assert torch.equal(record.dequantized(torch.float32), want)
    projection = Projection(record)
    assert projection.scale_and_zero is not None and projection.weight.shape == (ROWS, COLUMNS // 2)
    assert_within_the_int4_bound(kept(projection), want)


@pytest.mark.parametrize("name", INT8_KINDS)
def test_an_8_or_6_bit_kind_is_kept_as_int8_with_its_group_scales_exactly(kinds_file, name):
    form = kinds_file.form_of([name])
    record = kinds_file.read(name, dtype=torch.bfloat16, form=form)
    assert form.name == "int8" and isinstance(record, Int8Groups) and record.group == {"Q8_0": 32, "Q6_K": 16}[name]
    assert record.dtype == torch.bfloat16  # what it computes in; the scales stay as the file's
    assert record.scale.dtype == {"Q8_0": torch.float16, "Q6_K": torch.float32}[name]
    projection = Projection(record)
    assert projection.weight.dtype == torch.int8 and projection.dtype == torch.bfloat16
    assert torch.equal(kept(projection), exact(kinds_file, name))


def test_a_projection_computes_with_the_files_values(kinds_file):
    """int8 groups: eagerly (widened in blocks of rows) and for many rows, x @ Wᵀ of the file's values."""
    projection = Projection(kinds_file.read("Q6_K", dtype=torch.float32, form=kinds_file.form_of(["Q6_K"])))
    x = torch.randn(3, 40, COLUMNS, generator=torch.Generator().manual_seed(0))
    want = x @ exact(kinds_file, "Q6_K").t()
    assert (projection(x) - want).abs().max() <= 1e-5 * want.abs().max()
    ids = torch.tensor([[0, 17], [127, 64]])
    assert torch.equal(projection.rows(ids), exact(kinds_file, "Q6_K")[ids])


@pytest.mark.parametrize("dynamic", [False, True])  # a decode step's graph, a verify span's
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_int8_groups_stream_the_files_values(kinds_file, dtype, dynamic):
    """A few rows inside a compiled step: the streamed loop widens each weight and applies its group's scale."""
    projection = Projection(kinds_file.read("Q8_0", dtype=dtype, form=kinds_file.form_of(["Q8_0"])))
    x = torch.randn(3, COLUMNS, generator=torch.Generator().manual_seed(1)).to(dtype)
    want = x.float() @ exact(kinds_file, "Q8_0").t()
    got = torch.compile(projection, fullgraph=True, dynamic=dynamic)(x)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2  # the result rounded to bf16
    assert got.dtype == dtype and (got.float() - want).abs().max() <= tolerance * want.abs().max()


# -- forms: stacks, reorders ---------------------------------------------------------------------


@pytest.mark.parametrize("parts, form, why", [
    (["Q4_0", "Q4_K"], "int4", None),
    (["Q8_0", "Q6_K"], "int8", None),
    (["Q4_0", "Q8_0"], "int8", None),  # Q4_0's codes − 8 are int8 values on its scale
    (["Q4_K", "Q8_0"], "dense", "stacked into one matrix with parts of another form"),
    (["Q4_1", "Q5_0"], "dense", "stacked into one matrix with parts of another form"),
    (["Q4_0-8"], "int8", None),  # 8 rows: no int4 packing block divides them
    (["Q4_K-8"], "dense", "torch's int4 kernel here takes no matrix of 8 rows"),
    (["Q4_K-8", "Q4_0"], "dense", "torch's int4 kernel here takes no matrix of 136 rows"),
    (["Q5_0"], "dense", None),
])
def test_a_stack_of_projections_shares_the_widest_form_a_part_needs(kinds_file, parts, form, why):
    assert kinds_file.form_of(parts) == Form(form, why)


def test_the_load_note_names_each_widened_kind_and_why(kinds_file):
    file = GGUFFile(kinds_file.path)
    for parts in (["Q4_K", "Q8_0"], ["Q4_K-8"], ["Q5_0"], ["Q6_K"]):
        for name in parts:
            file.read(name, dtype=torch.float32, form=file.form_of(parts))
    assert file.widening_note() == (  # Q6_K, kept compact, is not in it
        "kinds.gguf: Q4_K (1 tensor), Q8_0 (1 tensor) widened to float32: stacked into one matrix with parts of another "
        "form; Q4_K (1 tensor) widened to float32: torch's int4 kernel here takes no matrix of 8 rows; Q5_0 (1 tensor) "
        "widened to float32: no kernel here keeps them compact")


def groups_moved(order: list[int], group: int) -> torch.Tensor:
    """A reorder of COLUMNS input channels that moves runs of `group` channels in `order`."""
    return torch.arange(COLUMNS).view(-1, group)[torch.tensor(order)].reshape(-1)


def test_a_reorder_of_whole_groups_keeps_the_form_and_one_that_splits_them_widens(kinds_file):
    whole = groups_moved([15 - i for i in range(16)], 32)  # the 16 groups of 32 reversed
    split = groups_moved([i ^ 1 for i in range(32)], 16)  # runs of 16 swapped in pairs: whole for Q6_K only
    for name in INT4_KINDS + INT8_KINDS:
        record = kinds_file.read(name, dtype=torch.float32, form=kinds_file.form_of([name]))
        assert kinds_file.form_of([name], columns=whole) == kinds_file.form_of([name])
        assert torch.equal(take_columns(record, whole).dequantized(torch.float32), exact(kinds_file, name)[:, whole])
        rows = torch.randperm(ROWS, generator=torch.Generator().manual_seed(2))
        assert torch.equal(take_rows(record, rows).dequantized(torch.float32), exact(kinds_file, name)[rows])
        if name == "Q6_K":
            assert torch.equal(take_columns(record, split).dequantized(torch.float32), exact(kinds_file, name)[:, split])
        else:
            assert kinds_file.form_of([name], columns=split) == Form("dense", "a reorder of input channels splits their groups of 32")


def test_stacked_parts_of_one_form_make_one_projection_of_it(kinds_file):
    def read(name):
        return kinds_file.read(name, dtype=torch.float32, form=kinds_file.form_of([name]))

    int4 = Projection.concat([read("Q4_0"), read("Q4_K")])
    assert int4.scale_and_zero is not None and int4.group == 32
    assert torch.equal(kept(int4), torch.cat([kept(Projection(read("Q4_0"))), kept(Projection(read("Q4_K")))]))
    int8 = Projection.concat([read("Q8_0"), read("Q6_K")])  # groups of 32 and 16: held on 16, each scale repeated
    assert int8.weight.dtype == torch.int8 and int8.group == 16 and int8.scale.dtype == torch.float32
    assert torch.equal(kept(int8), torch.cat([exact(kinds_file, "Q8_0"), exact(kinds_file, "Q6_K")]))
    dense = torch.randn(64, COLUMNS)
    mixed = Projection.concat([read("Q4_K"), read("Q8_0"), dense])  # a mix shares no kernel: each part kept in its form
    assert isinstance(mixed, StackedProjections) and [kept(part).shape[0] for part in mixed.parts] == [ROWS, ROWS, 64]
    assert mixed.parts[0].scale_and_zero is not None and mixed.parts[1].scale.dim() == 2 and mixed.parts[2].scale is None
    x = torch.randn(5, COLUMNS)
    assert relative_error(mixed(x), x @ torch.cat([kept(part) for part in mixed.parts]).t()) <= 1e-2  # the int4 kernel reads x in bf16


# -- models: files llama.cpp wrote ---------------------------------------------------------------

PROMPT = torch.arange(30)[None] * 997 % VOCAB  # tokens from across the vocabulary


def converted(tmp_path_factory, name: str, outtype: str, **sizes) -> Path:
    """A tiny random Qwen3.5 checkpoint with `sizes`, converted by llama.cpp (cached by its bytes)."""
    reference = dense_reference(vocab_size=VOCAB, **sizes)
    folder = save_checkpoint(reference, tmp_path_factory.mktemp("compact") / name, tokenizer=True)
    return llama_cpp.convert(folder, outtype, "--no-mtp")


@pytest.fixture(scope="module")
def q8_0(tmp_path_factory) -> Path:
    """Value heads of 32 (test_gguf.py's "untied" model): the out_proj reorder moves whole groups."""
    return converted(tmp_path_factory, "untied", "q8_0", tie_word_embeddings=False, linear_value_head_dim=32)


@pytest.fixture(scope="module")
def k_quant_f32(tmp_path_factory) -> Path:
    """Every input width a multiple of 256 (K-quants' super-block) and every stack's rows of 64
    (the int4 packing's block), but b|a's 8: as many Q4_K tensors on the int4 kernel as can be."""
    return converted(tmp_path_factory, "k-quants", "f32", hidden_size=256, intermediate_size=512, head_dim=64,
                     linear_key_head_dim=32, linear_value_head_dim=64)


def load(path: Path, compile: bool = False):
    return load_model(path, device="cpu", dtype=torch.float32, compile=compile)


def read_exactly(path: Path):
    """The model with every tensor read into fp32, exactly as the file's values."""
    with mock.patch.object(GGUFFile, "form_of", lambda self, tensors, columns=None: DENSE):
        return load(path)


def prefill_and_decode(model) -> torch.Tensor:
    """The last prompt position's logits, then three decoded tokens' [4, V]."""
    if model.compiled is not None:
        model.compiled.prefill_from = 1  # the short prompt through the prefill graphs too
    state = model.new_state(1)
    first = model.prefill(PROMPT, state)
    return torch.cat([first] + [model.decode(torch.tensor([t]), state) for t in (7, 1, 8)])


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


def projections(model) -> list[Projection]:
    return [part for part in model.modules() if isinstance(part, Projection)]


def weight_bytes(model) -> int:
    return sum(b.nbytes for b in model.buffers())


def test_a_q8_0_model_is_its_files_values_in_int8(q8_0):
    model, exactly = load(q8_0), read_exactly(q8_0)
    assert model.load_notes == [] and all(p.weight.dtype == torch.int8 and p.scale.dim() == 2 for p in projections(model))
    assert weight_bytes(model) < 0.3 * weight_bytes(exactly)  # 8.5 bits a weight against 32
    want = prefill_and_decode(exactly)
    assert relative_error(prefill_and_decode(model), want) <= 1e-5
    tokens = PROMPT.repeat(2, 1)
    assert relative_error(model.forward(tokens, model.new_state(2)), exactly.forward(tokens, exactly.new_state(2))) <= 1e-5


def test_a_compiled_q8_0_model_is_its_files_values(q8_0):
    compiled = load(q8_0, compile=True)
    assert compiled.compiled is not None
    assert relative_error(prefill_and_decode(compiled), prefill_and_decode(read_exactly(q8_0))) <= 1e-4


def test_a_reorder_that_splits_groups_widens_that_tensor_and_says_so(tmp_path_factory):
    """Value heads of 24 (test_gguf.py's "dense" model): out_proj's columns move in runs of 24."""
    path = converted(tmp_path_factory, "dense", "q8_0")
    model = load(path)
    widened = [p for p in projections(model) if p.scale is None]
    assert widened == [layer.mixer.out_proj for layer in model.layers if hasattr(layer.mixer, "out_proj")]
    assert model.load_notes == [f"{path.name}: Q8_0 (3 tensors) widened to float32: a reorder of input channels "
                                "splits their groups of 32"]
    assert relative_error(prefill_and_decode(model), prefill_and_decode(read_exactly(path))) <= 1e-5


@pytest.fixture(scope="module", params=["Q4_K_M", "Q4_0"])
def four_bit(request, k_quant_f32) -> Path:
    """`llama-quantize`'s Q4_K_M (Q4_K, Q6_K where it keeps more bits) and Q4_0 (the embedding Q6_K)."""
    return llama_cpp.quantize(k_quant_f32, request.param)


# What llama-quantize 0.3.36's Q4_K_M file of the model above widens: b|a (8 rows) in the three
# linear-attention layers. Its mixed stacks (layer 2's qkv, Q6_K, with z, Q4_K; layer 3's q, k, Q4_K,
# with v, Q6_K) keep each part's form, stacked side by side.
Q4_K_M_NOTE = "Q4_K (6 tensors) widened to float32: torch's int4 kernel here takes no matrix of 8 rows"


def test_a_4_bit_model_keeps_the_files_codes_on_the_int4_kernel(four_bit):
    """Its 4-bit matrices are int4, its Q6_K ones int8 groups; many rows (dequantized, then the
    GEMM) compute exactly what the same model computes with the int4 projections' kept weights."""
    model, exactly = load(four_bit), read_exactly(four_bit)
    forms = {("int4" if p.scale_and_zero is not None else "int8" if p.scale is not None else "dense") for p in projections(model)}
    assert weight_bytes(model) < 0.35 * weight_bytes(exactly)
    if "Q4_0" in four_bit.name:  # b|a's 8 rows: Q4_0 as int8 groups, exactly
        assert forms == {"int4", "int8"} and model.load_notes == []
    else:
        assert forms == {"int4", "int8", "dense"} and model.load_notes == [f"{four_bit.name}: {Q4_K_M_NOTE}"]
    stacked = [m for m in model.modules() if isinstance(m, StackedProjections)]
    assert bool(stacked) == ("Q4_K_M" in four_bit.name)  # its Q6_K parts beside Q4_K ones
    for name, theirs in exactly.named_modules():
        if isinstance(theirs, Projection):  # the same matrix, as the compact model keeps it
            mine = model.get_submodule(name)
            theirs.weight = torch.cat([kept(p) for p in mine.parts]) if isinstance(mine, StackedProjections) else kept(mine)
    tokens = torch.arange(machine.POLICY.int4_kernel_max_rows + 1)[None] * 997 % VOCAB  # more rows than the int4 kernel takes
    want = exactly.forward(tokens, exactly.new_state(1))
    assert relative_error(model.forward(tokens, model.new_state(1)), want) <= 1e-5


@pytest.mark.parametrize("compile", [False, True])
def test_a_4_bit_model_against_its_files_values(four_bit, compile):
    """The int4 kernel rounds scale and zero, and reads x, in bf16 (see the tolerances above)."""
    model = load(four_bit, compile=compile)
    assert any(p.scale_and_zero is not None for p in projections(model))
    assert relative_error(prefill_and_decode(model), prefill_and_decode(read_exactly(four_bit))) <= 3e-2
