"""Compiled prefill and decode steps compute what the eager ones do, and fall back to them cleanly.

Tolerance: fp32 logits within 1e-4 of the largest logit (the compiled projections sum in a
different order from torch's GEMM); diagnostics within 1e-4 relative.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from summarize.engine import State, compiled, compiled_store, load_model
from tiny_models import dense_reference, moe_reference, save_checkpoint

REL_TOL = 1e-4
VOCAB = 384


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    scale = want.abs().max().item()
    err = (got.float() - want.float()).abs().max().item()
    assert err <= REL_TOL * scale, f"max |diff| {err:.3g} > {REL_TOL} x {scale:.3g}"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_checkpoint(dense_reference(), tmp_path_factory.mktemp("dense"))


@pytest.fixture
def fresh_store(monkeypatch, tmp_path):
    """Models loaded in the test keep their captured graphs in an empty folder of their own: none
    is loaded from what earlier tests (or runs) captured."""
    store = compiled_store.StepStore(tmp_path / "steps")
    monkeypatch.setattr(compiled, "default_store", lambda: store)
    return store


def compiled_from_the_start(model):
    """Every step through its graphs from its first call: a read of any length builds the prefill
    graphs, the first verify pass the verify graphs (by default they wait for a long read and
    for a few verify passes)."""
    model.compiled.prefill_from, model.compiled.eager_verifies = 1, 0
    return model


@pytest.fixture(scope="module")
def models(folder):
    eager = load_model(folder, device="cpu", dtype=torch.float32, compile=False)
    compiled = compiled_from_the_start(load_model(folder, device="cpu", dtype=torch.float32, compile=True))
    assert eager.compiled is None and compiled.compiled is not None
    return eager, compiled


def prompt(length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


def test_compiled_steps_equal_eager_steps_with_their_diagnostics(models):
    eager, compiled = models
    reports = {}
    for name, model in (("eager", eager), ("compiled", compiled)):
        state = model.new_state(1)
        model.prefill(prompt(23, seed=1), state)
        spans = []
        model.listener = spans.append
        try:
            reports[name] = (spans, [model.decode(torch.tensor([t]), state) for t in (5, 9, 2, 7)], state)
        finally:
            model.listener = None
    (eager_spans, eager_logits, eager_state), (spans, logits, state) = reports["eager"], reports["compiled"]
    for got, want in zip(logits, eager_logits):
        assert_close(got, want)
    for got, want in zip(state.layers, eager_state.layers):
        for name, tensor in got.tensors().items():
            assert_close(tensor, want.tensors()[name])
    assert len(spans) == len(eager_spans) == 4
    for span, eager_span in zip(spans, eager_spans):
        for layer, eager_layer in zip(span.layers, eager_span.layers):
            assert layer.kind == eager_layer.kind
            for field in ("state_norm", "gate_mean", "delta_norm"):
                got, want = getattr(layer, field), getattr(eager_layer, field)
                assert (got is None) == (want is None)
                if want is not None:
                    assert got == pytest.approx(want, rel=1e-4)


def test_decode_steps_go_on_across_a_growing_cache_without_recompiling(models):
    """Attention over the cache runs between the compiled graphs: when the cache's buffer grows
    (256 → 512 positions here), the same graphs go on, with the same logits."""
    from torch._dynamo.utils import counters

    eager, compiled = models
    states = eager.new_state(1), compiled.new_state(1)
    for model, state in zip((eager, compiled), states):
        model.prefill(prompt(253, seed=6), state)
    compiled.decode(torch.tensor([3]), states[1])  # compiles, if no test did before
    eager.decode(torch.tensor([3]), states[0])
    graphs = counters["stats"]["unique_graphs"]
    capacities = set()
    for token in (7, 1, 9, 4, 2):  # positions 254..258: past the first 256
        assert_close(compiled.decode(torch.tensor([token]), states[1]), eager.decode(torch.tensor([token]), states[0]))
        capacities.add(states[1].layers[3].capacity)
    assert capacities == {256, 512}
    assert counters["stats"]["unique_graphs"] == graphs
    assert states[1].kv_tokens == states[0].kv_tokens == 259


def test_steps_are_compiled_when_first_used_and_short_reads_do_not_compile_prefill(folder):
    """Loading compiles nothing. Reads shorter than a full prefill block run eagerly; the first
    full block builds the prefill graphs; the decode step of a batch size is compiled at its first
    step. Each compile is announced while it lasts, and only then."""
    heard = []
    model = load_model(folder, device="cpu", dtype=torch.float32, compile=True, announce=heard.append)
    assert heard == [] and model.compiled.seconds == {}
    model.prefill(prompt(compiled.PREFILL_COMPILE_TOKENS - 1, seed=1), model.new_state(1))
    assert heard == [] and not model.compiled.prefill_ready
    model.prefill(prompt(compiled.PREFILL_COMPILE_TOKENS + 5, seed=1), model.new_state(1))  # one full block, then 5
    assert heard == ["compiling the prefill step", None]
    for rows in (2, 2, 1, 2, 1):
        model.decode(torch.tensor([5] * rows), model.new_state(rows))
    assert heard[2:] == ["compiling the decode step for 2 rows", None, "compiling the decode step for 1 row", None]
    assert set(model.compiled.seconds) == {"prefill", "decode B=2", "decode B=1"}


def test_each_graph_is_traced_once(folder, fresh_store):
    """A layer's float constants (norm epsilons, scales) are taken as they are: no graph is traced,
    handed to the compiler and then traced again, which would cost every process a trace and a
    cache miss."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # what earlier tests compiled would otherwise serve this model
    before = dict(counters["aot_autograd"])
    model = load_model(folder, device="cpu", dtype=torch.float32, compile=True)
    compiled_from_the_start(model)
    state = model.new_state(1)
    model.prefill(prompt(70, seed=2), state)
    model.decode(torch.tensor([3]), state)
    started = counters["aot_autograd"]["total"] - before.get("total", 0)
    assert started > 0 and counters["aot_autograd"]["ok"] - before.get("ok", 0) == started


