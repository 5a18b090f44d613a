"""tools/llm_compressor_rotation.py: llm-compressor's rotation recipes (QuIPModifier,
SpinQuantModifier) on SmolLM2, lesson 16's reference. llm-compressor lives in an environment of
its own (see the tool's docstring), so here its recipes and record-keeping are tested offline:
the recipe table, the errors a failing recipe leaves, the record's structure, and one recipe
run with a stand-in for llm-compressor's oneshot."""
import ast
import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "llm_compressor_rotation.py"


def _tool():
    spec = importlib.util.spec_from_file_location("llmc_rotation", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_recipe_parses_and_says_what_it_runs():
    t = _tool()
    names = t.recipe_names()
    assert len(names) == len(set(names))
    assert t.recipe_names(quick=True) == names             # --quick smoke-tests every recipe
    for name in names:
        scheme, rotation, quantizer = t.parse(name)
        what = t.describe(name)
        if rotation:                                       # the rotation's modifier is named
            assert t.ROTATIONS[rotation][0] in what, name
        if quantizer == "gptq":
            assert "actorder=None" in what
        if quantizer == "rtn":
            assert "QuantizationModifier" in what
    assert t.parse("w4_g32 quip+rtn") == ("w4_g32", "quip", "rtn")
    assert t.parse("w4_g32 rtn") == ("w4_g32", None, "rtn")
    assert t.parse("fp spinquant_r1-r4") == ("fp", "spinquant_r1-r4", "none")
    assert t.parse("off_grid w4_g32 quip+gptq") == ("w4_g32", "quip", "gptq")
    assert t.off_grid("off_grid w4_g32 rtn") == (True, "w4_g32 rtn")
    assert t.off_grid("w4_g32 rtn") == (False, "w4_g32 rtn")
    assert t.describe("off_grid w4_g32 rtn").startswith("SmolLM2 moved off its Q4_1 grid")
    # every weight recipe with a rotation runs on the moved model too (lesson 16's general case)
    for name in names:
        scheme, rotation, _ = t.parse(name)
        if scheme == "w4_g32" and rotation in (None, "quip", "spinquant_r1-r4"):
            assert f"off_grid {t.off_grid(name)[1]}" in names, name


def test_each_rotated_recipe_has_its_unrotated_twin_run_before_it():
    """Every rotated row is compared with the same quantizer unrotated, and the cheap rows land
    first (GPTQ, minutes at one thread, last)."""
    t = _tool()
    names = t.recipe_names()
    for i, name in enumerate(names):
        scheme, rotation, quantizer = t.parse(name)
        if rotation and scheme != "fp":
            moved = t.off_grid(name)[0]
            plain = f"{t.OFF_GRID} " * moved + f"{scheme} {quantizer}"
            assert plain in names and names.index(plain) < i, name
    first_gptq = min(i for i, n in enumerate(names) if t.parse(n)[2] == "gptq")
    assert all(t.parse(n)[2] == "gptq" for n in names[first_gptq:])
    # the brief's rows: QuIP defaults, SpinQuant defaults (kept although it fails here),
    # R1-R4, and activation schemes with and without rotation
    for must in ("w4_g32 quip+rtn", "w4_g32 spinquant+rtn", "w4_g32 spinquant_r1-r4+rtn",
                 "w8a8 rtn", "w8a8 spinquant_r1-r4+rtn", "w4a4 rtn", "w4a4 quip+rtn",
                 "w4_g32 quip+gptq"):
        assert must in names


@pytest.mark.parametrize("bad", ["w4_g32", "w5 rtn", "w4_g32 quarot+rtn", "fp rtn",
                                 "w4_g32 quip", "w8a8 gptq", "w4_g32 quip+awq"])
def test_a_name_that_is_not_a_recipe_says_what_the_parts_can_be(bad):
    with pytest.raises(ValueError, match="recipe"):
        _tool().parse(bad)


def test_the_rotation_defaults_are_llm_compressors():
    """The 'quip' and 'spinquant' recipes pass no arguments, so they run llm-compressor's
    defaults; the random-hadamard ones change only the transform type (and the rotations)."""
    t = _tool()
    assert t.ROTATIONS["quip"][:2] == ("QuIPModifier", {})
    assert t.ROTATIONS["spinquant"][:2] == ("SpinQuantModifier", {})
    for r in ("spinquant_r1r2", "spinquant_r1-r4"):
        cls, kw, _ = t.ROTATIONS[r]
        assert cls == "SpinQuantModifier" and set(kw) == {"rotations", "transform_type"}
        assert kw["transform_type"] == "random-hadamard"
    assert t.ROTATIONS["spinquant_r1-r4"][1]["rotations"] == ["R1", "R2", "R3", "R4"]


def test_every_gptq_recipe_sets_actorder_explicitly():
    """llm-compressor 0.14's GPTQModifier runs static act-order unless told (see
    tests/test_llm_compressor_record.py); read from the source, llm-compressor is absent here."""
    tree = ast.parse(TOOL.read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and getattr(n.func, "id", None) == "GPTQModifier"]
    assert calls
    for c in calls:
        kw = {k.arg: k.value for k in c.keywords}
        assert "actorder" in kw and ast.literal_eval(kw["actorder"]) is None


def test_a_failing_recipe_is_recorded_with_its_error_and_reason():
    t = _tool()
    err = ValueError("Cannot construct deterministic hadamard of size != 2^n\nmore lines")
    row = t.error_row(err, ["SpinQuantModifier(...)"], "what")
    assert row["error"] == "ValueError: Cannot construct deterministic hadamard of size != 2^n"
    assert "576" in row["reason"] and "hadamard.py:40-42" in row["reason"]
    assert row["ran"] == ["SpinQuantModifier(...)"] and row["what"] == "what"
    row = t.error_row(RuntimeError("something else"), [], "w")
    assert row["error"] == "RuntimeError: something else" and "reason" not in row


class _TinyTransform(torch.nn.Module):
    """Stands for compressed_tensors' HadamardTransform (only the class name's ending counts)."""


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        self.a.v_input, self.b.v_input = _TinyTransform(), _TinyTransform()


def test_run_one_records_a_measured_row_and_a_failed_one(monkeypatch):
    """A recipe's row from a stand-in oneshot: the figures, its seconds, the online rotations
    left in the model; and one whose oneshot raises becomes its error, not a dropped row."""
    t = _tool()
    monkeypatch.setattr(t, "build", lambda name: ["ModA()", "ModB()"])   # no llm-compressor
    figures = {"kl_nats": 0.1, "top1_agreement": 0.9, "perplexity": 20.0}
    row = t.run_one("w4_g32 quip+rtn", _Tiny(), lambda m, r: None, lambda m: dict(figures))
    assert row["ran"] == ["'ModA()'", "'ModB()'"] and "QuIPModifier" in row["what"]
    assert row["kl_nats"] == 0.1 and row["seconds"] >= 0 and row["score_seconds"] >= 0
    assert row["online_transforms"] == {"v_input": 2}

    def fails(model, recipe):
        raise ValueError("Cannot construct deterministic hadamard of size != 2^n")
    row = t.run_one("w4_g32 spinquant+rtn", _Tiny(), fails, lambda m: dict(figures))
    assert row["error"].startswith("ValueError") and "kl_nats" not in row and row["reason"]
    assert row["ran"] == ["'ModA()'", "'ModB()'"]


def test_the_record_has_the_reference_tools_structure():
    """Same top-level keys and protocol keys as tools/llm_compressor_reference.py's record, with
    the clean protocol and lesson 16's SmolLM2 windows."""
    t = _tool()
    rows = {"baseline": {"perplexity": 17.7}, "w4_g32 rtn": {"kl_nats": 0.3}}
    args = (rows, False, t.CALIB_WINDOWS, t.EVAL_WINDOWS, {"torch": "x"}, {"cpu": "y"}, "cmd")
    mine, theirs = t.record(*args), t.ref.record(*args)
    assert set(theirs) <= set(mine)
    assert set(theirs["protocol"]) - {"weights", "w8a8"} <= set(mine["protocol"])
    assert mine["protocol"]["name"] == "clean" == theirs["protocol"]["name"]
    assert mine["protocol"]["evaluation"]["windows"] == 8
    assert mine["protocol"]["calibration"] == {
        "windows": 16, "tokens": 512, "text": "course_lib.smollm.calibration_ids(protocol='clean')"}
    assert mine["protocol"]["reference_perplexity"] == 17.7 and mine["rows"] is rows
    json.dumps(mine)                                       # writable as it is


def test_the_settings_are_lesson_16s():
    from course_lib import rotation_table
    t = _tool()
    s = rotation_table.SETTINGS["smollm2"]
    assert (t.EVAL_WINDOWS, t.WINDOW, t.CALIB_WINDOWS) == (s["eval_windows"], s["eval_window"],
                                                           s["calib_windows"])
    assert s["calib_window"] == t.WINDOW and t.PROTOCOL == rotation_table.PROTOCOL


def test_build_makes_llm_compressor_modifiers():
    """Where llm-compressor is installed (its own venv), every recipe builds."""
    pytest.importorskip("llmcompressor", reason="llm-compressor is not installed here")
    t = _tool()
    for name in t.recipe_names():
        mods = t.build(name)
        kinds = [type(m).__name__ for m in mods]
        scheme, rotation, quantizer = t.parse(name)
        assert (rotation is not None) == (kinds[0] in ("QuIPModifier", "SpinQuantModifier"))
        assert (quantizer == "gptq") == ("GPTQModifier" in kinds)


def _tiny_course_model():
    """A 2-block course LlamaModel whose Linears take 64 inputs (two Q4_1 blocks of 32)."""
    from course_lib import model as M
    cfg = M.ModelConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=64, vocab_size=96)
    return M.LlamaModel(cfg).init_weights(0).eval()


