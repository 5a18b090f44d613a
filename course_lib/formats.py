"""Number formats, bit by bit: from-scratch encoders and decoders (lesson 01).

Every format the course uses is a small ``FormatSpec``: how many sign, exponent and
mantissa bits it has, its exponent bias, which bit patterns are special (inf, NaN), and what
happens to a number too big to store (its *overflow rule*). From that spec alone the code
below turns bit patterns into values (``decode``) and values into bit patterns (``encode``,
round to nearest, ties to even). Nothing here wraps ``ml_dtypes`` or torch's float8 dtypes:
those libraries are only used by the tests and by lesson 01 to cross-check this code.

Formats (``FORMAT_NAMES``)::

    fp32      1 sign, 8 exponent, 23 mantissa bits, bias 127   IEEE 754: inf and NaN
    fp16      1 / 5 / 10, bias 15                              IEEE 754: inf and NaN
    bf16      1 / 8 / 7,  bias 127                             IEEE-style: inf and NaN
    fp8_e4m3  1 / 4 / 3,  bias 7    OCP "E4M3FN": no inf; NaN only at S.1111.111; max 448
    fp8_e5m2  1 / 5 / 2,  bias 15                              IEEE-style: inf and NaN; max 57344
    fp4_e2m1  1 / 2 / 1,  bias 1    no inf, no NaN: 0, 0.5, 1, 1.5, 2, 3, 4, 6 (and negatives)
    e8m0      0 / 8 / 0,  bias 127  unsigned powers of two 2^-127 .. 2^127; 0xFF is NaN; no zero
    int8      two's complement -128 .. 127
    int4      two's complement -8 .. 7 (the low 4 bits of a uint8 code)
    uint4     0 .. 15
    nf4       16 levels from normal quantiles (QLoRA's NormalFloat4), -1 .. 1, code 7 is 0

Rounding: round to nearest, ties to even (for a lookup table: ties to the even code).

Overflow rules, chosen per format and matched to torch where torch has the format:

- fp32, fp16, bf16, fp8_e5m2: IEEE: anything that rounds past the largest finite value becomes
  +-inf; inf stays inf; NaN stays NaN.
- fp8_e4m3: **saturate**: anything past 448 (and +-inf) becomes +-448; NaN stays NaN (0x7F).
  This is what torch 2.13's ``float8_e4m3fn`` cast does, since PyTorch PR #178817 (April
  2026); before it torch's ``fp8e4m3fn_from_fp32_value`` gave NaN past 464, like ml_dtypes.
  Code that must agree across libraries clamps to +-448 before it casts (lesson 01).
- fp4_e2m1: saturate to +-6 (inf too). NaN has no encoding: ``ValueError``.
- e8m0: a value that rounds past 2^127 (and inf) becomes NaN (0xFF), as in torch and ml_dtypes.
  There is no zero: 0 and values under 2^-127 round to the smallest scale 2^-127 (torch does the
  same). There is no sign: a negative number raises ``ValueError``.
- int8, int4, uint4: round to the nearest integer (ties to even) and saturate to the range
  (uint4 takes negative numbers to 0); inf saturates. NaN raises ``ValueError``.
- nf4: values outside [-1, 1] saturate to +-1 (scale your block first); NaN raises ``ValueError``.

Known differences from the libraries (pinned by ``tests/test_formats.py``):

- ``ml_dtypes.float8_e4m3fn`` turns values that round past 448 (from 464 up, and inf) into NaN;
  torch 2.13 and this module saturate to 448 (an older torch gives NaN there too).
- ``ml_dtypes.float8_e8m0fnu`` maps 0 and negative numbers to NaN; torch maps 0 to 2^-127 and
  uses |x| for negatives; this module maps 0 to 2^-127 and raises on negatives. All three round
  ties *up* (1.5 -> 2): with no mantissa bits the even neighbour is the larger power of two,
  so this is round-to-nearest-even too.
- Both libraries round float32 *subnormal* inputs strictly between 2^-127 and 2^-126 up to
  2^-126 when casting to E8M0; the nearest power of two (this module's answer) is 2^-127.
- ``ml_dtypes.int4`` / ``uint4`` casts truncate toward zero and wrap around (9 -> -7); this module
  rounds to nearest and saturates. Clip and ``np.rint`` before casting to get the same codes.
- ``ml_dtypes.float4_e2m1fn`` turns NaN into -0.0; this module raises.
- NaN bit patterns: torch writes 0x7F for an E5M2 NaN, ml_dtypes 0x7E; both decode to NaN.
  This module writes a quiet NaN with the top mantissa bit set (0x7E for E5M2, 0x7FC00000
  for fp32, ...), 0x7F for E4M3 and 0xFF for E8M0.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

FORMAT_NAMES = ("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "e8m0",
                "int8", "int4", "uint4", "nf4")


# ---- NF4 levels ---------------------------------------------------------------------------

NF4_OFFSET = 0.9677083  # QLoRA's outer quantile: halfway between 1 - 1/(2*15) and 1 - 1/(2*16)


def _linspace_float32(start: float, end: float, n: int) -> np.ndarray:
    """Evenly spaced float32 numbers, computed as torch.linspace does (so NF4 matches the
    published table to the last bit): start + i*step for the first half, end - (n-1-i)*step
    for the second half, all in float32."""
    s, e = np.float32(start), np.float32(end)
    step = (e - s) / np.float32(n - 1)
    return np.array([s + step * np.float32(i) if i < n // 2 else e - step * np.float32(n - 1 - i)
                     for i in range(n)], dtype=np.float32)


def nf4_levels() -> np.ndarray:
    """The 16 NF4 levels, built the way QLoRA (bitsandbytes) builds them (lessons 01, 03).

    8 positive levels are the normal quantiles at 8 evenly spaced probabilities from 0.5 up to
    ``NF4_OFFSET`` (0.5 itself, the zero, dropped); 7 negative levels likewise from 7 spaced
    probabilities; plus an exact zero. Sorted and divided by the largest, so the levels run
    from -1 to 1. Asymmetric on purpose: one code is spent on an exact zero. Stored in
    float32, like the published table. Returns a (16,) float64 array, ascending.
    """
    normal = NormalDist()
    positive_p = _linspace_float32(NF4_OFFSET, 0.5, 9)[:-1]                # (8,)
    negative_p = _linspace_float32(NF4_OFFSET, 0.5, 8)[:-1]                # (7,)
    positive = [normal.inv_cdf(float(p)) for p in positive_p]
    negative = [-normal.inv_cdf(float(p)) for p in negative_p]
    levels = np.sort(np.array(positive + [0.0] + negative, dtype=np.float32))  # (16,)
    levels = levels / levels.max()                                          # float32 division
    return levels.astype(np.float64)


# ---- the spec: layout and facts ------------------------------------------------------------
# A FormatSpec holds the layout and answers questions about it (largest value, step near 1,
# how to split a pattern into fields). Decoding, encoding and describing are the module
# functions in the next three sections; the spec's methods are one-line calls to them.

@dataclass(frozen=True)
class FormatSpec:
    """One number format: its layout, special values and overflow rule (lesson 01).

    ``kind`` is "float" (sign/exponent/mantissa), "int" (two's complement or unsigned) or
    "lut" (a lookup table of levels, NF4). ``specials`` says which patterns are not numbers:
    "ieee" (all-ones exponent: inf if the mantissa is 0, else NaN), "fn" (only S.1111.111 is
    NaN, no inf), "e8m0" (0xFF is NaN) or "none". ``overflow`` is "inf", "saturate" or "nan".
    """
    name: str
    bits: int
    kind: str
    description: str
    sign_bits: int = 1
    exponent_bits: int = 0
    mantissa_bits: int = 0
    bias: int = 0
    specials: str = "none"
    overflow: str = "saturate"
    subnormals: bool = True
    int_min: int = 0
    int_max: int = 0
    levels: tuple = field(default=(), repr=False)

    # -- simple facts ------------------------------------------------------------------------
    @property
    def signed(self) -> bool:
        """Whether the format can hold negative numbers."""
        if self.kind == "float":
            return self.sign_bits == 1
        if self.kind == "int":
            return self.int_min < 0
        return bool(min(self.levels) < 0)

    @property
    def has_inf(self) -> bool:
        return self.specials == "ieee"

    @property
    def has_nan(self) -> bool:
        return self.specials in ("ieee", "fn", "e8m0")

    @property
    def code_dtype(self) -> type:
        """The numpy unsigned integer type that holds one bit pattern."""
        return np.uint8 if self.bits <= 8 else np.uint16 if self.bits <= 16 else np.uint32

    @property
    def nan_bits(self) -> int | None:
        """The bit pattern ``encode`` writes for NaN (None where the format has no NaN)."""
        e_all, m = (1 << self.exponent_bits) - 1, self.mantissa_bits
        if self.specials == "ieee":
            return (e_all << m) | (1 << (m - 1))       # quiet NaN: top mantissa bit set
        if self.specials == "fn":
            return (e_all << m) | ((1 << m) - 1)       # S.1111.111
        if self.specials == "e8m0":
            return 0xFF
        return None

    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal number (floats)."""
        return (1 if self.subnormals else 0) - self.bias

    @property
    def max_value(self) -> float:
        """Largest finite value."""
        if self.kind == "int":
            return float(self.int_max)
        if self.kind == "lut":
            return float(max(self.levels))
        e_field = (1 << self.exponent_bits) - 1        # all-ones exponent
        m_field = (1 << self.mantissa_bits) - 1        # all-ones mantissa
        if self.specials == "ieee":
            e_field -= 1                               # all-ones exponent is inf/NaN
        elif self.specials == "fn":
            m_field -= 1                               # S.1111.111 is NaN
        elif self.specials == "e8m0":
            e_field -= 1                               # 0xFF is NaN
        return float(np.ldexp((1 << self.mantissa_bits) + m_field,
                              e_field - self.bias - self.mantissa_bits))

    @property
    def smallest_normal(self) -> float | None:
        """Smallest positive normal value (floats only; None for int and lut formats)."""
        if self.kind != "float":
            return None
        return float(np.ldexp(1.0, self.emin))

    @property
    def smallest_subnormal(self) -> float | None:
        """Smallest positive subnormal value (None where the format has no subnormals)."""
        if self.kind != "float" or not self.subnormals or self.mantissa_bits == 0:
            return None
        return float(np.ldexp(1.0, self.emin - self.mantissa_bits))

    @property
    def smallest_positive(self) -> float:
        """Smallest positive value, whatever kind of format."""
        if self.kind == "float":
            return self.smallest_subnormal or self.smallest_normal
        if self.kind == "int":
            return 1.0
        return float(min(v for v in self.levels if v > 0))

    @property
    def step_near_one(self) -> float:
        """Gap between 1 and the next larger value (the next smaller one where 1 is the max).

        For a float this is 2^-mantissa_bits: the best relative precision the format offers.
        """
        if self.kind == "float":
            return float(np.ldexp(1.0, -self.mantissa_bits))
        if self.kind == "int":
            return 1.0
        lv = np.asarray(self.levels)
        above = lv[lv > 1.0]
        return float(above.min() - 1.0) if above.size else float(1.0 - lv[lv < 1.0].max())

    def __repr__(self) -> str:
        return f"FormatSpec({self.name!r}, {self.bits} bits, {self.kind}: {self.description})"

    # -- fields ---------------------------------------------------------------------------
    def fields(self, bits) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Split bit patterns into (sign, exponent field, mantissa field) integer arrays.

        Int formats give (sign bit, 0, the other bits); NF4 gives (0, 0, code).
        """
        b = self._check_bits(bits)
        if self.kind != "float":
            sign = (b >> (self.bits - 1)) & 1 if self.kind == "int" and self.signed else b * 0
            rest = b & ((1 << (self.bits - 1)) - 1) if self.kind == "int" and self.signed else b
            return sign, b * 0, rest
        m = self.mantissa_bits
        mantissa = b & ((1 << m) - 1)
        exponent = (b >> m) & ((1 << self.exponent_bits) - 1)
        sign = (b >> (m + self.exponent_bits)) & 1 if self.sign_bits else b * 0
        return sign, exponent, mantissa

    def bit_string(self, bits: int) -> str:
        """One pattern as text with the fields separated: fp8_e4m3 0x7E -> '0 1111 110'."""
        raw = format(int(bits), f"0{self.bits}b")
        if self.kind != "float":
            return raw
        cuts = [self.sign_bits, self.sign_bits + self.exponent_bits]
        parts = [raw[:cuts[0]], raw[cuts[0]:cuts[1]], raw[cuts[1]:]]
        return " ".join(p for p in parts if p)

    def _check_bits(self, bits) -> np.ndarray:
        b = np.asarray(bits)
        if b.dtype.kind not in "iub":
            if b.dtype.kind == "f" and np.all(np.isfinite(b)) and np.all(b == np.round(b)):
                b = b.astype(np.int64)
            else:
                raise TypeError(f"{self.name}: bit patterns must be integers, got dtype {b.dtype}")
        b = b.astype(np.int64)
        if np.any((b < 0) | (b >= (1 << self.bits))):
            raise ValueError(f"{self.name} has {self.bits}-bit patterns: every pattern must be in "
                             f"0 .. {(1 << self.bits) - 1}, got {int(b.min())} .. {int(b.max())}")
        return b

    # -- the codec: one-line methods over the module functions below -----------------------
    def decode(self, bits) -> np.ndarray:
        """Bit patterns -> values (float64 array of the same shape); see ``decode``."""
        return decode(self, bits)

    def encode(self, x) -> np.ndarray:
        """Values -> bit patterns, round to nearest even; see ``encode``."""
        return encode(self, x)

    def round(self, x) -> np.ndarray:
        """Nearest representable value (float64 array): ``decode(encode(x))``."""
        return decode(self, encode(self, x))

    def values(self) -> np.ndarray:
        """Every distinct finite value, sorted (float64). Formats of up to 16 bits only."""
        if self.bits > 16:
            raise ValueError(f"{self.name} has 2^{self.bits} bit patterns, too many to list; "
                             f"values() covers formats of up to 16 bits")
        v = self.decode(np.arange(1 << self.bits))
        v = np.unique(v[np.isfinite(v)])
        return np.where(v == 0, 0.0, v)                  # one zero, +0.0 (not -0.0)

    def describe(self, bits: int) -> dict:
        """Everything about one bit pattern (lesson 01's explorer); see ``describe_pattern``."""
        return describe_pattern(self, bits)


# ---- decoding: bits -> values -------------------------------------------------------------

def decode(spec: FormatSpec, bits) -> np.ndarray:
    """Bit patterns -> values (float64 array of the same shape) (lesson 01)."""
    b = spec._check_bits(bits)
    if spec.kind == "int":
        return np.where(b > spec.int_max, b - (1 << spec.bits), b).astype(np.float64)
    if spec.kind == "lut":
        return np.asarray(spec.levels, dtype=np.float64)[b]
    return decode_float(spec, b)


def decode_float(spec: FormatSpec, b: np.ndarray) -> np.ndarray:
    """Float bit patterns -> values: sign x 1.m x 2^(e - bias), subnormals, specials (lesson 01)."""
    sign, e, m = spec.fields(b)
    mbits = spec.mantissa_bits
    normal = (e > 0) | (not spec.subnormals)
    # normal: 1.m x 2^(e - bias)  = (2^M + m) x 2^(e - bias - M)
    # subnormal (e = 0): 0.m x 2^emin = m x 2^(emin - M)
    significand = np.where(normal, (1 << mbits) + m, m).astype(np.float64)
    exponent = np.where(normal, e - spec.bias, spec.emin) - mbits
    value = np.ldexp(significand, exponent.astype(np.int64))
    e_all, m_all = (1 << spec.exponent_bits) - 1, (1 << mbits) - 1
    if spec.specials == "ieee":
        value = np.where(e == e_all, np.where(m == 0, np.inf, np.nan), value)
    elif spec.specials == "fn":
        value = np.where((e == e_all) & (m == m_all), np.nan, value)
    elif spec.specials == "e8m0":
        value = np.where(e == e_all, np.nan, value)
    return np.where(sign == 1, -value, value)


# ---- encoding: values -> bits, round to nearest even --------------------------------------

def encode(spec: FormatSpec, x) -> np.ndarray:
    """Values -> bit patterns (``code_dtype`` array of x's shape); round to nearest even.

    Follows the format's overflow rule (see the module docstring); raises ``ValueError``
    for NaN where the format has no NaN, and for negative numbers in E8M0 (which has no
    sign bit; UINT4 saturates them to 0 like any out-of-range integer).
    """
    x = _as_float64(x)
    nan = np.isnan(x)
    if nan.any() and not spec.has_nan:
        raise ValueError(f"{spec.name} has no NaN, and the input holds {int(nan.sum())} NaN "
                         f"value(s): remove or replace them (e.g. np.nan_to_num) first")
    if not spec.signed and np.any(x[~nan] < 0) and spec.kind != "int":
        raise ValueError(f"{spec.name} has no sign bit and stores positive numbers only; "
                         f"got a minimum of {float(np.nanmin(x))}")
    if spec.kind == "int":
        codes = np.clip(np.rint(x), spec.int_min, spec.int_max).astype(np.int64)
        return (codes & ((1 << spec.bits) - 1)).astype(spec.code_dtype)
    if spec.kind == "lut":
        return encode_lut(spec, x)
    return encode_float(spec, x)


def round_magnitude(spec: FormatSpec, a: np.ndarray) -> np.ndarray:
    """Round finite magnitudes a >= 0 to the format's grid, ignoring the top of the range.

    Step 1: the exponent e = floor(log2 a), no smaller than emin (below it the subnormal
    spacing holds). Step 2: the grid spacing there is 2^(e - M). Step 3: a / spacing
    rounded to the nearest integer, ties to even (np.rint), times the spacing.
    A carry out of the mantissa (1.111.. rounding up to 10.000..) lands on the next
    power of two by itself.
    """
    _, k = np.frexp(a)                                # a = f * 2^k, 0.5 <= f < 1
    e = np.maximum(k - 1, spec.emin)                  # floor(log2 a), clamped
    quantum_exp = e - spec.mantissa_bits              # spacing is 2^quantum_exp
    n = np.rint(np.ldexp(a, -quantum_exp))            # exact scaling, then RNE
    r = np.ldexp(n, quantum_exp)
    if not spec.subnormals:                           # no zero (E8M0): smallest value
        r = np.maximum(r, spec.smallest_normal)
    return r


def encode_float(spec: FormatSpec, x: np.ndarray) -> np.ndarray:
    """Values -> float bit patterns: round the magnitude, apply the overflow rule, pack the
    fields, set NaN/inf patterns and the sign (lesson 01)."""
    nan = np.isnan(x)
    negative = np.signbit(x) & ~nan if spec.sign_bits else np.zeros(x.shape, bool)
    a = np.abs(np.where(nan, 0.0, x))
    finite = np.isfinite(a)
    r = round_magnitude(spec, np.where(finite, a, 0.0))
    over = ~finite | (r > spec.max_value)                  # the overflow rule applies
    as_inf = over if spec.overflow == "inf" else np.zeros(x.shape, bool)
    as_nan = nan | over if spec.overflow == "nan" else nan
    if spec.overflow == "saturate":
        r = np.where(over, spec.max_value, r)              # clamp to the largest value
    else:
        r = np.where(over, 0.0, r)                         # placeholder, replaced below
    bits = pack_finite(spec, r)
    mbits, e_all = spec.mantissa_bits, (1 << spec.exponent_bits) - 1
    if spec.has_inf:
        bits = np.where(as_inf, e_all << mbits, bits)
    if as_nan.any():
        bits = np.where(as_nan, spec.nan_bits, bits)
    sign_shift = spec.exponent_bits + mbits
    bits = np.where(negative & ~as_nan, bits | (1 << sign_shift), bits)
    return bits.astype(spec.code_dtype)


def pack_finite(spec: FormatSpec, r: np.ndarray) -> np.ndarray:
    """Exact representable magnitudes r >= 0 -> (exponent field, mantissa field) bits."""
    mbits = spec.mantissa_bits
    _, k = np.frexp(r)
    e = k - 1                                                  # floor(log2 r) for r > 0
    sub = (r < spec.smallest_normal) if spec.subnormals else np.zeros(r.shape, bool)
    e_field = np.where(sub, 0, e + spec.bias)
    mant = np.where(sub, np.ldexp(r, mbits - spec.emin),       # r / 2^(emin - M)
                    np.ldexp(r, mbits - e) - (1 << mbits))     # r / 2^(e - M) - 2^M
    return (e_field.astype(np.int64) << mbits) | mant.astype(np.int64)


def encode_lut(spec: FormatSpec, x: np.ndarray) -> np.ndarray:
    """Values -> the nearest level's code (ties to the even code), saturating (NF4)."""
    levels = np.asarray(spec.levels, dtype=np.float64)                # (L,) ascending
    xc = np.clip(x, levels[0], levels[-1])                             # saturate
    lo = np.clip(np.searchsorted(levels, xc, side="right") - 1, 0, len(levels) - 1)
    hi = np.minimum(lo + 1, len(levels) - 1)
    d_lo, d_hi = xc - levels[lo], levels[hi] - xc
    take_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))         # ties: even code
    return np.where(take_hi, hi, lo).astype(spec.code_dtype)


