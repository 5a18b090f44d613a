"""course_lib.formats: the from-scratch codecs against ml_dtypes, torch and numpy.

Every bit pattern of every 4- and 8-bit format (and of fp16/bf16) is decoded and compared;
encoding is checked on every representable value, every midpoint between neighbours (the ties),
values just either side of each midpoint, random values and the edges (overflow, inf, NaN).
The libraries' known differences from this module are pinned at the end.
"""
import math

import ml_dtypes
import numpy as np
import pytest
import torch

from course_lib import formats
from course_lib.formats import (FORMAT_NAMES, format_table, get_format, library_decode,
                                library_encode, nf4_levels, round_to_format)

SMALL = [n for n in FORMAT_NAMES if get_format(n).bits <= 16]
ML = {n: getattr(ml_dtypes, v) for n, v in formats.ML_DTYPES_NAMES.items()}
TORCH = {n: getattr(torch, v) for n, v in formats.TORCH_NAMES.items()}
RNG = np.random.default_rng(0)

# The published NF4 table (bitsandbytes / QLoRA), float32 values.
NF4_PUBLISHED = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                 -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                 0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
                 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                 0.7229568362236023, 1.0]


def all_patterns(name):
    return np.arange(1 << get_format(name).bits)


def probe_values(name):
    """Every value, every midpoint, values just beside each midpoint, beyond the max."""
    v = get_format(name).values()
    mids = (v[:-1] + v[1:]) / 2
    width = np.diff(v)
    near = np.concatenate([mids - width * 1e-3, mids + width * 1e-3])
    top = get_format(name).max_value
    beyond = np.array([top * 1.01, top * 1.2, top * 4, -top * 1.2])
    beyond = beyond[np.abs(beyond) < 3.4e38]                         # stay finite in float32
    return np.concatenate([v, mids, near, beyond])


# ---- the API and the table ----------------------------------------------------------------

def test_names_and_unknown_format():
    assert FORMAT_NAMES == ("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "e8m0",
                            "int8", "int4", "uint4", "nf4")
    for n in FORMAT_NAMES:
        assert get_format(n).name == n
    with pytest.raises(ValueError, match="known formats: fp32, fp16"):
        get_format("fp6")


@pytest.mark.parametrize("name, bits, top, normal, subnormal, step", [
    ("fp32", 32, 3.4028234663852886e38, 2.0 ** -126, 2.0 ** -149, 2.0 ** -23),
    ("fp16", 16, 65504.0, 2.0 ** -14, 2.0 ** -24, 2.0 ** -10),
    ("bf16", 16, 3.3895313892515355e38, 2.0 ** -126, 2.0 ** -133, 2.0 ** -7),
    ("fp8_e4m3", 8, 448.0, 2.0 ** -6, 2.0 ** -9, 0.125),
    ("fp8_e5m2", 8, 57344.0, 2.0 ** -14, 2.0 ** -16, 0.25),
    ("fp4_e2m1", 4, 6.0, 1.0, 0.5, 0.5),
    ("e8m0", 8, 2.0 ** 127, 2.0 ** -127, None, 1.0),
    ("int8", 8, 127.0, None, None, 1.0),
    ("int4", 4, 7.0, None, None, 1.0),
    ("uint4", 4, 15.0, None, None, 1.0),
    ("nf4", 4, 1.0, None, None, 1.0 - 0.7229568362236023),
])
def test_spec_figures(name, bits, top, normal, subnormal, step):
    s = get_format(name)
    assert s.bits == bits and s.max_value == top and s.smallest_normal == normal
    assert s.smallest_subnormal == subnormal and s.step_near_one == pytest.approx(step, rel=1e-12)
    row = format_table().row(name)
    assert row["max_value"] == top and row["step_near_one"] == pytest.approx(step, rel=1e-12)


