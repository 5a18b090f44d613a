"""Tests of course_lib.quant (lessons 02 and 03): values, bounds, errors, numpy/torch parity."""
import math

import numpy as np
import pytest
import torch

from course_lib import quant as Q
from course_lib import quant

EX_A = np.array([0.12, -0.45, 0.03, 0.88, -0.27, 0.51, -0.09, 0.34])
EX_B = np.array([0.423, -1.270, 0.081, 0.914, -0.337, 0.562, -0.708, 1.049])




# ---------------------------------------------------------------- lesson 02 worked examples

def test_example_a_scales_and_zero():
    qt8 = Q.quantize(EX_A, "int8", "per_tensor")
    qt4 = Q.quantize(EX_A, "int4", "per_tensor")
    assert float(qt8.scale.reshape(-1)[0]) == pytest.approx(0.00693, abs=5e-6)
    assert float(qt4.scale.reshape(-1)[0]) == pytest.approx(0.1257, abs=5e-5)
    assert qt4.q[2] == 0  # 0.03 rounds to zero in INT4
    assert qt8.q.dtype == np.int8 and qt8.q.tolist() == [17, -65, 4, 127, -39, 74, -13, 49]
    # INT8: every weight within half a step (0.88 / 127 / 2 = 0.0035) of where it started;
    # the worst is 0.51, stored as 74 steps (0.51 / 0.00693 = 73.6)
    half_step = 0.88 / 127 / 2
    err = np.abs(Q.dequantize(qt8) - EX_A)
    assert err.max() <= half_step * (1 + 1e-12)
    assert err.max() == pytest.approx(74 * 0.88 / 127 - 0.51, rel=1e-9) == err[5]


def test_example_b_mae():
    assert Q.mae(EX_B, Q.fake_quantize(EX_B, "int8", "per_tensor")) == pytest.approx(0.0020, abs=5e-5)
    assert Q.mae(EX_B, Q.fake_quantize(EX_B, "int4", "per_tensor")) == pytest.approx(0.0311, abs=5e-5)
    q, s = Q.absmax_quantize(EX_B, 8)
    assert s == pytest.approx(0.01) and q.dtype == np.int8


def test_zero_point_example():
    scale, zero = Q.zero_point(-0.4, 1.1, 4)
    assert scale == pytest.approx(0.1) and zero == 4
    qt = Q.quantize(np.array([-0.4, 0.0, 0.35, 1.1]), "int4", "per_tensor", symmetric=False)
    assert qt.q.tolist() == [0, 4, 8, 15] or qt.q.tolist() == [0, 4, 7, 15]
    assert int(qt.zero.reshape(-1)[0]) == 4 and qt.q.dtype == np.uint8
    np.testing.assert_allclose(Q.dequantize(qt)[[0, 1, 3]], [-0.4, 0.0, 1.1], atol=1e-6)


def test_zero_point_edges():
    assert Q.zero_point(0.0, 0.0, 4) == (1.0, 0)
    s, z = Q.zero_point(0.2, 1.5, 4)  # range widened to include 0
    assert z == 0 and s == pytest.approx(0.1)
    s, z = Q.zero_point(-3.0, -1.0, 8)
    assert z == 255
    with pytest.raises(ValueError, match="larger"):
        Q.zero_point(1.0, -1.0)
    with pytest.raises(ValueError, match="finite"):
        Q.zero_point(-math.inf, 1.0)


# ---------------------------------------------------------------- lesson 03 outlier examples

def test_one_outlier_per_tensor_and_groups():
    w = EX_B.copy()
    w[3] = 9.0
    qt = Q.quantize(w, "int4", "per_tensor")
    assert int((qt.q == 0).sum()) == 4
    d = Q.fake_quantize(w, "int4", "per_group", 4)
    assert np.abs(d - w)[4:].mean() == pytest.approx(0.029, abs=5e-4)


def test_threshold_under_scale():
    x = np.array([1.6, 0.1, -0.1, 0.11, -0.113, 0.115, 0.05, -0.08])
    qt = Q.quantize(x, "int4", "per_tensor")
    s = float(qt.scale.reshape(-1)[0])
    assert s == pytest.approx(0.229, abs=5e-4) and s / 2 == pytest.approx(0.114, abs=5e-4)
    assert (qt.q[np.abs(x) < s / 2] == 0).all() and qt.q[5] != 0


