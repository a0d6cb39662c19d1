"""Where drafted tokens come from, and how many to draft (docs/design.md §8).

`PromptLookup` drafts from the text itself: summaries copy phrases from what they summarize, so
the tokens that followed the latest earlier occurrence of the sequence's last few tokens are a
good guess at what comes next. `DraftPlanner` decides how many drafted tokens to verify each
step, from how often each row's drafts were kept and what verifying costs on this machine
(`DraftCosts`, measured as it runs): where verifying k tokens costs about k decode steps (a CPU
whose decode is already compute-bound) or where nothing is copied, it stops drafting, so
speculation costs almost nothing where it cannot pay.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from torch import Tensor

MAX_NGRAM = 3  # the longest n-gram looked up; shorter ones are tried when it is not found
GAIN_MARGIN = 0.05  # draft only where the expected tokens per unit of time beat plain decoding by this
PROBE_DRAFTS = 2  # the first verify at a batch size drafts at most this many: cheap where it does not pay
PRIOR_DRAFTS = 2.0  # how many drafts a new row's first guess at its α weighs
COST_WEIGHT = 0.3  # weight of the newest verify pass in a width's learnt cost
# After this many steps in a row without verifying while drafts were there, probe again: a verify
# once timed slow (the machine busy with something else) must not end speculation for good.
REPROBE_STEPS = 32


class PromptLookup:
    """Drafts for one sequence: the continuation of the latest earlier occurrence of its last
    n tokens (n = MAX_NGRAM down to 1) in `context` (the prompt's text) followed by what was
    generated. Each step costs a few dictionary lookups."""

    def __init__(self, context: Sequence[int] = ()) -> None:
        self.tokens: list[int] = []
        # n-gram → the position right after its latest occurrence that has a token after it
        self.follows: dict[tuple[int, ...], int] = {}
        for token in context:
            self.append(token)

    def append(self, token: int) -> None:
        end = len(self.tokens)  # the n-grams ending here now have a continuation: `token`
        for n in range(1, min(MAX_NGRAM, end) + 1):
            self.follows[tuple(self.tokens[end - n : end])] = end
        self.tokens.append(token)

    def propose(self, length: int) -> list[int]:
        """Up to `length` tokens that may come next; [] when nothing matches."""
        if length <= 0:
            return []
        for n in range(min(MAX_NGRAM, len(self.tokens)), 0, -1):
            start = self.follows.get(tuple(self.tokens[-n:]))
            if start is not None:
                return self.tokens[start : start + length]
        return []


class PromptLookups:
    """A `drafter.Drafter` for a batch: one `PromptLookup` per row (or any objects with its
    `append` and `propose`), each fed the tokens its row emits."""

    def __init__(self, lookups: Sequence) -> None:
        self.lookups = list(lookups)
        self.drafts: list[list[int]] = [[] for _ in self.lookups]  # what `available` found

    @classmethod
    def over(cls, contexts: Sequence[Sequence[int]]) -> PromptLookups:
        """Lookups in each row's context (the text it was given)."""
        return cls([PromptLookup(context) for context in contexts])

    def start(self, token: Tensor) -> None:
        for lookup, tid in zip(self.lookups, token.tolist()):
            lookup.append(tid)

    def available(self, most: int, running: Collection[int]) -> list[int]:
        self.drafts = [lookup.propose(most) if row in running else [] for row, lookup in enumerate(self.lookups)]
        return [len(draft) for draft in self.drafts]

    def propose(self, width: int, running: Collection[int]) -> list[list[int]]:
        return [draft[:width] if row in running else [] for row, draft in enumerate(self.drafts)]

    def landed(self, hidden: Tensor, following: Tensor, counts: Tensor) -> None:
        for lookup, tokens, n in zip(self.lookups, following.tolist(), counts.tolist()):
            for tid in tokens[:n]:
                lookup.append(tid)


class DraftCosts:
    """What verifying drafts costs on this machine, learnt from the calls themselves: per batch size,
    the wall time of a plain decode step, and for each number of drafts verified what the pass cost
    in steps. A width not yet verified is read off the line through the measured ones (through one
    step for no drafts; past the widest, along the line from there to the widest): verifying is
    not linear in the drafts where a CPU's GEMM reads a few rows as fast as one and more rows
    slower (docs/performance.md). Kept across generations."""

    def __init__(self) -> None:
        self.step: dict[int, float] = {}  # batch size -> fastest plain step seen, seconds
        self.verify: dict[int, dict[int, float]] = {}  # batch size -> drafts -> learnt cost, in steps
        self.kept = self.rejected = 1.0  # drafted tokens kept and drafts cut short, every row so far

    @property
    def kept_share(self) -> float:
        """The chance that a drafted token is kept, over all drafts so far: a new row's first guess."""
        return self.kept / (self.kept + self.rejected)

    def learn_step(self, batch: int, seconds: float) -> None:
        self.step[batch] = min(seconds, self.step.get(batch, seconds))

    def learn_verify(self, batch: int, drafts: int, seconds: float) -> None:
        step = self.step.get(batch)
        if step is None or drafts == 0:
            return
        seen = max(1.0, seconds / step)
        known = self.verify.setdefault(batch, {})
        old = known.get(drafts)
        known[drafts] = seen if old is None else (1 - COST_WEIGHT) * old + COST_WEIGHT * seen

    def cost(self, batch: int, drafts: int) -> float | None:
        """What verifying `drafts` drafts costs at this batch size, in plain steps; None before any
        verify pass has been timed there."""
        known = self.verify.get(batch)
        if not known:
            return None
        if drafts in known:
            return known[drafts]
        points = [(0, 1.0), *sorted(known.items())]
        for (w0, c0), (w1, c1) in zip(points, points[1:]):
            if w0 < drafts < w1:
                return c0 + (c1 - c0) * (drafts - w0) / (w1 - w0)
        widest, cost = points[-1]
        return 1.0 + (cost - 1.0) * drafts / widest


class DraftPlanner:
    """Decides, step by step, how many drafted tokens the rows of one generation verify together.

    Each row's chance that a drafted token is kept (α, counted over its own drafts from a prior
    worth PRIOR_DRAFTS drafts at the share kept so far by every row, `DraftCosts.kept_share`)
    gives the tokens a draft of k is expected to yield, 1 + α + … + α^k;
    `DraftCosts` gives what verifying k costs against a plain step. The planner drafts the k with
    the most tokens per unit of cost, and not at all when that beats plain decoding by less than
    GAIN_MARGIN: where verifying costs what decoding does (a compute-bound CPU), or where drafts
    are rarely kept, it stops drafting by itself. Before the first plain step has been timed it does
    not draft, and its first verify at a batch size drafts at most PROBE_DRAFTS, as does a verify
    after REPROBE_STEPS steps without one (about 1% of the steps where drafting does not pay).
    """

    def __init__(self, most: int, batch: int, costs: DraftCosts | None = None) -> None:
        self.most, self.batch = most, batch
        self.costs = costs or DraftCosts()
        share = self.costs.kept_share
        self.kept = [PRIOR_DRAFTS * share] * batch  # drafted tokens kept, per row
        self.rejected = [PRIOR_DRAFTS * (1 - share)] * batch  # drafts cut short, per row
        self.idle = 0  # steps in a row without a verify while drafts were there

    def width(self, available: list[int], running: int) -> int:
        """How many drafts to verify this step, given the length of the draft each row has (0: none,
        or the row has stopped) and how many rows run: a plain step gives each of them one token."""
        if not any(available) or self.batch not in self.costs.step:
            return 0
        measured = self.costs.cost(self.batch, 1) is not None
        most = min(self.most, max(available)) if measured else min(PROBE_DRAFTS, max(available))
        alphas = [k / (k + r) for k, r in zip(self.kept, self.rejected)]
        undrafted = running - sum(1 for n in available if n > 0)  # rows that get their one token either way
        best, best_rate = 0, running * (1 + GAIN_MARGIN)
        for width in range(1, most + 1):
            tokens = undrafted + sum(sum(a**i for i in range(min(width, n) + 1)) for a, n in zip(alphas, available) if n > 0)
            rate = tokens / (self.costs.cost(self.batch, width) or 1.0)
            if rate > best_rate:
                best, best_rate = width, rate
        self.idle = 0 if best else self.idle + 1
        if self.idle >= REPROBE_STEPS:
            self.idle = 0
            return min(PROBE_DRAFTS, max(available))
        return best

    def learn_row(self, row: int, drafted: int, kept: int) -> None:
        if drafted:
            self.kept[row] += kept
            self.rejected[row] += kept < drafted
            self.costs.kept += kept
            self.costs.rejected += kept < drafted
