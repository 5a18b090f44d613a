"""course_lib.rotation_table and its command course_lib.experiments.rotation_table (lesson 16):
the rows without and with QuaRot's rotation.

Measured on the bundled model, 2 windows of 256 bytes (1 thread): the rotated float model's KL
against the plain one is 2e-9 in size (rounding); with residual channel 7 of the embeddings
grown 20x (an outlier channel every block reads), W4A4's KL is 0.94 without the rotation and
0.053 with it.
"""
import copy
import json
import math

import pytest
import torch
import torch.nn as nn

from course_lib import quant
from course_lib import rotate
from course_lib import rotation_table as RT
from course_lib.experiments import rotation_table as RTW

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def bundled():
    return RT.load_model("bundled")


@pytest.fixture(scope="module")
def ref(bundled):
    return RT.reference(bundled, "bundled", 2, 256)


@pytest.fixture(scope="module")
def rotated(bundled):
    return RT.prepare(bundled, True)


def _lin(inp=64, out=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    lin = nn.Linear(inp, out)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(out, inp, generator=g))
        lin.bias.copy_(torch.randn(out, generator=g))
    return lin


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("row", ["w3a3", "W4A4", "", None, 4])
def test_unknown_row_refused(row):
    with pytest.raises(ValueError, match="unknown row"):
        RT.get_row(row)


@pytest.mark.parametrize("weights,acts", [("int3", None), (None, "int2"), ("fp8", "int4"),
                                          (4, 4), ("int4", "INT4")])
def test_bad_formats_refused(weights, acts):
    with pytest.raises(ValueError, match="must be None .* or one of"):
        RT.ActQuantLinear(_lin(), weights, acts)


def test_nothing_to_quantize_and_block_sizes_refused():
    with pytest.raises(ValueError, match="nothing to quantize"):
        RT.ActQuantLinear(_lin(), None, None)
    with pytest.raises(ValueError, match="multiple of its block of 32"):
        RT.ActQuantLinear(_lin(inp=48), None, "mxfp4")
    with pytest.raises(ValueError, match="multiple of its block of 16"):
        RT.ActQuantLinear(_lin(inp=40), "nvfp4", None)
    with pytest.raises(TypeError, match="plain nn.Linear"):
        RT.ActQuantLinear(RT.ActQuantLinear(_lin(), "int4", None), "int4", "int4")
    with pytest.raises(ValueError, match="expects 64"):
        RT.ActQuantLinear(_lin(), "int4", "int4")(torch.randn(3, 32))


@pytest.mark.parametrize("fmt", RT.FORMATS)
def test_nan_activations_refused(fmt):
    x = torch.randn(4, 64)
    x[2, 5] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        RT.fake_quant_tokens(x, fmt)


def test_models_refused(bundled, rotated):
    with pytest.raises(TypeError, match="LlamaModel"):
        RT.check_model(nn.Linear(4, 4))
    with pytest.raises(ValueError, match="rotated already"):
        RT.check_model(rotated)
    with pytest.raises(ValueError, match="rotated already"):
        RT.prepare(rotated, True)
    with pytest.raises(ValueError, match="rotated already"):
        RT.live_slice(rotated, "bundled")
    with pytest.raises(TypeError, match="not a plain nn.Linear"):
        RT.check_model(RT.quantize(bundled, "w4a4"))
    with pytest.raises(TypeError, match="LlamaModel"):
        RT.check_model(RT.quantize(bundled, "kv4"))                 # a WithCache wrapper
    with pytest.raises(TypeError, match="True or False"):
        RT.prepare(bundled, "yes")
    with pytest.raises(TypeError, match="LlamaModel"):
        RT.quantize("bundled", "w4a4")


def test_calibration_needed_and_smoothquant_only_plain(bundled, rotated):
    with pytest.raises(ValueError, match="pass calib_ids"):
        RT.quantize(bundled, "w4a16-gptq")
    with pytest.raises(ValueError, match="pass calib_ids"):
        RT.quantize(bundled, "w8a8-sq0.5", torch.rand(2, 16))
    with pytest.raises(ValueError, match="pass calib_ids"):
        RT.quantize(bundled, "w8a8-sq0.5", torch.arange(16))        # 1-D, not (n, T)
    with pytest.raises(ValueError, match="beside the rotation"):
        RT.quantize(rotated, "w8a8-sq0.5", torch.zeros(2, 16, dtype=torch.long))


