"""GGUF files written by llama.cpp's own converter load with `load_model` and compute what the
checkpoints they were made from compute.

Tiny random Qwen3.5 checkpoints (dense with more value heads than key heads, tied and untied heads,
MoE with per-expert and fused expert tensors) and an RWKV-7 one in the Hugging Face layout are
converted by `convert_hf_to_gguf.py` (tests/llama_cpp.py) at f32, bf16 and q8_0. Tolerances, relative
to the largest logit:
- F32 files against transformers on the original weights: 1e-4 (measured ~2e-6); RWKV-7 against
  the same weights loaded from BlinkDL's file (itself tested against the `rwkv` package): 1e-6
  (measured: equal).
- BF16 and Q8_0 files against transformers on the weights rounded as the file stores them (bf16;
  Q8_0's blocks through gguf-py's quantizer, its fp16 fallbacks to fp16), with every tensor read
  exactly: 1e-4. This checks the reading and the undoing without the rounding's own error.
- The same files as they load by default, against the original weights: BF16 within 5% (measured
  2.3%, dense). Q8_0 projections stay int8 with the file's scale per 32 values (docs/design.md §9,
  tests/test_gguf_compact.py): the Q8_0 values to 1e-4, and 10% of the original logits (measured
  7.4%, Q8_0's own rounding), at least 85% of argmaxes unchanged. RWKV-7 keeps no int8 weights: its
  BF16 and Q8_0 files (widened) within 4% and 8% of the original logits (measured 2.1% and 4.7%).
  Random tiny models have flat logits, the worst case for a relative error.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

import llama_cpp
from summarize.engine import ModelNotAvailable, load_model, load_tokenizer
from summarize.engine.ops.linear import Projection
from summarize.engine.tokenizers.rwkv import RwkvTokenizer
from summarize.engine.tokenizers.tokenizer import Tokenizer
from summarize.engine.weights.gguf_file import DENSE, GGUFFile, StringList
from summarize.errors import SummarizeError
from tiny_models import QWEN_TOKENIZER, RWKV_TINY, blinkdl_checkpoint, dense_reference, hf_layout, moe_reference, save_checkpoint

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 248320  # the converter writes the real tokenizer, so the models have its vocabulary


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -- the checkpoints and their GGUF files ------------------------------------------------------------


class Converted:
    """A tiny checkpoint, its transformers model and its GGUF files by outtype (converted on demand)."""

    def __init__(self, reference, folder: Path, *extra: str) -> None:
        self.reference, self.folder, self.extra, self.files = reference, folder, extra, {}

    def gguf(self, outtype: str) -> Path:
        if outtype not in self.files:
            self.files[outtype] = llama_cpp.convert(self.folder, outtype, *self.extra)
        return self.files[outtype]


def qwen(tmp_path_factory, name: str, make, *extra: str, **overrides) -> Converted:
    reference = make(vocab_size=VOCAB, **overrides)
    folder = save_checkpoint(reference, tmp_path_factory.mktemp("gguf") / name, tokenizer=True)
    return Converted(reference, folder, "--no-mtp", *extra)


@pytest.fixture(scope="module")
def dense(tmp_path_factory) -> Converted:
    """4 value heads on 2 key heads (value head dim 24 ≠ key 16), tied head."""
    return qwen(tmp_path_factory, "dense", dense_reference)


@pytest.fixture(scope="module")
def untied(tmp_path_factory) -> Converted:
    """An untied head; value heads of 32, so that Q8_0's blocks never straddle two heads (see rounded())."""
    return qwen(tmp_path_factory, "untied", dense_reference, tie_word_embeddings=False, linear_value_head_dim=32)


@pytest.fixture(scope="module")
def moe(tmp_path_factory) -> Converted:
    return qwen(tmp_path_factory, "moe", moe_reference, linear_value_head_dim=32)


@pytest.fixture(scope="module")
def moe_fused(tmp_path_factory) -> Converted:
    """The experts' gate and up written as one tensor, ffn_gate_up_exps."""
    return qwen(tmp_path_factory, "moe-fused", moe_reference, "--fuse-gate-up-exps", linear_value_head_dim=32)


