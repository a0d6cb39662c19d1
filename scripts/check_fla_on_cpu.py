"""The fla adapters against our torch ops and models, with fla's kernels under Triton's interpreter.

Run by scripts/check_fla_on_cpu.sh, which prepares the interpreter. fp32; tolerances as the
CPU tests' for our own ops (the kernels and ours sum in other orders).
"""

import os
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
from triton.runtime import autotuner  # noqa: E402

# Autotuning would time each configuration on a GPU: take the first instead.
autotuner.Autotuner.do_bench = property(lambda self: (lambda fn, quantiles=None, **kw: [1.0, 1.0, 1.0]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from summarize.engine import load_model  # noqa: E402
from summarize.engine.ops import fla_support, gated_delta_rule, rwkv7_wkv  # noqa: E402
from summarize.engine.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: E402
from summarize.engine.ops.gated_delta_rule_fla import fla_chunk_gated_delta_rule  # noqa: E402
from summarize.engine.ops.rwkv7_wkv import LOG_DECAY_MIN, chunk_rwkv7  # noqa: E402
from summarize.engine.ops.rwkv7_wkv_fla import fla_chunk_rwkv7  # noqa: E402
from tiny_models import RWKV_TINY, blinkdl_checkpoint, dense_reference, save_checkpoint  # noqa: E402

REL = 1e-4
failures = []


def check(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    err = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
    ok = err <= REL
    failures.extend([] if ok else [name])
    print(f"{'ok  ' if ok else 'FAIL'} {name}: relative error {err:.2g}")


def with_fla_on_cpu(op_module) -> None:
    """The op's dispatch takes fla's kernels on the CPU too (they run under Triton's interpreter)."""
    assert hasattr(op_module, "fla_usable"), f"{op_module.__name__} no longer asks fla_usable: update this script"
    op_module.fla_usable = lambda device: True


gen = torch.Generator().manual_seed(0)
B, T, Hk, H, K, V = 2, 150, 2, 4, 32, 48  # odd length, a k head per two v heads, dk != dv
q, k = (F.normalize(torch.randn(B, T, Hk, K, generator=gen), dim=-1) for _ in range(2))
v, g = torch.randn(B, T, H, V, generator=gen), F.logsigmoid(torch.randn(B, T, H, generator=gen) + 2)
beta, s0 = torch.rand(B, T, H, generator=gen), torch.randn(B, H, K, V, generator=gen) * 0.1
o, final, got = fla_chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, initial_state=s0)
stats = (got.state_norm, got.gate_mean, got.delta_norm)
want_o, want_final, want = chunk_gated_delta_rule(
    q=q.repeat_interleave(H // Hk, 2), k=k.repeat_interleave(H // Hk, 2), v=v, g=g, beta=beta, initial_state=s0
)
for name, a, b in zip(("o", "state", "state_norm", "gate_mean", "delta_norm"), (o, final, *stats),
                      (want_o, want_final, want.state_norm, want.gate_mean, want.delta_norm)):
    check(f"gated delta rule {name}", a, b)

N = 32
kk = F.normalize(torch.randn(B, T, 3, N, generator=gen), dim=-1)
x = dict(r=torch.randn(B, T, 3, N, generator=gen), k=torch.randn(B, T, 3, N, generator=gen) * 0.5,
         log_w=LOG_DECAY_MIN * torch.sigmoid(torch.randn(B, T, 3, N, generator=gen) * 2),
         v=torch.randn(B, T, 3, N, generator=gen), a=-kk, b=kk * torch.rand(B, T, 3, N, generator=gen),
         initial_state=torch.randn(B, 3, N, N, generator=gen) * 0.1)
o, final, stats = fla_chunk_rwkv7(**x, dtype=torch.float32)
want_o, want_final, want = chunk_rwkv7(**x)
for name, a, b in zip(("o", "state", "state_norm", "gate_mean", "delta_norm"),
                      (o, final, stats.state_norm, stats.gate_mean, stats.delta_norm),
                      (want_o, want_final, want.state_norm, want.gate_mean, want.delta_norm)):
    check(f"rwkv7 {name}", a, b)

scratch = Path(tempfile.mkdtemp())
qwen = load_model(save_checkpoint(dense_reference(), scratch / "qwen"), device="cpu", dtype=torch.float32, compile=False)
rwkv = load_model(blinkdl_checkpoint(scratch / "rwkv.pth", **RWKV_TINY), device="cpu", dtype=torch.float32)
ids = torch.randint(0, 384, (2, 130), generator=gen)
want_qwen, want_rwkv = (m.forward(ids, m.new_state(2)) for m in (qwen, rwkv))
with_fla_on_cpu(gated_delta_rule)
with_fla_on_cpu(rwkv7_wkv)
check("Qwen3.5 tiny model logits", qwen.forward(ids, qwen.new_state(2)), want_qwen)
check("RWKV-7 tiny model logits", rwkv.forward(ids, rwkv.new_state(2)), want_rwkv)
if fla_support.turned_off():  # a kernel failed and the models fell back to the torch path
    failures.append("fla's kernels ran (they failed and were turned off)")
sys.exit(f"{len(failures)} failed: {', '.join(failures)}" if failures else 0)