def test_figures_agree_with_numpy_and_torch_finfo():
    for name, dt in (("fp32", np.float32), ("fp16", np.float16)):
        fi = np.finfo(dt)
        s = get_format(name)
        assert (s.max_value, s.smallest_normal, s.step_near_one) == (
            float(fi.max), float(fi.smallest_normal), float(fi.eps))
    for name, dt in TORCH.items():
        fi = torch.finfo(dt)
        s = get_format(name)
        assert s.max_value == fi.max and s.smallest_normal == fi.smallest_normal, name
        assert s.step_near_one == fi.eps, name


def test_table_prints_every_format():
    text = str(format_table())
    for n in FORMAT_NAMES:
        assert n in text
    assert "448" in text and "57344" in text and "65504" in text


def test_source_figures():
    assert list(get_format("fp4_e2m1").values()[7:]) == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert len(get_format("fp4_e2m1").values()) == 15           # +-0 counted once
    assert len(get_format("int4").values()) == 16
    assert get_format("bf16").max_value > 1e38 > get_format("fp16").max_value
    # E4M3's worst relative rounding error near 1 is half a step: about 6%.
    assert get_format("fp8_e4m3").step_near_one / 2 == 0.0625


# ---- decode: every bit pattern ------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(ML))
def test_decode_every_pattern_vs_ml_dtypes(name):
    b = all_patterns(name)
    ours = get_format(name).decode(b)
    with np.errstate(invalid="ignore"):
        theirs = library_decode(b, name, "ml_dtypes")
    assert np.array_equal(ours, theirs, equal_nan=True)
    assert np.array_equal(np.signbit(ours), np.signbit(theirs))     # -0.0 too


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2", "e8m0", "fp16", "bf16"])
def test_decode_every_pattern_vs_torch(name):
    b = all_patterns(name)
    ours = get_format(name).decode(b)
    theirs = library_decode(b, name, "torch")
    assert np.array_equal(ours, theirs, equal_nan=True)
    assert np.array_equal(np.signbit(ours[~np.isnan(ours)]), np.signbit(theirs[~np.isnan(ours)]))


def test_decode_fp16_vs_numpy_and_int_formats():
    b = np.arange(1 << 16)
    assert np.array_equal(get_format("fp16").decode(b),
                          b.astype(np.uint16).view(np.float16).astype(np.float64), equal_nan=True)
    b8 = np.arange(256)
    assert np.array_equal(get_format("int8").decode(b8), b8.astype(np.uint8).view(np.int8))
    assert list(get_format("int4").decode(np.arange(16))) == list(range(8)) + list(range(-8, 0))
    assert list(get_format("uint4").decode(np.arange(16))) == list(range(16))


def test_fp32_decode_random_patterns_vs_numpy():
    b = RNG.integers(0, 1 << 32, 200_000, dtype=np.uint64)
    b = np.concatenate([b, [0, 1, 0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x80000000, 0x00800000]])
    ours = get_format("fp32").decode(b)
    with np.errstate(invalid="ignore"):
        theirs = b.astype(np.uint32).view(np.float32).astype(np.float64)
    assert np.array_equal(ours, theirs, equal_nan=True)


def test_special_patterns():
    e4 = get_format("fp8_e4m3")
    assert e4.decode(0x7E) == 448 and np.isnan(e4.decode(0x7F)) and np.isnan(e4.decode(0xFF))
    assert e4.decode(0x78) == 256                                    # 0.1111.000 is a number
    e5 = get_format("fp8_e5m2")
    assert e5.decode(0x7C) == np.inf and e5.decode(0xFC) == -np.inf and np.isnan(e5.decode(0x7D))
    assert np.isnan(get_format("e8m0").decode(0xFF)) and get_format("e8m0").decode(0) == 2.0 ** -127
    assert get_format("fp4_e2m1").decode(0b0111) == 6 and get_format("fp4_e2m1").decode(0b1001) == -0.5


def test_bad_bit_patterns_raise():
    with pytest.raises(ValueError, match="0 .. 255"):
        get_format("fp8_e4m3").decode(256)
    with pytest.raises(ValueError, match="0 .. 15"):
        get_format("fp4_e2m1").decode([3, 16])
    with pytest.raises(TypeError, match="integers"):
        get_format("int8").decode(0.5)


