"""Which exercises this learner has passed: ``course_lib.progress()`` (every exercise notebook).

Each ``check(...)`` that passes in the learner's own notebooks records the exercise in a small
JSON file in the course folder, ``.progress.json`` (git-ignored, yours alone). Checks run by the
tests, by CI or by nbgrader (``COURSE_CHECKS`` set to anything but ``learner``) record nothing.
The environment variable ``COURSE_PROGRESS_FILE`` puts the file elsewhere.

    import course_lib
    course_lib.progress()             # a table per lesson: passed / not yet
    course_lib.progress(reset=True)   # forget everything and start again
"""
from __future__ import annotations

import html
import json
import os
import re
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from course_lib.paths import ROOT

FILE_NAME = ".progress.json"
ENV = "COURSE_PROGRESS_FILE"
VERSION = 1
_EXERCISE_ID = re.compile(r"^\d\d\.[A-Za-z_][A-Za-z0-9_]*$")     # "02.absmax_quantize"
_REPAIR = "delete it or call course_lib.progress(reset=True)"


def progress_file(path: str | Path | None = None) -> Path:
    """Where progress is kept: ``path``, else ``$COURSE_PROGRESS_FILE``, else the course folder."""
    if path is None:
        path = os.environ.get(ENV) or ROOT / FILE_NAME
        where = f"${ENV}" if os.environ.get(ENV) else "the default"
    else:
        where = "path"
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise ValueError(f"{where} must name a progress file (a str or Path such as "
                         f"'~/my_progress.json'), got {path!r}")
    file = Path(path).expanduser()
    if file.is_dir():
        raise ValueError(f"{where} {str(file)!r} is a folder; give the path of a file inside it, "
                         f"e.g. {str(file / FILE_NAME)!r}")
    return file


def load(path: str | Path | None = None) -> dict[str, dict]:
    """The passed exercises: ``{exercise_id: {"at": iso time, "cases": n}}`` (empty if none).

    A damaged file (not JSON, not a progress record, entries of the wrong shape, a newer
    version) raises ``ValueError`` saying so and how to start again."""
    file = progress_file(path)
    if not file.exists():
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{file} is not valid JSON ({err}); {_REPAIR}") from err
    passed = data.get("passed", {}) if isinstance(data, dict) else None
    if not isinstance(passed, dict):
        raise ValueError(f"{file} does not hold a progress record (a JSON object with a "
                         f"'passed' object); {_REPAIR}")
    version = data.get("version", VERSION)
    if version != VERSION:
        raise ValueError(f"{file} is a progress record of version {version!r}; this course "
                         f"reads version {VERSION}. Update the course, or {_REPAIR}")
    for ex_id, entry in passed.items():
        if not _EXERCISE_ID.match(ex_id):
            raise ValueError(f"{file}: {ex_id!r} is not an exercise id (a lesson number and a "
                             f"name, like '02.absmax_quantize'); {_REPAIR}")
        if not (isinstance(entry, dict) and isinstance(entry.get("at"), str)
                and _iso_time(entry["at"]) and _valid_cases(entry.get("cases"))):
            raise ValueError(f"{file}: the entry for {ex_id!r} is damaged ({entry!r}; expected "
                             f"{{'at': an ISO time, 'cases': a whole number >= 1}}); {_REPAIR}")
    return passed


def _iso_time(text: str) -> bool:
    try:
        datetime.fromisoformat(text)
    except ValueError:
        return False
    return True


def _valid_cases(cases) -> bool:
    return isinstance(cases, int) and not isinstance(cases, bool) and cases >= 1


def _save(passed: dict[str, dict], file: Path) -> None:
    text = json.dumps({"version": 1, "passed": passed}, indent=1, sort_keys=True) + "\n"
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=file.name, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, file)   # atomic: a crash never leaves half a file
    except OSError as err:
        raise OSError(f"cannot write your progress to {file} ({err.strerror or err}); set "
                      f"${ENV} to a file in a folder you can write, e.g. "
                      f"~/course_progress.json") from err


def record_pass(exercise_id: str, cases: int, path: str | Path | None = None) -> None:
    """Note that ``exercise_id`` passed all its ``cases`` (called by ``check``)."""
    if not isinstance(exercise_id, str) or not _EXERCISE_ID.match(exercise_id):
        raise ValueError(f"exercise_id must be a lesson number and a name, like "
                         f"'02.absmax_quantize'; got {exercise_id!r}")
    if not _valid_cases(cases):
        raise ValueError(f"cases must be the number of cases passed, a whole number >= 1; "
                         f"got {cases!r}")
    file = progress_file(path)
    passed = load(file)
    passed[exercise_id] = {"at": datetime.now().isoformat(timespec="seconds"), "cases": cases}
    _save(passed, file)


