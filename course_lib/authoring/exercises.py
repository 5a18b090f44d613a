"""Generate ``exercises/`` from ``solutions/`` (the single source), and check they agree.

    python -m course_lib.authoring.exercises          # (re)write exercises/
    python -m course_lib.authoring.exercises --check  # exit 1 if exercises/ is stale (tests run this)
    python -m course_lib.authoring.exercises --name-results   # graded `check(...)` -> `ok_NAME = check(...)`

In a solution notebook, solution code sits between nbgrader's markers::

    def absmax_scale(x, qmax):
        ### BEGIN SOLUTION
        # HINT: the largest |x| must land exactly on qmax
        return np.abs(x).max() / qmax
        ### END SOLUTION

The generator replaces each block with ``raise NotImplementedError(...)``, keeping its
indentation and any ``# HINT:`` lines as comments. Outputs and execution counts are
dropped. Markdown cells may hold blocks too; they become "*(your answer here)*".

A graded cell (nbgrader's ``grade: true``, stamped by ``course_lib.authoring.nbmeta``) runs a check and
keeps its result in a name, ``ok_absmax = check("02.absmax_quantize", absmax_quantize)``:
nbgrader reads the text a cell *displays* as its partial-credit score, and a bare
``check(...)`` displays a ``CheckResult`` it cannot read as a number (0.9.6 warns, and gives
full credit "for now"). ``assert check(...)`` would stop an unsolved exercise notebook at its
first exercise; the assignment does not. ``graded_cells_that_display`` finds the bare ones and
``--name-results`` (``name_graded_results``) names them.
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

from course_lib.paths import ROOT

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
HINT = re.compile(r"^\s*#\s*HINT:\s*(.*)$")


def strip_solutions(source: str, markdown: bool = False) -> str:
    """Replace every BEGIN/END SOLUTION block in ``source`` with a stub (see module doc)."""
    if not isinstance(source, str):
        raise TypeError(f"source is a cell's text (str); got {type(source).__name__} (join a "
                        f"notebook cell's list of lines first)")
    out: list[str] = []
    inside = False
    indent = ""
    hints: list[str] = []
    for line in source.split("\n"):
        stripped = line.strip()
        if stripped == BEGIN:
            if inside:
                raise ValueError(f"nested {BEGIN!r} in:\n{source}")
            inside, indent, hints = True, line[: len(line) - len(line.lstrip())], []
            continue
        if stripped == END:
            if not inside:
                raise ValueError(f"{END!r} without {BEGIN!r} in:\n{source}")
            inside = False
            if markdown:
                out.append(indent + "*(your answer here)*")
            else:
                out.extend(f"{indent}# HINT: {h}" for h in hints)
                out.append(f"{indent}# YOUR CODE HERE")
                out.append(f'{indent}raise NotImplementedError("exercise: write this part")')
            continue
        if inside:
            m = HINT.match(line)
            if m:
                hints.append(m.group(1))
            continue
        out.append(line)
    if inside:
        raise ValueError(f"{BEGIN!r} without {END!r} in:\n{source}")
    return "\n".join(out)


def clean_notebook(nb: dict) -> dict:
    """Drop outputs, execution counts and volatile metadata (committed notebooks are clean)."""
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ValueError("nb must be a notebook: a dict with a 'cells' list (json.load of an "
                         ".ipynb file)")
    nb = json.loads(json.dumps(nb))
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        cell.get("metadata", {}).pop("execution", None)
    nb.get("metadata", {}).pop("widgets", None)
    return nb


def make_exercise(nb: dict) -> dict:
    """The exercise version of a solution notebook."""
    nb = clean_notebook(nb)
    for cell in nb["cells"]:
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if BEGIN in src:
            new = strip_solutions(src, markdown=cell["cell_type"] == "markdown")
            cell["source"] = new.splitlines(keepends=True)
    return nb


def graded_cells_that_display(nb: dict) -> list[str]:
    """Ids (or indices) of the graded code cells whose last statement is an expression other
    than a ``print(...)`` call: a value Jupyter displays and nbgrader reads as a score (see
    the module doc). Fix: ``name = check(...)``."""
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ValueError("nb must be a notebook: a dict with a 'cells' list (json.load of an "
                         ".ipynb file)")
    found = []
    for i, cell in enumerate(nb["cells"]):
        grade = cell.get("metadata", {}).get("nbgrader", {}).get("grade")
        if cell.get("cell_type") != "code" or not grade:
            continue
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        try:
            body = ast.parse(src).body
        except SyntaxError:
            continue                                     # nbval reports it when it runs
        last = body[-1] if body else None
        if (isinstance(last, ast.Expr) and src.rstrip()[-1:] != ";" and not (
                isinstance(last.value, ast.Call) and isinstance(last.value.func, ast.Name)
                and last.value.func.id == "print")):
            found.append(cell.get("id", str(i)))
    return found


def name_graded_results(nb: dict) -> list[str]:
    """Rewrite, in place, each graded cell whose last line is a bare ``check("NN.name", fn)``
    into ``ok_name = check("NN.name", fn)``; return the ids of the cells changed. Cells that
    display something else are left for a person (``graded_cells_that_display`` lists them)."""
    changed = []
    bare = set(graded_cells_that_display(nb))
    for i, cell in enumerate(nb["cells"]):
        if cell.get("id", str(i)) not in bare:
            continue
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        lines = src.rstrip("\n").split("\n")
        m = re.fullmatch(r"""check\((["'])\d\d\.(\w+)\1\s*,.*\)\s*""", lines[-1])
        if m is None:
            continue
        lines[-1] = f"ok_{m.group(2)} = {lines[-1]}"
        cell["source"] = "\n".join(lines).splitlines(keepends=True)
        changed.append(cell.get("id", str(i)))
    return changed


def dumps(nb: dict) -> str:
    """Serialise a notebook the way nbformat does (indent 1, trailing newline)."""
    return json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def expected_exercises(root: Path = ROOT) -> dict[Path, str]:
    """Map each exercises/ path to the text it should have."""
    result = {}
    for sol in sorted((root / "solutions").glob("*.ipynb")):
        nb = json.loads(sol.read_text())
        result[root / "exercises" / sol.name] = dumps(make_exercise(nb))
    return result


def stale_exercises(root: Path = ROOT) -> list[str]:
    """Paths in exercises/ that are missing, different, or have no solution notebook."""
    want = expected_exercises(root)
    problems = [str(p.relative_to(root)) for p, text in want.items()
                if not p.exists() or p.read_text() != text]
    problems += [str(p.relative_to(root)) + " (no matching solutions/ notebook)"
                 for p in sorted((root / "exercises").glob("*.ipynb")) if p not in want]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files")
    parser.add_argument("--name-results", action="store_true",
                        help="in solutions/, turn graded cells' bare check(...) into "
                             "ok_NAME = check(...) (nbgrader reads a displayed value as a score)")
    args = parser.parse_args(argv)
    if args.name_results:
        for sol in sorted((ROOT / "solutions").glob("*.ipynb")):
            nb = json.loads(sol.read_text())
            ids = name_graded_results(nb)
            if ids:
                sol.write_text(dumps(nb))
                print(f"{sol.relative_to(ROOT)}: named the result in {', '.join(ids)}")
            left = graded_cells_that_display(nb)
            if left:
                print(f"{sol.relative_to(ROOT)}: still displays a value, fix by hand: "
                      f"{', '.join(left)}")
        return 0
    if args.check:
        stale = stale_exercises()
        for s in stale:
            print("stale:", s)
        if stale:
            print("Run `make exercises` (python -m course_lib.authoring.exercises) and commit the result.")
        return 1 if stale else 0
    (ROOT / "exercises").mkdir(exist_ok=True)
    for path, text in expected_exercises().items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print("wrote", path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
