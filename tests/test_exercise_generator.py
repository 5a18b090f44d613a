"""The solutions -> exercises generator."""
import re

import pytest

from course_lib.authoring.exercises import make_exercise, strip_solutions


def test_block_becomes_not_implemented_with_indent_and_hint():
    src = ("def f(x):\n    ### BEGIN SOLUTION\n    # HINT: use abs\n    return abs(x)\n"
           "    ### END SOLUTION\n\nprint(1)")
    out = strip_solutions(src)
    assert "return abs(x)" not in out
    assert "    # HINT: use abs\n" in out
    assert '    raise NotImplementedError("exercise: write this part")' in out
    assert out.endswith("\n\nprint(1)")
    compile(out, "<exercise>", "exec")  # still valid Python


def test_markdown_block():
    out = strip_solutions("Answer:\n### BEGIN SOLUTION\n42\n### END SOLUTION", markdown=True)
    assert "42" not in out and "*(your answer here)*" in out


@pytest.mark.parametrize("bad,message", [
    ("### BEGIN SOLUTION\nx = 1", "'### BEGIN SOLUTION' without '### END SOLUTION'"),
    ("x = 1\n### END SOLUTION", "'### END SOLUTION' without '### BEGIN SOLUTION'"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "nested '### BEGIN SOLUTION'"),
])
def test_unbalanced_markers_raise(bad, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        strip_solutions(bad)


def test_outputs_are_dropped():
    nb = {"cells": [{"cell_type": "code", "metadata": {}, "execution_count": 3,
                     "outputs": [{"output_type": "stream", "text": "hi"}],
                     "source": ["x = 1\n", "### BEGIN SOLUTION\n", "y = 2\n", "### END SOLUTION"]}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    ex = make_exercise(nb)
    cell = ex["cells"][0]
    assert cell["outputs"] == [] and cell["execution_count"] is None
    assert "y = 2" not in "".join(cell["source"])
    assert nb["cells"][0]["outputs"], "the input notebook is not modified"


def test_what_is_not_a_cell_or_a_notebook_is_refused():
    with pytest.raises(TypeError, match=r"source is a cell's text \(str\); got list"):
        strip_solutions(["x = 1\n"])
    for nb in ([], {"cells": "x"}, {"metadata": {}}):
        with pytest.raises(ValueError, match="nb must be a notebook: a dict with a 'cells' list"):
            make_exercise(nb)


# ---- graded cells keep the check's result in a name (nbgrader 0.9.6) ------------------------

import json  # noqa: E402
from pathlib import Path  # noqa: E402

from course_lib.authoring.exercises import graded_cells_that_display  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
# lessons whose owners apply `name = check(...)` at merge (the lead's list; empty it then)
BARE_UNTIL_MERGE: set[str] = set()


def _graded(src):
    return {"cells": [{"cell_type": "code", "id": "g", "source": src,
                       "metadata": {"nbgrader": {"grade": True}}},
                      {"cell_type": "code", "id": "plain", "source": "check('x', f)",
                       "metadata": {"nbgrader": {"grade": False}}}]}


@pytest.mark.parametrize("src, bare", [
    ('check("02.zero_point", zero_point)', True),
    ('x = 1\ncheck("02.zero_point", zero_point)\n', True),
    ('ok_zero = check("02.zero_point", zero_point)', False),
    ('check("02.zero_point", zero_point);', False),
    ('print(check("02.zero_point", zero_point))', False),
    ('ok = check("a", f)\nok', True),
    ("", False),
])
def test_a_graded_cell_that_displays_a_value_is_found(src, bare):
    assert graded_cells_that_display(_graded(src)) == (["g"] if bare else [])


def test_graded_cell_lint_refuses_what_is_not_a_notebook():
    with pytest.raises(ValueError, match="nb must be a notebook"):
        graded_cells_that_display([])


@pytest.mark.parametrize("path", [
    pytest.param(p, marks=pytest.mark.xfail(strict=False, reason="bare check(...) cells: the "
                                            "lead applies `name = check(...)` at merge"))
    if p.name[:2] in BARE_UNTIL_MERGE else p for p in SOLUTIONS], ids=lambda p: p.stem)
def test_no_graded_cell_displays_a_check_result(path):
    """nbgrader would read the CheckResult's text as a score (and warns that it cannot)."""
    nb = json.loads(path.read_text())
    assert any(c.get("metadata", {}).get("nbgrader", {}).get("grade") for c in nb["cells"])
    assert graded_cells_that_display(nb) == [], (
        f"{path.name}: write `name = check(...)` in these graded cells")


def test_bare_checks_are_named_mechanically():
    from course_lib.authoring.exercises import name_graded_results
    nb = _graded('x = 2\ncheck("09.unpack_int4_bits", unpack_int4_bits)\n')
    nb["cells"].append({"cell_type": "code", "id": "other", "source": "hint('09.x')",
                        "metadata": {"nbgrader": {"grade": True}}})
    assert name_graded_results(nb) == ["g"]
    assert "".join(nb["cells"][0]["source"]) == (
        'x = 2\nok_unpack_int4_bits = check("09.unpack_int4_bits", unpack_int4_bits)')
    assert graded_cells_that_display(nb) == ["other"]          # left for a person
    assert name_graded_results(nb) == []                       # idempotent
    ungraded = "".join(nb["cells"][1]["source"])
    assert ungraded == "check('x', f)"


def test_naming_the_bare_checks_of_a_lesson_leaves_none(tmp_path):
    from course_lib.authoring.exercises import name_graded_results
    for path in SOLUTIONS:
        nb = json.loads(path.read_text())
        name_graded_results(nb)
        assert graded_cells_that_display(nb) == [], path.name
