"""The extractive summary: central sentences, within the word budget, in document order."""

import random
import re
from pathlib import Path

import pytest

import summarize.inputs.words
import summarize.summarizers.extractive_selection
from lines_executed import lines_executed
from summarize.errors import SummarizeError
from summarize.inputs.words import count_words, split_sentences
from summarize.settings import Settings
from summarize.summarizers.extractive import ExtractiveSummarizer
from summarize.summarizers.extractive_selection import extractive_summary

PARAGRAPHS = [
    "The town of {town} grew up where the {river} bends twice before reaching the sea. "
    "Its first houses were built by fishermen who needed shelter from the winter storms. "
    "By {year} the harbour held more than forty boats, and the market square was paved with grey stone. "
    "Travellers who arrived by the coast road often remarked on the smell of salt and tar. "
    "Mr. {name} kept the harbour records, noting every arrival, every departure and every loss at sea.",
    "Trade changed the town faster than anyone expected. "
    "Merchants from the south brought wool, glass and spices, and paid in silver coins worth about 2.5 shillings. "
    "The council argued for years about deepening the channel, e.g. by dredging the sandbanks of the {river}. "
    "When the work was finally done in {year}, larger ships could enter at any tide. "
    "Within a decade the population of {town} had doubled, and new streets climbed the hill behind the docks.",
    "Not everyone welcomed the growth. "
    "Dr. {name} warned that the crowded lanes near the water were breeding grounds for fever. "
    "She collected careful notes on every household, counting the sick and the dead week by week. "
    "Her report, printed in {year}, persuaded the council to build a fresh water supply from the hills. "
    "Historians now regard that report as the moment the town began to plan its future.",
    "The railway reached {town} a generation later and ended the golden age of the harbour. "
    "Goods that once came by sea now arrived by train, cheaper and faster, from the cities inland. "
    "Many of the old warehouses stood empty, their windows broken and their doors nailed shut. "
    "Yet the town survived by reinventing itself as a place for visitors who wanted clean air and quiet beaches. "
    "Today the harbour records kept by {name} are displayed in the small museum on the market square.",
]
NAMES = ["Hale", "Morrow", "Ashby", "Lindqvist", "Okafor", "Brennan", "Castell", "Varga"]
TOWNS = ["Kestrel Bay", "Northwick", "Saltmere", "Port Alder"]
RIVERS = ["Wend", "Tamar", "Esk", "Caldew"]
TERMINATORS = (".", "!", "?", "。", "！", "？")


def long_prose(repeats: int = 12, seed: int = 0) -> str:
    """A history of a harbour town, told ``repeats`` times with different names and dates."""
    rng = random.Random(seed)
    paragraphs = [
        p.format(
            name=rng.choice(NAMES), town=rng.choice(TOWNS), river=rng.choice(RIVERS), year=rng.randint(1700, 1900)
        )
        for _ in range(repeats)
        for p in PARAGRAPHS
    ]
    return "\n\n".join(paragraphs)


@pytest.fixture(scope="module")
def prose() -> str:
    return long_prose()


def _positions(summary: str, document: str) -> list[int]:
    """Index in the document's sentence list of each summary sentence, matched in order."""
    sentences = [" ".join(s.split()) for s in split_sentences(document)]
    positions, start = [], 0
    for s in split_sentences(summary):
        start = sentences.index(s, start) + 1  # ValueError if not found after the previous one
        positions.append(start - 1)
    return positions


@pytest.mark.parametrize("budget", [20, 50, 100, 250, 600])
def test_summary_fits_the_budget_and_uses_most_of_it(prose, budget):
    summary = extractive_summary(prose, budget)
    assert 0.6 * budget <= count_words(summary) <= budget
    assert summary.endswith(TERMINATORS)


def test_sentences_are_whole_and_in_document_order(prose):
    summary = extractive_summary(prose, 150)
    positions = _positions(summary, prose)
    assert positions == sorted(positions) and len(positions) >= 3


def test_deterministic(prose):
    assert extractive_summary(prose, 120) == extractive_summary(prose, 120)


def test_repeated_sentences_are_chosen_once(prose):
    summary = extractive_summary(prose, 300)
    sentences = split_sentences(summary)
    assert len(sentences) == len(set(sentences))


