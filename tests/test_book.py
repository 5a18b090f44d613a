"""The rendered book (course_lib.authoring.book, `make book`), built for two lessons: each page holds the
executed notebook with its outputs and plots and links to its neighbours; the contents page
links every page and its sections; nothing in a page needs the network but MathJax and the
widget manager (the build itself fetches nothing)."""
import json
import re

import pytest

from course_lib.authoring import book


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("book")
    record = book.build(out, only=["00", "01"], solutions=False, log=lambda *_: None)
    return out, record


def test_pages_hold_the_executed_notebooks_with_outputs_and_plots(built):
    out, record = built
    assert [p["source"] for p in record["pages"]] == ["notebooks/00_the_bill.ipynb",
                                                      "notebooks/01_number_formats.ipynb"]
    for page in record["pages"]:
        html = (out / page["html"]).read_text()
        executed = json.loads((out / "_executed" / page["source"]).read_text())
        code = [c for c in executed["cells"] if c["cell_type"] == "code"]
        assert all(c["execution_count"] for c in code), f"{page['source']}: a cell did not run"
        outputs = [o for c in code for o in c["outputs"]]
        assert not [o for o in outputs if o["output_type"] == "error"]
        assert "Traceback (most recent call last)" not in html
        assert html.count('src="data:image/png;base64,') >= 2, f"{page['html']}: plots missing"
        assert html.count('class="jp-OutputArea-child') >= 10, f"{page['html']}: outputs missing"
        # CSS is inline: no stylesheet from the network
        assert not re.search(r"<link[^>]+href=\"https?://", html)
        assert page["run_s"] > 0 and page["title"]


def test_pages_link_their_neighbours_and_the_contents(built):
    out, record = built
    first = (out / "notebooks/00_the_bill.html").read_text()
    second = (out / "notebooks/01_number_formats.html").read_text()
    assert 'href="../index.html"' in first and 'href="../notebooks/01_number_formats.html"' in first
    assert 'href="../notebooks/00_the_bill.html"' in second


def test_contents_page_links_every_page_and_its_sections(built):
    out, record = built
    index = (out / "index.html").read_text()
    for page in record["pages"]:
        assert f'href="{page["html"]}"' in index
        assert page["reading_min"] and f"about {page['reading_min']} min to read" in index
        assert len(page["sections"]) >= 5
        html = (out / page["html"]).read_text()
        for s in page["sections"]:
            assert f'id="{s["id"]}"' in html            # the anchor exists on the page
            assert f'href="{page["html"]}#{s["id"]}"' in index


def test_refuses_an_unknown_notebook():
    with pytest.raises(ValueError, match="no notebook starts with"):
        book.select(["99"], solutions=False)


def test_no_solutions_leaves_the_solved_exercises_out(monkeypatch, tmp_path):
    """`--no-solutions` (`make book` passes what BOOK_ARGS holds): lessons only, no page of
    solutions/ for a book handed to learners."""
    assert all(p.parent.name == "notebooks" for p in book.select(None, solutions=False))
    assert any(p.parent.name == "solutions" for p in book.select(None, solutions=True))
    calls = []
    monkeypatch.setattr(book, "build", lambda out, only, solutions, timeout_s: calls.append(
        (out, only, solutions)))
    assert book.main(["--no-solutions", "--out", str(tmp_path)]) == 0
    assert book.main(["--only", "00", "--out", str(tmp_path)]) == 0
    assert calls == [(tmp_path, None, False), (tmp_path, ["00"], True)]
