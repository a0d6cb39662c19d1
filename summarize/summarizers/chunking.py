"""Cut a document into overlapping windows of whole sentences, measured in model tokens."""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from dataclasses import dataclass

from summarize.inputs.places import Places
from summarize.inputs.words import CJK_CHARS, count_words, sentence_spans
from summarize.settings import MAP_REDUCE, STRATEGIES, STREAM

RESET_MARKER = "<|reset_state|>"
# When a chunk is at least this full, it ends at the last paragraph break it contains.
PARAGRAPH_FILL = 0.75

# Places where an over-long sentence may be cut: after a word or after a CJK character.
_TOKEN = re.compile(f"[{CJK_CHARS}]|[^\\s{CJK_CHARS}]+")


@dataclass(frozen=True)
class Chunk:
    """One window of the document.

    ``sentences`` indexes the document's sentence list (``split_sentences(text)``), ``places`` the
    document's places (its pages, sections or lines, inputs/places.py) that the chunk covers;
    ``resets_state`` says whether the engine restores the post-prefix snapshot before it.
    """

    index: int
    text: str
    resets_state: bool
    sentences: range
    size: int
    places: range = range(0)

    @property
    def marked_text(self) -> str:
        """The text as shown for display/debugging: with the reset marker when it resets."""
        return RESET_MARKER + self.text if self.resets_state else self.text


@dataclass(frozen=True)
class _Unit:
    """A sentence, or a piece of one that is longer than a chunk."""

    start: int
    end: int
    sentence: int
    size: int
    paragraph_end: bool


