"""--cite and --json's `sources`: each summary sentence says where it comes from, computed by
matching it against what it was written from (summarizers/citations.py), never asked of the model.

The places are carried from extraction (inputs/places.py: PDF pages, form-fed pages, sections under
headings, EPUB chapters, lines) through chunking to the summary, extractive or the model's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from summarize.inputs.extract import document_from_bytes, extract_document
from summarize.inputs.places import LINE, PAGE, SECTION, aligned, sections
from summarize.inputs.words import count_words, sentence_spans
from summarize.settings import Settings
from summarize.summarizers import model as model_summarizer
from summarize.summarizers.chunking import chunk_text
from summarize.summarizers.citations import Passage, sources, with_citations
from summarize.summarizers.model import ModelSummarizer
from summarize.summarizers.read_cache import read_cache_for
from summarize.summarizers.session import load_session
from test_formats import CHAPTERS, make_epub
from tiny_models import tiny_released_layout

# One animal a page, three facts each: a sentence is found on exactly one page.
PAGES = [
    "Otters hold hands while they sleep so that the current does not carry them apart. A sea otter grows "
    "the densest fur of any animal, about a million hairs to the square inch. Otters keep a favourite stone "
    "in a pouch of skin under the forearm.",
    "Honeybees tell each other where flowers are by dancing in figures of eight. A worker bee lives about "
    "six weeks in summer and wears out her wings. The queen lays up to two thousand eggs on a single day.",
    "Owls cannot move their eyes, so they turn their heads as far as two hundred and seventy degrees. The "
    "feathers of an owl have soft fringes that silence its flight. A barn owl finds mice in total darkness "
    "by sound alone.",
    "Octopuses have three hearts and blue blood rich in copper. Two thirds of the neurons of an octopus lie "
    "in its eight arms. An octopus squeezes through any gap wider than its beak.",
    "Camels store fat, not water, in their humps. A thirsty camel drinks a hundred litres in ten minutes. "
    "Their long eyelashes and closing nostrils keep the desert sand out.",
    "Hummingbirds beat their wings up to eighty times a second and can fly backwards. A hummingbird visits "
    "a thousand flowers a day to feed its racing heart. At night it falls into a torpor to save energy.",
]
CITATION = re.compile(r" \((?:p\.|§|l\.|¶) [^)]*\)")


def page_of(sentence: str) -> int:
    (page,) = [number for number, text in enumerate(PAGES, start=1) if sentence.rstrip(".") in text]
    return page


@pytest.fixture
def animals_pdf(tmp_path: Path, pdf_factory) -> Path:
    return pdf_factory(tmp_path / "animals.pdf", PAGES)


# --- the places, from extraction to chunks -----------------------------------------------------


def test_a_pdf_knows_the_page_of_every_sentence(animals_pdf):
    document = extract_document(animals_pdf)
    assert document.places.kind == PAGE
    for start, end in sentence_spans(document.text):
        covered = document.places.covering(document.text, start, end)
        assert [int(document.places.label(i)) for i in covered] == [page_of(document.text[start:end])]


def test_pages_are_found_across_what_cleaning_changes():
    """Form feeds mark pages; cleaning drops running headers, rejoins hyphenated words and joins
    lines, and each page's own words still fall on that page."""
    raw = ("Annual Report\n\nThe harbour was dredged in the spring of that year so that larger ships could "
           "dock.\nIts new cranes lift contain-\ners of forty tonnes.\n1\f"
           "Annual Report\n\nFishing fell by a third while the works lasted.\nThe fish market moved to the "
           "old customs house.\n2\f"
           "Annual Report\n\nTourists came back in the summer with the first cruise ships.\n3")
    document = document_from_bytes(raw.encode(), "report.txt")
    assert "Annual Report" not in document.text and "containers" in document.text
    assert document.places.kind == PAGE
    for word, page in [("harbour", 1), ("containers", 1), ("Fishing", 2), ("customs", 2), ("Tourists", 3)]:
        at = document.text.index(word)
        assert document.places.covering(document.text, at, at + len(word)) == range(page - 1, page)


