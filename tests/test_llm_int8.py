"""LLM.int8(): vector-wise INT8, the mixed-precision decomposition, the layer in a model."""
import pytest
import torch
import torch.nn as nn

from course_lib import quant
from course_lib.methods import llm_int8 as L
from course_lib.methods import llm_int8


def _xw(M=16, N=24, K=48, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(M, K, generator=g), torch.randn(N, K, generator=g) / K ** 0.5


def test_quantize_rows_by_hand():
    x = torch.tensor([[1.27, -0.635, 0.0], [0.0, 0.0, 0.0], [-2.54, 0.005, 0.015]])
    q, s = L.quantize_rows(x)
    assert q.dtype == torch.int8 and s.shape == (3,)
    assert torch.allclose(s, torch.tensor([0.01, 1.0, 0.02]))        # zero row: scale 1
    # 0.005 / 0.02 = 0.25 -> 0; 0.015 / 0.02 = 0.75 -> 1; -0.635 / 0.01 = -63.5 -> -64 (even)
    assert q.tolist() == [[127, -64, 0], [0, 0, 0], [-127, 0, 1]]
    qt = quant.quantize(x, "int8", "per_token")
    assert torch.equal(q, qt.q)


def test_int32_accumulator_is_exact_at_the_worst_case():
    for K in (1040, 1041, 4096):                                     # fp32 path, then fp64
        xq = torch.full((2, K), 127, dtype=torch.int8)
        wq = torch.full((3, K), -127, dtype=torch.int8)
        acc = L.int8_matmul_int32(xq, wq)
        assert acc.dtype == torch.int32 and int(acc[0, 0]) == -K * 127 * 127
    g = torch.Generator().manual_seed(1)
    xq = torch.randint(-127, 128, (5, 300), generator=g, dtype=torch.int8)
    wq = torch.randint(-127, 128, (7, 300), generator=g, dtype=torch.int8)
    assert torch.equal(L.int8_matmul_int32(xq, wq).long(), xq.long() @ wq.long().T)


def test_vectorwise_matches_float_within_int8_error():
    x, w = _xw()
    y = L.vectorwise_int8_matmul(x, w)
    exact = x @ w.T
    rel = ((y - exact).norm() / exact.norm()).item()
    assert 1e-4 < rel < 0.02                                         # ~1% for 8 bits, not 0
    # the formula: per-token x per-channel scales around an int32 accumulator
    xq, xs = L.quantize_rows(x)
    wq, ws = L.quantize_rows(w)
    by_hand = (xq.double() @ wq.double().T) * xs.double()[:, None] * ws.double()[None, :]
    assert torch.allclose(y.double(), by_hand, rtol=1e-6, atol=1e-6)


def test_no_crossing_column_equals_plain_int8_and_float_within_int8_error():
    x, w = _xw(scale=1.0)
    x = x.clamp(-5.9, 5.9)                                           # nothing reaches 6.0
    wq, ws = L.quantize_rows(w)
    assert L.outlier_columns(x, 6.0).numel() == 0
    y = L.mixed_int8_matmul(x, wq, ws, 6.0)
    assert torch.equal(y, L.mixed_int8_matmul(x, wq, ws, 6.0, outliers="int8"))
    w_hat = wq.float() * ws[:, None]
    exact = x @ w.T
    assert ((y - exact).norm() / exact.norm()).item() < 0.02
    # relative to the int8 weights actually stored, only the activation rounding is left
    assert ((y - x @ w_hat.T).abs() <= x.abs().amax(1, keepdim=True) / 127 / 2
            * w_hat.abs().sum(1)[None, :] + 1e-5).all()


def test_crossing_columns_go_through_16_bit_exactly():
    x, w = _xw(M=10, N=12, K=32, seed=3)
    x[::2, 7] = 40.0                                                 # a planted outlier feature
    x[2, 20] = -6.0                                                  # exactly the threshold
    x[:, 9] = 5.99                                                   # just below: stays int8
    wq, ws = L.quantize_rows(w)
    cols = L.outlier_columns(x, 6.0)
    assert cols.tolist() == [7, 20]
    y = L.mixed_int8_matmul(x, wq, ws, 6.0)
    w_hat = wq.float() * ws[:, None]                                 # (N, K)
    keep = [k for k in range(32) if k not in (7, 20)]
    xq, xs = L.quantize_rows(x[:, keep])
    expect = (x[:, [7, 20]] @ w_hat[:, [7, 20]].T
              + (xq.float() @ wq[:, keep].float().T) * xs[:, None] * ws[None, :])
    assert torch.allclose(y, expect, rtol=1e-6, atol=1e-6)
    # the outliers no longer stretch the per-token scale of row 4
    assert xs[4] < 40.0 / 127 / 5
    # and the decomposition is far more accurate than INT8 for every column
    exact = x @ w_hat.T
    err_mixed = (y - exact).norm()
    err_int8 = (L.mixed_int8_matmul(x, wq, ws, outliers="int8") - exact).norm()
    assert err_mixed < err_int8 / 3
    # zeroing drops the outlier columns' contribution entirely
    dropped = L.mixed_int8_matmul(x, wq, ws, outliers="zero")
    assert torch.allclose(dropped + x[:, [7, 20]] @ w_hat[:, [7, 20]].T, y, atol=1e-5)


def test_every_column_crossing_is_all_16_bit():
    x, w = _xw(M=4, N=6, K=8, seed=4, scale=100.0)
    x[:, :] = x.sign() * (x.abs() + 7)
    wq, ws = L.quantize_rows(w)
    y = L.mixed_int8_matmul(x, wq, ws)
    assert torch.allclose(y, x @ (wq.float() * ws[:, None]).T, rtol=1e-5, atol=1e-4)


def test_layer_in_a_model_and_its_errors():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8, bias=False))
    qm = L.quantize_model_int8(net, skip=())
    assert isinstance(qm[0], L.Int8Linear) and isinstance(net[0], nn.Linear)  # a copy
    x = torch.randn(3, 5, 16)
    y, yq = net(x), qm(x)
    assert yq.shape == (3, 5, 8) and 0 < (y - yq).abs().max() < 0.05
    with pytest.raises(ValueError, match="threshold must be a positive"):
        L.Int8Linear(nn.Linear(4, 4), threshold=0.0)
    with pytest.raises(ValueError, match="threshold must be a positive"):
        L.outlier_columns(torch.randn(3, 4), threshold=-1)
    with pytest.raises(ValueError, match="outliers must be one of"):
        L.Int8Linear(nn.Linear(4, 4), outliers="bf16")
    with pytest.raises(ValueError, match="w_q must be int8"):
        L.mixed_int8_matmul(torch.randn(2, 5), *L.quantize_rows(torch.randn(3, 4)))
    with pytest.raises(ValueError, match="NaN"):
        L.quantize_rows(torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(TypeError, match="int8 codes"):
        L.int8_matmul_int32(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.int8))


