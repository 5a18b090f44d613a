"""SmoothQuant: move the activation outliers into the weights, then quantize both (lesson 08).

Paper: Xiao et al., "SmoothQuant", ICML 2023 (arXiv:2211.10438).

A Linear computes y = x W^T. Shrink input channel j of x by a factor s_j and grow column j of
W by the same factor: (x / s) (W * s)^T = x W^T, whatever s is. The paper's choice,

    s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)          # quotation: SmoothQuant, eq. 4

(X's maximum over calibration tokens, W's over the output rows; the paper uses alpha = 0.5 for
most models), leaves channel j with an activation maximum of max|X_j|^(1-alpha) max|W_j|^(1-alpha)
and a weight maximum of max|X_j|^alpha max|W_j|^alpha; at alpha = 0.5 the two are equal.

The division of x by s is free at run time when the layer that *produced* x absorbs it. Groups
(a predecessor and the Linears that read its output), in every decoder block:

- reference groups, smoothed by default (the paper's code and llm-compressor's default Llama
  mappings): ``input_layernorm`` -> q/k/v_proj and ``post_attention_layernorm`` -> gate/up_proj
  (divide the RMSNorm's weight by s);
- ``extra="down_proj"``: ``up_proj`` -> ``down_proj``. down's input is silu(gate) * up, linear in
  each of up's output rows, so up's rows absorb 1/s (neither reference smooths this pair);
- ``extra="o_proj"``: ``v_proj`` -> ``o_proj``. Attention's output for head h is a
  softmax-weighted sum of the value vectors of the KV head it reads, so each of its channels is
  linear in the matching row of v_proj: v's rows absorb 1/s (llm-awq scales this pair for AWQ).
  With grouped-query attention, H query heads share K < H KV heads: channel d of KV head g
  feeds channel d of all H/K query heads that read it, so those H/K channels of o_proj's input
  must share one factor. :func:`gqa_share` takes the maxima over the heads that share a
  factor, :func:`gqa_expand` copies the K*head_dim factors out to o_proj's H*head_dim columns.

llm-compressor's ``SmoothQuantModifier`` (0.14.0.1, ``modifiers/transform/smoothquant/base.py``)
differs from the paper's formula in two details and one default: it takes each activation
channel's range max - min over the calibration tokens instead of max|X| (lines 345-348), twice
the largest |W| on the weight side (lines 404-415), and ``smoothing_strength`` 0.5 by default
(line 107; lesson 08's 0.8 for llm-compressor is the course's choice, in
``tools/llm_compressor_reference.py``). For a channel symmetric about 0 its s is
2**(2 alpha - 1) times the paper's: equal at 0.5, about 1.5x at 0.8 (lesson 08 computes it).

Taught by :func:`smoothing_factors`, :func:`fold_scales`, :func:`fold_groups`,
:func:`smooth_model`.
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn

# (predecessor, the Linears reading its output) inside every decoder block
REFERENCE_GROUPS = (("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj",
                                         "self_attn.v_proj")),
                    ("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj")))
#: Optional groups beyond the reference: name -> (predecessor, Linears)
EXTRA_GROUPS = {"down_proj": ("mlp.up_proj", ("mlp.down_proj",)),
                "o_proj": ("self_attn.v_proj", ("self_attn.o_proj",))}
#: Every group (the old name; the reference groups and both extras)
BLOCK_GROUPS = REFERENCE_GROUPS + tuple(EXTRA_GROUPS.values())


def _check_extra(extra) -> tuple[str, ...]:
    if isinstance(extra, str):
        extra = (extra,)
    extra = tuple(extra)
    bad = [e for e in extra if e not in EXTRA_GROUPS]
    if bad:
        raise ValueError(f"extra must name groups among {list(EXTRA_GROUPS)} (the reference "
                         f"groups are always smoothed); got {bad}")
    return tuple(e for e in EXTRA_GROUPS if e in extra)          # a fixed order


def _check_alpha(alpha) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
        raise ValueError(f"alpha is the migration strength and must lie in [0, 1], a fraction "
                         f"(0.5 in the paper, not 50); got {alpha!r}")
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


def fold_groups(model: nn.Module, extra=()) -> list[tuple[str, list[str]]]:
    """[(predecessor name, [Linear names])] for every group smoothed in a Llama model (lesson 08):
    the reference groups of each block, then the ``extra`` ones ("down_proj", "o_proj")."""
    extra = _check_extra(extra)
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError("fold_groups needs a Llama-layout model (model.model.layers[i] with "
                         "input_layernorm, self_attn.q/k/v_proj, post_attention_layernorm, "
                         "mlp.gate/up/down_proj), such as course_lib.model.LlamaModel")
    kinds = REFERENCE_GROUPS + tuple(EXTRA_GROUPS[e] for e in extra)
    return [(f"model.layers.{i}.{pred}", [f"model.layers.{i}.{n}" for n in lins])
            for i in range(len(layers)) for pred, lins in kinds]


def foldable_linears(model: nn.Module, extra=tuple(EXTRA_GROUPS)) -> list[str]:
    """Names of the Linears :func:`smooth_model` can smooth (with ``extra``: all by default)."""
    return [n for _, names in fold_groups(model, extra) for n in names]


def _heads(x: torch.Tensor, n_heads: int, n_kv_heads: int, what: str) -> int:
    for v, name in ((n_heads, "n_heads"), (n_kv_heads, "n_kv_heads")):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a whole number >= 1; got {v!r}")
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads}): "
                         f"each KV head serves the same number of query heads")
    x = torch.as_tensor(x)
    if x.dim() != 1 or x.numel() % n_heads:
        raise ValueError(f"{what} must be 1-D with a length that is a multiple of n_heads = "
                         f"{n_heads}; got shape {tuple(x.shape)}")
    return x.numel() // n_heads                                             # head_dim


def gqa_share(per_channel: torch.Tensor, n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """Per-channel maxima over o_proj's input (H*hd,) -> (K*hd,): for channel d of KV head g,
    the largest value over the H/K query heads that read it (lesson 08)."""
    hd = _heads(per_channel, n_heads, n_kv_heads, "per_channel")
    rep = n_heads // n_kv_heads
    x = torch.as_tensor(per_channel).reshape(n_kv_heads, rep, hd)           # (K, H/K, hd)
    return x.amax(dim=1).reshape(-1)                                        # (K*hd,)


def gqa_expand(s: torch.Tensor, n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """Factors of v_proj's rows (K*hd,) -> factors of o_proj's columns (H*hd,): query head h
    reads KV head h // (H/K), as the model's ``repeat_interleave`` does (lesson 08)."""
    s = torch.as_tensor(s)
    _heads(torch.zeros(n_heads if isinstance(n_heads, int) else 1), n_heads, n_kv_heads, "s")
    if s.dim() != 1 or s.numel() % n_kv_heads:
        raise ValueError(f"s must be 1-D with a length that is a multiple of n_kv_heads = "
                         f"{n_kv_heads}; got shape {tuple(s.shape)}")
    hd = s.numel() // n_kv_heads
    rep = n_heads // n_kv_heads
    return s.reshape(n_kv_heads, 1, hd).expand(n_kv_heads, rep, hd).reshape(-1)  # (H*hd,)


