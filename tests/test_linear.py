"""`ops.linear` computes x @ Wᵀ whichever way it asks torch's GEMM to (the order depends on rows and dtype)."""

import pytest
import torch
import torch.nn.functional as F

from summarize.engine.ops.linear import WEIGHT_FIRST_MAX_ROWS, WEIGHT_FIRST_MIN_ROWS, linear

# either side of each switch between the orders, and rows in more than one dimension
ROW_COUNTS = [(1,), (WEIGHT_FIRST_MIN_ROWS - 1,), (WEIGHT_FIRST_MIN_ROWS,), (2, 4), (WEIGHT_FIRST_MAX_ROWS,),
              (WEIGHT_FIRST_MAX_ROWS + 1,), (4, 9)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", ROW_COUNTS)
def test_linear_is_x_times_the_weight_transposed(dtype, shape):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, 96, generator=gen).to(dtype)
    weight = torch.randn(200, 96, generator=gen).to(dtype)
    out = linear(x, weight)
    assert out.shape == (*shape, 200) and out.dtype == dtype
    # the same sums in another order: fp32 rounding apart, or bf16's rounding of the result
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), F.linear(x.float(), weight.float()), rtol=tolerance, atol=tolerance * 10)
