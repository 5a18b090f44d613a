"""Slides an instructor can project: every lesson executed on the CPU, as a reveal.js deck that
works offline (``make slides``).

    python -m course_lib.authoring.slides                    # every lesson -> rendered/slides/
    python -m course_lib.authoring.slides 00 09              # just these lessons
    python -m course_lib.authoring.slides --out ~/decks 00   # elsewhere

Each lesson in ``notebooks/`` runs from a fresh kernel (nbclient, as ``course_lib.authoring.render``
does, but nothing is written beside the notebooks), then nbconvert's reveal.js exporter turns it
into ``OUT/NN_name.slides.html``, one slide per section (``course_lib.authoring.nbmeta`` stamps
the slide metadata). What this adds to ``jupyter nbconvert --to slides``:

- the outputs: the committed notebooks have none;
- offline: reveal.js is copied into ``OUT/reveal.js/`` from the Python package
  ``sphinx-revealjs`` (``REVEAL_PACKAGE``; installed without its dependencies: only its
  files are used), and the deck loads it with plain ``<script>`` tags. nbconvert's own
  template loads reveal.js through require.js, and require.js, jQuery, MathJax and Mermaid
  from CDNs; the deck's template (``TEMPLATE``) drops require.js, jQuery and Mermaid (no
  lesson has a Mermaid diagram, ``tests/test_slides.py`` checks) and loads MathJax 2.7 (lesson
  01's formulas) from ``OUT/mathjax/``, copied from the package ``jupyter-server-mathjax``
  (``MATHJAX_PACKAGE``), so the deck names no http(s) script or style sheet. A widget shows its
  text fallback, as in the book: a live widget needs a kernel;
- setup off the slides: the hosted-notebook setup cell and the device summary are stamped
  "skip" (``nbmeta``);
- long code: a code cell of more than ``LONG_CELL_LINES`` lines gets a sub-slide of its own
  and scrolls inside it (a "scroll" marker in its corner).

Output (git-ignored when under ``rendered/``): the decks, ``reveal.js/``, ``mathjax/`` and ``build.json``
(each deck's run time). Open ``OUT/index.html``, a list of the decks.
"""
from __future__ import annotations

import argparse
import html
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from course_lib.paths import ROOT

REVEAL_PACKAGE = "sphinx_revealjs"            # pip: sphinx-revealjs==3.2.1 (--no-deps)
REVEAL_IN_PACKAGE = ("_static", "revealjs")   # reveal.js 5.2.0's dist/ and plugin/ inside it
MATHJAX_PACKAGE = "jupyter_server_mathjax"    # pip: jupyter-server-mathjax==0.2.6: MathJax 2.7
MATHJAX_CONFIG = "TeX-AMS-MML_HTMLorMML-full,Safe"
LONG_CELL_LINES = 25
SCROLL_TAG = "slides-scroll"

TEMPLATE = r"""{%- extends 'reveal/index.html.j2' -%}
{% from 'mathjax.html.j2' import mathjax %}
{%- block html_head_js_jquery -%}{%- endblock html_head_js_jquery -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block html_head_js_mathjax -%}
{%- if resources.mathjax_url -%}{{ mathjax(resources.mathjax_url) }}{%- endif -%}
{%- endblock html_head_js_mathjax -%}
{% block jupyter_widgets %}{% endblock jupyter_widgets %}
{%- block html_head_css -%}
<style type="text/css">
.celltag_slides-scroll .jp-InputArea-editor .highlight { max-height: 480px; overflow-y: auto; }
.celltag_slides-scroll::before { content: "scroll \2193"; position: absolute; right: 0.5em;
  z-index: 2; font-size: 14px; color: #555; background: #ffd; padding: 0 0.4em; }
.celltag_slides-scroll { position: relative; }
.jp-OutputArea-output pre { max-height: 420px; overflow-y: auto; }
</style>
{%- endblock html_head_css -%}
{% block footer_js %}
<script src="{{ reveal_url_prefix }}/dist/reveal.js"></script>
<script src="{{ reveal_url_prefix }}/plugin/notes/notes.js"></script>
<script>
Reveal.initialize({
  controls: true, progress: true, history: true,
  transition: "{{reveal_transition}}", slideNumber: "{{reveal_number}}",
  width: {{reveal_width}}, height: {{reveal_height}},
  plugins: [RevealNotes]
});
</script>
{% endblock footer_js %}
"""
CONF = {"base_template": "reveal", "mimetypes": {"text/html": True}}


