"""Speculative decoding on the 0.8B shape: what verifying drafts costs, what landing the state
costs, and what tokens/s it gives at a known share of drafts kept.

    python bench/bench_speculative.py --folder /tmp/qwen3.5-0.8B-random    # bf16, about 15 minutes
    python bench/bench_speculative.py --folder /tmp/qwen3.5-0.8B-random --quick   # under 10 minutes
    python bench/bench_speculative.py --tiny                                  # self-test, < 1 min

Prints one markdown table (stdout; progress on stderr) and, last, the line
`speculative: verify8 X.XXx a step, 0% X.XXx, 50% X.XXx, 70% X.XXx plain decode` (the shares as
`summarize` plans its drafts).

Method
- The model loads as `summarize` loads it (compiled steps for this size; here the verify graphs
  are built at the first verify pass, not after a few eager ones), in --dtype, with --threads
  threads; the prompt is --prompt random token ids, prefilled once per row.
- (i) Verify k: one `model.verify` of [last token, k drafts] followed by `model.accept` of all of
  them, against one `model.decode` step, at B = 1 and B = --batch. Calls alternate (step,
  verify, step, ...), --repeats pairs after a warm-up; the figure is the median of the ratios of
  the calls made back to back, so the machine's drifting speed cancels.
- (ii) Rollback: `model.accept` of the last token only (every draft rejected) after a verify of 8
  drafts: the time to land the state, against a decode step. Nothing is run again.
- (iii) Tokens/s at a share of drafts kept. Random weights copy nothing, so an oracle drafts:
  k = 8 tokens each step, of which the first j are the tokens the verify pass itself will choose
  and the rest wrong, j drawn as the floor or the ceiling of share·k so that j/k averages the
  share. It finds them with untimed verify passes over a copy of the state (about one pass per
  token generated; their time is taken out of the run's, not what they leave in the caches); at
  a step where none is to be right it runs none, and drafts the plain output's next token plus
  one. The oracle must ask the verify pass,
  not a plain run: in bf16 a verify pass sums a span in another order than the compiled
  one-token step, the logits round differently, and random weights' flat logits then let greedy
  decoding take another token now and then. Two ways: "always 8 drafts" tells the planner
  verifying is free, so every step verifies all 8 (the mechanism's own speed); "as summarize
  plans" lets `drafts.DraftPlanner` learn what verifying costs and how often drafts are kept, and
  draft only where it pays (what a user gets); what it learns stays from run to run, as in a
  session, after one untimed run to learn it. Each run generates --tokens greedy tokens from the
  same prompt; random weights never emit a stop token, so every run is exactly --tokens long.
  Plain and speculative runs alternate, --runs pairs per share; the figure is the median of the
  paired ratios of tokens/s. The table gives the share really kept and how many tokens the
  speculative output shares with the plain one before they first differ (all of them in fp32; in
  bf16, for the reason above, fewer). --quick runs the shares 0, 50 and 70% only, as summarize
  plans them only.
- (v) MTP drafts, where the checkpoint has an MTP head (bench/random_checkpoint.py writes one):
  what drafting k tokens costs against a decode step, alternating with the steps, median of
  --repeats, with the head read for the whole vocabulary and for the prompt's tokens only; and,
  from that and (i), the least per-token chance α of a draft being kept at which drafting pays.
  Random weights cannot say how often a real head's guesses are kept.
- (iv) Real drafts on a real text, beside llama.cpp's n-gram speculation (with
  --llama-speculative and --gguf: llama.cpp built beside us, bench/README.md has the recipe, and
  the same weights converted to GGUF). Both engines read the first TEXT_CHARS characters of the
  sample (about 520 tokens) and write --tokens greedy tokens, plain and speculative in turns,
  --runs pairs, the median of the paired ratios. Ours: prompt lookup from the text and the output
  (`summarize`'s drafter, up to DEFAULT_SPECULATE tokens) against --speculate 0, timed from the
  first token. llama.cpp: `llama-speculative-simple --spec-type ngram-simple` (its "decoded ...
  speed" line) against `llama-completion` on the same text (its eval line; speculative-simple
  refuses `--spec-type none`). Random weights write no text that repeats the prompt or itself,
  so this shows what each engine's speculation costs where it finds nothing to copy.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from summarize.engine import load_model  # noqa: E402
from summarize.engine.generation.drafts import DraftCosts, PromptLookups  # noqa: E402
from summarize.engine.generation.generate import GenerationRequest, Speculation, generate, generate_batch  # noqa: E402
from summarize.engine.loading import default_dtype  # noqa: E402
from summarize.engine.tokenizers.tokenizer import Tokenizer  # noqa: E402
from summarize.settings import DEFAULT_SPECULATE  # noqa: E402

VERIFY_DRAFTS = (1, 2, 4, 8)
SHARES = (0.0, 0.3, 0.5, 0.7, 0.9)
QUICK_SHARES = (0.0, 0.5, 0.7)  # those of the last line
ORACLE_DRAFTS = 8
SAMPLE_TEXT = ROOT / "samples" / "target-tier-policy.txt"
TEXT_CHARS = 2500  # of the sample, (iv)'s prompt: about 520 tokens


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def prompt_state(model, batch: int, prompt: torch.Tensor):
    state = model.new_state(batch)
    logits = model.prefill(prompt.expand(batch, -1).contiguous(), state)
    return state, logits.max(dim=-1).indices


def verify_costs(model, batch: int, prompt: torch.Tensor, repeats: int) -> dict:
    """Median ratio, verify k + accept all against one decode step; and the rollback's cost."""
    state, token = prompt_state(model, batch, prompt)
    vocab = model.cfg.vocab_size
    gen = torch.Generator().manual_seed(0)

    def step():
        model.decode(token, state)

    def verify(k: int, kept: int):
        def run():
            span = torch.randint(0, vocab, (batch, k + 1), generator=gen)
            model.verify(span, state)
            model.accept(state, torch.full((batch,), kept))
        return run

    result = {}
    for k in VERIFY_DRAFTS:
        run = verify(k, k + 1)
        step(), run()  # warm-up
        ratios = [timed(run) / timed(step) for _ in range(repeats)]
        result[k] = statistics.median(ratios)
    # the rollback: landing after the last token only, timed on its own
    span = torch.randint(0, vocab, (batch, 9), generator=gen)
    rollback, steps = [], []
    for _ in range(repeats):
        model.verify(span, state)
        rollback.append(timed(lambda: model.accept(state, torch.ones(batch, dtype=torch.long))))
        steps.append(timed(step))
    result["rollback"] = statistics.median(r / s for r, s in zip(rollback, steps))
    result["rollback_ms"] = statistics.median(rollback) * 1e3
    result["step_ms"] = statistics.median(steps) * 1e3
    return result