# ---- encode: round trips, ties, random values, edges ----------------------------------------

@pytest.mark.parametrize("name", SMALL)
def test_encode_inverts_decode_on_every_finite_pattern(name):
    s = get_format(name)
    b = all_patterns(name)
    v = s.decode(b)
    fin = np.isfinite(v)
    assert np.array_equal(s.encode(v[fin]), b[fin])
    assert s.encode(v[fin]).dtype == s.code_dtype


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "bf16"])
def test_encode_ties_and_neighbours_vs_ml_dtypes(name):
    x = probe_values(name).astype(np.float32)
    x = np.concatenate([x, -x])
    if name == "fp8_e4m3":       # ml_dtypes gives NaN past 464 (pinned below); compare under it
        x = x[np.abs(x) < 464]
    ours = get_format(name).encode(x)
    theirs = library_encode(x, name, "ml_dtypes")
    assert np.array_equal(ours, theirs), x[ours != theirs][:10]


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2", "bf16", "fp16"])
def test_encode_ties_and_neighbours_vs_torch(name):
    x = probe_values(name).astype(np.float32)
    x = np.concatenate([x, -x, [np.inf, -np.inf, 1e30, -1e30]]).astype(np.float32)
    ours = get_format(name).encode(x)
    theirs = library_encode(x, name, "torch")
    assert np.array_equal(ours, theirs), x[ours != theirs][:10]


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "bf16"])
def test_encode_random_values_vs_libraries(name):
    top = min(get_format(name).max_value, 1e30)
    x = np.concatenate([RNG.normal(0, 1, 20_000) * top / 4,
                        np.exp(RNG.uniform(-25, math.log(top) + 0.5, 20_000)) * RNG.choice([-1, 1], 20_000)])
    x = x.astype(np.float32)
    ours = get_format(name).encode(x)
    ok = np.abs(x) < 464 if name == "fp8_e4m3" else np.ones(x.shape, bool)
    assert np.array_equal(ours[ok], library_encode(x[ok], name, "ml_dtypes"))
    if name in TORCH:
        assert np.array_equal(ours, library_encode(x, name, "torch"))


def test_encode_fp32_and_fp16_vs_numpy():
    x = np.concatenate([RNG.normal(0, 1, 50_000),
                        np.exp(RNG.uniform(-120, 90, 50_000)) * RNG.choice([-1, 1], 50_000),
                        [0.0, -0.0, np.inf, -np.inf, 65519.99, 65520.0, 2.0 ** -25, 2.0 ** -25 * 1.0001,
                         3.4028235677973366e38, 3.5e38, 2.0 ** -150, 2.0 ** -150 * 1.0001]])
    with np.errstate(over="ignore"):
        for name, dt, uint in (("fp32", np.float32, np.uint32), ("fp16", np.float16, np.uint16)):
            assert np.array_equal(get_format(name).encode(x), x.astype(dt).view(uint)), name
    nan = get_format("fp32").encode(np.nan)
    assert np.isnan(np.uint32(nan).view(np.float32))


def test_encode_int_formats():
    x = np.array([-1e9, -128.5, -127.5, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 126.5, 127.4, 1e9,
                  np.inf, -np.inf])
    expected = np.clip(np.rint(x), -128, 127).astype(np.int8).view(np.uint8)
    assert np.array_equal(get_format("int8").encode(x), expected)
    assert list(get_format("int4").decode(get_format("int4").encode([-9, -8.5, -7.5, 6.5, 7.6, 50])))\
        == [-8, -8, -8, 6, 7, 7]
    assert list(get_format("uint4").round([-3, 0.5, 1.5, 14.5, 15.7])) == [0, 0, 2, 14, 15]
    for name in ("int4", "uint4"):
        x = RNG.uniform(-20, 30, 5000).astype(np.float32)
        clipped = np.rint(np.clip(x, get_format(name).int_min, get_format(name).int_max))
        assert np.array_equal(get_format(name).encode(x), library_encode(clipped, name, "ml_dtypes"))


