"""Exercises of lesson 14, "What a Q4_K_M file holds" (solutions/14_k_quants_and_mixes.ipynb)."""
from __future__ import annotations

import numpy as np
import torch

from course_lib import imatrix, kquants, sensitivity
from course_lib.checks import Case, Exercise, register


# ---------------------------------------------------------------- 14.pack_scales

def _codes(seed, lo=0, hi=64):
    rng = np.random.default_rng(seed)
    return rng.integers(lo, hi, 8), rng.integers(lo, hi, 8)


def _pack_cases():
    sc, m = _codes(14)
    big, small = np.full(8, 63), np.zeros(8, np.int64)
    return [
        Case((sc, m), label="random 6-bit scales and minimums"),
        Case(_codes(15, 0, 16), label="every code below 16: no top bits to move",
             hint="With no top bits, only the nibbles of bytes 8-11 matter: which nibble holds "
                  "the scale, which the minimum?"),
        Case(_codes(16, 48, 64), label="every code at least 48: both top bits set",
             hint="Where do the top 2 bits of scale j and minimum j (j >= 4) go: bits 6-7 of "
                  "byte j - 4 for the scale, of byte j for the minimum?"),
        Case((big, small), label="scales all 63, minimums all 0",
             hint="Bytes 0-3 hold the scales of sub-blocks 0-3, bytes 4-7 their minimums: "
                  "are the two the right way round?"),
        Case((small, big), label="scales all 0, minimums all 63",
             hint="Bytes 0-3 hold the scales of sub-blocks 0-3, bytes 4-7 their minimums: "
                  "are the two the right way round?"),
        Case((np.arange(8), np.arange(8)[::-1].copy()), label="0..7 and 7..0"),
        Case((list(range(56, 64)), [1] * 8), label="Python lists of ints"),
        Case((np.full(8, 64), small), label="a scale of 64 needs 7 bits: raise ValueError",
             raises=ValueError),
        Case((small, np.full(8, -1)), label="a negative minimum: raise ValueError",
             raises=ValueError),
        Case((np.arange(7), np.arange(7)), label="7 codes: raise ValueError", raises=ValueError),
        Case((sc, np.arange(7)), label="8 scales but 7 minimums: raise ValueError",
             raises=ValueError, hint="Both sc and m must hold 8 codes: is m's length checked?"),
        Case((np.stack([sc, sc]), np.stack([m, m])), label="two super-blocks at once, shape "
             "(2, 8): raise ValueError (one super-block's 8 codes are asked)", raises=ValueError),
        Case((np.linspace(0, 63, 8), small.astype(np.float32)),
             label="float arrays of whole numbers (0.0, 9.0, ..., 63.0): whole numbers too, "
                   "the same bytes as their ints",
             hint="9.0 is a whole number: the task refuses codes that are not whole, not "
                  "floats as such. Test the values (v == np.round(v)), then convert."),
        Case((np.array([0.0, 9.0, 18.0, 27.5, 36.0, 45.0, 54.0, 63.0]), small),
             label="a code of 27.5, not a whole number: raise ValueError", raises=ValueError),
    ]


def _pack_ref(sc, m):
    """The library's packing of one super-block: 8 whole numbers each (integers, or floats of
    whole value), 0..63."""
    out = []
    for name, v in (("sc", sc), ("m", m)):
        v = np.asarray(v)
        if v.shape != (8,) or v.dtype == bool or not np.issubdtype(v.dtype, np.number) \
                or np.iscomplexobj(v):
            raise ValueError(f"{name} must hold the 8 codes of one super-block, whole numbers; "
                             f"got shape {v.shape} {v.dtype}")
        if np.issubdtype(v.dtype, np.floating):
            if not (np.isfinite(v).all() and (v == np.round(v)).all()):
                raise ValueError(f"{name} must hold whole numbers; got {v.tolist()}")
            v = v.astype(np.int64)
        out.append(v)
    return kquants.pack_scales_k4(*out)


def _pack_mutant(sc, m, swap_top=False, nibbles_swapped=False, no_top=False):
    """The packing with one thing changed (each flag a plausible slip)."""
    _pack_ref(sc, m)                                   # raises where the reference raises
    sc, m = np.asarray(sc).astype(np.uint8), np.asarray(m).astype(np.uint8)
    out = np.zeros(12, np.uint8)
    for j in range(4):
        out[j], out[j + 4] = sc[j], m[j]
    for j in range(4, 8):
        a, b = (m[j], sc[j]) if nibbles_swapped else (sc[j], m[j])
        out[j + 4] = (a & 0xF) | ((b & 0xF) << 4)
        if not no_top:
            ts, tm = (m[j], sc[j]) if swap_top else (sc[j], m[j])
            out[j - 4] |= (ts >> 4) << 6
            out[j] |= (tm >> 4) << 6
    return out


