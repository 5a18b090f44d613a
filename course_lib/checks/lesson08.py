"""Exercises of lesson 08, "SmoothQuant and W8A8" (solutions/08_smoothquant_w8a8.ipynb).

References are the library's own functions: ``course_lib.methods.smoothquant`` and
``course_lib.methods.w8a8`` (one source per algorithm).
"""
from __future__ import annotations

import torch

from course_lib.checks import Case, Exercise, register
from course_lib.methods import smoothquant, w8a8


def _r(*shape, seed=0, scale=1.0):
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- 08.smoothing_factors

def _factor_cases():
    a = _r(64, seed=1).abs() * 3 + 0.1
    a[[5, 40]] = torch.tensor([60.0, 90.0])                 # two outlier channels
    w = _r(64, seed=2).abs() * 0.2 + 0.01
    zeros_a = a.clone()
    zeros_a[3] = 0.0                                        # a channel that never fires
    zeros_w = w.clone()
    zeros_w[7] = 0.0                                        # a column of zero weights
    nan_w = w.clone()
    nan_w[9] = float("nan")
    return [
        Case((torch.tensor([64.0]), torch.tensor([0.5]), 0.5),
             label="the source's example: 64 and 0.5 at alpha 0.5 -> 11.3"),
        Case((a, w, 0.5), label="two outlier channels among 64, alpha 0.5"),
        Case((a, w, 0.8), label="alpha 0.8 (more of the difficulty moved into the weights)"),
        Case((a, w, 0.0), label="alpha 0: s = 1 / max|W|"),
        Case((a, w, 1.0), label="alpha 1: s = max|X|"),
        Case((zeros_a, zeros_w, 0.5), label="a zero activation max and a zero weight max: s = 1",
             hint="Where both maxima are 0, the task's s is 1: guard the 0 / 0."),
        Case((a, w, 1.5), label="alpha 1.5: raise ValueError", raises=ValueError),
        Case((a, w, 50), label="alpha 50 (a percent): raise ValueError", raises=ValueError),
        Case((a, w, float("nan")), label="alpha NaN: not in [0, 1], raise ValueError",
             raises=ValueError, hint="A NaN fails every comparison: `x < 0 or x > 1` lets it through, `not 0 <= x <= 1` does not."),
        Case((a.double(), w.double(), 0.5), label="float64 maxima: the factors are float32"),
        Case((a.half(), w.half(), 0.8), label="float16 maxima: computed in float32, not "
             "float16 and converted after",
             hint="Converting the result is too late: in which dtype were the maxima divided (or raised to a power)? Convert to float32 first."),
        Case((-a, w, 0.5), label="negative activation maxima (abs forgotten): raise ValueError",
             raises=ValueError),
        Case((a, nan_w, 0.5), label="a NaN weight maximum: raise ValueError", raises=ValueError),
    ]


def _wrong_f_nan_alpha(act, wmax, alpha=0.5):          # alpha checked with < and >: NaN passes
    if alpha < 0 or alpha > 1:
        raise ValueError("alpha in [0, 1]")
    return smoothquant.smoothing_factors(act, wmax, 0.5 if alpha != alpha else alpha)


def _wrong_f_in_half(act, wmax, alpha=0.5):            # powers taken in fp16, cast after
    if not 0 <= alpha <= 1 or bool((act < 0).any() | (wmax < 0).any()) or \
            not bool(torch.isfinite(act).all() & torch.isfinite(wmax).all()):
        raise ValueError("bad maxima")
    s = act.pow(alpha) / wmax.pow(1 - alpha)
    return torch.where((act > 0) & (wmax > 0), s, torch.ones_like(s)).float()


def _wrong_f_swapped(act, wmax, alpha=0.5):            # exponents swapped
    if not 0 <= alpha <= 1:
        raise ValueError("alpha in [0, 1]")
    s = act ** (1 - alpha) / wmax ** alpha
    return torch.where((act > 0) & (wmax > 0), s, torch.ones_like(s))


def _wrong_f_product(act, wmax, alpha=0.5):            # multiplied instead of divided
    if not 0 <= alpha <= 1:
        raise ValueError("alpha in [0, 1]")
    s = act ** alpha * wmax ** (1 - alpha)
    return torch.where((act > 0) & (wmax > 0), s, torch.ones_like(s))


