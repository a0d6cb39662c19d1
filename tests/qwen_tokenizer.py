"""The Qwen3.5 tokenizer the tests use: the released one cut down to the words of this repository
(`data/qwen3.5-tokenizer-small.json.gz`, ~200 KB; `data/build_qwen_tokenizer.py` makes it).

It has the released file's normalizer, pre-tokenizer, decoder, special tokens, chat markup and
ids: every text of the tests and samples encodes to the released ids. The ids it left out are
filled with placeholder words that no text encodes to, so that the vocabulary has its real size
and a random model's every token decodes to something. SUMMARIZE_TEST_TOKENIZER=PATH runs the
tests with another tokenizer.json (the released one: ../shared/reference/qwen3.5/tokenizer.json).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
from pathlib import Path

SMALL = Path(__file__).resolve().parent / "data" / "qwen3.5-tokenizer-small.json.gz"
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def placeholder(token_id: int) -> str:
    """A word for an id the small file left out: 'Ġ' (a space, byte-level) and the id in letters."""
    word = ""
    while True:
        token_id, digit = divmod(token_id, len(LETTERS))
        word += LETTERS[digit]
        if not token_id:
            return "Ġzz" + word


def completed(spec: dict) -> dict:
    """`spec` (a tokenizer.json) with every id below the first added token's in its vocabulary."""
    vocab = spec["model"]["vocab"]
    size = min(token["id"] for token in spec["added_tokens"])
    taken = set(vocab.values())
    vocab |= {placeholder(i): i for i in range(size) if i not in taken}
    # the added tokens take the ids after the vocabulary's: a gap would move them
    assert len(vocab) == size, "a placeholder is a word of the file"
    return spec


def tokenizer_json() -> Path:
    """A tokenizer.json for the tests: SUMMARIZE_TEST_TOKENIZER, else the small file completed
    (written once per version of it, in the temporary folder)."""
    named = os.environ.get("SUMMARIZE_TEST_TOKENIZER")
    if named:
        return Path(named)
    packed = SMALL.read_bytes()
    path = Path(tempfile.gettempdir()) / f"summarize-tests-qwen3.5-{hashlib.sha256(packed).hexdigest()[:16]}.json"
    if not path.is_file():
        scratch = path.with_suffix(f".{os.getpid()}.partial")
        scratch.write_text(json.dumps(completed(json.loads(gzip.decompress(packed)))), encoding="utf-8")
        os.replace(scratch, path)  # several test processes may write it at once
    return path
