"""Model-driven summaries end to end, on a tiny random model laid out like the released checkpoints.

A random model writes nonsense, so these tests check contracts, not wording: stdout carries only
a summary within the word budget, diagnostics are the real per-layer numbers, the instruction
prefix is computed once per document, and stream mode's recurrent memory does not grow.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from summarize.errors import SummarizeError
from summarize.inputs.words import count_words
from summarize.settings import DEFAULT_SPECULATE, Settings
from summarize.summarizers.extractive import ExtractiveSummarizer
from summarize.summarizers.model import MIN_SUMMARY_WORDS, TOKENS_PER_WORD, ModelSummarizer
from summarize.summarizers.session import load_session
from tiny_models import RELEASED_TOKENIZER, RWKV_TINY, blinkdl_checkpoint, needs_released_tokenizer, tiny_released_layout

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
NUM_LAYERS = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_released_layout(tmp_path_factory.mktemp("tiny-qwen3.5"))


def sample_pdf() -> Path:
    return sorted(SAMPLES.glob("*.pdf"))[0]


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    # fp32: tiny matrices are faster in fp32 than in bf16 on a CPU
    env_args = [sys.executable, "-m", "summarize", "--dtype", "float32", *args]
    return subprocess.run(env_args, input=stdin, capture_output=True, text=True, timeout=600,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "NO_COLOR": "1",
                               "SUMMARIZE_CACHE_DIR": os.environ["SUMMARIZE_CACHE_DIR"]})


def test_pdf_to_summary_with_diagnostics(model_dir, tmp_path):
    diagnostics = tmp_path / "d.jsonl"
    proc = run_cli(str(sample_pdf()), "-m", str(model_dir), "-n", "50", "--chunk-tokens", "1500",
                   "--diagnostics-file", str(diagnostics))
    assert proc.returncode == 0, proc.stderr
    assert 0 < count_words(proc.stdout) <= 50
    assert "Traceback" not in proc.stderr

    records = [json.loads(line) for line in diagnostics.read_text().splitlines()]
    assert {r["phase"] for r in records} == {"prefill", "decode"}
    assert set(records[0]) == {"input", "chunk", "phase", "layer", "kind", "state_norm", "gate_mean",
                               "delta_norm", "kv_tokens", "tokens"}
    # one record per layer per span: records come in whole groups of NUM_LAYERS, layers in order
    assert len(records) % NUM_LAYERS == 0
    for start in range(0, len(records), NUM_LAYERS):
        group = records[start : start + NUM_LAYERS]
        assert [r["layer"] for r in group] == list(range(NUM_LAYERS))
        assert len({(r["phase"], r["chunk"], r["tokens"]) for r in group}) == 1
    for r in records:
        if r["kind"] == "recurrent":
            assert math.isfinite(r["state_norm"]) and math.isfinite(r["delta_norm"])
            assert 0 < r["gate_mean"] < 1
            assert r["kv_tokens"] is None
        else:
            assert r["kv_tokens"] > 0 and r["state_norm"] is None
    # a decode span is one token, or the tokens a verified draft kept (speculative decoding)
    assert all(1 <= r["tokens"] <= DEFAULT_SPECULATE + 1 for r in records if r["phase"] == "decode")


def test_prefix_is_computed_once_and_restored_once_per_chunk(model_dir):
    proc = run_cli(str(sample_pdf()), "-m", str(model_dir), "-n", "40", "--chunk-tokens", "2000", "--json")
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    result = json.loads(line)
    if result["method"] == "model":
        assert result["chunks"] > 1
        assert result["prefix_prefills"] == 1
        assert result["restores"] == result["chunks"]
        assert result["strategy"] == "map-reduce" and result["model"] == str(model_dir)
        # where the seconds went: every phase ran, and together they fit in the document's time
        phases = result["phase_seconds"]
        assert set(phases) == {"prefill", "notes", "summary"} and all(s > 0 for s in phases.values())
        assert sum(phases.values()) <= result["seconds"]
    assert result["words"] <= 40


def test_prefix_counts_on_the_library_path(model_dir):
    """Same contract, counted inside the library, whatever the random model writes."""
    session = load_session(Settings(model=str(model_dir), device="cpu", dtype="float32"), lambda msg: None)
    summarizer = ModelSummarizer(session, words=30, chunk_tokens=300, overlap=32, fallback=ExtractiveSummarizer(Settings(words=30)))
    text = sample_pdf().with_suffix(".txt").read_text() if sample_pdf().with_suffix(".txt").exists() else None
    text = text or sorted(SAMPLES.glob("*.txt"))[0].read_text()
    summary = summarizer.summarize(text[:12000], name="doc")
    counters = summarizer.progress.counters
    assert summarizer.progress.chunks > 2
    assert counters["prefix_prefills"] == 1
    assert counters["restores"] == summarizer.progress.chunks
    assert count_words(summary.text) <= 30
    # the seconds of each phase: the chunks were read, their notes and a summary written
    assert counters["prefill_s"] > 0 and counters["notes_s"] > 0 and counters["summary_s"] > 0


def test_stream_recurrent_memory_is_the_same_for_1_and_50_pages(model_dir):
    session = load_session(Settings(model=str(model_dir), device="cpu", dtype="float32"), lambda msg: None)
    states = []
    new_state = session.model.new_state

    def recording_new_state(batch_size=1):
        state = new_state(batch_size)
        states.append(state)
        return state

    session.model.new_state = recording_new_state
    try:
        page = sorted(SAMPLES.glob("*.txt"))[0].read_text()[:3000]
        peak_kv = {}
        for pages in (1, 50):
            summarizer = ModelSummarizer(session, words=20, strategy="stream", chunk_tokens=1024,
                                         fallback=ExtractiveSummarizer(Settings(words=20)))
            states.clear()  # only the states the summary itself makes
            kv = []
            summarizer.on_span = lambda progress, report: kv.append(report.state_bytes)
            summarizer.summarize("\n\n".join([page] * pages), name=f"{pages} pages")
            (state,) = states
            peak_kv[pages] = (state.recurrent_nbytes, state.kv_tokens)
            assert summarizer.progress.counters["restores"] == 1  # the marker opens only the first chunk
        assert peak_kv[1][0] == peak_kv[50][0]
        assert peak_kv[50][1] <= 4096 + 1024 + 200  # prefix + attention window + one chunk + question
    finally:
        session.model.new_state = new_state


def test_folder_batch_with_a_model(model_dir, tmp_path):
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    text = sorted(SAMPLES.glob("*.txt"))[0].read_text()[:4000]
    (docs / "a.txt").write_text(text)
    (docs / "sub" / "b.md").write_text("# Notes\n\n" + text[:2000])
    out = tmp_path / "out"
    proc = run_cli(str(docs), "-m", str(model_dir), "-n", "30", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    for name in ("a.summary.md", "sub/b.summary.md"):
        body = (out / name).read_text().split("\n", 1)[1]
        assert 0 < count_words(body) <= 30
    assert proc.stderr.count("note: model ") == 1  # loaded once for the whole folder


def test_a_named_model_that_does_not_exist_is_a_usage_error_before_any_work(tmp_path):
    """Only the default model falls back to an extractive summary (test_hostile_inputs.py): one the
    user named is an error naming it."""
    missing = tmp_path / "no-such-model"
    proc = run_cli(str(sample_pdf()), "-m", str(missing), "-n", "60")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and str(missing) in proc.stderr


def test_model_load_uses_fp32_state_whatever_the_dtype(model_dir):
    session = load_session(Settings(model=str(model_dir), device="cpu", dtype="bfloat16"), lambda msg: None)
    state = session.model.new_state(1)
    assert session.model.dtype == torch.bfloat16
    assert all(layer.matrix.dtype == torch.float32 for layer in state.layers if hasattr(layer, "matrix"))


def test_int8_weights_from_the_command_line(model_dir):
    proc = run_cli(str(sample_pdf()), "-m", str(model_dir), "-n", "40", "--chunk-tokens", "3000",
                   "--quantize", "int8", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert 0 < result["words"] <= 40
    assert f"model {model_dir} on cpu (float32, int8 weights)" in proc.stderr  # the model ran, in int8


def test_int4_weights_for_an_rwkv_checkpoint_from_the_command_line(tmp_path):
    checkpoint = blinkdl_checkpoint(tmp_path / "tiny.pth", **RWKV_TINY | dict(vocab=65536, layers=2))  # the World vocabulary
    proc = run_cli("-", "-m", str(checkpoint), "-n", "20", "--quantize", "int4", "--temperature", "0",
                   stdin="Bees carry pollen from flower to flower. Crops depend on them. " * 10)
    assert proc.returncode == 0, proc.stderr
    assert f"model {checkpoint} on cpu" in proc.stderr and "int4 weights" in proc.stderr  # the model ran, in int4


def test_documents_share_their_decode_batches(model_dir, monkeypatch):
    """Several documents go through map-reduce together: notes of chunks from different documents
    decode in one batch, and so do the documents' final summaries."""
    import summarize.summarizers.model as model_summarizer

    session = load_session(Settings(model=str(model_dir), device="cpu", dtype="float32"), lambda msg: None)
    summarizer = ModelSummarizer(session, words=25, chunk_tokens=300, overlap=32)
    text = sorted(SAMPLES.glob("*.txt"))[0].read_text()
    documents = [(text[:1500], "a"), (text[3000:4500], "b"), ("", "empty"), (text[6000:6400], "c")]
    batches = []
    real = model_summarizer.generate_batch

    def recording(model, rows, request):
        batches.append(len(rows))
        return real(model, rows, request)

    monkeypatch.setattr(model_summarizer, "generate_batch", recording)
    # what each document went through, whatever the random model wrote
    monkeypatch.setattr(ModelSummarizer, "_summary", lambda self, doc: doc)
    assert summarizer.documents_per_batch == summarizer.map_batch > 3
    a, b, empty, c = summarizer.summarize_documents(documents)

    assert isinstance(empty, Exception) and "no text to summarize" in str(empty)
    assert [d.name for d in (a, b, c)] == ["a", "b", "c"]
    chunks = [len(d.chunks) for d in (a, b, c)]
    assert chunks[0] > 1 and chunks[1] > 1 and chunks[2] == 1
    # one batch for every chunk's notes (a's and b's), then one for the three final summaries
    assert batches[:2] == [chunks[0] + chunks[1], 3]
    counters = [d.progress.counters for d in (a, b, c)]
    # the instruction prefix is prefilled once for all documents; each chunk restores it once
    assert sum(c["prefix_prefills"] for c in counters) == 1
    assert [c["restores"] for c in counters] == [chunks[0], chunks[1], 0]
    assert all(c["tokens_out"] > 0 and c["tokens_in"] > 0 for c in counters)
    assert all(count_words(d.summary) <= 25 for d in (a, b, c))


