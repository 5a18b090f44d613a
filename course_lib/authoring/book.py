"""Build the course as a static HTML book: every notebook executed on CPU, with its outputs and
plots, one page per notebook, and a contents page (``make book``).

    python -m course_lib.authoring.book                     # lessons and solved exercises -> rendered/book/
    python -m course_lib.authoring.book --only 00 01        # just these lessons (CI builds two)
    python -m course_lib.authoring.book --no-solutions      # lessons only

The tool is nbconvert (it comes with JupyterLab): each notebook runs from a fresh kernel with
nbclient (``course_lib.authoring.render``), then nbconvert's ``lab`` HTML template turns it into a
self-contained page (CSS and plots inline). The contents page is itself a small notebook of
links, converted by the same template. Nothing is fetched while building. Read offline, a page
shows everything but the live widgets: their saved state needs the ipywidgets HTML manager
from a CDN, so offline a widget shows its fallback text; run the notebook for the widget.

Output (git-ignored): ``rendered/book/index.html``, ``rendered/book/notebooks/*.html``,
``rendered/book/solutions/*.html`` and ``rendered/book/build.json`` (each notebook's run time
and the whole build's).
"""
from __future__ import annotations

import argparse
import html
import json
import os
import re
import sys
import time
from pathlib import Path

from course_lib.authoring.render import ROOT, render

READING = re.compile(r"about (\d+) minutes to read")
HEADING_ID = re.compile(r"<h([12]) id=\"([^\"]+)\"[^>]*>(.*?)</h\1>", re.S)


def _md_cell(text: str) -> dict:
    import nbformat
    return nbformat.v4.new_markdown_cell(text)


def notebook_title(nb) -> str:
    """The notebook's first ``# `` heading (its title), else ''."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return ""


def reading_minutes(nb) -> int | None:
    """The reading time the lesson states ("about N minutes to read"), if it states one."""
    for cell in nb.cells:
        m = READING.search(cell.source) if cell.cell_type == "markdown" else None
        if m:
            return int(m.group(1))
    return None


def _nav(pages: list[dict], i: int) -> str:
    """A markdown line of links: contents, previous page, next page (relative to a page)."""
    parts = ["[Contents](../index.html)"]
    if i > 0:
        p = pages[i - 1]
        parts.append(f"← [{p['title']}](../{p['html']})")
    if i + 1 < len(pages):
        p = pages[i + 1]
        parts.append(f"[{p['title']}](../{p['html']}) →")
    return " · ".join(parts)


def _export(nb, target: Path) -> str:
    """nbconvert's lab template -> ``target``; returns the HTML written."""
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(body, encoding="utf-8")
    return body


def _sections(body: str) -> list[tuple[str, str]]:
    """(anchor id, heading text) of each level-2 heading in an exported page, in order."""
    out = []
    for level, anchor, inner in HEADING_ID.findall(body):
        text = html.unescape(re.sub(r"<[^>]+>", "", inner)).replace("¶", "").strip()
        if level == "2" and text:
            out.append((anchor, text))
    return out


def select(only: list[str] | None, solutions: bool) -> list[Path]:
    """The notebooks to build, lessons first: all of notebooks/ (and solutions/), or those whose
    names start with one of ``only`` (e.g. ["00", "01"])."""
    folders = ["notebooks"] + (["solutions"] if solutions else [])
    paths = [p for d in folders for p in sorted((ROOT / d).glob("*.ipynb"))]
    if only:
        paths = [p for p in paths if any(p.name.startswith(o) for o in only)]
        missing = [o for o in only if not any(p.name.startswith(o) for p in paths)]
        if missing:
            raise ValueError(f"no notebook starts with {missing}; names look like 00_the_bill")
    if not paths:
        raise ValueError("no notebooks selected")
    return paths


def build(out: Path, only: list[str] | None = None, solutions: bool = True,
          timeout_s: int = 900, log=print) -> dict:
    """Execute the selected notebooks and write the book under ``out``. Returns the build record
    (also written to ``out/build.json``): per page its title, reading and run time, sections."""
    import nbformat

    out = Path(out)
    start = time.perf_counter()
    executed = out / "_executed"
    pages = []
    for path in select(only, solutions):
        rel = path.relative_to(ROOT)
        seconds = render(path, executed, timeout_s=timeout_s, env=_kernel_env())
        nb = nbformat.read(executed / rel, as_version=4)
        title = notebook_title(nb) or path.stem
        if rel.parts[0] == "solutions" and "exercise" not in title.lower():
            title = f"{title} (exercises, solved)"
        pages.append({"source": str(rel), "html": str(rel.with_suffix(".html")), "title": title,
                      "reading_min": reading_minutes(nb), "run_s": round(seconds, 1), "_nb": nb})
        log(f"{rel}: ran in {seconds:.1f} s")
    for i, page in enumerate(pages):
        nb = page.pop("_nb")
        nav = _nav(pages, i)
        nb.cells.insert(0, _md_cell(nav))
        nb.cells.append(_md_cell(nav))
        body = _export(nb, out / page["html"])
        page["sections"] = [{"id": a, "title": t} for a, t in _sections(body)]
    _write_index(out, pages)
    record = {"pages": pages, "build_s": round(time.perf_counter() - start, 1),
              "built": time.strftime("%Y-%m-%d %H:%M", time.localtime()),
              "cpu_threads": os.environ.get("OMP_NUM_THREADS", "default"),
              "load_average": [round(x, 2) for x in os.getloadavg()]}
    (out / "build.json").write_text(json.dumps(record, indent=1) + "\n")
    log(f"book: {len(pages)} pages in {record['build_s']:.0f} s -> {out / 'index.html'}")
    return record


def _kernel_env() -> dict:
    """The kernel's environment: as the caller's, without a non-inline matplotlib backend
    (pytest's conftest sets Agg, which would leave the book without plots)."""
    env = dict(os.environ)
    env.pop("MPLBACKEND", None)
    env.setdefault("COURSE_CHECKS", "solutions")
    return env


def _write_index(out: Path, pages: list[dict]) -> None:
    """The contents page: a notebook of links, converted by the same nbconvert template."""
    import nbformat

    lines = ["# Quantization, Hands On", "",
             "Every notebook of the course, executed on a CPU with its outputs and plots. "
             "Widgets need a running kernel: open the notebook in JupyterLab (`make lab`) to turn "
             "their knobs.", ""]
    part = None
    for p in pages:
        folder = p["source"].split("/")[0]
        if folder != part:
            part = folder
            lines += ["", "## Lessons" if folder == "notebooks" else "## Exercises, solved", ""]
        times = [f"about {p['reading_min']} min to read"] if p["reading_min"] else []
        times.append(f"ran in {p['run_s']:.0f} s on CPU")
        lines.append(f"- **[{p['title']}]({p['html']})** ({', '.join(times)})")
        if folder == "notebooks":
            for s in p["sections"]:
                lines.append(f"    - [{s['title']}]({p['html']}#{s['id']})")
    nb = nbformat.v4.new_notebook(cells=[_md_cell("\n".join(lines))])
    nb.metadata["title"] = "Quantization, Hands On"
    _export(nb, out / "index.html")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the course as a static HTML book.")
    parser.add_argument("--out", type=Path, default=ROOT / "rendered" / "book")
    parser.add_argument("--only", nargs="*", help="notebook name prefixes, e.g. 00 01")
    parser.add_argument("--no-solutions", action="store_true", help="lessons only")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    args = parser.parse_args(argv)
    build(args.out, args.only, solutions=not args.no_solutions, timeout_s=args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
