"""Qwen3.5 from a GGUF file (architectures `qwen35`, `qwen35moe`): the config from the metadata and
the tensors under the names `qwen3_5.build` reads, with llama.cpp's conversion undone.

What llama.cpp's converter (`conversion/qwen.py`: `Qwen3NextModel.modify_tensors` and
`_LinearAttentionVReorderBase.modify_tensors`) does to the Hugging Face tensors, undone here:
- every `*norm.weight` except the gated norm `linear_attn.norm` (GGUF `ssm_norm`) is stored as
  1 + w: llama.cpp's RMSNorm is not zero-centred. `build` adds the 1 itself, so 1 is taken off;
- `A_log` is stored as `ssm_a` = −exp(A_log);
- the conv1d weight [C, 1, K] is squeezed to [C, K];
- when there are more value heads than key heads, the value heads are reordered from grouped by
  key head ([nk, r, d]) to tiled ([r, nk, d]): the V rows of `attn_qkv`, the rows of `attn_gate`,
  `ssm_beta`, `ssm_alpha`, `ssm_a` and `ssm_dt`, the V channels of `ssm_conv1d` and the columns
  of `ssm_out`. `ssm_norm` (one weight shared by every head) is untouched;
- `attn_q` keeps the per-head [query | gate] interleave of `q_proj`; the experts are stacked
  per layer (`ffn_{gate,up,down}_exps`, or `ffn_gate_up_exps` with gate rows first);
- the MTP head becomes layers `blk.{n_layer + i}` (`nextn_predict_layers` of them): never read.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from summarize.engine.weights.gguf_checkpoint import GGUFCheckpoint, Source, take_columns, take_rows
from summarize.engine.weights.gguf_file import GGUFFile
from summarize.errors import SummarizeError

ARCHS = ("qwen35", "qwen35moe")
DEFAULT_FULL_ATTENTION_INTERVAL = 4


def read_gguf(file: GGUFFile, dtype: torch.dtype) -> tuple[dict, GGUFCheckpoint]:
    """The config.json-like settings of the file's model and its tensors under Hugging Face names."""
    config = _config(file)
    table = _table(file, config)
    known = {tensor for source in table.values() for tensor in source.tensors}
    missing = [tensor for tensor in known if tensor not in file.tensors]
    if missing:
        raise SummarizeError(f"{file.path}: no tensor {min(missing, key=_file_order)}")
    layers = config["num_hidden_layers"]
    unknown = sorted(name for name in file.tensors if name not in known and not _is_mtp(name, layers))
    if unknown:
        raise SummarizeError(f"{file.path}: tensors Qwen3.5 does not have: {', '.join(unknown[:5])}")
    return config, GGUFCheckpoint(file, table, dtype)


def _file_order(name: str) -> tuple[int, str]:
    """Sorts layer by layer (blk.2 before blk.10), so that a message names the earliest missing tensor."""
    parts = name.split(".")
    return (int(parts[1]), name) if parts[0] == "blk" and parts[1].isdigit() else (-1, name)


def _is_mtp(name: str, layers: int) -> bool:
    parts = name.split(".")
    return parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) >= layers


def _config(file: GGUFFile) -> dict:
    arch = file.architecture
    key = f"{arch}."

    def size(name: str, default=...) -> int:
        value = file.get(key + name, int, default)
        if value is not default and value < 1:
            raise SummarizeError(f"{file.path}: metadata {key}{name} must be at least 1, not {value}")
        return value

    blocks = size("block_count")
    layers = blocks - file.get(key + "nextn_predict_layers", int, 0)
    recurrent = file.get(key + "attention.recurrent_layers", list, None)
    if recurrent is not None:
        if len(recurrent) < layers:
            raise SummarizeError(f"{file.path}: {key}attention.recurrent_layers names {len(recurrent)} layers, not {layers}")
        layer_types = ["linear_attention" if r else "full_attention" for r in recurrent[:layers]]
    else:
        interval = size("full_attention_interval", DEFAULT_FULL_ATTENTION_INTERVAL)
        layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    head_dim = size("attention.key_length")
    v_heads, k_heads = size("ssm.time_step_rank"), size("ssm.group_count")
    inner = size("ssm.inner_size")
    if inner % v_heads or v_heads % k_heads:
        raise SummarizeError(f"{file.path}: {v_heads} value heads do not split {inner} channels or share {k_heads} key heads")
    embedding = file.tensors.get("token_embd.weight")
    if embedding is None:
        raise SummarizeError(f"{file.path}: no tensor token_embd.weight")
    config = {
        "model_type": "qwen3_5_moe_text" if arch == "qwen35moe" else "qwen3_5_text",
        "vocab_size": embedding.shape[0],
        "hidden_size": size("embedding_length"),
        "num_hidden_layers": layers,
        "layer_types": layer_types,
        "rms_norm_eps": file.get(key + "attention.layer_norm_rms_epsilon", float),
        "tie_word_embeddings": "output.weight" not in file.tensors,
        "num_attention_heads": size("attention.head_count"),
        "num_key_value_heads": size("attention.head_count_kv"),
        "head_dim": head_dim,
        "rope_parameters": {
            "rope_theta": file.get(key + "rope.freq_base", float),
            "partial_rotary_factor": size("rope.dimension_count") / head_dim,
        },
        "linear_num_key_heads": k_heads,
        "linear_num_value_heads": v_heads,
        "linear_key_head_dim": size("ssm.state_size"),
        "linear_value_head_dim": inner // v_heads,
        "linear_conv_kernel_dim": size("ssm.conv_kernel"),
    }
    if arch == "qwen35moe":
        config |= {
            "num_experts": size("expert_count"),
            "num_experts_per_tok": size("expert_used_count"),
            "moe_intermediate_size": size("expert_feed_forward_length"),
            "shared_expert_intermediate_size": size("expert_shared_feed_forward_length"),
        }
    else:
        config["intermediate_size"] = size("feed_forward_length")
    return config


