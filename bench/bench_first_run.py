"""The first run on a machine against the next one: how long before the model reads its first chunk.

    python bench/bench_first_run.py --folder /tmp/qwen3.5-0.8B-random [--doc FILE] [--eager]

Runs `summarize DOC -n 300 --temperature 0 --json --no-cache` (the sample PDF by default) in fresh processes
over one inductor cache folder that starts empty (TORCHINDUCTOR_CACHE_DIR, and TMPDIR for the
precompiled header inductor keeps there, in a temporary folder): the first run (cold) compiles,
the second (warm) reads what the first built. `--eager` adds a run with SUMMARIZE_COMPILE=0 for
reference.

Every stderr line is time-stamped as it arrives. "first chunk" is the time from the command to the
note "compiled the prefill step in N s": the prefill graphs are built when the model first reads
a full block, the first chunk's, which it reads right after (without that note, a run that never
compiled: the model's "ready in N s" note). The prefill compile's seconds are inside the prefill
phase; the decode step's graphs are compiled at the first decode of each batch size, inside the
notes and summary phases, whose seconds include them. Random weights never end an
answer: every note and the summary run to their token budgets, and `summarize` then falls back to
an extractive summary (the model's timings are kept in --json).

Last line: `first run: first chunk after X.X s cold (warm Y.Y s), whole job X.X s cold, Y.Y s warm`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "target-tier-policy.pdf"


def timed_lines(command: list[str], env: dict) -> dict:
    """Run `command`: wall seconds, peak RSS, stdout, and its stderr lines with their arrival times."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.PIPE, env=env)
        lines = []
        for raw in process.stderr:
            for line in raw.decode(errors="replace").replace("\r", "\n").splitlines():
                if line.strip():
                    lines.append((time.perf_counter() - started, line))
        _, status, usage = os.wait4(process.pid, 0)
        out.seek(0)
        return dict(wall=time.perf_counter() - started, code=os.waitstatus_to_exitcode(status),
                    peak_rss=usage.ru_maxrss * 1024, stdout=out.read().decode(errors="replace"), lines=lines)


def first(lines: list[tuple[float, str]], pattern: str) -> tuple[float, re.Match] | tuple[None, None]:
    for seconds, line in lines:
        match = re.search(pattern, line)
        if match:
            return seconds, match
    return None, None


def run(args, name: str, env: dict) -> dict:
    command = [sys.executable, "-m", "summarize", str(args.doc), "-m", args.folder, "-n", "300",
               "--temperature", "0", "--json", "--no-cache"]
    print(f"{name}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
    result = timed_lines(command, env)
    if result["code"] != 0:
        sys.exit(f"{name} failed ({result['code']}): {result['lines'][-1:]}")
    record = json.loads(result["stdout"].splitlines()[-1])
    ready_at, _ = first(result["lines"], r"ready in \d+ s")
    compiled_at, compile_s = first(result["lines"], r"compiled the prefill step in (\d+) s")
    _, steps = first(result["lines"], r"\((?:bfloat16|float32|float16)[^)]*\), (.*), ready in")
    steps = steps.group(1) if steps else "?"
    if compile_s:
        steps += f" ({compile_s.group(1)} s prefill compile)"
    return dict(name=name, wall=result["wall"], first_chunk=compiled_at if compiled_at is not None else ready_at,
                peak_rss=result["peak_rss"], phases=record.get("phase_seconds", {}), steps=steps)


def seconds(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "–"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", required=True, help="the model folder (bench/random_checkpoint.py makes one)")
    parser.add_argument("--doc", type=Path, default=SAMPLE)
    parser.add_argument("--eager", action="store_true", help="also a run with SUMMARIZE_COMPILE=0")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as cache:
        env = os.environ | {"TORCHINDUCTOR_CACHE_DIR": cache, "TMPDIR": cache}
        rows.append(run(args, "cold", env))
        rows.append(run(args, "warm", env))
        if args.eager:
            rows.append(run(args, "eager", env | {"SUMMARIZE_COMPILE": "0"}))

    print(f"{args.doc.name}, model {args.folder}")
    print(f"{'run':<6} {'first chunk s':>13} {'prefill s':>9} "
          f"{'notes s':>8} {'summary s':>9} {'wall s':>7} {'peak RSS GB':>11}  steps")
    for row in rows:
        phases = row["phases"]
        print(f"{row['name']:<6} {seconds(row['first_chunk']):>13} {seconds(phases.get('prefill')):>9} {seconds(phases.get('notes')):>8} "
              f"{seconds(phases.get('summary')):>9} {row['wall']:>7.1f} {row['peak_rss'] / 1e9:>11.2f}  {row['steps']}")
    cold, warm = rows[0], rows[1]
    print(f"first run: first chunk after {seconds(cold['first_chunk'])} s cold (warm {seconds(warm['first_chunk'])} s), "
          f"whole job {cold['wall']:.1f} s cold, {warm['wall']:.1f} s warm")


if __name__ == "__main__":
    main()
