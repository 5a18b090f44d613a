"""course_lib.own_kmix: a k-quant mix for your own checkpoint by measured layer-local
sensitivity, one decoder layer in memory (lesson 17, lesson 14's allocation).

Tiny checkpoints written by the course's own save_pretrained (hidden size 256 and an MLP 512
wide, so every k-quant fits), a few seconds each; the committed SmolLM2 validation file is
checked against its own rows (skipped when absent).
"""
from __future__ import annotations

import gc
import json
import math
import weakref

import pytest
import torch

from course_lib import imatrix as imx_lib
from course_lib import kmix, kquants, own_kmix as K, own_model, sensitivity
from course_lib.model import LlamaModel, ModelConfig, save_pretrained

CFG = dict(vocab_size=128, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def build(folder, tied=True, poison=None):
    """A random course model saved as a Hugging Face folder in fp32; ``poison``: the name of
    a weight set to NaN at one entry."""
    torch.manual_seed(0)
    m = LlamaModel(ModelConfig(**CFG, tie_word_embeddings=tied))
    if poison is not None:
        with torch.no_grad():
            m.get_parameter(poison)[0, 0] = float("nan")
    save_pretrained(m, folder, dtype=torch.float32)
    return folder


def ids(n=2, T=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, CFG["vocab_size"], (n, T), generator=g)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = build(tmp_path_factory.mktemp("tied"))
    return folder, K.scan(folder, ids(), progress=False)


# ----------------------------------------------------------------------------- the scan
def test_the_scan_holds_one_layer_at_a_time(tmp_path, monkeypatch):
    folder = build(tmp_path)
    real, calls, alive = own_model.load_layer, [], []

    def spy(source, i, *a, **kw):
        gc.collect()
        held = [j for j, ref in alive if ref() is not None]
        assert not held, f"layer {held} still in memory when layer {i} is loaded"
        block = real(source, i, *a, **kw)
        calls.append(i)
        alive.append((i, weakref.ref(block)))
        return block

    def whole(*a, **kw):
        raise AssertionError("the scan must not load the whole model")
    monkeypatch.setattr(own_model, "load_layer", spy)
    monkeypatch.setattr(own_model, "load", whole)
    res = K.scan(folder, ids(), formats=("q4_k", "q8_0"), progress=False)
    assert calls == [0, 1, 2]                              # each layer read once, in order
    assert [r["tensor"] for r in res["rows"][:7]] == \
        [f"blk.0.{k}.weight" for k in ("attn_q", "attn_k", "attn_v", "attn_output",
                                       "ffn_gate", "ffn_up", "ffn_down")]
    assert len(res["rows"]) == 21 and set(res["imatrix"]) == {r["tensor"] for r in res["rows"]}


def test_costs_are_non_negative_and_larger_for_fewer_bits(tiny):
    _, res = tiny
    for r in res["rows"]:
        for m in K.MEASURES:
            c = r["costs"][m]
            assert set(c) == set(sensitivity.CANDIDATES)          # 256 and 512 wide: all fit
            assert all(math.isfinite(v) and v >= 0 for v in c.values())
            # each extra bit cuts the rounding error ~4x (measured 3-5x on these weights), so
            # the order is strict with a wide margin, no tolerance needed
            for lo, hi in (("q4_0", "q5_0"), ("q5_0", "q8_0"), ("q4_1", "q5_1"),
                           ("q5_1", "q8_0"), ("q4_k", "q5_k"), ("q5_k", "q6_k"),
                           ("q6_k", "q8_0")):
                assert c[lo] > c[hi], (r["tensor"], m, lo, hi)
        assert r["cost"] == r["costs"][K.MEASURES[0]]
        assert r["bytes"] == {f: r["shape"][0] * kquants.row_bytes(f, r["shape"][1])
                              for f in sensitivity.CANDIDATES}


def test_a_cost_is_the_measured_change_of_the_layers_output(tiny):
    """Recompute one cost on the whole model in memory: the float model to layer 1's input,
    layer 1 with its ffn_up alone rounded (with its importance vector), the change over the
    final residual stream per token."""
    folder, res = tiny
    m = own_model.load(folder)
    x = m.model.embed_tokens(ids())
    cos, sin = m.rope(0, x.shape[1])
    row = next(r for r in res["rows"] if r["tensor"] == "blk.1.ffn_up.weight")
    with torch.no_grad():
        h = [x]
        for b in m.model.layers:
            h.append(b(h[-1], cos, sin))
        lin = m.model.layers[1].mlp.up_proj
        w = lin.weight.data
        lin.weight.data = sensitivity.roundtrip(w, "q5_k", res["imatrix"]["blk.1.ffn_up.weight"])
        y_q = m.model.layers[1](h[1], cos, sin)
        lin.weight.data = w
    e = ((y_q - h[2]).double() ** 2).sum(-1)
    want = {"final": float((e / (h[3].double() ** 2).sum(-1)).mean()),
            "token": float((e / (h[2].double() ** 2).sum(-1)).mean()),
            "layer": float(e.sum() / (h[2].double() ** 2).sum())}
    for name, v in want.items():
        # the same fp32 arithmetic in another order (whole model vs one block): 1e-5 relative
        assert row["costs"][name]["q5_k"] == pytest.approx(v, rel=1e-5), name


def test_importance_vectors_are_llama_imatrix_means_on_the_same_windows(tiny):
    folder, res = tiny
    want = imx_lib.gguf_names(imx_lib.collect(own_model.load(folder), ids()))
    assert set(want) == set(res["imatrix"])
    for name, v in want.items():
        # fp32 means, accumulated in float64 in both: agreement to fp32 rounding
        assert torch.allclose(torch.as_tensor(res["imatrix"][name]), torch.as_tensor(v),
                              rtol=1e-5, atol=0), name


# ----------------------------------------------------------------------------- the plan
def _spent(res, p):
    """Every upgrade that would still lower the cost adds more bytes than the budget leaves."""
    for r in res["rows"]:
        f0 = p["types"][r["tensor"]]
        for f, b in r["bytes"].items():
            if b > r["bytes"][f0] and r["cost"][f] < r["cost"][f0]:
                assert p["bytes"] + b - r["bytes"][f0] > p["budget_bytes"], (r["tensor"], f)


@pytest.mark.parametrize("budget", [dict(), dict(bits_per_weight=4.6),
                                    dict(bits_per_weight=6.0), dict(budget_bytes=1_300_001)])
def test_the_plan_keeps_to_its_budget_to_the_byte_and_spends_it(tiny, budget):
    folder, res = tiny
    p = K.plan(res, **budget)
    cfg = own_model.own_config(folder)
    shapes = K._file_shapes(cfg)
    assert set(p["types"]) == set(shapes)
    assert p["bytes"] == kmix.file_bytes(p["types"], shapes) + 4 * K._f32_weights(cfg)
    assert p["bytes"] <= p["budget_bytes"]
    _spent(res, p)
    assert p["types"]["token_embd.weight"] == "q6_k"         # the tied head, as Q4_K_M
    # Q4_K_M's own rule, priced as own_model prices a llama.cpp Q4_K_M file
    assert p["q4_k_m"]["bytes"] == own_model._gguf_bytes(cfg, "q4_k_m")
    if not budget:
        assert p["budget_bytes"] == p["q4_k_m"]["bytes"]
    if "bits_per_weight" in budget:
        n = sum(math.prod(s) for s in shapes.values()) + K._f32_weights(cfg)
        assert p["budget_bytes"] == int(budget["bits_per_weight"] * n // 8)
    assert p["estimated_cost"] == pytest.approx(
        sum(r["cost"][p["types"][r["tensor"]]] for r in res["rows"]), rel=1e-12)


def test_an_untied_head_is_priced_as_llama_cpp_prices_it(tmp_path):
    folder = build(tmp_path, tied=False)
    res = K.scan(folder, ids(), formats=("q4_k", "q6_k", "q8_0"), progress=False)
    p = K.plan(res)
    assert p["types"]["output.weight"] == "q6_k" and p["types"]["token_embd.weight"] == "q4_k"
    assert p["q4_k_m"]["bytes"] == own_model._gguf_bytes(own_model.own_config(folder), "q4_k_m")
    _spent(res, p)


def test_a_budget_below_the_smallest_mix_is_refused_with_the_smallest(tiny):
    folder, res = tiny
    cfg = own_model.own_config(folder)
    least = sum(min(r["bytes"].values()) for r in res["rows"]) + \
        kquants.row_bytes("q6_k", 256) * 128 + 4 * K._f32_weights(cfg)
    with pytest.raises(ValueError, match=f"the smallest is {least:,} bytes"):
        K.plan(res, budget_bytes=least - 1)
    assert K.plan(res, budget_bytes=least)["bytes"] == least
    with pytest.raises(ValueError, match="the smallest is"):
        K.plan(res, bits_per_weight=2.0)


@pytest.mark.parametrize("kw, err, says", [
    (dict(bits_per_weight=float("nan")), ValueError, "finite"),
    (dict(bits_per_weight=-1), ValueError, "> 0"),
    (dict(budget_bytes=1.5), ValueError, "whole number"),
    (dict(bits_per_weight=5, budget_bytes=10**6), ValueError, "not both")])
def test_bad_budgets_are_refused(tiny, kw, err, says):
    with pytest.raises(err, match=says):
        K.plan(tiny[1], **kw)


def test_a_nan_cost_or_a_wrong_object_is_refused(tiny):
    res = json.loads(json.dumps({k: v for k, v in tiny[1].items() if k != "imatrix"}))
    res["rows"][3]["cost"]["q5_k"] = float("nan")
    with pytest.raises(ValueError, match="blk.0.attn_output.weight.*finite"):
        K.plan(res)
    with pytest.raises(TypeError, match="what own_kmix.scan returns"):
        K.plan(res["rows"])


# ----------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize("bad, says", [
    (ids()[0], "windows, tokens"),                                 # one window, 1-D
    (ids().float(), "int64"),
    (ids() + 1000, "another model's tokenizer"),
    (torch.zeros(1, 65, dtype=torch.long), "context")])