def _wrong_f_ratio(act, wmax, alpha=0.5):              # (X / W) ** alpha: right only at 0.5
    if not 0 <= alpha <= 1:
        raise ValueError("alpha in [0, 1]")
    s = (act / wmax) ** alpha
    return torch.where((act > 0) & (wmax > 0), s, torch.ones_like(s))


def _wrong_f_no_guard(act, wmax, alpha=0.5):           # zero maxima give 0 or inf
    if not 0 <= alpha <= 1:
        raise ValueError("alpha in [0, 1]")
    return act ** alpha / wmax ** (1 - alpha)


def _wrong_f_input_dtype(act, wmax, alpha=0.5):        # float64 in, float64 out
    if not 0 <= alpha <= 1 or bool((act < 0).any() | (wmax < 0).any()) \
            or not bool(torch.isfinite(act).all() & torch.isfinite(wmax).all()):
        raise ValueError("bad input")
    s = act ** alpha / wmax ** (1 - alpha)
    return torch.where((act > 0) & (wmax > 0), s, torch.ones_like(s))


def _wrong_f_negative_ok(act, wmax, alpha=0.5):        # negative maxima give NaN factors
    if not 0 <= alpha <= 1:
        raise ValueError("alpha in [0, 1]")
    s = act.float() ** alpha / wmax.float() ** (1 - alpha)
    return torch.where((act != 0) & (wmax != 0), s, torch.ones_like(s))


register(Exercise(
    id="08.smoothing_factors",
    title="SmoothQuant's per-channel smoothing factors",
    reference=smoothquant.smoothing_factors,
    cases=_factor_cases,
    hint=["Dividing channel j of X by s_j and multiplying column j of W by s_j leaves X W^T "
          "unchanged. alpha says how much of the activation's range moves into the weight: "
          "what should s be at alpha = 1, and at alpha = 0?",
          "s = act_absmax ** alpha / weight_absmax ** (1 - alpha), elementwise (K,).",
          "Where either maximum is 0 there is nothing to balance: use s = 1 there "
          "(torch.where). Raise ValueError unless 0 <= alpha <= 1, and for negative, NaN or "
          "infinite maxima; return float32."],
    wrong=[_wrong_f_swapped, _wrong_f_product, _wrong_f_ratio, _wrong_f_no_guard,
           _wrong_f_input_dtype, _wrong_f_negative_ok, _wrong_f_in_half, _wrong_f_nan_alpha],
    rtol=1e-5, atol=1e-6,
))


# ---------------------------------------------------------------- 08.fold_scales

def _fold_reference(pred_weight, weights, s):
    new_pred, new_ws = smoothquant.fold_scales(pred_weight, weights, s)
    return new_pred, tuple(new_ws)          # the checker compares a list item by item this way


def _fold_cases():
    s = _r(16, seed=3).abs() + 0.5
    norm = _r(16, seed=4).abs() + 0.5
    q, k = _r(24, 16, seed=5), _r(8, 16, seed=6)
    up, down = _r(16, 12, seed=7), _r(12, 16, seed=8)      # up (K=16, in=12) -> down (12, 16)
    zero_s, nan_s = s.clone(), s.clone()
    zero_s[4] = 0.0
    nan_s[2] = float("nan")
    return [
        Case((torch.tensor([1.0, 2.0, 4.0]), [torch.ones(2, 3)], torch.tensor([2.0, 4.0, 0.5])),
             label="by hand: norm [1, 2, 4], s [2, 4, 0.5]"),
        Case((norm, [q, k], s), label="an RMSNorm before q_proj and k_proj (two weights)"),
        Case((up, [down], s), label="up_proj's rows before down_proj (a Linear predecessor)"),
        Case((norm, [q], torch.ones(16)), label="s = 1 changes nothing"),
        Case((norm, [q], -s), label="negative factors: raise ValueError", raises=ValueError),
        Case((norm, [q], zero_s), label="a zero factor: raise ValueError", raises=ValueError),
        Case((norm, [q], nan_s), label="a NaN factor: raise ValueError", raises=ValueError),
        Case((norm, [q, k], s.double()),
             label="float64 factors: the norm and the weights keep their dtype (float32)"),
    ]


def _wrong_fold_reversed(pred, weights, s):             # multiplied the predecessor
    if not bool((s > 0).all()):
        raise ValueError("s must be positive")
    p = pred * s.reshape(-1, *([1] * (pred.dim() - 1)))
    return p, [w / s[None, :] for w in weights]


