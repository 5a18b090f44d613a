"""The workshop kit's tables are read from measurements: the notebook timer writes what a test
run took, course_lib.authoring.workshop turns it into results/notebook_times.json and the tables of
docs/instructors.md and README.md, which must match what the records say now."""
import json
import subprocess
import sys

import pytest

from course_lib.authoring import workshop


def test_generated_tables_match_the_records():
    stale = workshop.stale_documents()
    assert not stale, (f"{stale}: run `make exercises` (or `python -m course_lib.authoring.workshop doc`); "
                       "after a notebook changed its run time, `make notebook-times`")


def test_timing_record_names_notebooks_that_exist():
    record = workshop.load_times()
    assert record is not None, "results/notebook_times.json is missing: run `make notebook-times`"
    for name, rec in record["notebooks"].items():
        assert (workshop.ROOT / name).exists(), f"{name} is timed but does not exist"
        assert rec["kernel_cpu_s"] > 0 and rec["wall_s"] >= rec["kernel_cpu_s"] * 0.5 and rec["cells"] > 0
    lessons = [n for n in record["notebooks"] if n.startswith("notebooks/")]
    assert len(lessons) >= 12


def _line(nb, wall, cpu, failed=0):
    return json.dumps({"notebook": nb, "wall_s": wall, "kernel_cpu_s": cpu, "cells": 3,
                       "failed": failed, "load_average": [1.5, 1.0, 1.0], "omp_num_threads": "1"})


def test_times_from_log_keeps_the_last_run_of_each_notebook(tmp_path):
    log = tmp_path / "t.jsonl"
    log.write_text("\n".join([_line("notebooks/a.ipynb", 9.0, 4.0), _line("notebooks/b.ipynb", 3.0, 1.0),
                              _line("notebooks/a.ipynb", 7.0, 3.5)]) + "\n")
    rec = workshop.times_from_log(log, note="a note")
    assert rec["notebooks"] == {"notebooks/a.ipynb": {"wall_s": 7.0, "kernel_cpu_s": 3.5, "cells": 3},
                                "notebooks/b.ipynb": {"wall_s": 3.0, "kernel_cpu_s": 1.0, "cells": 3}}
    assert rec["load_average_1min"] == {"min": 1.5, "max": 1.5} and rec["note"] == "a note"
    assert rec["omp_num_threads"] == "1"


@pytest.mark.parametrize("lines, words", [
    ([], "holds no notebook timings"),
    ([_line("notebooks/a.ipynb", 9.0, 4.0, failed=2)], "failing cells"),
])
def test_times_from_log_refuses_empty_or_failing_runs(tmp_path, lines, words):
    log = tmp_path / "t.jsonl"
    log.write_text("\n".join(lines))
    with pytest.raises(ValueError, match=words):
        workshop.times_from_log(log)


def test_fill_replaces_only_the_generated_block_and_refuses_a_missing_one():
    text = "intro\n<!-- BEGIN GENERATED: t -->\nold\n<!-- END GENERATED: t -->\noutro\n"
    assert workshop.fill(text, {"t": "new | table"}) == \
        "intro\n<!-- BEGIN GENERATED: t -->\nnew | table\n<!-- END GENERATED: t -->\noutro\n"
    with pytest.raises(ValueError, match="no '<!-- BEGIN GENERATED: x -->'"):
        workshop.fill(text, {"x": "table"}, "doc.md")


def test_exercise_difficulty_follows_the_solution_size():
    ex = {e["id"]: e for e in workshop.exercises("02_absmax_and_zero_points")}
    # the reference solution of 02.dequantize is two code lines; GPTQ's loop is the longest
    assert ex["02.dequantize"]["solution_lines"] == 2 and ex["02.dequantize"]["difficulty"].startswith("★ ")
    gptq = {e["id"]: e for e in workshop.exercises("06_gptq")}
    assert gptq["06.gptq_loop"]["difficulty"].startswith("★★★")
    assert [e["id"] for e in workshop.exercises("00_the_bill")] == [
        "00.weight_gb", "00.kv_bytes_per_token", "00.decode_floor_ms", "00.conversations_that_fit"]


