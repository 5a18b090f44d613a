"""Lesson 14's importance matrix, sensitivity scan and bit allocation (course_lib.imatrix,
course_lib.sensitivity, course_lib.kmix_table; their writers are in course_lib.experiments), on
small inputs that run in seconds."""
import numpy as np
import pytest
import torch

from course_lib import imatrix, kmix_table, sensitivity, smollm
from course_lib.methods import gptq
from course_lib.model import LlamaModel, ModelConfig


def test_importance_is_half_the_gptq_hessian_diagonal():
    x = torch.randn(3, 40, 24) * torch.linspace(0.1, 5, 24)
    v = imatrix.from_inputs(x)
    assert v.shape == (24,) and v.dtype == torch.float32
    H = gptq.hessian(x.reshape(-1, 24))
    assert torch.allclose(torch.diagonal(H) / 2, v, rtol=1e-5)
    with pytest.raises(ValueError, match="NaN or inf"):
        imatrix.from_inputs(torch.full((4, 3), float("inf")))
    with pytest.raises(ValueError, match="captured inputs"):
        imatrix.from_inputs(torch.ones(5))


def test_weighted_error_is_the_output_error_for_uncorrelated_inputs():
    """With X^T X / N diagonal (orthogonal columns), mean ||dW x||^2 = sum_j imx_j ||dW_j||^2."""
    g = torch.Generator().manual_seed(0)
    N, d = 64, 8
    Q, _ = torch.linalg.qr(torch.randn(N, d, generator=g, dtype=torch.float64))
    X = Q * torch.linspace(1, 4, d, dtype=torch.float64) * N ** 0.5        # (N, d)
    w = torch.randn(5, d, generator=g, dtype=torch.float64)
    w_q = w + 0.01 * torch.randn(5, d, generator=g, dtype=torch.float64)
    out_err = float((((w_q - w) @ X.T) ** 2).sum(0).mean())
    assert imatrix.weighted_error(w, w_q, imatrix.from_inputs(X).double()) == \
        pytest.approx(out_err, rel=1e-5)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=50, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=96, max_position_embeddings=64)
    return LlamaModel(cfg).eval()


def test_collect_matches_captured_inputs(tiny):
    ids = torch.randint(0, 50, (2, 16))
    imx = imatrix.collect(tiny, ids)
    assert set(imx) == {n for n, m in tiny.named_modules()
                        if isinstance(m, torch.nn.Linear) and ".layers." in f".{n}."}
    from course_lib import activations
    x = activations.capture_linear_inputs(tiny, ids, names=["model.layers.1.mlp.down_proj"])
    assert torch.allclose(imx["model.layers.1.mlp.down_proj"],
                          imatrix.from_inputs(x["model.layers.1.mlp.down_proj"]), rtol=1e-5)
    with pytest.raises(ValueError, match="token ids"):
        imatrix.collect(tiny, torch.randn(2, 4))


def test_gguf_names():
    v = torch.ones(3)
    out = imatrix.gguf_names({"model.layers.7.mlp.down_proj": v,
                              "model.layers.0.self_attn.q_proj": v})
    assert set(out) == {"blk.7.ffn_down.weight", "blk.0.attn_q.weight"}
    with pytest.raises(ValueError, match="not a decoder-layer Linear"):
        imatrix.gguf_names({"lm_head": v})


def test_scanner_reuses_layers_and_matches_a_full_forward(tiny):
    ids = torch.randint(0, 50, (2, 12))
    sc = sensitivity.Scanner(tiny, ids)
    W = tiny.model.layers[1].mlp.up_proj.weight.detach().clone()
    kl0, top0 = sc.kl(1, "ffn_up", W)
    assert max(kl0) < 1e-6 and min(top0) == 1.0
    W2 = W + 0.05 * torch.randn_like(W)
    kl, _ = sc.kl(1, "ffn_up", W2)
    assert torch.equal(tiny.model.layers[1].mlp.up_proj.weight, W)      # restored
    with torch.no_grad():
        ref = torch.log_softmax(tiny(ids[:, :-1]), -1)
        tiny.model.layers[1].mlp.up_proj.weight.data = W2
        lp = torch.log_softmax(tiny(ids[:, :-1]), -1)
        tiny.model.layers[1].mlp.up_proj.weight.data = W
    full = (ref.exp() * (ref - lp)).sum(-1).mean(-1)
    assert np.allclose(kl, full.tolist(), rtol=1e-4, atol=1e-9)


