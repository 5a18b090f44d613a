"""The methods table command (course_lib.experiments.methods_table, writing what
course_lib.methods.table reads): resuming a partial JSON, refusing to mix protocols, and GPTQ's
one-layer benchmark command (run small here; the real one is by hand). The writer reaches the
model, the rows and the slice through course_lib.methods.table, so the stand-ins replace them
there."""
import json

import pytest
import torch

from course_lib.experiments import methods_table
from course_lib.methods import gptq
from course_lib.methods import table


class _Ref:
    bits_per_byte = 1.5


@pytest.fixture
def fake_run(monkeypatch):
    """write_table with the model, calibration and scoring replaced by stand-ins: returns the
    list of (method, bits, group_size) rows it actually measured."""
    measured = []
    monkeypatch.setattr(table, "load_model", lambda name: (None, lambda m, n, w: _Ref()))
    monkeypatch.setattr(table.cal, "calibration_ids", lambda *a, **k: torch.zeros(1, 1))

    def fake_row(model, ref, m, ids, bits, gs, n_blocks=None, progress=False, **kw):
        measured.append((m, bits, gs))
        return {"method": m, "bits": bits, "group_size": gs, "kl_nats": 0.5, "seconds": 1.0}

    monkeypatch.setattr(table, "row", fake_row)
    monkeypatch.setattr(table, "slice_rows", lambda *a: {**table.SETTINGS["bundled"]["slice"],
                                                         "rows": [{"method": "live"}]})
    return measured


def _all_jobs():
    st = table.SETTINGS["bundled"]
    return [(m, b, g) for g in st["group_sizes"] for b in (4, 3) for m in table.METHODS]


def test_resume_measures_only_the_missing_rows_and_keeps_the_rest(fake_run, tmp_path):
    path = tmp_path / "methods_bundled.json"
    methods_table.write_table("bundled", path, progress=False)
    assert len(fake_run) == 16
    full = json.loads(path.read_text())
    # drop three rows and the slice, as an interrupted run leaves the file
    full["rows"] = [r for r in full["rows"] if not (r["bits"] == 3 and r["group_size"] == 128
                                                    and r["method"] != "rtn")]
    full["rows"][0]["kl_nats"] = 0.123          # a kept row must come back untouched
    full["slice"] = None
    path.write_text(json.dumps(full))
    fake_run.clear()
    out = methods_table.write_table("bundled", path, progress=False, resume=True)
    assert fake_run == [("gptq", 3, 128), ("gptq+act", 3, 128), ("awq", 3, 128)]
    assert [(r["method"], r["bits"], r["group_size"]) for r in out["rows"]] == _all_jobs()
    assert out["rows"][0]["kl_nats"] == 0.123
    assert out["slice"]["rows"] == [{"method": "live"}]
    assert json.loads(path.read_text())["rows"] == out["rows"]   # saved
    # nothing missing: nothing measured, the slice kept
    fake_run.clear()
    methods_table.write_table("bundled", path, progress=False, resume=True)
    assert fake_run == []


def test_resume_refuses_rows_of_another_protocol(fake_run, tmp_path):
    path = tmp_path / "methods_bundled.json"
    methods_table.write_table("bundled", path, progress=False)
    old = json.loads(path.read_text())
    old["calibration"]["windows"] = 7
    path.write_text(json.dumps(old))
    with pytest.raises(ValueError, match="another calibration"):
        methods_table.write_table("bundled", path, progress=False, resume=True)


def test_a_subset_of_methods_without_the_other_rows_says_what_to_do(fake_run, tmp_path):
    path = tmp_path / "methods_bundled.json"
    path.write_text(json.dumps({"rows": []}))
    with pytest.raises(KeyError, match="--resume"):
        methods_table.write_table("bundled", path, progress=False, methods=("rtn",))


