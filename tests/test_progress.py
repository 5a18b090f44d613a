"""course_lib.progress(): which exercises a learner has passed, kept in a git-ignored file."""
import json
import subprocess
from pathlib import Path

import pytest

import course_lib
from course_lib import learner_progress
from course_lib.checks import check, load_all
from course_lib.checks.lesson02 import dequantize_codes as lib_dequantize
from course_lib.quant import absmax_quantize as lib_absmax

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A fresh progress file, and learner mode (where passes are recorded)."""
    file = tmp_path / "course" / ".progress.json"
    monkeypatch.setenv("COURSE_PROGRESS_FILE", str(file))
    monkeypatch.setenv("COURSE_CHECKS", "learner")
    return file


def _unsolved(*args, **kwargs):
    raise NotImplementedError


def test_nothing_passed_yet_every_exercise_listed_per_lesson(store):
    p = course_lib.progress()
    assert not store.exists(), "showing progress writes nothing"
    assert p.passed == [] and p.total == len(load_all()) >= 45
    assert "02 absmax and zero points" in p.lessons
    ids = [r.exercise_id for r in p.lessons["02 absmax and zero points"]]
    assert ids[:2] == ["02.absmax_quantize", "02.zero_point"], "notebook order"
    text = repr(p)
    assert f"0 of {p.total} exercises passed" in text and "not yet" in text and "passed 20" not in text


def test_a_passing_check_is_recorded_and_shown(store):
    assert check("02.absmax_quantize", lib_absmax, quiet=True)
    data = json.loads(store.read_text())
    assert set(data["passed"]) == {"02.absmax_quantize"}
    assert data["passed"]["02.absmax_quantize"]["cases"] >= 5
    p = course_lib.progress()
    assert p.passed == ["02.absmax_quantize"]
    rows = {r.exercise_id: r for r in p.lessons["02 absmax and zero points"]}
    assert rows["02.absmax_quantize"].passed_at and rows["02.zero_point"].passed_at is None
    assert f"1 of {p.total} exercises passed" in repr(p)
    html = p._repr_html_()
    assert html.count("<table>") == len(p.lessons) and "✓ passed" in html and "not yet" in html


def test_failed_and_unsolved_checks_are_not_recorded(store):
    assert not check("02.absmax_quantize", lambda x, bits: (x, 1.0), quiet=True)
    assert not check("02.dequantize", _unsolved, quiet=True)
    assert course_lib.progress().passed == []


def test_ci_and_grading_modes_record_nothing(store, monkeypatch):
    for mode in ("exercises", "solutions", "grading"):
        monkeypatch.setenv("COURSE_CHECKS", mode)
        assert check("02.dequantize", lib_dequantize, quiet=True)
    assert not store.exists()


def test_reset_forgets_everything(store):
    check("02.dequantize", lib_dequantize, quiet=True)
    assert course_lib.progress().passed == ["02.dequantize"]
    p = course_lib.progress(reset=True)
    assert p.passed == [] and not store.exists()


def test_an_explicit_path_wins_over_the_environment(store, tmp_path):
    other = tmp_path / "elsewhere.json"
    learner_progress.record_pass("02.dequantize", 3, path=other)
    assert course_lib.progress(path=other).passed == ["02.dequantize"]
    assert course_lib.progress().passed == []


def test_a_damaged_file_says_what_to_do(store):
    store.parent.mkdir(parents=True)
    store.write_text("{not json")
    with pytest.raises(ValueError, match="reset=True"):
        course_lib.progress()
    # a check still passes (the note says the progress was not saved) and reset repairs it
    assert check("02.dequantize", lib_dequantize, quiet=True)
    assert course_lib.progress(reset=True).passed == []


def test_reset_must_be_a_bool(store):
    with pytest.raises(TypeError, match="True or False"):
        course_lib.progress(reset="yes")


def test_the_table_takes_the_titles_it_is_given(store):
    """learner_progress sits below the checks (they record passes in it): it draws the table
    from the {id: title} that course_lib.progress() passes, and refuses anything else."""
    p = learner_progress.progress_table({"02.absmax_quantize": "a title"})
    assert p.total == 1 and p.lessons["02 absmax and zero points"][0].title == "a title"
    with pytest.raises(TypeError, match=r"exercises must be a dict \{exercise id: title\}"):
        learner_progress.progress_table(["02.absmax_quantize"])


def test_the_default_file_is_in_the_course_folder_and_git_ignored(monkeypatch):
    monkeypatch.delenv("COURSE_PROGRESS_FILE", raising=False)
    assert learner_progress.progress_file() == ROOT / ".progress.json"
    ignored = subprocess.run(["git", "check-ignore", "-q", ".progress.json"], cwd=ROOT)
    assert ignored.returncode == 0, ".progress.json must be in .gitignore"


def test_the_test_suite_itself_writes_no_progress_into_the_course_folder():
    # conftest.py points COURSE_PROGRESS_FILE at a throw-away folder for the whole run
    assert Path(learner_progress.progress_file()).parent != ROOT


# ---- bad input: damaged files, wrong arguments (issue 19) -----------------------------------

@pytest.mark.parametrize("text, words", [
    ("", "is not valid JSON"),
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "does not hold a progress record"),
    ('{"passed": ["02.dequantize"]}', "does not hold a progress record"),
    ('{"version": 7, "passed": {}}', "of version 7; this course reads version 1"),
    ('{"passed": {"02.dequantize": "yes"}}', "the entry for '02.dequantize' is damaged"),
    ('{"passed": {"02.dequantize": {"at": 5, "cases": 3}}}', "is damaged"),
    ('{"passed": {"02.dequantize": {"at": "2026-12-01T10:00:00", "cases": 0}}}', "is damaged"),
    ('{"passed": {"02.dequantize": {"at": "2026-12-01T10:00:00", "cases": true}}}', "is damaged"),
])
def test_a_damaged_progress_file_is_named_with_the_way_out(store, text, words):
    store.parent.mkdir(parents=True)
    store.write_text(text)
    with pytest.raises(ValueError, match=words) as err:
        course_lib.progress()
    assert "reset=True" in str(err.value) and str(store) in str(err.value)
    assert course_lib.progress(reset=True).passed == []          # the way out works


def test_a_file_of_other_bytes_is_refused(store):
    store.parent.mkdir(parents=True)
    store.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ValueError, match="is not valid JSON"):
        learner_progress.load()


@pytest.mark.parametrize("path, words", [
    (123, "path must name a progress file"),
    ("", "path must name a progress file"),
    ("   ", "path must name a progress file"),
])
def test_a_path_that_is_not_a_file_path_is_refused(store, path, words):
    with pytest.raises(ValueError, match=words):
        course_lib.progress(path=path)


def test_a_folder_is_not_a_progress_file(store, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"is a folder; give the path of a file inside it"):
        course_lib.progress(path=tmp_path)
    monkeypatch.setenv("COURSE_PROGRESS_FILE", str(tmp_path))
    with pytest.raises(ValueError, match=r"\$COURSE_PROGRESS_FILE .* is a folder"):
        learner_progress.forget_all()


@pytest.mark.parametrize("exercise_id, cases, words", [
    ("absmax", 3, "exercise_id must be a lesson number and a name"),
    ("02.", 3, "exercise_id must be a lesson number and a name"),
    (2, 3, "exercise_id must be a lesson number and a name"),
    ("02.dequantize", 0, "cases must be the number of cases passed"),
    ("02.dequantize", 2.5, "cases must be the number of cases passed"),
    ("02.dequantize", True, "cases must be the number of cases passed"),
])
def test_record_pass_refuses_what_is_not_an_exercise_pass(store, exercise_id, cases, words):
    with pytest.raises(ValueError, match=words):
        learner_progress.record_pass(exercise_id, cases)
    assert not store.exists()


def test_a_pass_of_an_exercise_the_course_no_longer_has_is_kept_but_not_shown(store):
    learner_progress.record_pass("99.retired_exercise", 4)
    p = course_lib.progress()
    assert p.passed == [] and "99.retired_exercise" in learner_progress.load()
