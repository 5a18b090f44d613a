"""Live numbers against committed ones, with bands that hold on any CPU.

Lessons 04-12 recompute a slice of a committed table (``results/*.json``) and check that the
learner's machine gets the same answer. "The same" cannot mean the same fourth digit: a number
downstream of a rounding decision (GPTQ's error feedback, an AWQ grid search, INT8 or FP8 codes
of activations, a quantized KV cache) follows the order in which the CPU's kernels add things
up (torch's vectorized code, the BLAS), and that order changes with the CPU, its vector width,
the library build and the thread count (docs/cpu_dispatch.md: which of these moved what).

Each quantity a lesson compares has a ``Band`` here:
- ``smooth``: a sum or a mean over fixed weights (a full-precision perplexity, RTN's KL: each
  weight is rounded on its own, so only the last bits of the sums move). A small band.
- ``chaotic``: downstream of a rounding decision. Its band is at least 3x the largest deviation
  measured by ``tools/cpu_spread.py`` (``results/cpu_spread.json``: this course's machines, each
  also told to dispatch like an older CPU and to run on one thread), and the lesson asserts its
  claim (an ordering, a ratio) on the live numbers besides.

``tests/test_spread.py`` holds every band to that rule and to the file. docs/cpu_dispatch.md
tells instructors what moved and by how much. Used in lessons 04-08 and 11-14 (the
cells that compare live numbers with committed ones or with a constant).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache

from course_lib.paths import ROOT

SPREAD_FILE = ROOT / "results" / "cpu_spread.json"
MARGIN = 3.0        # a band is at least this many times the largest deviation measured


@dataclass(frozen=True)
class Band:
    """How far a live number may sit from the committed one: ``rel`` of it, plus ``abs_``."""
    rel: float
    kind: str            # "smooth" or "chaotic"
    why: str
    abs_: float = 0.0


_RTN = "each weight is rounded on its own: only the last bits of the sums move"
_FWD = "a full-precision forward: the kernels' summation order moves the last bits"
_GPTQ = "GPTQ's error feedback: one flipped rounding changes every later column's target"
_AWQ = "AWQ picks each block's scale by a grid search: a near-tie can go the other way"
_W8A8 = "activations rounded to 8 bits: a value on a rounding edge flips with the kernels"
_KV = "keys and values rounded to 8 bits or less: codes on a rounding edge flip"
_K = "llama.cpp's rounding of one tensor, bit-exact anywhere: only the fp32 forward's sums move"

# name (as tools/cpu_spread.py records it) -> band. The chaotic bands: 3x or more the largest
# deviation in results/cpu_spread.json, the figure in each comment (tests/test_spread.py).
BANDS: dict[str, Band] = {
    # lesson 04: SmolLM2's first evaluation window, fp32 and RTN weights
    "04 SmolLM2 reference perplexity": Band(1e-3, "smooth", _FWD),
    "04 SmolLM2 W4 g32 perplexity": Band(1e-3, "smooth", _RTN),
    "04 SmolLM2 W4 g32 kl_nats": Band(1e-3, "smooth", _RTN),
    "04 SmolLM2 W3 g32 perplexity": Band(1e-3, "smooth", _RTN),
    "04 SmolLM2 W3 g32 kl_nats": Band(1e-3, "smooth", _RTN),
    # lesson 05: activation columns reaching LLM.int8()'s threshold, a count
    "05 bundled columns >= 6.0, all layers": Band(0.0, "smooth", "a count of |x| >= 6.0 in a "
                                                  "full-precision forward: exact unless a value "
                                                  "sits within a few ulps of 6.0"),
    # lesson 06: GPTQ on the bundled model (INT3 g128) and on SmolLM2 blocks 0-1 (INT3 g32)
    "06 bundled rtn KL": Band(0.01, "smooth", _RTN),
    "06 bundled gptq KL": Band(0.30, "chaotic", _GPTQ),                 # measured 5.6%
    "06 bundled gptq+act KL": Band(0.30, "chaotic", _GPTQ),             # measured 9.4%
    "06 SmolLM2 rtn KL": Band(0.01, "smooth", _RTN),
    "06 SmolLM2 gptq KL": Band(0.40, "chaotic", _GPTQ),                 # measured 10.2%
    "06 SmolLM2 gptq+act KL": Band(0.50, "chaotic", _GPTQ),             # measured 14.9%
    # lesson 07: AWQ, the same slices
    "07 bundled rtn KL": Band(0.01, "smooth", _RTN),
    "07 bundled awq KL": Band(0.05, "chaotic", _AWQ),                   # measured 0.3%
    "07 SmolLM2 rtn KL": Band(0.01, "smooth", _RTN),
    "07 SmolLM2 awq KL": Band(0.05, "chaotic", _AWQ),   # measured 0.001% (first split: 0.4%)
    # lesson 08: W8A8 on the bundled model
    "08 bundled reference bits per byte": Band(1e-6, "smooth", _FWD),
    "08 W8A8 INT8 static per-tensor KL": Band(0.02, "chaotic", _W8A8),  # measured 0.1%
    "08 W8A8 INT8 static per-tensor + SmoothQuant 0.8, down_proj and o_proj too KL":
        Band(0.02, "chaotic", _W8A8),                                   # measured 0.5%
    # lesson 11: SmolLM2's KV cache quantized, 320 tokens
    "11 int8 ppl": Band(0.02, "chaotic", _KV),                          # measured 0.14%
    "11 int8 kl": Band(0.5, "chaotic", _KV, 2e-5),                      # measured 4.5%
    "11 fp8_tensor ppl": Band(0.03, "chaotic", _KV),                    # measured 0.99%
    "11 fp8_tensor kl": Band(0.6, "chaotic", _KV, 2e-5),                # measured 3.6%
    "11 kivi2 ppl": Band(0.03, "chaotic", _KV),                         # measured 0.86%
    "11 kivi2 kl": Band(0.12, "chaotic", _KV, 2e-5),                    # measured 3.4%
    # lesson 12: the W4 g32 slice (SmolLM2), or the bundled W3 g128 RTN row without it
    "12 SmolLM2 W4 g32 perplexity": Band(1e-3, "smooth", _RTN),
    "12 SmolLM2 W4 g32 KL": Band(1e-3, "smooth", _RTN),
    "12 bundled W3 g128 RTN KL": Band(1e-2, "smooth", _RTN),
    # lesson 14: the sensitivity scan's slice (one tensor at llama.cpp's 4.5-bit rounding,
    # bit-exact on any CPU) and the course mix in the engine (its file is exact; the course's
    # fp32 reference it is scored against moves)
    "14 SmolLM2 blk.29.ffn_down KL": Band(1e-2, "smooth", _K),
    "14 SmolLM2 blk.29.attn_v KL": Band(1e-2, "smooth", _K),
    "14 SmolLM2 blk.28.ffn_up KL": Band(1e-2, "smooth", _K),
    "14 engine course mix KL": Band(1e-2, "smooth", _FWD),
}


# Live numbers a lesson compares with a constant, {name: (operator, bound)}: the margin to the
# bound must be at least MARGIN times the spread measured between settings (tests/test_spread.py).
BOUNDS: dict[str, tuple[str, float]] = {
    "04 bundled W8 per-channel top-1": (">", 0.99),
    "04 bundled |W4 g128 - W4 per-channel| top-1": ("<", 0.002),
    "04 bundled INT3 task drop / standard error": ("<", 2.0),
    "05 solution KL, decomposition / INT8 everywhere": ("<", 1.0),
    "06 solution |your GPTQ - library| / library KL": ("<", 0.25),
    "06 solution your GPTQ / round-to-nearest KL": ("<", 1.0),
    "13 engine F16 |perplexity / course reference - 1|": ("<", 0.01),
    "13 engine KL, Q4_0 GPTQ / Q4_0 RTN": ("<", 1.0),
}


@lru_cache(maxsize=1)
def measured() -> dict:
    """``results/cpu_spread.json``'s runs ({} when the file is missing)."""
    return json.loads(SPREAD_FILE.read_text())["runs"] if SPREAD_FILE.exists() else {}


