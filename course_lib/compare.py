"""One comparison helper, used everywhere: exact / allclose / max abs diff / SQNR.

Taught in lesson 02 (error metrics) and used by every checker and kernel test.
Works on numbers, numpy arrays and torch tensors. ``agree`` shows a computed figure beside
its source's and asserts that they agree (every lesson, from lesson 00).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def to_numpy(x) -> np.ndarray:
    """Turn a number, list, numpy array or torch tensor into a float64 numpy array."""
    if hasattr(x, "detach"):  # torch tensor (any dtype, any device)
        import torch

        x = x.detach().to("cpu")
        if x.dtype not in (torch.float64, torch.float32, torch.int64, torch.int32, torch.bool):
            x = x.to(torch.float32)
        x = x.numpy()
    return np.asarray(x, dtype=np.float64)


def sqnr_db(reference, approx) -> float:
    """Signal-to-quantization-noise ratio in dB: 10 log10(sum ref^2 / sum (ref - approx)^2).

    Infinite when the two agree exactly (lesson 02).
    """
    ref, app = to_numpy(reference), to_numpy(approx)
    if ref.shape != app.shape:  # numpy would broadcast (8,) against (8, 1) silently
        raise ValueError(f"sqnr_db: reference has shape {ref.shape} but approx has shape "
                         f"{app.shape}; compare a tensor with its own dequantized copy")
    if ref.size == 0:
        raise ValueError("sqnr_db: the arrays are empty; there is no signal or noise to measure")
    if not (np.isfinite(ref).all() and np.isfinite(app).all()):
        raise ValueError("sqnr_db: NaN or inf in the input; an SQNR of such values means "
                         "nothing: find where they come from first")
    noise = float(np.sum((ref - app) ** 2))
    signal = float(np.sum(ref ** 2))
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


@dataclass
class Comparison:
    """Result of ``cmp``: truthy when the two agree within tolerance."""
    name: str
    exact: bool
    close: bool
    max_abs_diff: float
    sqnr_db: float
    problem: str | None = None

    def __bool__(self) -> bool:
        return self.close and self.problem is None

    def __str__(self) -> str:
        if self.problem:
            return f"{self.name}: {self.problem}"
        verdict = "exact" if self.exact else ("allclose" if self.close else "DIFFERENT")
        return (f"{self.name}: {verdict}, max abs diff {self.max_abs_diff:.3g}, "
                f"SQNR {self.sqnr_db:.1f} dB")


def _kind(x) -> str:
    if hasattr(x, "detach"):
        return "torch.Tensor"
    if isinstance(x, np.ndarray):
        return "numpy.ndarray"
    if isinstance(x, (bool, np.bool_)):
        return "bool"
    if isinstance(x, (int, float, np.integer, np.floating)):
        return "number"
    return type(x).__name__


def cmp(name: str, expected, actual, rtol: float = 1e-5, atol: float = 1e-8,
        check_dtype: bool = True, verbose: bool = False, signed_zero: bool = False) -> Comparison:
    """Compare ``actual`` with ``expected``: kind, shape, dtype, NaN, then closeness.

    ``signed_zero=True`` also tells -0.0 from +0.0 (for formats that store both).

    Returns a ``Comparison`` whose ``problem`` says in words what is wrong (wrong kind of
    object, wrong shape, wrong dtype, NaN where there should be none, or too far off).
    """
    if not (rtol >= 0 and atol >= 0):
        raise ValueError(f"cmp: tolerances must be >= 0, got rtol={rtol}, atol={atol}")
    ek, ak = _kind(expected), _kind(actual)
    if ek in ("torch.Tensor", "numpy.ndarray") and ak != ek:
        return Comparison(name, False, False, math.inf, -math.inf,
                          f"expected a {ek}, got {ak} ({type(actual).__name__})")
    if ek == "number" and ak not in ("number", "bool"):
        if not (ak in ("torch.Tensor", "numpy.ndarray") and to_numpy(actual).size == 1):
            return Comparison(name, False, False, math.inf, -math.inf,
                              f"expected a number, got {type(actual).__name__}")
    try:
        e, a = to_numpy(expected), to_numpy(actual)
    except (TypeError, ValueError) as err:
        return Comparison(name, False, False, math.inf, -math.inf,
                          f"could not read the answer as numbers ({err})")
    if ek in ("torch.Tensor", "numpy.ndarray") and e.shape != a.shape:
        return Comparison(name, False, False, math.inf, -math.inf,
                          f"expected shape {tuple(e.shape)}, got shape {tuple(a.shape)}")
    if check_dtype and ek == ak and ek in ("torch.Tensor", "numpy.ndarray"):
        if str(expected.dtype) != str(actual.dtype):
            return Comparison(name, False, False, math.inf, -math.inf,
                              f"expected dtype {expected.dtype}, got dtype {actual.dtype}")
    e, a = e.reshape(-1), a.reshape(-1)
    if e.size != a.size:
        return Comparison(name, False, False, math.inf, -math.inf,
                          f"expected {e.size} values, got {a.size}")
    bad_nan = np.isnan(a) & ~np.isnan(e)
    if bad_nan.any():
        return Comparison(name, False, False, math.inf, -math.inf,
                          f"got NaN at {int(bad_nan.sum())} of {a.size} positions "
                          f"(first at flat index {int(np.argmax(bad_nan))})")
    missing_nan = np.isnan(e) & ~np.isnan(a)
    if missing_nan.any():  # NaN is the right answer here (e.g. E4M3's 0x7F): say so
        idx = int(np.argmax(missing_nan))
        return Comparison(name, False, False, math.inf, -math.inf,
                          f"expected NaN at {int(missing_nan.sum())} of {a.size} positions "
                          f"(first at flat index {idx}), got {a[idx]:.6g} there")
    if signed_zero:
        wrong_sign = (e == 0) & (a == 0) & (np.signbit(e) != np.signbit(a))
        if wrong_sign.any():
            idx = int(np.argmax(wrong_sign))
            return Comparison(name, False, False, 0.0, -math.inf,
                              f"the sign of zero differs at flat index {idx}: expected "
                              f"{e[idx]!r}, got {a[idx]!r} (this format stores -0.0 and +0.0 "
                              f"as different bit patterns)")
    same = (e == a) | (np.isnan(e) & np.isnan(a))  # equal infinities count as the same
    exact = bool(same.all())
    finite = np.isfinite(e) & np.isfinite(a)
    with np.errstate(invalid="ignore"):  # inf - inf is NaN; those positions are in `same`
        diff = np.abs(e - a)
    ok = same | (finite & (diff <= atol + rtol * np.abs(e)))
    max_diff = float(diff[finite].max()) if finite.any() else 0.0
    close = bool(ok.all())
    sq = sqnr_db(e[finite], a[finite]) if finite.any() else (math.inf if exact else -math.inf)
    result = Comparison(name, exact, close, max_diff, sq)
    if not close:
        idx = int(np.argmax(~ok))
        result.problem = (f"values differ: max abs diff {max_diff:.4g}; first mismatch at flat "
                          f"index {idx}: expected {e[idx]:.6g}, got {a[idx]:.6g}")
    if verbose:
        print(result)
    return result


def agree(computed, source, what: str, rel: float = 0.01, abs_tol: float = 0.0,
          unit: str = "", digits: int = 4) -> float:
    """Show a figure the course computed beside the figure its source gives, and assert that
    they agree within ``rel`` (relative) or ``abs_tol`` (absolute). Every lesson uses it in
    place of a bare ``assert`` so a learner sees both numbers (first in lesson 00):

    >>> agree(141.2, 141, "70B in BF16", unit="GB")      # prints "70B in BF16: 141.2 GB, source 141"

    Returns ``computed``; raises AssertionError, with both numbers, when they disagree.
    """
    for name, v in (("computed", computed), ("source", source)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise ValueError(f"agree: {name} must be a number, got {v!r}")
        if not math.isfinite(v):
            raise ValueError(f"agree: {name} must be finite, got {v}")
    if not (rel >= 0 and abs_tol >= 0):
        raise ValueError(f"agree: tolerances must be >= 0, got rel={rel}, abs_tol={abs_tol}")
    c, s = float(computed), float(source)
    suffix = f" {unit}" if unit else ""
    line = f"{what}: {c:.{digits}g}{suffix}, source {s:g}"
    ok = abs(c - s) <= max(abs_tol, rel * abs(s))
    if not ok:
        raise AssertionError(f"{line}: they differ by {abs(c - s):.3g}, more than "
                             f"rel {rel:g} / abs {abs_tol:g} allows")
    print(line)
    return computed