# ---- describing one pattern (lesson 01's explorer) ----------------------------------------

def describe_pattern(spec: FormatSpec, bits: int) -> dict:
    """Everything about one bit pattern, for lesson 01's explorer: fields, class, value.

    Keys: bits, bit_string, sign, exponent_field, exponent (unbiased), mantissa_field,
    category ("zero", "subnormal", "normal", "inf", "nan", "integer", "level"), value,
    formula (how the value is computed, in words and numbers).
    """
    b = int(bits)
    value = float(decode(spec, np.array(b)))
    s, e, m = (int(v) for v in spec.fields(np.array(b)))
    out = dict(bits=b, bit_string=spec.bit_string(b), sign=s, exponent_field=e,
               exponent=None, mantissa_field=m, value=value)
    if spec.kind == "int":
        lead = f"two's complement: {spec.bit_string(b)} = {int(value)}" if spec.signed \
            else f"unsigned: {spec.bit_string(b)} = {int(value)}"
        return dict(out, category="integer", formula=lead)
    if spec.kind == "lut":
        return dict(out, category="level",
                    formula=f"code {b} looks up level {b} of {len(spec.levels)}: {value:.8g}")
    mb = spec.mantissa_bits
    sign_txt = f"(-1)^{s} x " if spec.sign_bits else ""
    if np.isnan(value):
        return dict(out, category="nan", formula="NaN: a special pattern, not a number")
    if np.isinf(value):
        return dict(out, category="inf", formula="all-ones exponent, zero mantissa: infinity")
    mant_txt = format(m, f"0{mb}b") if mb else ""
    if e == 0 and spec.subnormals:
        cat = "zero" if m == 0 else "subnormal"
        formula = (f"{sign_txt}0.{mant_txt or '0'}b x 2^{spec.emin} "
                   f"(exponent field 0: subnormal, exponent fixed at 1 - bias) = {value:.8g}")
        return dict(out, exponent=spec.emin, category=cat, formula=formula)
    exp = e - spec.bias
    if mb == 0:                                      # E8M0: a bare power of two
        formula = f"2^({e} - {spec.bias}) = 2^{exp} = {value:.8g}"
        return dict(out, exponent=exp, category="normal", formula=formula)
    formula = (f"{sign_txt}1.{mant_txt or '0'}b x 2^({e} - {spec.bias}) = "
               f"{sign_txt}{1 + m / (1 << mb) if mb else 1:.8g} x 2^{exp} = {value:.8g}")
    return dict(out, exponent=exp, category="normal", formula=formula)


