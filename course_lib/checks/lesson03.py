"""Exercises of lesson 03, "Outliers and block scales" (solutions/03_outliers_and_block_scales.ipynb)."""
from __future__ import annotations

import numpy as np

from course_lib import quant
from course_lib.checks import Case, Exercise, register

EX_B_OUTLIER = [0.423, -1.270, 0.081, 9.0, -0.337, 0.562, -0.708, 1.049]


# ---------------------------------------------------------------- 03.groupwise_quantize

def groupwise_quantize(w, group_size, bits=4):
    """(q, scales) of symmetric INT``bits`` with one absmax scale per ``group_size``
    consecutive values of each row: q int8 (rows, cols), scales (rows, cols // group_size).
    Calls ``quant.quantize`` (lesson 03 exercise)."""
    qt = quant.quantize(w, f"int{bits}", "per_group", group_size)
    return qt.q, qt.scale


def _group_cases():
    rng = np.random.default_rng(3)
    w = rng.normal(0, 0.02, size=(4, 64))
    w[1, 5] = 0.6
    z = rng.normal(size=(2, 16))
    z[0, 8:] = 0.0
    return [
        Case((np.array([EX_B_OUTLIER]), 4), label="the outlier row, two groups of four"),
        Case((w, 16), label="4 x 64 weights with one outlier, groups of 16"),
        Case((w, 32, 3), label="INT3, groups of 32"),
        Case((rng.normal(size=(3, 24)) * np.array([[1.0], [10.0], [0.1]]), 8),
             label="rows of very different size (scales must be per row)",
             hint="Is each group's scale taken over its own values only (its row, its columns)?"),
        Case((z, 8), label="an all-zero group (scale 1.0, codes 0)",
             hint="An all-zero group has a largest magnitude of 0: which scale keeps the "
                  "division away from 0 / 0 (no NaN back)?"),
        Case((np.array([[7.0, 0.5, 1.5, 2.5, -2.5, -0.5, 3.5, -6.5]]), 8),
             label="exact ties (0.5, 1.5, 2.5, ... steps): round half to even",
             hint="Exactly half-way between two codes: which way does the task round? Half to even "
                  "(np.round, torch.round, Python's round); floor(x + 0.5) and rounding away from "
                  "zero do not."),
        Case((w, 48), label="48 does not divide 64: raise ValueError", raises=ValueError),
        Case((w, 0), label="group size 0: raise ValueError", raises=ValueError),
    ]


def _wrong_group_columns(w, group_size, bits=4):  # max over the rows: one scale per column block
    qmax = 2 ** (bits - 1) - 1
    g = w.reshape(w.shape[0], -1, group_size)
    s = np.abs(g).max(axis=(0, 2), keepdims=True) / qmax  # (1, n_groups, 1): shared by all rows
    s = np.where(s == 0, 1.0, s)
    q = np.clip(np.round(g / s), -qmax, qmax).astype(np.int8).reshape(w.shape)
    return q, np.broadcast_to(s[..., 0], (w.shape[0], g.shape[1])).copy()