def test_alignment_follows_the_letters_and_digits_of_each_part():
    """`aligned` against a step-by-step reference: part k starts at the clean text's letter or digit
    number (the count in parts 0..k-1)."""
    parts = ["  Alpha beta-\ngamma, 12. ", "", "\n\n", "delta (epsilon)", " zeta\n\n\n eta 7"]
    text = " ".join(" ".join(parts).replace("-\n", "").split())
    places = aligned(PAGE, parts, text)
    positions = [i for i, char in enumerate(text) if char.isalnum()]
    count = 0
    for k, part in enumerate(parts):
        expected = 0 if k == 0 else positions[count] if count < len(positions) else len(text)
        assert places.starts[k] == expected
        count += sum(char.isalnum() for char in part)


def test_headings_make_sections_and_the_text_before_them_is_section_0():
    text = "A preface.\n\n# Otters\n\nOtters sleep.\n\n## \n\nUntitled.\n\n## Bees\n\nBees dance."
    places = sections(text)
    assert places.kind == SECTION and [places.label(i) for i in range(4)] == ["0", "Otters", "2", "Bees"]
    at = text.index("Bees dance")
    assert places.cite([places.covering(text, at, at + 5)]) == "§ Bees"
    assert sections("# Only one heading\n\nText.") is None  # one heading cuts nothing: lines instead


def test_an_epub_cites_its_chapters(tmp_path: Path):
    document = extract_document(make_epub(tmp_path / "bees.epub"))
    assert document.places.kind == SECTION
    for title, body in CHAPTERS:
        at = document.text.index(body.split(".")[0])
        assert document.places.cite([document.places.covering(document.text, at, at + 10)]) == f"§ {title}"


def test_each_chunk_knows_the_pages_it_covers(animals_pdf):
    document = extract_document(animals_pdf)
    spans = sentence_spans(document.text)
    for chunk in chunk_text(document.text, chunk_size=40, overlap=10, places=document.places):
        pages = {page_of(document.text[s:e]) for s, e in spans[chunk.sentences.start : chunk.sentences.stop]}
        assert [int(document.places.label(i)) for i in chunk.places] == list(range(min(pages), max(pages) + 1))


def test_citations_are_written_the_way_readers_expect(animals_pdf):
    places = extract_document(animals_pdf).places
    assert places.cite([range(2, 3)]) == "p. 3"
    assert places.cite([range(2, 5), range(0, 1), range(4, 6)]) == "p. 1, 3–6"
    assert places.listed([range(1, 3)]) == {"pages": [2, 3]}
    lines = aligned(LINE, ["a", "b", "c"], "a b c")
    assert lines.cite([range(0, 2)]) == "l. 1–2" and lines.listed([range(0, 2)]) == {"lines": [[1, 2]]}


# --- the rule -----------------------------------------------------------------------------------


def test_the_best_passage_is_cited_and_a_second_only_when_it_scores_close():
    places = aligned(PAGE, ["x"] * 4, "x x x x")
    passages = [Passage("Camels store fat in their humps.", range(0, 1)),
                Passage("Camels store fat in their humps, as traders say.", range(2, 3)),
                Passage("Owls turn their heads.", range(3, 4))]
    (one,) = sources("Camels keep fat in humps.", passages, places)
    assert one.cite == "p. 1, 3" and one.score > 0  # the second scores close to the first
    (quoted,) = sources("Camels store fat in their humps.", passages, places)
    assert quoted.cite == "p. 1"  # only one holds the sentence word for word: a quote cites where it is
    (alone,) = sources("Owls turn.", passages, places)
    assert alone.cite == "p. 4"
    (none,) = sources("Nothing shared here.", passages, places)
    assert (none.cite, none.score, none.record(0)["cite"]) == ("", 0.0, None)


