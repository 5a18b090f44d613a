"""Each lesson states a reading time by one rule (``course_lib.authoring.reading_time``): its
prose, its own code and the library or kernel source it prints for study, each at a stated
rate, with its exercises' time given apart; then the time its notebook takes to run."""
import json
import re
from pathlib import Path

import pytest

from course_lib.authoring import reading_time as rt

ROOT = Path(__file__).resolve().parent.parent
# the run time follows: "the notebook runs in under 15 seconds" / "in about 10 seconds" /
# "in under a minute" (measured with a full nbval run; the notebooks must stay under 45 s in CI)
RUN_TIME = re.compile(r"runs\s+in\s+(about|under)\s+(?:(\d+)\s+seconds|a\s+minute(\s+and\s+a\s+half)?)")
STATED = re.compile(r"about (\d+) minutes to read \(([\d,]+) words, ([\d,]+) lines of its code "
                    r"and ([\d,]+) lines of printed source, at 200 words, 20 and 5 lines a "
                    r"minute\); (?:its (\d+) exercises?, about (\d+) minutes more|no exercises)")
LESSONS = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
SOLVED = sorted(p.stem for p in (ROOT / "solutions").glob("*.ipynb"))
EXERCISE_STATED = re.compile(
    r"about (\d+) minutes: (\d+) to read \(([\d,]+) words, ([\d,]+) lines of code and ([\d,]+) "
    r"lines of printed source, at 200 words, 20 and 5 lines a minute\) and (\d+) for its (\d+) "
    r"exercises? \(5 minutes each and 2 a line of their ([\d,]+) lines of reference solution\)")


def _num(s):
    return int(s.replace(",", ""))


def test_the_rule_counts_prose_code_and_printed_source(tmp_path):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "solutions").mkdir()
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "__init__.py").write_text("")
    (tmp_path / "lib" / "m.py").write_text("import os\n\n\n@dec\ndef f(x):\n    return x\n\n\n"
                                           "class C:\n    def g(self):\n        pass\n")
    cells = [{"cell_type": "markdown", "source": ["two words\n", "and three"]},
             {"cell_type": "code", "source": ["import inspect\nfrom lib import m\n\n"
                                              "print(inspect.getsource(m.f))\n"
                                              "print(inspect.getsource(m.C.g))\n"
                                              "print(inspect.getsource(m))  # the whole file"]},
             {"cell_type": "code", "source": ["x = unknown.source(y)"]}]
    (tmp_path / "notebooks" / "99_x.ipynb").write_text(json.dumps({"cells": cells}))
    sol = [{"cell_type": "code", "source": ["def f():\n    ### BEGIN SOLUTION\n    # HINT: h\n"
                                             "    a = 1\n    return a\n    ### END SOLUTION\n"]},
           {"cell_type": "code", "source": ['ok = check("99.f", f)']}]
    (tmp_path / "solutions" / "99_x.ipynb").write_text(json.dumps({"cells": sol}))
    t = rt.lesson_time("99_x", tmp_path)
    assert (t.words, t.code_lines) == (4, 6)
    assert t.source_lines == 3 + 2 + 11 and t.unresolved == ["y"]
    assert (t.exercises, t.solution_lines) == (1, 2)
    assert t.exercise_minutes == rt.EXERCISE_BASE_MINUTES + 2 * rt.EXERCISE_MINUTES_PER_LINE
    assert t.reading_minutes == max(1, round(4 / 200 + 6 / 20 + 16 / 5))


@pytest.mark.parametrize("stem", LESSONS)
def test_every_printed_source_is_found(stem):
    t = rt.lesson_time(stem)
    assert not t.unresolved, f"{stem}: the rule cannot find the printed source of {t.unresolved}"


@pytest.mark.parametrize("stem", LESSONS)
def test_the_stated_time_follows_the_rule(stem):
    path = ROOT / "notebooks" / f"{stem}.ipynb"
    text = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                     if c["cell_type"] == "markdown")
    flat = " ".join(text.split())
    m = STATED.search(flat)
    assert m, (f"{path.name} must state its time by the rule; run python -m "
               f"course_lib.authoring.reading_time")
    t = rt.lesson_time(stem)
    minutes, words, code, src = (_num(m.group(i)) for i in (1, 2, 3, 4))
    # others edit lessons between rewrites: small drifts pass, a stale header does not
    assert abs(words - t.words) <= 0.05 * t.words + 50, f"{stem}: {words} words stated, {t.words}"
    assert abs(code - t.code_lines) <= 0.1 * t.code_lines + 10, \
        f"{stem}: {code} code lines stated, {t.code_lines} counted"
    assert abs(src - t.source_lines) <= 0.1 * t.source_lines + 10, \
        f"{stem}: {src} printed source lines stated, {t.source_lines} counted"
    assert abs(minutes - t.reading_minutes) <= 2, \
        f"{stem}: {minutes} minutes stated, the rule gives {t.reading_minutes}"
    if t.exercises:
        assert m.group(5) and _num(m.group(5)) == t.exercises, f"{stem}: exercise count"
        assert abs(_num(m.group(6)) - t.exercise_minutes) <= 0.1 * t.exercise_minutes + 5
    run = RUN_TIME.search(flat[m.end():m.end() + 400])
    assert run, f"{path.name} must say, after its reading time, how long the notebook runs"
    assert run.group(2) is None or int(run.group(2)) <= 60, \
        f"{path.name} states a run time over a minute; CI allows 45 s per notebook"


def test_the_command_leaves_the_headers_as_they_are():
    assert rt.stale_headers() == [], "run python -m course_lib.authoring.reading_time"


