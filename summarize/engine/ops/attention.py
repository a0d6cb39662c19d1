"""Attention over a KV cache, in the forms the engine needs: a span and one token; and the rotary
embedding of queries and keys.

Shapes: q [B, H, T, D]; k, v [B, H_kv, T, D] with H a multiple of H_kv (grouped-query attention:
query head h reads key head h // (H / H_kv)); a `KVCache` holds [B, H_kv, capacity, D].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from summarize.engine.state import KVCache


@torch.compiler.disable  # the cache's length changes every step: kept out of compiled graphs
def attend(q: Tensor, k: Tensor, v: Tensor, cache: KVCache) -> Tensor:
    """Append k, v [B, H_kv, T, D] to the cache and attend with q [B, H, T, D] → [B, H, T, D],
    laid out token-major in memory ([B, T, H, D] transposed).

    The layout is for the compiled step that reads it next (`finish`): with symbolic sizes, a
    head-major tensor read token-major becomes a scalar loop there; a copy here costs far less.
    """
    T = q.shape[2]
    past = cache.length
    keys, values = cache.append(k, v)
    hidden = cache.hidden_keys  # [B, past+T] or None
    if T == 1 and q.device.type == "cpu":
        return attend_one_token(q, keys, values, hidden)
    if T == 1 and hidden is None:
        mask, causal = None, False
    elif past == 0 and hidden is None:
        mask, causal = None, True
    elif hidden is None and q.device.type == "cpu":
        return token_major(attend_past_then_new(q, keys, values, past))
    else:  # new tokens see the whole cache and, causally, each other; never a row's hidden positions
        key_index = torch.arange(past + T, device=q.device)
        mask = torch.arange(T, device=q.device)[:, None] + past >= key_index[None, :]
        if hidden is not None:
            mask = mask & ~hidden[:, None, None, :]  # [B, 1, T, past+T]
        causal = False
    return token_major(F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=causal, enable_gqa=True))


def token_major(x: Tensor) -> Tensor:
    """x [B, H, T, D] with its memory laid out as [B, T, H, D] (a copy unless it already is)."""
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def attend_one_token(q: Tensor, keys: Tensor, values: Tensor, hidden: Tensor | None) -> Tensor:
    """One query per row, q [B, H, 1, D], over the whole cache [B, H_kv, L, D].

    The query heads that share a key head are handed to torch's flash kernel as that head's
    queries at once ([B, H_kv, H / H_kv, D]), so each key and value block is read once per group,
    widened to fp32 in cache: one query per head, or the cache widened whole, reads it several
    times over. A row never sees the keys that `hidden` ([B, L] bool) marks.
    """
    B, H, _, D = q.shape
    kv_heads = keys.shape[1]
    grouped = q.reshape(B, kv_heads, H // kv_heads, D)  # query head h reads kv head h // group
    mask = None
    if hidden is not None:
        mask = torch.zeros(B, 1, 1, hidden.shape[1], dtype=q.dtype, device=q.device).masked_fill_(hidden[:, None, None, :], float("-inf"))
    out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(grouped, keys, values, 0.0, False, attn_mask=mask)[0]
    return out.reshape(B, H, 1, D)


def attend_past_then_new(q: Tensor, keys: Tensor, values: Tensor, past: int) -> Tensor:
    """New tokens q [B, H, T, D] over `past` cached positions, all visible, then over themselves,
    causally (keys, values [B, H_kv, past + T, D]) → [B, H, T, D].

    Two flash-attention calls merged by their log-sum-exps: with an explicit mask instead, torch's
    CPU kernel cannot skip the masked blocks.
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
