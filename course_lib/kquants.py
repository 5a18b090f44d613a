"""llama.cpp's 5-bit blocks and k-quants, quantized and decoded in NumPy, bit for bit (lesson 14).

A Q4_K_M file mixes several of llama.cpp's block formats. Two families:

- **Blocks of 32** (the lesson 13 family, one more bit): **Q5_0** stores one fp16 scale ``d``
  and 32 codes of 5 bits (``w = d * (q - 16)``): 22 bytes, 5.5 bits per weight; **Q5_1** adds an
  fp16 minimum ``m`` (``w = d * q + m``): 24 bytes, 6 bits. The fifth bit of every code lives in
  one 32-bit word ``qh`` beside the 16 bytes of low nibbles.
- **k-quants, super-blocks of 256 weights**: **Q4_K** holds 8 sub-blocks of 32, each with a 6-bit
  scale and a 6-bit minimum, and two fp16 numbers for the whole super-block, ``d`` and ``dmin``:
  sub-block j's weights are ``w = d * sc_j * q - dmin * m_j`` with ``q`` in 0..15. 2 + 2 + 12
  bytes of scales + 128 bytes of nibbles = 144 bytes, 4.5 bits per weight. The sub-block scales
  are themselves quantized against ``d`` (double quantization, as QLoRA does for NF4's
  absmax). **Q5_K** is Q4_K with a fifth bit per code (176 bytes, 5.5 bits); **Q6_K** has 16
  sub-blocks of 16 with signed 8-bit scales and one fp16 ``d``, codes -32..31 (210 bytes,
  6.5625 bits). A row must be a multiple of 256 wide: SmolLM2's 576-wide rows are not, which
  is why most of its Q4_K_M file falls back to Q5_0 (see :mod:`course_lib.kmix`).

How a block's scale is chosen is where llama.cpp spends its effort: for the k-quants not absmax
but a search over candidate scales (and minimums) minimizing a *weighted* squared error. Without
an importance matrix the weights come from the values themselves; with one (``imatrix``: a
non-negative weight per column, llama.cpp's mean squared input activation) they say which
columns matter, and the 32-blocks Q4_0, Q4_1, Q5_0 and Q5_1 search too (without one they keep
lesson 13's plain rounding). Q8_0 ignores the importance matrix. Where in llama.cpp's
``ggml/src/ggml-quants.c`` (llama-cpp-python 0.3.36): Q4_K/Q5_K ``make_qkx2_quants`` without
(lines 1476, 1663), ``make_qkx3_quants`` and ``make_qp_quants`` with (lines 1583-1587, sigma2
at 1570); Q6_K ``make_qx_quants`` weighted by x^2 without (1883), by the importance alone with
(1994); Q4_0 plain rounding without (2073-2076); Q8_0 (2296).

Every function reproduces llama.cpp's ``ggml-quants.c`` operation for operation in float32, so
:func:`quantize` gives the same bytes as the engine's ``ggml_quantize_chunk``
(:func:`course_lib.engine.quantize_chunk`; the tests compare them). Vectorized over blocks; the
sums llama.cpp takes element by element are taken element by element here too (NumPy's ``sum``
adds in another order and would round differently).
"""
from __future__ import annotations

import math

import numpy as np
import torch

QK_K = 256                               # weights per k-quant super-block
F32 = np.float32
EPS = F32(1e-15)                         # llama.cpp's GROUP_MAX_EPS: a block below is all zero