@pytest.mark.parametrize("stem", LESSONS)
def test_the_stated_run_time_is_the_measured_one(stem):
    """A header's run time is a measurement: results/notebook_times.json (a timed nbval run of
    a fresh clone, `make notebook-times`) must bear it out, 'under N' below N seconds of wall
    time, 'about N' within a factor 1.5 either way."""
    cells = json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text())["cells"]
    flat = " ".join("".join(cells[0]["source"]).split())
    m = RUN_TIME.search(flat)
    assert m, f"{stem}: no run time in its header"
    seconds = int(m.group(2)) if m.group(2) else 90 if m.group(3) else 60
    times = json.loads((ROOT / "results" / "notebook_times.json").read_text())["notebooks"]
    rec = times.get(f"notebooks/{stem}.ipynb")
    assert rec is not None, (f"{stem}: its run time is stated but was never measured: run "
                             "`make notebook-times` on an idle machine")
    wall = rec["wall_s"]
    if m.group(1) == "under":
        assert wall <= seconds, f"{stem}: says under {seconds} s, measured {wall:.0f} s"
    else:
        assert seconds / 1.5 <= wall <= 1.5 * seconds, \
            f"{stem}: says about {seconds} s, measured {wall:.0f} s"


# ---- exercise notebooks ----------------------------------------------------------------------

def _toy_solution(tmp_path):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "solutions").mkdir()
    sol = {"cells": [
        {"cell_type": "markdown", "metadata": {}, "source": ["# 99 · Toy: exercises\n", "\n",
                                                               "Two exercises."]},
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
         "source": ["def f():\n    ### BEGIN SOLUTION\n    # HINT: h\n    a = 1\n    b = 2\n"
                    "    return a + b\n    ### END SOLUTION\n"]},
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
         "source": ['ok = check("99.f", f)\n', 'ok2 = check("99.g", f)']}],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "solutions" / "99_x.ipynb"
    path.write_text(json.dumps(sol))
    return path


def test_an_exercise_notebook_is_timed_as_the_learner_opens_it(tmp_path):
    """Reading counts the stubbed notebook (the hint, the stub and the raise, not the reference
    solution's lines); doing counts the exercises and their reference lines."""
    _toy_solution(tmp_path)
    t = rt.exercise_time("99_x", tmp_path)
    # 7 words ("#" counts, as in a lesson); def f():, # HINT: h, # YOUR CODE HERE, raise ...,
    # and the two check lines
    assert (t.words, t.code_lines, t.source_lines) == (7, 6, 0)
    assert (t.exercises, t.solution_lines) == (2, 3)
    assert t.exercise_minutes == 2 * rt.EXERCISE_BASE_MINUTES + 3 * rt.EXERCISE_MINUTES_PER_LINE
    header = t.exercise_header()
    m = EXERCISE_STATED.search(header)
    assert m and int(m.group(1)) == t.reading_minutes + t.exercise_minutes
    with pytest.raises(FileNotFoundError, match="no solution notebook"):
        rt.exercise_time("98_missing", tmp_path)


def test_the_exercise_header_is_added_then_restated_in_place(tmp_path):
    path = _toy_solution(tmp_path)
    text = rt.rewrite_exercise_header(path, tmp_path)
    assert text is not None
    title = "".join(json.loads(text)["cells"][0]["source"])
    assert title.startswith("# 99 · Toy: exercises\n\nTwo exercises.\n\n*Time: about ")
    m = EXERCISE_STATED.search(" ".join(title.split()))
    assert m, title
    assert int(m.group(3)) == len(title.split())           # its own words counted
    path.write_text(text)
    assert rt.rewrite_exercise_header(path, tmp_path) is None, "a second run changes nothing"
    stale = title.replace(f"about {m.group(1)} minutes", "about 1 minutes")
    nb = json.loads(text)
    nb["cells"][0]["source"] = stale.splitlines(keepends=True)
    path.write_text(json.dumps(nb))
    assert "".join(json.loads(rt.rewrite_exercise_header(path, tmp_path))["cells"][0]["source"]) \
        == title, "a stale figure is restated where it stands, not added twice"


@pytest.mark.parametrize("stem", SOLVED)
def test_each_exercise_notebook_states_its_time(stem):
    """The header a learner reads in exercises/ (generated from solutions/) follows the rule."""
    for folder in ("solutions", "exercises"):
        cells = json.loads((ROOT / folder / f"{stem}.ipynb").read_text())["cells"]
        flat = " ".join("".join(cells[0]["source"]).split())
        m = EXERCISE_STATED.search(flat)
        assert m, (f"{folder}/{stem}.ipynb must state its exercise notebook's time in its title "
                   f"cell; run python -m course_lib.authoring.reading_time, then "
                   f"python -m course_lib.authoring.exercises")
        t = rt.exercise_time(stem)
        total, read, words, code = (_num(m.group(i)) for i in (1, 2, 3, 4))
        assert abs(words - t.words) <= 0.05 * t.words + 50, f"{stem}: {words} words, {t.words}"
        assert abs(code - t.code_lines) <= 0.1 * t.code_lines + 10, f"{stem}: code lines"
        assert abs(read - t.reading_minutes) <= 2, f"{stem}: reading minutes"
        assert _num(m.group(7)) == t.exercises, f"{stem}: exercise count"
        assert abs(_num(m.group(6)) - t.exercise_minutes) <= 0.1 * t.exercise_minutes + 5
        assert total == read + _num(m.group(6)), f"{stem}: the total is reading + exercises"


def test_the_command_leaves_the_exercise_headers_as_they_are():
    assert rt.stale_exercise_headers() == [], ("run python -m course_lib.authoring.reading_time, "
                                               "then python -m course_lib.authoring.exercises")
