"""The `summarize` command: parse the options, make one call into the library, map the outcome
to an exit code. Exit codes: 0 all inputs ok, 1 some inputs failed, 2 usage error (found before
anything is read or written), 130 interrupted (Ctrl-C), 143 terminated (SIGTERM).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand
from typer.exceptions import TyperException

from summarize import __version__, batch
from summarize.errors import SummarizeError
from summarize.map_batch import parse_size
from summarize.types import (
    DEFAULT_BATCH_MEMORY,
    DEFAULT_CACHE_SIZE,
    DEFAULT_CHUNK_TOKENS,
    DEFAULT_MODEL,
    DEFAULT_OVERLAP,
    DEFAULT_SPECULATE,
    DEFAULT_STRATEGY,
    DEFAULT_WORDS,
    MAX_CHUNK_TOKENS,
    MAX_OVERLAP_SHARE,
    MAX_SPECULATE,
    MIN_CHUNK_TOKENS,
    STRATEGIES,
    Reporter,
    Settings,
    printable,
)
from summarize.ui import QuietUI, RichUI

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143, what a shell reports for a process SIGTERM ended
DEVICE_KINDS = "cpu, cuda, cuda:N, mps"


# typer offers an Enum's values as the choices: built from STRATEGIES, so they are listed once
Strategy = Enum("Strategy", {name.replace("-", "_"): name for name in STRATEGIES}, type=str)


class DType(str, Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class Quantize(str, Enum):
    int8 = "int8"
    int4 = "int4"


class _OneLineErrors(TyperCommand):
    """Usage errors as one `error: ...` line on stderr (exit 2), instead of a usage panel."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except TyperException as exc:  # typer's (vendored click's) usage errors derive from it
            typer.echo(f"error: {printable(' '.join(exc.format_message().split()))}", err=True)
            code = exc.exit_code
        except typer.Abort:
            code = EXIT_FAILED
        if not standalone_mode:
            return code
        sys.exit(code or EXIT_OK)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so that the same cleanup runs on the way
    out (a half-written output's temporary file is removed)."""


def _print_version(asked: bool) -> None:
    if asked:
        typer.echo(f"summarize {__version__}")
        raise typer.Exit(EXIT_OK)


def _probability(p: float | None) -> float | None:
    """--top-p: 0 < p <= 1."""
    if p is not None and not 0.0 < p <= 1.0:
        raise typer.BadParameter(f"{p} is not in the range 0<x<=1.")
    return p


def _size(text: str | None) -> int | None:
    """--batch-memory, --cache-size: a size such as 1G or 512M."""
    if text is None:
        return None
    try:
        size = parse_size(text)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    if size <= 0:
        raise typer.BadParameter(f"{text} is not a positive size.")
    return size


app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
def summarize(
    inputs: Annotated[list[str] | None, typer.Argument(
        metavar="INPUT", show_default=False,
        help="PDF, .txt or .md files, folders (searched recursively), or - for stdin.")] = None,
    words: Annotated[int, typer.Option(
        "-n", "--words", min=1, help="Target length in words (a CJK character counts as one).")
    ] = DEFAULT_WORDS,
    model: Annotated[str, typer.Option(
        "-m", "--model", envvar="SUMMARIZE_MODEL",
        help="Model: a hub id, a local folder, a .gguf file, or owner/name:QUANT (a GGUF file on the hub).")
    ] = DEFAULT_MODEL,
    output: Annotated[str | None, typer.Option(
        "-o", "--output", metavar="PATH", show_default=False,
        help="Write to this file (one input) or folder (several inputs or a folder) "
             "instead of stdout.")] = None,
    device: Annotated[str | None, typer.Option(
        envvar="SUMMARIZE_DEVICE", show_default=False,
        help="cpu, cuda, cuda:1, ..., mps; one this machine has (default: the best available)")] = None,
    dtype: Annotated[DType | None, typer.Option(
        envvar="SUMMARIZE_DTYPE", show_default=False,
        help="Weight precision (default: the best for the device).")] = None,
    quantize: Annotated[Quantize | None, typer.Option(
        envvar="SUMMARIZE_QUANTIZE", show_default=False,
        help="Store the weights as int8 or int4 (CPU): less memory, faster decoding, slightly other text.")] = None,
    chunk_tokens: Annotated[int | None, typer.Option(
        "--chunk-tokens", min=MIN_CHUNK_TOKENS, max=MAX_CHUNK_TOKENS, show_default=False,
        help=f"Tokens per chunk of the document, {MIN_CHUNK_TOKENS} to {MAX_CHUNK_TOKENS} "
             f"(default {DEFAULT_CHUNK_TOKENS}).")] = None,
    overlap: Annotated[int | None, typer.Option(
        min=0, show_default=False,
        help=f"Tokens shared by consecutive chunks, at most a quarter of --chunk-tokens "
             f"(default {DEFAULT_OVERLAP}).")] = None,
    strategy: Annotated[Strategy, typer.Option(
        help="map-reduce: read each chunk on its own, then merge the notes; "
             "stream: one pass with the state carried across the whole document.")
    ] = Strategy(DEFAULT_STRATEGY),
    focus: Annotated[str | None, typer.Option(
        envvar="SUMMARIZE_FOCUS", show_default=False,
        help="What the summary should concentrate on, e.g. 'risks and costs' (model summaries).")] = None,
    extractive: Annotated[bool, typer.Option(
        "--extractive", help="Pick the document's key sentences; no model needed.")] = False,
    json_lines: Annotated[bool, typer.Option(
        "--json", help="One JSON object per input per line on stdout.")] = False,
    diagnostics_file: Annotated[Path | None, typer.Option(
        "--diagnostics-file", dir_okay=False, show_default=False,
        help="Write per-layer state diagnostics here as JSON lines.")] = None,
    temperature: Annotated[float | None, typer.Option(
        min=0.0, show_default=False, help="Sampling temperature; 0 decodes greedily.")] = None,
    top_k: Annotated[int | None, typer.Option(
        "--top-k", min=1, show_default=False, help="Sample among the k likeliest tokens.")] = None,
    top_p: Annotated[float | None, typer.Option(
        "--top-p", callback=_probability, show_default=False,
        help="Sample from the smallest token set with this much probability.")] = None,
    seed: Annotated[int | None, typer.Option(
        show_default=False, help="Random seed, for repeatable sampling.")] = None,
    speculate: Annotated[int, typer.Option(
        min=0, max=MAX_SPECULATE, envvar="SUMMARIZE_SPECULATE",
        help="Draft up to N tokens per step from the document and verify them in one pass "
             "(the same text, faster where it copies); 0 turns it off.")] = DEFAULT_SPECULATE,
    batch_memory: Annotated[str | None, typer.Option(
        "--batch-memory", metavar="SIZE", envvar="SUMMARIZE_BATCH_MEMORY", show_default=False, callback=_size,
        help="Memory for the states of the chunks read together in map-reduce (default 1G: 8 rows "
             "of a 0.8B model); it bounds the batch whatever the document's length.")] = None,
    no_cache: Annotated[bool, typer.Option(
        "--no-cache", help="Neither reuse nor keep what the model read (chunks' notes, stream states).")] = False,
    cache_dir: Annotated[Path | None, typer.Option(
        "--cache-dir", metavar="DIR", envvar="SUMMARIZE_CACHE_DIR", file_okay=False, show_default=False,
        help="Keep what the model read here (default: $XDG_CACHE_HOME/summarize, else ~/.cache/summarize).")] = None,
    cache_size: Annotated[str | None, typer.Option(
        "--cache-size", metavar="SIZE", envvar="SUMMARIZE_CACHE_SIZE", show_default=False, callback=_size,
        help=f"At most this much kept in the cache; the least recently used goes first "
             f"(default {DEFAULT_CACHE_SIZE // 2**30}G).")] = None,
    password: Annotated[str | None, typer.Option(
        envvar="SUMMARIZE_PASSWORD", show_default=False,
        help="Password for encrypted PDFs; the env var keeps it out of the process list.")
    ] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Rewrite output files even when they are up to date.")] = False,
    quiet: Annotated[bool, typer.Option(
        "-q", "--quiet", help="Say nothing on stderr but errors.")] = False,
    verbose: Annotated[bool, typer.Option(
        "-v", "--verbose", help="Show libraries' warnings and full error details.")] = False,
    pull: Annotated[bool, typer.Option(
        "--pull", help="Download the model (-m) into the local cache ahead of time, then exit.")
    ] = False,
    version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_print_version, help="Print the version, then exit.")] = False,
) -> None:
    """Summarize documents: each INPUT's summary of about N words goes to stdout (or to -o).

    Progress, notes and errors go to stderr, so stdout can be piped.
    """
    if pull:
        raise typer.Exit(_pull(model, quiet=quiet))
    if not inputs:
        raise typer.BadParameter("give at least one INPUT (a file, a folder or -)", param_hint="'INPUT'")
    _check_overlap(overlap, chunk_tokens)
    if device is not None and not extractive:  # an extractive run never needs torch: --device is moot
        _check_device(device)
    if sys.stdout is None and (output is None or json_lines):  # started with stdout closed (`>&-`)
        typer.echo("error: standard output is closed: nowhere to print the summaries "
                   "(-o writes them to files)", err=True)
        raise typer.Exit(EXIT_USAGE)
    settings = Settings(
        words=words, model=model, device=device, dtype=dtype.value if dtype else None,
        quantize=quantize.value if quantize else None, focus=focus, chunk_tokens=chunk_tokens, overlap=overlap, strategy=strategy.value,
        extractive=extractive, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, speculate=speculate,
        batch_memory=batch_memory or DEFAULT_BATCH_MEMORY,
        cache=not no_cache, cache_dir=str(cache_dir) if cache_dir else None, cache_size=cache_size or DEFAULT_CACHE_SIZE,
        diagnostics_file=str(diagnostics_file) if diagnostics_file else None,
        password=password, verbose=verbose,
    )
    ui = QuietUI(verbose=verbose) if quiet else RichUI(verbose=verbose)
    code = _run(inputs, output, settings, ui, force=force, json_lines=json_lines)
    raise typer.Exit(code)