def test_off_grid_model_copies_the_course_noise_into_the_transformers_model(monkeypatch):
    """The moved model is smollm.off_grid's, weight for weight; a transformers model whose
    weights are laid out otherwise is refused, not silently moved (stand-ins for both loaders:
    a tiny course model, and a copy of it as 'the transformers model')."""
    import copy
    from course_lib import smollm
    t = _tool()
    tiny = _tiny_course_model()
    monkeypatch.setattr(smollm, "load", lambda: copy.deepcopy(tiny))
    monkeypatch.setattr(t.ref, "load_hf_model", lambda: copy.deepcopy(tiny))
    model, rms = t.off_grid_model()
    want, want_rms = smollm.off_grid(copy.deepcopy(tiny))
    assert rms == want_rms and 0 < rms < 1
    got, expected = dict(model.named_parameters()), dict(want.named_parameters())
    for name, p in expected.items():
        assert torch.equal(got[name], p), name                # the same bits
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(got[q], dict(tiny.named_parameters())[q])    # and moved

    def permuted():                                           # rows in another order
        m = copy.deepcopy(tiny)
        w = m.model.layers[0].self_attn.q_proj.weight
        w.data = w.data.flip(0)
        return m
    monkeypatch.setattr(t.ref, "load_hf_model", permuted)
    with pytest.raises(ValueError, match="layout"):
        t.off_grid_model()


