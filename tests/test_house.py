"""The plan of the house (docs/design.md, "The plan of the house"), held against the code: the
app's top level stays small, the engine keeps its folders by concern, and no comment or docstring
carries a measured time or rate (those live in docs/performance.md and docs/kernel-policy.md)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "summarize"
MOST_TOP_LEVEL_MODULES = 8  # cli, api, errors and the leaves every room uses; the rest lives in folders
ENGINE_FOLDERS = {"models", "weights", "tokenizers", "generation", "ops"}

# a figure with a unit of time or rate: "15 s", "80 ms", "23 GB/s", "9 tok/s", "1.3× a step", "~10% of a decode"
MEASURED = re.compile(
    r"\d(?:[\d.,]*\d)?\s?(?:ms|µs|us|ns|GB/s|MB/s|tok/s|tokens/s)\b"
    r"|\d(?:[\d.,]*\d)?\s?s\b(?! ?[(\[])"
    r"|\d(?:\.\d+)?\s?[×x]\s(?:a|the|faster|slower)\b"
    r"|\d+\s?% of (?:a|the) (?:decode|step|prefill)\b"
)


def comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and every string that stands alone as a statement (docstrings)."""
    found = []
    previous = tokenize.NEWLINE
    for token in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline):
        if token.type == tokenize.COMMENT:
            found.append((token.start[0], token.string))
        elif token.type == tokenize.STRING and previous in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.NL):
            found.append((token.start[0], token.string))
        if token.type not in (tokenize.COMMENT, tokenize.NL):
            previous = token.type
    return found


def test_the_app_keeps_few_modules_at_its_top_level():
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= MOST_TOP_LEVEL_MODULES, top


def test_the_engine_is_in_folders_by_concern():
    folders = {path.name for path in (PACKAGE / "engine").iterdir() if (path / "__init__.py").is_file()}
    assert folders == ENGINE_FOLDERS


def test_the_measured_time_pattern_finds_what_it_is_for():
    for text in ("took 15 s to open", "# 80 ms a step", "23 GB/s", "9.5 tok/s", "1.3× a step", "~10% of a decode step"):
        assert MEASURED.search(text), text
    for text in ("at most 256M", "64 rows", "the 0.8B shape", "int4 (a scale per 64 inputs)", "a 2-core machine"):
        assert not MEASURED.search(text), text


def test_no_comment_or_docstring_carries_a_measured_time_or_rate():
    offending = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {text.strip()[:100]}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, text in comments_and_docstrings(path)
        if MEASURED.search(text)
    ]
    assert not offending, "\n".join(offending)
