"""Quantizers, block formats, INT4 packing and error metrics (lessons 02 and 03).

Everything here takes numpy arrays or torch tensors and gives back the same kind of object:
numpy in -> numpy out, torch in -> torch out (on the same device).

The pieces, in the order the lessons teach them:

- lesson 02: ``absmax_scale``, ``absmax_quantize``, ``zero_point``, ``quantize``,
  ``dequantize``, ``fake_quantize`` and the error metrics ``mae``, ``rmse``,
  ``relative_rms_error``, ``sqnr_db``;
- lesson 03: group-wise scales (``granularity="per_group"``), ``bits_per_weight``,
  ``pack_int4`` / ``unpack_int4``, the block formats MXFP4, NVFP4 and NF4, the NF4 levels
  rebuilt from normal quantiles, and ``synthetic_weights`` (the 256 x 1024 matrix with
  eight outliers).

What ``QTensor.q`` holds depends on the format family:

- integer formats (``int2``..``int8``, ``uint2``..``uint8``): integer codes. Symmetric
  signed codes are ``int8`` in ``[-qmax, qmax]`` (qmax = 2**(bits-1) - 1, so -7..7 for
  INT4); asymmetric codes (a zero point, or any ``uintN``) are ``uint8`` in
  ``[0, 2**bits - 1]``, and ``x^ = (q - zero) * scale``;
- float formats (``fp8_e4m3``, ``fp8_e5m2``, ``fp4_e2m1``, and the block formats MXFP4 and
  NVFP4): the format's grid values themselves, as float32 (each one exactly representable),
  so ``x^ = q * scale``;
- look-up-table formats (``nf4``): indices 0..15 into ``nf4_levels()`` as ``uint8``, so
  ``x^ = levels[q] * scale``.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from course_lib.compare import sqnr_db, to_numpy

__all__ = [
    "QTensor", "absmax_scale", "absmax_quantize", "zero_point", "quantize", "dequantize",
    "fake_quantize", "pack_int4", "unpack_int4", "bits_per_weight", "BLOCK_FORMAT_BITS",
    "quantize_mxfp4", "dequantize_mxfp4", "quantize_nvfp4", "dequantize_nvfp4",
    "quantize_nf4", "dequantize_nf4", "nf4_levels",
    "mae", "rmse", "relative_rms_error", "sqnr_db", "synthetic_weights", "known_formats",
    "divisors", "remove_outliers", "largest_group_within",
]

# ---------------------------------------------------------------- numpy / torch helpers


def _is_torch(x) -> bool:
    return hasattr(x, "detach") and hasattr(x, "dim")


def _as_array(x):
    """Lists and numbers become float64 numpy arrays; arrays and tensors pass through."""
    if _is_torch(x) or isinstance(x, np.ndarray):
        return x
    return np.asarray(x, dtype=np.float64)


def _work_float(x):
    """x in the dtype the arithmetic runs in: float64 stays float64, everything else float32."""
    if _is_torch(x):
        import torch

        return x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    return x.astype(np.float64 if x.dtype == np.float64 else np.float32, copy=False)


def _amax(a, axis=-1):
    if _is_torch(a):
        return a.abs().amax(dim=axis, keepdim=True)
    return np.abs(a).max(axis=axis, keepdims=True)


def _amin_raw(a, axis=-1):
    return a.amin(dim=axis, keepdim=True) if _is_torch(a) else a.min(axis=axis, keepdims=True)


def _amax_raw(a, axis=-1):
    return a.amax(dim=axis, keepdim=True) if _is_torch(a) else a.max(axis=axis, keepdims=True)


def _round(a):  # round half to even in both libraries
    if _is_torch(a):
        import torch

        return torch.round(a)
    return np.round(a)


def _clip(a, lo, hi):
    if _is_torch(a):
        import torch

        return torch.clamp(a, lo, hi)
    return np.clip(a, lo, hi)


def _where(cond, a, b):
    if _is_torch(cond):
        import torch

        return torch.where(cond, a, b)
    return np.where(cond, a, b)


def _cast(a, name: str):
    """Cast to a dtype named like numpy ('int8', 'uint8', 'int32', 'float32', ...)."""
    if _is_torch(a):
        import torch

        return a.to(getattr(torch, name))
    return a.astype(name)


def _size(x) -> int:
    return int(x.numel()) if _is_torch(x) else int(x.size)


def _dtype_name(x) -> str:
    return str(x.dtype).replace("torch.", "")


def _check_scale_normal(scale, spread, xf) -> None:
    """Raise if a nonzero group's scale is below the smallest normal number of the dtype the
    arithmetic runs in: such a scale (from float32 subnormals, max |x| below about 1.5e-36 for
    INT8) has lost its precision or flushed to 0, and the codes would come out all zero."""
    tiny = float(np.finfo(np.float64 if _dtype_name(xf) == "float64" else np.float32).tiny)
    bad = (scale < tiny) & (spread > 0)                 # a group with values, a scale gone
    if bool(bad.any()):
        raise ValueError(f"values this small (a group's scale {float(scale[bad].max()):.3g} is "
                         f"below {_dtype_name(xf)}'s smallest normal number {tiny:.3g}) cannot be "
                         f"quantized in {_dtype_name(xf)}: their codes would be all zero or "
                         f"imprecise. Multiply x by a power of two first (and divide the scale "
                         f"by it afterwards), or quantize a float64 copy")


def _check_finite(x, what: str = "x") -> None:
    """Raise if x holds NaN or inf: one would poison its whole block's absmax scale."""
    if _is_torch(x):
        import torch

        if not x.is_floating_point():
            return
        bad = ~torch.isfinite(x)
        if not bool(bad.any()):
            return
        bad_np = bad.detach().cpu().numpy()
        n_nan = int(torch.isnan(x).sum())
    else:
        if not np.issubdtype(x.dtype, np.floating):
            return
        bad_np = ~np.isfinite(x)
        if not bad_np.any():
            return
        n_nan = int(np.isnan(x).sum())
    n_bad = int(bad_np.sum())
    where = [tuple(int(i) for i in idx) for idx in np.argwhere(bad_np)[:5]]
    raise ValueError(
        f"{what} has {n_bad} non-finite value(s) ({n_nan} NaN, {n_bad - n_nan} inf) of "
        f"{bad_np.size}, first at index {', '.join(map(str, where))}"
        f"{' ...' if n_bad > 5 else ''}. An absmax scale over a block with NaN or inf makes "
        f"the whole block NaN or zero: find where they come from, or replace them "
        f"(e.g. nan_to_num) before quantizing.")