def test_figures_put_each_rotation_beside_its_plain_recipe():
    t = _tool()
    rows = {"baseline": {"perplexity": 17.7}, "off_grid baseline": {"perplexity": 18.0},
            "w4_g32 rtn": {"kl_nats": 0.34}, "w4_g32 quip+rtn": {"kl_nats": 0.33},
            "w4_g32 spinquant+rtn": {"error": "ValueError: ..."},
            "fp quip": {"kl_nats": 0.0}, "off_grid w4_g32 quip+rtn": {"kl_nats": 0.2}}
    assert t.figures(rows) == {"w4_g32 rtn": {"none": 0.34, "quip": 0.33, "spinquant": None},
                               "fp": {"quip": 0.0}, "off_grid w4_g32 rtn": {"quip": 0.2}}
    assert t.record(rows, True, 2, 1, {}, {}, "c")["figures"] == t.figures(rows)


def test_rotated_minus_plain_pairs_each_rotation_with_its_twin(tmp_path):
    """protocol.paired on the per-window KL, rotated minus plain, only where both were
    measured; refresh() rewrites a record's derived parts from its rows, rows untouched."""
    from course_lib import protocol
    t = _tool()
    plain = {"kl_nats": 0.4, "windows": {"kl_nats": [0.40, 0.50, 0.30]}}
    quip = {"kl_nats": 0.3, "windows": {"kl_nats": [0.30, 0.40, 0.20]}}
    rows = {"baseline": {"perplexity": 17.7}, "w4_g32 rtn": plain, "w4_g32 quip+rtn": quip,
            "w4_g32 spinquant+rtn": {"error": "ValueError: ..."},
            "fp quip": {"kl_nats": 0.0, "windows": {"kl_nats": [0.0, 0.0, 0.0]}},
            "off_grid w4_g32 quip+rtn": quip}                  # its twin was not measured
    got = t.rotated_minus_plain(rows)
    assert list(got) == ["w4_g32 quip+rtn"]
    assert got["w4_g32 quip+rtn"] == protocol.paired(quip["windows"]["kl_nats"],
                                                     plain["windows"]["kl_nats"])
    assert got["w4_g32 quip+rtn"]["a_better"] == 3          # the rotation wins every window
    one = {n: {**r, "windows": {"kl_nats": [0.1]}} for n, r in rows.items() if "windows" in r}
    assert t.rotated_minus_plain(one) == {}                    # --quick: one window, no pairs
    path = tmp_path / "rec.json"
    path.write_text(json.dumps({"rows": rows, "other": 1}))
    rec = t.refresh(path)
    assert rec == json.loads(path.read_text()) and rec["rows"] == rows and rec["other"] == 1
    assert rec["rotated_minus_plain"] == got and rec["figures"] == t.figures(rows)


