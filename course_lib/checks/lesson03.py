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
             label="rows of very different size (scales must be per row)"),
        Case((z, 8), label="an all-zero group (scale 1.0, codes 0)"),
        Case((w, 48), label="48 does not divide 64: raise ValueError", raises=ValueError),
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
    hint=("Check cols % group_size == 0 (else raise ValueError); reshape each row into "
          "(rows, n_groups, group_size); scale = max|group| / (2**(bits-1) - 1), 1.0 where "
          "that is 0; q = clip(round(w / scale), -qmax, qmax) as int8, reshaped back to "
          "(rows, cols). Return (q, scales) with scales of shape (rows, n_groups)."),
    wrong=[_wrong_group_columns, _wrong_group_per_row, _wrong_group_floor, _wrong_group_clamp8],
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
    ]


def _odd_guard(q):
    if q.shape[-1] % 2:
        raise ValueError("odd last dimension")


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
    hint=("Raise ValueError if the last dim is odd. Take each code's two's-complement nibble "
          "(q.astype(np.uint8) & 0xF: -1 -> 0xF), then byte = even element | (odd element << 4): "
          "element 2i in the LOW nibble, 2i+1 in the HIGH nibble. Return uint8."),
    wrong=[_wrong_pack_swapped, _wrong_pack_offset, _wrong_pack_no_mask, _wrong_pack_halves],
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
    return [
        Case((b1,), label="max 7: exponent floor(log2 7) - 2 = 0, 7 saturates to 6"),
        Case((b2,), label="max 0.9: scale 2**-3"),
        Case((b4,), label="32 small random weights"),
        Case((b5,), label="max exactly 4.0, a power of two"),
        Case((b6,), label="largest magnitude is negative (-3.0): use max|x|"),
        Case((np.zeros(32, dtype=np.float32),), label="all zeros (scale 1.0)"),
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
    hint=("Raise ValueError unless the block has 32 values. OCP MX rule: shared exponent = "
          "floor(log2(max|x|)) - 2 (2 is the exponent of E2M1's largest value, 6 = 1.5 * 2**2); "
          "scale = 2.0**exponent (1.0 for an all-zero block); elements = E2M1(x / scale) "
          "saturated to +-6: clip, then course_lib.formats.round_to_format(..., 'fp4_e2m1'). "
          "Return (scale as a float, elements as float32)."),
    wrong=[_wrong_mx_fit_rule, _wrong_mx_not_pow2, _wrong_mx_int_grid, _wrong_mx_emax,
           _wrong_mx_signed_max],
))
