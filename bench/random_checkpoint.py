"""Write a random-weight checkpoint of a real Qwen3.5 shape (from ../shared/reference/qwen3.5).

    python bench/random_checkpoint.py 0.8B /tmp/qwen3.5-0.8B-random [--dtype bfloat16] [--layers N]

transformers builds and saves it, so the files are laid out exactly as the hub's. Weight values
do not change speed or memory. The real tokenizer is copied beside it. `--layers N` keeps the
first N layers (their types as in the full model): the MoE shape's 40 layers (70 GB in bf16) do
not fit a small machine, its first 4 (two thirds of them experts) do.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "qwen3.5"
TOKENIZER = REFERENCE / "tokenizer.json"


def text_config(name: str, layers: int | None = None) -> dict:
    config = json.loads((REFERENCE / f"Qwen3.5-{name}.config.json").read_text())
    text = dict(config.get("text_config", config))
    text["tie_word_embeddings"] = config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    if layers is not None:
        text["num_hidden_layers"], text["layer_types"] = layers, text["layer_types"][:layers]
    return text


def build(name: str, folder: Path, dtype: torch.dtype, layers: int | None = None) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    text = text_config(name, layers)
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
    parser.add_argument("--layers", type=int, help="keep only the first N layers")
    args = parser.parse_args()
    print(build(args.shape, args.folder, getattr(torch, args.dtype), args.layers))