@pytest.fixture(scope="module")
def with_mtp(tmp_path_factory) -> Converted:
    """The released checkpoints' MTP head (mtp.*: one full-attention layer, fc and norms), converted
    as llama.cpp does by default: layer blk.{n_layer} and `nextn_predict_layers` 1."""
    from safetensors.torch import save_file

    converted = qwen(tmp_path_factory, "mtp", dense_reference)
    converted.extra = ()  # with the MTP layer
    cfg, gen = converted.reference.config, torch.Generator().manual_seed(9)
    H, d, FF = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    shapes = {"fc.weight": (H, 2 * H), "pre_fc_norm_embedding.weight": (H,), "pre_fc_norm_hidden.weight": (H,),
              "norm.weight": (H,), "layers.0.input_layernorm.weight": (H,), "layers.0.post_attention_layernorm.weight": (H,),
              "layers.0.self_attn.q_proj.weight": (2 * cfg.num_attention_heads * d, H),
              "layers.0.self_attn.k_proj.weight": (cfg.num_key_value_heads * d, H),
              "layers.0.self_attn.v_proj.weight": (cfg.num_key_value_heads * d, H),
              "layers.0.self_attn.o_proj.weight": (H, cfg.num_attention_heads * d),
              "layers.0.self_attn.q_norm.weight": (d,), "layers.0.self_attn.k_norm.weight": (d,),
              "layers.0.mlp.gate_proj.weight": (FF, H), "layers.0.mlp.up_proj.weight": (FF, H),
              "layers.0.mlp.down_proj.weight": (H, FF)}
    save_file({f"mtp.{name}": torch.randn(shape, generator=gen) * 0.1 for name, shape in shapes.items()},
              str(converted.folder / "model-mtp.safetensors"))
    config = json.loads((converted.folder / "config.json").read_text())
    (converted.folder / "config.json").write_text(json.dumps(config | {"mtp_num_hidden_layers": 1}))
    return converted


@pytest.fixture(scope="module")
def rwkv(tmp_path_factory) -> tuple[Path, Converted]:
    """RWKV-7 in the Hugging Face (flash-linear-attention) layout with the config keys and World
    vocabulary the converter reads, and the same weights as BlinkDL's `.pth`. One head of 64: the
    group-norm eps of that layout (head size × norm_eps) is then BlinkDL's."""
    scratch = tmp_path_factory.mktemp("rwkv")
    sizes = RWKV_TINY | dict(vocab=65536, head_size=64, layers=3)
    pth = blinkdl_checkpoint(scratch / "tiny.pth", **sizes)
    folder = hf_layout(pth, scratch / "rwkv7")
    ranks = sizes["ranks"]
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["RWKV7ForCausalLM"], "model_type": "rwkv7", "vocab_size": sizes["vocab"],
        "hidden_size": sizes["hidden"], "head_dim": sizes["head_size"], "num_hidden_layers": sizes["layers"],
        "intermediate_size": sizes["ffn"], "norm_eps": 1e-5, "decay_low_rank_dim": ranks["w"],
        "a_low_rank_dim": ranks["a"], "v_low_rank_dim": ranks["v"], "gate_low_rank_dim": ranks["g"],
    }))
    shutil.copy(ROOT / "summarize" / "data" / "rwkv_vocab_v20230424.txt", folder)
    return pth, Converted(None, folder)


# -- helpers -----------------------------------------------------------------------------------------


def ids(batch: int, length: int, vocab: int = VOCAB, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got.float() - want.float()).abs().max().item() / want.abs().max().item()


def argmax_agreement(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got.argmax(-1) == want.argmax(-1)).float().mean().item()


