"""Words and sentences: the units the chunker and the extractive summary count in.
Rule-based and self-contained (no model, no data download).
"""

from __future__ import annotations

import re

# Characters that count as one word each, as a regex character-class body: Han (with
# extensions, compatibility ideographs, 々 and 〇), Hiragana, Katakana (not the ・ separator),
# halfwidth Katakana, Hangul.
CJK_CHARS = (
    "\u3005\u3007\u3040-\u309f\u30a0-\u30fa\u30fc-\u30ff\u31f0-\u31ff\u3400-\u4dbf"
    "\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f\u1100-\u11ff\u3130-\u318f\uac00-\ud7af"
    "\U00020000-\U0002fa1f"
)
# CJK punctuation and symbols: separators, never words.
_CJK_PUNCT = (
    "\u3000-\u3004\u3006\u3008-\u303f\u30fb\ufe30-\ufe4f"
    "\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65"
)
_CJK = re.compile(f"[{CJK_CHARS}]")
_CJK_ANY = re.compile(f"[{CJK_CHARS}{_CJK_PUNCT}]")
_LETTER_OR_DIGIT = re.compile(r"[^\W_]")


def count_words(text: str) -> int:
    """Whitespace-separated words, except that each CJK character is one word.

    CJK punctuation is not a word, so ``count_words("日本語 text") == 4`` and
    ``count_words("你好，世界。") == 4``. Text without CJK counts exactly like ``wc -w``.
    """
    if not _CJK_ANY.search(text):
        return len(text.split())
    words = 0
    for token in text.split():
        if not _CJK_ANY.search(token):
            words += 1
            continue
        # Inside a token mixing CJK and other scripts, the non-CJK runs count once each if
        # they hold a letter or digit (so "日本語text" is 4 and "“你好”" is 2).
        words += len(_CJK.findall(token))
        words += sum(1 for run in _CJK_ANY.split(token) if _LETTER_OR_DIGIT.search(run))
    return words


# --- sentence boundaries -------------------------------------------------------------------

_CLOSERS = "\"'”’)\\]}»›」』）】〉》"
_OPENERS = "\"'“‘([{«‹¿¡"
_PARAGRAPH_BREAK = re.compile(r"\n[^\S\n]*\n")
# The western run starts at the first terminator and is taken whole, never backtracked into (a
# lookahead is atomic; `(?>...)` needs Python 3.11): trying every start and length inside a run
# of "!!!!" that no space follows made splitting quadratic in the run's length.
_TERMINATOR = re.compile(
    rf"(?P<cjk>[。！？｡]+[{_CLOSERS}]*)"
    rf"|(?<![.!?…])(?=(?P<western>[.!?…]+[{_CLOSERS}]*))(?P=western)(?=\s|$)"
)
# A line inside a paragraph that starts a list item or a heading starts a new sentence.
_LIST_LINE = re.compile(r"\n(?=[^\S\n]*(?:[-*•‣◦▪]|\d{1,3}[.)]|#{1,6})[^\S\n])")
_NEXT_WORD = re.compile(rf"\s*[{_OPENERS}]*(\w*)")
_LAST_TOKEN = re.compile(r"\S+$")
_NON_SPACE = re.compile(r"\S")
_LOOKBACK = 64  # characters searched backwards for the token before a terminator

# Never end a sentence: titles before names, and Latin/reference abbreviations.
_HARD_ABBREVIATIONS = frozenset(
    "mr mrs ms mx dr prof rev fr gen col capt cmdr lt sgt gov sen rep hon messrs mme mlle "
    "e.g i.e cf vs viz fig figs eq eqs approx vol vols pp ch sec nos".split()
)
# May end a sentence; they do when the next word is a typical sentence opener.
_SOFT_ABBREVIATIONS = frozenset(
    "etc inc ltd co corp llc jr sr st ave blvd rd mt ft no al ca est dept univ "
    "jan feb mar apr jun jul aug sep sept oct nov dec a.m p.m".split()
)
_SENTENCE_OPENERS = frozenset(
    "the a an this that these those it its he she we they i you his her their our my your "
    "in on at by for from with to of as but and or so if when while after before since "
    "because although though however there then thus yet also what who why how where which "
    "one all some many most no not each every both such today finally first".split()
)
_ACRONYM = re.compile(r"(?:[A-Za-z]\.)+[A-Za-z]")  # U.S, a.m (the final dot is not part of the token)
_LIST_NUMBER = re.compile(r"\d{1,3}|[A-Za-z]|(?i:x{0,2}(?:ix|iv|v?i{0,3}))")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Character offsets ``(start, end)`` of the sentences of ``text``, in order.

    Each span is stripped of surrounding whitespace and non-empty; every non-space character
    of ``text`` lies in exactly one span.

    Boundaries are found paragraph by paragraph: a blank line always ends a sentence; inside a
    paragraph a boundary is a terminator (. ! ? …) plus any closing quotes/brackets, followed by
    whitespace, unless the rules of this module say it is an abbreviation, an initial, a list
    number or a mid-sentence ellipsis. CJK terminators (。！？) end a sentence even with no space
    after them.
    """
    spans: list[tuple[int, int]] = []
    start = 0
    for brk in _PARAGRAPH_BREAK.finditer(text):
        _split_paragraph(text, start, brk.start(), spans)
        start = brk.end()
    _split_paragraph(text, start, len(text), spans)
    return spans


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text``, stripped, in order (see :func:`sentence_spans`)."""
    return [text[s:e] for s, e in sentence_spans(text)]


