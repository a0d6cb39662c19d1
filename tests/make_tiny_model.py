"""Write a tiny random-weight Qwen3.5 checkpoint, laid out like the released ones and with the
tests' Qwen3.5 tokenizer, into FOLDER: `python tests/make_tiny_model.py FOLDER`. Needs the test
extra; .ci/run uses it to run the CLI from a plain install, which has no such extra.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tiny_models import tiny_released_layout


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/make_tiny_model.py FOLDER")
    folder = Path(sys.argv[1])
    folder.mkdir(parents=True, exist_ok=True)
    tiny_released_layout(folder)
    print(f"make_tiny_model: wrote a tiny Qwen3.5 model to {folder}")


if __name__ == "__main__":
    main()
