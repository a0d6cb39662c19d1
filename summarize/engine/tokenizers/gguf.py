"""The tokenizer a GGUF file carries in its metadata, and the token ids that end an answer.

`tokenizer.ggml.model` says which kind:
- `gpt2`: byte-level BPE. `tokens` (ids in order), `merges` ("a b" per line) and `token_type`
  (1 normal, 3 control, 4 user-defined, 5 unused) become a `tokenizers` BPE tokenizer; control
  tokens are added as special tokens, user-defined ones as plain added tokens, unused ones
  (llama.cpp's `[PAD…]` fillers) are left out. What splits text before BPE is not stored, only its
  name (`tokenizer.ggml.pre`); the tokenizer.json settings of the models that name it are here.
- `rwkv`: the RWKV World vocabulary, each token's bytes written as the inside of a Python bytes
  literal (`\\xe4\\xb8\\x80`); token 0 is end-of-text.
"""

from __future__ import annotations

import json

import tokenizers

from summarize.engine.tokenizers.rwkv import RwkvTokenizer
from summarize.engine.tokenizers.tokenizer import END_OF_TEXT, IM_END, Tokenizer
from summarize.engine.weights.gguf_file import GGUFFile
from summarize.errors import SummarizeError, first_line

NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5

# tokenizer.ggml.pre -> the Split pattern of the tokenizer.json those files were made from
# (Qwen3.5's adds \p{M}: combining marks stay with their letters). Both normalise to NFC first.
SPLIT_PATTERNS = {
    "qwen35": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+",
}


def load_gguf_tokenizer(file: GGUFFile) -> tuple[Tokenizer | RwkvTokenizer, frozenset[int]]:
    """The file's tokenizer and its stop ids."""
    model = file.get("tokenizer.ggml.model", str)
    if model == "gpt2":
        return _bpe_tokenizer(file)
    if model == "rwkv":
        return _rwkv_tokenizer(file)
    raise SummarizeError(f"{file.path}: tokenizer kind {model!r} is not supported (supported: gpt2, rwkv)")


def _bpe_tokenizer(file: GGUFFile) -> tuple[Tokenizer, frozenset[int]]:
    pre = file.get("tokenizer.ggml.pre", str, "default")
    pattern = SPLIT_PATTERNS.get(pre)
    if pattern is None:
        raise SummarizeError(f"{file.path}: pre-tokenizer {pre!r} is not supported (supported: {', '.join(SPLIT_PATTERNS)})")
    tokens = file.strings("tokenizer.ggml.tokens")
    types = file.get("tokenizer.ggml.token_type", list, [NORMAL] * len(tokens))
    if len(types) != len(tokens):
        raise SummarizeError(f"{file.path}: {len(tokens)} tokens but {len(types)} token types")
    vocab = {token: i for i, (token, kind) in enumerate(zip(tokens, types)) if kind == NORMAL}
    merges = [merge.split(" ", 1) for merge in file.strings("tokenizer.ggml.merges")]
    added = [
        {"id": i, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": kind == CONTROL}
        for i, (token, kind) in enumerate(zip(tokens, types)) if kind in (CONTROL, USER_DEFINED)
    ]
    spec = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        ]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    try:
        raw = tokenizers.Tokenizer.from_str(json.dumps(spec))
    except Exception as exc:  # the library raises a bare Exception for a vocabulary it cannot use
                raise SummarizeError(f"{file.path}: its vocabulary does not make a tokenizer ({first_line(exc)})") from None
    tokenizer = Tokenizer(raw)
    stop = _metadata_ids(file, len(tokens))
    stop |= {tokenizer.token_id(s) for s in (IM_END, END_OF_TEXT) if tokenizer.has_token(s)}  # as load_stop_ids does
    return tokenizer, frozenset(stop)


def _rwkv_tokenizer(file: GGUFFile) -> tuple[RwkvTokenizer, frozenset[int]]:
    tokens = file.strings("tokenizer.ggml.tokens")
    types = file.get("tokenizer.ggml.token_type", list, [NORMAL] * len(tokens))
    vocabulary = {i: _unescape(token, file) for i, (token, kind) in enumerate(zip(tokens, types)) if kind == NORMAL and i > 0}
    try:
        tokenizer = RwkvTokenizer(vocabulary)
    except SummarizeError as exc:
        raise SummarizeError(f"{file.path}: {exc}") from None
    # eos (0) ends a document; the converter's eot, "\n\n" (261), is left out: the chat format's stop
    # text ("\n\nUser:") ends an answer, so an answer may hold blank lines before it
    return tokenizer, frozenset(tokenizer.stop_ids | _metadata_ids(file, len(tokens), ("eos",)))


def _metadata_ids(file: GGUFFile, vocab_size: int, kinds: tuple[str, ...] = ("eos", "eot")) -> set[int]:
    ids = set()
    for kind in kinds:
        token_id = file.get(f"tokenizer.ggml.{kind}_token_id", int, None)
        if token_id is not None:
            if not 0 <= token_id < vocab_size:
                raise SummarizeError(f"{file.path}: tokenizer.ggml.{kind}_token_id {token_id} is not a token id")
            ids.add(token_id)
    return ids


_ESCAPES = {"\\": 0x5C, "'": 0x27, '"': 0x22, "n": 0x0A, "r": 0x0D, "t": 0x09}


def _unescape(text: str, file: GGUFFile) -> bytes:
    """The bytes a token written as the inside of a Python bytes literal stands for."""
    if "\\" not in text:
        return text.encode("utf-8")
    out, i = bytearray(), 0
    while i < len(text):
        char = text[i]
        if char != "\\":
            out += char.encode("utf-8")
            i += 1
        elif text[i + 1 : i + 2] == "x":
            try:
                out.append(int(text[i + 2 : i + 4], 16))
            except ValueError:
                raise SummarizeError(f"{file.path}: RWKV token {text!r} has a broken escape") from None
            i += 4
        elif text[i + 1 : i + 2] in _ESCAPES:
            out.append(_ESCAPES[text[i + 1]])
            i += 2
        else:
            raise SummarizeError(f"{file.path}: RWKV token {text!r} has a broken escape")
    return bytes(out)
