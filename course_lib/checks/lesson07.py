"""Exercises of lesson 07, "AWQ" (solutions/07_awq.ipynb)."""
from __future__ import annotations

import torch

from course_lib.checks import Case, Exercise, register
from course_lib.methods import awq
from course_lib.methods import calibration as cal


# ---------------------------------------------------------------- 07.scales

def _scales_cases():
    g = torch.Generator().manual_seed(0)
    mag = torch.rand(16, generator=g) * 5 + 0.01
    return [
        Case((torch.tensor([0.1, 1.0, 10.0]), 0.5), label="hand-checkable: sqrt, product of ends 1"),
        Case((mag, 0.0), label="alpha 0: every scale is 1"),
        Case((mag, 0.3), label="16 channels, alpha 0.3"),
        Case((mag, 0.9), label="alpha 0.9"),
        Case((torch.tensor([0.0, 2.0, 4.0]), 0.5),
             label="a channel with mean |x| = 0 (clamp it to 1e-4 first)"),
        Case((mag, 1.5), label="alpha outside [0, 1]: raise ValueError", raises=ValueError),
    ]


def scales(magnitude, alpha):
    """Reference: awq.scales_for, refusing alpha outside [0, 1]."""
    if not 0 <= alpha <= 1:
        raise ValueError("alpha must be in [0, 1]")
    return awq.scales_for(magnitude, alpha)


def _a(alpha):
    if not 0 <= alpha <= 1:
        raise ValueError("alpha must be in [0, 1]")


def _wrong_sc_no_norm(m, alpha):              # not normalised
    _a(alpha)
    return m.clamp(min=1e-4).pow(alpha)


def _wrong_sc_max(m, alpha):                  # normalised by the max, not sqrt(max * min)
    _a(alpha)
    s = m.clamp(min=1e-4).pow(alpha)
    return s / s.max()


def _wrong_sc_times(m, alpha):                # alpha multiplies instead of raising to a power
    _a(alpha)
    s = m.clamp(min=1e-4) * alpha + (1 - alpha)
    return s / (s.max() * s.min()).sqrt()


def _wrong_sc_no_clamp(m, alpha):             # 0 ** alpha = 0: a zero scale
    _a(alpha)
    s = m.pow(alpha)
    return s / (s.max() * s.min()).sqrt().clamp(min=1e-12)


register(Exercise(
    id="07.scales",
    title="AWQ's per-channel scales s = mean|x|^alpha, normalised",
    reference=scales,
    cases=_scales_cases,
    hint=["Busier channels should get larger scales, by an amount alpha controls. After that, "
          "only the ratios between scales matter: pick a normalisation that keeps them near 1.",
          "Clamp the magnitudes to at least 1e-4, raise them to alpha, then divide by "
          "sqrt(s.max() * s.min()).",
          "s = magnitude.clamp(min=1e-4) ** alpha; return s / (s.max() * s.min()).sqrt()"],
    wrong=[_wrong_sc_no_norm, _wrong_sc_max, _wrong_sc_times, _wrong_sc_no_clamp],
    rtol=1e-5, atol=1e-7,
))


# ---------------------------------------------------------------- 07.fold

def _fold_cases():
    g = torch.Generator().manual_seed(1)
    n = torch.rand(8, generator=g) + 0.5
    s = torch.rand(8, generator=g) * 3 + 0.2
    return [
        Case((n, [torch.randn(8, 8, generator=g)], s), label="one square weight"),
        Case((n, [torch.randn(4, 8, generator=g), torch.randn(2, 8, generator=g),
                  torch.randn(2, 8, generator=g)], s), label="q, k and v (different out sizes)"),
        Case((torch.ones(3), [torch.ones(2, 3)], torch.tensor([1.0, 2.0, 4.0])),
             label="hand-checkable: norm 1, 0.5, 0.25; weight columns 1, 2, 4"),
        Case((n, [torch.randn(8, 5, generator=g)], s),
             label="a weight with 5 inputs for 8 scales: raise ValueError", raises=ValueError),
    ]


def _f_check(n, ws, s):
    if any(W.shape[1] != s.shape[0] for W in ws):
        raise ValueError("shapes")


def _wrong_fold_rows(n, ws, s):               # scaled the output rows of square weights
    _f_check(n, ws, s)
    return n / s, tuple(W * s[:W.shape[0], None] for W in ws)


def _wrong_fold_inverted(n, ws, s):           # multiplied the norm and divided the weights
    _f_check(n, ws, s)
    return n * s, tuple(W / s[None, :] for W in ws)


def _wrong_fold_first_only(n, ws, s):         # scaled only the first Linear
    _f_check(n, ws, s)
    return n / s, (ws[0] * s[None, :],) + tuple(ws[1:])


