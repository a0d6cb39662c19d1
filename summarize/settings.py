"""The shared vocabulary of the application: constants, the settings of a run, its results, the
protocols the summarizers and the UI implement, and how a name is shown on a terminal (`printable`).
It sits at the bottom: it imports nothing of ours.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MODEL = "Qwen/Qwen3.5-0.8B"
DEFAULT_WORDS = 300
MAX_WORDS = 100_000  # -n: a summary as long as a 400-page book is the most asked of it
MAX_SEED = 2**64 - 1
# Bytes read of one input: a 500-page book is a few MB of text and rarely over 100 MB as a PDF
# with pictures; past this, what is read is more likely a mistake (a disk image, `yes |`).
DEFAULT_MAX_INPUT_SIZE = 256 * 2**20  # torch.manual_seed's largest seed

MAP_REDUCE = "map-reduce"  # every chunk read alone from the instruction, the notes merged
STREAM = "stream"  # one pass, the state carried across the whole document
STRATEGIES = (MAP_REDUCE, STREAM)
DEFAULT_STRATEGY = MAP_REDUCE

# How a summary is laid out (--format): paragraphs, one point per line ("- "), or Markdown (a short
# heading, then the points).
PROSE, BULLETS, MARKDOWN = "prose", "bullets", "markdown"
FORMATS = (PROSE, BULLETS, MARKDOWN)
DEFAULT_FORMAT = PROSE

STDIN = "-"  # the input name that reads standard input
STDIN_LABEL = "<stdin>"  # how messages name it

# The chunking the model summarizer uses when not told (its own constants must agree: tested).
# Below 64 tokens a chunk holds a sentence or two, and every chunk's notes cost a decode, so a page
# would take minutes. Above 32K one chunk's prefill
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

# Sampling when not told (Qwen3.5's recommended non-thinking settings); --temperature 0 is greedy.
DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P, DEFAULT_SEED = 0.7, 20, 0.8, 0
DEFAULT_PRESENCE_PENALTY = 1.5

DEFAULT_CHUNK_TOKENS = 1536
DEFAULT_OVERLAP = 128
MIN_CHUNK_TOKENS, MAX_CHUNK_TOKENS = 64, 32768
MAX_OVERLAP_SHARE = 4  # the overlap is at most a quarter of a chunk, as the model summarizer keeps it

# Bump when the same settings start producing different output (new header format, new
# algorithm), so that files written by an older version stop counting as up to date.
FINGERPRINT_VERSION = 1
FINGERPRINT_LENGTH = 12


@dataclass(frozen=True)
class Settings:
    """Everything that shapes one run. `None` leaves the choice to the engine's defaults."""

    words: int = DEFAULT_WORDS
    model: str = DEFAULT_MODEL
    model_fallback: bool = True  # a model that cannot be had gives an extractive summary; False: an error
    device: str | None = None
    dtype: str | None = None
    quantize: str | None = None  # None: "auto" (`engine.load_model`); "none": the weights as loaded
    focus: str | None = None  # what a model summary should concentrate on (--focus)
    language: str | None = None  # the language a model summary is written in (--language)
    format: str = DEFAULT_FORMAT  # how the summary is laid out (FORMATS)
    cite: bool = False  # each sentence ends with where it comes from (--cite)
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
    max_input_size: int = DEFAULT_MAX_INPUT_SIZE  # bytes read of one input at most (--max-input-size)
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
        # each absent when unset: fingerprints of earlier runs stay valid
        if self.format != DEFAULT_FORMAT:
            shaping["format"] = self.format
        if self.cite:
            shaping["cite"] = True
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
            if self.language:
                shaping["language"] = " ".join(self.language.split())
        blob = json.dumps(shaping, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:FINGERPRINT_LENGTH]


_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", re.IGNORECASE)


def format_size(size: int) -> str:
    """Bytes as the options write them: 256M, 1G, 1.5G, 1000 bytes."""
    for unit in ("T", "G", "M", "K"):
        if size >= _UNITS[unit.lower()]:
            return f"{size / _UNITS[unit.lower()]:.4g}{unit}"
    return f"{size} bytes"


def parse_size(text: str) -> int:
    """"1G", "512MiB", "1.5 GB", "1073741824" → bytes (binary units: K = 1024); ValueError otherwise."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"not a size: {text!r} (say 1G, 512M or a number of bytes)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])