def _check_overlap(overlap: int | None, chunk_tokens: int | None) -> None:
    """--overlap: at most a quarter of the chunk (the summarizer would cut a larger one silently)."""
    chunk = chunk_tokens or DEFAULT_CHUNK_TOKENS
    if overlap is not None and overlap > chunk // MAX_OVERLAP_SHARE:
        raise typer.BadParameter(
            f"{overlap} is more than a quarter of the {chunk}-token chunks; at most {chunk // MAX_OVERLAP_SHARE}",
            param_hint="'--overlap'")


def _check_device(text: str) -> None:
    """--device: a device this torch has, found now rather than once per input after loading."""
    import torch  # only here: --help and extractive runs stay fast

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError) as exc:
        raise typer.BadParameter(f"{text!r} is not a device ({DEVICE_KINDS})", param_hint="'--device'") from exc
    if device.type == "cpu":
        return
    if device.type == "cuda":
        available, count = torch.cuda.is_available(), torch.cuda.device_count()
    elif device.type == "mps":
        available, count = torch.backends.mps.is_available(), 1
    else:
        raise typer.BadParameter(f"{text!r}: only {DEVICE_KINDS} are supported", param_hint="'--device'")
    if not available:
        raise typer.BadParameter(f"{text!r}: this torch sees no {device.type} device", param_hint="'--device'")
    if device.index is not None and device.index >= count:
        raise typer.BadParameter(
            f"{text!r}: there is no such device ({count} {device.type} device(s), numbered from 0)",
            param_hint="'--device'")