def _attention_heads(model: nn.Module, block: str) -> tuple[int, int]:
    attn = model.get_submodule(f"{block}.self_attn")
    cfg = getattr(model, "config", None)
    H = getattr(attn, "H", None) or getattr(cfg, "num_attention_heads", None)
    K = getattr(attn, "K", None) or getattr(cfg, "num_key_value_heads", None)
    if H is None or K is None:
        raise ValueError("smoothing o_proj through v_proj needs the number of query and KV heads "
                         "(attention modules with .H and .K, or model.config)")
    return int(H), int(K)


@torch.no_grad()
def calibrate_absmax(model: nn.Module, ids: torch.Tensor, names=None,
                     batch_size: int = 8) -> dict[str, torch.Tensor]:
    """Per-channel max |x| of each Linear's input on calibration ids (B, T): {name: (K,)}.

    Uses ``course_lib.activations`` (hooks) on the unsmoothed model; ``names`` default: one
    Linear per group, extras included (the others of a group share its input)."""
    from course_lib import activations

    if names is None:
        names = [lins[0] for _, lins in fold_groups(model, tuple(EXTRA_GROUPS))]
    acts = activations.capture_linear_inputs(model, ids, names=names, batch_size=batch_size)
    return {n: s["absmax"] for n, s in activations.channel_stats(acts).items()}


