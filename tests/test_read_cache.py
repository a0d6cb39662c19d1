"""The cache of what was read: a chunk's notes (map-reduce) and the state after a document (stream),
kept by content, so a second run redoes only what changed and never trusts an entry it cannot check.

Each test keeps its cache in a folder of its own (conftest's `read_cache_dir`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from summarize.engine.generation.generate import generate_batch
from summarize.settings import MAP_REDUCE, STREAM, Settings
from summarize.summarizers import model as model_summarizer
from summarize.summarizers.model import ModelSummarizer
from summarize.summarizers.read_cache import CACHE_FORMAT, NOTES, STATES, ReadCache, read_cache_for
from summarize.summarizers.session import load_session
from tiny_models import QWEN_TOKENIZER, RELEASED_TOKENIZER, needs_released_tokenizer, tiny_released_layout

SAMPLE = Path(__file__).resolve().parents[1] / "samples" / "target-tier-policy.txt"
TEXT = SAMPLE.read_text()[:5000]  # several chunks of 300 tokens
GREEDY = dict(device="cpu", dtype="float32", temperature=0)


@pytest.fixture(autouse=True)
def short_notes(monkeypatch):
    """Notes of a few words: a random model never stops before its budget, and the cache does not
    care how long notes are (they also stay short enough to be merged in one step)."""
    monkeypatch.setattr(model_summarizer, "NOTES_WORDS", 10)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_released_layout(tmp_path_factory.mktemp("tiny-qwen3.5"), tokenizer=RELEASED_TOKENIZER or QWEN_TOKENIZER)


def run(model_dir: Path, text: str = TEXT, *, strategy: str = MAP_REDUCE, words: int = 20, focus: str | None = None, **settings):
    """Summarize `text` on the library path with the cache the settings ask for → the document as
    the summarizer left it (its notes, summary and counters), whatever the random model wrote, and
    `answer`, the tokens of its final answer (a random model's summary is often trimmed to nothing)."""
    settings = Settings(model=str(model_dir), **(GREEDY | settings))
    session = load_session(settings, lambda msg: None)
    summarizer = ModelSummarizer(session, words=words, focus=focus, strategy=strategy, chunk_tokens=300, overlap=32,
                                 cache=read_cache_for(settings, session.model, lambda msg: None))
    summarizer._summary = lambda doc: doc
    answers = []

    def recording(*args, **kwargs):
        results = generate_batch(*args, **kwargs)
        answers.append([generation.token_ids for generation in results])
        return results

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(model_summarizer, "generate_batch", recording)
        (doc,) = summarizer.summarize_documents([(text, "doc")])
    doc.answer = answers[-1]
    doc.decodes = len(answers)  # generate_batch calls: notes batches, merges, the summary
    return doc


def entries(folder: Path, kind: str) -> list[Path]:
    return sorted((folder / kind).glob("*")) if (folder / kind).is_dir() else []


# -- map-reduce: the notes of each chunk --------------------------------------------------------


@needs_released_tokenizer
def test_a_second_run_takes_every_chunks_notes_from_the_cache_whatever_its_length_and_focus(model_dir, read_cache_dir):
    first = run(model_dir)
    second = run(model_dir)
    chunks = len(first.chunks)
    assert chunks > 2 and len(entries(read_cache_dir, NOTES)) == chunks
    assert first.progress.counters["cached_chunks"] == 0
    assert second.progress.counters["cached_chunks"] == chunks
    assert second.notes == first.notes
    assert second.answer == first.answer and second.summary == first.summary
    # nothing was read again: no instruction, no chunk, only the final prompt
    assert second.progress.counters["prefix_prefills"] == second.progress.counters["restores"] == 0
    assert second.progress.counters["tokens_in"] < first.progress.counters["tokens_in"] / 2
    # another length and a focus change only the final prompt: the notes are still those kept
    other = run(model_dir, words=10, focus="risks and costs")
    assert other.progress.counters["cached_chunks"] == chunks and other.notes == first.notes


@needs_released_tokenizer
def test_notes_merged_in_groups_are_kept_too_so_a_second_run_decodes_only_its_summary(model_dir, monkeypatch, read_cache_dir):
    monkeypatch.setattr(model_summarizer, "NOTES_WORDS", 40)  # notes that outgrow one window: merged in groups
    text = SAMPLE.read_text()[:9000]
    first = run(model_dir, text)
    merges = len(entries(read_cache_dir, NOTES)) - len(first.chunks)
    assert merges > 0 and first.decodes >= merges + 2  # notes, merges, the summary
    second = run(model_dir, text, words=10)
    assert second.progress.counters["cached_chunks"] == len(first.chunks)
    assert second.decodes == 1 and len(entries(read_cache_dir, NOTES)) == len(first.chunks) + merges


def test_a_changed_chunk_is_read_again_and_the_others_come_from_the_cache(model_dir):
    first = run(model_dir)
    last = first.chunks[-1].text
    changed = TEXT.replace(last[-60:], last[-60:].replace("e", "a"))  # a few words of the last sentences only
    second = run(model_dir, changed)
    assert len(second.chunks) == len(first.chunks)
    assert second.progress.counters["cached_chunks"] == len(first.chunks) - 1
    assert second.progress.counters["prefix_prefills"] == second.progress.counters["restores"] == 1
    last = len(first.chunks) - 1
    assert {i: n for i, n in second.chunk_notes.items() if i != last} == {i: n for i, n in first.chunk_notes.items() if i != last}


def test_a_setting_that_changes_the_notes_misses(model_dir):
    run(model_dir)
    for setting in (dict(temperature=0.7, seed=1), dict(dtype="bfloat16"), dict(quantize="int8")):
        assert run(model_dir, **setting).progress.counters["cached_chunks"] == 0, setting
    weights = next(model_dir.glob("*.safetensors"))
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the same size, written later
    assert run(model_dir).progress.counters["cached_chunks"] == 0


@needs_released_tokenizer
def test_corrupt_truncated_and_foreign_entries_are_ignored_and_written_again(model_dir, read_cache_dir):
    first = run(model_dir)
    files = entries(read_cache_dir, NOTES)
    intact = json.loads(files[3].read_text())
    files[0].write_text(files[0].read_text()[:20])  # truncated
    files[1].write_bytes(b"\x00\xff not json")  # not an entry at all
    files[2].write_text(json.dumps(intact))  # valid, but another chunk's: its key is not the file's
    files[3].write_text(json.dumps(intact | {"format": CACHE_FORMAT + 1}))  # another format
    second = run(model_dir)
    assert second.progress.counters["cached_chunks"] == len(first.chunks) - 4
    assert second.notes == first.notes
    assert all(cache_in(read_cache_dir).notes(file.stem) is not None for file in files)  # written again, whole


# -- stream: the state after the document -------------------------------------------------------


def test_the_state_after_the_document_comes_back_to_the_same_summary(model_dir, read_cache_dir):
    plain = run(model_dir, strategy=STREAM, cache=False)
    first = run(model_dir, strategy=STREAM)
    (entry,) = entries(read_cache_dir, STATES)
    second = run(model_dir, strategy=STREAM)
    assert first.progress.counters["cached_chunks"] == 0
    assert second.progress.counters["cached_chunks"] == len(first.chunks) > 1
    assert second.progress.counters["prefix_prefills"] == 0
    assert plain.answer == first.answer == second.answer and plain.summary == first.summary == second.summary
    # the question after the document is asked anew: another length still reads nothing
    assert run(model_dir, strategy=STREAM, words=10).progress.counters["prefix_prefills"] == 0
    whole = entry.read_bytes()
    entry.write_bytes(whole[: len(whole) // 2])  # truncated
    again = run(model_dir, strategy=STREAM)
    assert again.progress.counters["cached_chunks"] == 0 and again.answer == plain.answer
    assert entry.read_bytes() == whole  # written again


# -- the command line ---------------------------------------------------------------------------


def summarize_json(run_cli, *args: str) -> dict:
    result = run_cli("--dtype", "float32", "--temperature", "0", "--json", *args, env={"NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@needs_released_tokenizer
def test_the_command_line_reports_cached_chunks_and_no_cache_writes_nothing(model_dir, read_cache_dir, tmp_path, run_cli):
    doc = tmp_path / "doc.txt"
    doc.write_text(TEXT)
    args = [str(doc), "-m", str(model_dir), "--chunk-tokens", "300", "--overlap", "32"]
    assert summarize_json(run_cli, *args, "-n", "20", "--no-cache")["cached_chunks"] == 0
    assert not any(read_cache_dir.iterdir())
    assert summarize_json(run_cli, *args, "-n", "20")["cached_chunks"] == 0
    chunks = len(entries(read_cache_dir, NOTES))
    assert chunks > 2
    assert summarize_json(run_cli, *args, "-n", "10")["cached_chunks"] == chunks


def test_a_cache_dir_that_cannot_be_written_is_said_once(model_dir, tmp_path, run_cli):
    doc = tmp_path / "doc.txt"
    doc.write_text(TEXT[:2000])  # two chunks: notes to keep
    (tmp_path / "a-file").write_text("")
    result = run_cli(str(doc), "-m", str(model_dir), "--dtype", "float32", "--temperature", "0", "--chunk-tokens", "300",
                     "--cache-dir", str(tmp_path / "a-file" / "cache"), "-n", "10", env={"NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    assert result.stderr.count("going on without the cache") == 1 and "Traceback" not in result.stderr


def test_the_cache_options_reach_the_settings(monkeypatch, tmp_path, run_cli):

    from summarize.run import local

    seen = []
    monkeypatch.setattr(local, "run", lambda plan, settings, **kwargs: seen.append(settings) or [])
    doc = tmp_path / "a.txt"
    doc.write_text("One sentence here.\n")
    run_cli(str(doc), "--cache-dir", str(tmp_path / "c"), "--cache-size", "1G")
    run_cli(str(doc), "--no-cache", env={"SUMMARIZE_CACHE_SIZE": "512M", "SUMMARIZE_CACHE_DIR": str(tmp_path / "d")})
    assert [(s.cache, s.cache_dir, s.cache_size) for s in seen] == [(True, str(tmp_path / "c"), 2**30),
                                                                    (False, str(tmp_path / "d"), 2**29)]


# -- the cache itself ---------------------------------------------------------------------------


def cache_in(folder: Path, max_bytes: int = 2**20) -> ReadCache:
    return ReadCache(folder, max_bytes=max_bytes, reader={"weights": [("w", 1, 2)], "dtype": "torch.float32", "quantize": None})


def test_over_the_cap_the_least_recently_used_entries_go(tmp_path):
    cache = cache_in(tmp_path)
    for age, name in enumerate("abc"):
        cache.keep_notes(name, "notes of " + name)
        os.utime(cache._path(NOTES, name), ns=(10**18 + age, 10**18 + age))  # a, then b, then c
    assert cache.notes("a") == "notes of a"  # used now: the most recent
    kernels = tmp_path / "torchinductor" / "kernel.so"  # compiled kernels live beside the entries
    kernels.parent.mkdir()
    kernels.write_bytes(b"x" * 10_000)
    size = cache._path(NOTES, "a").stat().st_size
    cache.max_bytes = 2 * size
    cache.trim()
    assert [cache.notes(name) for name in "abc"] == ["notes of a", None, "notes of c"]
    assert kernels.is_file()


def test_an_entry_under_another_name_or_format_is_a_miss(tmp_path):
    cache = cache_in(tmp_path)
    cache.keep_notes("a", "notes of a")
    assert cache.notes("a") == "notes of a"
    os.replace(cache._path(NOTES, "a"), cache._path(NOTES, "b"))
    assert cache.notes("b") is None and cache.notes("a") is None
    cache._path(NOTES, "c").write_text(json.dumps({"format": CACHE_FORMAT, "key": "c", "notes": ["not", "text"]}))
    assert cache.notes("c") is None


def test_greedy_notes_do_not_depend_on_the_seed_or_the_filters(tmp_path):
    from summarize.engine.generation.generate import SamplingParams

    cache = cache_in(tmp_path)
    greedy = cache.notes_key([1, 2], SamplingParams(temperature=0, seed=1, top_k=5), 144)
    assert greedy == cache.notes_key([1, 2], SamplingParams(temperature=0, seed=2), 144)
    sampled = {cache.notes_key([1, 2], SamplingParams(temperature=0.7, seed=seed), 144) for seed in (1, 2)}
    assert len(sampled) == 2 and greedy not in sampled
    assert cache.notes_key([1, 3], SamplingParams(), 144) != cache.notes_key([1, 2], SamplingParams(), 144)


def test_a_diagnostics_file_after_cached_chunks_says_they_have_no_rows(model_dir, read_cache_dir, tmp_path, run_cli):
    doc = tmp_path / "doc.txt"
    doc.write_text(TEXT)
    diagnostics = tmp_path / "d.jsonl"
    args = [str(doc), "-m", str(model_dir), "--chunk-tokens", "300", "--overlap", "32", "-n", "20", "--diagnostics-file", str(diagnostics)]
    first = run_cli(*args)
    assert first.exit_code == 0, first.stderr
    assert "has no rows" not in first.stderr
    second = run_cli(*args)
    assert second.exit_code == 0, second.stderr
    assert "from the cache (not read again, so the diagnostics file has no rows for them" in second.stderr
    assert "has no rows" not in run_cli(*args[:-2]).stderr  # said only where a file is written
