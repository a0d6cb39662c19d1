"""The machine policy measured on the machine: the candidate products for a model's own shapes, timed
once per CPU model, core count, torch version and shape set, kept in a small table beside the
compiled kernels (`~/.cache/summarize/kernel-policy.json`).

Each decision the policy makes between eager products is a race at each row count it covers (a
decode batch, a verify span, a prefill block): the candidates take turns on the same inputs, each
over several distinct copies of the weight so that it is read from memory, not cache, and the
median of a few turns counts. A candidate whose result is not the reference product to the
tolerance the tests state never wins. The whole run stops after `BUDGET_SECONDS`; what it did not
reach keeps the portable default (`machine.policy_for`). Where the model's steps will be compiled,
the compiled streamed loop of a few fp32 rows races torch's GEMM too; its candidates are compiles of
seconds each, so it is timed on one shape, at the fewest row counts a bisection needs. First of all,
for a model held in full precision, one row through torch's int4 kernel races one row through the
full weight (compiled, where the steps will be): where int4 wins, a model loaded with
quantize="auto" keeps an int4 copy to generate tokens with (`int4_copy_generates`); and a
prefill's share of rows through the weight races the same rows through the weight stored as int8
with x rounded to int8 too: where that wins, quantize="auto" stores it so (`int8_activations`).
Then a batch of sequences generating together (2 to 8 rows) races the copy against the weights as
those reads store them: batches past the last the copy wins read the weights (`int4_copy_max_batch`).
Where int8 reads won, before that, int8 weights prepacked for oneDNN's kernel race plain ones read by
`torch._int_mm` at a batch's rows and a prompt's (`int8_prepacked`).
`SUMMARIZE_CALIBRATE=0` keeps the portable default whole. How it works: docs/kernel-policy.md.
"""

from __future__ import annotations

import copy
import json
import math
import os
import platform
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from summarize.engine.ops import machine
from summarize.engine.ops.linear import (
    STREAMED_MAX_ROWS,
    Projection,
    can_prepack_int8,
    dequantize_int4,
    int4_dequantized,
    int4_kernel,
    int8_activations,
    int8_dequantized,
    int8_kernel,
    int8_prepacked,
    int8_prepacked_product,
    int8_rounded_product,
    int8_widened,
    quantized,
    rounded_rows,
    streamed,
    weight_first,
)
from summarize.errors import first_line
from summarize.files import user_cache_folder, write_atomic

ENV = "SUMMARIZE_CALIBRATE"  # "0": the portable default policy, nothing timed
TABLE_NAME = "kernel-policy.json"  # in the user cache folder, beside torchinductor/
TABLE_FORMAT = 4  # 4: int8 weights prepacked for oneDNN raced (tables of 3 are timed again)
TABLES_KEPT = 16  # machine × model entries in the file, the most recent
BUDGET_SECONDS = 15.0
# A calibration cut short by its budget is taken again at the next loads, this many times in all:
# a first run's compiles (an empty inductor cache) can take the whole budget, a later run's are read
ATTEMPTS = 3
ROW_COUNTS = (1, 2, 3, 4, 6, 9, 16, 32, 64, 128)  # decode batches, verify spans, prefill blocks
STREAMED_ROW_COUNTS = (1, 2, 3, 4, 6, 9, 12, 16)  # a compiled step's decode batches and verify spans
PREFILL_ROWS = 64  # the row count a prefill-only choice is timed at
DECODE_ROWS = 1  # the row count the int4 copy races the full weight at: one summary's decode
BATCH_ROW_COUNTS = (2, 3, 4, 6, 8)  # sequences generating together (map-reduce's notes: up to 8)
READ_ROWS = 256  # the row count int8 activations race the others at: a share of a prefill block
TURNS = 3  # each candidate's timings, taken in turn with the others; the median counts
COPIES_BYTES = 48 * 2**20  # weights one timing reads, in distinct copies: more than a last-level cache
MAX_COPIES = 6
MAX_WEIGHT_BYTES = 16 * 2**20  # a larger weight (a head) is timed on its first rows, scaled by its size
SHAPES_TIMED = 2  # per weight form: the shapes that hold most of the model's weights
PACKED_ROWS = 64  # rows of a timed weight are a multiple of this (torch's int4 packing block)
# Largest error of a product against the fp32 reference, as a share of its largest value: fp32
# (tests/test_linear.py) and a product that reads x in bf16 (tests/test_quantize.py)
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 1e-2}
# x rounded to int8 with a scale per row moves each product by about twice what bf16's rounding
# does (tests/test_quantize.py): held to twice its tolerance
INT8_ACTIVATIONS_TOLERANCE = 2e-2
# int8 weights prepacked for oneDNN may read a prompt this much slower than `_int_mm` reads plain
# ones and still be kept, where they win a batch's products: prompts take about as long either way
PREPACKED_READ_SLACK = 1.05
WIDEN_BLOCKS = (512, 1024, 2048, 4096)  # int8 rows widened at a time, fp32
# Forms whose own products no race in the loop over forms decides: bf16 (its products have no
# field; its races are the int4 copy's and int8 reads', run first), int8 groups (torch's int8
# kernel takes no group scales; their widening block is the one timed on per-row int8)
UNTIMED = ("bfloat16", "int8 groups")
FULL_PRECISION = ("float32", "bfloat16")

