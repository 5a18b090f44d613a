"""Exercises of lesson 07, "AWQ" (solutions/07_awq.ipynb)."""
from __future__ import annotations

import torch

from course_lib.checks import Case, Exercise, register
from course_lib.methods import awq
from course_lib.methods import calibration as cal


#: the shared harness rejects answers that change their inputs in place (a wrong answer of
#: that kind is listed only where the harness can see it)
_HARNESS_SEES_MUTATION = int("mutates" in getattr(Exercise, "__dataclass_fields__", {}))


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
             label="a channel with mean |x| = 0 (clamp it to 1e-4 first)",
             hint="A channel whose mean |x| is 0: clamp it before raising it to alpha."),
        Case((mag.double(), 1.0), label="float64 magnitudes, alpha 1 (the grid's far end)"),
        Case((mag, 1.5), label="alpha outside [0, 1]: raise ValueError", raises=ValueError),
        Case((mag, float("nan")), label="alpha NaN: not in [0, 1], raise ValueError",
             raises=ValueError, hint="A NaN fails every comparison: `x < 0 or x > 1` lets it through, `not 0 <= x <= 1` does not."),
        Case((torch.tensor([1.0, float("nan"), 2.0]), 0.5),
             label="a NaN magnitude: raise ValueError", raises=ValueError),
        Case((torch.tensor([1.0, -2.0, 2.0]), 0.5),
             label="a negative mean |x| cannot happen: raise ValueError", raises=ValueError),
    ]


def scales(magnitude, alpha):
    """Reference: awq.scales_for, refusing alpha outside [0, 1] and NaN or negative
    magnitudes."""
    if not 0 <= alpha <= 1:
        raise ValueError("alpha must be in [0, 1]")
    return awq.scales_for(magnitude, alpha)


def _a(alpha, m=None):
    if not 0 <= alpha <= 1:
        raise ValueError("alpha must be in [0, 1]")
    if m is not None and (not torch.isfinite(m).all() or bool((m < 0).any())):
        raise ValueError("magnitudes must be finite and >= 0")


def _wrong_sc_no_refusal(m, alpha):           # right formula, lets NaN and negatives through
    _a(alpha)
    s = m.clamp(min=1e-4).pow(alpha)
    return s / (s.max() * s.min()).sqrt()


def _wrong_sc_nan_alpha(m, alpha):            # alpha checked with < and >: NaN passes
    if alpha < 0 or alpha > 1 or not torch.isfinite(m).all() or (m < 0).any():
        raise ValueError("bad input")
    s = m.clamp(min=1e-4) ** alpha
    return s / (s.max() * s.min()).sqrt()


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
          "refuse alpha outside [0, 1] and magnitudes with a NaN or a negative entry; "
          "s = magnitude.clamp(min=1e-4) ** alpha; return s / (s.max() * s.min()).sqrt()"],
    wrong=[_wrong_sc_nan_alpha, _wrong_sc_no_norm, _wrong_sc_max, _wrong_sc_times, _wrong_sc_no_clamp,
           _wrong_sc_no_refusal],
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
        Case((torch.ones(3), [torch.ones(2, 3)], torch.tensor([1.0, 0.0, 4.0])),
             label="a zero scale cannot be divided out of the norm: raise ValueError",
             raises=ValueError),
        Case((torch.ones(3), [torch.ones(2, 3)], torch.tensor([1.0, -2.0, 4.0])),
             label="a negative scale: raise ValueError", raises=ValueError),
    ]


def _f_check(n, ws, s):
    if any(W.shape[1] != s.shape[0] for W in ws) or not bool((s > 0).all()):
        raise ValueError("shapes")


def _wrong_fold_no_refusal(n, ws, s):         # right arithmetic, accepts a zero scale
    if any(W.shape[1] != s.shape[0] for W in ws):
        raise ValueError("shapes")
    return n / s, tuple(W * s[None, :] for W in ws)


def _wrong_fold_in_place(n, ws, s):           # divides the caller's norm weight in place
    _f_check(n, ws, s)
    n.div_(s)
    return n, tuple(W * s[None, :] for W in ws)


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
          "if any(W.shape[1] != len(s) for W in weights) or not (s > 0).all(): "
          "raise ValueError(...); "
          "return norm_weight / s, tuple(W * s[None, :] for W in weights)"],
    wrong=[_wrong_fold_rows, _wrong_fold_inverted, _wrong_fold_first_only,
           _wrong_fold_no_refusal, *_HARNESS_SEES_MUTATION * [_wrong_fold_in_place]],
))


