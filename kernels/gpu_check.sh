#!/usr/bin/env bash
# One-go GPU check for a session with an NVIDIA GPU (lessons 09-10):
#   1. the kernel tests, natively on the GPU (they add 4096-14336-sized shapes there),
#   2. the full benchmark, which writes results/bench_cuda_<gpu>.json with every target's
#      value and whether it was met.
# Usage: bash kernels/gpu_check.sh            (from the repository root; about 3-6 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
test -x "$PY" || PY=python3
unset TRITON_INTERPRET   # native kernels, not the interpreter
"$PY" - <<'PYEOF'
import torch, sys
if not torch.cuda.is_available():
    sys.exit("gpu_check.sh: no CUDA GPU visible to torch; run the CPU tests with `make test` instead")
p = torch.cuda.get_device_properties(0)
print(f"GPU: {p.name}, compute capability {p.major}.{p.minor}, {p.total_memory / 1e9:.0f} GB")
PYEOF
echo "== kernel tests (native) =="
"$PY" -m pytest -q -p no:nbval -o addopts="" tests/test_kernels_w8a16.py tests/test_kernels_w4a16.py \
    tests/test_kernels_fp8.py tests/test_bench.py
echo "== benchmark =="
"$PY" -m kernels.bench "$@"