register(Exercise(
    id="07.fold",
    title="fold AWQ's scales into the RMSNorm before the Linears",
    reference=awq.folded,
    cases=_fold_cases,
    hint=["The model must compute exactly the same thing: if the norm's output channel c is "
          "divided by s[c], what must happen to every weight that reads channel c?",
          "Divide the norm weight (in,) by s; multiply the *input columns* of each Linear "
          "weight (out, in) by s: W * s[None, :]. Every Linear fed by that norm, not one.",
          "if any(W.shape[1] != len(s) for W in weights): raise ValueError(...); "
          "return norm_weight / s, tuple(W * s[None, :] for W in weights)"],
    wrong=[_wrong_fold_rows, _wrong_fold_inverted, _wrong_fold_first_only],
))


# ---------------------------------------------------------------- 07.best_alpha

def best_alpha(W, x, bits=3, group_size=32, grid=10):
    """Reference: the library's search on one Linear."""
    cal.check_group_size(W.shape[1], group_size)
    lin = torch.nn.Linear(W.shape[1], W.shape[0], bias=False)
    lin.weight.data = W.clone()
    _, alpha, _ = awq.search_scale([lin], awq.channel_magnitude(x), lambda: lin(x), bits,
                                   group_size, True, grid)
    return float(alpha)


def _salient_x(n, d, seed, k=2, big=40.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    x[:, :k] *= big
    return x


def _ba_cases():
    g = torch.Generator().manual_seed(5)
    return [
        Case((torch.randn(16, 64, generator=g), _salient_x(256, 64, 1)),
             label="two salient channels, 40x the rest"),
        Case((torch.randn(32, 64, generator=g), _salient_x(256, 64, 2, 4, 10.0), 4, 32, 20),
             label="four channels 10x, INT4, grid of 20"),
        Case((torch.randn(8, 32, generator=g), torch.randn(128, 32, generator=g), 3, 32, 5),
             label="no salient channels, grid of 5"),
        Case((torch.randn(8, 64, generator=g), _salient_x(64, 64, 3), 3, 48),
             label="group 48 does not divide 64: raise ValueError", raises=ValueError),
    ]


def _ba(W, x, bits, gs, grid, *, inverse=False, weight_err=False, stat="mean", last=False):
    if W.shape[1] % gs:
        raise ValueError("group size must divide the inputs")
    mag = x.abs().mean(0) if stat == "mean" else x.abs().amax(0)
    alphas = [i / (grid - 1) for i in range(grid)] if last else [i / grid for i in range(grid)]
    best, best_a = float("inf"), None
    for a in alphas:
        s = awq.scales_for(mag, a)
        if inverse:
            Wq = cal.fake_quant(W / s[None, :], bits, gs) * s[None, :]
        else:
            Wq = cal.fake_quant(W * s[None, :], bits, gs) / s[None, :]
        err = float((Wq - W).pow(2).mean()) if weight_err else float((x @ (Wq - W).T).pow(2).mean())
        if err < best:
            best, best_a = err, a
    return float(best_a)


def _wrong_ba_inverse(W, x, bits=3, group_size=32, grid=10):      # Q(W / s) * s
    return _ba(W, x, bits, group_size, grid, inverse=True)


def _wrong_ba_weight_error(W, x, bits=3, group_size=32, grid=10): # error on weights, not outputs
    return _ba(W, x, bits, group_size, grid, weight_err=True)


def _wrong_ba_max(W, x, bits=3, group_size=32, grid=10):          # max |x|, not mean |x|
    return _ba(W, x, bits, group_size, grid, stat="max")


def _wrong_ba_inclusive(W, x, bits=3, group_size=32, grid=10):    # alphas i / (grid - 1)
    return _ba(W, x, bits, group_size, grid, last=True)


register(Exercise(
    id="07.best_alpha",
    title="AWQ's grid search: the alpha whose scaled-and-rounded weight gives the smallest output error",
    reference=best_alpha,
    cases=_ba_cases,
    hint=["For each alpha: which weight does the scaled layer effectively use on the original "
          "inputs, and what error do you measure: on the weights, or on the outputs?",
          "alpha runs over i / grid for i = 0..grid-1. s = scales of mean|x| (exercise 1); "
          "the effective weight is Q(W * s) / s (round-to-nearest in groups); the error is the "
          "mean of (x @ (W_eff - W).T) ** 2. Keep the first alpha with the smallest error.",
          "use course_lib.methods.calibration.fake_quant(W * s[None, :], bits, group_size) / "
          "s[None, :]; return float(best_alpha)"],
    wrong=[_wrong_ba_inverse, _wrong_ba_weight_error, _wrong_ba_max, _wrong_ba_inclusive],
    rtol=0, atol=1e-9,
))
