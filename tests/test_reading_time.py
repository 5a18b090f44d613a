"""Each lesson states a reading time computed from its word count (about 200 words a minute)
and the time its notebook takes to run."""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STATED = re.compile(r"about (\d+) minutes to read \(([\d,]+) words at 200 a minute\)")
# the run time follows: "the notebook runs in under 15 seconds" / "in about 10 seconds" /
# "in under a minute" (measured with a full nbval run; the notebooks must stay under 45 s in CI)
RUN_TIME = re.compile(r"runs\s+in\s+(?:about|under)\s+(?:(\d+)\s+seconds|a\s+minute)")
LESSONS = [f"{n:02d}" for n in range(14)]          # 00-13


def _markdown_words(path: Path) -> int:
    cells = json.loads(path.read_text())["cells"]
    return sum(len(re.findall(r"\S+", "".join(c["source"]))) for c in cells
               if c["cell_type"] == "markdown")


def test_words_are_counted_in_markdown_only(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "source": ["two words\n", "and three"]},
                    {"cell_type": "code", "source": ["x = 1  # not prose"]}]}
    (tmp_path / "n.ipynb").write_text(json.dumps(nb))
    assert _markdown_words(tmp_path / "n.ipynb") == 4


LESSONS.append("15")                                  # lesson 15: quantization-aware training


@pytest.mark.parametrize("number", LESSONS)
def test_stated_reading_time_fits_the_word_count(number):
    found = sorted((ROOT / "notebooks").glob(f"{number}_*.ipynb"))
    if not found:
        pytest.skip(f"lesson {number} does not exist yet")
    path = found[0]
    text = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                     if c["cell_type"] == "markdown")
    m = STATED.search(text)
    assert m, (f"{path.name} must state its reading time as 'about N minutes to read "
               f"(W words at 200 a minute)'")
    minutes, words_stated = int(m.group(1)), int(m.group(2).replace(",", ""))
    words = _markdown_words(path)
    assert abs(words_stated - words) <= 0.05 * words + 50, \
        f"{path.name} says {words_stated} words; its markdown has {words}"
    assert abs(minutes - words / 200) <= 1, \
        f"{path.name} says {minutes} minutes; {words} words at 200 a minute is {words / 200:.1f}"
    run = RUN_TIME.search(text[m.end():m.end() + 400])
    assert run, f"{path.name} must say, after its reading time, how long the notebook runs"
    assert run.group(1) is None or int(run.group(1)) <= 60, \
        f"{path.name} states a run time over a minute; CI allows 45 s per notebook"
