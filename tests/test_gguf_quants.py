"""GGML's block formats decoded in torch equal gguf-py's reference decoders, block for block (the
compact forms of Q4_0, Q4_1, Q4_K, Q8_0 and Q6_K against these decoders: tests/test_gguf_compact.py).

Blocks are random bytes (scales included, so a few are NaN or infinite: both sides must agree on
those too); a second set has finite scales, so that the comparison is not carried by NaNs.
"""

from __future__ import annotations

import pytest
import torch

from summarize.engine.weights.gguf_quants import GGML_TYPES, GGUF_PY_KINDS, dequantize
from summarize.errors import SummarizeError

np = pytest.importorskip("numpy")
gguf = pytest.importorskip("gguf")

BLOCKS = 257
OURS = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4"]
# where each kind keeps its fp16 scales (byte offsets in a block)
FP16_AT = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_K": (80, 82), "Q3_K": (108,),
           "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_NL": (0,), "IQ4_XS": (0,)}


def kind(name: str):
    return next(t for t in GGML_TYPES.values() if t.name == name)


def random_blocks(name: str, seed: int, finite: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(BLOCKS, kind(name).nbytes), dtype=np.uint8)
    if finite:
        for at in FP16_AT.get(name, ()):
            blocks[:, at : at + 2] = rng.uniform(-2, 2, size=(BLOCKS, 1)).astype(np.float16).view(np.uint8)
        if name == "MXFP4":
            blocks[:, 0] = rng.integers(100, 140, size=BLOCKS)
    return blocks


def reference(name: str, blocks: np.ndarray) -> torch.Tensor:
    values = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[name]).reshape(BLOCKS, -1)
    return torch.tensor(np.ascontiguousarray(values, dtype=np.float32))


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == torch.float32
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0))  # bit for bit, infinities included


def test_the_type_table_is_ggmls():
    for t in GGML_TYPES.values():
        assert gguf.GGMLQuantizationType[t.name].value == t.type_id, t.name
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t.name]] == (t.elements, t.nbytes), t.name


@pytest.mark.parametrize("finite", [False, True], ids=["any-bytes", "finite-scales"])
@pytest.mark.parametrize("name", OURS)
def test_torch_decoders_equal_gguf_py_block_for_block(name, finite):
    blocks = random_blocks(name, seed=len(name) + finite, finite=finite)
    with np.errstate(invalid="ignore", over="ignore"):
        want = reference(name, blocks)
    assert_same(dequantize(kind(name), torch.tensor(blocks)), want)


@pytest.mark.parametrize("name", sorted(GGUF_PY_KINDS))
def test_the_other_kinds_go_through_gguf_py(name):
    blocks = random_blocks(name, seed=3, finite=False)
    with np.errstate(invalid="ignore", over="ignore"):
        want = reference(name, blocks)
    assert_same(dequantize(kind(name), torch.tensor(blocks)), want)


def test_a_kind_that_holds_no_weights_is_refused():
    with pytest.raises(SummarizeError, match="Q8_K"):
        dequantize(kind("Q8_K"), torch.zeros(1, kind("Q8_K").nbytes, dtype=torch.uint8))
