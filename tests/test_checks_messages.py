"""What the checker's messages tell a learner to call is there to call; a hint shows once; a
failure quotes the hint of the case that failed.

A failed or unsolved check ends with "hint(exercise_id, level=2)"; each exercise notebook's
text names `hint(...)` too. Every exercise notebook imports each function of
``course_lib.checks`` that its messages or its text name, before its first check (a NameError
at the moment a learner asks for help is the worst time for one).
"""
import ast
import json
import re
from pathlib import Path

import numpy as np
import pytest

from course_lib import checks
from course_lib.checks import Case, Exercise, check

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "exercises").glob("*.ipynb"))
CALL = re.compile(r"\b([A-Za-z_]\w*)\(")


@pytest.fixture(autouse=True)
def learner_mode(monkeypatch):
    monkeypatch.setenv("COURSE_CHECKS", "learner")


def _stepped(monkeypatch, cases=None):
    ex = Exercise(id="toy.steps", title="double", reference=lambda x: 2 * x,
                  cases=cases or (lambda: [Case((np.arange(3.0),), label="small")]),
                  hint=["think about doubling", "multiply by two", "return 2 * x"])
    monkeypatch.setitem(checks.EXERCISES, ex.id, ex)
    return ex.id


def names_the_messages_call(monkeypatch) -> set[str]:
    """The course_lib.checks functions that a failed and an unsolved check tell the learner to
    call (read from the reports themselves, not listed by hand)."""
    ex_id = _stepped(monkeypatch)

    def unsolved(x):
        raise NotImplementedError

    text = check(ex_id, lambda x: 3 * x, quiet=True).report + check(ex_id, unsolved,
                                                                    quiet=True).report
    return set(CALL.findall(text)) & set(checks.__all__)


def _code_and_text(path: Path):
    cells = json.loads(path.read_text())["cells"]
    return ([(i, "".join(c["source"])) for i, c in enumerate(cells) if c["cell_type"] == "code"],
            "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown"))


def imported_before_first_check(path: Path) -> tuple[set[str], bool]:
    """Names imported from course_lib.checks in the code cells up to the first check(...) call,
    and whether the notebook calls check at all."""
    names: set[str] = set()
    for _, source in _code_and_text(path)[0]:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "course_lib.checks":
                names |= {a.asname or a.name for a in node.names}
        if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "check"
               for n in ast.walk(tree)):
            return names, True
    return names, False


def test_the_messages_name_hint(monkeypatch):
    assert "hint" in names_the_messages_call(monkeypatch)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_exercise_notebook_imports_what_its_messages_call(path, monkeypatch):
    imported, calls_check = imported_before_first_check(path)
    if not calls_check:
        pytest.skip(f"{path.name} runs no check")
    text = _code_and_text(path)[1]
    wanted = names_the_messages_call(monkeypatch) | (set(CALL.findall(text)) & set(checks.__all__))
    missing = sorted(wanted - imported - {"check"}) + ([] if "check" in imported else ["check"])
    assert not missing, (f"{path.name}: its messages or text tell the learner to call "
                         f"{missing}, but the notebook does not import them from "
                         f"course_lib.checks before its first check")


def test_the_rule_catches_a_missing_import(tmp_path, monkeypatch):
    nb = {"cells": [{"cell_type": "code", "source": ["from course_lib.checks import check\n"]},
                    {"cell_type": "code", "source": ["check('02.zero_point', f)\n"]}]}
    (tmp_path / "x.ipynb").write_text(json.dumps(nb))
    imported, calls = imported_before_first_check(tmp_path / "x.ipynb")
    assert calls and "hint" not in imported and "hint" in names_the_messages_call(monkeypatch)


