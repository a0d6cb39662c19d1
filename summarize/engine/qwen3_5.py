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

from summarize.engine.compiled import CompiledSteps, compile_steps
from summarize.engine.diagnostics import Listener, merge_block_stats, report_span
from summarize.engine.ops.gated_delta_rule import (
    DeltaRuleStats,
    chunk_rule_op,
    recurrent_step_gated_delta_rule,
)
from summarize.engine.ops.gated_delta_rule_fla import fla_chunk_gated_delta_rule, fla_usable
from summarize.engine.ops.linear import Projection
from summarize.engine.state import KVCache, LayerState, RecurrentLayerState, State
from summarize.errors import SummarizeError

MODEL_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
# Prefill runs in blocks of at most this many tokens: bounded activations. Measured on a 2-core
# Zen 4, 0.8B shape, bf16, interleaved: 1,024 against 2,048 gives 274 vs 262 tok/s over 2,048
# tokens and 210 vs 202 over 8,192 (a smaller working set; the attention flops are the same).
PREFILL_BLOCK_TOKENS = 1024
L2NORM_EPS = 1e-6
# Tokens per chunk of the Gated DeltaNet prefill. Measured on a 2-core Zen 4, 0.8B shape, bf16:
# 231 tok/s at 32 against 196 at 64 (2048 tokens); smaller chunks keep the solve in cache.
GDN_CHUNK_TOKENS = 32  # as the reference (and flash-linear-attention) normalise q and k


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
    def from_dict(cls, config: dict) -> Qwen35Config:
        """Read a checkpoint's config.json (text config at top level or under `text_config`)."""
        text = config.get("text_config", config)
        rope = text.get("rope_parameters") or {}
        num_layers = text["num_hidden_layers"]
        layer_types = text.get("layer_types") or [
            "full_attention" if (i + 1) % text.get("full_attention_interval", 4) == 0 else "linear_attention"
            for i in range(num_layers)
        ]
        head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
        tie = config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
        return cls(
            vocab_size=text["vocab_size"],
            hidden_size=text["hidden_size"],
            layer_types=tuple(layer_types[:num_layers]),
            rms_norm_eps=text.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=bool(tie),
            num_attention_heads=text["num_attention_heads"],
            num_key_value_heads=text["num_key_value_heads"],
            head_dim=head_dim,
            rope_theta=rope.get("rope_theta", text.get("rope_theta", 10_000_000)),
            partial_rotary_factor=rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25)),
            linear_num_key_heads=text["linear_num_key_heads"],
            linear_num_value_heads=text["linear_num_value_heads"],
            linear_key_head_dim=text["linear_key_head_dim"],
            linear_value_head_dim=text["linear_value_head_dim"],
            linear_conv_kernel_dim=text.get("linear_conv_kernel_dim", 4),
            intermediate_size=text.get("intermediate_size"),
            num_experts=text.get("num_experts", 0) or 0,
            num_experts_per_tok=text.get("num_experts_per_tok", 0) or 0,
            moe_intermediate_size=text.get("moe_intermediate_size", 0) or 0,
            shared_expert_intermediate_size=text.get("shared_expert_intermediate_size", 0) or 0,
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
# Everything else in a checkpoint (model.visual.*, mtp.*) is never read.
# ---------------------------------------------------------------------------------------------


