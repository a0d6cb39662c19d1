"""The shared vocabulary of the application: constants, the settings of a run, its results, the
protocols the summarizers and the UI implement, and how a name is shown on a terminal (`printable`).
It sits at the bottom: it imports nothing of ours.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

DEFAULT_MODEL = "Qwen/Qwen3.5-0.8B"
DEFAULT_WORDS = 300

MAP_REDUCE = "map-reduce"  # every chunk read alone from the instruction, the notes merged
STREAM = "stream"  # one pass, the state carried across the whole document
STRATEGIES = (MAP_REDUCE, STREAM)
DEFAULT_STRATEGY = MAP_REDUCE

STDIN = "-"  # the input name that reads standard input
STDIN_LABEL = "<stdin>"  # how messages name it

# The chunking the model summarizer uses when not told (its own constants must agree: tested).
# Below 64 tokens a chunk holds a sentence or two, and every chunk's notes cost a decode: minutes
# for a page (`--chunk-tokens 1` took 110 s for 400 bytes). Above 32K one chunk's prefill
# (activations, attention cache) outgrows a small machine's memory.
# Speculative decoding: the most tokens drafted (by prompt lookup) and verified per step; 0 is off.
# Its figures: bench/README.md (bench_speculative.py).
DEFAULT_SPECULATE = 8
MAX_SPECULATE = 32
# Where drafts come from: the document (prompt lookup), or the checkpoint's multi-token-prediction
# head (Qwen3.5 files with mtp.*). Lookup is the default: it costs nothing where it finds nothing.
DRAFT_SOURCES = ("document", "mtp")
DEFAULT_DRAFTS = "document"

# The memory the states of one batch of chunks may take in map-reduce (map_batch.py): 1 GiB holds
# 8 rows of the 0.8B model (~40–60 MB a row), whatever the document's length.
DEFAULT_BATCH_MEMORY = 2**30

# What the cache of what was read may hold (read_cache.py): a chunk's notes take ~1 KB, the state
# after a document ~70 MB (0.8B model, stream mode); the least recently used go first.
DEFAULT_CACHE_SIZE = 4 * 2**30

DEFAULT_CHUNK_TOKENS = 1536
DEFAULT_OVERLAP = 128
MIN_CHUNK_TOKENS, MAX_CHUNK_TOKENS = 64, 32768
MAX_OVERLAP_SHARE = 4  # the overlap is at most a quarter of a chunk, as the model summarizer keeps it

# Bump when the same settings start producing different output (new header format, new
# algorithm), so that files written by an older version stop counting as up to date.
FINGERPRINT_VERSION = 1
FINGERPRINT_LENGTH = 12

Status = Literal["ok", "skipped", "failed"]


@dataclass(frozen=True)
class Settings:
    """Everything that shapes one run. `None` leaves the choice to the engine's defaults."""

    words: int = DEFAULT_WORDS
    model: str = DEFAULT_MODEL
    device: str | None = None
    dtype: str | None = None
    quantize: str | None = None
    focus: str | None = None  # what a model summary should concentrate on (--focus)
    chunk_tokens: int | None = None
    overlap: int | None = None
    strategy: str = DEFAULT_STRATEGY
    extractive: bool = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    speculate: int = DEFAULT_SPECULATE  # output-invariant (greedy: the same tokens), so not fingerprinted
    drafts: str = DEFAULT_DRAFTS  # where drafts come from (DRAFT_SOURCES); output-invariant too
    batch_memory: int = DEFAULT_BATCH_MEMORY  # bytes for one map batch's states; not fingerprinted either
    cache: bool = True  # keep and reuse what was read (read_cache.py); output-invariant, as are the next two
    cache_dir: str | None = None  # None: $SUMMARIZE_CACHE_DIR, else the user's cache folder
    cache_size: int = DEFAULT_CACHE_SIZE  # bytes
    diagnostics_file: str | None = None
    password: str | None = field(default=None, repr=False)
    verbose: bool = False

    def fingerprint(self, method: str | None = None) -> str:
        """A short, stable hash of the settings that change a summary made by `method`.

        `method` defaults to the one these settings ask for: output files record that one, so a
        re-run with the same settings finds them up to date even where the model fell back to
        an extractive summary. Device, password, verbosity and diagnostics do not change the
        text, so they are left out.
        """
        method = method or ("extractive" if self.extractive else "model")
        shaping: dict[str, Any] = {"v": FINGERPRINT_VERSION, "method": method, "words": self.words}
        if method != "extractive":
            shaping |= {
                "model": self.model,
                "dtype": self.dtype,
                "chunk_tokens": self.chunk_tokens,
                "overlap": self.overlap,
                "strategy": self.strategy,
                "temperature": self.temperature,
                "top_k": self.top_k,
                "top_p": self.top_p,
                "seed": self.seed,
            }
            if self.quantize:  # absent when unset: fingerprints of earlier runs stay valid
                shaping["quantize"] = self.quantize
            if self.focus:
                shaping["focus"] = " ".join(self.focus.split())
        blob = json.dumps(shaping, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:FINGERPRINT_LENGTH]