def explain_rounding(x: float, name: str) -> str:
    """The encoder's steps for one number, in words and numbers (lesson 01).

    For a float format: the exponent, the grid step there, the division, the rounding
    (ties to even), the overflow rule, the sign and the bits. Integer and lookup formats get
    the short version (nearest integer / nearest level, then saturation).
    """
    s = get_format(name)
    x = float(x)
    code = int(s.encode(x))                      # raises the format's own errors first
    value = float(s.decode(code))
    lines = [f"x = {x:.10g} in {s.name}"]
    if s.kind == "float" and np.isfinite(x) and x != 0:
        a = abs(x)
        raw_e = int(np.frexp(a)[1]) - 1
        e = max(raw_e, s.emin)
        step = float(np.ldexp(1.0, e - s.mantissa_bits))
        n = a / step
        clamp = "" if e == raw_e else f", raised to the smallest normal exponent {s.emin}"
        lines += [f"|x| = {a:.10g}; floor(log2 |x|) = {raw_e}{clamp}: e = {e}",
                  f"grid step at that exponent: 2^(e - {s.mantissa_bits}) = 2^{e - s.mantissa_bits}"
                  f" = {step:.6g}",
                  f"|x| / step = {n:.6g} -> nearest integer, ties to even: {np.rint(n):.0f}",
                  f"{np.rint(n):.0f} x {step:.6g} = {np.rint(n) * step:.10g}"]
        r = float(np.rint(n) * step)
        if not s.subnormals and r < s.smallest_normal:
            lines.append(f"below the smallest value: becomes {s.smallest_normal:.6g}")
        elif r > s.max_value:
            lines.append(f"above the largest value {s.max_value:g}: overflow rule "
                         f"'{s.overflow}' gives {value:g}")
    elif s.kind == "int":
        lines.append(f"nearest integer (ties to even) {np.rint(x):.0f}, kept within "
                     f"{s.int_min}..{s.int_max}")
    elif s.kind == "lut":
        lines.append(f"nearest of the {len(s.levels)} levels (after clipping to "
                     f"[{min(s.levels):g}, {max(s.levels):g}]): level {code}")
    lines.append(f"stored value {value:.10g}, bits {s.bit_string(code)}")
    return "\n".join(lines)