def test_threshold_report_and_systematic_features():
    g = torch.Generator().manual_seed(5)
    acts = {}
    for layer in range(4):
        x = torch.randn(200, 16, generator=g)
        x[:, 3] *= 0.1
        x[:20, 3] = 9.0                                              # 10% of tokens, every layer
        if layer == 0:
            x[0, 11] = 7.0                                           # once, one layer only
        acts[f"layers.{layer}.q_proj"] = x
    rows = L.threshold_report(acts, 6.0)
    assert rows[0]["n_columns"] == 2 and rows[0]["top_columns"][0] == 3
    assert rows[1]["n_columns"] == 1 and abs(rows[1]["token_fraction"] - 0.1) < 1e-6
    feats = L.systematic_features(acts)
    assert list(feats) == [3] and feats[3]["layers"] == 1.0
    with pytest.raises(ValueError, match="different widths"):
        L.systematic_features({"a": torch.randn(4, 8), "b": torch.randn(4, 6)})


def test_zero_features_zeroes_only_the_named_columns():
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(6, 4, bias=False))
    zm = L.zero_features(net, {"0": [1, 4]})
    x = torch.randn(3, 6)
    x2 = x.clone()
    x2[:, [1, 4]] = 0
    assert torch.allclose(zm(x), net(x2)) and not torch.allclose(zm(x), net(x))


def test_decomposition_cost():
    c = L.decomposition_cost(M=4096, N=8192, K=8192, n_outliers=0)
    assert c["extra_bytes"] == 0 and c["compute_ratio"] == 1.0
    c = L.decomposition_cost(M=4096, N=8192, K=8192, n_outliers=8)
    assert c["fp16_flops"] == 2 * 4096 * 8192 * 8
    assert abs(c["compute_ratio"] - (1 + 8 / 8192)) < 1e-12       # 16-bit FLOPs cost double
    # gather of x's 8 columns, the 8 weight columns (int8 read, 16-bit written), addmm's reads of
    # both, and addmm reading and rewriting the 16-bit output (bitsandbytes 0.50.2)
    M, N, n = 4096, 8192, 8
    assert c["extra_bytes"] == (2 * M * n * 2 + (n * N + n * N * 2) + (M * n + n * N) * 2
                                + 2 * M * N * 2)
    assert c["output_roundtrip_bytes"] == 2 * M * N * 2
    assert c["output_roundtrip_bytes"] > 0.95 * c["extra_bytes"]    # the round trip dominates
    assert c["output_roundtrip_bytes"] > M * 8192 + N * 8192          # more than the int8 operands
    assert c["bytes_ratio"] > 1.5
    one = L.decomposition_cost(M=1, N=8192, K=8192, n_outliers=8)     # decode: next to nothing
    assert one["bytes_ratio"] < 1.01
    assert L.decomposition_cost(4096, 8192, 8192, 0)["output_roundtrip_bytes"] == 0
    with pytest.raises(ValueError, match="n_outliers"):
        L.decomposition_cost(1, 8, 8, 9)


