"""Extractive summary: the most central sentences of the whole document, in document order."""

from __future__ import annotations

import math
import re
import warnings
from collections import Counter

from summarize.inputs.words import CJK_CHARS, count_words, sentence_spans, split_clauses

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
HEADING_MAX_WORDS = 12  # a line this short, without a sentence end, standing alone is a heading
# A run without sentence ends is cut into segments of at most this many words, or CJK
# characters in mostly CJK text (CJK counts a word a character); a "sentence" longer than
# RUN_FACTOR segments is such a run too, whatever its last character.
SEGMENT_WORDS = 40
SEGMENT_CJK = 80
RUN_FACTOR = 3
# A summary with at least this share of the document's words keeps its paragraph breaks.
NEARLY_WHOLE = 0.8
# Per term, the redundancy filter remembers the first POSTINGS_CAP chosen sentences that use it.
# Only budgets far beyond a summary's (hundreds of sentences sharing a term) reach the cap;
# scanning every chosen sentence made the selection quadratic (-n 100000 took two minutes).
POSTINGS_CAP = 64

_TERMINAL = re.compile(r"[.!?…。！？｡][\"'”’)\]»」』）]*$")
_TERM = re.compile(f"[{CJK_CHARS}]+|[^\\W\\d_{CJK_CHARS}]+")
_CJK_CHAR = re.compile(f"[{CJK_CHARS}]")
_CJK_EDGE = re.compile(f"[{CJK_CHARS}\u3000-\u303f\uff01-\uff65]")
_NON_LETTER = re.compile(r"[\W\d_]")
_BULLET = re.compile(r"^(?:[-*•‣◦▪]|#{1,6}) ")
_MARKDOWN_HEADING = re.compile(r"#{1,6}\s")
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
    """The chosen sentences (`extractive_sentences`) as one paragraph, or paragraph by paragraph."""
    return _join(*extractive_sentences(text, max_words))


def extractive_sentences(text: str, max_words: int) -> tuple[list[str], list[int] | None]:
    """The sentences of ``text`` that make a summary of at most ``max_words`` words, in document
    order, and their paragraphs where they are to keep them (None: one paragraph).

    A document of at most ``max_words`` words comes back whole (whitespace normalised, its
    paragraphs kept). Otherwise the best-ranked sentences that fit are chosen, greedily, until
    the budget is used (at least ``MIN_FILL`` of it when the sentences allow); they keep their
    paragraphs when they are nearly the whole document. Headings are never chosen. No sentence
    when none fits in ``max_words``: the caller decides what that means (the CLI reports an
    error). Deterministic.

    A run with no sentence end (a line without punctuation, Chinese without 。), or one far too
    long to be a sentence, is cut into clause segments (see :func:`_segments`), so that text
    without punctuation still has something that fits.

    Sentences become TF-IDF vectors (words for alphabetic scripts, characters and character
    bigrams for CJK). Centrality is continuous LexRank: PageRank over the cosine-similarity graph
    W = X·Xᵀ − diag. W is never built; each power-iteration step multiplies by the sparse X twice,
    so the cost grows with the number of (sentence, term) pairs, not with sentences squared.
    A mild prior favours early sentences and paragraph openers; a redundancy filter (MMR-style)
    skips sentences too similar to ones already chosen.
    """
    spans = sentence_spans(text)
    if not spans or max_words <= 0:
        return [], None
    paragraphs = _paragraph_numbers(text, spans)
    # Whitespace normalised, list bullets and heading marks dropped: the summary is prose.
    sentences = [_prose(text, s, e) for s, e in spans]
    words = [count_words(s) for s in sentences]
    if sum(words) <= max_words:
        return sentences, paragraphs

    headings = _headings(text, spans, paragraphs, words)
    sentences, paragraphs, words, headings, fragments = _segments(
        text, spans, sentences, paragraphs, words, headings, max_words
    )
    n = len(sentences)
    leads = [i == 0 or paragraphs[i] != paragraphs[i - 1] for i in range(n)]
    usable = [i for i in range(n) if not headings[i] and not _is_junk(sentences[i], words[i], fragment=fragments[i])]
    # Segments are the last resort: chosen from only when whole sentences fill too little.
    picked = _choose(sentences, words, leads, [i for i in usable if not fragments[i]], max_words)
    if sum(words[i] for i in picked) < MIN_FILL * max_words and any(fragments[i] for i in usable):
        picked = _choose(sentences, words, leads, usable, max_words)
    if not picked:  # only junk fits: take the first such sentence (no heading, no stub of a run)
        picked = next(([i] for i in range(n) if words[i] <= max_words and not (headings[i] or fragments[i])), [])
    nearly_whole = sum(words[i] for i in picked) >= NEARLY_WHOLE * sum(words)
    return [sentences[i] for i in picked], [paragraphs[i] for i in picked] if nearly_whole else None