def _is_number(v) -> bool:
    """A finite real number (not a bool)."""
    return (not isinstance(v, bool) and isinstance(v, (int, float, np.integer, np.floating))
            and math.isfinite(v))


def _is_whole(v, minimum: int = 0) -> bool:
    """A whole number >= ``minimum`` (ints, or floats such as 128.0; not bools)."""
    return _is_number(v) and int(v) == v and v >= minimum


def divisors(n: int) -> list[int]:
    """Every group size that divides a row of length ``n`` (lesson 03)."""
    if not _is_whole(n, minimum=1):
        raise ValueError(f"divisors needs a row length, a whole number >= 1; got {n!r}")
    n = int(n)
    return [d for d in range(1, n + 1) if n % d == 0]


# ---------------------------------------------------------------- formats

_INT_RE = re.compile(r"^(u?)int([2-8])$")
_FLOAT_FORMATS = ("fp8_e4m3", "fp8_e5m2", "fp4_e2m1")
_LUT_FORMATS = ("nf4",)
GRANULARITIES = ("per_tensor", "per_channel", "per_group", "per_token")


def known_formats() -> list[str]:
    """The format names ``quantize`` accepts (lesson 02)."""
    return ([f"int{b}" for b in range(2, 9)] + [f"uint{b}" for b in range(2, 9)]
            + list(_FLOAT_FORMATS) + list(_LUT_FORMATS))


def _parse_format(fmt: str):
    """('int', bits, unsigned) or ('float', None, None) or ('lut', None, None)."""
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a format name string, got {type(fmt).__name__}")
    m = _INT_RE.match(fmt)
    if m:
        return "int", int(m.group(2)), m.group(1) == "u"
    if fmt in _FLOAT_FORMATS:
        return "float", None, None
    if fmt in _LUT_FORMATS:
        return "lut", None, None
    raise ValueError(f"unknown format {fmt!r}; known: int2..int8, uint2..uint8, "
                     f"{', '.join(_FLOAT_FORMATS + _LUT_FORMATS)} (block formats have their "
                     f"own functions: quantize_mxfp4, quantize_nvfp4, quantize_nf4)")


def _format_max(fmt: str) -> float:
    from course_lib.formats import get_format

    return float(get_format(fmt).max_value)


def _round_to_grid(x, fmt: str):
    """Nearest value of a float format's grid (saturating at its max), same container."""
    from course_lib.formats import round_to_format

    m = _format_max(fmt)
    return round_to_format(_clip(x, -m, m), fmt)


# ---------------------------------------------------------------- lesson 02 primitives


