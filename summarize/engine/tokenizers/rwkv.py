"""The RWKV World tokenizer, and the chat formats of the RWKV models.

Encoding is a greedy longest match over the UTF-8 bytes of the text on the vocabulary
`rwkv_vocab_v20230424.txt` (65,529 byte strings, ids 1..65529; every single byte is one of them,
so every text encodes). Id 0 is end-of-text and has no bytes. The result is the same as the `rwkv`
package's `TRIE_TOKENIZER`. The vocabulary file is read with `ast.literal_eval`: a line is a Python
str or bytes literal, and nothing in the file is ever executed. A model's folder may hold its own
vocabulary (`rwkv_vocab_v*.txt`): Mobius's is v20230424 plus `<|im_start|>`, `<|im_end|>` and
`<|endoftext|>` at 65530-65532, written as bytes literals under the old file name.

Chat formats (`ChatFormat`; no thinking):

    G1 (RWKV-7), World (RWKV-6):  [System: {system}\n\n]User: {user}\n\nAssistant:
    Mobius (RWKV-6 whose vocabulary has <|im_start|> and <|im_end|>):
        [<|im_start|>System: {system}<|im_end|>\n]<|im_start|>User: {user}<|im_end|>\n<|im_start|>Assistant:

"\n\n" separates chat rounds in the World models' training data, so there blank lines inside a turn
are closed up to single newlines (the model cards advise it). A G1 answer ends at token 0 or where
the model opens the next round ("\n\nUser:", cut off by the caller); a World answer ends at
"\n\n" and never at token 0, which is not sampled (as BlinkDL's chat demo does); a Mobius answer
ends at <|im_end|>. Control tokens are placed by id: document text never yields them.
"""

from __future__ import annotations

import ast
import copy
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from summarize.errors import SummarizeError

VOCAB_FILE = Path(__file__).resolve().parents[2] / "data" / "rwkv_vocab_v20230424.txt"
VOCAB_GLOB = "rwkv_vocab_v*.txt"  # a vocabulary shipped in a model's folder
END_OF_TEXT = 0  # the id that ends a document; it has no bytes
_BLANK_LINES = re.compile(r"\n\s*\n")
_ID = -1  # key of a trie node that holds the id of the token ending there (bytes keys are 0..255)


@dataclass(frozen=True)
class ChatFormat:
    """How one kind of RWKV model was trained to chat, and where its answers end.

    Control tokens are given by their bytes and found in the vocabulary; a format whose tokens a
    vocabulary lacks does not fit it (`fits`).
    """

    name: str
    turn_start: bytes = b""  # a control token that opens every turn (<|im_start|>), or none
    turn_end: bytes = b""  # a control token that closes every turn (<|im_end|>), or none
    turn_gap: str = "\n\n"  # the text between two turns
    stop_tokens: tuple[bytes, ...] = ()  # control tokens that end an answer
    stop_at_end_of_text: bool = False  # token 0 ends an answer
    never_end_of_text: bool = False  # token 0 is never sampled
    stop_texts: tuple[str, ...] = ()  # text that ends an answer (cut off by the caller)
    one_paragraph: bool = True  # blank lines in a turn closed up: "\n\n" would read as its end

    @property
    def control_tokens(self) -> tuple[bytes, ...]:
        return tuple(dict.fromkeys(t for t in (self.turn_start, self.turn_end, *self.stop_tokens) if t))


G1_CHAT = ChatFormat("G1", stop_at_end_of_text=True, stop_texts=("\n\nUser:",))
WORLD_CHAT = ChatFormat("World", never_end_of_text=True, stop_texts=("\n\n",))
MOBIUS_CHAT = ChatFormat(
    "Mobius", turn_start=b"<|im_start|>", turn_end=b"<|im_end|>", turn_gap="\n",
    # <|endoftext|> too: after it the model starts another document, not more of this answer
    stop_tokens=(b"<|im_end|>", b"<|endoftext|>"), never_end_of_text=True, one_paragraph=False,
)


class VocabularyError(SummarizeError, ValueError):
    """A vocabulary file that cannot be read or lacks tokens; the message names the file."""


