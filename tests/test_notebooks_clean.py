"""Committed notebooks are clean, follow the lesson template, and exercises/ is in sync."""
import json
import re
from pathlib import Path

import pytest

from course_lib.authoring.exercises import BEGIN, END, stale_exercises

ROOT = Path(__file__).resolve().parent.parent
ALL = sorted(p for d in ("notebooks", "solutions", "exercises", "templates")
             for p in (ROOT / d).glob("*.ipynb"))
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))


def _cells(path):
    return json.loads(path.read_text())["cells"]


def _text(path):
    return "\n".join("".join(c["source"]) for c in _cells(path))


def test_there_are_lessons():
    assert LESSONS, "notebooks/ holds no lessons"


@pytest.mark.parametrize("path", ALL, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_outputs_committed(path):
    dirty = [i for i, c in enumerate(_cells(path)) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: code cells {dirty} have outputs; clear them before committing"


@pytest.mark.parametrize("path", ALL, ids=lambda p: str(p.relative_to(ROOT)))
def test_cells_have_unique_ids(path):
    ids = [c.get("id") for c in _cells(path)]
    assert None not in ids and len(set(ids)) == len(ids), \
        f"{path.name}: every cell needs a unique id (nbformat 4.5); tools/py2nb.py writes them"


def test_exercises_in_sync_with_solutions():
    stale = stale_exercises()
    assert not stale, f"exercises/ is stale: {stale}; run `make exercises`"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name)
def test_lesson_follows_template(path):
    text = _text(path)
    assert re.match(r"\d\d_[a-z0-9_]+\.ipynb$", path.name), "lessons are named NN_snake_case"
    assert "Learning objectives" in text, "a lesson starts with learning objectives"
    assert "device.summary()" in text, "a lesson prints the device summary near the top"
    assert "## Summary" in text, "a lesson ends with a summary"
    assert "Check yourself" in text and "<details>" in text, \
        "a lesson ends with check-yourself questions whose answers are hidden in <details>"
    assert "exercises/" in text, "a lesson points to its exercise notebook"
    first_code = next(c for c in _cells(path) if c["cell_type"] == "code"
                      and "course-setup" not in c.get("metadata", {}).get("tags", []))
    assert "device" in "".join(first_code["source"]), "the first code cell is the device summary"


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name)
def test_solutions_have_checked_exercises(path):
    text = _text(path)
    assert (ROOT / "notebooks" / path.name).exists(), f"no lesson notebooks/{path.name}"
    n_blocks = text.count(BEGIN)
    assert n_blocks >= 2 and n_blocks == text.count(END), "at least two solution blocks"
    assert text.count("check(") >= 2, "each exercise calls course_lib.checks.check"
