"""Tokenizer, Qwen3.5 chat markup, stop ids and streaming detokenization.

Document text is never parsed for control tokens: a PDF that contains the characters
`<|im_end|>` must not end the user turn. `Tokenizer.encode` therefore treats every added token
as plain text; only `encode_markup` (for our own templates) and the chat builders below place
control tokens, and they place them by id.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import tokenizers
from tokenizers import AddedToken

from summarize.errors import SummarizeError, first_line

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
THINK = "<think>"
END_THINK = "</think>"

# U+FFFD: what a byte-level decoder yields for an incomplete UTF-8 sequence.
REPLACEMENT_CHAR = "\ufffd"


class Tokenizer:
    """A `tokenizers.Tokenizer` with safe plain-text encoding.

    Added tokens that the file marks non-special (some checkpoints ship `<think>` that way) are
    promoted to special so that plain encoding splits them too; `decode` still skips only the
    tokens that the file itself calls special. The wrapped tokenizer is configured in place.
    """

    stop_texts: tuple[str, ...] = ()  # a Qwen turn ends on a stop id (<|im_end|>), not on text
    banned_ids: frozenset[int] = frozenset()  # every token may be sampled

    def __init__(self, raw: tokenizers.Tokenizer) -> None:
        added = raw.get_added_tokens_decoder()  # {id: AddedToken}
        self._skip_ids = frozenset(i for i, t in added.items() if t.special)
        promoted = [t for t in added.values() if not t.special]
        if promoted:
            raw.add_special_tokens([
                AddedToken(t.content, single_word=t.single_word, lstrip=t.lstrip, rstrip=t.rstrip,
                           normalized=t.normalized, special=True)
                for t in promoted
            ])
        # Special tokens in the input are split like ordinary text, never matched.
        raw.encode_special_tokens = True
        self._raw = raw
        self._has_promoted = bool(promoted)
        self._added = {t.content: i for i, t in added.items()}
        # Longest first, so that a token that is a prefix of another cannot shadow it.
        contents = sorted(self._added, key=len, reverse=True)
        self._markup_re = re.compile("|".join(map(re.escape, contents))) if contents else None

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        """Load a Hugging Face `tokenizer.json`; a file it cannot read is a one-line error naming it."""
        try:
            raw = tokenizers.Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises a bare Exception for any bad file
                        raise SummarizeError(f"{path}: not a readable tokenizer.json ({first_line(exc)})") from None
        return cls(raw)

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included (the model's embedding may be larger)."""
        return self._raw.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` as plain text: control-token strings in it are not recognised."""
        # The batch-fast path skips offset tracking, which is most of the cost on long text.
        return self._raw.encode_batch_fast([text], add_special_tokens=False)[0].ids

    def count(self, text: str) -> int:
        """Number of tokens `encode(text)` would give."""
        return len(self._raw.encode_batch_fast([text], add_special_tokens=False)[0])

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """`count` of each text, encoded in parallel."""
        return [len(e) for e in self._raw.encode_batch_fast(list(texts), add_special_tokens=False)]

    def encode_markup(self, text: str) -> list[int]:
        """Token ids of `text` with added-token strings (`<|im_start|>`, ...) parsed as such.

        Only for markup we write ourselves; never pass document text through it.
        """
        if self._markup_re is None:
            return self.encode(text)
        ids: list[int] = []
        start = 0
        for m in self._markup_re.finditer(text):
            if m.start() > start:
                ids += self.encode(text[start:m.start()])
            ids.append(self._added[m.group()])
            start = m.end()
        if start < len(text):
            ids += self.encode(text[start:])
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; with `skip_special_tokens`, control tokens are left out."""
        ids = list(ids)
        if skip_special_tokens and self._has_promoted:
            ids = [i for i in ids if i not in self._skip_ids]
            return self._raw.decode(ids, skip_special_tokens=False)
        return self._raw.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_id(self, special: str) -> int:
        """Id of a single token given by its string, e.g. `"<|im_end|>"`; KeyError if none."""
        i = self._added.get(special)
        if i is None:
            i = self._raw.token_to_id(special)
        if i is None:
            raise KeyError(f"the tokenizer has no token {special!r}")
        return i

    def has_token(self, special: str) -> bool:
        try:
            self.token_id(special)
        except KeyError:
            return False
        return True

    # The chat surface the pipeline calls; every family's tokenizer has these methods.

    def chat_prompt_ids(self, user: str, *, system: str | None = None, assistant_prefix: str = "") -> list[int]:
        return chat_prompt_ids(self, user, system=system, assistant_prefix=assistant_prefix)

    def chat_prefix_ids(self, system: str | None, instruction: str) -> list[int]:
        return chat_prefix_ids(self, system, instruction)

    def chat_suffix_ids(self, document_chunk: str, question: str = "", *, assistant_prefix: str = "") -> list[int]:
        return chat_suffix_ids(self, document_chunk, question, assistant_prefix=assistant_prefix)

    def chat_text_ids(self, text: str) -> list[int]:
        """Ids of more user-turn text, between `chat_prefix_ids` and `chat_suffix_ids`."""
        return self.encode(text)



# ---------------------------------------------------------------------------------------------
# Qwen3.5 chat format, thinking off:
#   [<|im_start|>system\n{system}<|im_end|>\n]
#   <|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n{prefix}
# Text between control tokens is encoded as one plain-text piece, exactly as a tokenizer that
# parses the whole rendered template would split it; control tokens are placed by id.


def _encode_parts(tokenizer: Tokenizer, parts: Sequence[str | int]) -> list[int]:
    """Encode a mix of plain text (str) and token ids (int); adjacent strings are joined first."""
    ids: list[int] = []
    text: list[str] = []
    for part in parts:
        if isinstance(part, int):
            if text:
                ids += tokenizer.encode("".join(text))
                text = []
            ids.append(part)
        else:
            text.append(part)
    if text and "".join(text):
        ids += tokenizer.encode("".join(text))
    return ids


def _system_parts(tokenizer: Tokenizer, system: str | None) -> list[str | int]:
    if system is None:
        return []
    return [tokenizer.token_id(IM_START), "system\n" + system, tokenizer.token_id(IM_END), "\n"]


def _assistant_open_parts(tokenizer: Tokenizer, assistant_prefix: str) -> list[str | int]:
    """Close the user turn and open the assistant turn with an empty thinking block."""
    return [tokenizer.token_id(IM_END), "\n", tokenizer.token_id(IM_START), "assistant\n",
            tokenizer.token_id(THINK), "\n\n", tokenizer.token_id(END_THINK),
            "\n\n" + assistant_prefix]


def chat_prompt_ids(tokenizer: Tokenizer, user: str, *, system: str | None = None,
                    assistant_prefix: str = "") -> list[int]:
    """A one-turn chat prompt with thinking off; `user` is encoded as plain text."""
    parts = [*_system_parts(tokenizer, system), tokenizer.token_id(IM_START), "user\n" + user,
             *_assistant_open_parts(tokenizer, assistant_prefix)]
    return _encode_parts(tokenizer, parts)


def chat_prefix_ids(tokenizer: Tokenizer, system: str | None, instruction: str) -> list[int]:
    """The shared start of a prompt: the optional system turn and the user turn up to `instruction`.

    `instruction` must be empty or end with a newline. The pre-tokenizer never joins a newline
    with a following non-space character, so no token crosses the seam and
        chat_prefix_ids(t, s, i) + chat_suffix_ids(t, d, q)
            == chat_prompt_ids(t, i + (d + q).lstrip(), system=s)
    token for token.
    """
    if instruction and not instruction.endswith("\n"):
        raise ValueError("the instruction of a shared prefix must end with a newline")
    parts = [*_system_parts(tokenizer, system), tokenizer.token_id(IM_START),
             "user\n" + instruction]
    return _encode_parts(tokenizer, parts)


def chat_suffix_ids(tokenizer: Tokenizer, document_chunk: str, question: str = "", *,
                    assistant_prefix: str = "") -> list[int]:
    """The per-chunk rest of the prompt that `chat_prefix_ids` starts.

    Leading whitespace of `document_chunk + question` is dropped: the seam must start with a
    non-space character (the instruction already ends the line).
    """
    body = (document_chunk + question).lstrip()
    return _encode_parts(tokenizer, [body, *_assistant_open_parts(tokenizer, assistant_prefix)])


# ---------------------------------------------------------------------------------------------


def _eos_ids(config: dict, path: Path) -> set[int]:
    value = config.get("eos_token_id")
    if value is None:
        return set()
    values = value if isinstance(value, list) else [value]
    if not all(type(v) is int and v >= 0 for v in values):
        raise SummarizeError(f"{path}: eos_token_id must be a token id or a list of them, not {value!r}")
    return set(values)


def _json_object(path: Path) -> dict:
    """A JSON file that must hold an object; anything else is a one-line error naming it."""
    try:
        config = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deep
        raise SummarizeError(f"{path}: not valid JSON ({getattr(exc, 'msg', type(exc).__name__)})") from None
    except OSError as exc:
        raise SummarizeError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not isinstance(config, dict):
        raise SummarizeError(f"{path}: not a JSON object of settings (a {type(config).__name__})")
    return config


def load_stop_ids(model_dir: str | Path, tokenizer: Tokenizer | None = None) -> frozenset[int]:
    """Token ids that end generation.

    The union of `eos_token_id` (int or list) from `generation_config.json` and `config.json`
    (top level and `text_config`) and the tokenizer's `<|im_end|>` and `<|endoftext|>`: a chat
    turn ends on `<|im_end|>` even where a config names only `<|endoftext|>`. Without a
    `tokenizer`, the folder's `tokenizer.json` is read when present.
    """
    model_dir = Path(model_dir)
    ids: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        path = model_dir / name
        if not path.is_file():
            continue
        config = _json_object(path)
        ids |= _eos_ids(config, path)
        if isinstance(config.get("text_config"), dict):
            ids |= _eos_ids(config["text_config"], path)
    if tokenizer is None and (model_dir / "tokenizer.json").is_file():
        tokenizer = Tokenizer.from_file(model_dir / "tokenizer.json")
    if tokenizer is not None:
        ids |= {tokenizer.token_id(s) for s in (IM_END, END_OF_TEXT) if tokenizer.has_token(s)}
    return frozenset(ids)


def load_hub_tokenizer(folder: Path) -> tuple[Tokenizer, frozenset[int]]:
    """The `tokenizer.json` beside a hub checkpoint's weights, and its stop ids."""
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise SummarizeError(f"{folder}: no tokenizer.json beside the weights")
    tokenizer = Tokenizer.from_file(path)
    return tokenizer, load_stop_ids(folder, tokenizer)


class IncrementalDetokenizer:
    """Turns a stream of token ids into text pieces, never splitting a character.

    Byte-level BPE may spread one character over several tokens; until the bytes complete it,
    the decoded text ends in U+FFFD and is held back. Each push decodes only a short window of
    recent tokens: the last emitted tokens (context for decoders that strip a leading space)
    plus those not yet emitted.
    """

    # Past this many held-back tokens the bytes cannot be a character in progress (UTF-8 needs
    # at most 4 bytes); the model wrote invalid UTF-8, so emit it with replacement characters.
    MAX_PENDING = 8

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._window: list[int] = []
        self._emitted = 0  # tokens of `_window` whose text has been returned

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (often "", sometimes several characters)."""
        self._window.append(token_id)
        done_text = self._decode(self._window[:self._emitted]) if self._emitted else ""
        text = self._decode(self._window)
        if text.endswith(REPLACEMENT_CHAR) and len(self._window) - self._emitted < self.MAX_PENDING:
            return ""
        # The window restarts at the tokens just emitted, which serve as context next time.
        self._window = self._window[self._emitted:]
        self._emitted = len(self._window)
        return text[len(done_text):]

    def flush(self) -> str:
        """Return whatever is held back (at the end of generation)."""
        if self._emitted == len(self._window):
            return ""
        done_text = self._decode(self._window[:self._emitted]) if self._emitted else ""
        text = self._decode(self._window)
        self._window = []
        self._emitted = 0
        return text[len(done_text):]