Product = Callable[[Tensor, Projection], Tensor]  # x [rows, K], a projection → [rows, N]
# rows, candidates, deadline (on `time.perf_counter`) → seconds each; None: the deadline came first
Timer = Callable[[int, dict[str, Callable[[], object]], float], dict[str, float] | None]


@dataclass
class Table:
    """What a calibration chose: the policy's fields, and the races behind them."""

    fields: dict[str, int]
    # {"decision", "rows", "seconds": {candidate: s or None (inexact)}, "chosen", "bytes"}: the
    # times and bytes are those of all the model's weights of the form, scaled from the ones timed
    races: list[dict]
    seconds: float  # what it took
    complete: bool  # False: out of time, the rest kept the portable default
    attempts: int = 1  # calibrations of this key so far (one cut short is taken again, `ATTEMPTS`)


LAST: Table | None = None  # the table this process installed last (bench_engine prints it)


def calibrate_model(model, dtype: torch.dtype, announce: Callable[[str | None], None] | None = None,
                    compiles: bool = False) -> bool:
    """Install the policy calibrated for `model`'s projections in `dtype` on this machine: from the
    table if it has this machine's and shapes' entry, else timed now and added to it. `compiles`:
    the model's steps will be compiled (the compiled streamed loop is raced too). A table cut short
    by the budget is timed again at the next loads, `ATTEMPTS` times in all. Returns whether the
    steps may still be compiled: False where a calibration found that no compiler works here (said
    on stderr)."""
    global LAST
    if os.environ.get(ENV, "").strip() == "0":
        return compiles
    shapes = model_shapes(model)
    key = table_key(shapes, dtype, compiles)
    table = read_table(key)
    # a model of untimed forms times nothing: nothing to announce
    announcing = announce is not None and any(form in FULL_PRECISION or form not in UNTIMED for form, _, _ in shapes)
    if _due(table) and compiles and (failure := compiler_failure(announce if announcing else None)) is not None:
        # no working compiler: the steps run eagerly, the eager candidates are timed
        print(f"summarize: running without torch.compile ({failure[:200]})", file=sys.stderr)
        compiles = False
        key = table_key(shapes, dtype, compiles)
        table = read_table(key)
    if _due(table):
        attempts = 1 if table is None else table.attempts + 1
        when = "once per machine" if attempts == 1 else f"again, cut short before: try {attempts} of {ATTEMPTS}"
        if announcing:
            announce(f"timing this CPU's kernels for the model ({when}; {ENV}=0 skips it)")
        try:
            table = calibrate(shapes, dtype, compiles=compiles)
        finally:
            if announcing:
                announce(None)
        table.attempts = attempts
        save_table(key, table)
        # said here only where no UI hears it: the UI's note says it with its seconds
        if not announcing and (table.races or not table.complete):
            print(f"summarize: timed this CPU's kernels for this model in {table.seconds:.1f} s ({when}, "
                  f"at most {BUDGET_SECONDS:.0f} s; {ENV}=0 skips it)", file=sys.stderr)
    machine.POLICY = replace(machine.POLICY, **table.fields)
    LAST = table
    return compiles