def _pack_integers_only(sc, m):
    """Refuses 9.0: an integer dtype taken for 'whole numbers'."""
    for v in (sc, m):
        if not np.issubdtype(np.asarray(v).dtype, np.integer):
            raise ValueError("sc and m must be integers")
    return _pack_ref(sc, m)


def _pack_plain(sc, m):
    """Scales then minimums, one byte each, cut to 12: no packing at all."""
    _pack_ref(sc, m)
    return np.concatenate([np.asarray(sc), np.asarray(m)]).astype(np.uint8)[:12]


register(Exercise(
    id="14.pack_scales",
    title="a Q4_K super-block's 6-bit scales, byte for byte",
    reference=_pack_ref,
    cases=_pack_cases,
    hint=["Twelve bytes hold sixteen 6-bit numbers (8 scales, 8 minimums). Which sub-blocks "
          "fit whole into a byte, and where do the other four keep their top two bits?",
          "Sub-blocks 0-3: byte j = scale j, byte j + 4 = minimum j (both < 64, so bits 6-7 "
          "stay free). Sub-blocks 4-7: byte j + 4 = low 4 bits of scale j | low 4 bits of "
          "minimum j << 4.",
          "The top 2 bits of scale j (j >= 4), `sc[j] >> 4`, go into bits 6-7 of byte j - 4; "
          "those of minimum j into bits 6-7 of byte j. Refuse anything but 8 whole numbers "
          "0..63 each (integers, or floats of whole value: convert them) with ValueError; "
          "return np.uint8 (12,)."],
    wrong=[lambda sc, m: _pack_mutant(sc, m, swap_top=True),
           lambda sc, m: _pack_mutant(sc, m, nibbles_swapped=True),
           lambda sc, m: _pack_mutant(sc, m, no_top=True),
           _pack_plain, _pack_integers_only],
))


# ---------------------------------------------------------------- 14.importance

def _imp_cases():
    g = torch.Generator().manual_seed(14)
    x = torch.randn(3, 50, 16, generator=g)
    x[..., 5] *= 20                                     # an outlier column
    signs = torch.randn(40, 8, generator=g)
    huge = torch.full((64, 3), 1.5e19)
    huge[::2] = 0.5e19                                  # squares fit float32, their sum does not
    loud = torch.randn(30, 5, generator=g) * 40
    loud[:, 2] = 300.0                                  # 300^2 = 90,000 > float16's 65,504
    with_inf = torch.randn(6, 4, generator=g)
    with_inf[2, 1] = float("inf")
    dtype_hint = ("In which dtype were the inputs squared and averaged? The task says float64: "
                  "convert x first (x.double()), then square; converting the mean is too late.")
    return [
        Case((x,), label="3 windows x 50 tokens x 16 columns, one outlier column"),
        Case((torch.randn(200, 12, generator=g),), label="a 2-D capture (tokens, in)"),
        Case((signs - signs.mean(0),), label="centred columns: the mean square, not the "
                                             "variance or the mean",
             hint="Is it the mean of x squared, or the spread of x around its mean?"),
        Case((torch.randn(2, 3, 10, 6, generator=g),), label="four dimensions (2, 3, 10, 6): "
             "every leading dimension is tokens too",
             hint="How many leading dimensions can x have? Flatten all but the last."),
        Case((torch.randn(4, 10, generator=g).double(),), label="float64 in: float32 out",
             hint="What dtype does the task ask for the result, whatever x's dtype?"),
        Case((loud.half(),), label="float16 activations up to 300: their squares overflow "
             "float16 (compute in float64)", hint=dtype_hint),
        Case(((torch.randn(40, 6, generator=g) * 3).bfloat16(),),
             label="bfloat16 activations: squared in float64, not in bfloat16", hint=dtype_hint),
        Case((huge,), label="activations near 1e19: the sum of squares passes float32's range "
             "(compute in float64)", hint=dtype_hint),
        Case((torch.zeros(5, 7),), label="all zero"),
        Case((torch.randn(8, generator=g),), label="1-D: raise ValueError", raises=ValueError),
        Case((torch.ones(4, 3, dtype=torch.int32),), label="integers: raise ValueError",
             raises=ValueError),
        Case((torch.full((4, 3), float("nan")),), label="NaN: raise ValueError",
             raises=ValueError),
        Case((with_inf,), label="an inf: raise ValueError (NaN/inf are refused)",
             raises=ValueError, hint="The task refuses NaN and inf: torch.isnan alone lets "
                                     "inf through; torch.isfinite catches both."),
    ]


