"""Text in the course's own words (issue 19): no run of 12+ words from the source texts.

``tools/seed_overlap.py`` lists every run of ``MIN_WORDS`` or more consecutive words that a
notebook (notebooks/, solutions/, exercises/) or a ``course_lib`` module shares with the seed
texts in ``../shared/reference/seeds/``. Quotations marked as such (a markdown blockquote, a
Python line with ``# quotation:``) and runs that are mostly numbers are allowed.
"""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("seed_overlap", ROOT / "tools" / "seed_overlap.py")
seed_overlap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(seed_overlap)

SOURCE = ("The quick brown fox jumps over the lazy dog while the farmer sleeps soundly "
          "under an old oak tree near the river bank. Weights of 0.12 0.45 0.88 1.03 2.5 "
          "3.75 4.0 5.5 6.25 7.0 8.125 9.5 10.0 and more.")


@pytest.fixture
def grams(tmp_path):
    (tmp_path / "seed.txt").write_text(SOURCE)
    return seed_overlap.seed_ngrams(tmp_path)


def _words(n, start=0):
    return " ".join(seed_overlap.words(SOURCE)[start:start + n])


# ---- the tool ---------------------------------------------------------------------------------

def test_a_run_of_twelve_words_is_found(grams):
    text = f"Our own opening. {_words(12)}. Our own ending."
    assert seed_overlap.overlaps(text, grams) == [_words(12)]


def test_eleven_words_are_not_a_run(grams):
    assert seed_overlap.overlaps(f"Intro {_words(11)} outro", grams) == []
    assert seed_overlap.overlaps(f"Intro {_words(11, start=3)} outro", grams) == []


def test_a_longer_run_is_reported_once_whole(grams):
    runs = seed_overlap.overlaps(f"We say: {_words(16, start=2)}, in short.", grams)
    assert runs == [_words(16, start=2)]


def test_case_and_punctuation_do_not_hide_a_run(grams):
    shouted = "THE QUICK, BROWN FOX -- JUMPS OVER THE LAZY DOG; WHILE THE FARMER SLEEPS!"
    assert len(seed_overlap.overlaps(shouted, grams)) == 1


def test_runs_of_mostly_numbers_are_data_not_prose(grams):
    numbers = "weights of 0.12 0.45 0.88 1.03 2.5 3.75 4.0 5.5 6.25 7.0 8.125 9.5 10.0"
    assert seed_overlap.overlaps(numbers, grams) == []


def test_blockquotes_in_markdown_and_marked_python_lines_are_skipped(tmp_path, grams):
    nb = {"cells": [
        {"cell_type": "markdown", "metadata": {}, "source": [f"> {_words(14)}\n",
                                                               "(the source, section 2)\n"]},
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
         "source": [f"text = '{_words(13)}'  # quotation: the source\n"]},
        {"cell_type": "markdown", "metadata": {}, "source": ["Our own words only.\n"]}],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "quoted.ipynb"
    path.write_text(json.dumps(nb))
    assert seed_overlap.overlaps(seed_overlap.file_text(path), grams) == []
    py = tmp_path / "mod.py"
    py.write_text(f'"""{_words(12)}"""\nx = 1  # quotation: {_words(12)}\n')
    assert seed_overlap.overlaps(seed_overlap.file_text(py), grams) == [_words(12)]
    # a '>' in Python code is not a blockquote: only markdown cells and .md files skip it
    code = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [],
                       "execution_count": None, "source": [f"# > {_words(12)}\n"]}]}
    path.write_text(json.dumps(code))
    assert len(seed_overlap.overlaps(seed_overlap.file_text(path), grams)) == 1


def test_the_command_line_lists_runs_and_exits_1(tmp_path, monkeypatch, capsys):
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    (seeds / "a.txt").write_text(SOURCE)
    monkeypatch.setenv("COURSE_SEEDS_DIR", str(seeds))
    copied, own = tmp_path / "copied.md", tmp_path / "own.md"
    copied.write_text(f"{_words(12)}\n")
    own.write_text("A sentence of our own, well under twelve words of theirs.\n")
    assert seed_overlap.main([str(own)]) == 0
    assert seed_overlap.main([str(copied), str(own)]) == 1
    out = capsys.readouterr().out
    assert f"copied.md: 12 words: {_words(12)}" in out and "1 run(s)" in out


# ---- the course ----------------------------------------------------------------------------

def test_the_course_is_in_its_own_words():
    folder = seed_overlap.seeds_dir()
    if folder is None:
        pytest.skip("no seed texts: ../shared/reference/seeds (or $COURSE_SEEDS_DIR) is absent "
                    "in this checkout; CI has ../shared beside the clone and runs this test")
    grams = seed_overlap.seed_ngrams(folder)
    assert grams, f"{folder} holds no *.txt seed texts"
    files = seed_overlap.default_files()
    assert len(files) >= 39 + 20, "notebooks/, solutions/, exercises/ and course_lib/ scanned"
    found = [f"{p.relative_to(ROOT)}: {run}" for p in files
             for run in seed_overlap.overlaps(seed_overlap.file_text(p), grams)]
    assert not found, ("runs of 12+ words shared with the source texts (rewrite them in the "
                       "course's own words, or mark a quotation of a paper as one):\n"
                       + "\n".join(found))


def test_lessons_00_to_04_are_in_their_own_words():
    """The part of the course already rewritten stays so (strict now)."""
    folder = seed_overlap.seeds_dir()
    if folder is None:
        pytest.skip("no seed texts: ../shared/reference/seeds (or $COURSE_SEEDS_DIR) is absent")
    grams = seed_overlap.seed_ngrams(folder)
    files = [p for d in ("notebooks", "solutions", "exercises")
             for p in sorted((ROOT / d).glob("0[0-4]_*.ipynb"))]
    files += sorted((ROOT / "course_lib" / "checks").glob("lesson0[0-4].py"))
    files += [ROOT / "course_lib" / "checks" / "__init__.py", ROOT / "course_lib" / "authoring" / "grading.py",
              ROOT / "course_lib" / "authoring" / "exercises.py",
              ROOT / "course_lib" / "learner_progress.py"]
    assert len(files) == 15 + 9
    found = [f"{p.relative_to(ROOT)}: {run}" for p in files
             for run in seed_overlap.overlaps(seed_overlap.file_text(p), grams)]
    assert not found, "\n".join(found)
