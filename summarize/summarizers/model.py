"""Model-driven summaries: stream the chunks through the recurrent state, merge, respect the length.
The two strategies, map-reduce and stream, are told in `ModelSummarizer`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from summarize.diagnostics.log import DiagnosticsLog
from summarize.engine.diagnostics import SpanReport
from summarize.engine.generation.generate import generate_batch
from summarize.errors import SummarizeError
from summarize.inputs.places import Places, text_places
from summarize.inputs.words import count_words
from summarize.records import ModelProgress, Summary
from summarize.settings import DEFAULT_BATCH_MEMORY, DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP, MAP_REDUCE, PROSE, STREAM
from summarize.summarizers.base import DocumentSummarizer
from summarize.summarizers.chunking import Chunk, chunk_text
from summarize.summarizers.citations import Passage, sources, with_citations
from summarize.summarizers.map_rows import map_batch_size
from summarize.summarizers.prompts import (
    FORM_SENTENCES,
    MAP_INSTRUCTION,
    MAP_QUESTION,
    REDUCE_PROMPT,
    SINGLE_INSTRUCTION,
    STREAM_INSTRUCTION,
    STREAM_QUESTION,
    clean_output,
    focus_sentence,
    language_sentence,
    summary_from_answer,
)
from summarize.summarizers.read_cache import ReadCache
from summarize.summarizers.session import ModelSession

NOTES_WORDS = 80  # the most words of notes per chunk in map-reduce
# The notes' word budgets per chunk: nearby -n fall in one band, and so share their cached notes.
# Below the smallest, a chunk's names and numbers would not fit whatever the summary's length.
NOTES_BANDS = (24, 32, 48, 64, NOTES_WORDS)
NOTES_SHARE = 2  # a document's notes hold about twice the words its summary keeps: the summary still chooses
# Where a document's seconds go (--json `phase_seconds`): reading (prefill), writing chunks' notes,
# writing the summary (merging notes included). A batch shared by documents counts for each.
PHASES = ("prefill", "notes", "summary")
TOKENS_PER_WORD = 1.6  # generous: English averages ~1.3 tokens per word, other languages more
STREAM_ATTENTION_WINDOW = 4096  # tokens the attention layers keep in stream mode (plus the prefix)
RESTATE_LIMIT = 2  # how often the final summary is asked for again when the first is unusable
# A summary is at most as long as what it is written from (the document, or its notes), but never
# asked shorter than this: a document of a few words still gets a sentence.
MIN_SUMMARY_WORDS = 20


def notes_words(words: int, chunks: int) -> int:
    """Words of notes per chunk for a summary of `words` words from `chunks` chunks: the smallest
    band that gives the notes together NOTES_SHARE times the summary's words, at most NOTES_WORDS."""
    wanted = math.ceil(NOTES_SHARE * words / chunks)
    return min(NOTES_WORDS, next((band for band in NOTES_BANDS if band >= wanted), NOTES_BANDS[-1]))


def token_budget(words: int) -> int:
    """The most tokens decoded for an answer of about `words` words."""
    return int(words * TOKENS_PER_WORD) + 16


@dataclass
class _Document:
    """One document on its way through the summarizer."""

    name: str
    text: str
    places: Places
    chunks: list[Chunk]
    progress: ModelProgress
    start: float
    notes: list[str] = field(default_factory=list)
    chunk_notes: dict[int, str] = field(default_factory=dict)  # each chunk's notes, "" where unusable
    summary: str = ""
    words: int = 0  # the summary's word budget: -n, capped by what it is written from
    notes_words: int = NOTES_WORDS  # each chunk's notes' word budget in map-reduce (`notes_words`)