def test_a_citation_ends_its_sentence_before_the_closing_mark():
    summary = "Camels store fat. Owls turn their heads!\n- A point without a stop"
    places = aligned(PAGE, ["camels store fat", "owls turn heads", "point stop"], "camels store fat owls turn heads point stop")
    passages = [Passage(text, range(i, i + 1)) for i, text in enumerate(["camels store fat", "owls turn heads", "point stop"])]
    found = sources(summary, passages, places)
    assert [source.text for source in found] == ["Camels store fat.", "Owls turn their heads!", "A point without a stop"]
    assert with_citations(summary, found) == "Camels store fat (p. 1). Owls turn their heads (p. 2)!\n- A point without a stop (p. 3)"


# --- the extractive summary ---------------------------------------------------------------------


@pytest.mark.parametrize("form", ["prose", "bullets"])
def test_an_extractive_summary_cites_exactly_the_pages_it_quotes(animals_pdf, run_cli, form):
    result = run_cli(str(animals_pdf), "--extractive", "-n", "60", "--cite", "--json", "--format", form)
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert len(record["sources"]) >= 3
    for index, source in enumerate(record["sources"]):
        page = page_of(source["text"])
        assert source["sentence"] == index and source["pages"] == [page] and source["cite"] == f"p. {page}"
        assert f"{source['text'].rstrip('.')} (p. {page})." in record["summary"]
    printed = run_cli(str(animals_pdf), "--extractive", "-n", "60", "--cite", "--format", form).stdout
    assert printed.rstrip("\n") == record["summary"]


@pytest.mark.parametrize("words", [12, 30, 75])
@pytest.mark.parametrize("form", ["prose", "bullets", "markdown"])
def test_citations_are_not_counted_against_the_word_cap(animals_pdf, run_cli, words, form):
    result = run_cli(str(animals_pdf), "--extractive", "-n", str(words), "--cite", "--format", form, "--json")
    record = json.loads(result.stdout)
    assert CITATION.search(record["summary"])
    assert count_words(CITATION.sub("", record["summary"])) == record["words"] <= words


def test_json_always_carries_sources(animals_pdf, run_cli):
    record = json.loads(run_cli(str(animals_pdf), "--extractive", "-n", "30", "--json").stdout)
    assert not CITATION.search(record["summary"])  # without --cite, the summary has none ...
    assert [source["text"] for source in record["sources"]] == [record["summary"][s:e] for s, e in sentence_spans(record["summary"])]
    for source in record["sources"]:  # ... and --json still says where each sentence comes from
        assert set(source) == {"sentence", "text", "pages", "cite", "score"} and source["score"] > 0


def test_markdown_headings_are_cited_as_sections(tmp_path: Path, run_cli):
    notes = tmp_path / "animals.md"
    notes.write_text("".join(f"# {name}\n\n{text}\n\n" for name, text in zip(["Otters", "Bees", "Owls"], PAGES)))
    record = json.loads(run_cli(str(notes), "--extractive", "-n", "40", "--cite", "--json").stdout)
    names = {1: "Otters", 2: "Bees", 3: "Owls"}
    assert record["sources"]
    for source in record["sources"]:
        name = names[page_of(source["text"])]
        assert source["sections"] == [name] and f"(§ {name})." in record["summary"]


def test_a_plain_text_file_is_cited_by_its_lines(tmp_path: Path, run_cli):
    plain = tmp_path / "animals.txt"  # a sentence a line, a blank line between
    plain.write_text("\n\n".join(sentence.strip() for page in PAGES[:3] for sentence in re.findall(r"[^.]+\.", page)) + "\n")
    record = json.loads(run_cli(str(plain), "--extractive", "-n", "30", "--cite", "--json").stdout)
    file_lines = plain.read_text().split("\n")
    assert record["sources"]
    for source in record["sources"]:
        (number,) = [n for n, line in enumerate(file_lines, start=1) if line == source["text"]]
        assert source["lines"] == [[number, number]] and f"(l. {number})." in record["summary"]