def _choose(sentences: list[str], words: list[int], leads: list[bool], candidates: list[int], max_words: int) -> list[int]:
    """The indices, in document order, of the candidates chosen: ranked by centrality and
    prior, selected greedily within the budget."""
    n = len(sentences)
    vectors = _tfidf([sentences[i] for i in candidates])
    centrality = _lexrank(vectors)
    scores = [
        c * (1 + POSITION_WEIGHT * (1 - i / n) + PARAGRAPH_LEAD_WEIGHT * leads[i])
        for i, c in zip(candidates, centrality)
    ]
    # Rounded so that ties (repeated sentences) fall back to document order on every platform.
    ranked = sorted(range(len(candidates)), key=lambda k: (-round(scores[k], 9), candidates[k]))
    chosen = _select(ranked, vectors, [words[i] for i in candidates], max_words)
    return sorted(candidates[k] for k in chosen)


def _prose(text: str, start: int, end: int) -> str:
    """The span with whitespace normalised and list bullets and heading marks dropped."""
    return _BULLET.sub("", " ".join(text[start:end].split()))


def _paragraph_numbers(text: str, spans: list[tuple[int, int]]) -> list[int]:
    """The paragraph of each span, counted from 0."""
    numbers, paragraph = [], 0
    for i, (s, _) in enumerate(spans):
        # Spans are separated by whitespace only, so two newlines in the gap are a blank line.
        paragraph += i > 0 and text.count("\n", spans[i - 1][1], s) >= 2
        numbers.append(paragraph)
    return numbers


def _headings(text: str, spans: list[tuple[int, int]], paragraphs: list[int], words: list[int]) -> list[bool]:
    """Which spans are headings: Markdown ones, and short lines without a sentence end that
    are paragraphs of their own."""
    n = len(spans)
    headings = []
    for i, (s, e) in enumerate(spans):
        alone = (i == 0 or paragraphs[i - 1] != paragraphs[i]) and (i + 1 == n or paragraphs[i + 1] != paragraphs[i])
        short = words[i] <= HEADING_MAX_WORDS and not _TERMINAL.search(text, s, e)
        headings.append(bool(_MARKDOWN_HEADING.match(text, s, e)) or (alone and short))
    return headings


def _segments(
    text: str,
    spans: list[tuple[int, int]],
    sentences: list[str],
    paragraphs: list[int],
    words: list[int],
    headings: list[bool],
    max_words: int,
) -> tuple[list[str], list[int], list[int], list[bool], list[bool]]:
    """The sentences, with every run that is no sentence cut into clause segments (see
    :func:`summarize.inputs.words.split_clauses`); and for each its paragraph, words, whether it is a
    heading, whether it is such a segment.

    A run is no sentence when it has no sentence end and is longer than a segment (and is no
    heading), or is longer than the budget and ``RUN_FACTOR`` segments. A segment holds at most
    ``SEGMENT_WORDS`` words (``SEGMENT_CJK`` characters in mostly CJK text), never more than the
    budget unless that is under ``MIN_WORDS``.
    """
    out: tuple[list, list, list, list, list] = ([], [], [], [], [])
    for i, (s, e) in enumerate(spans):
        mostly_cjk = _CJK_CHAR.search(sentences[i]) is not None and 2 * _cjk_chars(sentences[i]) > words[i]
        segment = SEGMENT_CJK if mostly_cjk else SEGMENT_WORDS
        limit = max(MIN_WORDS, min(segment, max_words))  # a shorter segment would be junk
        unended = not headings[i] and not _TERMINAL.search(sentences[i]) and words[i] > limit
        if not (unended or words[i] > max(RUN_FACTOR * segment, max_words)):
            rows = [(sentences[i], words[i], False)]
        else:
            pieces = [_prose(text, ps, pe) for ps, pe in split_clauses(text, s, e, limit)]
            rows = [(piece, count_words(piece), True) for piece in pieces]
        for sentence, size, fragment in rows:
            for column, value in zip(out, (sentence, paragraphs[i], size, headings[i], fragment)):
                column.append(value)
    return out


