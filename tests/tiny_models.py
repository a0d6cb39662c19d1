"""Tiny random-weight Qwen3.5 checkpoints, saved by transformers exactly as the hub lays them out.

Every weight is randomised (norm weights, A_log and dt_bias included) so that a convention we get
wrong (zero-centred norms, gate order, head grouping) shows up in the logits.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from qwen_tokenizer import RELEASED_ENV, released_tokenizer_json, tokenizer_json

QWEN_TOKENIZER = tokenizer_json()  # the released ids for every text of the tests (qwen_tokenizer.py)
RELEASED_TOKENIZER = released_tokenizer_json()  # None in a fresh clone
# for tests that count what a random model's text becomes: the small tokenizer's placeholders change it
needs_released_tokenizer = pytest.mark.skipif(RELEASED_TOKENIZER is None, reason=(
    f"needs the released Qwen3.5 tokenizer (counts a random model's text in its words): set {RELEASED_ENV}=PATH/tokenizer.json"))

TEXT_CONFIG = dict(
    vocab_size=384,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,  # ≠ key heads: each k head serves two v heads
    linear_key_head_dim=16,
    linear_value_head_dim=24,  # dk ≠ dv
    linear_conv_kernel_dim=4,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 10_000_000, "partial_rotary_factor": 0.25},
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    tie_word_embeddings=True,
    eos_token_id=2,
)

MOE_CONFIG = dict(
    TEXT_CONFIG,
    num_experts=6,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=40,
    tie_word_embeddings=False,
)


def randomize(model: torch.nn.Module, seed: int = 0) -> None:
    """Every parameter random, in ranges that keep a tiny model numerically tame."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(-1.0, 1.5, generator=gen))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif "norm" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.08)


def dense_reference(**overrides):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**(TEXT_CONFIG | overrides))).float().eval()
    randomize(model)
    return model


def vlm_reference(**overrides):
    """The layout of the released small checkpoints: model.language_model.*, model.visual.*, mtp.*."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4)
    config = Qwen3_5Config(text_config=TEXT_CONFIG | overrides, vision_config=vision, tie_word_embeddings=True)
    model = Qwen3_5ForConditionalGeneration(config).float().eval()
    randomize(model)
    return model


def moe_reference(**overrides):
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    model = Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**(MOE_CONFIG | overrides))).float().eval()
    randomize(model)
    return model


def save_checkpoint(model, folder: Path, *, tokenizer: bool | Path = False, mtp_tensors: bool = False) -> Path:
    """save_pretrained, optionally with the Qwen3.5 tokenizer and extra MTP tensors as released files have."""
    model.save_pretrained(folder, safe_serialization=True)
    if mtp_tensors:
        from safetensors.torch import save_file

        hidden = model.config.get_text_config().hidden_size
        save_file({"mtp.fc.weight": torch.randn(hidden, 2 * hidden), "mtp.norm.weight": torch.randn(hidden)},
                  str(folder / "model-mtp.safetensors"))
    if tokenizer:
        shutil.copy(QWEN_TOKENIZER if tokenizer is True else tokenizer, folder / "tokenizer.json")
        (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [248046, 248044]}))
    return folder


def mtp_reference(model, seed: int = 1):
    """A random multi-token-prediction head for `model`, of transformers' own layers, as released
    checkpoints have one → (the head as a module, its tensors named as in a checkpoint)."""
    from torch import nn

    config = model.config.get_text_config()
    if getattr(config, "num_experts", 0):
        from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeDecoderLayer as Layer
        from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeRMSNorm as Norm
    else:
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer as Layer
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm as Norm
    H, eps = config.hidden_size, config.rms_norm_eps
    head = nn.Module()
    head.fc = nn.Linear(2 * H, H, bias=False)
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        setattr(head, name, Norm(H, eps=eps))
    head.layers = nn.ModuleList([Layer(config, config.layer_types.index("full_attention"))])
    head = head.float().eval()
    randomize(head, seed)
    return head, {f"mtp.{name}": tensor.contiguous() for name, tensor in head.state_dict().items()}


def tiny_released_layout(folder: Path, *, mtp_head: bool = False, tokenizer: Path = QWEN_TOKENIZER) -> Path:
    """A tiny random model laid out like the released small checkpoints, with the Qwen3.5 tokenizer;
    with `mtp_head`, a whole multi-token-prediction head (else a stray part of one)."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4)
    text = TEXT_CONFIG | dict(vocab_size=248320, eos_token_id=248044)
    config = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=True)
    model = Qwen3_5ForConditionalGeneration(config).float().eval()
    randomize(model)
    save_checkpoint(model, folder, tokenizer=tokenizer, mtp_tensors=not mtp_head)
    if mtp_head:
        from safetensors.torch import save_file

        save_file(mtp_reference(model)[1], str(folder / "model-mtp.safetensors"))
    return folder


