"""When one of flash-linear-attention's kernels fails (a GPU it was not built for, say), fla is
turned off for the process with one line on stderr, and the models run the torch path instead."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from summarize.engine.ops import fla_support, gated_delta_rule_fla, rwkv7_wkv_fla

CUDA = torch.device("cuda")


def broken(*args, **kwargs):
    raise RuntimeError("no kernel image is available for execution on the device\n(the rest of it)")


@pytest.fixture
def fla_with_broken_kernels(monkeypatch):
    monkeypatch.setattr(fla_support, "_failure", [])  # a process in which fla has not failed yet
    monkeypatch.setattr(gated_delta_rule_fla, "_kernels", lambda: (broken,) * 5)
    monkeypatch.setattr(rwkv7_wkv_fla, "_forward", lambda: broken)


def test_a_failing_kernel_turns_fla_off_with_one_line(fla_with_broken_kernels, capsys):
    assert gated_delta_rule_fla.fla_usable(CUDA) and rwkv7_wkv_fla.fla_usable(CUDA)
    q = k = F.normalize(torch.randn(1, 5, 2, 8), dim=-1)
    v, g, beta, state = torch.randn(1, 5, 2, 8), -torch.rand(1, 5, 2), torch.rand(1, 5, 2), torch.zeros(1, 2, 8, 8)

    assert gated_delta_rule_fla.fla_chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, initial_state=state) is None
    assert not gated_delta_rule_fla.fla_usable(CUDA) and not rwkv7_wkv_fla.fla_usable(CUDA)
    rwkv = dict(r=q, log_w=-torch.rand(1, 5, 2, 8), k=k, v=v, a=-k, b=k, initial_state=state)
    assert rwkv7_wkv_fla.fla_chunk_rwkv7(**rwkv, dtype=torch.float32) is None

    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "summarize: running without flash-linear-attention's kernels "
        "(no kernel image is available for execution on the device)"
    ]


def test_without_fla_core_or_a_gpu_fla_is_not_used(monkeypatch):
    monkeypatch.setattr(fla_support, "_failure", [])
    assert not gated_delta_rule_fla.fla_usable(torch.device("cpu"))
    monkeypatch.setattr(gated_delta_rule_fla, "_kernels", lambda: None)  # fla-core not importable
    monkeypatch.setattr(rwkv7_wkv_fla, "_forward", lambda: None)
    assert not gated_delta_rule_fla.fla_usable(CUDA) and not rwkv7_wkv_fla.fla_usable(CUDA)