# ---- bad input: clear errors naming the problem and the expected value (issue 19 item 8) -----
def _nan(shape=(3, 4)):
    x = torch.ones(*shape)
    x[1, 2] = float("nan")
    return x


@pytest.mark.parametrize("call, match", [
    (lambda: llm_int8.quantize_rows(_nan()), "NaN"),
    (lambda: llm_int8.quantize_rows(torch.ones(4)), r"2-D floating-point tensor \(rows, K\)"),
    (lambda: llm_int8.outlier_columns(_nan(), 6.0), "NaN or inf"),
    (lambda: llm_int8.outlier_columns(torch.ones(2, 3), 0.0), "positive magnitude such as 6.0"),
    (lambda: llm_int8.vectorwise_int8_matmul(torch.ones(2, 3), torch.ones(4, 5)),
     "x has 3 features but w expects 5"),
    (lambda: llm_int8.vectorwise_int8_matmul(_nan(), torch.ones(2, 4)), "NaN or inf"),
    (lambda: llm_int8.int8_matmul_int32(torch.ones(2, 3), torch.ones(2, 3)), "int8 codes"),
    (lambda: llm_int8.mixed_int8_matmul(torch.ones(2, 3), torch.ones(4, 5, dtype=torch.int8),
                                        torch.ones(4)), r"w_q must be int8 codes \(N, 3\)"),
    (lambda: llm_int8.mixed_int8_matmul(torch.ones(2, 3), torch.ones(4, 3, dtype=torch.int8),
                                        torch.ones(3)), r"one scale per output channel \(4\)"),
    (lambda: llm_int8.mixed_int8_matmul(torch.ones(2, 3), torch.ones(4, 3, dtype=torch.int8),
                                        torch.tensor([1.0, 0.0, 1.0, 1.0])), "positive, finite scales"),
    (lambda: llm_int8.mixed_int8_matmul(_nan((2, 3)), torch.ones(4, 3, dtype=torch.int8),
                                        torch.ones(4)), "NaN"),
    (lambda: llm_int8.mixed_int8_matmul(torch.ones(2, 3), torch.ones(4, 3, dtype=torch.int8),
                                        torch.ones(4), outliers="half"), "outliers must be one of"),
    (lambda: llm_int8.threshold_report({"a": _nan()}), "NaN or inf"),
    (lambda: llm_int8.threshold_report({}), "non-empty dict"),
    (lambda: llm_int8.systematic_features({"a": torch.ones(3, 4)}, 6.0, 25),
     r"min_layer_fraction is a fraction in \[0, 1\] \(0.25 for 25%"),
    (lambda: llm_int8.systematic_features({"a": torch.ones(3, 4)}, 6.0, 0.25, 6),
     r"min_token_fraction is a fraction in \[0, 1\] \(0.06 for 6%"),
    (lambda: llm_int8.systematic_features({"a": torch.ones(3, 4), "b": torch.ones(3, 5)}),
     "different widths"),
    (lambda: llm_int8.decomposition_cost(1, 8, 8, 9), r"n_outliers must be a whole number of columns in 0..K=8"),
    (lambda: llm_int8.decomposition_cost(1, 8, 8, 2.5), "n_outliers must be a whole number"),
    (lambda: llm_int8.decomposition_cost(0, 8, 8, 1), "M must be a positive integer"),
    (lambda: llm_int8.ZeroFeaturesLinear(torch.nn.Linear(4, 2), [4]), r"indices in 0..3"),
    (lambda: llm_int8.zero_features(torch.nn.Linear(4, 2), {}), "columns is empty"),
    (lambda: llm_int8.eval_windows(object()), "must be a course_lib.eval.Reference"),
    (lambda: llm_int8.Int8Linear(torch.nn.Linear(4, 2))(torch.ones(2, 8)),
     "input has 8 features but this layer expects 4"),
    (lambda: llm_int8.Int8Linear(torch.nn.Linear(4, 2), threshold=-1), "positive magnitude"),
])
def test_bad_input_is_named(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
