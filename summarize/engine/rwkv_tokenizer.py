"""The RWKV World tokenizer, and the chat format of the RWKV-7 G1 models.

Encoding is a greedy longest match over the UTF-8 bytes of the text on the vocabulary
`rwkv_vocab_v20230424.txt` (65,529 byte strings, ids 1..65529; every single byte is one of them,
so every text encodes). Id 0 is end-of-text and has no bytes. The result is the same as the `rwkv`
package's `TRIE_TOKENIZER`. The vocabulary file is read with `ast.literal_eval`: a line is a Python
str or bytes literal, and nothing in the file is ever executed.

Chat format (no thinking; the G-series model cards' "no-think-mode" prompt):

    [System: {system}\\n\\n]User: {user}\\n\\nAssistant:

"\\n\\n" separates chat rounds in the models' training data, so blank lines inside a turn are
closed up to single newlines (the model cards advise it), and an answer ends where the model
opens the next round ("\\n\\nUser:", cut off by the caller) or at token 0.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path

from summarize.errors import SummarizeError

VOCAB_FILE = Path(__file__).resolve().parents[1] / "data" / "rwkv_vocab_v20230424.txt"
END_OF_TEXT = 0  # the id that ends a document; it has no bytes
STOP_TEXTS = ("\n\nUser:",)  # the model opening the next chat round: its answer is complete
_BLANK_LINES = re.compile(r"\n\s*\n")
_ID = -1  # key of a trie node that holds the id of the token ending there (bytes keys are 0..255)


class VocabularyError(SummarizeError, ValueError):
    """A vocabulary file that cannot be read or lacks tokens; the message names the file."""


class RwkvTokenizer:
    """Greedy longest-match byte tokenizer with the surface the pipeline uses (see tokenizer.Tokenizer)."""

    stop_ids = frozenset({END_OF_TEXT})
    stop_texts = STOP_TEXTS

    def __init__(self, tokens: dict[int, bytes]) -> None:
        if not tokens:
            raise VocabularyError("the vocabulary has no tokens")
        self._bytes = tokens
        self._vocab_size = max(tokens) + 1
        # A byte trie of dicts: node[byte] -> child node, node[_ID] -> id of the token ending here.
        root: dict = {}
        for token_id, data in tokens.items():
            node = root
            for byte in data:
                node = node.setdefault(byte, {})
            node[_ID] = token_id
        missing = [byte for byte in range(256) if _ID not in root.get(byte, {})]
        if missing:
            raise VocabularyError(f"the vocabulary lacks single-byte tokens {missing[:5]}; some texts could not be encoded")
        self._root = root

    @classmethod
    def from_file(cls, path: str | Path) -> RwkvTokenizer:
        """Read a vocabulary file: lines `<id> <Python str or bytes literal> <byte length>`."""
        tokens: dict[int, bytes] = {}
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise VocabularyError(f"{path}: not a readable vocabulary ({getattr(exc, 'strerror', None) or exc})") from None
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                token_id = int(line[: line.index(" ")])
                literal = ast.literal_eval(line[line.index(" ") : line.rindex(" ")].strip())
                length = int(line[line.rindex(" ") :])
            except (ValueError, SyntaxError) as exc:
                raise VocabularyError(f"{path}:{number}: not a vocabulary line ({exc})") from None
            data = literal.encode("utf-8") if isinstance(literal, str) else literal
            if not isinstance(data, bytes) or len(data) != length:
                raise VocabularyError(f"{path}:{number}: token {token_id} does not have the {length} bytes it claims")
            tokens[token_id] = data
        try:
            return cls(tokens)
        except VocabularyError as exc:
            raise VocabularyError(f"{path}: {exc}") from None

    @classmethod
    def default(cls) -> RwkvTokenizer:
        """The World vocabulary shipped with the package (read once per process)."""
        return _default_tokenizer()

    @property
    def vocab_size(self) -> int:
        """Number of token ids, end-of-text included (the model's embedding may be larger)."""
        return self._vocab_size

    # -- plain text ------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`: at each position, the longest vocabulary entry that matches."""
        return self.encode_bytes(text.encode("utf-8"))

    def encode_bytes(self, data: bytes) -> list[int]:
        ids: list[int] = []
        root, n, i = self._root, len(data), 0
        while i < n:
            node, j = root, i
            best_id, best_end = -1, i
            while j < n:
                node = node.get(data[j])
                if node is None:
                    break
                j += 1
                token_id = node.get(_ID)
                if token_id is not None:
                    best_id, best_end = token_id, j
            ids.append(best_id)  # every single byte is a token: best_end > i
            i = best_end
        return ids

    def count(self, text: str) -> int:
        """Number of tokens `encode(text)` would give."""
        return len(self.encode(text))

    def count_many(self, texts: Sequence[str]) -> list[int]:
        return [self.count(text) for text in texts]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; end-of-text has no text. Incomplete UTF-8 becomes U+FFFD (at the end too,
        which is what `IncrementalDetokenizer` waits on)."""
        table = self._bytes
        return b"".join(table.get(i, b"") for i in ids).decode("utf-8", errors="replace")

    # -- chat --------------------------------------------------------------------------------------

    def chat_prompt_ids(self, user: str, *, system: str | None = None, assistant_prefix: str = "") -> list[int]:
        """A one-turn chat prompt; `user` is plain text (its blank lines closed up)."""
        return (self._system(system) + self.encode("User: " + _one_turn(user).strip())
                + self._assistant_open(assistant_prefix))

    def chat_prefix_ids(self, system: str | None, instruction: str) -> list[int]:
        """The shared start of a prompt, up to and including `instruction` (empty or ending in a newline).

        No vocabulary entry holds a newline followed by anything but whitespace, so no token
        crosses the seam and
            chat_prefix_ids(s, i) + chat_suffix_ids(d, q) == chat_prompt_ids(i + (d + q).lstrip(), system=s)
        token for token (when `i` ends in a single newline).
        """
        if instruction and not instruction.endswith("\n"):
            raise ValueError("the instruction of a shared prefix must end with a newline")
        return self._system(system) + self.encode("User: " + _one_turn(instruction).lstrip())

    def chat_suffix_ids(self, document_chunk: str, question: str = "", *, assistant_prefix: str = "") -> list[int]:
        """The per-chunk rest of the prompt that `chat_prefix_ids` starts."""
        body = _one_turn(document_chunk + question).strip()
        return self.encode(body) + self._assistant_open(assistant_prefix)

    def chat_text_ids(self, text: str) -> list[int]:
        """Ids of more user-turn text, between `chat_prefix_ids` and `chat_suffix_ids`."""
        return self.encode(_one_turn(text))

    def _system(self, system: str | None) -> list[int]:
        return [] if system is None else self.encode("System: " + _one_turn(system).strip() + "\n\n")

    def _assistant_open(self, assistant_prefix: str) -> list[int]:
        return self.encode("\n\nAssistant:" + (" " + assistant_prefix if assistant_prefix else ""))


def _one_turn(text: str) -> str:
    """Blank lines closed up to one newline: "\\n\\n" would read as the end of the turn."""
    return _BLANK_LINES.sub("\n", text)


@lru_cache(maxsize=1)
def _default_tokenizer() -> RwkvTokenizer:
    return RwkvTokenizer.from_file(VOCAB_FILE)


def load_rwkv_tokenizer(folder: Path) -> tuple[RwkvTokenizer, frozenset[int]]:
    """The RWKV World tokenizer (the same for every checkpoint: its vocabulary ships with us)."""
    tokenizer = RwkvTokenizer.default()
    return tokenizer, tokenizer.stop_ids