def _as_float64(x) -> np.ndarray:
    """Numbers, lists, numpy arrays (ml_dtypes too) or torch tensors -> float64 numpy array."""
    if hasattr(x, "detach"):  # torch tensor
        import torch

        x = x.detach().to("cpu")
        if x.dtype != torch.float64:
            x = x.to(torch.float32) if x.is_floating_point() else x.to(torch.float64)
        return x.to(torch.float64).numpy()
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiub" and arr.dtype.kind != "V":
        try:
            return arr.astype(np.float64)
        except (TypeError, ValueError) as err:
            raise TypeError(f"expected numbers, got {arr.dtype}: {err}") from None
    return arr.astype(np.float64)


# ---- the catalogue ------------------------------------------------------------------------

def _float(name, e, m, bias, specials, overflow, description, sign=1, subnormals=True):
    return FormatSpec(name=name, bits=sign + e + m, kind="float", description=description,
                      sign_bits=sign, exponent_bits=e, mantissa_bits=m, bias=bias,
                      specials=specials, overflow=overflow, subnormals=subnormals)


_SPECS = {
    "fp32": _float("fp32", 8, 23, 127, "ieee", "inf", "IEEE 754 single precision"),
    "fp16": _float("fp16", 5, 10, 15, "ieee", "inf", "IEEE 754 half precision"),
    "bf16": _float("bf16", 8, 7, 127, "ieee", "inf", "bfloat16: fp32's range, 8 bits of precision"),
    "fp8_e4m3": _float("fp8_e4m3", 4, 3, 7, "fn", "saturate",
                       "OCP FP8 E4M3 (e4m3fn): no inf, NaN = S.1111.111, saturates at 448"),
    "fp8_e5m2": _float("fp8_e5m2", 5, 2, 15, "ieee", "inf", "OCP FP8 E5M2: IEEE-style, max 57344"),
    "fp4_e2m1": _float("fp4_e2m1", 2, 1, 1, "none", "saturate",
                       "OCP FP4 E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6; no inf or NaN; saturates"),
    "e8m0": _float("e8m0", 8, 0, 127, "e8m0", "nan",
                   "OCP E8M0 scale: unsigned powers of two 2^-127..2^127, 0xFF = NaN",
                   sign=0, subnormals=False),
    "int8": FormatSpec("int8", 8, "int", "two's complement integer -128..127",
                       int_min=-128, int_max=127),
    "int4": FormatSpec("int4", 4, "int", "two's complement integer -8..7", int_min=-8, int_max=7),
    "uint4": FormatSpec("uint4", 4, "int", "unsigned integer 0..15", int_min=0, int_max=15),
    "nf4": FormatSpec("nf4", 4, "lut", "NormalFloat4 (QLoRA): 16 normal-quantile levels in [-1, 1]",
                      levels=tuple(float(v) for v in nf4_levels())),
}
assert tuple(_SPECS) == FORMAT_NAMES