# -- RWKV-7 --------------------------------------------------------------------------------------

# C = 64, two heads of 32, distinct LoRA ranks and FFN width: a size read from the wrong tensor shows
RWKV_TINY = dict(vocab=512, hidden=64, layers=3, head_size=32, ffn=160, ranks=dict(w=16, a=12, v=8, g=24))


def blinkdl_checkpoint(path: Path, *, vocab: int, hidden: int, layers: int, head_size: int, ffn: int,
                       ranks: dict[str, int], seed: int = 0, extra: dict | None = None) -> Path:
    """A random-weight RWKV-7 with the tensor names and shapes of BlinkDL's released `.pth` files."""
    gen = torch.Generator().manual_seed(seed)
    C, H = hidden, hidden // head_size

    def rand(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen) * scale

    def vec():  # BlinkDL stores per-channel vectors as [1, 1, C]
        return torch.rand(1, 1, C, generator=gen)

    z = {
        "emb.weight": rand(vocab, C),
        "blocks.0.ln0.weight": 1 + rand(C, scale=0.2), "blocks.0.ln0.bias": rand(C, scale=0.1),
        "ln_out.weight": 1 + rand(C, scale=0.2), "ln_out.bias": rand(C, scale=0.1),
        "head.weight": rand(vocab, C, scale=C**-0.5),
    }
    for i in range(layers):
        p, a, f = f"blocks.{i}.", f"blocks.{i}.att.", f"blocks.{i}.ffn."
        for norm in ("ln1", "ln2"):
            z[p + norm + ".weight"], z[p + norm + ".bias"] = 1 + rand(C, scale=0.2), rand(C, scale=0.1)
        for name in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g"):
            z[a + name] = vec()
        for lora in "wavg":  # layer 0 has v0/v1/v2 too in the released files; they are never used
            if lora != "g":
                z[a + lora + "0"] = rand(1, 1, C)
            z[a + lora + "1"] = rand(C, ranks[lora], scale=0.3)
            z[a + lora + "2"] = rand(ranks[lora], C, scale=0.3)
        z[a + "k_k"] = 0.7 + rand(1, 1, C, scale=0.1)
        z[a + "k_a"] = 1 + rand(1, 1, C, scale=0.1)
        z[a + "r_k"] = rand(H, head_size, scale=0.3)
        for name in ("receptance", "key", "value", "output"):
            z[a + name + ".weight"] = rand(C, C, scale=C**-0.5)
        z[a + "ln_x.weight"], z[a + "ln_x.bias"] = 1 + rand(C, scale=0.2), rand(C, scale=0.1)
        z[f + "x_k"] = vec()
        z[f + "key.weight"] = rand(ffn, C, scale=C**-0.5)
        z[f + "value.weight"] = rand(C, ffn, scale=ffn**-0.5)
    z |= extra or {}
    torch.save(z, path)
    return path


def hf_layout(checkpoint: Path, folder: Path) -> Path:
    """The same weights as flash-linear-attention lays them out (config.json + safetensors)."""
    from safetensors.torch import save_file

    from summarize.engine.models.rwkv7 import hf_name

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, tensor in torch.load(checkpoint, weights_only=True).items():
        if name in ("blocks.0.att.v0", "blocks.0.att.v1", "blocks.0.att.v2"):
            continue  # flash-linear-attention's layer 0 has no value-residual LoRA
        stored, transposed = hf_name(name)
        tensor = tensor.t() if transposed else tensor
        if tensor.dim() == 3 and ".attn.x_" not in stored:
            tensor = tensor.reshape(-1)  # [1, 1, C] -> [C], except the time-mix mixing vectors
        tensors[stored] = tensor.contiguous()
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "rwkv7", "norm_eps": 1e-5}))
    return folder


# -- RWKV-6 --------------------------------------------------------------------------------------

# C = 64, two heads of 32, distinct LoRA ranks and FFN width: a size read from the wrong tensor shows
RWKV6_TINY = dict(vocab=512, hidden=64, layers=3, head_size=32, ffn=160, ranks=dict(mix=8, decay=16))
# another head size and other LoRA ranks
RWKV6_TINY_SMALL_HEADS = RWKV6_TINY | dict(head_size=16, ranks=dict(mix=12, decay=24))
# time_decay in [DECAY_LOW, DECAY_HIGH]: per-token decays w = exp(-exp(.)) from 0.998 down to
# exp(-12) and below (the data-dependent LoRA moves them further)
DECAY_LOW, DECAY_HIGH = -6.0, 2.6


