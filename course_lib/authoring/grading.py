"""Grade the course's exercises with nbgrader (for instructors).

    python -m course_lib.authoring.grading COURSE_DIR            # every lesson
    python -m course_lib.authoring.grading COURSE_DIR 02 04      # some lessons
    cd COURSE_DIR
    nbgrader generate_assignment 02_absmax_and_zero_points --force   # -> release/
    # learners' notebooks go to submitted/<student>/<lesson>/<lesson>.ipynb, then
    nbgrader autograde 02_absmax_and_zero_points                     # -> autograded/, gradebook.db
    nbgrader export                                                   # -> grades.csv

The command makes an nbgrader course folder: one assignment per lesson, whose source is the
lesson's solution notebook (``solutions/``, stamped with nbgrader's cell metadata by
``course_lib.authoring.nbmeta``), and an ``nbgrader_config.py`` that

- sets ``COURSE_CHECKS=grading`` for the kernels nbgrader starts, so that ``check(...)`` raises
  unless the answer passes: an unsolved or wrong exercise scores 0, a passing one its points;
- releases exercises exactly as ``exercises/`` holds them (the ``# HINT:`` lines stay), through
  ``ClearSolutionsKeepHints``;
- gives each cell up to 10 minutes (nbgrader's default, 30 s, is short for a 2-core laptop).

nbgrader runs ``alembic`` from the environment's ``bin`` folder: activate the environment
(``source .venv/bin/activate``) before calling ``nbgrader``.

A blank submission scores 0 in any nbgrader course, this config or none: ``check(...)`` is strict
whenever nbgrader runs a notebook (``course_lib.checks``: nbgrader sets ``NBGRADER_EXECUTION``).

The learners' copy of the course, without the solutions:

    python -m course_lib.authoring.grading release DIR     # the course minus RELEASE_EXCLUDES

copies the course's files (those git tracks, and new files git does not ignore; no ``.venv``,
model or progress file) except ``solutions/`` and what reads it (``tests/``, ``.ci/``), and
writes ``DIR/.course-release`` saying what it is (``--force`` replaces an earlier release).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from nbgrader.converters import GenerateAssignment
from nbgrader.preprocessors import ClearSolutions

from course_lib.authoring.exercises import ROOT, strip_solutions

CONFIG = '''\
# nbgrader configuration for "Quantization, Hands On" (written by python -m course_lib.authoring.grading).
import os

# check(...) raises unless the answer passes, so nbgrader's autograder sees a failed test cell
# (0 points) for an unsolved or wrong exercise, and a clean one (full points) for a correct one.
# (First, so that it holds even if the import below fails: nbgrader goes on after a config error.)
os.environ["COURSE_CHECKS"] = "grading"

from course_lib.authoring.grading import release_preprocessors  # noqa: E402

c = get_config()  # noqa: F821 (nbgrader provides it)
c.CourseDirectory.course_id = "quantization-hands-on"
c.GenerateAssignment.preprocessors = release_preprocessors()
c.Execute.timeout = {timeout}
'''


def lessons(root: Path = ROOT) -> list[str]:
    """The assignment names: one per solution notebook (``02_absmax_and_zero_points``...)."""
    names = [p.stem for p in sorted((Path(root) / "solutions").glob("*.ipynb"))]
    if not names:
        raise ValueError(f"no solution notebooks in {Path(root) / 'solutions'}: root must be the "
                         f"course's folder (the one holding solutions/)")
    return names


def setup_course(course_dir: str | Path, only: list[str] | None = None, timeout: int = 600,
                 root: Path = ROOT) -> list[str]:
    """Write an nbgrader course folder (config + ``source/<lesson>/``); return its assignments.

    ``only``: lesson numbers or names to include (``["02", "04_a_real_model"]``); all by default.
    ``timeout``: seconds nbgrader gives each cell (a whole number >= 1).
    """
    if not isinstance(course_dir, (str, os.PathLike)) or not str(course_dir).strip():
        raise ValueError(f"course_dir must be a folder path (str or Path), got {course_dir!r}")
    course = Path(course_dir)
    if course.exists() and not course.is_dir():
        raise ValueError(f"course_dir {str(course)!r} is a file; give a folder (new or an "
                         f"nbgrader course folder made by this command)")
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
        raise ValueError(f"timeout is the seconds nbgrader gives each cell, a whole number >= 1 "
                         f"(600 by default); got {timeout!r}")
    names = lessons(root)
    if only is not None:
        if isinstance(only, (str, bytes)) or not all(isinstance(o, str) for o in only):
            raise ValueError(f"only must be a list of lesson numbers or names, e.g. ['02'] or "
                             f"['04_a_real_model']; got {only!r}")
        unknown = [o for o in only if not any(n == o or n.startswith(f"{o}_") for n in names)]
        if unknown:
            raise ValueError(f"no lesson {unknown}; lessons: {', '.join(names)}")
        names = [n for n in names if any(n == o or n.startswith(f"{o}_") for o in only)]
        if not names:
            raise ValueError("only is empty: name at least one lesson, or pass None for all")
    course.mkdir(parents=True, exist_ok=True)
    (course / "nbgrader_config.py").write_text(CONFIG.format(timeout=int(timeout)))
    for name in names:
        dest = course / "source" / name
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / "solutions" / f"{name}.ipynb", dest / f"{name}.ipynb")
    return names


def release_preprocessors() -> list:
    """nbgrader's release steps with ``ClearSolutions`` replaced by ``ClearSolutionsKeepHints``."""
    steps = GenerateAssignment.class_traits()["preprocessors"].default()
    return [ClearSolutionsKeepHints if p is ClearSolutions else p for p in steps]


