"""The `summarize` command: parse the options, make one call into the library, map the outcome
to an exit code. Exit codes: 0 all inputs ok, 1 some inputs failed, 2 usage error (found before
anything is read or written), 130 interrupted (Ctrl-C), 143 terminated (SIGTERM).

`summarize plot FILE -o OUT` (`plot` as the first argument) draws a --diagnostics-file instead,
with the same exit codes; a file named `plot` is summarized as `./plot`.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import signal
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand
from typer.exceptions import TyperException

from summarize import __version__
from summarize.cluster import address as cluster
from summarize.errors import SummarizeError, first_line
from summarize.run import local
from summarize.run.plan import plan_jobs
from summarize.settings import (
    DEFAULT_BATCH_MEMORY,
    DEFAULT_CACHE_SIZE,
    DEFAULT_CHUNK_TOKENS,
    DEFAULT_DRAFTS,
    DEFAULT_FORMAT,
    DEFAULT_MAX_INPUT_SIZE,
    DEFAULT_MODEL,
    DEFAULT_OVERLAP,
    DEFAULT_SEED,
    DEFAULT_SPECULATE,
    DEFAULT_STRATEGY,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    DEFAULT_WORDS,
    DRAFT_SOURCES,
    FORMATS,
    MAX_CHUNK_TOKENS,
    MAX_OVERLAP_SHARE,
    MAX_SEED,
    MAX_SPECULATE,
    MAX_WORDS,
    MIN_CHUNK_TOKENS,
    STRATEGIES,
    Settings,
    format_size,
    parse_size,
)
from summarize.summarizers.factory import missing_model_path
from summarize.summarizers.prompts import language_sentence
from summarize.ui.escape import printable
from summarize.ui.reporter import Reporter
from summarize.ui.terminal import QuietUI, RichUI

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143, what a shell reports for a process SIGTERM ended
DEVICE_KINDS = "cpu, cuda, cuda:N, mps"


# typer offers an Enum's values as the choices: built from STRATEGIES, so they are listed once
Strategy = Enum("Strategy", {name.replace("-", "_"): name for name in STRATEGIES}, type=str)
Drafts = Enum("Drafts", {name: name for name in DRAFT_SOURCES}, type=str)
Format = Enum("Format", {name: name for name in FORMATS}, type=str)


class DType(str, Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class Quantize(str, Enum):
    auto = "auto"
    none = "none"
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
        gc.freeze()  # else the interpreter, exiting, walks every object torch and its compiler made
        sys.exit(code or EXIT_OK)


class _SummarizeOrPlot(_OneLineErrors):
    """`plot` as the first argument runs the plot command, anything else summarizes. Chosen where
    the context is made, so that running, --help and shell completion all meet the plot options."""

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        if args[:1] == [PLOT]:
            command = typer.main.get_command(plot_app)
            return command.make_context(f"{info_name} {PLOT}", args[1:], parent=parent, **extra)
        return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx: Any) -> Any:
        return super().invoke(ctx) if ctx.command is self else ctx.command.invoke(ctx)


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


def _positive(value: float | None) -> float | None:
    """--ray-cpus: a finite number more than 0 (a worker's share sets how many fit on the cluster)."""
    if value is not None and not value > 0:
        raise typer.BadParameter(f"{value:g} is not more than 0.")
    if value is not None and value == math.inf:
        raise typer.BadParameter(f"{value:g} is not a finite number.")
    return value


def _finite_nonnegative(value: float | None) -> float | None:
    """--temperature, --ray-gpus: a finite number, 0 or more (inf and nan would reach torch)."""
    if value is not None and not 0 <= value < math.inf:
        raise typer.BadParameter(f"{value:g} is not a finite number >= 0.")
    return value


def _language(text: str | None) -> str | None:
    """--language: the name of a language (prompts.language_sentence says which are)."""
    try:
        language_sentence(text)
    except SummarizeError as exc:
        raise typer.BadParameter(str(exc).removeprefix("--language: ")) from None
    return text


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


PLOT = "plot"
HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}
app = typer.Typer(pretty_exceptions_enable=False)  # with --install-completion and --show-completion
plot_app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command(cls=_SummarizeOrPlot, context_settings=HELP_OPTIONS)
def summarize(
    ctx: typer.Context,
    inputs: Annotated[list[str] | None, typer.Argument(
        metavar="INPUT", show_default=False,
        help="PDF, EPUB, .docx, .html, .txt or .md files, http(s) URLs, folders (searched recursively), or - for stdin.")] = None,
    words: Annotated[int, typer.Option(
        "-n", "--words", min=1, max=MAX_WORDS,
        help="Target length in words (a CJK character counts as one; --cite's citations do not count).",
        rich_help_panel="Output")
    ] = DEFAULT_WORDS,
    model: Annotated[str, typer.Option(
        "-m", "--model", envvar="SUMMARIZE_MODEL",
        help="Model: a hub id, a local folder, a .gguf file, owner/name:QUANT (a GGUF file on the hub), or "
             "ollama:NAME[:TAG] (a model Ollama pulled).",
        rich_help_panel="Model")
    ] = DEFAULT_MODEL,
    output: Annotated[str | None, typer.Option(
        "-o", "--output", metavar="PATH", show_default=False,
        help="Write to this file (one input) or folder (several inputs or a folder) "
             "instead of stdout.",
        rich_help_panel="Output")] = None,
    device: Annotated[str | None, typer.Option(
        envvar="SUMMARIZE_DEVICE", show_default=False,
        help="cpu, cuda, cuda:1, ..., mps; one this machine has (default: the best available)",
        rich_help_panel="Model")] = None,
    dtype: Annotated[DType | None, typer.Option(
        envvar="SUMMARIZE_DTYPE", show_default=False,
        help="Weight precision (default: the best for the device).",
        rich_help_panel="Model")] = None,
    quantize: Annotated[Quantize | None, typer.Option(
        envvar="SUMMARIZE_QUANTIZE", show_default=False,
        help="int8 or int4 (CPU): weights stored so, less memory, faster decoding, slightly other text; "
             "none: as loaded; auto (default): as loaded, plus an int4 copy to write with where this CPU "
             "decodes faster from it.",
        rich_help_panel="Model")] = None,
    chunk_tokens: Annotated[int | None, typer.Option(
        "--chunk-tokens", min=MIN_CHUNK_TOKENS, max=MAX_CHUNK_TOKENS, show_default=False,
        help=f"Tokens per chunk of the document, {MIN_CHUNK_TOKENS} to {MAX_CHUNK_TOKENS} "
             f"(default {DEFAULT_CHUNK_TOKENS}).",
        rich_help_panel="Reading")] = None,
    overlap: Annotated[int | None, typer.Option(
        min=0, show_default=False,
        help=f"Tokens shared by consecutive chunks, at most a quarter of --chunk-tokens "
             f"(default {DEFAULT_OVERLAP}).",
        rich_help_panel="Reading")] = None,
    strategy: Annotated[Strategy, typer.Option(
        help="map-reduce: read each chunk on its own, then merge the notes; "
             "stream: one pass with the state carried across the whole document.",
        rich_help_panel="Reading")
    ] = Strategy(DEFAULT_STRATEGY),
    focus: Annotated[str | None, typer.Option(
        envvar="SUMMARIZE_FOCUS", show_default=False,
        help="What the summary should concentrate on, e.g. 'risks and costs' (model summaries).",
        rich_help_panel="Reading")] = None,
    language: Annotated[str | None, typer.Option(
        "--language", metavar="L", callback=_language, show_default=False,
        help="Write the summary in this language, e.g. French, whatever the document's (model summaries; "
             "the extractive summary cannot translate and says so).",
        rich_help_panel="Output")] = None,
    summary_format: Annotated[Format, typer.Option(
        "--format", help="prose: paragraphs; bullets: one point per line (\"- \"); markdown: a short heading, then bullets.",
        rich_help_panel="Output")] = Format(DEFAULT_FORMAT),
    cite: Annotated[bool, typer.Option(
        "--cite", help="End each sentence with where it comes from: (p. 12–14) in a PDF, (§ Title) under a heading, "
                       "(l. 10–42) in a text file; not counted in -n.",
        rich_help_panel="Output", metavar="")] = False,
    extractive: Annotated[bool, typer.Option(
        "--extractive", help="Pick the document's key sentences; no model needed.",
        rich_help_panel="Reading", metavar="")] = False,
    json_lines: Annotated[bool, typer.Option(
        "--json", help="One JSON object per input per line on stdout.",
        rich_help_panel="Output", metavar="")] = False,
    diagnostics_file: Annotated[Path | None, typer.Option(
        "--diagnostics-file", dir_okay=False, show_default=False,
        help="Write per-layer state diagnostics here as JSON lines.",
        rich_help_panel="Output")] = None,
    temperature: Annotated[float | None, typer.Option(
        callback=_finite_nonnegative, show_default=False,
        help=f"Sampling temperature, a finite number >= 0; 0 decodes greedily (default {DEFAULT_TEMPERATURE}).",
        rich_help_panel="Sampling")] = None,
    top_k: Annotated[int | None, typer.Option(
        "--top-k", min=1, show_default=False, help=f"Sample among the k likeliest tokens (default {DEFAULT_TOP_K}).",
        rich_help_panel="Sampling")] = None,
    top_p: Annotated[float | None, typer.Option(
        "--top-p", callback=_probability, show_default=False,
        help=f"Sample from the smallest token set with this much probability (default {DEFAULT_TOP_P}).",
        rich_help_panel="Sampling")] = None,
    seed: Annotated[int | None, typer.Option(
        min=0, max=MAX_SEED, show_default=False, help=f"Random seed, for repeatable sampling (default {DEFAULT_SEED}).",
        rich_help_panel="Sampling")] = None,
    speculate: Annotated[int, typer.Option(
        min=0, max=MAX_SPECULATE, envvar="SUMMARIZE_SPECULATE",
        help="Draft up to N tokens per step from the document and verify them in one pass "
             "(the same text, faster where it copies); 0 turns it off.",
        rich_help_panel="Sampling")] = DEFAULT_SPECULATE,
    drafts: Annotated[Drafts, typer.Option(
        envvar="SUMMARIZE_DRAFTS",
        help="Where drafted tokens come from: the document, or the model file's multi-token-prediction "
             "head (Qwen3.5 files with mtp.* weights).",
        rich_help_panel="Sampling")] = Drafts(DEFAULT_DRAFTS),
    batch_memory: Annotated[str | None, typer.Option(
        "--batch-memory", metavar="SIZE", envvar="SUMMARIZE_BATCH_MEMORY", show_default=False, callback=_size,
        help="Memory for the states of the chunks read together in map-reduce (default 1G: 8 rows "
             "of a 0.8B model); it bounds the batch whatever the document's length.",
        rich_help_panel="Reading")] = None,
    no_cache: Annotated[bool, typer.Option(
        "--no-cache", help="Neither reuse nor keep what the model read (chunks' notes, stream states).",
        rich_help_panel="Cache", metavar="")] = False,
    cache_dir: Annotated[Path | None, typer.Option(
        "--cache-dir", metavar="DIR", envvar="SUMMARIZE_CACHE_DIR", file_okay=False, show_default=False,
        help="Keep what the model read here (default: $XDG_CACHE_HOME/summarize, else ~/.cache/summarize).",
        rich_help_panel="Cache")] = None,
    cache_size: Annotated[str | None, typer.Option(
        "--cache-size", metavar="SIZE", envvar="SUMMARIZE_CACHE_SIZE", show_default=False, callback=_size,
        help=f"At most this much kept in the cache; the least recently used goes first "
             f"(default {DEFAULT_CACHE_SIZE // 2**30}G).",
        rich_help_panel="Cache")] = None,
    max_input_size: Annotated[str | None, typer.Option(
        "--max-input-size", metavar="SIZE", show_default=False, callback=_size,
        help=f"Read at most this much of one input; a larger one fails alone "
             f"(default {format_size(DEFAULT_MAX_INPUT_SIZE)}).",
        rich_help_panel="Reading")] = None,
    password: Annotated[str | None, typer.Option(
        envvar="SUMMARIZE_PASSWORD", show_default=False,
        help="Password for encrypted PDFs; the env var keeps it out of the process list.",
        rich_help_panel="Reading")
    ] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Rewrite output files even when they are up to date.",
        rich_help_panel="Output", metavar="")] = False,
    quiet: Annotated[bool, typer.Option(
        "-q", "--quiet", help="Say nothing on stderr but errors.",
        rich_help_panel="Output", metavar="")] = False,
    verbose: Annotated[bool, typer.Option(
        "-v", "--verbose", help="Show libraries' warnings and full error details.",
        rich_help_panel="Output", metavar="")] = False,
    ray: Annotated[str | None, typer.Option(
        "--ray", metavar="ADDRESS", callback=_ray_address, show_default=False,
        help="Summarize on a Ray cluster: auto (the running one, or RAY_ADDRESS), local[:N] (start one "
             "with N workers here) or ray://host:port. Needs the ray extra.",
        rich_help_panel="Cluster")] = None,
    ray_cpus: Annotated[float | None, typer.Option(
        "--ray-cpus", callback=_positive, show_default=False,
        help="CPUs each cluster worker reserves (default 1); it holds one model.",
        rich_help_panel="Cluster")] = None,
    ray_gpus: Annotated[float | None, typer.Option(
        "--ray-gpus", callback=_finite_nonnegative, show_default=False,
        help="GPUs each cluster worker reserves (default 0; 0.5 puts two workers on a GPU).",
        rich_help_panel="Cluster")] = None,
    pull: Annotated[bool, typer.Option(
        "--pull", help="Download the model (-m) into the local cache ahead of time, then exit.",
        rich_help_panel="Model", metavar="")
    ] = False,
    version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_print_version, help="Print the version, then exit.", metavar="")] = False,
) -> None:
    """Summarize documents: each INPUT's summary of about N words goes to stdout (or to -o).

    Progress, notes and errors go to stderr, so stdout can be piped.

    summarize plot FILE -o OUT.html draws a --diagnostics-file (summarize plot --help); a file named plot is ./plot.
    """
    if pull:
        raise typer.Exit(_pull(model, quiet=quiet))
    if not inputs:
        raise typer.BadParameter("give at least one INPUT (a file, a folder or -)", param_hint="'INPUT'")
    _check_overlap(overlap, chunk_tokens)
    on_cluster = _cluster_run(ray, ray_cpus, ray_gpus, diagnostics_file)
    # an extractive run never needs torch: --device is moot; on a cluster, the workers' devices count
    if device is not None and not extractive and on_cluster is None:
        _check_device(device)
    if sys.stdout is None and (output is None or json_lines):  # started with stdout closed (`>&-`)
        typer.echo("error: standard output is closed: nowhere to print the summaries "
                   "(-o writes them to files)", err=True)
        raise typer.Exit(EXIT_USAGE)
    # only the default model may fall back to an extractive summary; one the user named must be found
    source = ctx.get_parameter_source("model")  # typer's vendored click: compared by name
    model_named = source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")
    if model_named and not extractive and on_cluster is None:
        if model.startswith("ollama:"):  # its store is read now: a missing model is said before any work
            _check_ollama_model(model)
        elif problem := missing_model_path(model):
            raise typer.BadParameter(problem.removeprefix(f"-m {model}: ") + f": {model}", param_hint="'-m'")
    settings = Settings(
        words=words, model=model, model_fallback=not model_named, device=device, dtype=dtype.value if dtype else None,
        quantize=quantize.value if quantize and quantize != Quantize.auto else None,
        focus=focus, language=language, format=summary_format.value, cite=cite,
        chunk_tokens=chunk_tokens, overlap=overlap, strategy=strategy.value,
        extractive=extractive, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, speculate=speculate,
        drafts=drafts.value,
        batch_memory=batch_memory or DEFAULT_BATCH_MEMORY,
        max_input_size=max_input_size or DEFAULT_MAX_INPUT_SIZE,
        cache=not no_cache, cache_dir=str(cache_dir) if cache_dir else None, cache_size=cache_size or DEFAULT_CACHE_SIZE,
        diagnostics_file=str(diagnostics_file) if diagnostics_file else None,
        password=password, verbose=verbose,
    )
    ui = QuietUI(verbose=verbose) if quiet else RichUI(verbose=verbose)
    if extractive and diagnostics_file is not None:  # else the file's absence would go unexplained
        ui.note(f"--diagnostics-file {diagnostics_file}: an extractive summary reads no model state; "
                "nothing is written there")
    code = _run(inputs, output, settings, ui, force=force, json_lines=json_lines, on_cluster=on_cluster)
    raise typer.Exit(code)


