"""Speed and memory of our engine beside transformers, and beside the machine's own limits.

    python bench/bench_engine.py --folder /tmp/qwen3.5-0.8B-random   # the full run: 0.8B, bf16, fp32, int8, int4
    python bench/bench_engine.py --dtypes bfloat16 --skip-transformers   # our engine only, bf16
    python bench/bench_engine.py --tiny                                 # self-test on a tiny model, < 1 min
    python bench/bench_engine.py --shape mobius --layers 1 --dtypes bfloat16   # RWKV-6 Mobius (12B), its first layer
    python bench/bench_engine.py --folder /tmp/q08 --dtypes bfloat16,int8 \
        --llama-bench ~/llama.cpp/build/bin/llama-bench --gguf bfloat16=/tmp/q08-bf16.gguf --gguf int8=/tmp/q08-q8_0.gguf
    python bench/bench_engine.py --folder /tmp/q08 --dtypes bfloat16 --skip-transformers \
        --ours-gguf Q8_0=/tmp/q08-Q8_0.gguf --ours-gguf Q4_K_M=/tmp/q08-Q4_K_M.gguf   # our engine on GGUF files

Prints one markdown table: prefill tok/s at each length, decode tok/s after a 512-token prompt,
batched decode (aggregate tok/s at B=1 and B=--batch), peak RSS against weight bytes and the cost
of diagnostics, for our engine and for transformers, with their ratios; the ceilings of this
machine measured in the same run, and each of our speeds as a fraction of its ceiling. Progress
goes to stderr, the table to stdout. A measurement that fails (out of memory, say) shows as –.

How long, on the 2-core reference machine (Zen 4), for the full default run (0.8B; bf16 and fp32;
512, 2048 and 8192 tokens; 2 repeats): about 20 minutes. Transformers takes ~8 of them: one of its
8192-token prefills takes ~100 s in fp32 and ~60 s in bf16. Our engine takes up to as long again,
the diagnostics comparison (3 modes × 3 runs of 2048 tokens per dtype) ~1-2 minutes of that.
Building the random checkpoint takes about a minute; with --folder it is kept and reused.
Run it on a quiet machine: shared ones vary by about ±10% from run to run.

Method
- Each measurement runs in a fresh subprocess (this script with --worker), so a peak RSS (the
  child's VmHWM) belongs to one engine at one length, loading included. Both engines run with
  --threads threads (default 2), on random token ids; transformers under torch.inference_mode,
  ours under torch.no_grad as `summarize` runs it (see worker_main). Both flush subnormal values
  to zero, as our engine does when it loads a model: transformers' default leaves them on, which
  made its prefill about half as fast here (its chunked delta rule meets the same tiny decays).
- Prefill: one short warm-up call, then --repeats timed calls on a fresh state; the median.
  Transformers runs `model(ids, use_cache=True, logits_to_keep=1)`.
- Decode: one prompt of --decode-prompt tokens, two warm-up steps, then --repeats runs of
  --decode-tokens greedy steps (the context grows by those few tokens from run to run).
- Prefill and decode steps run as `summarize` runs them: compiled (torch.compile) for a model of
  this size; compiling happens while loading and in the warm-up calls, outside the timings.
- Side by side: both engines loaded into one process, their calls alternating (prefill of
  --diag-length tokens, runs of --decode-tokens steps after --decode-prompt; at least 5 pairs,
  neither engine always first); the ratio is the median of the ratios of calls made back to back.
- int8, int4: weight-only (`--quantize int8`, `--quantize int4`), activations in the dtype
  `summarize` picks on this machine (bf16 with native bf16 matmuls, else fp32; the int4 kernel
  reads them in bf16); transformers has no such rows.
- RWKV-6 (`--shape mobius`, Mobius's 12B shape, written by random_checkpoint.build_rwkv6): our
  engine alone (transformers runs RWKV-6 only through a repository's own code); the
  notes give the state's bytes per sequence, the same for every length.
- GGUF (--ours-gguf KIND=FILE): our engine loading that file, bf16 activations (projections in the
  file's own codes and group scales where a kernel takes them, the rest widened to bf16:
  docs/design.md §9); our rows only, beside
  llama.cpp on the same file with --llama-bench. No diagnostics rows for them.
- Loading: the peak RSS while `load_model` reads the weights (steps compiled only afterwards, as it
  does), over the RSS before it, against the weight bytes it keeps; and its wall time.
- Batched decode: the prompt's state stacked B times (`State.stack`, as batched summaries do).
- Diagnostics: prefill of --diag-length tokens with the per-chunk stats switched off (patched),
  with listener None (the default: cheap stats and a NaN check) and with a no-op listener (full
  SpanReports); decode with listener None (no stats) and with a no-op listener. Interleaved, at
  least 5 runs each; the cost is the median of the ratios of runs made back to back.
- llama.cpp (with --llama-bench and --gguf, the same random weights converted to GGUF: BF16 for
  the bf16 rows, Q8_0 for the int8 ones, Q4_K_M for the int4 ones): each figure is one llama-bench process of its own
  (`-t --threads -r --repeats`, its warm-up run first), the median of its samples. Prefill:
  `-p N -n 0`; decode: `-p 0 -n --decode-tokens -d --decode-prompt` (generation after a prompt of
  that depth); peak RSS: that process's. If a decode after a prompt fails, it is measured once
  more without the prompt, and the cell says so.
- Prefill ceiling = matmul FLOP/s (torch.mm 2048³, measured in our prefill worker just before and
  just after its timed calls, the better of the two: shared machines drift in speed by more than
  the figures measured) / FLOP per token, FLOP per token = 2 ×
  non-embedding weights (active experts only) + attention scores at that length + the head's
  2·V·H once per prompt (prefill computes only the last position's logits). The recurrence's own
  FLOPs are left out, as in the reference figures.
- Decode ceiling = memory GB/s (the best of a few reductions over 512 MiB, or a copy's rate if it
  moves more) / bytes a step reads: every weight it uses (the head included, active experts only),
  the recurrent state read and written, the KV cache.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path

import torch

# a short first call before timing: kernels and allocator warm up, and the prefill graph is built
# for more rows than any projection switches kernels at (int4's 64), as the timed calls read
WARMUP_TOKENS = 96
WARMUP_STEPS = 2
MATMUL_SIZE = 2048
MEMORY_BYTES = 512 * 2**20  # far beyond any L3 cache
CEILING_REPEATS = 5  # ceilings take the best run: they are upper bounds
DIAGNOSTICS_MIN_REPEATS = 5  # differences of a few percent: a few more runs than elsewhere
CHECKPOINT_DTYPE = torch.bfloat16  # as the released checkpoints
GGUF = "gguf-"  # a "dtype" of the run that is our engine on a GGUF file (--ours-gguf)
DASH = "–"

TINY_CONFIG = dict(
    vocab_size=4096,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=4,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 10_000_000, "partial_rotary_factor": 0.25},
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    tie_word_embeddings=True,
)
RWKV_SHAPES = {"mobius": "RWKV-6 Mobius (12B)"}  # shapes our engine runs alone: transformers has no class for them
TINY_DEFAULTS = dict(lengths="64,256", decode_tokens=8, decode_prompt=64, batch=4, diag_length=128)
FULL_DEFAULTS = dict(lengths="512,2048,8192", decode_tokens=32, decode_prompt=512, batch=8, diag_length=2048)


# ---------------------------------------------------------------------------------------------
# Workers: one measurement each, in a fresh process, JSON on stdout
# ---------------------------------------------------------------------------------------------


def peak_rss() -> int:
    """This process's peak RSS in bytes.

    VmHWM rather than ru_maxrss: ru_maxrss survives exec, so a child would start from its
    parent's peak (the conductor's ceiling measurement, a checkpoint build).
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def current_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return peak_rss()


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def greedy_token(logits: torch.Tensor) -> torch.Tensor:
    """The next token of each row, for both engines: as `summarize` picks it (generate.greedy_token)."""
    return logits.max(dim=-1).indices


