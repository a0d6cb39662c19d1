"""Peak memory of whole `summarize` runs: does it stay flat as the document grows?

    python bench/bench_memory.py MODEL_DIR [--small-kb 6] [--large-kb 300] [--chunk-tokens N] [--strategies map-reduce]

Runs the CLI in a fresh process per case (map-reduce and stream, a small and a large text made
from the bundled sample) and prints peak RSS side by side with the ratio large / small. Also
prints the model's load-only peak against its weight bytes.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[1] / "samples" / "target-tier-policy.txt"

LOAD_ONLY = """
import resource, sys, torch
from summarize.engine import load_model
model = load_model(sys.argv[1], device="cpu", dtype=getattr(torch, sys.argv[2]))
seen, weight_bytes = set(), 0
for b in model.buffers():
    if b.data_ptr() not in seen:
        seen.add(b.data_ptr()); weight_bytes += b.numel() * b.element_size()
print(weight_bytes, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def text_of(kb: int) -> str:
    base = SAMPLE.read_text()
    out = []
    while sum(map(len, out)) < kb * 1024:
        out.append(base)
    return "\n\n".join(out)[: kb * 1024]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--small-kb", type=int, default=6)
    parser.add_argument("--large-kb", type=int, default=300)
    parser.add_argument("--chunk-tokens", type=int, default=None)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--strategies", default="map-reduce,stream", help="comma-separated: map-reduce, stream")
    args = parser.parse_args()

    out = subprocess.run([sys.executable, "-c", LOAD_ONLY, args.model, args.dtype], check=True,
                         capture_output=True, text=True).stdout.split()
    weight_bytes, load_peak = int(out[0]), int(out[1])
    print(f"weights {weight_bytes / 2**20:,.0f} MiB; load-only peak RSS {load_peak / 2**20:,.0f} MiB "
          f"({load_peak / weight_bytes:.2f}x weights)")
    print(f"{'strategy':<11} {'text':>7} {'peak RSS MiB':>13} {'seconds':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in args.strategies.split(","):
            peaks = {}
            for kb in (args.small_kb, args.large_kb):
                doc = Path(tmp) / f"{kb}kb.txt"
                doc.write_text(text_of(kb))
                cmd = [sys.executable, "-m", "summarize", str(doc), "-m", args.model, "-n", "100", "-q",
                       "--strategy", strategy, "--dtype", args.dtype, "--no-cache"]
                if args.chunk_tokens:
                    cmd += ["--chunk-tokens", str(args.chunk_tokens)]
                # a fresh interpreter per case, measured through a wrapper so maxima do not mix
                wrapper = [sys.executable, "-c",
                           "import resource,subprocess,sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
                           "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)", *cmd]
                start = time.perf_counter()
                peak = int(subprocess.run(wrapper, check=True, capture_output=True, text=True).stdout)
                peaks[kb] = peak
                print(f"{strategy:<11} {kb:>5}KB {peak / 2**20:>13,.0f} {time.perf_counter() - start:>8.1f}")
            small, large = peaks[args.small_kb], peaks[args.large_kb]
            text_mb = (args.large_kb - args.small_kb) / 1024
            print(f"{strategy:<11} large/small {large / small:.3f}  (+{(large - small) / 2**20:,.0f} MiB; "
                  f"the text itself is {text_mb:.2f} MiB)")


if __name__ == "__main__":
    main()