MTP_DRAFTS = (1, 2, 4)


def mtp_costs(model, prompt: torch.Tensor, repeats: int) -> dict:
    """What drafting k tokens from the MTP head costs against a decode step (B = 1): reading the
    position the step kept, then k guesses. With the full head, and read for the prompt's tokens
    only (`MTPDrafts`' vocabulary)."""
    from summarize.engine.generation.mtp_drafts import MTPDrafts

    state, token = prompt_state(model, 1, prompt)
    result = {}
    for label, vocabulary in (("full", None), ("prompt", prompt[0].tolist())):
        drafts = MTPDrafts(model, state, vocabulary)
        drafts.start(token)
        for k in MTP_DRAFTS:
            ratios = []
            for i in range(repeats + 1):  # the first pair warms up
                step = timed(lambda: model.decode(token, state))
                drafts.landed(state.last_hidden, token[:, None], torch.ones_like(token))
                if i:
                    ratios.append(timed(lambda: drafts.propose(k)) / step)
                else:
                    drafts.propose(k)
            result[label, k] = statistics.median(ratios)
    return result


def mtp_break_even(verify: dict, mtp: dict, label: str) -> tuple[float, int] | None:
    """The least chance α that a drafted token is kept at which drafting k from the head beats plain
    decoding (the planner's model: 1 + α + … + α^k tokens for a verify and the head's k guesses)."""
    for alpha in [i / 100 for i in range(100)]:
        for k in MTP_DRAFTS:
            if sum(alpha**i for i in range(k + 1)) / (verify[k] + mtp[label, k]) > 1:
                return alpha, k
    return None