def test_bad_ids_are_refused(tiny, bad, says):
    with pytest.raises(ValueError, match=says):
        K.scan(tiny[0], bad, progress=False)


@pytest.mark.parametrize("formats, err, says", [
    (("q4_k", "q4_k_m"), ValueError, "unknown format 'q4_k_m'"),
    (("q3_k",), ValueError, "unknown format"),
    ((), ValueError, "empty"),
    ("q4_k", TypeError, "not the string")])
def test_unknown_formats_are_refused(tiny, formats, err, says):
    with pytest.raises(err, match=says):
        K.scan(tiny[0], ids(), formats=formats, progress=False)


def test_a_nan_weight_is_refused_naming_the_tensor(tmp_path):
    folder = build(tmp_path, poison="model.layers.1.mlp.up_proj.weight")
    with pytest.raises(ValueError, match="layer 1's mlp.up_proj.weight holds NaN"):
        K.scan(folder, ids(), formats=("q8_0",), progress=False)


def test_evaluation_windows_are_refused():
    from course_lib import smollm, stream
    if not (smollm.model_dir() / "tokenizer.json").is_file():
        pytest.skip("SmolLM2 is not converted here")
    ev = stream.eval_ids(smollm.model_dir(), n_windows=2, window=64)
    with pytest.raises(ValueError, match="evaluation text"):
        K.scan(smollm.model_dir(), ev, progress=False)