class UnknownQuantity(KeyError, ValueError):
    """A name that neither :data:`BANDS` nor :data:`BOUNDS` holds (a KeyError for the callers
    that look it up, a ValueError as the course's bad-input errors are)."""

    def __str__(self) -> str:                   # KeyError's own str() would quote the message
        return str(self.args[0]) if self.args else ""


def _known(name, table: dict, what: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"name must be the quantity's name (str), a key of "
                        f"course_lib.spread.{what}; got {type(name).__name__}")
    if name not in table:
        close = [k for k in table if k.split()[0] == name.split()[0]][:3] if name.split() else []
        hint = f"; names of that lesson: {', '.join(map(repr, close))}" if close else ""
        raise UnknownQuantity(f"no band for {name!r} (name): add one to "
                              f"course_lib.spread.{what} and measure it with "
                              f"`python tools/cpu_spread.py`{hint}")
    return name


def _real(v, name: str) -> float:
    """A real number (int, float, NumPy scalar, or a one-element tensor or array) as float;
    strings, bools and arrays of several values are refused naming the argument."""
    if isinstance(v, (bool, str, bytes)) or v is None:
        raise TypeError(f"{name} must be a number; got {type(v).__name__} {v!r:.40}")
    size = getattr(v, "numel", None)
    n = size() if callable(size) else getattr(v, "size", 1)
    if n != 1 or not hasattr(v, "__float__"):
        raise TypeError(f"{name} must be one number; got {type(v).__name__} with {n} values"
                        if n != 1 else f"{name} must be a number; got {type(v).__name__}")
    return float(v)


