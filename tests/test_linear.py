"""`ops.linear` computes x @ Wᵀ whichever way it asks torch's GEMM to (the order depends on rows and dtype)."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from summarize.engine.ops import machine
from summarize.engine.ops.linear import Projection, linear

PORTABLE = machine.policy_for(multiplies_bf16=False, int4_block_rows=machine.POLICY.int4_block_rows)
# policies a calibration may install: the portable default, and one that streams a few rows itself
# (as calibrations on AVX2-only CPUs chose) and takes W @ xᵀ from two rows
POLICIES = {"portable": PORTABLE, "streams 9 rows": replace(PORTABLE, weight_first_min_rows=2, streamed_fp32_max_rows=9)}
CPU_KERNELS = list(POLICIES)
STREAMS = POLICIES["streams 9 rows"]
# either side of each switch between the orders, and rows in more than one dimension
ROW_COUNTS = [(1,), (2,), (PORTABLE.weight_first_min_rows - 1,), (PORTABLE.weight_first_min_rows,), (2, 4),
              (PORTABLE.weight_first_max_rows,), (PORTABLE.weight_first_max_rows + 1,), (4, 9)]


@pytest.fixture
def cpu_running(monkeypatch):
    """Installs the named policy, for the test."""
    return lambda kernels: monkeypatch.setattr(machine, "POLICY", POLICIES[kernels])


@pytest.mark.parametrize("kernels", CPU_KERNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", ROW_COUNTS)
def test_linear_is_x_times_the_weight_transposed(dtype, shape, kernels, cpu_running):
    cpu_running(kernels)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, 96, generator=gen).to(dtype)
    weight = torch.randn(200, 96, generator=gen).to(dtype)
    out = linear(x, weight)
    assert out.shape == (*shape, 200) and out.dtype == dtype
    # the same sums in another order: fp32 rounding apart, or bf16's rounding of the result
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), F.linear(x.float(), weight.float()), rtol=tolerance, atol=tolerance * 10)


@pytest.mark.parametrize("kernels", CPU_KERNELS)
@pytest.mark.parametrize("dynamic", [False, True])  # a decode step's graph, a verify span's
@pytest.mark.parametrize("rows", [1, 2, STREAMS.streamed_fp32_max_rows, STREAMS.streamed_fp32_max_rows + 1])
def test_compiled_fp32_linear_is_x_times_the_weight_transposed(rows, dynamic, kernels, cpu_running):
    """Inside a compiled step too, whether it streams the weights itself or asks torch's GEMM."""
    cpu_running(kernels)
    torch._dynamo.reset()  # graphs built under the other policy
    gen = torch.Generator().manual_seed(0)
    x, weight = torch.randn(rows, 96, generator=gen), torch.randn(200, 96, generator=gen)
    got = torch.compile(linear, fullgraph=True, dynamic=dynamic)(x, weight)
    torch.testing.assert_close(got, F.linear(x, weight), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dynamic", [False, True])  # a decode step's graph, a verify span's
@pytest.mark.parametrize("rows", [1, 5, machine.POLICY.int8_packed_max_rows, machine.POLICY.int8_packed_max_rows + 1])
def test_compiled_int8_projection_equals_its_dequantized_weight_in_fp32(rows, dynamic):
    """Inside a compiled step an fp32 int8 projection widens each weight as it reads it (a few
    rows, a fixed number or a span's) or dequantizes first (more): either is x @ (int8 · scale)ᵀ
    to fp32 rounding."""
    gen = torch.Generator().manual_seed(0)
    projection = Projection(torch.randn(200, 96, generator=gen))
    projection.quantize_int8()
    x = torch.randn(rows, 96, generator=gen)
    want = F.linear(x, projection.weight.float() * projection.scale[:, None])
    got = torch.compile(projection, fullgraph=True, dynamic=dynamic)(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