def _due(table: Table | None) -> bool:
    """Whether a calibration is to be run for this table: none yet, or one cut short and tried
    fewer than `ATTEMPTS` times."""
    return table is None or (not table.complete and table.attempts < ATTEMPTS)


def compiler_failure(announce: Callable[[str | None], None] | None = None) -> str | None:
    """Why torch.compile cannot build and run a small function here (None: it can). Its first build
    on a machine (the compiler's precompiled header, an empty kernel cache) takes seconds that the
    steps' first compile would pay otherwise: paid here, before the calibration's budget starts, so
    that its compiled candidates are timed within it."""
    if announce is not None:
        announce("preparing the compiler")
    try:
        torch.compile(_doubled_sums, dynamic=False)(torch.ones(4, 16))
        return None
    except Exception as e:  # noqa: BLE001 - any failure of the compiler: the steps cannot be compiled
        return first_line(e)
    finally:
        if announce is not None:
            announce(None)


def _doubled_sums(x: Tensor) -> Tensor:
    return (x * 2).sum(-1)


def model_shapes(model) -> Counter[tuple[str, int, int]]:
    """(form, N, K) of each projection in `model` → how many there are. form: "int4", "int8" (a
    scale per row), "int8 groups" (a scale per group of input channels: a GGUF file's) or the
    weight's dtype ("float32", "bfloat16")."""
    shapes: Counter[tuple[str, int, int]] = Counter()
    for part in model.modules():
        if isinstance(part, Projection):
            N, K = part.shape
            if part.scale_and_zero is not None:
                form = "int4"
            elif part.scale is not None:
                form = "int8 groups" if part.scale.dim() == 2 else "int8"
            else:
                form = str(part.weight.dtype).removeprefix("torch.")
            shapes[form, N, K] += 1
    return shapes


