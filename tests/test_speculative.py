"""Speculative decoding: a verified draft lands the state exactly where running the kept tokens one
by one would, and generation gives the same tokens (greedy) or the same distribution (sampled).

Tolerances: fp32 throughout; the verify tiers agree with the step-by-step oracle within 1e-5
(their sums run in another order), models' logits within 1e-4.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from summarize.engine import load_model
from summarize.engine.generation.drafts import PROBE_DRAFTS, REPROBE_STEPS, DraftCosts, DraftPlanner, PromptLookup
from summarize.engine.generation.generate import GenerationRequest, SamplingParams, Speculation, generate_batch
from summarize.engine.ops import machine
from summarize.engine.ops.gated_delta_rule import naive_recurrent_gated_delta_rule, verify_gated_delta_rule
from summarize.engine.ops.rwkv7_wkv import naive_recurrent_rwkv7, verify_rwkv7
from summarize.engine.state import KV_GROWTH_TOKENS
from test_generate import TOK
from tiny_models import RWKV_TINY, blinkdl_checkpoint, dense_reference, moe_reference, save_checkpoint

OP_TOL = 1e-5
LOGITS_TOL = 1e-4


# -- the ops' verify tier against the oracle ---------------------------------------------------


def delta_rule_inputs(B: int, T: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    Hk, H, K, V = 2, 4, 8, 6
    return dict(
        q=F.normalize(torch.randn(B, T, Hk, K, generator=g), dim=-1),
        k=F.normalize(torch.randn(B, T, Hk, K, generator=g), dim=-1),
        v=torch.randn(B, T, H, V, generator=g),
        g=-torch.rand(B, T, H, generator=g),
        beta=torch.rand(B, T, H, generator=g),
    ), torch.randn(B, H, K, V, generator=g)


def rwkv7_inputs(B: int, T: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    H, K = 2, 8
    kk = F.normalize(torch.randn(B, T, H, K, generator=g), dim=-1)
    return dict(
        r=torch.randn(B, T, H, K, generator=g),
        log_w=-math.exp(-0.5) * torch.rand(B, T, H, K, generator=g),
        k=0.3 * torch.randn(B, T, H, K, generator=g),
        v=torch.randn(B, T, H, K, generator=g),
        a=-kk,
        b=kk * torch.rand(B, T, H, K, generator=g),
    ), torch.randn(B, H, K, K, generator=g)


def grouped(x: dict) -> dict:
    """The delta rule's oracle takes k heads already repeated to the value heads."""
    groups = x["v"].shape[2] // x["k"].shape[2]
    return x | {name: x[name].repeat_interleave(groups, dim=2) for name in ("q", "k")}


@pytest.mark.parametrize("T", [1, 5, 9])
def test_a_verified_delta_rule_span_lands_on_every_prefix_as_the_oracle_does(T):
    x, state = delta_rule_inputs(3, T)
    before = state.clone()
    o, pending = verify_gated_delta_rule(**x, state=state)
    assert torch.equal(state, before)  # verifying reads the state only
    want_o, _ = naive_recurrent_gated_delta_rule(**grouped(x), initial_state=state)
    assert (o - want_o).abs().max() < OP_TOL
    for n in range(1, T + 1):
        landed = state.clone()
        pending.land(landed, torch.full((3,), n), with_stats=False)
        _, want = naive_recurrent_gated_delta_rule(**grouped({k: v[:, :n] for k, v in x.items()}), initial_state=state)
        assert (landed - want).abs().max() < OP_TOL


@pytest.mark.parametrize("T", [1, 5, 9])
def test_a_verified_rwkv7_span_lands_on_every_prefix_as_the_oracle_does(T):
    x, state = rwkv7_inputs(3, T)
    before = state.clone()
    o, pending = verify_rwkv7(**x, state=state)
    assert torch.equal(state, before)
    want_o, _ = naive_recurrent_rwkv7(**x, initial_state=state)
    assert (o - want_o).abs().max() < OP_TOL
    for n in range(1, T + 1):
        landed = state.clone()
        pending.land(landed, torch.full((3,), n), with_stats=False)
        _, want = naive_recurrent_rwkv7(**{k: v[:, :n] for k, v in x.items()}, initial_state=state)
        assert (landed - want).abs().max() < OP_TOL


