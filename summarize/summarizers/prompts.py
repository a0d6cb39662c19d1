"""What the model is asked (the instructions of map-reduce and stream) and how its answer is
cleaned into the summary: plain prose, or the points of a list (--format).
"""

from __future__ import annotations

import re
import unicodedata

from summarize.errors import SummarizeError
from summarize.inputs.words import split_sentences, trim_to_words
from summarize.settings import BULLETS, MARKDOWN, PROSE
from summarize.summarizers.layout import lay_out

MAP_INSTRUCTION = (
    "You are reading one part of a longer document. Write notes on this part: its main points, "
    "key facts, names and numbers, in at most {words} words of plain sentences.\n\nPart of the document:\n"
)
MAP_QUESTION = "\n\nWrite the notes on this part now."
# {focus}, {form} and {language}: what the final prompts say of --focus, --format and --language
SINGLE_INSTRUCTION = (
    "Summarize the following document in about {words} words.{focus} {form}{language}\n\nDocument:\n"
)
REDUCE_PROMPT = (
    "Below are notes on consecutive parts of one document. Using them, write a summary of the whole "
    "document in about {words} words.{focus} {form}{language}\n\nNotes:\n{notes}"
)
STREAM_INSTRUCTION = "Read the following document carefully; you will summarize it afterwards.\n\nDocument:\n"
STREAM_QUESTION = "\n\nSummarize the document above in about {words} words.{focus} {form}{language}"
# --focus and --language: said in the instruction, before the document or notes (or, in stream, in
# the question after it), so that nothing in the document can stand in for them
FOCUS_SENTENCE = " Concentrate on what it says about: {focus}."
FORM_SENTENCES = {
    PROSE: "Write plain prose paragraphs, no headings and no lists.",
    BULLETS: 'Write a list of points, one per line, each line starting with "- "; no heading.',
    MARKDOWN: 'Write Markdown: a short heading, then a list of points, one per line, each starting with "- ".',
}
LANGUAGE_SENTENCE = " Write the summary in {language}, whatever the language of the document."
MAX_LANGUAGE_CHARS = 40  # "Portuguese (Brazil)", "Simplified Chinese", "pt-BR": a name, not a sentence
MIN_LANGUAGE_LETTERS = 2  # "en", "中文"
# Letters, joined by spaces, hyphens, apostrophes or parentheses: no digits, no punctuation that
# could end the instruction's sentence and start another.
_LANGUAGE = re.compile(r"\(?[^\W\d_]+(?:[ '’-]+\(?[^\W\d_]+\)?|\))*")


def focus_sentence(focus: str | None) -> str:
    """The instruction's sentence for `--focus` (one line), or nothing without one."""
    focus = " ".join((focus or "").split())
    return FOCUS_SENTENCE.format(focus=focus) if focus else ""


def language_sentence(language: str | None) -> str:
    """The instruction's sentence for `--language` (nothing without one); SummarizeError for a
    value that names no language: empty, too long, or with digits or sentence punctuation."""
    if language is None:
        return ""
    name = unicodedata.normalize("NFC", " ".join(language.split()))
    if not name:
        raise SummarizeError("--language: empty; name a language, e.g. French")
    letters = sum(char.isalpha() for char in name)
    if letters < MIN_LANGUAGE_LETTERS or len(name) > MAX_LANGUAGE_CHARS or not _LANGUAGE.fullmatch(name):
        raise SummarizeError(f"--language: {name[:MAX_LANGUAGE_CHARS]!r} is not the name of a language "
                             f"(letters, spaces and hyphens, at most {MAX_LANGUAGE_CHARS} characters; e.g. French)")
    return LANGUAGE_SENTENCE.format(language=name)

THINK_BLOCK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
MARKUP = re.compile(r"<\|[^|>]*\|>|</?think>")
LIST_OR_HEADING = re.compile(r"^\s*(?:#+\s*|[-*•]\s+|\d+[.)]\s+)", re.MULTILINE)
EMPHASIS = re.compile(r"\*\*|__")
BLANKS = re.compile(r"[ \t]+")


HEADING_LINE = re.compile(r"^\s*#+\s*(.*)$", re.MULTILINE)


def clean_output(text: str) -> str:
    """Strip thinking blocks, chat markup, headings and list marks; keep the prose."""
    text = THINK_BLOCK.sub("", text)
    text = MARKUP.sub("", text)
    text = LIST_OR_HEADING.sub("", text)
    text = EMPHASIS.sub("", text)
    return BLANKS.sub(" ", text).strip()


def summary_from_answer(answer: str, form: str, words: int) -> str:
    """The model's answer as a summary of at most `words` words in `form`: prose cut to the longest
    run of whole sentences that fits; a list of points, one sentence each (the model's lines cut
    into their sentences, whether or not it made a list), the last dropped until it fits, under
    the model's first heading in Markdown."""
    if form == PROSE:
        return trim_to_words(clean_output(answer), words)
    answer = MARKUP.sub("", THINK_BLOCK.sub("", answer))
    headings = HEADING_LINE.findall(answer)
    heading = clean_output(headings[0]) if headings and form == MARKDOWN else ""
    body = clean_output(HEADING_LINE.sub("", answer))
    points = [sentence for line in body.split("\n") for sentence in split_sentences(line)]
    return lay_out(points, form, words, heading=heading)