def calibrate(shapes: Counter[tuple[str, int, int]], dtype: torch.dtype, timer: Timer | None = None,
              budget: float = BUDGET_SECONDS, clock: Callable[[], float] = time.perf_counter, compiles: bool = False) -> Table:
    """Race the candidates of each decision that the forms in `shapes` meet, computing in `dtype`;
    `timer` (default `taking_turns`) times a set of candidates. `compiles`: race the compiled
    streamed loop too."""
    started, races, chosen, complete = clock(), [], {}, True
    timer = timer or taking_turns
    deadline = time.perf_counter() + budget
    # compiled steps round x to int8 inside the prefill graph, fused with what came before: timed so
    int8_rows = torch.compile(int8_activations, dynamic=False) if compiles else int8_activations

    def int8_product(x: Tensor, projection: Projection) -> Tensor:
        return int8_rows(x, projection.weight, projection.scale)

    int8_own = {"int8 activations": (dequantized, INT8_ACTIVATIONS_TOLERANCE)}  # an int8 weight's own product, x rounded
    prepacked_rows = torch.compile(int8_prepacked, dynamic=False) if compiles else int8_prepacked

    def prepacked_product(x: Tensor, projection: Projection) -> Tensor:
        return prepacked_rows(x, projection.int8_prepacked, projection.int8_prepacked_scale)

    def race(label: str, weights: list[tuple[float, int, list[Projection]]], candidates: dict[str, Product], rows: int,
             tolerance: float, own: dict[str, tuple[Callable[[Projection], Tensor], float]] | None = None) -> str | None:
        """The fastest exact candidate at `rows` over `weights` (share, K, copies), None when out of
        time. `own`: candidates that compute with a weight of their own (the int4 copy), checked
        against it to their own tolerance."""
        own = own or {}
        nonlocal complete
        totals: dict[str, float | None] = dict.fromkeys(candidates, 0.0)
        read = 0.0
        for share, K, copies in weights:
            if clock() - started > budget:
                complete = False
                return None
            x = torch.randn(rows, K).to(dtype)
            read += share * sum(b.nbytes for b in copies[0].buffers())
            want = F.linear(x.float(), dequantized(copies[0]))

            def exact_enough(name: str, product: Product) -> bool:
                if name not in own:
                    return close(product(x, copies[0]), want, tolerance)
                weight_of, its_tolerance = own[name]
                return close(product(x, copies[0]), F.linear(x.float(), weight_of(copies[0])), its_tolerance)

            exact = {name: product for name, product in candidates.items() if exact_enough(name, product)}
            seconds = timer(rows, {name: _over(product, x, copies) for name, product in exact.items()}, deadline)
            if seconds is None:
                complete = False
                return None
            for name in candidates:
                totals[name] = None if name not in exact or totals[name] is None else totals[name] + share * seconds[name] / len(copies)
        timed = {name: s for name, s in totals.items() if s is not None}
        winner = min(timed, key=timed.__getitem__) if timed else next(iter(candidates))
        races.append({"decision": label, "rows": rows, "seconds": totals, "chosen": winner, "bytes": read})
        return winner

    def prepacked_wins(weights: list[tuple[float, int, list[Projection]]], twins: dict[int, Projection]) -> bool | None:
        """Whether int8 weights prepacked for oneDNN beat plain ones read by `_int_mm`: faster for a
        batch of the most sequences generating together, and at most `PREPACKED_READ_SLACK` times
        as slow for a share of a prompt. None: out of time."""
        packed = prepacked_twins(twins)
        ways = {"int8 activations": lambda x, p: int8_product(x, twins[id(p)]),
                "int8 prepacked": lambda x, p: prepacked_product(x, packed[id(p)])}
        own = {name: (lambda p: dequantized(twins[id(p)]), INT8_ACTIVATIONS_TOLERANCE) for name in ways}
        seconds = []
        for rows in (max(BATCH_ROW_COUNTS), READ_ROWS):
            if race("int8 prepacked", weights, ways, rows, TOLERANCE[dtype], own) is None:
                return None
            seconds.append({name: math.inf if s is None else s for name, s in races[-1]["seconds"].items()})
        batch, prompt = seconds
        return batch["int8 prepacked"] < batch["int8 activations"] and \
            prompt["int8 prepacked"] <= PREPACKED_READ_SLACK * prompt["int8 activations"]

    held = Counter()  # weights by form: the form that holds most is timed first
    for (form, n, k), count in shapes.items():
        held[form] += n * k * count
    main = held.most_common(1)[0][0] if held else None
    copied: list[tuple[float, int, list[Projection]]] = []  # weights with int4 copies, where the copy won
    if main in FULL_PRECISION and machine.POLICY.int4_block_rows is not None:
        weights = timed_weights(shapes, main, dtype, int4_copy=True)
        if weights:
            candidates = full_precision_candidates(dtype, compiles) | {"int4 copy": int4_copy_product}
            winner = race("int4 copy generates", weights, candidates, DECODE_ROWS, TOLERANCE[dtype], COPY_OWN)
            if winner is not None:
                chosen["int4_copy_generates"] = int(winner == "int4 copy")
                copied = weights if winner == "int4 copy" else []
    if main in FULL_PRECISION:
        weights = timed_weights(shapes, main, dtype)
        if weights:  # the weights as int8 (what quantize="auto" would store), x rounded to int8 too
            twins = int8_twins(weights)
            candidates = {"GEMM": lambda x, p: F.linear(x, p.weight),
                          "int8 activations": lambda x, p: int8_product(x, twins[id(p)])}
            own = {"int8 activations": (lambda p: dequantized(twins[id(p)]), INT8_ACTIVATIONS_TOLERANCE)}
            winner = race("int8 reads", weights, candidates, READ_ROWS, TOLERANCE[dtype], own)
            if winner is not None:
                chosen["int8_activations"] = int(winner == "int8 activations")
            if winner == "int8 activations" and can_prepack_int8():
                packed = prepacked_wins(weights, twins)
                if packed is not None:
                    chosen["int8_prepacked"] = int(packed)
            weights = twins = None  # freed before the next race's weights are made
    if copied and "int8_activations" in chosen:
        # sequences generating together: their int4 copy, or the weights as the reads store them
        own = dict(COPY_OWN)
        if chosen["int8_activations"]:
            twins = int8_twins(copied)
            own["int8 activations"] = (lambda p: dequantized(twins[id(p)]), INT8_ACTIVATIONS_TOLERANCE)
            packed = prepacked_twins(twins) if chosen.get("int8_prepacked") else None
            rounded: dict[str, tuple] = {}  # x and its rounding, made once per x where a compiled step fuses it

            def int8_batch(x: Tensor, p: Projection) -> Tensor:
                """Compiled, x's rounding is fused into the op that makes x: untimed here. Eagerly it
                is ops of its own, timed with the product. Prepacked where the reads keep them so."""
                twin = twins[id(p)] if packed is None else packed[id(p)]
                if not compiles and packed is not None:
                    return int8_prepacked(x, twin.int8_prepacked, twin.int8_prepacked_scale)
                if not compiles:
                    return int8_activations(x, twin.weight, twin.scale)
                if rounded.get("x") is not x:
                    rounded.update(x=x, codes_and_step=rounded_rows(x))
                if packed is not None:
                    return int8_prepacked_product(*rounded["codes_and_step"], twin.int8_prepacked, twin.int8_prepacked_scale, x.dtype)
                return int8_rounded_product(*rounded["codes_and_step"], twin.weight, twin.scale, x.dtype)

            def weights_read(rows: int) -> dict[str, Product]:
                return {"int8 activations": int8_batch}
        else:
            loop = torch.compile(lambda x, weight: streamed(x, weight), dynamic=False) if compiles else None

            def weights_read(rows: int) -> dict[str, Product]:
                """As a decode step of `rows` rows takes the full weight (`linear`)."""
                if dtype == torch.float32:  # in the order the later race picks
                    return {"x @ Wᵀ": lambda x, p: F.linear(x, p.weight), "W @ xᵀ": lambda x, p: weight_first(x, p.weight)}
                if loop is not None and rows <= STREAMED_MAX_ROWS:
                    return {"streamed loop, compiled": lambda x, p: loop(x, p.weight)}
                return {"GEMM": lambda x, p: F.linear(x, p.weight)}

        def by_batch(rows: int) -> str | None:
            candidates = {"int4 copy": int4_copy_product} | weights_read(rows)
            return race("int4 copy by batch", copied, candidates, rows, TOLERANCE[dtype], own)

        most = _rows_won_from_one(by_batch, "int4 copy", BATCH_ROW_COUNTS)
        if most is not None:
            chosen["int4_copy_max_batch"] = max(DECODE_ROWS, most)
    for form, _ in held.most_common():
        if form in UNTIMED:
            continue
        weights = timed_weights(shapes, form, dtype)
        if not weights:
            continue
        if form == "float32":
            order = {"x @ Wᵀ": lambda x, p: F.linear(x, p.weight), "W @ xᵀ": lambda x, p: weight_first(x, p.weight)}
            won = _rows_won(lambda rows: race("fp32 order", weights, order, rows, TOLERANCE[dtype]), "W @ xᵀ")
            if won is not None:
                first, last = won
                chosen |= {"weight_first_min_rows": first, "weight_first_max_rows": last}
            if compiles and won is not None:
                loop = torch.compile(lambda x, weight: streamed(x, weight), dynamic=False)
                in_turn = {"streamed loop, compiled": lambda x, p: loop(x, p.weight),
                           "GEMM": lambda x, p: weight_first(x, p.weight) if first <= x.shape[0] <= last else F.linear(x, p.weight)}
                most = _rows_won_from_one(lambda rows: race("fp32 streamed", weights[:1], in_turn, rows, TOLERANCE[dtype]),
                                          "streamed loop, compiled", STREAMED_ROW_COUNTS)
                if most is not None:
                    chosen["streamed_fp32_max_rows"] = most
        elif form == "int8" and dtype == torch.float32:
            blocks = {f"widen {b} rows at a time": (lambda x, p, b=b: int8_widened(x, p.weight, p.scale, b)) for b in WIDEN_BLOCKS}
            winner = race("int8 widening block, fp32", weights, blocks, PREFILL_ROWS, TOLERANCE[dtype])
            if winner is not None:
                chosen["widen_block_rows"] = int(winner.split()[1])
                widened = {f"widen {winner.split()[1]} rows at a time": blocks[winner], "int8 activations": int8_product}
                many = race("int8 activations, fp32", weights, widened, READ_ROWS, TOLERANCE[dtype], int8_own)
                if many is not None:
                    chosen["int8_activations"] = int(many == "int8 activations")
        elif form == "int8":
            few = {"int8 kernel": lambda x, p: int8_kernel(x, p.weight, p.scale),
                   "dequantize, GEMM": lambda x, p: int8_dequantized(x, p.weight, p.scale)}
            most = _rows_won_from_one(lambda rows: race("int8", weights, few, rows, TOLERANCE[torch.bfloat16]), "int8 kernel")
            if most is not None:
                chosen["int8_packed_max_rows"] = most
            many = {"dequantize, GEMM": lambda x, p: int8_dequantized(x, p.weight, p.scale), "int8 activations": int8_product}
            winner = race("int8 activations", weights, many, READ_ROWS, TOLERANCE[torch.bfloat16], int8_own)
            if winner is not None:
                chosen["int8_activations"] = int(winner == "int8 activations")
        elif form == "int4":
            few = {"int4 kernel": lambda x, p: int4_kernel(x, p.weight, p.scale_and_zero, p.group),
                   "dequantize, GEMM": lambda x, p: int4_dequantized(x, p.weight, p.scale_and_zero, p.group)}
            most = _rows_won_from_one(lambda rows: race("int4", weights, few, rows, TOLERANCE[torch.bfloat16]), "int4 kernel")
            if most is not None:
                chosen["int4_kernel_max_rows"] = most
    return Table(chosen, races, clock() - started, complete)


