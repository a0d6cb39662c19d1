"""Cache entries are opened only when they are regular files of a plausible size: a FIFO, a link
to a device or to a huge file, a folder in an entry's place is a miss, dropped and written again."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from summarize.summarizers.read_cache import MAX_NOTES_BYTES, NOTES, STATES, ReadCache


def _within(seconds: float, call):
    """`call()`'s value, failing the test if it has not returned after `seconds` (a hang)."""
    box: list = []
    thread = threading.Thread(target=lambda: box.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert box, f"hung for {seconds} s"
    return box[0]


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    os.symlink("/dev/zero", path)


def _link_to_big_file(path: Path) -> None:
    big = path.parent.parent / "elsewhere.json"
    with open(big, "wb") as f:
        f.truncate(64 * 2**20)
    os.symlink(big, path)


def _oversized(path: Path) -> None:
    with open(path, "wb") as f:
        f.truncate(MAX_NOTES_BYTES * 8)


def _folder(path: Path) -> None:
    path.mkdir()


HOSTILE = {"fifo": _fifo, "dev-zero": _dev_zero, "link-to-big-file": _link_to_big_file, "oversized": _oversized,
           "folder": _folder, "dev-null": lambda p: os.symlink("/dev/null", p)}


@pytest.fixture
def cache(tmp_path: Path) -> tuple[ReadCache, list[str]]:
    notes: list[str] = []
    cache = ReadCache(tmp_path / "cache", max_bytes=16 * 2**20, reader={"weights": []}, notify=notes.append,
                      verbose=True)
    for kind in (NOTES, STATES):
        (cache.folder / kind).mkdir(parents=True)
    return cache, notes


@pytest.mark.parametrize("make", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_notes_entry_that_is_not_a_file_is_a_miss_and_written_again(cache, make):
    cache, said = cache
    key = "ab" * 32
    make(cache._path(NOTES, key))
    assert _within(10, lambda: cache.notes(key)) is None
    if make is not _folder:
        assert any("dropped" in line for line in said)
        cache.keep_notes(key, "the notes")
        assert _within(10, lambda: cache.notes(key)) == "the notes"


@pytest.mark.parametrize("make", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_state_entry_that_is_not_a_file_is_a_miss(cache, make):
    cache, _ = cache
    key = "cd" * 32
    make(cache._path(STATES, key))

    class NeverLoaded:
        def load(self, path):
            raise AssertionError("a hostile entry was loaded")

    assert _within(10, lambda: cache.load_state(key, NeverLoaded())) is False


def test_dropped_entries_are_said_only_under_verbose(tmp_path: Path):
    said: list[str] = []
    quiet = ReadCache(tmp_path, max_bytes=2**20, reader={}, notify=said.append)
    (tmp_path / NOTES).mkdir()
    os.mkfifo(quiet._path(NOTES, "ef" * 32))
    assert _within(10, lambda: quiet.notes("ef" * 32)) is None
    assert said == [] and not os.path.lexists(quiet._path(NOTES, "ef" * 32))
