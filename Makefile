# Quantization, Hands On: two commands.
#   make lab    set up .venv (once) and open the course in JupyterLab at lesson 00
#   make test   set up .venv (once) and run every test (unit tests + nbval over all notebooks)
# Python 3.11 or newer creates .venv; where `python3` is older (macOS's own can be 3.9), name one:
#   PYTHON=python3.11 make lab
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# JupyterLab refuses to run as root without --allow-root (containers, cloud boxes).
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: setup lab test test-dispatch test-no-triton exercises render book notebook-times model bench engine gpu-bundle clean-venv \
	python-check preflight slides image image-cuda

setup: $(STAMP)

# The version check runs only when .venv is about to be created (an existing .venv keeps its Python).
python-check:
	@v=$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null); \
	case "$$v" in 3.1[1-9]|3.[2-9][0-9]|[4-9].*) echo "Python $$v ($(PYTHON)): ok" ;; \
	*) echo "The course needs Python 3.11 or newer; '$(PYTHON)' is $${v:-not found}."; \
	   echo "Install Python 3.11+ (python.org; Homebrew: brew install python@3.11; apt: python3.11-venv), then: PYTHON=python3.11 make lab"; \
	   exit 1 ;; esac

$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	test -x $(PY) || $(MAKE) --no-print-directory python-check PYTHON="$(PYTHON)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -r requirements.txt
	$(PY) -m pip install --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install --no-deps -e .
	$(PY) -m course_lib.smollm convert
	touch $(STAMP)

lab: setup
	$(VENV)/bin/jupyter lab notebooks/00_the_bill.ipynb $(LAB_ARGS)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

# The lessons that compare live numbers with committed ones, run again as if on another CPU:
# torch's AVX2 kernels and MKL's AVX2 code path (docs/cpu_dispatch.md; one thread instead of two
# changed no number tools/cpu_spread.py measured, so it is not repeated). A band tuned to the
# machine that wrote results/ fails here before a learner's laptop sees it. CI runs it after
# `make test` (.ci/run); about 4 minutes on 2 cores.
DISPATCH_ENV   := ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
DISPATCH_TESTS := notebooks/04_a_real_model.ipynb notebooks/05_llm_int8.ipynb notebooks/06_gptq.ipynb \
	notebooks/07_awq.ipynb notebooks/08_smoothquant_w8a8.ipynb notebooks/11_kv_cache.ipynb \
	notebooks/12_validate_and_choose.ipynb notebooks/16_rotations.ipynb notebooks/17_your_own_model.ipynb solutions/05_llm_int8.ipynb solutions/06_gptq.ipynb \
	exercises/06_gptq.ipynb \
	tests/test_spread.py
test-dispatch: setup
	$(DISPATCH_ENV) $(PY) -m pytest $(PYTEST_ARGS) $(DISPATCH_TESTS)

# The course as on a Mac or Windows, where the package index has no Triton wheel: Triton blocked
# (COURSE_NO_TRITON=1: conftest.py installs tools/no_triton/sitecustomize.py in pytest and in
# every notebook kernel), then lessons 09-11 (lesson, solution, exercise) and the unit tests that
# import kernels, which must pass with one-line skips (-rs lists them). The other unit tests
# never import Triton, so blocking it changes nothing there. CI runs it after `make test`
# (.ci/run). Measured on a shared, loaded 2-core machine: 9 min 4 s for the whole set (368
# passed, 316 skipped); the nine notebooks' idle run times in results/notebook_times.json add up
# to about a minute, and most kernel tests skip at once, so an idle CI machine takes far less.
# (unit tests first, as in `make test`: a notebook leaves COURSE_CHECKS set for what follows)
NO_TRITON_TESTS := $(wildcard tests/test_kernels_*.py) tests/test_ptx_interp.py tests/test_bench.py tests/test_bench_lessons0910.py \
	tests/test_checks_lessons0910.py tests/test_device.py tests/test_environment.py \
	$(foreach n,09_kernels 10_measure_decode_speed 11_kv_cache,notebooks/$(n).ipynb \
	solutions/$(n).ipynb exercises/$(n).ipynb)