def full_precision_candidates(dtype: torch.dtype, compiles: bool) -> dict[str, Product]:
    """The ways one row through a full-precision weight may go: in fp32, torch's GEMM either way
    round or (compiled) a streamed loop, whichever the later races pick; in bf16, what a compiled
    decode step runs (`linear`'s streamed loop), or eagerly torch's GEMM."""
    loop = torch.compile(lambda x, weight: streamed(x, weight), dynamic=False) if compiles else None
    if dtype == torch.float32:
        ways = {"x @ Wᵀ": lambda x, p: F.linear(x, p.weight), "W @ xᵀ": lambda x, p: weight_first(x, p.weight)}
        return ways | ({"streamed loop, compiled": lambda x, p: loop(x, p.weight)} if compiles else {})
    if compiles:
        return {"streamed loop, compiled": lambda x, p: loop(x, p.weight)}
    return {"GEMM": lambda x, p: F.linear(x, p.weight)}


def int8_twins(weights: list[tuple[float, int, list[Projection]]]) -> dict[int, Projection]:
    """id of each timed projection → its weight as int8 (what quantize="auto" would store): as many
    distinct twins per set as `read_from_memory` asks (no more than the set has projections), shared
    in turn by its projections."""
    twins = {}
    for _, _, copies in weights:
        made = [quantized(Projection(p.weight), "int8") for p in copies[:read_from_memory(copies[0].weight.numel())]]
        twins |= {id(p): made[i % len(made)] for i, p in enumerate(copies)}
    return twins


