"""Exercises of lesson 01, "Number formats, bit by bit" (solutions/01_number_formats.ipynb).

Each reference is ``course_lib.formats``; each wrong answer is a mistake people make when they
write these codecs by hand (tests/test_checks.py proves the checker rejects every one).
"""
from __future__ import annotations

import math

import numpy as np

from course_lib.checks import Case, Exercise, register
from course_lib.formats import get_format, nonnegative_float_values, round_to_format

# ---- 01.decode_e4m3: one FP8 E4M3 byte -> its value -----------------------------------------


def _ref_decode_e4m3(byte: int) -> float:
    return float(get_format("fp8_e4m3").decode(byte))


def _e4m3_fields(byte):
    return (byte >> 7) & 1, (byte >> 3) & 0xF, byte & 0x7


def _wrong_decode_no_bias(byte):
    s, e, m = _e4m3_fields(byte)
    if e == 15 and m == 7:
        return math.nan
    v = (1 + m / 8) * 2.0 ** e if e else m / 8 * 2.0 ** 1
    return -v if s else v


def _wrong_decode_no_subnormals(byte):
    s, e, m = _e4m3_fields(byte)
    if e == 15 and m == 7:
        return math.nan
    v = (1 + m / 8) * 2.0 ** (e - 7) if byte & 0x7F else 0.0   # e = 0 read as a normal number
    return -v if s else v


def _wrong_decode_ieee_specials(byte):
    s, e, m = _e4m3_fields(byte)
    if e == 15:                                   # IEEE habit: all-ones exponent is inf / NaN
        v = math.inf if m == 0 else math.nan
    else:
        v = (1 + m / 8) * 2.0 ** (e - 7) if e else m / 8 * 2.0 ** -6
    return -v if s else v


def _wrong_decode_7f_is_inf(byte):
    s, e, m = _e4m3_fields(byte)
    if e == 15 and m == 7:
        v = math.inf                               # E4M3 has no inf: 0x7F is NaN
    else:
        v = (1 + m / 8) * 2.0 ** (e - 7) if e else m / 8 * 2.0 ** -6
    return -v if s else v


def _wrong_decode_ignores_sign(byte):
    _, e, m = _e4m3_fields(byte)
    if e == 15 and m == 7:
        return math.nan
    return (1 + m / 8) * 2.0 ** (e - 7) if e else m / 8 * 2.0 ** -6


def _wrong_decode_subnormal_exponent_minus7(byte):
    s, e, m = _e4m3_fields(byte)
    if e == 15 and m == 7:
        return math.nan
    v = (1 + m / 8) * 2.0 ** (e - 7) if e else m / 8 * 2.0 ** -7   # 0 - bias instead of 1 - bias
    return -v if s else v


def _wrong_decode_unsigned_zero(byte):
    s, e, m = _e4m3_fields(byte)
    if byte & 0x7F == 0:                           # both zeros returned as +0.0
        return 0.0
    if e == 15 and m == 7:
        return math.nan
    v = (1 + m / 8) * 2.0 ** (e - 7) if e else m / 8 * 2.0 ** -6
    return -v if s else v


def _wrong_decode_only_7f_nan(byte):
    s, e, m = _e4m3_fields(byte)
    if byte == 0x7F:                               # forgets the negative NaN, 0xFF
        return math.nan
    v = (1 + m / 8) * 2.0 ** (e - 7) if e else m / 8 * 2.0 ** -6
    return -v if s else v


