"""Give every notebook slide metadata and nbgrader metadata, derived from its content.

    python -m course_lib.authoring.nbmeta            # stamp notebooks/ and solutions/ in place
    python -m course_lib.authoring.nbmeta --check    # exit 1 if any notebook would change (tests run this)
    python -m course_lib.authoring.exercises         # then carry solutions/' metadata into exercises/

The stamper is idempotent: it computes all of its metadata from the cells' text, so running it
twice changes nothing, and it can be rerun after any edit (a new lesson included).

Slides (``jupyter nbconvert --to slides``; every notebook):

- a markdown cell that starts with a ``# `` or ``## `` heading starts a new slide, so a lesson
  gives one slide per section (a markdown cell holding a second ``## `` heading further down
  is split in two there first);
- a ``### `` heading, or a markdown cell that follows a code cell, starts a sub-slide (the
  section's steps stack vertically: text, then its code and output);
- plumbing is skipped: cells of imports only, the device summary (first code cell), and the
  hosted-notebook setup cell every lesson opens with (tag ``course-setup``, written by
  ``course_lib.authoring.hosted``; it does not count as the first code cell) with any
  markdown cell tagged the same (lesson 00's note on it);
- everything else continues the slide it is in.

nbgrader (solution notebooks only; ``exercises/`` inherits it through ``course_lib.authoring.exercises``):

- a cell with a ``### BEGIN SOLUTION`` block is a solution cell (grade id ``answer_<name>``,
  after the function it defines); a markdown answer would be a manually graded solution cell;
- a code cell whose statements are all ``check("NN.id", ...)`` calls is an autograded test
  cell worth 1 point per exercise it checks for the first time (grade id ``check_NN_id``);
  where a solution cell ends with its check call, the call is first split into its own cell;
- every other cell is read-only (locked; nbgrader restores it before autograding).
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

from course_lib.authoring.exercises import BEGIN, END, ROOT, dumps

SECTION = re.compile(r"^#{1,2} ")   # a slide
SUBSECTION = re.compile(r"^### ")   # a sub-slide
FENCE = re.compile(r"^\s*(```|~~~)")
SETUP_TAG = "course-setup"          # course_lib.authoring.hosted's cell
SCHEMA_VERSION = 3
POINTS_PER_EXERCISE = 1


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _set_source(cell: dict, text: str) -> None:
    cell["source"] = text.splitlines(keepends=True)


def _new_cell(like: dict, cell_id: str, text: str) -> dict:
    cell = {"cell_type": like["cell_type"], "id": cell_id, "metadata": {}}
    _set_source(cell, text)
    if like["cell_type"] == "code":
        cell.update(outputs=[], execution_count=None)
    return cell


def _unique_id(base: str, taken: set[str]) -> str:
    new, k = base, 1
    while new in taken:
        k += 1
        new = f"{base}{k}"
    taken.add(new)
    return new


# ---------------------------------------------------------------- splitting cells

def heading_lines(text: str) -> list[int]:
    """Indices of the lines of a markdown text that are ``#``/``##`` headings (not in code)."""
    found, in_fence = [], False
    for i, line in enumerate(text.split("\n")):
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and SECTION.match(line):
            found.append(i)
    return found


def split_at_headings(cells: list[dict]) -> list[dict]:
    """Split each markdown cell before every section heading that is not its first line."""
    taken = {c.get("id") for c in cells}
    out = []
    for cell in cells:
        text = _source(cell)
        cuts = [i for i in heading_lines(text) if i > 0] if cell["cell_type"] == "markdown" else []
        if not cuts:
            out.append(cell)
            continue
        lines = text.split("\n")
        bounds = [0] + cuts + [len(lines)]
        for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
            part = "\n".join(lines[a:b]).rstrip("\n") if b < len(lines) else "\n".join(lines[a:b])
            if k == 0:
                _set_source(cell, part)
                out.append(cell)
            else:
                out.append(_new_cell(cell, _unique_id(f"{cell['id']}-h{k}", taken), part))
    return out


def _parse(text: str) -> ast.Module | None:
    """The cell's code as an AST (IPython magics and shell lines blanked), or None."""
    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                     for line in text.split("\n"))
    try:
        return ast.parse(code)
    except SyntaxError:
        return None


def _check_call(node: ast.AST) -> ast.Call | None:
    """The ``check(...)`` call a statement consists of (``check(...)`` or ``x = check(...)``)."""
    value = node.value if isinstance(node, (ast.Expr, ast.Assign, ast.AnnAssign)) else None
    if isinstance(value, ast.Call):
        f = value.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        if name == "check":
            return value
    return None


def _exercise_id(call: ast.Call) -> str | None:
    if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
        return call.args[0].value
    return None


def split_trailing_checks(cells: list[dict]) -> list[dict]:
    """Move the ``check(...)`` calls that end a solution cell into a cell of their own
    (nbgrader grades a cell either as the learner's answer or as a test, not both)."""
    taken = {c.get("id") for c in cells}
    out = []
    for cell in cells:
        text = _source(cell)
        tree = _parse(text) if cell["cell_type"] == "code" and BEGIN in text else None
        body = tree.body if tree else []
        k = len(body)
        while k > 0 and _check_call(body[k - 1]) is not None:
            k -= 1
        lines = text.split("\n")
        if not body or k == len(body) or k == 0:
            out.append(cell)
            continue
        cut = body[k].lineno - 1   # first line of the first trailing check call
        if any(END in line for line in lines[cut:]):
            out.append(cell)
            continue
        _set_source(cell, "\n".join(lines[:cut]).rstrip("\n"))
        out.append(cell)
        out.append(_new_cell(cell, _unique_id(f"{cell['id']}-check", taken),
                             "\n".join(lines[cut:]).strip("\n")))
    return out