def rwkv6_checkpoint(path: Path, *, vocab: int, hidden: int, layers: int, head_size: int, ffn: int,
                     ranks: dict[str, int], seed: int = 0, extra: dict | None = None) -> Path:
    """A random-weight RWKV-6 with the tensor names and shapes of BlinkDL's x060 `.pth` files, in fp32
    (the `rwkv` package folds ln0 into the embedding in the file's dtype: bf16 would differ by ~0.06)."""
    gen = torch.Generator().manual_seed(seed)
    C, H = hidden, hidden // head_size

    def rand(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen) * scale

    def vec():  # BlinkDL stores per-channel vectors as [1, 1, C]
        return torch.rand(1, 1, C, generator=gen)

    z = {
        "emb.weight": rand(vocab, C),
        "blocks.0.ln0.weight": 1 + rand(C, scale=0.2), "blocks.0.ln0.bias": rand(C, scale=0.1),
        "ln_out.weight": 1 + rand(C, scale=0.2), "ln_out.bias": rand(C, scale=0.1),
        "head.weight": rand(vocab, C, scale=C**-0.5),
    }
    for i in range(layers):
        p, a, f = f"blocks.{i}.", f"blocks.{i}.att.", f"blocks.{i}.ffn."
        for norm in ("ln1", "ln2"):
            z[p + norm + ".weight"], z[p + norm + ".bias"] = 1 + rand(C, scale=0.2), rand(C, scale=0.1)
        for name in ("x", "w", "k", "v", "r", "g"):
            z[a + "time_maa_" + name] = vec()
        z[a + "time_maa_w1"] = rand(C, 5 * ranks["mix"], scale=0.3)
        z[a + "time_maa_w2"] = rand(5, ranks["mix"], C, scale=0.3)
        z[a + "time_decay"] = DECAY_LOW + (DECAY_HIGH - DECAY_LOW) * torch.rand(1, 1, C, generator=gen)
        z[a + "time_decay_w1"] = rand(C, ranks["decay"], scale=0.3)
        z[a + "time_decay_w2"] = rand(ranks["decay"], C, scale=0.3)
        z[a + "time_faaaa"] = rand(H, head_size, scale=0.5)
        for name in ("receptance", "key", "value", "gate", "output"):
            z[a + name + ".weight"] = rand(C, C, scale=C**-0.5)
        z[a + "ln_x.weight"], z[a + "ln_x.bias"] = 1 + rand(C, scale=0.2), rand(C, scale=0.1)
        z[f + "time_maa_k"], z[f + "time_maa_r"] = vec(), vec()
        z[f + "key.weight"] = rand(ffn, C, scale=C**-0.5)
        z[f + "receptance.weight"] = rand(C, C, scale=C**-0.5)
        z[f + "value.weight"] = rand(C, ffn, scale=ffn**-0.5)
    z |= extra or {}
    torch.save(z, path)
    return path


def rwkv6_hf_layout(checkpoint: Path, folder: Path, **config) -> Path:
    """The same weights as the Hugging Face RWKV-6 repositories lay them out (their modeling_rwkv6.py's
    names, the `.pth` shapes), with their config.json."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, tensor in torch.load(checkpoint, weights_only=True).items():
        if name == "emb.weight":
            name = "rwkv.embeddings.weight"
        elif name.startswith(("blocks.", "ln_out.")):
            name = "rwkv." + name.replace(".ln0.", ".pre_ln.").replace(".att.", ".attention.").replace(".ffn.", ".feed_forward.")
        tensors[name] = tensor.contiguous()
    save_file(tensors, str(folder / "model.safetensors"))
    hidden = tensors["rwkv.embeddings.weight"].shape[1]
    heads, head_size = tensors["rwkv.blocks.0.attention.time_faaaa"].shape
    (folder / "config.json").write_text(json.dumps({
        "model_type": "rwkv6", "architectures": ["Rwkv6ForCausalLM"], "vocab_size": tensors["head.weight"].shape[0],
        "hidden_size": hidden, "attention_hidden_size": heads * head_size, "head_size": head_size,
        "head_size_divisor": 8, "intermediate_size": tensors["rwkv.blocks.0.feed_forward.key.weight"].shape[0],
        "num_hidden_layers": sum(1 for n in tensors if n.endswith(".ln1.weight")), "layer_norm_epsilon": 1e-5,
        "rescale_every": 6, "tie_word_embeddings": False,
    } | config))
    return folder