# -- the word budget is capped by what the summary is written from --------------------------------


def token_budget(words: int) -> int:
    return int(words * TOKENS_PER_WORD) + 16


def recording_budgets(monkeypatch, limit: int) -> list[int]:
    """Record each generate_batch's max_new_tokens; one over `limit` fails at once (it would
    decode for minutes)."""
    import summarize.summarizers.model as model_summarizer

    budgets: list[int] = []
    real = model_summarizer.generate_batch

    def recording(model, state, request):
        budgets.append(request.max_new_tokens)
        assert request.max_new_tokens <= limit, f"a decode budget of {request.max_new_tokens} tokens"
        return real(model, state, request)

    monkeypatch.setattr(model_summarizer, "generate_batch", recording)
    return budgets


@pytest.mark.parametrize("strategy", ["map-reduce", "stream"])
def test_a_short_document_caps_the_word_budget(model_dir, monkeypatch, strategy):
    """-n 100000 on a 70-word document asks for at most 70 words, and says so once."""
    session = load_session(Settings(model=str(model_dir), device="cpu", dtype="float32"), lambda msg: None)
    notes: list[str] = []
    summarizer = ModelSummarizer(session, words=100_000, strategy=strategy, notify=notes.append,
                                 fallback=ExtractiveSummarizer(Settings(words=100_000)))
    words = [w for w in sorted(SAMPLES.glob("*.txt"))[0].read_text().split() if count_words(w) == 1]
    text = " ".join(words[:70])
    assert count_words(text) == 70
    budgets = recording_budgets(monkeypatch, limit=token_budget(70))
    summary = summarizer.summarize(text, name="short")
    assert budgets and max(budgets) == token_budget(70)
    assert [n for n in notes if "asking for" in n] == ["short: the document has 70 words; asking for at most 70"]
    assert summary.words <= 70

    # a budget below the document's length is the user's, and nothing is said
    notes.clear()
    budgets.clear()
    ModelSummarizer(session, words=30, strategy=strategy, notify=notes.append).summarize_documents([(text, "short")])
    assert max(budgets) == token_budget(30) and not [n for n in notes if "asking for" in n]