def test_kv_and_names_refused(bundled):
    with pytest.raises(ValueError, match="unknown KV format"):
        RT.kv_cache(bundled.config, "int2-token")
    for bits in (1, 9, 4.0, True):
        with pytest.raises(ValueError, match="bits must be"):
            RT.TokenKV4Cache(bundled.config, bits)
    with pytest.raises(ValueError, match="unknown model"):
        RT.reference(bundled, "llama", 1, 256)
    with pytest.raises(ValueError, match="n_windows"):
        RT.reference(bundled, "bundled", 0, 256)
    with pytest.raises(ValueError, match="unknown model"):
        RTW.write_table("llama")
    with pytest.raises(ValueError, match="n_windows"):
        RTW.write_table("bundled", n_windows=0)
    with pytest.raises(ValueError, match="rows is empty"):
        RTW.write_table("bundled", rows=[])
    with pytest.raises(ValueError, match="unknown row"):
        RTW.write_table("bundled", rows=["w2a2"])
    with pytest.raises(ValueError, match="unknown model"):
        RT.load_table("llama")
    with pytest.raises(ValueError, match="calibrate"):
        RT.live_slice(bundled, "bundled", rows=["w4a16-gptq"])
    with pytest.raises(ValueError, match="rows is empty"):
        RT.live_slice(bundled, "bundled", rows=[])


def test_resume_refuses_another_protocol(tmp_path):
    path = tmp_path / "rotation_bundled.json"
    path.write_text(json.dumps({"protocol": {"name": "v1"}, "rotation": {"seed": 0},
                                "rows": []}))
    with pytest.raises(ValueError, match="another protocol"):
        RTW.write_table("bundled", path=path, resume=True, progress=False)


# ----------------------------------------------------------------------------- quantizers
def test_w8a8_matches_lesson_08():
    """INT8 weights per channel and activations per token: lesson 08's W8A8Linear (exact int32
    sums), to float32 rounding."""
    from course_lib.methods.w8a8 import W8A8Linear
    lin = _lin(128, 40)
    x = torch.randn(2, 7, 128, generator=torch.Generator().manual_seed(1))
    a, b = RT.ActQuantLinear(lin, "int8", "int8")(x), W8A8Linear(lin)(x)
    assert (a - b).abs().max() <= 1e-5 * b.abs().max()


def test_int_rows_use_course_quantizer():
    w = torch.randn(24, 64)
    x = torch.randn(5, 64)
    assert torch.equal(RT.fake_quant_weight(w, "int4"), quant.fake_quantize(w, "int4",
                                                                            "per_channel"))
    assert torch.equal(RT.fake_quant_tokens(x, "int4"), quant.fake_quantize(x, "int4",
                                                                            "per_token"))
    assert torch.equal(RT.fake_quant_tokens(x, "mxfp4"),
                       quant.dequantize(quant.quantize_mxfp4(x)))
    assert torch.equal(RT.fake_quant_weight(w, "nvfp4"),
                       quant.dequantize(quant.quantize_nvfp4(w)))
    assert len(torch.unique(RT.fake_quant_tokens(x, "int4")[0] /
                            (x[0].abs().max() / 7))) <= 15                 # codes -7..7


