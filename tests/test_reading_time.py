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
