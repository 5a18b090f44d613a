#!/usr/bin/env bash
# One-go GPU check for a session with an NVIDIA GPU (lessons 09-10):
#   1. the kernel tests, natively on the GPU (they add 4096-14336-sized shapes there), with
#      autotuning off for the shape sweep (COURSE_KERNELS_AUTOTUNE=0: one config per
#      specialization) and every autotune configuration forced in turn
#      (tests/test_kernels_configs.py). Every failing test is reported; none stops the run;
#   2. the measurements that separate issue 18's hypotheses (results/separate_<gpu>.json:
#      W8A16 through the tensor-core kernel against the GEMV at batch 1, the W4 kernel alone
#      against the first version's activation preparation alone, decode attention);
#   3. the benchmark, which writes results/bench_cuda_<gpu>[_quick].json with every
#      target's value and whether it was met. It saves the JSON after every timed row
#      (marked "partial": true until the end), so a run cut short still leaves data, and it
#      checks every backend's output once before timing it.
#
# Python: .venv/bin/python when it exists, else whatever `python3` holds a CUDA torch (set
# PY=... to choose). What needs a package that is missing there is skipped with a note
# (pytest for the tests; nbval and ipywidgets for the notebooks).
#
# Usage (from anywhere; about 3-5 minutes quick, 6-10 minutes full on an H100):
#   bash kernels/gpu_check.sh            # tests + full benchmark (every shape and batch)
#   bash kernels/gpu_check.sh --quick    # tests + the subset that still covers every target
#   SKIP_TESTS=1 bash kernels/gpu_check.sh --quick     # benchmark only
#   NOTEBOOKS=1 bash kernels/gpu_check.sh              # also run lessons 09-10 under nbval
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
test -x "$PY" || PY=python3
unset TRITON_INTERPRET   # native kernels, not the interpreter
"$PY" - <<'PYEOF' || exit 1
import sys
import torch
if not torch.cuda.is_available():
    sys.exit("gpu_check.sh: no CUDA GPU visible to torch; run the CPU tests with `make test` instead")
p = torch.cuda.get_device_properties(0)
print(f"GPU: {p.name}, compute capability {p.major}.{p.minor}, {p.total_memory / 1e9:.0f} GB, "
      f"torch {torch.__version__}, python {sys.version.split()[0]}")
PYEOF
has() { "$PY" -c "import $1" >/dev/null 2>&1; }
tests_rc=0
if [ -z "${SKIP_TESTS:-}" ]; then
  if has pytest; then
    echo "== kernel tests (native; autotuning off for the sweep; every config forced in turn) =="
    COURSE_KERNELS_AUTOTUNE=0 "$PY" -m pytest -q -o addopts="" -rf \
        tests/test_kernels_w8a16.py tests/test_kernels_w4a16.py tests/test_kernels_fp8.py \
        tests/test_kernels_w8a8_int8.py tests/test_kernels_decode_attention.py \
        tests/test_kernels_configs.py tests/test_kernels_autotune.py tests/test_bench.py \
        tests/test_bandwidth.py
    tests_rc=$?
    [ $tests_rc -eq 0 ] || echo "!! some kernel tests failed (listed above); running the benchmark anyway"
  else
    echo "-- pytest is not installed for $PY: kernel tests skipped"
  fi
fi
echo "== separating measurements (W8A16 dot vs GEMV at M=1; W4 kernel vs activation prep; decode attention) =="
"$PY" -m kernels.bench --separate || echo "!! the separating measurements failed (see above)"
echo "== benchmark =="
"$PY" -m kernels.bench "$@"
bench_rc=$?
[ $bench_rc -eq 0 ] || echo "!! the benchmark stopped early (rc $bench_rc): results/ holds its partial JSON"
if [ -n "${NOTEBOOKS:-}" ]; then
  if has nbval && has ipywidgets; then
    echo "== lessons 09-10 on the GPU =="
    "$PY" -m pytest -q --nbval-lax notebooks/09_kernels.ipynb notebooks/10_measure_decode_speed.ipynb
  else
    echo "-- nbval or ipywidgets missing for $PY: notebooks skipped"
  fi
fi
echo "Results are in results/: commit the new bench_cuda_*.json and separate_*.json (tests rc $tests_rc, benchmark rc $bench_rc)."
exit $(( tests_rc != 0 || bench_rc != 0 ))
