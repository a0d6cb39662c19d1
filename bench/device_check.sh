#!/usr/bin/env bash
# The GPU checks, as one short script for a lent GPU machine (it has torch, Triton and
# transformers, but no network): the CUDA tests, then bench_cuda.py on the 0.8B shape.
#
#   bash bench/device_check.sh --prepare   # here, with network: fla-core's wheel and the reference
#                                          # config into .device/ (ignored by git)
#   bash bench/device_check.sh             # there, with .device carried; results under $OUT
#
# About 5 minutes on an H200 (building the random checkpoint on its CPUs is one of them).
set -uo pipefail
cd "$(dirname "$0")/.."
FLA_CORE="fla-core==0.5.2"

if [[ "${1:-}" == "--prepare" ]]; then
    set -e
    grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
    mkdir -p .device/reference/qwen3.5
    python3 -m pip download --no-deps --only-binary=:all: -d .device "$FLA_CORE"
    cp ../shared/reference/qwen3.5/Qwen3.5-0.8B.config.json ../shared/reference/qwen3.5/tokenizer.json \
        .device/reference/qwen3.5/
    du -sh .device
    exit 0
fi

OUT="${OUT:-/tmp/device-out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
if [[ ! -e ../shared/reference/qwen3.5/Qwen3.5-0.8B.config.json ]]; then  # random_checkpoint.py reads it there
    mkdir -p ../shared/reference && cp -r .device/reference/qwen3.5 ../shared/reference/
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"

status=0
python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py "tests/test_generate.py::test_cuda_overlap_matches_plain_loop" \
    2>&1 | tee "$OUT/pytest_cuda.txt" || status=1
python3 bench/bench_cuda.py --folder /tmp/qwen3.5-0.8B-random --json "$OUT/bench_cuda.json" \
    2> "$OUT/bench_cuda.err" | tee "$OUT/bench_cuda.md" || status=1
tail -5 "$OUT/bench_cuda.err"
exit $status
