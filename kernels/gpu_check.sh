#!/usr/bin/env bash
# One-go GPU check for a session with an NVIDIA GPU (lessons 09-10):
#   1. the kernel tests, natively on the GPU (they add 4096-14336-sized shapes there), with
#      autotuning off for the shape sweep (COURSE_KERNELS_AUTOTUNE=0: one config per
#      specialization, so the sweep compiles little) and one test with autotuning on;
#   2. the benchmark, which writes results/bench_cuda_<gpu>[_quick].json with every
#      target's value and whether it was met. It saves the JSON after every timed row
#      (marked "partial": true until the end), so a run cut short still leaves data.
#
# Usage (from anywhere; about 3-5 minutes quick, 6-10 minutes full on an H100):
#   bash kernels/gpu_check.sh            # tests + full benchmark (every shape and batch)
#   bash kernels/gpu_check.sh --quick    # tests + the subset that still covers every target
#   SKIP_TESTS=1 bash kernels/gpu_check.sh --quick     # benchmark only
#   NOTEBOOKS=1 bash kernels/gpu_check.sh              # also run lessons 09-10 under nbval
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
test -x "$PY" || PY=python3
unset TRITON_INTERPRET   # native kernels, not the interpreter
"$PY" - <<'PYEOF'
import sys
import torch
if not torch.cuda.is_available():
    sys.exit("gpu_check.sh: no CUDA GPU visible to torch; run the CPU tests with `make test` instead")
p = torch.cuda.get_device_properties(0)
print(f"GPU: {p.name}, compute capability {p.major}.{p.minor}, {p.total_memory / 1e9:.0f} GB, "
      f"torch {torch.__version__}")
PYEOF
if [ -z "${SKIP_TESTS:-}" ]; then
  echo "== kernel tests (native, autotuning off for the sweep) =="
  COURSE_KERNELS_AUTOTUNE=0 "$PY" -m pytest -q -o addopts="" -x \
      tests/test_kernels_w8a16.py tests/test_kernels_w4a16.py tests/test_kernels_fp8.py \
      tests/test_kernels_autotune.py tests/test_bench.py
fi
echo "== benchmark =="
"$PY" -m kernels.bench "$@"
if [ -n "${NOTEBOOKS:-}" ]; then
  echo "== lessons 09-10 on the GPU =="
  "$PY" -m pytest -q --nbval-lax notebooks/09_kernels.ipynb notebooks/10_measure_decode_speed.ipynb
fi
echo "Results are in results/: commit the new bench_cuda_*.json."
