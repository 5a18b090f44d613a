"""pytest setup shared by unit tests and nbval runs.

Checkers (course_lib.checks) are strict in CI: in solutions/ and notebooks/ every check must
pass; in exercises/ an unsolved exercise may say "not yet implemented" but a wrong answer fails.
The mode travels to each notebook's kernel through the COURSE_CHECKS environment variable,
set here before nbval starts the kernel for that notebook.
"""
import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
# Checks the tests run in learner mode must not write the learner's progress file
# (course_lib.progress()) in the course folder: give this test run a throw-away one.
_PROGRESS_DIR = tempfile.mkdtemp(prefix="course-progress-")
atexit.register(shutil.rmtree, _PROGRESS_DIR, ignore_errors=True)
os.environ["COURSE_PROGRESS_FILE"] = os.path.join(_PROGRESS_DIR, "progress.json")

# COURSE_NO_TRITON=1: run as on a Mac or Windows, where Triton is not installed
# (`make test-no-triton`). The blocker (tools/no_triton/sitecustomize.py) is installed in this
# process now, and its folder goes first on PYTHONPATH so that every notebook kernel nbval starts
# runs it at start-up too.
if os.environ.get("COURSE_NO_TRITON") == "1":
    import importlib.util

    _NO_TRITON = Path(__file__).resolve().parent / "tools" / "no_triton"
    _spec = importlib.util.spec_from_file_location("course_no_triton", _NO_TRITON / "sitecustomize.py")
    _blocker = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_blocker)         # installs itself (the variable is set)
    _paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(_NO_TRITON) not in _paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(_NO_TRITON)] + [p for p in _paths if p])

# On a machine without a CUDA GPU, kernels sets TRITON_INTERPRET=1 before triton is imported.
# Import it now, before any test imports a library that imports triton itself (transformers
# does): otherwise a subset of the tests (tests/test_own_model.py before
# tests/test_results_machine.py) finds triton imported without the interpreter.
import kernels  # noqa: E402,F401


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    path = Path(str(item.fspath))
    if path.suffix == ".ipynb":
        os.environ["COURSE_CHECKS"] = "exercises" if path.parent.name == "exercises" else "solutions"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Where Triton is not installed (or COURSE_NO_TRITON=1 blocks it), a unit test that
    launches a Triton kernel is skipped with the one line kernels gives, not failed."""
    try:
        return (yield)
    except Exception as err:
        import sys
        stand_in = sys.modules.get("kernels._triton")       # loaded only if a test used kernels
        if stand_in is not None and isinstance(err, stand_in.TritonMissing):
            pytest.skip(str(err).split(": ", 1)[-1])
        raise
