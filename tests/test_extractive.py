"""The extractive summary: central sentences, within the word budget, in document order."""

import random
import re
import time
from pathlib import Path

import pytest

from summarize.extractive import extractive_summary
from summarize.text import count_words, split_sentences

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
    assert extractive_summary(text, 100) == "A short note. It spans two lines. And a second paragraph."


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


def test_500_pages_in_a_couple_of_seconds():
    text = long_prose(repeats=800)  # ~1.5 MB, 16,000 sentences
    extractive_summary("Warm up the imports once. " * 50, 20)
    started = time.perf_counter()
    summary = extractive_summary(text, 400)
    elapsed = time.perf_counter() - started
    assert 240 <= count_words(summary) <= 400
    assert elapsed < 6.0  # typically ~1.3 s; generous for loaded CI machines


SAMPLES = sorted((Path(__file__).parent.parent / "samples").glob("*.txt"))


@pytest.mark.skipif(not SAMPLES, reason="no samples/*.txt")
@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_real_samples(path):
    text = path.read_text(encoding="utf-8")
    summary = extractive_summary(text, 150)
    assert count_words(summary) <= 150
    if count_words(text) > 1000 and summary:
        assert re.search(r"[.!?。！？][\"'”’)\]]*$", summary)
