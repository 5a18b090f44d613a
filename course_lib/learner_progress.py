"""Which exercises this learner has passed: ``course_lib.progress()`` (every exercise notebook),
and the room's progress for an instructor (``python -m course_lib.learner_progress room``).

Each ``check(...)`` that passes in the learner's own notebooks records the exercise in a small
JSON file of the learner's, under their home: ``$XDG_DATA_HOME/quant-course/`` (by default
``~/.local/share/quant-course/``), one file per course folder (its name carries the folder's
name and a hash of its path). So a shared install (JupyterHub, one checkout for many users)
keeps one progress file per user, and two copies of the course keep one each. The environment
variable ``COURSE_PROGRESS_FILE`` puts the file elsewhere. A ``.progress.json`` in the course
folder (where earlier versions kept it) that belongs to you is still read, and reset.

What is not recorded: checks run by the tests, by CI or by nbgrader (``COURSE_CHECKS`` set to
anything but ``learner``, or nbgrader running), and checks in the course's own solutions
notebooks (``solutions/``): only the learner's own notebooks (``exercises/``) count.

    import course_lib
    course_lib.progress()             # a table per lesson: passed / not yet
    course_lib.progress(reset=True)   # forget everything and start again

    python -m course_lib.learner_progress where                  # this learner's file
    python -m course_lib.learner_progress room FILE_OR_FOLDER... # the room: one row per learner
"""
from __future__ import annotations

import argparse
import csv
import getpass
import hashlib
import html
import io
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from course_lib.paths import ROOT

FILE_NAME = ".progress.json"       # where earlier versions kept it: in the course folder
ENV = "COURSE_PROGRESS_FILE"
APP_DIR = "quant-course"           # under $XDG_DATA_HOME (~/.local/share)
VERSION = 1
_EXERCISE_ID = re.compile(r"^\d\d\.[A-Za-z_][A-Za-z0-9_]*$")     # "02.absmax_quantize"
_CHECK_CALL = re.compile(r"""\bcheck\(\s*["'](\d\d\.[A-Za-z_][A-Za-z0-9_]*)["']""")
_REPAIR = "delete it or call course_lib.progress(reset=True)"


def default_file(root: Path | None = None) -> Path:
    """This user's progress file for the course in ``root``: ``$XDG_DATA_HOME/quant-course/
    progress-<folder name>-<hash of its path>.json`` (``~/.local/share`` when
    ``$XDG_DATA_HOME`` is unset or not an absolute path, as the XDG spec says)."""
    base = os.environ.get("XDG_DATA_HOME", "")
    data = Path(base) if os.path.isabs(base) else Path("~/.local/share").expanduser()
    course = Path(ROOT if root is None else root).resolve()
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", course.name).strip("-.") or "course"
    key = hashlib.sha256(str(course).encode()).hexdigest()[:10]
    return data / APP_DIR / f"progress-{name}-{key}.json"


def progress_file(path: str | Path | None = None) -> Path:
    """Where progress is kept: ``path``, else ``$COURSE_PROGRESS_FILE``, else this user's
    ``default_file()``."""
    if path is None:
        path = os.environ.get(ENV) or default_file()
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


def _legacy_file(path: str | Path | None) -> Path | None:
    """The course folder's ``.progress.json`` of an earlier version, when the default file is in
    use and that file is this user's own (on a shared install it may be someone else's)."""
    if path is not None or os.environ.get(ENV):
        return None
    old = ROOT / FILE_NAME
    try:
        mine = not hasattr(os, "getuid") or old.stat().st_uid == os.getuid()
    except OSError:
        return None
    return old if mine and old.is_file() else None


def solutions_notebook(root: Path = ROOT) -> bool:
    """Whether this kernel runs one of the course's solutions notebooks (``solutions/``): their
    passes are the course's answers, not the learner's. Jupyter names the notebook in
    ``$JPY_SESSION_NAME`` (jupyter_server 2, ``SessionManager.get_kernel_env``) and starts the
    kernel in its folder; without the name, the working folder decides."""
    name = os.environ.get("JPY_SESSION_NAME", "")
    try:
        where = Path(name).parent if os.path.isabs(name) else Path.cwd()
        return where.resolve() == (Path(root) / "solutions").resolve()
    except OSError:                     # a working folder that no longer exists
        return False