def absmax_scale(x, qmax: float, axis=None):
    """scale = max|x| / qmax (lesson 02). ``axis=None``: one scale for all of x.

    qmax is the largest level of the target format: 127 for INT8, 7 for INT4, 6 for FP4
    E2M1, 448 for FP8 E4M3. An all-zero x gives scale 0; ``quantize`` turns that into 1 so
    nothing divides by zero.
    """
    x = _as_array(x)
    _check_finite(x)
    if not qmax > 0:
        raise ValueError(f"qmax must be the format's largest level, a positive number "
                         f"(127 for INT8, 7 for INT4, 6 for FP4); got {qmax!r}")
    if axis is None:
        m = abs(x).max()
        return float(m) / qmax if not _is_torch(x) else m / qmax
    return _amax(x, axis) / qmax


def absmax_quantize(x, bits: int = 8):
    """Symmetric absmax to signed ``bits``-bit integers: returns (q int8, scale) (lesson 02).

    scale = max|x| / (2**(bits-1) - 1); q = clamp(round(x / scale), -qmax, qmax).
    One scale for the whole of x; an all-zero x gets scale 1.0 (q all zero, no NaN).
    """
    qt = quantize(x, f"int{bits}", granularity="per_tensor")
    s = qt.scale.reshape(-1)[0]
    return qt.q, float(s)


def _minmax_params(lo, hi, bits: int):
    """Vectorised scale and zero point for ranges lo..hi (numpy or torch), see ``zero_point``."""
    levels = 2 ** bits - 1
    lo, hi = _clip(lo, None, 0.0), _clip(hi, 0.0, None)  # widen each range to include 0
    scale = (hi - lo) / levels
    scale = _where(scale == 0, scale * 0 + 1, scale)  # empty range: scale 1, zero 0
    zero = _clip(_round(-lo / scale), 0, levels)
    return scale, zero


def zero_point(x_min: float, x_max: float, bits: int = 4):
    """Asymmetric (min-max) quantization parameters: returns (scale, zero) (lesson 02).

    The range is first widened to include 0 (lo = min(x_min, 0), hi = max(x_max, 0), so 0 is
    stored exactly), then spread over the 2**bits levels 0..2**bits-1:
    scale = (hi - lo) / (2**bits - 1), zero = round(-lo / scale), clamped to 0..2**bits-1.
    Example: -0.4..1.1 in INT4 -> scale 0.1, zero 4. A range still empty after the widening
    (x_min == x_max == 0) gets (1.0, 0); 0.5..0.5 widens to 0..0.5 and is not empty.
    """
    if not (math.isfinite(x_min) and math.isfinite(x_max)):
        raise ValueError(f"zero_point needs a finite range, got {x_min}..{x_max}")
    if x_min > x_max:
        raise ValueError(f"x_min {x_min} is larger than x_max {x_max}: swap them")
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 1 <= bits <= 16:
        raise ValueError(f"bits must be a whole number of bits from 1 to 16 (e.g. 4 or 8); "
                         f"got {bits!r}")
    scale, zero = _minmax_params(np.float64(x_min), np.float64(x_max), bits)
    return float(scale), int(zero)


# ---------------------------------------------------------------- QTensor and quantize


@dataclass
class QTensor:
    """A quantized tensor: codes, scales (and zero points) plus what is needed to undo it.

    q      codes, same shape as the input (see the module docstring for their dtype);
    scale  shape ``shape[:-1] + (n_groups,)`` (per-tensor: all ones but the last, which is 1),
           float32 (float64 if the input was float64);
    zero   integer zero points shaped like ``scale`` (int32), or None when symmetric;
    fmt, granularity, group_size (values per scale along the last dim), shape, dtype
           (the input's dtype name); tensor_scale: NVFP4's second-level FP32 scale or None;
    extra  anything a block format keeps on the side (NF4 double quantization).
    """
    q: Any
    scale: Any
    zero: Any
    fmt: str
    granularity: str
    group_size: int
    shape: tuple
    dtype: str = "float32"
    tensor_scale: Any = None
    extra: dict = field(default_factory=dict)

    def dequantize(self):
        return dequantize(self)

    @property
    def n_groups(self) -> int:
        return self.shape[-1] // self.group_size if self.shape else 1


def _group_size_for(shape, granularity: str, group_size):
    if granularity not in GRANULARITIES:
        raise ValueError(f"unknown granularity {granularity!r}; known: {', '.join(GRANULARITIES)}")
    if len(shape) == 0:
        raise ValueError("cannot quantize a 0-d value: pass an array with at least one dimension")
    last = shape[-1]
    if granularity in ("per_tensor", "per_channel", "per_token"):
        if group_size is not None and group_size != last:
            raise ValueError(f"group_size={group_size} was given with granularity="
                             f"{granularity!r}; use granularity='per_group' for groups")
        return last
    gs = 128 if group_size is None else group_size
    if isinstance(gs, bool) or not isinstance(gs, (int, np.integer)) or gs <= 0:
        raise ValueError(f"group_size must be a positive integer, got {gs!r}")
    if last % gs != 0:
        divs = divisors(last)
        near = sorted(divs, key=lambda d: abs(d - gs))[:6]
        raise ValueError(f"group_size {gs} does not divide the last dimension ({last}); "
                         f"group sizes that do: {sorted(near)} (all divisors: "
                         f"{divs if len(divs) <= 24 else str(divs[:24])[:-1] + ', ...]'})")
    return int(gs)