def test_a_tiny_document_still_gets_a_sentence(model_dir, monkeypatch):
    session = load_session(Settings(model=str(model_dir), device="cpu", dtype="float32"), lambda msg: None)
    notes: list[str] = []
    summarizer = ModelSummarizer(session, words=100_000, notify=notes.append)
    budgets = recording_budgets(monkeypatch, limit=token_budget(MIN_SUMMARY_WORDS))
    summarizer.summarize_documents([("Rivers flood in spring.", "tiny")])
    assert max(budgets) == token_budget(MIN_SUMMARY_WORDS)
    assert f"tiny: the document has 4 words; asking for at most {MIN_SUMMARY_WORDS}" in notes


def test_the_notes_cap_the_word_budget_of_a_long_document(model_dir, monkeypatch):
    """A document of several chunks: its summary is written from the notes, and asks for no more
    words than they have."""
    session = load_session(Settings(model=str(model_dir), device="cpu", dtype="float32"), lambda msg: None)
    notes: list[str] = []
    summarizer = ModelSummarizer(session, words=100_000, chunk_tokens=300, overlap=32, notify=notes.append)
    note = "The policy sets three tiers of targets, each with its own duties for the maintainers."  # 15 words

    def write_notes(docs):  # what the model would write per chunk, fixed: the test is about the budget
        for doc in docs:
            doc.notes = [note] * len(doc.chunks)

    monkeypatch.setattr(summarizer, "_write_notes", write_notes)
    text = sorted(SAMPLES.glob("*.txt"))[0].read_text()[:3000]
    doc = summarizer._open(text, "long")
    words = count_words(note) * len(doc.chunks)
    assert len(doc.chunks) > 2 and count_words(text) > words > MIN_SUMMARY_WORDS
    budgets = recording_budgets(monkeypatch, limit=token_budget(words))
    monkeypatch.setattr(ModelSummarizer, "_summary", lambda self, doc: doc)
    summarizer.summarize_documents([(text, "long")])
    assert set(budgets) == {token_budget(words)}  # the final summary's decode (asked again if unusable)
    assert [n for n in notes if "asking for" in n] == [f"long: its notes have {words} words; asking for at most {words}"]


