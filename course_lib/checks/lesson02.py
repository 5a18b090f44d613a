"""Exercises of lesson 02, "Absmax and zero points" (solutions/02_absmax_and_zero_points.ipynb)."""
from __future__ import annotations

import math

import numpy as np

from course_lib import quant
from course_lib.checks import Case, Exercise, register

EX_A = [0.12, -0.45, 0.03, 0.88, -0.27, 0.51, -0.09, 0.34]
EX_B = [0.423, -1.270, 0.081, 0.914, -0.337, 0.562, -0.708, 1.049]


# ---------------------------------------------------------------- 02.absmax_quantize

def _absmax_cases():
    rng = np.random.default_rng(2)
    return [
        Case((np.array(EX_A), 8), label="worked example A, INT8"),
        Case((np.array(EX_A), 4), label="worked example A, INT4"),
        Case((np.array(EX_B), 4), label="worked example B, INT4"),
        Case((np.array([-2.0, 0.5, 1.0, 0.25]), 4), label="largest magnitude is negative",
             hint="Is the scale set by the largest value, or by the largest magnitude?"),
        Case((rng.normal(size=64), 3), label="64 random values, INT3"),
        Case((np.array([0.3, -0.1, 0.05, 0.06]), 2), label="INT2: levels -1, 0, 1"),
        Case((np.zeros(5), 8), label="all zeros (scale must not be 0)",
             hint="An all-zero group has a largest magnitude of 0: which scale keeps the "
                  "division away from 0 / 0 (no NaN back)?"),
        Case((np.array([7.0, 0.5, 1.5, 2.5, -2.5, -0.5, 3.5]), 4),
             label="exact ties (x / scale = 0.5, 1.5, 2.5, ...): round half to even",
             hint="Exactly half-way between two codes: which way does the task round? Half to even "
                  "(np.round, torch.round, Python's round); floor(x + 0.5) and rounding away from "
                  "zero do not."),
        # no value here sits within a rounding of a tie, so float64 and float32 arithmetic
        # give the same codes (tests/test_checks.py runs both readings, ``right`` below)
        Case((np.array([0.2, -0.05, 0.11, 0.7, -0.33], dtype=np.float32), 8),
             label="float32 input (compute in float64 or float32: both pass)",
             hint="A float32 x: q must still be np.int8 codes and scale a Python float "
                  "(float(...)); either precision is fine here."),
        Case((np.array([3, -1, 2]), 4), label="integer input: the codes of 3, -1, 2",
             hint="x may hold integers: does your division truncate, and is q still np.int8?"),
    ]


def _right_absmax_float64(x, bits):  # everything in float64 first: also right
    x = np.asarray(x, dtype=np.float64)
    qmax = 2 ** (bits - 1) - 1
    scale = float(np.abs(x).max()) / qmax or 1.0
    return np.clip(np.round(x / scale), -qmax, qmax).astype(np.int8), scale


def _right_absmax_own_dtype(x, bits):  # scale and x / scale in x's own float dtype
    qmax = 2 ** (bits - 1) - 1
    dt = x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)
    scale = np.abs(x).max().astype(dt) / dt.type(qmax)
    scale = scale if scale != 0 else dt.type(1.0)
    return np.clip(np.round(x.astype(dt) / scale), -qmax, qmax).astype(np.int8), float(scale)


def _wrong_absmax_numpy_scale(x, bits):  # scale left as a numpy scalar of x's dtype
    q, scale = quant.absmax_quantize(x, bits)
    return q, np.asarray(x).dtype.type(scale) if np.asarray(x).dtype.kind == "f" else scale


def _wrong_absmax_pow2(x, bits):  # divides by 2**bits instead of qmax
    scale = float(np.abs(x).max()) / 2 ** bits or 1.0
    return np.clip(np.round(x / scale), -(2 ** (bits - 1) - 1), 2 ** (bits - 1) - 1).astype(np.int8), scale


def _wrong_absmax_floor(x, bits):  # floor instead of round
    qmax = 2 ** (bits - 1) - 1
    scale = float(np.abs(x).max()) / qmax or 1.0
    return np.clip(np.floor(x / scale), -qmax, qmax).astype(np.int8), scale


def _wrong_absmax_signed_max(x, bits):  # max(x) instead of max(|x|)
    qmax = 2 ** (bits - 1) - 1
    scale = float(np.max(x)) / qmax or 1.0
    return np.clip(np.round(x / scale), -qmax, qmax).astype(np.int8), scale


