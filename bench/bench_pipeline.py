"""The whole job as a user times it: `summarize DOC -n 300`, from the command to the summary.

    python bench/bench_pipeline.py --folder /tmp/qwen3.5-0.8B-random       # the sample and a 100-page book
    python bench/bench_pipeline.py --folder /tmp/qwen3.5-0.8B-random --quick  # the sample only
    python bench/bench_pipeline.py --folder ... --llama-completion BIN --gguf BF16=FILE --gguf Q4_K_M=FILE

Documents:
- sample: samples/target-tier-policy.pdf (13 pages, ~6,900 words);
- book: the first BOOK_WORDS words of *The rustc book* (the book the sample is a chapter of;
  Apache-2.0/MIT, shipped as `share/doc/rust/html/rustc/print.html` with every Rust toolchain's
  docs), typeset by scripts/make_sample_pdf.py into a PDF of 100+ pages. `--book FILE` takes any
  other PDF or text instead.

Settings, each a fresh `summarize` process, run in turns (A B C D A B C D ...), --repeats each, the
median reported:
- before: the job as main ran it before this benchmark: as many chunks per map batch as the old
  rule gave (the rows' states within 8% of the weights' bytes: 2 for the 0.8B shape in bf16), and
  no speculation;
- now: the defaults (8 chunks per batch within --batch-memory 1G; speculation on; --quantize auto:
  an int4 copy to write with where the machine's calibration found it faster);
- now, no speculation: --speculate 0;
- now, int4: --quantize int4;
- now, stream: --strategy stream (one pass, no notes: the summary alone is decoded);
- now, --quantize none, and stream with it: the weights as loaded alone (the default before auto).
Every run is `-n 300 --temperature 0 --json --no-cache` (every chunk read, none taken from the cache)
on the model in --folder, in the machine's dtype.
Random weights never end an answer, so every note runs to its budget (80 words: 144 tokens) and
so does the summary (300 words: 496 tokens); greedy, so a summary that ends in mid-sentence is
not asked for again. What random weights write is no usable summary, so `summarize` falls back to
an extractive one after the model has done all its work: the timings are the model's all the same
(--json keeps them for a fallback). Whether a real model's drafts would be kept as often is not known: the table
gives the share kept, so a reader can weigh the speculative rows.

Per run: wall seconds from the command to its exit; load (model ready: the "ready in N s" note);
prefill, notes (map decode) and summary (merge and reduce decode) seconds from --json's
`phase_seconds` (each step compiles at its first use: the prefill graphs inside prefill, the
decode and verify graphs inside notes and summary); the rest (imports, PDF text, tokenizing) is wall minus those; tokens
in and out; drafts kept; peak RSS (the process's own, from wait4); rows per map batch.

GGUF files (each --gguf NAME=FILE, the same weights converted by llama.cpp's own converter, and
quantized by its llama-quantize): ours reads each file (`-m FILE`, as a llama.cpp or ollama user
would point it at the file they have) as a setting of its own; with --llama-completion, llama.cpp
runs on each file too, in the same turns. llama.cpp's run is what its user would run, the whole
document's text as one prompt and -n the summary's token budget: `llama-completion -m GGUF -f DOC.txt -n 496 -c PROMPT+496 -t THREADS --temp 0
--ignore-eos -no-cnv`, timed the same way (wall and peak RSS). A document longer than the
model's context is cut to it, and the row says so.

The last lines read `pipeline: 100-page X.X s (was Y.Y s, Z.ZZx), sample X.X s (Z.ZZx)`: "now"
against "before"; and, with llama.cpp, per document `against llama.cpp (CPU): ours' best X.X s
(setting) ÷ llama.cpp's best Y.Y s (file) = Z.ZZx`, a speed ratio (above 1: ours is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "target-tier-policy.pdf"
BOOK_WORDS = 28_000  # 105 pages as typeset (code, lists and headings fill pages fast)
WORDS = 300
SUMMARY_TOKENS = int(WORDS * 1.6) + 16  # the summarizer's token budget for 300 words
OLD_SHARE, OLD_PROMPT_TOKENS = 0.08, 256  # the old rule: the rows' states within 8% of the weights' bytes
DASH = "–"
LLAMA = "llama.cpp"  # the rows of its runs begin so


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- the documents ------------------------------------------------------------------------------


class _Text(HTMLParser):
    """The readable text of an mdBook page: paragraphs, headings, list items, code; no scripts."""

    BLOCKS = {"p", "h1", "h2", "h3", "h4", "li", "pre", "tr", "blockquote"}
    HIDDEN = {"script", "style", "nav", "head"}

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.hidden = 0

    def handle_starttag(self, tag, attrs):
        self.hidden += tag in self.HIDDEN
        if tag in self.BLOCKS:
            self.parts.append("\n\n")

    def handle_endtag(self, tag):
        self.hidden -= tag in self.HIDDEN

    def handle_data(self, data):
        if not self.hidden:
            self.parts.append(data)


def rust_book_text(words: int) -> str | None:
    """The first `words` words of the rustc book from the Rust toolchain's docs, or None."""
    try:
        sysroot = subprocess.run(["rustc", "--print", "sysroot"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    page = Path(sysroot) / "share" / "doc" / "rust" / "html" / "rustc" / "print.html"
    if not page.exists():
        return None
    parser = _Text()
    parser.feed(page.read_text(encoding="utf-8"))
    paragraphs = [" ".join(p.split()) for p in "".join(parser.parts).split("\n\n")]
    kept, count = [], 0
    for paragraph in filter(None, paragraphs):
        kept.append(paragraph)
        count += len(paragraph.split())
        if count >= words:
            break
    return "\n\n".join(kept) + "\n"


def make_book(folder: Path, given: str | None) -> Path | None:
    if given:
        return Path(given)
    text = rust_book_text(BOOK_WORDS)
    if text is None:
        log("no Rust toolchain docs (rustc book): the 100-page run is skipped; --book FILE gives one")
        return None
    source, pdf = folder / "rustc-book.txt", folder / "rustc-book.pdf"
    source.write_text(text, encoding="utf-8")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_sample_pdf.py"), str(source), str(pdf)], check=True,
                   stdout=subprocess.DEVNULL)
    return pdf


def pdf_pages(path: Path) -> int | None:
    if path.suffix.lower() != ".pdf":
        return None
    from pypdf import PdfReader

    return len(PdfReader(str(path)).pages)


def plain_text(path: Path, folder: Path) -> Path:
    """The document as the text llama.cpp is given: what summarize extracts from it."""
    out = folder / (path.stem + ".prompt.txt")
    from summarize.inputs.extract import extract_text

    out.write_text(extract_text(str(path)), encoding="utf-8")
    return out


# -- one timed process --------------------------------------------------------------------------


def timed(command: list[str], env: dict | None = None) -> dict:
    """Run `command` to its end: wall seconds, its own peak RSS, its exit code, stdout and stderr."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        return dict(wall=wall, peak_rss=usage.ru_maxrss * 1024, code=process.returncode,
                    stdout=out.read().decode(errors="replace"), stderr=err.read().decode(errors="replace"))


def run_summarize(args, document: Path, extra: list[str]) -> dict | None:
    """`extra` may name another model (`-m FILE.gguf`): the last -m counts."""
    command = [sys.executable, "-m", "summarize", str(document), "-m", args.folder, "-n", str(WORDS),
               "--temperature", "0", "--json", "--no-cache", *extra]
    env = os.environ | {"OMP_NUM_THREADS": str(args.threads)}
    run = timed(command, env)
    if run["code"] != 0:
        log(f"  failed ({run['code']}): {run['stderr'].strip().splitlines()[-1:]}")
        return None
    record = json.loads(run["stdout"].splitlines()[-1])
    if "phase_seconds" not in record:  # random weights' summaries fall back to extractive ones, timed all the same
        log(f"  the model did not run ({record.get('method')}): not a timing of the model")
        return None
    ready = re.search(r"ready in (\d+) s", run["stderr"])
    phases = record["phase_seconds"]
    load = float(ready.group(1)) if ready else None
    return dict(
        wall=run["wall"], load=load, **phases,
        rest=run["wall"] - sum(phases.values()) - (load or 0.0),
        tokens_in=record["tokens_in"], tokens_out=record["tokens_out"],
        kept=record["accepted_tokens"] / record["draft_tokens"] if record["draft_tokens"] else None,
        peak_rss=run["peak_rss"],
    )


def run_llama(args, prompt: Path, gguf: str) -> dict | None:
    n_prompt = len(prompt.read_text(encoding="utf-8").split()) * 2  # a generous token count for -c
    context = min(n_prompt + SUMMARY_TOKENS, args.llama_context)
    command = [args.llama_completion, "-m", gguf, "-f", str(prompt), "-n", str(SUMMARY_TOKENS), "-c", str(context),
               "-t", str(args.threads), "--temp", "0", "--ignore-eos", "-no-cnv"]
    run = timed(command)
    if run["code"] != 0:
        log(f"  llama.cpp failed ({run['code']}): {run['stderr'].strip().splitlines()[-1:]}")
        return None
    prompt_eval = re.search(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens", run["stderr"])
    evaluated = re.search(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs", run["stderr"])
    return dict(
        wall=run["wall"], peak_rss=run["peak_rss"],
        prefill=float(prompt_eval.group(1)) / 1000 if prompt_eval else None,
        summary=float(evaluated.group(1)) / 1000 if evaluated else None,
        tokens_in=int(prompt_eval.group(2)) if prompt_eval else None,
        tokens_out=int(evaluated.group(2)) if evaluated else None,
        cut=n_prompt + SUMMARY_TOKENS > args.llama_context,
    )


# -- the table ----------------------------------------------------------------------------------


def median(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def speedup(now: float | None, was: float | None) -> str:
    return f"{was / now:.2f}x" if now and was else DASH


def cpu_name() -> str:
    """The CPU's model name, as `lscpu` shows it."""
    from summarize.engine.ops.calibration import cpu_model

    return cpu_model()


def fmt(value: float | None, digits: int = 1) -> str:
    return DASH if value is None else f"{value:,.{digits}f}"


def settings(folder: str, ggufs: dict[str, str]) -> tuple[dict[str, list[str]], dict[str, int]]:
    """The settings compared ({name: extra arguments}) and the rows per map batch each runs; one
    more per GGUF file (`ggufs`: name → file), ours reading it."""
    from summarize.engine import load_model
    from summarize.settings import DEFAULT_CHUNK_TOKENS
    from summarize.summarizers.map_rows import MAX_MAP_BATCH, map_batch_size, row_bytes

    model = load_model(folder, device="cpu", compile=False)
    state, weight_bytes = model.new_state(1), sum(b.nbytes for b in model.buffers())
    old_row = state.recurrent_nbytes + state.bytes_per_token * (DEFAULT_CHUNK_TOKENS + OLD_PROMPT_TOKENS)
    old_rows = max(1, min(MAX_MAP_BATCH, int(OLD_SHARE * weight_bytes // old_row)))
    rows = map_batch_size(model, DEFAULT_CHUNK_TOKENS)
    before = ["--batch-memory", str(old_rows * row_bytes(state, DEFAULT_CHUNK_TOKENS)), "--speculate", "0"]
    configs = {
        f"before ({old_rows} rows, no speculation)": before,
        "now (defaults)": [],
        "now, --speculate 0": ["--speculate", "0"],
        "now, --quantize int4": ["--quantize", "int4"],
        "now, --strategy stream": ["--strategy", "stream"],
        "now, --quantize none": ["--quantize", "none"],
        "now, --strategy stream --quantize none": ["--strategy", "stream", "--quantize", "none"],
    } | {f"now, -m {name} GGUF": ["-m", file] for name, file in ggufs.items()}
    return configs, {name: old_rows if name.startswith("before") else rows for name in configs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--folder", required=True, help="a Qwen3.5 checkpoint (bench/random_checkpoint.py 0.8B FOLDER)")
    p.add_argument("--quick", action="store_true", help="the sample only")
    p.add_argument("--book", help="a document of 100+ pages instead of the rustc book")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--only", help="comma-separated setting numbers to run (1-7, then one per --gguf), e.g. 1,2,8")
    p.add_argument("--llama-completion", help="llama.cpp's llama-completion binary (runs on each --gguf)")
    p.add_argument("--gguf", action="append", default=[], metavar="NAME=FILE",
                   help="the same checkpoint converted by llama.cpp's tools, e.g. BF16=q08-bf16.gguf (repeatable)")
    p.add_argument("--llama-context", type=int, default=65536, help="the most context llama.cpp is given")
    args = p.parse_args()
    ggufs = dict(item.split("=", 1) if "=" in item else (Path(item).stem, item) for item in args.gguf)

    work = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    documents = {"sample": SAMPLE}
    book = None if args.quick else make_book(work, args.book)
    if book is not None:
        documents = {"100-page": book} | documents
    configs, rows_per_batch = settings(args.folder, ggufs)
    if args.only:
        keep = {int(i) - 1 for i in args.only.split(",")}
        configs = {name: extra for i, (name, extra) in enumerate(configs.items()) if i in keep}

    results: dict[tuple[str, str], list[dict]] = {}
    for name, path in documents.items():
        pages = pdf_pages(path)
        log(f"{name}: {path} ({pages or '?'} pages)")
        for repeat in range(args.repeats):
            order = list(configs.items()) if repeat % 2 == 0 else list(configs.items())[::-1]  # no setting always first
            for setting, extra in order:
                log(f"  {setting}, run {repeat + 1}")
                run = run_summarize(args, path, extra)
                if run is not None:
                    results.setdefault((name, setting), []).append(run)
            for gguf_name, gguf in ggufs.items() if args.llama_completion else ():
                log(f"  llama.cpp on {gguf_name}, run {repeat + 1}")
                run = run_llama(args, plain_text(path, work), gguf)
                if run is not None:
                    results.setdefault((name, f"{LLAMA} {gguf_name} (whole document, one prompt)"), []).append(run)

    header = ["document", "setting", "wall s", "vs before", "load s", "prefill s", "notes s", "summary s", "other s",
              "tokens in / out", "drafts kept", "peak RSS GB", "rows"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    walls: dict[tuple[str, str], float | None] = {}
    for (name, setting), runs in results.items():
        wall = median(runs, "wall")
        walls[name, setting] = wall
        before = walls.get((name, next(iter(configs))))
        kept = median(runs, "kept")
        rows = rows_per_batch.get(setting, 1)
        note = " (cut to context)" if any(r.get("cut") for r in runs) else ""
        cells = [name + note, setting, fmt(wall), speedup(wall, before),
                 fmt(median(runs, "load")), fmt(median(runs, "prefill")), fmt(median(runs, "notes")),
                 fmt(median(runs, "summary")), fmt(median(runs, "rest")),
                 f"{fmt(median(runs, 'tokens_in'), 0)} / {fmt(median(runs, 'tokens_out'), 0)}",
                 DASH if kept is None else f"{kept:.0%}", fmt(median(runs, "peak_rss") / 1e9, 2), str(rows)]
        print("| " + " | ".join(cells) + " |")
    print(f"\n{args.repeats} runs per setting, median; {args.threads} threads; model {args.folder}; work files in {work}.")

    def pair(name: str) -> tuple[float | None, float | None]:
        """("now (defaults)", "before") walls of a document: – for a setting --only left out."""
        before = next((s for s in configs if s.startswith("before")), None)
        return walls.get((name, "now (defaults)")), walls.get((name, before))

    book_now, book_before = pair("100-page")
    sample_now, sample_before = pair("sample")
    print(f"pipeline: 100-page {fmt(book_now)} s (was {fmt(book_before)} s, {speedup(book_now, book_before)}), "
          f"sample {fmt(sample_now)} s ({speedup(sample_now, sample_before)})")
    for name in documents:
        ours = {s: w for (n, s), w in walls.items() if n == name and not s.startswith(LLAMA) and w is not None}
        theirs = {s: w for (n, s), w in walls.items() if n == name and s.startswith(LLAMA) and w is not None}
        if ours and theirs:
            best, their_best = min(ours, key=ours.get), min(theirs, key=theirs.get)
            print(f"{name} against llama.cpp ({cpu_name()}): ours' best {fmt(ours[best])} s ({best}) ÷ llama.cpp's best "
                  f"{fmt(theirs[their_best])} s ({their_best.removeprefix(LLAMA + ' ')}) = {speedup(ours[best], theirs[their_best])}")


if __name__ == "__main__":
    main()