def random_ids(vocab: int, batch: int, tokens: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, tokens), generator=torch.Generator().manual_seed(tokens))


def model_costs(model) -> dict:
    """What one token costs our model: weight bytes, matmul weights, bytes a decode step reads."""
    if model.family != "qwen3_5":
        return rwkv_costs(model)
    cfg = model.cfg
    tied = model.lm_head is model.embed_tokens
    active = cfg.num_experts_per_tok / cfg.num_experts if cfg.num_experts else 1.0
    seen, weight_bytes, matmul_params, step_bytes = set(), 0, 0.0, 0.0
    for name, buf in model.named_buffers():
        if buf.data_ptr() in seen or name == "inv_freq":
            continue
        seen.add(buf.data_ptr())
        nbytes = buf.numel() * buf.element_size()
        weight_bytes += nbytes
        if name.startswith(("embed_tokens.", "lm_head.")):
            if name.startswith("lm_head.") or tied:  # the head reads all of it; an embedding lookup one row
                step_bytes += nbytes
            continue
        share = active if "experts_" in name else 1.0  # routed experts: only top-k of them run
        if name.endswith(".weight"):  # not int8's scales nor int4's scales and zeros
            matmul_params += buf.numel() * share * (2 if buf.dtype == torch.uint8 else 1)  # int4: two a byte
        step_bytes += nbytes * share
    attention_layers = sum(kind == "full_attention" for kind in cfg.layer_types)
    element = torch.empty((), dtype=model.dtype).element_size()  # the KV cache's
    return dict(
        weight_bytes=weight_bytes,
        matmul_params=matmul_params,
        head_params=cfg.vocab_size * cfg.hidden_size,
        # QKᵀ and PV: 4·heads·head_dim FLOP per earlier token and layer, on average T/2 earlier tokens
        attention_flop_per_token_per_length=2 * cfg.num_attention_heads * cfg.head_dim * attention_layers,
        kv_bytes_per_token=2 * attention_layers * cfg.num_key_value_heads * cfg.head_dim * element,
        recurrent_bytes=model.new_state(1).recurrent_nbytes,
        step_weight_bytes=step_bytes,
    )


def rwkv_costs(model) -> dict:
    """model_costs of an RWKV model: every layer recurrent, no KV cache; the embedding is a lookup."""
    weight_bytes = sum(buf.numel() * buf.element_size() for buf in model.buffers())
    embedding_bytes = model.embedding.numel() * model.embedding.element_size()
    matrices = sum(buf.numel() for name, buf in model.named_buffers()
                   if buf.dim() >= 2 and name not in ("embedding", "head") and not name.endswith((".bonus", ".mix")))
    return dict(
        weight_bytes=weight_bytes,
        matmul_params=matrices,
        head_params=model.head.numel(),
        attention_flop_per_token_per_length=0,
        kv_bytes_per_token=0,
        recurrent_bytes=model.new_state(1).recurrent_nbytes,
        step_weight_bytes=weight_bytes - embedding_bytes,
    )