def _wrong_absmax_no_zero_guard(x, bits):  # 0 / 0 on an all-zero input
    qmax = 2 ** (bits - 1) - 1
    scale = float(np.abs(x).max()) / qmax
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.clip(np.round(x / scale), -qmax, qmax).astype(np.int8)
    return q, scale


def _wrong_absmax_half_up(x, bits):  # floor(v + 0.5): ties always go up
    qmax = 2 ** (bits - 1) - 1
    scale = float(np.abs(x).max()) / qmax or 1.0
    return np.clip(np.floor(x / scale + 0.5), -qmax, qmax).astype(np.int8), scale


def _wrong_absmax_float_codes(x, bits):  # right numbers, codes left as floats
    qmax = 2 ** (bits - 1) - 1
    scale = float(np.abs(x).max()) / qmax or 1.0
    return np.clip(np.round(x / scale), -qmax, qmax), scale


register(Exercise(
    id="02.absmax_quantize",
    title="symmetric absmax quantization",
    reference=quant.absmax_quantize,
    cases=_absmax_cases,
    hint=["Which stored level should the largest magnitude land on, so that +max and -max "
          "are both representable? That fixes the scale. Then: what happens to a value exactly "
          "halfway between two levels, and to a group that is all zeros?",
          "qmax = 2**(bits-1) - 1 (127 for INT8, 7 for INT4); scale = max(|x|) / qmax; "
          "np.round rounds halves to even (floor(v + 0.5) does not).",
          "q = np.clip(np.round(x / scale), -qmax, qmax).astype(np.int8); use scale 1.0 when "
          "max(|x|) is 0; return (q, float(scale)). Work in float64 or in x's own dtype: "
          "either passes."],
    wrong=[_wrong_absmax_pow2, _wrong_absmax_floor, _wrong_absmax_signed_max,
           _wrong_absmax_no_zero_guard, _wrong_absmax_float_codes, _wrong_absmax_half_up,
           _wrong_absmax_numpy_scale],
    right=[_right_absmax_float64, _right_absmax_own_dtype],
    float_results=True,
))


# ---------------------------------------------------------------- 02.zero_point

def _zp_cases():
    return [
        Case((-0.4, 1.1, 4), label="the lesson's range -0.4..1.1 in INT4"),
        Case((-1.0, 1.0, 8), label="symmetric range in 8 bits"),
        Case((0.2, 1.5, 4), label="range above zero (widen it to include 0)",
             hint="Widen the range to include 0 first (x_min at most 0, x_max at least 0); only a "
                  "range still empty after that gets the task's fallback scale."),
        Case((-3.0, -1.0, 8), label="range below zero",
             hint="Widen the range to include 0 first (x_min at most 0, x_max at least 0); only a "
                  "range still empty after that gets the task's fallback scale."),
        Case((-0.05, 0.7, 3), label="3 bits"),
        Case((0.0, 0.0, 4), label="a range still empty after widening to include 0 (0..0): "
             "scale 1.0, zero 0",
             hint="Widen the range to include 0 first (x_min at most 0, x_max at least 0); only a "
                  "range still empty after that gets the task's fallback scale."),
        Case((0.5, 0.5, 4), label="x_min == x_max = 0.5: widened to 0..0.5, not empty",
             hint="Widen the range to include 0 first (x_min at most 0, x_max at least 0); only a "
                  "range still empty after that gets the task's fallback scale."),
        Case((-0.3, -0.3, 8), label="x_min == x_max = -0.3: widened to -0.3..0, not empty",
             hint="Widen the range to include 0 first (x_min at most 0, x_max at least 0); only a "
                  "range still empty after that gets the task's fallback scale."),
        Case((-0.25, 1.25, 2), label="a tie: -x_min / scale = 0.5 exactly, rounds to even 0",
             hint="Exactly half-way between two codes: which way does the task round? Half to even "
                  "(np.round, torch.round, Python's round); floor(x + 0.5) and rounding away from "
                  "zero do not."),
        Case((-0.75, 0.75, 2), label="a tie: -x_min / scale = 1.5 exactly, rounds to even 2",
             hint="Exactly half-way between two codes: which way does the task round? Half to even "
                  "(np.round, torch.round, Python's round); floor(x + 0.5) and rounding away from "
                  "zero do not."),
        Case((1.0, -1.0, 4), label="x_min > x_max must raise ValueError", raises=ValueError),
    ]