def test_off_topic_sentence_is_not_central(prose):
    paragraphs = prose.split("\n\n")
    paragraphs.insert(7, "Bananas are a yellow fruit rich in potassium and eaten by monkeys.")
    summary = extractive_summary("\n\n".join(paragraphs), 80)
    assert "Bananas" not in summary


def test_junk_is_skipped(prose):
    paragraphs = prose.split("\n\n")
    for k in range(0, len(paragraphs), 4):
        paragraphs.insert(k, "Page 12 of 48 — 2021/03/04 — 17:45:03 — ID 0x7f3a9c.")
        paragraphs.insert(k, "Contents")
    summary = extractive_summary("\n\n".join(paragraphs), 200)
    assert "Page" not in summary and "Contents" not in summary


def test_short_document_comes_back_whole():
    text = "  A short note.\nIt spans\n  two lines.\n\nAnd a second paragraph.  "
    assert extractive_summary(text, 100) == "A short note. It spans two lines.\n\nAnd a second paragraph."


def test_the_best_sentence_that_fits_when_little_fits():
    text = (
        "This opening sentence is far too long to fit into the tiny budget that we allow here. "
        "Harbour records matter. "
        "Another sentence that is also much too long for the budget, with many extra words in it."
    )
    assert extractive_summary(text, 4) == "Harbour records matter."


def test_empty_when_no_sentence_fits():
    text = "Every sentence here has more than three words. So does this one, clearly."
    assert extractive_summary(text, 3) == ""
    assert extractive_summary("", 10) == ""
    assert extractive_summary(text, 0) == ""


def test_cjk_document():
    base = [
        "这座小镇建在{river}河转弯的地方。",
        "最早的房子是渔民建造的，他们需要躲避冬天的风暴。",
        "到了{year}年，港口里已经有四十多条船。",
        "商人从南方带来羊毛、玻璃和香料。",
        "铁路通车以后，港口的黄金时代结束了。",
        "如今，小镇靠游客生活，海滩干净而安静。",
    ]
    rng = random.Random(1)
    paragraphs = [
        "".join(s.format(river=rng.choice("东西南北"), year=rng.randint(1700, 1900)) for s in base) for _ in range(20)
    ]
    text = "\n\n".join(paragraphs)
    summary = extractive_summary(text, 60)
    assert 36 <= count_words(summary) <= 60
    assert summary.endswith("。") and " " not in summary  # CJK sentences are joined without spaces
    assert _positions(summary, text) == sorted(_positions(summary, text))


def test_500_pages_are_summarized_with_linear_work():
    """The time it takes is in bench/bench_text.py; here, the work twice the text takes."""
    summary = extractive_summary(long_prose(repeats=800), 400)  # ~1.5 MB, 16,000 sentences
    assert 240 <= count_words(summary) <= 400
    work = []
    for repeats in (50, 100):  # 1,000 and 2,000 sentences
        text = long_prose(repeats=repeats)
        _, lines = lines_executed(lambda: extractive_summary(text, 400),
                                  summarize.summarizers.extractive_selection, summarize.inputs.words)
        work.append(lines)
    assert work[1] <= 2.5 * work[0]


SAMPLES = sorted((Path(__file__).parent.parent / "samples").glob("*.txt"))


@pytest.mark.skipif(not SAMPLES, reason="no samples/*.txt")
@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_real_samples(path):
    text = path.read_text(encoding="utf-8")
    summary = extractive_summary(text, 150)
    assert count_words(summary) <= 150
    if count_words(text) > 1000 and summary:
        assert re.search(r"[.!?。！？][\"'”’)\]]*$", summary)


# --- the selection's work grows linearly with the budget ------------------------------------------


def _letters(i: int) -> str:
    """A distinct word of letters only (digits are no terms): 0 -> "aab", 1 -> "bab", ..."""
    word, i = "", i + 26 * 26
    while i:
        i, r = divmod(i, 26)
        word += chr(ord("a") + r)
    return word


def _distinct_sentences(n: int) -> list[str]:
    """Sentences sharing five common terms, each with one term of its own: none repeats another."""
    return [f"Harbour boats carry grey stone {_letters(i)} daily." for i in range(n)]


def test_selection_work_is_linear_in_a_budget_that_takes_nearly_everything():
    work = []
    for n in (400, 800):
        text = " ".join(_distinct_sentences(n))
        summary, lines = lines_executed(lambda: extractive_summary(text, count_words(text) - 1),  # all but one sentence
                                        summarize.summarizers.extractive_selection)
        assert len(split_sentences(summary)) == n - 1
        work.append(lines)
    # Was ~4x: each candidate was compared with every chosen sentence sharing a term.
    assert work[1] <= 2.5 * work[0]