def reference_logits(reference, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return reference(input_ids=tokens).logits


def our_logits(path: Path, tokens: torch.Tensor, **kwargs) -> torch.Tensor:
    model = load_model(path, device="cpu", dtype=torch.float32, compile=False, **kwargs)
    return model.forward(tokens, model.new_state(tokens.shape[0]))


def exactly_as_stored(path: Path, tokens: torch.Tensor) -> torch.Tensor:
    """Our logits with every quantized tensor read into fp32 (Q8_0 too, instead of as int8 groups)."""
    with mock.patch.object(GGUFFile, "form_of", lambda self, tensors, columns=None: DENSE):
        return our_logits(path, tokens)


def rounded(reference, path: Path):
    """A copy of `reference` with each weight rounded as the GGUF file stores it (its type read with
    gguf-py's name map, its rounding done by torch and gguf-py's Q8_0 quantizer). Q8_0's blocks run
    along each row; the converter only reorders rows, and columns in whole heads of 32, so rounding
    in the Hugging Face layout gives the file's values."""
    file = GGUFFile(path)
    arch = gguf.MODEL_ARCH.QWEN35MOE if file.architecture == "qwen35moe" else gguf.MODEL_ARCH.QWEN35
    names = gguf.get_tensor_name_map(arch, reference.config.num_hidden_layers)
    model = copy.deepcopy(reference)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if weight.dim() < 2:
                continue  # vectors are written in F32
            stored = names.get_name(name, try_suffixes=(".weight", ".bias"))
            stored = stored if stored.endswith(".weight") else stored + ".weight"
            if stored not in file.tensors:  # gate_up_proj, written as ffn_gate_exps and ffn_up_exps
                stored = stored.replace("gate_up_exps", "gate_exps")
            kind = file.tensors[stored].kind.name
            if kind == "F16":
                weight.copy_(weight.half().float())
            elif kind == "BF16":
                weight.copy_(weight.bfloat16().float())
            elif kind == "Q8_0":
                rows = weight.detach().numpy().reshape(-1, weight.shape[-1])
                q8 = gguf.quants.quantize(rows, gguf.GGMLQuantizationType.Q8_0)
                weight.copy_(torch.tensor(gguf.quants.dequantize(q8, gguf.GGMLQuantizationType.Q8_0)).view(weight.shape))
            else:
                assert kind == "F32", (stored, kind)
    return model


# -- logits: F32 files -------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["dense", "untied", "moe", "moe_fused"])
def test_f32_files_give_the_original_logits(request, which):
    converted = request.getfixturevalue(which)
    tokens = ids(2, 70, seed=1)  # above one 64-token chunk of the delta rule
    got = our_logits(converted.gguf("f32"), tokens)
    assert relative_error(got, reference_logits(converted.reference, tokens)) <= 1e-4


def test_the_mtp_layer_is_never_read(with_mtp):
    path = with_mtp.gguf("f32")
    file = GGUFFile(path)
    assert file.get("qwen35.nextn_predict_layers", int) == 1 and "blk.4.nextn.eh_proj.weight" in file.tensors
    tokens = ids(1, 40, seed=8)
    model = load_model(path, device="cpu", dtype=torch.float32, compile=False)
    assert len(model.layers) == 4
    assert relative_error(model.forward(tokens, model.new_state(1)), reference_logits(with_mtp.reference, tokens)) <= 1e-4


def test_the_fused_expert_file_has_the_fused_tensor(moe_fused):
    assert "blk.0.ffn_gate_up_exps.weight" in GGUFFile(moe_fused.gguf("f32")).tensors


def test_the_file_says_what_config_json_says(dense):
    model = load_model(dense.gguf("f32"), device="cpu", dtype=torch.float32, compile=False)
    text = dense.reference.config
    cfg = model.cfg
    assert cfg.layer_types == tuple(text.layer_types) and cfg.tie_word_embeddings
    assert (cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim) == (2, 4, 16, 24)
    assert cfg.partial_rotary_factor == 0.25 and cfg.rope_theta == 10_000_000 and cfg.vocab_size == VOCAB
    assert model.lm_head is model.embed_tokens


# -- logits: BF16 and Q8_0 files ----------------------------------------------------------------------


@pytest.mark.parametrize("which, outtype", [("dense", "bf16"), ("moe", "bf16"), ("untied", "q8_0"), ("moe", "q8_0")])
def test_rounded_files_give_the_logits_of_their_rounded_weights(request, which, outtype):
    converted = request.getfixturevalue(which)
    path = converted.gguf(outtype)
    tokens = ids(2, 40, seed=2)
    want = reference_logits(rounded(converted.reference, path), tokens)
    assert relative_error(exactly_as_stored(path, tokens), want) <= 1e-4


def test_bf16_file_against_the_original_weights(dense):
    tokens = ids(2, 40, seed=3)
    assert relative_error(our_logits(dense.gguf("bf16"), tokens), reference_logits(dense.reference, tokens)) <= 0.05


def test_q8_0_projections_load_as_int8_with_the_files_scales(untied):
    path = untied.gguf("q8_0")
    model = load_model(path, device="cpu", dtype=torch.float32, compile=False)
    projections = [m for m in model.modules() if isinstance(m, Projection)]
    assert projections and all(p.weight.dtype == torch.int8 and p.group == 32 for p in projections)
    assert model.dtype == torch.float32 and model.load_notes == []
    tokens = ids(2, 40, seed=4)
    got = model.forward(tokens, model.new_state(2))
    original = reference_logits(untied.reference, tokens)
    as_stored = reference_logits(rounded(untied.reference, path), tokens)
    assert relative_error(got, original) <= 0.10 and argmax_agreement(got, original) >= 0.85
    assert relative_error(got, as_stored) <= 1e-4


def test_moe_q8_0_widens_the_experts_and_says_so(moe):
    model = load_model(moe.gguf("q8_0"), device="cpu", dtype=torch.bfloat16, compile=False)
    layer = model.layers[0].mlp
    assert layer.experts_gate_up.dtype == torch.bfloat16 and layer.shared.gate_up.weight.dtype == torch.int8
    assert len(model.load_notes) == 1 and "Q8_0" in model.load_notes[0] and "bfloat16" in model.load_notes[0]


# -- RWKV-7 ------------------------------------------------------------------------------------------


def test_rwkv7_f32_file_gives_the_original_logits(rwkv):
    pth, converted = rwkv
    original = load_model(pth, device="cpu", dtype=torch.float32, compile=False)
    model = load_model(converted.gguf("f32"), device="cpu", dtype=torch.float32, compile=False)
    assert (model.cfg.num_heads, model.cfg.decay_rank, model.cfg.value_rank, model.cfg.ffn_size) == (1, 16, 8, 160)
    tokens = ids(2, 70, vocab=65536, seed=5)
    want = original.forward(tokens, original.new_state(2))
    assert relative_error(model.forward(tokens, model.new_state(2)), want) <= 1e-6


@pytest.mark.parametrize("outtype, tolerance", [("bf16", 0.04), ("q8_0", 0.08)])  # measured 2.1% and 4.7%
def test_rwkv7_rounded_files_within_the_stated_tolerance(rwkv, outtype, tolerance):
    pth, converted = rwkv
    original = load_model(pth, device="cpu", dtype=torch.float32, compile=False)
    tokens = ids(1, 40, vocab=65536, seed=6)
    want = original.forward(tokens, original.new_state(1))
    model = load_model(converted.gguf(outtype), device="cpu", dtype=torch.float32, compile=False)
    assert relative_error(model.forward(tokens, model.new_state(1)), want) <= tolerance
    assert ("Q8_0" in " ".join(model.load_notes)) == (outtype == "q8_0")  # RWKV-7 keeps no int8 weights: widened


def test_rwkv7_tokenizer_is_the_world_tokenizer(rwkv):
    _, converted = rwkv
    tokenizer, stop_ids = load_tokenizer(load_model(converted.gguf("f32"), device="cpu", compile=False))
    world = RwkvTokenizer.default()
    assert isinstance(tokenizer, RwkvTokenizer) and stop_ids == frozenset({0})
    for text in TEXTS:
        assert tokenizer.encode(text) == world.encode(text)


# -- the file as gguf-py reads it -------------------------------------------------------------------


def test_the_header_and_every_tensor_read_as_gguf_py_reads_them(rwkv):
    """Metadata, tensor table and values against gguf-py's GGUFReader and dequantizers (a Q8_0 file,
    F32 vectors among its Q8_0 matrices; RWKV-7's small vocabulary keeps GGUFReader quick)."""
    path = rwkv[1].gguf("q8_0")
    ours, theirs = GGUFFile(path), gguf.GGUFReader(path)
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):
            continue
        value = field.contents()
        assert (ours.strings(key) if isinstance(ours.metadata[key], StringList) else ours.metadata[key]) == value, key
    assert len(ours.tensors) == len(theirs.tensors)
    for tensor in theirs.tensors:
        info = ours.tensors[tensor.name]
        assert (info.shape, info.kind.name, info.offset) == (tuple(reversed(tensor.shape.tolist())), tensor.tensor_type.name,
                                                              tensor.data_offset)
        want = torch.tensor(np.ascontiguousarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32))
        assert torch.equal(ours.read(tensor.name, dtype=torch.float32), want.reshape(info.shape)), tensor.name