test-no-triton: setup
	COURSE_NO_TRITON=1 $(PY) -m pytest -rs $(PYTEST_ARGS) $(NO_TRITON_TESTS)

# The pre-workshop check: PASS/WARN/FAIL lines (Python, setup, packages, torch and its build,
# SmolLM2 loaded, Triton, the engine, memory against the lessons' measured peak, disk) and the
# machine's details, in seconds; exit code 1 when something blocks the day. --json for a report.
preflight: setup
	$(PY) -m course_lib.preflight $(PREFLIGHT_ARGS)

# Slide decks of the lessons, executed, with reveal.js bundled (offline), into rendered/slides/
# (not committed); SLIDES_ARGS="00 09" for some lessons, "--out DIR" elsewhere
# (course_lib.authoring.slides).
slides: setup
	$(PY) -m course_lib.authoring.slides $(SLIDES_ARGS)

# The server image (docs/server.md): CPU torch, the course, SmolLM2 converted, the engine, built by
# tools/install_course.sh. The build context (build/image-context/) is course/, the repository's
# files as git lists them (tracked and untracked, not ignored: no .venv, no models/), and
# wheelhouse/, the wheels of the folder IMAGE_WHEELS names (the offline kit, torch's CPU wheel,
# the engine's wheel), which the build installs first. BASE_IMAGE: a Debian or Ubuntu image with
# Python 3.11+ (default python:3.11-slim-bookworm). For image-cuda, IMAGE_WHEELS must not hold
# torch's CPU wheel (pip would prefer it).
IMAGE       ?= quant-course:cpu
IMAGE_CUDA  ?= quant-course:cuda
IMAGE_WHEELS ?=
DOCKER      ?= docker
# IMAGE_OFFLINE=1: the build installs from IMAGE_WHEELS alone (no package index).
# HUB_PACKAGES="jupyterhub==<the hub's version> nbgitpuller": what a JupyterHub needs in the image.
IMAGE_ARGS   = $(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE),) $(if $(filter 1,$(IMAGE_OFFLINE)),--build-arg OFFLINE=1,) \
	$(if $(HUB_PACKAGES),--build-arg HUB_PACKAGES="$(HUB_PACKAGES)",)