@contextmanager
def stats_off(family: str):
    """Run the recurrent layers with their per-chunk stats switched off: the no-diagnostics baseline.
    (Their forward takes `with_stats` last: Gated DeltaNet's and RWKV-6's time-mix.)"""
    from summarize.engine.models import qwen3_5, rwkv6

    layer = {"qwen3_5": qwen3_5.GatedDeltaNet, "rwkv6": rwkv6.TimeMix}[family]
    original = layer.forward

    def forward(self, *args):
        return original(self, *args[:-1], False)

    layer.forward = forward
    try:
        yield
    finally:
        layer.forward = original


def ours_steps(model, state, token: torch.Tensor, n: int) -> torch.Tensor:
    """n greedy decode steps of our engine from `token` [B]; returns the last token."""
    for _ in range(n):
        token = greedy_token(model.decode(token, state))
    return token


def transformers_steps(model, cache, token: torch.Tensor, n: int) -> torch.Tensor:
    """n greedy decode steps of transformers from `token` [B] over `cache`; returns the last token."""
    for _ in range(n):
        step = model(token[:, None], past_key_values=cache, use_cache=True, logits_to_keep=1)
        token = greedy_token(step.logits[:, -1])
    return token


QUANTIZED = ("int8", "int4")  # --dtypes that are weight formats
SHORT_DTYPES = {torch.bfloat16: "bf16", torch.float32: "fp32"}


def compute_dtype(name: str) -> torch.dtype:
    """The activations' dtype of a --dtypes entry: quantized weights compute as `summarize` would here."""
    if name in QUANTIZED:
        from summarize.engine.loading import default_dtype

        return default_dtype(torch.device("cpu"))
    return getattr(torch, name)


def ours_worker(args, dtype: torch.dtype) -> dict:
    from summarize.engine import State, load_model
    from summarize.engine.compiled import compile_steps, wanted
    from summarize.engine.ops import calibration

    baseline = current_rss()  # torch and the engine imported, nothing loaded
    quantize = args.dtype if args.dtype in QUANTIZED else None
    started = time.perf_counter()
    model = load_model(args.folder, device="cpu", dtype=dtype, quantize=quantize, compile=False)
    loaded = {"load_s": time.perf_counter() - started, "load_rss": peak_rss()}
    costs = model_costs(model)
    if wanted(model, model.device, costs["weight_bytes"]):  # as load_model would, after the weights
        compile_steps(model)
        model.compiled.prefill_from = 1  # the warm-up below builds the prefill graphs, whatever its length
    vocab = model.cfg.vocab_size
    out: dict = {"costs": costs, "baseline_rss": baseline, "compiled": model.compiled is not None} | loaded
    if args.job == "prefill":
        model.prefill(random_ids(vocab, 1, min(WARMUP_TOKENS, args.length)), model.new_state(1))
        ids = random_ids(vocab, 1, args.length)
        before = matmul_gflops(dtype)
        times = [timed(lambda: model.prefill(ids, model.new_state(1))) for _ in range(args.repeats)]
        out["prefill_s"] = statistics.median(times)
        out["matmul_gflops"] = max(before, matmul_gflops(dtype))  # the machine's rate around these calls
    elif args.job == "decode":
        state = model.new_state(1)
        token = greedy_token(model.prefill(random_ids(vocab, 1, args.decode_prompt), state))
        prompt_state = state.snapshot()
        for batch in sorted({1, args.batch}):
            rows = State.stack([state] * batch)
            first = token.expand(batch).contiguous()
            ours_steps(model, rows, first, WARMUP_STEPS)
            times = [timed(lambda: ours_steps(model, rows, first, args.decode_tokens)) for _ in range(args.repeats)]
            out[f"decode_s_b{batch}"] = statistics.median(times)
            state.restore(prompt_state)
    elif args.job == "diagnostics":
        out.update(diagnostics(model, args))
    out["peak_rss"] = peak_rss()
    out["calibration"] = calibration.LAST.__dict__ if calibration.LAST else None  # what load_model installed
    return out


def diagnostics(model, args) -> dict:
    """Median prefill and decode times with diagnostics off, at their default, and fully on."""
    vocab, noop = model.cfg.vocab_size, lambda report: None
    runs = max(args.repeats, DIAGNOSTICS_MIN_REPEATS)
    ids = random_ids(vocab, 1, args.diag_length)
    modes = {"off": (None, partial(stats_off, model.family)), "default": (None, nullcontext), "listener": (noop, nullcontext)}
    try:  # the patch follows the engine's internals; without it, still compare the other two
        with stats_off(model.family):
            model.prefill(ids[:, :WARMUP_TOKENS], model.new_state(1))
    except Exception as exc:
        log(f"stats could not be switched off ({exc!r}); comparing listener and default only")
        del modes["off"]
    model.prefill(ids[:, :WARMUP_TOKENS], model.new_state(1))
    prefill: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(runs):  # interleaved, so that a slow spell of the machine hits every mode
        for mode, (listener, context) in modes.items():
            model.listener = listener
            with context():
                prefill[mode].append(timed(lambda: model.prefill(ids, model.new_state(1))))
    state = model.new_state(1)
    token = greedy_token(model.prefill(random_ids(vocab, 1, args.decode_prompt), state))

    def steps() -> None:
        ours_steps(model, state, token, args.decode_tokens)

    decode: dict[str, list[float]] = {"default": [], "listener": []}
    for listener in (None, noop):  # a compiled step builds its variant with diagnostics here
        model.listener = listener
        steps()
    for _ in range(runs):
        for mode, listener in (("default", None), ("listener", noop)):
            model.listener = listener
            decode[mode].append(timed(steps))
    model.listener = None
    return {f"prefill_{mode}": times for mode, times in prefill.items()} | {
        f"decode_{mode}": times for mode, times in decode.items()
    }