# ---------------------------------------------------------------- slides

def is_plumbing(cell: dict, first_code: bool) -> bool:
    """Imports only, or the device summary that opens every notebook: not shown on slides."""
    if cell["cell_type"] != "code":
        return False
    tree = _parse(_source(cell))
    if tree is None or not tree.body:
        return tree is not None   # an empty cell is plumbing; unparsable code is shown
    imports = (ast.Import, ast.ImportFrom)
    if all(isinstance(s, imports) for s in tree.body):
        return True
    summary = "device.summary()" in _source(cell)
    return first_code and summary and all(
        isinstance(s, imports) or (isinstance(s, (ast.Assign, ast.Expr))
                                   and "summary" in ast.unparse(s.value)) for s in tree.body)


def slide_types(cells: list[dict]) -> list[str]:
    """The ``slideshow.slide_type`` of each cell (see module docstring)."""
    types, previous, seen_code = [], None, False
    for cell in cells:
        text = _source(cell).lstrip("\n")
        if SETUP_TAG in cell.get("metadata", {}).get("tags", []):
            kind = "skip"
        elif cell["cell_type"] == "code":
            kind = "skip" if is_plumbing(cell, first_code=not seen_code) else "-"
            seen_code = True
        elif cell["cell_type"] != "markdown":
            kind = "skip"
        elif SECTION.match(text):
            kind = "slide"
        elif SUBSECTION.match(text) or previous == "code":
            kind = "subslide"
        else:
            kind = "-"
        if kind != "skip":
            previous = cell["cell_type"]
        types.append(kind)
    return types


def section_headings(nb: dict) -> int:
    """How many ``#``/``##`` section headings a notebook's markdown holds (= its slides)."""
    return sum(len(heading_lines(_source(c))) for c in nb["cells"] if c["cell_type"] == "markdown")


# ---------------------------------------------------------------- nbgrader

def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_")


def checked_ids(cell: dict) -> list[str] | None:
    """The exercise ids a checker cell checks, or None if the cell does anything else."""
    if cell["cell_type"] != "code" or BEGIN in _source(cell):
        return None
    tree = _parse(_source(cell))
    if tree is None or not tree.body:
        return None
    calls = [_check_call(s) for s in tree.body]
    if any(c is None for c in calls):
        return None
    ids = [_exercise_id(c) for c in calls]
    return None if None in ids else ids


def nbgrader_metadata(cells: list[dict]) -> list[dict]:
    """nbgrader's cell metadata for each cell of a solution notebook (see module docstring)."""
    metas, taken, graded = [], set(), set()
    for cell in cells:
        text = _source(cell)
        meta = {"grade": False, "locked": True, "schema_version": SCHEMA_VERSION,
                "solution": False}
        ids = checked_ids(cell)
        new_ids = [i for i in dict.fromkeys(ids or []) if i not in graded]
        if BEGIN in text:
            names = re.findall(r"^(?:async\s+)?(?:def|class)\s+(\w+)", text, re.M)
            base = f"answer_{names[0]}" if names else f"answer_{_slug(cell['id'])}"
            meta.update(solution=True, locked=False)
            if cell["cell_type"] == "markdown":   # a written answer: graded by hand
                meta.update(grade=True, points=POINTS_PER_EXERCISE)
        elif new_ids:
            graded.update(new_ids)
            base = "check_" + _slug(new_ids[0])
            meta.update(grade=True, points=POINTS_PER_EXERCISE * len(new_ids))
        else:
            base = f"cell_{_slug(cell['id'])}"
        meta["grade_id"] = _unique_id(base, taken)
        metas.append(meta)
    return metas


# ---------------------------------------------------------------- notebooks

def stamp(nb: dict, grading: bool) -> dict:
    """The notebook with its cells split where needed and metadata stamped (a new dict)."""
    nb = json.loads(json.dumps(nb))
    cells = split_at_headings(nb["cells"])
    if grading:
        cells = split_trailing_checks(cells)
    for cell, kind in zip(cells, slide_types(cells)):
        cell.setdefault("metadata", {})["slideshow"] = {"slide_type": kind}
        cell["metadata"].pop("nbgrader", None)
    if grading:
        for cell, meta in zip(cells, nbgrader_metadata(cells)):
            cell["metadata"]["nbgrader"] = meta
    nb["cells"] = cells
    return nb


def notebooks(root: Path = ROOT) -> list[tuple[Path, bool]]:
    """Every notebook the stamper owns, with whether it gets nbgrader metadata."""
    found = [(p, False) for d in ("notebooks", "templates") for p in sorted((root / d).glob("*.ipynb"))]
    return found + [(p, True) for p in sorted((root / "solutions").glob("*.ipynb"))]


def unstamped(root: Path = ROOT) -> list[str]:
    """Notebooks that the stamper would change."""
    return [str(p.relative_to(root)) for p, grading in notebooks(root)
            if dumps(stamp(json.loads(p.read_text()), grading)) != p.read_text()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report notebooks it would change")
    args = parser.parse_args(argv)
    if args.check:
        stale = unstamped()
        for s in stale:
            print("not stamped:", s)
        if stale:
            print("Run `python -m course_lib.authoring.nbmeta && python -m course_lib.authoring.exercises` and commit.")
        return 1 if stale else 0
    for path, grading in notebooks():
        old = path.read_text()
        new = dumps(stamp(json.loads(old), grading))
        if new != old:
            path.write_text(new)
            print("stamped", path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