def test_speculation_changes_nothing_in_a_greedy_summary_and_is_reported(model_dir):
    # --no-cache: the second run reads the document again rather than taking the first run's notes
    args = [str(sample_pdf()), "-m", str(model_dir), "-n", "60", "--temperature", "0", "--json", "--no-cache"]
    plain, speculative = run_cli(*args, "--speculate", "0"), run_cli(*args)
    assert plain.returncode == speculative.returncode == 0, plain.stderr + speculative.stderr
    plain_record, speculative_record = json.loads(plain.stdout), json.loads(speculative.stdout)
    assert speculative_record["summary"] == plain_record["summary"]
    assert speculative_record["tokens_out"] == plain_record["tokens_out"] > 0
    assert plain_record["draft_tokens"] == plain_record["accepted_tokens"] == 0
    assert 0 <= speculative_record["accepted_tokens"] <= speculative_record["draft_tokens"]


def test_drafts_from_the_mtp_head_change_nothing_in_a_greedy_summary(tmp_path):
    folder = tiny_released_layout(tmp_path / "with-head", mtp_head=True)
    args = [str(sample_pdf()), "-m", str(folder), "-n", "60", "--temperature", "0", "--json", "--no-cache"]
    plain, drafted = run_cli(*args, "--speculate", "0"), run_cli(*args, "--drafts", "mtp")
    assert plain.returncode == drafted.returncode == 0, plain.stderr + drafted.stderr
    plain_record, drafted_record = json.loads(plain.stdout), json.loads(drafted.stdout)
    assert drafted_record["summary"] == plain_record["summary"]
    assert 0 <= drafted_record["accepted_tokens"] <= drafted_record["draft_tokens"]


def test_drafts_asked_of_a_file_without_an_mtp_head_are_a_one_line_error(model_dir):
    result = run_cli(str(sample_pdf()), "-m", str(model_dir), "--drafts", "mtp", "--no-cache")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "has no multi-token-prediction head (mtp.* weights)" in result.stderr and result.stdout == ""


@needs_released_tokenizer
def test_drafts_kept_by_the_model_summarizer_are_counted(tmp_path):
    """With verifying made free, the library path drafts from the chunks and counts what was kept.
    The drafts come where the random model's notes, decoded to words, are read again for the
    summary: with the shipped tokenizer's placeholder ids they decode to no words at all."""
    model_dir = tiny_released_layout(tmp_path / "tiny", tokenizer=RELEASED_TOKENIZER)
    from summarize.engine.generation.drafts import DraftCosts

    class FreeVerify(DraftCosts):
        def cost(self, batch, drafts):
            return 1.0

    session = load_session(Settings(model=str(model_dir), device="cpu", dtype="float32", temperature=0), lambda msg: None)
    session.draft_costs = FreeVerify()
    summarizer = ModelSummarizer(session, words=30, chunk_tokens=300, overlap=32)
    text = sorted(SAMPLES.glob("*.txt"))[0].read_text()[:3000]
    try:
        summarizer.summarize(text, name="doc")
    except SummarizeError:  # a random model may write nothing usable; the counters are what this test reads
        pass
    counters = summarizer.progress.counters
    assert counters["draft_tokens"] > 0
    assert 0 <= counters["accepted_tokens"] <= counters["draft_tokens"]
