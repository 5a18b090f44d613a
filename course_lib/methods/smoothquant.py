"""SmoothQuant: move the activation outliers into the weights, then quantize both (lesson 08).

Paper: G. Xiao, J. Lin, M. Seznec, H. Wu, J. Demouth, S. Han, "SmoothQuant: Accurate and
Efficient Post-Training Quantization for Large Language Models", ICML 2023.

A Linear computes y = x W^T. Divide input channel j of x by s_j and multiply column j of W by
the same s_j: the product is unchanged, (x / s) (W * s)^T = x W^T. With

    s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)

(max over calibration tokens for X, over output rows for W; alpha = 0.5 "a well-balanced
point") the channel's activation maximum becomes max|X_j|^(1-alpha) max|W_j|^(1-alpha) and its
weight maximum max|X_j|^alpha max|W_j|^alpha: at alpha 0.5 both are sqrt(max|X_j| max|W_j|).

Dividing x by s costs nothing at run time when it is *folded* into whatever produced x:

- an RMSNorm's weight (input_layernorm -> q/k/v_proj, post_attention_layernorm -> gate/up_proj);
- the rows of the Linear before (up_proj -> down_proj: down's input is silu(gate) * up, linear
  in up's output).

o_proj has no such predecessor here (its input comes out of attention), so it is refused.
Taught by :func:`smoothing_factors`, :func:`fold_scales`, :func:`fold_groups`,
:func:`smooth_model`.
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn

# (predecessor, the Linears reading its output) inside every decoder block
BLOCK_GROUPS = (("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
                ("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj")),
                ("mlp.up_proj", ("mlp.down_proj",)))


def _check_alpha(alpha) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
        raise ValueError(f"alpha is the migration strength and must lie in [0, 1] (0.5 in the "
                         f"paper); got {alpha!r}")
    return float(alpha)


def smoothing_factors(act_absmax, weight_absmax, alpha: float = 0.5) -> torch.Tensor:
    """s_j = max|X_j|^alpha / max|W_j|^(1 - alpha), one per input channel (lesson 08).

    act_absmax, weight_absmax: (K,) non-negative per-channel maxima. A channel whose
    activation or weight maximum is 0 gets s = 1 (nothing to balance). Example from the
    source: 64 and 0.5 at alpha 0.5 -> s = 8 / 0.707 = 11.3.
    """
    alpha = _check_alpha(alpha)
    a = torch.as_tensor(act_absmax, dtype=torch.float32)
    w = torch.as_tensor(weight_absmax, dtype=torch.float32)
    if a.dim() != 1 or a.shape != w.shape:
        raise ValueError(f"act_absmax and weight_absmax must both be (K,) per-channel maxima; got "
                         f"{tuple(a.shape)} and {tuple(w.shape)} (the calibration activations' "
                         f"width must match the layer's in_features)")
    if not bool(torch.isfinite(a).all() & torch.isfinite(w).all()) or bool((a < 0).any()) \
            or bool((w < 0).any()):
        raise ValueError("maxima must be finite and non-negative (take .abs() before .amax())")
    s = a.pow(alpha) / w.pow(1 - alpha)                                   # (K,)
    return torch.where((a > 0) & (w > 0), s, torch.ones_like(s))


def fold_scales(pred_weight: torch.Tensor, weights, s: torch.Tensor):
    """Fold factors s (K,) into a predecessor and the Linears after it (lesson 08).

    pred_weight: an RMSNorm weight (K,), or a Linear weight (K, in) whose K output rows feed
    the K input channels; weights: the (out, K) weights that read those channels. Returns
    (pred_weight / s, [w * s for w in weights]): the predecessor's output channel j shrinks by
    s_j and every column j of the following weights grows by s_j, so their product is
    unchanged. New tensors; nothing is modified in place.
    """
    s = torch.as_tensor(s)
    if s.dim() != 1 or pred_weight.shape[0] != s.shape[0]:
        raise ValueError(f"s must be (K,) with K = pred_weight.shape[0] = {pred_weight.shape[0]}; "
                         f"got {tuple(s.shape)}")
    if not bool(torch.isfinite(s).all()) or bool((s <= 0).any()):
        raise ValueError("smoothing factors must be finite and positive")
    bad = [tuple(w.shape) for w in weights if w.dim() != 2 or w.shape[1] != s.shape[0]]
    if bad:
        raise ValueError(f"every following weight must be (out, {s.shape[0]}); got {bad}")
    s = s.to(pred_weight.dtype)
    pred = pred_weight / s.reshape(-1, *([1] * (pred_weight.dim() - 1)))   # (K,) or (K, in)
    return pred, [w * s[None, :] for w in weights]                          # (out, K) each


def weight_absmax(*weights: torch.Tensor) -> torch.Tensor:
    """max |W[:, j]| over the output rows of every weight reading the same input: (K,)."""
    return torch.cat([w.detach().abs() for w in weights], dim=0).amax(dim=0).float()


def fold_groups(model: nn.Module) -> list[tuple[str, list[str]]]:
    """[(predecessor name, [Linear names])] for every foldable group of a Llama model (lesson 08)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError("fold_groups needs a Llama-layout model (model.model.layers[i] with "
                         "input_layernorm, self_attn.q/k/v_proj, post_attention_layernorm, "
                         "mlp.gate/up/down_proj), such as course_lib.model.LlamaModel")
    return [(f"model.layers.{i}.{pred}", [f"model.layers.{i}.{n}" for n in lins])
            for i in range(len(layers)) for pred, lins in BLOCK_GROUPS]