def prepacked_twins(twins: dict[int, Projection]) -> dict[int, Projection]:
    """The int8 twins (`int8_twins`) held prepacked for oneDNN's int8 kernel, a shared twin once."""
    packed: dict[int, Projection] = {}  # id of a twin → its prepacked one
    for twin in twins.values():
        if id(twin) not in packed:
            packed[id(twin)] = copy.deepcopy(twin)
            packed[id(twin)].prepack_int8(keep_rows=False)
    return {key: packed[id(twin)] for key, twin in twins.items()}


def int4_copy_product(x: Tensor, projection: Projection) -> Tensor:
    return int4_kernel(x, projection.int4_copy, projection.int4_copy_scale_and_zero, projection.int4_copy_group)


def copy_dequantized(projection: Projection) -> Tensor:
    return dequantize_int4(projection.int4_copy, projection.int4_copy_scale_and_zero, projection.int4_copy_group, torch.float32)


# the int4 copy is held to its own dequantized weight, at the tolerance of a product reading x in bf16
COPY_OWN = {"int4 copy": (copy_dequantized, TOLERANCE[torch.bfloat16])}


def _rows_won(race: Callable[[int], str | None], candidate: str) -> tuple[int, int] | None:
    """The first and last of the row counts that `candidate` wins in a run: from its first win up
    to its next loss. (1, 0): it wins none. None: out of time before the run ended."""
    first = last = None
    for rows in ROW_COUNTS:
        winner = race(rows)
        if winner is None:
            return None
        if winner == candidate:
            first, last = first or rows, rows
        elif first is not None:
            break
    return (1, 0) if first is None else (first, last)


