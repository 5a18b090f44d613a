"""How long a lesson takes: the rule every lesson's header states, and the command that
rewrites the headers from it (the README's lessons table and the instructors' study-time table
are generated from the same rule, ``course_lib.authoring.workshop``).

The rule. **Reading** counts what the lesson asks a learner to read:

- its prose: the lesson notebook's markdown words at 200 a minute;
- its own code cells, at 20 lines a minute: short, commented cells, read to follow what runs;
- the library and kernel source it prints for study (``inspect.getsource(...)``,
  ``kernels.source(...)``), at 5 lines a minute: dense code that is the lesson's subject, read
  line by line. That is 300 lines an hour, below the 400-500 lines an hour beyond which code
  reviewers were measured to miss defects (the Cisco code-review study, SmartBear, 2006): a
  first careful reading, not a skim.

**Exercises** are timed apart: each checked exercise of the solution notebook takes 5 minutes
(reading its task, running its check) plus 2 minutes a line of its reference solution
(writing it, failing a case, fixing it); the lines are the code lines between the solution
markers, as the instructors' difficulty column counts them.

These rates are stated assumptions, the same for every lesson, so that lessons compare; they
are not a measurement of any learner.

**An exercise notebook** (``exercises/<lesson>.ipynb``, generated from ``solutions/``) states
its own time by the same rule: reading counts what the learner opens, the exercise notebook
itself (its prose, its code with the solutions stubbed out, the source it prints), and doing
counts its exercises as above. The header sits in the solution notebook's title cell and
reaches ``exercises/`` when that is regenerated (``python -m course_lib.authoring.exercises``).

    python -m course_lib.authoring.reading_time           # rewrite every lesson's header and
                                                          # every solution notebook's (then
                                                          # regenerate exercises/)
    python -m course_lib.authoring.reading_time --check   # exit 1 where a header is stale
    python -m course_lib.authoring.reading_time --show    # the figures, lesson by lesson

A lesson's header states: ``*Time: about R minutes to read (W words, C lines of its code and S
lines of printed source, at 200 words, 20 and 5 lines a minute); its E exercises, about X
minutes more; the notebook runs in ...`` (the run time and what follows are the lesson's own
words). An exercise notebook's states: ``*Time: about T minutes: R to read (W words, C lines of
code and S lines of printed source, at 200 words, 20 and 5 lines a minute) and X for its E
exercises (5 minutes each and 2 a line of their L lines of reference solution).*``
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from course_lib.authoring.exercises import dumps, make_exercise
from course_lib.paths import ROOT

WORDS_PER_MINUTE = 200
CODE_LINES_PER_MINUTE = 20
SOURCE_LINES_PER_MINUTE = 5
EXERCISE_BASE_MINUTES = 5
EXERCISE_MINUTES_PER_LINE = 2
PRINTERS = ("getsource", "source")          # inspect.getsource(f), kernels.source(k)
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"

#: The part of a header the rule writes, up to the lesson's own run-time words. It matches the
#: old form ("about 12 minutes to read (2,370 words at 200 a minute), more with the
#: exercises; the notebook runs ...") and the rule's own.
STATED = re.compile(
    r"\*Time:\s+about\s+\d+\s+minutes\s+to\s+read\s+\((?P<inside>[^)]*)\)"
    r"(?P<ex>(?:,|;)[^;]*?exercises?[^;]*?)?;\s+(?=the\s+notebook\s+runs)", re.S)
#: An exercise notebook's header (``LessonTime.exercise_header``), whole.
EXERCISE_STATED = re.compile(
    r"\*Time:\s+about\s+\d+\s+minutes:\s+\d+\s+to\s+read\s+\([^)]*\)\s+and\s+"
    r"(?:\d+\s+for\s+its\s+\d+\s+exercises?\s+\([^)]*\)|no\s+exercises)\.\*")
RULE_TEXT = re.compile(
    r"\((?P<words>[\d,]+)\s+words,\s+(?P<code>[\d,]+)\s+lines\s+of\s+its\s+code\s+and\s+"
    r"(?P<src>[\d,]+)\s+lines\s+of\s+printed\s+source,\s+at\s+200\s+words,\s+20\s+and\s+5\s+"
    r"lines\s+a\s+minute\)")


@dataclass
class LessonTime:
    stem: str
    words: int
    code_lines: int
    source_lines: int
    unresolved: list[str]          # printed objects the rule could not find (counted as 0)
    exercises: int
    solution_lines: int

    @property
    def reading_minutes(self) -> int:
        m = (self.words / WORDS_PER_MINUTE + self.code_lines / CODE_LINES_PER_MINUTE
             + self.source_lines / SOURCE_LINES_PER_MINUTE)
        return max(1, round(m))

    @property
    def exercise_minutes(self) -> int:
        return round(EXERCISE_BASE_MINUTES * self.exercises
                     + EXERCISE_MINUTES_PER_LINE * self.solution_lines)

    def header(self) -> str:
        """The rule's words for this lesson, up to "; " before "the notebook runs"."""
        ex = (f"its {self.exercises} exercise{'s' if self.exercises != 1 else ''}, about "
              f"{self.exercise_minutes} minutes more" if self.exercises else "no exercises")
        return (f"*Time: about {self.reading_minutes} minutes to read ({self.words:,} words, "
                f"{self.code_lines:,} lines of its code and {self.source_lines:,} lines of "
                f"printed source, at 200 words, 20 and 5 lines a minute); {ex}; ")

    def exercise_header(self) -> str:
        """The rule's words for an exercise notebook (its reading and its exercises together):
        the whole header, a paragraph of its own."""
        ex = (f"{self.exercise_minutes} for its {self.exercises} "
              f"exercise{'s' if self.exercises != 1 else ''} ({EXERCISE_BASE_MINUTES} minutes "
              f"each and {EXERCISE_MINUTES_PER_LINE} a line of their {self.solution_lines:,} "
              f"lines of reference solution)" if self.exercises else "no exercises")
        return (f"*Time: about {self.reading_minutes + self.exercise_minutes} minutes: "
                f"{self.reading_minutes} to read ({self.words:,} words, {self.code_lines:,} lines "
                f"of code and {self.source_lines:,} lines of printed source, at 200 words, 20 "
                f"and 5 lines a minute) and {ex}.*")


