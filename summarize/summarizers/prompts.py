"""What the model is asked (the instructions of map-reduce and stream) and how its answer is
cleaned into plain prose.
"""

from __future__ import annotations

import re

MAP_INSTRUCTION = (
    "You are reading one part of a longer document. Write notes on this part: its main points, "
    "key facts, names and numbers, in at most {words} words of plain sentences.\n\nPart of the document:\n"
)
MAP_QUESTION = "\n\nWrite the notes on this part now."
SINGLE_INSTRUCTION = (
    "Summarize the following document in about {words} words.{focus} Write plain prose paragraphs, "
    "no headings and no lists.\n\nDocument:\n"
)
REDUCE_PROMPT = (
    "Below are notes on consecutive parts of one document. Using them, write a summary of the whole "
    "document in about {words} words.{focus} Write plain prose paragraphs, no headings and no lists.\n\n"
    "Notes:\n{notes}"
)
STREAM_INSTRUCTION = "Read the following document carefully; you will summarize it afterwards.\n\nDocument:\n"
STREAM_QUESTION = (
    "\n\nSummarize the document above in about {words} words.{focus} Write plain prose paragraphs, "
    "no headings and no lists."
)
# --focus: said in the instruction, before the document or notes (or, in stream, in the question
# after it), so that nothing in the document can stand in for it
FOCUS_SENTENCE = " Concentrate on what it says about: {focus}."


def focus_sentence(focus: str | None) -> str:
    """The instruction's sentence for `--focus` (one line), or nothing without one."""
    focus = " ".join((focus or "").split())
    return FOCUS_SENTENCE.format(focus=focus) if focus else ""

THINK_BLOCK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
MARKUP = re.compile(r"<\|[^|>]*\|>|</?think>")
LIST_OR_HEADING = re.compile(r"^\s*(?:#+\s*|[-*•]\s+|\d+[.)]\s+)", re.MULTILINE)
EMPHASIS = re.compile(r"\*\*|__")
BLANKS = re.compile(r"[ \t]+")


def clean_output(text: str) -> str:
    """Strip thinking blocks, chat markup, headings and list marks; keep the prose."""
    text = THINK_BLOCK.sub("", text)
    text = MARKUP.sub("", text)
    text = LIST_OR_HEADING.sub("", text)
    text = EMPHASIS.sub("", text)
    return BLANKS.sub(" ", text).strip()
