"""Qwen3.5, dense and MoE: 3 of every 4 layers are Gated DeltaNet, the 4th gated full attention.

Conventions fixed here, once, at load time (the reference is transformers' `models/qwen3_5`):
- RMSNorm is zero-centred in the checkpoint (y = x̂·(1 + w)); we store 1 + w and use a plain
  RMSNorm. The gated norm inside Gated DeltaNet is not zero-centred (y = x̂·w·silu(z)).
- Projections that read the same input are fused into one matrix (GDN: qkv|z and b|a; attention:
  q+gate|k|v; MLP: gate|up), so each layer makes few matmuls where the checkpoint has several.
- Gated DeltaNet keeps A as -exp(A_log) in fp32; its state is fp32 whatever the weight dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from summarize.engine.diagnostics import RecurrenceStats
from summarize.engine.model import RecurrentModel
from summarize.engine.models import qwen3_5_gguf
from summarize.engine.models.family import Family
from summarize.engine.ops.attention import apply_rotary, attend
from summarize.engine.ops.causal_conv import causal_conv_silu
from summarize.engine.ops.gated_delta_rule import GATED_DELTA_RULE
from summarize.engine.ops.linear import QUANTIZATIONS, Int4Groups, Int8Groups, Projection, quantized
from summarize.engine.state import KVCache, LayerState, RecurrentLayerState, State
from summarize.engine.tokenizers.tokenizer import load_hub_tokenizer
from summarize.errors import SummarizeError

MODEL_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
MTP_LAYER = "mtp.layers.0."  # the head's one decoder layer
# Prefill blocks of 1,024 tokens: a little faster than 2,048 (a smaller working set)
PREFILL_BLOCK_TOKENS = 1024
L2NORM_EPS = 1e-6  # as the reference normalises q and k


@dataclass(frozen=True)
class Qwen35Config:
    vocab_size: int
    hidden_size: int
    layer_types: tuple[str, ...]
    rms_norm_eps: float
    tie_word_embeddings: bool
    # full attention
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    partial_rotary_factor: float
    # Gated DeltaNet
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    # dense MLP
    intermediate_size: int | None
    # MoE (num_experts == 0 for dense models)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0

    @classmethod
    def from_dict(cls, config: dict, where: str = "config.json") -> Qwen35Config:
        """Read a checkpoint's config.json (text config at top level or under `text_config`).

        A missing or ill-typed setting is a one-line SummarizeError naming `where` and the key.
        """
        if not isinstance(config, dict):
            raise SummarizeError(f"{where}: not a JSON object of settings (a {type(config).__name__})")
        text = config.get("text_config")
        text = config if text is None else text
        if not isinstance(text, dict):
            raise SummarizeError(f"{where}: text_config is not an object (a {type(text).__name__})")
        prefix = "text_config." if text is not config else ""
        rope = text.get("rope_parameters") or {}
        if not isinstance(rope, dict):
            raise SummarizeError(f"{where}: {prefix}rope_parameters is not an object")
        required = object()

        def setting(key: str, default, sources=(text,)):
            value = next((s[key] for s in sources if s.get(key) is not None), None)  # null reads as absent
            if value is None and default is required:
                raise SummarizeError(f"{where}: no {prefix}{key}; not a Qwen3.5 config")
            return (default, False) if value is None else (value, True)

        def size(key: str, default=required, minimum: int = 1) -> int:
            value, given = setting(key, default)
            if given and (type(value) is not int or value < minimum):
                raise SummarizeError(f"{where}: {prefix}{key} must be an integer of at least {minimum}, not {value!r}")
            return value

        def number(key: str, default: float, sources=(text,)) -> float:
            value, given = setting(key, default, sources)
            if given and (type(value) not in (int, float) or not value > 0):
                raise SummarizeError(f"{where}: {prefix}{key} must be a positive number, not {value!r}")
            return value

        num_layers, hidden_size, num_heads = size("num_hidden_layers"), size("hidden_size"), size("num_attention_heads")
        interval = size("full_attention_interval", 4)
        layer_types = text.get("layer_types") or [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)
        ]
        if (not isinstance(layer_types, list) or len(layer_types) < num_layers
                or not all(kind in ("linear_attention", "full_attention") for kind in layer_types[:num_layers])):
            raise SummarizeError(f"{where}: {prefix}layer_types must name {num_layers} layers, "
                                 "each linear_attention or full_attention")
        num_experts = size("num_experts", 0, minimum=0)
        tie = config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
        return cls(
            vocab_size=size("vocab_size"),
            hidden_size=hidden_size,
            layer_types=tuple(layer_types[:num_layers]),
            rms_norm_eps=number("rms_norm_eps", 1e-6),
            tie_word_embeddings=bool(tie),
            num_attention_heads=num_heads,
            num_key_value_heads=size("num_key_value_heads"),
            head_dim=size("head_dim", hidden_size // num_heads),
            rope_theta=number("rope_theta", 10_000_000, sources=(rope, text)),
            partial_rotary_factor=number("partial_rotary_factor", 0.25, sources=(rope, text)),
            linear_num_key_heads=size("linear_num_key_heads"),
            linear_num_value_heads=size("linear_num_value_heads"),
            linear_key_head_dim=size("linear_key_head_dim"),
            linear_value_head_dim=size("linear_value_head_dim"),
            linear_conv_kernel_dim=size("linear_conv_kernel_dim", 4),
            # a dense model needs its MLP width; an MoE model's experts have their own
            intermediate_size=size("intermediate_size", None if num_experts else required),
            num_experts=num_experts,
            num_experts_per_tok=size("num_experts_per_tok", 0, minimum=0),
            moe_intermediate_size=size("moe_intermediate_size", 0, minimum=0),
            shared_expert_intermediate_size=size("shared_expert_intermediate_size", 0, minimum=0),
        )

    @property
    def conv_dim(self) -> int:
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + self.value_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim


# ---------------------------------------------------------------------------------------------
# The checkpoint's name table: every text tensor we read, with its shape. Names are relative to
# the text model (`model.` or `model.language_model.` stripped); `lm_head.weight` is top level.
# The multi-token-prediction head (mtp.*) is read when present; the rest (model.visual.*) never is.
# ---------------------------------------------------------------------------------------------


def checkpoint_shapes(cfg: Qwen35Config, *, fused_experts: bool = True) -> dict[str, tuple[int, ...]]:
    H, V = cfg.hidden_size, cfg.vocab_size
    shapes: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (V, H), "norm.weight": (H,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (V, H)
    for i, kind in enumerate(cfg.layer_types):
        shapes |= layer_shapes(cfg, f"layers.{i}.", kind, fused_experts)
    return shapes


def mtp_shapes(cfg: Qwen35Config, *, fused_experts: bool = True) -> dict[str, tuple[int, ...]]:
    """The multi-token-prediction head's tensors (top level in a checkpoint, beside `model.`)."""
    H = cfg.hidden_size
    norms = {f"mtp.{n}.weight": (H,) for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")}
    return {"mtp.fc.weight": (H, 2 * H)} | norms | layer_shapes(cfg, MTP_LAYER, "full_attention", fused_experts)


def layer_shapes(cfg: Qwen35Config, p: str, kind: str, fused_experts: bool) -> dict[str, tuple[int, ...]]:
    H = cfg.hidden_size
    shapes = {p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,)}
    if kind == "linear_attention":
        a = p + "linear_attn."
        hv = cfg.linear_num_value_heads
        shapes |= {
            a + "in_proj_qkv.weight": (cfg.conv_dim, H),
            a + "in_proj_z.weight": (cfg.value_dim, H),
            a + "in_proj_b.weight": (hv, H),
            a + "in_proj_a.weight": (hv, H),
            a + "conv1d.weight": (cfg.conv_dim, 1, cfg.linear_conv_kernel_dim),
            a + "dt_bias": (hv,),
            a + "A_log": (hv,),
            a + "norm.weight": (cfg.linear_value_head_dim,),
            a + "out_proj.weight": (H, cfg.value_dim),
        }
    elif kind == "full_attention":
        a = p + "self_attn."
        nq, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        shapes |= {
            a + "q_proj.weight": (2 * nq * d, H),  # query and output gate, interleaved per head
            a + "k_proj.weight": (nkv * d, H),
            a + "v_proj.weight": (nkv * d, H),
            a + "o_proj.weight": (H, nq * d),
            a + "q_norm.weight": (d,),
            a + "k_norm.weight": (d,),
        }
    else:
        raise ValueError(f"unknown layer type {kind!r} at {p}")
    m = p + "mlp."
    if cfg.num_experts:
        E, FF, S = cfg.num_experts, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
        shapes |= {
            m + "gate.weight": (E, H),
            m + "shared_expert.gate_proj.weight": (S, H),
            m + "shared_expert.up_proj.weight": (S, H),
            m + "shared_expert.down_proj.weight": (H, S),
            m + "shared_expert_gate.weight": (1, H),
        }
        if fused_experts:
            shapes[m + "experts.gate_up_proj"] = (E, 2 * FF, H)
            shapes[m + "experts.down_proj"] = (E, H, FF)
        else:
            for e in range(E):
                shapes[m + f"experts.{e}.gate_proj.weight"] = (FF, H)
                shapes[m + f"experts.{e}.up_proj.weight"] = (FF, H)
                shapes[m + f"experts.{e}.down_proj.weight"] = (H, FF)
    else:
        FF = cfg.intermediate_size
        shapes |= {
            m + "gate_proj.weight": (FF, H),
            m + "up_proj.weight": (FF, H),
            m + "down_proj.weight": (H, FF),
        }
    return shapes