class Oracle:
    """Drafts `k` tokens of which the first j are what the verify pass itself will choose and the
    rest are wrong, with j drawn so that j/k averages `share` (floor or ceil of share·k).

    The right tokens are found as the verify pass will see them: untimed verify passes of the same
    width over a copy of the state, one per right token plus one for the first wrong one, each
    revealing the pass's own greedy token at the next position. Verify passes are causal to the
    bit at a fixed width, so the timed pass keeps exactly those j (when the planner verifies fewer
    than k, the width differs and its rounding may differ: the "kept" column gives the real share).
    When j = 0 no pass is run: the first draft is the plain output's next token plus one
    (`reference`), which no pass chooses unless the outputs have parted (the "kept" column would
    show it). The untimed passes are taken out of the run's time, but not what they leave behind
    in the caches and the allocator; at 0% there are none.
    """

    def __init__(self, model, state, share: float, reference: list[int], k: int = ORACLE_DRAFTS, seed: int = 0) -> None:
        self.model, self.state, self.share, self.k = model, state, share, k
        self.reference = reference
        self.vocab = model.cfg.vocab_size
        self.rng = random.Random(seed)
        self.last: int | None = None
        self.generated = 0  # tokens appended so far
        self.seconds = 0.0  # spent finding drafts: not part of the timed run


    def append(self, token: int) -> None:
        self.last = token
        self.generated += 1

    def propose(self, length: int) -> list[int]:
        started = time.perf_counter()
        k = min(self.k, length)
        whole, part = divmod(self.share * k, 1)
        right = int(whole) + (self.rng.random() < part)
        if right == 0 and self.generated < len(self.reference):
            wrong = (self.reference[self.generated] + 1) % self.vocab
            self.seconds += time.perf_counter() - started
            return [wrong] * k
        saved = self.state.snapshot()
        draft: list[int] = []
        for position in range(min(right + 1, k)):
            scratch = self.model.new_state(1)
            scratch.restore(saved)
            span = [self.last, *draft, *[draft[-1] if draft else self.last] * (k - len(draft))]
            greedy = int(self.model.verify(torch.tensor([span]), scratch)[0, position].argmax())
            scratch.accept(torch.ones(1, dtype=torch.long))
            draft.append(greedy if position < right else (greedy + 1) % self.vocab)
        self.seconds += time.perf_counter() - started
        return draft + [draft[-1]] * (k - len(draft))  # past a wrong token nothing is kept


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many tokens two outputs share before they first differ."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


class FreeVerify(DraftCosts):
    """Tells the planner that verifying more drafts saves time (a negative cost per draft), so it
    verifies all k every step whatever it has learnt of the share kept: the mechanism's own speed."""

    def cost(self, batch: int, drafts: int) -> float:
        return 1.0 - 0.9 * drafts / ORACLE_DRAFTS


def throughput(model, tokenizer, prompt: torch.Tensor, tokens: int, runs: int, shares: tuple[float, ...],
               modes: tuple[str, ...] = ("forced", "planned")) -> dict:
    def run(share=None, costs=None):
        state = model.new_state(1)
        first = model.prefill(prompt, state)
        oracle = Oracle(model, state, share, reference.token_ids) if share is not None else None
        start = time.perf_counter()
        out = generate_batch(model, state, GenerationRequest(tokenizer=tokenizer, stop_ids=[], max_new_tokens=tokens, first_logits=first,
                             speculation=Speculation(ORACLE_DRAFTS, PromptLookups([oracle]), costs=costs) if oracle else None))[0]
        return out, len(out.token_ids) / (time.perf_counter() - start - (oracle.seconds if oracle else 0.0))

    reference, _ = run()  # warm-up, and the plain output to compare with
    result = {}
    for share in shares:
        row = {}
        for mode, costs in ((mode, FreeVerify() if mode == "forced" else DraftCosts()) for mode in modes):
            # as in a session, what the planner learnt stays: one run first, untimed, to learn it
            run(share, costs)
            ratios, kept, drafted, rates, same = [], [], [], [], []
            for _ in range(runs):
                plain, plain_rate = run()
                spec, spec_rate = run(share, costs)
                if plain.token_ids != reference.token_ids:
                    raise SystemExit("plain decoding is not repeatable: no output to compare with")
                same.append(common_prefix(spec.token_ids, plain.token_ids))
                ratios.append(spec_rate / plain_rate)
                kept.append(spec.accepted_tokens)
                drafted.append(spec.draft_tokens)
                rates.append((plain_rate, spec_rate))
            row[mode] = dict(ratio=statistics.median(ratios), kept=sum(kept) / max(sum(drafted), 1),
                             drafted=statistics.mean(drafted), plain=statistics.median(r[0] for r in rates),
                             spec=statistics.median(r[1] for r in rates), same=min(same))
            log(f"  share {share:.0%} {mode}: {row[mode]['ratio']:.2f}x plain "
                f"({row[mode]['plain']:.1f} -> {row[mode]['spec']:.1f} tok/s, {row[mode]['drafted']:.0f} drafted)")
        result[share] = row
    return result


