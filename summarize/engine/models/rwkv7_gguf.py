"""RWKV-7 from a GGUF file (architecture `rwkv7`): its tensors under BlinkDL's names, which
`rwkv7.build` reads, with llama.cpp's conversion undone (`conversion/rwkv.py`, `Rwkv7Model`):
- the six token-shift mixes x_r, x_w, x_k, x_v, x_a, x_g are stacked in that order into
  `time_mix_lerp_fused` [6, 1, 1, C];
- the LoRA matrices are in Linear layout (w1 [rank, C], w2 [C, rank]): BlinkDL's transposed;
- `r_k` [H, N] is flattened; per-channel vectors are squeezed to [C];
- the decay bias w0 is stored raw (the decay is exp(−e^{−1/2}·sigmoid(w0 + ·)) either way);
- ln0 is `token_embd_norm`; layer 0's value-residual LoRA (v0, v1, v2) is a copy of its a0, a1,
  a2 that llama.cpp wants present, and is never read.
Sizes come from tensor shapes as for the other layouts; the LayerNorm eps from the metadata.
"""

from __future__ import annotations

import torch

from summarize.engine.weights.gguf_checkpoint import GGUFCheckpoint, Source
from summarize.engine.weights.gguf_file import GGUFFile
from summarize.errors import SummarizeError

ARCHS = ("rwkv7",)
MIXES = ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g")  # the rows of time_mix_lerp_fused
LAYER0_DUMMIES = ("blk.0.time_mix_v0.weight", "blk.0.time_mix_v1.weight", "blk.0.time_mix_v2.weight")


def read_gguf(file: GGUFFile, dtype: torch.dtype) -> tuple[dict, GGUFCheckpoint]:
    arch = file.architecture
    C, layers = file.get(f"{arch}.embedding_length", int), file.get(f"{arch}.block_count", int)
    N = file.get(f"{arch}.wkv.head_size", int)
    if N < 1 or C % N:
        raise SummarizeError(f"{file.path}: heads of {N} do not split {C} channels")
    config = {"model_type": "rwkv7", "norm_eps": file.get(f"{arch}.attention.layer_norm_epsilon", float)}
    table = _table(file, layers, C, N)
    known = {tensor for source in table.values() for tensor in source.tensors} | set(LAYER0_DUMMIES)
    unknown = sorted(set(file.tensors) - known)
    if unknown:  # a variant (DeepEmbed, ARWKV) this engine does not implement
        raise SummarizeError(f"{file.path}: tensors plain RWKV-7 does not have: {', '.join(unknown[:5])}")
    return config, GGUFCheckpoint(file, table, dtype)


def _table(file: GGUFFile, layers: int, C: int, N: int) -> dict[str, Source]:
    def stored(tensor: str) -> tuple[int, ...]:  # sizes not in the metadata (LoRA ranks, FFN width) come from the file
        info = file.tensors.get(tensor)
        if info is None:
            raise SummarizeError(f"{file.path}: no tensor {tensor}")
        return info.shape

    def same(tensor: str, *, fp32: bool = False) -> Source:
        shape = stored(tensor)
        return Source((tensor,), (shape,), shape, fp32=fp32)

    def transposed(tensor: str) -> Source:
        shape = stored(tensor)
        if len(shape) != 2:
            raise SummarizeError(f"{file.path}: tensor {tensor} has shape {shape}, not a matrix")
        return Source((tensor,), (shape,), shape[::-1], lambda parts: parts[0].t().contiguous())

    table = {
        "emb.weight": same("token_embd.weight"),
        "blocks.0.ln0.weight": same("token_embd_norm.weight", fp32=True),
        "blocks.0.ln0.bias": same("token_embd_norm.bias", fp32=True),
        "ln_out.weight": same("output_norm.weight", fp32=True),
        "ln_out.bias": same("output_norm.bias", fp32=True),
        "head.weight": same("output.weight"),
    }
    for i in range(layers):
        b, p, a, f = f"blk.{i}.", f"blocks.{i}.", f"blocks.{i}.att.", f"blocks.{i}.ffn."
        for norm, tensor in (("ln1", "attn_norm"), ("ln2", "attn_norm_2")):
            for part in ("weight", "bias"):
                table[f"{p}{norm}.{part}"] = same(f"{b}{tensor}.{part}", fp32=True)
        lerp = b + "time_mix_lerp_fused.weight"
        for row, mix in enumerate(MIXES):
            table[a + mix] = Source((lerp,), ((6, 1, 1, C),), (C,), lambda parts, row=row: parts[0][row].reshape(-1))
        residual = ("w", "a", "g") + (("v",) if i > 0 else ())
        for lora in residual:
            table[a + lora + "1"] = transposed(f"{b}time_mix_{lora}1.weight")
            table[a + lora + "2"] = transposed(f"{b}time_mix_{lora}2.weight")
            if lora != "g":
                table[a + lora + "0"] = same(f"{b}time_mix_{lora}0.weight", fp32=lora == "w")
        table |= {
            a + "k_k": same(b + "time_mix_k_k.weight"),
            a + "k_a": same(b + "time_mix_k_a.weight"),
            a + "r_k": Source((b + "time_mix_r_k.weight",), ((C,),), (C // N, N), lambda parts: parts[0].view(C // N, N), fp32=True),
            a + "ln_x.weight": same(b + "time_mix_ln.weight", fp32=True),
            a + "ln_x.bias": same(b + "time_mix_ln.bias", fp32=True),
            f + "x_k": same(b + "channel_mix_lerp_k.weight"),
            f + "key.weight": same(b + "channel_mix_key.weight"),
            f + "value.weight": same(b + "channel_mix_value.weight"),
        }
        for name in ("receptance", "key", "value", "output"):
            table[f"{a}{name}.weight"] = same(f"{b}time_mix_{name}.weight")
    return table