def _zp_guard(x_min, x_max):
    if x_min > x_max:
        raise ValueError("x_min > x_max")


def _wrong_zp_no_widen(x_min, x_max, bits):  # range not widened to include 0
    _zp_guard(x_min, x_max)
    levels = 2 ** bits - 1
    scale = (x_max - x_min) / levels
    if scale == 0:
        return 1.0, 0
    return scale, int(min(max(round(-x_min / scale), 0), levels))


def _wrong_zp_pow2(x_min, x_max, bits):  # 2**bits steps instead of 2**bits - 1
    _zp_guard(x_min, x_max)
    lo, hi = min(x_min, 0.0), max(x_max, 0.0)
    scale = (hi - lo) / 2 ** bits
    if scale == 0:
        return 1.0, 0
    return scale, int(min(max(round(-lo / scale), 0), 2 ** bits - 1))


def _wrong_zp_sign(x_min, x_max, bits):  # zero = round(x_min / scale): wrong sign
    _zp_guard(x_min, x_max)
    lo, hi = min(x_min, 0.0), max(x_max, 0.0)
    scale = (hi - lo) / (2 ** bits - 1)
    if scale == 0:
        return 1.0, 0
    return scale, int(round(lo / scale))


def _wrong_zp_half_up(x_min, x_max, bits):  # int(v + 0.5): ties always go up
    _zp_guard(x_min, x_max)
    lo, hi = min(x_min, 0.0), max(x_max, 0.0)
    scale = (hi - lo) / (2 ** bits - 1)
    if scale == 0:
        return 1.0, 0
    return scale, int(min(max(int(-lo / scale + 0.5), 0), 2 ** bits - 1))


def _wrong_zp_float_zero(x_min, x_max, bits):  # right value, but the zero point as a float
    _zp_guard(x_min, x_max)
    lo, hi = min(x_min, 0.0), max(x_max, 0.0)
    scale = (hi - lo) / (2 ** bits - 1)
    if scale == 0:
        return 1.0, 0.0
    return scale, float(min(max(round(-lo / scale), 0), 2 ** bits - 1))


def _wrong_zp_equal_is_empty(x_min, x_max, bits):  # x_min == x_max read as an empty range
    _zp_guard(x_min, x_max)
    if x_min == x_max:
        return 1.0, 0
    lo, hi = min(x_min, 0.0), max(x_max, 0.0)
    scale = (hi - lo) / (2 ** bits - 1)
    return scale, int(min(max(round(-lo / scale), 0), 2 ** bits - 1))


def _wrong_zp_unclamped_no_guard(x_min, x_max, bits):  # forgets the empty range
    _zp_guard(x_min, x_max)
    lo, hi = min(x_min, 0.0), max(x_max, 0.0)
    scale = (hi - lo) / (2 ** bits - 1)
    return scale, int(round(-lo / scale))


register(Exercise(
    id="02.zero_point",
    title="scale and zero point of an asymmetric range",
    reference=quant.zero_point,
    cases=_zp_cases,
    hint=["The codes 0 to 2^bits - 1 must cover the range, and 0.0 itself must be stored "
          "exactly (why does that force you to widen some ranges?). Which code should the "
          "real number 0 land on?",
          "lo = min(x_min, 0), hi = max(x_max, 0); there are 2**bits - 1 steps between the "
          "lowest and the highest code; the zero point is the code of 0.0, i.e. -lo / scale "
          "rounded (Python's round: ties to even).",
          "scale = (hi - lo) / (2**bits - 1); zero = int(round(-lo / scale)) clamped to "
          "0..2**bits - 1; a range still empty after widening (0..0) returns (1.0, 0); "
          "x_min > x_max raises ValueError."],
    int_results=True,
    wrong=[_wrong_zp_no_widen, _wrong_zp_pow2, _wrong_zp_sign, _wrong_zp_unclamped_no_guard,
           _wrong_zp_half_up, _wrong_zp_float_zero, _wrong_zp_equal_is_empty],
))


# ---------------------------------------------------------------- 02.dequantize