def load(path: str | Path | None = None) -> dict[str, dict]:
    """The passed exercises: ``{exercise_id: {"at": iso time, "cases": n}}`` (empty if none).

    A damaged file (not JSON, not a progress record, entries of the wrong shape, a newer
    version) raises ``ValueError`` saying so and how to start again. With the default file,
    passes kept in the course folder's ``.progress.json`` of an earlier version (yours) count
    too."""
    passed = _read(progress_file(path))
    legacy = _legacy_file(path)
    if legacy is not None:
        try:
            passed = {**_read(legacy), **passed}
        except ValueError:
            pass                   # an old, damaged file: the current one alone counts
    return passed


def _read(file: Path) -> dict[str, dict]:
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


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:                   # no user name to be had (some containers)
        return ""


def _save(passed: dict[str, dict], file: Path) -> None:
    record = {"version": 1, "passed": passed, "course": str(ROOT), "user": _user()}
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
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
    passed = load(path)
    passed[exercise_id] = {"at": datetime.now().isoformat(timespec="seconds"), "cases": cases}
    _save(passed, file)


def forget_all(path: str | Path | None = None) -> None:
    """Forget every passed exercise (the course folder's ``.progress.json`` of an earlier
    version too, when it is yours and the default file is in use)."""
    file = progress_file(path)
    for f in (file, _legacy_file(path)):
        if f is not None and f.exists():
            f.unlink()


def _exercise_notebooks(root: Path = ROOT) -> list[Path]:
    """The learner's exercise notebooks (``exercises/``); ``solutions/`` where a copy has no
    ``exercises/`` (same names). A learner's release has no ``solutions/``."""
    for folder in ("exercises", "solutions"):
        found = sorted((Path(root) / folder).glob("*.ipynb"))
        if found:
            return found
    return []


def lesson_names(root: Path = ROOT) -> dict[str, str]:
    """``{"02": "02 absmax and zero points", ...}`` from the exercise notebooks' file names."""
    names = {}
    for nb in _exercise_notebooks(root):
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


# ---- the room: every learner's progress file in one table (for an instructor) ---------------

def exercise_ids(root: Path = ROOT) -> dict[str, list[str]]:
    """``{"02 absmax and zero points": ["02.absmax_quantize", ...], ...}``: the exercises each
    exercise notebook checks, in notebook order, read from its ``check("NN.id", ...)`` calls
    (this module sits below the checks' registry, so it reads the notebooks instead)."""
    names = lesson_names(root)
    lessons: dict[str, list[str]] = {}
    for nb in _exercise_notebooks(root):
        ids = lessons.setdefault(names[nb.stem.partition("_")[0]], [])
        for cell in json.loads(nb.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "code":
                src = cell["source"]
                for ex_id in _CHECK_CALL.findall("".join(src) if isinstance(src, list) else src):
                    if ex_id not in ids:
                        ids.append(ex_id)
    return lessons


def progress_files(sources: list[str | Path]) -> list[Path]:
    """The files named, and the ``*.json`` files found under each folder named (at any depth),
    in order, each once. A path that does not exist raises ``ValueError`` naming it."""
    if isinstance(sources, (str, os.PathLike)) or not sources:
        raise ValueError(f"give a list of progress files or folders holding them, got {sources!r}")
    files: list[Path] = []
    for source in sources:
        path = Path(source).expanduser()
        if path.is_dir():
            found = sorted(path.rglob("*.json"))
        elif path.is_file():
            found = [path]
        else:
            raise ValueError(f"{str(path)!r} does not exist: give progress files (JSON) or "
                             f"folders holding them")
        files += [f for f in found if f not in files]
    return files


@dataclass
class Learner:
    name: str
    file: Path
    passed: dict[str, dict]

    @property
    def last(self) -> str:
        """The time of the latest pass ("" if none)."""
        return max((e["at"] for e in self.passed.values()), default="")


@dataclass
class Room:
    """Every learner's progress (``room()``): text in a terminal, ``csv()`` for a spreadsheet."""
    lessons: dict[str, list[str]]       # lesson name -> its exercise ids, in notebook order
    learners: list[Learner]
    skipped: list[tuple[Path, str]]     # files that are not progress records, and why

    @property
    def total(self) -> int:
        return sum(len(ids) for ids in self.lessons.values())

    def done(self, learner: Learner, lesson: str) -> int:
        return sum(1 for ex_id in self.lessons[lesson] if ex_id in learner.passed)

    def _score(self, learner: Learner) -> int:
        return sum(self.done(learner, lesson) for lesson in self.lessons)

    def __repr__(self) -> str:
        numbers = [lesson.split(" ", 1)[0] for lesson in self.lessons]
        head = (["learner", "passed", "last pass"]
                + [f"{n}/{len(ids)}" for n, ids in zip(numbers, self.lessons.values())])
        rows = [[x.name, f"{self._score(x)}/{self.total}", x.last.replace("T", " ")[:16] or "-"]
                + [str(self.done(x, lesson) or "·") for lesson in self.lessons]
                for x in self.learners]
        complete = ["", "", ""] + [
            str(sum(1 for x in self.learners if self.done(x, lesson) == len(ids)))
            for lesson, ids in self.lessons.items()]
        widths = [max(len(r[i]) for r in [head, complete] + rows) for i in range(len(head))]
        widths[0] = max(len(r[0]) for r in [head] + rows)
        line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)   # noqa: E731
                                   for i, (c, w) in enumerate(zip(r, widths))).rstrip()
        out = [f"The room: {len(self.learners)} learner(s), {self.total} exercises in "
               f"{len(self.lessons)} lessons (a lesson column: exercises passed, of the number "
               f"in its heading)", line(head)]
        out += [line(r) for r in rows]
        out.append("learners who passed every exercise of a lesson: " + ", ".join(
            f"{n}: {c}" for n, c in zip(numbers, complete[3:])))
        out += [f"skipped {f}: {why}" for f, why in self.skipped]
        return "\n".join(out)

    def csv(self) -> str:
        """One row per learner: name, file, passed, then 1/0 per exercise (lesson order)."""
        ids = [ex_id for lesson_ids in self.lessons.values() for ex_id in lesson_ids]
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["learner", "file", "passed", "last_pass"] + ids)
        for x in self.learners:
            writer.writerow([x.name, str(x.file), self._score(x), x.last]
                            + [int(ex_id in x.passed) for ex_id in ids])
        return buf.getvalue()