def test_a_hint_shows_once_in_jupyter(monkeypatch):
    """IPython prints the hint and displays nothing more for the returned text."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    ex_id = _stepped(monkeypatch)
    shell = InteractiveShell.instance()
    try:
        shell.user_ns["hint"] = checks.hint
        with capture_output() as cap:
            shell.run_cell(f"hint({ex_id!r}, level=2)", store_history=False)
    finally:
        InteractiveShell.clear_instance()
    assert cap.stdout.count("multiply by two") == 1, cap.stdout
    assert not cap.outputs
    text = checks.hint(ex_id, level=2)
    assert isinstance(text, str) and "multiply by two" in text   # still usable as a string


def test_a_failure_quotes_the_hint_of_its_case(monkeypatch):
    ex_id = _stepped(monkeypatch, cases=lambda: [
        Case((np.arange(3.0),), label="plain"),
        Case((np.array([0.5]),), label="a half", hint="what is half of one, doubled?"),
        Case((np.array([-1.0]),), label="negative", hint=2),
        Case((np.array([4.0]),), label="four", hint=""),
    ])
    rep = check(ex_id, lambda x: 2 * x if x[0] != 0.5 else x, quiet=True).report
    assert "what is half of one, doubled?" in rep and "think about doubling" not in rep
    rep = check(ex_id, lambda x: 2 * x if x[0] != -1 else x, quiet=True).report
    assert "step 2: multiply by two" in rep and "level=3" in rep
    rep = check(ex_id, lambda x: 2 * x if x[0] != 4 else x, quiet=True).report
    assert "hint:" not in rep and "FAILED" in rep
    rep = check(ex_id, lambda x: 3 * x, quiet=True).report
    assert "think about doubling" in rep and "level=2" in rep


def test_a_case_naming_a_missing_step_is_refused(monkeypatch):
    ex_id = _stepped(monkeypatch, cases=lambda: [Case((np.arange(3.0),), hint=7)])
    with pytest.raises(ValueError, match="names hint step 7; the exercise has steps 1..3"):
        check(ex_id, lambda x: 3 * x, quiet=True)


@pytest.mark.parametrize("ex_id", sorted(checks.load_all()))
def test_every_case_hint_is_one_the_exercise_has(ex_id):
    ex = checks.EXERCISES[ex_id]
    for case in ex.cases():
        checks.case_hint(ex, case)                       # raises for a step that is not there


# ---- a learner's exception: its line; an expected exception: its name (issue 39) ------------

def _raises_in_a_helper(x):
    return _helper(x)


def _helper(x):
    scale = x.max()
    return x / scale.item(0, 1)          # ValueError: a scalar has no two indices


def test_a_learner_exception_shows_the_line_of_their_code(monkeypatch):
    ex_id = _stepped(monkeypatch)

    def learner(x):
        y = x * 2
        return y[7]                       # IndexError: index 7 is out of bounds
    rep = check(ex_id, learner, quiet=True).report
    assert "your function raised IndexError" in rep
    assert "where:    line " in rep and "in `learner`: return y[7]" in rep
    rep = check(ex_id, _raises_in_a_helper, quiet=True).report
    assert "raised ValueError: incorrect number of indices" in rep
    assert "in `_helper`: return x / scale.item(0, 1)" in rep     # the deepest frame of theirs


def test_an_exception_raised_inside_a_library_names_it_and_the_learner_line(monkeypatch):
    ex_id = _stepped(monkeypatch)

    def learner(x):
        import json
        return json.loads(x)              # raises inside the standard library's json
    rep = check(ex_id, learner, quiet=True).report
    assert "in `learner`: return json.loads(x)" in rep
    assert "(raised inside " in rep and "called from there)" in rep
    where = checks.where_raised(ValueError("made, never raised"))
    assert where == ""                    # no traceback: nothing to show


def test_a_learner_exception_in_a_jupyter_cell_names_the_cell(monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    ex_id = _stepped(monkeypatch)
    shell = InteractiveShell.instance()
    try:
        shell.user_ns.update(check=check, ex_id=ex_id)
        with capture_output() as cap:
            shell.run_cell("def double(x):\n    y = x + x\n    return y / undefined_name\n",
                           store_history=True)
            shell.run_cell("r = check(ex_id, double)", store_history=True)
    finally:
        InteractiveShell.clear_instance()
    assert "raised NameError: name 'undefined_name' is not defined" in cap.stdout
    assert re.search(r"where:    line 3 of Cell In\[\d+\], in `double`: return y / "
                     r"undefined_name", cap.stdout), cap.stdout


def test_a_case_that_expects_value_error_says_so_whatever_came_instead(monkeypatch):
    ex_id = _stepped(monkeypatch, cases=lambda: [
        Case((np.arange(3.0),), label="plain"),
        Case((np.array([-1.0]),), label="a negative value", raises=ValueError),
    ])

    def raises_type_error(x):
        if x[0] < 0:
            raise TypeError("negative")
        return 2 * x
    rep = check(ex_id, raises_type_error, quiet=True).report
    assert ("expected your function to raise ValueError for this input, but it raised "
            "TypeError: negative") in rep
    assert "where:    line " in rep and "raise TypeError(\"negative\")" in rep
    rep = check(ex_id, lambda x: 2 * x, quiet=True).report
    assert "expected your function to raise ValueError for this input, but it returned" in rep
    # the hint of a refusal case names the exception, not the exercise's first step
    assert "the task asks for ValueError on an input like this one" in rep
    assert "think about doubling" not in rep


def test_a_refusal_case_with_a_hint_of_its_own_keeps_it(monkeypatch):
    ex_id = _stepped(monkeypatch, cases=lambda: [
        Case((np.array([-1.0]),), label="negative", raises=ValueError, hint="is -1 allowed?")])
    rep = check(ex_id, lambda x: 2 * x, quiet=True).report
    assert "is -1 allowed?" in rep and "the task asks for ValueError" not in rep


def test_a_float_answer_returned_as_a_tensor_says_what_to_return(monkeypatch):
    import torch
    ex = Exercise(id="toy.mean", title="mean", reference=lambda x: float(np.mean(x)),
                  cases=lambda: [Case((np.array([0.1, 0.2, 0.4]),))], hint="add, divide",
                  rtol=1e-12, atol=0.0)
    monkeypatch.setitem(checks.EXERCISES, ex.id, ex)
    rep = check(ex.id, lambda x: torch.tensor(x).float().mean(), quiet=True).report
    assert "values differ" in rep and "your answer is a torch tensor (torch.float32)" in rep
    assert "return float(...)" in rep
    rep = check(ex.id, lambda x: np.float32(np.mean(x)), quiet=True).report
    assert "a NumPy scalar (float32)" in rep
    strict = Exercise(**{**ex.__dict__, "id": "toy.mean_strict", "float_results": True})
    monkeypatch.setitem(checks.EXERCISES, strict.id, strict)
    rep = check(strict.id, lambda x: torch.tensor(float(np.mean(x)), dtype=torch.float64),
                quiet=True).report
    assert "expected a Python float, got Tensor" in rep


def test_slack_lets_a_lower_precision_computation_pass_and_nothing_else(monkeypatch):
    import torch
    x = torch.tensor([[1.1, 2.3], [0.7, -5.9]])
    w = torch.tensor([[0.33, -1.7], [2.9, 0.01]])
    ex = Exercise(id="toy.mm", title="matmul", reference=lambda a, b: a @ b.T,
                  cases=lambda: [Case((x, w))], hint="multiply",
                  rtol=1e-6, atol=1e-7,
                  slack=lambda a, b: 2.0 ** -8 * 4 * (a.abs() @ b.abs().T))
    monkeypatch.setitem(checks.EXERCISES, ex.id, ex)
    bf16 = lambda a, b: (a.bfloat16() @ b.bfloat16().T).float()     # noqa: E731
    assert check(ex.id, bf16, quiet=True)
    assert not check(ex.id, lambda a, b: (a @ b.T) * 1.05, quiet=True)
    assert "dtype" in check(ex.id, lambda a, b: (a.bfloat16() @ b.bfloat16().T),
                            quiet=True).report                 # slack is values, not dtype
    plain = Exercise(**{**ex.__dict__, "id": "toy.mm_plain", "slack": None})
    monkeypatch.setitem(checks.EXERCISES, plain.id, plain)
    assert not check(plain.id, bf16, quiet=True)
