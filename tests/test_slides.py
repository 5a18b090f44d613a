"""The slide decks (course_lib.authoring.slides, `make slides`): executed, offline, setup off the
slides, long code split or scrolled, nothing written beside the notebooks."""
import json
import re
from pathlib import Path

import nbformat
import pytest

from course_lib.authoring import hosted, slides

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _tree(folder: Path) -> set:
    """Every path under ``folder`` (a deck, an executed copy or a checkpoint folder would be new;
    the notebooks' own edits, by a person working beside the test, are not counted)."""
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def deck(tmp_path_factory):
    """Lesson 00 built once (about 15-25 s): its folder and the notebooks/ tree before and after."""
    out = tmp_path_factory.mktemp("slides")
    before = _tree(ROOT / "notebooks")
    built = slides.build(slides.lesson_paths(["00"]), out)
    return out, built, before, _tree(ROOT / "notebooks")


def test_a_lesson_builds_offline_with_its_outputs(deck):
    out, built, _, _ = deck
    html = (out / "00_the_bill.slides.html").read_text()
    # reveal.js is beside the deck, loaded by a relative path; no script or style sheet is fetched
    assert (out / "reveal.js" / "dist" / "reveal.js").is_file()
    assert (out / "reveal.js" / "plugin" / "notes" / "notes.js").is_file()
    assert '<script src="reveal.js/dist/reveal.js">' in html
    fetched = re.findall(r'<(?:script|link|img)[^>]+(?:src|href)="(https?:[^"]+)"', html)
    assert fetched == [], fetched
    assert not re.search(r"require\(|cdnjs|unpkg", html)
    # executed: outputs and the lesson's figures are in the deck
    assert html.count('class="jp-OutputArea-child') >= 20
    assert "decode floor" in html.lower()
    assert "data:image/png;base64," in html
    meta = json.loads((out / "build.json").read_text())
    assert meta["reveal.js"] == slides.reveal_version() and meta["decks"][0]["deck"] == built[0]["deck"]
    assert (out / "index.html").read_text().count("00_the_bill.slides.html") == 1


def test_nothing_is_written_beside_the_notebooks(deck):
    _, _, before, after = deck
    assert after == before


def test_the_title_slide_holds_no_setup(deck):
    out, _, _, _ = deck
    html = (out / "00_the_bill.slides.html").read_text()
    first = html[html.index("<section"):html.index("</section>")]
    assert "00 · The bill" in first or "00 \u00b7 The bill" in first
    assert "COURSE_SOURCE" not in html and "find_spec" not in html and "device.summary" not in html


def test_the_deck_must_not_land_in_notebooks():
    with pytest.raises(ValueError, match="outside the course's notebooks"):
        slides.build([], ROOT / "notebooks" / "decks")


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.name[:2])
def test_long_code_is_split_or_scrolled(path):
    nb = nbformat.read(path, as_version=4)
    scrolled = set(slides.mark_long_cells(nb))
    code = {c.get("id"): c for c in nb.cells if c.cell_type == "code"}
    assert scrolled == {i for i, c in code.items()
                        if len(c.source.splitlines()) > slides.LONG_CELL_LINES
                        and c.metadata["slideshow"]["slide_type"] != "skip"}
    # every (sub-)slide shows at most LONG_CELL_LINES lines of code, or one cell that scrolls
    shown = [[]]
    for cell in nb.cells:
        kind = cell.metadata.get("slideshow", {}).get("slide_type", "-")
        if kind == "skip":
            continue
        if kind in ("slide", "subslide"):
            shown.append([])
        if cell.cell_type == "code":
            shown[-1].append(cell)
    for cells in shown:
        lines = sum(len(c.source.splitlines()) for c in cells)
        assert lines <= slides.LONG_CELL_LINES or (
            len(cells) == 1 and cells[0].get("id") in scrolled), [c.get("id") for c in cells]
    assert max(slides.code_lines_per_slide(nb)) == max(
        [sum(len(c.source.splitlines()) for c in cells) for cells in shown] + [0])


def test_long_cells_in_lessons_06_and_09_get_their_own_scrolling_sub_slide():
    for name, at_least in (("06_gptq", 1), ("09_kernels", 1)):
        nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
        ids = slides.mark_long_cells(nb)
        assert len(ids) >= at_least
        for cell in nb.cells:
            if cell.get("id") in ids:
                assert cell.metadata["slideshow"]["slide_type"] in ("slide", "subslide")
                assert slides.SCROLL_TAG in cell.metadata["tags"]


def test_the_template_needs_nothing_the_lessons_use_from_a_cdn():
    """The deck's template drops Mermaid (no lesson has a Mermaid block) and loads MathJax from
    beside the deck (lesson 01 has formulas)."""
    for path in LESSONS:
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "markdown":
                assert "```mermaid" not in "".join(cell["source"]), path.name
    assert slides.mathjax_dir() is not None, "pip install --no-deps jupyter-server-mathjax==0.2.6"
    assert (slides.mathjax_dir() / "config" / "TeX-AMS-MML_HTMLorMML-full.js").is_file()


def test_mathjax_is_bundled_and_loaded_locally(deck):
    out, _, _, _ = deck
    html = (out / "00_the_bill.slides.html").read_text()
    assert (out / "mathjax" / "MathJax.js").is_file()
    assert f'<script src="mathjax/MathJax.js?config={slides.MATHJAX_CONFIG}">' in html


def test_bad_selections_say_what_to_give():
    with pytest.raises(ValueError, match="names no lesson"):
        slides.lesson_paths(["99"])
    with pytest.raises(FileNotFoundError, match="not a notebook file"):
        slides.lesson_paths(["nowhere.ipynb"])
    with pytest.raises(ValueError, match="whole number"):
        slides.mark_long_cells(nbformat.v4.new_notebook(), lines=0)
    assert slides.lesson_paths(None) == LESSONS


def test_setup_cells_are_skipped_in_every_lesson():
    for path in LESSONS:
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            if hosted.TAG in cell["metadata"].get("tags", []):
                assert cell["metadata"]["slideshow"]["slide_type"] == "skip"