def foldable_linears(model: nn.Module) -> list[str]:
    """Names of the Linears :func:`smooth_model` can smooth."""
    return [n for _, names in fold_groups(model) for n in names]


@torch.no_grad()
def calibrate_absmax(model: nn.Module, ids: torch.Tensor, names=None,
                     batch_size: int = 8) -> dict[str, torch.Tensor]:
    """Per-channel max |x| of each Linear's input on calibration ids (B, T): {name: (K,)}.

    Uses ``course_lib.activations`` (hooks) on the unsmoothed model; ``names`` default: the
    foldable Linears, one per group (the others of a group share its input)."""
    from course_lib import activations

    if names is None:
        names = [lins[0] for _, lins in fold_groups(model)]
    acts = activations.capture_linear_inputs(model, ids, names=names, batch_size=batch_size)
    return {n: s["absmax"] for n, s in activations.channel_stats(acts).items()}


def _group_of(model, name: str):
    for pred, lins in fold_groups(model):
        if name in lins:
            return pred, lins
    kinds = ", ".join(n.rsplit(".", 1)[-1] for _, lins in BLOCK_GROUPS for n in lins)
    raise ValueError(f"{name!r} has no foldable predecessor: nothing before it can absorb 1/s "
                     f"for free (o_proj's input comes out of attention, and this course leaves "
                     f"lm_head unquantized). Smoothable Linears: {kinds}")


@torch.no_grad()
def smooth_model(model: nn.Module, act_absmax: dict, alpha: float = 0.5, layers=None,
                 inplace: bool = False):
    """Fold SmoothQuant's factors into a copy of ``model`` (lesson 08). Returns (model, {pred: s}).

    act_absmax: {Linear name: (K,) max |x| per input channel} from :func:`calibrate_absmax`
    (any Linear of a group will do: they share the input). layers: Linear names to smooth
    (default: every foldable group); naming one Linear of a group smooths the whole group,
    since its members share one input. In float the smoothed model computes the same function
    (a test checks the logits); only quantization afterwards sees the difference.
    """
    alpha = _check_alpha(alpha)
    groups = fold_groups(model)
    if layers is not None:
        if isinstance(layers, str):
            raise TypeError("layers takes a list of Linear names")
        wanted = {_group_of(model, n)[0] for n in layers}
        groups = [g for g in groups if g[0] in wanted]
    if not inplace:
        model = copy.deepcopy(model)
    factors = {}
    for pred_name, lin_names in groups:
        pred = model.get_submodule(pred_name)
        lins = [model.get_submodule(n) for n in lin_names]
        stat = next((act_absmax[n] for n in lin_names if n in act_absmax), None)
        if stat is None:
            raise ValueError(f"no calibration maxima for {lin_names[0]} (pass act_absmax from "
                             f"calibrate_absmax(model, ids))")
        K = lins[0].in_features
        if torch.as_tensor(stat).shape != (K,):
            raise ValueError(f"calibration maxima for {lin_names[0]} have shape "
                             f"{tuple(torch.as_tensor(stat).shape)} but the layer has {K} input "
                             f"features: were they captured on another model?")
        s = smoothing_factors(stat, weight_absmax(*[lin.weight for lin in lins]), alpha)  # (K,)
        new_pred, new_ws = fold_scales(pred.weight, [lin.weight for lin in lins], s)
        pred.weight.copy_(new_pred)                    # RMSNorm (K,) or up_proj rows (K, in)
        if getattr(pred, "bias", None) is not None:
            pred.bias.div_(s.to(pred.bias.dtype))
        for lin, w in zip(lins, new_ws):
            lin.weight.copy_(w)                                            # (out, K)
        factors[pred_name] = s
    return model, factors


def smoothed_maxima(act_absmax, weight_absmax_, alpha: float):
    """(activation max, weight max) of each channel after smoothing at alpha (lesson 08's plot)."""
    s = smoothing_factors(act_absmax, weight_absmax_, alpha)
    return torch.as_tensor(act_absmax).float() / s, torch.as_tensor(weight_absmax_).float() * s


def worked_example(x_max: float = 64.0, w_max: float = 0.5, alpha: float = 0.5) -> dict:
    """The source's example: a channel reaching 64 in X and 0.5 in W, at alpha 0.5 -> s ~ 11.3,
    both maxima ~ 5.66 (lesson 08)."""
    s = float(smoothing_factors(torch.tensor([x_max]), torch.tensor([w_max]), alpha)[0])
    return {"s": s, "act_max": x_max / s, "weight_max": w_max * s,
            "balanced": math.sqrt(x_max * w_max)}
