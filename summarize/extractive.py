"""Extractive summary: the most central sentences of the whole document, in document order."""

from __future__ import annotations

import math
import re
import warnings
from collections import Counter

from summarize.text import CJK_CHARS, count_words, sentence_spans

DAMPING = 0.85
MAX_ITERATIONS = 100
TOLERANCE = 1e-6  # L1 change of the scores; far below what reorders the ranking
POSITION_WEIGHT = 0.1  # bonus for the document's first sentence, falling linearly to 0 at the end
PARAGRAPH_LEAD_WEIGHT = 0.1  # bonus for the first sentence of a paragraph
# Cosine similarity above which a candidate repeats a chosen sentence. If the summary is
# still shorter than MIN_FILL of the budget, the next threshold is tried.
REDUNDANCY_THRESHOLDS = (0.5, 0.8, 0.999)
MIN_FILL = 0.6
MIN_WORDS = 4  # shorter sentences are headings, captions, page furniture
MIN_LETTER_RATIO = 0.5  # letters among non-space characters

_TERMINAL = re.compile(r"[.!?…。！？｡][\"'”’)\]»」』）]*$")
_TERM = re.compile(f"[{CJK_CHARS}]+|[^\\W\\d_{CJK_CHARS}]+")
_CJK_CHAR = re.compile(f"[{CJK_CHARS}]")
_CJK_EDGE = re.compile(f"[{CJK_CHARS}\u3000-\u303f\uff01-\uff65]")
_NON_LETTER = re.compile(r"[\W\d_]")
_BULLET = re.compile(r"^(?:[-*•‣◦▪]|#{1,6}) ")
_QUOTES = "\"'“”‘’"

STOPWORDS = frozenset(
    """a about above after again against all also am an and any are as at be because been
    before being below between both but by can could did do does doing down during each few
    for from further had has have having he her here hers herself him himself his how i if in
    into is it its itself just me more most my myself no nor not now of off on once only or
    other our ours ourselves out over own same she should so some such than that the their
    theirs them themselves then there these they this those through to too under until up very
    was we were what when where which while who whom why will with would you your yours
    yourself yourselves""".split()
)


def extractive_summary(text: str, max_words: int) -> str:
    """A summary of at most ``max_words`` words made of whole sentences of ``text``.

    A document of at most ``max_words`` words comes back whole (whitespace normalised).
    Otherwise the best-ranked sentences that fit are chosen, greedily, until the budget is
    used (at least ``MIN_FILL`` of it when the sentences allow), and printed in document
    order. Returns "" when no sentence fits in ``max_words``: the caller decides what that
    means (the CLI reports an error). Deterministic.

    Sentences become TF-IDF vectors (words for alphabetic scripts, characters and character
    bigrams for CJK). Centrality is continuous LexRank: PageRank over the cosine-similarity graph
    W = X·Xᵀ − diag. W is never built; each power-iteration step multiplies by the sparse X twice,
    so the cost grows with the number of (sentence, term) pairs, not with sentences squared.
    A mild prior favours early sentences and paragraph openers; a redundancy filter (MMR-style)
    skips sentences too similar to ones already chosen.
    """
    spans = sentence_spans(text)
    if not spans or max_words <= 0:
        return ""
    # Whitespace normalised, list bullets and heading marks dropped: the summary is prose.
    sentences = [_BULLET.sub("", " ".join(text[s:e].split())) for s, e in spans]
    words = [count_words(s) for s in sentences]
    if sum(words) <= max_words:
        return _join(sentences)

    leads = [i == 0 or text.count("\n", spans[i - 1][1], spans[i][0]) >= 2 for i in range(len(spans))]
    candidates = [i for i, s in enumerate(sentences) if not _is_junk(s, words[i])]
    vectors = _tfidf([sentences[i] for i in candidates])
    centrality = _lexrank(vectors)
    n = len(sentences)
    scores = [
        c * (1 + POSITION_WEIGHT * (1 - i / n) + PARAGRAPH_LEAD_WEIGHT * leads[i])
        for i, c in zip(candidates, centrality)
    ]
    # Rounded so that ties (repeated sentences) fall back to document order on every platform.
    ranked = sorted(range(len(candidates)), key=lambda k: (-round(scores[k], 9), candidates[k]))

    chosen = _select(ranked, vectors, [words[i] for i in candidates], max_words)
    picked = sorted(candidates[k] for k in chosen)
    if not picked:  # only junk fits: take the first such sentence
        picked = next(([i] for i in range(n) if words[i] <= max_words), [])
    return _join([sentences[i] for i in picked])


def _is_junk(sentence: str, words: int) -> bool:
    if words < MIN_WORDS or not _TERMINAL.search(sentence):
        return True
    letters = len(sentence) - len(_NON_LETTER.findall(sentence))
    return letters < MIN_LETTER_RATIO * (len(sentence) - sentence.count(" "))


def _terms(sentence: str) -> list[str]:
    terms = []
    for run in _TERM.findall(sentence.lower()):
        if _CJK_CHAR.match(run):
            terms.extend(run)
            terms.extend(run[k : k + 2] for k in range(len(run) - 1))
        elif len(run) > 1 and run not in STOPWORDS:
            # Plural folding is all the stemming a similarity graph needs.
            plural = len(run) > 3 and run.endswith("s") and not run.endswith("ss")
            terms.append(run[:-1] if plural else run)
    return terms


