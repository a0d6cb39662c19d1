#!/usr/bin/env bash
# Checks the fla adapters (Gated DeltaNet and RWKV-7 prefill on CUDA) without a GPU: fla-core's
# Triton kernels run on the CPU under Triton's interpreter (TRITON_INTERPRET=1), in fp32, against
# our torch ops and models. A development check, not a test: a minute or two, tiny shapes, and the
# interpreter's bf16 is not faithful (bf16 and speed are checked on a GPU: bench/device_check.sh).
#
#   bash scripts/check_fla_on_cpu.sh [folder for triton + fla-core, default /tmp/fla-cpu-site]
set -euo pipefail
cd "$(dirname "$0")/.."
site="${1:-/tmp/fla-cpu-site}"
if [[ ! -d "$site/fla" ]]; then
    python -m pip install -q --target "$site" --no-deps triton==3.6.0 fla-core==0.5.2 einops
    # What the interpreter cannot run as the kernels are written, changed in this private copy only:
    # int() of a one-element array (numpy 2), .to() on a Python loop counter, and tl.gather.
    sed -i 's/lambda self: int(self.handle.data))/lambda self: int(self.handle.data.reshape(-1)[0]))/' \
        "$site/triton/runtime/interpreter.py"
    sed -i 's/i_t\.to(tl\.int64)/tl.full([], i_t, tl.int64)/g' "$site/fla/ops/common/chunk_delta_h.py"
    sed -i "s/^IS_GATHER_SUPPORTED = .*/IS_GATHER_SUPPORTED = False/" "$site/fla/utils/_device.py"
fi
PYTHONPATH="$site:$PWD:$PWD/tests" python scripts/check_fla_on_cpu.py
