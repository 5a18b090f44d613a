"""A pytest plugin that times each notebook of a test run (nbval: one test item per cell).

    NOTEBOOK_TIMES_LOG=/tmp/times.jsonl python -m pytest -p course_lib.authoring.notebook_timer notebooks solutions exercises
    python -m course_lib.authoring.workshop times --log /tmp/times.jsonl     # -> results/notebook_times.json

For each notebook it appends one JSON line to ``$NOTEBOOK_TIMES_LOG`` as soon as the notebook
is done: ``wall_s`` (from its first cell's setup, which starts the kernel, to its kernel's
shutdown), ``kernel_cpu_s`` (user + system CPU seconds of the kernel process, read from
``getrusage(RUSAGE_CHILDREN)`` once the kernel has exited), ``cells``, ``failed`` and the load
average. On a busy machine the wall time grows with the load; the kernel's CPU time hardly
does, so it is the figure to quote for an idle machine running one thread.
"""
from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest

from course_lib.paths import ROOT as _ROOT

_state: dict = {"path": None}


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _finish() -> None:
    """Write the line of the notebook in progress (its kernel has been shut down by now)."""
    path = _state.get("path")
    log = os.environ.get("NOTEBOOK_TIMES_LOG")
    if path is None or not log:
        return
    try:
        rel = str(Path(path).resolve().relative_to(_ROOT))
    except ValueError:
        rel = str(path)
    line = {"notebook": rel, "wall_s": round(time.perf_counter() - _state["t0"], 2),
            "kernel_cpu_s": round(_children_cpu() - _state["cpu0"], 2),
            "cells": _state["cells"], "failed": _state["failed"],
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "")}
    with open(log, "a") as f:
        f.write(json.dumps(line) + "\n")
    _state["path"] = None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    path = str(item.fspath)
    if path == _state["path"]:
        return
    _finish()      # the previous notebook's kernel was stopped in its last cell's teardown
    if path.endswith(".ipynb"):
        _state.update(path=path, t0=time.perf_counter(), cpu0=_children_cpu(), cells=0, failed=0)


def pytest_runtest_logreport(report):
    if _state["path"] is None or not report.nodeid.split("::")[0].endswith(".ipynb"):
        return
    if report.when == "call":
        _state["cells"] += 1
    if report.failed:
        _state["failed"] += 1


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    _finish()