register(Exercise(
    id="01.decode_e4m3",
    title="decode one FP8 E4M3 byte",
    reference=_ref_decode_e4m3,
    cases=lambda: [
        Case((0x38,), label="1.0"),
        Case((0x7E,), label="448, the largest value"),
        Case((0xBE,), label="-448: the sign bit"),
        Case((0x08,), label="smallest normal 2^-6"),
        Case((0x01,), label="smallest subnormal 2^-9",
             hint="With an exponent field of 0: is there an implicit leading 1, and which exponent "
                  "applies?"),
        Case((0x05,), label="a subnormal",
             hint="With an exponent field of 0: is there an implicit leading 1, and which exponent "
                  "applies?"),
        Case((0x00,), label="zero"),
        Case((0x80,), label="0x80 is -0.0: the sign bit still counts",
             hint="Does the sign bit survive when the magnitude is 0? -0.0 and +0.0 "
                  "are different."),
        Case((0x78,), label="0x78 = 256: an all-ones exponent is still a number",
             hint="E4M3 has no infinity: which patterns with an all-ones exponent are still "
                  "numbers?"),
        Case((0x7F,), label="0x7F: NaN, not inf",
             hint="Which patterns are NaN in E4M3 (it has no infinity), whatever the sign bit?"),
        Case((0xFF,), label="0xFF: NaN as well (sign bit set), not -480",
             hint="Which patterns are NaN in E4M3 (it has no infinity), whatever the sign bit?"),
        Case((0x4D,), label="0x4D"),
    ],
    hint=["Split the byte into its three fields first (shifts and masks), then ask: which "
          "exponent fields are subnormal, which patterns are NaN in a format with no infinity, "
          "and does the sign bit apply to zero too?",
          "s = byte >> 7, e = (byte >> 3) & 0xF, m = byte & 0x7. e > 0: (1 + m/8) * 2^(e - 7); "
          "e == 0: (m/8) * 2^(1 - 7). Only e == 15 with m == 7 is NaN.",
          "Build the magnitude, then `return -value if s else value` (for value 0.0 that gives "
          "-0.0, as it should)."],
    signed_zero=True, float_results=True,        # the task: "returning a Python float"
    wrong=[_wrong_decode_unsigned_zero, _wrong_decode_no_bias, _wrong_decode_no_subnormals, _wrong_decode_ieee_specials,
           _wrong_decode_7f_is_inf, _wrong_decode_ignores_sign,
           _wrong_decode_subnormal_exponent_minus7, _wrong_decode_only_7f_nan],
))


# ---- 01.bf16_bits: float32 -> bfloat16 bits by rounding the top 16 bits ---------------------


def _ref_bf16_bits(x: float) -> int:
    return int(get_format("bf16").encode(np.float32(x)))


def _f32_bits(x) -> int:
    return int(np.array(x, dtype=np.float32).view(np.uint32))


def _wrong_bf16_truncate(x):
    return _f32_bits(x) >> 16                                   # chops, never rounds


def _wrong_bf16_round_half_up(x):
    return (_f32_bits(x) + 0x8000) >> 16                        # ties always go up


def _wrong_bf16_ties_to_odd(x):
    b = _f32_bits(x)
    return (b + 0x7FFF + (1 - ((b >> 16) & 1))) >> 16             # even/odd swapped


def _wrong_bf16_sign_lost(x):
    return _ref_bf16_bits(abs(x))


def _wrong_bf16_as_float(x):
    return float(_ref_bf16_bits(x))                             # the right pattern, as a float


def _wrong_bf16_via_float16(x):
    return int(np.array(x, dtype=np.float16).view(np.uint16))   # fp16 is a different layout


register(Exercise(
    id="01.bf16_bits",
    title="float32 -> bfloat16 bit pattern, round to nearest even",
    reference=_ref_bf16_bits,
    cases=lambda: [
        Case((1.0,), label="1.0 -> 0x3F80"),
        Case((3.140625,), label="exactly representable"),
        Case((float(np.float32(0.1)),), label="0.1 rounds up"),
        Case((1.0 + 2.0 ** -8,), label="a tie: stays on the even 1.0",
             hint="Exactly half-way between two bfloat16 values: round to the even one. "
                  "Truncating the low 16 bits, or adding 0x8000 alone, does not."),
        Case((1.0 + 3 * 2.0 ** -8,), label="a tie: goes up to the even neighbour",
             hint="Exactly half-way between two bfloat16 values: round to the even one. Truncating "
                  "the low 16 bits, or adding 0x8000 alone, does not."),
        Case((-2.5 - 2.0 ** -9,), label="negative, rounds down in magnitude"),
        Case((float(np.finfo(np.float32).max),), label="float32 max rounds to inf (0x7F80)",
             hint="Rounding up the largest float32 carries into the exponent: which pattern "
                  "results, and is that inf?"),
        Case((-0.0,), label="-0.0 -> 0x8000",
             hint="Does the sign bit survive when the magnitude is 0? -0.0 and +0.0 "
                  "are different."),
        Case((1.0e-40,), label="a float32 subnormal",
             hint="Does your rounding work on the 32-bit pattern itself, subnormals included?"),
    ],
    hint=["BF16 keeps the top 16 of FP32's 32 bits. Keeping them as they are truncates; what "
          "must you add to the 32-bit pattern before dropping the low 16 so that it rounds to "
          "nearest, and how do you break an exact tie towards an even last bit?",
          "Get the pattern with int(np.float32(x).view(np.uint32)). Adding 0x8000 rounds "
          "half-up; adding 0x7FFF plus the lowest bit you keep rounds half-to-even.",
          "bits + 0x7FFF + ((bits >> 16) & 1), then >> 16 (and & 0xFFFF)."],
    wrong=[_wrong_bf16_truncate, _wrong_bf16_round_half_up, _wrong_bf16_ties_to_odd,
           _wrong_bf16_sign_lost, _wrong_bf16_via_float16, _wrong_bf16_as_float],
    int_results=True,
))