def same_text_ours(model, tokenizer, text: str, tokens: int, runs: int) -> dict:
    """(iv), ours: prompt lookup against --speculate 0 on `text`, tok/s from the first token."""
    ids = tokenizer.encode(text)

    def run(speculate: int):
        state = model.new_state(1)
        first = model.prefill(torch.tensor([ids]), state)
        start = time.perf_counter()
        out = generate(model, state, GenerationRequest(
            tokenizer=tokenizer, stop_ids=[], max_new_tokens=tokens, first_logits=first, contexts=[ids],
            speculation=Speculation(most=speculate)))
        return out, len(out.token_ids) / (time.perf_counter() - start)

    run(DEFAULT_SPECULATE)  # warm-up
    pairs, drafted, kept = [], 0, 0
    for _ in range(runs):
        _, plain = run(0)
        spec, rate = run(DEFAULT_SPECULATE)
        pairs.append((plain, rate))
        drafted, kept = drafted + spec.draft_tokens, kept + spec.accepted_tokens
    return _paired(pairs, drafted, kept, runs) | {"prompt": len(ids)}


def same_text_llama(binary: str, gguf: str, text: str, tokens: int, runs: int, threads: int) -> dict:
    """(iv), llama.cpp: ngram-simple speculation against plain decoding of the same text."""
    bin_dir = Path(binary).parent
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as prompt_file:
        prompt_file.write(text)
        prompt_file.flush()
        common = ["-m", gguf, "-f", prompt_file.name, "-n", str(tokens), "-t", str(threads), "--temp", "0", "-c", "4096"]

        def plain() -> float:
            err = _run([str(bin_dir / "llama-completion"), *common, "-no-cnv", "--ignore-eos"])
            return float(_find(r":\s+eval time =.*?([\d.]+) tokens per second", err))  # not "prompt eval time"

        def speculative() -> tuple[float, int, int]:
            err = _run([binary, *common, "--spec-type", "ngram-simple"])
            return (float(_find(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s", err)),
                    int(_find(r"n_drafted\s*=\s*(\d+)", err)), int(_find(r"n_accept\s*=\s*(\d+)", err)))

        pairs, drafted, kept = [], 0, 0
        for _ in range(runs):
            rate_plain = plain()
            rate, d, k = speculative()
            pairs.append((rate_plain, rate))
            drafted, kept = drafted + d, kept + k
    return _paired(pairs, drafted, kept, runs)


def _paired(pairs: list[tuple[float, float]], drafted: int, kept: int, runs: int) -> dict:
    return dict(plain=statistics.median(p for p, _ in pairs), spec=statistics.median(s for _, s in pairs),
                ratio=statistics.median(s / p for p, s in pairs), drafted=drafted / runs, kept=kept / max(drafted, 1))


def _run(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, errors="replace")  # random weights write broken UTF-8
    if done.returncode != 0:
        raise SystemExit(f"{Path(command[0]).name} failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    return done.stderr


def _find(pattern: str, text: str) -> str:
    found = re.search(pattern, text)
    if found is None:
        raise SystemExit(f"llama.cpp's output has no line matching {pattern!r}")
    return found.group(1)


def build_tiny(folder: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_models import dense_reference, save_checkpoint

    return save_checkpoint(dense_reference(vocab_size=248320), folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folder", type=Path, help="a Qwen3.5 checkpoint (bench/random_checkpoint.py 0.8B FOLDER)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer repeats and tokens: under 10 minutes")
    parser.add_argument("--tiny", action="store_true", help="a tiny random model: checks the script, not speed")
    parser.add_argument("--llama-speculative", help="llama.cpp's llama-speculative-simple (llama-completion beside it): (iv)")
    parser.add_argument("--gguf", help="the same weights converted by llama.cpp's converter, for --llama-speculative")
    args = parser.parse_args()
    if bool(args.llama_speculative) != bool(args.gguf):
        parser.error("--llama-speculative and --gguf go together")
    shares = SHARES
    if args.quick:
        args.repeats, args.runs, args.tokens, shares = 5, 2, 64, QUICK_SHARES
    torch.set_num_threads(args.threads)
    scratch = tempfile.TemporaryDirectory()
    if args.tiny:
        args.folder, args.dtype, args.tokens, args.repeats, args.runs = build_tiny(Path(scratch.name) / "tiny"), "float32", 32, 3, 1
    if args.folder is None:
        parser.error("give --folder (bench/random_checkpoint.py 0.8B FOLDER writes one) or --tiny")
    log(f"loading {args.folder} ({args.dtype}, {args.threads} threads)")
    if args.dtype == "bfloat16" and default_dtype(torch.device("cpu")) != torch.bfloat16:
        log("note: this CPU has no bf16 instructions (torch widens bf16 in software); summarize runs fp32 here: --dtype float32")
    model = load_model(str(args.folder), device="cpu", dtype=getattr(torch, args.dtype))
    if model.compiled is not None:
        model.compiled.eager_verifies = 0  # the verify graphs from the first pass: it is their cost we measure
    tokenizer = Tokenizer.from_file(str(args.folder / "tokenizer.json")) if (args.folder / "tokenizer.json").is_file() else None
    if tokenizer is None:
        sys.path.insert(0, str(ROOT / "tests"))
        from test_generate import TOK as tokenizer
    vocab = model.cfg.vocab_size
    prompt = torch.randint(0, vocab, (1, args.prompt), generator=torch.Generator().manual_seed(1))

    costs = {}
    for batch in (1, args.batch):
        log(f"verify costs at B={batch}")
        costs[batch] = verify_costs(model, batch, prompt, args.repeats)
    mtp = None
    if model.mtp is not None:
        log("MTP drafting costs at B=1")
        mtp = mtp_costs(model, prompt, args.repeats)
    log("tokens/s at shares of drafts kept (B=1)")
    rates = throughput(model, tokenizer, prompt, args.tokens, args.runs, shares, ("planned",) if args.quick else ("forced", "planned"))
    text = SAMPLE_TEXT.read_text()[:TEXT_CHARS]
    log("(iv) real drafts on the sample's text")
    same_text = {"ours, prompt lookup": same_text_ours(model, tokenizer, text, args.tokens, args.runs)}
    if args.llama_speculative:
        same_text["llama.cpp, ngram-simple"] = same_text_llama(args.llama_speculative, args.gguf, text, args.tokens,
                                                               args.runs, args.threads)

    print(f"\n{args.folder.name}, {args.dtype}, {args.threads} threads, prompt {args.prompt} tokens, "
          f"{args.tokens} tokens per run, compiled: {model.compiled is not None}\n")
    print("| figure | B=1 | B=%d |" % args.batch)
    print("|---|---|---|")
    print(f"| one decode step, ms | {costs[1]['step_ms']:.1f} | {costs[args.batch]['step_ms']:.1f} |")
    for k in VERIFY_DRAFTS:
        print(f"| verify {k} + land, × a step | {costs[1][k]:.2f} | {costs[args.batch][k]:.2f} |")
    print(f"| rollback (land after 0 of 8 kept), × a step | {costs[1]['rollback']:.3f} | {costs[args.batch]['rollback']:.3f} |")
    print(f"| rollback, ms | {costs[1]['rollback_ms']:.2f} | {costs[args.batch]['rollback_ms']:.2f} |")
    if mtp is not None:
        for label, what in (("full", "the whole vocabulary"), ("prompt", "the prompt's tokens")):
            costs_k = ", ".join(f"{k}: {mtp[label, k]:.2f}" for k in MTP_DRAFTS)
            even = mtp_break_even(costs[1], mtp, label)
            pays = f"pays from α = {even[0]:.2f} per drafted token (k = {even[1]})" if even else "never pays"
            print(f"| MTP drafts read for {what}, k: × a step | {costs_k}; {pays} | – |")
    print("\n| drafts kept (oracle, k = 8) | plain tok/s | always 8 drafts: kept, tok/s, × plain | "
          "as `summarize` plans: drafted per run, tok/s, × plain | tokens equal to plain's (fewest) |")
    print("|---|---|---|---|---|")
    for share in shares:
        forced, planned = rates[share].get("forced"), rates[share]["planned"]
        same = min(row["same"] for row in rates[share].values())
        always = f"{forced['kept']:.0%}, {forced['spec']:.1f}, {forced['ratio']:.2f}" if forced else "– (--quick)"
        print(f"| {share:.0%} | {planned['plain']:.1f} | {always} | "
              f"{planned['drafted']:.0f}, {planned['spec']:.1f}, {planned['ratio']:.2f} | {same}/{args.tokens} |")
    prompt_tokens = same_text["ours, prompt lookup"]["prompt"]
    print(f"\n| (iv) real drafts, the sample's first {prompt_tokens} tokens | plain tok/s | drafted per run, kept | "
          "speculative tok/s | × plain |")
    print("|---|---|---|---|---|")
    for engine, row in same_text.items():
        print(f"| {engine} | {row['plain']:.1f} | {row['drafted']:.0f}, {row['kept']:.0%} | {row['spec']:.1f} | {row['ratio']:.2f} |")
    line = ", ".join(f"{share:.0%} {rates[share]['planned']['ratio']:.2f}x" for share in (0.0, 0.5, 0.7))
    print(f"\nspeculative: verify8 {costs[1][8]:.2f}x a step, {line} plain decode")


if __name__ == "__main__":
    main()