def _tables():
    costs = {"a": {"q4_0": 1.0, "q5_0": 0.3, "q8_0": 0.0},
             "b": {"q4_0": 0.2, "q5_0": 0.05, "q8_0": 0.0},
             "c": {"q4_0": 0.5, "q5_0": 0.5, "q8_0": 0.4}}
    sizes = {t: {"q4_0": 180, "q5_0": 220, "q8_0": 340} for t in costs}
    return costs, sizes


def test_allocate_fits_the_budget_and_improves_with_it():
    costs, sizes = _tables()
    least = sensitivity.smallest(sizes)
    assert least == 540
    last = None
    for budget in range(least, 3 * 340 + 1, 20):
        pick = sensitivity.allocate(costs, sizes, budget)
        assert sum(sizes[t][f] for t, f in pick.items()) <= budget
        cost = sensitivity.estimated_cost(costs, pick)
        assert last is None or cost <= last + 1e-12
        last = cost
    assert sensitivity.allocate(costs, sizes, least) == {"a": "q4_0", "b": "q4_0", "c": "q4_0"}
    assert sensitivity.allocate(costs, sizes, least + 40)["a"] == "q5_0"   # 0.7 saved / 40 B
    with pytest.raises(ValueError, match="smallest possible is 540 bytes"):
        sensitivity.allocate(costs, sizes, 539)
    with pytest.raises(ValueError, match="positive number of bytes"):
        sensitivity.allocate(costs, sizes, 0)
    with pytest.raises(ValueError, match="finite number >= 0"):
        sensitivity.allocate({**costs, "c": {**costs["c"], "q8_0": float("nan")}}, sizes, 900)


def test_costs_from_scan_and_course_mix():
    rows = [{"tensor": "blk.0.attn_v.weight", "format": "q4_0", "kl_mean": 0.01,
             "weighted_error": {"q4_0": 4.0, "q4_1": 0.0, "q5_0": 1.0, "q8_0": 0.01},
             "bytes": {"q4_0": 18, "q4_1": 20, "q5_0": 22, "q8_0": 34}}]
    costs, sizes = sensitivity.costs_from_scan(rows)
    assert costs["blk.0.attn_v.weight"] == pytest.approx(
        {"q4_0": 0.01, "q4_1": 0.0, "q5_0": 0.0025, "q8_0": 0.000025})
    pick = kmix_table.course_mix(rows, 21)
    assert pick == {"blk.0.attn_v.weight": "q4_0"}          # Q4_1 (20 B, free) is left out
    assert kmix_table.course_mix(rows, 21, kmix_table.ALLOC_FORMATS + ("q4_1",)) == \
        {"blk.0.attn_v.weight": "q4_1"}


def test_heat_map_and_candidates():
    rows = [{"layer": 2, "kind": "ffn_down", "kl_mean": 0.5}]
    h = sensitivity.heat_map(rows, n_layers=4)
    assert h.shape == (4, 7) and h[2, 6] == 0.5 and np.isnan(h[0, 0])
    assert sensitivity.candidates(576) == ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0"]
    assert sensitivity.low_format(1536) == "q4_k" and sensitivity.low_format(576) == "q4_0"


@pytest.mark.skipif(not smollm.available(), reason="SmolLM2 not converted")
def test_the_scan_and_the_table_choose_on_calibration_text_only():
    """The scan chooses the bits, so its windows are calibration text of the clean protocol,
    sharing no 50-character run with the evaluation text that scores the mixes."""
    from course_lib import data
    w = sensitivity.scan_windows()                                            # (2, 512)
    cal = smollm.calibration_ids(protocol="clean")
    assert w.shape == (sensitivity.WINDOWS, sensitivity.WINDOW)
    for row in w:
        starts = [s for s in range(0, len(cal) - len(row) + 1, len(row))
                  if torch.equal(cal[s:s + len(row)], row)]
        assert starts, "a scan window is not a window of the calibration text"
        text = smollm.tokenizer().decode(row.tolist())
        assert data.verbatim_overlap(text, smollm.texts("clean")[1], 50) == 0
    assert sensitivity.PROTOCOL == kmix_table.PROTOCOL == "clean"