def test_no_compiled_step_breaks_its_graph(folder, fresh_store):
    """An attention layer reads its KV cache eagerly between two graphs of its own: a graph broken
    inside one compiled call would have dynamo trace every frame around the break twice, in every
    process."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    breaks = sum(counters["graph_break"].values())
    model = compiled_from_the_start(load_model(folder, device="cpu", dtype=torch.float32, compile=True))
    assert any(layer.reads_cache for layer in model.layers)
    state = model.new_state(2)
    model.prefill(prompt(70, seed=4).expand(2, -1), state)
    model.decode(torch.tensor([3, 4]), state)
    model.verify(torch.tensor([[5, 6, 7], [8, 9, 10]]), state)
    assert set(model.compiled.seconds) == {"prefill", "decode B=2", "verify B=2"}
    assert sum(counters["graph_break"].values()) == breaks


@pytest.mark.parametrize("length", [2, 45, 70])  # shortest; chunks of the delta rule and a rest
def test_compiled_prefill_equals_eager_prefill_with_its_diagnostics(models, length):
    """One graph per layer kind serves every length: logits, state and diagnostics as eager."""
    eager, compiled = models
    runs = {}
    for name, model in (("eager", eager), ("compiled", compiled)):
        state, spans = model.new_state(1), []
        model.prefill(prompt(7, seed=2), state)  # a state that has read before: not from zeros
        model.listener = spans.append
        try:
            runs[name] = (model.prefill(prompt(length, seed=length), state), state, spans)
        finally:
            model.listener = None
    (want, eager_state, eager_spans), (got, state, spans) = runs["eager"], runs["compiled"]
    assert_close(got, want)
    for got_layer, want_layer in zip(state.layers, eager_state.layers):
        for name, tensor in got_layer.tensors().items():
            assert_close(tensor, want_layer.tensors()[name])
    [span], [eager_span] = spans, eager_spans
    for layer, eager_layer in zip(span.layers, eager_span.layers):
        for field in ("state_norm", "gate_mean", "delta_norm"):
            got, want = getattr(layer, field), getattr(eager_layer, field)
            assert (got is None) == (want is None)
            if want is not None:
                assert got == pytest.approx(want, rel=1e-4)


def test_compiled_full_logits_equal_eager(models):
    eager, compiled = models
    ids = prompt(40, seed=4)
    assert_close(compiled(ids, compiled.new_state(1)), eager(ids, eager.new_state(1)))


def test_the_mtp_head_reads_a_prompt_through_the_compiled_prefill_as_eagerly(tmp_path):
    """With `--drafts mtp` the head reads each prefill block through the model's steps: compiled,
    its cache holds what the eager head's holds."""
    from safetensors.torch import save_file

    from summarize.engine.generation.mtp_drafts import HeadCache
    from summarize.engine.generation.sequences import Sequences
    from tiny_models import mtp_reference

    reference = dense_reference()
    folder = save_checkpoint(reference, tmp_path)
    save_file(mtp_reference(reference)[1], str(folder / "model-mtp.safetensors"))
    eager = load_model(folder, device="cpu", dtype=torch.float32, compile=False)
    compiled = compiled_from_the_start(load_model(folder, device="cpu", dtype=torch.float32, compile=True))
    caches = {}
    for name, model in (("eager", eager), ("compiled", compiled)):
        state = Sequences(model.new_state(1), HeadCache.new(model, 1))
        state.prefill(model, prompt(23, seed=5))
        cache = state.memory.state.layers[0]
        caches[name] = (cache.keys[:, :, : cache.length], cache.values[:, :, : cache.length])
    assert caches["compiled"][0].shape[2] == 22  # every position but the last, which waits for its next token
    for got, want in zip(caches["compiled"], caches["eager"]):
        assert_close(got, want)


