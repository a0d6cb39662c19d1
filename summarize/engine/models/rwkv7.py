"""RWKV-7 ("Goose", x070): every layer is recurrent; nothing grows with the context.

Each layer is a time-mix (token shift, LoRA projections for the decay, the in-context learning
rate, the value residual and the output gate, then one call into the wkv7 op, a per-head group
norm and the bonus term) followed by a channel-mix (token shift, squared-ReLU MLP). The reference
is BlinkDL's `RWKV_x070` (the `rwkv` package); checkpoints come in BlinkDL's layout or the Hugging Face one.

Conventions fixed here, once, at load time (with those of every RWKV family, `rwkv_common`: BlinkDL's
names canonical, ln0 folded into the embedding, the state's layout):
- A Hugging Face checkpoint is read through a name table (`hf_name`); its LoRA matrices are stored
  transposed and are turned back.
- Layer 0 has no value residual: its v0/v1/v2, present in BlinkDL's files, are dropped unread.
- The decay bias w0 and all norm weights stay fp32; the wkv state is fp32 whatever the weight dtype.
- Sizes (heads, head size, LoRA ranks, FFN width, layers, vocabulary) come from tensor shapes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from summarize.engine.diagnostics import RecurrenceStats
from summarize.engine.models import rwkv7_gguf
from summarize.engine.models.family import Family
from summarize.engine.models.rwkv_common import (
    GROUP_NORM_EPS,
    LAYER_NORM_EPS,
    NamedTensors,
    RWKVModel,
    SizingShapes,
    Take,
    blinkdl_name,
    blinkdl_version,
    layer_norm,
    require_version,
    token_shift,
)
from summarize.engine.ops.linear import QUANTIZATIONS, Projection
from summarize.engine.ops.rwkv7_wkv import RWKV7_WKV
from summarize.engine.state import RecurrentLayerState, State
from summarize.engine.tokenizers.rwkv import G1_CHAT, load_rwkv_tokenizer
from summarize.errors import SummarizeError

MODEL_TYPES = ("rwkv7", "rwkv7_fla")  # config.json model_type of the Hugging Face layout
DECAY_SCALE = math.exp(-0.5)  # w = exp(-e^{-1/2} sigmoid(.)) lies in (0.545, 1)
MIX_NAMES = ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g")
# Tensors of BlinkDL's files that the model never uses (layer 0 has no value residual)
UNUSED = ("blocks.0.att.v0", "blocks.0.att.v1", "blocks.0.att.v2")


@dataclass(frozen=True)
class RWKV7Config:
    vocab_size: int
    hidden_size: int
    num_layers: int
    head_size: int
    decay_rank: int
    iclr_rank: int  # in-context learning rate ("a") LoRA
    value_rank: int  # value-residual LoRA (0 for a one-layer model)
    gate_rank: int
    ffn_size: int
    layer_norm_eps: float = LAYER_NORM_EPS
    group_norm_eps: float = GROUP_NORM_EPS

    @property
    def num_heads(self) -> int:
        return self.hidden_size // self.head_size

    @classmethod
    def from_shapes(cls, shape: Callable[[str], tuple[int, ...] | None], config: dict, where: str = "the checkpoint") -> RWKV7Config:
        """Read every size from tensor shapes (BlinkDL names); eps values from config.json if any.

        `where` (the checkpoint's folder or file) is named in the one-line SummarizeError that a
        missing or misshaped sizing tensor, or an ill-typed config.json setting, gives.
        """
        sizes = SizingShapes(shape, config, where, "x070")
        dims = sizes.dims
        vocab, hidden = dims("emb.weight", 2)
        layers = sizes.layers()
        heads, head_size = dims("blocks.0.att.r_k", 2)
        if heads * head_size != hidden:
            raise SummarizeError(f"{where}: blocks.0.att.r_k has {heads} heads of {head_size}; the embedding has {hidden} channels")
        eps = sizes.setting("norm_eps", LAYER_NORM_EPS)
        # BlinkDL fixes ln_x's eps; the Hugging Face layout's models use head_size x norm_eps (equal at 64)
        group_eps = head_size * eps if config.get("model_type") in MODEL_TYPES else GROUP_NORM_EPS
        v1 = shape("blocks.1.att.v1")
        return cls(
            vocab_size=vocab,
            hidden_size=hidden,
            num_layers=layers,
            head_size=head_size,
            decay_rank=dims("blocks.0.att.w1", 2)[1],
            iclr_rank=dims("blocks.0.att.a1", 2)[1],
            value_rank=dims("blocks.1.att.v1", 2)[1] if v1 is not None else 0,
            gate_rank=dims("blocks.0.att.g1", 2)[1],
            ffn_size=dims("blocks.0.ffn.key.weight", 2)[0],
            layer_norm_eps=eps,
            group_norm_eps=group_eps,
        )


# ---------------------------------------------------------------------------------------------
# The name table: every tensor read, with its shape (BlinkDL names; its [1, 1, C] vectors read as [C]).
# ---------------------------------------------------------------------------------------------


def checkpoint_shapes(cfg: RWKV7Config) -> dict[str, tuple[int, ...]]:
    V, C, H, N, FF = cfg.vocab_size, cfg.hidden_size, cfg.num_heads, cfg.head_size, cfg.ffn_size
    shapes: dict[str, tuple[int, ...]] = {
        "emb.weight": (V, C),
        "blocks.0.ln0.weight": (C,),
        "blocks.0.ln0.bias": (C,),
        "ln_out.weight": (C,),
        "ln_out.bias": (C,),
        "head.weight": (V, C),
    }
    for i in range(cfg.num_layers):
        p, a, f = f"blocks.{i}.", f"blocks.{i}.att.", f"blocks.{i}.ffn."
        for norm in ("ln1", "ln2"):
            shapes[p + norm + ".weight"] = shapes[p + norm + ".bias"] = (C,)
        shapes |= {a + name: (C,) for name in (*MIX_NAMES, "w0", "a0", "k_k", "k_a", "ln_x.weight", "ln_x.bias")}
        shapes |= {
            a + "w1": (C, cfg.decay_rank), a + "w2": (cfg.decay_rank, C),
            a + "a1": (C, cfg.iclr_rank), a + "a2": (cfg.iclr_rank, C),
            a + "g1": (C, cfg.gate_rank), a + "g2": (cfg.gate_rank, C),
            a + "r_k": (H, N),
            a + "receptance.weight": (C, C), a + "key.weight": (C, C),
            a + "value.weight": (C, C), a + "output.weight": (C, C),
            f + "x_k": (C,), f + "key.weight": (FF, C), f + "value.weight": (C, FF),
        }
        if i > 0:
            shapes |= {a + "v0": (C,), a + "v1": (C, cfg.value_rank), a + "v2": (cfg.value_rank, C)}
    return shapes


_HF_BLOCK = {"att": "attn", "ffn": "ffn", "ln0": "pre_norm", "ln1": "attn_norm", "ln2": "ffn_norm"}
_HF_ATT = {"receptance": "r_proj", "key": "k_proj", "value": "v_proj", "output": "o_proj", "ln_x": "g_norm"}
_HF_LORA = {"0": "lora.2.bias", "1": "lora.0.weight", "2": "lora.2.weight"}  # w0 is the bias of lora.2
_HF_TOP = {"emb.weight": "model.embeddings.weight", "ln_out.weight": "model.norm.weight",
           "ln_out.bias": "model.norm.bias", "head.weight": "lm_head.weight"}


def hf_name(name: str) -> tuple[str, bool]:
    """The Hugging Face layout's name for BlinkDL's `name`, and whether the tensor is transposed there."""
    if name in _HF_TOP:
        return _HF_TOP[name], False
    _, layer, part, rest = name.split(".", 3)
    first, _, tail = rest.partition(".")
    transposed = False
    if part == "att" and len(first) == 2 and first[0] in "wavg" and first[1] in "012":
        rest, transposed = f"{first[0]}_lora.{_HF_LORA[first[1]]}", first[1] != "0"
    elif part == "att" and first in _HF_ATT:
        rest = _HF_ATT[first] + ("." + tail if tail else "")
    return f"model.layers.{layer}.{_HF_BLOCK[part]}.{rest}", transposed


@dataclass
class ValueResidual:
    """What the layers of one span share: layer 0's value, which every later layer mixes in."""

    v_first: Tensor | None = None


# ---------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------


class TimeMix(nn.Module):
    """The token mixer: projections and LoRA gates around one call into the wkv7 op."""

    def __init__(self, cfg: RWKV7Config, take: Take, prefix: str, layer: int) -> None:
        super().__init__()
        self.layer, self.heads, self.head_size = layer, cfg.num_heads, cfg.head_size
        self.group_norm_eps = cfg.group_norm_eps
        self.register_buffer("mix", torch.stack([take(prefix + n) for n in MIX_NAMES]))  # [6, C]
        self.receptance, self.key, self.value, self.output = (
            Projection(take(prefix + name + ".weight")) for name in ("receptance", "key", "value", "output")
        )  # [C, C] each
        for name in ("w1", "w2", "a1", "a2", "g1", "g2"):
            self.register_buffer(name, take(prefix + name))
        self.register_buffer("w0", take(prefix + "w0", target=torch.float32))
        self.register_buffer("a0", take(prefix + "a0"))
        if layer > 0:  # value residual: later layers mix in layer 0's value
            for name in ("v0", "v1", "v2"):
                self.register_buffer(name, take(prefix + name))
        self.register_buffer("k_k", take(prefix + "k_k"))
        self.register_buffer("k_a", take(prefix + "k_a"))
        self.register_buffer("r_k", take(prefix + "r_k", target=torch.float32))  # [H, N]
        self.register_buffer("ln_x_weight", take(prefix + "ln_x.weight", target=torch.float32))
        self.register_buffer("ln_x_bias", take(prefix + "ln_x.bias", target=torch.float32))

    def forward(
        self, x: Tensor, state: RecurrentLayerState, residual: ValueResidual, with_stats: bool
    ) -> tuple[Tensor, RecurrenceStats | None]:
        """x [B, T, C] (after ln1) -> (output [B, T, C], stats); layer 0 sets `residual.v_first`."""
        B, T, C = x.shape
        H, N = self.heads, self.head_size
        prev = token_shift(x, state, 0)
        xr, xw, xk, xv, xa, xg = (x[:, :, None] + (prev - x)[:, :, None] * self.mix).unbind(dim=2)

        r, k, v = self.receptance(xr), self.key(xk), self.value(xv)
        w = torch.tanh(xw @ self.w1) @ self.w2
        iclr = torch.sigmoid(self.a0 + (xa @ self.a1) @ self.a2)  # in-context learning rate, (0, 1)
        g = torch.sigmoid(xg @ self.g1) @ self.g2
        if self.layer == 0:
            residual.v_first = v
        else:
            v = v + (residual.v_first - v) * torch.sigmoid(self.v0 + (xv @ self.v1) @ self.v2)
        log_w = -DECAY_SCALE * torch.sigmoid(self.w0 + w.float())  # [-0.607, 0]

        heads = (B, T, H, N)
        kk = F.normalize((k * self.k_k).float().view(heads), dim=-1)  # unit removal key per head
        k = k * (1 + (iclr - 1) * self.k_a)
        r32, k32, v32 = (t.float().view(heads) for t in (r, k, v))
        iclr32 = iclr.float().view(heads)
        o, stats = state.run(
            RWKV7_WKV, r=r32, log_w=log_w.view(heads), k=k32, v=v32, a=-kk, b=kk * iclr32,
            dtype=x.dtype, with_stats=with_stats,
        )

        o = F.group_norm(o.reshape(B * T, C), H, self.ln_x_weight, self.ln_x_bias, self.group_norm_eps).view(heads)
        bonus = (r32 * k32 * self.r_k).sum(-1, keepdim=True) * v32  # the current token's own value
        o = (o + bonus).view(B, T, C).to(x.dtype)
        return self.output(o * g), stats


class ChannelMix(nn.Module):
    """Token shift, then a squared-ReLU MLP."""

    def __init__(self, take: Take, prefix: str) -> None:
        super().__init__()
        self.register_buffer("x_k", take(prefix + "x_k"))
        self.key = Projection(take(prefix + "key.weight"))  # [F, C]
        self.value = Projection(take(prefix + "value.weight"))  # [C, F]

    def forward(self, x: Tensor, state: RecurrentLayerState) -> Tensor:
        prev = token_shift(x, state, 1)
        k = x + (prev - x) * self.x_k
        return self.value(torch.relu(self.key(k)).square())


class Block(nn.Module):
    def __init__(self, cfg: RWKV7Config, take: Take, index: int) -> None:
        super().__init__()
        p = f"blocks.{index}."
        self.att = TimeMix(cfg, take, p + "att.", index)
        self.ffn = ChannelMix(take, p + "ffn.")
        for norm in ("ln1", "ln2"):
            self.register_buffer(norm + "_weight", take(p + norm + ".weight", target=torch.float32))
            self.register_buffer(norm + "_bias", take(p + norm + ".bias", target=torch.float32))
        self.eps = cfg.layer_norm_eps

    def forward(
        self, x: Tensor, state: RecurrentLayerState, residual: ValueResidual, with_stats: bool
    ) -> tuple[Tensor, RecurrenceStats | None]:
        h, stats = self.att(layer_norm(x, self.ln1_weight, self.ln1_bias, self.eps), state, residual, with_stats)
        x = x + h
        return x + self.ffn(layer_norm(x, self.ln2_weight, self.ln2_bias, self.eps), state), stats


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


class RWKV7Model(RWKVModel):
    """RWKV-7 with a recurrent `State` (the protocol: `model.RecurrentModel`)."""

    family = "rwkv7"

    def __init__(self, cfg: RWKV7Config, take: Take, embedding: Tensor, quantize: str | None = None) -> None:
        blocks = (Block(cfg, take, i) for i in range(cfg.num_layers))
        super().__init__(cfg, take, embedding, blocks, out_norm_eps=cfg.layer_norm_eps, quantize=quantize)

    def span_context(self, state: State, tokens: int) -> ValueResidual:
        return ValueResidual()


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def build(config: dict, checkpoint, *, device: torch.device, dtype: torch.dtype, quantize: str | None = None) -> RWKV7Model:
    """Build the model from a checkpoint in BlinkDL's (`.pth`) or the Hugging Face layout.

    `checkpoint` answers `name in checkpoint`, `names()`, `shape(name)` and `read(name)` and has a
    `folder` for messages; `config` is config.json ({} for a `.pth`). Every tensor's name and shape
    is checked, and a tensor the model does not know is an error (a variant we do not implement).
    """
    if "emb.weight" in checkpoint:
        require_version(checkpoint, "x070")
        locate = blinkdl_name
    elif "model.embeddings.weight" in checkpoint:
        locate = hf_name
    else:
        raise SummarizeError(f"{checkpoint.folder}: no emb.weight nor model.embeddings.weight; not RWKV-7")
    tensors = NamedTensors(checkpoint, locate, device=device, dtype=dtype)
    if tensors.shape("blocks.0.att.r_k") is None:
        raise SummarizeError(f"{checkpoint.folder}: no blocks.0.att.r_k; not an RWKV-7 (x070) checkpoint")
    cfg = RWKV7Config.from_shapes(tensors.shape, config, where=str(checkpoint.folder))
    tensors.expect(checkpoint_shapes(cfg))
    model = RWKV7Model(cfg, tensors.take, embedding=tensors.embedding(cfg.layer_norm_eps), quantize=quantize)
    # e.g. DeepEmbed (ffn.s_emb) or DEA (att.qq): variants this engine does not implement
    tensors.refuse_unknown(UNUSED, "plain RWKV-7")
    return model


def is_rwkv7_file(checkpoint) -> bool:
    """Whether a BlinkDL file holds an RWKV-7 (x070), from its tensor names."""
    return blinkdl_version(set(checkpoint.names())) == "x070"


FAMILY = Family(
    name=RWKV7Model.family,
    model_types=MODEL_TYPES,
    file_suffixes=(".pth",),
    claims=is_rwkv7_file,
    build=build,
    load_tokenizer=partial(load_rwkv_tokenizer, formats=(G1_CHAT,)),
    quantize_modes=QUANTIZATIONS,
    label="RWKV-7",
    gguf_archs=rwkv7_gguf.ARCHS,
    read_gguf=rwkv7_gguf.read_gguf,
)