# name -> tensor on the target device, in the target dtype (a projection may come grouped: a GGUF file's Q8_0, Q4_K, ...)
Take = Callable[[str], Tensor | Int8Groups | Int4Groups]


# ---------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Plain RMSNorm computed in fp32 (weight already holds 1 + w for the zero-centred norms)."""
    return F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)


def l2norm(x: Tensor) -> Tensor:
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + L2NORM_EPS)


class GatedDeltaNet(nn.Module):
    """Token mixer of a linear-attention layer: projections, causal conv, gates, one op call."""

    def __init__(self, cfg: Qwen35Config, take: Take, prefix: str) -> None:
        super().__init__()
        self.cfg = cfg
        self.num_k_heads, self.num_v_heads = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.k_dim, self.v_dim = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.key_dim = self.num_k_heads * self.k_dim
        # Two matrices, qkv | z and b | a: torch's CPU GEMM is slower when N is not a multiple of 1,024
        self.in_proj = Projection.concat([take(prefix + f"in_proj_{n}.weight") for n in ("qkv", "z")])
        self.beta_decay_proj = Projection.concat([take(prefix + f"in_proj_{n}.weight") for n in ("b", "a")])
        # [kernel, C]: tap j of every channel contiguous, so the shifted products vectorize
        self.register_buffer("conv_taps", take(prefix + "conv1d.weight")[:, 0, :].t().contiguous())
        self.register_buffer("dt_bias", take(prefix + "dt_bias").float())
        self.register_buffer("neg_A", -take(prefix + "A_log").float().exp())
        self.register_buffer("norm", take(prefix + "norm.weight"))
        self.out_proj = Projection(take(prefix + "out_proj.weight"))
        self.eps = cfg.rms_norm_eps

    def forward(self, x: Tensor, state: RecurrentLayerState, with_stats: bool) -> tuple[Tensor, RecurrenceStats | None]:
        B, T, _ = x.shape
        qkv, z = self.in_proj(x).split((self.cfg.conv_dim, self.cfg.value_dim), dim=-1)
        b, a = self.beta_decay_proj(x).chunk(2, dim=-1)
        q, k, v = self._causal_conv(qkv, state)  # [B, T, key_dim] twice, [B, T, value_dim]
        q = l2norm(q.float().view(B, T, self.num_k_heads, self.k_dim))
        k = l2norm(k.float().view(B, T, self.num_k_heads, self.k_dim))
        v = v.reshape(B, T, self.num_v_heads, self.v_dim)
        beta = b.float().sigmoid()
        g = self.neg_A * F.softplus(a.float() + self.dt_bias)  # log-space decay, ≤ 0
        o, stats = state.run(GATED_DELTA_RULE, q=q, k=k, v=v, g=g, beta=beta, with_stats=with_stats)
        return self._output(o, z, x.dtype), stats

    def _output(self, o: Tensor, z: Tensor, dtype: torch.dtype) -> Tensor:
        """Gated RMSNorm per head (not zero-centred), x̂ · w · silu(z), then out_proj."""
        B, T = o.shape[:2]
        o = F.rms_norm(o.float(), (self.v_dim,), self.norm.float(), self.eps)
        o = o * F.silu(z.float().view(B, T, self.num_v_heads, self.v_dim))
        return self.out_proj(o.to(dtype).view(B, T, -1))

    def _causal_conv(self, qkv: Tensor, state: RecurrentLayerState) -> tuple[Tensor, Tensor, Tensor]:
        """Depthwise causal conv + SiLU of qkv [B, T, C] over [window | new tokens], returned as
        q, k, v (token-major); the window (state.shift [B, C, kernel-1]) keeps the last kernel-1
        tokens.

        Token-major throughout: the transposes around torch's channel-major conv cost more than
        the conv. q, k, v are convolved apart, so that a compiled step makes one pass per part.
        """
        window = state.shift.transpose(1, 2)  # [B, kernel-1, C]
        bounds = (0, self.key_dim, 2 * self.key_dim, qkv.shape[-1])
        q, k, v = (
            causal_conv_silu(qkv[..., lo:hi], window[..., lo:hi], self.conv_taps[:, lo:hi])
            for lo, hi in zip(bounds, bounds[1:])
        )
        state.slide(window, qkv)
        return q, k, v