def dequantize_codes(q, scale, zero=None):
    """x^ = (q - zero) * scale for one scale over all of q, float64 (lesson 02 exercise).

    Builds a per-tensor ``QTensor`` and calls ``quant.dequantize`` (the one source).
    """
    q = np.asarray(q)
    qt = quant.QTensor(q=q, scale=np.full((1,) * q.ndim, scale, dtype=np.float64),
                       zero=None if zero is None else np.full((1,) * q.ndim, zero, np.int32),
                       fmt="int8", granularity="per_tensor", group_size=q.shape[-1],
                       shape=tuple(q.shape), dtype="float64")
    return quant.dequantize(qt)


def _deq_cases():
    rng = np.random.default_rng(5)
    qa = quant.quantize(np.array([-0.4, 0.0, 0.3, 0.75, 1.1]), "int4", "per_tensor",
                        symmetric=False)
    return [
        Case((np.array([17, -65, 4, 127], dtype=np.int8), 0.88 / 127, None),
             label="symmetric INT8 codes, no zero point"),
        Case((qa.q, 0.1, 4), label="asymmetric INT4 codes (uint8) with zero point 4"),
        Case((np.array([0, 1, 2, 255], dtype=np.uint8), 0.02, 128),
             label="uint8 codes below the zero point",
             hint="With uint8 codes, what is 2 - 4? Leave the integer dtype before subtracting the "
                  "zero point."),
        Case((rng.integers(0, 16, size=(3, 8)).astype(np.uint8), 0.05, 7),
             label="a 3 x 8 block of uint4 codes"),
        Case((np.zeros(4, dtype=np.uint8), 0.1, 0), label="all codes zero"),
    ]


def _wrong_deq_no_zero(q, scale, zero=None):  # forgets the zero point
    return q.astype(np.float64) * scale


def _wrong_deq_uint8_wrap(q, scale, zero=None):  # subtracts in uint8: wraps below zero
    zero = 0 if zero is None else zero
    return ((q - np.asarray(zero, dtype=q.dtype)) * scale).astype(np.float64)


def _wrong_deq_zero_after_scale(q, scale, zero=None):  # q * scale - zero
    zero = 0 if zero is None else zero
    return q.astype(np.float64) * scale - zero


def _wrong_deq_plus_zero(q, scale, zero=None):  # adds the zero point instead
    zero = 0 if zero is None else zero
    return (q.astype(np.float64) + zero) * scale


register(Exercise(
    id="02.dequantize",
    title="dequantize integer codes with a scale and zero point",
    reference=dequantize_codes,
    cases=_deq_cases,
    hint=["Undo the two steps of quantization in reverse order. Then look at the dtype of q: "
          "what is 0 - 4 in uint8 arithmetic?",
          "x^ = (q - zero) * scale, with zero = 0 when it is None; uint8 wraps around "
          "(0 - 4 = 252), so leave the integer dtype first.",
          "(q.astype(np.float64) - zero) * scale."],
    wrong=[_wrong_deq_no_zero, _wrong_deq_uint8_wrap, _wrong_deq_zero_after_scale,
           _wrong_deq_plus_zero],
))


# ---------------------------------------------------------------- 02.error_metrics

def error_metrics(x, x_hat) -> dict:
    """{"mae", "rmse", "sqnr_db"} of an approximation (lesson 02 exercise; calls quant)."""
    return {"mae": quant.mae(x, x_hat), "rmse": quant.rmse(x, x_hat),
            "sqnr_db": quant.sqnr_db(x, x_hat)}


def _metric_cases():
    rng = np.random.default_rng(7)
    g = rng.normal(size=256)
    xb = np.array(EX_B)
    return [
        Case((xb, quant.fake_quantize(xb, "int4", "per_tensor")), label="example B in INT4"),
        Case((xb, quant.fake_quantize(xb, "int8", "per_tensor")), label="example B in INT8"),
        Case((g, g + 0.1 * rng.normal(size=256)), label="noise at 1/10 of the signal"),
        Case((np.array([1.0, -2.0, 2.0]), np.array([1.0, -1.0, 2.0])), label="one error of 1"),
        Case((np.array([3.0, -4.0]), np.array([3.0, -4.0])), label="exact (SQNR is inf)",
             hint="When the error is all zero, what is the signal-to-noise ratio? The task says "
                  "what to return then."),
        Case((np.zeros(4), np.zeros(4)), label="all zeros, reproduced exactly: no noise, SQNR "
             "inf (not 0 / 0 = NaN)",
             hint="With no noise at all the SQNR is inf, whatever the signal: test the noise "
                  "before dividing."),
        Case((np.array([0.5, -0.25, 0.125], dtype=np.float32),
              np.array([0.5, -0.5, 0.0], dtype=np.float32)), label="float32 arrays"),
        Case((np.array([0, 100, 200, 255], dtype=np.uint8),
              np.array([3, 98, 203, 250], dtype=np.uint8)),
             label="uint8 codes: 0 - 3 must be -3, not 253 (leave the integer dtype first)",
             hint="Integer dtypes wrap around: convert both inputs to float64 before "
                  "subtracting or squaring."),
        Case((np.array([100, -100, 50, 7], dtype=np.int8),
              np.array([90, -90, 50, 7], dtype=np.int8)),
             label="int8 values: 100**2 does not fit in int8",
             hint="Integer dtypes wrap around: convert both inputs to float64 before subtracting "
                  "or squaring."),
    ]