def make_float_format(exponent_bits: int, mantissa_bits: int, bias: int | None = None,
                      name: str | None = None) -> FormatSpec:
    """A small float format of your own: every pattern a number, no inf or NaN (lesson 01).

    Like FP4 E2M1 and the MX FP6 formats (E3M2, E2M3): exponent field 0 holds zero and the
    subnormals; anything too big saturates. ``bias`` defaults to 2^(exponent_bits-1) - 1.
    """
    for what, v in (("exponent_bits", exponent_bits), ("mantissa_bits", mantissa_bits)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"{what} must be a whole number of bits, got {v!r}")
    if bias is not None and (isinstance(bias, bool) or not isinstance(bias, (int, np.integer))):
        raise ValueError(f"bias must be a whole number, got {bias!r}")
    if exponent_bits < 1 or mantissa_bits < 0 or exponent_bits + mantissa_bits > 15:
        raise ValueError(f"need exponent_bits >= 1, mantissa_bits >= 0 and at most 15 bits in "
                         f"all; got E{exponent_bits}M{mantissa_bits}")
    bias = (1 << (exponent_bits - 1)) - 1 if bias is None else int(bias)
    name = name or f"e{exponent_bits}m{mantissa_bits}"
    return _float(name, exponent_bits, mantissa_bits, bias, "none", "saturate",
                  f"custom E{exponent_bits}M{mantissa_bits}, bias {bias}, no inf or NaN")


