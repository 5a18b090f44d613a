"""pytest setup shared by unit tests and nbval runs.

Checkers (course_lib.checks) are strict in CI: in solutions/ and notebooks/ every check must
pass; in exercises/ an unsolved exercise may say "not yet implemented" but a wrong answer fails.
The mode travels to each notebook's kernel through the COURSE_CHECKS environment variable,
set here before nbval starts the kernel for that notebook.
"""
import os
from pathlib import Path

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    path = Path(str(item.fspath))
    if path.suffix == ".ipynb":
        os.environ["COURSE_CHECKS"] = "exercises" if path.parent.name == "exercises" else "solutions"