def reveal_dir() -> Path:
    """The reveal.js files (``dist/``, ``plugin/``) the package ``REVEAL_PACKAGE`` ships."""
    import importlib.util

    spec = importlib.util.find_spec(REVEAL_PACKAGE)        # located, not imported (no Sphinx)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"reveal.js comes from the package {REVEAL_PACKAGE.replace('_', '-')} (its files "
            f"only): pip install --no-deps sphinx-revealjs==3.2.1")
    folder = Path(list(spec.submodule_search_locations)[0]).joinpath(*REVEAL_IN_PACKAGE)
    if not (folder / "dist" / "reveal.js").is_file():
        raise FileNotFoundError(f"{folder} holds no dist/reveal.js: another version of "
                                f"{REVEAL_PACKAGE} moved it; install sphinx-revealjs==3.2.1")
    return folder


def reveal_version(folder: Path | None = None) -> str:
    """reveal.js's version, from the banner of ``dist/reveal.js``."""
    import re

    head = ((folder or reveal_dir()) / "dist" / "reveal.js").read_text()[:300]
    m = re.search(r"reveal\.js (\d+\.\d+\.\d+)", head)
    return m.group(1) if m else "unknown"


def mathjax_dir() -> Path | None:
    """MathJax 2.7's files (``MathJax.js``, ``config/``, ...) from ``MATHJAX_PACKAGE``, or None."""
    import importlib.util

    spec = importlib.util.find_spec(MATHJAX_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "static"
    return folder if (folder / "MathJax.js").is_file() else None


def copy_mathjax(out: Path) -> str:
    """Copy MathJax beside the decks; return the URL a deck loads it from ('' without it:
    then a formula shows as its TeX source, and the build says so)."""
    src = mathjax_dir()
    if src is None:
        print(f"MathJax not found ({MATHJAX_PACKAGE.replace('_', '-')} is not installed): "
              f"formulas show as TeX source", flush=True)
        return ""
    shutil.copytree(src, out / "mathjax", dirs_exist_ok=True)
    return f"mathjax/MathJax.js?config={MATHJAX_CONFIG}"


def copy_reveal(out: Path) -> Path:
    """Copy reveal.js's ``dist/`` and ``plugin/`` into ``out/reveal.js`` (once)."""
    src, dst = reveal_dir(), out / "reveal.js"
    for part in ("dist", "plugin"):
        shutil.copytree(src / part, dst / part, dirs_exist_ok=True)
    for name in ("LICENSE", "package.json"):
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    return dst


def mark_long_cells(nb, lines: int = LONG_CELL_LINES) -> list[str]:
    """Keep each (sub-)slide's code to about ``lines`` lines: a code cell longer than that gets
    a sub-slide of its own and the ``SCROLL_TAG`` tag (the template scrolls it), and a code cell
    that would take its (sub-)slide's code past ``lines`` starts a new sub-slide. Changes the
    executed copy only (the committed notebooks keep nbmeta's stamps); returns the ids of the
    cells that scroll."""
    if isinstance(lines, bool) or not isinstance(lines, int) or lines < 1:
        raise ValueError(f"lines is a whole number of lines >= 1; got {lines!r}")
    scrolled, on_slide = [], 0
    for cell in nb.cells:
        show = cell.metadata.setdefault("slideshow", {})
        kind = show.get("slide_type", "-")
        if kind in ("skip", "notes"):
            continue
        if kind in ("slide", "subslide"):
            on_slide = 0
        if cell.cell_type != "code":
            continue
        n = len(cell.source.splitlines())
        if (n > lines or on_slide + n > lines) and on_slide > 0 and kind not in ("slide", "subslide"):
            show["slide_type"], on_slide = "subslide", 0
        if n > lines:
            if show.get("slide_type", "-") not in ("slide", "subslide"):
                show["slide_type"] = "subslide"
            tags = cell.metadata.setdefault("tags", [])
            if SCROLL_TAG not in tags:
                tags.append(SCROLL_TAG)
            scrolled.append(cell.get("id", ""))
        on_slide += n
    return scrolled


def code_lines_per_slide(nb) -> list[int]:
    """The lines of code on each (sub-)slide the deck shows (cells marked skip left out)."""
    counts = [0]
    for cell in nb.cells:
        kind = cell.metadata.get("slideshow", {}).get("slide_type", "-")
        if kind in ("skip", "notes"):
            continue
        if kind in ("slide", "subslide"):
            counts.append(0)
        if cell.cell_type == "code":
            counts[-1] += len(cell.source.splitlines())
    return counts


def lesson_paths(selection: list[str] | None = None, root: Path = ROOT) -> list[Path]:
    """The lessons to build: all of ``notebooks/``, or those named by number (``00``) or path."""
    every = sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if not selection:
        return every
    found = []
    for item in selection:
        as_path = Path(item)
        if as_path.suffix == ".ipynb":
            if not as_path.is_file():
                raise FileNotFoundError(f"{item} is not a notebook file that exists")
            found.append(as_path.resolve())
            continue
        hits = [p for p in every if p.name.startswith(f"{item}_")]
        if len(hits) != 1:
            raise ValueError(f"{item!r} names no lesson: give a number such as 00 or 09, or a "
                             f"path to a notebook; lessons: {', '.join(p.name[:2] for p in every)}")
        found.append(hits[0])
    return found


def build_one(path: Path, out: Path, template_dir: Path, timeout_s: int = 900,
              mathjax_url: str = "") -> dict:
    """Execute one lesson and write its deck into ``out``; returns what was built."""
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import SlidesExporter

    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    seconds = time.perf_counter() - start
    marked = mark_long_cells(nb)
    exporter = SlidesExporter(template_name="course-reveal",
                              extra_template_basedirs=[str(template_dir)],
                              reveal_url_prefix="reveal.js", reveal_theme="white",
                              mathjax_url=mathjax_url)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": path.stem}})
    target = out / f"{path.stem}.slides.html"
    target.write_text(body, encoding="utf-8")
    return {"lesson": path.name, "deck": target.name, "run_seconds": round(seconds, 1),
            "long_cells_scrolled": marked}


def _template_dir(tmp: Path) -> Path:
    folder = tmp / "course-reveal"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "index.html.j2").write_text(TEMPLATE)
    (folder / "conf.json").write_text(json.dumps(CONF))
    return tmp