def _group_of(model, name: str):
    for pred, lins in fold_groups(model, tuple(EXTRA_GROUPS)):
        if name in lins:
            return pred, lins
    kinds = ", ".join(n.rsplit(".", 1)[-1] for _, lins in BLOCK_GROUPS for n in lins)
    raise ValueError(f"{name!r} has no foldable predecessor in this course (it leaves lm_head "
                     f"unquantized). Smoothable Linears: {kinds}")


@torch.no_grad()
def smooth_model(model: nn.Module, act_absmax: dict, alpha: float = 0.5, layers=None,
                 inplace: bool = False, extra=()):
    """Fold SmoothQuant's factors into a copy of ``model`` (lesson 08). Returns (model, {pred: s}).

    act_absmax: {Linear name: (K,) max |x| per input channel} from :func:`calibrate_absmax`
    (any Linear of a group will do: they share the input). extra: groups beyond the reference
    ones, "down_proj" (through up_proj) and/or "o_proj" (through v_proj, one factor per
    channel of a KV head, shared by its query heads). layers: Linear names to smooth (default:
    every group smoothed); naming one Linear of a group smooths the whole group, and naming an
    extra group's Linear smooths it even when ``extra`` does not list it. In float the smoothed
    model computes the same function (tests check the logits); only quantization afterwards
    sees the difference.
    """
    alpha = _check_alpha(alpha)
    extra = _check_extra(extra)
    if not isinstance(act_absmax, dict):
        raise TypeError(f"act_absmax must be a dict {{Linear name: (K,) maxima}} from "
                        f"calibrate_absmax(model, ids); got {type(act_absmax).__name__}")
    groups = fold_groups(model, extra)
    if layers is not None:
        if isinstance(layers, str):
            raise TypeError("layers takes a list of Linear names")
        wanted = {_group_of(model, n)[0] for n in layers}
        groups = [g for g in fold_groups(model, tuple(EXTRA_GROUPS)) if g[0] in wanted]
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
        w_max = weight_absmax(*[lin.weight for lin in lins])                  # (K,)
        if pred_name.endswith("self_attn.v_proj"):       # GQA: one factor per KV-head channel
            H, Kv = _attention_heads(model, pred_name.rsplit(".", 2)[0])
            s = smoothing_factors(gqa_share(torch.as_tensor(stat).float(), H, Kv),
                                  gqa_share(w_max, H, Kv), alpha)              # (Kv*hd,)
            s_cols = gqa_expand(s, H, Kv)                                      # (H*hd,)
        else:
            s = s_cols = smoothing_factors(stat, w_max, alpha)                 # (K,)
        new_pred, _ = fold_scales(pred.weight, [], s)
        pred.weight.copy_(new_pred)                    # RMSNorm (K,) or Linear rows (K, in)
        if getattr(pred, "bias", None) is not None:
            pred.bias.div_(s.to(pred.bias.dtype))
        for lin in lins:
            lin.weight.mul_(s_cols.to(lin.weight.dtype)[None, :])             # (out, K)
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
