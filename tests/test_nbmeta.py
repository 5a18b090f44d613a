"""Slide and nbgrader metadata (course_lib.authoring.nbmeta): stamped, idempotent, one slide per section."""
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest
from nbconvert import SlidesExporter
from nbgrader.nbgraderformat import MetadataValidator

from course_lib.authoring import nbmeta
from course_lib.checks import load_all
from course_lib.authoring.exercises import dumps

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))


def _nb(path):
    return json.loads(path.read_text())


def _src(cell):
    return "".join(cell["source"])


def _md(text, cid):
    return {"cell_type": "markdown", "id": cid, "metadata": {}, "source": text.splitlines(True)}


def _code(text, cid):
    return {"cell_type": "code", "id": cid, "metadata": {}, "source": text.splitlines(True),
            "outputs": [], "execution_count": None}


def _toy():
    return {"cells": [
        _md("# 99 · Toy: exercises\n\nIntro.", "a"),
        _code("from course_lib import device\ninfo = device.summary()", "b"),
        _code("import numpy as np\nfrom course_lib.checks import check", "c"),
        _md("## Exercise 1\n\nWrite it.\n\n```python\n## not a heading in code\n```", "d"),
        _code("def f(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION\n\n\n"
              "ok = check(\"99.f\", f)", "e"),
        _md("What it gives.\n\n### A detail\n\n## Exercise 2\n\nMore.", "g"),
        _code("def g(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION", "h"),
        _code("check(\"99.g\", g)", "i"),
        _code("print(f(1), check(\"99.f\", f, quiet=True))", "j"),
        _md("### Sub\n\ntext", "k"),
    ], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def test_stamping_twice_changes_nothing():
    once = nbmeta.stamp(_toy(), grading=True)
    assert dumps(nbmeta.stamp(once, grading=True)) == dumps(once)
    assert dumps(nbmeta.stamp(nbmeta.stamp(_toy(), False), False)) == dumps(nbmeta.stamp(_toy(), False))


def test_toy_notebook_is_split_and_stamped_as_designed():
    nb = nbmeta.stamp(_toy(), grading=True)
    cells = {c["id"]: c for c in nb["cells"]}
    order = [c["id"] for c in nb["cells"]]
    # a second "## " heading in a markdown cell starts a cell of its own; "##" in code does not
    assert order == ["a", "b", "c", "d", "e", "e-check", "g", "g-h1", "h", "i", "j", "k"]
    assert _src(cells["g"]) == "What it gives.\n\n### A detail"
    assert _src(cells["g-h1"]) == "## Exercise 2\n\nMore."
    # the check call that ended the solution cell moved to a cell of its own
    assert _src(cells["e"]).endswith("### END SOLUTION")
    assert _src(cells["e-check"]) == 'ok = check("99.f", f)'
    assert cells["e-check"]["outputs"] == [] and cells["e-check"]["execution_count"] is None
    slides = {cid: c["metadata"]["slideshow"]["slide_type"] for cid, c in cells.items()}
    assert slides == {"a": "slide", "b": "skip", "c": "skip", "d": "slide", "e": "-",
                      "e-check": "-", "g": "subslide", "g-h1": "slide", "h": "-", "i": "-",
                      "j": "-", "k": "subslide"}
    grade = {cid: c["metadata"]["nbgrader"] for cid, c in cells.items()}
    assert grade["e"] == {"grade": False, "grade_id": "answer_f", "locked": False,
                          "schema_version": 3, "solution": True}
    assert grade["e-check"] == {"grade": True, "grade_id": "check_99_f", "locked": True,
                                "points": 1, "schema_version": 3, "solution": False}
    assert grade["i"]["grade_id"] == "check_99_g" and grade["i"]["grade"]
    # a later check of the same exercise, inside other code, is not a second test
    assert grade["j"] == {"grade": False, "grade_id": "cell_j", "locked": True,
                          "schema_version": 3, "solution": False}
    assert all(g["locked"] for cid, g in grade.items() if cid not in ("e", "h"))
    MetadataValidator().validate_nb(nbformat.from_dict(nb))


def test_lessons_get_slides_but_no_nbgrader_metadata():
    nb = nbmeta.stamp(_toy(), grading=False)
    assert all("nbgrader" not in c["metadata"] for c in nb["cells"])
    assert [c["id"] for c in nb["cells"]].count("e-check") == 0, "lessons keep their cells"


def test_committed_notebooks_are_stamped():
    stale = nbmeta.unstamped()
    assert not stale, (f"not stamped: {stale}; run `python -m course_lib.authoring.nbmeta && "
                       f"python -m course_lib.authoring.exercises` and commit")


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name)
def test_every_exercise_is_one_autograded_test_cell(path):
    nb = _nb(path)
    MetadataValidator().validate_nb(nbformat.from_dict(nb))
    lesson = path.name[:2]
    registered = [i for i in load_all() if i.startswith(lesson + ".")]
    graded = [c for c in nb["cells"] if c["metadata"]["nbgrader"]["grade"]]
    tests = [c for c in graded if c["cell_type"] == "code"]
    checked = [re.search(r'check\("([^"]+)"', _src(c)).group(1) for c in tests]
    assert sorted(checked) == sorted(registered), \
        "each registered exercise needs one cell of nothing but check(...) calls"
    assert all(c["metadata"]["nbgrader"]["points"] == 1 for c in tests)
    # the only other graded cells: written answers (markdown solution blocks), graded by hand
    assert all(c["metadata"]["nbgrader"]["solution"] for c in graded if c["cell_type"] != "code")
    for cell in nb["cells"]:
        meta = cell["metadata"]["nbgrader"]
        assert meta["solution"] == ("### BEGIN SOLUTION" in _src(cell)), cell["id"]
        assert meta["locked"] == (not meta["solution"]), cell["id"]


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name)
def test_exercises_carry_the_metadata(path):
    sol, ex = _nb(path), _nb(ROOT / "exercises" / path.name)
    assert [c["metadata"] for c in ex["cells"]] == [c["metadata"] for c in sol["cells"]]