def _index(out: Path, decks: list[dict]) -> None:
    items = "\n".join(f'<li><a href="{html.escape(d["deck"])}">{html.escape(d["lesson"])}</a></li>'
                      for d in decks)
    (out / "index.html").write_text(f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
                                    f"<title>Quantization, Hands On: slides</title></head>"
                                    f"<body><h1>Slides</h1><ul>\n{items}\n</ul></body></html>\n",
                                    encoding="utf-8")


def build(lessons: list[Path], out: Path, timeout_s: int = 900) -> list[dict]:
    """Build the decks of ``lessons`` into ``out`` with reveal.js beside them."""
    out = Path(out).expanduser().resolve()
    if out == ROOT or ROOT / "notebooks" in (out, *out.parents):
        raise ValueError(f"write the slides outside the course's notebooks (e.g. "
                         f"{ROOT / 'rendered' / 'slides'}); got {out}")
    out.mkdir(parents=True, exist_ok=True)
    reveal = copy_reveal(out)
    mathjax_url = copy_mathjax(out)
    built = []
    with tempfile.TemporaryDirectory(prefix="course-slides-") as tmp:
        templates = _template_dir(Path(tmp))
        for path in lessons:
            one = build_one(path, out, templates, timeout_s, mathjax_url)
            print(f"{one['deck']}: ran in {one['run_seconds']} s; long cells on a scrolling "
                  f"sub-slide: {len(one['long_cells_scrolled'])}", flush=True)
            built.append(one)
    known = {}
    if (out / "build.json").is_file():
        known = {d["lesson"]: d for d in json.loads((out / "build.json").read_text())["decks"]}
    known.update({d["lesson"]: d for d in built})
    decks = [known[k] for k in sorted(known)]
    (out / "build.json").write_text(json.dumps(
        {"reveal.js": reveal_version(reveal), "from": f"{REVEAL_PACKAGE} (pip)",
         "mathjax": mathjax_url.split("?")[0] or None,
         "decks": decks}, indent=1) + "\n")
    _index(out, decks)
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lessons", nargs="*", help="lesson numbers (00 09) or notebook paths; "
                                                   "default: every lesson")
    parser.add_argument("--out", type=Path, default=ROOT / "rendered" / "slides",
                        help="where the decks go (default: rendered/slides, git-ignored)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds a cell may run")
    args = parser.parse_args(argv)
    build(lesson_paths(args.lessons), args.out, args.timeout)
    print(f"open {Path(args.out).expanduser().resolve() / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
