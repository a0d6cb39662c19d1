"""Drafts from a checkpoint's multi-token-prediction head (Qwen3.5's mtp.*).

The reference is the head built of transformers' own Qwen3.5 layers (decoder layer, RMSNorm,
rotary embedding) with the same random weights, run over the whole span without a cache; the
model's final-normed hidden states come from transformers' model. Tolerance: fp32 logits within
1e-4 of the largest.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from summarize.engine import load_model
from summarize.engine.generation.drafter import Drafter, DraftMemory
from summarize.engine.generation.drafts import PromptLookups
from summarize.engine.generation.generate import GenerationRequest, Speculation, generate_batch
from summarize.engine.generation.mtp_drafts import HeadCache, MTPDrafts
from summarize.engine.generation.sequences import Sequences
from test_generate import TOK
from tiny_models import dense_reference, moe_reference, mtp_reference, save_checkpoint

REL_TOL = 1e-4
VOCAB = 384


@pytest.fixture(scope="module", params=["dense", "moe"])
def family(request, tmp_path_factory):
    reference = (dense_reference if request.param == "dense" else moe_reference)()
    folder = save_checkpoint(reference, tmp_path_factory.mktemp(request.param))
    head, tensors = mtp_reference(reference)
    save_file(tensors, str(folder / "model-mtp.safetensors"))
    model = load_model(str(folder), device="cpu", dtype=torch.float32, compile=False)
    return reference, head, model


@torch.no_grad()
def reference_head(reference, head, following: torch.Tensor, hidden: torch.Tensor, start: int) -> torch.Tensor:
    """transformers' layers: the head over positions start.. (no cache) → its normed output."""
    x = head.fc(torch.cat([head.pre_fc_norm_embedding(reference.model.embed_tokens(following)),
                           head.pre_fc_norm_hidden(hidden)], dim=-1))
    T = x.shape[1]
    positions = torch.arange(start, start + T)[None]
    rotary = reference.model.rotary_emb(x, positions[None].expand(3, 1, T))
    mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
    out = head.layers[0](x, position_embeddings=rotary, attention_mask=mask, position_ids=positions)
    return head.norm(out[0] if isinstance(out, tuple) else out)


def with_head(model, batch: int) -> Sequences:
    """A new state with the head's cache beside it, as `--drafts mtp` makes them."""
    return Sequences(model.new_state(batch), HeadCache.new(model, batch))


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    err = (got - want).abs().max().item()
    assert err <= REL_TOL * want.abs().max().item(), f"max |diff| {err:.3g}"


def test_a_checkpoint_with_a_head_loads_it_and_one_without_does_not(family, tmp_path):
    _, _, model = family
    assert model.mtp is not None
    assert load_model(str(save_checkpoint(dense_reference(), tmp_path / "plain")), device="cpu", dtype=torch.float32).mtp is None