def one_exercise_minutes(solution_lines: int) -> int:
    """The rule's time for one exercise whose solution has ``solution_lines`` code lines (the
    instructors' agendas; a lesson's ``exercise_minutes`` is the sum over its exercises)."""
    return EXERCISE_BASE_MINUTES + EXERCISE_MINUTES_PER_LINE * solution_lines


# ---- counting --------------------------------------------------------------------------------

def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def markdown_words(cells: list[dict]) -> int:
    return sum(len(re.findall(r"\S+", _source(c))) for c in cells if c["cell_type"] == "markdown")


def code_lines(cells: list[dict]) -> int:
    """Non-blank lines of the code cells, comment lines included (a learner reads them)."""
    return sum(1 for c in cells if c["cell_type"] == "code"
               for line in _source(c).splitlines() if line.strip())


def _aliases(trees: list[ast.AST]) -> dict[str, str]:
    """Name -> dotted module path, from every import of the notebook."""
    names: dict[str, str] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    names[a.asname or a.name.split(".")[0]] = a.name if a.asname else \
                        a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _module_file(dotted: str, root: Path) -> Path | None:
    base = root / Path(*dotted.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.exists():
            return p
    return None


def _lines_of(tree: ast.Module, path: list[str]) -> int | None:
    body = tree.body
    node = None
    for name in path:
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                         ast.ClassDef)) and n.name == name), None)
        if node is None:
            return None
        body = node.body
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return node.end_lineno - start + 1


def _find_lines(full: list[str], root: Path, depth: int = 0) -> int | None:
    """Source lines of the object at dotted path ``full`` (a module, or a def/class in one,
    followed through one ``from module import name`` re-export)."""
    for cut in range(len(full), 0, -1):                  # the longest prefix that is a module
        f = _module_file(".".join(full[:cut]), root)
        if f is None:
            continue
        text = f.read_text()
        if cut == len(full):
            return len(text.splitlines())
        mod = ast.parse(text)
        found = _lines_of(mod, full[cut:])
        if found is None and depth < 2:
            for node in mod.body:                        # a name imported from elsewhere
                if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    for a in node.names:
                        if (a.asname or a.name) == full[cut]:
                            return _find_lines(node.module.split(".") + [a.name]
                                               + full[cut + 1:], root, depth + 1)
        return found
    return None


