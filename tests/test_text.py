"""Words and sentences: how the summarizer counts and where it cuts."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from summarize.inputs.words import count_words, sentence_spans, split_clauses, split_sentences, trim_to_words

# --- count_words -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, words",
    [
        ("", 0),
        ("   \n\t ", 0),
        ("hello world", 2),
        ("  one\ntwo\tthree  ", 3),
        ("well-known e.g. 3.14 — yes", 5),  # like `wc -w`: any whitespace-separated token
        ("日本語 text", 4),  # each CJK character is a word
        ("日本語text", 4),
        ("你好，世界。", 4),  # CJK punctuation is not a word
        ("。", 0),
        ("“你好”", 2),
        ("ひらがな カタカナ", 8),
        ("안녕하세요", 5),
        ("abc。def", 2),
    ],
)
def test_count_words(text, words):
    assert count_words(text) == words


# --- split_sentences: the hard cases ---------------------------------------------------------


@pytest.mark.parametrize(
    "text, sentences",
    [
        pytest.param(
            "Mr. Smith met Dr. Jones and Mrs. Lee. They talked.",
            ["Mr. Smith met Dr. Jones and Mrs. Lee.", "They talked."],
            id="titles",
        ),
        pytest.param(
            "Bring tools, e.g. hammers, i.e. heavy ones, etc. and rope. Then go.",
            ["Bring tools, e.g. hammers, i.e. heavy ones, etc. and rope.", "Then go."],
            id="latin-abbreviations",
        ),
        pytest.param(
            "We bought apples, pears, etc. The rest was sold.",
            ["We bought apples, pears, etc.", "The rest was sold."],
            id="etc-ends-a-sentence",
        ),
        pytest.param(
            "The U.S. Army arrived. He moved to the U.S. The weather was better.",
            ["The U.S. Army arrived.", "He moved to the U.S.", "The weather was better."],
            id="acronyms",
        ),
        pytest.param(
            "J. R. R. Tolkien wrote it. It sold well.",
            ["J. R. R. Tolkien wrote it.", "It sold well."],
            id="initials",
        ),
        pytest.param(
            "Pi is 3.14 or so. It costs $2.50. Fine.",
            ["Pi is 3.14 or so.", "It costs $2.50.", "Fine."],
            id="decimals",
        ),
        pytest.param(
            "Steps:\n1. Install it.\n2. Run it.\n3. Done.",
            ["Steps:", "1. Install it.", "2. Run it.", "3. Done."],
            id="numbered-lines",
        ),
        pytest.param(
            "1. Install it. 2. Run it. 3. Done.",
            ["1. Install it.", "2. Run it.", "3. Done."],
            id="numbered-inline",
        ),
        pytest.param(
            "- first item\n- second item. It has a note.",
            ["- first item", "- second item.", "It has a note."],
            id="bullets",
        ),
        pytest.param(
            "Wait... what happened? Nothing… Then silence.",
            ["Wait... what happened?", "Nothing…", "Then silence."],
            id="ellipses",
        ),
        pytest.param(
            'He said "Stop." Then he left. "Really?" she asked. (It was late.) Next day!',
            ['He said "Stop."', "Then he left.", '"Really?" she asked.', "(It was late.)", "Next day!"],
            id="quotes-and-brackets",
        ),
        pytest.param(
            "It said “go.” She went.",
            ["It said “go.”", "She went."],
            id="curly-quotes",
        ),
        pytest.param(
            "See Fig. 3 for details. Call No. 5 now. The answer was no. The end.",
            ["See Fig. 3 for details.", "Call No. 5 now.", "The answer was no.", "The end."],
            id="fig-and-no",
        ),
        pytest.param(
            "日本語の文です。次の文！最後？終わり",
            ["日本語の文です。", "次の文！", "最後？", "終わり"],
            id="japanese",
        ),
        pytest.param(
            "“你好，”他说。“再见！”她回答。",
            ["“你好，”他说。", "“再见！”她回答。"],
            id="chinese-quotes",
        ),
        pytest.param("「はい。」と言った。次へ。", ["「はい。」と言った。", "次へ。"], id="japanese-quotes"),
        pytest.param(
            "A heading without a period\n\nThe body starts here. It goes on",
            ["A heading without a period", "The body starts here.", "It goes on"],
            id="paragraph-break",
        ),
        pytest.param(
            "A line that is\nhard-wrapped in the middle. Next.",
            ["A line that is\nhard-wrapped in the middle.", "Next."],
            id="single-newline-is-not-a-break",
        ),
    ],
)
def test_split_sentences(text, sentences):
    assert split_sentences(text) == sentences


def test_blank_line_always_ends_a_sentence():
    assert split_sentences("Dr.\n\nSmith was here.\r\n\r\nMr.") == ["Dr.", "Smith was here.", "Mr."]


def test_empty_and_blank_text_have_no_sentences():
    assert split_sentences("") == []
    assert split_sentences(" \n\n \t") == []


def test_spans_are_offsets_of_the_sentences():
    text = "  First one.  Second one?\n\nThird!  "
    spans = sentence_spans(text)
    assert [text[s:e] for s, e in spans] == split_sentences(text) == ["First one.", "Second one?", "Third!"]
    assert spans == sorted(spans)


_PIECES = st.sampled_from(
    ["word", "Mr.", "Dr.", "e.g.", "U.S.", "3.14", "etc.", "end.", "Why?", "Yes!", "wait...", '"Stop."',
     "(aside.)", "J.", "1.", "日本語。", "你好！", "The", "and", "x", "—", "\n", "\n\n", " "]
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_PIECES, max_size=40).map(" ".join))
def test_segmentation_loses_nothing(text):
    sentences = split_sentences(text)
    assert all(s and s == s.strip() for s in sentences)
    assert re.sub(r"\s", "", "".join(sentences)) == re.sub(r"\s", "", text)
    assert sum(count_words(s) for s in sentences) == count_words(text)
    spans = sentence_spans(text)
    assert all(e0 <= s1 for (_, e0), (s1, _) in zip(spans, spans[1:]))


class _CountedSlices(str):
    """A text that counts the characters sliced out of it."""

    sliced = 0

    def __getitem__(self, key):
        piece = super().__getitem__(key)
        self.sliced += len(piece)
        return piece


def test_runs_of_terminators_and_initials_split_in_linear_time():
    # Each was quadratic in its length: every start inside "!!!!x" was tried to the end of the
    # run, and every initial sliced the sentence from its start. 100k characters took minutes.
    # The regex engine's work cannot be counted from Python: its time is in bench/bench_text.py.
    n = 100_000
    assert split_sentences("!" * n + "x") == ["!" * n + "x"]
    initials = _CountedSlices("J. Smith " * (n // 9))
    assert len(split_sentences(initials)) == 1
    assert initials.sliced <= 3 * len(initials)  # the sentence a few times, not once per initial
    assert split_sentences("Wow!!! " + "?" * n + "x. End.") == ["Wow!!!", "?" * n + "x.", "End."]


# --- split_clauses ---------------------------------------------------------------------------


def test_split_clauses_prefers_clause_punctuation():
    text = "one two three four five six, seven eight nine ten; eleven twelve"
    segments = [text[s:e] for s, e in split_clauses(text, 0, len(text), 8)]
    # A cut between words would give "one ... eight" and "nine ... twelve".
    assert segments == ["one two three four five six,", "seven eight nine ten; eleven twelve"]


def test_split_clauses_cuts_between_words_without_punctuation():
    text = " ".join(f"w{i}" for i in range(25))
    segments = [text[s:e] for s, e in split_clauses(text, 0, len(text), 10)]
    assert [len(s.split()) for s in segments] == [10, 10, 5]
    assert " ".join(segments) == text


def test_split_clauses_cuts_cjk_between_characters():
    text = "这是一个没有句号的很长的句子，" * 6  # 14 characters and a comma, six times
    segments = [text[s:e] for s, e in split_clauses(text, 0, len(text), 20)]
    assert "".join(segments) == text
    assert all(count_words(s) <= 20 for s in segments)
    assert all(s.endswith("，") for s in segments)  # each at a comma, none at a stub


@settings(max_examples=200, deadline=None)
@given(st.lists(_PIECES | st.sampled_from([",", "，", "；", "你好", "word,"]), max_size=60).map(" ".join), st.integers(1, 12))
def test_split_clauses_loses_nothing_and_fits(text, max_words):
    segments = [text[s:e] for s, e in split_clauses(text, 0, len(text), max_words)]
    assert all(s and s == s.strip() for s in segments)
    assert re.sub(r"\s", "", "".join(segments)) == re.sub(r"\s", "", text)
    assert all(count_words(s) <= max_words for s in segments)


# --- trim_to_words ---------------------------------------------------------------------------


def test_trim_to_words_keeps_whole_sentences():
    text = "One two three. Four five.\n\nSix seven eight."
    assert trim_to_words(text, 100) == text
    assert trim_to_words(text, 8) == text
    assert trim_to_words(text, 7) == "One two three. Four five."
    assert trim_to_words(text, 5) == "One two three. Four five."
    assert trim_to_words(text, 4) == "One two three."
    assert trim_to_words(text, 2) == ""
    assert trim_to_words("", 10) == ""


def test_trim_to_words_counts_cjk_characters():
    assert trim_to_words("你好。世界很大。", 4) == "你好。"
    assert trim_to_words("你好。世界很大。", 6) == "你好。世界很大。"