def _tfidf(sentences: list[str]) -> list[dict[str, float]]:
    """Unit-length TF-IDF vectors (sublinear tf, smoothed idf); empty dict for no terms."""
    counts = [Counter(_terms(s)) for s in sentences]
    df = Counter(t for c in counts for t in c)
    n = len(sentences)
    idf = {t: math.log((1 + n) / (1 + d)) + 1 for t, d in df.items()}
    vectors = []
    for c in counts:
        v = {t: (1 + math.log(k)) * idf[t] for t, k in c.items()}
        norm = math.sqrt(sum(w * w for w in v.values()))
        vectors.append({t: w / norm for t, w in v.items()} if norm else {})
    return vectors


def _lexrank(vectors: list[dict[str, float]]) -> list[float]:
    """PageRank scores (mean 1) on the graph of cosine similarities between ``vectors``."""
    import torch  # a runtime dependency; imported here so that `summarize.text` users don't pay for it

    n = len(vectors)
    if n == 0:
        return []
    # Matrix-vector products this small gain nothing from threads, and OpenMP workers waiting
    # on a busy machine made them up to 50x slower: run single-threaded, then restore.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _power_iteration(torch, vectors)
    finally:
        torch.set_num_threads(threads)


def _power_iteration(torch, vectors: list[dict[str, float]]) -> list[float]:
    n = len(vectors)
    x, xt = _sparse_matrices(torch, vectors)
    self_similarity = torch.tensor([1.0 if v else 0.0 for v in vectors], dtype=torch.float64)

    def similarity_times(q: torch.Tensor) -> torch.Tensor:  # W·q with W = X·Xᵀ − diag(X·Xᵀ)
        return x @ (xt @ q) - self_similarity * q

    degree = similarity_times(torch.ones(n, dtype=torch.float64))
    inverse_degree = torch.where(degree > 1e-12, 1 / degree.clamp_min(1e-12), torch.zeros_like(degree))
    p = torch.full((n,), 1 / n, dtype=torch.float64)
    for _ in range(MAX_ITERATIONS):
        nxt = (1 - DAMPING) / n + DAMPING * similarity_times(p * inverse_degree)
        nxt /= nxt.sum()  # isolated sentences leak mass; put it back evenly
        done = float((nxt - p).abs().sum()) < TOLERANCE
        p = nxt
        if done:
            break
    return (p * n).tolist()


def _sparse_matrices(torch, vectors: list[dict[str, float]]):
    """X [sentences, terms] and Xᵀ as CSR float64 tensors, built without sorting X."""
    vocabulary: dict[str, int] = {}
    row_starts, cols, values = [0], [], []
    for v in vectors:
        for term, w in v.items():
            cols.append(vocabulary.setdefault(term, len(vocabulary)))
            values.append(w)
        row_starts.append(len(cols))
    n, n_terms = len(vectors), max(len(vocabulary), 1)
    crow = torch.tensor(row_starts, dtype=torch.int64)
    col = torch.tensor(cols, dtype=torch.int64)
    val = torch.tensor(values, dtype=torch.float64)
    row = torch.repeat_interleave(torch.arange(n), crow.diff())
    by_term = torch.sort(col, stable=True).indices
    term_starts = torch.zeros(n_terms + 1, dtype=torch.int64)
    term_starts[1:] = torch.cumsum(torch.bincount(col, minlength=n_terms), 0)
    with warnings.catch_warnings():  # "sparse CSR support is in beta": matrix-vector is all we use
        warnings.simplefilter("ignore", UserWarning)
        x = torch.sparse_csr_tensor(crow, col, val, (n, n_terms))
        xt = torch.sparse_csr_tensor(term_starts, row[by_term], val[by_term], (n_terms, n))
    return x, xt


def _select(
    ranked: list[int], vectors: list[dict[str, float]], words: list[int], budget: int
) -> list[int]:
    """Greedy fill in rank order, skipping what does not fit or repeats a chosen sentence."""
    chosen: list[int] = []
    chosen_set: set[int] = set()
    postings: dict[str, list[tuple[int, float]]] = {}  # term -> (chosen slot, weight)
    used = 0
    for threshold in REDUNDANCY_THRESHOLDS:
        for k in ranked:
            if k in chosen_set or used + words[k] > budget:
                continue
            overlap = Counter()
            for term, w in vectors[k].items():
                for slot, w2 in postings.get(term, ()):
                    overlap[slot] += w * w2
            if overlap and max(overlap.values()) > threshold:
                continue
            for term, w in vectors[k].items():
                postings.setdefault(term, []).append((len(chosen), w))
            chosen.append(k)
            chosen_set.add(k)
            used += words[k]
        if used >= MIN_FILL * budget:
            break
    return chosen


def _join(sentences: list[str]) -> str:
    """Join with spaces, except between two CJK sentences (CJK text has no spaces)."""
    out = sentences[:1]
    for prev, cur in zip(sentences, sentences[1:]):
        left, right = prev.rstrip(_QUOTES), cur.lstrip(_QUOTES)
        cjk = left and right and _CJK_EDGE.match(left[-1]) and _CJK_EDGE.match(right[0])
        out.append(cur if cjk else " " + cur)
    return "".join(out)