def test_a_q4_k_m_file_from_llama_quantize(tmp_path_factory):
    """K-quants as llama.cpp's quantizer mixes them (Q4_K, Q6_K, Q5_0 and Q8_0 fallbacks beside F32):
    each tensor decodes as gguf-py decodes it, the widened kinds are named (tests/test_gguf_compact.py
    has the compact ones), the model runs."""
    wide = qwen(tmp_path_factory, "wide", dense_reference, hidden_size=256)
    path = llama_cpp.quantize(wide.gguf("f32"), "Q4_K_M")
    file = GGUFFile(path)
    kinds = {info.kind.name for info in file.tensors.values()}
    assert {"Q4_K", "Q6_K"} <= kinds
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    for name, info in file.tensors.items():
        if info.kind.float_dtype is None:
            blocks = np.asarray(raw[info.offset : info.offset + info.nbytes]).reshape(-1, info.kind.nbytes)
            want = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[info.kind.name]).reshape(info.shape)
            assert torch.equal(file.read(name, dtype=torch.float32), torch.tensor(np.ascontiguousarray(want))), name
    model = load_model(path, device="cpu", dtype=torch.float32, compile=False)
    assert any(p.scale_and_zero is not None for p in model.modules() if isinstance(p, Projection))  # Q4_K: int4
    (note,) = model.load_notes
    assert "Q5_0 (6 tensors) widened to float32: no kernel here keeps them compact" in note and "Q8_0" not in note
    tokens = ids(1, 20, seed=7)
    assert torch.isfinite(model.forward(tokens, model.new_state(1))).all()


