"""What the model has read, kept on disk by content: a second run on the same document redoes only
what changed (--focus, or an -n whose notes budget falls in the same band: only the reduce step; a
PDF with one new page: its chunks).

Two kinds of entry, each a file named by its key:
- `notes/<key>.json`: a chunk's notes in map-reduce, `{"format", "key", "notes"}`.
- `states/<key>.safetensors`: stream mode's state after the whole document (`State.save`), with
  `format` and `key` in its header.

The key is a SHA-256 over everything that changes what is kept:
- the reader: the weight files' resolved paths, sizes and modification times (a stat, never a
  hash of gigabytes), the model's dtype and `--quantize`;
- what the model was given, as token ids (so the tokenizer, the chat format, the instruction and
  the chunk's text all count): the instruction and the chunk for notes; the instruction and every
  chunk of the document, and the attention window, for a state;
- for notes, how they were written: temperature and presence penalty, and top-k, top-p and seed
  when sampling (greedy ignores them), and the token budget;
- CACHE_FORMAT.
-n and --focus are not in it: they enter only the reduce step (and stream's question, asked after
the cached state). Chunk size and overlap change the chunks' text, which is. `--speculate`,
`--batch-memory` and the device are left out as the output fingerprint leaves them out: the same
weights in the same precision write the same text with or without them (up to rounding). Sampled
notes come back as an earlier run with the same seed wrote them.

Where: `--cache-dir`, else `$SUMMARIZE_CACHE_DIR`, else `$XDG_CACHE_HOME/summarize`, else
`~/.cache/summarize`. Only `notes/` and `states/` are counted and evicted: compiled kernels in
`torchinductor/` beside them are never touched. Over the size cap, the least recently used entries
go (a hit touches its file's modification time). Entries are written atomically; one that is
unreadable, truncated, of another format or holding another key is a miss, and is written again.
An entry is opened only if it is a regular file (not a link, a FIFO or a device) of a plausible
size; anything else is dropped (said under -v) and written again.
A cache that cannot be written is said once; the run goes on without it.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

from safetensors import safe_open

from summarize.errors import SummarizeError
from summarize.files import replacing, user_cache_folder, write_atomic
from summarize.settings import Settings
from summarize.summarizers.session import weight_forms

# Bump when the same key starts meaning other contents (the generation or the entries' layout
# change): entries of an older format are then misses.
CACHE_FORMAT = 1
CACHE_DIR_ENV = "SUMMARIZE_CACHE_DIR"
NOTES, STATES = "notes", "states"  # the cache's subfolders: all it counts and evicts
MAX_NOTES_BYTES = 1 << 20  # a chunk's notes are a few KB of JSON; more is not an entry of ours


def read_cache_for(settings: Settings, model, notify: Callable[[str], None]) -> ReadCache | None:
    """The cache these settings ask for (None with `--no-cache`), for `model` as loaded."""
    if not settings.cache:
        return None
    folder = settings.cache_dir or os.environ.get(CACHE_DIR_ENV) or user_cache_folder()
    reader = {"weights": weights_identity(settings.model, Path(model.source)),
              "dtype": str(model.dtype), "quantize": ", ".join(weight_forms(model, settings)) or None}
    return ReadCache(Path(folder).expanduser(), max_bytes=settings.cache_size, reader=reader, notify=notify,
                     verbose=settings.verbose)


def weights_identity(name: str, source: Path) -> list[tuple[str, int, int]]:
    """(resolved path, size, mtime in ns) of the files the model was read from: the weight file
    named (a .pth, a .gguf), else every file of its folder (config, weights and tokenizer)."""
    named = Path(name).expanduser()
    if named.is_file():
        files = [named]
    elif source.is_file():
        files = [source]
    else:
        files = sorted(path for path in source.iterdir() if path.is_file())
    identity = []
    for path in files:
        info = path.stat()
        identity.append((str(path.resolve()), info.st_size, info.st_mtime_ns))
    return identity


class ReadCache:
    """Notes and states kept under `folder`, at most `max_bytes` of them, for one `reader`."""

    def __init__(self, folder: Path, *, max_bytes: int, reader: dict, notify: Callable[[str], None] = lambda msg: None,
                 verbose: bool = False) -> None:
        self.folder = folder
        self.verbose = verbose
        self.max_bytes = max_bytes
        self.reader = reader
        self.notify = notify
        self.writable = True  # until a write fails: said once, then nothing more is written

    # -- keys ----------------------------------------------------------------------------------

    def notes_key(self, prompt: list[int], sampling, max_new_tokens: int) -> str:
        """The key of the notes written for `prompt` (instruction and chunk, as token ids)."""
        how = {"temperature": sampling.temperature, "presence_penalty": sampling.presence_penalty}
        if sampling.temperature != 0:  # greedy decoding ignores the filters and the seed
            how |= {"top_k": sampling.top_k, "top_p": sampling.top_p, "seed": sampling.seed}
        return self._key(NOTES, prompt=prompt, sampling=how, max_new_tokens=max_new_tokens)

    def state_key(self, prefix: list[int], chunks: list[list[int]], attention_window: int) -> str:
        """The key of the state after reading `prefix`, then each of `chunks` (token ids)."""
        return self._key(STATES, prefix=prefix, chunks=chunks, attention_window=attention_window)

    def _key(self, kind: str, **given) -> str:
        blob = json.dumps({"format": CACHE_FORMAT, "kind": kind, "reader": self.reader, **given},
                          sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    # -- notes ---------------------------------------------------------------------------------

    def notes(self, key: str) -> str | None:
        """The notes kept under `key`, or None (none kept, or an entry not to be trusted)."""
        path = self._path(NOTES, key)
        if not self._plausible(path, MAX_NOTES_BYTES):
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with open(fd, "rb") as f:  # checked again on what was opened: it may have changed
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    return None
                entry = json.loads(f.read(MAX_NOTES_BYTES + 1).decode("utf-8"))
        except (OSError, ValueError):  # missing, unreadable, truncated, not UTF-8 or not JSON
            return None
        if not isinstance(entry, dict) or entry.get("format") != CACHE_FORMAT or entry.get("key") != key:
            return None
        notes = entry.get("notes")
        if not isinstance(notes, str):
            return None
        _touch(path)
        return notes

    def keep_notes(self, key: str, notes: str) -> None:
        entry = json.dumps({"format": CACHE_FORMAT, "key": key, "notes": notes}, ensure_ascii=False)
        self._write(lambda: write_atomic(self._path(NOTES, key), entry))

    # -- states --------------------------------------------------------------------------------

    def load_state(self, key: str, state) -> bool:
        """Load the state kept under `key` into `state`; False (and `state` untouched) on a miss."""
        path = self._path(STATES, key)
        if not self._plausible(path, self.max_bytes):
            return False
        try:
            with safe_open(str(path), framework="pt") as f:
                header = f.metadata() or {}
        except Exception:  # missing or not a safetensors file: safetensors raises several types
            return False
        if header.get("format") != str(CACHE_FORMAT) or header.get("key") != key:
            return False
        try:
            state.load(path)  # checks every tensor against this model before changing anything
        except SummarizeError:
            return False
        _touch(path)
        return True

    def keep_state(self, key: str, state) -> None:
        def write() -> None:
            with replacing(self._path(STATES, key)) as tmp:
                state.save(tmp, metadata={"format": str(CACHE_FORMAT), "key": key})

        self._write(write)

    # -- the folder ----------------------------------------------------------------------------

    def trim(self) -> None:
        """Remove the least recently used entries until what is kept fits `max_bytes`."""
        entries = []
        for kind in (NOTES, STATES):
            try:
                with os.scandir(self.folder / kind) as found:
                    for entry in found:
                        if entry.is_file(follow_symlinks=False):
                            info = entry.stat(follow_symlinks=False)
                            entries.append((info.st_mtime_ns, info.st_size, entry.path))
            except OSError:  # not made yet, or unreadable: nothing of ours to count
                continue
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            try:
                os.unlink(path)
            except FileNotFoundError:  # another run removed it first
                pass
            except OSError:
                continue
            total -= size

    def _plausible(self, path: Path, most: int) -> bool:
        """Whether `path` is a regular file (not a link) of at most `most` bytes; anything else in
        its place (a FIFO that would hang, a link to /dev/zero) is dropped, to be written again."""
        try:
            st = os.lstat(path)
        except OSError:  # missing: a plain miss
            return False
        if stat.S_ISREG(st.st_mode) and st.st_size <= most:
            return True
        if self.verbose:
            self.notify(f"dropped a cache entry that is not a file of ours ({path})")
        try:
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(path)
        except OSError:
            pass
        return False

    def _path(self, kind: str, key: str) -> Path:
        return self.folder / kind / (key + (".json" if kind == NOTES else ".safetensors"))

    def _write(self, write: Callable[[], None]) -> None:
        if not self.writable:
            return
        try:
            write()
        except OSError as exc:
            self.writable = False
            self.notify(f"cannot keep what was read in {self.folder} ({exc.strerror or exc}); going on without the cache")


def _touch(path: Path) -> None:
    """Mark an entry used now: eviction goes by modification time."""
    try:
        os.utime(path)
    except OSError:
        pass