@pytest.mark.parametrize("family", ["delta_rule", "rwkv7"])
def test_rows_land_on_their_own_prefixes_with_the_stats_of_their_kept_tokens(family):
    from summarize.engine.ops.gated_delta_rule import recurrent_step_gated_delta_rule
    from summarize.engine.ops.rwkv7_wkv import recurrent_step_rwkv7

    T, counts = 6, torch.tensor([1, 4, 6])
    if family == "delta_rule":
        x, state = delta_rule_inputs(3, T, seed=1)
        verify, step, per_token = verify_gated_delta_rule, recurrent_step_gated_delta_rule, grouped(x)
    else:
        x, state = rwkv7_inputs(3, T, seed=1)
        verify, step, per_token = verify_rwkv7, recurrent_step_rwkv7, x
    _, pending = verify(**x, state=state)
    landed = state.clone()
    stats = pending.land(landed, counts, with_stats=True)
    for row, n in enumerate(counts.tolist()):
        s = state[row : row + 1].clone()
        steps = [step(**{k: v[row : row + 1, t] for k, v in per_token.items()}, state=s, with_stats=True)[1] for t in range(n)]
        assert (landed[row] - s[0]).abs().max() < OP_TOL
        assert stats.state_norm[row] == pytest.approx(steps[-1].state_norm.item(), rel=1e-5)
        assert stats.gate_mean[row] == pytest.approx(sum(s.gate_mean.item() for s in steps) / n, rel=1e-5)
        assert stats.delta_norm[row] == pytest.approx(sum(s.delta_norm.item() for s in steps) / n, rel=1e-5)


# -- models: verify + accept against decoding the kept tokens one by one ------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("speculative")
    dense = str(save_checkpoint(dense_reference(), root / "dense"))
    with pytest.MonkeyPatch.context() as machine_where_copies_pay:  # an int4 copy writes (tests/test_int4_copy.py)
        machine_where_copies_pay.setattr(machine, "POLICY", replace(machine.POLICY, int4_copy_generates=1))
        copied = load_model(dense, device="cpu", dtype=torch.float32, quantize="auto")
    assert copied.int4_copy_bytes
    with pytest.MonkeyPatch.context() as reads_int8:  # and int8 reads (tests/test_calibration.py)
        reads_int8.setattr(machine, "POLICY", replace(machine.POLICY, int4_copy_generates=1, int8_activations=1))
        int8_and_copy = load_model(dense, device="cpu", dtype=torch.float32, quantize="auto")
    assert int8_and_copy.reads_int8 and int8_and_copy.int4_copy_bytes
    return {
        "dense": (load_model(dense, device="cpu", dtype=torch.float32), 384),
        "dense, int4 copy": (copied, 384),
        "dense, int8 past the copy's batch": (int8_and_copy, 384),
        "moe": (load_model(str(save_checkpoint(moe_reference(), root / "moe")), device="cpu", dtype=torch.float32), 384),
        "rwkv7": (load_model(str(blinkdl_checkpoint(root / "rwkv.pth", **RWKV_TINY)), device="cpu", dtype=torch.float32), 512),
    }


FAMILIES = ["dense", "moe", "rwkv7"]


@pytest.mark.parametrize("name", FAMILIES)
def test_rows_that_keep_different_lengths_continue_as_if_they_had_decoded_them(models, name):
    model, vocab = models[name]
    g = torch.Generator().manual_seed(1)
    prompt, span, counts = torch.randint(0, vocab, (3, 11), generator=g), torch.randint(0, vocab, (3, 6), generator=g), torch.tensor([1, 4, 6])
    after = torch.randint(0, vocab, (3, 2), generator=g)

    state = model.new_state(3)
    model.prefill(prompt, state)
    verified = model.verify(span, state)
    model.accept(state, counts)
    # two more rounds: a plain decode step over the hidden positions, then a second draft
    continued = [model.decode(after[:, 0], state), model.verify(after[:, 1:], state)[:, 0]]
    model.accept(state, torch.ones(3, dtype=torch.long))

    for row, n in enumerate(counts.tolist()):
        one = model.new_state(1)
        model.prefill(prompt[row : row + 1], one)
        stepped = torch.stack([model.decode(span[row : row + 1, t], one) for t in range(6)], dim=1)
        assert (verified[row] - stepped[0]).abs().max() < LOGITS_TOL
        one = model.new_state(1)
        model.prefill(torch.cat([prompt[row], span[row, :n]])[None], one)
        for t, logits in enumerate(continued):
            assert (logits[row] - model.decode(after[row : row + 1, t], one)[0]).abs().max() < LOGITS_TOL