def _wrong_group_per_row(w, group_size, bits=4):  # one scale per row, repeated
    if w.shape[-1] % group_size:
        raise ValueError("group size does not divide")
    qt = quant.quantize(w, f"int{bits}", "per_channel")
    return qt.q, np.repeat(qt.scale, w.shape[-1] // group_size, axis=-1)


def _wrong_group_floor(w, group_size, bits=4):  # floor instead of round
    qmax = 2 ** (bits - 1) - 1
    g = w.reshape(w.shape[0], -1, group_size)
    s = np.abs(g).max(-1, keepdims=True) / qmax
    s = np.where(s == 0, 1.0, s)
    return np.clip(np.floor(g / s), -qmax, qmax).astype(np.int8).reshape(w.shape), s[..., 0]


def _wrong_group_half_up(w, group_size, bits=4):  # floor(v + 0.5): ties always go up
    if group_size < 1 or w.shape[-1] % group_size:
        raise ValueError("group size does not divide")
    qmax = 2 ** (bits - 1) - 1
    g = w.reshape(w.shape[0], -1, group_size)
    s = np.abs(g).max(-1, keepdims=True) / qmax
    s = np.where(s == 0, 1.0, s)
    return np.clip(np.floor(g / s + 0.5), -qmax, qmax).astype(np.int8).reshape(w.shape), s[..., 0]


def _wrong_group_clamp8(w, group_size, bits=4):  # scale for 2**(bits-1) levels, clamp to +-8
    qmax = 2 ** (bits - 1)
    g = w.reshape(w.shape[0], -1, group_size)
    s = np.abs(g).max(-1, keepdims=True) / qmax
    s = np.where(s == 0, 1.0, s)
    return np.clip(np.round(g / s), -qmax, qmax).astype(np.int8).reshape(w.shape), s[..., 0]


register(Exercise(
    id="03.groupwise_quantize",
    title="group-wise INT4 quantization",
    reference=groupwise_quantize,
    cases=_group_cases,
    hint=["This is lesson 02's absmax quantizer applied to every run of group_size values of "
          "each row separately. How can you give numpy those runs as one axis, so that a single "
          "max finds every group's scale at once? Which group sizes must you refuse?",
          "w.reshape(rows, cols // group_size, group_size) puts each group on the last axis; "
          "its max over axis -1 (keepdims=True) broadcasts back against the groups. "
          "np.round rounds ties to even.",
          "Raise ValueError unless group_size >= 1 and cols % group_size == 0; scale = "
          "max|g| / (2**(bits-1) - 1), 1.0 where 0; q = clip(round(g / scale)) as int8 "
          "reshaped to (rows, cols); return (q, scale[..., 0])."],
    wrong=[_wrong_group_columns, _wrong_group_per_row, _wrong_group_floor, _wrong_group_clamp8,
           _wrong_group_half_up],
))


# ---------------------------------------------------------------- 03.pack_int4

def _pack_cases():
    all_pairs = quant.unpack_int4(np.arange(256, dtype=np.uint8))
    rng = np.random.default_rng(4)
    return [
        Case((np.array([1, -1, 7, -8], dtype=np.int8),), label="[1, -1, 7, -8] -> 0xF1, 0x87"),
        Case((all_pairs,), label="all 256 nibble pairs"),
        Case((rng.integers(-8, 8, size=(3, 10)).astype(np.int8),), label="a 3 x 10 matrix"),
        Case((np.zeros((2, 2), dtype=np.int8),), label="zeros"),
        Case((np.array([1, 2, 3], dtype=np.int8),), label="odd length: raise ValueError",
             raises=ValueError),
        Case((np.array([3, 8], dtype=np.int8),), label="8 is outside -8..7: raise ValueError",
             raises=ValueError),
    ]


def _odd_guard(q):
    if q.shape[-1] % 2 or q.min(initial=0) < -8 or q.max(initial=0) > 7:
        raise ValueError("odd last dimension or a code outside -8..7")


def _wrong_pack_swapped(q):  # element 2i in the HIGH nibble
    _odd_guard(q)
    u = q.astype(np.uint8) & 0xF
    return ((u[..., 0::2] << 4) | u[..., 1::2]).astype(np.uint8)


def _wrong_pack_offset(q):  # stores q + 8 (offset binary) instead of two's complement
    _odd_guard(q)
    u = (q.astype(np.int16) + 8).astype(np.uint8)
    return (u[..., 0::2] | (u[..., 1::2] << 4)).astype(np.uint8)


def _wrong_pack_no_mask(q):  # forgets & 0xF: a negative low code spills into the high nibble
    _odd_guard(q)
    u = q.astype(np.uint8)
    return (u[..., 0::2] | (u[..., 1::2] << 4)).astype(np.uint8)


def _wrong_pack_no_range_check(q):  # 8 silently becomes -8 (0x8)
    if q.shape[-1] % 2:
        raise ValueError("odd last dimension")
    u = q.astype(np.uint8) & 0xF
    return (u[..., 0::2] | (u[..., 1::2] << 4)).astype(np.uint8)


def _wrong_pack_halves(q):  # pairs element i with element i + n/2
    _odd_guard(q)
    n = q.shape[-1] // 2
    u = q.astype(np.uint8) & 0xF
    return (u[..., :n] | (u[..., n:] << 4)).astype(np.uint8)


register(Exercise(
    id="03.pack_int4",
    title="pack two INT4 codes per byte",
    reference=quant.pack_int4,
    cases=_pack_cases,
    hint=["A byte has two 4-bit halves. How is a negative code such as -1 written in 4 bits "
          "(two's complement)? Which element goes in the low half? Which inputs cannot be "
          "packed at all?",
          "The low 4 bits of q.astype(np.uint8) are the two's-complement nibble (& 0xF): "
          "-1 -> 0xF. Element 2i goes in the low nibble, 2i+1 in the high one (<< 4).",
          "Raise ValueError for an odd last dimension or a code outside -8..7; nib = "
          "q.astype(np.uint8) & 0xF; return (nib[..., 0::2] | (nib[..., 1::2] << 4)) as uint8."],
    wrong=[_wrong_pack_swapped, _wrong_pack_offset, _wrong_pack_no_mask, _wrong_pack_halves,
           _wrong_pack_no_range_check],
))


# ---------------------------------------------------------------- 03.mxfp4_block

def mxfp4_block(block):
    """(scale, elements) of one 32-value MXFP4 block: the power-of-two scale as a Python
    float and the E2M1 elements as float32 (32,). Calls ``quant.quantize_mxfp4``
    (lesson 03 exercise)."""
    qt = quant.quantize_mxfp4(np.asarray(block, dtype=np.float32).reshape(1, -1))
    if qt.q.shape[-1] != 32:
        raise ValueError(f"an MXFP4 block holds 32 values, got {qt.q.shape[-1]}")
    return float(qt.scale[0, 0]), qt.q[0]


def _mx_cases():
    rng = np.random.default_rng(6)
    b1 = np.zeros(32, dtype=np.float32)
    b1[:4] = [1.0, -2.5, 0.3, 7.0]
    b2 = np.zeros(32, dtype=np.float32)
    b2[:3] = [0.9, -0.2, 0.05]
    b4 = (rng.normal(size=32) * 0.02).astype(np.float32)
    b5 = np.linspace(-4.0, 4.0, 32).astype(np.float32)
    b6 = np.zeros(32, dtype=np.float32)
    b6[:3] = [-3.0, 0.5, 1.0]
    b7 = np.zeros(32, dtype=np.float32)
    b7[:8] = [6.0, 2.5, 5.0, 0.25, 1.25, 1.75, -0.1, -0.2]
    return [
        Case((b1,), label="max 7: exponent floor(log2 7) - 2 = 0, 7 saturates to 6"),
        Case((b2,), label="max 0.9: scale 2**-3"),
        Case((b4,), label="32 small random weights"),
        Case((b5,), label="max exactly 4.0, a power of two"),
        Case((b6,), label="largest magnitude is negative (-3.0): use max|x|"),
        Case((np.zeros(32, dtype=np.float32),), label="all zeros (scale 1.0)",
             hint="An all-zero group has a largest magnitude of 0: which scale keeps the "
                  "division away from 0 / 0 (no NaN back)?"),
        Case((b7,), label="E2M1 ties (2.5, 5, 0.25, 1.25, 1.75) round to even; -0.1 gives -0.0",
             hint="E2M1 ties round to the even neighbour, and a tiny negative value keeps its sign "
                  "as -0.0: does yours?"),
        Case((np.ones(20, dtype=np.float32),), label="20 values: raise ValueError",
             raises=ValueError),
    ]


def _e2m1(y):
    from course_lib.formats import round_to_format

    return round_to_format(np.clip(y, -6, 6).astype(np.float32), "fp4_e2m1").astype(np.float32)


def _mx_guard(block):
    if block.shape[-1] != 32:
        raise ValueError("32 values")
    return float(np.abs(block).max())


def _wrong_mx_fit_rule(block):  # smallest power of two with max/scale <= 6 (not OCP's rule)
    amax = _mx_guard(block)
    scale = 2.0 ** np.ceil(np.log2(amax / 6.0)) if amax else 1.0
    return float(scale), _e2m1(block / scale)


def _wrong_mx_not_pow2(block):  # scale = max / 6, like INT absmax
    amax = _mx_guard(block)
    scale = amax / 6.0 if amax else 1.0
    return float(scale), _e2m1(block / scale)


def _wrong_mx_int_grid(block):  # rounds to integers -6..6 instead of the E2M1 grid
    amax = _mx_guard(block)
    scale = 2.0 ** (np.floor(np.log2(amax)) - 2) if amax else 1.0
    return float(scale), np.clip(np.round(block / scale), -6, 6).astype(np.float32)


def _wrong_mx_emax(block):  # subtracts 1 instead of E2M1's largest exponent, 2
    amax = _mx_guard(block)
    scale = 2.0 ** (np.floor(np.log2(amax)) - 1) if amax else 1.0
    return float(scale), _e2m1(block / scale)


def _wrong_mx_half_up(block):  # rounds E2M1 ties away from zero
    amax = _mx_guard(block)
    scale = 2.0 ** (np.floor(np.log2(amax)) - 2) if amax else 1.0
    y = np.clip(block / scale, -6, 6)
    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    a = np.abs(y)[:, None]
    d = np.abs(a - grid[None, :]) - 1e-9 * grid[None, :]         # ties go to the larger level
    return float(scale), (np.sign(y) * grid[np.argmin(d, axis=1)]).astype(np.float32)


def _wrong_mx_signed_max(block):  # max(x) instead of max(|x|): misses a negative peak
    _mx_guard(block)
    amax = float(np.max(block))
    scale = 2.0 ** (np.floor(np.log2(amax)) - 2) if amax > 0 else 1.0
    return float(scale), _e2m1(block / scale)


register(Exercise(
    id="03.mxfp4_block",
    title="quantize one MXFP4 block",
    reference=mxfp4_block,
    cases=_mx_cases,
    hint=["The scale must be a power of two. OCP's rule lines up the block's largest "
          "exponent with E2M1's largest exponent: what is the exponent of E2M1's top value 6? "
          "What happens to a value that still lands above 6?",
          "6 = 1.5 x 2**2, so shared exponent = floor(log2(max|x|)) - 2 and scale = "
          "2.0**exponent (1.0 for an all-zero block). Elements: x / scale, clipped to "
          "-6..6, rounded onto the E2M1 grid.",
          "round_to_format(np.clip(block / scale, -6, 6).astype(np.float32), 'fp4_e2m1'); "
          "raise ValueError unless there are 32 values; return (float(scale), elements "
          "as float32)."],
    signed_zero=True,
    wrong=[_wrong_mx_half_up, _wrong_mx_fit_rule, _wrong_mx_not_pow2, _wrong_mx_int_grid, _wrong_mx_emax,
           _wrong_mx_signed_max],
))


# ---------------------------------------------------------------- 03.asym_groupwise

def asym_groupwise(w, group_size, bits=4):
    """Asymmetric (scale + zero point) group-wise fake quantization: w_hat, same shape and
    dtype as w. Calls ``quant.fake_quantize(..., symmetric=False)`` (lesson 03 exercise)."""
    return quant.fake_quantize(w, f"int{bits}", "per_group", group_size, symmetric=False)


def _asym_cases():
    rng = np.random.default_rng(8)
    lop = rng.uniform(-0.4, 1.1, size=(3, 32))
    w = rng.normal(0, 0.02, size=(4, 64))
    w[2, 7] = 0.6
    pos = np.abs(rng.normal(size=(2, 16))) + 0.5          # all above zero: widen to include 0
    return [
        Case((np.array([[-0.4, 0.0, 0.3, 0.75, 1.1, 0.2, -0.1, 0.5]]), 8),
             label="lesson 02's range -0.4..1.1, one group of 8"),
        Case((lop, 16), label="lopsided rows, groups of 16"),
        Case((w, 32, 3), label="INT3 with an outlier, groups of 32"),
        Case((pos, 8), label="every value above 0 (the range must still include 0)",
             hint="Widen the range to include 0 first (x_min at most 0, x_max at least 0); only a "
                  "range still empty after that gets the task's fallback scale."),
        Case((np.zeros((2, 8)), 4), label="all-zero groups",
             hint="An all-zero group has a largest magnitude of 0: which scale keeps the "
                  "division away from 0 / 0 (no NaN back)?"),
        Case((np.array([[0.5] * 4 + [-0.3] * 4, [0.0] * 4 + [1.0, 1.0, 1.0, 1.0]]), 4),
             label="constant groups (min == max, not 0): widened to include 0, not empty",
             hint="Widen the range to include 0 first (x_min at most 0, x_max at least 0); only a "
                  "range still empty after that gets the task's fallback scale."),
        Case((np.array([[0.0, 0.25, 0.75, 1.5]]), 4, 2),
             label="INT2 ties: x / scale + zero lands on .5 (round half to even)",
             hint="Exactly half-way between two codes: which way does the task round? Half to even "
                  "(np.round, torch.round, Python's round); floor(x + 0.5) and rounding away from "
                  "zero do not."),
        Case((lop, 5), label="5 does not divide 32: raise ValueError", raises=ValueError),
    ]


def _asym_groups(w, group_size):
    if group_size < 1 or w.shape[-1] % group_size:
        raise ValueError("group size does not divide")
    return w.reshape(w.shape[0], -1, group_size)


def _wrong_asym_no_widen(w, group_size, bits=4):  # range not widened to include 0
    g = _asym_groups(w, group_size)
    lo, hi = g.min(-1, keepdims=True), g.max(-1, keepdims=True)
    scale = np.where(hi - lo == 0, 1.0, (hi - lo) / (2 ** bits - 1))
    z = np.clip(np.round(-lo / scale), 0, 2 ** bits - 1)
    q = np.clip(np.round(g / scale) + z, 0, 2 ** bits - 1)
    return ((q - z) * scale).reshape(w.shape)


def _wrong_asym_symmetric(w, group_size, bits=4):  # forgets the zero point altogether
    _asym_groups(w, group_size)
    return quant.fake_quantize(w, f"int{bits}", "per_group", group_size)


def _wrong_asym_unclipped(w, group_size, bits=4):  # no clamp: a code may leave 0..2**bits-1
    g = _asym_groups(w, group_size)
    lo = np.minimum(g.min(-1, keepdims=True), 0)
    hi = np.maximum(g.max(-1, keepdims=True), 0)
    scale = np.where(hi - lo == 0, 1.0, (hi - lo) / (2 ** bits))      # 2**bits steps
    z = np.round(-lo / scale)
    q = np.round(g / scale) + z
    return ((q - z) * scale).reshape(w.shape)


def _wrong_asym_half_up(w, group_size, bits=4):  # floor(v + 0.5) instead of half to even
    g = _asym_groups(w, group_size)
    lo = np.minimum(g.min(-1, keepdims=True), 0)
    hi = np.maximum(g.max(-1, keepdims=True), 0)
    scale = np.where(hi - lo == 0, 1.0, (hi - lo) / (2 ** bits - 1))
    z = np.clip(np.floor(-lo / scale + 0.5), 0, 2 ** bits - 1)
    q = np.clip(np.floor(g / scale + 0.5) + z, 0, 2 ** bits - 1)
    return ((q - z) * scale).reshape(w.shape)


def _wrong_asym_equal_is_empty(w, group_size, bits=4):  # min == max read as an empty range
    g = _asym_groups(w, group_size)
    gmin, gmax = g.min(-1, keepdims=True), g.max(-1, keepdims=True)
    lo, hi = np.minimum(gmin, 0), np.maximum(gmax, 0)
    scale = np.where(gmax == gmin, 1.0, (hi - lo) / (2 ** bits - 1))
    z = np.where(gmax == gmin, 0.0, np.clip(np.round(-lo / scale), 0, 2 ** bits - 1))
    q = np.clip(np.round(g / scale) + z, 0, 2 ** bits - 1)
    return ((q - z) * scale).reshape(w.shape)


register(Exercise(
    id="03.asym_groupwise",
    title="asymmetric group-wise fake quantization",
    reference=asym_groupwise,
    cases=_asym_cases,
    hint=["Lesson 02's zero point, once per group: each group gets its own range, scale and "
          "zero point. What must each group's range include before you compute them, and in "
          "which order do you quantize and dequantize so the answer has w's shape?",
          "Group the values as in exercise 1; lo = min(group min, 0), hi = max(group max, 0); "
          "scale = (hi - lo) / (2**bits - 1) (1.0 for an empty range); zero = round(-lo / "
          "scale) clamped to 0..2**bits - 1.",
          "q = clip(round(g / scale) + zero, 0, 2**bits - 1); w_hat = (q - zero) * scale, "
          "reshaped to w.shape (np.round rounds ties to even)."],
    wrong=[_wrong_asym_no_widen, _wrong_asym_symmetric, _wrong_asym_unclipped,
           _wrong_asym_half_up, _wrong_asym_equal_is_empty],
))


# ---------------------------------------------------------------- 03.remove_outliers

def _outlier_cases():
    w = quant.synthetic_weights(rows=16, cols=64, n_outliers=3, outlier=0.6, seed=2)
    tie = np.ones((1, 36), dtype=np.float32)
    tie[0, 0] = 6.0          # row RMS = sqrt((36 + 35) / 36); 6.0 < 6 x RMS: it stays
    neg = np.full((2, 8), 0.1, dtype=np.float32)
    neg[1, 3] = -5.0
    return [
        Case((w,), label="16 x 64 weights with three planted outliers, k = 6"),
        Case((w, 3.0), label="k = 3 removes more"),
        Case((neg, 2.0), label="a negative outlier (compare |w|)",
             hint="Is an outlier judged by its value or by its magnitude?"),
        Case((tie, 6.0), label="an entry just under k x RMS stays"),
        Case((np.zeros((2, 4), dtype=np.float32),), label="all zeros: nothing to remove",
             hint="With an RMS of 0, does your comparison still leave the zeros alone, with no "
                  "NaN?"),
        Case((w, 0.0), label="k = 0: raise ValueError", raises=ValueError),
        Case((w[0],), label="a 1-D row: raise ValueError", raises=ValueError),
    ]


def _wrong_outliers_signed(w, k=6.0):  # w > k x RMS: misses negative outliers
    if k <= 0 or np.ndim(w) != 2:
        raise ValueError("bad input")
    rms = np.sqrt(np.mean(w.astype(np.float64) ** 2, axis=1, keepdims=True))
    return np.where(w > k * rms, 0, w).astype(w.dtype)


def _wrong_outliers_global(w, k=6.0):  # one RMS for the whole matrix, not per row
    if k <= 0 or np.ndim(w) != 2:
        raise ValueError("bad input")
    rms = np.sqrt(np.mean(w.astype(np.float64) ** 2))
    return np.where(np.abs(w) > k * rms, 0, w).astype(w.dtype)


def _wrong_outliers_std_mean_abs(w, k=6.0):  # mean |w| instead of the RMS
    if k <= 0 or np.ndim(w) != 2:
        raise ValueError("bad input")
    m = np.mean(np.abs(w), axis=1, keepdims=True)
    return np.where(np.abs(w) > k * m, 0, w).astype(w.dtype)


def _wrong_outliers_in_place(w, k=6.0):  # right values, but float64 out of float32 in
    if k <= 0 or np.ndim(w) != 2:
        raise ValueError("bad input")
    rms = np.sqrt(np.mean(w.astype(np.float64) ** 2, axis=1, keepdims=True))
    return np.where(np.abs(w) > k * rms, 0.0, w.astype(np.float64))


register(Exercise(
    id="03.remove_outliers",
    title="remove the outliers (entries above k x their row's RMS)",
    reference=quant.remove_outliers,
    cases=_outlier_cases,
    hint=["An outlier is large compared with the other weights *of its own row* (rows have "
          "very different spreads). Which measure of a row's size, and which comparison catches "
          "an outlier of either sign?",
          "row RMS = sqrt(mean(w**2)) over axis 1 with keepdims=True; an outlier has |w| > "
          "k x its row's RMS.",
          "np.where(np.abs(w) > k * rms, 0, w).astype(w.dtype); raise ValueError for k <= 0 "
          "or a w that is not 2-D."],
    wrong=[_wrong_outliers_signed, _wrong_outliers_global, _wrong_outliers_std_mean_abs,
           _wrong_outliers_in_place],
))


# ---------------------------------------------------------------- 03.largest_group_within

def _lg_cases():
    w = quant.synthetic_weights(rows=8, cols=96, n_outliers=2, outlier=0.6, seed=5)
    t8 = quant.relative_rms_error(w, quant.fake_quantize(w, "int8", "per_tensor"))
    g = np.random.default_rng(9).normal(size=(4, 64)).astype(np.float32)
    return [
        Case((w, t8), label="INT4 against INT8 per-tensor's error (8 x 96, divisors of 96)"),
        Case((w, 0.15), label="a 15% budget (the answer is not a power of two)"),
        Case((g, 0.5), label="a generous budget: the whole row is one group"),
        Case((g, 0.08, "int4", False), label="asymmetric INT4"),
        Case((g, 0.02, "int3"), label="INT3, a tight budget"),
        Case((w, -0.1), label="a negative budget: raise ValueError", raises=ValueError),
    ]


def _lg_check(w, target):
    if target < 0 or np.ndim(w) != 2:
        raise ValueError("bad input")


def _wrong_lg_smallest(w, target, fmt="int4", symmetric=True):  # the smallest passing group
    _lg_check(w, target)
    for g in quant.divisors(w.shape[1]):
        if quant.relative_rms_error(w, quant.fake_quantize(w, fmt, "per_group", g,
                                                           symmetric=symmetric)) <= target:
            return g
    return None


def _wrong_lg_powers_of_two(w, target, fmt="int4", symmetric=True):  # only tries 1, 2, 4, 8...
    _lg_check(w, target)
    best = None
    g = 1
    while g <= w.shape[1]:
        if w.shape[1] % g == 0 and quant.relative_rms_error(
                w, quant.fake_quantize(w, fmt, "per_group", g, symmetric=symmetric)) <= target:
            best = g
        g *= 2
    return best


def _wrong_lg_ignores_format(w, target, fmt="int4", symmetric=True):  # always INT4 symmetric
    _lg_check(w, target)
    return quant.largest_group_within(w, target)


def _wrong_lg_strict(w, target, fmt="int4", symmetric=True):  # < instead of <=, and in percent
    _lg_check(w, target)
    for g in sorted(quant.divisors(w.shape[1]), reverse=True):
        e = quant.relative_rms_error(w, quant.fake_quantize(w, fmt, "per_group", g,
                                                            symmetric=symmetric))
        if 100 * e < target:
            return g
    return None


register(Exercise(
    id="03.largest_group_within",
    title="the largest group size that meets an error budget",
    reference=quant.largest_group_within,
    cases=_lg_cases,
    int_results=True,
    hint=["Larger groups cost fewer scale bits but err more. Which group sizes are possible for "
          "a row of this length, in which order should you try them, and when can you stop?",
          "quant.divisors(cols) lists the possible sizes; try them from the largest down and "
          "return the first whose quant.relative_rms_error (a fraction, not %) is <= the target.",
          "for g in sorted(quant.divisors(w.shape[1]), reverse=True): w_hat = "
          "quant.fake_quantize(w, fmt, 'per_group', g, symmetric=symmetric); ... return None "
          "if none; raise ValueError for a negative target."],
    wrong=[_wrong_lg_smallest, _wrong_lg_powers_of_two, _wrong_lg_ignores_format,
           _wrong_lg_strict],
))
