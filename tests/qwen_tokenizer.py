"""The Qwen3.5 tokenizer the tests use: the released one cut down to the words of this repository
(`data/qwen3.5-tokenizer-small.json.gz`, ~200 KB; `data/build_qwen_tokenizer.py` makes it).

It has the released file's normalizer, pre-tokenizer, decoder, special tokens, chat markup and
ids: every text of the tests and samples encodes to the released ids. The ids it left out are
filled with placeholder words that no text encodes to, so that the vocabulary has its real size
and a random model's every token decodes to something. A few tests count what a random model's
text becomes in words and tokens, which the placeholders change: they need the released file,
named by SUMMARIZE_QWEN_TOKENIZER or found in ../shared/reference/qwen3.5 beside the repository.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
from pathlib import Path

SMALL = Path(__file__).resolve().parent / "data" / "qwen3.5-tokenizer-small.json.gz"
SHARED_RELEASED = Path(__file__).resolve().parents[2] / "shared" / "reference" / "qwen3.5" / "tokenizer.json"
RELEASED_ENV = "SUMMARIZE_QWEN_TOKENIZER"
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


def released_tokenizer_json() -> Path | None:
    """The released tokenizer.json where it is at hand, else None."""
    named = os.environ.get(RELEASED_ENV)
    if named:
        return Path(named)
    return SHARED_RELEASED if SHARED_RELEASED.is_file() else None


def tokenizer_json() -> Path:
    """The small file completed, as a tokenizer.json (written once per version of it, in the
    temporary folder)."""
    packed = SMALL.read_bytes()
    path = Path(tempfile.gettempdir()) / f"summarize-tests-qwen3.5-{hashlib.sha256(packed).hexdigest()[:16]}.json"
    if not path.is_file():
        scratch = path.with_suffix(f".{os.getpid()}.partial")
        scratch.write_text(json.dumps(completed(json.loads(gzip.decompress(packed)))), encoding="utf-8")
        os.replace(scratch, path)  # several test processes may write it at once
    return path
