"""The RWKV World tokenizer equals the `rwkv` package's TRIE_TOKENIZER, and its chat format holds.

Equality is exact (same ids) on varied text: CJK, emoji sequences, code, whitespace runs longer
than the longest token, control bytes, the sample document, and random mixes of all of them.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from summarize.engine.tokenizers.rwkv import END_OF_TEXT, VOCAB_FILE, RwkvTokenizer
from summarize.engine.tokenizers.tokenizer import IncrementalDetokenizer

SAMPLES = Path(__file__).resolve().parents[1] / "samples"

TEXTS = [
    "",
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "你好，世界！这是一个测试。日本語のテキストも、한국어도 있습니다。",
    "emoji 😀👍🏽 flags 🇫🇷🇯🇵 family 👨‍👩‍👧‍👦 keycap 1️⃣ and a lone ZWJ \u200d",
    "def f(x):\n    return {'a': [x ** 2 for _ in range(3)]}  # comment\n\n\n\tif x != 0:\n\t\tpass\r\n",
    " " * 300 + "\n" * 9 + "\t" * 20 + "x" + " \n \n  \n",
    "-" * 170 + "#" * 85 + "=" * 3,
    "\x00\x01\x7f control bytes and é, ñ, ü, Ω, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢, e\u0301 (combining)",
    "العربية हिन्दी ไทย עברית Ελληνικά Русский",
    "<|endoftext|> <think></think> User: Assistant: \n\nUser:",
]


@pytest.fixture(scope="module")
def tokenizer() -> RwkvTokenizer:
    return RwkvTokenizer.default()


@pytest.fixture(scope="module")
def reference():
    pytest.importorskip("rwkv")
    from rwkv.rwkv_tokenizer import TRIE_TOKENIZER

    return TRIE_TOKENIZER(str(VOCAB_FILE))


@pytest.mark.parametrize("text", TEXTS)
def test_ids_equal_the_reference(tokenizer, reference, text):
    assert tokenizer.encode(text) == reference.encode(text)
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.count(text) == len(reference.encode(text))


def test_sample_document_and_random_mixes_equal_the_reference(tokenizer, reference):
    document = sorted(SAMPLES.glob("*.txt"))[0].read_text(encoding="utf-8")
    assert tokenizer.encode(document) == reference.encode(document)
    pool = "".join(TEXTS) + document[:2000]
    rng = random.Random(0)
    for _ in range(200):
        text = "".join(rng.choice(pool) for _ in range(rng.randrange(1, 80)))
        assert tokenizer.encode(text) == reference.encode(text), repr(text)


def test_vocabulary_facts(tokenizer):
    assert tokenizer.vocab_size == 65530  # ids 0..65529; the released models' embeddings have 65536 rows
    assert tokenizer.stop_ids == frozenset({END_OF_TEXT})
    assert tokenizer.decode([END_OF_TEXT]) == ""
    assert tokenizer.encode("\n\n") == [261]


def test_incomplete_utf8_is_held_back_by_the_detokenizer(tokenizer):
    text = "naïve 🦙 llama, 中文 and 𝔘𝔫𝔦"
    ids = tokenizer.encode(text)
    assert any(tokenizer.decode([i]).endswith("\ufffd") for i in ids)  # some character spans tokens
    detok = IncrementalDetokenizer(tokenizer)
    assert "".join(detok.push(i) for i in ids) + detok.flush() == text


def test_vocabulary_lines_are_never_executed(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"{b + 1} {bytes([b])!r} 1\n" for b in range(256)) + "257 __import__('os') 2\n")
    with pytest.raises(ValueError, match=":257:"):
        RwkvTokenizer.from_file(vocab)


# -- chat format --------------------------------------------------------------------------------


def test_chat_prompt_is_the_g1_format(tokenizer):
    ids = tokenizer.chat_prompt_ids("Summarize this.\n\nFirst paragraph.\n\n\nSecond one.\n", system="Be brief.")
    assert tokenizer.decode(ids) == (
        "System: Be brief.\n\nUser: Summarize this.\nFirst paragraph.\nSecond one.\n\nAssistant:"
    )


@pytest.mark.parametrize("chunk", [
    "The document text.\n\nA second paragraph.",
    "  \n\nLeading blank lines, then text 中文 and code `x = 1`.\n",
    "Ends mid-line",
])
def test_prefix_plus_suffix_equals_the_whole_prompt(tokenizer, chunk):
    instruction = "Write notes on this part.\n\nPart of the document:\n"
    question = "\n\nWrite the notes on this part now."
    split = tokenizer.chat_prefix_ids(None, instruction) + tokenizer.chat_suffix_ids(chunk, question)
    assert split == tokenizer.chat_prompt_ids(instruction + (chunk + question).lstrip())
    assert "\n\n" not in tokenizer.decode(split).removesuffix("\n\nAssistant:")  # one turn, no round breaks


def test_document_text_inside_a_turn_has_no_round_breaks(tokenizer):
    ids = tokenizer.chat_text_ids(" Paragraph one.\n\n\nParagraph two.\n \nThree.")
    assert tokenizer.decode(ids) == " Paragraph one.\nParagraph two.\nThree."


def test_an_answer_ends_where_the_next_round_opens(tokenizer):
    """Generation stops on these texts (see test_generate); a blank line alone does not end it."""
    assert "\n\nUser:" in tokenizer.stop_texts
    assert not any(stop in " Two paragraphs.\n\nStill the answer." for stop in tokenizer.stop_texts)
