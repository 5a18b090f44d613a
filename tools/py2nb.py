"""Convert a percent-format script into a clean notebook (an authoring aid, optional).

    python tools/py2nb.py draft.py notebooks/05_llm_int8.ipynb

Cells start at lines ``# %%`` (code) or ``# %% [markdown]`` (markdown; each line starts
with ``# ``). The notebook in the repo is the source of truth; this only saves typing
JSON by hand. ``python tools/py2nb.py --back nb.ipynb`` prints a notebook as a script.
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from course_lib.authoring.exercises import dumps  # noqa: E402

KERNEL = {"display_name": "Python 3", "language": "python", "name": "python3"}


def script_to_notebook(text: str) -> dict:
    cells, kind, lines = [], None, []

    def flush():
        if kind is None:
            return
        body = "\n".join(lines).strip("\n")
        if kind == "markdown":
            body = "\n".join(l[2:] if l.startswith("# ") else l.lstrip("#") for l in body.split("\n"))
        cell = {"cell_type": kind, "id": f"c{len(cells):03d}", "metadata": {},
                "source": body.splitlines(keepends=True)}
        if kind == "code":
            cell.update(outputs=[], execution_count=None)
        cells.append(cell)

    for line in text.split("\n"):
        if line.startswith("# %%"):
            flush()
            kind, lines = ("markdown" if "[markdown]" in line else "code"), []
        elif kind is not None:
            lines.append(line)
    flush()
    return {"cells": cells, "metadata": {"kernelspec": KERNEL,
            "language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}


def notebook_to_script(nb: dict) -> str:
    out = []
    for c in nb["cells"]:
        src = "".join(c["source"])
        if c["cell_type"] == "markdown":
            out.append("# %% [markdown]\n" + "\n".join("# " + l for l in src.split("\n")))
        else:
            out.append("# %%\n" + src)
    return "\n\n".join(out) + "\n"


if __name__ == "__main__":
    if sys.argv[1] == "--back":
        print(notebook_to_script(json.loads(Path(sys.argv[2]).read_text())))
    else:
        nb = script_to_notebook(Path(sys.argv[1]).read_text())
        Path(sys.argv[2]).write_text(dumps(nb))
        print("wrote", sys.argv[2], len(nb["cells"]), "cells")