def _pull(model: str, *, quiet: bool) -> int:
    """Fetch a hub model with huggingface_hub's progress bars on stderr; a folder or file is just checked."""
    from summarize.engine.gguf_file import GGUFFile
    from summarize.engine.gguf_source import gguf_file_for
    from summarize.engine.loading import read_config, resolve_source

    ui = QuietUI() if quiet else RichUI()
    try:
        where = gguf_file_for(model)  # a GGUF file, downloaded if on the hub
        if where is not None:
            GGUFFile(where)
        else:
            where = resolve_source(model)
            read_config(where)
    except SummarizeError as exc:
        ui.error(str(exc))
        return EXIT_FAILED
    ui.note(f"model {model} is ready in {where}")
    return EXIT_OK


def _run(inputs: list[str], output: str | None, settings: Settings, ui: Reporter, *,
         force: bool, json_lines: bool) -> int:
    try:
        with _library_warnings(shown=settings.verbose), _sigterm_interrupts():
            try:
                plan = batch.plan(inputs, output, diagnostics_file=settings.diagnostics_file)
            except SummarizeError as exc:
                ui.error(str(exc))
                return EXIT_USAGE
            results = batch.run(plan, settings, ui=ui, force=force, json_lines=json_lines)
    except KeyboardInterrupt as exc:
        ui.close()
        terminated = isinstance(exc, Terminated)
        ui.error("terminated" if terminated else "interrupted")
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    except batch.StdoutError as exc:
        ui.close()
        ui.error(str(exc))
        return EXIT_FAILED
    except BrokenPipeError:
        _silence_stdout()  # the reader went away (`| head`): nothing more to say
        return EXIT_FAILED
    except Exception as exc:  # a bug, not a bad input: still one line unless --verbose
        ui.close()
        first_line = next(iter(str(exc).splitlines()), "")
        ui.error(f"unexpected {type(exc).__name__}: {first_line} (--verbose shows details)",
                 exc=exc)
        return EXIT_FAILED
    finally:
        ui.close()
    return EXIT_FAILED if any(r.status == "failed" for r in results) else EXIT_OK


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """While the run lasts, SIGTERM raises Terminated, so it cleans up as Ctrl-C does."""

    def raise_terminated(signum: int, frame: object) -> None:
        raise Terminated

    try:
        previous = signal.signal(signal.SIGTERM, raise_terminated)
    except ValueError:  # not the main thread (a host application's worker): its signals are its own
        yield
        return
    try:
        yield
    finally:  # None: the previous handler was not set from Python; the default is what it did
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


@contextmanager
def _library_warnings(*, shown: bool) -> Iterator[None]:
    """Keep libraries' warnings (pypdf's malformed-file chatter, ...) off stderr unless asked."""
    if shown:
        yield
        return
    previous = logging.root.manager.disable
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.ERROR)
        try:
            yield
        finally:
            logging.disable(previous)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def main() -> None:
    app(prog_name="summarize")