def test_compiled_moe_steps_equal_eager(tmp_path):
    """The MoE dispatch stays eager inside compiled prefill and decode steps."""
    folder = save_checkpoint(moe_reference(), tmp_path)
    eager = load_model(folder, device="cpu", dtype=torch.float32, compile=False)
    compiled = compiled_from_the_start(load_model(folder, device="cpu", dtype=torch.float32, compile=True))
    assert compiled.compiled is not None
    for length in (30, 47):
        states = eager.new_state(1), compiled.new_state(1)
        want, got = (model.prefill(prompt(length, seed=length), s) for model, s in zip((eager, compiled), states))
        assert_close(got, want)
        token = want.argmax(-1)
        assert_close(compiled.decode(token, states[1]), eager.decode(token, states[0]))


@pytest.mark.parametrize("lengths", [(9, 31), (9, 31, 20)])  # rows streamed; rows through the GEMM
def test_compiled_batch_of_stacked_states_equals_eager(models, lengths):
    """Rows that read different lengths (padded KV caches, per-row positions), as map-reduce decodes."""
    eager, compiled = models
    rows = {}
    for name, model in (("eager", eager), ("compiled", compiled)):
        singles = []
        for length in lengths:
            state = model.new_state(1)
            model.prefill(prompt(length, seed=length), state)
            singles.append(state)
        batch = State.stack(singles)
        rows[name] = [model.decode(torch.tensor([4, 8, 1][: len(lengths)]), batch) for _ in range(3)]
    for got, want in zip(rows["compiled"], rows["eager"]):
        assert_close(got, want)


def test_a_compiler_failure_leaves_the_model_eager(folder, monkeypatch, capsys, fresh_store):
    """Without a working compiler every step falls back at its first use, said once on stderr,
    and computes what the eager model does."""
    def broken_compile(fn, **_):
        def fail(*args, **kwargs):
            raise RuntimeError("no C++ compiler found")

        return fail

    eager = load_model(folder, device="cpu", dtype=torch.float32, compile=False)
    monkeypatch.setattr(torch, "compile", broken_compile)
    model = compiled_from_the_start(load_model(folder, device="cpu", dtype=torch.float32, compile=True))
    states = eager.new_state(1), model.new_state(1)
    for m, state in zip((eager, model), states):
        m.prefill(prompt(5, seed=3), state)
    assert_close(model.decode(torch.tensor([1]), states[1]), eager.decode(torch.tensor([1]), states[0]))
    assert_close(model.verify(torch.tensor([[2, 3, 4]]), states[1]), eager.verify(torch.tensor([[2, 3, 4]]), states[0]))
    assert capsys.readouterr().err.count("running without torch.compile (no C++ compiler found)") == 1