def largest_deviation(name: str) -> float | None:
    """The largest relative deviation from the committed value measured for ``name``, over
    every machine and setting in results/cpu_spread.json (None if it was never measured).
    A name in neither :data:`BANDS` nor :data:`BOUNDS` is refused (a typo would read as
    "never measured")."""
    _known(name, {**BANDS, **BOUNDS}, "BANDS")
    devs = [run["quantities"][name].get("max_dev_from_committed_rel", 0.0)
            for run in measured().values() if name in run["quantities"]]
    return max(devs) if devs else None


def check(name: str, live: float, committed: float) -> float:
    """Assert that ``live`` lies within ``name``'s band around ``committed``; return the relative
    deviation. The message says how far it is, what was measured, and what to do."""
    _known(name, BANDS, "BANDS")
    live, committed = _real(live, "live"), _real(committed, "committed")
    if not (math.isfinite(live) and math.isfinite(committed)):
        raise AssertionError(f"{name}: live {live} or committed {committed} is not finite: the "
                             "computation broke (NaN or inf), not the rounding")
    band = BANDS[name]
    dev = abs(live - committed) / abs(committed) if committed else abs(live)
    if abs(live - committed) > band.rel * abs(committed) + band.abs_:
        seen = largest_deviation(name)
        seen_txt = (f"the largest deviation measured across CPU dispatches is {seen:.2%} "
                    "(results/cpu_spread.json)" if seen is not None else "never measured")
        raise AssertionError(
            f"{name}: live {live:.6g} is {dev:.2%} from the committed {committed:.6g}; the band is "
            f"{band.rel:.2%} ({band.kind}: {band.why}); {seen_txt}. Far outside it, something "
            "changed beyond rounding (the model file, the code, a package version): rerun the "
            "notebook from a fresh kernel; if it persists, run `python tools/cpu_spread.py` on "
            "this machine and report the table.")
    return dev


def describe(name: str, dev: float) -> str:
    """One line for a lesson to print after ``check``: how far, the band, what was measured."""
    _known(name, BANDS, "BANDS")
    dev = _real(dev, "dev")
    if not math.isfinite(dev) or dev < 0:
        raise ValueError(f"dev must be the relative deviation check returned, a finite number "
                         f">= 0; got {dev!r}")
    seen = largest_deviation(name)
    seen_txt = "never measured" if seen is None else f"{seen:.1%}"
    return (f"{dev:.1%} from the committed value; band {BANDS[name].rel:.0%} "
            f"(largest deviation measured across CPU dispatches: {seen_txt})")
