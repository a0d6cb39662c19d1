"""Text handling on 500 pages and on pathological runs: seconds, at one size and at twice it.

    python bench/bench_text.py

The tests check the work these take in lines of Python run (tests/test_extractive.py,
tests/test_chunking.py) or characters sliced (tests/test_text.py); the regex engine's own work,
which Python cannot count, and the seconds themselves are here. A ratio near 2 is linear; the
quadratic forms these replaced took minutes at the first size.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from summarize.inputs.words import split_sentences
from summarize.summarizers.chunking import chunk_text
from summarize.summarizers.extractive_selection import extractive_summary

ROOT = Path(__file__).resolve().parents[1]
RUN = 100_000  # characters in a run of terminators


def cases() -> dict:
    """name -> call(scale): the texts the tests make, at `scale` times their size."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_chunking import days_of_prose
    from test_extractive import long_prose

    return {
        "extractive summary, 500 pages": lambda scale: extractive_summary(long_prose(repeats=800 * scale), 400),
        "chunking, 500 pages": lambda scale: chunk_text(days_of_prose(6000 * scale), chunk_size=1024, overlap=128),
        "a run of '!' with no space after": lambda scale: split_sentences("!" * RUN * scale + "x"),
        "a sentence of initials": lambda scale: split_sentences("J. Smith " * (RUN * scale // 9)),
        "a run of '?' before a sentence end": lambda scale: split_sentences("Wow!!! " + "?" * RUN * scale + "x. End."),
    }


def seconds(call, scale: int) -> float:
    started = time.perf_counter()
    call(scale)
    return time.perf_counter() - started


def main() -> None:
    extractive_summary("Warm up the imports once. " * 50, 20)
    print(f"{'case':<38} {'1x (s)':>8} {'2x (s)':>8} {'ratio':>6}")
    for name, call in cases().items():
        once, twice = seconds(call, 1), seconds(call, 2)
        print(f"{name:<38} {once:>8.2f} {twice:>8.2f} {twice / once:>6.1f}")


if __name__ == "__main__":
    main()