def _imp_guard(x):
    return imatrix.from_inputs(x)                       # raises where the reference raises


register(Exercise(
    id="14.importance",
    title="the importance vector from captured activations",
    reference=imatrix.from_inputs,
    cases=_imp_cases,
    rtol=1e-5, atol=1e-7,
    hint=["What does llama.cpp weight each column's rounding error by: the inputs' size on "
          "average, but which average, and over which axis?",
          "Flatten every dimension but the last (tokens from every window together), then take "
          "the mean of x squared over the tokens: one number per input column.",
          "`x.reshape(-1, x.shape[-1]).double().pow(2).mean(0).float()`; refuse fewer than 2 "
          "dimensions, non-float input and NaN/inf with ValueError."],
    wrong=[lambda x: (_imp_guard(x), x.reshape(-1, x.shape[-1]).abs().mean(0).float())[1],
           lambda x: (_imp_guard(x), x.reshape(-1, x.shape[-1]).double().pow(2).sum(0)
                      .float())[1],
           lambda x: (_imp_guard(x), x.reshape(-1, x.shape[-1]).double().pow(2).mean(0)
                      .sqrt().float())[1],
           lambda x: (_imp_guard(x), x.reshape(-1, x.shape[-1]).double().var(0, correction=0)
                      .float())[1],
           lambda x: (_imp_guard(x), x.reshape(-1, x.shape[-1]).pow(2).mean(0))[1]
           .double()],
))


# ---------------------------------------------------------------- 14.allocate

def _toy(n=4, seed=0):
    rng = np.random.default_rng(seed)
    costs, sizes = {}, {}
    for i in range(n):
        base = float(rng.random() * 0.01 + 0.001)
        costs[f"t{i}"] = {"q4_0": base, "q5_0": base / 4, "q8_0": base / 200}
        rows = int(rng.integers(1, 5)) * 10
        sizes[f"t{i}"] = {"q4_0": rows * 18, "q5_0": rows * 22, "q8_0": rows * 34}
    return costs, sizes