define image_context
	rm -rf build/image-context && mkdir -p build/image-context/course build/image-context/wheelhouse
	git ls-files -z --cached --others --exclude-standard \
	  | xargs -0 sh -c 'for f; do [ -e "$$f" ] && printf "%s\0" "$$f"; done' sh \
	  | tar --null -T - -cf - | tar -xf - -C build/image-context/course
	$(if $(IMAGE_WHEELS),cp $(IMAGE_WHEELS)/*.whl build/image-context/wheelhouse/,)
	du -sh build/image-context/course build/image-context/wheelhouse
endef
image:
	$(image_context)
	$(DOCKER) build -f build/image-context/course/docker/Dockerfile -t $(IMAGE) $(IMAGE_ARGS) build/image-context
image-cuda:
	$(image_context)
	$(DOCKER) build -f build/image-context/course/docker/Dockerfile.cuda -t $(IMAGE_CUDA) $(IMAGE_ARGS) build/image-context

# Write every lesson's hosted-runtime setup cell and stamp slide and nbgrader metadata (both
# idempotent), then regenerate exercises/ from solutions/,
# then the README's and docs/instructors.md's generated tables (CI fails when any is out of date).
exercises: setup
	$(PY) -m course_lib.authoring.hosted
	$(PY) -m course_lib.authoring.nbmeta
	$(PY) -m course_lib.authoring.exercises
	$(PY) -m course_lib.authoring.workshop doc

# Build a rendered copy of every notebook, with outputs, into rendered/ (not committed).
render: setup
	$(PY) -m course_lib.authoring.render

# Build the course as a static HTML book (every notebook executed on CPU, with a contents page)
# into rendered/book/ (not committed): open rendered/book/index.html. BOOK_ARGS=--no-solutions
# leaves the solutions out (a book for learners).
book: setup
	$(PY) -m course_lib.authoring.book $(BOOK_ARGS)

# Time every notebook in a test run (nbval, one torch thread) and rewrite the run-time tables
# of README.md and docs/instructors.md from results/notebook_times.json.
notebook-times: setup
	mkdir -p rendered && rm -f rendered/notebook_times.jsonl
	OMP_NUM_THREADS=1 NOTEBOOK_TIMES_LOG=$(CURDIR)/rendered/notebook_times.jsonl \
		$(PY) -m pytest -q -p course_lib.authoring.notebook_timer notebooks solutions exercises
	$(PY) -m course_lib.authoring.workshop times --log rendered/notebook_times.jsonl
	$(PY) -m course_lib.authoring.workshop doc

# llama.cpp for lesson 13 (optional): llama-cpp-python built from source with the flags that run
# everywhere (native off), without the multimodal library (LLAVA_BUILD off: mtmd, for images,
# which the course never loads). The built wheel is kept in ENGINE_WHEELS, so a second build (a new
# venv, CI on the same machine) installs it in seconds; without it the build takes about 5 minutes (300 s on 2 idle cores, measured).
# On macOS llama.cpp also builds its Metal backend (Apple's GPU): GGML_METAL=ON, stated here; not
# tested by CI, which has no Mac.
ENGINE_CMAKE_ARGS := -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF$(if $(filter Darwin,$(shell uname -s)), -DGGML_METAL=ON,)
ENGINE_WHEELS ?= $(HOME)/.cache/quant-course/llama-cpp-python-0.3.36-native-off-text
ENGINE_STAMP := $(VENV)/.engine

engine: $(ENGINE_STAMP)

$(ENGINE_STAMP): requirements-engine.txt $(STAMP)
	@start=$$(date +%s); \
	if ! ls $(ENGINE_WHEELS)/llama_cpp_python-0.3.36-*.whl >/dev/null 2>&1; then \
	  echo "building llama.cpp (llama-cpp-python 0.3.36) from source: about 5 minutes on 2 cores, once"; \
	  CMAKE_ARGS="$(ENGINE_CMAKE_ARGS)" $(PY) -m pip wheel --no-deps --no-cache-dir \
	    -w $(ENGINE_WHEELS) llama-cpp-python==0.3.36 || exit 1; \
	fi; \
	$(PY) -m pip install --find-links $(ENGINE_WHEELS) -r requirements-engine.txt || exit 1; \
	$(PY) -c "import llama_cpp; print('llama.cpp engine', llama_cpp.__version__, 'ready')" || exit 1; \
	echo "make engine took $$(( $$(date +%s) - start )) s"
	touch $@

# Retrain the bundled tiny model (about 30 minutes on 2 CPU cores).
model: setup
	$(PY) -m course_lib.train

# Run the decode-speed benchmark on this machine; writes results/bench_<device>.json.
bench: setup
	$(PY) -m kernels.bench

# Before a GPU session (its machines have no network): put gemlite (pure Python + Triton,
# ~180 KB), an optional peer of kernels.bench, into third_party/gemlite (git-ignored; it
# travels with the working tree). Its import touches CUDA: kernels.bench imports it on a GPU only.
GEMLITE ?= gemlite==0.6.0.post2
gpu-bundle: setup
	rm -rf third_party/gemlite third_party/wheels && mkdir -p third_party/wheels
	$(PY) -m pip download --no-deps --only-binary=:all: -d third_party/wheels "$(GEMLITE)"
	$(PY) -c "import glob, zipfile; zipfile.ZipFile(glob.glob('third_party/wheels/gemlite-*.whl')[0]).extractall('third_party/gemlite')"
	du -sh third_party/gemlite

clean-venv:
	rm -rf $(VENV)
