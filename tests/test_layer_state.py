"""Every kind of layer state answers the whole `LayerState` contract, with the same signatures, so
a third kind cannot silently miss a member that `State` or the steps ask for."""

from __future__ import annotations

import inspect

import pytest
import torch

from summarize.engine.state import KVCache, LayerState, RecurrentLayerState

KINDS = {
    "recurrent": lambda: RecurrentLayerState(matrix=torch.zeros(2, 3, 4, 4), shift=torch.zeros(2, 3, 5)),
    "kv cache": lambda: KVCache(keys=torch.zeros(2, 1, 8, 4), values=torch.zeros(2, 1, 8, 4)),
}


def contract_members(protocol: type = LayerState) -> dict[str, object]:
    """A Protocol's own members: its annotated attributes and what its body defines."""
    members = {name: None for name in getattr(protocol, "__annotations__", {})}
    members |= {name: value for name, value in vars(protocol).items() if not name.startswith("_")}
    return members


def parameters(function) -> list[tuple[str, object]]:
    """A method's parameters after self/cls: their names and kinds (annotations are the kinds' own)."""
    return [(p.name, p.kind) for p in list(inspect.signature(function).parameters.values())[1:]]


def misses(kind: type, instance, protocol: type = LayerState) -> list[str]:
    """What `kind` lacks of `protocol`, or answers with another shape of call."""
    wrong = []
    for name, member in contract_members(protocol).items():
        if not hasattr(instance, name):
            wrong.append(f"{name}: missing")
        elif isinstance(member, property) and not isinstance(inspect.getattr_static(kind, name), property):
            wrong.append(f"{name}: not a property")
        elif isinstance(member, classmethod):
            own = inspect.getattr_static(kind, name)
            if not isinstance(own, classmethod) or parameters(own.__func__) != parameters(member.__func__):
                wrong.append(f"{name}: not a classmethod of the same parameters")
        elif inspect.isfunction(member) and parameters(getattr(kind, name)) != parameters(member):
            wrong.append(f"{name}: parameters {parameters(getattr(kind, name))}, not {parameters(member)}")
    return wrong


def test_the_contract_names_what_state_asks_of_a_layer():
    assert {"nbytes", "bytes_per_token", "cached_tokens", "snapshot", "restore", "stack", "reset", "begin_draft",
            "accept", "discard", "keep_window", "tensors", "check", "load"} <= set(contract_members())


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_of_layer_state_answers_the_whole_contract(kind):
    instance = KINDS[kind]()
    assert isinstance(instance, LayerState)
    assert misses(type(instance), instance) == []


def test_a_kind_that_misses_a_member_or_its_parameters_is_found():
    class Partial(RecurrentLayerState):
        def keep_window(self, keep_first: int) -> None:  # one parameter short
            pass

    instance = Partial(matrix=torch.zeros(1, 1, 1, 1), shift=torch.zeros(1, 1))
    assert misses(Partial, instance) == [
        f"keep_window: parameters {parameters(Partial.keep_window)}, not {parameters(LayerState.keep_window)}"
    ]


def test_a_kind_without_a_member_is_not_a_layer_state():
    body = {name: value for name, value in vars(KVCache).items() if name not in ("keep_window", "__dict__", "__weakref__")}
    Forgetful = type("Forgetful", (), body)
    instance = Forgetful(keys=torch.zeros(1, 1, 1, 1), values=torch.zeros(1, 1, 1, 1))
    assert not isinstance(instance, LayerState)
    assert misses(Forgetful, instance) == ["keep_window: missing"]
