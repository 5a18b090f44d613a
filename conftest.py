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


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    path = Path(str(item.fspath))
    if path.suffix == ".ipynb":
        os.environ["COURSE_CHECKS"] = "exercises" if path.parent.name == "exercises" else "solutions"