@pytest.mark.parametrize("copy_up_to", [5, 2])  # 3 sequences: from the copy, or past its batch from int8 with x rounded
def test_a_batch_verifies_a_span_as_it_decodes_it_whichever_form_it_generates_from(models, copy_up_to, monkeypatch):
    """A generating batch reads one form in its decode steps and its verify spans: the int4 copy up to
    the policy's `int4_copy_max_batch` sequences, past it the int8 weights with x rounded to int8 too.
    A span's logits are the steps' to 2e-2 of the largest: both forms round x (to bf16 for the int4
    kernel, to int8 past it), and an x that the span's attention and the steps' put on either side
    of a step of that grid, a rounding-level difference, moves by the step (0.6% and 1.3% at most
    over 20 prompts on this tiny model)."""
    model, vocab = models["dense, int8 past the copy's batch"]
    monkeypatch.setattr(machine, "POLICY", replace(machine.POLICY, int4_copy_generates=1, int8_activations=1, int4_copy_max_batch=copy_up_to))
    g = torch.Generator().manual_seed(6)
    prompt, span = torch.randint(0, vocab, (3, 11), generator=g), torch.randint(0, vocab, (3, 6), generator=g)
    spanned, stepped = model.new_state(3), model.new_state(3)
    model.prefill(prompt, spanned)
    model.prefill(prompt, stepped)
    verified = model.verify(span, spanned)
    decoded = torch.stack([model.decode(span[:, t], stepped) for t in range(6)], dim=1)
    assert (verified - decoded).abs().max() <= 2e-2 * decoded.abs().max()
    model.accept(spanned, torch.full((3,), 6))
    assert (model.decode(span[:, -1], spanned) - model.decode(span[:, -1], stepped)).abs().max() <= 2e-2 * decoded.abs().max()


def noisy_copy(tokens: list[int], vocab: int, every: int, first: int) -> list[int]:
    """`tokens` with every `every`-th from `first` changed: drafts taken from it are kept only in part."""
    out = list(tokens)
    for i in range(first, len(out), every):
        out[i] = (out[i] + 1) % vocab
    return out


@pytest.mark.parametrize("name", [*FAMILIES, "dense, int4 copy"])  # the copy: decode and verify both read it
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(presence_penalty=1.5)], ids=["greedy", "greedy-penalty"])
def test_greedy_output_is_the_same_with_and_without_speculation(models, name, sampling):
    model, vocab = models[name]
    prompts = torch.randint(0, vocab, (3, 9), generator=torch.Generator().manual_seed(3))

    def run(speculate: int, contexts=None):
        return generate_batch(model, model.new_state(3), GenerationRequest(
            prompts=prompts, tokenizer=TOK, stop_ids=[], max_new_tokens=48, sampling=sampling, contexts=contexts,
            speculation=Speculation(most=speculate, costs=FixedCosts(3, 0.0))))

    plain = run(0)
    # drafts looked up in a damaged copy of the answer: each row keeps different lengths
    contexts = [prompts[row].tolist() + noisy_copy(gen.token_ids, vocab, 7 + row, 5 + 3 * row) for row, gen in enumerate(plain)]
    speculative = run(8, contexts)
    assert [g.token_ids for g in speculative] == [g.token_ids for g in plain]
    assert all(0 < g.accepted_tokens < g.draft_tokens for g in speculative)
    assert len({g.accepted_tokens for g in speculative}) > 1


def test_greedy_output_is_the_same_across_a_kv_cache_growth(models):
    model, vocab = models["dense"]
    prompt = torch.randint(0, vocab, (1, KV_GROWTH_TOKENS - 10), generator=torch.Generator().manual_seed(4))
    plain = generate_batch(model, model.new_state(1), GenerationRequest(prompts=prompt, tokenizer=TOK, stop_ids=[], max_new_tokens=40))[0]
    speculative = generate_batch(model, model.new_state(1), GenerationRequest(
        prompts=prompt, tokenizer=TOK, stop_ids=[], max_new_tokens=40, contexts=[prompt[0].tolist() + plain.token_ids],
        speculation=Speculation(most=8, costs=FixedCosts(1, 0.0))))[0]
    assert speculative.token_ids == plain.token_ids
    assert speculative.accepted_tokens > 20


def test_a_stop_token_inside_an_accepted_draft_ends_the_row_there(models):
    model, vocab = models["rwkv7"]
    prompt = torch.randint(0, vocab, (1, 9), generator=torch.Generator().manual_seed(5))
    plain = generate_batch(model, model.new_state(1), GenerationRequest(prompts=prompt, tokenizer=TOK, stop_ids=[], max_new_tokens=30))[0]
    stop = plain.token_ids[12]
    first = plain.token_ids.index(stop)
    want = generate_batch(model, model.new_state(1), GenerationRequest(prompts=prompt, tokenizer=TOK, stop_ids=[stop], max_new_tokens=30))[0]
    got = generate_batch(model, model.new_state(1), GenerationRequest(
        prompts=prompt, tokenizer=TOK, stop_ids=[stop], max_new_tokens=30, contexts=[prompt[0].tolist() + plain.token_ids],
        speculation=Speculation(most=8, costs=FixedCosts(1, 0.0))))[0]
    assert got.token_ids == want.token_ids == plain.token_ids[:first]
    assert got.stop_reason == "stop"