# --- the model's summary ------------------------------------------------------------------------

# What a model might write from the animals' pages: a paraphrase of one page's fact each.
# Fewer words than the notes of a random model hold, so that none is cut.
PARAPHRASES = {1: "Otters sleep holding hands.", 4: "Octopuses have three hearts.", 6: "Hummingbirds fly backwards."}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_released_layout(tmp_path_factory.mktemp("tiny-qwen3.5"))


def writing(answer: str, monkeypatch) -> None:
    """The model's final answer is `answer` (a random model writes no sentences to cite); it reads
    the document and writes its notes itself."""
    real = ModelSummarizer._generate

    def generate(self, states, words, contexts, rows=None, phase="summary"):
        results = real(self, states, words, contexts, rows, phase)
        if phase == "summary":
            for result in results:
                result.text = answer
        return results

    monkeypatch.setattr(ModelSummarizer, "_generate", generate)
    monkeypatch.setattr(model_summarizer, "NOTES_WORDS", 10)  # a random model writes to its budget


@pytest.mark.parametrize("strategy", ["map-reduce", "stream"])
def test_a_model_summary_cites_the_pages_its_sentences_come_from(animals_pdf, model_dir, monkeypatch, strategy):
    writing(" ".join(PARAPHRASES.values()), monkeypatch)
    settings = Settings(model=str(model_dir), device="cpu", dtype="float32", temperature=0, cache=False)
    summarizer = ModelSummarizer(load_session(settings, lambda msg: None), words=60, strategy=strategy,
                                 chunk_tokens=90, overlap=12, cite=True)
    document = extract_document(animals_pdf)
    summary = summarizer.summarize(document.text, name="animals", places=document.places)
    assert summary.method == "model" and summary.extra["chunks"] > 2
    assert [source.text for source in summary.sources] == list(PARAPHRASES.values())
    for page, source in zip(PARAPHRASES, summary.sources):
        assert set(source.places["pages"]) <= set(range(1, len(PAGES) + 1))  # pages that exist ...
        assert page in source.places["pages"]  # ... among them the one it paraphrases
        assert f"({source.cite})" in summary.text
    assert summary.words == count_words(CITATION.sub("", summary.text)) <= 60


def test_notes_from_the_read_cache_cite_the_same_pages(animals_pdf, model_dir, monkeypatch):
    writing(" ".join(PARAPHRASES.values()), monkeypatch)
    settings = Settings(model=str(model_dir), device="cpu", dtype="float32", temperature=0)
    session = load_session(settings, lambda msg: None)
    document = extract_document(animals_pdf)
    runs = []
    for _ in range(2):
        summarizer = ModelSummarizer(session, words=60, chunk_tokens=90, overlap=12,
                                     cache=read_cache_for(settings, session.model, lambda msg: None))
        runs.append(summarizer.summarize(document.text, name="animals", places=document.places))
    assert runs[0].extra["cached_chunks"] == 0 and runs[1].extra["cached_chunks"] == runs[1].extra["chunks"]
    assert runs[1].sources == runs[0].sources


def test_a_model_run_from_the_command_line_cites_pages_that_exist(animals_pdf, model_dir, run_cli):
    result = run_cli(str(animals_pdf), "-m", str(model_dir), "-n", "40", "--cite", "--json", "--dtype", "float32",
                     "--temperature", "0", "--chunk-tokens", "128", "--overlap", "16", "--no-cache")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["words"] <= 40 and record["sources"]  # the model's summary, or the extractive one it fell back to
    for source in record["sources"]:
        assert source["pages"] and set(source["pages"]) <= set(range(1, len(PAGES) + 1))
        assert f"({source['cite']})" in record["summary"]
