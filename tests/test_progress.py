"""course_lib.progress(): which exercises a learner has passed, kept in a git-ignored file."""
import json
import os
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


def test_the_default_file_is_the_users_own_one_per_course(monkeypatch, tmp_path):
    """A shared install (JupyterHub: one checkout, many users) keeps one file per user: under
    the user's $XDG_DATA_HOME (~/.local/share), named after the course folder's path."""
    monkeypatch.delenv("COURSE_PROGRESS_FILE", raising=False)
    course = tmp_path / "main"             # a course folder without an old .progress.json
    monkeypatch.setattr(learner_progress, "ROOT", course)
    files = {}
    for user in ("alice", "bob"):
        monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / user / "data"))
        files[user] = learner_progress.progress_file()
        assert files[user].parent == tmp_path / user / "data" / "quant-course"
        assert files[user].name.startswith("progress-main-") and files[user].suffix == ".json"
        learner_progress.record_pass("02.dequantize", 3)
    assert files["alice"].name == files["bob"].name and files["alice"] != files["bob"]
    assert all(learner_progress.load(f).keys() == {"02.dequantize"} for f in files.values())
    assert not (course / ".progress.json").exists()
    # another copy of the course gets another file; no $XDG_DATA_HOME (or a relative one, which
    # the XDG spec says to ignore) means ~/.local/share
    assert learner_progress.default_file(tmp_path / "copy" / "main").name != files["alice"].name
    monkeypatch.setenv("HOME", str(tmp_path / "carol"))
    for xdg in ("", "relative/path"):
        monkeypatch.setenv("XDG_DATA_HOME", xdg)
        assert learner_progress.progress_file().parent == \
            tmp_path / "carol" / ".local" / "share" / "quant-course"
    # the record names its user and its course (for the instructor's room table)
    data = json.loads(files["bob"].read_text())
    assert data["course"] == str(course) and isinstance(data["user"], str)


