#!/usr/bin/env bash
# The GPU check for a machine with an NVIDIA GPU (lessons 09-11), in parts that each finish in
# under 8 minutes, so that one part fits a 10-minute command on a lent machine:
#
#   --part tests     every test that runs differently on a GPU, natively: the kernel tests (real
#                    Llama layer shapes added, the fp16 and bf16 inline-PTX paths, every autotune
#                    configuration forced in turn, one launch per call), the benchmark's and the
#                    bandwidth's tests, the device/hardware tests. Autotuning is off for the shape
#                    sweep (COURSE_KERNELS_AUTOTUNE=0: one compile per specialization). The test
#                    files run in groups; a group does not start once TEST_BUDGET_S (default 420 s)
#                    has passed, and the summary names the groups left (`--groups "..."` runs
#                    them). Estimated at 5-7 minutes on an H200 with a cold compile cache
#                    (results/logs/gpu_tests_h200_first_run.log: 262 tests in 98 s, before the
#                    configs group, the fp16 path and the one-launch tests were added).
#   --part compile   the compile report on this machine's own Triton (per-pipe instructions per
#                    weight byte, registers, spills, shared memory, launch plans): a report a
#                    CPU machine writes with another Triton version is a prediction, this one
#                    is what the GPU runs. Estimated at 1-2 minutes.
#   --part bench     the separating measurements (results/separate_<gpu>.json), then the decode
#                    benchmark (bench_cuda_<gpu>[_quick].json, saved after every timed row, so a
#                    cut run still leaves data). `--quick` is the subset that covers every
#                    target: estimated at 3-4 minutes; the full sweep 6-8 minutes.
#   --part notebooks lessons 09-11 under nbval on the GPU (needs nbval and ipywidgets); estimated
#                    at 3-5 minutes.
#
# Everything a part writes goes to $OUT (set by a lent machine; else results/gpu_check/): its
# full log (<part>.log), every JSON, and summary.txt, which starts with the test summary. The
# terminal shows only one line per step and then the summary, so the summary is never lost
# behind a long log. Exit code 0 when every step of the part passed.
#
# Python: .venv/bin/python when it exists, else python3 (PY=... to choose); it must hold a
# CUDA torch. What needs a missing package (pytest, nbval) is skipped with a note.
#
# Usage (from anywhere):
#   bash kernels/gpu_check.sh --part tests
#   bash kernels/gpu_check.sh --part tests --groups "w4a16 configs"
#   bash kernels/gpu_check.sh --part bench --quick
#   bash kernels/gpu_check.sh --part compile
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
test -x "$PY" || PY=python3
unset TRITON_INTERPRET   # native kernels, not the interpreter
export PYTHONUNBUFFERED=1

PART="" GROUPS_ARG="" BENCH_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --part) PART="$2"; shift 2 ;;
    --groups) GROUPS_ARG="$2"; shift 2 ;;
    --quick) BENCH_ARGS+=(--quick); shift ;;
    -h|--help) sed -n '2,38p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)"; exit 2 ;;
  esac
done
case "$PART" in
  tests|compile|bench|notebooks) ;;
  *) echo "gpu_check.sh: choose a part: --part tests | compile | bench | notebooks (see --help)"; exit 2 ;;
esac

OUT_DIR=${OUT:-results/gpu_check}
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/$PART.log"
SUMMARY="$OUT_DIR/summary.txt"
: >"$LOG"
"$PY" - <<'PYEOF' >"$OUT_DIR/gpu.txt" 2>&1 || { cat "$OUT_DIR/gpu.txt"; exit 1; }
import sys
import torch
if not torch.cuda.is_available():
    sys.exit("gpu_check.sh: no CUDA GPU visible to torch; run the CPU tests with `make test` instead")
import triton
p = torch.cuda.get_device_properties(0)
print(f"GPU: {p.name}, compute capability {p.major}.{p.minor}, {p.total_memory / 1e9:.0f} GB, "
      f"{p.multi_processor_count} SMs; torch {torch.__version__}, triton {triton.__version__}, "
      f"python {sys.version.split()[0]}")
PYEOF
GPU_LINE=$(cat "$OUT_DIR/gpu.txt"); rm -f "$OUT_DIR/gpu.txt"
echo "$GPU_LINE"
has() { "$PY" -c "import $1" >/dev/null 2>&1; }
step() {  # step NAME COMMAND...: run, log everything, print one line, remember the result
  local name=$1; shift
  local t0=$SECONDS
  echo "== $name ==" >>"$LOG"
  "$@" >>"$LOG" 2>&1
  local rc=$?
  local line="$name: $([ $rc -eq 0 ] && echo ok || echo "FAILED (rc $rc)") in $((SECONDS - t0)) s"
  echo "$line"; LINES+=("$line"); [ $rc -eq 0 ] || FAILED=1
}
LINES=() FAILED=0