def transformers_worker(args, dtype: torch.dtype) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.folder, dtype=dtype).eval()
    vocab = model.config.get_text_config().vocab_size
    out: dict = {}
    if args.job == "prefill":
        model(random_ids(vocab, 1, min(WARMUP_TOKENS, args.length)), use_cache=True, logits_to_keep=1)
        ids = random_ids(vocab, 1, args.length)
        times = [timed(lambda: model(ids, use_cache=True, logits_to_keep=1)) for _ in range(args.repeats)]
        out["prefill_s"] = statistics.median(times)
    elif args.job == "decode":
        first = model(random_ids(vocab, 1, args.decode_prompt), use_cache=True, logits_to_keep=1)
        cache, token = first.past_key_values, greedy_token(first.logits[:, -1])
        token = transformers_steps(model, cache, token, WARMUP_STEPS)
        out["decode_s_b1"] = statistics.median(
            timed(lambda: transformers_steps(model, cache, token, args.decode_tokens)) for _ in range(args.repeats)
        )
    out["peak_rss"] = peak_rss()
    return out


def side_by_side_worker(args, dtype: torch.dtype) -> dict:
    """Both engines in one process, their calls alternating: prefill of --diag-length tokens and
    runs of --decode-tokens greedy steps after --decode-prompt, at least DIAGNOSTICS_MIN_REPEATS
    pairs each. A ratio of two calls made back to back is not biased by the machine's drift."""
    from transformers import AutoModelForCausalLM

    from summarize.engine import load_model

    ours = load_model(args.folder, device="cpu", dtype=dtype)
    with torch.inference_mode():
        ref = AutoModelForCausalLM.from_pretrained(args.folder, dtype=dtype).eval()
    vocab = ours.cfg.vocab_size
    prompt, decode_prompt = random_ids(vocab, 1, args.diag_length), random_ids(vocab, 1, args.decode_prompt)
    state = ours.new_state(1)
    with torch.inference_mode():
        first = ref(decode_prompt, use_cache=True, logits_to_keep=1)
    tokens = {"ours": greedy_token(ours.prefill(decode_prompt, state)), "transformers": greedy_token(first.logits[:, -1])}

    def our_decode() -> None:
        tokens["ours"] = ours_steps(ours, state, tokens["ours"], args.decode_tokens)

    @torch.inference_mode()
    def ref_decode() -> None:
        tokens["transformers"] = transformers_steps(ref, first.past_key_values, tokens["transformers"],
                                                    args.decode_tokens)

    @torch.inference_mode()
    def ref_prefill() -> None:
        ref(prompt, use_cache=True, logits_to_keep=1)

    jobs = {
        "prefill": {"ours": lambda: ours.prefill(prompt, ours.new_state(1)), "transformers": ref_prefill},
        "decode": {"ours": our_decode, "transformers": ref_decode},
    }
    out: dict = {}
    for job, engines in jobs.items():
        for fn in engines.values():
            fn()  # warm-up: compiled variants, kernels, the allocator
        times: dict[str, list[float]] = {engine: [] for engine in engines}
        for i in range(max(args.repeats, DIAGNOSTICS_MIN_REPEATS)):
            for engine in (list(engines) if i % 2 == 0 else list(engines)[::-1]):  # neither always first
                times[engine].append(timed(engines[engine]))
        out |= {f"{job}_{engine}": ts for engine, ts in times.items()}
    return out


def worker_main(args) -> None:
    torch.set_flush_denormal(True)  # first: threads take the mode from the main thread as they start
    torch.set_num_threads(args.threads)
    # quantized weights compute in the machine's dtype, as summarize would; GGUF files in bf16
    dtype = torch.bfloat16 if args.dtype.startswith(GGUF) else compute_dtype(args.dtype)
    # Our engine as `summarize` runs it, under no_grad: a model loaded under inference_mode holds
    # inference tensors, with which compiled decode steps run ~25% slower (measured: 51 → 64 ms
    # per step, 0.8B shape). Transformers under inference_mode, its fastest.
    workers = {"ours": ours_worker, "transformers": transformers_worker, "both": side_by_side_worker}
    with torch.inference_mode() if args.worker == "transformers" else torch.no_grad():
        out = workers[args.worker](args, dtype)
    print(json.dumps(out))


# ---------------------------------------------------------------------------------------------
# The conductor: checkpoint, ceilings, one subprocess per measurement, the table
# ---------------------------------------------------------------------------------------------


def build_tiny(folder: Path) -> Path:
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**TINY_CONFIG)).to(CHECKPOINT_DTYPE)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.uniform_(-1.0, 1.5)
            else:
                p.normal_(0.0, 0.1 if "norm" in name or name.endswith("dt_bias") else 0.02)
    model.save_pretrained(folder)
    return folder


def checkpoint(args, scratch: Path) -> Path:
    folder = Path(args.folder) if args.folder else scratch / "checkpoint"
    if (folder / "config.json").is_file():
        log(f"reusing the checkpoint in {folder}")
        return folder
    log(f"building a random-weight {'tiny' if args.tiny else args.shape} checkpoint in {folder}")
    folder.mkdir(parents=True, exist_ok=True)
    if args.tiny:
        return build_tiny(folder)
    from random_checkpoint import build, build_rwkv6

    if args.shape in RWKV_SHAPES:
        return build_rwkv6(folder, CHECKPOINT_DTYPE, args.layers)
    return build(args.shape, folder, CHECKPOINT_DTYPE, args.layers)