# -- the tokenizer -----------------------------------------------------------------------------------

TEXTS = [
    "Long documents are read one chunk at a time. It's 2024; we'll see.",
    "我想在apple工作1314151天～ 日本語のテキスト、한국어 문장입니다.",
    "🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ 🦙🦙",
    "def f(x):\n\tif x  >  3:\n        return x**2  # done\n\n\n}",
    "   leading   and    trailing   \n\n\t \r\n  ",
    "combining: e\u0301 cafe\u0301 nai\u0308ve, ligature ﬁ, NBSP\u00a0here",
    "<|im_end|> <think> markup written as text is text",
    "I'VE 'll 3.14159 12345678 ------======= ......!!!!!!",
]


def test_the_tokenizer_from_the_metadata_gives_tokenizer_jsons_ids(dense):
    model = load_model(dense.gguf("q8_0"), device="cpu", dtype=torch.float32, compile=False)
    tokenizer, stop_ids = load_tokenizer(model)
    reference = Tokenizer.from_file(QWEN_TOKENIZER)
    assert tokenizer.vocab_size == reference.vocab_size
    for text in TEXTS:
        assert tokenizer.encode(text) == reference.encode(text), text
        assert tokenizer.decode(reference.encode(text)) == reference.decode(reference.encode(text))
    assert tokenizer.chat_prompt_ids("Summarize.", system="Be brief.") == reference.chat_prompt_ids("Summarize.", system="Be brief.")
    # eos from the metadata (the tiny config's 2), and the chat turn's end as the folder loader adds it
    assert stop_ids == {2, reference.token_id("<|im_end|>"), reference.token_id("<|endoftext|>")}


def test_the_tokenizer_agrees_on_arbitrary_text(dense):
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import strategies as st

    tokenizer, _ = load_tokenizer(load_model(dense.gguf("f32"), device="cpu", compile=False))
    reference = Tokenizer.from_file(QWEN_TOKENIZER)

    @hypothesis.settings(max_examples=300, deadline=None)
    @hypothesis.given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=80))
    def same_ids(text):
        assert tokenizer.encode(text) == reference.encode(text)

    same_ids()


# -- where files come from ---------------------------------------------------------------------------