def _alloc_cases():
    costs, sizes = _toy()
    small = sensitivity.smallest(sizes)
    big = sum(max(s.values()) for s in sizes.values())
    c2, s2 = _toy(6, seed=3)
    lopsided = {"a": {"q4_0": 1.0, "q8_0": 0.0}, "b": {"q4_0": 0.001, "q8_0": 0.0}}
    lop_sizes = {"a": {"q4_0": 100, "q8_0": 300}, "b": {"q4_0": 10, "q8_0": 11}}
    per_byte = {"a": {"q4_0": 1.0, "q8_0": 0.0}, "b": {"q4_0": 0.6, "q8_0": 0.0}}
    pb_sizes = {"a": {"q4_0": 100, "q8_0": 200}, "b": {"q4_0": 100, "q8_0": 120}}
    tie_order = ("On a tie in KL saved per byte, which move wins? The task: the tensor that "
                 "comes first in sizes, then the format that comes first in sizes[t] (not the "
                 "order of costs, not the last one seen: a strict > keeps the first).")
    return [
        Case((costs, sizes, small), label="a budget of exactly the smallest allocation"),
        Case((costs, sizes, (small + big) // 2), label="half-way between smallest and largest"),
        Case((costs, sizes, big), label="room for everything at its largest format",
             hint="A move whose extra bytes fill the budget exactly still fits: <=, not <."),
        Case((c2, s2, sensitivity.smallest(s2) + 150), label="six tensors, a little room"),
        Case((lopsided, lop_sizes, 311), label="the biggest saving does not fit: take the "
                                               "one that does",
             hint="Among the moves that still fit, which is best? One that does not fit is "
                  "skipped, and the search goes on."),
        Case((per_byte, pb_sizes, 230), label="saving per byte, not saving: b first"),
        Case(({"b": {"q8_0": 0.0, "q4_0": 1.0}, "a": {"q4_0": 1.0, "q8_0": 0.0}},
              {"a": {"q4_0": 100, "q8_0": 200}, "b": {"q4_0": 100, "q8_0": 200}}, 300),
             label="a and b tie, room for one: a, first in sizes (costs lists b first)",
             hint=tie_order),
        Case(({"t": {"q5_1": 0.5, "q5_0": 0.5, "q4_0": 1.0}},
              {"t": {"q4_0": 100, "q5_0": 150, "q5_1": 150}}, 150),
             label="q5_0 and q5_1 tie (same bytes, same KL): q5_0, first in sizes['t']",
             hint=tie_order),
        Case(({"t": {"q4_0": 0.5, "iq4_nl": 0.2, "q8_0": 0.0}},
              {"t": {"q4_0": 180, "iq4_nl": 180, "q8_0": 340}}, 200),
             label="two smallest formats of the same bytes: start at the lower cost (iq4_nl)",
             hint="Where does each tensor start when two formats share the smallest size? "
                  "The task: the lower cost of the two."),
        Case(({"t": {"q4_0": 1.0, "q5_0": 0.9, "q8_0": 0.0}, "u": {"q4_0": 0.25, "q8_0": 0.0}},
              {"t": {"q4_0": 100, "q5_0": 150, "q8_0": 200}, "u": {"q4_0": 100, "q8_0": 150}},
              300),
             label="q4_0 -> q8_0 in one move beats two small moves: every larger format is a "
                   "move, not only the next one",
             hint="Which moves does each round consider: the next larger format only, or "
                  "every larger one?"),
        Case(({"t": {"q4_0": 0.3, "q8_0": 0.3}}, {"t": {"q4_0": 100, "q8_0": 200}}, 250),
             label="a larger format that saves nothing is not a move",
             hint="A move must lower the cost: what does a move that saves 0 KL buy?"),
        Case(({"a": {"q4_0": 1.0, "q8_0": 0.0}, "b": {"q4_0": 0.09, "q8_0": 0.0}},
              {"a": {"q4_0": 1000, "q8_0": 1100}, "b": {"q4_0": 10, "q8_0": 20}}, 1110),
             label="per byte ADDED: a saves 0.01 per added byte, b 0.009",
             hint="Per byte of what: the bytes the move adds, or the format's whole size?"),
        Case((costs, sizes, small - 1), label="a budget below the smallest: raise ValueError",
             raises=ValueError),
        Case((costs, sizes, 0), label="a budget of 0: raise ValueError", raises=ValueError),
    ]


def _alloc_by_gain(costs, sizes, budget):
    """Greedy on KL saved, ignoring how many bytes it costs."""
    pick = sensitivity.allocate(costs, sizes, budget)         # raises where it should
    pick = {t: min(s, key=lambda f: (s[f], costs[t][f])) for t, s in sizes.items()}
    total = sum(sizes[t][f] for t, f in pick.items())
    while True:
        opts = [(costs[t][pick[t]] - costs[t][f], t, f) for t in pick for f in sizes[t]
                if sizes[t][f] > sizes[t][pick[t]] and costs[t][f] < costs[t][pick[t]]
                and total + sizes[t][f] - sizes[t][pick[t]] <= budget]
        if not opts:
            return pick
        _, t, f = max(opts)
        total += sizes[t][f] - sizes[t][pick[t]]
        pick[t] = f


def _alloc_stop_early(costs, sizes, budget):
    """Per byte, but stops at the first upgrade that does not fit."""
    pick = sensitivity.allocate(costs, sizes, budget)
    pick = {t: min(s, key=lambda f: (s[f], costs[t][f])) for t, s in sizes.items()}
    total = sum(sizes[t][f] for t, f in pick.items())
    while True:
        opts = [((costs[t][pick[t]] - costs[t][f]) / (sizes[t][f] - sizes[t][pick[t]]), t, f)
                for t in pick for f in sizes[t]
                if sizes[t][f] > sizes[t][pick[t]] and costs[t][f] < costs[t][pick[t]]]
        if not opts:
            return pick
        _, t, f = max(opts)
        if total + sizes[t][f] - sizes[t][pick[t]] > budget:
            return pick
        total += sizes[t][f] - sizes[t][pick[t]]
        pick[t] = f


def _alloc_all_small(costs, sizes, budget):
    sensitivity.allocate(costs, sizes, budget)
    return {t: min(s, key=s.get) for t, s in sizes.items()}


register(Exercise(
    id="14.allocate",
    title="bits allocated under a byte budget",
    reference=sensitivity.allocate,
    cases=_alloc_cases,
    hint=["Start as small as possible. Then, of all the upgrades that still fit, which one "
          "is the best deal: the one that saves the most KL, or the most KL per byte?",
          "Every tensor starts at its smallest format (on a tie in bytes, the lower cost). "
          "Repeat: among (tensor, larger format) with a lower cost whose extra bytes still "
          "fit, take the largest (cost now - cost then) / (extra bytes); stop when none fits. "
          "Loop over sizes, then sizes[t], and keep a move only if strictly better: ties go "
          "to the first.",
          "Refuse a budget <= 0, and a budget below the smallest allocation (ValueError, "
          "saying the smallest possible size). Return {tensor: format}."],
    wrong=[_alloc_by_gain, _alloc_stop_early, _alloc_all_small],
))