class RwkvTokenizer:
    """Greedy longest-match byte tokenizer with the surface the pipeline uses (see tokenizer.Tokenizer):
    `stop_ids`, `stop_texts` and `banned_ids` (never sampled) come from its `ChatFormat`."""

    def __init__(self, tokens: dict[int, bytes], chat: ChatFormat = G1_CHAT) -> None:
        if not tokens:
            raise VocabularyError("the vocabulary has no tokens")
        self._bytes = tokens
        self._vocab_size = max(tokens) + 1
        self._ids = {data: token_id for token_id, data in tokens.items()}
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
        self._use(chat)

    def fits(self, chat: ChatFormat) -> bool:
        """Whether the vocabulary holds every control token of `chat`."""
        return all(token in self._ids for token in chat.control_tokens)

    def with_chat(self, chat: ChatFormat) -> RwkvTokenizer:
        """The same vocabulary (shared, not copied) with another chat format."""
        other = copy.copy(self)
        other._use(chat)
        return other

    def _use(self, chat: ChatFormat) -> None:
        if not self.fits(chat):
            missing = [t.decode("utf-8", "replace") for t in chat.control_tokens if t not in self._ids]
            raise VocabularyError(f"the vocabulary lacks the {chat.name} chat tokens {', '.join(missing)}")
        ids = self._ids
        self.chat = chat
        self.stop_ids = frozenset({END_OF_TEXT} if chat.stop_at_end_of_text else set()) | {ids[t] for t in chat.stop_tokens}
        self.stop_texts = chat.stop_texts
        self.banned_ids = frozenset({END_OF_TEXT} if chat.never_end_of_text else set())
        self._controls = frozenset(ids[t] for t in chat.control_tokens)  # never made from text in a turn
        self._turn_start = [ids[chat.turn_start]] if chat.turn_start else []
        self._turn_end = [ids[chat.turn_end]] if chat.turn_end else []

    @classmethod
    def from_file(cls, path: str | Path, chat: ChatFormat = G1_CHAT) -> RwkvTokenizer:
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
            return cls(tokens, chat)
        except VocabularyError as exc:
            raise VocabularyError(f"{path}: {exc}") from None

    @classmethod
    def default(cls) -> RwkvTokenizer:
        """The World vocabulary shipped with the package, G1's chat format (read once per process)."""
        return read_vocabulary(VOCAB_FILE)

    @property
    def vocab_size(self) -> int:
        """Number of token ids, end-of-text included (the model's embedding may be larger)."""
        return self._vocab_size

    # -- plain text ------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`: at each position, the longest vocabulary entry that matches."""
        return self.encode_bytes(text.encode("utf-8"))

    def encode_bytes(self, data: bytes, skip: frozenset[int] = frozenset()) -> list[int]:
        """Token ids of `data`; with `skip`, the longest match that is not one of those ids."""
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
                if token_id is not None and token_id not in skip:
                    best_id, best_end = token_id, j
            ids.append(best_id)  # every single byte is a token (and none is a control token): best_end > i
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
        """A one-turn chat prompt; `user` is plain text (its blank lines closed up where the format wants)."""
        user_turn = self._turn_start + self._text("User: " + self._turn(user).strip())
        return self._system(system) + user_turn + self._assistant_open(assistant_prefix)

    def chat_prefix_ids(self, system: str | None, instruction: str) -> list[int]:
        """The shared start of a prompt, up to and including `instruction` (empty or ending in a newline).

        No vocabulary entry holds a newline followed by anything but whitespace, so no token
        crosses the seam and
            chat_prefix_ids(s, i) + chat_suffix_ids(d, q) == chat_prompt_ids(i + (d + q).lstrip(), system=s)
        token for token (when `i` ends in a single newline).
        """
        if instruction and not instruction.endswith("\n"):
            raise ValueError("the instruction of a shared prefix must end with a newline")
        return self._system(system) + self._turn_start + self._text("User: " + self._turn(instruction).lstrip())

    def chat_suffix_ids(self, document_chunk: str, question: str = "", *, assistant_prefix: str = "") -> list[int]:
        """The per-chunk rest of the prompt that `chat_prefix_ids` starts."""
        body = self._turn(document_chunk + question).strip()
        return self._text(body) + self._assistant_open(assistant_prefix)

    def chat_text_ids(self, text: str) -> list[int]:
        """Ids of more user-turn text, between `chat_prefix_ids` and `chat_suffix_ids`."""
        return self._text(self._turn(text))

    def _system(self, system: str | None) -> list[int]:
        if system is None:
            return []
        body = "System: " + self._turn(system).strip()
        if not self._turn_end:  # the gap is text of the turn, as the models read it
            return self._text(body + self.chat.turn_gap)
        return self._turn_start + self._text(body) + self._turn_end + self._text(self.chat.turn_gap)

    def _assistant_open(self, assistant_prefix: str) -> list[int]:
        opening = "Assistant:" + (" " + assistant_prefix if assistant_prefix else "")
        if not self._turn_end:
            return self._text(self.chat.turn_gap + opening)
        return self._turn_end + self._text(self.chat.turn_gap) + self._turn_start + self._text(opening)

    def _turn(self, text: str) -> str:
        return _one_paragraph(text) if self.chat.one_paragraph else text

    def _text(self, text: str) -> list[int]:
        """Ids of text inside a turn: control tokens are never made from it, whatever it holds."""
        return self.encode_bytes(text.encode("utf-8"), self._controls)


def _one_paragraph(text: str) -> str:
    """Blank lines closed up to one newline: "\n\n" would read as the end of the turn."""
    return _BLANK_LINES.sub("\n", text)


def vocabulary_file(folder: Path | None) -> Path:
    """The vocabulary in a model's folder (the newest version if it has several), else the shipped one."""
    found = sorted(Path(folder).glob(VOCAB_GLOB)) if folder is not None and Path(folder).is_dir() else []
    return found[-1] if found else VOCAB_FILE


def read_vocabulary(path: Path) -> RwkvTokenizer:
    """The tokenizer of a vocabulary file (G1's chat format), read once per process and file version."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError as exc:
        raise VocabularyError(f"{path}: not a readable vocabulary ({exc.strerror or exc})") from None
    return _read_cached(path.resolve(), (stat.st_mtime_ns, stat.st_size))


@lru_cache(maxsize=4)
def _read_cached(path: Path, version: tuple[int, int]) -> RwkvTokenizer:
    return RwkvTokenizer.from_file(path)


def load_rwkv_tokenizer(folder: Path, formats: Sequence[ChatFormat] = (G1_CHAT,)) -> tuple[RwkvTokenizer, frozenset[int]]:
    """The tokenizer of a model in `folder` (its own vocabulary, else the shipped World one) with
    the first of `formats` whose control tokens the vocabulary holds, and the ids that end its answers."""
    path = vocabulary_file(folder)
    vocabulary = read_vocabulary(path)
    try:
        tokenizer = vocabulary.with_chat(next((chat for chat in formats if vocabulary.fits(chat)), formats[-1]))
    except VocabularyError as exc:
        raise VocabularyError(f"{path}: {exc}") from None
    return tokenizer, tokenizer.stop_ids