def test_nvfp4_tokens_are_independent_of_the_batch():
    """One FP32 scale per token: a token quantizes the same alone or beside a far larger one,
    and as quant.quantize_nvfp4 quantizes it on its own (to one rounding of x / max|x|)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 64, generator=g)
    big = 1e4 * torch.randn(1, 64, generator=g)
    both = RT.fake_quant_tokens(torch.cat([x, big]), "nvfp4")
    assert torch.equal(both[:3], RT.fake_quant_tokens(x, "nvfp4"))
    for i in range(3):
        alone = quant.dequantize(quant.quantize_nvfp4(x[i:i + 1]))
        assert torch.allclose(both[i:i + 1], alone, rtol=1e-6, atol=1e-7)
    zero = RT.fake_quant_tokens(torch.zeros(2, 32), "nvfp4")
    assert torch.equal(zero, torch.zeros(2, 32))


def test_shared_input_changes_nothing(bundled, ref):
    """q, k and v (and gate, up) quantize their common input once: the same logits as each
    Linear quantizing it on its own."""
    shared = RT.act_quant_model(bundled, "int4", "int4")
    alone = copy.deepcopy(shared)
    for m in alone.modules():
        if isinstance(m, RT.ActQuantLinear):
            m.shared = None
    ids = ref.ids[:257][None, :-1]
    with torch.no_grad():
        assert torch.equal(shared(ids), alone(ids))
    n = sum(isinstance(m, RT.ActQuantLinear) for m in shared.modules())
    assert n == 7 * bundled.config.num_hidden_layers
    assert type(shared.lm_head) is nn.Linear and type(shared.model.embed_tokens) is nn.Embedding


def test_gptq_rows_share_one_gptq_run(bundled, monkeypatch):
    """w4a16-gptq, w4a8-gptq, w4a4-gptq and w4a4-kv4 quantize one GPTQ model of each base; its
    Linears keep their GPTQ weights and get their inputs quantized."""
    from course_lib.methods import gptq
    from course_lib.methods.calibration import GroupQuantLinear
    calls, real = [], gptq.gptq_model
    monkeypatch.setattr(gptq, "gptq_model", lambda *a, **k: calls.append(1) or real(*a, **k))
    memo, calib = {}, RT.calibration("bundled", 2, 64)
    w = RT.quantize(bundled, "w4a16-gptq", calib, memo=memo)
    a4 = RT.quantize(bundled, "w4a4-gptq", calib, memo=memo)
    full = RT.quantize(bundled, "w4a4-kv4", calib, memo=memo)
    assert len(calls) == 1
    q_w, q_a = w.model.layers[0].self_attn.q_proj, a4.model.layers[0].self_attn.q_proj
    assert type(q_w) is GroupQuantLinear and type(q_a) is RT.ActQuantLinear
    assert torch.equal(q_a.weight, q_w.weight) and q_a.acts == "int4" and q_a.weights is None
    assert isinstance(full, RT.WithCache) and isinstance(full.cache, RT.TokenKV4Cache)
    assert type(w.model.layers[0].self_attn.q_proj) is GroupQuantLinear    # memo not changed
    with pytest.raises(ValueError, match="quantized already"):
        RT.ActQuantLinear(q_w, "int4", "int4")


def test_kv_cache_sees_rotated_keys(bundled, rotated):
    """The rotated model hands the cache keys rotated after RoPE: their incoherence drops."""
    seen = {}

    class Grab(RT.TokenKV4Cache):
        def attend(self, layer, q, k, v):
            seen.setdefault(self.name, []).append(k.detach())
            return super().attend(layer, q, k, v)

    ids = torch.randint(0, 256, (1, 128), generator=torch.Generator().manual_seed(0))
    for name, m in (("plain", bundled), ("rotated", rotated)):
        cache = Grab(m.config, 8)
        cache.name = name
        with torch.no_grad():
            RT.WithCache(m, cache)(ids)
    inc = {n: float(torch.stack([rotate.incoherence(k.reshape(-1, k.shape[-1])).mean()
                                 for k in ks]).mean()) for n, ks in seen.items()}
    assert inc["rotated"] < inc["plain"]


# ----------------------------------------------------------------------------- rows
def test_rotated_float_row_equals_unrotated(bundled, rotated, ref):
    """The rotation alone changes nothing but rounding (the table's fp row)."""
    ids = ref.ids[:257][None, :-1]
    with torch.no_grad():
        a, b = bundled(ids), RT.quantize(rotated, "fp")(ids)
    assert (a - b).abs().max() <= 1e-4
    r = RT.score(RT.quantize(rotated, "fp"), ref)
    assert abs(r["kl_nats"]) < 1e-7 and r["top1_agreement"] >= 0.999
    assert r["perplexity"] == pytest.approx(ref.perplexity, rel=1e-5)


def test_8_bit_cache_is_near_lossless(bundled, rotated, ref):
    for base in (bundled, rotated):
        r = RT.score(RT.WithCache(base, RT.TokenKV4Cache(base.config, 8)), ref)
        assert r["kl_nats"] < 1e-3 and r["top1_agreement"] > 0.98


def test_w4a4_rotation_beats_plain_on_an_outlier_channel(bundled):
    """An outlier channel in the residual stream (embedding column 7 grown 20x): per-token INT4
    activations lose every other channel of each token to it; the rotation spreads it."""
    m = copy.deepcopy(bundled)
    with torch.no_grad():
        m.model.embed_tokens.weight[:, 7] *= 20
    ref = RT.reference(m, "bundled", 2, 256)
    bases = {"plain": m, "rotated": RT.prepare(m, True)}
    r = RT.measure_row(bases, RT.ROWS["w4a4"], ref, None, None, False)
    plain, rot = r["plain"]["kl_nats"], r["rotated"]["kl_nats"]
    assert plain > 0.3 and rot < plain / 5                      # measured 0.94 and 0.053
    assert r["rotated_minus_plain"]["kl_nats"]["a_better"] == 2
    assert r["rotated"]["top1_agreement"] > r["plain"]["top1_agreement"]


def test_every_row_builds_and_runs(bundled, rotated, ref):
    """Every row on both bases (SmoothQuant: plain only), one window of 64 bytes."""
    ids = ref.ids[:65][None, :-1]
    calib = RT.calibration("bundled", 2, 64)
    for row in RT.ROWS.values():
        for base in ((bundled, rotated) if row.rotated_too else (bundled,)):
            qm = RT.quantize(base, row, calib, 1)
            with torch.no_grad():
                out = qm(ids)
            assert out.shape == (1, 64, 256) and bool(torch.isfinite(out).all()), row.name


# ----------------------------------------------------------------------------- the JSON
def _check_score(s, n_windows):
    for k in ("perplexity", "kl_nats", "top1_agreement", "bits_per_byte", "seconds"):
        assert isinstance(s[k], float) and math.isfinite(s[k]), k
    assert set(s["windows"]) == {"kl_nats", "top1_agreement", "nll_nats"}
    assert all(len(v) == n_windows for v in s["windows"].values())
    if n_windows >= 2:
        assert s["interval"]["kl_nats"][0] <= s["kl_nats"] <= s["interval"]["kl_nats"][1]
    assert s["kl_nats"] == pytest.approx(sum(s["windows"]["kl_nats"]) / n_windows, rel=1e-6)


def _check_table(t, model_name, n_windows, rows):
    assert t["model"] == model_name
    assert t["command"].startswith(f"{RTW.COMMAND} --model {model_name}")
    assert t["protocol"]["n_windows"] == n_windows
    assert t["rotation"]["seed"] == RT.SEED and t["rotation"]["steps"][0] == "fold_norms"
    assert {"cpu", "torch", "threads"} <= set(t["machine"]) and t["torch"] == torch.__version__
    assert t["note"] and t["reference"]["perplexity"] > 1
    assert [r["row"] for r in t["rows"]] == rows
    for r in t["rows"]:
        row = RT.ROWS[r["row"]]
        _check_score(r["plain"], n_windows)
        if row.rotated_too:
            _check_score(r["rotated"], n_windows)
            c = r["rotated_minus_plain"]["kl_nats"]
            assert c["diff"] == pytest.approx(r["rotated"]["kl_nats"] - r["plain"]["kl_nats"],
                                              rel=1e-5, abs=1e-8)   # float32 means
            assert c["n_windows"] == n_windows and 0 <= c["a_better"] <= n_windows
        else:
            assert r["rotated"] is None and r["rotated_minus_plain"] is None
    sl = t["slice"]
    assert [r["row"] for r in sl["rows"]] == list(RT.SETTINGS[model_name]["slice"]["rows"])
    assert t["seconds_total"] > 0


def test_write_table_schema_and_subset(tmp_path):
    path = tmp_path / "rotation_bundled.json"
    t = RTW.write_table("bundled", path=path, rows=["fp", "w8a8-sq0.5"], n_windows=2,
                       calib_windows=2, progress=False)
    _check_table(t, "bundled", 2, ["fp", "w8a8-sq0.5"])
    assert json.loads(path.read_text()) == json.loads(json.dumps(t))
    # a subset keeps the file's other rows; the table's order is ROWS'
    t2 = RTW.write_table("bundled", path=path, rows=["w4a4"], n_windows=2, calib_windows=2,
                        progress=False)
    _check_table(t2, "bundled", 2, ["fp", "w4a4", "w8a8-sq0.5"])
    assert t2["rows"][0] == t["rows"][0]
    text = RT.format_table(t2["rows"])
    assert "w4a4" in text and text.count("\n") == 3


def test_committed_bundled_table():
    t = RT.load_table("bundled")
    st = RT.SETTINGS["bundled"]
    _check_table(t, "bundled", st["eval_windows"], list(RT.ROWS))
    assert t["protocol"]["window_tokens"] == st["eval_window"]
    assert "general_case" not in t
    assert abs(RT.find(t, "fp")["rotated"]["kl_nats"]) < 1e-6
    with pytest.raises(KeyError, match="no row"):
        RT.find({"rows": []}, "fp")


def test_live_slice_reuses_a_rotated_model(bundled, rotated):
    """The lesson's own quarot copy is used as it is; a copy of another model is refused."""
    a = RT.live_slice(bundled, "bundled", rows=["a4"], n_windows=1, rotated=rotated)
    b = RT.live_slice(bundled, "bundled", rows=["a4"], n_windows=1)
    assert a == b
    with pytest.raises(ValueError, match="quarot"):
        RT.live_slice(bundled, "bundled", rows=["a4"], n_windows=1,
                      rotated=rotate.fold_norms(bundled))
    other = copy.deepcopy(bundled)
    with torch.no_grad():
        other.model.embed_tokens.weight.mul_(1.5)
    with pytest.raises(ValueError, match="same function"):
        RT.live_slice(bundled, "bundled", rows=["a4"], n_windows=1,
                      rotated=RT.prepare(other, True))


def test_committed_slice_recomputes(bundled):
    """What the lesson does: the slice, live, against the committed one."""
    t = RT.load_table("bundled")
    live = RT.live_slice(bundled, "bundled")
    for a, b in zip(live["rows"], t["slice"]["rows"]):
        for key in ("plain", "rotated"):
            for k in ("kl_nats", "top1_agreement", "perplexity"):
                assert a[key][k] == pytest.approx(b[key][k], rel=2e-2, abs=1e-4), (a["row"], k)


def test_reference_pairs_put_llm_compressors_recipes_beside_the_course_rows():
    """Synthetic record: each pair reads the course's row and llm-compressor's three recipes of
    the same scheme, and pairs the two rotated models window by window; a recipe that failed
    (or is missing) leaves None, never a number from another recipe."""
    table = RT.load_table("smollm2")
    w = lambda v: {"kl_nats": v, "windows": {"kl_nats": [v] * 8}}  # noqa: E731
    rec = {"rows": {"w8a8 rtn": w(0.03), "w8a8 spinquant_r1-r4+rtn": w(0.01),
                    "w8a8 quip+rtn": w(0.002),
                    "w4a4 rtn": w(6.0), "w4a4 spinquant_r1-r4+rtn": {"error": "boom"}}}
    pairs = {p["label"]: p for p in RT.reference_pairs(table, rec)}
    assert [p[0] for p in RT.REFERENCE_PAIRS] == list(pairs)
    p = pairs["W8A8"]
    course = RT.find(table, "w8a8")
    assert p["course_plain"] == course["plain"]["kl_nats"]
    assert p["course_rotated"] == course["rotated"]["kl_nats"]
    assert (p["llmc_plain"], p["llmc_quarot"], p["llmc_quip"]) == (0.03, 0.01, 0.002)
    c = p["course_minus_llmc"]
    assert c["n_windows"] == 8
    assert c["diff"] == pytest.approx(course["rotated"]["kl_nats"] - 0.01)
    q = pairs["W4A4 RTN"]
    assert q["llmc_plain"] == 6.0 and q["llmc_quarot"] is None and q["course_minus_llmc"] is None
    assert pairs["W4A16 GPTQ g32"]["llmc_plain"] is None
    off = pairs["W4A16 RTN g32, off grid"]
    assert off["course_plain"] == RT.find(table, "w4a16-rtn", general=True)["plain"]["kl_nats"]
    text = RT.format_reference(list(pairs.values()))
    assert "W8A8" in text and "QuIP" in text and len(text.splitlines()) == 2 + len(pairs)


def test_committed_smollm2_table():
    """results/rotation_smollm2.json: every row on the clean protocol's 8 windows, the weight
    rows again off the Q4_1 grid, the live slice, and calibration text disjoint from the
    scored text (the split is course_lib.data.clean_split's; checked in tests/test_protocol)."""
    t = RT.load_table("smollm2")
    st = RT.SETTINGS["smollm2"]
    _check_table(t, "smollm2", st["eval_windows"], list(RT.ROWS))
    assert t["protocol"]["name"] == "clean" and t["protocol"]["window_tokens"] == st["eval_window"]
    assert t["protocol"]["calibration"]["windows"] == st["calib_windows"]
    assert "clean_split()[0]" in t["protocol"]["calibration"]["text"]
    assert "clean_split()[1]" in t["protocol"]["text"]
    g = t["general_case"]
    assert [r["row"] for r in g["rows"]] == list(RT.GENERAL_ROWS)
    for r in g["rows"]:
        _check_score(r["plain"], st["eval_windows"])
        _check_score(r["rotated"], st["eval_windows"])
    assert abs(RT.find(t, "fp")["rotated"]["kl_nats"]) < 1e-6