def test_the_head_reads_a_span_as_transformers_layers_do(family):
    reference, head, model = family
    ids = torch.randint(0, VOCAB, (1, 21), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        target = reference.model(ids[:, :-1]).last_hidden_state  # final-normed
        want = reference.lm_head(reference_head(reference, head, ids[:, 1:], target, start=0))
        state = model.new_state(1)
        model.prefill(ids[:, :-1], state)
        assert_close(model.mtp.target_hidden(state.last_hidden), target)
        cache = model.mtp.new_state(1, torch.float32, torch.device("cpu"))
        out = model.mtp(model.embed(ids[:, 1:]), model.mtp.target_hidden(state.last_hidden), cache, model.span_context(cache, 20))
        assert_close(model.lm_head(out), want)


@pytest.mark.parametrize("vocabulary", [None, "prompt"])
def test_drafts_are_the_heads_guesses_each_fed_back_with_its_own_output(family, vocabulary):
    """Beside a state without the head's cache (one loaded from the read cache, say), the head
    starts at the prompt's last position; each further guess reads the one before and the head's
    own output. Read for the prompt's tokens only, it guesses among them."""
    reference, head, model = family
    prompt = torch.randint(0, VOCAB, (1, 13), generator=torch.Generator().manual_seed(2))
    state = model.new_state(1)
    first = model.prefill(prompt, state).argmax(dim=-1)
    allowed = sorted(set(prompt[0].tolist())) if vocabulary else list(range(VOCAB))
    drafts = MTPDrafts(model, state, allowed if vocabulary else None)
    drafts.start(first)
    got = drafts.propose(4)[0]

    with torch.no_grad():
        following, hidden = first[None], reference.model(prompt).last_hidden_state[:, -1:]
        want = []
        for _ in range(4):
            out = reference_head(reference, head, following, hidden, start=12)
            logits = reference.lm_head(out[:, -1])[0, allowed]
            want.append(allowed[int(logits.argmax())])
            following = torch.cat([following, torch.tensor([[want[-1]]])], dim=1)
            hidden = torch.cat([hidden, out[:, -1:]], dim=1)
    assert got == want
    assert drafts.state.position == 13 and drafts.state.kv_tokens == 1  # the guesses were discarded


def head_guesses(reference, head, prompt: torch.Tensor, first: int, count: int) -> list[int]:
    """transformers' layers: the head over every position of the prompt (each hidden state with the
    token after it, the last with `first`), then `count` guesses each fed back with its output."""
    with torch.no_grad():
        hidden = reference.model(prompt).last_hidden_state
        following = torch.cat([prompt[:, 1:], torch.tensor([[first]])], dim=1)
        guesses = []
        for _ in range(count):
            out = reference_head(reference, head, following, hidden, start=0)
            guesses.append(int(reference.lm_head(out[:, -1]).argmax()))
            following = torch.cat([following, torch.tensor([[guesses[-1]]])], dim=1)
            hidden = torch.cat([hidden, out[:, -1:]], dim=1)
    return guesses


@pytest.fixture
def short_blocks(family):
    """The model prefills in blocks of 5 tokens, so a prompt spans several."""
    model = family[2]
    model.prefill_block_tokens = 5
    yield
    del model.prefill_block_tokens


def test_the_head_reads_the_prompt_as_the_model_does_one_position_behind(family, short_blocks):
    """A state made for drafting with the head carries its cache: the prefill, block by block, has
    the head read each position whose next token it knows, so the drafts are those of the head run
    over the whole prompt."""
    reference, head, model = family
    prompt = torch.randint(0, VOCAB, (1, 13), generator=torch.Generator().manual_seed(7))
    rows = with_head(model, 1)
    first = rows.prefill(model, prompt).argmax(dim=-1)
    assert rows.memory.state.position == 12 and rows.memory.state.kv_tokens == 12  # the last waits for `first`
    drafts = MTPDrafts(model, rows.state, cache=rows.memory)
    drafts.start(first)
    assert drafts.propose(4)[0] == head_guesses(reference, head, prompt, int(first), 4)
    assert drafts.state is rows.memory.state and drafts.state.kv_tokens == 13


def test_a_snapshot_of_the_instruction_brings_the_heads_cache_back_and_rows_stack(family, short_blocks):
    """As `summarize` reads chunks: the instruction once, its snapshot restored before each chunk,
    the chunks' states stacked into one batch. Each row drafts as after one prefill of its prompt."""
    reference, head, model = family
    gen = torch.Generator().manual_seed(8)
    instruction = torch.randint(0, VOCAB, (1, 7), generator=gen)
    chunks = [torch.randint(0, VOCAB, (1, n), generator=gen) for n in (9, 4)]
    prefix = with_head(model, 1)
    prefix.prefill(model, instruction)
    snapshot = prefix.snapshot()
    states, firsts = [], []
    for chunk in chunks:
        state = with_head(model, 1)
        state.restore(snapshot)
        firsts.append(state.prefill(model, chunk).argmax(dim=-1))
        states.append(state)
    batch = Sequences.stack(states)
    drafts = MTPDrafts(model, batch.state, cache=batch.memory)
    drafts.start(torch.cat(firsts))
    got = drafts.propose(3)
    for row, (chunk, first) in enumerate(zip(chunks, firsts)):
        assert got[row] == head_guesses(reference, head, torch.cat([instruction, chunk], dim=1), int(first), 3)


def test_a_state_that_read_without_the_head_drops_its_cache(family):
    _, _, model = family
    prompt = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(9))
    plain = model.new_state(1)
    model.prefill(prompt, plain)
    state = with_head(model, 1)
    state.restore(Sequences(plain).snapshot())  # the head has not read these positions
    assert state.memory is None
    state.prefill(model, prompt)  # nothing for the head to keep in step with
    assert state.memory is None
    state = with_head(model, 1)
    state.state.restore(plain.snapshot())  # the model's state alone: the head is out of step
    state.prefill(model, prompt)
    assert state.memory is None


@pytest.mark.parametrize("cache", ["with the head's cache", "without"])
def test_greedy_output_is_the_same_with_drafts_from_the_head(family, cache):
    """Token for token. (Sampled, a draft is the head's single guess, kept when the model's own
    sample equals it: the rule test_speculative checks for keeping the distribution.)"""
    _, _, model = family
    prompts = torch.randint(0, VOCAB, (3, 9), generator=torch.Generator().manual_seed(3))

    def run(state, **speculation):
        return generate_batch(model, state, GenerationRequest(prompts=prompts, tokenizer=TOK, stop_ids=[], max_new_tokens=30, **speculation))

    plain = run(model.new_state(3))
    state = with_head(model, 3) if cache != "without" else model.new_state(3)
    drafted = run(state, speculation=Speculation(4, mtp=True, costs=free_verify()))
    assert [g.token_ids for g in drafted] == [g.token_ids for g in plain]
    assert all(g.draft_tokens > 0 for g in drafted)