def test_a_progress_file_of_an_earlier_version_in_the_course_folder_still_counts(
        monkeypatch, tmp_path):
    monkeypatch.delenv("COURSE_PROGRESS_FILE", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setattr(learner_progress, "ROOT", tmp_path / "course")
    old = tmp_path / "course" / ".progress.json"
    learner_progress.record_pass("02.dequantize", 3, path=old)
    assert learner_progress.load() == learner_progress.load(old)       # read where it was
    learner_progress.record_pass("02.zero_point", 5)                  # new passes: the user's file
    assert set(learner_progress.load(learner_progress.progress_file())) == {
        "02.dequantize", "02.zero_point"}
    learner_progress.forget_all()
    assert not old.exists() and learner_progress.load() == {}
    # and an explicit file or $COURSE_PROGRESS_FILE never reads it
    learner_progress.record_pass("02.dequantize", 3, path=old)
    monkeypatch.setenv("COURSE_PROGRESS_FILE", str(tmp_path / "mine.json"))
    assert learner_progress.load() == {}


def test_the_old_file_name_stays_git_ignored():
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


# ---- the solutions notebook is the course's, not the learner's ------------------------------

def test_a_check_in_the_solutions_notebook_is_not_recorded(store, monkeypatch, capsys):
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.chdir(ROOT / "solutions")                 # Jupyter starts a kernel in its folder
    assert check("02.dequantize", lib_dequantize)
    assert "not counted in your progress: this is the solutions notebook" in capsys.readouterr().out
    assert not store.exists()
    monkeypatch.chdir(ROOT / "exercises")
    assert check("02.dequantize", lib_dequantize, quiet=True)
    assert course_lib.progress().passed == ["02.dequantize"]


def test_jupyter_names_the_notebook_and_its_name_decides(store, monkeypatch):
    """jupyter_server gives the kernel the notebook's path ($JPY_SESSION_NAME): it wins over a
    working folder the notebook may have changed."""
    monkeypatch.chdir(ROOT / "exercises")
    monkeypatch.setenv("JPY_SESSION_NAME", str(ROOT / "solutions" / "02_absmax_and_zero_points.ipynb"))
    assert learner_progress.solutions_notebook()
    monkeypatch.chdir(ROOT / "solutions")
    monkeypatch.setenv("JPY_SESSION_NAME", str(ROOT / "exercises" / "02_absmax_and_zero_points.ipynb"))
    assert not learner_progress.solutions_notebook()
    monkeypatch.setenv("JPY_SESSION_NAME", "02_absmax_and_zero_points.ipynb")   # relative: cwd decides
    assert learner_progress.solutions_notebook()


@pytest.mark.timeout(600)
def test_running_the_solutions_notebook_in_learner_mode_records_nothing(tmp_path):
    """The real thing: solutions/02 run top to bottom by a Jupyter kernel in learner mode (as a
    learner opening it would), every check passing, and no pass lands in the progress file."""
    import nbformat
    from nbclient import NotebookClient

    file = tmp_path / "progress.json"
    env = dict(os.environ, COURSE_CHECKS="learner", COURSE_PROGRESS_FILE=str(file),
               OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    env.pop("JPY_SESSION_NAME", None)
    path = ROOT / "solutions" / "02_absmax_and_zero_points.ipynb"
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute(env=env)
    out = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert out.count("cases passed") >= 4 and "not counted in your progress" in out
    assert not file.exists()


# ---- the room: an instructor's table of every learner's file ---------------------------------

def _write(file, passed, user=None):
    file.parent.mkdir(parents=True, exist_ok=True)
    record = {"version": 1, "passed": {i: {"at": f"2026-12-0{d}T10:00:00", "cases": 3}
                                       for i, d in passed.items()}}
    if user is not None:
        record["user"] = user
    file.write_text(json.dumps(record))
    return file


def test_exercise_ids_are_read_from_the_exercise_notebooks_in_order():
    lessons = learner_progress.exercise_ids()
    numbers = {lesson[:2] for lesson in lessons}          # (a lesson being written may have its
    registered = {i for i in load_all() if i[:2] in numbers}   # checks before its notebook)
    assert {i for ids in lessons.values() for i in ids} == registered
    assert lessons["02 absmax and zero points"][:2] == ["02.absmax_quantize", "02.zero_point"]


def test_the_room_has_one_row_per_learner(tmp_path):
    home = tmp_path / "home"
    sub = ".local/share/quant-course/progress-main-0123456789.json"
    _write(home / "alice" / sub, {"02.absmax_quantize": 1, "02.zero_point": 2,
                                  "02.dequantize": 2, "02.error_metrics": 3, "00.weight_gb": 1})
    _write(home / "bob" / sub, {"00.weight_gb": 4})
    _write(home / "carol" / sub, {})
    (home / "dave" / ".local/share/quant-course").mkdir(parents=True)
    (home / "dave" / sub).write_text("{broken")
    r = learner_progress.room([home])
    assert [x.name for x in r.learners] == ["alice", "bob", "carol"]      # from their homes
    alice = r.learners[0]
    assert r.done(alice, "02 absmax and zero points") == 4 and alice.last == "2026-12-03T10:00:00"
    assert r.total == sum(len(ids) for ids in learner_progress.exercise_ids().values()) >= 60
    text = repr(r)
    assert "The room: 3 learner(s)" in text and f"5/{r.total}" in text
    assert "every exercise of a lesson: 00: 0, 01: 0, 02: 1, 03: 0" in text   # alice: all of 02
    assert "skipped" in text and "dave" in text and "not valid JSON" in text
    rows = r.csv().splitlines()
    assert rows[0].startswith("learner,file,passed,last_pass,00.weight_gb")
    assert rows[1].startswith("alice,") and rows[1].split(",")[2] == "5"
    assert len(rows[1].split(",")) == 4 + r.total


def test_the_room_names_learners_by_their_record_then_their_file(tmp_path):
    a = _write(tmp_path / "x" / "progress.json", {"00.weight_gb": 1}, user="ana")
    b = _write(tmp_path / "y" / "progress.json", {}, user="ben")
    assert [x.name for x in learner_progress.room([a, b]).learners] == ["ana", "ben"]
    c = _write(tmp_path / "collected" / "chris.json", {}, user="jovyan")   # same user in Docker
    d = _write(tmp_path / "collected" / "dana.json", {}, user="jovyan")
    assert [x.name for x in learner_progress.room([tmp_path / "collected"]).learners] == [
        "chris", "dana"]
    assert [x.name for x in learner_progress.room([c, d, c]).learners] == ["chris", "dana"]


def test_the_room_command_line(tmp_path, capsys):
    _write(tmp_path / "room" / "alice.json", {"00.weight_gb": 1})
    assert learner_progress.main(["room", str(tmp_path / "room")]) == 0
    assert "alice" in capsys.readouterr().out
    assert learner_progress.main(["room", "--csv", str(tmp_path / "room" / "alice.json")]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("alice,")
    for bad, words in (([str(tmp_path / "nowhere")], "does not exist"),
                       ([str(tmp_path)], "no progress file among the paths given")):
        (tmp_path / "room" / "alice.json").unlink(missing_ok=bad[0] != str(tmp_path / "nowhere"))
        with pytest.raises(SystemExit) as exit_:
            learner_progress.main(["room", *bad])
        assert exit_.value.code == 2 and words in capsys.readouterr().err
    assert learner_progress.main(["where"]) == 0
    assert capsys.readouterr().out.strip() == str(learner_progress.progress_file())


def test_a_release_without_solutions_still_names_the_lessons(tmp_path):
    (tmp_path / "exercises").mkdir()
    (tmp_path / "exercises" / "02_absmax_and_zero_points.ipynb").write_text(
        (ROOT / "exercises" / "02_absmax_and_zero_points.ipynb").read_text())
    assert learner_progress.lesson_names(tmp_path) == {"02": "02 absmax and zero points"}
    assert learner_progress.exercise_ids(tmp_path)["02 absmax and zero points"][0] == \
        "02.absmax_quantize"
