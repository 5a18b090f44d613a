"""Exercises of lesson 13, "Ship it" (solutions/13_ship_it.ipynb)."""
from __future__ import annotations

import math

import numpy as np
import torch

from course_lib import engine
from course_lib.checks import Case, Exercise, register
from course_lib.gguf_model import pack_q4_0_block


# ---------------------------------------------------------------- 13.pack_q4_0

def _blk(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def _pack_cases():
    g = torch.Generator().manual_seed(13)
    tie_pos = torch.zeros(32)
    tie_pos[3], tie_pos[20] = 2.0, -2.0                      # |max| tie: +2 comes first
    tie_neg = torch.zeros(32)
    tie_neg[3], tie_neg[20] = -2.0, 2.0                      # ... and here -2 comes first
    halves = torch.arange(32, dtype=torch.float32) / 4 - 4   # x/d + 8.5 lands on whole numbers
    halves[0] = -8.0
    return [
        Case((torch.randn(32, generator=g),), label="a random block"),
        Case((torch.randn(32, generator=g) * 0.02,), label="small weights, as in a real layer"),
        Case((tie_pos,), label="+2 and -2: the first of the largest magnitudes sets the sign",
             hint=_TIE),
        Case((tie_neg,), label="-2 first: d changes sign", hint=_TIE),
        Case((torch.zeros(32),), label="all zeros: d = 0, every code 8",
             hint="What is 1 / d when d is 0? The task takes the reciprocal as 0 then, so "
                  "every code is trunc(0 + 8.5) = 8."),
        Case((halves,), label="values on the rounding boundaries",
             hint="Which way does C's cast of a float to an integer round? trunc(x / d + 8.5), "
                  "not round(x / d) + 8."),
        Case((_blk([0.1 * i for i in range(32)]),), label="the largest weight is the last one"),
        Case((torch.full((32,), -3.0),), label="a constant block",
             hint="Every weight is the largest here: x / d = 8 for all of them. What is "
                  "trunc(16.5), and which code is the largest a nibble holds?"),
        Case((torch.randn(32, generator=g).double(),), label="float64 input: same bytes",
             hint="The task computes in float32 whatever the input's dtype: convert first."),
        Case((_randn(13).half(),), label="float16 input: computed in float32, not float16",
             hint="In which dtype did x times the reciprocal happen? The task says float32."),
        Case((_randn(1).bfloat16(),), label="bfloat16 input: computed in float32",
             hint="In which dtype did x times the reciprocal happen? The task says float32."),
        Case((_on_boundaries(0),), label="codes exactly on their boundaries with a d whose "
             "reciprocal is inexact: x times 1/d and x / d round differently here",
             hint="The task asks for x times the float32 reciprocal of d, as llama.cpp "
                  "computes it; x / d rounds differently on a value like these."),
        Case((_randn(340),), label="the codes use the float32 d, not the float16 one stored",
             hint="Which d do the codes come from: the float32 one, or the float16 one stored "
                  "in bytes 0-1? Rounding d to 16 bits first rounds twice."),
        Case((torch.randn(31, generator=g),), label="31 weights: raise ValueError",
             raises=ValueError),
        Case((torch.randn(2, 32, generator=g),), label="two blocks at once: raise ValueError",
             raises=ValueError),
        Case((torch.randn(1, 32, generator=g),), label="32 floats in two dimensions (1, 32): "
             "raise ValueError", raises=ValueError),
        Case((torch.arange(32),), label="32 integers: raise ValueError (floats are asked)",
             raises=ValueError),
        Case((torch.full((32,), float("nan")),), label="NaN weights: raise ValueError",
             raises=ValueError),
    ]


_TIE = ("Two weights share the largest magnitude with opposite signs: which one sets d? The "
        "task: the first one, with its sign (torch.argmax of |x| returns the first).")


def _randn(seed):
    return torch.randn(32, generator=torch.Generator().manual_seed(seed))


def _on_boundaries(seed):
    """The largest weight m first, then weights d * (n - 8.5): x / d + 8.5 lands on (or
    within a rounding of) the whole number n, where x / d and x * (1 / d) can disagree."""
    g = torch.Generator().manual_seed(seed)
    m = float(torch.rand(1, generator=g) * 3 + 0.1)
    d = torch.tensor(m, dtype=torch.float32) / -8
    n = torch.randint(1, 16, (31,), generator=g).float()
    return torch.cat([torch.tensor([m]), d * (n - 8.5)]).float()


def _pack_ref(block):
    if not isinstance(block, torch.Tensor) or block.shape != (32,) or \
            not block.is_floating_point():
        raise ValueError("block must be 32 floats")
    if not torch.isfinite(block).all():
        raise ValueError("NaN or inf")
    return pack_q4_0_block(block.float())


def _pack_with(block, signed_max=True, first=True, rule="trunc", layout="halves",
               scale_dtype=np.float16, clip=15, divide=False, d16=False, half=False,
               any_dtype=False, flatten=False):
    """A configurable packer: the right one with the defaults; each mutant changes one thing."""
    if flatten and isinstance(block, torch.Tensor):
        block = block.reshape(-1)
    if any_dtype and isinstance(block, torch.Tensor):
        block = block.float()
    if not isinstance(block, torch.Tensor) or block.shape != (32,) or \
            not block.is_floating_point() or not torch.isfinite(block).all():
        raise ValueError("block must be 32 finite floats")
    x = block if half else block.float()
    order = range(32) if first else range(31, -1, -1)
    amax, mx = 0.0, 0.0
    for j in order:
        if abs(float(x[j])) > amax:
            amax, mx = abs(float(x[j])), float(x[j])
    m = torch.tensor(mx if signed_max else amax, dtype=x.dtype if half else torch.float32)
    d = m / -8
    dd = d.half().float() if d16 else d                  # two roundings: d to 16 bits first
    inv = torch.where(dd == 0, torch.zeros((), dtype=dd.dtype),
                      1 / torch.where(dd == 0, torch.ones((), dtype=dd.dtype), dd))
    v = (x / d if float(d) else x * 0) + 8.5 if divide else x * inv + 8.5
    v = v.float()
    q = torch.trunc(v) if rule == "trunc" else torch.round(x * inv) + 8
    q = q.clamp(0, clip).to(torch.uint8).numpy()
    if layout == "halves":
        nib = q[:16] | (q[16:] << 4)
    else:
        nib = q[0::2] | (q[1::2] << 4)
    head = np.array([float(d)], dtype=scale_dtype).view(np.uint8)
    if scale_dtype == np.float32:
        head = head[:2]
    return torch.from_numpy(np.concatenate([head, nib]).astype(np.uint8))


register(Exercise(
    id="13.pack_q4_0",
    title="one Q4_0 block, byte for byte",
    reference=_pack_ref,
    cases=_pack_cases,
    hint=["Which one of the 32 weights sets the scale, and does its sign matter? Where does "
          "the +8 come from, and which way does C's cast of a float to an integer round?",
          "Find the weight with the largest magnitude (the first one on a tie) and keep its "
          "sign: d = that weight / -8. Each code is min(15, trunc(x / d + 8.5)), computed "
          "with d in float32 (and 0 for every code's x / d when d is 0).",
          "Bytes 0-1: d as float16 (`np.array([d], np.float16).view(np.uint8)`). Bytes 2-17: "
          "byte j holds code j in its low four bits and code j + 16 in its high four bits: "
          "`q[:16] | (q[16:] << 4)`. Return a torch uint8 tensor of 18 bytes."],
    wrong=[lambda b: _pack_with(b, signed_max=False),
           lambda b: _pack_with(b, first=False),
           lambda b: _pack_with(b, rule="round"),
           lambda b: _pack_with(b, layout="pairs"),
           lambda b: _pack_with(b, scale_dtype=np.float32),
           lambda b: _pack_with(b, clip=14),
           lambda b: _pack_with(b, divide=True),         # x / d, not x times 1/d
           lambda b: _pack_with(b, d16=True),            # reciprocal of the float16 d
           lambda b: _pack_with(b, half=True),           # computed in the input's dtype
           lambda b: _pack_with(b, any_dtype=True),      # integers accepted
           lambda b: _pack_with(b, flatten=True)],       # (1, 32) accepted
))


# ---------------------------------------------------------------- 13.decode_bytes

def _sizes(tied=True, extra=None):
    s = {"token_embd.weight": 49152 * 612, "blk.0.attn_q.weight": 576 * 324,
         "blk.0.ffn_down.weight": 576 * 864, "blk.0.attn_norm.weight": 576 * 4,
         "output_norm.weight": 576 * 4}
    if not tied:
        s["output.weight"] = 49152 * 324
    if extra:
        s.update(extra)
    return s


def _decode_cases():
    return [
        Case((_sizes(True), 49152), label="tied embeddings: the table is the head, read whole",
             hint="Without output.weight, the embedding is the head too: every row of it is "
                  "read for each token. Is 'output_norm.weight' an output head?"),
        Case((_sizes(False), 49152), label="its own output head: one embedding row per token",
             hint="With its own output.weight, decoding only looks up one row of the embedding "
                  "(bytes // n_vocab); the head itself is read whole."),
        Case(({"token_embd.weight": 1000, "output.weight": 500}, 10),
             label="a toy file with a head"),
        Case(({"token_embd.weight": 1000}, 10), label="a toy file with tied embeddings"),
        Case(({"blk.0.attn_q.weight": 0, "token_embd.weight": 8}, 4),
             label="an empty tensor counts 0"),
        Case(({"token_embd.weight": 1005, "output.weight": 500}, 10),
             label="1005 bytes over 10 rows: bytes // n_vocab rounds down (100)",
             hint="The task's row is bytes // n_vocab: floor division, a whole number."),
        Case(({}, 10), label="no tensors: raise ValueError", raises=ValueError),
        Case((_sizes(True), 0), label="a vocabulary of 0: raise ValueError", raises=ValueError),
        Case(({"token_embd.weight": -5}, 4), label="negative bytes: raise ValueError",
             raises=ValueError),
        Case(({"token_embd.weight": 10.5}, 4), label="bytes are whole: raise ValueError",
             raises=ValueError),
    ]


def _dec_all(sizes, n_vocab):
    engine.decode_bytes(sizes, n_vocab)
    return sum(sizes.values())


def _dec_never(sizes, n_vocab):
    engine.decode_bytes(sizes, n_vocab)
    return sum(b for k, b in sizes.items() if k != "token_embd.weight")


def _dec_row_always(sizes, n_vocab):
    engine.decode_bytes(sizes, n_vocab)
    return sum(b // n_vocab if k == "token_embd.weight" else b for k, b in sizes.items())


def _dec_no_checks(sizes, n_vocab):
    total = 0
    for k, b in sizes.items():
        total += b // max(n_vocab, 1) if k == "token_embd.weight" and "output.weight" in sizes \
            else b
    return total


register(Exercise(
    id="13.decode_bytes",
    title="the bytes one decoded token reads",
    reference=engine.decode_bytes,
    cases=_decode_cases,
    int_results=True,
    hint=["Decoding one token multiplies the new activation by every weight matrix once. Which "
          "tensor is the exception, and what changes when the model has no output.weight of "
          "its own?",
          "Sum every tensor's bytes, except token_embd.weight when output.weight exists: then "
          "the lookup reads one row, bytes // n_vocab. Refuse an empty dict, n_vocab < 1 and "
          "sizes that are not whole numbers >= 0 with ValueError.",
          "`total += b // n_vocab if name == 'token_embd.weight' and 'output.weight' in sizes "
          "else b` in a loop over `sizes.items()`, after the checks."],
    wrong=[_dec_all, _dec_never, _dec_row_always, _dec_no_checks],
))


# ---------------------------------------------------------------- 13.choose_file

def _rows():
    return [{"file": "f16", "perplexity": 15.80, "bytes": 270_000_000},
            {"file": "q8_0", "perplexity": 15.81, "bytes": 145_000_000},
            {"file": "q4_0 gptq", "perplexity": 16.90, "bytes": 92_000_000},
            {"file": "q4_0 rtn", "perplexity": 18.40, "bytes": 92_000_000},
            {"file": "q4_1", "perplexity": 16.50, "bytes": 98_000_000}]


def _choose_cases():
    rows = _rows()
    edge = [{"file": "a", "perplexity": 10.5, "bytes": 5}, {"file": "b", "perplexity": 10.0,
                                                            "bytes": 9}]
    return [
        Case((rows, 15.80, 0.01), label="1 %: only the 8-bit file fits"),
        Case((rows, 15.80, 0.05), label="5 %: Q4_1 fits, the 4-bit files do not"),
        Case((rows, 15.80, 0.10), label="10 %: GPTQ's Q4_0 fits, RTN's does not"),
        Case((rows, 15.80, 0.20), label="20 %: both Q4_0 fit, same bytes: the lower perplexity",
             hint="Two files fit with the same bytes: which one does the task ship?"),
        Case((edge, 10.0, 0.05), label="exactly on the budget: it fits",
             hint="'At most ref_perplexity * (1 + budget)': is a file exactly on the limit in?"),
        Case((rows, 15.80, 0.0), label="no loss allowed: only files at or below the reference",
             hint="A budget of 0 is allowed (0 <= budget < 1): the limit is the reference "
                  "itself."),
        Case((list(reversed(rows)), 15.80, 0.20),
             label="RTN listed before GPTQ, same bytes: still the lower perplexity"),
        Case(([{"file": "a rtn", "perplexity": 18.4, "bytes": 92},
               {"file": "b gptq", "perplexity": 16.9, "bytes": 92}], 15.80, 0.20),
             label="same bytes, the lower perplexity named later in the alphabet",
             hint="On a tie in bytes, what decides: the name, the order, or the perplexity?"),
        Case((rows, 15.80, 0), label="a budget of the int 0 (a fraction too): no loss allowed",
             hint="0 is a fraction with 0 <= budget < 1, written as an int."),
        Case(([{"file": "x", "perplexity": 1.4, "bytes": 10},
               {"file": "y", "perplexity": 1.0, "bytes": 20}], 1.0, 0.5),
             label="a reference of exactly 1 (a perfect model): allowed",
             hint="The task refuses a reference that is not a finite number >= 1: is 1 "
                  "itself allowed?"),
        Case((rows, 15.80, 5), label="5 meaning 5 %: raise ValueError (a fraction is asked)",
             raises=ValueError),
        Case((rows, 15.80, -0.1), label="a negative budget: raise ValueError", raises=ValueError),
        Case((rows, 15.80, 1.0), label="a budget of exactly 1 (100 %): raise ValueError, "
             "0 <= budget < 1", raises=ValueError),
        Case((rows, 15.80, False), label="budget=False (a bool, not a fraction): raise ValueError",
             raises=ValueError),
        Case((rows, 0.5, 0.1), label="a reference perplexity below 1 (no model does better "
             "than 1): raise ValueError", raises=ValueError),
        Case((rows, float("inf"), 0.1), label="an infinite reference: raise ValueError",
             raises=ValueError),
        Case((rows, float("nan"), 0.1), label="a NaN reference: raise ValueError",
             raises=ValueError),
        Case((rows, 10.0, 0.1), label="nothing fits: raise ValueError", raises=ValueError),
    ]


def _smallest(fits):
    """The smallest of the files that fit, the better perplexity on a tie; none: ValueError."""
    if not fits:
        raise ValueError("none")
    return min(fits, key=lambda r: (r["bytes"], r["perplexity"]))["file"]


def _choose_strict(rows, ref, budget):
    engine.choose_file(rows, ref, budget)
    return _smallest([r for r in rows if r["perplexity"] < ref * (1 + budget)])


def _choose_first_on_tie(rows, ref, budget):
    engine.choose_file(rows, ref, budget)
    fits = [r for r in rows if r["perplexity"] <= ref * (1 + budget)]
    return min(fits, key=lambda r: r["bytes"])["file"]


def _choose_absolute(rows, ref, budget):
    engine.choose_file(rows, ref, budget)
    return _smallest([r for r in rows if r["perplexity"] - ref <= budget])


def _choose_percent(rows, ref, budget):
    if not 0 <= budget < 100 or not math.isfinite(ref):
        raise ValueError("bad")
    b = budget / 100 if budget >= 1 else budget
    return _smallest([r for r in rows if r["perplexity"] <= ref * (1 + b)])


def _choose_loose_ranges(rows, ref, budget):       # lets budget 1 and ref < 1 or inf in
    if not 0 <= budget <= 1 or math.isnan(ref) or ref <= 0:
        raise ValueError("bad")
    return _smallest([r for r in rows if r["perplexity"] <= ref * (1 + budget)])


def _choose_bool_budget(rows, ref, budget):        # every check but a bool budget
    if not isinstance(budget, (int, float)) or not 0 <= budget < 1 or \
            not 1 <= ref < math.inf:
        raise ValueError("bad")
    return _smallest([r for r in rows if r["perplexity"] <= ref * (1 + budget)])


def _choose_best_quality(rows, ref, budget):
    engine.choose_file(rows, ref, budget)
    fits = [r for r in rows if r["perplexity"] <= ref * (1 + budget)]
    return min(fits, key=lambda r: r["perplexity"])["file"]


register(Exercise(
    id="13.choose_file",
    title="the file to ship under a perplexity budget",
    reference=engine.choose_file,
    cases=_choose_cases,
    hint=["Which files are allowed at all, given the reference and the budget? Among those, "
          "what makes one better to ship on a machine whose decode speed is set by bytes?",
          "Keep the rows with perplexity <= ref_perplexity * (1 + budget); return the 'file' of "
          "the one with the fewest bytes, the lower perplexity breaking a tie. Refuse a budget "
          "outside 0 <= budget < 1, a reference that is not a finite number >= 1, and the case "
          "where nothing fits, with ValueError.",
          "`min(fits, key=lambda r: (r['bytes'], r['perplexity']))['file']`"],
    wrong=[_choose_strict, _choose_first_on_tie, _choose_absolute, _choose_percent,
           _choose_best_quality, _choose_loose_ranges, _choose_bool_budget],
))