def best_time(fn) -> float:
    fn()  # the first call picks kernels and touches memory
    return min(timed(fn) for _ in range(CEILING_REPEATS))


def matmul_gflops(dtype: torch.dtype) -> float:
    """The best rate of torch.mm on two MATMUL_SIZE² matrices in `dtype`, GFLOP/s."""
    a, b = torch.randn(MATMUL_SIZE, MATMUL_SIZE).to(dtype), torch.randn(MATMUL_SIZE, MATMUL_SIZE).to(dtype)
    return 2 * MATMUL_SIZE**3 / best_time(lambda: torch.mm(a, b)) / 1e9


def ceilings() -> dict:
    out = {f"matmul_{name}": matmul_gflops(dtype) for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16))}
    x = torch.ones(MEMORY_BYTES // 4)
    y = torch.empty_like(x)
    # the best of a few reductions: on these machines a bf16 sum streams a little faster than fp32
    readers = (lambda: x.sum(), lambda: x.amax(), lambda: x.view(torch.bfloat16).sum())
    out["read"] = max(MEMORY_BYTES / best_time(read) / 1e9 for read in readers)
    out["copy"] = 2 * MEMORY_BYTES / best_time(lambda: y.copy_(x)) / 1e9
    return out


def machine() -> str:
    model = "unknown CPU"
    try:
        info = Path("/proc/cpuinfo").read_text()
        model = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name"))
        flags = next(line for line in info.splitlines() if line.startswith("flags")).split()
        simd = "AVX-512 bf16" if "avx512_bf16" in flags else "AVX-512" if "avx512f" in flags else "no AVX-512"
        model += ", " + simd + (", AMX bf16" if "amx_bf16" in flags else "")
    except (OSError, StopIteration):
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    cores = len(os.sched_getaffinity(0))
    return (f"{model}; {cores} cores available ({os.cpu_count()} logical); {memory:.0f} GiB; "
            f"Python {platform.python_version()}, torch {torch.__version__}")


def run_worker(args, engine: str, job: str, dtype: str, **extra) -> dict | None:
    """One measurement in a fresh process; None (shown as –) when it fails, e.g. out of memory."""
    settings = dict(folder=args.folder, threads=args.threads, repeats=args.repeats, decode_tokens=args.decode_tokens,
                    decode_prompt=args.decode_prompt, batch=args.batch, diag_length=args.diag_length) | extra
    command = [sys.executable, __file__, "--worker", engine, "--job", job, "--dtype", dtype]
    for key, value in settings.items():
        command += [f"--{key.replace('_', '-')}", str(value)]
    what = f"{engine} {job} {dtype}" + "".join(f" {v}" for v in extra.values())
    log(f"{what} ...")
    start = time.perf_counter()
    env = os.environ | {"OMP_NUM_THREADS": str(args.threads)}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        tail = "\n    ".join(done.stderr.strip().splitlines()[-5:])
        log(f"{what} failed (exit {done.returncode}), shown as {DASH}:\n    {tail}")
        return None
    log(f"{what} done in {time.perf_counter() - start:.0f} s")
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        log(f"{what} printed no result, shown as {DASH}")
        return None


def llama_cpp(args, gguf: str, *, prompt: int, generate: int, depth: int = 0) -> dict | None:
    """One llama-bench test in a process of its own: tok/s (median of its samples) and its peak RSS."""
    command = [args.llama_bench, "-m", gguf, "-t", str(args.threads), "-r", str(args.repeats), "-o", "json",
               "-p", str(prompt), "-n", str(generate), "-d", str(depth)]
    what = f"llama.cpp {Path(gguf).name} -p {prompt} -n {generate} -d {depth}"
    log(f"{what} ...")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            child = subprocess.Popen(command, stdout=out, stderr=err)
        except OSError as e:
            log(f"{what} could not start ({e.strerror}: {args.llama_bench}), shown as {DASH}")
            return None
        _, status, usage = os.wait4(child.pid, 0)  # this child's own peak RSS, not that of all children
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if child.returncode != 0:
        tail = "\n    ".join(stderr.strip().splitlines()[-3:])
        log(f"{what} failed (exit {child.returncode}), shown as {DASH}:\n    {tail}")
        return None
    try:
        samples = json.loads(stdout)[0]["samples_ts"]
    except (json.JSONDecodeError, IndexError, KeyError):
        log(f"{what} printed no result, shown as {DASH}")
        return None
    return {"tok_s": statistics.median(samples), "peak_rss": usage.ru_maxrss * 1024}


def measure_llama_cpp(args, gguf: str, lengths: list[int]) -> dict:
    m: dict = {("prefill", n): llama_cpp(args, gguf, prompt=n, generate=0) for n in lengths}
    m["decode"] = llama_cpp(args, gguf, prompt=0, generate=args.decode_tokens, depth=args.decode_prompt)
    if m["decode"] is None:
        m["decode"] = llama_cpp(args, gguf, prompt=0, generate=args.decode_tokens)
        if m["decode"] is not None:
            m["decode"]["without_prompt"] = True
    return m


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measure(args, dtype: str, lengths: list[int]) -> dict:
    gguf = args.ours_gguf.get(dtype.removeprefix(GGUF)) if dtype.startswith(GGUF) else None
    source = {"folder": gguf} if gguf else {}  # our engine loads the GGUF file instead of the folder
    alone = args.skip_transformers or dtype in QUANTIZED or gguf or args.shape in RWKV_SHAPES
    engines = ["ours"] + ([] if alone else ["transformers"])
    m: dict = {"prefill": {}, "diagnostics": None}
    for engine in engines:
        for length in lengths:
            m["prefill"][engine, length] = run_worker(args, engine, "prefill", dtype, length=length, **source)
        m["decode", engine] = run_worker(args, engine, "decode", dtype, **source)
    if not gguf:
        m["diagnostics"] = run_worker(args, "ours", "diagnostics", dtype)
    if "transformers" in engines:
        m["side_by_side"] = run_worker(args, "both", "side_by_side", dtype)
    llama_file = args.gguf.get(dtype) or gguf
    if args.llama_bench and llama_file:
        m["llama"] = measure_llama_cpp(args, llama_file, lengths)
    return m


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------


def fmt(value: float | None, digits: int = 1) -> str:
    return DASH if value is None else f"{value:,.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    return DASH if a is None or b is None or b == 0 else f"{a / b:.2f}×"


def share(a: float | None, b: float | None) -> str:
    return DASH if a is None or b is None or b == 0 else f"{100 * a / b:.0f}%"


def overhead(on: list[float] | None, off: list[float] | None) -> str:
    """The median over interleaved runs of on / off - 1: each pair ran back to back, so a slow
    spell of the machine divides out rather than landing on one side."""
    if not on or not off:
        return DASH
    return f"{100 * (statistics.median(a / b for a, b in zip(on, off)) - 1):+.1f}%"


def slowdown(short: float | None, long: float | None) -> str:
    return DASH if short is None or long is None else f"{100 * (1 - long / short):.0f}%"


def get(result: dict | None, key: str) -> float | None:
    return None if result is None else result.get(key)


def prefill_flop(costs: dict, length: int) -> float:
    """FLOP per prompt token: weight matmuls, attention scores over the prompt, one head product per prompt."""
    return (2 * costs["matmul_params"] + costs["attention_flop_per_token_per_length"] * length
            + 2 * costs["head_params"] / length)


def memory_gbps(limits: dict) -> float:
    """Streaming rate for the decode ceiling: a machine that copies at X GB/s can also read at X."""
    return max(limits["read"], limits["copy"])


def decode_bytes(costs: dict, context: int) -> float:
    """Bytes one decode step reads: the weights it uses, the recurrent state (read and written), the KV cache."""
    return costs["step_weight_bytes"] + 2 * costs["recurrent_bytes"] + costs["kv_bytes_per_token"] * context


def rows_for(args, dtype: str, m: dict, limits: dict, costs: dict | None, lengths: list[int]) -> list[list[str]]:
    """The table's rows for one dtype: [dtype, figure, ours, transformers, ratio, ceiling, ours / ceiling]."""
    short = {"bfloat16": "bf16", "float32": "fp32"}.get(dtype, dtype)
    if dtype in QUANTIZED:
        short += f" ({SHORT_DTYPES[compute_dtype(dtype)]} compute)"
    if dtype.startswith(GGUF):
        short = f"{dtype.removeprefix(GGUF)} GGUF (bf16 compute)"
    rows: list[list[str]] = []

    llama = m.get("llama", {})

    def row(figure: str, ours: str, ref: str = "", ratio_: str = "", ceiling: str = "", fraction: str = "",
            llama_cell: str = "", llama_ratio: str = "") -> None:
        rows.append([short, figure, ours, ref, ratio_] + ([llama_cell, llama_ratio] if args.llama_bench else [])
                    + [ceiling, fraction])

    def prefill(engine: str, length: int) -> float | None:
        seconds = get(m["prefill"].get((engine, length)), "prefill_s")
        return None if seconds is None else length / seconds

    def decode(engine: str, batch: int) -> float | None:
        seconds = get(m.get(("decode", engine)), f"decode_s_b{batch}")
        return None if seconds is None else batch * args.decode_tokens / seconds

    run_gflops = limits.get(f"matmul_{str(compute_dtype(dtype)).removeprefix('torch.')}")
    for length in lengths:
        ours, ref = prefill("ours", length), prefill("transformers", length)
        gflops = get(m["prefill"].get(("ours", length)), "matmul_gflops") or run_gflops
        ceiling = gflops * 1e9 / prefill_flop(costs, length) if costs and gflops else None
        theirs = get(llama.get(("prefill", length)), "tok_s")
        row(f"prefill {length} tok/s", fmt(ours), fmt(ref), ratio(ours, ref), fmt(ceiling), share(ours, ceiling),
            fmt(theirs) if llama else "", ratio(ours, theirs) if llama else "")
    if len(lengths) > 1:
        first, last = lengths[0], lengths[-1]
        row(f"prefill slowdown {first} → {last}",
            *(slowdown(prefill(e, first), prefill(e, last)) for e in ("ours", "transformers")))

    ours, ref = decode("ours", 1), decode("transformers", 1)
    ceiling = memory_gbps(limits) * 1e9 / decode_bytes(costs, args.decode_prompt) if costs else None
    theirs = get(llama.get("decode"), "tok_s")
    note = " (no prompt)" if (llama.get("decode") or {}).get("without_prompt") else ""
    row(f"decode tok/s (after {args.decode_prompt})", fmt(ours, 2), fmt(ref, 2), ratio(ours, ref), fmt(ceiling, 2),
        share(ours, ceiling), fmt(theirs, 2) + note if llama else "", ratio(ours, theirs) if llama else "")
    batched = decode("ours", args.batch)
    row("batched decode B=1, aggregate tok/s", fmt(ours, 2), DASH)
    row(f"batched decode B={args.batch}, aggregate tok/s (ratio: vs B=1)", fmt(batched, 2), DASH, ratio(batched, ours))

    weights = costs["weight_bytes"] if costs else None

    def cell(rss: float | None) -> str:
        return DASH if rss is None else f"{rss / 1e9:.2f} GB ({ratio(rss, weights)})"
    load = m["prefill"].get(("ours", lengths[0]))
    if load and "load_rss" in load:
        row("load: peak RSS over the RSS before (× our weight bytes); seconds",
            f"{cell(load['load_rss'] - load['baseline_rss'])}; {load['load_s']:.1f} s")
    for length in lengths:
        ours, ref = (get(m["prefill"].get((e, length)), "peak_rss") for e in ("ours", "transformers"))
        theirs = get(llama.get(("prefill", length)), "peak_rss")
        row(f"peak RSS, prefill {length} (× our weight bytes)", cell(ours), cell(ref), ratio(ours, ref), "", "",
            cell(theirs) if llama else "", ratio(ours, theirs) if llama else "")

    pair = m.get("side_by_side")
    if pair:
        for job, figure, count in (("prefill", f"prefill {args.diag_length} tok/s", args.diag_length),
                                   ("decode", f"decode tok/s (after {args.decode_prompt})", args.decode_tokens)):
            ours, ref = (count / statistics.median(pair[f"{job}_{e}"]) for e in ("ours", "transformers"))
            paired = statistics.median(r / o for o, r in zip(pair[f"{job}_ours"], pair[f"{job}_transformers"]))
            row(f"{figure}, side by side in one process ({len(pair[f'{job}_ours'])} pairs)",
                fmt(ours, 2 if job == "decode" else 1), fmt(ref, 2 if job == "decode" else 1), f"{paired:.2f}×")

    d, cost = m["diagnostics"], f"diagnostics cost, prefill {args.diag_length}"
    row(f"{cost}: listener vs none", overhead(get(d, "prefill_listener"), get(d, "prefill_default")))
    row(f"{cost}: none (cheap stats) vs stats off", overhead(get(d, "prefill_default"), get(d, "prefill_off")))
    row("diagnostics cost, decode: listener vs none", overhead(get(d, "decode_listener"), get(d, "decode_default")))
    return rows


def print_calibration(dtype: str, table: dict | None) -> None:
    """The kernel policy our engine took for `dtype` on this machine (`ops/calibration.py`): each
    race, form × rows → each candidate's time and read rate over the model's weights, and the pick."""
    if table is None:
        return
    state = "" if table["complete"] else ", out of time: the rest kept the portable default"
    print(f"\nKernel policy calibrated for {dtype} in {table['seconds']:.1f} s{state}: {table['fields'] or 'no field changed'}.\n")
    print("| decision | rows | candidates: ms (GB/s) | chosen |")
    print("|---|---|---|---|")
    for race in table["races"]:
        times = ", ".join(f"{name} " + (DASH if s is None else f"{s * 1e3:.1f} ({race['bytes'] / s / 1e9:.1f})")
                          for name, s in race["seconds"].items())
        print(f"| {race['decision']} | {race['rows']} | {times} | {race['chosen']} |")


def report(args, lengths: list[int], limits: dict, results: dict) -> None:
    header = ["dtype", "figure", "ours", "transformers", "ours / transformers"]
    header += ["llama.cpp", "ours / llama.cpp"] if args.llama_bench else []
    header += ["ceiling", "ours / ceiling"]
    rows, notes = [], []
    for dtype, m in results.items():
        runs = [*(m["prefill"].get(("ours", n)) for n in lengths), m["decode", "ours"], m["diagnostics"]]
        ours = [r for r in runs if r]
        costs = ours[0]["costs"] if ours else None
        rows += rows_for(args, dtype, m, limits, costs, lengths)
        if costs:
            notes.append(
                f"Model, {dtype}: weights {costs['weight_bytes'] / 1e9:.3f} GB; prefill "
                f"{2 * costs['matmul_params'] / 1e9:.3f} GFLOP/token + attention "
                f"{costs['attention_flop_per_token_per_length'] * 1024 / 1e9:.4f} GFLOP/token per 1K prompt tokens; "
                f"decode reads {decode_bytes(costs, args.decode_prompt) / 1e9:.3f} GB/token; state "
                f"{costs['recurrent_bytes'] / 2**20:.1f} MiB recurrent + {costs['kv_bytes_per_token'] / 1024:.1f} KiB "
                f"KV per token (the recurrent state per sequence, at any length: {costs['recurrent_bytes']:,} bytes); "
                f"our process before loading (torch imported) {ours[0]['baseline_rss'] / 1e9:.2f} GB; "
                f"prefill and decode steps {'compiled' if ours[0].get('compiled') else 'eager'}."
            )
    shape = "tiny" if args.tiny else args.shape + (f" (its first {args.layers} layers)" if args.layers else "")
    if not args.tiny and args.shape in RWKV_SHAPES:
        shape = RWKV_SHAPES[args.shape] + (f" (its first {args.layers} layers)" if args.layers else "")
    else:
        shape = "Qwen3.5 " + shape
    print(f"### {shape}, random weights, {args.threads} threads, median of {args.repeats}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    print(f"Machine: {machine()}; transformers {transformers_version()}.")
    print(f"Ceilings measured in this run: matmul {limits['matmul_float32']:.0f} GFLOP/s fp32, "
          f"{limits['matmul_bfloat16']:.0f} bf16 (torch.mm {MATMUL_SIZE}³); memory read {limits['read']:.1f} GB/s, "
          f"copy {limits['copy']:.1f} GB/s (read + written); the decode ceiling uses {memory_gbps(limits):.1f}.")
    for dtype, m in results.items():
        rates = [get(m["prefill"].get(("ours", n)), "matmul_gflops") for n in lengths]
        if any(rates):
            print(f"Matmul rate around our {dtype} prefills ({', '.join(map(str, lengths))} tokens), the prefill "
                  f"ceilings' basis: {' / '.join(DASH if r is None else f'{r:.0f}' for r in rates)} GFLOP/s.")
    for note in notes:
        print(note)
    for dtype, m in results.items():
        print_calibration(dtype, next((r["calibration"] for r in m["prefill"].values() if r and r.get("calibration")), None))
    if args.ours_gguf:
        print("GGUF files our engine read: " + ", ".join(f"{kind} {path}" for kind, path in args.ours_gguf.items()) + ".")
    if args.llama_bench:
        files = {**args.gguf, **{GGUF + kind: path for kind, path in args.ours_gguf.items()}}
        print(f"llama.cpp: {llama_cpp_version(args.llama_bench)}; GGUF files: "
              + ", ".join(f"{dtype} {path}" for dtype, path in files.items()) + ".")


def llama_cpp_version(binary: str) -> str:
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "version unknown"
    lines = (done.stdout + done.stderr).strip().splitlines()
    return next((line.strip() for line in lines if "build" in line.lower()), "version unknown")


def transformers_version() -> str:
    try:
        import transformers

        return transformers.__version__
    except ImportError:
        return "not installed"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="0.8B", choices=["0.8B", "2B", "35B-A3B", *RWKV_SHAPES],
                   help="a real Qwen3.5 shape, or mobius: RWKV-6 Mobius (12B)")
    p.add_argument("--layers", type=int, help="only the shape's first N layers (for a checkpoint built here)")
    p.add_argument("--tiny", action="store_true", help="a tiny random model and short lengths: a quick self-test")
    p.add_argument("--folder", help="checkpoint folder: reused if it holds config.json, else built there and kept")
    p.add_argument("--dtypes", default="bfloat16,float32,int8,int4", help="int8, int4: quantized weights")
    p.add_argument("--lengths", help=f"prefill lengths (default {FULL_DEFAULTS['lengths']})")
    p.add_argument("--decode-tokens", type=int, help=f"timed decode steps (default {FULL_DEFAULTS['decode_tokens']})")
    p.add_argument("--decode-prompt", type=int, help=f"prompt before decode (default {FULL_DEFAULTS['decode_prompt']})")
    p.add_argument("--batch", type=int, help=f"batched decode rows (default {FULL_DEFAULTS['batch']})")
    p.add_argument("--diag-length", type=int, help=f"diagnostics prefill (default {FULL_DEFAULTS['diag_length']})")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--skip-transformers", action="store_true")
    p.add_argument("--llama-bench", help="a llama-bench binary: llama.cpp's figures beside ours (needs --gguf)")
    p.add_argument("--gguf", action="append", default=[], metavar="DTYPE=FILE",
                   help="the checkpoint converted to GGUF for one of --dtypes (BF16 for bfloat16, Q8_0 for int8, Q4_K_M for int4)")
    p.add_argument("--ours-gguf", action="append", default=[], metavar="KIND=FILE",
                   help="our engine on a GGUF file too (e.g. Q4_K_M=/tmp/q08-Q4_K_M.gguf): rows of their own")
    # internal: one measurement in a subprocess
    p.add_argument("--worker", choices=["ours", "transformers", "both"], help=argparse.SUPPRESS)
    p.add_argument("--job", choices=["prefill", "decode", "diagnostics", "side_by_side"], help=argparse.SUPPRESS)
    p.add_argument("--dtype", help=argparse.SUPPRESS)
    p.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    gguf = dict(item.split("=", 1) for item in args.gguf if "=" in item)
    ours_gguf = dict(item.split("=", 1) for item in args.ours_gguf if "=" in item)
    if len(ours_gguf) != len(args.ours_gguf):
        p.error("--ours-gguf takes KIND=FILE")
    if len(gguf) != len(args.gguf) or (args.llama_bench and not (gguf or ours_gguf)) or (gguf and not args.llama_bench):
        p.error("--llama-bench and --gguf DTYPE=FILE go together")
    args.gguf, args.ours_gguf = gguf, ours_gguf
    if args.shape in RWKV_SHAPES and not args.tiny and not args.worker and set(QUANTIZED) & set(args.dtypes.split(",")):
        log("the Mobius shape is measured in bf16 or fp32 here (its quantized rows are not): int8 and int4 left out")
        args.dtypes = ",".join(d for d in args.dtypes.split(",") if d not in QUANTIZED) or "bfloat16"
    for key, value in (TINY_DEFAULTS if args.tiny else FULL_DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main() -> None:
    args = parse_args()
    if args.worker:
        return worker_main(args)
    torch.set_num_threads(args.threads)
    lengths = [int(n) for n in args.lengths.split(",")]
    dtypes = [d for d in args.dtypes.split(",") if d] + [GGUF + kind for kind in args.ours_gguf]
    start = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    try:
        args.folder = checkpoint(args, scratch)
        log("measuring the machine's ceilings ...")
        limits = ceilings()
        results = {dtype: measure(args, dtype, lengths) for dtype in dtypes}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report(args, lengths, limits, results)
    log(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
