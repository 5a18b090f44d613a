"""Held-out wrong answers for every checked exercise of lessons 13, 14 and 15 (issue 39).

None of these is in an exercise's own ``wrong`` list: they were written from the task
sentences, as a learner might slip, to find the inputs no case tried (ties and orderings,
boundary values, half-precision input, more leading dimensions, infinities, a required call
left out, a tensor returned where a float is asked). Each must fail its check; the references
and the other right readings must pass.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from course_lib import checks, engine, imatrix, kquants, qat, sensitivity
from course_lib.checks import check, lesson15
from course_lib.gguf_model import pack_q4_0_block

checks.load_all()
pytestmark = pytest.mark.filterwarnings("ignore:reduction. 'mean' divides")


@pytest.fixture(autouse=True)
def learner_mode(monkeypatch):
    monkeypatch.setenv("COURSE_CHECKS", "learner")


# ================================================================ 13.pack_q4_0

def _q4_0(block, pick="first", clamp=True, scale_bytes="f16le", compute=torch.float32,
          negate=True, low_first=True, finite_check=True, zero_guard=True):
    """A Q4_0 packer with one slip (the defaults are right)."""
    if not isinstance(block, torch.Tensor) or block.shape != (32,) or \
            not block.is_floating_point():
        raise ValueError("block must be 32 floats")
    if finite_check and not torch.isfinite(block).all():
        raise ValueError("NaN or inf")
    x = block.to(compute)
    if pick == "first":
        m = x[int(x.abs().argmax())]
    elif pick == "max_or_min":                           # the sign from max() vs min()
        m = x.max() if x.max().abs() >= x.min().abs() else x.min()
    else:                                                # "abs": the sign dropped
        m = x.abs().max()
    d = m / (-8 if negate else 8)
    if zero_guard:
        inv = 1 / d if float(d) != 0 else torch.zeros((), dtype=compute)
    else:
        inv = 1 / d
    v = torch.trunc(x * inv + 8.5)
    q = (v.clamp(max=15) if clamp else v).to(torch.uint8)
    lo, hi = (q[:16], q[16:]) if low_first else (q[16:], q[:16])
    nib = (lo | (hi << 4)).numpy()
    if scale_bytes == "f16le":
        head = np.array([float(d)], dtype="<f2").view(np.uint8)
    elif scale_bytes == "f16be":
        head = np.array([float(d)], dtype=">f2").view(np.uint8)
    else:                                                # bf16: the top two bytes of fp32
        head = np.array([float(d)], dtype="<f4").view(np.uint8)[2:]
    return torch.from_numpy(np.concatenate([head, nib]).astype(np.uint8))


Q4_0 = {
    "sign from max() or min(), not the first largest": lambda b: _q4_0(b, pick="max_or_min"),
    "the scale's sign dropped (|max| / -8)": lambda b: _q4_0(b, pick="abs"),
    "d = max / 8 (codes mirrored)": lambda b: _q4_0(b, negate=False),
    "no clamp at 15 (the code 16 spills into the next nibble)": lambda b: _q4_0(b, clamp=False),
    "the scale stored big-endian": lambda b: _q4_0(b, scale_bytes="f16be"),
    "the scale stored as bfloat16": lambda b: _q4_0(b, scale_bytes="bf16"),
    "computed in float64": lambda b: _q4_0(b, compute=torch.float64),
    "code j + 16 in the low nibble": lambda b: _q4_0(b, low_first=False),
    "NaN weights not refused": lambda b: _q4_0(b, finite_check=False),
    "no guard for d = 0 (0 * inf = NaN codes)": lambda b: _q4_0(b, zero_guard=False),
}


# ================================================================ 13.decode_bytes

def _sizes_ok(sizes, n_vocab):
    engine.decode_bytes(sizes, n_vocab)                 # raises where the reference does


def _db_substring(sizes, n_vocab):                       # 'output' in 'output_norm.weight'
    _sizes_ok(sizes, n_vocab)
    untied = any("output" in k for k in sizes)
    return sum(b // n_vocab if k == "token_embd.weight" and untied else b
               for k, b in sizes.items())


def _db_ceil(sizes, n_vocab):                            # a row rounded up
    _sizes_ok(sizes, n_vocab)
    return sum(-(-b // n_vocab) if k == "token_embd.weight" and "output.weight" in sizes else b
               for k, b in sizes.items())


def _db_float(sizes, n_vocab):                           # bytes / n_vocab: a float
    _sizes_ok(sizes, n_vocab)
    return sum(b / n_vocab if k == "token_embd.weight" and "output.weight" in sizes else b
               for k, b in sizes.items())


def _db_reversed(sizes, n_vocab):                        # tied and untied swapped
    _sizes_ok(sizes, n_vocab)
    return sum(b // n_vocab if k == "token_embd.weight" and "output.weight" not in sizes else b
               for k, b in sizes.items())


def _db_head_row_too(sizes, n_vocab):                    # one row of the head as well
    _sizes_ok(sizes, n_vocab)
    return sum(b // n_vocab if k in ("token_embd.weight", "output.weight")
               and "output.weight" in sizes else b for k, b in sizes.items())


def _db_no_checks(sizes, n_vocab):                       # nothing refused
    return sum(b // max(n_vocab, 1) if k == "token_embd.weight" and "output.weight" in sizes
               else b for k, b in sizes.items())


def _db_vocab_unchecked(sizes, n_vocab):                 # every check but n_vocab's
    if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 0
                        for b in sizes.values()):
        raise ValueError("bad sizes")
    return sum(b // n_vocab if k == "token_embd.weight" and "output.weight" in sizes else b
               for k, b in sizes.items())


def _db_empty_is_zero(sizes, n_vocab):                   # {} -> 0, not refused
    if not sizes:
        return 0
    return engine.decode_bytes(sizes, n_vocab)


DECODE = {
    "'output' found inside 'output_norm.weight'": _db_substring,
    "the embedding row rounded up": _db_ceil,
    "a float (bytes / n_vocab)": _db_float,
    "tied and untied swapped": _db_reversed,
    "one row of the head too": _db_head_row_too,
    "nothing refused": _db_no_checks,
    "n_vocab not checked": _db_vocab_unchecked,
    "an empty dict gives 0": _db_empty_is_zero,
}


# ================================================================ 13.choose_file

def _cf(rows, ref, budget, key=None, budget_ok=None, ref_ok=None, out="file", none=None):
    budget_ok = budget_ok or (lambda b: not isinstance(b, bool) and isinstance(b, (int, float))
                              and 0 <= b < 1)
    ref_ok = ref_ok or (lambda r: isinstance(r, (int, float)) and 1 <= r < math.inf)
    if not budget_ok(budget) or not ref_ok(ref):
        raise ValueError("bad budget or reference")
    fits = [r for r in rows if r["perplexity"] <= ref * (1 + budget)]
    if not fits:
        if none == "None":
            return None
        raise ValueError("nothing fits")
    best = min(fits, key=key or (lambda r: (r["bytes"], r["perplexity"])))
    return best[out] if out else best


CHOOSE = {
    "a tie in bytes: the higher perplexity": lambda rows, ref, b: _cf(
        rows, ref, b, key=lambda r: (r["bytes"], -r["perplexity"])),
    "a tie in bytes: the file name decides": lambda rows, ref, b: _cf(
        rows, ref, b, key=lambda r: (r["bytes"], r["file"])),
    "a budget of 0 refused": lambda rows, ref, b: _cf(
        rows, ref, b, budget_ok=lambda x: isinstance(x, (int, float)) and 0 < x < 1),
    "a reference of exactly 1 refused": lambda rows, ref, b: _cf(
        rows, ref, b, ref_ok=lambda r: isinstance(r, (int, float)) and 1 < r < math.inf),
    "an int budget refused (0 is a fraction too)": lambda rows, ref, b: _cf(
        rows, ref, b, budget_ok=lambda x: isinstance(x, float) and 0 <= x < 1),
    "the row, not its file name": lambda rows, ref, b: _cf(rows, ref, b, out=None),
    "nothing fits: None": lambda rows, ref, b: _cf(rows, ref, b, none="None"),
    "an infinite reference let in": lambda rows, ref, b: _cf(
        rows, ref, b, ref_ok=lambda r: isinstance(r, (int, float)) and r >= 1),
}


# ================================================================ 14.pack_scales

def _ps(sc, m, top_shift=6, low_mask=0xF, first_swapped=False, hi=63, out_dtype=np.uint8,
        check_m_len=True, floats="whole", as_list=False, ndim_ok=False):
    sc, m = np.asarray(sc), np.asarray(m)
    for i, v in enumerate((sc, m)):
        if floats == "refused" and not np.issubdtype(v.dtype, np.integer):
            raise ValueError("integers")
        if floats == "whole" and (not np.issubdtype(v.dtype, np.number)
                                  or (v != np.round(v)).any()):
            raise ValueError("whole numbers")
        if (i == 0 or check_m_len) and (v.shape[-1:] != (8,) if ndim_ok else v.shape != (8,)):
            raise ValueError("8 codes")
        if v.min() < 0 or v.max() > hi:
            raise ValueError("0..63")
    sc, m = sc.reshape(-1)[:8].astype(np.int64), m.reshape(-1)[:8].astype(np.int64)
    if len(m) < 8:
        m = np.concatenate([m, np.zeros(8 - len(m), np.int64)])
    out = np.zeros(12, np.int64)
    a, b = (m, sc) if first_swapped else (sc, m)
    out[:4], out[4:8] = a[:4], b[:4]
    out[8:] = (sc[4:] & low_mask) | ((m[4:] & 0xF) << 4)
    out[:4] |= (sc[4:] >> 4) << top_shift
    out[4:8] |= (m[4:] >> 4) << top_shift
    out &= 0xFF
    out = out.astype(out_dtype)
    return out.tolist() if as_list else out


PACK_SCALES = {
    "top bits into bits 4-5, not 6-7": lambda sc, m: _ps(sc, m, top_shift=4),
    "six bits of the scale in the low nibble": lambda sc, m: _ps(sc, m, low_mask=0x3F),
    "minimums in bytes 0-3, scales in 4-7": lambda sc, m: _ps(sc, m, first_swapped=True),
    "64 let in": lambda sc, m: _ps(sc, m, hi=64),
    "int64 bytes": lambda sc, m: _ps(sc, m, out_dtype=np.int64),
    "a list of ints": lambda sc, m: _ps(sc, m, as_list=True),
    "m's length not checked": lambda sc, m: _ps(sc, m, check_m_len=False),
    "whole floats (9.0) refused: integer dtypes only": lambda sc, m: _ps(sc, m,
                                                                         floats="refused"),
    "27.5 truncated to 27, not refused": lambda sc, m: _ps(sc, m, floats="truncated"),
    "two super-blocks (2, 8) accepted": lambda sc, m: _ps(sc, m, ndim_ok=True),
}


# ================================================================ 14.importance

def _imp_checks(x, inf_ok=False):
    if not isinstance(x, torch.Tensor) or x.dim() < 2 or not x.is_floating_point():
        raise ValueError("x")
    if (torch.isnan(x).any() if inf_ok else not torch.isfinite(x).all()):
        raise ValueError("NaN")


def _imp_axis0(x):                                       # the first axis only
    _imp_checks(x)
    return x.double().pow(2).mean(0).float()


def _imp_flatten01(x):                                   # assumes at most 3 dimensions
    _imp_checks(x)
    if x.dim() == 3:
        x = x.flatten(0, 1)
    return x.double().pow(2).mean(-2).float()


def _imp_float32(x):                                     # computed in float32, not float64
    _imp_checks(x)
    return x.reshape(-1, x.shape[-1]).float().pow(2).mean(0)


def _imp_inf_ok(x):                                      # NaN refused, inf let through
    _imp_checks(x, inf_ok=True)
    return x.reshape(-1, x.shape[-1]).double().pow(2).mean(0).float()


def _imp_square_first(x):                                # squared in the input's dtype
    _imp_checks(x)
    return x.pow(2).reshape(-1, x.shape[-1]).double().mean(0).float()


def _imp_per_window(x):                                  # summed over windows, / tokens
    _imp_checks(x)
    s = x.double().pow(2)
    return (s.reshape(-1, x.shape[-1]).sum(0) / x.shape[-2]).float()


def _imp_last_axis(x):                                   # the mean over columns, per token
    _imp_checks(x)
    return x.double().pow(2).mean(-1).reshape(-1)[: x.shape[-1]].float()


IMPORTANCE = {
    "the mean over the first axis only": _imp_axis0,
    "more than three dimensions not flattened": _imp_flatten01,
    "computed in float32": _imp_float32,
    "inf let through": _imp_inf_ok,
    "squared in the input's dtype": _imp_square_first,
    "summed over the windows, divided by the tokens of one": _imp_per_window,
    "the mean over the wrong axis": _imp_last_axis,
}


# ================================================================ 14.allocate

def _greedy(costs, sizes, budget, start=None, order=None, better=None, moves=None,
            ratio=None, fits=None, gain_ok=None):
    """The greedy allocation with one piece swapped (defaults: the right one)."""
    sensitivity.allocate(costs, sizes, budget)          # raises where the reference does
    start = start or (lambda t, s: min(s, key=lambda f: (s[f], costs[t][f])))
    pick = {t: start(t, sizes[t]) for t in sizes}
    total = sum(sizes[t][f] for t, f in pick.items())
    order = order or (lambda: list(sizes))
    better = better or (lambda r, best: r > best)
    ratio = ratio or (lambda gain, extra, t, f, f0: gain / extra)
    fits = fits or (lambda new: new <= budget)
    gain_ok = gain_ok or (lambda gain: gain > 0)
    while True:
        best = None
        for t in order():
            f0 = pick[t]
            fmts = moves(t, f0) if moves else list(sizes[t])
            for f in fmts:
                extra, gain = sizes[t][f] - sizes[t][f0], costs[t][f0] - costs[t][f]
                if extra <= 0 or not gain_ok(gain) or not fits(total + extra):
                    continue
                r = ratio(gain, extra, t, f, f0)
                if best is None or better(r, best[0]):
                    best = (r, t, f, extra)
        if best is None:
            return pick
        _, t, f, extra = best
        pick[t], total = f, total + extra


def _al_costs_order(costs, sizes, budget):               # ties: the order of costs, not sizes
    return _greedy(costs, sizes, budget, order=lambda: list(costs))


def _al_last_on_tie(costs, sizes, budget):               # >= keeps the last of equals
    return _greedy(costs, sizes, budget, better=lambda r, best: r >= best)


def _al_start_first_format(costs, sizes, budget):        # smallest bytes, first listed on a tie
    return _greedy(costs, sizes, budget, start=lambda t, s: min(s, key=s.get))


def _al_adjacent_only(costs, sizes, budget):             # only the next larger format
    def moves(t, f0):
        larger = sorted((f for f in sizes[t] if sizes[t][f] > sizes[t][f0]),
                        key=lambda f: sizes[t][f])
        return larger[:1]
    return _greedy(costs, sizes, budget, moves=moves)


def _al_vs_smallest(costs, sizes, budget):               # saving per byte counted from the start
    base = {t: min(s, key=lambda f: (s[f], costs[t][f])) for t, s in sizes.items()}

    def ratio(gain, extra, t, f, f0):
        return (costs[t][base[t]] - costs[t][f]) / (sizes[t][f] - sizes[t][base[t]])
    return _greedy(costs, sizes, budget, ratio=ratio)


def _al_zero_gain(costs, sizes, budget):                 # a move that saves nothing taken too
    return _greedy(costs, sizes, budget, gain_ok=lambda g: g >= 0)


def _al_strict_fit(costs, sizes, budget):                # < budget, not <=
    return _greedy(costs, sizes, budget, fits=lambda new: new < budget)


def _al_per_total_bytes(costs, sizes, budget):           # saving per byte of the new format
    return _greedy(costs, sizes, budget,
                   ratio=lambda gain, extra, t, f, f0: gain / sizes[t][f])


ALLOCATE = {
    "ties go to the order of costs, not of sizes": _al_costs_order,
    "ties go to the last tensor or format": _al_last_on_tie,
    "the start ignores the cost on a tie in bytes": _al_start_first_format,
    "only the next larger format": _al_adjacent_only,
    "saving per byte counted from the smallest format": _al_vs_smallest,
    "a move that saves nothing": _al_zero_gain,
    "a move that fills the budget exactly refused": _al_strict_fit,
    "saving per byte of the whole format": _al_per_total_bytes,
}


# ================================================================ 15.ste

def _ste_fn(round_fn=torch.round, mask="v", upstream=True, scale_out=True, lo=None,
            grad_factor=None):
    class F_(torch.autograd.Function):
        @staticmethod
        def forward(ctx, w, scale, qmax):
            v = w / scale
            q = torch.clamp(round_fn(v), -qmax if lo is None else lo(qmax), qmax)
            if mask == "v":
                inside = (v >= -qmax) & (v <= qmax)
            elif mask == "rounded":
                inside = (round_fn(v) >= -qmax) & (round_fn(v) <= qmax)
            else:                                        # "w": the range on w itself
                inside = (w >= -qmax) & (w <= qmax)
            ctx.save_for_backward(inside, scale)
            return q * scale if scale_out else q

        @staticmethod
        def backward(ctx, grad):
            inside, scale = ctx.saved_tensors
            g = (grad if upstream else torch.ones_like(grad)) * inside
            if grad_factor is not None:
                g = g * grad_factor(scale)
            return g, None, None
    return lesson15.with_gradient(F_.apply)


def _half_away(v):
    return torch.sign(v) * torch.floor(v.abs() + 0.5)


STE = {
    "ties rounded away from zero": _ste_fn(round_fn=_half_away),
    "the range tested on the rounded code": _ste_fn(mask="rounded"),
    "the upstream gradient ignored": _ste_fn(upstream=False),
    "the range tested on w, not w / scale": _ste_fn(mask="w"),
    "the codes, not times the scale": _ste_fn(scale_out=False),
    "clamped to -qmax - 1 .. qmax": _ste_fn(lo=lambda qmax: -qmax - 1),
    "the gradient divided by the scale": _ste_fn(grad_factor=lambda s: 1 / s),
    "ties rounded half up": _ste_fn(round_fn=lambda v: torch.floor(v + 0.5)),
}


# ================================================================ 15.lsq_step_grad

def _lsq(w, scale, qmax, upstream, grad_scale, round_fn=torch.round, inside_fn=None,
         outside=None, reduce="sum", gs=None, shape=None):
    v = w / scale
    q = torch.clamp(round_fn(v), -qmax, qmax)
    inside = inside_fn(v, qmax) if inside_fn else (v >= -qmax) & (v <= qmax)
    term = torch.where(inside, q - v, outside(q) if outside else q)
    g = (upstream * term).sum() if reduce == "sum" else (upstream * term).mean()
    g = gs(g, grad_scale) if gs else g * grad_scale
    return g.reshape(shape) if shape is not None else g


LSQ = {
    "ties rounded away from zero": lambda *a: _lsq(*a, round_fn=_half_away),
    "grad_scale divides": lambda *a: _lsq(*a, gs=lambda g, s: g / s),
    "the clipped terms' signs swapped": lambda *a: _lsq(*a, outside=lambda q: -q),
    "w / s exactly +-qmax counted as clipped": lambda *a: _lsq(
        *a, inside_fn=lambda v, qmax: (v > -qmax) & (v < qmax)),
    "the mean, not the sum": lambda *a: _lsq(*a, reduce="mean"),
    "shape (1,), not a 0-d tensor": lambda *a: _lsq(*a, shape=(1,)),
    "round(w/s) inside, the w/s term forgotten": lambda *a: _lsq(
        *a, inside_fn=lambda v, qmax: torch.zeros_like(v, dtype=torch.bool)),
    "ties rounded half up": lambda *a: _lsq(*a, round_fn=lambda v: torch.floor(v + 0.5)),
}


# ================================================================ 15.qat_step

def _kl(logits, teacher, reduction="batchmean", flatten=True):
    V = logits.shape[-1]
    s, t = F.log_softmax(logits, -1), F.log_softmax(teacher, -1)
    if flatten:
        s, t = s.reshape(-1, V), t.reshape(-1, V)
    return F.kl_div(s, t, log_target=True, reduction=reduction)


def _step(model, opt, x, y, teacher_logits=None, step=0, ret="item", clamp=True,
          check=True, order="zero_first", kl=_kl, add_ce=False, clip="all"):
    logits = model(x)
    V = logits.shape[-1]
    ce = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
    loss = ce if teacher_logits is None else kl(logits, teacher_logits) + (ce if add_ce else 0)
    if check:
        qat.check_loss(loss, step)
    if order == "zero_first":
        opt.zero_grad()
        loss.backward()
    else:                                                # cleared after backward: no gradient
        loss.backward()
        opt.zero_grad()
    if clip == "all":
        torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], 1.0)
    else:                                                # each group clipped on its own
        for g in opt.param_groups:
            torch.nn.utils.clip_grad_norm_(g["params"], 1.0)
    opt.step()
    if clamp:
        with torch.no_grad():
            for m in qat.qat_linears(model).values():
                m.step.clamp_(min=1e-8)
    return loss.item() if ret == "item" else loss.detach()


S = lesson15.after_one_step
QAT_STEP = {
    "the loss returned as a tensor": S(lambda *a: _step(*a, ret="tensor")),
    "the LSQ steps not kept positive": S(lambda *a: _step(*a, clamp=False)),
    "qat.check_loss not called (a NaN loss trains on)": S(lambda *a: _step(*a, check=False)),
    "the gradients cleared after backward": S(lambda *a: _step(*a, order="zero_after")),
    "KL with reduction='mean'": S(lambda *a: _step(*a, kl=lambda s, t: _kl(s, t, "mean"))),
    "KL not flattened (batchmean over B only)": S(
        lambda *a: _step(*a, kl=lambda s, t: _kl(s, t, flatten=False))),
    "cross-entropy added to the teacher's KL": S(lambda *a: _step(*a, add_ce=True)),
    "each group clipped on its own": S(lambda *a: _step(*a, clip="per_group")),
}


MUTANTS = {"13.pack_q4_0": Q4_0, "13.decode_bytes": DECODE, "13.choose_file": CHOOSE,
           "14.pack_scales": PACK_SCALES, "14.importance": IMPORTANCE, "14.allocate": ALLOCATE,
           "15.ste": STE, "15.lsq_step_grad": LSQ, "15.qat_step": QAT_STEP}
CASES = [(ex_id, name) for ex_id, m in MUTANTS.items() for name in m]


def test_every_checked_exercise_of_lessons_13_to_15_has_six_or_more_mutants():
    ids = {k for k in checks.EXERCISES if k[:2] in ("13", "14", "15")}
    assert ids == set(MUTANTS)
    assert all(len(m) >= 6 for m in MUTANTS.values()), {k: len(m) for k, m in MUTANTS.items()}


@pytest.mark.parametrize("ex_id, name", CASES, ids=[f"{e}: {n}" for e, n in CASES])
def test_each_held_out_mutant_is_rejected(ex_id, name):
    result = check(ex_id, MUTANTS[ex_id][name], quiet=True)
    assert result.status == "failed", f"{ex_id}: the mutant '{name}' passed"
    assert "input:" in result.report and "problem:" in result.report


RIGHT = {
    "13.pack_q4_0": [lambda b: pack_q4_0_block(b.float()) if isinstance(b, torch.Tensor)
                     and b.shape == (32,) and b.is_floating_point()
                     and bool(torch.isfinite(b).all()) else _q4_0(b),
                     _q4_0],
    "13.decode_bytes": [engine.decode_bytes],
    "13.choose_file": [_cf],
    "14.pack_scales": [_ps],
    "14.importance": [imatrix.from_inputs],
    "14.allocate": [_greedy, sensitivity.allocate],
    "15.ste": [_ste_fn(), lesson15.with_gradient(qat.RoundSTE.apply)],
    "15.lsq_step_grad": [_lsq],
    "15.qat_step": [S(_step), S(qat.qat_step)],
}


@pytest.mark.parametrize("ex_id", sorted(RIGHT))
def test_the_right_versions_of_the_same_code_pass(ex_id):
    """The mutants' own code with nothing swapped passes: each rejection is the slip's."""
    for fn in RIGHT[ex_id]:
        result = check(ex_id, fn, quiet=True)
        assert result, result.report


def test_kquants_reference_is_what_the_checker_packs():
    sc, m = np.arange(8), np.arange(8)[::-1].copy()
    assert np.array_equal(_ps(sc, m), kquants.pack_scales_k4(sc, m))
