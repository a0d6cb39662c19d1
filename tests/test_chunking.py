"""Chunking: overlapping windows of whole sentences, with reset markers (design §1, §3)."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import summarize.inputs.words
import summarize.summarizers.chunking
from lines_executed import lines_executed
from summarize.inputs.words import count_words, split_sentences
from summarize.summarizers.chunking import RESET_MARKER, Chunk, chunk_text

VOCABULARY = ["river", "stone", "light", "garden", "quiet", "window", "morning", "paper", "silver", "forest"]


def _sentence(words: list[str]) -> str:
    return " ".join([words[0].capitalize(), *words[1:]]) + "."


@st.composite
def documents(draw):
    """(text, sentences, chunk_size, overlap): sentences shorter than chunk_size - overlap."""
    chunk_size = draw(st.integers(min_value=2, max_value=60))
    overlap = draw(st.integers(min_value=0, max_value=chunk_size - 1))
    longest = max(1, chunk_size - overlap)
    sentence = st.lists(st.sampled_from(VOCABULARY), min_size=1, max_size=longest).map(_sentence)
    paragraphs = draw(st.lists(st.lists(sentence, min_size=1, max_size=8), min_size=1, max_size=8))
    text = "\n\n".join(" ".join(p) for p in paragraphs)
    return text, [s for p in paragraphs for s in p], chunk_size, overlap


def _shared(a: Chunk, b: Chunk) -> range:
    return range(b.sentences.start, min(a.sentences.stop, b.sentences.stop))


@settings(max_examples=300, deadline=None)
@given(documents(), st.sampled_from(["map-reduce", "stream"]))
def test_chunking_properties(document, strategy):
    text, sentences, chunk_size, overlap = document
    assert split_sentences(text) == sentences  # the generator makes unambiguous sentences
    chunks = chunk_text(text, chunk_size=chunk_size, overlap=overlap, strategy=strategy)
    bound = overlap if strategy == "map-reduce" else 0  # stream reads each sentence once

    assert [c.index for c in chunks] == list(range(len(chunks)))
    # Every sentence lies wholly inside at least one chunk.
    for i, s in enumerate(sentences):
        assert any(i in c.sentences and s in c.text for c in chunks)
    for c in chunks:
        assert c.text.strip() and len(c.sentences) > 0  # never empty
        assert c.size == count_words(c.text) <= chunk_size  # within budget
        assert c.text in text  # a slice of the document: paragraph breaks kept
        assert split_sentences(c.text) == sentences[c.sentences.start : c.sentences.stop]
    # Order is preserved and every chunk brings new text.
    for a, b in zip(chunks, chunks[1:]):
        assert a.sentences.start < b.sentences.start and a.sentences.stop < b.sentences.stop
        assert b.sentences.start <= a.sentences.stop  # no gap
        assert sum(count_words(sentences[i]) for i in _shared(a, b)) <= bound
    # Markers: every chunk resets in map-reduce, only the first in stream.
    if strategy == "map-reduce":
        assert all(c.resets_state for c in chunks)
    else:
        assert [c.resets_state for c in chunks] == [True] + [False] * (len(chunks) - 1)


@settings(max_examples=100, deadline=None)
@given(documents())
def test_a_token_counter_sees_each_sentence_once(document):
    text, sentences, chunk_size, overlap = document
    calls = []

    def count(s: str) -> int:  # a stand-in tokenizer: one token per 4 characters
        calls.append(s)
        return len(s) // 4 + 1

    chunks = chunk_text(text, chunk_size=chunk_size * 4, overlap=overlap, count=count)
    if all(count(s) <= chunk_size * 4 for s in sentences):
        assert sorted(calls[: len(sentences)]) == sorted(sentences)
        assert len(calls) == 2 * len(sentences)  # once by the chunker, once just above
    assert all(c.size <= chunk_size * 4 for c in chunks)


def test_overlap_repeats_trailing_sentences():
    text = " ".join(f"Sentence number {w} is here." for w in VOCABULARY)  # 5 words each
    chunks = chunk_text(text, chunk_size=20, overlap=10)
    assert [(c.sentences.start, c.sentences.stop) for c in chunks[:3]] == [(0, 4), (2, 6), (4, 8)]
    assert all(c.size == 20 for c in chunks[:-1])


def test_overlap_never_blocks_progress():
    # The next sentence (9 words) leaves room for only 1 word of overlap, so none is kept.
    text = "One two three four five six seven eight nine. " * 4
    chunks = chunk_text(text, chunk_size=10, overlap=8)
    assert [c.sentences for c in chunks] == [range(i, i + 1) for i in range(4)]


def test_prefers_a_paragraph_break_when_the_chunk_is_three_quarters_full():
    first = "Aa bb cc dd. " * 4  # 16 words, then a paragraph break
    text = first.strip() + "\n\n" + "Ee ff gg hh. " * 4
    chunks = chunk_text(text, chunk_size=20, overlap=0)
    assert chunks[0].text == first.strip() and chunks[0].size == 16
    # Below 75 % full the chunk goes on past the break.
    early = "Aa bb cc dd. " * 2 + "\n\n" + "Ee ff gg hh. " * 6
    assert chunk_text(early, chunk_size=20, overlap=0)[0].size == 20


def test_a_sentence_longer_than_a_chunk_is_split_at_word_boundaries():
    words = [f"w{i}" for i in range(45)]
    text = "Short one. Long " + " ".join(words) + ". Short two."
    chunks = chunk_text(text, chunk_size=10, overlap=0)
    assert all(c.size <= 10 for c in chunks)
    assert " ".join(c.text for c in chunks).split() == text.split()
    long_pieces = [c for c in chunks if 1 in c.sentences]
    assert len(long_pieces) >= 5 and all(c.sentences == range(1, 2) for c in long_pieces[1:-1])


def test_cjk_sentences_are_split_by_characters():
    chunks = chunk_text("你" * 25 + "。", chunk_size=10, overlap=0)
    assert [c.size for c in chunks] == [10, 10, 5]
    assert "".join(c.text for c in chunks) == "你" * 25 + "。"


def test_a_word_longer_than_a_chunk_is_split_by_characters():
    chunks = chunk_text("x" * 25, chunk_size=10, overlap=0, count=len)
    assert [c.text for c in chunks] == ["x" * 10, "x" * 10, "x" * 5]


def test_stream_ignores_overlap_and_resets_only_first():
    text = "Aa bb cc dd. " * 20
    chunks = chunk_text(text, chunk_size=8, overlap=4, strategy="stream")
    assert [c.sentences for c in chunks] == [range(2 * i, 2 * i + 2) for i in range(10)]
    assert [c.marked_text.startswith(RESET_MARKER) for c in chunks] == [True] + [False] * 9


def test_marked_text():
    chunk = Chunk(index=0, text="Hello.", resets_state=True, sentences=range(0, 1), size=1)
    assert chunk.marked_text == "<|reset_state|>Hello."
    assert Chunk(1, "Hello.", False, range(0, 1), 1).marked_text == "Hello."


def test_empty_text_has_no_chunks():
    assert chunk_text("", chunk_size=10, overlap=2) == []
    assert chunk_text(" \n\n ", chunk_size=10, overlap=2) == []


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(chunk_size=0, overlap=0),
        dict(chunk_size=-5, overlap=0),
        dict(chunk_size=10, overlap=-1),
        dict(chunk_size=10, overlap=10),
        dict(chunk_size=10, overlap=2, strategy="tree"),
        dict(chunk_size=10, overlap=12, strategy="stream"),
    ],
)
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        chunk_text("Some text.", **kwargs)


def days_of_prose(paragraphs: int) -> str:
    paragraph = (
        "The river ran quietly past the old mill, carrying leaves from the hills. "
        "Dr. Hale measured its depth every morning at 6.30 and wrote the numbers down. "
        "Nobody in the village knew why she did it, though many guessed."
    )
    return "\n\n".join(f"{paragraph} It was day {i}." for i in range(paragraphs))


def test_500_pages_are_chunked_with_linear_work():
    """The time it takes is in bench/bench_text.py; here, the work twice the text takes."""
    chunks = chunk_text(days_of_prose(6000), chunk_size=1024, overlap=128)  # ~1.5 MB
    assert chunks[-1].text.endswith("It was day 5999.")
    work = []
    for paragraphs in (1000, 2000):
        text = days_of_prose(paragraphs)
        _, lines = lines_executed(lambda: chunk_text(text, chunk_size=1024, overlap=128),
                                  summarize.summarizers.chunking, summarize.inputs.words)
        work.append(lines)
    assert work[1] <= 2.5 * work[0]


def _unpunctuated(words: int) -> str:
    """One sentence without an end: a line of words, as a long log or a transcript may be."""
    return " ".join(f"{VOCABULARY[i % 10]}{'x' * (i % 7)}" for i in range(words))


def _chunk_counting(text: str, chunk_size: int) -> tuple[list[Chunk], int]:
    """The chunks, and how many characters the counter was given in all."""
    tokenized = 0

    def count(s: str) -> int:  # a stand-in tokenizer: one token per word
        nonlocal tokenized
        tokenized += len(s)
        return len(s.split())

    return chunk_text(text, chunk_size=chunk_size, overlap=8, count=count), tokenized


def test_an_unpunctuated_run_is_chunked_with_linear_work():
    small, big = _unpunctuated(4000), _unpunctuated(8000)
    small_chunks, small_work = _chunk_counting(small, 64)
    big_chunks, big_work = _chunk_counting(big, 64)
    assert big_work <= 2.5 * small_work  # was ~4x: every cut recounted the rest of the sentence
    assert big_work <= 2 * len(big)  # each character is counted about once
    for text, chunks in ((small, small_chunks), (big, big_chunks)):
        assert all(c.size == len(c.text.split()) <= 64 for c in chunks)
        assert all(c.size >= 0.9 * 64 for c in chunks[:-1])  # pieces are packed nearly full
        assert chunks[-1].text.endswith(text[-20:])
        seen = " ".join(c.text for c in chunks).split()
        assert sorted(set(seen)) == sorted(set(text.split()))


def test_a_word_longer_than_a_chunk_is_cut_with_linear_work():
    blob = "".join(f"{i:x}" for i in range(20000))  # base64-like: no space anywhere
    calls = []

    def count(s: str) -> int:
        calls.append(len(s))
        return len(s) // 4 + 1

    chunks = chunk_text(blob, chunk_size=256, overlap=0, count=count)
    assert "".join(c.text for c in chunks) == blob
    assert all(c.size <= 256 for c in chunks)
    assert sum(calls) <= 3 * len(blob)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(VOCABULARY + ["x" * 30, "日本語", "你好，", "—", "\n"]), min_size=1, max_size=300).map(" ".join),
    st.integers(min_value=1, max_value=40),
    st.sampled_from([None, len]),
)
def test_a_long_sentence_is_cut_into_pieces_that_fit(text, chunk_size, count):
    chunks = chunk_text(text, chunk_size=chunk_size, overlap=0, count=count)
    assert re.sub(r"\s", "", "".join(c.text for c in chunks)) == re.sub(r"\s", "", text)
    for c in chunks:
        assert c.size <= chunk_size or len(c.text) == 1  # only a lone character may not fit
        if count is None:  # words are additive: the pieces' sizes are exact
            assert c.size == count_words(c.text)