def printed_source_lines(cells: list[dict], root: Path = ROOT) -> tuple[int, list[str]]:
    """Lines of library or kernel source the notebook prints (``inspect.getsource(x)``,
    ``kernels.source(x)``), found in the course's files by name without importing anything;
    and the printed objects that could not be found."""
    trees = []
    for c in cells:
        if c["cell_type"] == "code":
            try:
                trees.append(ast.parse(_source(c)))
            except SyntaxError:
                pass
    alias = _aliases(trees)
    total, unresolved = 0, []
    for tree in trees:
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in PRINTERS and node.args):
                continue
            name = _dotted(node.args[0])
            parts = name.split(".") if name else []
            if not parts or parts[0] not in alias:
                unresolved.append(name or ast.unparse(node.args[0]))
                continue
            full = alias[parts[0]].split(".") + parts[1:]
            found = _find_lines(full, root)
            if found is None:
                unresolved.append(name)
            else:
                total += found
    return total, unresolved


def solution_code_lines(cell: dict) -> int:
    """Code lines (not blank, not comments) between the solution markers of one cell."""
    if cell["cell_type"] != "code":
        return 0
    lines, inside = 0, False
    for line in _source(cell).split("\n"):
        s = line.strip()
        if s in (BEGIN, END):
            inside = s == BEGIN
        elif inside and s and not s.startswith("#"):
            lines += 1
    return lines


def solution_exercises(path: Path) -> tuple[int, int]:
    """(checked exercises, code lines of their solutions) of a solution notebook."""
    if not path.exists():
        return 0, 0
    ids, lines = set(), 0
    for c in _taught(_cells(path)):
        lines += solution_code_lines(c)
        if c["cell_type"] == "code":
            ids |= set(re.findall(r'check\(\s*"(\d{2}\.[A-Za-z0-9_]+)"', _source(c)))
    return len(ids), lines


def lesson_time(stem: str, root: Path = ROOT) -> LessonTime:
    """The rule applied to ``notebooks/<stem>.ipynb`` and ``solutions/<stem>.ipynb``."""
    path = root / "notebooks" / f"{stem}.ipynb"
    if not path.exists():
        raise FileNotFoundError(f"no lesson notebook {path.relative_to(root)}; lessons are "
                                f"{sorted(p.stem for p in (root / 'notebooks').glob('*.ipynb'))}")
    return _time_of(_cells(path), stem, root)


def exercise_time(stem: str, root: Path = ROOT) -> LessonTime:
    """The rule applied to the exercise notebook a learner opens: ``solutions/<stem>.ipynb``
    with its solutions stubbed out, as ``course_lib.authoring.exercises`` writes
    ``exercises/<stem>.ipynb`` from it (reading), and its exercises (doing)."""
    path = root / "solutions" / f"{stem}.ipynb"
    if not path.exists():
        raise FileNotFoundError(f"no solution notebook {path.relative_to(root)}; there are "
                                f"{sorted(p.stem for p in (root / 'solutions').glob('*.ipynb'))}")
    return _time_of(make_exercise(json.loads(path.read_text()))["cells"], stem, root)


#: Cells tagged so are the hosted-runtime setup (course_lib.authoring.hosted): a no-op in a
#: clone, never read by the learner, so they count neither as reading nor as code.
SETUP_TAG = "course-setup"


def _taught(cells: list[dict]) -> list[dict]:
    return [c for c in cells if SETUP_TAG not in c.get("metadata", {}).get("tags", [])]


def _time_of(cells: list[dict], stem: str, root: Path) -> LessonTime:
    cells = _taught(cells)
    src, unresolved = printed_source_lines(cells, root)
    n_ex, sol_lines = solution_exercises(root / "solutions" / f"{stem}.ipynb")
    return LessonTime(stem, markdown_words(cells), code_lines(cells), src, unresolved, n_ex,
                      sol_lines)


# ---- the headers -----------------------------------------------------------------------------

def _header_cell(cells: list[dict]) -> tuple[int, re.Match] | tuple[None, None]:
    for i, c in enumerate(cells):
        if c["cell_type"] == "markdown":
            m = STATED.search(_source(c))
            if m:
                return i, m
    return None, None


def _rewrap(text: str, start: int) -> str:
    """Refill the paragraph of ``text`` that holds position ``start`` at 95 columns."""
    a = text.rfind("\n\n", 0, start)
    a = 0 if a < 0 else a + 2
    b = text.find("\n\n", start)
    b = len(text) if b < 0 else b
    para = " ".join(text[a:b].split())
    return text[:a] + textwrap.fill(para, 95, break_on_hyphens=False) + text[b:]