@pytest.mark.parametrize(
    ("env", "device", "weight_bytes", "expected"),
    [
        ("", "cpu", 2**30, True),  # a real model on the CPU: worth compiling
        ("", "cpu", 2**20, False),  # a tiny one: compiling costs more than it saves
        ("1", "cpu", 2**20, True),
        ("0", "cpu", 2**30, False),
        ("", "cuda", 2**30, False),  # the GPU keeps the eager path
    ],
)
def test_when_steps_are_compiled(models, monkeypatch, env, device, weight_bytes, expected):
    monkeypatch.setenv(compiled.ENV, env)
    assert compiled.wanted(models[0], torch.device(device), weight_bytes) is expected


def torchs_default_cache_folder() -> str:
    """What importing torch._dynamo writes into TORCHINDUCTOR_CACHE_DIR when it is unset."""
    return os.path.abspath(default_cache_dir())


def test_importing_the_engine_leaves_the_environment_as_it_was(tmp_path):
    """In a fresh process: nothing of the engine's in os.environ, and no cache folder made. Only
    torch's own write may show: importing torch._dynamo (a decorator in the models does) sets
    TORCHINDUCTOR_CACHE_DIR to torch's default."""
    env = {name: value for name, value in os.environ.items() if name != compiled.CACHE_ENV}
    env |= {"XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)}
    script = ("import json, os; before = dict(os.environ); import summarize.engine; "
              "print(json.dumps({k: v for k, v in os.environ.items() if before.get(k) != v} "
              "| {k: None for k in before if k not in os.environ}))")
    changed = json.loads(subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                                        check=True).stdout)
    assert changed in ({}, {compiled.CACHE_ENV: torchs_default_cache_folder()})
    assert not (tmp_path / "summarize").exists()


