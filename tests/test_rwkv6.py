"""The RWKV-6 engine equals BlinkDL's reference (the `rwkv` package's v6 path), its wkv6 op is exact
with unbounded decays, and it verifies drafts, reads its layouts and its vocabularies. What every
family keeps (prefill vs decode, the State, diagnostics, bf16, the CLI from a `.pth`) is checked in
test_family_contract.py.

Tolerances (fp32):
- logits vs the reference: 1e-4 relative to the largest logit, over 300 tokens, for BlinkDL's `.pth`
  and the Hugging Face layout, two head sizes and two pairs of LoRA ranks (measured: ~2e-6; the two
  sides sum in different orders);
- wkv6 ops: chunked, step and verify vs the naive oracle within 2e-5 + 1e-5 relative, over 1,000
  tokens that include channels decaying by exp(-12) per token and channels that forget at once (w = 0)
  (measured: ~4e-6 on outputs of size ~20);
- the state after 100 tokens vs the reference's: 1e-5 of its largest entry (measured: ~1e-6);
- our engine against itself (verify vs decode): 1e-5 relative.

The reference module reads RWKV_V7_ON when it is imported and when it runs. test_rwkv7.py imports
`rwkv.model` with it on, which turns the module's `RWKV` into RWKV-7's class; this file runs its own
copy of the module (`rwkv_v6_reference`), read with RWKV_V7_ON unset, so the two files pass in one
pytest run in either order. Tiny models run on one thread.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import warnings
from pathlib import Path
from unittest import mock

import pytest
import torch

from summarize.engine import load_model, load_tokenizer
from summarize.engine.generation.generate import GenerationRequest, SamplingParams, Speculation, generate_batch
from summarize.engine.models.rwkv6 import RWKV6Model
from summarize.engine.ops.rwkv6_wkv import (
    DEFAULT_CHUNK_SIZE,
    SUB_CHUNK,
    chunk_rwkv6,
    naive_recurrent_rwkv6,
    recurrent_step_rwkv6,
    rwkv6_wkv,
    verify_rwkv6,
)
from summarize.engine.tokenizers.rwkv import MOBIUS_CHAT, VOCAB_FILE, WORLD_CHAT, RwkvTokenizer
from summarize.errors import SummarizeError
from test_family_contract import assert_every_layer_reported, summarize_cli
from test_speculative import FixedCosts, noisy_copy
from tiny_models import RWKV6_TINY, RWKV6_TINY_SMALL_HEADS, RWKV_TINY, blinkdl_checkpoint, rwkv6_checkpoint, rwkv6_hf_layout

REF_TOL = 1e-4
SELF_TOL = 1e-5
VOCAB = RWKV6_TINY["vocab"]
REFERENCE_TOKENS = 300
SAMPLES = Path(__file__).resolve().parents[1] / "samples"
SHAPES = {"heads-of-32": RWKV6_TINY, "heads-of-16": RWKV6_TINY_SMALL_HEADS}
MOBIUS_TOKENS = {65530: b"<|im_start|>", 65531: b"<|im_end|>", 65532: b"<|endoftext|>"}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def random_ids(batch: int, length: int, seed: int = 0, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def assert_close_to_scale(got: torch.Tensor, want: torch.Tensor, rel: float) -> None:
    """|got - want| <= rel x the largest |want| (logits, or a state matrix)."""
    scale = want.abs().max().item()
    err = (got.float() - want.float()).abs().max().item()
    assert err <= rel * scale, f"max |diff| {err:.3g} > {rel} x {scale:.3g}"


# -- the reference ------------------------------------------------------------------------------

REFERENCE_ENV = {"RWKV_JIT_ON": "0", "RWKV_CUDA_ON": "0"}


def reference_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "RWKV_V7_ON"} | REFERENCE_ENV


class Reference:
    """BlinkDL's v6 path of the `rwkv` package, pure PyTorch on the CPU, fp32: a copy of its module
    of our own, read and run with RWKV_V7_ON unset (the module reads the environment at both)."""

    module = None

    def __init__(self, checkpoint: Path) -> None:
        with mock.patch.dict(os.environ, reference_environment(), clear=True):
            self.model = self._module().RWKV(str(checkpoint.with_suffix("")), "cpu fp32", verbose=False)  # it appends ".pth"

    @classmethod
    def _module(cls):
        if cls.module is None:
            spec = importlib.util.find_spec("rwkv.model")
            own = importlib.util.spec_from_file_location("rwkv_v6_reference", spec.origin)
            module = importlib.util.module_from_spec(own)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                own.loader.exec_module(module)
            cls.module = module
        return cls.module

    def forward(self, ids: list[int], state=None, full_output: bool = False):
        with mock.patch.dict(os.environ, reference_environment(), clear=True):
            return self.model.forward(ids, state, full_output=full_output)

    def logits(self, ids: list[int]) -> torch.Tensor:
        """[T, V]: every position, from one call."""
        logits, _ = self.forward(ids, None, full_output=True)
        return logits.reshape(len(ids), -1)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("rwkv6")
    return {name: rwkv6_checkpoint(root / f"{name}.pth", **sizes, seed=i) for i, (name, sizes) in enumerate(SHAPES.items())}


@pytest.fixture(scope="module")
def references(checkpoints) -> dict[str, Reference]:
    pytest.importorskip("rwkv")
    return {name: Reference(path) for name, path in checkpoints.items()}


@pytest.fixture(scope="module")
def models(checkpoints, tmp_path_factory) -> dict[tuple[str, str], RWKV6Model]:
    root = tmp_path_factory.mktemp("rwkv6-hf")
    out = {}
    for name, path in checkpoints.items():
        out[name, "pth"] = load_model(path, device="cpu", dtype=torch.float32)
        out[name, "hf"] = load_model(rwkv6_hf_layout(path, root / name), device="cpu", dtype=torch.float32)
    return out


@pytest.fixture(scope="module")
def model(models) -> RWKV6Model:
    return models["heads-of-32", "pth"]


CASES = [(shape, layout) for shape in SHAPES for layout in ("pth", "hf")]


# -- logits equal the reference -------------------------------------------------------------


@pytest.mark.parametrize("shape, layout", CASES)
def test_logits_equal_reference_in_one_call(models, references, shape, layout):
    model = models[shape, layout]
    ids = random_ids(2, REFERENCE_TOKENS, seed=1)
    got = model.forward(ids, model.new_state(2))
    for row in range(2):  # the reference reads one sequence at a time
        assert_close_to_scale(got[row], references[shape].logits(ids[row].tolist()), REF_TOL)


@pytest.mark.parametrize("shape, layout", CASES)
def test_logits_equal_reference_in_uneven_pieces(models, references, shape, layout):
    model = models[shape, layout]
    ids = random_ids(1, REFERENCE_TOKENS, seed=2)
    state, pieces, start = model.new_state(1), [], 0
    for size in (7, 64, 1, 50, 17, 133, 28):  # 300 tokens, below, at and above chunk multiples
        pieces.append(model.forward(ids[:, start : start + size], state))
        start += size
    assert start == REFERENCE_TOKENS
    assert_close_to_scale(torch.cat(pieces, dim=1)[0], references[shape].logits(ids[0].tolist()), REF_TOL)


@pytest.mark.parametrize("shape, layout", CASES)
def test_logits_equal_reference_token_by_token(models, references, shape, layout):
    model, reference = models[shape, layout], references[shape]
    ids = random_ids(1, REFERENCE_TOKENS, seed=3)[0].tolist()
    ref_state, want = None, []
    for token in ids:
        logits, ref_state = reference.forward([token], ref_state)
        want.append(logits)
    state = model.new_state(1)
    got = [model.decode(torch.tensor([token]), state)[0] for token in ids]
    assert_close_to_scale(torch.stack(got), torch.stack(want), REF_TOL)


def test_state_equals_reference_state(model, references):
    ids = random_ids(1, 100, seed=4)[0].tolist()
    _, ref_state = references["heads-of-32"].forward(ids)  # per layer: time-mix shift, wkv [H, K, V], channel-mix shift
    state = model.new_state(1)
    model.prefill(torch.tensor([ids]), state)
    for i, layer in enumerate(state.layers):  # the matrices hold sums of ~100 outer products: relative to their largest entry
        assert_close_to_scale(layer.matrix[0], ref_state[3 * i + 1], SELF_TOL)
        assert torch.allclose(layer.shift[0, 0], ref_state[3 * i], atol=1e-5)
        assert torch.allclose(layer.shift[0, 1], ref_state[3 * i + 2], atol=1e-5)


@pytest.mark.parametrize("shape", SHAPES)
def test_sizes_are_read_from_the_tensors(models, shape):
    sizes = SHAPES[shape]
    for layout in ("pth", "hf"):
        cfg = models[shape, layout].cfg
        assert (cfg.vocab_size, cfg.hidden_size, cfg.num_layers) == (sizes["vocab"], sizes["hidden"], sizes["layers"])
        assert (cfg.num_heads, cfg.head_size) == (sizes["hidden"] // sizes["head_size"], sizes["head_size"])
        assert (cfg.mix_rank, cfg.decay_rank, cfg.ffn_size) == (sizes["ranks"]["mix"], sizes["ranks"]["decay"], sizes["ffn"])
        assert (cfg.layer_norm_eps, cfg.group_norm_eps) == (1e-5, pytest.approx(64e-5))


def test_the_decays_of_the_test_model_are_unbounded(model):
    """The reference comparisons above run through per-token decays down to exp(-12) and below."""
    logs = []
    state = model.new_state(1)
    with mock.patch("summarize.engine.models.rwkv6.RWKV6_WKV") as recurrence:
        recurrence.advance.side_effect = lambda **x: (logs.append(x["log_w"]), rwkv6_wkv(**x))[1]
        model.forward(random_ids(1, 64, seed=5), state)
    log_w = torch.cat([x.flatten() for x in logs])
    assert log_w.min() < -12 and log_w.max() > -0.01


# -- our engine against itself ----------------------------------------------------------------


def test_verify_and_accept_equal_decoding_the_kept_tokens(model):
    g = torch.Generator().manual_seed(10)
    prompt, span, counts = torch.randint(0, VOCAB, (3, 11), generator=g), torch.randint(0, VOCAB, (3, 6), generator=g), torch.tensor([1, 4, 6])
    after = torch.randint(0, VOCAB, (3, 2), generator=g)
    state = model.new_state(3)
    model.prefill(prompt, state)
    verified = model.verify(span, state)
    model.accept(state, counts)
    continued = [model.decode(after[:, 0], state), model.verify(after[:, 1:], state)[:, 0]]
    model.accept(state, torch.ones(3, dtype=torch.long))
    for row, n in enumerate(counts.tolist()):
        one = model.new_state(1)
        model.prefill(prompt[row : row + 1], one)
        stepped = torch.stack([model.decode(span[row : row + 1, t], one) for t in range(6)], dim=1)
        assert_close_to_scale(verified[row], stepped[0], SELF_TOL)
        one = model.new_state(1)
        model.prefill(torch.cat([prompt[row], span[row, :n]])[None], one)
        for t, logits in enumerate(continued):
            assert_close_to_scale(logits[row], model.decode(after[row : row + 1, t], one)[0], SELF_TOL)


class AnyText:
    """A tokenizer stand-in for generation without stop texts: only decode is called."""

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return " ".join(map(str, ids))


def test_greedy_output_is_the_same_with_speculation(model):
    prompts = random_ids(2, 9, seed=11)
    plain = generate_batch(model, model.new_state(2), GenerationRequest(prompts=prompts, tokenizer=AnyText(), stop_ids=[], max_new_tokens=40))
    # drafts looked up in a damaged copy of the answer: rows keep some drafts and reject others
    contexts = [prompts[row].tolist() + noisy_copy(gen.token_ids, VOCAB, 7 + row, 5) for row, gen in enumerate(plain)]
    fast = generate_batch(model, model.new_state(2), GenerationRequest(
        prompts=prompts, tokenizer=AnyText(), stop_ids=[], max_new_tokens=40, contexts=contexts,
        speculation=Speculation(most=8, costs=FixedCosts(2, 0.0))))
    assert [g.token_ids for g in fast] == [g.token_ids for g in plain]
    assert all(0 < g.accepted_tokens < g.draft_tokens for g in fast)


def test_a_banned_token_is_never_sampled(model):
    prompt = random_ids(1, 12, seed=12)
    best = model.prefill(prompt, model.new_state(1))[0]
    first, second = best.topk(2).indices.tolist()
    got = generate_batch(model, model.new_state(1), GenerationRequest(
        prompts=prompt, tokenizer=AnyText(), stop_ids=[], max_new_tokens=1, banned_ids={first}))[0]
    assert got.token_ids == [second]
    sampled = generate_batch(model, model.new_state(64), GenerationRequest(
        prompts=prompt.expand(64, -1), tokenizer=AnyText(), stop_ids=[], max_new_tokens=4, sampling=SamplingParams(temperature=5.0, seed=0),
        banned_ids={first}))
    assert all(first not in g.token_ids for g in sampled)


# -- the wkv6 ops -------------------------------------------------------------------------------

ATOL, RTOL = 2e-5, 1e-5
B, H, N = 2, 3, 16


def op_inputs(T: int, *, seed: int = 0) -> dict:
    """Decays of every kind: mild ones, random ones down to exp(-12) per token, channels at exactly
    exp(-12) per token, a channel that forgets at once for a stretch (w = 0, log w = -inf)."""
    gen = torch.Generator().manual_seed(seed)
    log_w = -torch.exp(torch.randn(B, T, H, N, generator=gen) * 1.5 - 1)
    log_w[..., :4] = -12 * torch.rand(B, T, H, 4, generator=gen)
    log_w[..., 4] = -12.0
    log_w[:, T // 3 : T // 3 + 9, :, 5] = -float("inf")
    return dict(
        r=torch.randn(B, T, H, N, generator=gen), log_w=log_w, k=torch.randn(B, T, H, N, generator=gen) * 0.5,
        v=torch.randn(B, T, H, N, generator=gen), u=torch.randn(H, N, generator=gen) * 0.5,
    )


def initial_state(seed: int) -> torch.Tensor:
    return torch.randn(B, H, N, N, generator=torch.Generator().manual_seed(seed))


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert torch.isfinite(got).all()
    assert torch.allclose(got, want, atol=ATOL, rtol=RTOL), f"max |diff| {(got - want).abs().max():.3g}"


@pytest.mark.parametrize("T", [1, SUB_CHUNK - 1, SUB_CHUNK, DEFAULT_CHUNK_SIZE + 1, 1000])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunk_op_equals_naive(T, with_state):
    x = op_inputs(T, seed=T)
    s0 = initial_state(1) if with_state else None
    want_o, want_s = naive_recurrent_rwkv6(**x, initial_state=s0)
    o, s, _ = chunk_rwkv6(**x, initial_state=s0)
    assert_close(o, want_o)
    assert_close(s, want_s)


@pytest.mark.parametrize("chunk_size", [SUB_CHUNK, 2 * SUB_CHUNK, 8 * SUB_CHUNK])
def test_chunk_op_is_exact_for_every_chunk_size_over_1000_tokens(chunk_size):
    """A chunk of 128 tokens at exp(-12) per token spans exp(-1536): no factor may be split across it."""
    x = op_inputs(1000, seed=2)
    s0 = initial_state(3)
    want_o, want_s = naive_recurrent_rwkv6(**x, initial_state=s0)
    o, s, _ = chunk_rwkv6(**x, initial_state=s0, chunk_size=chunk_size)
    assert_close(o, want_o)
    assert_close(s, want_s)


def test_step_op_and_stats_equal_naive():
    T = 40
    x = op_inputs(T, seed=4)
    s0 = initial_state(5)
    want_o, want_s = naive_recurrent_rwkv6(**x, initial_state=s0)
    state, outs, deltas = s0.clone(), [], []
    for t in range(T):
        before = state.clone()
        o, stats = recurrent_step_rwkv6(**{n: x[n][:, t] for n in ("r", "log_w", "k", "v")}, u=x["u"], state=state, with_stats=True)
        outs.append(o)
        written = state - before * x["log_w"][:, t].exp()[..., None]  # what the token wrote
        assert torch.allclose(stats.delta_norm, written.flatten(1).norm(dim=-1), rtol=1e-4)
        deltas.append(stats.delta_norm)
    assert_close(torch.stack(outs, dim=1), want_o)
    assert_close(state, want_s)
    _, _, chunk_stats = chunk_rwkv6(**x, initial_state=s0)
    assert torch.allclose(chunk_stats.delta_norm, torch.stack(deltas).mean(0), rtol=1e-5)
    assert torch.allclose(chunk_stats.state_norm, want_s.flatten(1).norm(dim=-1), rtol=1e-5)
    assert torch.allclose(chunk_stats.gate_mean, x["log_w"].exp().mean(dim=(1, 2, 3)))


@pytest.mark.parametrize("T", [1, 5, 9, SUB_CHUNK + 3])
def test_a_verified_span_lands_on_every_prefix_as_the_oracle_does(T):
    x = op_inputs(T, seed=6)
    state = initial_state(7)
    before = state.clone()
    o, pending = verify_rwkv6(**x, state=state)
    assert torch.equal(state, before)  # verifying reads the state only
    want_o, _ = naive_recurrent_rwkv6(**x, initial_state=state)
    assert_close(o, want_o)
    for n in range(1, T + 1):
        landed = state.clone()
        pending.land(landed, torch.full((B,), n), with_stats=False)
        _, want = naive_recurrent_rwkv6(**{k: (v[:, :n] if k != "u" else v) for k, v in x.items()}, initial_state=state)
        assert_close(landed, want)


def test_rows_land_on_their_own_prefixes_with_the_stats_of_their_kept_tokens():
    T, counts = 6, torch.tensor([2, 5])
    x = op_inputs(T, seed=8)
    state = initial_state(9)
    _, pending = verify_rwkv6(**x, state=state)
    landed = state.clone()
    stats = pending.land(landed, counts, with_stats=True)
    for row, n in enumerate(counts.tolist()):
        s = state[row : row + 1].clone()
        steps = [recurrent_step_rwkv6(**{k: x[k][row : row + 1, t] for k in ("r", "log_w", "k", "v")}, u=x["u"], state=s,
                                      with_stats=True)[1] for t in range(n)]
        assert_close(landed[row], s[0])
        assert stats.state_norm[row] == pytest.approx(steps[-1].state_norm.item(), rel=1e-5)
        assert stats.gate_mean[row] == pytest.approx(sum(s.gate_mean.item() for s in steps) / n, rel=1e-5)
        assert stats.delta_norm[row] == pytest.approx(sum(s.delta_norm.item() for s in steps) / n, rel=1e-5)


# -- loading ------------------------------------------------------------------------------------


def test_hugging_face_settings_are_read(checkpoints, tmp_path):
    folder = rwkv6_hf_layout(checkpoints["heads-of-32"], tmp_path / "divisor-4", head_size_divisor=4, layer_norm_epsilon=2e-5)
    cfg = load_model(folder, device="cpu", dtype=torch.float32).cfg
    assert (cfg.group_norm_eps, cfg.layer_norm_eps) == (pytest.approx(16e-5), 2e-5)


@pytest.mark.parametrize("setting", [{"head_size_divisor": "8"}, {"layer_norm_epsilon": -1}], ids=["string", "negative"])
def test_hugging_face_settings_that_are_not_positive_numbers_are_refused(checkpoints, tmp_path, setting):
    folder = rwkv6_hf_layout(checkpoints["heads-of-32"], tmp_path / "bad", **setting)
    with pytest.raises(SummarizeError, match=f"{next(iter(setting))} must be a positive number") as excinfo:
        load_model(folder, device="cpu", dtype=torch.float32)
    assert f"{folder}/config.json" in str(excinfo.value)


def test_a_pth_of_rwkv7_still_loads_as_rwkv7(tmp_path):
    rwkv7 = load_model(blinkdl_checkpoint(tmp_path / "x070.pth", **RWKV_TINY), device="cpu", dtype=torch.float32)
    assert rwkv7.family == "rwkv7"


@pytest.mark.parametrize("tensors, what", [
    ({"blocks.0.att.ln_x.weight": torch.zeros(8), "blocks.0.att.time_mix_k": torch.zeros(1, 1, 8)}, "an RWKV-5 checkpoint"),
    ({"blocks.0.att.time_mix_k": torch.zeros(1, 1, 8)}, "an RWKV-4 checkpoint"),
    ({"blocks.0.mlp.weight": torch.zeros(8, 8)}, "not an RWKV checkpoint in BlinkDL's layout"),
], ids=["rwkv5", "rwkv4", "not-rwkv"])
def test_a_pth_of_another_version_is_named_in_one_line(tmp_path, tensors, what):
    path = tmp_path / "other.pth"
    torch.save({"emb.weight": torch.zeros(16, 8)} | tensors, path)
    with pytest.raises(SummarizeError) as excinfo:
        load_model(path, device="cpu", dtype=torch.float32)
    message = str(excinfo.value)
    assert "\n" not in message and str(path) in message and what in message, message
    assert "summarize reads RWKV-6 (x060) and RWKV-7 (x070)" in message


@pytest.mark.parametrize("change, why", [
    ({"blocks.0.att.time_state": torch.zeros(2, 32, 32)}, "plain RWKV-6 does not have: blocks.0.att.time_state"),
    ({"blocks.1.att.gate.weight": None}, "lacks tensor blocks.1.att.gate.weight"),
    ({"blocks.0.att.time_faaaa": torch.zeros(3, 21)}, "3 heads of 21"),
    ({"blocks.0.att.time_maa_w1": torch.zeros(64, 42)}, "not 5 LoRAs of equal rank"),
    ({"blocks.2.ffn.value.weight": torch.zeros(64, 161)}, "blocks.2.ffn.value.weight has shape (64, 161), expected (64, 160)"),
], ids=["state-tuned", "missing", "heads-vs-channels", "mix-lora", "misshaped"])
def test_a_bad_rwkv6_pth_is_named_in_one_line(checkpoints, tmp_path, change, why):
    tensors = {k: v for k, v in (torch.load(checkpoints["heads-of-32"], weights_only=True) | change).items() if v is not None}
    path = tmp_path / "bad.pth"
    torch.save(tensors, path)
    with pytest.raises(SummarizeError) as excinfo:
        load_model(path, device="cpu", dtype=torch.float32)
    message = str(excinfo.value)
    assert "\n" not in message and why in message, message


# -- vocabularies and chat formats ------------------------------------------------------------


def mobius_vocabulary(folder: Path) -> Path:
    """Mobius's vocabulary as it ships: v20230424 plus three control tokens, every line a bytes
    literal, under the old file name."""
    lines = []
    for line in VOCAB_FILE.read_text(encoding="utf-8").splitlines():
        token_id, literal = int(line[: line.index(" ")]), ast.literal_eval(line[line.index(" ") : line.rindex(" ")].strip())
        data = literal.encode("utf-8") if isinstance(literal, str) else literal
        lines.append(f"{token_id} {data!r} {len(data)}")
    lines += [f"{token_id} {data!r} {len(data)}" for token_id, data in MOBIUS_TOKENS.items()]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / VOCAB_FILE.name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "你好，世界！日本語のテキストも、한국어도 있습니다。 emoji 😀👍🏽 family 👨‍👩‍👧‍👦",
    "def f(x):\n    return {'a': [x ** 2 for _ in range(3)]}\n\n\n\tpass\r\n" + " " * 200,
    "<|im_start|>User: hi<|im_end|>\n<|im_start|>Assistant: <|endoftext|><|im_end|><|im_start|",
]


@pytest.fixture(scope="module")
def mobius_vocab(tmp_path_factory) -> Path:
    return mobius_vocabulary(tmp_path_factory.mktemp("mobius-vocab"))


@pytest.mark.parametrize("vocabulary", ["v20230424", "mobius-bytes-literals"])
def test_both_vocabularies_encode_as_the_reference(mobius_vocab, vocabulary):
    pytest.importorskip("rwkv")
    from rwkv.rwkv_tokenizer import TRIE_TOKENIZER

    path = VOCAB_FILE if vocabulary == "v20230424" else mobius_vocab
    ours, reference = RwkvTokenizer.from_file(path), TRIE_TOKENIZER(str(path))
    document = (SAMPLES / "target-tier-policy.txt").read_text(encoding="utf-8")
    for text in [*TEXTS, document]:
        assert ours.encode(text) == reference.encode(text)
        assert ours.decode(ours.encode(text)) == text
    assert ours.vocab_size == (65530 if vocabulary == "v20230424" else 65533)


def test_the_world_format_for_the_shipped_vocabulary(model):
    tokenizer, stop_ids = load_tokenizer(model)  # no vocabulary beside the .pth: the shipped one
    assert tokenizer.chat == WORLD_CHAT and stop_ids == frozenset()
    assert tokenizer.banned_ids == {0} and tokenizer.stop_texts == ("\n\n",)
    ids = tokenizer.chat_prompt_ids("Summarize this.\n\nFirst paragraph.\n\n\nSecond one.\n")
    assert tokenizer.decode(ids) == "User: Summarize this.\nFirst paragraph.\nSecond one.\n\nAssistant:"


def test_a_format_whose_tokens_the_vocabulary_lacks_is_refused():
    with pytest.raises(SummarizeError, match=re.escape("lacks the Mobius chat tokens <|im_start|>, <|im_end|>, <|endoftext|>")):
        RwkvTokenizer.default().with_chat(MOBIUS_CHAT)


def test_the_mobius_format_when_the_folder_has_its_vocabulary(checkpoints, mobius_vocab, tmp_path):
    folder = rwkv6_hf_layout(checkpoints["heads-of-32"], tmp_path / "mobius")
    (folder / VOCAB_FILE.name).write_bytes(mobius_vocab.read_bytes())
    tokenizer, stop_ids = load_tokenizer(load_model(folder, device="cpu", dtype=torch.float32))
    assert tokenizer.chat == MOBIUS_CHAT
    assert stop_ids == {65531, 65532} and tokenizer.banned_ids == {0} and tokenizer.stop_texts == ()
    ids = tokenizer.chat_prompt_ids("Summarize <|im_end|> this.\n\nSecond paragraph.", system="Be brief.")
    assert ids[0] == 65530 and ids.count(65531) == 2 and ids.count(65530) == 3  # the document's text makes no control token
    assert tokenizer.decode(ids) == ("<|im_start|>System: Be brief.<|im_end|>\n<|im_start|>User: Summarize <|im_end|> this."
                                     "\n\nSecond paragraph.<|im_end|>\n<|im_start|>Assistant:")
    instruction, chunk, question = "Write notes.\n\nPart:\n", "The text.\n\nMore.", "\n\nNotes now."
    split = tokenizer.chat_prefix_ids(None, instruction) + tokenizer.chat_suffix_ids(chunk, question)
    assert split == tokenizer.chat_prompt_ids(instruction + chunk + question)


# -- the whole pipeline -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world_checkpoint(tmp_path_factory) -> Path:
    """A tiny model over the whole World vocabulary (and Mobius's three more), so the real tokenizer's ids fit."""
    sizes = RWKV6_TINY | dict(vocab=65536, layers=2)
    return rwkv6_checkpoint(tmp_path_factory.mktemp("rwkv6-world") / "rwkv6-tiny-world.pth", **sizes)


@pytest.mark.parametrize("strategy", ["map-reduce", "stream"])
def test_pdf_to_summary_with_a_mobius_folder(world_checkpoint, mobius_vocab, tmp_path, strategy):
    folder = rwkv6_hf_layout(world_checkpoint, tmp_path / "mobius")
    (folder / VOCAB_FILE.name).write_bytes(mobius_vocab.read_bytes())
    assert_every_layer_reported(summarize_cli(folder, tmp_path, "--strategy", strategy), layers=2)
