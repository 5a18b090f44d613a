"""The learner's text speaks of the course only: no issue numbers, no issue tracker.

Learners cannot see the course's development tracker, so notebooks, solutions, exercises and
the code they read (course_lib/, kernels/) never cite it; a figure measured elsewhere lives in
results/ with its provenance. Links to other projects' issues (".../issues/123") are fine.
"""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# "issue 18" as a noun (not the verb: "an SM issues 128 lane-instructions a clock")
FORBIDDEN = [re.compile(r"(?<![/\w])issues?\s*#\d+", re.I),                       # "issue #18"
             re.compile(r"(?:\(|\b(?:see|in|from|by|of|per|for|the|an|this|that|course's|our)\s+)"
                        r"issues?\s+\d+", re.I),                                     # "see issue 18"
             re.compile(r"\bissues?\s+\d+(?:'s|\))", re.I),                         # "issue 25)"
             re.compile(r"\b(issue[- ])?tracker\b", re.I)]


def learner_files() -> list[Path]:
    files = []
    for folder in ("notebooks", "solutions", "exercises"):
        files += sorted((ROOT / folder).glob("*.ipynb"))
    for package in ("course_lib", "kernels"):
        files += [p for p in sorted((ROOT / package).rglob("*")) if p.suffix in (".py", ".sh")
                  and "data" not in p.relative_to(ROOT / package).parts]   # bundled text aside
    return files


def text_of(path: Path) -> str:
    if path.suffix == ".ipynb":
        return "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"])
    return path.read_text()


def test_the_scan_sees_the_files_and_catches_a_citation():
    assert len(learner_files()) > 60
    assert all(any(p.search(s) for p in FORBIDDEN) for s in
               ("see issue 18", "Issue #25's table", "quoted from the course's issue tracker",
                "(issue 25)", "the figures of issue 18's run", "as in issues 3 and 4"))
    assert not any(p.search(s) for p in FORBIDDEN for s in (
        "github.com/ggml-org/llama.cpp/issues/1234", "An SM issues 128 lane-instructions a clock",
        "every SM issues 4 warp instructions"))


@pytest.mark.parametrize("path", learner_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_issue_numbers_or_tracker(path):
    text = text_of(path)
    found = [m.group(0) for p in FORBIDDEN for m in p.finditer(text)]
    assert not found, f"{path.relative_to(ROOT)} cites the development tracker: {found}"
