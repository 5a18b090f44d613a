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