# ----------------------------------------------------------------------------- validation
def test_spearman_and_the_top_overlap():
    assert K.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)    # 1 - 6*2/(4*15)
    assert K.spearman([1, 2, 2, 3], [10, 20, 20, 30]) == pytest.approx(1.0)   # ties, same ranks
    assert K.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert K.top_overlap({"a": 3, "b": 2, "c": 1}, {"a": 1, "b": 2, "c": 3}, k=2) == 1
    with pytest.raises(ValueError, match="NaN"):
        K.spearman([1, float("nan")], [1, 2])


def test_the_smollm2_validation_file_agrees_with_its_rows():
    if not K.RESULTS_FILE.is_file():
        pytest.skip(f"{K.RESULTS_FILE.name} not written: python -m course_lib.own_kmix --validate")
    rec = json.loads(K.RESULTS_FILE.read_text())
    assert rec["command"] == K.COMMAND and rec["machine"]["cpu"]
    committed = {r["tensor"]: r for r in sensitivity.load_scan()["rows"]}
    rows = rec["rows"]
    assert len(rows) == len(committed) == 210            # 30 layers x 7 Linears
    for r in rows:
        assert r["committed_kl"] == committed[r["tensor"]]["kl_mean"]
        assert r["format"] == committed[r["tensor"]]["format"]
        assert r["cost"] == r["costs"][rec["measure"]]
    for m in K.MEASURES:
        for label, get in ((m, lambda r: r["costs"][m][r["format"]]),
                           (f"{m}, rounded without imatrix", lambda r: r["plain_low"][m])):
            got = K.agreement([{**r, "cost_low": get(r)} for r in rows])
            want = rec["figures"][label]
            # the same numbers through the same float64 arithmetic: equal to rounding
            assert got["spearman"] == pytest.approx(want["spearman"], abs=1e-12)
            assert got["top10_overlap"] == want["top10_overlap"]
            for k, v in want["per_kind"].items():
                assert got["per_kind"][k] == pytest.approx(v, abs=1e-12)
    base = K.agreement([{**r, "cost_low": committed[r["tensor"]]["weighted_error"][r["format"]]}
                        for r in rows])
    assert base["spearman"] == pytest.approx(rec["figures"][K.BASELINE]["spearman"], abs=1e-12)
    assert base["top10_overlap"] == rec["figures"][K.BASELINE]["top10_overlap"]
