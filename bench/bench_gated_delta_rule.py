"""Micro-benchmark: our chunked Gated Delta Rule vs transformers' torch_chunk_gated_delta_rule.

Shape of one Gated DeltaNet layer of Qwen3.5-0.8B (B=1, H=16 value heads, K=V=128), prefill of
T tokens from a random initial state, fp32 and bf16 inputs, on CPU. Not a test: prints a table
(ms per call, best of N; ours includes the diagnostics unless --no-stats).

    python bench/bench_gated_delta_rule.py [--threads 2] [--lengths 512 2048 8192] [--chunk-sizes 32 64 128]
    python bench/bench_gated_delta_rule.py --threads 1 --cpu-time     # steadier on a busy machine
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not
from summarize.engine.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: E402

B, H, K, V = 1, 16, 128, 128
REFERENCE_CHUNK_SIZE = 64  # what transformers uses for Qwen3.5


def make_inputs(T: int, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen)
    a_log = torch.rand(H, generator=gen) * 2.0 - 1.0
    g = -a_log.exp() * F.softplus(torch.randn(B, T, H, generator=gen))
    beta = torch.sigmoid(torch.randn(B, T, H, generator=gen))
    state = torch.randn(B, H, K, V, generator=gen) * 0.1
    out = {name: x.to(dtype) for name, x in dict(q=q, k=k, v=v, g=g, beta=beta).items()}
    out["state"] = state
    return out


def best_times(fns: list, repeats: int, clock=time.perf_counter) -> list[float]:
    """Best time of each function, the functions taking turns so that load changes hit all alike."""
    for fn in fns:
        fn()  # warm-up
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = clock()
            fn()
            best[i] = min(best[i], clock() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--chunk-sizes", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-stats", action="store_true", help="time ours with with_stats=False")
    parser.add_argument(
        "--cpu-time", action="store_true",
        help="process CPU time instead of wall time: steadier on a shared machine; use with --threads 1",
    )
    args = parser.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter

    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # its "falling back to the PyTorch implementation" notice

    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, B={B} H={H} K={K} V={V}, "
        f"{'CPU' if args.cpu_time else 'wall'} time, best of {args.repeats} (half that at T > 2048)"
    )
    ours_cols = [f"ours C={c} (ms)" for c in args.chunk_sizes]
    header = [
        "T", "dtype", f"transformers C={REFERENCE_CHUNK_SIZE} (ms)", *ours_cols,
        "speed-up same C", "speed-up best C",
    ]
    rows = []
    for T in args.lengths:
        repeats = max(2, args.repeats if T <= 2048 else args.repeats // 2)
        for dtype in (torch.float32, torch.bfloat16):
            x = make_inputs(T, dtype)

            def reference():
                torch_chunk_gated_delta_rule(
                    x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"], chunk_size=REFERENCE_CHUNK_SIZE,
                    initial_state=x["state"], output_final_state=True, use_qk_l2norm_in_kernel=False,
                )

            def ours(c):
                return lambda: chunk_gated_delta_rule(
                    q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], initial_state=x["state"],
                    chunk_size=c, with_stats=not args.no_stats,
                )

            t_ref, *t_ours = best_times([reference, *(ours(c) for c in args.chunk_sizes)], repeats, clock)
            name = "fp32" if dtype == torch.float32 else "bf16"
            same = (
                f"{t_ref / t_ours[args.chunk_sizes.index(REFERENCE_CHUNK_SIZE)]:.2f}x"
                if REFERENCE_CHUNK_SIZE in args.chunk_sizes else "-"
            )
            rows.append([str(T), name, f"{t_ref * 1e3:.1f}", *(f"{t * 1e3:.1f}" for t in t_ours),
                         same, f"{t_ref / min(t_ours):.2f}x"])
            print("  ".join(rows[-1]), flush=True)

    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print()
    print(" | ".join(h.rjust(w) for h, w in zip(header, widths)))
    print("-|-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(c.rjust(w) for c, w in zip(r, widths)))


if __name__ == "__main__":
    main()
