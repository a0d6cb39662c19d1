"""The generation loop against small deterministic fake models."""

from __future__ import annotations

import pytest
import tokenizers
import torch
from tokenizers import AddedToken

from summarize.engine.generation.generate import (
    Generation,
    GenerationRequest,
    SamplingParams,
    generate,
    generate_batch,
    greedy_token,
)
from summarize.engine.tokenizers.tokenizer import Tokenizer

IM_END, ENDOFTEXT = 256, 257
VOCAB = 258
ASCII = range(32, 127)


def byte_level_tokenizer() -> Tokenizer:
    """Ids 0..255 are the bytes (no merges); 256 and 257 are the stop tokens."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), 256)}
    chars, extra = {}, 0
    for b in range(256):  # GPT-2's byte → character table
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    raw = tokenizers.Tokenizer(tokenizers.models.BPE({chars[b]: b for b in range(256)}, []))
    raw.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = tokenizers.decoders.ByteLevel()
    raw.add_special_tokens([AddedToken(s, special=True, normalized=False)
                            for s in ("<|im_end|>", "<|endoftext|>")])
    assert raw.token_to_id("<|im_end|>") == IM_END
    return Tokenizer(raw)


TOK = byte_level_tokenizer()


class FakeState:
    def __init__(self, batch: int) -> None:
        self.last = torch.zeros(batch, dtype=torch.long)
        self.position = 0


class TableModel:
    """logits = W[last token]: a fixed random table that only favours printable ASCII."""

    def __init__(self, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.table = torch.full((VOCAB, VOCAB), -30.0)
        self.table[:, ASCII] = 3 * torch.randn(VOCAB, len(ASCII), generator=g)
        self.prefills = self.decodes = 0

    def prefill(self, input_ids, state):
        self.prefills += 1
        state.last = input_ids[:, -1].clone()
        state.position += input_ids.shape[1]
        return self.table[state.last]

    def decode(self, token_ids, state):
        assert token_ids.ndim == 1 and token_ids.dtype == torch.long
        self.decodes += 1
        state.last = token_ids.clone()
        state.position += 1
        return self.table[state.last]


class ScriptModel(TableModel):
    """Emits a fixed script of tokens (by position), then the stop token."""

    def __init__(self, script: list[int]) -> None:
        super().__init__()
        self.script = script
        self.start = None

    def _logits(self, state):
        step = state.position - self.start
        tid = self.script[step] if step < len(self.script) else IM_END
        logits = torch.zeros(state.last.shape[0], VOCAB)
        logits[:, tid] = 10.0
        return logits

    def prefill(self, input_ids, state):
        super().prefill(input_ids, state)
        self.start = state.position
        return self._logits(state)

    def decode(self, token_ids, state):
        super().decode(token_ids, state)
        return self._logits(state)


def run(model, prompt, max_new_tokens=20, stop_ids=(IM_END, ENDOFTEXT), **kw) -> Generation:
    return generate(model, FakeState(1), GenerationRequest(
        prompts=prompt, tokenizer=TOK, stop_ids=stop_ids, max_new_tokens=max_new_tokens, **kw))


def greedy_chain(model: TableModel, last: int, n: int, penalty: float = 0.0) -> list[int]:
    out, seen = [], torch.zeros(VOCAB)
    for _ in range(n):
        last = int((model.table[last] - penalty * seen).argmax())
        seen[last] = 1.0
        out.append(last)
    return out


PROMPT = [ord(c) for c in "Hi!"]


@pytest.mark.parametrize("overlap", [False, True])
def test_greedy_follows_the_argmax_chain(overlap):
    model = TableModel()
    gen = run(model, PROMPT, max_new_tokens=12, overlap=overlap)
    assert gen.token_ids == greedy_chain(model, PROMPT[-1], 12)
    assert gen.stop_reason == "length"
    assert gen.text == bytes(gen.token_ids).decode()
    assert model.prefills == 1
    assert model.decodes == 11  # no step after the last token


def test_greedy_token_is_argmax_with_the_first_of_tied_maxima():
    logits = torch.randn(4, 1000).to(torch.bfloat16)
    logits[1, [7, 500]] = 100.0  # a tie: the first wins, as with argmax
    assert torch.equal(greedy_token(logits), logits.argmax(dim=-1))
    assert greedy_token(logits)[1] == 7


@pytest.mark.parametrize("overlap", [False, True])
def test_stops_on_any_stop_id_which_is_left_out(overlap):
    model = TableModel()
    chain = greedy_chain(model, PROMPT[-1], 12)
    stop = chain[4]
    gen = run(model, PROMPT, stop_ids={999, stop}, overlap=overlap)
    assert gen.token_ids == chain[:chain.index(stop)]
    assert gen.stop_reason == "stop"
    assert chr(stop) not in gen.text


def test_max_new_tokens():
    one = run(TableModel(), PROMPT, max_new_tokens=1)
    assert one.token_ids == greedy_chain(TableModel(), PROMPT[-1], 1)
    gen = run(TableModel(), PROMPT, max_new_tokens=0)
    assert gen == Generation([], "", "length")


def test_first_logits_skips_the_prefill():
    model = TableModel()
    state = FakeState(1)
    logits = model.prefill(torch.tensor([PROMPT]), state)
    gen = generate(model, state, GenerationRequest(tokenizer=TOK, stop_ids={IM_END}, max_new_tokens=8, first_logits=logits[0]))
    assert model.prefills == 1
    assert gen.token_ids == greedy_chain(model, PROMPT[-1], 8)


def test_prompt_as_tensor():
    model = TableModel()
    assert run(model, torch.tensor(PROMPT)).token_ids == run(model, torch.tensor([PROMPT])).token_ids


@pytest.mark.parametrize("overlap", [False, True])
def test_seeded_sampling_is_reproducible(overlap):
    params = SamplingParams(temperature=1.0, top_k=20, top_p=0.9, seed=7)
    a = run(TableModel(), PROMPT, max_new_tokens=40, sampling=params, overlap=overlap)
    b = run(TableModel(), PROMPT, max_new_tokens=40, sampling=params, overlap=False)
    other = run(TableModel(), PROMPT, max_new_tokens=40,
                sampling=SamplingParams(temperature=1.0, top_k=20, top_p=0.9, seed=8))
    assert a.token_ids == b.token_ids
    assert a.token_ids != other.token_ids
    assert a.token_ids != run(TableModel(), PROMPT, max_new_tokens=40).token_ids  # not greedy


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0, top_k=1, seed=1),
    SamplingParams(temperature=5.0, top_k=1),
    SamplingParams(temperature=1.0, top_p=1e-6, seed=3),  # nucleus of one token
    SamplingParams(temperature=1.0, top_k=50, top_p=1e-6, seed=3),
])
def test_degenerate_sampling_equals_greedy(params):
    greedy = run(TableModel(), PROMPT, max_new_tokens=30).token_ids
    assert run(TableModel(), PROMPT, max_new_tokens=30, sampling=params).token_ids == greedy


def test_sampling_stays_in_the_top_k():
    model = TableModel()
    state = FakeState(1)
    params = SamplingParams(temperature=10.0, top_k=3, seed=0)  # hot: all 3 get picked
    gen = generate(model, state, GenerationRequest(prompts=PROMPT, tokenizer=TOK, stop_ids=(), max_new_tokens=200, sampling=params))
    last = PROMPT[-1]
    for tid in gen.token_ids:
        assert tid in model.table[last].topk(3).indices.tolist()
        last = tid


def test_unfiltered_sampling_follows_the_distribution():
    # One step from the same logits many times: the frequencies approach softmax(logits / T).
    model = TableModel()
    logits = model.table[PROMPT[-1]]
    params = SamplingParams(temperature=2.0, seed=0)
    counts = torch.zeros(VOCAB)
    for _ in range(2000):
        gen = generate(model, FakeState(1), GenerationRequest(
            tokenizer=TOK, stop_ids=(), max_new_tokens=1, sampling=params, first_logits=logits))
        counts[gen.token_ids[0]] += 1
        params.seed += 1
    expected = torch.softmax(logits / 2.0, dim=-1)
    assert (counts / 2000 - expected).abs().max() < 0.04


def test_presence_penalty_is_additive_on_generated_tokens():
    model = TableModel()
    greedy = run(model, PROMPT, max_new_tokens=60).token_ids
    assert len(set(greedy)) < len(greedy)  # the plain chain falls into a cycle
    for penalty in (3.0, 100.0):  # (1.5 is less than the margin of a self-loop in the chain)
        gen = run(model, PROMPT, max_new_tokens=60, sampling=SamplingParams(presence_penalty=penalty))
        assert gen.token_ids == greedy_chain(model, PROMPT[-1], 60, penalty)
        assert gen.token_ids != greedy
    strong = run(model, PROMPT, max_new_tokens=60, sampling=SamplingParams(presence_penalty=100.0))
    assert len(set(strong.token_ids)) == 60  # nothing repeats while unseen tokens remain


def _prompts():
    return [[ord(c) for c in p] for p in ("Hi!", "Yo?", "abc", "xyz")]


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(presence_penalty=2.0)])
def test_batch_equals_one_by_one(overlap, sampling):
    prompts = _prompts()
    model = TableModel()
    chains = [run(model, p, max_new_tokens=25, sampling=sampling).token_ids for p in prompts]

    def own(row):  # tokens that only this row generates
        return [t for t in chains[row] if not any(t in c for i, c in enumerate(chains) if i != row)]

    # Stop ids that end rows 0 and 1 early, at different steps, and leave the others running.
    stops = {own(0)[1], own(1)[3]}
    singles = [run(model, p, max_new_tokens=25, stop_ids=stops, sampling=sampling) for p in prompts]
    assert [g.stop_reason for g in singles] == ["stop", "stop", "length", "length"]
    assert len(singles[0].token_ids) != len(singles[1].token_ids)
    batch = generate_batch(model, FakeState(len(prompts)), GenerationRequest(
        prompts=prompts, tokenizer=TOK, stop_ids=stops, max_new_tokens=25, sampling=sampling, overlap=overlap))
    assert batch == singles


def test_batch_streams_per_row_and_rejects_ragged_prompts():
    prompts = _prompts()
    streamed = {i: "" for i in range(len(prompts))}

    def on_text(row, text):
        streamed[row] += text

    batch = generate_batch(TableModel(), FakeState(4), GenerationRequest(
        prompts=prompts, tokenizer=TOK, stop_ids={IM_END}, max_new_tokens=10, on_text=on_text))
    assert [streamed[i] for i in range(4)] == [g.text for g in batch]
    with pytest.raises(ValueError, match="different lengths"):
        generate_batch(TableModel(), FakeState(2), GenerationRequest(prompts=[[1, 2], [3]], tokenizer=TOK, stop_ids=(), max_new_tokens=4))


@pytest.mark.parametrize("overlap", [False, True])
def test_streamed_text_equals_final_text(overlap):
    text = "héllo 世界 👨‍👩‍👧 ok"
    model = ScriptModel(list(text.encode()))
    pieces = []
    gen = run(model, PROMPT, max_new_tokens=100, on_text=lambda _row, piece: pieces.append(piece), overlap=overlap)
    assert gen.stop_reason == "stop"
    assert gen.text == text
    assert "".join(pieces) == text
    assert len(pieces) > 5 and not any("\ufffd" in p for p in pieces)


def test_bfloat16_logits():
    model = TableModel()
    model.table = model.table.to(torch.bfloat16)
    greedy = run(model, PROMPT, max_new_tokens=10)
    assert greedy.token_ids == greedy_chain(model, PROMPT[-1], 10)
    sampled = run(model, PROMPT, max_new_tokens=10,
                  sampling=SamplingParams(temperature=0.7, top_p=0.9, presence_penalty=1.0, seed=0))
    assert len(sampled.token_ids) == 10


def test_invalid_sampling_params():
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValueError):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError):
        SamplingParams(top_k=-1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_overlap_matches_plain_loop():
    model = TableModel()
    model.table = model.table.cuda()
    cpu_greedy = run(TableModel(), PROMPT, max_new_tokens=30).token_ids

    def on_cuda(**kw):
        state = FakeState(1)
        state.last = state.last.cuda()
        return generate(model, state, GenerationRequest(prompts=PROMPT, tokenizer=TOK, stop_ids={IM_END}, max_new_tokens=30, **kw))

    assert on_cuda(overlap=True).token_ids == on_cuda(overlap=False).token_ids == cpu_greedy
    for params in (SamplingParams(temperature=1.0, seed=3),
                   SamplingParams(temperature=1.0, top_p=0.9, presence_penalty=1.0, seed=3)):
        assert (on_cuda(overlap=True, sampling=params).token_ids
                == on_cuda(overlap=False, sampling=params).token_ids)


def test_a_stop_text_ends_the_row_and_is_cut_off():
    """Chat models that end an answer with text (RWKV: "\\n\\nUser:") stop there, not at the budget."""
    script = list(b"Done.\n\nUser: and more text after the round opens")
    result = run(ScriptModel(script), [65], max_new_tokens=50, stop_texts=("\n\nUser:",))
    assert result.text == "Done."
    assert result.stop_reason == "stop"
    assert len(result.token_ids) < len(script)
