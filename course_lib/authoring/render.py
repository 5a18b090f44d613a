"""Build a rendered copy of the course, with outputs, into ``rendered/`` (never committed).

    python -m course_lib.authoring.render                 # every notebook in notebooks/ and solutions/
    python -m course_lib.authoring.render notebooks/00_the_bill.ipynb

Each notebook runs from a fresh kernel, as a learner would run it, and is saved with its
outputs; an instructor can then read it, or turn it into slides with
``jupyter nbconvert --to slides rendered/notebooks/00_the_bill.ipynb``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from course_lib.paths import ROOT


def render(path: Path, out_root: Path, timeout_s: int = 900, env: dict | None = None) -> float:
    """Execute one notebook and write it with outputs under ``out_root``; return seconds taken.
    ``env``: the kernel's environment (default: this process's)."""
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    if path.suffix != ".ipynb" or not path.is_file():
        raise FileNotFoundError(f"{path} is not a notebook file (.ipynb) that exists; pass one of "
                                f"notebooks/*.ipynb or solutions/*.ipynb")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int) or timeout_s < 1:
        raise ValueError(f"timeout_s is the seconds a cell may run, a whole number >= 1; got "
                         f"{timeout_s!r}")
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute(
                       **({"env": env} if env is not None else {}))
    seconds = time.perf_counter() - start
    target = out_root / path.relative_to(ROOT)
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, target)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Execute notebooks into rendered/ with outputs.")
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "rendered")
    args = parser.parse_args(argv)
    paths = [p.resolve() for p in args.paths] or sorted(
        p for d in ("notebooks", "solutions") for p in (ROOT / d).glob("*.ipynb"))
    for p in paths:
        print(f"{p.relative_to(ROOT)}: {render(p, args.out):.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