def test_timer_plugin_times_a_notebook_in_a_test_run(tmp_path):
    """A two-cell notebook that burns about 0.6 s of CPU: the plugin's line says so."""
    import nbformat
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import time\nt = time.process_time()"),
        nbformat.v4.new_code_cell("while time.process_time() - t < 0.6:\n    pass")])
    path = tmp_path / "burn.ipynb"
    nbformat.write(nb, path)
    log = tmp_path / "times.jsonl"
    env = {**__import__("os").environ, "NOTEBOOK_TIMES_LOG": str(log)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "course_lib.authoring.notebook_timer",
                          "--nbval-lax", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    [line] = [json.loads(l) for l in log.read_text().splitlines()]
    assert line["notebook"].endswith("burn.ipynb") and line["cells"] == 2 and line["failed"] == 0
    assert 0.6 <= line["kernel_cpu_s"] < 30 and line["wall_s"] >= 0.6


def test_readme_opens_with_the_two_commands_and_targets_that_exist():
    readme = (workshop.ROOT / "README.md").read_text()
    block = readme.split("```", 2)[1].splitlines()[1:3]       # the first fenced block
    assert [l.split()[:2] for l in block] == [["make", "lab"], ["make", "test"]]
    assert readme.index("```") < readme.index("\n## ")        # before any section
    make = (workshop.ROOT / "Makefile").read_text()
    for target in ("lab", "test", "book", "notebook-times"):
        assert f"\n{target}:" in make, f"README names make {target}; the Makefile has no such target"
    for image in __import__("re").findall(r"\]\((docs/img/[^)]+)\)", readme):
        assert (workshop.ROOT / image).exists(), image


def test_citation_file_names_the_course_and_its_version():
    import tomllib
    import yaml
    cff = yaml.safe_load((workshop.ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software"
    assert cff["title"].startswith("Quantization, Hands On") and cff["authors"]
    version = tomllib.loads((workshop.ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert str(cff["version"]) == version


def test_fill_fills_an_empty_block():
    text = "<!-- BEGIN GENERATED: t -->\n<!-- END GENERATED: t -->\n"
    assert workshop.fill(text, {"t": "a\nb"}) == "<!-- BEGIN GENERATED: t -->\na\nb\n<!-- END GENERATED: t -->\n"


def test_agendas_follow_the_reading_time_rule():
    from course_lib.authoring import reading_time as rt
    for name in workshop.AGENDAS:
        blocks = workshop.agenda_blocks(name)
        assert blocks[-1]["start"] <= 8 * 60, f"{name} runs past 8 hours"
        for b, nxt in zip(blocks, blocks[1:]):
            assert nxt["start"] == b["start"] + b["minutes"]
            if b["walkthrough"] is not None:
                assert b["walkthrough"] + b["work"] <= b["minutes"] < b["walkthrough"] + b["work"] + 5
                assert b["minutes"] % 5 == 0
    # one block by hand: lesson 00 with two exercises
    stem = "00_the_bill"
    lines = {e["id"]: e["solution_lines"] for e in workshop.exercises(stem)}
    walk = -(-rt.lesson_time(stem).reading_minutes // 3)
    work = sum(5 + 2 * lines[x] for x in ("00.weight_gb", "00.decode_floor_ms"))
    block = next(b for b in workshop.agenda_blocks("half_day") if b["what"].startswith("00 "))
    assert (block["walkthrough"], block["work"]) == (walk, work)
    assert block["minutes"] == -(-(walk + work) // 5) * 5


def test_the_two_days_cover_every_lesson_once():
    days = [b for name in ("day_1", "day_2") for kind, b, _ in workshop.AGENDAS[name] if kind == "lesson"]
    written = [s for s in workshop.lesson_stems() if (workshop.ROOT / "notebooks" / f"{s}.ipynb").exists()]
    assert sorted(days) == sorted(written)


def test_an_agenda_naming_an_unknown_exercise_is_refused(monkeypatch):
    monkeypatch.setitem(workshop.AGENDAS, "bad", [("lesson", "00_the_bill", ["00.weight_kg"])])
    with pytest.raises(ValueError, match=r"\['00.weight_kg'\] are not exercises of 00_the_bill"):
        workshop.agenda_blocks("bad")