def test_built_kernels_are_kept_in_the_users_cache_folder(monkeypatch, tmp_path):
    monkeypatch.delenv(compiled.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    compiled.keep_kernels_across_reboots()
    folder = tmp_path / "summarize" / "torchinductor"
    assert folder.is_dir() and os.environ[compiled.CACHE_ENV] == str(folder)


def test_torchs_default_cache_folder_counts_as_not_chosen(monkeypatch, tmp_path):
    monkeypatch.setenv(compiled.CACHE_ENV, torchs_default_cache_folder())  # as importing torch._dynamo leaves it
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    compiled.keep_kernels_across_reboots()
    assert os.environ[compiled.CACHE_ENV] == str(tmp_path / "summarize" / "torchinductor")


def test_a_model_loaded_to_compile_keeps_its_kernels_in_the_users_cache_folder(folder, monkeypatch, tmp_path):
    monkeypatch.delenv(compiled.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    load_model(folder, device="cpu", dtype=torch.float32, compile=False)
    assert compiled.CACHE_ENV not in os.environ  # an eager model compiles nothing
    load_model(folder, device="cpu", dtype=torch.float32, compile=True)
    assert os.environ[compiled.CACHE_ENV] == str(tmp_path / "summarize" / "torchinductor")


def test_a_cache_folder_chosen_by_the_environment_is_kept(monkeypatch, tmp_path):
    monkeypatch.setenv(compiled.CACHE_ENV, str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    compiled.keep_kernels_across_reboots()
    assert os.environ[compiled.CACHE_ENV] == str(tmp_path / "mine")


def test_an_unusable_cache_folder_leaves_torchs_default(monkeypatch, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would go")
    monkeypatch.delenv(compiled.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    compiled.keep_kernels_across_reboots()
    assert compiled.CACHE_ENV not in os.environ


@pytest.fixture(scope="module")
def int8_models(folder):
    eager = load_model(folder, device="cpu", dtype=torch.float32, compile=False, quantize="int8")
    return eager, compiled_from_the_start(load_model(folder, device="cpu", dtype=torch.float32, compile=True, quantize="int8"))


@pytest.mark.parametrize("weights", ["models", "int8_models"])  # int8 widens its weights in the graph
def test_compiled_verify_lands_rows_where_eager_verify_does_through_one_graph_for_every_draft_length(weights, request):
    """Drafts of any length verify through the same compiled graphs (one shorter than
    VERIFY_MIN_TOKENS is padded, and the padding never lands): the logits of eager verify, and
    rows that keep different lengths land on the same state."""
    from torch._dynamo.utils import counters

    eager, model = request.getfixturevalue(weights)
    g = torch.Generator().manual_seed(7)
    states = eager.new_state(2), model.new_state(2)
    prompts = torch.randint(0, VOCAB, (2, 13), generator=g)
    for m, state in zip((eager, model), states):
        m.prefill(prompts, state)
    graphs = None
    for length in (4, 6, 1, 2, 3, 8, 5):
        span, counts = torch.randint(0, VOCAB, (2, length), generator=g), torch.tensor([1, length])
        assert_close(model.verify(span, states[1]), eager.verify(span, states[0]))
        for m, state in zip((eager, model), states):
            m.accept(state, counts)
        if length == 6:  # the graphs of a first draft, then of rows whose cache lengths differ
            graphs = counters["stats"]["unique_graphs"]
        elif graphs is not None:
            assert counters["stats"]["unique_graphs"] == graphs, f"a draft of {length} compiled again"
    assert states[1].kv_tokens == states[0].kv_tokens
    for got, want in zip(states[1].layers, states[0].layers):
        for name, tensor in got.tensors().items():
            assert_close(tensor, want.tensors()[name])
    assert_close(model.decode(torch.tensor([3, 5]), states[1]), eager.decode(torch.tensor([3, 5]), states[0]))


def test_a_batch_size_compiles_its_verify_step_after_a_few_eager_verify_passes(folder):
    """Where drafts do not pay the planner stops after a probe or two: those verify passes run
    eagerly, and only a batch size that keeps verifying has its graphs built."""
    heard = []
    model = load_model(folder, device="cpu", dtype=torch.float32, compile=True, announce=heard.append)
    first = compiled.EAGER_VERIFIES + 1
    for rows, length in [(1, 4)] * compiled.EAGER_VERIFIES + [(3, 2)] * 3 + [(1, 6), (1, 1)]:
        state = model.new_state(rows)
        model.verify(torch.full((rows, length), 5), state)
        model.accept(state, torch.ones(rows, dtype=torch.long))
        if len(heard) == 0:
            assert model.compiled.verified[rows] < first
    assert heard == ["compiling the verify step for 1 row", None]
    assert set(model.compiled.seconds) == {"verify B=1"}
    assert model.compiled.verified[3] == 3 and not model.compiled.compiles_verify(3)


@pytest.mark.parametrize("graph", ["decode_graphs", "verify_graphs"])
def test_a_step_that_fails_to_compile_runs_eagerly_with_the_same_logits(folder, capsys, graph):
    """A decode or verify graph is first built on a scratch state: if that fails, the real state is
    left as it was and every such step of the run runs eagerly, said once on stderr."""
    eager = load_model(folder, device="cpu", dtype=torch.float32, compile=False)
    model = compiled_from_the_start(load_model(folder, device="cpu", dtype=torch.float32, compile=True))

    def fails_to_compile(*args):
        raise RuntimeError("C++ compile failed: no such compiler")

    setattr(model.compiled, graph, compiled.Graphs(fails_to_compile, fails_to_compile, fails_to_compile))
    states = eager.new_state(1), model.new_state(1)
    for m, state in zip((eager, model), states):
        m.prefill(prompt(9, seed=3), state)
    for span in ([4, 8, 1], [2, 6], [7]):
        assert_close(model.verify(torch.tensor([span]), states[1]), eager.verify(torch.tensor([span]), states[0]))
        for m, state in zip((eager, model), states):
            m.accept(state, torch.tensor([len(span)]))
        for token in span:
            assert_close(model.decode(torch.tensor([token]), states[1]), eager.decode(torch.tensor([token]), states[0]))
    assert capsys.readouterr().err.count("running without torch.compile (C++ compile failed") == 1
