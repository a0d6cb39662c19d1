"""Write a random-weight checkpoint of a real Qwen3.5 shape, or of Mobius's RWKV-6 shape.

    python bench/random_checkpoint.py 0.8B /tmp/qwen3.5-0.8B-random [--dtype bfloat16] [--layers N]
    python bench/random_checkpoint.py mobius /tmp/mobius-1-layer --layers 1

A Qwen3.5 shape's config and tokenizer come from `--reference DIR` (a folder of the released
files: config.json and tokenizer.json; or Qwen3.5-<shape>.config.json beside tokenizer.json, as in
../shared/reference/qwen3.5), else from ../shared/reference/qwen3.5 beside this repository, else
from the hub (Qwen/Qwen3.5-<shape>: two small files, kept in the hub's cache).

transformers builds and saves the Qwen3.5 shapes, so the files are laid out exactly as the hub's;
the multi-token-prediction head (mtp.*) is written beside them, and the real tokenizer. Mobius (RWKV-6, 12B: hidden 5120, 80 heads of 64, FFN
17920, LoRA ranks 32 and 64, vocabulary 65536, 32 layers) is written here in the Hugging Face
`rwkv6` layout, one safetensors file per layer, so that memory holds one layer at a time; its
tokenizer ships with summarize. Weight values do not change speed or memory. `--layers N` keeps
the first N layers (their types as in the full model): the MoE shape's 40 layers (70 GB in bf16)
do not fit a small machine, its first 4 (two thirds of them experts) do; Mobius is 24 GB in bf16,
its first layer and the embedding and head 2 GB.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

SHARED_REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "qwen3.5"
# Mobius-RWKV-r6-12B, from its config and tensor shapes
MOBIUS = dict(vocab=65536, hidden=5120, layers=32, head_size=64, ffn=17920, mix_rank=32, decay_rank=64)


class ReferenceMissing(Exception):
    """The released config or tokenizer of a shape cannot be had: the message says what to pass."""


def released_files(name: str, reference: Path | None = None) -> tuple[Path, Path]:
    """(config, tokenizer.json) of the Qwen3.5 shape `name`: from `reference`, else
    ../shared/reference/qwen3.5, else the hub."""
    folder = reference or SHARED_REFERENCE
    config = next((p for p in (folder / f"Qwen3.5-{name}.config.json", folder / "config.json") if p.is_file()), None)
    if config and (folder / "tokenizer.json").is_file():
        return config, folder / "tokenizer.json"
    if reference:
        raise ReferenceMissing(f"{folder} holds no Qwen3.5-{name}.config.json or config.json, and tokenizer.json")
    return _from_hub(f"Qwen/Qwen3.5-{name}")


def _from_hub(repo: str) -> tuple[Path, Path]:
    from huggingface_hub import hf_hub_download

    try:
        return tuple(Path(hf_hub_download(repo, file)) for file in ("config.json", "tokenizer.json"))
    except Exception as exc:  # offline, HF_HUB_OFFLINE without a cached copy, no such repository
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ReferenceMissing(
            f"cannot fetch {repo}'s config.json and tokenizer.json from the hub ({reason}); pass --reference DIR, "
            f"a folder with them (or ../shared/reference/qwen3.5 beside this repository)") from exc


def text_config(config_file: Path, layers: int | None = None) -> dict:
    config = json.loads(config_file.read_text())
    text = dict(config.get("text_config", config))
    text["tie_word_embeddings"] = config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    if layers is not None:
        text["num_hidden_layers"], text["layer_types"] = layers, text["layer_types"][:layers]
    return text


def build(name: str, folder: Path, dtype: torch.dtype, layers: int | None = None, reference: Path | None = None) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    config_file, tokenizer = released_files(name, reference)
    text = text_config(config_file, layers)
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
    del model
    if text.get("mtp_num_hidden_layers"):
        save_mtp_head(folder, dtype)
    shutil.copy(tokenizer, folder / "tokenizer.json")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [248046, 248044]}))
    return folder


def save_mtp_head(folder: Path, dtype: torch.dtype) -> None:
    """The multi-token-prediction head the released files carry (mtp.*, which transformers does
    not build), random, in its own file."""
    from safetensors.torch import save_file

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from summarize.engine.models.qwen3_5 import Qwen35Config, mtp_shapes

    cfg = Qwen35Config.from_dict(json.loads((folder / "config.json").read_text()))
    gen = torch.Generator().manual_seed(1)
    tensors = {name: (torch.randn(shape, generator=gen) * (0.1 if "norm" in name else 0.02)).to(dtype)
               for name, shape in mtp_shapes(cfg).items()}
    save_file(tensors, str(folder / "model-mtp.safetensors"))


def build_rwkv6(folder: Path, dtype: torch.dtype, layers: int | None = None, shape: dict = MOBIUS) -> Path:
    """An RWKV-6 of `shape` in the Hugging Face `rwkv6` layout (config.json, one safetensors file
    per layer), with decays as trained models have them: per token from 0.998 down to exp(-12)."""
    from safetensors.torch import save_file

    V, C, N, FF = shape["vocab"], shape["hidden"], shape["head_size"], shape["ffn"]
    D, DW, layers = shape["mix_rank"], shape["decay_rank"], layers or shape["layers"]
    gen = torch.Generator().manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)

    def normal(*size, std=0.02):
        return (torch.randn(*size, generator=gen) * std).to(dtype)

    def uniform(*size, low=0.0, high=1.0):
        return (low + (high - low) * torch.rand(*size, generator=gen)).to(dtype)

    top = {"rwkv.embeddings.weight": normal(V, C, std=1.0), "head.weight": normal(V, C, std=C**-0.5),
           "rwkv.ln_out.weight": uniform(C, low=0.9, high=1.1), "rwkv.ln_out.bias": normal(C)}
    save_file(top, str(folder / "model-embedding-head.safetensors"))
    del top
    for i in range(layers):
        b, a, f = f"rwkv.blocks.{i}.", f"rwkv.blocks.{i}.attention.", f"rwkv.blocks.{i}.feed_forward."
        z = {b + f"{norm}.{part}": uniform(C, low=0.9, high=1.1) if part == "weight" else normal(C)
             for norm in (["pre_ln", "ln1", "ln2"] if i == 0 else ["ln1", "ln2"]) for part in ("weight", "bias")}
        z |= {a + f"time_maa_{name}": uniform(1, 1, C) for name in "xwkvrg"}
        z |= {a + "time_maa_w1": normal(C, 5 * D), a + "time_maa_w2": normal(5, D, C),
              a + "time_decay": uniform(1, 1, C, low=-6.0, high=2.5), a + "time_decay_w1": normal(C, DW),
              a + "time_decay_w2": normal(DW, C), a + "time_faaaa": normal(C // N, N, std=0.3),
              a + "ln_x.weight": uniform(C, low=0.9, high=1.1), a + "ln_x.bias": normal(C)}
        z |= {a + f"{name}.weight": normal(C, C, std=C**-0.5) for name in ("receptance", "key", "value", "gate", "output")}
        z |= {f + "time_maa_k": uniform(1, 1, C), f + "time_maa_r": uniform(1, 1, C),
              f + "key.weight": normal(FF, C, std=C**-0.5), f + "receptance.weight": normal(C, C, std=C**-0.5),
              f + "value.weight": normal(C, FF, std=FF**-0.5)}
        save_file(z, str(folder / f"model-layer-{i:02d}.safetensors"))
    config = {"model_type": "rwkv6", "architectures": ["Rwkv6ForCausalLM"], "vocab_size": V, "hidden_size": C,
              "attention_hidden_size": C, "head_size": N, "head_size_divisor": 8, "intermediate_size": FF,
              "num_hidden_layers": layers, "layer_norm_epsilon": 1e-5, "rescale_every": 6, "tie_word_embeddings": False}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("shape", choices=["0.8B", "2B", "9B", "35B-A3B", "mobius"])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--layers", type=int, help="keep only the first N layers")
    parser.add_argument("--reference", type=Path, help="a folder with the shape's released config.json and "
                        "tokenizer.json (default: ../shared/reference/qwen3.5, else the hub)")
    args = parser.parse_args()
    if args.shape == "mobius":
        print(build_rwkv6(args.folder, getattr(torch, args.dtype), args.layers))
    else:
        try:
            print(build(args.shape, args.folder, getattr(torch, args.dtype), args.layers, args.reference))
        except ReferenceMissing as exc:
            sys.exit(f"random_checkpoint.py: {exc}")