class ClearSolutionsKeepHints(ClearSolutions):
    """nbgrader's ClearSolutions, writing the stub ``course_lib.authoring.exercises`` writes (the
    ``# HINT:`` lines of a solution block stay), so that a release equals ``exercises/``."""

    def _replace_solution_region(self, cell, language):
        if self.begin_solution_delimeter not in cell.source:
            return False
        cell.source = strip_solutions(cell.source, markdown=cell.cell_type == "markdown")
        return True


# What a learner's copy leaves out: the solved exercises, and what exists to test them (the
# course's test suite and CI read solutions/, so they would fail in a copy without it).
RELEASE_EXCLUDES = ("solutions/", "tests/", ".ci/")
# Where git is not there to say what the course's files are: what .gitignore lists, and .git
_NOT_COURSE = {".git", ".venv", "models", "data", "rendered", "build", "third_party",
               "__pycache__", ".pytest_cache", ".ipynb_checkpoints", ".progress.json"}
MARKER = ".course-release"


def course_files(root: Path = ROOT) -> list[str]:
    """The course's files, relative to ``root``: what git tracks and the new files it does not
    ignore (``git ls-files --cached --others --exclude-standard``), present on disk; without
    git, every file outside ``_NOT_COURSE`` and ``*.egg-info``."""
    root = Path(root)
    if (root / ".git").exists() and shutil.which("git"):
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=root, capture_output=True, text=True, check=True).stdout
        names = sorted({n for n in out.split("\0") if n})
    else:
        names = sorted(
            str(p.relative_to(root)) for p in root.rglob("*")
            if p.is_file() and not any(part in _NOT_COURSE or part.endswith(".egg-info")
                                       for part in p.relative_to(root).parts))
    return [n for n in names if (root / n).is_file() and not (root / n).is_symlink()]


def release(dest: str | Path, root: Path = ROOT, force: bool = False) -> dict:
    """Write the learners' copy of the course into ``dest``: every course file except
    ``RELEASE_EXCLUDES`` (no solutions). Returns what ``dest/.course-release`` records.

    ``dest`` must be outside the course folder, and new or empty, or (``force``) an earlier
    release, which is replaced."""
    if not isinstance(dest, (str, os.PathLike)) or not str(dest).strip():
        raise ValueError(f"the release folder must be a path (str or Path), got {dest!r}")
    root, dest = Path(root).resolve(), Path(dest).expanduser().resolve()
    lessons(root)                                     # a course folder, with its solutions/
    if dest == root or root in dest.parents or dest in root.parents:
        raise ValueError(f"write the release outside the course folder ({root}), not at "
                         f"{dest}: a copy inside it would travel with the course")
    if dest.exists() and not dest.is_dir():
        raise ValueError(f"{dest} is a file; give a folder for the release")
    if dest.is_dir() and any(dest.iterdir()):
        if not (dest / MARKER).is_file():
            raise ValueError(f"{dest} is not empty and holds no earlier release ({MARKER}); "
                             f"give a new or empty folder")
        if not force:
            raise ValueError(f"{dest} holds an earlier release; pass --force to replace it")
        shutil.rmtree(dest)
    files = course_files(root)
    kept = [f for f in files if not f.startswith(RELEASE_EXCLUDES)]
    for name in kept:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, target)
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = ""
    record = {"from": str(root), "commit": commit,
              "made": time.strftime("%Y-%m-%d %H:%M", time.localtime()),
              "files": len(kept), "left_out": list(RELEASE_EXCLUDES),
              "left_out_files": len(files) - len(kept)}
    dest.mkdir(parents=True, exist_ok=True)
    (dest / MARKER).write_text(json.dumps(record, indent=1) + "\n")
    return record


def release_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.authoring.grading release",
        description="Write the learners' copy of the course: no solutions/ (nor tests/, .ci/).")
    parser.add_argument("dest", help="a new or empty folder outside the course folder")
    parser.add_argument("--force", action="store_true", help="replace an earlier release there")
    args = parser.parse_args(argv)
    try:
        record = release(args.dest, force=args.force)
    except ValueError as err:
        parser.error(str(err))
    print(f"{args.dest}: {record['files']} files; left out: {', '.join(record['left_out'])} "
          f"({record['left_out_files']} files)")
    print("not in it: .venv, the converted model (make setup makes both), progress files")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["release"]:
        return release_main(argv[1:])
    parser = argparse.ArgumentParser(
        description="Make an nbgrader course folder from solutions/ (or: release DIR, the "
                    "learners' copy of the course without solutions/).")
    parser.add_argument("course_dir", help="folder to create or update")
    parser.add_argument("lessons", nargs="*", help="lesson numbers or names (default: all)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell when grading")
    args = parser.parse_args(argv)
    try:
        names = setup_course(args.course_dir, args.lessons or None, args.timeout)
    except ValueError as err:
        parser.error(str(err))
    print(f"{args.course_dir}: {len(names)} assignment(s): {', '.join(names)}")
    print(f"next: cd {args.course_dir} && nbgrader generate_assignment {names[0]} --force")
    return 0


if __name__ == "__main__":
    sys.exit(main())
