"""The notes' budget in map-reduce follows -n and the number of chunks.

The rule: each chunk is noted in the smallest band of words that gives the document's notes
together NOTES_SHARE times the words of the summary, never more than NOTES_WORDS. A random model
runs its notes to their token budget, so the tokens decoded for notes check the budget directly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from summarize.settings import MAP_REDUCE, STREAM, Settings
from summarize.summarizers.map_rows import NOTES_TOKENS
from summarize.summarizers.model import NOTES_BANDS, NOTES_SHARE, NOTES_WORDS, ModelSummarizer, notes_words, token_budget
from summarize.summarizers.read_cache import read_cache_for
from summarize.summarizers.session import load_session
from tiny_models import tiny_released_layout

TEXT = (Path(__file__).resolve().parents[1] / "samples" / "target-tier-policy.txt").read_text()
GREEDY = dict(device="cpu", dtype="float32", temperature=0)



# -- the rule ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "words, chunks, band",
    [
        (40, 7, 24),  # 12 words a chunk would do: the smallest band
        (100, 7, 32),  # 29
        (150, 7, 48),  # 43
        (200, 7, 64),  # 58
        (300, 7, 80),  # 86: capped at the most a chunk is given
        (300, 17, 48),  # 36
        (64, 4, 32),  # exactly a band
        (40, 2, 48),
        (100_000, 3, 80),
        (1, 1000, 24),
    ],
)
def test_the_band_for_n_and_chunks(words, chunks, band):
    assert notes_words(words, chunks) == band


def test_the_bands_stay_between_24_and_80_and_follow_n():
    assert NOTES_BANDS[0] == 24 and NOTES_BANDS[-1] == NOTES_WORDS == 80
    for chunks in (2, 3, 7, 17, 60):
        bands = [notes_words(words, chunks) for words in range(1, 2001)]
        assert all(NOTES_BANDS[0] <= band <= NOTES_WORDS and band in NOTES_BANDS for band in bands)
        assert bands == sorted(bands)  # monotone in -n
    for words in (20, 100, 300, 1000):
        bands = [notes_words(words, chunks) for chunks in range(2, 200)]
        assert bands == sorted(bands, reverse=True)  # more chunks, fewer words each


def test_the_notes_hold_twice_the_summary_unless_capped():
    for chunks in range(2, 40):
        for words in range(1, 1500, 7):
            band = notes_words(words, chunks)
            assert band == NOTES_WORDS or band * chunks >= NOTES_SHARE * words
            # and no bigger band than that takes: the next smaller one would hold too little
            smaller = [b for b in NOTES_BANDS if b < band]
            assert not smaller or smaller[-1] * chunks < NOTES_SHARE * words


def test_the_memory_budget_bounds_the_largest_band():
    assert NOTES_TOKENS >= token_budget(max(NOTES_BANDS))


# -- on a tiny random model ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_released_layout(tmp_path_factory.mktemp("tiny-qwen3.5"))


def summarizer_for(model_dir: Path, words: int, *, strategy: str = MAP_REDUCE, cache: bool = False) -> ModelSummarizer:
    settings = Settings(model=str(model_dir), cache=cache, **GREEDY)
    session = load_session(settings, lambda msg: None)
    summarizer = ModelSummarizer(session, words=words, strategy=strategy, chunk_tokens=300, overlap=32,
                                 cache=read_cache_for(settings, session.model, lambda msg: None))
    summarizer._summary = lambda doc: doc  # what each document went through, whatever the model wrote
    if strategy == MAP_REDUCE:  # these tests are about the notes: no final summary is written
        summarizer._write_summaries = lambda docs: None
    return summarizer


def decodes(summarizer: ModelSummarizer, monkeypatch) -> list[tuple[str, int, int]]:
    """Record each decode as (phase, token budget, tokens decoded)."""
    calls = []
    real = ModelSummarizer._generate

    def recording(self, states, words, contexts, rows=None, phase="summary"):
        results = real(self, states, words, contexts, rows, phase)
        calls.extend((phase, token_budget(words), len(result.token_ids)) for result in results)
        return results

    monkeypatch.setattr(ModelSummarizer, "_generate", recording)
    return calls


def test_a_shorter_summary_decodes_shorter_notes(model_dir, monkeypatch):
    text = TEXT[:5000]
    tokens = {}
    for words in (40, 300):
        summarizer = summarizer_for(model_dir, words)
        calls = decodes(summarizer, monkeypatch)
        (doc,) = summarizer.summarize_documents([(text, "doc")])
        notes = [(budget, out) for phase, budget, out in calls if phase == "notes"]
        assert len(notes) == len(doc.chunks) > 2
        assert {budget for budget, _ in notes} == {token_budget(notes_words(words, len(doc.chunks)))}
        assert all(out <= budget for budget, out in notes)
        tokens[words] = sum(out for _, out in notes)
        assert tokens[words] > 0
    chunks = len(doc.chunks)
    assert notes_words(40, chunks) < notes_words(300, chunks)
    assert tokens[40] < tokens[300] <= chunks * token_budget(NOTES_WORDS)  # never more than 80 words a chunk asked


def test_the_notes_prefix_is_prefilled_once_per_band(model_dir, monkeypatch):
    summarizer = summarizer_for(model_dir, 40)
    calls = decodes(summarizer, monkeypatch)
    prefixes = []
    real = summarizer._read_chunks
    monkeypatch.setattr(summarizer, "_read_chunks", lambda rows, prefix, words: (prefixes.append(words), real(rows, prefix, words)))
    docs = summarizer.summarize_documents([(TEXT[:1500], "a"), (TEXT[3000:4500], "b"), (TEXT[:9000], "long")])
    a, b, long = docs
    assert len(a.chunks) == len(b.chunks) == 2 and len(long.chunks) > 4
    bands = {notes_words(40, 2), notes_words(40, len(long.chunks))}
    assert len(bands) == 2 and {d.notes_words for d in docs} == bands
    # a and b share their band's prefix and their decode batches; long has its own prefix
    assert sorted(prefixes) == sorted(bands)
    assert sum(d.progress.counters["prefix_prefills"] for d in docs) == 2
    assert [d.progress.counters["restores"] for d in docs] == [len(d.chunks) for d in docs]
    assert {budget for phase, budget, _ in calls if phase == "notes"} == {token_budget(band) for band in bands}


def test_a_nearby_n_takes_every_chunks_notes_from_the_cache_and_a_far_one_reads_again(model_dir):
    text = TEXT[:5000]
    first = summarizer_for(model_dir, 40, cache=True).summarize_documents([(text, "doc")])[0]
    chunks = len(first.chunks)
    assert notes_words(45, chunks) == notes_words(40, chunks) != notes_words(300, chunks)
    nearby = summarizer_for(model_dir, 45, cache=True).summarize_documents([(text, "doc")])[0]
    assert nearby.progress.counters["cached_chunks"] == chunks and nearby.notes == first.notes
    assert nearby.progress.counters["prefix_prefills"] == 0
    far = summarizer_for(model_dir, 300, cache=True).summarize_documents([(text, "doc")])[0]
    assert far.progress.counters["cached_chunks"] == 0 and far.progress.counters["prefix_prefills"] == 1


def test_stream_decodes_only_its_summary(model_dir, monkeypatch):
    summarizer = summarizer_for(model_dir, 30, strategy=STREAM)
    calls = decodes(summarizer, monkeypatch)
    (doc,) = summarizer.summarize_documents([(TEXT[:5000], "doc")])
    assert len(doc.chunks) > 2
    assert {(phase, budget) for phase, budget, _ in calls} == {("summary", token_budget(30))}

