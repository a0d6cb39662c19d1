"""Our engine on a GPU beside transformers, with and without flash-linear-attention's kernels.

    python bench/bench_cuda.py --folder /tmp/qwen3.5-0.8B-random [--json out.json]
    python bench/bench_cuda.py --tiny [--device cpu]   # self-test of the script on a tiny model

Needs CUDA. Prints one markdown table: prefill tok/s at each length for our engine with fla's
kernels (when fla-core is installed), our engine on its torch path, and transformers; greedy
decode tok/s after --decode-prompt tokens (B=1, and our B=--batch aggregate); the peak GPU memory
a prefill allocates beyond the weights; the cost of the per-chunk diagnostics. All in one
process, bf16, on random token ids; `bench/device_check.sh` runs it on a lent GPU.

Method
- Every timing waits for the GPU (torch.cuda.synchronize) before and after the call.
- Each figure: a warm-up call (Triton compiles its kernels on first use), then --repeats rounds
  in which the engines' calls alternate, not always in the same order; the median per engine,
  and ratios as the median of the ratios of calls made in the same round.
- Our torch path: the same model with fla switched off (`ops.gated_delta_rule.fla_usable` patched to False).
- Transformers runs `model(ids, use_cache=True, logits_to_keep=1)` under torch.inference_mode,
  with whatever Gated DeltaNet kernel it picks by itself (fla's when it finds fla installed).
- Peak memory: torch.cuda.max_memory_allocated during a prefill, less what was allocated before
  it (the weights).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import DASH, build_tiny, greedy_token, ours_steps, random_ids, stats_off, transformers_steps  # noqa: E402


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def synced(fn) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def peak_bytes(fn) -> int | None:
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


@contextmanager
def torch_path():
    """Our engine with fla's kernels switched off."""
    from summarize.engine.ops import gated_delta_rule

    original = gated_delta_rule.fla_usable
    gated_delta_rule.fla_usable = lambda device: False
    try:
        yield
    finally:
        gated_delta_rule.fla_usable = original


def rounds(calls: dict, repeats: int) -> dict[str, list[float]]:
    """Alternating timed calls (warm-up first); seconds per engine, one per round."""
    for fn in calls.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for i in range(repeats):
        order = list(calls) if i % 2 == 0 else list(calls)[::-1]
        for name in order:
            times[name].append(synced(calls[name]))
    return times


def measure(args) -> dict:
    from transformers import AutoModelForCausalLM

    from summarize.engine import State, load_model
    from summarize.engine.ops.gated_delta_rule_fla import fla_usable

    cuda = torch.device(args.device)
    dtype = torch.bfloat16
    ours = load_model(args.folder, device=cuda, dtype=dtype)
    with torch.inference_mode():
        ref = AutoModelForCausalLM.from_pretrained(args.folder, dtype=dtype).to(cuda).eval()
    vocab = ours.cfg.vocab_size
    fla = fla_usable(cuda)
    name = torch.cuda.get_device_name() if cuda.type == "cuda" else "CPU"
    out: dict = {"fla": fla, "device": name, "torch": torch.__version__, "prefill": {}}

    def our_prefill(ids, path=nullcontext):
        def call():
            with path():
                ours.prefill(ids, ours.new_state(1))
        return call

    @torch.inference_mode()
    def ref_call(ids):
        return ref(ids, use_cache=True, logits_to_keep=1)

    for length in args.lengths:
        ids = random_ids(vocab, 1, length).to(cuda)
        calls = {"ours_torch": our_prefill(ids, torch_path), "transformers": lambda: ref_call(ids)}
        if fla:
            calls = {"ours_fla": our_prefill(ids)} | calls
        times = rounds(calls, args.repeats)
        row = {name: length / statistics.median(ts) for name, ts in times.items()}
        base = "ours_fla" if fla else "ours_torch"
        row["ratio"] = statistics.median(t / o for o, t in zip(times[base], times["transformers"]))
        row["peak"] = {name: peak_bytes(fn) for name, fn in calls.items()}
        out["prefill"][length] = row

    # decode after a prompt: ours at B=1 and B=batch, transformers at B=1
    prompt = random_ids(vocab, 1, args.decode_prompt).to(cuda)
    state = ours.new_state(1)
    first_token = greedy_token(ours.prefill(prompt, state))
    rows = State.stack([state] * args.batch)
    first = ref_call(prompt)
    tokens = {"ours": first_token, "transformers": greedy_token(first.logits[:, -1])}

    def our_steps():
        tokens["ours"] = ours_steps(ours, state, tokens["ours"], args.decode_tokens)

    def batch_steps():
        ours_steps(ours, rows, first_token.expand(args.batch).contiguous(), args.decode_tokens)

    @torch.inference_mode()
    def ref_steps():
        tokens["transformers"] = transformers_steps(ref, first.past_key_values, tokens["transformers"], args.decode_tokens)

    times = rounds({"ours": our_steps, "transformers": ref_steps, "ours_batch": batch_steps}, args.repeats)
    out["decode"] = {
        "ours": args.decode_tokens / statistics.median(times["ours"]),
        "transformers": args.decode_tokens / statistics.median(times["transformers"]),
        "ours_batch": args.batch * args.decode_tokens / statistics.median(times["ours_batch"]),
        "ratio": statistics.median(t / o for o, t in zip(times["ours"], times["transformers"])),
    }

    # diagnostics: the per-chunk stats off (patched) against the default
    ids = random_ids(vocab, 1, args.lengths[0]).to(cuda)

    def stats_off_prefill():
        with stats_off():
            ours.prefill(ids, ours.new_state(1))

    times = rounds({"default": our_prefill(ids), "off": stats_off_prefill}, max(args.repeats, 5))
    out["diagnostics_cost"] = statistics.median(d / o - 1 for d, o in zip(times["default"], times["off"]))
    return out