# -- sampling keeps its distribution -----------------------------------------------------------


class MarkovModel:
    """logits = table[last token] on a vocabulary of 4, with verify/accept: exact probabilities known."""

    def __init__(self) -> None:
        self.table = torch.tensor([[2.0, 0.5, -1.0, 0.0], [0.0, 1.5, 0.3, -0.5], [1.0, -1.0, 1.0, 0.2], [0.3, 0.3, 0.3, 1.2]])

    def new_state(self, batch: int):
        return {"last": torch.zeros(batch, dtype=torch.long)}

    def prefill(self, input_ids, state):
        state["last"] = input_ids[:, -1].clone()
        return self.table[state["last"]]

    def decode(self, token_ids, state):
        state["last"] = token_ids.clone()
        return self.table[token_ids]

    def verify(self, token_ids, state):
        state["span"] = token_ids
        return self.table[token_ids]

    def accept(self, state, counts, drafted=None):
        state["last"] = state["span"].gather(1, (counts - 1)[:, None])[:, 0]


def test_sampled_output_keeps_its_distribution():
    model, rows, steps = MarkovModel(), 20000, 3
    prompts = torch.zeros(rows, 1, dtype=torch.long)
    # drafts: prompt lookup in a context where every token is followed by 0, then 1: often right, often wrong
    contexts = [[0, 1, 0, 3, 0, 1, 2, 0, 0]] * rows
    sampling = SamplingParams(temperature=1.0, seed=7)
    out = generate_batch(model, model.new_state(rows), GenerationRequest(
        prompts=prompts, tokenizer=TOK, stop_ids=[], max_new_tokens=steps, sampling=sampling, contexts=contexts,
        speculation=Speculation(most=4, costs=FixedCosts(rows, 0.0))))
    assert sum(g.accepted_tokens for g in out) > rows // 2  # drafts were really kept
    probs = model.table.softmax(-1)
    expected = torch.zeros(4, 4, 4)
    for a in range(4):
        for b in range(4):
            for c in range(4):
                expected[a, b, c] = probs[0, a] * probs[a, b] * probs[b, c]
    counts = torch.zeros(4, 4, 4)
    for g in out:
        counts[tuple(g.token_ids)] += 1
    chi2 = ((counts - rows * expected) ** 2 / (rows * expected)).sum().item()
    assert chi2 < 120.0  # 63 degrees of freedom: the 0.999 quantile is about 103; seeded, so not flaky


# -- drafters ----------------------------------------------------------------------------------


def test_prompt_lookup_continues_the_latest_occurrence_of_the_longest_suffix():
    lookup = PromptLookup([5, 6, 7, 8, 1, 6, 7, 9, 2, 7, 4])
    for token in (6, 7):
        lookup.append(token)
    assert lookup.propose(3) == [9, 2, 7]  # "6 7" last seen before 9 (not before 8)
    lookup.append(3)
    assert lookup.propose(3) == []  # 3 never came before
    lookup.append(7)
    assert lookup.propose(2) == [3, 7]  # "3 7" unseen; the latest "7" before it was followed by 3
    assert lookup.propose(0) == []


def costs(batch: int, slope: float | None) -> DraftCosts:
    """Costs as if measured: a plain step of 10 ms, and verifying k drafts (1 + slope·k) steps."""
    known = DraftCosts()
    known.learn_step(batch, 0.010)
    if slope is not None:
        known.learn_verify(batch, 4, 0.010 * (1 + 4 * slope))
    return known


class FixedCosts(DraftCosts):
    """What verifying costs, fixed: generation's own timings are not learnt (tests stay deterministic)."""

    def __init__(self, batch: int, slope: float) -> None:
        super().__init__()
        self.step, self.fixed_slope = {batch: 1.0}, slope

    def cost(self, batch, drafts):
        return 1 + self.fixed_slope * drafts

    def learn_step(self, batch, seconds):
        pass

    def learn_verify(self, batch, drafts, seconds):
        pass


def test_the_planner_drafts_long_where_verifying_is_cheap_and_drafts_are_kept():
    planner = DraftPlanner(8, 1, costs(1, slope=0.03))
    for _ in range(5):
        planner.learn_row(0, 8, 8)
    assert planner.width([8], running=1) == 8
    assert planner.width([3], running=1) == 3  # no longer than the draft there is