def checkpoint_shapes(cfg: Qwen35Config, *, fused_experts: bool = True) -> dict[str, tuple[int, ...]]:
    H, V = cfg.hidden_size, cfg.vocab_size
    shapes: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (V, H), "norm.weight": (H,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (V, H)
    for i, kind in enumerate(cfg.layer_types):
        p = f"layers.{i}."
        shapes[p + "input_layernorm.weight"] = (H,)
        shapes[p + "post_attention_layernorm.weight"] = (H,)
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
            raise ValueError(f"unknown layer type {kind!r} at layer {i}")
        m = p + "mlp."
        if cfg.num_experts:
            E, I, S = cfg.num_experts, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
            shapes |= {
                m + "gate.weight": (E, H),
                m + "shared_expert.gate_proj.weight": (S, H),
                m + "shared_expert.up_proj.weight": (S, H),
                m + "shared_expert.down_proj.weight": (H, S),
                m + "shared_expert_gate.weight": (1, H),
            }
            if fused_experts:
                shapes[m + "experts.gate_up_proj"] = (E, 2 * I, H)
                shapes[m + "experts.down_proj"] = (E, H, I)
            else:
                for e in range(E):
                    shapes[m + f"experts.{e}.gate_proj.weight"] = (I, H)
                    shapes[m + f"experts.{e}.up_proj.weight"] = (I, H)
                    shapes[m + f"experts.{e}.down_proj.weight"] = (H, I)
        else:
            I = cfg.intermediate_size
            shapes |= {
                m + "gate_proj.weight": (I, H),
                m + "up_proj.weight": (I, H),
                m + "down_proj.weight": (H, I),
            }
    return shapes


Take = Callable[[str], Tensor]  # name -> tensor on the target device, in the target dtype


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
        # Two matrices, qkv | z and b | a: torch's CPU GEMM reads a weight [N, K] as Wᵀ about a
        # quarter slower when N is not a multiple of 1,024 (1,024 × 1,024 inputs, bf16, N = 8,224
        # against 8,192 + 32: 1.08-1.22× for the pair, measured on a 2-core Xeon).
        self.in_proj = Projection(torch.cat([take(prefix + f"in_proj_{n}.weight") for n in ("qkv", "z")]))
        self.beta_decay_proj = Projection(torch.cat([take(prefix + f"in_proj_{n}.weight") for n in ("b", "a")]))
        # [kernel, C]: tap j of every channel contiguous, so the shifted products vectorize
        self.register_buffer("conv_taps", take(prefix + "conv1d.weight")[:, 0, :].t().contiguous())
        self.register_buffer("dt_bias", take(prefix + "dt_bias").float())
        self.register_buffer("neg_A", -take(prefix + "A_log").float().exp())
        self.register_buffer("norm", take(prefix + "norm.weight"))
        self.out_proj = Projection(take(prefix + "out_proj.weight"))
        self.eps = cfg.rms_norm_eps

    def forward(self, x: Tensor, state: RecurrentLayerState, with_stats: bool) -> tuple[Tensor, DeltaRuleStats | None]:
        B, T, _ = x.shape
        qkv, z = self.in_proj(x).split((self.cfg.conv_dim, self.cfg.value_dim), dim=-1)
        b, a = self.beta_decay_proj(x).chunk(2, dim=-1)
        q, k, v = self._causal_conv(qkv, state)  # [B, T, key_dim] twice, [B, T, value_dim]
        q = l2norm(q.float().view(B, T, self.num_k_heads, self.k_dim))
        k = l2norm(k.float().view(B, T, self.num_k_heads, self.k_dim))
        v = v.reshape(B, T, self.num_v_heads, self.v_dim)
        beta = b.float().sigmoid()
        g = self.neg_A * F.softplus(a.float() + self.dt_bias)  # log-space decay, ≤ 0
        stats = None
        result = None
        if T > 1 and x.is_cuda and fla_usable(x.device):  # fla's kernels take the k heads as they are
            result = fla_chunk_gated_delta_rule(q, k, v, g, beta, state.matrix, with_stats)  # None: they failed
        if result is not None:
            o, final, *stats = result
            state.matrix.copy_(final)
            stats = DeltaRuleStats(*stats) if with_stats else None
            return self._output(o, z, x.dtype), stats
        if self.num_v_heads != self.num_k_heads:  # each q/k head serves consecutive v heads
            groups = self.num_v_heads // self.num_k_heads
            q, k = q.repeat_interleave(groups, dim=2), k.repeat_interleave(groups, dim=2)
        if T == 1:
            step = recurrent_step_gated_delta_rule(
                q=q[:, 0], k=k[:, 0], v=v[:, 0], g=g[:, 0], beta=beta[:, 0], state=state.matrix, with_stats=with_stats
            )
            o, stats = step if with_stats else (step, None)
            o = o[:, None]
        else:
            o, final, *stats = chunk_rule_op(q, k, v, g, beta, state.matrix, GDN_CHUNK_TOKENS, with_stats)
            state.matrix.copy_(final)
            stats = DeltaRuleStats(*stats) if with_stats else None
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

        The delta-rule op reads token-major rows; torch's depthwise conv works channel-major, and
        the transposes around it cost more than the conv itself (2-core Zen 4, 0.8B shape, bf16:
        the whole layer, torch's conv then a transpose 176 ms, shifted products 168 ms, 1,024
        tokens). Each of q, k, v is convolved on its own, and the new window is sliced from qkv
        rather than from window and tokens joined: a compiled step then makes one pass per part
        where it made a copy of qkv and an fp32 copy of the whole conv (2-core Xeon, 0.8B shape,
        bf16, 1,024 tokens, compiled: 6.5 -> 4.0 ms for the conv, q/k norms and gates).
        """
        kernel, T = self.conv_taps.shape[0], qkv.shape[1]
        window = state.shift.transpose(1, 2)  # [B, kernel-1, C]
        bounds = (0, self.key_dim, 2 * self.key_dim, qkv.shape[-1])
        q, k, v = (
            causal_conv_silu(qkv[..., lo:hi], window[..., lo:hi], self.conv_taps[:, lo:hi])
            for lo, hi in zip(bounds, bounds[1:])
        )
        new_window = qkv[:, T - (kernel - 1) :] if T >= kernel - 1 else torch.cat([window, qkv], dim=1)[:, T:]
        state.shift.copy_(new_window.transpose(1, 2))
        return q, k, v


def causal_conv_silu(x: Tensor, window: Tensor, taps: Tensor) -> Tensor:
    """SiLU(depthwise causal conv) of x [B, T, C] after window [B, kernel-1, C]; taps [kernel, C],
    kernel ≥ 2 (Qwen3.5: 4).

    Summed in fp32 as `kernel` shifted products, which a compiled step fuses into one pass: the
    new tokens shifted over zeros, then the window's share added to the first kernel-1 outputs
    (output t < kernel-1 reads window[t + j] through tap j < kernel-1-t).
    """
    kernel, T = taps.shape[0], x.shape[1]
    taps = taps.float()
    padded = F.pad(x, (0, 0, kernel - 1, 0))  # output t reads padded[t : t + kernel]
    out = padded[:, :T].float() * taps[0]
    for j in range(1, kernel):
        out = out + padded[:, j : j + T].float() * taps[j]
    window_share = torch.stack(
        [sum(window[:, t + j].float() * taps[j] for j in range(kernel - 1 - t)) for t in range(kernel - 1)], dim=1
    )
    out = out + F.pad(window_share, (0, 0, 0, T - (kernel - 1)))  # T < kernel-1: cropped
    return F.silu(out).to(x.dtype)


class GatedAttention(nn.Module):
    """Full attention with an output gate, q/k norms, partial rotary and GQA over a KV cache.

    Two steps, `project` and `finish`; the decoder layer calls `attend` between them.
    """

    def __init__(self, cfg: Qwen35Config, take: Take, prefix: str) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        qkv = [take(prefix + f"{n}_proj.weight") for n in ("q", "k", "v")]
        self.split = tuple(w.shape[0] for w in qkv)
        self.qkv_proj = Projection(torch.cat(qkv))
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


@torch.compiler.disable  # the cache's length changes every step: kept out of compiled graphs
def attend(q: Tensor, k: Tensor, v: Tensor, cache: KVCache) -> Tensor:
    """Append k, v [B, H_kv, T, D] to the cache and attend with q [B, H, T, D] → [B, H, T, D],
    laid out token-major in memory ([B, T, H, D] transposed).

    The layout is for the compiled step that reads it next (`finish`): it sees its inputs'
    sizes as symbolic, and a head-major tensor read token-major becomes a scalar loop there
    (0.8B shape, bf16, 1,024 tokens: 11 ms for the gate; a copy here costs well under one).
    """
    T = q.shape[2]
    past = cache.length
    keys, values = cache.append(k, v)
    if T == 1 and q.device.type == "cpu":
        return attend_one_token(q, keys, values, cache.pad)
    if T == 1 and cache.pad is None:
        mask, causal = None, False
    elif past == 0 and cache.pad is None:
        mask, causal = None, True
    elif cache.pad is None and q.device.type == "cpu":
        return token_major(attend_past_then_new(q, keys, values, past))
    else:  # new tokens see the whole cache and, causally, each other; never a row's padding
        key_index = torch.arange(past + T, device=q.device)
        mask = torch.arange(T, device=q.device)[:, None] + past >= key_index[None, :]
        if cache.pad is not None:
            mask = mask & (key_index >= cache.pad[:, None, None, None])  # [B, 1, T, past+T]
        causal = False
    return token_major(F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=causal, enable_gqa=True))


def token_major(x: Tensor) -> Tensor:
    """x [B, H, T, D] with its memory laid out as [B, T, H, D] (a copy unless it already is)."""
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def attend_one_token(q: Tensor, keys: Tensor, values: Tensor, pad: Tensor | None, last: Tensor | None = None) -> Tensor:
    """One query per row, q [B, H, 1, D], over the whole cache [B, H_kv, L, D], in fp32.

    On a CPU torch's flash kernel spends about 1 ms on a single query over 520 keys and 7.5 ms
    over 4,096 (2 KV heads of 256); two small products cost 0.18 and 0.67 ms (measured on a
    2-core Zen 4), with fp32 scores as exact as the math kernel's. Rows left-padded by a stacked
    batch never see their padding (keys before `pad[b]`); with `last` ([1]) keys after it are
    not seen either.
    """
    B, H, _, D = q.shape
    kv_heads, length = keys.shape[1], keys.shape[2]
    grouped = q.reshape(B, kv_heads, H // kv_heads, D).float()  # query head h reads kv head h // group
    scores = torch.matmul(grouped, keys.transpose(-1, -2).float()).mul_(D**-0.5)  # [B, H_kv, group, L]
    if pad is not None:
        scores.masked_fill_(torch.arange(length, device=q.device) < pad[:, None, None, None], float("-inf"))
    if last is not None:
        scores.masked_fill_(torch.arange(length, device=q.device) > last, float("-inf"))
    out = torch.matmul(scores.softmax(dim=-1), values.float())
    return out.reshape(B, H, 1, D).to(q.dtype)


def attend_at_slot(q: Tensor, k: Tensor, v: Tensor, cache: KVCache, slot: Tensor) -> Tensor:
    """One new token per row inside a compiled decode step: write k, v [B, H_kv, 1, D] at
    position `slot` ([1], a tensor, so the step does not depend on the cache's length) and attend
    with q [B, H, 1, D] over the whole buffer, up to the slot → [B, H, 1, D]. The caller has
    reserved the slot; unused positions hold finite values (masked, they weigh 0).
    """
    cache.keys.index_copy_(2, slot, k)
    cache.values.index_copy_(2, slot, v)
    return attend_one_token(q, cache.keys, cache.values, cache.pad, last=slot)


def attend_past_then_new(q: Tensor, keys: Tensor, values: Tensor, past: int) -> Tensor:
    """New tokens q [B, H, T, D] over `past` cached positions, all visible, then over themselves,
    causally (keys, values [B, H_kv, past + T, D]) → [B, H, T, D].

    Two flash-attention calls merged by their log-sum-exps: with an explicit mask instead, torch's
    CPU kernel cannot skip the masked blocks (2 KV heads of 256, 1,536 new tokens: 122 → 96 ms
    after 150 cached ones, 439 → 372 ms after 4,096; measured on a 2-core Zen 4).
    """
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu  # reads H_kv < H heads as GQA
    seen, seen_lse = flash(q, keys[:, :, :past], values[:, :, :past], 0.0, False)[:2]
    new, new_lse = flash(q, keys[:, :, past:], values[:, :, past:], 0.0, True)[:2]
    top = torch.maximum(seen_lse, new_lse)
    seen_weight, new_weight = (seen_lse - top).exp_()[..., None], (new_lse - top).exp_()[..., None]
    merged = seen.float().mul_(seen_weight).add_(new.float().mul_(new_weight))
    return merged.div_(seen_weight + new_weight).to(q.dtype)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the first cos.shape[-1] dims of x [B, H, T, D] (rotate-half layout); leave the rest."""
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = torch.cat([-x_rot[..., half:], x_rot[..., :half]], dim=-1)
    return torch.cat([x_rot * cos + rotated * sin, x_pass], dim=-1)


class MLP(nn.Module):
    """SwiGLU with gate and up fused into one matrix [2I, H]."""

    def __init__(self, take: Take, prefix: str) -> None:
        super().__init__()
        self.gate_up = Projection(torch.cat([take(prefix + "gate_proj.weight"), take(prefix + "up_proj.weight")]))
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
    def __init__(self, cfg: Qwen35Config, take: Take, index: int, fused_experts: bool) -> None:
        super().__init__()
        p = f"layers.{index}."
        self.kind = cfg.layer_types[index]
        if self.kind == "linear_attention":
            self.mixer = GatedDeltaNet(cfg, take, p + "linear_attn.")
        else:
            self.mixer = GatedAttention(cfg, take, p + "self_attn.")
        self.mlp = SparseMoE(cfg, take, p + "mlp.", fused_experts) if cfg.num_experts else MLP(take, p + "mlp.")
        self.register_buffer("input_norm", 1.0 + take(p + "input_layernorm.weight").float())
        self.register_buffer("post_norm", 1.0 + take(p + "post_attention_layernorm.weight").float())
        self.eps = cfg.rms_norm_eps

    def forward(
        self, x: Tensor, layer_state: LayerState, rotary: tuple[Tensor, Tensor], with_stats: bool,
        slot: Tensor | None = None,
    ) -> tuple[Tensor, DeltaRuleStats | None]:
        """One layer over x [B, T, H]. `slot` ([1]): decoding one token inside a compiled step
        that spans the whole model, where the token's keys go (see `attend_at_slot`)."""
        h = rms_norm(x, self.input_norm, self.eps)
        if self.kind == "linear_attention":
            h, stats = self.mixer(h, layer_state, with_stats)
        else:
            # Elsewhere `attend` runs eagerly (the cache grows), so a compiled layer step breaks
            # there. Called here rather than inside the mixer, the step resumes in one graph
            # (output projection, residual, MLP) instead of one per nested call.
            q, k, v, gate = self.mixer.project(h, rotary)
            attended = attend(q, k, v, layer_state) if slot is None else attend_at_slot(q, k, v, layer_state, slot)
            h, stats = self.mixer.finish(attended, gate), None
        x = x + h
        return x + self.mlp(rms_norm(x, self.post_norm, self.eps)), stats


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


class Qwen35Model(nn.Module):
    """Qwen3.5 text model with a recurrent `State`.

    forward(input_ids [B, T], state) -> logits [B, T, vocab]      (advances state)
    prefill(input_ids [B, T], state) -> logits [B, vocab]         (last position only)
    decode(token_ids [B], state)     -> logits [B, vocab]         (one step)
    Set `listener` to receive a `SpanReport` after each call (design §4).
    """

    family = "qwen3_5"

    def __init__(self, cfg: Qwen35Config, take: Take, *, fused_experts: bool = True, int8: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        # int8: each part is quantized as soon as it is built, so the full-precision weights
        # never exist all at once (peak memory: the int8 model plus one part)
        built = _quantized if int8 else (lambda module: module)
        self.embed = built(Projection(take("embed_tokens.weight")))
        self.compute_dtype = self.embed.scale.dtype if int8 else self.embed.weight.dtype
        self.layers = nn.ModuleList(built(DecoderLayer(cfg, take, i, fused_experts)) for i in range(len(cfg.layer_types)))
        self.register_buffer("final_norm", 1.0 + take("norm.weight").float())
        self.lm_head = self.embed if cfg.tie_word_embeddings else built(Projection(take("lm_head.weight")))
        rotary_dim = int(cfg.head_dim * cfg.partial_rotary_factor)
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
        self.register_buffer("inv_freq", inv_freq.to(self.embed.weight.device))
        self.listener: Listener | None = None
        self.compiled: CompiledSteps | None = None  # set by `compile_steps`

    @property
    def dtype(self) -> torch.dtype:
        return self.compute_dtype

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def compile_steps(self) -> bool:
        """Run prefill and decode steps through torch.compile from now on (see `compiled`)."""
        # MoE layers dispatch eagerly: their decode keeps one graph per layer
        return compile_steps(self, _layer_step, _head, None if self.cfg.num_experts else _decode_step)

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

    @torch.no_grad()
    def forward(self, input_ids: Tensor, state: State) -> Tensor:
        hidden, reports = self._blocks(input_ids, state, "prefill")
        logits = self.lm_head(rms_norm(hidden, self.final_norm, self.cfg.rms_norm_eps))
        self._report(reports, state, "prefill", input_ids.shape[1])
        return logits

    @torch.no_grad()
    def prefill(self, input_ids: Tensor, state: State) -> Tensor:
        reports = []
        for start in range(0, input_ids.shape[1], PREFILL_BLOCK_TOKENS):
            hidden, block_reports = self._blocks(input_ids[:, start : start + PREFILL_BLOCK_TOKENS], state, "prefill")
            reports.append(block_reports)
        self._report(merge_block_stats(reports), state, "prefill", input_ids.shape[1])
        return _head(self, hidden[:, -1])

    @torch.no_grad()
    def decode(self, token_ids: Tensor, state: State) -> Tensor:
        if self.compiled is not None and self.compiled.decode_step is not None and token_ids.shape[0] == 1:
            return self._decode_in_one_graph(token_ids, state)
        hidden, reports = self._blocks(token_ids[:, None], state, "decode")
        head = self.compiled.head if self.compiled is not None else _head
        logits = head(self, hidden[:, -1])
        self._report(reports, state, "decode", 1)
        return logits

    def _decode_in_one_graph(self, token_ids: Tensor, state: State) -> Tensor:
        """One token through the compiled step that spans every layer and the head.

        One graph rather than one per layer (and three per attention layer, around the eager
        cache append) saves the calls' overhead. The attention layers write their keys at a slot
        given as a tensor and read their whole buffer, whose length is a dynamic dimension: the
        graph serves every cache length.
        """
        caches = [layer for layer in state.layers if isinstance(layer, KVCache)]
        length = state.kv_tokens
        for cache in caches:
            cache.reserve(length + 1)
            torch._dynamo.mark_dynamic(cache.keys, 2)
            torch._dynamo.mark_dynamic(cache.values, 2)
        slot = torch.tensor([length], device=self.device)
        x = self.embed.rows(token_ids[:, None])
        # Always with the diagnostics: one graph to compile, not two (a first run compiles it
        # in ~50 s on 2 cores), for about 1% of a step when nobody listens.
        logits, stats = self.compiled.decode_step(self, x, state.layers, self._rotary(state, 1), slot, True)
        for cache in caches:
            cache.length = length + 1
        self._advance(state, 1)
        listened = self.listener is not None  # as layer by layer: unread stats are not checked
        reports = [(1, s) if listened and layer.kind == "linear_attention" else None for layer, s in zip(self.layers, stats)]
        self._report(reports, state, "decode", 1)
        return logits

    def _rotary(self, state: State, T: int) -> tuple[Tensor, Tensor]:
        """cos and sin of the next T positions: [T, rot], or [B, 1, T, rot] when rows differ."""
        steps = torch.arange(T, device=self.device)
        if state.row_positions is None:  # every row at the same position: [T, rot]
            positions = (state.position + steps).float()
        else:  # rows that read different lengths: [B, 1, T, rot], broadcast over heads
            positions = (state.row_positions[:, None] + steps)[:, None, :].float()
        freqs = positions[..., None] * self.inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    @staticmethod
    def _advance(state: State, T: int) -> None:
        state.position += T
        if state.row_positions is not None:
            state.row_positions += T

    def _blocks(self, input_ids: Tensor, state: State, phase: str) -> tuple[Tensor, list]:
        """Run every layer over input_ids [B, T]; return the last hidden states and per-layer stats."""
        T = input_ids.shape[1]
        rotary = self._rotary(state, T)
        # prefill always checks the state (cheap per chunk); decode only when someone listens
        with_stats = phase == "prefill" or self.listener is not None
        x = self.embed.rows(input_ids)
        stats: list = []
        step = _layer_step
        if self.compiled is not None:
            step = self.compiled.decode_layer if T == 1 else self.compiled.prefill_layer
        for layer, layer_state in zip(self.layers, state.layers):
            x, layer_stats = step(layer, x, layer_state, rotary, with_stats)
            stats.append((T, layer_stats) if layer.kind == "linear_attention" else None)
        self._advance(state, T)
        return x, stats

    def _report(self, stats: list, state: State, phase: str, tokens: int) -> None:
        report_span(stats, state, phase, tokens, self.listener)


def _quantized(module: nn.Module) -> nn.Module:
    """Weight-only int8: every projection in `module` (the embedding table too) as int8 with
    per-row scales. The experts of an MoE model stay in the model's dtype."""
    for part in module.modules():
        if isinstance(part, Projection):
            part.quantize_int8()
    return module


def _layer_step(layer: DecoderLayer, x: Tensor, layer_state: LayerState, rotary, with_stats: bool):
    return layer(x, layer_state, rotary, with_stats)


def _decode_step(model: Qwen35Model, x: Tensor, layer_states: list, rotary, slot: Tensor, with_stats: bool):
    """Every layer and the head for one token per row → (logits [B, V], per-layer stats)."""
    stats = []
    for layer, layer_state in zip(model.layers, layer_states):
        x, layer_stats = layer(x, layer_state, rotary, with_stats, slot)
        stats.append(layer_stats)
    return _head(model, x[:, -1]), stats


def _head(model: Qwen35Model, hidden: Tensor) -> Tensor:
    """Logits [B, V] of the last hidden states [B, H]."""
    return model.lm_head(rms_norm(hidden, model.final_norm, model.cfg.rms_norm_eps))


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------

TEXT_PREFIXES = ("model.language_model.", "model.", "")  # VLM checkpoint, CausalLM, bare text model
FP32_TENSORS = ("A_log", "dt_bias")  # decay parameters stay fp32 whatever the weight dtype


def build(config: dict, checkpoint, *, device: torch.device, dtype: torch.dtype, quantize: str | None = None) -> Qwen35Model:
    """Build the model from a `Checkpoint`, checking every tensor's name and shape on the way."""
    cfg = Qwen35Config.from_dict(config)
    prefix = next((p for p in TEXT_PREFIXES if p + "embed_tokens.weight" in checkpoint), None)
    if prefix is None:
        raise SummarizeError(f"{checkpoint.folder}: no embed_tokens.weight; not a Qwen3.5 checkpoint")
    fused = not cfg.num_experts or prefix + "layers.0.mlp.experts.gate_up_proj" in checkpoint
    shapes = checkpoint_shapes(cfg, fused_experts=fused)

    def take(name: str) -> Tensor:
        full = name if name == "lm_head.weight" else prefix + name
        tensor = checkpoint.read(full)
        if tuple(tensor.shape) != shapes[name]:
            raise SummarizeError(
                f"{checkpoint.folder}: tensor {full} has shape {tuple(tensor.shape)}, config says {shapes[name]}"
            )
        target = torch.float32 if name.endswith(FP32_TENSORS) else dtype
        return tensor.to(device=device, dtype=target)

    return Qwen35Model(cfg, take, fused_experts=fused, int8=quantize == "int8")
