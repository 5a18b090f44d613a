"""course_lib.authoring.grading refuses bad input with a clear message (issue 19); the nbgrader round
trip itself is tests/test_nbgrader.py."""
import pytest

from course_lib.authoring.grading import lessons, main, setup_course


def test_only_picks_lessons_by_number_or_name(tmp_path):
    assert setup_course(tmp_path / "c", only=["02", "04_a_real_model"]) == [
        "02_absmax_and_zero_points", "04_a_real_model"]
    assert (tmp_path / "c" / "source" / "02_absmax_and_zero_points").is_dir()
    assert "c.Execute.timeout = 600" in (tmp_path / "c" / "nbgrader_config.py").read_text()


@pytest.mark.parametrize("kwargs, words", [
    ({"only": ["99"]}, r"no lesson \['99'\]; lessons: 00_the_bill"),
    ({"only": "02"}, r"only must be a list of lesson numbers or names, e.g. \['02'\]"),
    ({"only": [2]}, "only must be a list of lesson numbers or names"),
    ({"only": []}, "only is empty"),
    ({"timeout": 0}, "timeout is the seconds nbgrader gives each cell, a whole number >= 1"),
    ({"timeout": 2.5}, "timeout is the seconds"),
    ({"timeout": True}, "timeout is the seconds"),
])
def test_bad_arguments_are_refused_before_anything_is_written(tmp_path, kwargs, words):
    course = tmp_path / "course"
    with pytest.raises(ValueError, match=words):
        setup_course(course, **kwargs)
    assert not course.exists()


def test_a_file_where_the_course_folder_should_be(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("x")
    with pytest.raises(ValueError, match="course_dir '.*notes.txt' is a file; give a folder"):
        setup_course(f)
    for bad in ("", None, 5):
        with pytest.raises(ValueError, match="course_dir must be a folder path"):
            setup_course(bad)


def test_a_root_without_solutions_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no solution notebooks in .*solutions: root must be"):
        lessons(tmp_path)
    with pytest.raises(ValueError, match="no solution notebooks"):
        setup_course(tmp_path / "c", root=tmp_path)


def test_the_command_line_says_what_is_wrong(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / "c"), "99"])
    assert exit_.value.code == 2 and "no lesson ['99']" in capsys.readouterr().err
    assert main([str(tmp_path / "c"), "01"]) == 0
    assert "1 assignment(s): 01_number_formats" in capsys.readouterr().out


# ---- check() under nbgrader: strict whatever the config ---------------------------------------

def test_under_nbgrader_an_unsolved_exercise_fails_whatever_course_checks_says(monkeypatch):
    """nbgrader sets NBGRADER_EXECUTION while it autogrades or validates (its FAQ): check()
    then raises on an unsolved or wrong answer even in the learner's mode, so a plain nbgrader
    course (no COURSE_CHECKS=grading in its config) cannot give a blank full marks."""
    import numpy as np

    from course_lib.checks import check
    from course_lib.quant import absmax_quantize

    def unsolved(x, bits):
        raise NotImplementedError()

    monkeypatch.setenv("COURSE_CHECKS", "learner")
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    assert check("02.absmax_quantize", unsolved, quiet=True).status == "not implemented"
    for how in ("autograde", "validate"):
        monkeypatch.setenv("NBGRADER_EXECUTION", how)
        for mode in ("learner", "exercises", "solutions", "grading"):
            monkeypatch.setenv("COURSE_CHECKS", mode)
            with pytest.raises(AssertionError, match="not yet implemented"):
                check("02.absmax_quantize", unsolved, quiet=True)
            with pytest.raises(AssertionError, match="FAILED"):
                check("02.absmax_quantize", lambda x, bits: (np.zeros(x.shape, np.int8), 1.0),
                      quiet=True)
            assert check("02.absmax_quantize", absmax_quantize, quiet=True)


def test_under_nbgrader_a_kernel_exercise_that_cannot_run_fails_saying_why(monkeypatch):
    """Where Triton is missing a kernel exercise is skipped for a learner; a grader must not
    count that as a pass."""
    import sys
    import types

    from course_lib import checks

    class TritonMissing(RuntimeError):
        pass

    def kernel(x):
        raise TritonMissing("w8a16_gemv cannot launch: Triton is not installed (macOS)")

    monkeypatch.setitem(sys.modules, "kernels._triton", types.SimpleNamespace(TritonMissing=TritonMissing))
    monkeypatch.setitem(checks.EXERCISES, "toy.kernel", checks.Exercise(
        id="toy.kernel", title="a kernel", reference=lambda x: x,
        cases=lambda: [checks.Case((1.0,))], hint="launch it"))
    monkeypatch.setenv("COURSE_CHECKS", "learner")
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    assert checks.check("toy.kernel", kernel, quiet=True).status == "skipped"
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    with pytest.raises(AssertionError, match="cannot be graded on this machine"):
        checks.check("toy.kernel", kernel, quiet=True)


# ---- the learners' copy: no solutions --------------------------------------------------------

def test_release_writes_the_course_without_solutions(tmp_path, capsys):
    import json

    from course_lib.authoring.grading import ROOT, course_files, release

    dest = tmp_path / "learners"
    record = release(dest)
    names = {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()}
    assert not any(n.startswith(("solutions/", "tests/", ".ci/")) for n in names)
    for needed in ("Makefile", "course_lib/checks/__init__.py", "exercises/02_absmax_and_zero_points.ipynb",
                   "notebooks/00_the_bill.ipynb", "requirements.txt", "pyproject.toml"):
        assert needed in names, needed
    assert not any(n.startswith((".venv/", "models/", ".git/")) or n.endswith(".progress.json")
                   for n in names)
    notebooks = [p for p in dest.rglob("*.ipynb")]
    assert len(notebooks) >= 34 and not any("BEGIN SOLUTION" in p.read_text() for p in notebooks)
    assert record["files"] == len(names) - 1 and record["left_out_files"] >= 17 + 10
    assert json.loads((dest / ".course-release").read_text())["left_out"] == [
        "solutions/", "tests/", ".ci/"]
    assert (dest / "Makefile").read_bytes() == (ROOT / "Makefile").read_bytes()
    assert len(names) - 1 + record["left_out_files"] == len(course_files())
    # the learner's progress table still knows every lesson (it reads exercises/)
    from course_lib import learner_progress
    assert learner_progress.lesson_names(dest) == learner_progress.lesson_names()


def test_release_refuses_what_would_lose_files(tmp_path, capsys):
    from course_lib.authoring.grading import ROOT, release

    with pytest.raises(ValueError, match="outside the course folder"):
        release(ROOT / "rendered" / "release")
    with pytest.raises(ValueError, match="outside the course folder"):
        release(ROOT.parent)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty and holds no earlier release"):
        release(busy)
    with pytest.raises(ValueError, match="no solution notebooks"):
        release(tmp_path / "x", root=tmp_path)
    # an earlier release is replaced only with --force, through the command line
    assert main(["release", str(tmp_path / "r")]) == 0
    assert "left out: solutions/, tests/, .ci/" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["release", str(tmp_path / "r")])
    assert exit_.value.code == 2 and "pass --force" in capsys.readouterr().err
    (tmp_path / "r" / "stale.txt").write_text("old")
    assert main(["release", str(tmp_path / "r"), "--force"]) == 0
    assert not (tmp_path / "r" / "stale.txt").exists()