@plot_app.command(context_settings=HELP_OPTIONS)
def plot(
    diagnostics: Annotated[Path, typer.Argument(
        metavar="FILE", show_default=False, help="A --diagnostics-file (JSON lines).")],
    output: Annotated[Path, typer.Option(
        "-o", "--output", metavar="PATH", show_default=False,
        help="The picture: .html (a page) or .svg; it opens offline.")],
) -> None:
    """Draw a --diagnostics-file as heatmaps of layers × spans: state_norm, gate_mean and
    delta_norm, in prefill (by chunk) and decode (by step), for each input."""
    from summarize.diagnostics.plot import FORMATS, write_plot

    if output.suffix.lower() not in FORMATS:
        raise typer.BadParameter(f"{output} is neither .html nor .svg", param_hint="'-o'")
    if output.exists() and diagnostics.exists() and output.samefile(diagnostics):
        raise typer.BadParameter(f"{output} is the diagnostics file itself", param_hint="'-o'")
    try:
        with _sigterm_interrupts():
            write_plot(diagnostics, output)
    except SummarizeError as exc:
        typer.echo(f"error: {printable(str(exc))}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    except KeyboardInterrupt as exc:
        message, code = _interruption(exc)
        typer.echo(f"error: {message}", err=True)
        raise typer.Exit(code) from None


def _ray_address(text: str | None) -> cluster.ClusterAddress | None:
    """--ray: auto, local[:N] or ray://host:port."""
    if text is None:
        return None
    try:
        return cluster.parse_address(text)
    except cluster.ClusterError as exc:
        raise typer.BadParameter(str(exc)) from None


def _cluster_run(address: cluster.ClusterAddress | None, cpus: float | None, gpus: float | None,
                 diagnostics_file: Path | None) -> tuple[cluster.ClusterAddress, cluster.WorkerResources] | None:
    """Where a --ray run goes and what each worker reserves; None without --ray. Ray itself is
    checked now: a missing extra is a usage error, said before anything is read."""
    if address is None:
        if cpus is not None or gpus is not None:
            raise typer.BadParameter("only with --ray", param_hint="'--ray-cpus' / '--ray-gpus'")
        return None
    if diagnostics_file is not None:
        raise typer.BadParameter("not with --ray: each worker would write its own, on its own machine",
                                 param_hint="'--diagnostics-file'")
    try:
        cluster.require_ray()
    except cluster.ClusterError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    default = cluster.WorkerResources()
    return address, cluster.WorkerResources(cpus=default.cpus if cpus is None else cpus,
                                            gpus=default.gpus if gpus is None else gpus)


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
        if device.index not in (None, 0):  # torch has one CPU device; cpu:N is taken, then fails later
            raise typer.BadParameter(f"{text!r}: there is one CPU device, cpu (or cpu:0)", param_hint="'--device'")
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


def _check_ollama_model(model: str) -> None:
    from summarize.engine.weights.ollama_store import ollama_model_file  # the engine, torch with it: on need

    try:
        ollama_model_file(model)
    except SummarizeError as exc:
        raise typer.BadParameter(str(exc), param_hint="'-m'") from None


def _pull(model: str, *, quiet: bool) -> int:
    """Fetch a hub model with huggingface_hub's progress bars on stderr; a folder or file is just checked."""
    from summarize.engine.loading import read_config, resolve_source
    from summarize.engine.weights.gguf_file import GGUFFile
    from summarize.engine.weights.gguf_source import gguf_file_for

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


def _run(inputs: list[str], output: str | None, settings: Settings, ui: Reporter, *, force: bool, json_lines: bool,
         on_cluster: tuple[cluster.ClusterAddress, cluster.WorkerResources] | None = None) -> int:
    sigterm = _SigtermRecord()
    try:
        with _library_warnings(shown=settings.verbose), _sigterm_interrupts() as sigterm:
            try:
                plan = plan_jobs(inputs, output, diagnostics_file=settings.diagnostics_file)
            except SummarizeError as exc:
                ui.error(str(exc))
                return EXIT_USAGE
            if plan.clashes:
                ui.error(plan.clashes[0])
                return EXIT_USAGE
            if on_cluster is None:
                results = local.run(plan, settings, ui=ui, force=force, json_lines=json_lines)
            else:
                from summarize.cluster import run as cluster_run  # only here: a plain run never imports the cluster code

                address, resources = on_cluster
                results = cluster_run.run(plan, settings, cluster=address, resources=resources, ui=ui, force=force,
                                        json_lines=json_lines)
    except cluster.ClusterError as exc:  # before any document was sent
        ui.close()
        ui.error(str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        ui.close()
        # Ray's waits turn the handler's Terminated into a plain KeyboardInterrupt: the record says
        message, code = _interruption(exc, sigterm)
        ui.error(message)
        return code
    except local.NamedModelMissing as exc:
        ui.close()
        ui.error(str(exc))
        return EXIT_USAGE
    except local.StdoutError as exc:
        ui.close()
        ui.error(str(exc))
        return EXIT_FAILED
    except BrokenPipeError:
        _silence_stdout()  # the reader went away (`| head`): nothing more to say
        return EXIT_FAILED
    except Exception as exc:  # a bug, not a bad input: still one line unless --verbose
        ui.close()
        ui.error(f"unexpected {type(exc).__name__}: {first_line(exc)} (--verbose shows details)",
                 exc=exc)
        return EXIT_FAILED
    finally:
        ui.close()
    return EXIT_FAILED if any(r.status == "failed" for r in results) else EXIT_OK


@dataclass
class _SigtermRecord:
    received: bool = False


def _interruption(exc: KeyboardInterrupt, sigterm: _SigtermRecord | None = None) -> tuple[str, int]:
    """What to say and the exit code, for Ctrl-C or SIGTERM (`Terminated`, or a record of it)."""
    terminated = isinstance(exc, Terminated) or (sigterm is not None and sigterm.received)
    return ("terminated", EXIT_TERMINATED) if terminated else ("interrupted", EXIT_INTERRUPTED)


@contextmanager
def _sigterm_interrupts() -> Iterator[_SigtermRecord]:
    """While the run lasts, SIGTERM raises Terminated, so it cleans up as Ctrl-C does; the record
    yielded says whether one came."""
    record = _SigtermRecord()

    def raise_terminated(signum: int, frame: object) -> None:
        record.received = True
        raise Terminated

    try:
        previous = signal.signal(signal.SIGTERM, raise_terminated)
    except ValueError:  # not the main thread (a host application's worker): its signals are its own
        yield record
        return
    try:
        yield record
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
