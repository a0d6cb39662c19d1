"""Decode speed of whole models side by side: each model's one-row decode after a prompt, in turns.

    python bench/bench_decode.py /tmp/q08 /tmp/q08@int4 /tmp/q08-Q4_K_M.gguf
    python bench/bench_decode.py /tmp/q08 /tmp/q08-Q4_K_M.gguf --llama-bench BIN --gguf /tmp/q08-bf16.gguf \\
        --gguf /tmp/q08-Q4_K_M.gguf

A model is anything `-m` takes (a folder, a GGUF file); `MODEL@int4` or `MODEL@int8` quantizes it
at load, `MODEL@auto` loads it as `summarize` does by default (a bare MODEL: the weights as loaded,
`--quantize none`). Each measurement is a process of its own (`load_model` as `summarize` loads it: compiled,
calibrated), so its peak RSS is that model's: a random prompt of --prompt tokens, 4 untimed steps,
then --steps greedy steps timed. The models take turns for --rounds rounds (A B C A B C), so a
machine whose speed drifts does not favour one. Greedy steps never stop early: the loop runs the
steps it is given whatever the model writes, so random weights time what a released model would.

With --llama-bench, llama.cpp's `llama-bench -p PROMPT -n STEPS -r 2` on each --gguf file, in the
same run: its decode (`tg`, without a prompt) and its prefill (`pp`). The last line gives the
memory's read and copy rates measured in the same run, and the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

WARM_STEPS = 4


def child(model: str, prompt: int, steps: int) -> None:
    """In a process of its own: one model's decode, printed as one JSON line."""
    import torch

    from summarize.engine import load_model

    source, _, quantize = model.partition("@")
    loaded = load_model(source, quantize=quantize or None)
    state = loaded.new_state(1)
    token = loaded.prefill(torch.randint(0, 1000, (1, prompt)), state).argmax(-1)
    for _ in range(WARM_STEPS):
        token = loaded.decode(token, state).argmax(-1)
    started = time.perf_counter()
    for _ in range(steps):
        token = loaded.decode(token, state).argmax(-1)
    print(json.dumps({"tok_s": steps / (time.perf_counter() - started)}))


def measure(model: str, args) -> dict | None:
    command = [sys.executable, __file__, "--child", model, "--prompt", str(args.prompt), "--steps", str(args.steps)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(process.pid, 0)
    out, err = process.stdout.read(), process.stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        print(f"{model}: failed: {err.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return json.loads(out.strip().splitlines()[-1]) | {"peak_rss": usage.ru_maxrss * 1024}


def llama_bench(binary: str, gguf: str, args) -> dict[str, float]:
    """llama-bench's tok/s on `gguf`: {"pp": prefill, "tg": decode}."""
    run = subprocess.run([binary, "-m", gguf, "-p", str(args.prompt), "-n", str(args.steps), "-r", "2", "-t", str(args.threads)],
                         capture_output=True, text=True)
    rates = {}
    for line in run.stdout.splitlines():
        found = re.search(r"\|\s*(pp|tg)\d+\s*\|\s*([\d.]+)", line)
        if found:
            rates[found.group(1)] = float(found.group(2))
    return rates


def memory_rates() -> tuple[float, float]:
    """The best of five reads and five copies of 256 MiB, GB/s (a copy's bytes read and written)."""
    import torch

    a = torch.ones(2**26)
    b = torch.empty_like(a)
    read = copy = 0.0
    for _ in range(5):
        started = time.perf_counter()
        a.sum()
        read = max(read, a.nbytes / (time.perf_counter() - started))
        started = time.perf_counter()
        b.copy_(a)
        copy = max(copy, 2 * a.nbytes / (time.perf_counter() - started))
    return read / 1e9, copy / 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+", help="what -m takes; MODEL@int4, MODEL@int8 or MODEL@auto loads it so (bare: the weights as loaded)")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2, help="llama-bench's threads")
    p.add_argument("--llama-bench", help="llama.cpp's llama-bench binary")
    p.add_argument("--gguf", action="append", default=[], help="a GGUF file for llama-bench (repeatable)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.models[0], args.prompt, args.steps)

    runs: dict[str, list[dict]] = {model: [] for model in args.models}
    for _ in range(args.rounds):
        for model in args.models:
            run = measure(model, args)
            if run is not None:
                runs[model].append(run)
    print(f"| model | decode after {args.prompt} tokens, tok/s, each round | peak RSS GB |")
    print("|---|---|---|")
    for model, done in runs.items():
        rates = " / ".join(f"{run['tok_s']:.1f}" for run in done) or "–"
        rss = " / ".join(f"{run['peak_rss'] / 1e9:.2f}" for run in done) or "–"
        print(f"| {model} | {rates} | {rss} |")
    if args.llama_bench:
        print(f"\n| llama.cpp on | decode tok/s (no prompt) | prefill {args.prompt} tok/s |")
        print("|---|---|---|")
        for gguf in args.gguf:
            rates = llama_bench(args.llama_bench, gguf, args)
            print(f"| {gguf} | {rates.get('tg', '–')} | {rates.get('pp', '–')} |")
    from summarize.engine.ops.calibration import cpu_model

    read, copy = memory_rates()
    print(f"\nmemory: read {read:.1f} GB/s, copy {copy:.1f} GB/s (read + written); {cpu_model()}; {args.steps} steps a run")


if __name__ == "__main__":
    main()
