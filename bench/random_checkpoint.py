"""Write a random-weight checkpoint of a real Qwen3.5 shape (from ../shared/reference/qwen3.5).

    python bench/random_checkpoint.py 0.8B /tmp/qwen3.5-0.8B-random [--dtype bfloat16]

transformers builds and saves it, so the files are laid out exactly as the hub's. Weight values
do not change speed or memory. The real tokenizer is copied beside it.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "qwen3.5"
TOKENIZER = REFERENCE / "tokenizer.json"


def text_config(name: str) -> dict:
    config = json.loads((REFERENCE / f"Qwen3.5-{name}.config.json").read_text())
    text = dict(config.get("text_config", config))
    text["tie_word_embeddings"] = config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    return text


def build(name: str, folder: Path, dtype: torch.dtype) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    text = text_config(name)
    config = AutoConfig.for_model(text.pop("model_type"), **text)
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("A_log"):
                p.uniform_(-1.0, 1.5)
            elif "norm" in pname or pname.endswith("dt_bias"):
                p.normal_(0.0, 0.1)
            else:
                p.normal_(0.0, 0.02)
    model.save_pretrained(folder)
    shutil.copy(TOKENIZER, folder / "tokenizer.json")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [248046, 248044]}))
    return folder


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("shape", choices=["0.8B", "2B", "9B", "35B-A3B"])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    print(build(args.shape, args.folder, getattr(torch, args.dtype)))