# ---- 01.float_values: every value >= 0 of a small float format -----------------------------


def _decode_small(e, m, exponent_bits, mantissa_bits, bias, subnormals=True, bias_sign=-1):
    if e == 0 and subnormals:
        return m / 2 ** mantissa_bits * 2.0 ** (1 - bias)
    return (1 + m / 2 ** mantissa_bits) * 2.0 ** (e + bias_sign * bias)


def _all_fields(exponent_bits, mantissa_bits):
    return [(e, m) for e in range(2 ** exponent_bits) for m in range(2 ** mantissa_bits)]


def _wrong_values_no_subnormals(exponent_bits, mantissa_bits, bias):
    v = {_decode_small(e, m, exponent_bits, mantissa_bits, bias, subnormals=False)
         for e, m in _all_fields(exponent_bits, mantissa_bits)}
    return np.array(sorted(v | {0.0}))


def _wrong_values_plus_bias(exponent_bits, mantissa_bits, bias):
    v = {_decode_small(e, m, exponent_bits, mantissa_bits, bias, bias_sign=+1) if e else
         m / 2 ** mantissa_bits * 2.0 ** (1 + bias)
         for e, m in _all_fields(exponent_bits, mantissa_bits)}
    return np.array(sorted(v))


def _wrong_values_top_exponent_reserved(exponent_bits, mantissa_bits, bias):
    v = {_decode_small(e, m, exponent_bits, mantissa_bits, bias)
         for e, m in _all_fields(exponent_bits, mantissa_bits) if e < 2 ** exponent_bits - 1}
    return np.array(sorted(v))                      # IEEE habit: top exponent kept for inf/NaN


def _wrong_values_unsorted_with_duplicates(exponent_bits, mantissa_bits, bias):
    return np.array([_decode_small(e, m, exponent_bits, mantissa_bits, bias)
                     for e, m in _all_fields(exponent_bits, mantissa_bits)][::-1])


def _wrong_values_standard_bias(exponent_bits, mantissa_bits, bias):
    usual = 2 ** (exponent_bits - 1) - 1                   # the given bias ignored
    return np.array(sorted({_decode_small(e, m, exponent_bits, mantissa_bits, usual)
                            for e, m in _all_fields(exponent_bits, mantissa_bits)}))


register(Exercise(
    id="01.float_values",
    title="list every value >= 0 of a small float format (no inf, no NaN)",
    reference=nonnegative_float_values,
    cases=lambda: [
        Case((2, 1, 1), label="FP4 E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6"),
        Case((3, 2, 3), label="FP6 E3M2 (max 28)"),
        Case((2, 3, 1), label="FP6 E2M3 (max 7.5)"),
        Case((1, 2, 0), label="E1M2, bias 0"),
        Case((4, 3, 7), label="E4M3 if every pattern were a number (max 480)"),
        Case((2, 1, 0), label="E2M1 with bias 0, not its usual 1: everything twice as big"),
        Case((3, 2, 5), label="E3M2 with bias 5, not its usual 3: a range shifted down"),
    ],
    hint=["Every (exponent field, mantissa field) pair is a value: go through all of them. "
          "Which exponent field is special (no hidden leading 1)? What do you do about values "
          "that appear twice? And which bias do you use: the usual one, or the one you are given?",
          "e == 0: (m / 2^M) * 2^(1 - bias) (zero and the subnormals); otherwise "
          "(1 + m / 2^M) * 2^(e - bias).",
          "Two loops over range(2**E) and range(2**M) into a set; then "
          "np.array(sorted(values), dtype=np.float64)."],
    wrong=[_wrong_values_no_subnormals, _wrong_values_plus_bias,
           _wrong_values_top_exponent_reserved, _wrong_values_unsorted_with_duplicates,
           _wrong_values_standard_bias],
))


# ---- 01.round_e4m3: round a number to the nearest FP8 E4M3 value ---------------------------


def _ref_round_e4m3(x: float) -> float:
    return round_to_format(float(x), "fp8_e4m3")


def _e4m3_step(a):
    e = max(math.floor(math.log2(a)), -6) if a > 0 else -6
    return 2.0 ** (e - 3)