def _wrong_fold_pred_columns(pred, weights, s):         # divided the Linear's columns
    if not bool((s > 0).all()):
        raise ValueError("s must be positive")
    p = pred / s if pred.dim() == 1 else pred / s[: pred.shape[1]][None, :]
    return p, [w * s[None, :] for w in weights]


def _wrong_fold_first_only(pred, weights, s):           # scaled only the first weight
    if not bool((s > 0).all()):
        raise ValueError("s must be positive")
    p = pred / s.reshape(-1, *([1] * (pred.dim() - 1)))
    return p, [weights[0] * s[None, :]] + [w.clone() for w in weights[1:]]


def _wrong_fold_weight_rows(pred, weights, s):          # scaled the weights' rows
    if not bool((s > 0).all()):
        raise ValueError("s must be positive")
    p = pred / s.reshape(-1, *([1] * (pred.dim() - 1)))
    return p, [w * s[: w.shape[0], None] if w.shape[0] <= s.numel() else w * s.mean()
               for w in weights]


def _wrong_fold_dtype(pred, weights, s):               # results follow s's dtype
    if not bool((s > 0).all()):
        raise ValueError("s must be positive")
    return pred / s.reshape(-1, *([1] * (pred.dim() - 1))), [w * s[None, :] for w in weights]


def _wrong_fold_nan_passes(pred, weights, s):          # `(s <= 0).any()` lets NaN through
    if bool((s <= 0).any()):
        raise ValueError("s must be positive")
    s = s.to(pred.dtype)
    return pred / s.reshape(-1, *([1] * (pred.dim() - 1))), [w * s[None, :] for w in weights]


register(Exercise(
    id="08.fold_scales",
    title="fold the smoothing factors into the predecessor and the weights",
    reference=_fold_reference,
    cases=_fold_cases,
    hint=["The predecessor's output channel j becomes input channel j of the next weights. "
          "One side must shrink by s_j, the other grow by s_j. Which dimension of an "
          "(out, K) weight is the input channel, and which of a (K, in) predecessor?",
          "pred_weight / s along its first dimension (s for a (K,) norm weight, s[:, None] for a "
          "(K, in) Linear weight); every following weight * s[None, :].",
          "Return (new_pred, [new_w, ...]) as new tensors in the weights' own dtype "
          "(s.to(pred_weight.dtype)); raise ValueError unless every s is positive and finite "
          "(NaN is not)."],
    wrong=[_wrong_fold_reversed, _wrong_fold_pred_columns, _wrong_fold_first_only,
           _wrong_fold_weight_rows, _wrong_fold_dtype, _wrong_fold_nan_passes],
    rtol=1e-6, atol=1e-7,
))


# ---------------------------------------------------------------- 08.quantize_static

def _static_reference(x, static_scale):
    return w8a8.quantize_activations(x, "int8", "static_per_tensor", static_scale)


def _static_cases():
    x = _r(6, 32, seed=9)
    calib_max = float(x.abs().max())
    spiky = x.clone()
    spiky[2, 3] = 5 * calib_max                             # beyond the calibrated range
    nan_x = x.clone()
    nan_x[4, 1] = float("nan")
    return [
        Case((torch.tensor([[0.5, -1.27, 3.0], [0.0, 0.01, -0.006]]), 0.01),
             label="by hand: scale 0.01, 3.0 is clipped to 127"),
        Case((x, calib_max / 127), label="calibrated on this very x: nothing clipped"),
        Case((spiky, calib_max / 127), label="a token beyond the calibrated range: clipped",
             hint="Values past the calibrated range: are their codes clamped to the largest one?"),
        Case((x, calib_max / 127 * 4), label="a generous scale: coarse codes"),
        Case((torch.zeros(3, 4), 0.05), label="an all-zero input"),
        Case((x, 0.0), label="scale 0: raise ValueError", raises=ValueError),
        Case((torch.tensor([[0.5, 1.5, 2.5, -0.5, -1.5, -2.5]]), 1.0),
             label="exact ties: round half to even (2.5 -> 2, -0.5 -> 0)",
             hint="Exactly half-way between two codes: which way does the task round? Half to even "
                  "(np.round, torch.round, Python's round); floor(x + 0.5) and rounding away from "
                  "zero do not."),
        Case((torch.tensor([[-5.0, 5.0, -1.28, 0.2]]), 0.01),
             label="clipped on both sides: -5.0 -> -127 (not -128), 5.0 -> 127",
             hint="Which codes does symmetric INT8 use: -127..127, never -128."),
        Case((nan_x, 0.05), label="a NaN in x: raise ValueError", raises=ValueError),
        Case((x, float("nan")), label="a NaN scale: raise ValueError", raises=ValueError),
        Case((x, float("inf")), label="an infinite scale: raise ValueError", raises=ValueError),
    ]