def test_bits_per_weight():
    assert Q.bits_per_weight(4, 128) == 4.125
    assert Q.bits_per_weight(4, 32) == 4.5
    assert Q.bits_per_weight(4, 128, zero_bits=16) == 4.25
    assert Q.bits_per_weight("mxfp4") == 4.25
    assert Q.bits_per_weight("nvfp4") == 4.5
    assert Q.bits_per_weight("nvfp4", n_elements=4096) == pytest.approx(4.5 + 32 / 4096)
    # Q4_K by hand: 256 4-bit weights + 8 blocks x (6-bit scale + 6-bit min) + FP16 d and dmin
    assert Q.BLOCK_FORMAT_BITS["q4_k"] == (256 * 4 + 8 * 12 + 2 * 16) / 256 == 4.5
    assert Q.BLOCK_FORMAT_BITS["q6_k"] == (256 * 6 + 16 * 8 + 16) / 256 == 6.5625
    # Q4_K_M's 4.89 is Llama-3.1-8B's (llama.cpp tools/quantize/README.md: 4.8944, head
    # included): between its two block types, mostly Q4_K (test_hardware rebuilds it)
    q4km = Q.bits_per_weight("q4_k_m")
    assert Q.BLOCK_FORMAT_BITS["q4_k"] < q4km < Q.BLOCK_FORMAT_BITS["q6_k"]
    assert (q4km - 4.5) / (6.5625 - 4.5) < 0.5
    with pytest.raises(ValueError, match="known"):
        Q.bits_per_weight("q5_x")


# ---------------------------------------------------------------- general properties

@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("gran,gs", [("per_tensor", None), ("per_channel", None),
                                     ("per_group", 16), ("per_token", None)])
