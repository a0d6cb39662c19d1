"""Generated inputs through the text cleaner, the chunker, the word cap and the PDF reader: no
exception but SummarizeError, the word cap holds, the chunks cover the text."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from summarize.errors import SummarizeError
from summarize.inputs.extract import clean_text, text_from_bytes
from summarize.inputs.words import count_words
from summarize.settings import Settings
from summarize.summarizers.chunking import chunk_text
from summarize.summarizers.extractive import ExtractiveSummarizer

BOUNDED = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# scripts with and without spaces or sentence marks: Latin, Thai, CJK, emoji, controls
_ALPHABETS = st.sampled_from([
    "abc def. Ghi! jkl? \n\n", "ภาษาไทยไม่มีวรรค", "日本語の文。中文，句子！", "😀🐝🌊👍🏽", "a\u0301e\u0308 \ufb01 \u00ad\u200b",
    "x" * 3 + " ", "\t\r\n\f\x0b", "... !!! ??? …", "-\n", "Mr. Dr. e.g. 3.14 ",
])
texts = st.lists(_ALPHABETS.flatmap(lambda a: st.text(alphabet=a, max_size=400)), max_size=8).map("".join)


@BOUNDED
@given(texts)
def test_the_cleaner_takes_any_text(text: str):
    assert isinstance(clean_text(text), str)


@BOUNDED
@given(texts, st.integers(8, 200), st.integers(0, 50))
def test_chunks_fit_and_cover_the_text(text: str, chunk_size: int, overlap: int):
    overlap = min(overlap, chunk_size // 4)
    chunks = chunk_text(text, chunk_size=chunk_size, overlap=overlap, count=count_words)
    assert all(chunk.size <= chunk_size for chunk in chunks)
    # every character of the text, in order, is in the chunks (which repeat the overlap)
    read = iter("".join("".join(chunk.text.split()) for chunk in chunks))
    assert all(char in read for char in "".join(text.split()))


@BOUNDED
@given(texts, st.integers(1, 60))
def test_the_word_cap_holds_for_every_script(text: str, words: int):
    try:
        summary = ExtractiveSummarizer(Settings(words=words, extractive=True)).summarize(text, name="fuzz")
    except SummarizeError:
        return
    assert count_words(summary.text) <= words


@BOUNDED
@given(st.binary(max_size=2000), st.sampled_from(["x.pdf", "x.txt", "x.md", "-"]))
def test_any_bytes_fail_only_with_one_line(data: bytes, name: str):
    for candidate in (data, b"%PDF-1.7\n" + data, b"%PDF-1.4\n1 0 obj <<>> endobj trailer <</Root 1 0 R>>" + data):
        try:
            text_from_bytes(candidate, name)
        except SummarizeError as exc:
            assert "\n" not in str(exc)


def test_a_pdf_of_generated_pages_reads(pdf_factory, tmp_path):
    # the generated fuzz above seldom makes a valid PDF: one made properly must read
    path = pdf_factory(tmp_path / "ok.pdf", ["One page of text. It has two sentences."])
    assert "two sentences" in text_from_bytes(path.read_bytes(), path)