def printable(name: str) -> str:
    """`name` safe to print on a terminal: control characters (C0, DEL, C1) and the bytes of an
    undecodable file name shown as `\\xNN`, so that no name can move the cursor or retitle the window."""
    return "".join(_escaped(char) for char in name)


def _escaped(char: str) -> str:
    code = ord(char)
    if code < 0x20 or 0x7F <= code <= 0x9F:
        return f"\\x{code:02x}"
    if 0xDC80 <= code <= 0xDCFF:  # os.fsdecode's stand-in for an undecodable byte (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if 0xD800 <= code <= 0xDFFF:  # any other lone surrogate cannot be encoded for the terminal
        return f"\\u{code:04x}"
    return char


@dataclass
class Summary:
    """One input's summary. `extra` carries method-specific fields (model id, tokens, ...)."""

    text: str
    words: int
    method: str  # "extractive" or "model"
    input: str
    seconds: float  # time spent summarizing the text, extraction excluded
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Job:
    """One input and where its summary goes (`output` None: stdout)."""

    input: str  # a path as the user would write it, or "-" for stdin
    output: Path | None = None
    problem: str = ""  # known before reading anything: this job fails with this reason

    @property
    def is_stdin(self) -> bool:
        return self.input == STDIN

    @property
    def label(self) -> str:
        return STDIN_LABEL if self.is_stdin else self.input


@dataclass
class Result:
    """What became of one input: summarized, skipped (up to date) or failed, and why."""

    input: str
    status: Status
    reason: str = ""  # one line; why it failed or was skipped
    output: Path | None = None
    summary: Summary | None = field(default=None, repr=False)
    seconds: float | None = None  # reading and summarizing this input

    @property
    def words(self) -> int | None:
        return None if self.summary is None else self.summary.words


@dataclass
class ModelProgress:
    """Where the model summarizer is, for the diagnostics records and the live view."""

    input: str = ""
    chunk: int | None = None
    chunks: int = 0
    phase: str = "prefill"
    rows: list[tuple[str, int | None]] | None = None  # (input, chunk) of each row while rows decode together
    counters: dict[str, int] = field(default_factory=dict)


class Summarizer(Protocol):
    """Text in, `Summary` out. A new way of summarizing is one new class with these members."""

    method: str

    @property
    def documents_per_batch(self) -> int:
        """How many documents to hand to `summarize_documents` at once."""
        ...

    def summarize(self, text: str, *, name: str) -> Summary:
        """Summarize `text` (read from input `name`) or raise SummarizeError."""
        ...

    def summarize_documents(self, documents: list[tuple[str, str]]) -> list[Summary | Exception]:
        """Summaries of (text, name) documents, in order; a document's failure in its place."""
        ...

    def close(self) -> None:
        """Release what the summarizer holds (the diagnostics file); called when the run ends."""
        ...


class Reporter(Protocol):
    """What the library tells the user about, through the UI (stderr only, never stdout).

    `report` in `span` is the engine's SpanReport; it is not named here, so that this module
    stays below the engine.
    """

    def note(self, msg: str) -> None: ...

    def error(self, msg: str, *, exc: BaseException | None = None) -> None: ...

    def file_started(self, name: str, i: int, n: int) -> None: ...

    def file_finished(self, result: Result) -> None: ...

    def results_table(self, results: Sequence[Result]) -> None: ...

    @property
    def shows_live_state(self) -> bool:
        """Whether `span` is worth calling: per-token reports cost ~10% of a decode step."""
        ...

    def phase(self, progress: ModelProgress) -> None: ...

    def span(self, progress: ModelProgress, report: Any) -> None: ...

    def waiting(self, what: str | None) -> None:
        """What the user waits for now (loading the model, compiling a step), or None: over."""
        ...

    def close(self) -> None: ...