def test_a_folder_with_one_gguf_file_loads(dense, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tiny-Q8_0.gguf").symlink_to(dense.gguf("q8_0"))
    (folder / "mmproj-tiny-F16.gguf").write_bytes(b"a vision projector is never the model")
    assert load_model(folder, device="cpu", compile=False).source == folder / "tiny-Q8_0.gguf"
    (folder / "tiny-F32.gguf").symlink_to(dense.gguf("f32"))
    with pytest.raises(SummarizeError, match="2 GGUF files"):
        load_model(folder, device="cpu", compile=False)


def test_a_hub_repo_with_a_quantization_tag(dense, tmp_path, monkeypatch, run_cli):
    """owner/name:Q8_0 picks that file of the repository (here a Hugging Face cache laid out as
    huggingface_hub leaves it, read offline)."""
    from huggingface_hub import constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someone--Tiny-GGUF"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    (snapshot / "Tiny-Q8_0.gguf").symlink_to(dense.gguf("q8_0"))
    (snapshot / "Tiny-F32.gguf").symlink_to(dense.gguf("f32"))
    (snapshot / "mmproj-Tiny-Q8_0.gguf").write_bytes(b"not the model")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    for tag in ("Q8_0", "q8_0"):
        model = load_model(f"someone/Tiny-GGUF:{tag}", device="cpu", compile=False)
        assert Path(model.source).name == "Tiny-Q8_0.gguf"
    pulled = run_cli("--pull", "-m", "someone/Tiny-GGUF:Q8_0", env={"NO_COLOR": "1"})
    assert pulled.exit_code == 0 and "Tiny-Q8_0.gguf" in pulled.stderr, pulled.stderr
    with pytest.raises(ModelNotAvailable, match="no Q4_K_M GGUF file.*Tiny-F32.gguf"):
        load_model("someone/Tiny-GGUF:Q4_K_M", device="cpu", compile=False)
    with pytest.raises(ModelNotAvailable, match="offline"):
        load_model("someone/Other-GGUF:Q8_0", device="cpu", compile=False)


# -- what reading costs ---------------------------------------------------------------------------------

PEAK_RSS = """
import sys
import torch
from summarize.engine import load_model
def status(key):  # VmHWM: this process's own peak (ru_maxrss would carry the parent's over exec)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))
before = status("VmRSS:")
model = load_model(sys.argv[1], device="cpu", dtype=getattr(torch, sys.argv[2]), compile=False)
print(before, status("VmHWM:"), sum(b.nbytes for b in model.buffers()))
"""
WORKING_SET = 32 << 20  # one chunk's temporaries, the metadata, the modules and the allocator's slack


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads /proc/self/status (Linux)")
@pytest.mark.parametrize("outtype, dtype", [("f32", "bfloat16"), ("q8_0", "float32")])
def test_loading_peaks_at_the_weights_it_keeps(tmp_path_factory, outtype, dtype):
    """A model whose embedding dominates (248K × 256): F32 read into bf16, and Q8_0 into int8 groups,
    peak at the weights kept + 10% + a fixed working set (measured: 1.09x of 128 MB and 1.11x of
    68 MB, i.e. +11 and +7 MB). At the 0.8B shape the working set is lost in the weights: 1.02x of
    1.5 GB from BF16, 1.06x of the 0.75 GB kept from its Q8_0 file when it was requantized to
    per-row int8 (bench_engine.py --ours-gguf, its "load" row). Reading the file into memory first,
    or converting a whole tensor at once, would fail it."""
    big = qwen(tmp_path_factory, "wide", dense_reference, hidden_size=256)
    proc = subprocess.run([sys.executable, "-c", PEAK_RSS, str(big.gguf(outtype)), dtype], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    before, peak, weights = map(int, proc.stdout.split())
    assert weights > 60e6
    assert peak - before <= 1.10 * weights + WORKING_SET, f"loading took {(peak - before) / 1e6:.0f} MB for {weights / 1e6:.0f} MB"


WITHOUT_NUMPY = """
import sys
sys.modules["numpy"] = None  # as on a plain install
import torch
from summarize.engine import load_model, load_tokenizer
model = load_model(sys.argv[1], device="cpu", dtype=torch.float32, compile=False)
tokenizer, stop_ids = load_tokenizer(model)
ids = torch.tensor([tokenizer.encode("GGUF without numpy.")])
torch.save({"weights": model.state_dict(), "logits": model.forward(ids, model.new_state(1))}, sys.argv[2])
"""


def test_gguf_files_load_without_numpy(dense, tmp_path):
    path = dense.gguf("q8_0")
    proc = subprocess.run([sys.executable, "-c", WITHOUT_NUMPY, str(path), str(tmp_path / "out.pt")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = torch.load(tmp_path / "out.pt")
    model = load_model(path, device="cpu", dtype=torch.float32, compile=False)
    want = model.state_dict()
    assert got["weights"].keys() == want.keys()
    assert all(torch.equal(got["weights"][name], want[name]) for name in want), "the same file loads to other weights"
    # the same weights; the logits only to rounding, as MKL's fp32 GEMM may sum in another order in
    # another process (it picks its code path by the buffers' alignment: seen on an AMD EPYC)
    tokenizer, _ = load_tokenizer(model)
    ids = torch.tensor([tokenizer.encode("GGUF without numpy.")])
    torch.testing.assert_close(got["logits"], model.forward(ids, model.new_state(1)), rtol=0, atol=1e-4)


# -- end to end --------------------------------------------------------------------------------------


def test_the_sample_pdf_summarized_with_a_gguf_file(dense, run_cli):
    result = run_cli(str(ROOT / "samples" / "target-tier-policy.pdf"), "-m", str(dense.gguf("q8_0")), "-n", "50", "--temperature", "0",
                     env={"NO_COLOR": "1"})
    assert result.exit_code == 0, result.stderr
    assert f"model {dense.gguf('q8_0')} on cpu" in result.stderr
    assert result.stdout.strip()

