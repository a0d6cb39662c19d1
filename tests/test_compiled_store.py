"""Captured layer graphs are kept on disk: a later process loads them instead of tracing, computes
what the graphs that were traced compute, and a damaged or stale file costs a capture, never a
wrong result.

Tolerance: a loaded graph's logits equal those of the process that captured it exactly (the same
kernels); against eager steps, fp32 logits within 1e-4 of the largest logit (test_compiled.py).
"""

from __future__ import annotations

import pytest
import torch

from summarize.engine import compiled, compiled_store, load_model
from tiny_models import dense_reference, save_checkpoint

REL_TOL = 1e-4


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_checkpoint(dense_reference(), tmp_path_factory.mktemp("dense"))


@pytest.fixture
def store(monkeypatch, tmp_path):
    store = compiled_store.StepStore(tmp_path / "steps")
    monkeypatch.setattr(compiled, "default_store", lambda: store)
    return store


def a_process(folder):
    """A model as a new process has it: dynamo's in-memory graphs forgotten, every step compiled
    from its first call."""
    torch._dynamo.reset()
    model = load_model(folder, device="cpu", dtype=torch.float32, compile=True)
    model.compiled.prefill_from = 1
    return model


def run(model) -> list[torch.Tensor]:
    """A prompt, then three decode steps of one row and one of two rows: their logits."""
    state = model.new_state(1)
    logits = [model.prefill(torch.arange(70)[None] % 300, state)]
    logits += [model.decode(torch.tensor([token]), state) for token in (5, 9, 2)]
    pair = model.new_state(2)
    model.prefill(torch.arange(40).view(2, 20) % 300, pair)
    return logits + [model.decode(torch.tensor([3, 4]), pair)]


def traces() -> int:
    from torch._dynamo.utils import counters

    return counters["aot_autograd"]["total"]


def test_a_later_process_loads_the_graphs_without_tracing_and_computes_the_same(folder, store):
    first = run(a_process(folder))
    files = sorted(store.folder.glob("*.pt"))
    assert files and all(f.name.startswith(compiled_store.generation() + "-") for f in files)
    before = traces()
    again = run(a_process(folder))
    assert traces() == before  # no graph traced, the head's included
    for got, want in zip(again, first):
        assert torch.equal(got, want)
    eager = run(load_model(folder, device="cpu", dtype=torch.float32, compile=False))
    for got, want in zip(again, eager):
        assert (got - want).abs().max() <= REL_TOL * want.abs().max()
    assert sorted(store.folder.glob("*.pt")) == files  # nothing captured again


def test_a_damaged_file_is_captured_again(folder, store):
    first = run(a_process(folder))
    files = sorted(store.folder.glob("*.pt"))
    for f in files:
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    again = run(a_process(folder))
    for got, want in zip(again, first):
        assert (got - want).abs().max() <= REL_TOL * want.abs().max()
    assert sorted(store.folder.glob("*.pt")) == files and all(compiled_store.StepStore(store.folder).load(f) for f in files)


def test_files_of_another_torch_or_source_are_removed_at_the_next_save(folder, store):
    store.folder.mkdir(parents=True)
    stale = store.folder / "0123456789abcdef-00.pt"
    stale.write_bytes(b"a graph of an earlier version")
    run(a_process(folder))
    assert not stale.exists() and any(store.folder.glob("*.pt"))


def test_a_graph_whose_guards_refuse_a_call_leaves_it_to_the_next(folder, store):
    """Lengths on either side of a branch the graph was captured on (the fp32 products' row
    ranges) each get a graph of their own under one variant, and each computes what eager does."""
    model = a_process(folder)
    eager = load_model(folder, device="cpu", dtype=torch.float32, compile=False)
    for length in (70, 5, 45, 2):
        got, want = (m.prefill(torch.arange(length)[None] % 300, m.new_state(1)) for m in (model, eager))
        assert (got - want).abs().max() <= REL_TOL * want.abs().max()
    prefill = model.compiled.prefill_graphs.layer
    assert max(len(graphs) for graphs in prefill.graphs.values()) > 1