def test_error_bound_and_shapes(bits, gran, gs):
    rng = np.random.default_rng(bits)
    x = rng.normal(size=(6, 64)).astype(np.float32)
    qt = Q.quantize(x, f"int{bits}", gran, gs)
    qmax = 2 ** (bits - 1) - 1
    assert qt.q.shape == x.shape and qt.q.dtype == np.int8
    assert np.abs(qt.q).max() <= qmax
    n_groups = {"per_tensor": 1, "per_group": 4}.get(gran, 1)
    assert qt.scale.shape[-1] == n_groups and qt.scale.ndim == 2
    xh = Q.dequantize(qt)
    assert xh.dtype == np.float32 and xh.shape == x.shape
    scale_full = np.repeat(qt.scale, x.shape[-1] // qt.scale.shape[-1], axis=-1)
    assert (np.abs(x - xh) <= scale_full / 2 + 1e-6).all()


def test_per_channel_is_per_row():
    x = np.array([[1.0, 0.5, 0.25, 0.0], [10.0, 5.0, 2.5, 0.0]])
    qt = Q.quantize(x, "int8", "per_channel")
    np.testing.assert_allclose(qt.scale[:, 0], [1 / 127, 10 / 127])
    assert Q.quantize(x, "int8", "per_token").q.tolist() == qt.q.tolist()


@pytest.mark.parametrize("bits", [3, 4, 8])
def test_asymmetric_bounds(bits):
    rng = np.random.default_rng(0)
    x = rng.uniform(-0.3, 1.2, size=(4, 32))
    qt = Q.quantize(x, f"int{bits}", "per_group", 8, symmetric=False)
    assert qt.q.dtype == np.uint8 and qt.q.max() <= 2 ** bits - 1 and qt.zero.shape == (4, 4)
    xh = Q.dequantize(qt)
    scale_full = np.repeat(qt.scale, 8, axis=-1)
    assert (np.abs(x - xh) <= scale_full / 2 + 1e-9).all()
    assert xh.dtype == np.float64
    qu = Q.quantize(x, f"uint{bits}", "per_group", 8)
    assert qu.q.tolist() == qt.q.tolist()


def test_round_trip_exact_on_grid():
    q = np.arange(-7, 8, dtype=np.float64)
    x = np.tile(q * 0.25, (3, 1))
    xh = Q.fake_quantize(x, "int4", "per_channel")
    np.testing.assert_array_equal(xh, x)


def test_all_zero_groups_give_zeros_not_nan():
    x = np.zeros((3, 16), dtype=np.float32)
    x[1, :8] = np.linspace(-1, 1, 8)
    for kwargs in [dict(fmt="int4", granularity="per_group", group_size=8),
                   dict(fmt="int8", granularity="per_channel", group_size=None),
                   dict(fmt="int4", granularity="per_group", group_size=8, symmetric=False)]:
        xh = Q.fake_quantize(x, **kwargs)
        assert not np.isnan(xh).any()
        assert (xh[0] == 0).all() and (xh[1, 8:] == 0).all() and (xh[2] == 0).all()
    assert Q.absmax_quantize(np.zeros(4), 8)[1] == 1.0
    assert Q.absmax_scale(np.zeros(4), 7) == 0.0


def test_fake_quantize_keeps_type_dtype_shape():
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    y = Q.fake_quantize(x)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16 and y.shape == x.shape
    xn = np.random.default_rng(0).normal(size=(2, 128)).astype(np.float16)
    yn = Q.fake_quantize(xn, "int8", "per_channel")
    assert isinstance(yn, np.ndarray) and yn.dtype == np.float16 and yn.shape == xn.shape
    assert isinstance(Q.fake_quantize([[0.1, 0.2]], "int8", "per_tensor"), np.ndarray)


def test_torch_dequantize_dtype():
    x32 = torch.randn(2, 32)
    assert Q.dequantize(Q.quantize(x32.to(torch.float16), "int4", "per_group", 16)).dtype == torch.float32
    assert Q.dequantize(Q.quantize(x32.double(), "int4", "per_group", 16)).dtype == torch.float64


@pytest.mark.parametrize("fmt,sym", [("int8", True), ("int4", True), ("int3", True),
                                     ("int4", False), ("uint8", True)])
@pytest.mark.parametrize("gran,gs", [("per_tensor", None), ("per_channel", None), ("per_group", 32)])
def test_numpy_torch_parity(fmt, sym, gran, gs):
    x = np.random.default_rng(1).normal(size=(5, 128)).astype(np.float32)
    a = Q.quantize(x, fmt, gran, gs, sym)
    b = Q.quantize(torch.from_numpy(x), fmt, gran, gs, sym)
    assert isinstance(b.q, torch.Tensor) and str(b.q.dtype).endswith(str(a.q.dtype))
    np.testing.assert_array_equal(a.q, b.q.numpy())
    np.testing.assert_allclose(a.scale, b.scale.numpy(), rtol=1e-6)
    np.testing.assert_allclose(Q.dequantize(a), Q.dequantize(b).numpy(), rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- packing

def test_pack_unpack_all_256_nibble_pairs():
    bytes_ = np.arange(256, dtype=np.uint8)
    signed = Q.unpack_int4(bytes_)
    assert signed.dtype == np.int8 and signed.shape == (512,)
    lo, hi = signed[0::2], signed[1::2]
    for b in range(256):  # low nibble = element 2i, high nibble = 2i+1, two's complement
        exp_lo, exp_hi = b & 0xF, b >> 4
        assert lo[b] == (exp_lo - 16 if exp_lo >= 8 else exp_lo)
        assert hi[b] == (exp_hi - 16 if exp_hi >= 8 else exp_hi)
    np.testing.assert_array_equal(Q.pack_int4(signed), bytes_)
    unsigned = Q.unpack_int4(bytes_, signed=False)
    assert unsigned.dtype == np.uint8 and unsigned.max() == 15
    np.testing.assert_array_equal(Q.pack_int4(unsigned), bytes_)
    # torch parity
    tb = torch.from_numpy(bytes_)
    ts = Q.unpack_int4(tb)
    assert ts.dtype == torch.int8
    np.testing.assert_array_equal(ts.numpy(), signed)
    np.testing.assert_array_equal(Q.pack_int4(ts).numpy(), bytes_)
    assert Q.pack_int4(Q.unpack_int4(tb, signed=False)).dtype == torch.uint8


def test_pack_nibble_order_and_shape():
    q = np.array([[1, -1, 7, -8]], dtype=np.int8)
    p = Q.pack_int4(q)
    assert p.shape == (1, 2) and p.dtype == np.uint8
    assert p.tolist() == [[0xF1, 0x87]]
    q32 = torch.tensor([[3, 4]], dtype=torch.int32)
    assert Q.pack_int4(q32).tolist() == [[0x43]]


def test_pack_errors():
    with pytest.raises(ValueError, match="even"):
        Q.pack_int4(np.zeros((2, 3), dtype=np.int8))
    with pytest.raises(ValueError, match=r"\[-8, 7\]"):
        Q.pack_int4(np.array([8, 0], dtype=np.int8))
    with pytest.raises(ValueError, match=r"\[0, 15\]"):
        Q.pack_int4(np.array([16, 0], dtype=np.uint8))
    with pytest.raises(ValueError, match="integer"):
        Q.pack_int4(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="uint8"):
        Q.unpack_int4(np.array([1, 2], dtype=np.int8))


# ---------------------------------------------------------------- bad input

def test_nan_inf_error_says_how_many_and_where():
    x = np.zeros((2, 8))
    x[1, 3] = np.nan
    x[0, 5] = np.inf
    with pytest.raises(ValueError, match=r"2 non-finite.*1 NaN, 1 inf.*\(0, 5\), \(1, 3\)"):
        Q.quantize(x, "int8")
    with pytest.raises(ValueError, match="1 non-finite"):
        Q.fake_quantize(torch.tensor([[1.0, float("nan")]]), "int8", "per_channel")


def test_unknown_format_lists_known():
    with pytest.raises(ValueError, match="known: int2..int8.*fp8_e4m3.*nf4"):
        Q.quantize(EX_A, "int12")
    with pytest.raises(ValueError, match="known: per_tensor"):
        Q.quantize(EX_A, "int8", "per_row")


def test_group_size_error_suggests_divisors():
    with pytest.raises(ValueError, match=r"group_size 128 does not divide the last dimension \(100\).*\[.*50.*\]"):
        Q.quantize(np.ones((2, 100)), "int4", "per_group", 128)
    with pytest.raises(ValueError, match="per_group"):
        Q.quantize(np.ones((2, 64)), "int4", "per_channel", group_size=32)
    assert Q.divisors(12) == [1, 2, 3, 4, 6, 12]


def test_empty_and_0d_inputs():
    with pytest.raises(ValueError, match="nothing to quantize"):
        Q.quantize(np.zeros((3, 0)), "int8")
    with pytest.raises(ValueError, match="0-d"):
        Q.quantize(np.float64(1.0), "int8", "per_tensor")


def test_zero_point_on_float_format_is_an_error():
    with pytest.raises(ValueError, match="integer formats"):
        Q.quantize(EX_A, "fp8_e4m3", "per_tensor", symmetric=False)


# ---------------------------------------------------------------- metrics and data

def test_metrics():
    r = np.array([1.0, -2.0, 2.0])
    a = np.array([1.0, -1.0, 2.0])
    assert Q.mae(r, a) == pytest.approx(1 / 3)
    assert Q.rmse(r, a) == pytest.approx(math.sqrt(1 / 3))
    assert Q.relative_rms_error(r, a) == pytest.approx(1 / 3)
    assert Q.sqnr_db(r, a) == pytest.approx(10 * math.log10(9))
    assert Q.relative_rms_error(r, torch.tensor(a)) == pytest.approx(1 / 3)


def test_synthetic_weights():
    w = Q.synthetic_weights()
    assert w.shape == (256, 1024) and w.dtype == np.float32
    assert int((np.abs(w) == np.float32(0.6)).sum()) == 8
    np.testing.assert_array_equal(w, Q.synthetic_weights())


def test_int_table_conclusions():
    """Lesson 03's table against values computed here by hand (numpy rounding, one scale per
    block) and against the rounding-noise model: a uniform error on [-s/2, s/2] has RMS s/sqrt(12)."""
    w = Q.synthetic_weights().astype(np.float64)                          # (256, 1024)
    rms = np.sqrt(np.mean(w ** 2))
    err, noise_model = {}, {}
    for k, (f, g, gs) in {
            "int8_t": ("int8", "per_tensor", None), "int8_c": ("int8", "per_channel", None),
            "int4_t": ("int4", "per_tensor", None), "int4_c": ("int4", "per_channel", None),
            "int4_g128": ("int4", "per_group", 128), "int4_g32": ("int4", "per_group", 32)}.items():
        qmax = 127 if f == "int8" else 7
        blocks = w.reshape(1, -1) if g == "per_tensor" else w.reshape(-1, gs or w.shape[1])
        s = np.abs(blocks).max(axis=1, keepdims=True) / qmax                 # one scale per block
        by_hand = np.clip(np.round(blocks / s), -qmax, qmax) * s
        err[k] = Q.relative_rms_error(w, Q.fake_quantize(w, f, g, gs))
        assert err[k] == pytest.approx(np.sqrt(np.mean((by_hand - blocks) ** 2)) / rms, rel=1e-9), k
        noise_model[k] = np.sqrt(np.mean(np.broadcast_to(s, blocks.shape) ** 2) / 12) / rms
    # INT8's steps are small next to the weights: the noise model holds to 1%, and it tells
    # per-tensor from per-channel (4.4x apart), so neither could pass for the other
    for k in ("int8_t", "int8_c"):
        assert err[k] == pytest.approx(noise_model[k], rel=0.01), k
    assert err["int8_t"] > 4 * err["int8_c"]
    # INT4 rounds many weights to 0 (error below s/sqrt(12)) but never beyond half a step
    for k in ("int4_t", "int4_c", "int4_g128", "int4_g32"):
        assert err[k] <= np.sqrt(3) * noise_model[k], k
    assert err["int4_t"] > err["int4_c"] > err["int4_g128"] > err["int4_g32"]


# ---------------------------------------------------------------- NF4

def test_nf4_levels_are_normal_quantiles():
    published = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                 -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                 0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
                 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                 0.7229568362236023, 1.0]  # bitsandbytes' table
    lv = Q.nf4_levels()
    np.testing.assert_allclose(lv, published, atol=1e-7)
    assert lv.dtype == np.float32
    assert lv[0] == -1 and lv[-1] == 1 and lv[7] == 0 and len(lv) == 16


def test_nf4_hand_block():
    lv = Q.nf4_levels()
    x = np.concatenate([lv * 2.0, -lv[::-1] * 0.0 + 0.03])  # block 0 on the grid, block 1 small
    x = x.reshape(1, 32)
    qt = Q.quantize_nf4(x, block_size=16)
    assert qt.q.dtype == np.uint8 and qt.q[0, :16].tolist() == list(range(16))
    np.testing.assert_allclose(qt.scale, [[2.0, 0.03]], rtol=1e-6)
    np.testing.assert_allclose(Q.dequantize_nf4(qt)[0, :16], lv * 2.0, rtol=1e-6)
    np.testing.assert_allclose(Q.dequantize_nf4(qt)[0, 16:], 0.03, rtol=1e-6)
    qt_t = Q.quantize_nf4(torch.from_numpy(x.astype(np.float32)), block_size=16)
    np.testing.assert_array_equal(qt_t.q.numpy(), qt.q)
    np.testing.assert_allclose(Q.dequantize_nf4(qt_t).numpy(), Q.dequantize_nf4(qt), rtol=1e-6)


def test_nf4_nearest_level_and_bound():
    x = np.random.default_rng(3).normal(size=(4, 256)).astype(np.float32)
    qt = Q.quantize_nf4(x)
    xh = Q.dequantize_nf4(qt)
    lv = Q.nf4_levels()
    y = x.reshape(4, 4, 64) / qt.scale[..., None]
    best = np.abs(y[..., None] - lv).argmin(-1)
    np.testing.assert_array_equal(qt.q.reshape(4, 4, 64), best)
    # each value comes back as its level times the block's absmax, so it is off by at most
    # half the widest gap between neighbouring levels (0.72..1.0) times that absmax
    np.testing.assert_allclose(xh.reshape(4, 4, 64), lv[best] * qt.scale[..., None], rtol=1e-6)
    bound = np.diff(lv).max() / 2 * qt.scale[..., None]
    assert (np.abs(x - xh).reshape(4, 4, 64) <= bound * (1 + 1e-6)).all()


def test_nf4_double_quant():
    x = np.random.default_rng(4).normal(size=(8, 64 * 80)).astype(np.float32)
    plain = Q.quantize_nf4(x)
    dq = Q.quantize_nf4(x, double_quant=True)
    assert dq.scale.shape == plain.scale.shape == (8, 80)
    assert dq.extra["scale_codes"].dtype == np.int8 and dq.extra["scale_codes"].shape == (3, 256)
    # the 640 absmax values, less their mean, are INT8 absmax-quantized in rows of 256: each
    # comes back within half its row's step (row absmax / 127 / 2), and exactly as code * step
    codes, steps = dq.extra["scale_codes"], dq.extra["scale_scales"]       # (3, 256), (3, 1)
    centred = np.concatenate([plain.scale.ravel() - dq.extra["scale_mean"], np.zeros(128)])
    np.testing.assert_allclose(steps[:, 0], np.abs(centred.reshape(3, 256)).max(1) / 127, rtol=1e-6)
    np.testing.assert_allclose(dq.scale.ravel(), (codes * steps).ravel()[:640] + dq.extra["scale_mean"],
                               rtol=1e-6)
    row_of = np.arange(640) // 256
    assert (np.abs(dq.scale - plain.scale).ravel() <= steps[row_of, 0] / 2 * (1 + 1e-5)).all()
    e_plain = Q.relative_rms_error(x, Q.dequantize_nf4(plain))
    e_dq = Q.relative_rms_error(x, Q.dequantize_nf4(dq))
    assert e_dq < e_plain * 1.05
    assert 8 / 64 + 32 / (64 * 256) == pytest.approx(0.127, abs=5e-4)


# ---------------------------------------------------------------- float formats (need formats.py)

def test_fp4_example_a():
    qt = Q.quantize(EX_A, "fp4_e2m1", "per_tensor")
    s = float(qt.scale.reshape(-1)[0])
    assert s == pytest.approx(0.1467, abs=5e-5)
    xh = Q.dequantize(qt)
    # 0.51 / 0.1467 = 3.48 lies between FP4's 3 and 4: 0.44 and 0.59
    assert xh[5] == pytest.approx(0.44, abs=0.005)
    assert 3 * s == pytest.approx(0.44, abs=0.005) and 4 * s == pytest.approx(0.59, abs=0.005)
    assert abs(xh[5] - 0.51) == pytest.approx(0.07, abs=0.005)
    assert set(np.abs(qt.q).tolist()) <= {0, 0.5, 1, 1.5, 2, 3, 4, 6}


def test_fp8_example_b():
    xh = Q.fake_quantize(EX_B, "fp8_e4m3", "per_tensor")
    rel = Q.mae(EX_B, xh) / np.abs(EX_B).mean()
    # the source prints three decimals: agreement to half a unit of the last one
    assert Q.mae(EX_B, xh) == pytest.approx(0.013, abs=5e-4)
    assert rel == pytest.approx(0.019, abs=5e-4)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2", "fp4_e2m1"])
def test_float_parity_and_grid(fmt):
    from course_lib.formats import get_format

    x = np.random.default_rng(2).normal(size=(4, 64)).astype(np.float32)
    a = Q.quantize(x, fmt, "per_group", 32)
    b = Q.quantize(torch.from_numpy(x), fmt, "per_group", 32)
    np.testing.assert_array_equal(a.q, b.q.numpy())
    grid = set(np.asarray(get_format(fmt).values(), dtype=np.float64).tolist())
    assert set(a.q.astype(np.float64).ravel().tolist()) <= grid
    assert np.abs(a.q).max() == get_format(fmt).max_value


def test_mxfp4_hand_blocks():
    x = np.zeros((1, 96), dtype=np.float32)
    x[0, :4] = [1.0, -2.5, 0.3, 7.0]  # amax 7: exponent floor(log2 7) - 2 = 0 -> scale 1
    x[0, 32:35] = [0.9, -0.2, 0.05]  # amax 0.9: exponent -1 - 2 = -3 -> scale 1/8
    qt = Q.quantize_mxfp4(x)           # block 3 all zero
    np.testing.assert_array_equal(qt.scale, [[1.0, 0.125, 1.0]])
    assert qt.q[0, :4].tolist() == [1.0, -2.0, 0.5, 6.0]  # 2.5 ties to even (2), 7 saturates
    assert qt.q[0, 32:35].tolist() == [6.0, -1.5, 0.5]  # 7.2 -> 6, -1.6 -> -1.5, 0.4 -> 0.5
    xh = Q.dequantize_mxfp4(qt)
    np.testing.assert_allclose(xh[0, 32:35], [0.75, -0.1875, 0.0625])
    assert (xh[0, 64:] == 0).all() and not np.isnan(xh).any()
    t = Q.quantize_mxfp4(torch.from_numpy(x))
    np.testing.assert_array_equal(t.q.numpy(), qt.q)
    np.testing.assert_array_equal(t.scale.numpy(), qt.scale)


def test_nvfp4_hand_blocks():
    x = np.zeros((1, 48), dtype=np.float32)
    x[0, :3] = [6.0, 1.0, -0.5]   # tensor amax 6 -> tensor scale 6 / 2688; block scale 448
    x[0, 16:19] = [3.0, -1.0, 0.2]  # block scale 224 (exact in E4M3): x / 0.5
    qt = Q.quantize_nvfp4(x)
    assert float(qt.tensor_scale) == pytest.approx(6 / 2688)
    np.testing.assert_allclose(qt.scale[0, :2], [448.0, 224.0])
    assert qt.q[0, :3].tolist() == [6.0, 1.0, -0.5]
    assert qt.q[0, 16:19].tolist() == [6.0, -2.0, 0.5]
    xh = Q.dequantize_nvfp4(qt)
    np.testing.assert_allclose(xh[0, :3], [6.0, 1.0, -0.5], rtol=1e-6)
    np.testing.assert_allclose(xh[0, 16:19], [3.0, -1.0, 0.25], rtol=1e-6)
    assert (xh[0, 32:] == 0).all() and not np.isnan(xh).any()
    t = Q.quantize_nvfp4(torch.from_numpy(x))
    np.testing.assert_allclose(Q.dequantize_nvfp4(t).numpy(), xh, rtol=1e-6)


def test_block_formats_bad_input():
    with pytest.raises(ValueError, match="does not divide"):
        Q.quantize_mxfp4(np.ones((2, 48)))
    with pytest.raises(ValueError, match="non-finite"):
        Q.quantize_nvfp4(np.array([[np.nan] * 16]))


# ---------------------------------------------------------------- the playground widget

def test_playground_stats_outlier_hurts_per_tensor_more_than_groups():
    from course_lib.widgets.playground import playground_stats

    calm = playground_stats("int", 4, "per_tensor", outlier=0.0)
    wild = playground_stats("int", 4, "per_tensor", outlier=15.0)
    grouped = playground_stats("int", 4, "per_group", 32, outlier=15.0)
    assert wild["relative_rms_error"] > 2 * calm["relative_rms_error"]
    assert wild["zeroed_fraction"] > 0.5 > calm["zeroed_fraction"]
    assert grouped["relative_rms_error"] < wild["relative_rms_error"]
    assert grouped["bits_per_weight"] == 4.5 and calm["bits_per_weight"] == pytest.approx(4 + 16 / 2048)
    assert len(calm["levels_ordinary_group"]) == 15


def test_playground_widget_updates():
    from course_lib.widgets.playground import quantization_playground

    box = quantization_playground()
    first = box.summary.value
    assert "int4" in first and "bits/weight" in first
    box.controls["granularity"].value = "per_tensor"
    box.controls["outlier"].value = 12.0
    assert box.summary.value != first and box.stats["zeroed_fraction"] > 0.5
    box.controls["fmt"].value = "nf4"
    assert "nf4" in box.summary.value and box.controls["bits"].disabled
    box.controls["fmt"].value = "fp8_e4m3"
    assert box.stats["sqnr_db"] > 20


def test_metrics_reject_mismatched_shapes():
    # (8,) against (8, 1) would broadcast to (8, 8) and give a wrong number silently
    r = np.arange(8.0)
    for fn in (Q.mae, Q.rmse, Q.relative_rms_error):
        with pytest.raises(ValueError, match=r"shape \(8,\).*shape \(8, 1\)"):
            fn(r, r[:, None])
    assert Q.mae(r, torch.tensor(r)) == 0.0


def test_absmax_scale_rejects_nan_and_bad_qmax():
    with pytest.raises(ValueError, match="1 non-finite"):
        Q.absmax_scale(np.array([1.0, np.nan]), 127)
    with pytest.raises(ValueError, match="1 non-finite"):
        Q.absmax_scale(torch.tensor([1.0, float("inf")]), 127)
    for qmax in (0, -7):
        with pytest.raises(ValueError, match="qmax must be"):
            Q.absmax_scale(np.array([1.0, 2.0]), qmax)
    assert Q.absmax_scale(np.array([0.5, -1.4]), 7) == pytest.approx(0.2)


def test_zero_point_rejects_bad_bits():
    for bits in (0, 4.5, True, 17):
        with pytest.raises(ValueError, match="bits must be"):
            Q.zero_point(-0.4, 1.1, bits)
    assert Q.zero_point(-0.4, 1.1, np.int64(4)) == (pytest.approx(0.1), 4)


def test_group_size_true_is_not_one():
    with pytest.raises(ValueError, match="group_size must be a positive integer"):
        Q.quantize(np.ones((2, 8)), "int4", "per_group", True)


def test_sqnr_db_rejects_mismatched_shapes():
    r = np.arange(1.0, 9.0)
    with pytest.raises(ValueError, match=r"shape \(8,\).*shape \(8, 1\)"):
        Q.sqnr_db(r, r[:, None])            # broadcast to (8, 8): gave -5.2 dB silently


# ---- bad input is refused, saying what to do (issue 13, item 9) ----------------------------

@pytest.mark.parametrize("call, words", [
    (lambda: quant.bits_per_weight(-4, 128), "bits must be a positive number"),
    (lambda: quant.bits_per_weight(math.nan, 128), "bits must be a positive number"),
    (lambda: quant.bits_per_weight(4, 2.5), "group_size must be a whole number"),
    (lambda: quant.bits_per_weight(4, 0), "group_size must be a whole number >= 1"),
    (lambda: quant.bits_per_weight(4, 128, scale_bits=-1), "scale_bits must be a number >= 0"),
    (lambda: quant.bits_per_weight(4, None, n_elements=0), "n_elements is the tensor's number"),
    (lambda: quant.bits_per_weight("nvfp4", n_elements=-5), "n_elements"),
    (lambda: quant.bits_per_weight("q9_k"), "unknown block format"),
    (lambda: quant.synthetic_weights(rows=0), "rows must be a whole number >= 1"),
    (lambda: quant.synthetic_weights(cols=2.5), "cols must be a whole number"),
    (lambda: quant.synthetic_weights(n_outliers=-1), "n_outliers must be a whole number >= 0"),
    (lambda: quant.synthetic_weights(outlier=math.nan), "outlier is the planted magnitude"),
    (lambda: quant.divisors(0), "row length"),
    (lambda: quant.divisors(2.5), "row length"),
    (lambda: quant.mae(np.array([]), np.array([])), "empty"),
    (lambda: quant.mae(np.array([np.nan, 1.0]), np.array([1.0, 1.0])), "non-finite"),
    (lambda: quant.relative_rms_error(np.ones(3), np.array([1.0, np.inf, 1.0])), "non-finite"),
    (lambda: quant.absmax_quantize(np.array([1.0, np.nan]), 8), "non-finite"),
    (lambda: quant.absmax_quantize(np.array([]), 8), "nothing to quantize"),
    (lambda: quant.quantize(np.ones((2, 8)), "int4", "per_group", 0), "group_size must be a positive"),
    (lambda: quant.zero_point(0.0, 1.0, 0), "bits must be a whole number of bits"),
    (lambda: quant.remove_outliers(np.ones(8), 6), "2-D"),
    (lambda: quant.remove_outliers(np.ones((2, 8)), 0), "k is a multiple of the row RMS"),
    (lambda: quant.remove_outliers(np.arange(8).reshape(2, 4), 6), "floating-point"),
    (lambda: quant.largest_group_within(np.ones((2, 8)), -0.1), "target_rel_error"),
    (lambda: quant.largest_group_within(np.ones((2, 8)), math.nan), "target_rel_error"),
])
def test_refuses_bad_input(call, words):
    with pytest.raises(ValueError, match=words):
        call()


def test_remove_outliers_and_largest_group_against_hand_values():
    w = np.full((2, 36), 0.1, dtype=np.float32)
    w[0, 3], w[1, 7] = 5.0, -5.0
    clean = quant.remove_outliers(w)            # 6 x row RMS = 5.035: 5.0 is not above it
    assert (clean == w).all()                   # 5.0 stays under six times its row's RMS
    clean = quant.remove_outliers(w, 3.0)
    assert clean[0, 3] == 0 and clean[1, 7] == 0 and clean.dtype == np.float32
    assert (np.delete(clean, [3, 36 + 7]) == np.float32(0.1)).all()
    g = np.array([[1.0, 0.1, 0.1, 0.1, 1.0, 0.2, 0.3, 0.4]])
    # group 8: scale 1/7: 0.1 -> 1/7 (error 0.043); group 1: exact; group 2 and 4 in between
    assert quant.largest_group_within(g, 0.0) == 1
    assert quant.largest_group_within(g, 1.0) == 8