# ---- tests: the groups, in the order a short budget should run them
declare -A GROUP=(
  [w4a16]="tests/test_kernels_w4a16.py tests/test_kernels_dequant16.py tests/test_ptx_interp.py"
  [w8a16]="tests/test_kernels_w8a16.py"
  [launch]="tests/test_kernels_one_launch.py"
  [w8a8]="tests/test_kernels_w8a8_int8.py tests/test_kernels_fp8.py"
  [attention]="tests/test_kernels_decode_attention.py"
  [rotation]="tests/test_kernels_hadamard_quant.py"
  [configs]="tests/test_kernels_configs.py tests/test_kernels_autotune.py"
  [bench]="tests/test_bench.py tests/test_bench_lessons0910.py tests/test_bandwidth.py tests/test_device.py tests/test_hardware.py tests/test_validate_guide.py tests/test_preflight.py"
)
ORDER="w4a16 w8a16 launch w8a8 attention rotation bench configs"

if [ "$PART" = tests ]; then
  if ! has pytest; then echo "-- pytest is not installed for $PY: tests skipped"; exit 1; fi
  budget=${TEST_BUDGET_S:-420}
  left=()
  start=$SECONDS
  for g in ${GROUPS_ARG:-$ORDER}; do
    [ -n "${GROUP[$g]:-}" ] || { echo "unknown group $g (groups: $ORDER)"; exit 2; }
    if [ $((SECONDS - start)) -ge "$budget" ]; then left+=("$g"); continue; fi
    # shellcheck disable=SC2086
    step "tests $g" env COURSE_KERNELS_AUTOTUNE=0 "$PY" -m pytest -q -o addopts="" -rfE \
      --junitxml="$OUT_DIR/tests_$g.xml" ${GROUP[$g]}
  done
  # one line per failed test, from the junit files, for the summary
  FAILS=$("$PY" - "$OUT_DIR" <<'PYEOF'
import sys, glob, xml.etree.ElementTree as ET
total = failed = skipped = 0
names = []
for f in sorted(glob.glob(sys.argv[1] + "/tests_*.xml")):
    for case in ET.parse(f).getroot().iter("testcase"):
        total += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
            names.append(f"  FAILED {case.get('classname')}::{case.get('name')}")
        elif case.find("skipped") is not None:
            skipped += 1
print(f"tests: {total - failed - skipped} passed, {failed} failed, {skipped} skipped")
print("\n".join(names[:60]) + (f"\n  ... {len(names) - 60} more" if len(names) > 60 else ""))
PYEOF
)
  # the junit files are folded into the summary (a lent machine returns at most 8 files)
  rm -f "$OUT_DIR"/tests_*.xml
  [ ${#left[@]} -eq 0 ] || LINES+=("groups not run (budget ${budget}s): ${left[*]} -> bash kernels/gpu_check.sh --part tests --groups \"${left[*]}\"")
fi

if [ "$PART" = compile ]; then
  arch=$("$PY" -c "import torch; m, n = torch.cuda.get_device_capability(0); print(10 * m + n)")
  archs=$(printf '%s\n' 80 90 "$arch" | sort -un | tr '\n' ' ')
  # shellcheck disable=SC2086
  step "compile report (this machine's Triton; sm $archs)" \
    "$PY" -m kernels.compile_check --arch $archs --report --json "$OUT_DIR/compile_report_native.json"
fi

if [ "$PART" = bench ]; then
  step "separating measurements" "$PY" -m kernels.bench --separate --out "$OUT_DIR"
  step "benchmark ${BENCH_ARGS[*]:-}" "$PY" -m kernels.bench --out "$OUT_DIR" "${BENCH_ARGS[@]}"
fi

if [ "$PART" = notebooks ]; then
  if has nbval && has ipywidgets; then
    step "lessons 09-11 under nbval" "$PY" -m pytest -q --nbval-lax notebooks/09_kernels.ipynb \
      notebooks/10_measure_decode_speed.ipynb notebooks/11_kv_cache.ipynb
  else
    echo "-- nbval or ipywidgets missing for $PY: notebooks skipped"; LINES+=("notebooks: skipped (nbval/ipywidgets missing)")
  fi
fi

{
  echo "gpu_check.sh --part $PART  ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
  echo "$GPU_LINE"
  [ -z "${FAILS:-}" ] || echo "$FAILS"
  printf '%s\n' "${LINES[@]}"
  echo "full log: $LOG; JSON files: $(cd "$OUT_DIR" && ls ./*.json 2>/dev/null | tr '\n' ' ')"
  echo "commit the JSON files to results/ (they are the evidence for lessons 09-11's claims)"
} >"$SUMMARY"
echo "---- summary ($SUMMARY) ----"
cat "$SUMMARY"
exit $FAILED
