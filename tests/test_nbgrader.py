"""nbgrader round trip, as an instructor runs it (nbgrader 0.9.6, its command line).

`nbgrader generate_assignment` releases every lesson's exercises from solutions/: no solution
code is left, and each release holds exactly exercises/' cells. `nbgrader autograde` scores the
solved notebook full marks and the unsolved release zero, for a representative subset of the
lessons (all of them with COURSE_NBGRADER_ALL=1; see AUTOGRADED for why not by default).

The same holds in a plain nbgrader course, with nbgrader's defaults and none of the course's
config (no COURSE_CHECKS=grading): a blank submission scores 0, a solved one full marks
(check() is strict whenever nbgrader runs a notebook).
"""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nbgrader.api import Gradebook

from course_lib.authoring.exercises import BEGIN, END
from course_lib.authoring.grading import lessons, setup_course

ROOT = Path(__file__).resolve().parent.parent
LESSONS = lessons()
# Autograding runs each notebook twice (solved, unsolved): all 12 lessons took 464 s on the
# 2-core machine under heavy load (all passed), too much to add to every CI run. The subset
# covers each kind of test cell: `ok = check(...)` cells after the solution cell (02), cells
# the stamper split off a solution cell (01), and `ok_NAME = check(...)` cells after a Triton
# kernel exercise run by the interpreter (09). COURSE_NBGRADER_ALL=1 autogrades every lesson.
AUTOGRADED = LESSONS if os.environ.get("COURSE_NBGRADER_ALL") else [
    n for n in LESSONS if n[:2] in ("01", "02", "09")]