def report(args, m: dict) -> None:
    def mib(n: int | None) -> str:
        return DASH if n is None else f"{n / 2**20:,.0f} MiB"

    print(f"\n{m['device']}, torch {m['torch']}, bf16; fla-core kernels for our prefill: {'yes' if m['fla'] else 'not installed'}\n")
    print("| tokens/s | ours (fla) | ours (torch path) | transformers | ours / transformers |")
    print("|---|---|---|---|---|")
    for length, row in m["prefill"].items():
        fla = f"{row['ours_fla']:,.0f}" if "ours_fla" in row else DASH
        print(f"| prefill {length} | {fla} | {row['ours_torch']:,.0f} | {row['transformers']:,.0f} | {row['ratio']:.2f}× |")
    d = m["decode"]
    print(f"| decode after {args.decode_prompt} | | {d['ours']:.1f} | {d['transformers']:.1f} | {d['ratio']:.2f}× |")
    print(f"| decode, {args.batch} rows at once (aggregate) | | {d['ours_batch']:.1f} | | "
          f"{d['ours_batch'] / d['ours']:.2f}× our B=1 |")
    for length, row in m["prefill"].items():
        peak = row["peak"]
        print(f"| peak memory beyond the weights, prefill {length} | {mib(peak.get('ours_fla'))} | "
              f"{mib(peak['ours_torch'])} | {mib(peak['transformers'])} | |")
    print(f"\nDiagnostics (per-chunk stats, prefill {args.lengths[0]}): {100 * m['diagnostics_cost']:+.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, help="random checkpoint of the 0.8B shape (built if missing)")
    parser.add_argument("--tiny", action="store_true", help="a tiny random model: checks the script itself")
    parser.add_argument("--lengths", default="2048,8192")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--decode-prompt", type=int, default=512)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--device", default="cuda", help="cpu only to check the script itself")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("bench_cuda.py: needs a CUDA device")
    args.lengths = [int(n) for n in args.lengths.split(",")]
    if args.tiny:
        args.folder = build_tiny(Path(tempfile.mkdtemp()))
        args.lengths, args.decode_prompt, args.decode_tokens = [64, 256], 64, 8
    elif args.folder is None:
        sys.exit("bench_cuda.py: give --folder (or --tiny)")
    elif not (args.folder / "config.json").is_file():
        from random_checkpoint import build

        build("0.8B", args.folder, torch.bfloat16)
    torch.set_grad_enabled(False)
    m = measure(args)
    report(args, m)
    if args.json:
        args.json.write_text(json.dumps(m, indent=1))


if __name__ == "__main__":
    main()