def _rows_won_from_one(race: Callable[[int], str | None], candidate: str, row_counts: tuple[int, ...] = ROW_COUNTS) -> int | None:
    """The most of `row_counts` up to which `candidate`, a kernel for few rows, wins from one row
    (0: none), found by bisection: its time grows with the rows, the other's (a dequantization
    first, or a GEMM) much less. None: out of time before it was found."""
    low, high = 0, len(row_counts)  # it wins row_counts[:low], loses row_counts[high:]
    while low < high:
        middle = (low + high) // 2
        winner = race(row_counts[middle])
        if winner is None:
            return None
        low, high = (middle + 1, high) if winner == candidate else (low, middle)
    return row_counts[low - 1] if low else 0


def timed_weights(shapes: Counter[tuple[str, int, int]], form: str, dtype: torch.dtype,
                  int4_copy: bool = False) -> list[tuple[float, int, list[Projection]]]:
    """Random weights in `form` of the shapes that hold most of the model's weights in it: (how many
    of it the model holds, its input channels K, its distinct copies). `int4_copy`: each with an
    int4 copy, in as many copies as the int4 copies need to be read from memory."""
    mine = sorted(((n * k * count, n, k, count) for (f, n, k), count in shapes.items() if f == form), reverse=True)
    timed = []
    for _, N, K, count in mine[:SHAPES_TIMED]:
        rows = min(N, max(PACKED_ROWS, MAX_WEIGHT_BYTES // (4 * K) // PACKED_ROWS * PACKED_ROWS))
        one = quantized(Projection(torch.randn(rows, K).to(dtype)), None if form in ("float32", "bfloat16") else form)
        if form == "int4" and one.scale_and_zero is None:  # a shape torch's int4 kernel cannot take
            continue
        if int4_copy and not one.add_int4_copy():
            continue
        if int4_copy:  # each copy an int4 copy of its own; the full weights they copy, in a ring of their own size
            n_copies = min(MAX_COPIES * 4, read_from_memory(one.int4_copy.nbytes))  # an int4 copy: a quarter of bf16's bytes or less
            fulls = [one.weight] + [one.weight.clone() for _ in range(min(n_copies, read_from_memory(one.weight.nbytes)) - 1)]
            copies = [one] + [_with_int4_copy(fulls[i % len(fulls)]) for i in range(1, n_copies)]
        else:
            copies = [one] + [copy.deepcopy(one) for _ in range(min(MAX_COPIES, read_from_memory(sum(b.nbytes for b in one.buffers()))) - 1)]
        timed.append((count * N / rows, K, copies))
    return timed


def read_from_memory(size: int) -> int:
    """How many distinct tensors of `size` bytes one timing reads in turn, so that each is read from
    memory, not cache: `COPIES_BYTES` of them, two at least."""
    return max(2, math.ceil(COPIES_BYTES / size))


def _with_int4_copy(weight: Tensor) -> Projection:
    """A projection of `weight` (shared, not copied) with an int4 copy of its own."""
    projection = Projection(weight)
    projection.add_int4_copy()
    return projection


def dequantized(projection: Projection) -> Tensor:
    """The projection's weight [N, K] in fp32, as its products should compute with it."""
    if projection.scale_and_zero is not None:
        return dequantize_int4(projection.weight, projection.scale_and_zero, projection.group, torch.float32)
    if projection.scale is not None:
        return projection.weight.float() * projection.scale.float()[:, None]
    return projection.weight.float()


def close(got: Tensor, want: Tensor, tolerance: float) -> bool:
    return got.shape == want.shape and bool((got.float() - want).abs().max() <= tolerance * want.abs().max())


def _over(product: Product, x: Tensor, copies: list[Projection]) -> Callable[[], object]:
    return lambda: [product(x, p) for p in copies]


def taking_turns(rows: int, candidates: dict[str, Callable[[], object]], deadline: float = math.inf) -> dict[str, float] | None:
    """Each candidate's median time over `TURNS` turns, the candidates taking turns (after one
    untimed call each), so that a slow moment of the machine does not fall on one of them. None
    where `deadline` (`time.perf_counter`) passes first."""
    seconds: dict[str, list[float]] = {name: [] for name in candidates}
    for turn in range(TURNS + 1):
        for name, run in candidates.items():
            start = time.perf_counter()
            if start > deadline:
                return None
            run()
            if turn:
                seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) for name, times in seconds.items()}


