"""Find runs of 12 or more consecutive words shared with the course's source texts.

The course is written in its own words (issue 19): no notebook or ``course_lib`` module may
repeat a run of ``MIN_WORDS`` words from ``../shared/reference/seeds/``. Allowed, and skipped:
- quotations of papers, marked as such: markdown lines starting with ``>`` (a blockquote, with
  its source named beside it), and Python lines carrying the comment ``# quotation:``;
- runs that are mostly numbers (a table of figures is data, not prose).

Usage: ``python tools/seed_overlap.py [FILE ...]`` (default: notebooks/, solutions/,
exercises/ and course_lib/); prints each run with its file and exits 1 when any is found.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

MIN_WORDS = 12
ROOT = Path(__file__).resolve().parents[1]
_WORD = re.compile(r"[a-z0-9]+(?:['.][a-z0-9]+)*")


def seeds_dir() -> Path | None:
    """The folder of source texts: ``$COURSE_SEEDS_DIR`` or ``../shared/reference/seeds``."""
    import os
    for cand in (os.environ.get("COURSE_SEEDS_DIR"), ROOT.parent / "shared" / "reference" / "seeds"):
        if cand and Path(cand).is_dir():
            return Path(cand)
    return None


def words(text: str) -> list[str]:
    """Lower-case words and numbers, punctuation dropped."""
    return _WORD.findall(text.lower())


def _keep_line(line: str, markdown: bool) -> bool:
    if markdown and line.lstrip().startswith(">"):
        return False
    return "# quotation:" not in line


def file_text(path: Path) -> str:
    """The prose and code of a file: every cell of a notebook, the whole of a .py or .md file,
    without the lines marked as quotations."""
    if path.suffix == ".ipynb":
        nb = json.loads(path.read_text(encoding="utf-8"))
        parts = []
        for cell in nb.get("cells", []):
            md = cell.get("cell_type") == "markdown"
            src = "".join(cell.get("source", []))
            parts.append("\n".join(l for l in src.splitlines() if _keep_line(l, md)))
        return "\n".join(parts)
    md = path.suffix == ".md"
    return "\n".join(l for l in path.read_text(encoding="utf-8").splitlines() if _keep_line(l, md))


def seed_ngrams(folder: Path, n: int = MIN_WORDS) -> set[tuple[str, ...]]:
    grams: set[tuple[str, ...]] = set()
    for p in sorted(folder.glob("*.txt")):
        w = words(p.read_text(encoding="utf-8"))
        grams.update(tuple(w[i:i + n]) for i in range(len(w) - n + 1))
    return grams


def _mostly_numbers(run: list[str]) -> bool:
    return sum(any(c.isdigit() for c in t) for t in run) * 2 >= len(run)


def overlaps(text: str, grams: set[tuple[str, ...]], n: int = MIN_WORDS) -> list[str]:
    """Maximal runs of >= n words of ``text`` whose every n-word window is in ``grams``."""
    w = words(text)
    hit = [tuple(w[i:i + n]) in grams for i in range(len(w) - n + 1)]
    runs, i = [], 0
    while i < len(hit):
        if hit[i]:
            j = i
            while j + 1 < len(hit) and hit[j + 1]:
                j += 1
            run = w[i:j + n]
            if not _mostly_numbers(run):
                runs.append(" ".join(run))
            i = j + 1
        else:
            i += 1
    return runs


def default_files() -> list[Path]:
    files = []
    for d in ("notebooks", "solutions", "exercises"):
        files += sorted((ROOT / d).glob("*.ipynb"))
    files += sorted((ROOT / "course_lib").rglob("*.py"))
    return files


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    folder = seeds_dir()
    if folder is None:
        print("no seed texts found (set COURSE_SEEDS_DIR or put them in ../shared/reference/seeds)")
        return 0
    grams = seed_ngrams(folder)
    found = 0
    for path in [Path(a) for a in argv] or default_files():
        for run in overlaps(file_text(path), grams):
            found += 1
            print(f"{path}: {len(words(run))} words: {run}")
    print(f"{found} run(s) of {MIN_WORDS}+ words shared with the source texts")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
