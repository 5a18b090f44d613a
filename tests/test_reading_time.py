"""Each lesson states a reading time computed from its word count (about 200 words a minute)."""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STATED = re.compile(r"about (\d+) minutes to read \(([\d,]+) words at 200 a minute\)")
MUST_STATE = ["00_the_bill", "01_number_formats", "02_absmax_and_zero_points",
              "03_outliers_and_block_scales"]


def _markdown_words(path: Path) -> int:
    cells = json.loads(path.read_text())["cells"]
    return sum(len(re.findall(r"\S+", "".join(c["source"]))) for c in cells
               if c["cell_type"] == "markdown")


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_stated_reading_time_fits_the_word_count(path):
    text = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"])
    m = STATED.search(text)
    if m is None:
        assert path.stem not in MUST_STATE, f"{path.name} must state its reading time"
        pytest.skip(f"{path.name} does not state a reading time in this form yet")
    minutes, words_stated = int(m.group(1)), int(m.group(2).replace(",", ""))
    words = _markdown_words(path)
    assert abs(words_stated - words) <= 0.05 * words + 50, \
        f"{path.name} says {words_stated} words; its markdown has {words}"
    assert abs(minutes - words / 200) <= 1, \
        f"{path.name} says {minutes} minutes; {words} words at 200 a minute is {words / 200:.1f}"