def rewrite_header(path: Path, root: Path = ROOT) -> str | None:
    """The lesson notebook's text with its header restated by the rule (None: no change)."""
    nb = json.loads(path.read_text())
    original = _source(nb["cells"][_header_cell(nb["cells"])[0] or 0])
    for _ in range(3):              # the header's own words count: restate until it holds
        i, m = _header_cell(nb["cells"])
        if i is None:
            raise ValueError(f"{path.name}: no header states '*Time: about N minutes to read "
                             f"(...)...; the notebook runs ...' for the rule to restate")
        t = _time_of(nb["cells"], path.stem, root)
        old = _source(nb["cells"][i])
        new = _rewrap(old[:m.start()] + t.header() + old[m.end():], m.start())
        if new == old:
            break
        nb["cells"][i]["source"] = new.splitlines(keepends=True)
    if _source(nb["cells"][i]) == original:
        return None
    return dumps(nb)


def rewrite_exercise_header(path: Path, root: Path = ROOT) -> str | None:
    """The solution notebook's text with its exercise notebook's header restated by the rule,
    or added as the last paragraph of its title cell (the first markdown cell) when it has
    none (None: no change)."""
    nb = json.loads(path.read_text())
    cells = nb["cells"]
    holders = [j for j, c in enumerate(cells) if c["cell_type"] == "markdown"
               and EXERCISE_STATED.search(_source(c))]
    titles = [j for j, c in enumerate(cells) if c["cell_type"] == "markdown"]
    if not holders and not titles:
        raise ValueError(f"{path.name}: no markdown cell to hold the exercise notebook's time")
    i = holders[0] if holders else titles[0]
    original = _source(cells[i])
    for _ in range(3):              # the header's own words count: restate until it holds
        old = _source(cells[i])
        t = _time_of(make_exercise(nb)["cells"], path.stem, root)
        m = EXERCISE_STATED.search(old)
        if m:
            new = _rewrap(old[:m.start()] + t.exercise_header() + old[m.end():], m.start())
        else:
            head = old.rstrip("\n") + "\n\n"
            new = _rewrap(head + t.exercise_header() + "\n", len(head)).rstrip("\n")
        if new == old:
            break
        cells[i]["source"] = new.splitlines(keepends=True)
    if _source(cells[i]) == original:
        return None
    return dumps(nb)


def stale_headers(root: Path = ROOT) -> list[str]:
    return [p.name for p in sorted((root / "notebooks").glob("*.ipynb"))
            if rewrite_header(p, root) is not None]


def stale_exercise_headers(root: Path = ROOT) -> list[str]:
    """Solution notebooks whose exercise-notebook header is missing or stale."""
    return [p.name for p in sorted((root / "solutions").glob("*.ipynb"))
            if rewrite_exercise_header(p, root) is not None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 where a header is stale")
    parser.add_argument("--show", action="store_true", help="print each lesson's figures")
    args = parser.parse_args(argv)
    lessons = sorted((ROOT / "notebooks").glob("*.ipynb"))
    if args.show:
        for p in lessons:
            t = lesson_time(p.stem)
            print(f"{p.stem:32s} read {t.reading_minutes:3d} min ({t.words} words, "
                  f"{t.code_lines} code lines, {t.source_lines} source lines"
                  + (f", unresolved {t.unresolved}" if t.unresolved else "")
                  + f"); {t.exercises} exercises, {t.exercise_minutes} min")
            if (ROOT / "solutions" / p.name).exists():
                e = exercise_time(p.stem)
                print(f"{'  its exercise notebook':32s} read {e.reading_minutes:3d} min "
                      f"({e.words} words, {e.code_lines} code lines, {e.source_lines} source "
                      f"lines); in all {e.reading_minutes + e.exercise_minutes} min")
        return 0
    if args.check:
        stale = stale_headers()
        for s in stale:
            print("stale header:", s)
        stale_ex = stale_exercise_headers()
        for s in stale_ex:
            print("stale exercise-notebook header: solutions/" + s)
        if stale or stale_ex:
            print("Run python -m course_lib.authoring.reading_time, then "
                  "python -m course_lib.authoring.exercises and "
                  "python -m course_lib.authoring.workshop doc")
        return 1 if stale or stale_ex else 0
    for p in lessons:
        text = rewrite_header(p)
        if text is not None:
            p.write_text(text)
            print("rewrote the header of", p.relative_to(ROOT))
    rewrote = False
    for p in sorted((ROOT / "solutions").glob("*.ipynb")):
        text = rewrite_exercise_header(p)
        if text is not None:
            p.write_text(text)
            rewrote = True
            print("rewrote the exercise notebook's header in", p.relative_to(ROOT))
    if rewrote:
        print("now regenerate exercises/: python -m course_lib.authoring.exercises")
    return 0


if __name__ == "__main__":
    sys.exit(main())