def test_repeats_are_chosen_once_at_any_budget():
    sentences = _distinct_sentences(300)
    repeated = "Harbour boats carry grey stone daily."
    text = " ".join(sentences[:150] + [repeated] * 100 + sentences[150:])
    summary = extractive_summary(text, count_words(text) - 1)
    assert split_sentences(summary).count(repeated) == 1
    assert len(split_sentences(summary)) == 301


# --- text without sentence ends ---------------------------------------------------------------------


def _unpunctuated(prose: str) -> str:
    return " ".join(re.sub(r"[.,;:!?]", " ", prose).split())  # one line, no sentence end


@pytest.mark.parametrize("budget", [4, 10, 50, 300])
def test_a_line_without_punctuation_has_a_summary_that_fits(prose, budget):
    line = _unpunctuated(prose)
    summary = extractive_summary(line, budget)
    assert 0.6 * budget <= count_words(summary) <= budget
    assert set(summary.split()) <= set(line.split())  # segments of the line, at whole words


def test_segments_are_never_shorter_than_a_sentence_can_be(prose):
    # Under MIN_WORDS a segment would be junk: budgets that small get no summary, as with sentences.
    assert extractive_summary(_unpunctuated(prose), 3) == ""


def test_segments_are_a_last_resort(prose):
    run = "an unpunctuated line about the harbour records " * 20  # 140 words, no sentence end
    text = prose + "\n\n" + run.strip()
    assert extractive_summary(text, 150) == extractive_summary(prose, 150)


def test_chinese_without_full_stops_has_a_summary():
    base = "这座小镇建在河流转弯的地方，最早的房子是渔民建造的，他们需要躲避冬天的风暴，商人从南方带来羊毛、玻璃和香料，"
    rng = random.Random(2)
    text = "\n".join(base.replace("河流", rng.choice(["东河", "西河", "南河"])) for _ in range(100))  # ~16 KB
    assert "。" not in text and len(text.encode()) > 15_000
    summary = extractive_summary(text, 50)
    assert 30 <= count_words(summary) <= 50
    assert ExtractiveSummarizer(Settings(words=50)).summarize(text, name="zh.txt").text == summary


# --- headings are no sentences --------------------------------------------------------------------


HEADED = "Target Tier Policy\n\nGeneral\n\n# Install\n\n" + long_prose(repeats=2)


@pytest.mark.parametrize("budget", [1, 3])
def test_a_budget_that_only_headings_fit_gives_no_summary(budget):
    assert extractive_summary(HEADED, budget) == ""
    with pytest.raises(SummarizeError, match=f"^doc.md: no sentence fits in {budget} words$"):
        ExtractiveSummarizer(Settings(words=budget)).summarize(HEADED, name="doc.md")


def test_headings_are_not_chosen_but_short_sentences_are():
    text = "Overview\n\n# Results\n\nIt worked.\n\n" + long_prose(repeats=2)
    assert extractive_summary(text, 2) == "It worked."
    summary = extractive_summary(text, 200)
    assert not {"Overview", "Results", "Install"} & set(summary.split())


# --- a summary that is (nearly) the whole document keeps its paragraphs ----------------------------


def test_a_budget_beyond_the_document_keeps_its_paragraphs():
    text = "First paragraph here. It has two sentences.\n\nSecond one\nwraps a line.\n\n\nThird paragraph."
    expected = "First paragraph here. It has two sentences.\n\nSecond one wraps a line.\n\nThird paragraph."
    assert extractive_summary(text, 1000) == expected


def test_nearly_the_whole_document_keeps_its_paragraphs():
    sentences = _distinct_sentences(60)
    paragraphs = [" ".join(sentences[k : k + 4]) for k in range(0, 60, 4)]
    text = "\n\n".join(paragraphs)
    summary = extractive_summary(text, count_words(text) - 1)  # all sentences but one
    kept = summary.split("\n\n")
    assert len(kept) >= len(paragraphs) - 1
    for paragraph in kept:  # each a run of one paragraph's sentences
        assert any(set(split_sentences(paragraph)) <= set(split_sentences(p)) for p in paragraphs)
    assert "\n\n" not in extractive_summary(text, 100)  # a summary proper stays one paragraph