class _Slides(HTMLParser):
    """The first h1/h2 of each top-level <section> of a reveal.js page."""

    def __init__(self):
        super().__init__()
        self.depth, self.titles, self._grab = 0, [], None

    def handle_starttag(self, tag, attrs):
        if tag == "section":
            if self.depth == 0:
                self.titles.append(None)
            self.depth += 1
        elif tag in ("h1", "h2") and self.depth and self.titles[-1] is None:
            self._grab = ""

    def handle_data(self, data):
        if self._grab is not None:
            self._grab += data

    def handle_endtag(self, tag):
        if tag == "section":
            self.depth -= 1
        elif tag in ("h1", "h2") and self._grab is not None:
            self.titles[-1], self._grab = self._grab.replace("¶", "").strip(), None


@pytest.mark.parametrize("name", ["00_the_bill", "07_awq"])
def test_nbconvert_slides_give_one_slide_per_section(name):
    path = ROOT / "notebooks" / f"{name}.ipynb"
    headings = [re.sub(r"[`*]", "", line[line.index(" ") + 1:]).strip()   # as rendered
                for c in _nb(path)["cells"] if c["cell_type"] == "markdown"
                for line in _src(c).split("\n") if re.match(r"#{1,2} ", line)]
    body, _ = SlidesExporter().from_notebook_node(nbformat.read(path, as_version=4))
    parser = _Slides()
    parser.feed(body)
    assert len(parser.titles) == len(headings) >= 8
    assert parser.titles == headings


def test_a_written_answer_is_a_hand_graded_solution_cell():
    nb = _toy()
    nb["cells"].append(_md("Why?\n\n### BEGIN SOLUTION\nBecause.\n### END SOLUTION", "m"))
    stamped = nbmeta.stamp(nb, grading=True)
    meta = stamped["cells"][-1]["metadata"]["nbgrader"]
    assert meta["solution"] and meta["grade"] and meta["points"] == 1 and not meta["locked"]
    MetadataValidator().validate_nb(nbformat.from_dict(stamped))