# --- the table on disk ---------------------------------------------------------------------------


def table_path():
    return user_cache_folder() / TABLE_NAME


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo's, else what platform says)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith(("model name", "cpu model", "hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def table_key(shapes: Counter[tuple[str, int, int]], dtype: torch.dtype, compiles: bool = False) -> str:
    """What a table holds for: this CPU model, core count and torch, the model's shapes and dtype,
    and whether its steps are compiled."""
    listed = ", ".join(f"{count}×{form} {n}×{k}" for (form, n, k), count in sorted(shapes.items()))
    steps = "compiled" if compiles else "eager"
    return f"{cpu_model()}; {torch.get_num_threads()} threads; torch {torch.__version__}; {dtype}, {steps}: {listed}"


CALIBRATED = {f.name for f in fields(machine.CpuPolicy) if f.type in ("int", int)}  # what a table may set


def read_table(key: str) -> Table | None:
    """The table stored for `key`; None where there is none, or the file is not one we wrote."""
    entry = _stored().get(key)
    try:
        table = Table(**entry)
    except TypeError:  # None, or not a table's fields
        return None
    values = table.fields
    if not isinstance(values, dict) or not all(k in CALIBRATED and type(v) is int and v >= 0 for k, v in values.items()):
        return None
    if values.get("widen_block_rows", 1) == 0:  # a step of a loop
        return None
    if type(table.complete) is not bool or type(table.attempts) is not int:
        return None
    return table


def save_table(key: str, table: Table) -> None:
    """Add `table` to the file under `key` (a corrupt file is replaced); a file that cannot be
    written leaves this process's policy as it is."""
    tables = _stored()
    tables.pop(key, None)
    tables[key] = table.__dict__
    kept = dict(list(tables.items())[-TABLES_KEPT:])
    try:
        write_atomic(table_path(), json.dumps({"format": TABLE_FORMAT, "tables": kept}, ensure_ascii=False, indent=1))
    except OSError:
        pass


def _stored() -> dict:
    """key → table (as written) from the file; {} where it is missing, unreadable or corrupt."""
    try:
        stored = json.loads(table_path().read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(stored, dict) or stored.get("format") != TABLE_FORMAT or not isinstance(stored.get("tables"), dict):
        return {}
    return stored["tables"]