def forget_all(path: str | Path | None = None) -> None:
    """Forget every passed exercise."""
    file = progress_file(path)
    if file.exists():
        file.unlink()


def lesson_names(root: Path = ROOT) -> dict[str, str]:
    """``{"02": "02 absmax and zero points", ...}`` from the exercise notebooks' file names."""
    names = {}
    for nb in sorted((root / "solutions").glob("*.ipynb")):
        number, _, rest = nb.stem.partition("_")
        names[number] = f"{number} {rest.replace('_', ' ')}"
    return names


@dataclass
class Row:
    exercise_id: str
    title: str
    passed_at: str | None   # ISO time of the first pass recorded, None = not yet


@dataclass
class Progress:
    """The table ``course_lib.progress()`` shows (text in a terminal, HTML in a notebook)."""
    file: Path
    lessons: dict[str, list[Row]]   # lesson name -> its exercises in order

    @property
    def passed(self) -> list[str]:
        return [r.exercise_id for rows in self.lessons.values() for r in rows if r.passed_at]

    @property
    def total(self) -> int:
        return sum(len(rows) for rows in self.lessons.values())

    def _headline(self) -> str:
        return f"{len(self.passed)} of {self.total} exercises passed"

    def __repr__(self) -> str:
        out = [f"Your progress: {self._headline()} (kept in {self.file})"]
        width = max((len(r.exercise_id) for rows in self.lessons.values() for r in rows), default=0)
        for lesson, rows in self.lessons.items():
            done = sum(1 for r in rows if r.passed_at)
            out.append(f"\n{lesson}  ({done}/{len(rows)})")
            for r in rows:
                mark = f"passed {r.passed_at.replace('T', ' ')[:16]}" if r.passed_at else "not yet"
                out.append(f"  {'✓' if r.passed_at else '·'} {r.exercise_id:<{width}}  "
                           f"{mark:<23} {r.title}")
        return "\n".join(out)

    def _repr_html_(self) -> str:
        parts = [f"<p><b>Your progress:</b> {self._headline()} "
                 f"<small>(kept in <code>{html.escape(str(self.file))}</code>)</small></p>"]
        for lesson, rows in self.lessons.items():
            done = sum(1 for r in rows if r.passed_at)
            body = "".join(
                f"<tr><td><code>{html.escape(r.exercise_id)}</code></td>"
                f"<td>{html.escape(r.title)}</td>"
                + (f"<td style='color:#1a7f37'>✓ passed {html.escape(r.passed_at[:10])}</td>"
                   if r.passed_at else "<td style='color:#888'>not yet</td>") + "</tr>"
                for r in rows)
            parts.append(f"<details open><summary><b>{html.escape(lesson)}</b> ({done}/{len(rows)})"
                         f"</summary><table><tr><th>exercise</th><th>what</th><th>status</th></tr>"
                         f"{body}</table></details>")
        return "\n".join(parts)


def progress_table(exercises: dict[str, str], reset: bool = False,
                   path: str | Path | None = None) -> Progress:
    """Which of ``exercises`` ({exercise id: title}, in notebook order) you have passed, lesson
    by lesson: what ``course_lib.progress()`` shows, given the checks' registry (this module
    sits below ``course_lib.checks``, which records passes here, so it does not import it).

    ``reset=True`` forgets them all first. ``path``: a progress file other than the course's.
    """
    if not isinstance(exercises, dict):
        raise TypeError(f"exercises must be a dict {{exercise id: title}} (course_lib.progress() "
                        f"passes the checks' registry); got {type(exercises).__name__}")
    if not isinstance(reset, bool):
        raise TypeError(f"reset must be True or False, got {reset!r}")
    if reset:
        forget_all(path)
    passed = load(path)
    names = lesson_names()
    lessons: dict[str, list[Row]] = {}
    for ex_id, title in exercises.items():   # lesson by lesson, in notebook order
        number = ex_id.split(".", 1)[0]
        at = passed.get(ex_id, {}).get("at")
        lessons.setdefault(names.get(number, number), []).append(Row(ex_id, title, at))
    return Progress(progress_file(path), lessons)
