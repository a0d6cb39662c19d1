"""The dtype a model loads in when none is asked for: bf16 where the hardware multiplies it, else fp32.

Each test says what torch reports about the CPU, builds the machine policy from that, as a process
does at its start, and asks the loader for its default.
"""

import pytest
import torch

from summarize.engine import loading
from summarize.engine.ops import machine


@pytest.fixture
def reload_policy(monkeypatch):
    """Rebuilds the machine policy from what torch reports now (the test's patches), for the test."""
    return lambda: monkeypatch.setattr(machine, "POLICY", machine.this_cpu())


@pytest.fixture
def x86_cpu(monkeypatch, reload_policy):
    """An x86 CPU on which oneDNN offers bf16 (it does on any AVX-512 core); what it has is set per test."""
    monkeypatch.setattr(machine.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)

    def has(avx512_bf16: bool, amx: bool) -> None:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
        reload_policy()

    return has


def test_an_avx512_cpu_that_only_emulates_bf16_loads_in_fp32(x86_cpu):
    x86_cpu(avx512_bf16=False, amx=False)
    assert loading.default_dtype(torch.device("cpu")) == torch.float32


@pytest.mark.parametrize("avx512_bf16, amx", [(True, False), (False, True), (True, True)])
def test_a_cpu_with_bf16_instructions_loads_in_bf16(x86_cpu, avx512_bf16, amx):
    x86_cpu(avx512_bf16=avx512_bf16, amx=amx)
    assert loading.default_dtype(torch.device("cpu")) == torch.bfloat16


def test_a_cpu_without_onednn_bf16_loads_in_fp32(x86_cpu, monkeypatch, reload_policy):
    x86_cpu(avx512_bf16=True, amx=True)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    reload_policy()
    assert loading.default_dtype(torch.device("cpu")) == torch.float32


def test_an_arm_cpu_goes_by_onednn(monkeypatch, reload_policy):
    monkeypatch.setattr(machine.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    for supported in (True, False):
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: supported)
        reload_policy()
        assert loading.default_dtype(torch.device("cpu")) == (torch.bfloat16 if supported else torch.float32)
