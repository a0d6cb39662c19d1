"""RWKV-6 ("Finch", x060): every layer is recurrent; nothing grows with the context.

Each layer is a time-mix followed by a channel-mix. The time-mix shifts tokens by how much the input
asks for ("ddlerp": a LoRA of the shifted input gives the mix of each of w, k, v, r and g), takes a
per-channel decay w = exp(-exp(time_decay + LoRA)) that is not bounded below, makes one call into
the wkv6 op (a bonus u for the current token, S = k v^T + w S), then a per-head group norm and a
SiLU gate. The channel-mix is a token shift, a squared-ReLU MLP and a sigmoid receptance. The
reference is BlinkDL's v6 path of the `rwkv` package; checkpoints come in BlinkDL's layout (`.pth`)
or the Hugging Face one (model_type `rwkv6`: the RWKV-6-World repositories, Mobius).

Conventions fixed here, once, at load time (with those of every RWKV family, `rwkv_common`: BlinkDL's
names canonical, ln0 folded into the embedding, the state's layout):
- The Hugging Face layout names the same tensors, of the same shapes, `rwkv.embeddings`,
  `rwkv.blocks.N.{pre_ln,ln1,ln2}`, `rwkv.blocks.N.attention.*`, `rwkv.blocks.N.feed_forward.*`,
  `rwkv.ln_out` and `head` (`hf_name`). Its weights are stored unscaled: `rescale_every` is a
  half-precision trick of its code at run time, and nothing needs undoing.
- The decay bias time_decay, the bonus time_faaaa and all norm weights stay fp32; the decay is
  computed in fp32 and the wkv state is fp32 whatever the weight dtype.
- Sizes come from tensor shapes: heads and head size from time_faaaa [H, N], the LoRA ranks from
  time_maa_w1 [C, 5 D] and time_decay_w1 [C, D'], the FFN width from ffn.key, layers, vocabulary.
- eps: the block norms' from config.json's layer_norm_epsilon (BlinkDL: 1e-5), ln_x's 1e-5 times
  head_size_divisor squared (BlinkDL: divisor 8), ln_out's always 1e-5.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from summarize.engine.diagnostics import RecurrenceStats
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
from summarize.engine.ops.rwkv6_wkv import RWKV6_WKV
from summarize.engine.state import RecurrentLayerState
from summarize.engine.tokenizers.rwkv import MOBIUS_CHAT, WORLD_CHAT, load_rwkv_tokenizer
from summarize.errors import SummarizeError

MODEL_TYPES = ("rwkv6",)  # config.json model_type of the Hugging Face layout
MIXED = ("w", "k", "v", "r", "g")  # what the token-shift LoRA mixes, in time_maa_w2's order
DEFAULT_HEAD_SIZE_DIVISOR = 8


@dataclass(frozen=True)
class RWKV6Config:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    head_size: int
    mix_rank: int  # the token-shift LoRA's rank per mixed input (time_maa_w1 has 5 of them)
    decay_rank: int
    ffn_size: int
    layer_norm_eps: float = LAYER_NORM_EPS
    group_norm_eps: float = GROUP_NORM_EPS

    @classmethod
    def from_shapes(cls, shape: Callable[[str], tuple[int, ...] | None], config: dict, where: str = "the checkpoint") -> RWKV6Config:
        """Read every size from tensor shapes (BlinkDL names); eps values from config.json if any.

        `where` (the checkpoint's folder or file) is named in the one-line SummarizeError that a
        missing or misshaped sizing tensor, or an ill-typed config.json setting, gives.
        """
        sizes = SizingShapes(shape, config, where, "x060")
        dims = sizes.dims
        vocab, hidden = dims("emb.weight", 2)
        layers = sizes.layers()
        heads, head_size = dims("blocks.0.att.time_faaaa", 2)
        if heads * head_size != hidden:
            raise SummarizeError(f"{where}: blocks.0.att.time_faaaa has {heads} heads of {head_size}; the embedding has {hidden} channels")
        mix_width = dims("blocks.0.att.time_maa_w1", 2)[1]
        if mix_width % len(MIXED):
            raise SummarizeError(f"{where}: blocks.0.att.time_maa_w1 has {mix_width} columns, not {len(MIXED)} LoRAs of equal rank")
        divisor = sizes.setting("head_size_divisor", DEFAULT_HEAD_SIZE_DIVISOR)
        return cls(
            vocab_size=vocab,
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            head_size=head_size,
            mix_rank=mix_width // len(MIXED),
            decay_rank=dims("blocks.0.att.time_decay_w1", 2)[1],
            ffn_size=dims("blocks.0.ffn.key.weight", 2)[0],
            layer_norm_eps=sizes.setting("layer_norm_epsilon", LAYER_NORM_EPS),
            group_norm_eps=1e-5 * divisor**2,
        )


# ---------------------------------------------------------------------------------------------
# The name table: every tensor read, with its shape (BlinkDL names; its [1, 1, C] vectors read as [C]).
# ---------------------------------------------------------------------------------------------


def checkpoint_shapes(cfg: RWKV6Config) -> dict[str, tuple[int, ...]]:
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
        shapes |= {a + "time_maa_" + name: (C,) for name in ("x", *MIXED)}
        shapes |= {
            a + "time_maa_w1": (C, len(MIXED) * cfg.mix_rank), a + "time_maa_w2": (len(MIXED), cfg.mix_rank, C),
            a + "time_decay": (C,), a + "time_decay_w1": (C, cfg.decay_rank), a + "time_decay_w2": (cfg.decay_rank, C),
            a + "time_faaaa": (H, N),
            a + "receptance.weight": (C, C), a + "key.weight": (C, C), a + "value.weight": (C, C),
            a + "gate.weight": (C, C), a + "output.weight": (C, C),
            a + "ln_x.weight": (C,), a + "ln_x.bias": (C,),
            f + "time_maa_k": (C,), f + "time_maa_r": (C,),
            f + "key.weight": (FF, C), f + "receptance.weight": (C, C), f + "value.weight": (C, FF),
        }
    return shapes


_HF_BLOCK = {"att": "attention", "ffn": "feed_forward", "ln0": "pre_ln", "ln1": "ln1", "ln2": "ln2"}
_HF_TOP = {"emb.weight": "rwkv.embeddings.weight", "ln_out.weight": "rwkv.ln_out.weight",
           "ln_out.bias": "rwkv.ln_out.bias", "head.weight": "head.weight"}


def hf_name(name: str) -> tuple[str, bool]:
    """The Hugging Face layout's name for BlinkDL's `name` (never transposed there)."""
    if name in _HF_TOP:
        return _HF_TOP[name], False
    _, layer, part, rest = name.split(".", 3)
    return f"rwkv.blocks.{layer}.{_HF_BLOCK[part]}.{rest}", False


# ---------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------


class TimeMix(nn.Module):
    """The token mixer: data-dependent token shift and decay around one call into the wkv6 op."""

    def __init__(self, cfg: RWKV6Config, take: Take, prefix: str) -> None:
        super().__init__()
        self.heads, self.head_size, self.group_norm_eps = cfg.num_heads, cfg.head_size, cfg.group_norm_eps
        self.register_buffer("mix_x", take(prefix + "time_maa_x"))  # [C]
        self.register_buffer("mix", torch.stack([take(prefix + "time_maa_" + n) for n in MIXED]))  # [5, C]
        self.register_buffer("mix_w1", take(prefix + "time_maa_w1"))  # [C, 5 D]
        self.register_buffer("mix_w2", take(prefix + "time_maa_w2"))  # [5, D, C]
        self.register_buffer("decay", take(prefix + "time_decay", target=torch.float32))  # [C]
        self.register_buffer("decay_w1", take(prefix + "time_decay_w1"))  # [C, D']
        self.register_buffer("decay_w2", take(prefix + "time_decay_w2"))  # [D', C]
        self.register_buffer("bonus", take(prefix + "time_faaaa", target=torch.float32))  # u [H, N]
        self.receptance, self.key, self.value, self.gate, self.output = (
            Projection(take(prefix + name + ".weight")) for name in ("receptance", "key", "value", "gate", "output")
        )  # [C, C] each
        self.register_buffer("ln_x_weight", take(prefix + "ln_x.weight", target=torch.float32))
        self.register_buffer("ln_x_bias", take(prefix + "ln_x.bias", target=torch.float32))

    def forward(self, x: Tensor, state: RecurrentLayerState, with_stats: bool) -> tuple[Tensor, RecurrenceStats | None]:
        """x [B, T, C] (after ln1) -> (output [B, T, C], stats)."""
        B, T, C = x.shape
        H, N = self.heads, self.head_size
        shifted = token_shift(x, state, 0) - x
        lora = torch.tanh((x + shifted * self.mix_x) @ self.mix_w1).view(B * T, len(MIXED), -1).transpose(0, 1)
        lora = torch.bmm(lora, self.mix_w2).view(len(MIXED), B, T, C)  # each mixed input's own share
        xw, xk, xv, xr, xg = (x + shifted * (self.mix[:, None, None] + lora)).unbind(dim=0)

        r, k, v = self.receptance(xr), self.key(xk), self.value(xv)
        g = F.silu(self.gate(xg))
        log_w = -torch.exp(self.decay + (torch.tanh(xw @ self.decay_w1) @ self.decay_w2).float())  # <= 0, unbounded

        heads = (B, T, H, N)
        o, stats = state.run(
            RWKV6_WKV, r=r.float().view(heads), log_w=log_w.view(heads), k=k.float().view(heads), v=v.float().view(heads),
            u=self.bonus, with_stats=with_stats,
        )
        o = F.group_norm(o.reshape(B * T, C), H, self.ln_x_weight, self.ln_x_bias, self.group_norm_eps).view(B, T, C)
        return self.output(o.to(x.dtype) * g), stats


class ChannelMix(nn.Module):
    """Token shift, then a squared-ReLU MLP behind a sigmoid receptance."""

    def __init__(self, take: Take, prefix: str) -> None:
        super().__init__()
        self.register_buffer("mix_k", take(prefix + "time_maa_k"))
        self.register_buffer("mix_r", take(prefix + "time_maa_r"))
        self.key, self.receptance, self.value = (Projection(take(prefix + name + ".weight")) for name in ("key", "receptance", "value"))

    def forward(self, x: Tensor, state: RecurrentLayerState) -> Tensor:
        shifted = token_shift(x, state, 1) - x
        k = x + shifted * self.mix_k
        r = x + shifted * self.mix_r
        return torch.sigmoid(self.receptance(r)) * self.value(torch.relu(self.key(k)).square())


class Block(nn.Module):
    def __init__(self, cfg: RWKV6Config, take: Take, index: int) -> None:
        super().__init__()
        p = f"blocks.{index}."
        self.att = TimeMix(cfg, take, p + "att.")
        self.ffn = ChannelMix(take, p + "ffn.")
        for norm in ("ln1", "ln2"):
            self.register_buffer(norm + "_weight", take(p + norm + ".weight", target=torch.float32))
            self.register_buffer(norm + "_bias", take(p + norm + ".bias", target=torch.float32))
        self.eps = cfg.layer_norm_eps

    def forward(self, x: Tensor, state: RecurrentLayerState, context: None, with_stats: bool) -> tuple[Tensor, RecurrenceStats | None]:
        h, stats = self.att(layer_norm(x, self.ln1_weight, self.ln1_bias, self.eps), state, with_stats)
        x = x + h
        return x + self.ffn(layer_norm(x, self.ln2_weight, self.ln2_bias, self.eps), state), stats


class RWKV6Model(RWKVModel):
    """RWKV-6 with a recurrent `State` (the protocol: `model.RecurrentModel`)."""

    family = "rwkv6"

    def __init__(self, cfg: RWKV6Config, take: Take, embedding: Tensor, quantize: str | None = None) -> None:
        blocks = (Block(cfg, take, i) for i in range(cfg.num_layers))
        super().__init__(cfg, take, embedding, blocks, out_norm_eps=LAYER_NORM_EPS, quantize=quantize)


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def build(config: dict, checkpoint, *, device: torch.device, dtype: torch.dtype, quantize: str | None = None) -> RWKV6Model:
    """Build the model from a checkpoint in BlinkDL's (`.pth`) or the Hugging Face layout.

    `checkpoint` answers `name in checkpoint`, `names()`, `shape(name)` and `read(name)` and has a
    `folder` for messages; `config` is config.json ({} for a `.pth`). Every tensor's name and shape
    is checked, and a tensor the model does not know is an error (a variant we do not implement,
    such as a state-tuned file's time_state).
    """
    if "emb.weight" in checkpoint:
        require_version(checkpoint, "x060")
        locate = blinkdl_name
    elif "rwkv.embeddings.weight" in checkpoint:
        locate = hf_name
    else:
        raise SummarizeError(f"{checkpoint.folder}: no emb.weight nor rwkv.embeddings.weight; not RWKV-6")
    tensors = NamedTensors(checkpoint, locate, device=device, dtype=dtype)
    cfg = RWKV6Config.from_shapes(tensors.shape, config, where=str(checkpoint.folder))
    tensors.expect(checkpoint_shapes(cfg))
    model = RWKV6Model(cfg, tensors.take, embedding=tensors.embedding(cfg.layer_norm_eps), quantize=quantize)
    tensors.refuse_unknown((), "plain RWKV-6")
    return model


def is_rwkv6_file(checkpoint) -> bool:
    """Whether a BlinkDL file holds an RWKV-6 (x060), from its tensor names."""
    return blinkdl_version(set(checkpoint.names())) == "x060"


FAMILY = Family(
    name=RWKV6Model.family,
    model_types=MODEL_TYPES,
    file_suffixes=(".pth",),
    claims=is_rwkv6_file,
    build=build,
    # Mobius's chat format when its vocabulary has the tokens, else the World models'
    load_tokenizer=partial(load_rwkv_tokenizer, formats=(MOBIUS_CHAT, WORLD_CHAT)),
    quantize_modes=QUANTIZATIONS,
    label="RWKV-6",
)