def nonnegative_float_values(exponent_bits: int, mantissa_bits: int, bias: int) -> np.ndarray:
    """Sorted values >= 0 of ``make_float_format(exponent_bits, mantissa_bits, bias)``.

    Lesson 01's exercise: for E2M1 with bias 1 this is 0, 0.5, 1, 1.5, 2, 3, 4, 6.
    """
    v = make_float_format(exponent_bits, mantissa_bits, bias).values()
    return v[v >= 0]


def get_format(name: str) -> FormatSpec:
    """The ``FormatSpec`` for a format name (lesson 01). Unknown names list the known ones."""
    if isinstance(name, FormatSpec):
        return name
    try:
        return _SPECS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown number format {name!r}; known formats: "
                         f"{', '.join(FORMAT_NAMES)}") from None


def round_to_format(x, name: str):
    """Round x to the nearest value of format ``name`` (RNE, the format's overflow rule).

    Lesson 01. Returns the same kind of object as x: a torch tensor comes back as a torch
    tensor of the same dtype and device (integer tensors come back as float32); a float32 or
    float64 numpy array keeps its dtype (both hold every value of these formats exactly);
    other arrays and lists come back as float64 arrays; a Python number as a Python float.
    """
    spec = get_format(name)
    if isinstance(x, (str, bytes)):
        raise ValueError(f"round_to_format rounds numbers, got the text {x!r}: convert it "
                         f"with float() first")
    if hasattr(x, "detach"):
        import torch

        rounded = torch.from_numpy(spec.round(x))
        dtype = x.dtype if x.is_floating_point() else torch.float32
        return rounded.to(device=x.device, dtype=dtype)
    if isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool):
        out = spec.round(x)
        if isinstance(x, np.floating) and x.dtype in (np.float32, np.float64):
            return x.dtype.type(out)
        return float(out)
    rounded = spec.round(x)
    if isinstance(x, np.ndarray) and x.dtype in (np.float32, np.float64):
        return rounded.astype(x.dtype)
    return rounded


