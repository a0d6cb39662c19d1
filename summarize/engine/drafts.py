"""Where drafted tokens come from, and how many to draft (docs/design.md §8).

`PromptLookup` drafts from the text itself: summaries copy phrases from what they summarize, so
the tokens that followed the latest earlier occurrence of the sequence's last few tokens are a
good guess at what comes next. `DraftLength` decides, per row, how many to propose: more while
drafts are taken whole, fewer when they are cut short, none for a while after a draft is
rejected outright (longer each time that repeats), so a text with nothing to copy costs almost
nothing extra.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_NGRAM = 3  # the longest n-gram looked up; shorter ones are tried when it is not found
FIRST_PAUSE = 4  # tokens without drafts after a draft that was wholly rejected ...
MOST_PAUSE = 64  # ... doubling while rejections repeat, up to this


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


class DraftLength:
    """How many tokens one row drafts next (0: none this step), from how its drafts fared."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.length = most
        self.paused = 0  # steps left without drafts
        self.pause = FIRST_PAUSE

    def next(self) -> int:
        if self.paused:
            self.paused -= 1
            return 0
        return self.length

    def update(self, proposed: int, accepted: int) -> None:
        if proposed == 0:
            return
        if accepted == proposed:
            self.length = min(self.most, self.length + 2)
        else:
            self.length = max(1, accepted + 1)
        if accepted == 0:
            self.paused, self.pause = self.pause, min(2 * self.pause, MOST_PAUSE)
        else:
            self.pause = FIRST_PAUSE
