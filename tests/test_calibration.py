"""The kernel policy calibrated on the machine (`ops/calibration.py`): what it picks follows the
timings (a fake timer here: no test depends on real timing), every pick computes the product it
stands for, and the table on disk is used once written, rebuilt when corrupt, ignored when it is
another machine's.

Tolerances: those the calibration keeps candidates to (`calibration.TOLERANCE`), 1e-4 of the largest
output in fp32 (tests/test_linear.py), 1e-2 where a kernel reads x in bf16 (tests/test_quantize.py).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from summarize.engine import load_model
from summarize.engine.ops import calibration, linear, machine
from summarize.engine.ops.calibration import ROW_COUNTS, TOLERANCE, calibrate
from summarize.engine.ops.linear import Projection, quantized
from tiny_models import dense_reference, save_checkpoint

N, K = 128, 128  # a shape every form takes (int4: rows a multiple of its packing block, K of its group)


def faster(winner: str, rows_won: range, loser_time: float = 2.0):
    """A timer under which `winner` takes 1 s at `rows_won` rows and `loser_time` elsewhere, and
    every other candidate the other way round."""
    calls = []

    def timer(rows, candidates, deadline):
        calls.append(rows)
        won = rows in rows_won
        return {name: (1.0 if (name == winner) == won else loser_time) for name in candidates}

    timer.calls = calls
    return timer


def shapes(form: str) -> Counter:
    return Counter({(form, N, K): 2, (form, 2 * N, K): 1})


def without_copy(fields: dict) -> dict:
    """The fields but the two a full-precision model's calibration races first: whether an int4
    copy writes, whether int8 reads."""
    return {name: value for name, value in fields.items() if name not in ("int4_copy_generates", "int8_activations")}


@pytest.fixture
def policy_kept(monkeypatch):
    """Whatever a test installs in `machine.POLICY` is undone after it."""
    monkeypatch.setattr(machine, "POLICY", machine.POLICY)


@pytest.fixture
def cache(monkeypatch, tmp_path, policy_kept):
    """Calibration on, its table in a cache folder of the test's own, timed by a fake timer that
    makes W @ xᵀ win at 4 to 16 rows (installed as the default timer)."""
    monkeypatch.delenv(calibration.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    timer = faster("W @ xᵀ", range(4, 17))
    monkeypatch.setattr(calibration, "taking_turns", timer)
    return timer


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_checkpoint(dense_reference(), tmp_path_factory.mktemp("dense"))


def test_the_fastest_fp32_order_is_the_one_taken():
    table = calibrate(shapes("float32"), torch.float32, timer=faster("W @ xᵀ", range(4, 17)))
    assert without_copy(table.fields) == {"weight_first_min_rows": 4, "weight_first_max_rows": 16} and table.complete
    orders = [race["rows"] for race in table.races if race["decision"] == "fp32 order"]
    assert orders == [r for r in ROW_COUNTS if r <= 32]  # stops at its first loss after


def test_an_order_that_never_wins_is_never_taken():
    table = calibrate(shapes("float32"), torch.float32, timer=faster("x @ Wᵀ", range(1, 1000)))
    assert table.fields == {"weight_first_min_rows": 1, "weight_first_max_rows": 0, "int4_copy_generates": 0, "int8_activations": 0}


@pytest.mark.parametrize("form, dtype, winner, field", [
    ("int4", torch.bfloat16, "int4 kernel", "int4_kernel_max_rows"),
    ("int4", torch.float32, "int4 kernel", "int4_kernel_max_rows"),
    ("int8", torch.bfloat16, "int8 kernel", "int8_packed_max_rows"),
])
@pytest.mark.parametrize("up_to", [0, 1, 9, 32, ROW_COUNTS[-1]])
def test_a_kernel_for_few_rows_takes_the_rows_it_wins_from_one(form, dtype, winner, field, up_to):
    table = calibrate(shapes(form), dtype, timer=faster(winner, range(1, up_to + 1)))
    assert {name: value for name, value in table.fields.items() if name != "int8_activations"} == {field: up_to}


@pytest.mark.parametrize("up_to", [0, 1, 4, 16])
def test_compiled_steps_stream_the_rows_the_streamed_loop_wins(up_to):
    """Where the steps will be compiled, the compiled streamed loop races torch's GEMM at a few rows,
    on one shape: each row count it tries is a compile."""
    timer = faster("streamed loop, compiled", range(1, up_to + 1))
    table = calibrate(shapes("float32"), torch.float32, timer=timer, compiles=True)
    assert table.fields["streamed_fp32_max_rows"] == up_to and table.complete
    streamed = [race for race in table.races if race["decision"] == "fp32 streamed"]
    assert streamed and {race["rows"] for race in streamed} <= set(calibration.STREAMED_ROW_COUNTS)
    assert len(streamed) <= 4  # a bisection over the row counts, not all of them


def test_eager_steps_never_time_the_streamed_loop():
    table = calibrate(shapes("float32"), torch.float32, timer=faster("W @ xᵀ", range(4, 17)))
    assert "streamed_fp32_max_rows" not in table.fields
    assert all(race["decision"] != "fp32 streamed" for race in table.races)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("compiles", [False, True])
@pytest.mark.parametrize("copy_wins", [True, False])
def test_a_full_precision_model_generates_from_an_int4_copy_where_one_row_of_int4_is_faster(dtype, compiles, copy_wins):
    """One row through torch's int4 kernel races one row through the full weight, the way a decode
    step takes it (a compiled bf16 step streams the weight itself)."""
    rival = "streamed loop, compiled" if compiles else ("x @ Wᵀ" if dtype == torch.float32 else "GEMM")
    table = calibrate(shapes(str(dtype).removeprefix("torch.")), dtype, timer=faster("int4 copy" if copy_wins else rival, range(1, 2)),
                      compiles=compiles)
    assert table.fields["int4_copy_generates"] == int(copy_wins)
    race = table.races[0]
    assert race["decision"] == "int4 copy generates" and race["rows"] == 1 and {"int4 copy", rival} <= set(race["seconds"])
    assert all(seconds is not None for seconds in race["seconds"].values())  # each exact to its own weight


@pytest.mark.parametrize("form, dtype, rival", [
    ("bfloat16", torch.bfloat16, "GEMM"),  # what quantize="auto" would store
    ("float32", torch.float32, "GEMM"),
    ("int8", torch.bfloat16, "dequantize, GEMM"),
    ("int8", torch.float32, None),  # the widening block its own race chose
])
@pytest.mark.parametrize("int8_wins", [True, False])
def test_many_rows_are_multiplied_in_int8_where_that_wins(form, dtype, rival, int8_wins):
    """A prefill's share of rows: the weights as int8 with x rounded to int8 too, against the way
    the form multiplies them otherwise."""
    # int8 activations take 1 s where they win and 2 s elsewhere, every other candidate the other way round
    timer = faster("int8 activations", range(calibration.READ_ROWS, calibration.READ_ROWS + 1) if int8_wins else range(0))
    table = calibrate(shapes(form), dtype, timer=timer)
    assert table.fields["int8_activations"] == int(int8_wins)
    race = next(race for race in table.races if race["rows"] == calibration.READ_ROWS)
    rival = rival or f"widen {table.fields['widen_block_rows']} rows at a time"
    assert set(race["seconds"]) == {rival, "int8 activations"} and None not in race["seconds"].values()


def test_compiled_steps_race_int8_activations_as_a_prefill_graph_runs_them(monkeypatch):
    """Compiled, x's rounding runs inside the graph: the candidate raced is the compiled product,
    exact to its tolerance like the eager one."""
    compiled = []

    def int8_activations(rows, weight, scale):
        compiled.append(torch.compiler.is_compiling())
        return linear.int8_activations(rows, weight, scale)

    monkeypatch.setattr(calibration, "int8_activations", int8_activations)
    timer = faster("int8 activations", range(calibration.READ_ROWS, calibration.READ_ROWS + 1))
    table = calibrate(shapes("bfloat16"), torch.bfloat16, timer=timer, compiles=True)
    assert compiled and all(compiled)
    assert table.fields["int8_activations"] == 1
    race = next(race for race in table.races if race["decision"] == "int8 reads")
    assert race["seconds"]["int8 activations"] is not None


def prepacked_taking(batch: float, prompt: float):
    """A timer under which int8 activations win the reads (1 s against the GEMM's 2 s) and, raced
    against them, int8 prepacked take `batch` s for a batch's rows and `prompt` s for a prompt's."""

    def timer(rows, candidates, deadline):
        if "int8 prepacked" in candidates:
            return {"int8 activations": 1.0, "int8 prepacked": prompt if rows == calibration.READ_ROWS else batch}
        return {name: 1.0 if name == "int8 activations" else 2.0 for name in candidates}

    return timer


@pytest.mark.skipif(not linear.can_prepack_int8(), reason="this torch has no oneDNN int8 kernel for prepacked weights")
@pytest.mark.parametrize("batch, prompt, prepacked", [
    (0.5, 1.0, 1),
    (0.5, calibration.PREPACKED_READ_SLACK - 0.01, 1),  # a prompt read a little slower, within the slack
    (0.5, calibration.PREPACKED_READ_SLACK + 0.1, 0),
    (1.5, 0.5, 0),  # no faster for a batch
])
def test_int8_weights_are_prepacked_where_that_wins_a_batch_and_reads_a_prompt_about_as_fast(batch, prompt, prepacked):
    table = calibrate(shapes("bfloat16"), torch.bfloat16, timer=prepacked_taking(batch, prompt))
    assert table.fields["int8_activations"] == 1 and table.fields["int8_prepacked"] == prepacked
    races = [race for race in table.races if race["decision"] == "int8 prepacked"]
    assert [race["rows"] for race in races] == [max(calibration.BATCH_ROW_COUNTS), calibration.READ_ROWS]
    assert all(None not in race["seconds"].values() for race in races)  # both exact to int8's tolerance


def test_no_prepacked_race_where_int8_does_not_read():
    table = calibrate(shapes("bfloat16"), torch.bfloat16, timer=faster("GEMM", range(1, 1000)))
    assert "int8_prepacked" not in table.fields
    assert all(race["decision"] != "int8 prepacked" for race in table.races)


def copy_for_few(up_to: int, int8_reads: bool):
    """A timer under which the int4 copy takes 1 s up to `up_to` rows and 3 s past them, int8
    activations 1.5 s where they win the reads (4 s elsewhere), every other candidate 2 s."""

    def timer(rows, candidates, deadline):
        def seconds(name: str) -> float:
            if name == "int4 copy":
                return 1.0 if rows <= up_to else 3.0
            return (1.5 if int8_reads else 4.0) if name == "int8 activations" else 2.0

        return {name: seconds(name) for name in candidates}

    return timer


@pytest.mark.parametrize("dtype, compiles, int8_reads, rival", [
    (torch.bfloat16, False, True, "int8 activations"),  # the weights as auto stores them to read in int8
    (torch.bfloat16, False, False, "GEMM"),
    (torch.float32, False, False, "x @ Wᵀ"),
])
@pytest.mark.parametrize("up_to", [1, 4, 8])
def test_a_batch_generates_from_the_copy_up_to_the_rows_the_copy_wins(dtype, compiles, int8_reads, rival, up_to):
    """Sequences generating together (2 to 8 rows: map-reduce's notes) race the int4 copy against the
    weights as the reads keep them; batches past the last it wins read the weights."""
    table = calibrate(shapes(str(dtype).removeprefix("torch.")), dtype, timer=copy_for_few(up_to, int8_reads), compiles=compiles)
    assert table.fields["int4_copy_generates"] == 1 and table.fields["int8_activations"] == int(int8_reads)
    assert table.fields["int4_copy_max_batch"] == up_to
    by_batch = [race for race in table.races if race["decision"] == "int4 copy by batch"]
    assert {race["rows"] for race in by_batch} <= set(calibration.BATCH_ROW_COUNTS) and len(by_batch) <= 3  # a bisection
    assert all(rival in race["seconds"] and None not in race["seconds"].values() for race in by_batch)  # each exact to its own weight


def test_a_compiled_bf16_step_of_two_rows_races_the_copy_against_its_streamed_loop():
    table = calibrate(shapes("bfloat16"), torch.bfloat16, timer=copy_for_few(1, False), compiles=True)
    assert table.fields["int4_copy_max_batch"] == 1
    two = next(race for race in table.races if race["decision"] == "int4 copy by batch" and race["rows"] == 2)
    assert set(two["seconds"]) == {"int4 copy", "streamed loop, compiled"}


def test_no_batch_race_where_one_row_of_the_copy_loses():
    table = calibrate(shapes("bfloat16"), torch.bfloat16, timer=faster("GEMM", range(1, 1000)))
    assert table.fields["int4_copy_generates"] == 0 and "int4_copy_max_batch" not in table.fields
    assert not any(race["decision"] == "int4 copy by batch" for race in table.races)


@pytest.mark.parametrize("form", ["int4", "int8"])
def test_a_model_of_compact_weights_races_no_copy(form):
    table = calibrate(shapes(form), torch.bfloat16, timer=faster("int4 copy", range(1, 1000)))
    assert "int4_copy_generates" not in table.fields


def test_each_timing_reads_its_weights_from_memory_without_holding_a_copy_more(monkeypatch):
    """The copies a timing reads in turn hold `COPIES_BYTES` of distinct bytes per form read (so
    that each is read from memory, not cache), and no more: with int4 copies, every copy has an int4
    copy of its own while the full weights they copy are shared in a ring of their own size; int8
    twins the same, ringed by their own size."""
    weight_bytes = 256 * 128 * 2  # bf16
    monkeypatch.setattr(calibration, "COPIES_BYTES", 3 * weight_bytes)
    [(_, _, copies)] = calibration.timed_weights(Counter({("bfloat16", 256, 128): 2}), "bfloat16", torch.bfloat16, int4_copy=True)
    distinct = lambda tensors: len({t.data_ptr() for t in tensors})  # noqa: E731
    int4_bytes = copies[0].int4_copy.nbytes
    assert len(copies) == distinct(p.int4_copy for p in copies) == math.ceil(3 * weight_bytes / int4_bytes)
    assert distinct(p.weight for p in copies) == 3
    twins = calibration.int8_twins([(1.0, 128, copies)])
    assert distinct(twins[id(p)].weight for p in copies) == math.ceil(3 * weight_bytes / (256 * 128))
    packed = calibration.prepacked_twins(twins) if linear.can_prepack_int8() else {}
    assert len({id(p) for p in packed.values()}) == (6 if packed else 0)


def test_the_fastest_int8_widening_block_is_the_one_taken():
    table = calibrate(shapes("int8"), torch.float32, timer=faster("widen 1024 rows at a time", range(1, 1000)))
    assert table.fields == {"widen_block_rows": 1024, "int8_activations": 0}


def test_an_inexact_candidate_never_wins(monkeypatch):
    monkeypatch.setattr(calibration, "weight_first", lambda x, weight: torch.zeros(x.shape[0], weight.shape[0]))
    table = calibrate(shapes("float32"), torch.float32, timer=faster("W @ xᵀ", range(1, 1000)))
    assert without_copy(table.fields) == {"weight_first_min_rows": 1, "weight_first_max_rows": 0}
    orders = [race for race in table.races if race["decision"] == "fp32 order"]
    assert orders and all(race["seconds"]["W @ xᵀ"] is None for race in orders)


def test_out_of_time_the_rest_keeps_the_default():
    ticks = iter(range(1000))
    table = calibrate(shapes("float32"), torch.float32, timer=faster("W @ xᵀ", range(4, 17)), budget=4.5,
                      clock=lambda: float(next(ticks)))  # a second passes at each look at the clock
    assert not table.complete and without_copy(table.fields) == {}


@pytest.mark.parametrize("form, dtype, winner, rows_won", [
    ("float32", torch.float32, "W @ xᵀ", range(4, 17)),
    ("float32", torch.float32, "W @ xᵀ", range(1, 3)),
    ("int4", torch.float32, "int4 kernel", range(1, 10)),
    ("int4", torch.bfloat16, "int4 kernel", range(1, 33)),
    ("int8", torch.bfloat16, "int8 kernel", range(1, 5)),
    ("int8", torch.float32, "widen 512 rows at a time", range(1, 1000)),
])
def test_every_policy_it_picks_computes_the_product(form, dtype, winner, rows_won, monkeypatch):
    """The dispatch under the calibrated policy, at every row count, on either side of each switch."""
    table = calibrate(shapes(form), dtype, timer=faster(winner, rows_won))
    assert table.fields
    monkeypatch.setattr(machine, "POLICY", replace(machine.POLICY, **table.fields))
    gen = torch.Generator().manual_seed(0)
    projection = quantized(Projection(torch.randn(N, K, generator=gen).to(dtype)), None if form == "float32" else form)
    weight = calibration.dequantized(projection)
    tolerance = TOLERANCE[torch.float32 if form == "float32" or (form == "int8" and dtype == torch.float32) else torch.bfloat16]
    for rows in sorted({*ROW_COUNTS, *(r + 1 for r in ROW_COUNTS)}):
        x = torch.randn(rows, K, generator=gen).to(dtype)
        want = F.linear(x.float(), weight)
        got = projection(x)
        assert got.dtype == dtype and (got.float() - want).abs().max() <= tolerance * want.abs().max(), rows


def test_a_compiled_step_under_the_streaming_policy_computes_the_product(monkeypatch):
    """Either side of the streamed loop's last row count, inside a compiled step."""
    table = calibrate(shapes("float32"), torch.float32, timer=faster("streamed loop, compiled", range(1, 7)), compiles=True)
    assert table.fields["streamed_fp32_max_rows"] == 6
    monkeypatch.setattr(machine, "POLICY", replace(machine.POLICY, **table.fields))
    torch._dynamo.reset()  # graphs built under another policy
    gen = torch.Generator().manual_seed(0)
    projection = Projection(torch.randn(N, K, generator=gen))
    step = torch.compile(projection, fullgraph=True, dynamic=False)
    for rows in (1, 6, 7):
        x = torch.randn(rows, K, generator=gen)
        want = F.linear(x, projection.weight)
        assert (step(x) - want).abs().max() <= TOLERANCE[torch.float32] * want.abs().max(), rows


def test_loading_calibrates_once_and_then_reads_the_table(folder, cache, capsys):
    load_model(folder, device="cpu", dtype=torch.float32, compile=False)
    assert "timed this CPU's kernels" in capsys.readouterr().err
    assert (machine.POLICY.weight_first_min_rows, machine.POLICY.weight_first_max_rows) == (4, 16)
    timed = len(cache.calls)
    assert timed and calibration.table_path().is_file()

    machine.POLICY = replace(machine.POLICY, weight_first_min_rows=2, weight_first_max_rows=32)  # another process's start
    load_model(folder, device="cpu", dtype=torch.float32, compile=False)
    assert len(cache.calls) == timed and capsys.readouterr().err == ""
    assert (machine.POLICY.weight_first_min_rows, machine.POLICY.weight_first_max_rows) == (4, 16)


def test_a_corrupt_table_is_rebuilt(folder, cache):
    calibration.table_path().parent.mkdir(parents=True)
    calibration.table_path().write_text('{"format": 1, "tables": {"')
    load_model(folder, device="cpu", dtype=torch.float32, compile=False)
    assert cache.calls
    tables = json.loads(calibration.table_path().read_text())["tables"]
    assert [without_copy(table["fields"]) for table in tables.values()] == [{"weight_first_min_rows": 4, "weight_first_max_rows": 16}]


def test_an_entry_with_fields_no_policy_has_is_rebuilt(folder, cache):
    model = load_model(folder, device="cpu", dtype=torch.float32, compile=False)
    key = calibration.table_key(calibration.model_shapes(model), torch.float32)
    calibration.save_table(key, calibration.Table({"weight_first_min_rows": -3}, [], 0.0, True))
    calls = len(cache.calls)
    load_model(folder, device="cpu", dtype=torch.float32, compile=False)
    assert len(cache.calls) > calls and machine.POLICY.weight_first_min_rows == 4


@pytest.mark.parametrize("other", ["cpu", "torch", "threads"])
def test_a_table_for_another_machine_is_ignored(folder, cache, monkeypatch, other):
    with monkeypatch.context() as elsewhere:
        if other == "cpu":
            elsewhere.setattr(calibration, "cpu_model", lambda: "Some Other CPU")
        elif other == "torch":
            elsewhere.setattr(torch, "__version__", "1.0.0")
        else:
            elsewhere.setattr(torch, "get_num_threads", lambda: 64)
        elsewhere.setattr(calibration, "taking_turns", faster("W @ xᵀ", range(2, 33)))
        load_model(folder, device="cpu", dtype=torch.float32, compile=False)
    assert machine.POLICY.weight_first_min_rows == 2 and not cache.calls
    load_model(folder, device="cpu", dtype=torch.float32, compile=False)
    assert cache.calls and (machine.POLICY.weight_first_min_rows, machine.POLICY.weight_first_max_rows) == (4, 16)
    assert len(json.loads(calibration.table_path().read_text())["tables"]) == 2  # the other machine's kept


def test_a_calibration_cut_short_is_taken_again_at_the_next_loads(folder, cache, monkeypatch):
    """A first run's compiles (an empty inductor cache) can take the whole budget: the table says
    it was cut short, and the next load times again; one that completes is then kept."""
    def stored() -> dict:
        [table] = json.loads(calibration.table_path().read_text())["tables"].values()
        return table

    with monkeypatch.context() as first_run:
        first_run.setattr(calibration, "taking_turns", lambda rows, candidates, deadline: None)  # past the deadline
        load_model(folder, device="cpu", dtype=torch.float32, compile=False)
    won = (4, 16)  # the fake timer's
    assert not stored()["complete"] and stored()["attempts"] == 1
    assert (machine.POLICY.weight_first_min_rows, machine.POLICY.weight_first_max_rows) != won
    load_model(folder, device="cpu", dtype=torch.float32, compile=False)
    assert stored()["complete"] and stored()["attempts"] == 2
    assert (machine.POLICY.weight_first_min_rows, machine.POLICY.weight_first_max_rows) == won
    calls = len(cache.calls)
    load_model(folder, device="cpu", dtype=torch.float32, compile=False)
    assert len(cache.calls) == calls


def test_a_calibration_cut_short_every_time_is_tried_three_times_in_all(folder, cache, monkeypatch):
    tries = []
    monkeypatch.setattr(calibration, "taking_turns", lambda rows, candidates, deadline: tries.append(rows))
    timed = []  # per load: whether it timed anything
    for _ in range(calibration.ATTEMPTS + 2):
        before = len(tries)
        load_model(folder, device="cpu", dtype=torch.float32, compile=False)
        timed.append(len(tries) > before)
    assert timed == [True] * calibration.ATTEMPTS + [False, False]
    [table] = json.loads(calibration.table_path().read_text())["tables"].values()
    assert table["attempts"] == calibration.ATTEMPTS and not table["complete"]


def broken_compile(fn, **_):
    """torch.compile where no C++ compiler works: the compiled function fails when called."""
    def fail(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    return fail


def test_without_a_working_compiler_the_model_loads_eager_and_eager_kernels_are_timed(folder, cache, monkeypatch, capsys):
    """A machine without a C++ compiler: the calibration's compiled candidates cannot be built, so it
    times the eager ones and keeps that table for eager steps; the model loads with its steps
    eager, said once on stderr."""
    monkeypatch.setattr(torch, "compile", broken_compile)
    model = load_model(folder, device="cpu", dtype=torch.float32, compile=True)
    assert model.compiled is None and cache.calls
    assert capsys.readouterr().err.count("running without torch.compile (no C++ compiler found)") == 1
    tables = json.loads(calibration.table_path().read_text())["tables"]
    assert list(tables) == [calibration.table_key(calibration.model_shapes(model), torch.float32, compiles=False)]
    [table] = tables.values()
    assert not any("compiled" in race["decision"] or any("compiled" in name for name in race["seconds"]) for race in table["races"])


def test_the_compiler_is_built_before_the_first_candidate_is_timed(folder, cache, monkeypatch):
    """The compiler's own first build on a machine (seconds) comes before the calibration's budget
    starts, not inside it."""
    events = []
    monkeypatch.setattr(calibration, "compiler_failure", lambda announce=None: events.append("compiler"))
    monkeypatch.setattr(calibration, "calibrate", lambda *args, **kwargs: events.append("timing") or calibration.Table({}, [], 0.0, True))
    model = load_model(folder, device="cpu", dtype=torch.float32, compile=True)
    assert events == ["compiler", "timing"] and model.compiled is not None
    load_model(folder, device="cpu", dtype=torch.float32, compile=True)  # the table kept: neither again
    assert events == ["compiler", "timing"]


def test_the_compiler_check_says_why_torch_compile_cannot_build_here(monkeypatch):
    assert calibration.compiler_failure() is None
    monkeypatch.setattr(torch, "compile", broken_compile)
    assert calibration.compiler_failure() == "no C++ compiler found"


def test_calibrate_0_keeps_the_portable_default(folder, cache, monkeypatch):
    monkeypatch.setenv(calibration.ENV, "0")
    before = machine.POLICY
    load_model(folder, device="cpu", dtype=torch.float32, compile=False)
    assert machine.POLICY is before and not cache.calls and not calibration.table_path().exists()


def test_the_real_timer_gives_each_candidate_a_time():
    runs = Counter()
    candidates = {name: (lambda name=name: runs.update([name])) for name in ("a", "b")}
    seconds = calibration.taking_turns(1, candidates)
    assert set(seconds) == {"a", "b"} and all(s >= 0 for s in seconds.values())
    assert runs == {"a": calibration.TURNS + 1, "b": calibration.TURNS + 1}
    assert calibration.taking_turns(1, candidates, deadline=0.0) is None  # past its deadline: nothing more run
    assert runs == {"a": calibration.TURNS + 1, "b": calibration.TURNS + 1}


def test_a_timing_past_the_deadline_leaves_the_rest_to_the_default():
    table = calibrate(shapes("float32"), torch.float32, timer=lambda rows, candidates, deadline: None)
    assert not table.complete and table.fields == {} and table.races == []