def _names(files: list[Path], users: list[str]) -> list[str]:
    """A name per file: the user its record names (written since per-user files), else the
    shortest part of its path that tells the files apart (the file's stem, or the folder under
    the files' common folder: /home/<name>/...)."""
    def unique(names):
        return len(set(names)) == len(names) and all(names)
    if unique(users):
        return users
    stems = [f.stem for f in files]
    if unique(stems):
        return stems
    absolute = [f.resolve() for f in files]
    common = Path(os.path.commonpath(absolute)) if len(files) > 1 else absolute[0].parent
    rel = [f.relative_to(common) for f in absolute]
    firsts = [r.parts[0] if len(r.parts) > 1 else r.stem for r in rel]
    return firsts if unique(firsts) else [str(r) for r in rel]


def room(sources: list[str | Path], root: Path = ROOT) -> Room:
    """Every learner's progress in one table: ``sources`` are progress files, or folders holding
    them (collected from learners, or read where a shared install keeps them:
    ``/home/*/.local/share/quant-course/``). A file that is not a progress record is skipped,
    with the reason, not fatal: one broken file must not hide the room."""
    files = progress_files(sources)
    kept, users, skipped = [], [], []
    for f in files:
        try:
            passed = load(f)
            data = json.loads(f.read_text(encoding="utf-8"))
        except (ValueError, OSError) as err:
            skipped.append((f, str(err).replace(f"{f}: ", "").replace(str(f), "it")))
            continue
        kept.append((f, passed))
        user = data.get("user") if isinstance(data.get("user"), str) else ""
        users.append(user)
    names = _names([f for f, _ in kept], users) if kept else []
    learners = [Learner(n, f, p) for n, (f, p) in zip(names, kept)]
    return Room(exercise_ids(root), sorted(learners, key=lambda x: x.name), skipped)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.learner_progress",
        description="Learners' progress files: where yours is, and the room's in one table.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("where", help="print the path of this learner's progress file")
    r = sub.add_parser("room", help="one row per learner, from their progress files")
    r.add_argument("sources", nargs="+", help="progress files (JSON), or folders holding them")
    r.add_argument("--csv", action="store_true", help="CSV, one column per exercise")
    args = parser.parse_args(argv)
    if args.command == "where":
        print(progress_file())
        return 0
    try:
        table = room(args.sources)
    except ValueError as err:
        parser.error(str(err))
    if not table.learners:
        print(repr(table) if table.skipped else "", file=sys.stderr)
        parser.error("no progress file among the paths given")
    print(table.csv() if args.csv else repr(table), end="\n" if not args.csv else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
