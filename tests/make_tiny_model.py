"""Write a tiny random-weight checkpoint in a safetensors folder, with its tokenizer, into FOLDER:
`python tests/make_tiny_model.py FOLDER`. Qwen3.5 laid out like the released checkpoints when the
real Qwen3.5 tokenizer is at hand (../shared/reference), else RWKV-7 in the Hugging Face layout
(its tokenizer ships with summarize). Needs the test extra; .ci/run uses it to run the CLI from a
plain install, which has no such extra.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tiny_models import REAL_TOKENIZER, RWKV_TINY, blinkdl_checkpoint, hf_layout, tiny_released_layout


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/make_tiny_model.py FOLDER")
    folder = Path(sys.argv[1])
    if REAL_TOKENIZER.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        tiny_released_layout(folder)
        kind = "Qwen3.5"
    else:  # the World vocabulary, so that the real tokenizer's ids fit
        with tempfile.TemporaryDirectory() as scratch:
            pth = blinkdl_checkpoint(Path(scratch) / "tiny.pth", **(RWKV_TINY | dict(vocab=65536, layers=2)))
            hf_layout(pth, folder)
        kind = "RWKV-7"
    print(f"make_tiny_model: wrote a tiny {kind} model to {folder}")


if __name__ == "__main__":
    main()