def _wrong_round_truncate(x):
    a = abs(x)
    step = _e4m3_step(a)
    return math.copysign(min(math.floor(a / step) * step, 448.0), x)


def _wrong_round_half_away(x):
    a = abs(x)
    step = _e4m3_step(a)
    return math.copysign(min(math.floor(a / step + 0.5) * step, 448.0), x)


def _wrong_round_no_saturation(x):
    a = abs(x)
    step = _e4m3_step(a)
    return math.copysign(round(a / step) * step, x)             # 1000 -> 1024, not 448


def _wrong_round_no_subnormal_clamp(x):
    a = abs(x)
    e = math.floor(math.log2(a)) if a > 0 else -6               # exponent below -6 allowed
    spacing = 2.0 ** (e - 3)
    r = min(round(a / spacing) * spacing, 448.0)
    return math.copysign(r, x)


def _wrong_round_unsigned_zero(x):
    a = abs(x)
    if a == 0:
        return 0.0                                               # -0.0 comes back as +0.0
    step = _e4m3_step(a)
    r = min(round(a / step) * step, 448.0)
    return -r if x < 0 and r else r                              # and so does -0.0009


def _wrong_round_step_from_bits(x):
    a = abs(x)
    e = max(math.floor(math.log2(a)), -6) if a > 0 else -6
    step = 2.0 ** (e - 4)                                        # one mantissa bit too many
    return math.copysign(min(round(a / step) * step, 448.0), x)


register(Exercise(
    id="01.round_e4m3",
    title="round a number to the nearest FP8 E4M3 value",
    reference=_ref_round_e4m3,
    cases=lambda: [
        Case((0.1,), label="0.1 -> 0.1015625"),
        Case((1.0625,), label="a tie: stays on the even 1.0",
             hint="Exactly half-way between two codes: which way does the task round? Half to "
                  "even (Python's round); floor(x + 0.5) and rounding away from zero do not."),
        Case((1.1875,), label="a tie: goes up to the even 1.25",
             hint="Exactly half-way between two codes: which way does the task round? Half to even "
                  "(np.round, torch.round, Python's round); floor(x + 0.5) and rounding away from "
                  "zero do not."),
        Case((300.0,), label="300 -> 288"),
        Case((-0.3,), label="negative"),
        Case((0.001,), label="subnormal range: step 2^-9",
             hint="Below the smallest normal (2^-6) the gap between values stops shrinking: what "
                  "is it there?"),
        Case((0.0009,), label="under half the smallest subnormal: 0",
             hint="Below the smallest normal (2^-6) the gap between values stops shrinking: what "
                  "is it there, and where does half of it round?"),
        Case((464.0,), label="464, a tie at the top: 448",
             hint="464 is half-way between 448 and 480 (past E4M3's top): the tie goes to the "
                  "even mantissa, 448, as every larger value saturates there."),
        Case((1000.0,), label="too big: saturates to 448",
             hint="Past the top, does your rounding saturate at 448?"),
        Case((0.0,), label="zero"),
        Case((-0.0,), label="-0.0 keeps its sign",
             hint="Does the sign bit survive when the magnitude is 0? -0.0 and +0.0 "
                  "are different."),
        Case((-0.0009,), label="a tiny negative rounds to -0.0, not +0.0",
             hint="Does the sign bit survive when the magnitude is 0? -0.0 and +0.0 "
                  "are different."),
        Case((-464.0,), label="-464: a tie at the top, saturates to -448",
             hint="-464 is half-way between -448 and -480 (past E4M3's range): the tie goes "
                  "to the even mantissa, -448, as every larger magnitude saturates there."),
    ],
    signed_zero=True, float_results=True,        # the task: "as a Python float"
    hint=["How does the gap between neighbouring E4M3 values depend on the size of the "
          "number, and what changes below the smallest normal one? Once you can round to a "
          "multiple of that gap (ties to even), what about numbers past the top, and the sign?",
          "For a = |x| > 0: e = max(floor(log2(a)), -6); step = 2^(e - 3) (3 mantissa bits); "
          "Python's round(a / step) rounds ties to even. E4M3 saturates at 448.",
          "math.copysign(min(round(a / step) * step, 448.0), x); for a == 0 return "
          "math.copysign(0.0, x) so -0.0 keeps its sign."],
    wrong=[_wrong_round_unsigned_zero, _wrong_round_truncate, _wrong_round_half_away, _wrong_round_no_saturation,
           _wrong_round_no_subnormal_clamp, _wrong_round_step_from_bits],
))