def nbgrader(course: Path, *args: str, timeout: int = 900,
             env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """Run the nbgrader command line in the course folder, as an instructor would."""
    env = dict(os.environ, **(env_extra or {}))
    # nbgrader runs `alembic` (its database migrations) from the environment's bin folder
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    # this checkout's course_lib, for nbgrader_config.py and for the kernels it starts
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    # the learner's default: only the course's nbgrader_config.py makes check() strict
    env["COURSE_CHECKS"] = "learner"
    env.setdefault("OMP_NUM_THREADS", "1")
    run = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env,
                         capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{run.stdout}\n{run.stderr}"
    assert "Traceback" not in run.stdout + run.stderr, run.stdout + run.stderr  # config errors
    return run


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    course = tmp_path_factory.mktemp("nbgrader_course")
    assert setup_course(course) == LESSONS
    start = time.perf_counter()
    nbgrader(course, "generate_assignment", "*", "--force")
    print(f"\ngenerate_assignment, {len(LESSONS)} lessons: {time.perf_counter() - start:.1f} s")
    return course


def _cells(path):
    return json.loads(Path(path).read_text())["cells"]


def _src(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


@pytest.mark.parametrize("name", LESSONS)
def test_release_has_no_solution_and_equals_exercises(course, name):
    release = course / "release" / name / f"{name}.ipynb"
    cells = _cells(release)
    text = release.read_text()
    assert BEGIN not in text and END not in text and "BEGIN SOLUTION" not in text
    solution_lines = {line.strip() for c in _cells(ROOT / "solutions" / f"{name}.ipynb")
                      for block in _src(c).split(BEGIN)[1:]
                      for line in block.split(END)[0].split("\n")
                      if len(line.strip()) >= 20 and not line.strip().startswith("#")}
    # a line the solution notebook also has outside its solutions (`with torch.no_grad():` in a
    # later cell) is not a leak
    outside = {line.strip() for c in _cells(ROOT / "solutions" / f"{name}.ipynb")
               for i, block in enumerate(_src(c).split(BEGIN))
               for line in (block.split(END)[-1] if i else block).split("\n")}
    solution_lines -= outside
    leaked = [line for c in cells for line in _src(c).split("\n") if line.strip() in solution_lines]
    assert not leaked, f"solution code left in the release: {leaked[:3]}"
    exercise = _cells(ROOT / "exercises" / f"{name}.ipynb")
    assert [(c["id"], c["cell_type"], _src(c)) for c in cells] == \
        [(c["id"], c["cell_type"], _src(c)) for c in exercise]
    # (equal to exercises/ also means course_lib.authoring.grading's stub, hints kept, replaced nbgrader's)
    assert sum(_src(c).count('raise NotImplementedError("exercise') for c in cells) >= 2


@pytest.fixture(scope="module")
def graded(course):
    """Autograde a solved and an unsolved copy of each lesson in AUTOGRADED."""
    for name in AUTOGRADED:
        for student, src in (("solved", course / "source"), ("unsolved", course / "release")):
            dest = course / "submitted" / student / name
            dest.mkdir(parents=True)
            shutil.copyfile(src / name / f"{name}.ipynb", dest / f"{name}.ipynb")
    times = {}
    for name in AUTOGRADED:
        start = time.perf_counter()
        nbgrader(course, "autograde", name, "--force")
        times[name] = time.perf_counter() - start
    print("\nautograde (solved + unsolved):", {k: round(v, 1) for k, v in times.items()})
    gb = Gradebook(f"sqlite:///{course / 'gradebook.db'}")
    scores = {(name, student): gb.find_submission(name, student)
              for name in AUTOGRADED for student in ("solved", "unsolved")}
    yield scores
    gb.close()


@pytest.mark.timeout(3600)   # the first test also runs the autograding (fixture)
@pytest.mark.parametrize("name", AUTOGRADED)
def test_autograde_solved_full_marks_unsolved_zero(graded, name):
    solved, unsolved = graded[(name, "solved")], graded[(name, "unsolved")]
    n_exercises = sum(1 for c in _cells(ROOT / "solutions" / f"{name}.ipynb")
                      if c["metadata"]["nbgrader"]["grade"])
    assert n_exercises >= 3
    assert solved.max_score == n_exercises and not solved.needs_manual_grade
    assert solved.score == n_exercises, [
        (g.name, g.auto_score) for g in solved.notebooks[0].grades if g.auto_score != g.max_score]
    assert unsolved.score == 0 and not unsolved.needs_manual_grade
    assert all(g.auto_score == 0 for g in unsolved.notebooks[0].grades)


# ---- a plain nbgrader course: nbgrader's own defaults, not the course's config -----------------

PLAIN = "02_absmax_and_zero_points"


@pytest.fixture(scope="module")
def plain_course(tmp_path_factory):
    """An nbgrader course as an instructor would make one by hand: the solution notebook under
    source/, no nbgrader_config.py (nor any in the user's Jupyter config folder), so nbgrader's
    own ClearSolutions writes the release and nothing sets COURSE_CHECKS=grading."""
    course = tmp_path_factory.mktemp("plain_nbgrader")
    empty_config = tmp_path_factory.mktemp("empty_jupyter_config")
    env = {"JUPYTER_CONFIG_DIR": str(empty_config), "COURSE_CHECKS": "learner"}
    (course / "source" / PLAIN).mkdir(parents=True)
    shutil.copyfile(ROOT / "solutions" / f"{PLAIN}.ipynb", course / "source" / PLAIN / f"{PLAIN}.ipynb")
    nbgrader(course, "generate_assignment", PLAIN, "--force", env_extra=env)
    assert not (course / "nbgrader_config.py").exists()
    for student, folder in (("blank", "release"), ("solved", "source")):
        dest = course / "submitted" / student / PLAIN
        dest.mkdir(parents=True)
        shutil.copyfile(course / folder / PLAIN / f"{PLAIN}.ipynb", dest / f"{PLAIN}.ipynb")
    # (the one setting given: a cell may run 10 minutes, not 30 s, on a loaded 2-core machine)
    nbgrader(course, "autograde", PLAIN, "--force", "--Execute.timeout=600", env_extra=env)
    gb = Gradebook(f"sqlite:///{course / 'gradebook.db'}")
    yield course, {s: gb.find_submission(PLAIN, s) for s in ("blank", "solved")}
    gb.close()


@pytest.mark.timeout(1800)
def test_plain_nbgrader_scores_a_blank_zero_and_a_solved_notebook_full(plain_course):
    course, scores = plain_course
    release = (course / "release" / PLAIN / f"{PLAIN}.ipynb").read_text()
    assert "raise NotImplementedError()" in release and "BEGIN SOLUTION" not in release  # nbgrader's stub
    n_exercises = sum(1 for c in _cells(ROOT / "solutions" / f"{PLAIN}.ipynb")
                      if c["metadata"]["nbgrader"]["grade"])
    blank, solved = scores["blank"], scores["solved"]
    assert blank.max_score == solved.max_score == n_exercises >= 4
    assert blank.score == 0 and all(g.auto_score == 0 for g in blank.notebooks[0].grades)
    assert solved.score == n_exercises and not solved.needs_manual_grade
    # the blank's test cells failed with check()'s own message, not by accident
    graded = _cells(course / "autograded" / "blank" / PLAIN / f"{PLAIN}.ipynb")
    errors = [o for c in graded if c.get("outputs") for o in c["outputs"]
              if o.get("output_type") == "error" and c["metadata"].get("nbgrader", {}).get("grade")]
    assert len(errors) == n_exercises and all("not yet implemented" in e["evalue"] for e in errors)