def test_the_planner_stops_drafting_where_verifying_costs_what_decoding_does():
    planner = DraftPlanner(8, 1, costs(1, slope=1.0))
    for _ in range(20):
        planner.learn_row(0, 8, 8)  # even drafts that are always kept do not pay
    assert planner.width([8], running=1) == 0


def test_the_planner_stops_drafting_for_rows_whose_drafts_are_rejected():
    planner = DraftPlanner(8, 2, costs(2, slope=0.05))
    assert planner.width([8, 8], running=2) > 0
    for _ in range(10):
        planner.learn_row(0, 4, 0)
        planner.learn_row(1, 4, 0)
    assert planner.width([8, 8], running=2) == 0


def test_the_planner_probes_again_now_and_then_where_it_stopped_drafting():
    """A verify once timed slow stops drafting; a short probe every REPROBE_STEPS steps lets a
    faster time measured later start it again."""
    planner = DraftPlanner(8, 1, costs(1, slope=1.0))
    widths = [planner.width([8], running=1) for _ in range(2 * REPROBE_STEPS)]
    assert widths.count(0) == 2 * REPROBE_STEPS - 2
    assert [i for i, w in enumerate(widths) if w] == [REPROBE_STEPS - 1, 2 * REPROBE_STEPS - 1]
    assert max(widths) == PROBE_DRAFTS


def test_the_planner_times_a_plain_step_first_and_probes_short():
    unmeasured = DraftPlanner(8, 1)
    assert unmeasured.width([8], running=1) == 0
    probing = DraftPlanner(8, 1, costs(1, slope=None))
    assert 0 < probing.width([8], running=1) <= PROBE_DRAFTS


def test_verify_costs_are_learnt_per_width_and_read_off_the_line_between_them():
    known = DraftCosts()
    assert known.cost(1, 2) is None  # nothing timed yet
    known.learn_step(1, 0.100)
    known.learn_verify(1, 2, 0.110)  # two drafts: 1.1 steps
    assert known.cost(1, 2) == pytest.approx(1.1)
    assert known.cost(1, 1) == pytest.approx(1.05)  # between no drafts (1 step) and two
    assert known.cost(1, 8) == pytest.approx(1.4)  # past the widest: along the line to it
    known.learn_verify(1, 8, 0.200)
    assert known.cost(1, 8) == pytest.approx(2.0)
    assert known.cost(1, 5) == pytest.approx(1.55)  # between 2 and 8
    assert known.cost(2, 2) is None  # each batch size learns its own


def test_the_planner_drafts_short_where_only_a_few_rows_verify_cheaply():
    """A CPU whose GEMM reads up to three rows as fast as one: two drafts cost about a step, eight
    cost two. With drafts kept half the time two pay best; kept nearly always, eight do."""
    known = DraftCosts()
    known.learn_step(1, 0.100)
    known.learn_verify(1, 2, 0.105)
    known.learn_verify(1, 8, 0.200)
    sometimes, always = DraftPlanner(8, 1, known), DraftPlanner(8, 1, known)
    for _ in range(20):
        sometimes.learn_row(0, 2, 1)
        always.learn_row(0, 8, 8)
    assert sometimes.width([8], running=1) == 2
    assert always.width([8], running=1) == 8


def test_rows_without_a_draft_count_in_what_a_verify_pass_costs():
    # one row of eight could draft: its gain must pay for slowing all eight down
    alone, crowd = DraftPlanner(8, 1, costs(1, slope=0.2)), DraftPlanner(8, 8, costs(8, slope=0.2))
    assert alone.width([8], running=1) > 0
    assert crowd.width([8] + [0] * 7, running=8) == 0


def test_the_live_view_shows_the_share_of_drafts_kept():
    import io

    from rich.console import Console

    from summarize.engine.diagnostics import LayerReport, SpanReport
    from summarize.records import ModelProgress
    from summarize.ui.live_view import StateView

    view = StateView()
    view.set_phase(ModelProgress(input="doc.pdf", chunk=0, chunks=1, phase="decode"))
    layers = (LayerReport(0, "recurrent", state_norm=1.0, gate_mean=0.9, delta_norm=0.1),)
    view.update(SpanReport("decode", 0, 4, layers, 100, drafted=8))  # kept 3 of 8
    view.update(SpanReport("decode", 0, 2, layers, 100, drafted=2))  # kept 1 of 2
    view.update(SpanReport("decode", 0, 1, layers, 100))  # a plain step
    buffer = io.StringIO()
    Console(file=buffer, width=200).print(view)
    assert "drafts kept 40%" in buffer.getvalue()
