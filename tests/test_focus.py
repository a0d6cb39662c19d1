"""--focus: what the summary should concentrate on. It is said in the instruction of the final
prompts (the single-chunk and reduce prompts before the text, the stream question after it),
never in the notes of each chunk, and it is part of the settings' fingerprint."""

from __future__ import annotations

from pathlib import Path

import pytest

from summarize.run import local
from summarize.settings import MAP_REDUCE, STREAM, Settings
from summarize.summarizers.extractive import ExtractiveSummarizer
from summarize.summarizers.model import ModelSummarizer
from summarize.summarizers.prompts import FORM_SENTENCES, MAP_INSTRUCTION, REDUCE_PROMPT, SINGLE_INSTRUCTION, focus_sentence
from summarize.summarizers.session import load_session
from tiny_models import tiny_released_layout

SAMPLE = Path(__file__).resolve().parents[1] / "samples" / "target-tier-policy.txt"


def test_the_option_and_its_environment_variable_reach_the_settings(monkeypatch, tmp_path, run_cli):
    seen = []
    monkeypatch.setattr(local, "run", lambda plan, settings, **kwargs: seen.append(settings) or [])
    doc = tmp_path / "a.txt"
    doc.write_text("One sentence here. Another sentence here.\n")
    run_cli(str(doc), "--focus", "risks and costs")
    run_cli(str(doc), env={"SUMMARIZE_FOCUS": "who pays"})
    assert [s.focus for s in seen] == ["risks and costs", "who pays"]


def test_a_focus_changes_the_fingerprint_of_model_summaries_only():
    plain, focused = Settings(), Settings(focus="risks and costs")
    assert focused.fingerprint() != plain.fingerprint()
    assert Settings(focus="  risks\nand   costs ").fingerprint() == focused.fingerprint()  # one line, as said
    assert Settings(focus="", extractive=True).fingerprint() == Settings(focus="x", extractive=True).fingerprint()


def test_without_a_focus_the_prompts_are_as_before():
    assert focus_sentence(None) == focus_sentence("  ") == ""
    assert SINGLE_INSTRUCTION.format(words=50, focus="", form=FORM_SENTENCES["prose"], language="") == (
        "Summarize the following document in about 50 words. Write plain prose paragraphs, no headings and no lists."
        "\n\nDocument:\n")
    assert "{focus}" not in MAP_INSTRUCTION  # the notes on each chunk never narrow to it


@pytest.mark.parametrize("strategy, chunk_tokens", [(MAP_REDUCE, 1536), (MAP_REDUCE, 256), (STREAM, 256)])
def test_the_focus_is_in_the_final_prompt_only(tmp_path, strategy, chunk_tokens):
    session = load_session(Settings(model=str(tiny_released_layout(tmp_path / "tiny")), temperature=0), lambda msg: None)
    said: list[str] = []
    for method in ("chat_prompt_ids", "chat_prefix_ids", "chat_suffix_ids", "chat_text_ids"):
        real = getattr(session.tokenizer, method)
        setattr(session.tokenizer, method, lambda *args, real=real, **kw: said.append(" ".join(map(str, args))) or real(*args, **kw))
    summarizer = ModelSummarizer(session, words=40, focus="risks and\n costs", strategy=strategy, chunk_tokens=chunk_tokens,
                                 fallback=ExtractiveSummarizer(Settings(words=40)))  # a random model's text is unusable
    summarizer.summarize(SAMPLE.read_text()[:2500], name="doc")
    sentence = " Concentrate on what it says about: risks and costs."
    with_focus = [text for text in said if sentence in text]
    assert len(with_focus) >= 1 and all("Write the notes on this part" not in text for text in with_focus)
    if strategy == MAP_REDUCE and chunk_tokens == 256:  # several chunks: the reduce prompt, before the notes
        assert all(text.index(sentence) < text.index("Notes:\n") for text in with_focus)
        assert REDUCE_PROMPT.split("{words}")[0] in with_focus[0]
    if strategy == MAP_REDUCE and chunk_tokens == 1536:  # one chunk: before the document
        assert all(text.index(sentence) < text.index("Document:\n") for text in with_focus)