def test_e8m0_vs_torch_and_ml_dtypes_on_positive_values():
    x = np.concatenate([np.exp2(RNG.uniform(-130, 128, 20_000)),
                        np.exp2(np.arange(-127, 128)) * 1.5, np.exp2(np.arange(-127, 128)),
                        [2.0 ** -140, 2.0 ** 127 * 1.4999]]).astype(np.float32)
    # float32 subnormals between 2^-127 and 2^-126 round up in both libraries (pinned below)
    x = x[(x >= 2.0 ** -126) | (x <= 2.0 ** -127)]
    ours = get_format("e8m0").encode(x)
    assert np.array_equal(ours, library_encode(x, "e8m0", "torch"))
    assert np.array_equal(ours, library_encode(x, "e8m0", "ml_dtypes"))
    assert get_format("e8m0").round([1.5, 3.0, 0.75, 1.25]).tolist() == [2.0, 4.0, 1.0, 1.0]


@pytest.mark.parametrize("name, x, expected", [
    ("fp8_e4m3", [448, 464, 464.01, 1e6, np.inf, -np.inf], [448, 448, 448, 448, 448, -448]),
    ("fp8_e5m2", [57344, 61439, 61440, np.inf], [57344, 57344, np.inf, np.inf]),
    ("fp4_e2m1", [0.25, 0.75, 1.25, 2.5, 3.5, 5, 7, np.inf], [0, 1, 1, 2, 4, 4, 6, 6]),
    ("fp16", [65519, 65520, -1e6], [65504, np.inf, -np.inf]),
    ("e8m0", [0.0, 2.0 ** -130, 2.0 ** 127 * 1.5, np.inf], [2.0 ** -127, 2.0 ** -127, np.nan, np.nan]),
    ("nf4", [-5, 5, 0.03, 0.04, 0.05, -np.inf], [-1, 1, 0, 0.07958029955625534, 0.07958029955625534, -1]),
])
def test_overflow_rules_and_edges(name, x, expected):
    assert np.array_equal(get_format(name).round(x), np.array(expected, dtype=np.float64),
                          equal_nan=True)