def _cjk_chars(text: str) -> int:
    return len(text) - len(_CJK_CHAR.sub("", text))


def _is_junk(sentence: str, words: int, *, fragment: bool = False) -> bool:
    # A segment of a run without sentence ends needs no sentence end of its own.
    if words < MIN_WORDS or not (fragment or _TERMINAL.search(sentence)):
        return True
    letters = len(sentence) - len(_NON_LETTER.findall(sentence))
    return letters < MIN_LETTER_RATIO * (len(sentence) - sentence.count(" "))


def terms(sentence: str) -> list[str]:
    """The terms a sentence is compared by: words less stopwords, plurals folded; CJK characters and their bigrams."""
    found = []
    for run in _TERM.findall(sentence.lower()):
        if _CJK_CHAR.match(run):
            found.extend(run)
            found.extend(run[k : k + 2] for k in range(len(run) - 1))
        elif len(run) > 1 and run not in STOPWORDS:
            # Plural folding is all the stemming a similarity graph needs.
            plural = len(run) > 3 and run.endswith("s") and not run.endswith("ss")
            found.append(run[:-1] if plural else run)
    return found


def _tfidf(sentences: list[str]) -> list[dict[str, float]]:
    """Unit-length TF-IDF vectors (sublinear tf, smoothed idf); empty dict for no terms."""
    counts = [Counter(terms(s)) for s in sentences]
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
    import torch  # a runtime dependency; imported here so that `summarize.inputs.words` users don't pay for it

    n = len(vectors)
    if n == 0:
        return []
    # Matrix-vector products this small gain nothing from threads, and OpenMP workers waiting
    # on a busy machine made them many times slower: run single-threaded, then restore.
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
    """Greedy fill in rank order, skipping what does not fit or repeats a chosen sentence.

    Work per candidate is bounded by its terms times ``POSTINGS_CAP``, so the whole selection
    is linear in the number of sentences whatever the budget. An exact repeat of a chosen
    sentence is skipped even where the cap hides it.
    """
    chosen: list[int] = []
    chosen_set: set[int] = set()
    chosen_vectors: set[frozenset] = set()
    postings: dict[str, list[tuple[int, float]]] = {}  # term -> (chosen slot, weight), capped
    # The highest similarity to a chosen sentence found for a candidate: it only grows as more
    # are chosen, so a later pass rejects at once what it already rejects.
    redundancy: dict[int, float] = {}
    used = 0
    for threshold in REDUNDANCY_THRESHOLDS:
        for k in ranked:
            if k in chosen_set or used + words[k] > budget or redundancy.get(k, 0.0) > threshold:
                continue
            key = frozenset(vectors[k].items())
            if key and key in chosen_vectors:
                continue
            overlap = Counter()
            for term, w in vectors[k].items():
                for slot, w2 in postings.get(term, ()):
                    overlap[slot] += w * w2
            redundancy[k] = max(overlap.values(), default=0.0)
            if redundancy[k] > threshold:
                continue
            for term, w in vectors[k].items():
                slots = postings.setdefault(term, [])
                if len(slots) < POSTINGS_CAP:
                    slots.append((len(chosen), w))
            chosen.append(k)
            chosen_set.add(k)
            chosen_vectors.add(key)
            used += words[k]
        if used >= MIN_FILL * budget:
            break
    return chosen


def _join(sentences: list[str], paragraphs: list[int] | None = None) -> str:
    """Join with spaces, except between two CJK sentences (CJK text has no spaces); with the
    sentences' ``paragraphs``, with a blank line where the paragraph changes."""
    if paragraphs is not None:
        groups: list[list[str]] = []
        for k, sentence in enumerate(sentences):
            if k == 0 or paragraphs[k] != paragraphs[k - 1]:
                groups.append([])
            groups[-1].append(sentence)
        return "\n\n".join(_join(group) for group in groups)
    out = sentences[:1]
    for prev, cur in zip(sentences, sentences[1:]):
        left, right = prev.rstrip(_QUOTES), cur.lstrip(_QUOTES)
        cjk = left and right and _CJK_EDGE.match(left[-1]) and _CJK_EDGE.match(right[0])
        out.append(cur if cjk else " " + cur)
    return "".join(out)