def _wrong_static_no_clamp(x, static_scale):            # int8 cast wraps beyond 127
    if not static_scale > 0:
        raise ValueError("static_scale must be positive")
    q = torch.round(x / static_scale).to(torch.int32).remainder(256)
    q = torch.where(q > 127, q - 256, q).to(torch.int8)
    return q, torch.full((x.shape[0],), float(static_scale))


def _wrong_static_dynamic(x, static_scale):             # per-token scales after all
    if not static_scale > 0:
        raise ValueError("static_scale must be positive")
    s = x.abs().amax(1) / 127
    s = torch.where(s == 0, torch.ones_like(s), s)
    return torch.round(x / s[:, None]).clamp(-127, 127).to(torch.int8), s


def _wrong_static_absmax(x, static_scale):              # treated the scale as max|x|
    if not static_scale > 0:
        raise ValueError("static_scale must be positive")
    s = static_scale / 127
    q = torch.round(x / s).clamp(-127, 127).to(torch.int8)
    return q, torch.full((x.shape[0],), float(s))


def _wrong_static_floor(x, static_scale):               # floor instead of round
    if not static_scale > 0:
        raise ValueError("static_scale must be positive")
    q = torch.floor(x / static_scale).clamp(-127, 127).to(torch.int8)
    return q, torch.full((x.shape[0],), float(static_scale))


def _ok_static(x, static_scale):
    if not 0 < static_scale < float("inf") or not bool(torch.isfinite(x).all()):
        raise ValueError("bad input")


def _wrong_static_half_away(x, static_scale):           # ties away from zero
    _ok_static(x, static_scale)
    y = x / static_scale
    q = (torch.sign(y) * torch.floor(y.abs() + 0.5)).clamp(-127, 127).to(torch.int8)
    return q, torch.full((x.shape[0],), float(static_scale))


def _wrong_static_clamp_128(x, static_scale):           # the int8 range, -128..127
    _ok_static(x, static_scale)
    q = torch.round(x / static_scale).clamp(-128, 127).to(torch.int8)
    return q, torch.full((x.shape[0],), float(static_scale))


def _wrong_static_nan_passes(x, static_scale):          # NaN becomes a code silently
    if not 0 < static_scale < float("inf"):
        raise ValueError("bad scale")
    q = torch.round(x.nan_to_num(0) / static_scale).clamp(-127, 127).to(torch.int8)
    return q, torch.full((x.shape[0],), float(static_scale))


def _wrong_static_inf_scale(x, static_scale):           # `static_scale > 0` accepts inf
    if not static_scale > 0 or not bool(torch.isfinite(x).all()):
        raise ValueError("bad input")
    q = torch.round(x / static_scale).clamp(-127, 127).to(torch.int8)
    return q, torch.full((x.shape[0],), float(static_scale))


register(Exercise(
    id="08.quantize_static",
    title="static per-tensor INT8 activations (a calibrated scale, clipping)",
    reference=_static_reference,
    cases=_static_cases,
    hint=["The scale was fixed on calibration text, so a new token may hold values beyond "
          "127 * scale. What must happen to them before they become int8?",
          "q = round(x / static_scale), clamped to [-127, 127], as int8; the scale of every "
          "row is static_scale.",
          "Return (q, scales) with scales = torch.full((rows,), static_scale) float32; raise "
          "ValueError unless 0 < static_scale < inf, and when x holds NaN or inf."],
    wrong=[_wrong_static_no_clamp, _wrong_static_dynamic, _wrong_static_absmax,
           _wrong_static_floor, _wrong_static_half_away, _wrong_static_clamp_128,
           _wrong_static_nan_passes, _wrong_static_inf_scale],
    rtol=1e-6, atol=0,
))