def chunk_text(
    text: str,
    *,
    chunk_size: int,
    overlap: int,
    count: Callable[[str], int] | None = None,
    strategy: str = MAP_REDUCE,
    places: Places | None = None,
) -> list[Chunk]:
    """Split ``text`` into chunks of at most ``chunk_size`` units (as measured by ``count``), each
    knowing which of ``places`` it covers.

    Consecutive chunks share trailing sentences worth at most ``overlap`` units (fewer when
    more would leave no room for new text). ``"map-reduce"``: every chunk resets the state.
    ``"stream"``: only the first does, and ``overlap`` is ignored (the document is read in
    one pass, so repeating text would feed it to the state twice).

    Each sentence is counted once; windows are then found with prefix sums, so chunking 500
    pages costs about as much as segmenting them. A chunk's ``size`` is the sum of its
    sentences' counts (with a tokenizer, joining may merge or split a token at the seams; the
    sum is what the limit is checked against).

    The one exception to "whole sentences": a sentence longer than ``chunk_size`` on its own is
    cut at word boundaries (at characters if a single word is too long) into pieces that fit,
    each sized by the sum of the counts of the blocks of words it is packed from; the cost stays
    linear in the sentence's length. Such pieces keep the sentence's index, so consecutive
    chunks may share that index.
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if overlap < 0:
        raise ValueError(f"overlap must be >= 0, got {overlap}")
    if overlap >= chunk_size:
        raise ValueError(f"overlap ({overlap}) must be smaller than chunk_size ({chunk_size})")
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
    if strategy == STREAM:
        overlap = 0
    units = _units(text, chunk_size, count or count_words)
    if not units:
        return []

    prefix = [0]  # prefix[k] = total size of units[:k]
    for unit in units:
        prefix.append(prefix[-1] + unit.size)

    chunks: list[Chunk] = []
    start, end = 0, 0
    while True:
        # The furthest end that fits (each unit fits alone), or an earlier paragraph break,
        # but always past the previous chunk's end.
        fits = bisect.bisect_right(prefix, prefix[start] + chunk_size) - 1
        end = _paragraph_end(units, prefix, start, end + 1, fits, chunk_size)
        first, last = units[start], units[end - 1]
        chunks.append(
            Chunk(
                index=len(chunks),
                text=text[first.start : last.end],
                resets_state=strategy == MAP_REDUCE or not chunks,
                sentences=range(first.sentence, last.sentence + 1),
                size=prefix[end] - prefix[start],
                places=range(0) if places is None else places.covering(text, first.start, last.end),
            )
        )
        if end == len(units):
            return chunks
        start = _next_start(units, prefix, start, end, overlap, chunk_size)


# An over-long sentence is counted in blocks of whole words, at most chunk_size /
# BLOCKS_PER_PIECE characters each (so at least that many blocks to a piece, even at one token a
# character), and its pieces are packed from the blocks: the counter reads each character about
# once. (Searching for the furthest cut that fits recounted the whole rest of the sentence ~40
# times a piece: quadratic in the sentence's length.)
BLOCKS_PER_PIECE = 16
# A sentence longer than chunk_size times this many characters cannot fit whatever the counter
# (no tokenizer has tokens that long on average): it is split without counting it whole first.
MAX_CHARS_PER_TOKEN = 32


def _units(text: str, chunk_size: int, count: Callable[[str], int]) -> list[_Unit]:
    spans = sentence_spans(text)
    units: list[_Unit] = []
    for i, (s, e) in enumerate(spans):
        # Spans are separated by whitespace only, so two newlines in the gap are a blank line.
        paragraph_end = i + 1 == len(spans) or text.count("\n", e, spans[i + 1][0]) >= 2
        if e - s <= chunk_size * MAX_CHARS_PER_TOKEN:
            size = count(text[s:e])
            if size <= chunk_size:
                units.append(_Unit(s, e, i, size, paragraph_end))
                continue
        pieces = _split_long(text, s, e, chunk_size, count)
        for k, (ps, pe, psize) in enumerate(pieces):
            units.append(_Unit(ps, pe, i, psize, paragraph_end and k == len(pieces) - 1))
    return units


def _split_long(
    text: str, start: int, end: int, limit: int, count: Callable[[str], int]
) -> list[tuple[int, int, int]]:
    """Cut ``text[start:end]`` into ``(start, end, size)`` pieces of at most ``limit``.

    A piece's size is the sum of its blocks' counts (as a chunk's is of its sentences'), each
    block counted with the whitespace before it. Cuts fall between words; a word that does
    not fit a piece on its own is cut between characters.
    """
    pieces: list[tuple[int, int, int]] = []
    max_chars = max(1, limit // BLOCKS_PER_PIECE)
    _add_parts(pieces, text, start, _blocks(text, start, end, max_chars), limit, count, max_chars)
    return pieces


def _blocks(text: str, start: int, end: int, max_chars: int) -> list[tuple[int, int]]:
    """Runs of whole words (or single CJK characters) of ``text[start:end]``, each spanning at
    most ``max_chars`` characters unless it is one word; stripped, in order."""
    blocks: list[tuple[int, int]] = []
    block_start = block_end = -1
    for word in _TOKEN.finditer(text, start, end):
        ws, we = word.span()
        if block_start < 0:
            block_start = ws
        elif we - block_start > max_chars:
            blocks.append((block_start, block_end))
            block_start = ws
        block_end = we
    if block_start >= 0:
        blocks.append((block_start, block_end))
    return blocks


def _add_parts(
    pieces: list[tuple[int, int, int]],
    text: str,
    lead: int,
    parts: list[tuple[int, int]],
    limit: int,
    count: Callable[[str], int],
    max_chars: int,
) -> None:
    """Add each part ``(start, end)`` to the pieces, counted from where the one before it
    ended (``lead`` for the first): extend the last piece, or start a new one where it would
    not fit.

    A part too big for any piece goes in as its own parts: its words; a single word as slices
    of ``max_chars`` characters, then single characters. A lone character over the limit
    still makes a piece: no cut can make it smaller.
    """
    for start, end in parts:
        size = count(text[lead:end])
        if size > limit and end - start > 1:
            inner = _blocks(text, start, end, 1)
            if len(inner) == 1:
                step = max_chars if end - start > max_chars else 1
                inner = [(c, min(c + step, end)) for c in range(start, end, step)]
            _add_parts(pieces, text, lead, inner, limit, count, max_chars)
        elif pieces and pieces[-1][2] + size <= limit:
            piece_start, _, piece_size = pieces[-1]
            pieces[-1] = (piece_start, end, piece_size + size)
        else:  # a piece does not start with the whitespace before it
            pieces.append((start, end, size if lead == start else count(text[start:end])))
        lead = end


def _paragraph_end(
    units: list[_Unit], prefix: list[int], start: int, lowest: int, end: int, chunk_size: int
) -> int:
    """Move ``end`` back, not below ``lowest``, to the last paragraph break that still leaves
    the chunk full enough."""
    floor = prefix[start] + PARAGRAPH_FILL * chunk_size
    for k in range(end, lowest - 1, -1):
        if prefix[k] < floor:
            break
        if units[k - 1].paragraph_end:
            return k
    return end


def _next_start(
    units: list[_Unit], prefix: list[int], start: int, end: int, overlap: int, chunk_size: int
) -> int:
    """First unit of the next chunk: re-use trailing units worth <= ``overlap``, keeping room
    for the next new unit, and always start after ``start`` so that every chunk makes progress."""
    room = chunk_size - units[end].size
    s = end
    while s - 1 > start and prefix[end] - prefix[s - 1] <= min(overlap, room):
        s -= 1
    return s