# ---------------------------------------------------------------- 07.best_alpha

def best_alpha(weights, x, run, bits=3, group_size=32, n_grid=10):
    """Reference: the library's search (awq.search_scale) on Linears sharing the input x,
    scored on what they feed, run(weights)."""
    for W in weights:
        cal.check_group_size(W.shape[1], group_size)
    mag = awq.channel_magnitude(x)                               # refuses NaN
    lins = []
    for W in weights:
        lin = torch.nn.Linear(W.shape[1], W.shape[0], bias=False)
        lin.weight.data = W.clone()
        lins.append(lin)
    _, alpha, _ = awq.search_scale(lins, mag, lambda: run([lin.weight.data for lin in lins]),
                                   bits, group_size, True, n_grid)
    return float(alpha)


def _salient_x(n, d, seed, k=2, big=40.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    x[:, :k] *= big
    return x


class _MLP:
    """What gate and up feed: down(silu(x gate^T) * (x up^T)), down fixed (a picklable run)."""

    def __init__(self, x, W_down):
        self.x, self.W_down = x, W_down

    def __call__(self, ws):
        h = torch.nn.functional.silu(self.x @ ws[0].T) * (self.x @ ws[1].T)   # (n, hidden)
        return h @ self.W_down.T                                               # (n, d)

    def __deepcopy__(self, memo):
        return self


class _Linear:
    """What a lone Linear feeds: itself, x W^T."""

    def __init__(self, x):
        self.x = x

    def __call__(self, ws):
        return self.x @ ws[0].T

    def __deepcopy__(self, memo):
        return self


def _mlp_case():
    """gate/up whose rows feed down_proj unevenly: half the hidden units barely reach the output,
    so the MLP's output and the Linears' own outputs prefer different alphas."""
    g = torch.Generator().manual_seed(0)
    x = _salient_x(256, 64, 0, 2, 40.0)
    W_down = torch.randn(64, 32, generator=g) * 0.1
    W_down[:, 16:] *= 0.01
    W_gate, W_up = torch.randn(32, 64, generator=g), torch.randn(32, 64, generator=g)
    W_gate[16:, :2] *= 0.05
    return [W_gate, W_up], x, _MLP(x, W_down)


def _end_case():
    """one channel 400x busier with tiny weights: it can be scaled far before it sets the range"""
    g = torch.Generator().manual_seed(3)
    W = torch.randn(8, 64, generator=g)
    W[:, 0] *= 0.003
    x = _salient_x(256, 64, 11, 1, 400.0)
    return [W], x, _Linear(x)


def _ba_cases():
    g = torch.Generator().manual_seed(5)
    x1 = _salient_x(256, 64, 1)
    x2 = _salient_x(256, 64, 2, 4, 10.0)
    x_flat = torch.randint(0, 2, (128, 32), generator=g).float() * 2 - 1   # |x| = 1 everywhere
    x_spike = _salient_x(256, 64, 4, 2, 20.0)
    x_spike[7, 10] = 2000.0                       # channel 10: one huge value, otherwise quiet
    x_nan = x2.clone()
    x_nan[3, 5] = float("nan")
    return [
        Case(_mlp_case(), label="gate and up (two channels 40x) scored on the MLP's output, "
                                "which weighs their rows unevenly"),
        Case(([torch.randn(32, 64, generator=g)], x2, _Linear(x2), 4, 32, 20),
             label="one Linear feeding itself: four channels 10x, INT4, 20 alphas"),
        Case(([torch.randn(16, 64, generator=g)], x_spike, _Linear(x_spike)),
             label="one channel spikes on a single token (a large max |x|, a small mean |x|)"),
        Case(([torch.randn(8, 32, generator=g)], x_flat, _Linear(x_flat), 3, 32, 5),
             label="every channel equally busy: every alpha ties, return the first (0.0)",
             hint="When every alpha gives the same error, which one does the task return? The "
                  "first: a strict < keeps it."),
        Case(_end_case() + (3, 32, 10),
             label="one channel 400x the rest, its weights tiny: the best alpha is the grid's "
                   "last, 0.9"),
        Case(([torch.randn(8, 64, generator=g)], x1, _Linear(x1), 3, 48),
             label="group 48 does not divide 64: raise ValueError", raises=ValueError),
        Case(([torch.randn(8, 64, generator=g)], x_nan, _Linear(x_nan), 3, 32),
             label="a NaN in x: raise ValueError (your scales refuses it)", raises=ValueError),
    ]


def _ba(weights, x, run, bits, gs, n_grid, *, inverse=False, weight_err=False, stat="mean",
        last=False, per_layer=False, ties_last=False):
    if any(W.shape[1] % gs for W in weights):
        raise ValueError("group size must divide the inputs")
    if not torch.isfinite(x).all():
        raise ValueError("x holds NaN")
    mag = x.abs().mean(0) if stat == "mean" else x.abs().amax(0)
    alphas = [i / (n_grid - 1) for i in range(n_grid)] if last else [i / n_grid for i in range(n_grid)]
    ref = run(weights)
    best, best_a = float("inf"), None
    for a in alphas:
        s = awq.scales_for(mag, a)
        if inverse:
            eff = [cal.fake_quant(W / s[None, :], bits, gs) * s[None, :] for W in weights]
        else:
            eff = [cal.fake_quant(W * s[None, :], bits, gs) / s[None, :] for W in weights]
        if weight_err:
            err = sum(float((E - W).pow(2).mean()) for E, W in zip(eff, weights))
        elif per_layer:
            err = sum(float((x @ (E - W).T).pow(2).mean()) for E, W in zip(eff, weights))
        else:
            err = float((run(eff) - ref).pow(2).mean())
        if err < best or (ties_last and err == best):
            best, best_a = err, a
    return float(best_a)


def _wrong_ba_inverse(weights, x, run, bits=3, group_size=32, n_grid=10):      # Q(W / s) * s
    return _ba(weights, x, run, bits, group_size, n_grid, inverse=True)


def _wrong_ba_weight_error(weights, x, run, bits=3, group_size=32, n_grid=10): # on weights
    return _ba(weights, x, run, bits, group_size, n_grid, weight_err=True)


def _wrong_ba_per_layer(weights, x, run, bits=3, group_size=32, n_grid=10):    # each Linear's
    return _ba(weights, x, run, bits, group_size, n_grid, per_layer=True)      # own output


def _wrong_ba_max(weights, x, run, bits=3, group_size=32, n_grid=10):          # max |x|
    return _ba(weights, x, run, bits, group_size, n_grid, stat="max")


def _wrong_ba_inclusive(weights, x, run, bits=3, group_size=32, n_grid=10):    # i / (n - 1)
    return _ba(weights, x, run, bits, group_size, n_grid, last=True)


def _wrong_ba_ties_last(weights, x, run, bits=3, group_size=32, n_grid=10):    # <= keeps the
    return _ba(weights, x, run, bits, group_size, n_grid, ties_last=True)      # last tie


register(Exercise(
    id="07.best_alpha",
    title="AWQ's grid search: the alpha whose scaled-and-rounded weights change the block's "
          "output least",
    reference=best_alpha,
    cases=_ba_cases,
    hint=["For each alpha: which weights do the scaled Linears effectively use on the original "
          "inputs, and whose output do you compare: each Linear's, or what they feed together?",
          "alpha runs over i / n_grid for i = 0..n_grid-1. s = your scales of mean|x|; each "
          "effective weight is Q(W * s) / s (round-to-nearest in groups); the error is the mean "
          "of (run(effective weights) - run(weights)) ** 2. Keep the first alpha with the "
          "smallest error (a strict <).",
          "use course_lib.methods.calibration.fake_quant(W * s[None, :], bits, group_size) / "
          "s[None, :] for every W; return float(best_alpha)"],
    wrong=[_wrong_ba_inverse, _wrong_ba_weight_error, _wrong_ba_per_layer, _wrong_ba_max,
           _wrong_ba_inclusive, _wrong_ba_ties_last],
    rtol=0, atol=1e-9, float_results=True,       # the task: "as a Python float"
))