def test_nan_handling():
    for name in ("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "e8m0"):
        assert np.isnan(get_format(name).round(np.nan))
    assert get_format("fp8_e4m3").encode(np.nan) == 0x7F
    for name in ("int8", "int4", "uint4", "fp4_e2m1", "nf4"):
        with pytest.raises(ValueError, match="has no NaN"):
            get_format(name).encode([1.0, np.nan])


def test_negative_zero_keeps_its_sign():
    for name in ("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1"):
        s = get_format(name)
        assert s.encode(-0.0) == 1 << (s.bits - 1)
        assert s.encode(-1e-300) == 1 << (s.bits - 1)


def test_e8m0_rejects_negative_numbers():
    with pytest.raises(ValueError, match="no sign bit"):
        get_format("e8m0").encode([1.0, -2.0])


# ---- NF4 --------------------------------------------------------------------------------

def test_nf4_matches_published_table_bit_for_bit():
    levels = nf4_levels()
    assert np.array_equal(levels.astype(np.float32), np.array(NF4_PUBLISHED, dtype=np.float32))
    assert (levels > 0).sum() == 8 and (levels < 0).sum() == 7 and levels[7] == 0.0
    assert np.array_equal(get_format("nf4").values(), levels)


def test_nf4_encodes_to_the_nearest_level():
    x = RNG.uniform(-1.2, 1.2, 10_000)
    codes = get_format("nf4").encode(x)
    levels = np.array(NF4_PUBLISHED)
    nearest = np.argmin(np.abs(np.clip(x, -1, 1)[:, None] - levels[None, :]), axis=1)
    assert np.array_equal(codes, nearest)


# ---- round_to_format keeps the input's type -----------------------------------------------

def test_round_to_format_types():
    x32 = np.array([0.1, 500.0], dtype=np.float32)
    out = round_to_format(x32, "fp8_e4m3")
    assert out.dtype == np.float32 and out.tolist() == [0.1015625, 448.0]
    out = round_to_format([0.1, 500.0], "fp8_e4m3")
    assert isinstance(out, np.ndarray) and out.dtype == np.float64
    assert round_to_format(0.3, "fp4_e2m1") == 0.5 and isinstance(round_to_format(0.3, "fp4_e2m1"), float)
    assert round_to_format(np.arange(3), "int4").dtype == np.float64
    t = torch.tensor([0.1, 1.0009765625, 70000.0], dtype=torch.bfloat16)
    r = round_to_format(t, "fp8_e5m2")
    assert r.dtype == torch.bfloat16 and r.device == t.device
    assert r.tolist() == [0.09375, 1.0, float("inf")]
    ti = round_to_format(torch.tensor([3, 9]), "int4")
    assert ti.dtype == torch.float32 and ti.tolist() == [3.0, 7.0]
    tf = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(round_to_format(tf, "fp8_e4m3"),
                       tf.to(torch.float8_e4m3fn).to(torch.float32))
    assert torch.equal(round_to_format(tf, "bf16"), tf.to(torch.bfloat16).to(torch.float32))


# ---- fields, bit strings, explanations ----------------------------------------------------

def test_fields_and_bit_strings():
    e4 = get_format("fp8_e4m3")
    s, e, m = e4.fields(np.array([0xBE]))
    assert (s[0], e[0], m[0]) == (1, 7, 6)
    assert e4.bit_string(0x7E) == "0 1111 110"
    assert get_format("fp32").bit_string(0x3F800000) == "0 01111111 00000000000000000000000"
    assert get_format("e8m0").bit_string(127) == "01111111"
    d = e4.describe(0x7E)
    assert d["category"] == "normal" and d["value"] == 448 and d["exponent"] == 8
    assert "2^(15 - 7)" in d["formula"]
    assert e4.describe(0x01)["category"] == "subnormal" and e4.describe(0x7F)["category"] == "nan"
    assert get_format("fp8_e5m2").describe(0x7C)["category"] == "inf"
    assert get_format("int8").describe(0xFF)["value"] == -1
    assert get_format("nf4").describe(7)["value"] == 0.0


def test_values_refuses_fp32():
    with pytest.raises(ValueError, match="up to 16 bits"):
        get_format("fp32").values()


# ---- the libraries' known differences, pinned ---------------------------------------------

def test_known_difference_e4m3_overflow_ml_dtypes_nan_torch_saturates():
    x = np.array([460.0, 464.0, 464.5, 1000.0, np.inf], dtype=np.float32)
    md = x.astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    th = torch.from_numpy(x).to(torch.float8_e4m3fn).to(torch.float64).numpy()
    assert md[:2].tolist() == [448.0, 448.0] and np.isnan(md[2:]).all()
    assert th.tolist() == [448.0] * 5
    assert get_format("fp8_e4m3").round(x).tolist() == [448.0] * 5      # we follow torch


def test_known_difference_e8m0_zero_and_negatives():
    x = np.array([0.0, -1.0], dtype=np.float32)
    assert np.isnan(x.astype(ml_dtypes.float8_e8m0fnu).astype(np.float64)).all()
    th = torch.from_numpy(x).to(torch.float8_e8m0fnu).to(torch.float64).tolist()
    assert th == [2.0 ** -127, 1.0]                                     # torch: |x|, 0 -> 2^-127
    assert get_format("e8m0").round(0.0) == 2.0 ** -127                  # we: 0 -> 2^-127 too
    with pytest.raises(ValueError, match="no sign bit"):                # ... but refuse negatives
        get_format("e8m0").round(-1.0)
    # ties go up in all three (1.5 -> 2, 3 -> 4)
    ties = np.array([1.5, 3.0], dtype=np.float32)
    assert ties.astype(ml_dtypes.float8_e8m0fnu).astype(np.float64).tolist() == [2.0, 4.0]


def test_known_difference_e8m0_libraries_round_float32_subnormals_up():
    x = (np.array([1.01, 1.3, 1.49]) * 2.0 ** -127).astype(np.float32)   # nearest: 2^-127
    for lib in ("torch", "ml_dtypes"):
        assert library_encode(x, "e8m0", lib).tolist() == [1, 1, 1]       # 2^-126
    assert get_format("e8m0").encode(x).tolist() == [0, 0, 0]            # 2^-127


def test_known_difference_int4_casts_truncate_and_wrap():
    x = np.array([1.7, -1.7, 2.5, 9.0, -9.0], dtype=np.float32)
    assert x.astype(ml_dtypes.int4).astype(np.int64).tolist() == [1, -1, 2, -7, 7]
    assert get_format("int4").round(x).tolist() == [2, -2, 2, 7, -8]
    assert np.array([-1.0], np.float32).astype(ml_dtypes.uint4).astype(int).tolist() == [15]


def test_known_difference_fp4_nan_becomes_negative_zero_in_ml_dtypes():
    y = np.array([np.nan], np.float32).astype(ml_dtypes.float4_e2m1fn).astype(np.float64)
    assert y[0] == 0 and np.signbit(y[0])
    with pytest.raises(ValueError, match="has no NaN"):
        get_format("fp4_e2m1").encode(np.nan)


def test_known_difference_e5m2_nan_pattern():
    nan32 = np.array([np.nan], np.float32)
    assert library_encode(nan32, "fp8_e5m2", "torch")[0] == 0x7F
    assert library_encode(nan32, "fp8_e5m2", "ml_dtypes")[0] == 0x7E
    assert get_format("fp8_e5m2").encode(np.nan) == 0x7E


# ---- custom small floats (lesson 01's exercise) --------------------------------------------

def test_make_float_format_fp6_and_exercise_reference():
    assert formats.make_float_format(3, 2).max_value == 28.0         # MX FP6 E3M2
    assert formats.make_float_format(2, 3).max_value == 7.5          # MX FP6 E2M3
    assert formats.nonnegative_float_values(2, 1, 1).tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    e4m3_all = formats.make_float_format(4, 3, 7)
    assert e4m3_all.max_value == 480.0                               # no NaN pattern reserved
    assert not np.signbit(formats.nonnegative_float_values(2, 1, 1)[0])
    with pytest.raises(ValueError, match="exponent_bits"):
        formats.make_float_format(0, 3)


# ---- the widget and plots ------------------------------------------------------------------

def test_bit_explorer_flips_bits_and_rounds_typed_numbers():
    from course_lib.widgets.formats import bit_explorer

    box = bit_explorer("fp8_e4m3", 0.1)
    c = box.controls
    assert len(c["bits"]) == 8 and "0.1015625" in box.nearest.value
    assert [b.value for b in c["bits"]] == [bool(int(ch)) for ch in "00011101"]
    c["number"].value = 1000.0                                       # saturates
    assert "<b>448</b>" in box.nearest.value and "<b>448</b>" in box.result.value
    c["bits"][7].value = True                                        # 0x7F: NaN
    assert "nan" in box.result.value
    c["bits"][0].value = True
    assert "0xFF" in box.result.value
    c["format"].value = "fp4_e2m1"
    assert len(box.controls["bits"]) == 4 and "<b>6</b>" in box.nearest.value
    for b in box.controls["bits"]:
        b.value = False
    box.controls["bits"][2].value = True                             # 0 01 0 = 1.0
    assert "<b>1</b>" in box.result.value
    c["format"].value = "e8m0"
    c["number"].value = -3.0
    assert "no sign bit" in box.nearest.value
    c["format"].value = "fp32"
    assert len(box.controls["bits"]) == 32


def test_value_grids_and_spacing():
    from course_lib.widgets.formats import spacing, value_grids

    g = value_grids()
    assert len(g["int4"]) == 15 and np.allclose(np.diff(g["int4"]), 1 / 7)
    assert g["fp4_e2m1"].max() == 1 and len(g["fp4_e2m1"]) == 15 and len(g["nf4"]) == 16
    v, gap = spacing("fp8_e4m3")
    normal = v >= 2.0 ** -6
    assert np.all((gap[normal] / v[normal] <= 0.125) & (gap[normal] / v[normal] > 0.0625))


def test_explain_rounding_shows_each_step():
    text = formats.explain_rounding(0.001, "fp8_e4m3")
    assert "raised to the smallest normal exponent -6" in text and "2^-9" in text
    assert "stored value 0.001953125" in text
    text = formats.explain_rounding(1000, "fp8_e4m3")
    assert "overflow rule 'saturate' gives 448" in text
    assert "ties to even: 8" in formats.explain_rounding(1.0625, "fp8_e4m3")
    assert "level 11" in formats.explain_rounding(0.3, "nf4")
    with pytest.raises(ValueError, match="has no NaN"):
        formats.explain_rounding(float("nan"), "int8")


def test_cross_checks_report_per_library():
    from course_lib.formats import cross_check_decode, cross_check_encode
    assert cross_check_decode("fp8_e4m3") == {"torch": 0, "ml_dtypes": 0}
    assert cross_check_decode("fp4_e2m1") == {"ml_dtypes": 0}          # torch cannot cast FP4
    report = cross_check_encode("fp8_e4m3", n_random=2000)
    n, tried, smallest = report["ml_dtypes"]
    assert tried == 2000 + 2 * len(get_format("fp8_e4m3").values()) - 1
    assert n > 0 and smallest > 464                                  # only the NaN-past-464 rule
    assert report["torch"][0] == 0
    with pytest.raises(ValueError, match="n_random is a count"):
        cross_check_encode("fp8_e4m3", n_random=-1)


@pytest.mark.parametrize("call, words", [
    (lambda: get_format("fp8_e4m3").decode(256), "every pattern must be in 0 .. 255"),
    (lambda: get_format("fp8_e4m3").decode(-1), "every pattern must be in 0 .. 255"),
    (lambda: get_format("fp8_e4m3").describe(300), "every pattern must be in 0 .. 255"),
    (lambda: get_format("fp4_e2m1").encode(math.nan), "has no NaN"),
    (lambda: get_format("e8m0").encode(-1.0), "no sign bit"),
    (lambda: formats.nonnegative_float_values(0, 1, 1), "exponent_bits >= 1"),
    (lambda: formats.nonnegative_float_values(2, 2.5, 1), "mantissa_bits must be a whole number"),
    (lambda: formats.make_float_format(3, 2, bias=1.5), "bias must be a whole number"),
    (lambda: formats.round_to_format("1.0", "fp8_e4m3"), "convert it with float"),
    (lambda: formats.format_table(["fp7"]), "unknown number format"),
    (lambda: formats.library_decode([1], "fp8_e4m3", "jax"), "library must be"),
    (lambda: formats.library_decode([1], "nf4", "torch"), "torch has no castable nf4"),
    (lambda: get_format("fp32").values(), "too many to list"),
])
def test_formats_refuse_bad_input(call, words):
    with pytest.raises(ValueError, match=words):
        call()


def test_formatspec_reads_in_one_sitting_and_methods_are_the_module_functions():
    import ast
    import inspect as ins
    tree = ast.parse(ins.getsource(formats))
    sizes = {n.name: n.end_lineno - n.lineno + 1 for n in tree.body
             if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    assert sizes["FormatSpec"] <= 200, sizes["FormatSpec"]
    assert max(sizes.values()) <= 200, max(sizes, key=sizes.get)
    e4 = get_format("fp8_e4m3")
    x = np.array([0.1, -3.3, 500.0, 1.0625])
    assert (e4.encode(x) == formats.encode(e4, x)).all()
    assert formats.round_magnitude(e4, np.array([1.0625, 0.001])).tolist() == [1.0, 2.0 ** -9]
    assert formats.describe_pattern(e4, 0x7E)["value"] == 448