def trim_to_words(text: str, max_words: int) -> str:
    """The longest prefix of ``text`` made of whole sentences with at most ``max_words`` words.

    Returns "" when even the first sentence is longer than ``max_words``.
    """
    spans = sentence_spans(text)
    total, end = 0, None
    for s, e in spans:
        total += count_words(text[s:e])
        if total > max_words:
            break
        end = e
    return "" if end is None else text[spans[0][0] : end]


# Where a run without sentence ends may be cut, best first: after clause punctuation, else
# between words (or CJK characters). A clause cut is taken only when it leaves the segment at
# least CLAUSE_FILL full, so that one early comma does not leave a stub.
CLAUSE_PUNCTUATION = ",;:、，；："
CLAUSE_FILL = 0.5
_SEGMENT_UNIT = re.compile(f"(?P<cjk>[{CJK_CHARS}])|[^\\s{CJK_CHARS}]+")


def split_clauses(text: str, start: int, end: int, max_words: int) -> list[tuple[int, int]]:
    """Cut ``text[start:end]`` (a run with no sentence end, or far too long to be one sentence)
    into stripped, non-empty spans of at most ``max_words`` words each, in order.

    Cuts fall after clause punctuation (, ; : 、，；) when one leaves the segment at least
    ``CLAUSE_FILL`` full, else between words or CJK characters. One pass over the text. A single
    whitespace-free token of more than ``max_words`` words (CJK punctuation between letters, no
    CJK characters) stays whole.
    """
    limit = max(1, max_words)
    cjk = _CJK_ANY.search(text, start, end) is not None
    segments: list[tuple[int, int]] = []
    seg_start = seg_end = -1
    words = 0
    cut_end = after_cut = -1  # end of the segment's last clause, start of the unit after it
    cut_words = 0
    for unit in _SEGMENT_UNIT.finditer(text, start, end):
        s, e = unit.span()
        # CJK characters are matched one by one; other units are whitespace-free tokens whose
        # count on their own is never below their share of the whole (see count_words).
        w = count_words(unit.group()) if cjk and unit.lastgroup is None else 1
        if seg_start < 0:
            seg_start = s
        elif words + w > limit:
            if after_cut >= 0 and cut_words >= CLAUSE_FILL * limit:
                segments.append((seg_start, cut_end))
                seg_start, words = after_cut, words - cut_words
            if words + w > limit:
                segments.append((seg_start, seg_end))
                seg_start, words = s, 0
            cut_end = after_cut = -1
        if cut_end >= 0 and after_cut < 0:
            after_cut = s
        words += w
        seg_end = e
        if text[e - 1] in CLAUSE_PUNCTUATION:
            cut_end, cut_words, after_cut = e, words, -1
    if seg_start >= 0:
        segments.append((seg_start, seg_end))
    return segments


def _split_paragraph(text: str, start: int, end: int, spans: list[tuple[int, int]]) -> None:
    """Append the stripped, non-empty sentences of ``text[start:end]`` to ``spans``."""
    cuts = [m.start() for m in _LIST_LINE.finditer(text, start, end)]
    cuts.reverse()  # popped from the end, in text order
    sentence_start = start
    for match in _TERMINATOR.finditer(text, start, end):
        while cuts and cuts[-1] <= match.start():
            cut = cuts.pop()
            if cut > sentence_start:
                _add_span(text, sentence_start, cut, spans)
                sentence_start = cut
        if match.group("cjk"):
            boundary = _is_cjk_boundary(text, match)
        else:
            boundary = _is_boundary(text, match, sentence_start, end)
        if boundary:
            _add_span(text, sentence_start, match.end(), spans)
            sentence_start = match.end()
    for cut in reversed(cuts):
        if cut > sentence_start:
            _add_span(text, sentence_start, cut, spans)
            sentence_start = cut
    _add_span(text, sentence_start, end, spans)


def _is_cjk_boundary(text: str, match: re.Match) -> bool:
    """。！？ end a sentence, except inside a quote that the sentence goes on after:
    「はい。」と言った, “再见！”她回答."""
    quoted = match.group("cjk")[-1] in _CLOSERS
    return not (quoted and _CJK.match(text, match.end()))


def _is_boundary(text: str, match: re.Match, sentence_start: int, end: int) -> bool:
    """Whether a western terminator followed by whitespace really ends the sentence."""
    next_word = _NEXT_WORD.match(text, match.end(), end).group(1)
    if next_word[:1].islower():
        return False  # "Wait... what", '"Really?" she asked', "etc. and so on"
    if match.group("western").rstrip(_CLOSERS) != ".":
        return True  # ! ? … and runs like ?! or ...
    lookback = max(sentence_start, match.start() - _LOOKBACK)
    last = _LAST_TOKEN.search(text, lookback, match.start())
    if last is None:
        return True
    token = last.group().lstrip(_OPENERS)
    if not token:
        return True
    word = token.lower()
    if word in _HARD_ABBREVIATIONS:
        return False
    # A search, not a slice: the slice grew with the sentence, quadratic in an unending one.
    first_in_sentence = _NON_SPACE.search(text, sentence_start, last.start()) is None
    if first_in_sentence and _LIST_NUMBER.fullmatch(token):
        return False  # "1. Install", "b. Run", "iv. Results"
    initial = len(token) == 1 and token.isalpha()
    if initial or word in _SOFT_ABBREVIATIONS or _ACRONYM.fullmatch(token):
        # "J. R. R. Tolkien", "the U.S. Army" stay together; "in the U.S. The" splits.
        return next_word.lower() in _SENTENCE_OPENERS
    return True


def _add_span(text: str, start: int, end: int, spans: list[tuple[int, int]]) -> None:
    chunk = text[start:end]
    stripped = chunk.lstrip()
    if stripped:
        s = start + len(chunk) - len(stripped)
        spans.append((s, s + len(stripped.rstrip())))