def test_gptq_benchmark_command_writes_its_json(tmp_path):
    out = tmp_path / "bench.json"
    r = gptq.main(["--d", "128", "--tokens", "512", "--batch", "256", "--group-size", "32",
                   "--device", "cpu", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved == r
    assert (r["d"], r["n_tokens"], r["device"]) == (128, 512, "cpu")
    assert r["total_s"] == pytest.approx(r["hessian_s"] + r["quantize_s"], abs=2e-3)
    with pytest.raises(ValueError, match="multiple of batch"):
        gptq.benchmark_layer(128, 300, 256, device="cpu", warmup=False)


def test_smollm2_calibration_windows_share_no_passage_with_the_scored_windows():
    """The calibration windows, up to llm-compressor's 64 x 512 (lesson 06's reference), hold
    no 24-token run of the 8 scored evaluation windows, on the clean protocol the tables use.
    (On the first split, "v1", a 64-window set shared 466 of the 4096 scored tokens.)"""
    from course_lib import smollm
    from course_lib.methods import calibration as cal
    if not smollm.available():
        pytest.skip("SmolLM2 is not installed (course_lib.smollm.available() is False)")
    st = table.SETTINGS["smollm2"]
    assert table.PROTOCOL == smollm.DEFAULT_PROTOCOL == "clean"
    ids = cal.calibration_ids("smollm2", 64, st["calib_window"], protocol=table.PROTOCOL)
    assert ids.shape == (64, st["calib_window"])
    ev = smollm.eval_ids(table.PROTOCOL)[:st["eval_windows"] * st["eval_window"]].tolist()
    n = 24
    scored = {tuple(ev[i:i + n]) for i in range(len(ev) - n + 1)}
    for w in ids.tolist():
        assert not any(tuple(w[i:i + n]) in scored for i in range(len(w) - n + 1))


# ----------------------------------------------------------------------------- variants, bad input
def test_a_variant_table_holds_only_its_methods_and_names_its_options(monkeypatch, tmp_path):
    measured = []
    monkeypatch.setattr(table, "load_model", lambda name: (None, lambda m, n, w: _Ref()))
    monkeypatch.setattr(table.cal, "calibration_ids", lambda *a, **k: torch.zeros(1, 1))

    def fake_row(model, ref, m, ids, bits, gs, n_blocks=None, progress=False, spread=False,
                 **options):
        assert spread is False          # the bundled model's tables keep their means only
        measured.append((m, bits, gs, tuple(sorted(options.items()))))
        return {"method": m, "bits": bits, "group_size": gs, "kl_nats": 0.5, "seconds": 1.0}

    monkeypatch.setattr(table, "row", fake_row)
    monkeypatch.setattr(table, "slice_rows", lambda *a, **k: {"rows": [], **k})
    out = methods_table.write_table("bundled", tmp_path / "v.json", progress=False,
                            methods=("gptq",), grid="llm-compressor", group_sizes=(32,))
    assert measured == [("gptq", 4, 32, (("grid", "llm-compressor"),)),
                        ("gptq", 3, 32, (("grid", "llm-compressor"),))]
    assert out["options"] == {"grid": "llm-compressor"} and "absmax/7.5" in out["convention"]
    assert table.results_path("smollm2", "llm-compressor").name == \
        "methods_smollm2_llm-compressor.json"


@pytest.mark.parametrize("call, exc, match", [
    (lambda: table.load_table("opt"), ValueError, "unknown model"),
    (lambda: table.find([], "gptq", 4, 32), KeyError, "no row gptq W4 g32"),
    (lambda: table.quantize(None, "smoothquant", None, 4, 32), ValueError, "unknown method"),
    (lambda: table.results_path("bundled", "../x"), ValueError, "tag must be"),
    (lambda: methods_table._parse_option("inputs"), ValueError, "key=value"),
    (lambda: methods_table.write_table("bundled", grid="q8_0"), ValueError, "unknown grid"),
    (lambda: table.load_model("opt"), ValueError, "unknown model"),
])
def test_table_functions_refuse_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_options_parse_to_python_values():
    assert methods_table._parse_option("symmetric=False") == ("symmetric", False)
    assert methods_table._parse_option("n_grid=10") == ("n_grid", 10)
    assert methods_table._parse_option("inputs=fp") == ("inputs", "fp")


def test_rtn_takes_a_grid_option_and_rtn_asym_adds_a_zero_point():
    from course_lib.model import load_pretrained
    model = load_pretrained()
    sym, _ = table.quantize(model, "rtn", None, 4, 32)
    also, _ = table.quantize(model, "rtn", None, 4, 32, symmetric=False)   # an option passes through
    asym, _ = table.quantize(model, table.ASYM_METHOD, None, 4, 32)
    w = lambda m: m.model.layers[0].mlp.down_proj.dequantized()            # noqa: E731
    assert torch.equal(w(also), w(asym)) and not torch.equal(w(sym), w(asym))