def test_resume_keeps_measured_rows_of_the_same_protocol_only(tmp_path):
    """--resume keeps the rows an interrupted run measured (a failed one runs again), and
    refuses a record of another protocol, window count or --quick setting."""
    t = _tool()
    rows = {"baseline": {"perplexity": 12.7}, "w4_g32 rtn": {"kl_nats": 0.37},
            "w4_g32 spinquant+rtn": {"error": "ValueError: ..."}}
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(t.record(rows, False, t.CALIB_WINDOWS, t.EVAL_WINDOWS, {}, {},
                                        "c")))
    kept = t.resumable_rows(path, False, t.CALIB_WINDOWS, t.EVAL_WINDOWS)
    assert kept == {"baseline": {"perplexity": 12.7}, "w4_g32 rtn": {"kl_nats": 0.37}}
    assert t.resumable_rows(tmp_path / "absent.json", False, 16, 8) == {}
    assert t.resumable_rows(None, False, 16, 8) == {}
    for other in ((True, 16, 8), (False, 16, 1), (False, 64, 8)):
        with pytest.raises(SystemExit, match="--resume"):
            t.resumable_rows(path, *other)


# ----------------------------------------------------------------------------- the committed record
RESULT = ROOT / "results" / "llm_compressor_rotation_smollm2.json"


def test_the_committed_record_is_a_full_run_with_its_provenance():
    rec = json.loads(RESULT.read_text())
    t = _tool()
    assert not rec["quick"] and rec["command"].startswith("python tools/llm_compressor_rotation.py")
    assert set(rec["versions"]) >= {"llmcompressor", "compressed-tensors", "transformers", "torch"}
    assert rec["machine"]["cpu"] and rec["protocol"]["name"] == "clean"
    assert rec["protocol"]["evaluation"]["windows"] == t.EVAL_WINDOWS
    assert rec["protocol"]["calibration"]["windows"] == t.CALIB_WINDOWS
    # every recipe is there: measured on every window, or failed with its error
    assert set(rec["rows"]) == set(t.recipe_names()) | {"baseline", f"{t.OFF_GRID} baseline"}
    for name in t.recipe_names():
        row = rec["rows"][name]
        assert ("error" in row) != ("windows" in row), name
        if "windows" in row:
            assert len(row["windows"]["kl_nats"]) == t.EVAL_WINDOWS
    # the one recipe that cannot run on SmolLM2 says why (576 is not a power of two)
    assert "2^n" in rec["rows"]["w4_g32 spinquant+rtn"]["error"]
    # derived parts are what the rows give
    assert rec["figures"] == t.figures(rec["rows"])
    assert rec["rotated_minus_plain"] == t.rotated_minus_plain(rec["rows"])


def test_the_reference_agrees_with_the_course_where_nothing_is_rotated():
    """The unrotated recipes are the course's rows by another implementation: within 10%
    (lesson 16 asserts it; the grids differ: absmax / 7.5 against the course's absmax / 7)."""
    from course_lib import rotation_table as rt
    pairs = {p["label"]: p for p in rt.reference_pairs(rt.load_table("smollm2"),
                                                       rt.load_reference())}
    for label in ("W4A16 RTN g32", "W8A8", "W4A4 RTN", "W4A16 RTN g32, off grid"):
        p = pairs[label]
        assert abs(p["course_plain"] - p["llmc_plain"]) < 0.1 * p["llmc_plain"], label
    assert all(p["course_minus_llmc"] is not None for p in pairs.values())
    # on llm-compressor's INT4 grid (16 levels) the course's rotated W4A4 is llm-compressor's
    # QuaRot-style one (measured 2.381 against 2.392); on the course's 15 levels it is not
    same_grid = pairs["W4A4 RTN, 16-level grid"]
    assert abs(same_grid["course_rotated"] - same_grid["llmc_quarot"]) < 0.1 * same_grid["llmc_quarot"]
    assert pairs["W4A4 RTN"]["course_rotated"] > 1.5 * pairs["W4A4 RTN"]["llmc_quarot"]
