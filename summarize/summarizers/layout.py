"""How a summary's points are laid out (--format): one point per line behind "- " (bullets), or
under a short heading (markdown). Prose is each summarizer's own: the model's paragraphs, the
extractive summary's sentences joined.
"""

from __future__ import annotations

from summarize.inputs.words import count_words
from summarize.settings import MARKDOWN

BULLET = "- "
HEADING = "## "
HEADING_MAX_WORDS = 12  # a longer "heading" is a sentence: left out


def lay_out(points: list[str], form: str, words: int | None, *, heading: str = "") -> str:
    """The points one per line behind BULLET, under `heading` in Markdown, with at most `words`
    words (None: all of them), the marks counted as `wc -w` counts them: the last points are
    dropped until it fits (the heading before the first point)."""
    heading = " ".join(heading.split()) if form == MARKDOWN and count_words(heading) <= HEADING_MAX_WORDS else ""
    points = [" ".join(point.split()) for point in points if point.strip()]
    while words is not None and count_words(_render(points, heading)) > words:
        if len(points) > 1:
            points.pop()
        elif heading:
            heading = ""
        else:
            return ""
    return _render(points, heading)


def _render(points: list[str], heading: str) -> str:
    listed = "\n".join(BULLET + point for point in points)
    return f"{HEADING}{heading}\n\n{listed}" if heading and points else listed