class ModelSummarizer:
    """Summarizes with a recurrent-state model, by one of two strategies.

    map-reduce (default): the instruction prefix is prefilled once per document and snapshotted; every
    chunk opens with a reset-state marker, which restores that snapshot, then its text is prefilled
    and the model writes notes; the notes are merged (hierarchically when they do not fit one window)
    into the final summary.
    stream: the marker appears only before the first chunk; the state carries across the whole
    document and the model writes the summary from the state after the last chunk. The attention
    layers keep the prefix and a sliding window of recent tokens, so memory stays flat.
    """

    method = "model"

    def __init__(
        self,
        session: ModelSession,
        *,
        words: int,
        focus: str | None = None,
        language: str | None = None,
        form: str = PROSE,
        cite: bool = False,
        strategy: str = MAP_REDUCE,
        chunk_tokens: int | None = None,
        overlap: int | None = None,
        batch_memory: int = DEFAULT_BATCH_MEMORY,
        cache: ReadCache | None = None,
        fallback: DocumentSummarizer | None = None,
        notify: Callable[[str], None] = lambda msg: None,
        on_span: Callable[[ModelProgress, SpanReport], None] | None = None,
        on_phase: Callable[[ModelProgress], None] | None = None,
        diagnostics: DiagnosticsLog | None = None,
    ) -> None:
        self.s = session
        self.words = words
        self.form = form
        self.cite = cite
        # what the final prompts say of --focus, --format and --language
        self.asks = {"focus": focus_sentence(focus), "form": FORM_SENTENCES[form], "language": language_sentence(language)}
        self.strategy = strategy
        self.chunk_tokens = chunk_tokens or DEFAULT_CHUNK_TOKENS
        self.overlap = DEFAULT_OVERLAP if overlap is None else overlap
        self.overlap = min(self.overlap, self.chunk_tokens // 4)
        self.fallback = fallback
        self.notify = notify
        self.on_span = on_span
        self.on_phase = on_phase
        self.diagnostics = diagnostics
        self.map_batch = map_batch_size(session, self.chunk_tokens, batch_memory)
        self.cache = cache
        self.progress = ModelProgress()
        # per-token span reports cost a share of each decode step: only when someone reads them
        session.model.listener = self._span if on_span is not None or diagnostics is not None else None

    # -- documents in, summaries out ------------------------------------------------------------

    @property
    def documents_per_batch(self) -> int:
        """How many documents to hand to `summarize_documents` at once: their decodes share batches."""
        return self.map_batch if self.strategy == MAP_REDUCE else 1

    def summarize(self, text: str, *, name: str, places: Places | None = None) -> Summary:
        (result,) = self.summarize_documents([(text, name)], [places])
        if isinstance(result, Exception):
            raise result
        return result

    def summarize_documents(self, documents: list[tuple[str, str]],
                            places: list[Places | None] | None = None) -> list[Summary | Exception]:
        """Summaries of several (text, name) documents, in order; a document's failure is returned
        in its place as the exception. `places`, one per document, are where their parts came
        from (None: found in the text itself, `text_places`).

        In map-reduce the documents go through each stage together: the instruction prefix is
        prefilled once for all of them of one notes budget, their chunks' notes are decoded in
        shared batches, and so are their final summaries. Stream reads one document after another.
        """
        docs: list[_Document | Exception] = []
        for (text, name), where in zip(documents, places or [None] * len(documents)):
            try:
                docs.append(self._open(text, name, where))
            except SummarizeError as exc:
                docs.append(exc)
        live = [d for d in docs if isinstance(d, _Document)]
        if self.strategy == STREAM:
            for doc in live:
                self.progress = doc.progress
                self._cap_words(doc, doc.text, "the document has")
                doc.summary = self._stream(doc)
        else:
            self._write_notes([d for d in live if len(d.chunks) > 1])
            self._write_summaries(live)
        if self.diagnostics is not None:
            self.diagnostics.flush()
        if self.cache is not None:
            self.cache.trim()
        results = []
        for doc in docs:
            try:
                results.append(doc if isinstance(doc, Exception) else self._summary(doc))
            except SummarizeError as exc:
                results.append(exc)
        return results

    def close(self) -> None:
        """Close the diagnostics file, flushed: the run has ended (or failed)."""
        if self.diagnostics is not None:
            self.diagnostics.close()
            self.diagnostics = None

    def _open(self, text: str, name: str, places: Places | None = None) -> _Document:
        places = places or text_places(text)
        chunks = chunk_text(text, chunk_size=self.chunk_tokens, overlap=self.overlap, count=self.s.tokenizer.count,
                            strategy=self.strategy, places=places)
        if not chunks:
            raise SummarizeError(f"{name}: no text to summarize")
        counters = {"prefix_prefills": 0, "restores": 0, "tokens_in": 0, "tokens_out": 0, "draft_tokens": 0, "accepted_tokens": 0,
                    "cached_chunks": 0}
        counters |= {f"{phase}_s": 0.0 for phase in PHASES}
        progress = ModelProgress(input=name, chunks=len(chunks), counters=counters)
        return _Document(name, text, places, chunks, progress, time.perf_counter(),
                         notes_words=notes_words(self.words, len(chunks)))

    def _summary(self, doc: _Document) -> Summary:
        counters = doc.progress.counters
        if not doc.summary and self.fallback is not None:
            untranslated = ", in the document's language" if self.asks["language"] else ""
            self.notify(f"{doc.name}: the model wrote no usable summary; writing an extractive one instead{untranslated}")
            summary = self.fallback.summarize(doc.text, name=doc.name, places=doc.places)
            # what the model read and wrote before its answer was found unusable
            summary.extra |= {key: counters[key] for key in ("tokens_in", "tokens_out", "draft_tokens", "accepted_tokens", "cached_chunks")}
            summary.extra["phase_seconds"] = self._phase_seconds(counters)
            return summary
        if not doc.summary:
            raise SummarizeError(f"{doc.name}: the model wrote no usable summary")
        # a sentence comes from the chunks it was written from: their text and the notes on them
        passages = [Passage(f"{chunk.text}\n\n{doc.chunk_notes.get(chunk.index, '')}", chunk.places) for chunk in doc.chunks]
        found = sources(doc.summary, passages, doc.places)
        return Summary(
            text=with_citations(doc.summary, found) if self.cite else doc.summary,
            words=count_words(doc.summary),
            method=self.method,
            input=doc.name,
            seconds=time.perf_counter() - doc.start,
            extra={
                "model": self.s.name,
                "strategy": self.strategy,
                "chunks": len(doc.chunks),
                "tokens_in": counters["tokens_in"],
                "tokens_out": counters["tokens_out"],
                "prefix_prefills": counters["prefix_prefills"],
                "restores": counters["restores"],
                "cached_chunks": counters["cached_chunks"],
                "draft_tokens": counters["draft_tokens"],
                "accepted_tokens": counters["accepted_tokens"],
                "phase_seconds": self._phase_seconds(counters),
            },
            sources=found,
        )

    # -- map-reduce ----------------------------------------------------------------------------

    def _write_notes(self, docs: list[_Document]) -> None:
        """Notes on every chunk of `docs`: each chunk read alone from the prefix snapshot, the notes
        decoded in batches that may span documents of one notes budget (its prefix is prefilled
        once); notes kept in the cache are taken from it."""
        bands: dict[int, list[_Document]] = {}
        for doc in docs:
            bands.setdefault(doc.notes_words, []).append(doc)
        for words, band in bands.items():
            self._write_band_notes(band, words)
        for doc in docs:
            doc.notes = [note for _, note in sorted(doc.chunk_notes.items()) if note]

    def _write_band_notes(self, docs: list[_Document], words: int) -> None:
        """Notes of about `words` words on every chunk of `docs`."""
        tok = self.s.tokenizer
        prefix = tok.chat_prefix_ids(None, MAP_INSTRUCTION.format(words=words))
        rows = []  # (document, chunk, prompt, cache key) of each chunk to read
        for doc in docs:
            for chunk in doc.chunks:
                prompt = tok.chat_suffix_ids(chunk.text, MAP_QUESTION)
                key = None if self.cache is None else self.cache.notes_key(prefix + prompt, self.s.sampling, token_budget(words))
                cached = None if key is None else self.cache.notes(key)
                if cached is None:
                    rows.append((doc, chunk, prompt, key))
                else:
                    doc.chunk_notes[chunk.index] = cached
                    doc.progress.counters["cached_chunks"] += 1
            if doc.progress.counters["cached_chunks"]:
                self.notify(f"{doc.name}: notes of {doc.progress.counters['cached_chunks']} of {len(doc.chunks)} chunks from the cache"
                            + self._unread_in_diagnostics())
        if rows:
            self._read_chunks(rows, prefix, words)

    def _read_chunks(self, rows: list, prefix: list[int], words: int) -> None:
        """Read each (document, chunk, prompt, cache key) of `rows` and write its notes of about `words` words."""
        self.progress = rows[0][0].progress
        prefix_state = self.s.new_state(1)
        self._phase(None, "prefix")
        self._prefill(prefix, prefix_state)
        self.progress.counters["prefix_prefills"] += 1  # the same instruction serves every document of the band
        snapshot = prefix_state.snapshot()
        for start in range(0, len(rows), self.map_batch):
            group = rows[start : start + self.map_batch]
            states, prompts = [], []
            for doc, chunk, prompt, _ in group:  # chunks differ in length: each is read on its own...
                assert chunk.resets_state  # map-reduce: every chunk opens with the marker
                self.progress = doc.progress
                state = self.s.new_state(1)
                state.restore(snapshot)  # the reset-state marker: back to "just read the instruction"
                self.progress.counters["restores"] += 1
                self._phase(chunk.index, "prefill")
                prompts.append(prompt)
                self._prefill(prompt, state)
                states.append(state)
            # ...and their notes are written together: decoding is memory-bound, a batch costs
            # about what one sequence does
            named = [(doc, chunk.index) for doc, chunk, _, _ in group]
            generations = self._generate(states, words, prompts, named, phase="notes")
            for (doc, chunk, _, key), generation in zip(group, generations):
                doc.chunk_notes[chunk.index] = clean_output(generation.text)
                if key is not None:  # kept as written, unusable ones too: they would be again
                    self.cache.keep_notes(key, doc.chunk_notes[chunk.index])

    def _write_summaries(self, docs: list[_Document]) -> None:
        """The final summary of each document (from its notes, or its one chunk), decoded in
        batches across documents; a document whose answer is unusable is asked again alone."""
        tok = self.s.tokenizer
        pairs = []
        for doc in docs:
            self.progress = doc.progress
            if len(doc.chunks) == 1:  # a document that fits one window is summarized directly
                self._cap_words(doc, doc.chunks[0].text, "the document has")
                text = SINGLE_INSTRUCTION.format(words=doc.words, **self.asks) + doc.chunks[0].text
            elif doc.notes:
                notes = "\n\n".join(self._merge(doc.notes, doc.notes_words * 2))
                self._cap_words(doc, notes, "its notes have")
                text = REDUCE_PROMPT.format(words=doc.words, notes=notes, **self.asks)
            else:  # no chunk gave usable notes: nothing to summarize from (the fallback takes over)
                continue
            pairs.append((doc, tok.chat_prompt_ids(text)))
        for start in range(0, len(pairs), self.map_batch):
            group = pairs[start : start + self.map_batch]
            states = []
            for doc, prompt in group:
                self.progress = doc.progress
                states.append(self._prompt_state(prompt, chunk=None if len(doc.chunks) > 1 else 0))
            words = max(doc.words for doc, _ in group)  # the rows share one decode loop
            generations = self._generate(states, words, [p for _, p in group], [(doc, None) for doc, _ in group])
            for (doc, _), generation in zip(group, generations):
                doc.summary = summary_from_answer(generation.text, self.form, doc.words)
        for doc, prompt in pairs:
            if count_words(doc.summary) == 0 and self.s.sampling.temperature != 0:  # greedy would repeat itself
                self.progress = doc.progress
                doc.summary = self._final(lambda: self._prompt_state(prompt, chunk=None), doc.words, prompt, attempts=RESTATE_LIMIT)

    def _cap_words(self, doc: _Document, source: str, has: str) -> None:
        """Set the document's word budget: -n, but no longer than `source`, what the summary is
        written from (decoding 100,000 words' worth of tokens for a 70-word text takes minutes);
        said once when it cuts -n."""
        available = count_words(source)
        doc.words = min(self.words, max(available, MIN_SUMMARY_WORDS))
        if doc.words < self.words:
            self.notify(f"{doc.name}: {has} {available} words; asking for at most {doc.words}")

    def _merge(self, notes: list[str], words: int) -> list[str]:
        """Notes that do not fit one window are merged in groups, of about `words` words each, until they do."""
        tok = self.s.tokenizer
        while len(notes) > 1 and tok.count("\n\n".join(notes)) > self.chunk_tokens:
            groups, group = [], []
            for note in notes:
                if group and tok.count("\n\n".join(group + [note])) > self.chunk_tokens:
                    groups.append(group)
                    group = []
                group.append(note)
            groups.append(group)
            if len(groups) == len(notes):  # every note alone fills a window: keep what fits
                return notes[:1]
            merged = []
            for group in groups:  # -n, --focus, --format and --language are not in a merge: it is kept as chunks' notes are
                prompt = tok.chat_prompt_ids(REDUCE_PROMPT.format(words=words, focus="", form=FORM_SENTENCES[PROSE], language="",
                                                                  notes="\n\n".join(group)))
                key = None if self.cache is None else self.cache.notes_key(prompt, self.s.sampling, token_budget(words))
                note = None if key is None else self.cache.notes(key)
                if note is None:
                    self._phase(None, "merge")
                    state = self.s.new_state(1)
                    self._prefill(prompt, state)
                    self._phase(None, "decode")
                    note = clean_output(self._generate([state], words, [prompt])[0].text)
                    if key is not None:
                        self.cache.keep_notes(key, note)
                merged.append(note)
            notes = [n for n in merged if n]
        return notes

    # -- stream --------------------------------------------------------------------------------

    def _stream(self, doc: _Document) -> str:
        tok = self.s.tokenizer
        prefix = tok.chat_prefix_ids(None, STREAM_INSTRUCTION)
        # each chunk's tokens; the summary's drafts are looked up in all of them
        pieces = [tok.chat_text_ids(chunk.text if chunk.index == 0 else " " + chunk.text) for chunk in doc.chunks]
        read = [token for piece in pieces for token in piece]
        key = None if self.cache is None else self.cache.state_key(prefix, pieces, STREAM_ATTENTION_WINDOW)
        state = self.s.new_state(1)
        if key is not None and self.cache.load_state(key, state):
            self.progress.counters["cached_chunks"] += len(doc.chunks)
            self.notify(f"{doc.name}: the state after the document from the cache" + self._unread_in_diagnostics())
        else:
            self._read_document(doc, prefix, pieces, state)
            if key is not None:
                self.cache.keep_state(key, state)
        after_document = state.snapshot()

        def ask():
            state.restore(after_document)
            self._phase(None, "prefill")
            self._prefill(tok.chat_suffix_ids("", STREAM_QUESTION.format(words=doc.words, **self.asks)), state)
            return state

        return self._final(ask, doc.words, read)

    def _read_document(self, doc: _Document, prefix: list[int], pieces: list[list[int]], state) -> None:
        """Read the instruction, then each chunk's tokens (`pieces`), into `state` in one pass."""
        self._phase(None, "prefix")
        self._prefill(prefix, state)
        self.progress.counters["prefix_prefills"] += 1
        snapshot = state.snapshot()
        for chunk, ids in zip(doc.chunks, pieces):
            if chunk.resets_state:  # stream: only the first chunk carries the marker
                state.restore(snapshot)
                self.progress.counters["restores"] += 1
            self._phase(chunk.index, "prefill")
            self._prefill(ids, state)
            state.keep_attention_window(keep_first=len(prefix), keep_last=STREAM_ATTENTION_WINDOW)

    # -- the pieces ----------------------------------------------------------------------------

    def _final(
        self, start: Callable[[], object], words: int, context: list[int], attempts: int = 1 + RESTATE_LIMIT
    ) -> str:
        """Generate the summary from the row `start` gives, having read its prompt (drafts looked up
        in `context`), trim it to `words` on a sentence end; ask again if unusable."""
        for _ in range(attempts):
            state = start()
            self._phase(None, "decode")
            text = summary_from_answer(self._generate([state], words, [context])[0].text, self.form, words)
            if count_words(text) > 0:
                return text
            if self.s.sampling.temperature == 0:
                break  # greedy would say the same again
        return ""

    def _prompt_state(self, prompt: list[int], *, chunk: int | None):
        """A new row that has read `prompt`."""
        state = self.s.new_state(1)
        self._phase(chunk, "prefill")
        self._prefill(prompt, state)
        return state

    @staticmethod
    def _phase_seconds(counters: dict) -> dict[str, float]:
        return {phase: round(counters[f"{phase}_s"], 3) for phase in PHASES}

    def _prefill(self, ids: list[int], state) -> None:
        """Read the token ids `ids` into the row `state`, counted and timed."""
        started = time.perf_counter()
        self.progress.counters["tokens_in"] += len(ids)
        state.read(self.s.model, ids)
        self.progress.counters["prefill_s"] += time.perf_counter() - started

    def _generate(self, states: list, words: int, contexts: list[list[int]], rows: list | None = None, phase: str = "summary") -> list:
        """Generate from the rows `states`, each having read its prompt, up to the token budget for
        `words`; each row's drafts are looked up in its `contexts` entry (the text it was given).
        The engine decodes the rows as one batch, and they are spent.

        `rows`, for a batch that may span documents: one (document, chunk index or None) per row;
        the live view and the diagnostics records then name each row's document and chunk, and
        each document counts its own tokens, and the batch's seconds under `phase` ("notes" or
        "summary").
        """
        started = time.perf_counter()
        if rows is not None:
            self.progress.rows = [(doc.name, chunk) for doc, chunk in rows]
            self._phase(rows[0][1], "decode")
        try:
            results = generate_batch(self.s.model, states, self.s.request(token_budget(words), contexts))
        finally:
            self.progress.rows = None
        counters = [doc.progress.counters for doc, _ in rows] if rows is not None else [self.progress.counters] * len(results)
        for counter, result in zip(counters, results):
            counter["tokens_out"] += len(result.token_ids)
            counter["draft_tokens"] += result.draft_tokens
            counter["accepted_tokens"] += result.accepted_tokens
        for counter in {id(c): c for c in counters}.values():  # a document with many rows counts the batch once
            counter[f"{phase}_s"] += time.perf_counter() - started
        return results

    def _unread_in_diagnostics(self) -> str:
        """What a note on cached chunks adds when a diagnostics file is written: those chunks are
        not read, so the file has no prefill rows for them."""
        if self.diagnostics is None:
            return ""
        return " (not read again, so the diagnostics file has no rows for them; --no-cache reads them)"

    def _phase(self, chunk: int | None, phase: str) -> None:
        self.progress.chunk, self.progress.phase = chunk, phase
        if self.on_phase is not None:
            self.on_phase(self.progress)

    def _span(self, report: SpanReport) -> None:
        if self.diagnostics is not None:
            self.diagnostics(self.progress, report)
            if not self.diagnostics.writing and self.on_span is None:
                self.s.model.listener = None  # the log failed and said so: no more per-token reports
        if self.on_span is not None:
            self.on_span(self.progress, report)