def _table(file: GGUFFile, config: dict) -> dict[str, Source]:
    """Every tensor `qwen3_5.build` reads, by its Hugging Face name (relative to the text model)."""
    H, V = config["hidden_size"], config["vocab_size"]
    nk, nv = config["linear_num_key_heads"], config["linear_num_value_heads"]
    dk, dv = config["linear_key_head_dim"], config["linear_value_head_dim"]
    key_dim, value_dim = nk * dk, nv * dv
    conv_dim, kernel = 2 * key_dim + value_dim, config["linear_conv_kernel_dim"]
    # file position of each Hugging Face value row; None when every key head has one value head
    # (then the converter reorders nothing)
    reordered = nv != nk
    v_rows = _grouped_order(nk, nv // nk, dv) if reordered else None
    v_heads = _grouped_order(nk, nv // nk, 1) if reordered else None
    qkv_rows = torch.cat([torch.arange(2 * key_dim), 2 * key_dim + v_rows]) if reordered else None

    def projection(tensor: str, shape: tuple[int, int], rows: Tensor | None = None, columns: Tensor | None = None) -> Source:
        def make(parts):
            weight = parts[0] if rows is None else take_rows(parts[0], rows)
            return weight if columns is None else take_columns(weight, columns)

        return Source((tensor,), (shape,), shape, make, form=file.form_of([tensor], columns=columns))

    def norm(tensor: str, size: int) -> Source:  # stored as 1 + w
        return Source((tensor,), ((size,),), (size,), lambda parts: parts[0] - 1.0, fp32=True)

    def vector(tensor: str, shape: tuple[int, ...], make=lambda parts: parts[0]) -> Source:
        return Source((tensor,), (shape,), shape, make, fp32=True)

    table = {"embed_tokens.weight": projection("token_embd.weight", (V, H)), "norm.weight": norm("output_norm.weight", H)}
    if not config["tie_word_embeddings"]:
        table["lm_head.weight"] = projection("output.weight", (V, H))
    for i, kind in enumerate(config["layer_types"]):
        b, p = f"blk.{i}.", f"layers.{i}."
        table[p + "input_layernorm.weight"] = norm(b + "attn_norm.weight", H)
        table[p + "post_attention_layernorm.weight"] = norm(b + "post_attention_norm.weight", H)
        if kind == "linear_attention":
            a = p + "linear_attn."
            table |= {
                a + "in_proj_qkv.weight": projection(b + "attn_qkv.weight", (conv_dim, H), rows=qkv_rows),
                a + "in_proj_z.weight": projection(b + "attn_gate.weight", (value_dim, H), rows=v_rows),
                a + "in_proj_b.weight": projection(b + "ssm_beta.weight", (nv, H), rows=v_heads),
                a + "in_proj_a.weight": projection(b + "ssm_alpha.weight", (nv, H), rows=v_heads),
                a + "out_proj.weight": projection(b + "ssm_out.weight", (H, value_dim), columns=v_rows),
                a + "conv1d.weight": Source((b + "ssm_conv1d.weight",), ((conv_dim, kernel),), (conv_dim, 1, kernel),
                                            lambda parts: _reordered(parts[0], qkv_rows)[:, None, :]),
                a + "dt_bias": vector(b + "ssm_dt.bias", (nv,), lambda parts: _reordered(parts[0], v_heads)),
                a + "A_log": vector(b + "ssm_a", (nv,), lambda parts: (-_reordered(parts[0], v_heads)).log()),
                a + "norm.weight": vector(b + "ssm_norm.weight", (dv,)),
            }
        else:
            a, nq, nkv, d = p + "self_attn.", config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
            table |= {
                a + "q_proj.weight": projection(b + "attn_q.weight", (2 * nq * d, H)),
                a + "k_proj.weight": projection(b + "attn_k.weight", (nkv * d, H)),
                a + "v_proj.weight": projection(b + "attn_v.weight", (nkv * d, H)),
                a + "o_proj.weight": projection(b + "attn_output.weight", (H, nq * d)),
                a + "q_norm.weight": norm(b + "attn_q_norm.weight", d),
                a + "k_norm.weight": norm(b + "attn_k_norm.weight", d),
            }
        table |= _mlp(file, config, b, p + "mlp.", projection)
    return _one_form_together(file, table, config)


# Projections `qwen3_5` stacks into one matrix (GatedDeltaNet, GatedAttention, MLP): one form for all
# where their own forms agree (`_one_form_together`)
FUSED = (("linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight"),
         ("linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight"),
         ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
         ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
         ("mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight"))


def _one_form_together(file: GGUFFile, table: dict[str, Source], config: dict) -> dict[str, Source]:
    """Projections stacked into one matrix share one form where their own forms agree
    (`GGUFFile.form_of` of the stack: int4 if the stack fits the int4 kernel, int8 groups, or all
    read into the dtype). Where they differ (a Q6_K part beside Q4_K ones, as llama.cpp's Q4_K_M
    mixes them), each part keeps its own and the model stacks their outputs instead
    (`Projection.concat`)."""
    for i in range(config["num_hidden_layers"]):
        for group in FUSED:
            names = [f"layers.{i}.{name}" for name in group]
            if not all(name in table for name in names):
                continue
            if len({table[name].form.name for name in names}) > 1:
                continue
            form = file.form_of([table[name].tensors[0] for name in names])
            for name in names:
                table[name] = dataclasses.replace(table[name], form=form)
    return table


def _mlp(file: GGUFFile, config: dict, b: str, m: str, projection) -> dict[str, Source]:
    H = config["hidden_size"]
    if not config.get("num_experts"):
        FF = config["intermediate_size"]
        return {m + "gate_proj.weight": projection(b + "ffn_gate.weight", (FF, H)),
                m + "up_proj.weight": projection(b + "ffn_up.weight", (FF, H)),
                m + "down_proj.weight": projection(b + "ffn_down.weight", (H, FF))}
    E, FF, S = config["num_experts"], config["moe_intermediate_size"], config["shared_expert_intermediate_size"]
    if b + "ffn_gate_up_exps.weight" in file.tensors:  # fused, gate rows first
        gate_up = Source((b + "ffn_gate_up_exps.weight",), ((E, 2 * FF, H),), (E, 2 * FF, H))
    else:
        gate_up = Source((b + "ffn_gate_exps.weight", b + "ffn_up_exps.weight"), ((E, FF, H), (E, FF, H)), (E, 2 * FF, H),
                         lambda parts: torch.cat(parts, dim=1))
    return {
        m + "gate.weight": Source((b + "ffn_gate_inp.weight",), ((E, H),), (E, H)),
        m + "experts.gate_up_proj": gate_up,
        m + "experts.down_proj": Source((b + "ffn_down_exps.weight",), ((E, H, FF),), (E, H, FF)),
        m + "shared_expert.gate_proj.weight": projection(b + "ffn_gate_shexp.weight", (S, H)),
        m + "shared_expert.up_proj.weight": projection(b + "ffn_up_shexp.weight", (S, H)),
        m + "shared_expert.down_proj.weight": projection(b + "ffn_down_shexp.weight", (H, S)),
        m + "shared_expert_gate.weight": Source((b + "ffn_gate_inp_shexp.weight",), ((1, H),), (1, H)),
    }


def _reordered(tensor: Tensor, rows: Tensor | None) -> Tensor:
    return tensor if rows is None else tensor[rows]


def _grouped_order(k_heads: int, per_key: int, width: int) -> Tensor:
    """For each row of the grouped layout ([k_heads, per_key, width], Hugging Face's), the row of
    the tiled layout ([per_key, k_heads, width], llama.cpp's) that holds it."""
    return torch.arange(per_key * k_heads * width).view(per_key, k_heads, width).transpose(0, 1).reshape(-1)
