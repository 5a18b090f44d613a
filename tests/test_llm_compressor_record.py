"""results/llm_compressor_smollm2.json: llm-compressor's figures that lessons 06-08 quote, with
their provenance, written by tools/llm_compressor_reference.py (which needs llm-compressor in an
environment of its own: here only its record-keeping is tested, offline)."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "results" / "llm_compressor_smollm2.json"


def _tool():
    spec = importlib.util.spec_from_file_location("llmc_ref", ROOT / "tools" / "llm_compressor_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_figures_are_read_from_the_measured_rows():
    rows = {"baseline": {"perplexity": 16.0},
            "w4_g32 rtn": {"kl_nats": 0.36, "perplexity": 22.0, "seconds": 0.1},
            "w4_g32 gptq": {"kl_nats": 0.19, "perplexity": 19.0, "seconds": 200.0},
            "w3_g32 rtn": {"kl_nats": 1.6, "perplexity": 77.0},
            "w8a8 none": {"kl_nats": 0.028}}
    f = _tool().figures(rows)
    assert f["w4_g32_kl_nats"] == {"rtn": 0.36, "gptq": 0.19, "gptq+act": None, "awq": None}
    assert f["w3_g32_perplexity"]["rtn"] == 77.0 and f["w3_g32_perplexity"]["gptq"] is None
    assert f["w8a8_int8_dynamic_per_token_kl_nats"] == {"none": 0.028, "smoothquant_0.8": None}
    assert f["seconds_to_quantize"] == {"gptq": 200.0, "gptq+act": None, "awq": None}
    # a row named after what it ran (a relabelled one) is a figure too
    rows["w4_g32 gptq+act, actorder unset"] = {"kl_nats": 0.2, "seconds": 300.0}
    f = _tool().figures(rows)
    assert f["w4_g32_kl_nats"]["gptq+act, actorder unset"] == 0.2
    assert f["seconds_to_quantize"]["gptq+act, actorder unset"] == 300.0


def test_every_gptq_recipe_sets_actorder_explicitly():
    """llm-compressor 0.14's GPTQModifier runs static act-order when actorder is left out
    (modifiers/gptq/base.py:132, 154-158), so every GPTQ recipe must say which it wants.
    llm-compressor is not installed here: read the recipes from the tool's source."""
    import ast
    tree = ast.parse((ROOT / "tools" / "llm_compressor_reference.py").read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and getattr(n.func, "id", None) == "GPTQModifier"]
    assert len(calls) == 2
    actorders = []
    for c in calls:
        kw = {k.arg: k.value for k in c.keywords}
        assert "actorder" in kw, "a GPTQ recipe without actorder runs llm-compressor's default"
        actorders.append(ast.literal_eval(kw["actorder"]))
    assert sorted(actorders, key=str) == [None, "static"]


def test_the_committed_record_has_its_provenance_and_every_figure():
    rec = json.loads(RESULT.read_text())
    assert not rec["quick"], "the committed record must be a full run, not --quick"
    assert set(rec["versions"]) >= {"llmcompressor", "compressed-tensors", "transformers", "torch"}
    assert rec["command"].startswith("python tools/llm_compressor_reference.py")
    assert rec["machine"]["cpu"] and rec["protocol"]["name"] == "clean"
    assert rec["protocol"]["calibration"] == {
        "windows": 64, "tokens": 512, "text": "course_lib.smollm.calibration_ids(protocol='clean')"}
    assert rec["protocol"]["evaluation"]["windows"] == 8
    recipes = {"w4_g32_kl_nats": "w4_g32 {}", "w3_g32_perplexity": "w3_g32 {}",
               "w8a8_int8_dynamic_per_token_kl_nats": "w8a8 {}", "seconds_to_quantize": "w4_g32 {}"}
    for table, values in rec["figures"].items():
        for name, v in values.items():
            row = rec["rows"][recipes[table].format(name)]
            # a figure is measured, or its row says why not (failed with its error, or skipped)
            assert (isinstance(v, float) and v > 0) or (v is None and (row.get("error") or row.get("skipped"))), \
                f"{table} {name}: {v!r}"
    # the figures lessons 06 and 08 assert on are all measured (lesson 07 prints AWQ's or why not)
    for table, names in (("w4_g32_kl_nats", ("rtn", "gptq", "gptq+act")),
                         ("w3_g32_perplexity", ("rtn", "gptq", "gptq+act")),
                         ("w8a8_int8_dynamic_per_token_kl_nats", ("none", "smoothquant_0.8"))):
        assert all(rec["figures"][table][n] is not None for n in names), (table, names)
    # every figure is one of the measured rows, and the figures are what the tool derives
    f = rec["figures"]
    assert f == _tool().figures(rec["rows"])
    assert f["w4_g32_kl_nats"]["gptq+act"] == rec["rows"]["w4_g32 gptq+act"]["kl_nats"]


def test_every_measured_row_keeps_its_windows_and_their_spread():
    """The lessons compare llm-compressor with the course window by window (the clean
    protocol's rule 3): each measured row keeps its 8 windows' figures, whose means are the
    row's, and a bootstrap interval that contains the mean."""
    import math
    rec = json.loads(RESULT.read_text())
    measured = {n: r for n, r in rec["rows"].items() if "kl_nats" in r}
    assert len(measured) >= 8
    for name, r in measured.items():
        w = r["windows"]
        assert len(w["kl_nats"]) == len(w["top1_agreement"]) == len(w["nll_nats"]) == 8, name
        # the row's means are the windows' means (equal windows of 511 predictions); float32
        # sums against float64 means: 1e-5 relative
        assert math.isclose(sum(w["kl_nats"]) / 8, r["kl_nats"], rel_tol=1e-5, abs_tol=1e-7), name
        assert math.isclose(math.exp(sum(w["nll_nats"]) / 8), r["perplexity"], rel_tol=1e-5), name
        lo, hi = r["interval"]["kl_nats"]
        assert lo <= r["kl_nats"] <= hi, name