# ---- the table ----------------------------------------------------------------------------

class FormatTable(list):
    """Rows (dicts) of ``format_table``; prints as an aligned text table."""
    COLUMNS = ("name", "bits", "kind", "max_value", "smallest_normal", "smallest_subnormal",
               "step_near_one")

    def __str__(self) -> str:
        def cell(v):
            if v is None:
                return "-"
            if isinstance(v, float):
                return f"{v:.6g}"
            return str(v)
        rows = [self.COLUMNS] + [tuple(cell(r[c]) for c in self.COLUMNS) for r in self]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.COLUMNS))]
        lines = ["  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in
                           enumerate(zip(r, widths))) for r in rows]
        lines.insert(1, "-" * len(lines[0]))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def row(self, name: str) -> dict:
        """The row for one format."""
        for r in self:
            if r["name"] == name:
                return r
        raise ValueError(f"no row {name!r}; rows: {', '.join(r['name'] for r in self)}")


def format_table(names=FORMAT_NAMES) -> FormatTable:
    """Max, smallest normal, smallest subnormal and step near 1 for each format (lesson 01)."""
    rows = FormatTable()
    for n in names:
        s = get_format(n)
        rows.append(dict(name=s.name, bits=s.bits, kind=s.kind, max_value=s.max_value,
                         smallest_normal=s.smallest_normal,
                         smallest_subnormal=s.smallest_subnormal,
                         step_near_one=s.step_near_one))
    return rows


# ---- cross-checks against libraries (lesson 01, tests) -------------------------------------

ML_DTYPES_NAMES = {"bf16": "bfloat16", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2",
                   "fp4_e2m1": "float4_e2m1fn", "e8m0": "float8_e8m0fnu", "int4": "int4",
                   "uint4": "uint4"}
TORCH_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16",
               "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2", "e8m0": "float8_e8m0fnu"}