class KnownAnswers(MTPDrafts):
    """The head reads what lands as it always does, but its guesses are a known answer's tokens,
    with every `wrong`-th one changed: a random head is never right, and rows should keep drafts,
    different lengths of them."""

    def __init__(self, model, state, answers: list[list[int]], wrong: list[int]) -> None:
        super().__init__(model, state)
        self.answers, self.wrong, self.known = answers, wrong, [0] * len(answers)

    def landed(self, hidden, following, counts):
        super().landed(hidden, following, counts)
        self.known = [k + n for k, n in zip(self.known, counts.tolist())]

    def propose(self, most, running=None):
        guesses = super().propose(most, running)
        out = []
        for row, (answer, k) in enumerate(zip(self.answers, self.known)):
            draft = list(answer[k : k + len(guesses[row])])
            for i in range(len(draft)):
                if (k + i) % self.wrong[row] == 0:
                    draft[i] = (draft[i] + 1) % VOCAB
            out.append(draft)
        return out


@pytest.mark.parametrize("rows", [1, 3])
def test_the_heads_cache_holds_what_the_model_kept_whatever_lengths_rows_keep(family, rows):
    """After drafts kept in pieces of different lengths, the head's cache is what reading the
    model's final hidden states in one span gives, position by position; and the output is the
    plain one."""
    _, _, model = family
    prompts = torch.randint(0, VOCAB, (rows, 9), generator=torch.Generator().manual_seed(4))
    plain = generate_batch(model, model.new_state(rows), GenerationRequest(prompts=prompts, tokenizer=TOK, stop_ids=[], max_new_tokens=30))
    state = model.new_state(rows)
    first = model.prefill(prompts, state)
    drafts = KnownAnswers(model, state, [g.token_ids for g in plain], wrong=[4, 3, 6][:rows])
    drafted = generate_batch(model, state, GenerationRequest(
        tokenizer=TOK, stop_ids=[], max_new_tokens=30, first_logits=first,
        speculation=Speculation(most=4, drafter=drafts, costs=free_verify(rows))))
    assert [g.token_ids for g in drafted] == [g.token_ids for g in plain]
    assert all(g.accepted_tokens > 5 for g in drafted) and len({g.accepted_tokens for g in drafted}) == min(rows, 2)

    for row in range(rows):
        sequence = torch.cat([prompts[row], torch.tensor(plain[row].token_ids)])[None]
        whole = model.new_state(1)
        model.prefill(sequence, whole)
        cache = model.mtp.new_state(1, torch.float32, torch.device("cpu"))
        cache.position = 8  # the prompt's last position
        span = sequence.shape[1] - 9
        model.mtp(model.embed(sequence[:, 9:]), model.mtp.target_hidden(whole.last_hidden[:, 8:-1]), cache,
                  model.span_context(cache, span))
        kv = drafts.state.layers[0]
        kept = ~kv.hidden_keys[row] if kv.hidden_keys is not None else torch.ones(kv.length, dtype=torch.bool)
        got = kv.keys[row, :, : kv.length][:, kept][:, :span]  # a row that stopped early runs on
        assert got.shape[1] >= span - 5  # all but the last landing, which no draft read
        assert_close(got, cache.layers[0].keys[0, :, : got.shape[1]])


def free_verify(batch: int = 3):
    """The planner told that verifying is free: it verifies every draft it is given."""
    from test_speculative import FixedCosts

    return FixedCosts(batch, 0.0)


def test_both_drafters_and_the_heads_cache_answer_their_contracts(family):
    from test_layer_state import misses

    _, _, model = family
    drafters = [PromptLookups.over([[1, 2, 3]]), MTPDrafts(model, model.new_state(1))]
    for drafter in drafters:
        assert isinstance(drafter, Drafter) and misses(type(drafter), drafter, Drafter) == []
    cache = HeadCache.new(model, 1)
    assert isinstance(cache, DraftMemory) and misses(HeadCache, cache, DraftMemory) == []


def test_where_drafting_does_not_pay_the_head_guesses_nothing_but_keeps_its_cache_in_step(family):
    """The planner decides first: with verifying as dear as decoding it drafts nothing, and the
    head then only reads what each step landed (one position a step), so a text with nothing to
    gain costs little more than the head's one layer."""
    from test_speculative import FixedCosts

    _, _, model = family
    prompt = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(6))
    state = model.new_state(1)
    first = model.prefill(prompt, state)
    drafts = MTPDrafts(model, state)
    guesses = []
    real_propose = drafts.propose
    drafts.propose = lambda most, running: guesses.append(most) or real_propose(most, running)
    out = generate_batch(model, state, GenerationRequest(
        tokenizer=TOK, stop_ids=[], max_new_tokens=20, first_logits=first,
        speculation=Speculation(most=4, drafter=drafts, costs=FixedCosts(1, 1.0))))[0]
    assert out.draft_tokens == 0 and set(guesses) == {0}
    assert drafts.state.position == state.position - 1 and drafts.state.kv_tokens == 19  # all but the last step's