def _grouped(x, gs: int, granularity: str):
    """(..., last) -> (..., n_groups, gs); per-tensor -> (1, ..., 1, 1, N)."""
    if granularity == "per_tensor":
        return x.reshape((1,) * (x.ndim - 1) + (1, -1))
    return x.reshape(tuple(x.shape[:-1]) + (x.shape[-1] // gs, gs))


def quantize(x, fmt: str = "int8", granularity: str = "per_channel", group_size=None,
             symmetric: bool = True) -> QTensor:
    """Round-to-nearest quantization with absmax (or min-max) scales (lessons 02-03).

    fmt: ``int2``..``int8``, ``uint2``..``uint8`` (always asymmetric), ``fp8_e4m3``,
    ``fp8_e5m2``, ``fp4_e2m1``, ``nf4``. granularity: ``per_tensor`` (one scale),
    ``per_channel`` (one per row, over the last dim: the output channels of an (out, in)
    weight), ``per_token`` (the same, for (tokens, features) activations), ``per_group``
    (runs of ``group_size`` consecutive values along the last dim; default 128).
    symmetric=False adds an integer zero point per scale (integer formats only).
    """
    x = _as_array(x)
    kind, bits, unsigned = _parse_format(fmt)
    _check_finite(x)
    if _size(x) == 0:
        raise ValueError(f"nothing to quantize: x has shape {tuple(x.shape)}")
    gs = _group_size_for(tuple(x.shape), granularity, group_size)
    xf = _work_float(x)
    xg = _grouped(xf, gs, granularity)  # (..., n_groups, gs)
    asym = unsigned or not symmetric
    zero = None
    if kind != "int" and asym:
        raise ValueError(f"zero points are for integer formats; {fmt} is symmetric "
                         f"(use symmetric=True, or an integer format such as uint4)")
    if kind == "int" and asym:
        levels = 2 ** bits - 1
        spread = _clip(_amax_raw(xg), 0.0, None) - _clip(_amin_raw(xg), None, 0.0)
        _check_scale_normal(spread / levels, spread, xf)
        scale, z = _minmax_params(_amin_raw(xg), _amax_raw(xg), bits)  # (..., n_groups, 1)
        q = _clip(_round(xg / scale) + z, 0, levels)
        q, zero = _cast(q, "uint8"), _cast(z[..., 0], "int32")
    else:
        if kind == "int":
            qmax = 2 ** (bits - 1) - 1
        elif kind == "float":
            qmax = _format_max(fmt)
        else:
            qmax = 1.0
        amax = _amax(xg)  # (..., n_groups, 1)
        scale = amax / qmax
        _check_scale_normal(scale, amax, xf)
        scale = _where(scale == 0, scale * 0 + 1, scale)
        y = xg / scale
        if kind == "int":
            q = _cast(_clip(_round(y), -qmax, qmax), "int8")
        elif kind == "float":
            q = _cast(_round_to_grid(y, fmt), "float32")
        else:
            q = _nf4_index(y)
    q = q.reshape(tuple(x.shape))
    return QTensor(q=q, scale=scale[..., 0], zero=zero, fmt=fmt, granularity=granularity,
                   group_size=gs, shape=tuple(x.shape), dtype=_dtype_name(x))


def _out_dtype(qt: QTensor) -> str:
    return "float64" if qt.dtype == "float64" else "float32"


def dequantize(qt: QTensor):
    """Undo ``quantize``: x^ = (q - zero) * scale, float32 (float64 for float64 input) (lesson 02)."""
    q = qt.q
    out = _out_dtype(qt)
    if qt.fmt == "nf4":
        vals = _nf4_value(q, out)
    else:
        vals = _cast(q, out)
    shape = tuple(qt.shape)
    vg = _grouped(vals, qt.group_size, qt.granularity)  # (..., n_groups, gs)
    scale = _cast(qt.scale, out)[..., None]
    if qt.zero is not None:
        vg = vg - _cast(qt.zero, out)[..., None]
    xh = vg * scale
    if qt.tensor_scale is not None:
        xh = xh * _cast(qt.tensor_scale, out)
    return xh.reshape(shape)


def fake_quantize(x, fmt: str = "int4", granularity: str = "per_group", group_size=128,
                  symmetric: bool = True):
    """dequantize(quantize(x)): same container, dtype and shape as x (lessons 02-04)."""
    x = _as_array(x)
    if granularity != "per_group":
        group_size = None
    xh = dequantize(quantize(x, fmt, granularity, group_size, symmetric))
    return _cast(xh, _dtype_name(x)) if (_is_torch(x) or x.dtype != xh.dtype) else xh


# ---------------------------------------------------------------- packing (lesson 03)


def pack_int4(q):
    """Two 4-bit codes per byte along the last dim (lesson 03; used by the W4A16 kernel).

    q: int8 (or any signed int) in [-8, 7], or uint8 in [0, 15]; the last dim must be even.
    Element 2i goes in the LOW nibble and 2i+1 in the HIGH nibble, as two's-complement
    nibbles (-1 -> 0xF). Returns uint8 with the last dim halved.
    """
    q = _as_array(q)
    name = _dtype_name(q)
    if "int" not in name or name == "bool":
        raise ValueError(f"pack_int4 packs integer codes; got dtype {name} "
                         f"(quantize first, e.g. quantize(x, 'int4').q)")
    if q.ndim == 0 or q.shape[-1] % 2 != 0:
        raise ValueError(f"pack_int4 needs an even last dimension (two codes per byte); got "
                         f"shape {tuple(q.shape)}: pad the last dim by one")
    lo, hi = (0, 15) if name == "uint8" else (-8, 7)
    qmin, qmax = (int(q.min()), int(q.max())) if _size(q) else (0, 0)
    if qmin < lo or qmax > hi:
        raise ValueError(f"pack_int4: codes must lie in [{lo}, {hi}] for dtype {name}; "
                         f"found {qmin}..{qmax}")
    u = _cast(_cast(q, "int16") & 0xF, "uint8")
    return u[..., 0::2] | (u[..., 1::2] << 4)


def unpack_int4(packed, signed: bool = True):
    """Inverse of ``pack_int4``: int8 in -8..7 (signed) or uint8 in 0..15 (lesson 03)."""
    packed = _as_array(packed)
    if _dtype_name(packed) != "uint8":
        raise ValueError(f"unpack_int4 expects uint8 bytes, got dtype {_dtype_name(packed)}")
    lo = packed & 0xF
    hi = packed >> 4
    if _is_torch(packed):
        import torch

        both = torch.stack([lo, hi], dim=-1)  # (..., n, 2)
    else:
        both = np.stack([lo, hi], axis=-1)  # (..., n, 2)
    out = both.reshape(tuple(packed.shape[:-1]) + (2 * packed.shape[-1],))
    if not signed:
        return out
    s = _cast(out, "int16")
    return _cast(_where(s >= 8, s - 16, s), "int8")


# ---------------------------------------------------------------- bits per weight (lesson 03)

#: Bits per weight of block formats, scales included (lesson 03).
#: mxfp4: 4-bit E2M1 + one 8-bit E8M0 scale per 32 values = 4 + 8/32.
#: nvfp4: 4-bit E2M1 + one 8-bit E4M3 scale per 16 values = 4 + 8/16 (plus one FP32
#:        scale per tensor, negligible: see ``bits_per_weight("nvfp4", n_elements=...)``).
#: q4_k: GGUF super-blocks of 256 weights = 8 sub-blocks of 32, each with a 6-bit scale
#:       and a 6-bit min, plus FP16 d and dmin per super-block: 4 + (8*12 + 2*16)/256 = 4.5.
#: q6_k: 6 + (16*8 + 16)/256 = 6.5625.
#: q4_k_m: a mix, not a block format: Q4_K for most tensors, Q6_K for the output head and for
#:         attn_v and ffn_down in about half the layers (llama.cpp ``src/llama-quant.cpp``,
#:         ``llama_tensor_get_type``), so its bits per weight depend on the model. 4.89 is
#:         Llama-3.1-8B's: llama.cpp's ``tools/quantize/README.md`` (vendored in the
#:         llama-cpp-python 0.3.36 sdist) lists 4.8944 bits/weight, 4.58 GiB, for that model:
#:         the whole file over all its weights, token embedding and output head included.
#:         ``hardware.llama_q4_k_m_bits`` recomputes it from the mix rule and the shapes.
BLOCK_FORMAT_BITS = {
    "mxfp4": 4 + 8 / 32,
    "nvfp4": 4 + 8 / 16,
    "q4_k": 4 + (8 * 12 + 2 * 16) / 256,
    "q6_k": 6 + (16 * 8 + 16) / 256,
    "q4_k_m": 4.89,
}


def bits_per_weight(bits, group_size=None, scale_bits: int = 16, zero_bits: int = 0,
                    n_elements=None) -> float:
    """Storage per weight, scales included: bits + (scale_bits + zero_bits) / group_size.

    ``bits_per_weight(4, 128)`` = 4.125, ``bits_per_weight(4, 32)`` = 4.5 (lesson 03).
    ``bits`` may also name a block format from ``BLOCK_FORMAT_BITS`` ("mxfp4", "nvfp4",
    "q4_k_m", ...); for "nvfp4", ``n_elements`` adds the FP32 tensor scale amortised over
    the tensor. group_size None means one scale per tensor of ``n_elements`` (or none).
    """
    if n_elements is not None and not _is_whole(n_elements, minimum=1):
        raise ValueError(f"n_elements is the tensor's number of values, a whole number >= 1; "
                         f"got {n_elements!r}")
    if isinstance(bits, str):
        if bits not in BLOCK_FORMAT_BITS:
            raise ValueError(f"unknown block format {bits!r}; known: {', '.join(BLOCK_FORMAT_BITS)}")
        extra = 32 / n_elements if (bits == "nvfp4" and n_elements) else 0.0
        return BLOCK_FORMAT_BITS[bits] + extra
    if not _is_number(bits) or not bits > 0:
        raise ValueError(f"bits must be a positive number (4, 8, ...) or a block format name; "
                         f"got {bits!r}")
    for name, v in (("scale_bits", scale_bits), ("zero_bits", zero_bits)):
        if not _is_number(v) or v < 0:
            raise ValueError(f"{name} must be a number >= 0 (16 for an FP16 scale); got {v!r}")
    if group_size is None:
        return float(bits) + ((scale_bits + zero_bits) / n_elements if n_elements else 0.0)
    if not _is_whole(group_size, minimum=1):
        raise ValueError(f"group_size must be a whole number >= 1 (32, 128, ...), got {group_size!r}")
    return float(bits) + (scale_bits + zero_bits) / group_size


# ---------------------------------------------------------------- MXFP4 (lesson 03)

_E2M1_EMAX = 2  # largest E2M1 exponent: 6 = 1.5 * 2**2


def quantize_mxfp4(x) -> QTensor:
    """OCP MXFP4: blocks of 32 along the last dim, one E8M0 (power-of-two) scale each.

    OCP MX rule: shared exponent = floor(log2(max|block|)) - 2 (2 is E2M1's largest
    exponent), clamped to E8M0's -127..127; elements = E2M1(x / 2**exponent), saturating at
    +-6. An all-zero block gets scale 1. q holds the E2M1 values, scale the powers of two.
    """
    x = _as_array(x)
    _check_finite(x)
    gs = _group_size_for(tuple(x.shape), "per_group", 32)
    xg = _grouped(_work_float(x), gs, "per_group")  # (..., n_blocks, 32)
    amax = _amax(xg)  # (..., n_blocks, 1)
    safe = _where(amax == 0, amax * 0 + 1, amax)
    if _is_torch(safe):
        import torch

        e = torch.floor(torch.log2(safe)) - _E2M1_EMAX
    else:
        e = np.floor(np.log2(safe)) - _E2M1_EMAX
    e = _clip(e, -127, 127)
    e = _where(amax == 0, e * 0, e)
    scale = 2.0 ** e
    q = _cast(_round_to_grid(xg / scale, "fp4_e2m1"), "float32").reshape(tuple(x.shape))
    return QTensor(q=q, scale=scale[..., 0], zero=None, fmt="mxfp4", granularity="per_group",
                   group_size=32, shape=tuple(x.shape), dtype=_dtype_name(x))


def dequantize_mxfp4(qt: QTensor):
    """x^ = E2M1 value * 2**shared_exponent (lesson 03)."""
    return dequantize(qt)


# ---------------------------------------------------------------- NVFP4 (lesson 03)


def quantize_nvfp4(x) -> QTensor:
    """NVIDIA NVFP4: blocks of 16, an FP8 E4M3 scale each, and one FP32 scale per tensor.

    tensor_scale = max|x| / (448 * 6), so every block scale fits E4M3;
    block scale = E4M3(max|block| / 6 / tensor_scale); elements = E2M1(x / (block scale *
    tensor_scale)). x^ = q * block scale * tensor_scale.
    """
    x = _as_array(x)
    _check_finite(x)
    gs = _group_size_for(tuple(x.shape), "per_group", 16)
    xf = _work_float(x)
    xg = _grouped(xf, gs, "per_group")  # (..., n_blocks, 16)
    t = float(abs(xf).max()) / (448.0 * 6.0) if _size(xf) else 0.0
    t = t if t > 0 else 1.0
    block = _cast(_round_to_grid(_amax(xg) / 6.0 / t, "fp8_e4m3"), _dtype_name(xf))
    safe = _where(block == 0, block * 0 + 1, block)
    q = _cast(_round_to_grid(xg / (safe * t), "fp4_e2m1"), "float32").reshape(tuple(x.shape))
    ts = np.asarray(t, dtype=np.float32)
    if _is_torch(x):
        import torch

        ts = torch.tensor(t, dtype=torch.float32, device=x.device)
    return QTensor(q=q, scale=safe[..., 0], zero=None, fmt="nvfp4", granularity="per_group",
                   group_size=16, shape=tuple(x.shape), dtype=_dtype_name(x), tensor_scale=ts)


def dequantize_nvfp4(qt: QTensor):
    """x^ = E2M1 value * E4M3 block scale * FP32 tensor scale (lesson 03)."""
    return dequantize(qt)


# ---------------------------------------------------------------- NF4 (lesson 03)

@lru_cache(maxsize=1)
def _nf4_table() -> np.ndarray:
    from course_lib.formats import nf4_levels as _levels

    return np.asarray(_levels(), dtype=np.float32)  # (16,) ascending


def nf4_levels() -> np.ndarray:
    """The 16 NF4 levels (float32, ascending), -1..1 with an exact 0 (lesson 03).

    Built from normal quantiles by ``course_lib.formats.nf4_levels`` (lesson 01), the one
    source; they match the table bitsandbytes ships.
    """
    return _nf4_table().copy()


def _nf4_index(y):
    """Nearest NF4 level's index (uint8) for values already divided by the block absmax."""
    lv = _nf4_table()
    mids = (lv[1:] + lv[:-1]) / 2  # 15 decision boundaries
    if _is_torch(y):
        import torch

        m = torch.as_tensor(mids, dtype=y.dtype, device=y.device)
        return torch.bucketize(y.contiguous(), m, right=False).to(torch.uint8)
    return np.searchsorted(mids.astype(y.dtype), y, side="left").astype(np.uint8)


def _nf4_value(q, out: str):
    if _is_torch(q):
        import torch

        lut = torch.as_tensor(_nf4_table(), device=q.device).to(getattr(torch, out))
        return lut[q.long()]
    return _nf4_table().astype(out)[q]


def quantize_nf4(x, block_size: int = 64, double_quant: bool = False) -> QTensor:
    """QLoRA NF4: blocks of ``block_size`` along the last dim, absmax scale, 16 normal levels.

    double_quant=True quantizes the absmax scales themselves (QLoRA's double quantization):
    their mean is subtracted and the rest stored as INT8 with one FP32 scale per 256 absmax
    values (QLoRA uses an 8-bit float there; INT8 shows the same saving). Scale storage
    drops from 32/64 = 0.5 to 8/64 + 32/(64*256) ~ 0.127 bits per weight. ``scale`` then
    holds the dequantized absmax values, ``extra`` the codes, their scales and the mean.
    """
    qt = quantize(x, "nf4", "per_group", block_size)
    if not double_quant:
        return qt
    s = qt.scale  # (..., n_blocks)
    flat = s.reshape(-1)
    mean = flat.mean()
    c = flat - mean
    n = c.shape[0]
    pad = (-n) % 256
    if _is_torch(c):
        import torch

        cp = torch.cat([c, c.new_zeros(pad)])
    else:
        cp = np.concatenate([c, np.zeros(pad, dtype=c.dtype)])
    sq = quantize(cp.reshape(-1, 256), "int8", "per_channel")
    deq = dequantize(sq).reshape(-1)[:n] + mean
    qt.scale = deq.reshape(tuple(s.shape))
    qt.extra = {"scale_codes": sq.q, "scale_scales": sq.scale, "scale_mean": mean}
    return qt


def dequantize_nf4(qt: QTensor):
    """x^ = NF4 level * block absmax (lesson 03)."""
    return dequantize(qt)


# ---------------------------------------------------------------- error metrics (lesson 02)


def _same_shape(reference, approx, what: str):
    """Both as numpy arrays; raise if their shapes differ (numpy would broadcast silently)."""
    r, a = to_numpy(reference), to_numpy(approx)
    if r.shape != a.shape:
        raise ValueError(f"{what}: reference has shape {r.shape} but approx has shape {a.shape}; "
                         f"compare a tensor with its own dequantized copy (same shape), e.g. "
                         f"reshape one of them")
    if r.size == 0:
        raise ValueError(f"{what}: the arrays are empty; there is no error to measure")
    _check_finite(r, f"{what}: reference")
    _check_finite(a, f"{what}: approx")
    return r, a


def mae(reference, approx) -> float:
    """Mean absolute error (lesson 02)."""
    r, a = _same_shape(reference, approx, "mae")
    return float(np.mean(np.abs(r - a)))


def rmse(reference, approx) -> float:
    """Root-mean-square error (lesson 02)."""
    r, a = _same_shape(reference, approx, "rmse")
    return float(np.sqrt(np.mean((r - a) ** 2)))


def relative_rms_error(reference, approx) -> float:
    """||ref - approx|| / ||ref|| (a fraction; x100 for %) (lessons 02-03)."""
    r, a = _same_shape(reference, approx, "relative_rms_error")
    denom = float(np.sqrt(np.sum(r ** 2)))
    num = float(np.sqrt(np.sum((r - a) ** 2)))
    if denom == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / denom


# ---------------------------------------------------------------- synthetic weights (lesson 03)


def synthetic_weights(rows: int = 256, cols: int = 1024, n_outliers: int = 8,
                      outlier: float = 0.6, seed: int = 11) -> np.ndarray:
    """A weight-like matrix: Gaussian rows of different scales plus a few large outliers.

    Row r has standard deviation 0.02 * exp(N(0, 0.5)); ``n_outliers`` random entries are
    set to +-``outlier``. float32, shape (rows, cols). The course's own numpy generator of
    the 256 x 1024 matrix its source text uses (lesson 03).
    """
    for name, v in (("rows", rows), ("cols", cols)):
        if not _is_whole(v, minimum=1):
            raise ValueError(f"{name} must be a whole number >= 1, got {v!r}")
    if not _is_whole(n_outliers, minimum=0):
        raise ValueError(f"n_outliers must be a whole number >= 0, got {n_outliers!r}")
    if not _is_number(outlier):
        raise ValueError(f"outlier is the planted magnitude, a finite number; got {outlier!r}")
    rows, cols, n_outliers = int(rows), int(cols), int(n_outliers)
    rng = np.random.default_rng(seed)
    row_std = 0.02 * np.exp(rng.normal(0.0, 0.5, size=(rows, 1)))  # (rows, 1)
    w = rng.normal(0.0, 1.0, size=(rows, cols)) * row_std  # (rows, cols)
    r = rng.integers(0, rows, size=n_outliers)
    c = rng.integers(0, cols, size=n_outliers)
    w[r, c] = rng.choice([-1.0, 1.0], size=n_outliers) * outlier
    return w.astype(np.float32)


def _check_matrix(w, what: str) -> np.ndarray:
    """w as a 2-D finite float numpy array, or a ValueError that says what to pass."""
    w = to_numpy(w) if _is_torch(w) else np.asarray(w)
    if w.ndim != 2 or w.size == 0:
        raise ValueError(f"{what} needs a non-empty 2-D (rows, cols) weight matrix; got shape "
                         f"{w.shape}")
    if not np.issubdtype(w.dtype, np.floating):
        raise ValueError(f"{what} needs floating-point weights; got dtype {w.dtype}")
    _check_finite(w, "w")
    return w


def remove_outliers(w, k: float = 6.0) -> np.ndarray:
    """A copy of ``w`` with every entry larger than ``k`` x its row's RMS set to 0 (lesson 03).

    The "remove the outliers and see which schemes change" experiment: on the 256 x 1024
    benchmark, k = 6 removes exactly its eight planted outliers.
    """
    w = _check_matrix(w, "remove_outliers")
    if isinstance(k, bool) or not isinstance(k, (int, float, np.integer, np.floating)) \
            or not math.isfinite(k) or k <= 0:
        raise ValueError(f"k is a multiple of the row RMS, a positive number such as 6; got {k!r}")
    row_rms = np.sqrt(np.mean(w.astype(np.float64) ** 2, axis=1, keepdims=True))  # (rows, 1)
    return np.where(np.abs(w) > k * row_rms, 0, w).astype(w.dtype)  # (rows, cols)


def largest_group_within(w, target_rel_error: float, fmt: str = "int4",
                         symmetric: bool = True) -> int | None:
    """The largest group size (a divisor of the row length) whose per-group ``fmt`` error on
    ``w`` is at most ``target_rel_error`` (a fraction, e.g. 0.054); None if even group 1
    misses it (lesson 03: how small must INT4 groups get to match INT8 per tensor?)."""
    w = _check_matrix(w, "largest_group_within")
    if not (isinstance(target_rel_error, (int, float, np.floating)) and
            math.isfinite(target_rel_error) and target_rel_error >= 0):
        raise ValueError(f"target_rel_error is a fraction >= 0 (0.054 for 5.4%); got "
                         f"{target_rel_error!r}")
    for g in sorted(divisors(w.shape[1]), reverse=True):
        w_hat = fake_quantize(w, fmt, "per_group", g, symmetric=symmetric)
        if relative_rms_error(w, w_hat) <= target_rel_error:
            return g
    return None