class GatedAttention(nn.Module):
    """Full attention with an output gate, q/k norms, partial rotary and GQA over a KV cache.

    Two steps, `project` and `finish`; the decoder layer calls `attend` between them.
    """

    def __init__(self, cfg: Qwen35Config, take: Take, prefix: str) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        qkv = [take(prefix + f"{n}_proj.weight") for n in ("q", "k", "v")]
        self.split = tuple(w.shape[0] for w in qkv)
        self.qkv_proj = Projection.concat(qkv)
        self.o_proj = Projection(take(prefix + "o_proj.weight"))
        self.register_buffer("q_norm", 1.0 + take(prefix + "q_norm.weight").float())
        self.register_buffer("k_norm", 1.0 + take(prefix + "k_norm.weight").float())
        self.eps = cfg.rms_norm_eps

    def project(self, x: Tensor, rotary: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """x [B, T, H] → q [B, Hq, T, D], k and v [B, H_kv, T, D] (normed, rotated), gate [B, T, Hq·D]."""
        B, T, _ = x.shape
        q_and_gate, k, v = self.qkv_proj(x).split(self.split, dim=-1)
        q_and_gate = q_and_gate.view(B, T, self.num_heads, 2 * self.head_dim)
        q, gate = q_and_gate[..., : self.head_dim], q_and_gate[..., self.head_dim :]
        q = rms_norm(q, self.q_norm, self.eps).transpose(1, 2)  # [B, Hq, T, D]
        k = rms_norm(k.view(B, T, self.num_kv_heads, self.head_dim), self.k_norm, self.eps).transpose(1, 2)
        v = v.view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        return q, k, v, gate.reshape(B, T, -1)

    def finish(self, attended: Tensor, gate: Tensor) -> Tensor:
        """Attention's output [B, Hq, T, D] through the output gate and projection → [B, T, H]."""
        B, _, T, _ = attended.shape
        return self.o_proj(attended.transpose(1, 2).reshape(B, T, -1) * torch.sigmoid(gate))


class MLP(nn.Module):
    """SwiGLU with gate and up fused into one matrix [2I, H]."""

    def __init__(self, take: Take, prefix: str) -> None:
        super().__init__()
        self.gate_up = Projection.concat([take(prefix + "gate_proj.weight"), take(prefix + "up_proj.weight")])
        self.down = Projection(take(prefix + "down_proj.weight"))

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class SparseMoE(nn.Module):
    """Softmax router, top-k renormalised, plus a shared expert behind a sigmoid gate.

    Tokens are dispatched per expert: each expert runs only on the tokens routed to it.
    """

    def __init__(self, cfg: Qwen35Config, take: Take, prefix: str, fused_experts: bool) -> None:
        super().__init__()
        self.top_k = cfg.num_experts_per_tok
        self.register_buffer("router", take(prefix + "gate.weight"))
        if fused_experts:
            gate_up, down = take(prefix + "experts.gate_up_proj"), take(prefix + "experts.down_proj")
        else:
            E = cfg.num_experts
            gate_up = torch.stack(
                [torch.cat([take(prefix + f"experts.{e}.{n}_proj.weight") for n in ("gate", "up")]) for e in range(E)]
            )
            down = torch.stack([take(prefix + f"experts.{e}.down_proj.weight") for e in range(E)])
        self.register_buffer("experts_gate_up", gate_up)  # [E, 2I, H]
        self.register_buffer("experts_down", down)  # [E, H, I]
        self.shared = MLP(take, prefix + "shared_expert.")
        self.register_buffer("shared_gate", take(prefix + "shared_expert_gate.weight"))

    @torch.compiler.disable  # data-dependent dispatch: always eager
    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # [N, H]
        probs = F.linear(x, self.router).float().softmax(dim=-1)
        weights, experts = probs.topk(self.top_k, dim=-1)  # [N, k]
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.sigmoid(F.linear(x, self.shared_gate)) * self.shared(x)
        flat = experts.flatten()
        order = flat.argsort()
        counts = torch.bincount(flat, minlength=self.experts_gate_up.shape[0]).tolist()
        tokens, slot_weights = order // self.top_k, weights.flatten()[order]
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            idx = tokens[start : start + count]
            gate, up = F.linear(x[idx], self.experts_gate_up[expert]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.experts_down[expert]) * slot_weights[start : start + count, None]
            out.index_add_(0, idx, y)
            start += count
        return out.view(shape)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen35Config, take: Take, p: str, kind: str, fused_experts: bool) -> None:
        super().__init__()
        self.kind = kind
        self.reads_cache = kind == "full_attention"
        if self.kind == "linear_attention":
            self.mixer = GatedDeltaNet(cfg, take, p + "linear_attn.")
        else:
            self.mixer = GatedAttention(cfg, take, p + "self_attn.")
        self.mlp = SparseMoE(cfg, take, p + "mlp.", fused_experts) if cfg.num_experts else MLP(take, p + "mlp.")
        self.register_buffer("input_norm", 1.0 + take(p + "input_layernorm.weight").float())
        self.register_buffer("post_norm", 1.0 + take(p + "post_attention_layernorm.weight").float())
        self.eps = cfg.rms_norm_eps

    def forward(
        self, x: Tensor, layer_state: LayerState, rotary: tuple[Tensor, Tensor], with_stats: bool
    ) -> tuple[Tensor, RecurrenceStats | None]:
        """One layer over x [B, T, H]."""
        if self.reads_cache:
            return self.after_cache(x, self.read_cache(self.before_cache(x, rotary), layer_state), with_stats)
        h, stats = self.mixer(rms_norm(x, self.input_norm, self.eps), layer_state, with_stats)
        return self._mlp(x + h), stats

    # A full-attention layer in three steps (`model.Steps.layer`): the cache's read in the middle
    # runs eagerly (the cache grows every step).
    def before_cache(self, x: Tensor, rotary: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return self.mixer.project(rms_norm(x, self.input_norm, self.eps), rotary)

    def read_cache(self, parts: tuple[Tensor, Tensor, Tensor, Tensor], layer_state: LayerState) -> tuple[Tensor, Tensor]:
        q, k, v, gate = parts
        return attend(q, k, v, layer_state), gate

    def after_cache(self, x: Tensor, parts: tuple[Tensor, Tensor], with_stats: bool) -> tuple[Tensor, None]:
        return self._mlp(x + self.mixer.finish(*parts)), None

    def _mlp(self, x: Tensor) -> Tensor:
        return x + self.mlp(rms_norm(x, self.post_norm, self.eps))


class MultiTokenPredictor(nn.Module):
    """The checkpoint's multi-token-prediction head (`mtp.*`): from the hidden state the model
    left at a position and the token that followed it, a guess at the token after that.

    It concatenates `pre_fc_norm_embedding(embed(token))` and `pre_fc_norm_hidden(hidden)`, maps
    them back to the hidden size (`fc`), runs one full-attention decoder layer with a KV cache of
    its own, and ends in `norm`; the model's head turns that into logits. `hidden` is the model's
    final-normed hidden state (`target_hidden`), or, to guess further ahead, this head's own output.
    """

    def __init__(self, cfg: Qwen35Config, take: Take, fused_experts: bool) -> None:
        super().__init__()
        self.cfg = cfg
        self.fc = Projection(take("mtp.fc.weight"))
        self.register_buffer("embedding_norm", 1.0 + take("mtp.pre_fc_norm_embedding.weight").float())
        self.register_buffer("hidden_norm", 1.0 + take("mtp.pre_fc_norm_hidden.weight").float())
        self.register_buffer("norm", 1.0 + take("mtp.norm.weight").float())
        self.register_buffer("final_norm", 1.0 + take("norm.weight").float())  # the model's own
        self.layer = DecoderLayer(cfg, take, MTP_LAYER, "full_attention", fused_experts)

    def new_state(self, batch_size: int, dtype: torch.dtype, device: torch.device) -> State:
        empty = torch.zeros(batch_size, self.cfg.num_key_value_heads, 0, self.cfg.head_dim, dtype=dtype, device=device)
        return State(layers=[KVCache(keys=empty, values=empty.clone())])

    def target_hidden(self, hidden: Tensor) -> Tensor:
        """The model's last-layer hidden states → the final-normed ones this head reads."""
        return rms_norm(hidden, self.final_norm, self.cfg.rms_norm_eps)

    def forward(self, embedded: Tensor, hidden: Tensor, state: State, rotary: tuple[Tensor, Tensor], steps=None) -> Tensor:
        """embedded [B, T, H] (the tokens that followed), hidden [B, T, H] → normed output [B, T, H].
        `steps`: the model's (`model.Steps`), to run the decoder layer as the model runs its own
        (compiled, for a prompt); eagerly when None."""
        eps = self.cfg.rms_norm_eps
        x = self.fc(torch.cat([rms_norm(embedded, self.embedding_norm, eps), rms_norm(hidden, self.hidden_norm, eps)], dim=-1))
        if steps is None:
            x, _ = self.layer(x, state.layers[0], rotary, False)
        else:
            x, _ = steps.layer(self.layer, x, state.layers[0], rotary, False)
        state.advance(x.shape[1])
        return rms_norm(x, self.norm, eps)


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


class Qwen35Model(RecurrentModel):
    """Qwen3.5 text model with a recurrent `State` (the protocol: `model.RecurrentModel`)."""

    family = "qwen3_5"
    prefill_block_tokens = PREFILL_BLOCK_TOKENS
    compiles = True

    def __init__(self, cfg: Qwen35Config, take: Take, *, fused_experts: bool = True, quantize: str | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.mtp: MultiTokenPredictor | None = None  # the checkpoint's multi-token-prediction head, if any
        # quantized part by part (the embedding table too; the experts of an MoE model stay in the
        # model's dtype): peak memory is the quantized model plus one part
        def built(module: nn.Module) -> nn.Module:
            return quantized(module, quantize)

        self.embed_tokens = built(Projection(take("embed_tokens.weight")))
        self.layers = nn.ModuleList(
            built(DecoderLayer(cfg, take, f"layers.{i}.", kind, fused_experts)) for i, kind in enumerate(cfg.layer_types)
        )
        self.register_buffer("final_norm", 1.0 + take("norm.weight").float())
        self.lm_head = self.embed_tokens if cfg.tie_word_embeddings else built(Projection(take("lm_head.weight")))
        rotary_dim = int(cfg.head_dim * cfg.partial_rotary_factor)
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
        self.register_buffer("inv_freq", inv_freq.to(self.embed_tokens.weight.device))

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.dtype  # a property: a dtype held by a module is lost in saved graphs

    def lookup_tables(self) -> list[nn.Module]:
        return [] if self.lm_head is self.embed_tokens else [self.embed_tokens]

    def row_tables(self) -> list[nn.Module]:
        return [self.embed_tokens, self.lm_head]  # the multi-token-prediction drafter reads the head's rows

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    def new_state(self, batch_size: int = 1) -> State:
        cfg, dev = self.cfg, self.device
        layers = []
        for kind in cfg.layer_types:
            if kind == "linear_attention":
                h, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
                layers.append(
                    RecurrentLayerState(
                        matrix=torch.zeros(batch_size, h, dk, dv, dtype=torch.float32, device=dev),
                        shift=torch.zeros(batch_size, cfg.conv_dim, cfg.linear_conv_kernel_dim - 1, dtype=self.dtype, device=dev),
                    )
                )
            else:
                empty = torch.zeros(batch_size, cfg.num_key_value_heads, 0, cfg.head_dim, dtype=self.dtype, device=dev)
                layers.append(KVCache(keys=empty, values=empty.clone()))
        return State(layers=layers)

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.embed_tokens.rows(input_ids)

    def span_context(self, state: State, tokens: int) -> tuple[Tensor, Tensor]:
        """cos and sin of the next `tokens` positions: [T, rot], or [B, 1, T, rot] when rows differ."""
        steps = torch.arange(tokens, device=self.device)
        if state.row_positions is None:  # every row at the same position: [T, rot]
            positions = (state.position + steps).float()
        else:  # rows that read different lengths: [B, 1, T, rot], broadcast over heads
            positions = (state.row_positions[:, None] + steps)[:, None, :].float()
        freqs = positions[..., None] * self.inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def logits(self, hidden: Tensor) -> Tensor:
        return self.lm_head(rms_norm(hidden, self.final_norm, self.cfg.rms_norm_eps))


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------

TEXT_PREFIXES = ("model.language_model.", "model.", "")  # VLM checkpoint, CausalLM, bare text model
FP32_TENSORS = ("A_log", "dt_bias")  # decay parameters stay fp32 whatever the weight dtype


def build(config: dict, checkpoint, *, device: torch.device, dtype: torch.dtype, quantize: str | None = None) -> Qwen35Model:
    """Build the model from a `Checkpoint`, checking every tensor's name and shape on the way."""
    cfg = Qwen35Config.from_dict(config, where=getattr(checkpoint, "config_where", None) or str(checkpoint.folder / "config.json"))
    prefix = next((p for p in TEXT_PREFIXES if p + "embed_tokens.weight" in checkpoint), None)
    if prefix is None:
        raise SummarizeError(f"{checkpoint.folder}: no embed_tokens.weight; not a Qwen3.5 checkpoint")
    fused = not cfg.num_experts or prefix + "layers.0.mlp.experts.gate_up_proj" in checkpoint
    shapes = checkpoint_shapes(cfg, fused_experts=fused)
    mtp_fused = not cfg.num_experts or MTP_LAYER + "mlp.experts.gate_up_proj" in checkpoint
    head = mtp_shapes(cfg, fused_experts=mtp_fused)
    with_mtp = all(name in checkpoint for name in head)
    if with_mtp:
        shapes |= head

    def take(name: str) -> Tensor | Int8Groups | Int4Groups:
        full = name if name == "lm_head.weight" or name.startswith("mtp.") else prefix + name
        tensor = checkpoint.read(full)
        if tuple(tensor.shape) != shapes[name]:
            raise SummarizeError(
                f"{checkpoint.folder}: tensor {full} has shape {tuple(tensor.shape)}, config says {shapes[name]}"
            )
        target = torch.float32 if name.endswith(FP32_TENSORS) else dtype
        return tensor.to(device=device, dtype=target)

    model = Qwen35Model(cfg, take, fused_experts=fused, quantize=quantize)
    if with_mtp:
        model.mtp = quantized(MultiTokenPredictor(cfg, take, mtp_fused), quantize)
    return model


FAMILY = Family(
    name=Qwen35Model.family,
    model_types=MODEL_TYPES,
    build=build,
    load_tokenizer=load_hub_tokenizer,
    quantize_modes=QUANTIZATIONS,
    label="Qwen3.5",
    gguf_archs=qwen3_5_gguf.ARCHS,
    read_gguf=qwen3_5_gguf.read_gguf,
)