def _wrong_metrics_signed(x, x_hat):  # mean of signed errors: they cancel
    e = x - x_hat
    return {"mae": float(np.mean(e)), "rmse": float(np.sqrt(np.mean(e ** 2))),
            "sqnr_db": float(10 * np.log10(np.sum(x ** 2) / np.sum(e ** 2)))
            if np.any(e) else math.inf}


def _wrong_metrics_no_sqrt(x, x_hat):  # RMSE without the square root
    e = x - x_hat
    return {"mae": float(np.mean(np.abs(e))), "rmse": float(np.mean(e ** 2)),
            "sqnr_db": float(10 * np.log10(np.sum(x ** 2) / np.sum(e ** 2)))
            if np.any(e) else math.inf}


def _wrong_metrics_20log(x, x_hat):  # 20 log10 of a power ratio
    e = x - x_hat
    return {"mae": float(np.mean(np.abs(e))), "rmse": float(np.sqrt(np.mean(e ** 2))),
            "sqnr_db": float(20 * np.log10(np.sum(x ** 2) / np.sum(e ** 2)))
            if np.any(e) else math.inf}


def _wrong_metrics_amplitude(x, x_hat):  # ratio of sums of |.|, not of squares
    e = x - x_hat
    return {"mae": float(np.mean(np.abs(e))), "rmse": float(np.sqrt(np.mean(e ** 2))),
            "sqnr_db": float(10 * np.log10(np.sum(np.abs(x)) / np.sum(np.abs(e))))
            if np.any(e) else math.inf}


def _wrong_metrics_nan_no_noise(x, x_hat):  # divides first: 0 / 0 gives NaN for zero noise
    x, e = np.asarray(x, np.float64), np.asarray(x, np.float64) - np.asarray(x_hat, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        sq = float(10 * np.log10(np.sum(x ** 2) / np.sum(e ** 2)))
    return {"mae": float(np.mean(np.abs(e))), "rmse": float(np.sqrt(np.mean(e ** 2))),
            "sqnr_db": sq}


def _wrong_metrics_int_dtype(x, x_hat):  # right formulas, in the inputs' own dtype
    e = x - x_hat
    signal, noise = np.sum(x * x, dtype=x.dtype), np.sum(e * e, dtype=e.dtype)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return {"mae": float(np.mean(np.abs(e))), "rmse": float(np.sqrt(np.mean(e * e))),
                "sqnr_db": float(10 * np.log10(signal / noise)) if noise else math.inf}


register(Exercise(
    id="02.error_metrics",
    title="MAE, RMSE and SQNR",
    reference=error_metrics,
    cases=_metric_cases,
    hint=["All three start from the error, x minus x_hat. Which one must not let positive and "
          "negative errors cancel, which one punishes big misses more, and which one is a ratio "
          "of powers (signal over noise) on a log scale? What is that ratio when e is all zero, "
          "and what is 0 - 3 when the inputs are uint8 codes?",
          "MAE = mean(|e|); RMSE = sqrt(mean(e**2)); SQNR = 10 * log10(sum(x**2) / sum(e**2)) "
          "dB (10, not 20: these are powers already). Convert both inputs to float64 first: "
          "integer dtypes wrap around and overflow.",
          "Return {'mae': ..., 'rmse': ..., 'sqnr_db': ...} as Python floats, with "
          "math.inf for sqnr_db when sum(e**2) == 0."],
    wrong=[_wrong_metrics_signed, _wrong_metrics_no_sqrt, _wrong_metrics_20log,
           _wrong_metrics_amplitude, _wrong_metrics_int_dtype, _wrong_metrics_nan_no_noise],
    float_results=True,                          # the task: "(Python floats)"
))