def library_decode(bits, name: str, library: str) -> np.ndarray:
    """Decode bit patterns with ``library`` ("torch" or "ml_dtypes") instead of this module.

    Used to cross-check the from-scratch codecs (lesson 01). Returns float64.
    """
    spec = get_format(name)
    b = spec._check_bits(bits).astype(spec.code_dtype)
    if library == "ml_dtypes":
        import ml_dtypes

        if name not in ML_DTYPES_NAMES:
            raise ValueError(f"ml_dtypes has no {name}; it has {', '.join(ML_DTYPES_NAMES)}")
        dt = np.dtype(getattr(ml_dtypes, ML_DTYPES_NAMES[name]))
        if dt.itemsize != b.dtype.itemsize:
            raise ValueError(f"{name}: unexpected ml_dtypes item size {dt.itemsize}")
        return b.view(dt).astype(np.float64)
    if library == "torch":
        import torch

        if name not in TORCH_NAMES:
            raise ValueError(f"torch has no castable {name}; it has {', '.join(TORCH_NAMES)}")
        carrier = {1: np.uint8, 2: np.int16, 4: np.int32}[b.dtype.itemsize]  # torch-friendly
        t = torch.from_numpy(np.ascontiguousarray(b).view(carrier))
        return t.view(getattr(torch, TORCH_NAMES[name])).to(torch.float64).numpy()
    raise ValueError(f"library must be 'torch' or 'ml_dtypes', got {library!r}")


def library_encode(x, name: str, library: str) -> np.ndarray:
    """Encode float32 values with ``library`` ("torch" or "ml_dtypes"): bit patterns.

    The library's own rounding and overflow rules apply (see the module docstring for where
    they differ from this module's). Returns an array of ``get_format(name).code_dtype``.
    """
    spec = get_format(name)
    x32 = np.asarray(_as_float64(x), dtype=np.float32)
    if library == "ml_dtypes":
        import ml_dtypes

        if name not in ML_DTYPES_NAMES:
            raise ValueError(f"ml_dtypes has no {name}; it has {', '.join(ML_DTYPES_NAMES)}")
        y = x32.astype(getattr(ml_dtypes, ML_DTYPES_NAMES[name]))
        if spec.kind == "int":
            return (y.astype(np.int64) & ((1 << spec.bits) - 1)).astype(spec.code_dtype)
        return y.view({1: np.uint8, 2: np.uint16}[y.dtype.itemsize]).astype(spec.code_dtype)
    if library == "torch":
        import torch

        if name not in TORCH_NAMES:
            raise ValueError(f"torch has no castable {name}; it has {', '.join(TORCH_NAMES)}")
        y = torch.from_numpy(x32).to(getattr(torch, TORCH_NAMES[name]))
        carrier = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[y.element_size()]
        raw = y.view(carrier).to(torch.int64).numpy() & ((1 << spec.bits) - 1)
        return raw.astype(spec.code_dtype)
    raise ValueError(f"library must be 'torch' or 'ml_dtypes', got {library!r}")


def _same_values(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise: equal, with the same sign of zero, or both NaN."""
    return ((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b))


def cross_check_decode(name: str) -> dict:
    """Decode every bit pattern of ``name`` here and with torch and ml_dtypes (lesson 01).

    Returns ``{library: number of patterns that differ}`` for each library that has the
    format (-0.0 must match +0.0's sign; NaN equals NaN).
    """
    spec = get_format(name)
    patterns = np.arange(1 << spec.bits)
    ours = spec.decode(patterns)
    report = {}
    for lib in ("torch", "ml_dtypes"):
        try:
            with np.errstate(invalid="ignore"):
                theirs = library_decode(patterns, name, lib)
        except ValueError:
            continue  # this library does not have this format
        report[lib] = int((~_same_values(ours, theirs)).sum())
    return report


def cross_check_encode(name: str, n_random: int = 20_000, seed: int = 0) -> dict:
    """Encode every value of ``name``, every midpoint between neighbours (the ties) and
    ``n_random`` random values on many scales, here and with torch and ml_dtypes (lesson 01).

    Returns ``{library: (n_differ, n_tried, smallest |x| where they differ or None)}``.
    """
    if isinstance(n_random, bool) or not isinstance(n_random, (int, np.integer)) or n_random < 0:
        raise ValueError(f"n_random is a count >= 0, got {n_random!r}")
    spec = get_format(name)
    rng = np.random.default_rng(seed)
    v = spec.values()
    mids = (v[:-1] + v[1:]) / 2
    randoms = rng.normal(0, 1, n_random) * np.exp(rng.uniform(-8, 8, n_random))
    x = np.concatenate([v, mids, randoms]).astype(np.float32)
    ours = spec.encode(x)
    report = {}
    for lib in ("torch", "ml_dtypes"):
        try:
            theirs = library_encode(x, name, lib)
        except ValueError:
            continue
        differ = ours != theirs
        first = float(np.abs(x[differ]).min()) if differ.any() else None
        report[lib] = (int(differ.sum()), int(x.size), first)
    return report


__all__ = ["cross_check_decode", "cross_check_encode", "decode", "decode_float", "encode",
           "round_magnitude", "encode_float", "pack_finite", "encode_lut", "describe_pattern",
           "FORMAT_NAMES", "FormatSpec", "FormatTable", "get_format", "round_to_format",
           "format_table", "nf4_levels", "library_decode", "library_encode", "NF4_OFFSET",
           "make_float_format", "nonnegative_float_values", "explain_rounding"]