#: weights per block and bytes per block of each format this module writes.
BLOCKS = {"q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24),
          "q8_0": (32, 34), "q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210)}
FORMATS = tuple(BLOCKS)


def bits_per_weight(fmt: str) -> float:
    """Bits per weight of ``fmt``, scales included: q4_k 4.5, q6_k 6.5625 ..."""
    n, size = BLOCKS[_fmt(fmt)]
    return size * 8 / n


def row_bytes(fmt: str, cols: int) -> int:
    """Bytes of one row of ``cols`` weights in ``fmt``. ValueError when ``fmt`` cannot store
    such a row (``cols`` not a multiple of its block: :func:`fits`)."""
    fmt = _fmt(fmt)
    cols = _whole(cols, "cols")
    n, size = BLOCKS[fmt]
    if cols % n:
        raise ValueError(f"cols={cols}: " + _misfit(fmt, cols))
    return cols // n * size


def fits(fmt: str, cols: int) -> bool:
    """Whether rows of ``cols`` weights can be stored in ``fmt`` (a whole number of blocks)."""
    fmt = _fmt(fmt)
    return _whole(cols, "cols") % BLOCKS[fmt][0] == 0


# ----------------------------------------------------------------------------- checks
def _fmt(fmt) -> str:
    if not isinstance(fmt, str) or fmt.lower() not in BLOCKS:
        raise ValueError(f"fmt must be one of {', '.join(FORMATS)}; got {fmt!r}")
    return fmt.lower()


def _whole(v, name: str, minimum: int = 1) -> int:
    """v as an int: a whole number >= ``minimum`` (ints, NumPy ints, or floats such as 256.0;
    not bools, not strings)."""
    ok = (not isinstance(v, bool) and isinstance(v, (int, float, np.integer, np.floating))
          and math.isfinite(v) and int(v) == v and v >= minimum)
    if not ok:
        raise ValueError(f"{name} must be a whole number >= {minimum}; got {v!r}")
    return int(v)


def _misfit(fmt: str, cols: int) -> str:
    """The message for rows of ``cols`` that ``fmt``'s blocks do not tile."""
    n = BLOCKS[fmt][0]
    ok = [f for f in FORMATS if cols % BLOCKS[f][0] == 0]
    return (f"{fmt.upper()} stores blocks of {n} weights along each row, and rows of {cols} "
            f"are not a multiple of {n}; formats that take {cols} columns: "
            f"{', '.join(ok) if ok else 'none (pad the rows or keep them F16)'}")


def _array(x, name: str, ndim: int | None = None, last: int | None = None) -> np.ndarray:
    """x (NumPy, torch or a nested list of numbers) as a finite float32 NumPy array with
    ``ndim`` dimensions (and ``last`` entries in the last one), or a ValueError naming it."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        x = x.float().numpy() if x.is_floating_point() else x.numpy()
    if isinstance(x, (str, bytes)) or x is None:
        raise ValueError(f"{name} must be an array of numbers; got {type(x).__name__}")
    a = np.asarray(x)
    if a.dtype == object or not (np.issubdtype(a.dtype, np.floating)
                                 or np.issubdtype(a.dtype, np.integer)):
        raise ValueError(f"{name} must be an array of real numbers; got dtype {a.dtype}")
    if (ndim is not None and a.ndim != ndim) or (last is not None and a.shape[-1] != last) \
            or a.size == 0:
        want = f"{ndim}-D" if ndim is not None else "an"
        raise ValueError(f"{name} must be a non-empty {want} array"
                         f"{f' with {last} entries per row' if last is not None else ''}; "
                         f"got shape {a.shape}")
    a = a.astype(F32)
    _finite(a, name)
    return a


def _finite(a: np.ndarray, name: str) -> None:
    """Refuse NaN and inf, saying how many and where the first is."""
    bad = ~np.isfinite(a)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name} holds {int(bad.sum())} NaN or inf value(s) of {a.size} "
                         f"(first at index {first}): no block format can represent them; find "
                         f"where they come from, or replace them (np.nan_to_num) first")


def _same_shape(a: np.ndarray, name: str, like: np.ndarray, like_name: str) -> None:
    if a.shape != like.shape:
        raise ValueError(f"{name} needs one weight per entry of {like_name}: shape "
                         f"{like.shape}; got {a.shape}")


def _non_negative(a: np.ndarray, name: str) -> None:
    if (a < 0).any():
        raise ValueError(f"{name} holds error weights, which are never negative; got a minimum "
                         f"of {float(a.min()):g}")


def _rows(w, fmt: str) -> np.ndarray:
    """w (rows, cols) as float32 NumPy, refusing what ``fmt`` cannot hold."""
    if isinstance(w, torch.Tensor):
        if not w.is_floating_point():
            raise ValueError(f"{fmt.upper()} quantizes floating-point weights; got {w.dtype}")
        w = w.detach().float().cpu().numpy()
    if isinstance(w, (str, bytes)) or w is None:
        raise ValueError(f"{fmt.upper()} quantizes a 2-D floating-point weight w (rows, cols); "
                         f"got {type(w).__name__}")
    w = np.asarray(w)
    if w.ndim != 2 or not np.issubdtype(w.dtype, np.floating):
        raise ValueError(f"{fmt.upper()} quantizes a 2-D floating-point weight (rows, cols); got "
                         f"shape {w.shape} {w.dtype}")
    if w.shape[0] == 0 or w.shape[1] == 0:
        raise ValueError(f"w has shape {w.shape}: {fmt.upper()} needs at least one row of at "
                         f"least one block ({BLOCKS[fmt][0]} weights)")
    cols = w.shape[1]
    if cols % BLOCKS[fmt][0]:
        raise ValueError(_misfit(fmt, cols))
    w = np.ascontiguousarray(w, dtype=F32)
    if not np.isfinite(w).all():
        bad = ~np.isfinite(w)
        r, c = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"the weight holds NaN or inf ({int(bad.sum())} of {w.size}, first at "
                         f"row {r}, column {c}): {fmt.upper()} cannot represent them; find where "
                         f"they come from, or replace them before quantizing")
    return w


def check_imatrix(imatrix, cols: int) -> np.ndarray:
    """An importance vector, one non-negative finite weight per column, as float32 (cols,)."""
    cols = _whole(cols, "cols")
    if isinstance(imatrix, torch.Tensor):
        imatrix = imatrix.detach().float().cpu().numpy()
    if isinstance(imatrix, (str, bytes, dict)) or imatrix is None:
        raise ValueError(f"imatrix must be an importance vector, one number per column "
                         f"({cols},); got {type(imatrix).__name__}")
    try:
        v = np.asarray(imatrix, dtype=F32)
    except (TypeError, ValueError):
        raise ValueError(f"imatrix must be an importance vector, one number per column "
                         f"({cols},); got {type(imatrix).__name__} that is not numbers") from None
    if v.shape != (cols,):
        raise ValueError(f"the importance vector needs one weight per column: shape ({cols},); "
                         f"got {v.shape} (is it the imatrix of another Linear?)")
    if not np.isfinite(v).all():
        raise ValueError(f"the importance vector (imatrix) holds NaN or inf at "
                         f"{int((~np.isfinite(v)).sum())} column(s): recompute it from finite "
                         f"activations")
    if (v < 0).any():
        raise ValueError(f"the importance vector (imatrix) holds importance weights, mean squared "
                         f"activations, never negative; got a minimum of {float(v.min()):g} "
                         f"(at column {int(v.argmin())})")
    return v


def _fp16(d: np.ndarray, fmt: str) -> np.ndarray:
    """Scales as the file stores them (fp16), refusing one fp16 cannot hold."""
    with np.errstate(over="ignore"):
        h = d.astype(np.float16)
    if np.isinf(h).any():
        big = float(np.abs(d[np.isinf(h)]).max())
        raise ValueError(f"a {fmt.upper()} scale of {big:.4g} overflows fp16 (largest 65504): "
                         f"the weights are too large for this format; scale the tensor down "
                         f"or keep it in F32")
    return h


def _no_lost_blocks(x: np.ndarray, zero: np.ndarray, fmt: str, cols: int, per: int,
                    strict: bool, qw=None) -> None:
    """Refuse blocks x (B, per) that hold nonzero weights but whose stored fp16 scales all
    rounded to 0 (``zero`` (B,) True there): such a block would decode as all zeros, its
    weights lost without a word. llama.cpp stores them so; the course says so instead, unless
    ``strict`` is False (``quantize(..., strict_scales=False)``: llama.cpp's bytes). ``qw``:
    the importance vector (cols,) when one was given (a block it weights 0 everywhere has no
    error to minimize, so its scale stays 0)."""
    if not strict:
        return
    lost = zero & (np.abs(x).max(1) > 0)
    if lost.any():
        b = int(np.argmax(lost))
        per_row = cols // per
        row, c0 = b // per_row, b % per_row * per
        if qw is not None and not np.any(qw[c0:c0 + per]):
            raise ValueError(
                f"{int(lost.sum())} {fmt.upper()} block(s) of {per} weights would decode as all "
                f"zeros (the first: row {row}, columns {c0}..{c0 + per - 1}): the importance "
                f"vector (imatrix) is 0 on all of their columns, so the scale search has no "
                f"error to weigh and keeps scale 0 (llama.cpp writes such blocks so). Check the "
                f"importance vector (columns that never saw an input?), or quantize without one")
        raise ValueError(
            f"{int(lost.sum())} {fmt.upper()} block(s) of {per} weights hold nonzero weights "
            f"(the first: row {row}, columns {c0}..{c0 + per - 1}, "
            f"largest |w| {float(np.abs(x[b]).max()):.3g}) but their scale rounds to 0 in fp16 "
            f"(its smallest step is 6e-08): they would decode as all zeros. Scale the tensor "
            f"up (and the layer's output down), keep it in F16/F32, or pass "
            f"strict_scales=False to store the zeros as llama.cpp does")


# ----------------------------------------------------------------------------- the searches
def _nearest(v: np.ndarray) -> np.ndarray:
    """llama.cpp's ``nearest_int``: float32 rounded to the nearest integer, ties to even
    (it adds 1.5 * 2**23 and reads the mantissa). Returned as float32 holding integers;
    NaN (from a 0/0 in a block that is skipped anyway) becomes 0."""
    r = np.rint(v)
    return np.where(np.isnan(r), F32(0), r).astype(F32)


def _sum(terms: np.ndarray) -> np.ndarray:
    """Row sums of terms (B, n), added one column after the other from 0 in float32, as a
    C loop does: (B,)."""
    acc = np.zeros(terms.shape[0], F32)
    for i in range(terms.shape[1]):
        acc = acc + terms[:, i]
    return acc


def _wsum(w, a, b=None):
    """sum_i (w_i * a_i) (* b_i), element by element: C's ``s += w*a*b``."""
    t = w * a if b is None else (w * a) * b
    return _sum(t)


def make_qx_quants(x: np.ndarray, nmax: int, qw: np.ndarray | None = None):
    """Symmetric codes for blocks x (B, n): the scale search of llama.cpp's ``make_qx_quants``
    (rmse_type 1). Codes l in -nmax..nmax-1 round x / s; 19 trial scales around -nmax / max
    (max: the value of largest magnitude, with its sign); kept: the one whose least-squares
    scale explains most of sum w x^2 (the weighted error is then smallest). Weights w: ``qw``,
    or x^2. Returns (scale (B,), codes l + nmax (B, n))."""
    x = _array(x, "x", ndim=2)
    nmax = _whole(nmax, "nmax")
    if qw is not None:
        qw = _array(qw, "qw", ndim=2)
        _same_shape(qw, "qw", x, "x")
        _non_negative(qw, "qw")
    return _make_qx_quants(x, nmax, qw)


def _make_qx_quants(x: np.ndarray, nmax: int, qw: np.ndarray | None = None):
    """make_qx_quants without its checks (the quantizers call it on checked blocks)."""
    B, n = x.shape
    idx = np.abs(x).argmax(1)                                            # first largest |x|
    mx = x[np.arange(B), idx]                                            # (B,) signed
    zero = np.abs(mx) < EPS
    w = qw if qw is not None else x * x
    safe = np.where(zero, F32(1), mx)
    nm = F32(nmax)

    def trial(iscale):
        l = np.clip(_nearest(iscale[:, None] * x), -nm, nm - 1)          # (B, n)
        with np.errstate(over="ignore"):                                 # inf compares as C's
            return l, _wsum(w, x, l), _wsum(w, l, l)

    l, sumlx, suml2 = trial(-nm / safe)
    L = l + nm
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(suml2 != 0, sumlx / suml2, F32(0)).astype(F32)
    best = scale * sumlx
    for s in range(-9, 10):
        if s == 0:
            continue
        l, sumlx, suml2 = trial(-(nm + F32(0.1) * F32(s)) / safe)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            up = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            new = (sumlx / suml2).astype(F32)
        L = np.where(up[:, None], l + nm, L)
        scale = np.where(up, new, scale)
        best = np.where(up, new * sumlx, best)
    scale = np.where(zero, F32(0), scale)
    L = np.where(zero[:, None], F32(0), L)
    return scale.astype(F32), L.astype(F32)


def make_qkx_quants(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float,
                    nstep: int, v3: bool):
    """Codes 0..nmax with a scale and a minimum for blocks x (B, n): llama.cpp's
    ``make_qkx2_quants`` (``v3=False``, no importance matrix) or ``make_qkx3_quants``
    (``v3=True``). Start from min/max; try nstep + 1 grids ``(nmax + rmin + rdelta * i) /
    (max - min)``; for each, the weighted least-squares scale and minimum of the codes it
    gives (a minimum above 0 is set to 0); keep the lowest weighted squared error.
    Returns (scale (B,), minimum as stored, -min >= 0 (B,), codes (B, n))."""
    x = _array(x, "x", ndim=2)
    w = _array(w, "w", ndim=2)
    _same_shape(w, "w", x, "x")
    _non_negative(w, "w")
    nmax = _whole(nmax, "nmax")
    nstep = _whole(nstep, "nstep", minimum=0)
    for name, v in (("rmin", rmin), ("rdelta", rdelta)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) \
                or not math.isfinite(v):
            raise ValueError(f"{name} must be a finite number (llama.cpp's Q4_K: rmin -1, "
                             f"rdelta 0.1); got {v!r}")
    if not isinstance(v3, (bool, np.bool_)):
        raise TypeError(f"v3 must be True (make_qkx3_quants) or False (make_qkx2_quants); "
                        f"got {v3!r}")
    return _make_qkx_quants(x, w, nmax, rmin, rdelta, nstep, bool(v3))


def _make_qkx_quants(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float,
                    nstep: int, v3: bool):
    """make_qkx_quants without its checks (the quantizers call it on checked blocks)."""
    B, n = x.shape
    mn, mx = x.min(1), x.max(1)
    sum_w, sum_x = w[:, 0].copy(), w[:, 0] * x[:, 0]
    for i in range(1, n):
        sum_w = sum_w + w[:, i]
        sum_x = sum_x + w[:, i] * x[:, i]
    mn = np.where(mn > 0, F32(0), mn).astype(F32)
    flat = (mx <= mn) if v3 else (mx == mn)
    nm = F32(nmax)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = nm / (mx - mn)
        scale = F32(1) / iscale
        L = np.clip(_nearest(iscale[:, None] * (x - mn[:, None])), 0, nm)
        d = (scale[:, None] * L + mn[:, None]) - x
        best = _wsum(w, d * d)
        for s in range(nstep + 1):
            iscale = (F32(rmin) + F32(rdelta) * F32(s) + nm) / (mx - mn)
            v = iscale[:, None] * (x - mn[:, None])
            if v3:
                la = np.where(v > 0, _nearest(np.minimum(v, nm)), F32(0))
            else:
                la = np.clip(_nearest(v), 0, nm)
            sum_l, sum_l2, sum_xl = _wsum(w, la), _wsum(w, la, la), _wsum(w, la, x)
            D = sum_w * sum_l2 - sum_l * sum_l
            ts = (sum_w * sum_xl - sum_x * sum_l) / D
            tm = (sum_l2 * sum_x - sum_l * sum_xl) / D
            pos = tm > 0
            tm = np.where(pos, F32(0), tm)
            ts = np.where(pos, sum_xl / sum_l2, ts)
            d = (ts[:, None] * la + tm[:, None]) - x
            err = _wsum(w, d * d)
            up = (D > 0) & (err < best)
            L = np.where(up[:, None], la, L)
            best = np.where(up, err, best)
            scale = np.where(up, ts, scale).astype(F32)
            mn = np.where(up, tm, mn).astype(F32)
    scale = np.where(flat, F32(0), scale)
    L = np.where(flat[:, None], F32(0), L)
    return scale.astype(F32), (-mn).astype(F32), L.astype(F32)


def _u8(v: np.ndarray) -> np.ndarray:
    """C's conversion of an int to uint8_t (modulo 256), kept as float32."""
    return np.mod(v, 256).astype(F32)


def make_qp_quants(x: np.ndarray, nmax: int, qw: np.ndarray):
    """Codes 0..nmax for the non-negative sub-block scales x (B, n) of a super-block, weighted
    by qw (B, n): llama.cpp's ``make_qp_quants`` (used with an importance matrix). Nine trial
    scales around max / nmax by weighted error, then up to five passes that move single codes
    while the weighted fit improves. Returns (scale (B,), codes (B, n))."""
    x = _array(x, "x", ndim=2)
    if (x < 0).any():
        raise ValueError(f"x holds the sub-block scales of super-blocks, never negative; got a "
                         f"minimum of {float(x.min()):g}")
    nmax = _whole(nmax, "nmax")
    if nmax > 255:
        raise ValueError(f"nmax must be at most 255 (the codes are bytes; llama.cpp uses 63); "
                         f"got {nmax}")
    qw = _array(qw, "qw", ndim=2)
    _same_shape(qw, "qw", x, "x")
    _non_negative(qw, "qw")
    return _make_qp_quants(x, nmax, qw)


def _make_qp_quants(x: np.ndarray, nmax: int, qw: np.ndarray):
    """make_qp_quants without its checks (the quantizers call it on checked blocks)."""
    B, n = x.shape
    mx = np.maximum(x.max(1), F32(0))
    zero = mx < EPS
    safe = np.where(zero, F32(1), mx)
    nm = F32(nmax)
    iscale = nm / safe
    L = _u8(_nearest(iscale[:, None] * x))
    scale = F32(1) / iscale
    d = x - scale[:, None] * L
    best = _wsum(qw, d, d)
    for s in range(-4, 5):
        if s == 0:
            continue
        isc = (F32(0.1) * F32(s) + nm) / safe
        sc = F32(1) / isc
        l = np.minimum(nm, _nearest(isc[:, None] * x))
        d = x - sc[:, None] * l
        mse = _wsum(qw, d, d)
        up = mse < best
        best = np.where(up, mse, best)
        iscale = np.where(up, isc, iscale).astype(F32)
    l = np.minimum(nm, _nearest(iscale[:, None] * x))
    L = _u8(l)
    sumlx, suml2 = _wsum(qw, x, l), _wsum(qw, l, l)
    with np.errstate(divide="ignore", invalid="ignore"):
        for _ in range(5):
            changed = False
            for i in range(n):
                w, xi, Li = qw[:, i], x[:, i], L[:, i]
                slx = sumlx - (w * xi) * Li
                sl2 = suml2 - (w * Li) * Li
                ok = (slx > 0) & (sl2 > 0)
                new = np.minimum(nm, _nearest((xi * sl2) / slx))
                ok &= new != Li
                slx2 = slx + (w * xi) * new
                sl22 = sl2 + (w * new) * new
                ok &= (slx2 * slx2) * suml2 > (sumlx * sumlx) * sl22
                if ok.any():
                    changed = True
                    L[:, i] = np.where(ok, _u8(new), Li)
                    sumlx = np.where(ok, slx2, sumlx).astype(F32)
                    suml2 = np.where(ok, sl22, suml2).astype(F32)
            if not changed:
                break
        out = np.where(suml2 > 0, sumlx / suml2, F32(0)).astype(F32)
    out = np.where(zero, F32(0), out)
    L = np.where(zero[:, None], F32(0), L)
    return out.astype(F32), L


# ----------------------------------------------------------------------------- bit packing
def _pack_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """pack_scales_k4 without its checks, on uint8 codes as C stores them."""
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    out = np.zeros(sc.shape[:-1] + (12,), np.uint8)
    for j in range(4):
        out[..., j] = sc[..., j]
        out[..., j + 4] = m[..., j]
    for j in range(4, 8):
        out[..., j + 4] = (sc[..., j] & 0xF) | ((m[..., j] & 0xF) << 4)
        out[..., j - 4] |= (sc[..., j] >> 4) << 6
        out[..., j] |= (m[..., j] >> 4) << 6
    return out


def pack_scales_k4(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and eight 6-bit minimums of a Q4_K/Q5_K super-block -> its 12 bytes.

    (..., 8) codes 0..63 each -> (..., 12) uint8. Sub-blocks 0-3: byte j holds scale j,
    byte j + 4 minimum j (6 bits each). Sub-blocks 4-7: byte j + 4 holds the low 4 bits of
    scale j (low nibble) and of minimum j (high nibble); their top 2 bits go into the free
    top bits of bytes j - 4 (scale) and j (minimum)."""
    sc, m = _codes(sc, "sc", 8, 63), _codes(m, "m", 8, 63)
    if sc.shape != m.shape:
        raise ValueError(f"sc and m need the same shape; got {sc.shape} and {m.shape}")
    return _pack_scales(sc, m)


def unpack_scales_k4(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 scale bytes (..., 12) of a Q4_K/Q5_K super-block -> (scales, minimums) (..., 8)."""
    q = _codes(q, "q", 12, 255).astype(np.uint8)
    sc = np.zeros(q.shape[:-1] + (8,), np.uint8)
    m = np.zeros_like(sc)
    for j in range(4):
        sc[..., j] = q[..., j] & 63
        m[..., j] = q[..., j + 4] & 63
    for j in range(4, 8):
        sc[..., j] = (q[..., j + 4] & 0xF) | ((q[..., j - 4] >> 6) << 4)
        m[..., j] = (q[..., j + 4] >> 4) | ((q[..., j] >> 6) << 4)
    return sc, m


def _codes(v, name: str, last: int, top: int) -> np.ndarray:
    """v as integer codes (..., ``last``) in 0..``top``: integer arrays, or float arrays of
    whole values (converted), NumPy or torch; anything else is refused naming ``name``."""
    if isinstance(v, torch.Tensor):
        v = v.detach().cpu().numpy()
    if isinstance(v, (str, bytes)) or v is None:
        raise ValueError(f"{name} must be an array of whole numbers (..., {last}); got "
                         f"{type(v).__name__}")
    v = np.asarray(v)
    what = (f"{name} must hold {last} whole numbers per super-block (..., {last}) in "
            f"0..{top}; got shape {v.shape} {v.dtype}")
    if v.ndim < 1 or v.shape[-1] != last or v.dtype == bool or v.dtype == object:
        raise ValueError(what)
    if np.issubdtype(v.dtype, np.floating):
        if not (np.isfinite(v).all() and (v == np.round(v)).all()):
            raise ValueError(what + " with values that are not whole numbers (e.g. "
                             f"{v[~(np.isfinite(v) & (v == np.round(v)))].flat[0]!r}): round them "
                             f"first")
        v = v.astype(np.int64)
    elif not np.issubdtype(v.dtype, np.integer):
        raise ValueError(what)
    if v.size and (v.min() < 0 or v.max() > top):
        raise ValueError(f"{name} codes are {top.bit_length()}-bit, 0..{top}; got "
                         f"{v.min()}..{v.max()}")
    return v


def _f16_bytes(h: np.ndarray) -> np.ndarray:
    return h.astype(np.float16).reshape(h.shape + (1,)).view(np.uint8)       # (..., 2)


def _pack_5bit(L: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes 0..31 (B, 32) -> qh (B, 4) (bit j = fifth bit of code j) and qs (B, 16)."""
    L = L.astype(np.uint32)
    qs = ((L[:, :16] & 0xF) | ((L[:, 16:] & 0xF) << 4)).astype(np.uint8)
    hi = (L >> 4) & 1                                                     # (B, 32)
    qh = (hi << np.arange(32, dtype=np.uint32)).sum(1, dtype=np.uint32)  # bits never overlap
    return qh.astype("<u4").reshape(-1, 1).view(np.uint8), qs


# ----------------------------------------------------------------------------- the formats
def _row_weights(w: np.ndarray, qw: np.ndarray, per: int) -> np.ndarray:
    """llama.cpp's importance-weighted error weights for the 32-blocks: qw_j * sqrt(sigma2 +
    x_j^2), sigma2 the row's mean square (a whole-row sum taken element by element)."""
    rows, cols = w.shape
    sigma2 = _sum(w * w) / F32(cols)                                      # (rows,)
    return (qw[None, :] * np.sqrt(sigma2[:, None] + w * w)).reshape(-1, per)


def _q_32(w: np.ndarray, fmt: str, qw, strict: bool = True) -> np.ndarray:
    """Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 rows (rows, cols) -> bytes (rows, cols/32 * size)."""
    rows, cols = w.shape
    x = w.reshape(-1, 32)                                                 # (B, 32)
    B = x.shape[0]
    sym = fmt in ("q4_0", "q5_0", "q8_0")
    half = {"q4_0": 8, "q5_0": 16, "q4_1": 15, "q5_1": 31}.get(fmt)
    if fmt == "q8_0" or qw is None:
        if fmt == "q8_0":
            amax = np.abs(x).max(1)
            d = amax / F32(127)
            with np.errstate(divide="ignore"):
                idd = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
            v = x * idd[:, None]
            q = np.trunc(v.astype(np.float64) + 0.5 * np.sign(v))         # C's roundf
            dh = _fp16(d, fmt)
            _no_lost_blocks(x, dh == 0, fmt, cols, 32, strict)         # Q8_0 ignores qw
            return np.concatenate([_f16_bytes(dh), q.astype(np.int8).view(np.uint8)],
                                  1).reshape(rows, -1)
        if sym:
            mx = x[np.arange(B), np.abs(x).argmax(1)]                    # signed, first largest
            d = mx / F32(-half)
            with np.errstate(divide="ignore"):
                idd = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
            L = np.minimum(F32(2 * half - 1),
                           np.trunc(x * idd[:, None] + F32(half + 0.5)))  # (int8_t)(x+8.5)
            m = None
        else:
            lo, hi = x.min(1), x.max(1)
            d = (hi - lo) / F32(half)
            with np.errstate(divide="ignore"):
                idd = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
            L = np.trunc((x - lo[:, None]) * idd[:, None] + F32(0.5))
            if fmt == "q4_1":
                L = np.minimum(F32(15), L)
            m = lo
    else:
        wt = _row_weights(w, qw, 32)
        if sym:
            d, L = _make_qx_quants(x, half, wt)
            m = None
        else:
            d, neg_min, L = _make_qkx_quants(x, wt, half, -0.9, 0.05, 36, True)
            m = -neg_min
    dh = _fp16(d, fmt)
    parts = [_f16_bytes(dh)]
    if m is not None:
        mh = _fp16(m, fmt)
        parts.append(_f16_bytes(mh))
        _no_lost_blocks(x, (dh == 0) & (mh == 0), fmt, cols, 32, strict, qw)   # d q + m: both 0
    else:
        _no_lost_blocks(x, dh == 0, fmt, cols, 32, strict, qw)
    Lu = L.astype(np.uint8)
    if fmt in ("q4_0", "q4_1"):
        parts.append(Lu[:, :16] | (Lu[:, 16:] << 4))
    else:
        qh, qs = _pack_5bit(Lu & 0x1F)
        parts += [qh, qs]
    return np.concatenate(parts, 1).reshape(rows, -1)


def _superblocks(w: np.ndarray, qw, sub: int):
    """Rows -> x (S, 256/sub, sub) sub-blocks and their error weights: llama.cpp's
    av_x + |x| per sub-block (no imatrix) or qw * sqrt(sigma2 + x^2), sigma2 = 2 * mean x^2
    over the super-block (with one)."""
    x = w.reshape(-1, QK_K // sub, sub)                                   # (S, nsub, sub)
    S = x.shape[0]
    if qw is None:
        xb = x.reshape(-1, sub)
        av = np.sqrt(_sum(xb * xb) / F32(sub))
        wt = av[:, None] + np.abs(xb)
    else:
        flat = x.reshape(S, QK_K)
        sigma2 = (F32(2) * _sum(flat * flat)) / F32(QK_K)
        q = np.tile(qw, w.shape[0]).reshape(S, QK_K)
        wt = (q * np.sqrt(sigma2[:, None] + flat * flat)).reshape(-1, sub)
    return x, wt


def _q_k45(w: np.ndarray, fmt: str, qw, strict: bool = True) -> np.ndarray:
    """Q4_K and Q5_K rows -> bytes."""
    rows = w.shape[0]
    nmax = 15 if fmt == "q4_k" else 31
    x, wt = _superblocks(w, qw, 32)
    S = x.shape[0]
    xb = x.reshape(-1, 32)
    if qw is None:
        rmin, rdelta, nstep = (-1.0, 0.1, 20) if fmt == "q4_k" else (-0.5, 0.1, 15)
        scales, mins, L = _make_qkx_quants(xb, wt, nmax, rmin, rdelta, nstep, False)
        scales, mins = scales.reshape(S, 8), mins.reshape(S, 8)
        max_scale = np.maximum(scales.max(1), F32(0))
        max_min = np.maximum(mins.max(1), F32(0))
        with np.errstate(divide="ignore"):
            inv_s = np.where(max_scale > 0, F32(63) / max_scale, F32(0)).astype(F32)
            inv_m = np.where(max_min > 0, F32(63) / max_min, F32(0)).astype(F32)
        ls = np.minimum(F32(63), _u8(_nearest(inv_s[:, None] * scales))).astype(np.int64)
        lm = np.minimum(F32(63), _u8(_nearest(inv_m[:, None] * mins))).astype(np.int64)
        d, dmin = max_scale / F32(63), max_min / F32(63)
    else:
        scales, mins, L = _make_qkx_quants(xb, wt, nmax, -0.9, 0.05, 36, True)
        sw = _sum(wt).reshape(S, 8)                                       # sum of weights
        d, ls = _make_qp_quants(scales.reshape(S, 8), 63, sw)
        dmin, lm = _make_qp_quants(mins.reshape(S, 8), 63, sw)
        if fmt == "q5_k":
            ls, lm = np.minimum(F32(63), ls), np.minimum(F32(63), lm)
        ls, lm = ls.astype(np.int64), lm.astype(np.int64)
    packed = _pack_scales(ls, lm)                                         # (S, 12)
    dh, mh = _fp16(d, fmt), _fp16(dmin, fmt)
    _no_lost_blocks(x.reshape(S, QK_K), (dh == 0) & (mh == 0), fmt, w.shape[1], QK_K, strict,
                    qw)
    sc, m = unpack_scales_k4(packed)                                      # what the file holds
    dd = dh.astype(F32)[:, None] * sc.astype(F32)                         # (S, 8)
    dm = mh.astype(F32)[:, None] * m.astype(F32)
    L = L.reshape(S, 8, 32)
    with np.errstate(divide="ignore", invalid="ignore"):
        req = np.clip(_nearest((x + dm[..., None]) / dd[..., None]), 0, F32(nmax))
    L = np.where((dd != 0)[..., None], req, L).astype(np.uint8).reshape(S, 4, 2, 32)
    lo, hi = L[:, :, 0], L[:, :, 1]                                       # (S, 4, 32)
    qs = ((lo & 0xF) | ((hi & 0xF) << 4)).reshape(S, 128)
    parts = [_f16_bytes(dh), _f16_bytes(mh), packed]
    if fmt == "q5_k":
        bits = ((lo >> 4) << (2 * np.arange(4, dtype=np.uint8))[None, :, None]) | \
               ((hi >> 4) << (2 * np.arange(4, dtype=np.uint8) + 1)[None, :, None])
        parts.append(np.bitwise_or.reduce(bits, axis=1).astype(np.uint8))  # (S, 32)
    parts.append(qs)
    return np.concatenate(parts, 1).reshape(rows, -1)


def _q_q6k(w: np.ndarray, qw, strict: bool = True) -> np.ndarray:
    """Q6_K rows -> bytes."""
    rows = w.shape[0]
    x = w.reshape(-1, 16, 16)                                             # (S, 16, 16)
    S = x.shape[0]
    q = None if qw is None else np.tile(qw, rows).reshape(-1, 16)
    scales, L = _make_qx_quants(x.reshape(-1, 16), 32, q)
    scales = scales.reshape(S, 16)
    idx = np.abs(scales).argmax(1)
    max_scale = scales[np.arange(S), idx]
    zero = np.abs(max_scale) < EPS
    with np.errstate(divide="ignore"):
        iscale = F32(-128) / np.where(zero, F32(1), max_scale)
    dh = _fp16(F32(1) / iscale, "q6_k")
    _no_lost_blocks(x.reshape(S, QK_K), (dh == 0) | zero, "q6_k", w.shape[1], QK_K, strict,
                    qw)
    sc = np.minimum(F32(127), _nearest(iscale[:, None] * scales))         # int8 -128..127
    dd = dh.astype(F32)[:, None] * sc                                     # (S, 16)
    with np.errstate(divide="ignore", invalid="ignore"):
        req = np.clip(_nearest(x / dd[..., None]), -32, 31) + F32(32)
    L = np.where((dd != 0)[..., None], req, L.reshape(S, 16, 16))
    L = L.astype(np.uint8).reshape(S, 2, 4, 32)                           # (S, half, quarter, 32)
    ql = np.concatenate([L[:, :, 0] & 0xF | ((L[:, :, 2] & 0xF) << 4),
                         L[:, :, 1] & 0xF | ((L[:, :, 3] & 0xF) << 4)], 2)   # (S, 2, 64)
    qh = (L[:, :, 0] >> 4) | ((L[:, :, 1] >> 4) << 2) | ((L[:, :, 2] >> 4) << 4) | \
         ((L[:, :, 3] >> 4) << 6)                                         # (S, 2, 32)
    out = np.concatenate([ql.reshape(S, 128), qh.reshape(S, 64),
                          sc.astype(np.int8).view(np.uint8), _f16_bytes(dh)], 1)
    out[zero] = 0
    return out.reshape(rows, -1)


def quantize(w, fmt: str, imatrix=None, strict_scales: bool = True) -> np.ndarray:
    """Rows of a weight (rows, cols) as llama.cpp stores them in ``fmt``: uint8 (rows,
    :func:`row_bytes`), the same bytes as ``ggml_quantize_chunk`` (lesson 14).

    ``imatrix``: optional importance weights, one per column (llama.cpp's mean squared input
    activation of each column): the scale searches then weight each weight's squared error
    by it. Q8_0 ignores it, as llama.cpp does.

    A block that holds nonzero weights but whose fp16 scale rounds to 0 (weights below about
    1e-7; llama.cpp stores it, and it decodes as all zeros) is refused unless
    ``strict_scales=False``, which gives llama.cpp's bytes for it. A scale that overflows fp16
    (weights beyond about 65504 times the format's largest code) is always refused."""
    fmt = _fmt(fmt)
    if not isinstance(strict_scales, (bool, np.bool_)):
        raise TypeError(f"strict_scales must be True or False; got {strict_scales!r}")
    w = _rows(w, fmt)
    qw = None if imatrix is None else check_imatrix(imatrix, w.shape[1])
    with np.errstate(over="ignore"):        # a scale past fp16 is refused below, not warned
        if fmt == "q6_k":
            return _q_q6k(w, qw, bool(strict_scales))
        if fmt in ("q4_k", "q5_k"):
            return _q_k45(w, fmt, qw, bool(strict_scales))
        return _q_32(w, fmt, qw, bool(strict_scales))


# ----------------------------------------------------------------------------- decoding
def _raw(raw, fmt: str, cols: int) -> np.ndarray:
    if isinstance(raw, torch.Tensor):
        raw = raw.detach().cpu().numpy()
    raw = np.asarray(raw)
    if raw.dtype != np.uint8 or raw.ndim != 2:
        raise ValueError(f"raw must be uint8 bytes (rows, bytes per row); got {raw.shape} "
                         f"{raw.dtype}")
    cols = _whole(cols, "cols")
    if cols % BLOCKS[fmt][0]:
        raise ValueError(f"cols={cols}: " + _misfit(fmt, cols))
    if raw.shape[1] != row_bytes(fmt, cols):
        raise ValueError(f"a {fmt.upper()} row of {cols} weights takes "
                         f"{row_bytes(fmt, cols)} bytes (blocks of {BLOCKS[fmt][0]}); got raw "
                         f"rows of {raw.shape[1]} bytes: pass the cols the rows were quantized "
                         f"with, and whole rows of raw")
    n, size = BLOCKS[fmt]
    return raw.reshape(-1, size)


def _h(b: np.ndarray, at: int) -> np.ndarray:
    return b[:, at:at + 2].copy().view(np.float16)[:, 0].astype(F32)


def dequantize(raw, fmt: str, cols: int) -> np.ndarray:
    """llama.cpp's bytes (rows, row bytes) in ``fmt`` -> float32 weights (rows, cols), computed
    as its ``dequantize_row_*`` do (same operations, same order)."""
    fmt = _fmt(fmt)
    b = _raw(raw, fmt, cols)
    cols = int(cols)
    rows = b.shape[0] * BLOCKS[fmt][0] // cols
    if fmt in ("q4_0", "q4_1", "q8_0", "q5_0", "q5_1"):
        d = _h(b, 0)[:, None]
        if fmt == "q8_0":
            return (b[:, 2:].view(np.int8).astype(F32) * d).reshape(rows, cols)
        at = 4 if fmt in ("q4_1", "q5_1") else 2
        m = _h(b, 2)[:, None] if at == 4 else None
        if fmt.startswith("q5"):
            qh = b[:, at:at + 4].copy().view("<u4")[:, 0].astype(np.uint32)
            hi = ((qh[:, None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8) << 4
            at += 4
        else:
            hi = 0
        qs = b[:, at:at + 16]
        q = (np.concatenate([qs & 0xF, qs >> 4], 1) | hi).astype(F32)      # (B, 32)
        if m is None:
            return ((q - F32(16 if fmt == "q5_0" else 8)) * d).reshape(rows, cols)
        return (q * d + m).reshape(rows, cols)
    if fmt in ("q4_k", "q5_k"):
        d, dmin = _h(b, 0)[:, None], _h(b, 2)[:, None]
        sc, m = unpack_scales_k4(b[:, 4:16])
        d1 = d * sc.astype(F32)                                           # (S, 8)
        m1 = dmin * m.astype(F32)
        qs = b[:, -128:].reshape(-1, 4, 32)
        q = np.stack([qs & 0xF, qs >> 4], 2)                              # (S, 4, 2, 32)
        if fmt == "q5_k":
            qh = b[:, 16:48]                                              # (S, 32)
            sh = np.arange(8, dtype=np.uint8).reshape(4, 2)
            q = q + (((qh[:, None, None, :] >> sh[None, :, :, None]) & 1) << 4)
        q = q.reshape(-1, 8, 32).astype(F32)
        return (d1[..., None] * q - m1[..., None]).reshape(rows, cols)
    # q6_k
    ql, qh = b[:, :128].reshape(-1, 2, 64), b[:, 128:192].reshape(-1, 2, 32)
    sc = b[:, 192:208].view(np.int8).astype(F32).reshape(-1, 16)
    d = _h(b, 208)[:, None]
    q = np.stack([(ql[..., :32] & 0xF) | (((qh >> 0) & 3) << 4),
                  (ql[..., 32:] & 0xF) | (((qh >> 2) & 3) << 4),
                  (ql[..., :32] >> 4) | (((qh >> 4) & 3) << 4),
                  (ql[..., 32:] >> 4) | (((qh >> 6) & 3) << 4)], 2)      # (S, 2, 4, 32)
    q = q.astype(F32).reshape(-1, 16, 16) - F32(32)
    return ((d * sc)[..., None] * q).reshape(rows, cols)
