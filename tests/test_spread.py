"""Bands for live-vs-committed numbers come from measured spread (issue 25, course_lib.spread).

results/cpu_spread.json is written by tools/cpu_spread.py: each lesson cell that compares a live
number with a committed one, rerun under settings that make one machine dispatch like others.
These tests hold the lessons' bands to it: every band at least MARGIN (3x) the largest deviation
measured, every measured quantity with a band, every probe pointing at the cell that checks it.
"""
import ast
import json
import math
import sys
from pathlib import Path

import pytest

from course_lib import spread

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import cpu_spread  # noqa: E402

DATA = json.loads(spread.SPREAD_FILE.read_text())
RUNS = DATA["runs"]
MEASURED = {name for run in RUNS.values() for name in run["quantities"]}


def test_the_spread_file_names_its_machines_and_settings():
    assert RUNS, "results/cpu_spread.json has no run: `python tools/cpu_spread.py`"
    for cpu, run in RUNS.items():
        m = run["machine"]
        assert m["cpu"] == cpu and m["torch"] and m["blas"] and m["isa_flags"], m
        for name, q in run["quantities"].items():
            # every quantity under the CI's second dispatch at least, and this machine as it is
            assert {"base", "avx2"} <= set(q["values"]), (cpu, name, sorted(q["values"]))
    assert DATA["settings"]["avx2"] == {"ATEN_CPU_CAPABILITY": "avx2",
                                        "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def test_every_measured_quantity_has_a_band_and_every_band_was_measured():
    assert set(spread.BANDS).isdisjoint(spread.BOUNDS)
    named = set(spread.BANDS) | set(spread.BOUNDS)
    assert MEASURED - named == set(), "measured but no band (spread.BANDS) or bound (spread.BOUNDS)"
    assert named - MEASURED == set(), \
        "a band or bound never measured: run `python tools/cpu_spread.py --probes <lesson>`"


@pytest.mark.parametrize("name", sorted(spread.BOUNDS))
def test_each_bound_clears_three_times_the_spread_measured(name):
    """A live number compared with a constant: its distance to the constant, on every setting,
    is at least 3x what the settings moved it (or the assert is one dispatch away from failing)."""
    op, bound = spread.BOUNDS[name]
    for cpu, run in RUNS.items():
        q = run["quantities"].get(name)
        if q is None:
            continue
        assert q["committed"] is None, f"{name}: has a committed value, so it needs a band"
        vals = list(q["values"].values())
        margin = (bound - max(vals)) if op == "<" else (min(vals) - bound)
        assert margin > 0 and margin >= spread.MARGIN * q["spread_abs"], (name, cpu, q["values"])


@pytest.mark.parametrize("name", sorted(spread.BANDS))
def test_each_band_is_at_least_three_times_the_largest_deviation_measured(name):
    band = spread.BANDS[name]
    assert band.kind in ("smooth", "chaotic") and band.why
    for cpu, run in RUNS.items():
        q = run["quantities"].get(name)
        if q is None or not q["committed"]:
            continue
        committed = q["committed"]
        worst = max(abs(v - committed) for v in q["values"].values())
        allowed = band.rel * abs(committed) + band.abs_
        assert allowed >= spread.MARGIN * worst, (
            f"{name}: band {allowed:.3g} < {spread.MARGIN}x the deviation {worst:.3g} measured on "
            f"{cpu} ({q['values']}, committed {committed})")


def test_chaotic_quantities_are_called_chaotic():
    """A quantity that moved by more than 1% between settings on one machine is downstream of a
    rounding decision: its band must say so (and its lesson assert the claim besides)."""
    for run in RUNS.values():
        for name, q in run["quantities"].items():
            if q["spread_rel"] > 0.01 and name not in spread.BOUNDS:
                assert spread.BANDS[name].kind == "chaotic", (name, q["spread_rel"])


@pytest.mark.parametrize("key", sorted(cpu_spread.PROBES))
def test_each_probe_points_at_the_cell_that_checks_its_numbers(key):
    probe = cpu_spread.PROBES[key]
    cells = [c for c in json.loads((ROOT / probe.notebook).read_text())["cells"]
             if c["cell_type"] == "code"     # the hosted setup cell is not counted (cpu_spread)
             and "course-setup" not in c.get("metadata", {}).get("tags", [])]
    for cap in probe.captures:
        src = "".join(cells[cap.cell]["source"])
        assert "spread.check(" in src or "assert" in src, (
            f"{probe.notebook} code cell {cap.cell} no longer checks the live numbers it is "
            "probed for: update the probe in tools/cpu_spread.py")
        # and it is the cell that computes them: some name the probe reads is assigned there
        # (an inserted cell shifts the indices; a check alone would still pass on the wrong cell)
        used = {n.id for n in ast.walk(ast.parse(cap.expr, mode="eval"))
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        tree = ast.parse(cpu_spread.without_asserts(src))         # parses
        stored = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        assert used & stored, (f"{probe.notebook} code cell {cap.cell} assigns none of {sorted(used)}: "
                               "update the probe's cell index in tools/cpu_spread.py")


def test_without_asserts_keeps_the_computation():
    src = "x = 1\nassert x == 2, 'no'\nif x:\n    assert False\n    y = x + 1\n"
    ns = {}
    exec(cpu_spread.without_asserts(src), ns)
    assert ns["x"] == 1 and ns["y"] == 2


def test_summarize():
    s = cpu_spread.summarize({"base": 1.0, "avx2": 1.1}, 1.05)
    assert math.isclose(s["spread_rel"], 0.1) and math.isclose(s["max_dev_from_committed_rel"], 0.05 / 1.05)


def test_check_passes_inside_and_explains_outside():
    name = "06 SmolLM2 gptq KL"
    band = spread.BANDS[name]
    assert spread.check(name, 0.1 * (1 + band.rel / 2), 0.1) == pytest.approx(band.rel / 2)
    with pytest.raises(AssertionError, match=r"band is .*cpu_spread"):
        spread.check(name, 0.1 * (1 + 2 * band.rel), 0.1)
    with pytest.raises(AssertionError, match="not finite"):
        spread.check(name, float("nan"), 0.1)
    with pytest.raises(KeyError, match="BANDS"):
        spread.check("no such quantity", 1.0, 1.0)


def test_the_instructors_page_shows_the_stored_table():
    text = cpu_spread.DOC.read_text()
    block = text.split(cpu_spread.BEGIN, 1)[1].split(cpu_spread.END, 1)[0]
    assert block.strip() == cpu_spread.markdown_table(DATA).strip(), \
        "docs/cpu_dispatch.md's table is stale: `python tools/cpu_spread.py --doc`"
