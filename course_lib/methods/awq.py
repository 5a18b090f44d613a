"""AWQ, activation-aware weight quantization (lesson 07). Lin, Tang, Tang, Yang, Dang, Gan, Han,
2023 (arXiv:2306.00978; MLSys 2024).

Which weights deserve care is decided by the inputs, not by the weights: an input channel that
carries large activations multiplies every weight in its column, so a rounding error there is
amplified in the output. Putting back in 16 bits the 1% of columns with the largest mean |x|
removes much of the damage; the same number of columns picked by weight size or at random
barely helps (:func:`keep_salient`).

Serving a few 16-bit columns among 4-bit ones needs special kernels, so AWQ scales instead:
input column c of the weight is multiplied by s_c > 1 and the matching activation divided by
s_c. The product is unchanged, and the enlarged column loses less to rounding relative to its
size. Per decoder block:

1. mean |x| per input channel for each set of Linears reading one input (q/k/v, gate/up,
   down) on the calibration text (:func:`channel_magnitude`);
2. for alpha on a grid in [0, 1): s = mean|x|^alpha, quantize W * s, divide the input by s, and
   measure the error of what those Linears feed (the attention, the MLP, the down projection);
   keep the best alpha (:func:`search_scale`);
3. fold 1/s into the operation before: the RMSNorm's weight, or the rows of ``up_proj`` for
   ``down_proj`` (:func:`fold_scale`), so the unquantized model computes exactly what it did;
   optionally (``scale_o_proj``) the rows of ``v_proj`` for ``o_proj``: attention is linear in
   the values, channel by channel, so a scale on a value channel passes through the softmax
   weighting unchanged; under grouped-query attention one KV head serves several query heads,
   so those heads' channels of ``o_proj`` must share the value channel's scale
   (:func:`kv_expand`). llm-awq scales o_proj only when v_proj and o_proj are square (no
   GQA), which is why it is off by default here;
4. optionally, the paper's clipping search: shrink each group's range where that lowers the
   group's output error (:func:`search_clip`);
5. round to nearest on a grid (the course's symmetric one by default; ``symmetric=False``
   gives zero points as llm-awq's code uses; llama.cpp's Q4_0/Q4_1 with ``grid=``).

Two deviations from llm-awq's reference code, both offered as options: blocks are calibrated
on the outputs of the blocks already quantized (``inputs="quantized"``, as GPTQ's code does;
llm-awq feeds every block the unquantized model's activations, ``inputs="fp"``), and the
default grid is symmetric (llm-awq's is asymmetric, with zero points: ``symmetric=False``).
At INT3 the symmetric grid has 7 levels and the zero-point grid 8, so a zero-point gain mixes
asymmetry with one more level; ``grid="llm-compressor"`` (absmax / 3.5, codes -4..3: 8 levels,
a range centred on 0) separates the two (lesson 07).

llm-compressor's ``AWQModifier`` (0.14.0.1, ``modifiers/transform/awq/``) is another variant:
by default s = mean|x|^alpha / mean(w)^(1 - alpha) ("duo scaling", ``base.py:150``,
``672-679``; mean(w): each input channel's mean of |w| over its group's largest |w|), no clipping
search, and default Llama mappings that include v_proj -> o_proj (``mappings.py:44``), skipped
where their sizes differ, as under grouped-query attention (``base.py:984-1013``).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from course_lib import quant
from course_lib.methods import calibration as cal
from course_lib.model import RMSNorm

#: Where each group's scales are folded, and what its error is measured on (decoder blocks).
DEFAULT_GRID = 20          # alphas tried: 0, 1/20, ..., 19/20 (llm-awq's n_grid)
SALIENT_BY = ("activation", "weight", "random")


# ----------------------------------------------------------------------------- saliency
def channel_magnitude(x: torch.Tensor) -> torch.Tensor:
    """Mean |x| per input channel of inputs x (..., in): (in,) fp32 (lesson 07)."""
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        raise ValueError("x must be a tensor of activations (..., in)")
    x = x.reshape(-1, x.shape[-1]).float()                                   # (N, in)
    if x.shape[0] == 0:
        raise ValueError("no activations: capture some calibration inputs first")
    if not torch.isfinite(x).all():
        raise ValueError("the activations hold NaN or inf: check the model and its inputs")
    return x.abs().mean(0)                                                   # (in,)


def salient_channels(W: torch.Tensor, x: torch.Tensor, frac: float = 0.01,
                     by: str = "activation", seed: int = 0) -> torch.Tensor:
    """Indices of the ``frac`` most salient input channels (at least one) of weight W (out, in)
    judged by the activations x (N, in), the weight's own magnitude, or at random."""
    if by not in SALIENT_BY:
        raise ValueError(f"by must be one of {SALIENT_BY}; got {by!r}")
    if not 0 < frac <= 1:
        raise ValueError(f"frac must be in (0, 1] (0.01 keeps 1%); got {frac}")
    k = max(1, round(frac * W.shape[1]))
    if by == "activation" and x.shape[-1] != W.shape[1]:
        raise ValueError(f"x has {x.shape[-1]} channels but W has {W.shape[1]} inputs")
    if by == "activation":
        score = channel_magnitude(x)                                         # (in,)
    elif by == "weight":
        score = W.float().abs().mean(0)                                      # (in,)
    else:
        score = torch.rand(W.shape[1], generator=torch.Generator().manual_seed(seed))
    return torch.topk(score, k).indices.sort().values


def keep_salient(W: torch.Tensor, keep: torch.Tensor, bits: int = 3, group_size: int = 128,
                 symmetric: bool = True) -> torch.Tensor:
    """Round W (out, in) to nearest, then put the ``keep`` input channels back in full precision
    (the paper's 1% experiment; lesson 07)."""
    keep = torch.as_tensor(keep)
    if keep.numel() and (int(keep.min()) < 0 or int(keep.max()) >= W.shape[1]):
        raise ValueError(f"keep holds channel indices outside 0..{W.shape[1] - 1}")
    Wq = quant.fake_quantize(W.float(), f"int{bits}", "per_group", group_size, symmetric)
    Wq[:, keep] = W.float()[:, keep]
    return Wq


# ----------------------------------------------------------------------------- scale search
def scales_for(magnitude: torch.Tensor, alpha: float) -> torch.Tensor:
    """s = mean|x|^alpha, normalised so that max(s) * min(s) = 1 (as the paper's code does;
    the normalisation does not change which alpha wins, only keeps s near 1). (in,)"""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be a number in [0, 1] (0: no scaling, 1: s = mean|x|); "
                         f"got {alpha!r}")
    if not isinstance(magnitude, torch.Tensor) or magnitude.dim() != 1 or magnitude.numel() == 0 \
            or not torch.isfinite(magnitude).all() or bool((magnitude < 0).any()):
        raise ValueError("magnitude must be a non-empty 1-D tensor of mean |x| per input "
                         "channel (finite, >= 0): channel_magnitude(x)")
    s = magnitude.clamp(min=1e-4).pow(alpha)                                 # (in,)
    return s / (s.max() * s.min()).sqrt()


def scaled_fake_quant(W: torch.Tensor, s: torch.Tensor, bits: int, group_size: int,
                      symmetric: bool | None = None, grid="course") -> torch.Tensor:
    """Q(W * s) / s: the weight the scaled layer effectively uses on unscaled inputs, Q being
    round-to-nearest on ``grid`` (see :func:`course_lib.methods.calibration.get_grid`)."""
    Ws = W.float() * s[None, :]                                              # (out, in)
    return cal.fake_quant(Ws, bits, group_size, symmetric, grid) / s[None, :]


@torch.no_grad()
def search_scale(lins: list[nn.Linear], magnitude: torch.Tensor, run, bits: int = 4,
                 group_size: int = 128, symmetric: bool | None = None,
                 n_grid: int = DEFAULT_GRID, grid="course", expand=None):
    """Grid search of alpha for Linears sharing one input (lesson 07).

    magnitude: mean |x| of that input (in,); run(): the output the Linears feed (the attention,
    the MLP, the projection itself), computed with their current weights. Each alpha in
    0, 1/n_grid, ..., (n_grid-1)/n_grid sets every Linear's weight to Q(W s) / s (Q: round to
    nearest on ``grid``), runs, and compares with the unquantized output (mean squared error).
    Weights are restored afterwards. expand: maps s to the Linears' inputs when the scale is
    shared (o_proj's query heads sharing one value channel, :func:`kv_expand`).
    Returns (best s (in,), best alpha, errors: list of (alpha, mse)).
    """
    if isinstance(n_grid, bool) or not isinstance(n_grid, int) or n_grid < 1:
        raise ValueError(f"n_grid (the number of alphas tried) must be a whole number >= 1; "
                         f"got {n_grid!r}")
    originals = [lin.weight.data.clone() for lin in lins]
    ref = run()
    errors = []
    best = (float("inf"), None, None)
    try:
        for i in range(n_grid):
            alpha = i / n_grid
            s = scales_for(magnitude, alpha)
            s_in = s if expand is None else expand(s)
            for lin, W in zip(lins, originals):
                lin.weight.data = scaled_fake_quant(W, s_in, bits, group_size, symmetric,
                                                    grid).to(W.dtype)
            err = float((run() - ref).float().pow(2).mean())
            errors.append((alpha, err))
            if err < best[0]:
                best = (err, alpha, s)
    finally:
        for lin, W in zip(lins, originals):
            lin.weight.data = W
    return best[2], best[1], errors


def folded(prev_weight: torch.Tensor, weights: list[torch.Tensor], s: torch.Tensor):
    """The folding arithmetic (lesson 07): an RMSNorm weight (in,) divided by s, and each
    following Linear's weight (out, in) with its input columns multiplied by s. Returns
    (new norm weight, (new weights, ...))."""
    if not torch.isfinite(s).all() or bool((s <= 0).any()):
        raise ValueError("the scales s must be finite and > 0 (a zero scale cannot be divided "
                         "out of the norm)")
    if prev_weight.shape != s.shape or any(W.dim() != 2 or W.shape[1] != s.shape[0]
                                           for W in weights):
        raise ValueError(f"s ({tuple(s.shape)}) must match the norm weight "
                         f"({tuple(prev_weight.shape)}) and each weight's inputs "
                         f"{[tuple(W.shape) for W in weights]}")
    return prev_weight / s, tuple(W * s[None, :] for W in weights)


def kv_expand(n_kv_heads: int, n_heads: int, head_dim: int):
    """The map from a scale on v_proj's outputs (n_kv_heads * head_dim,) to o_proj's inputs
    (n_heads * head_dim,) under grouped-query attention (lesson 07): query head h reads KV head
    h // (n_heads / n_kv_heads), so its channels take that KV head's scales."""
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
    rep = n_heads // n_kv_heads

    def expand(s):
        if s.shape != (n_kv_heads * head_dim,):
            raise ValueError(f"a value-channel scale must have {n_kv_heads * head_dim} entries "
                             f"(n_kv_heads x head_dim); got {tuple(s.shape)}")
        return s.view(n_kv_heads, 1, head_dim).expand(n_kv_heads, rep, head_dim).reshape(-1)
    return expand


def kv_magnitude(magnitude: torch.Tensor, n_kv_heads: int, n_heads: int, head_dim: int):
    """o_proj's mean |x| per input (n_heads * head_dim,) averaged over the query heads that
    share a KV head: one magnitude per value channel (n_kv_heads * head_dim,) (lesson 07)."""
    rep = n_heads // n_kv_heads
    return magnitude.view(n_kv_heads, rep, head_dim).mean(1).reshape(-1)


def fold_scale(prev: nn.Module, lins: list[nn.Linear], s: torch.Tensor, expand=None) -> None:
    """Divide what ``prev`` outputs by s and multiply the Linears' input columns by s, in place
    (lesson 07). prev: an RMSNorm (its weight) or a Linear (its output rows and bias).
    s must be finite and > 0. expand: maps s (prev's outputs) to the Linears' inputs when they differ (v_proj's value
    channels to o_proj's query-head channels, :func:`kv_expand`).
    Without quantization the model computes the same thing."""
    if not isinstance(s, torch.Tensor) or s.dim() != 1 or not torch.isfinite(s).all() \
            or bool((s <= 0).any()):
        raise ValueError("s must be a 1-D tensor of finite scales > 0")
    if isinstance(prev, RMSNorm) or (hasattr(prev, "weight") and prev.weight.dim() == 1):
        prev.weight.data = prev.weight.data / s.to(prev.weight.dtype)
    elif isinstance(prev, nn.Linear):
        prev.weight.data = prev.weight.data / s[:, None].to(prev.weight.dtype)
        if prev.bias is not None:
            prev.bias.data = prev.bias.data / s.to(prev.bias.dtype)
    else:
        raise TypeError(f"cannot fold a scale into {type(prev).__name__}: only RMSNorm or Linear")
    if expand is not None:
        s = expand(s)
    for lin in lins:
        if lin.weight.shape[1] != s.shape[0]:
            raise ValueError(f"scale of {s.shape[0]} channels for a Linear with "
                             f"{lin.weight.shape[1]} inputs")
        lin.weight.data = lin.weight.data * s[None, :].to(lin.weight.dtype)


# ----------------------------------------------------------------------------- clipping
@torch.no_grad()
def search_clip(W: torch.Tensor, x: torch.Tensor, bits: int = 4, group_size: int = 128,
                symmetric: bool | None = None, n_grid: int = 20, max_shrink: float = 0.5,
                n_tokens: int = 512, rows_per_batch: int = 256, grid="course") -> torch.Tensor:
    """The paper's clipping search (lesson 07): for each (row, group), the range shrink
    r in 1, 1 - 1/n_grid, ... (down to 1 - max_shrink) whose clamped-and-rounded weights (round
    to nearest on ``grid``) give the smallest error on that group's share of the output,
    sum_c W[o, c] x[t, c], over ``n_tokens`` calibration tokens. Returns W clamped to the
    chosen ranges (out, in)."""
    gr = cal.get_grid(grid)
    sym = gr.check(bits, group_size, symmetric)
    if isinstance(n_grid, bool) or not isinstance(n_grid, int) or n_grid < 1:
        raise ValueError(f"n_grid must be a whole number >= 1; got {n_grid!r}")
    if not 0 <= max_shrink < 1:
        raise ValueError(f"max_shrink must be in [0, 1) (0.5: ranges down to half); "
                         f"got {max_shrink}")
    out_f, in_f = W.shape
    G = in_f // cal.check_group_size(in_f, group_size)
    if x.shape[-1] != in_f:
        raise ValueError(f"x has {x.shape[-1]} channels but W has {in_f} inputs")
    xs = x.reshape(-1, in_f).float()
    xs = xs[::max(1, xs.shape[0] // n_tokens)][:n_tokens]                    # (t, in)
    xg = xs.T.reshape(G, group_size, -1)                                     # (G, gs, t)
    out = torch.empty(G, out_f, group_size)
    for r0 in range(0, out_f, rows_per_batch):
        w = W[r0:r0 + rows_per_batch].float().view(-1, G, group_size).transpose(0, 1)  # (G, b, gs)
        ref = w @ xg                                                         # (G, b, t)
        hi0, lo0 = w.amax(-1, keepdim=True), w.amin(-1, keepdim=True)        # (G, b, 1)
        best_err = torch.full(w.shape[:2], float("inf"))                     # (G, b)
        best_w = w.clone()
        for i in range(int(max_shrink * n_grid) + 1):
            r = 1 - i / n_grid
            if sym:
                m = torch.maximum(hi0.abs(), lo0.abs()) * r
                wc = torch.maximum(torch.minimum(w, m), -m)
            else:
                hi, lo = hi0 * r, lo0 * r
                if gr.name == "course":         # the course's asymmetric range holds 0
                    hi, lo = hi.clamp(min=0), lo.clamp(max=0)
                wc = torch.maximum(torch.minimum(w, hi), lo)
            wq = cal.fake_quant_groups(wc, bits, sym, gr)                    # (G, b, gs)
            err = (wq @ xg - ref).pow(2).mean(-1)                            # (G, b)
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_w = torch.where(better[..., None], wc, best_w)
        out[:, r0:r0 + rows_per_batch] = best_w
    return out.transpose(0, 1).reshape(out_f, in_f).to(W.dtype)


# ----------------------------------------------------------------------------- a whole block
@torch.no_grad()
def _capture_inputs(block: nn.Module, x, cos, sin, batch_size: int):
    """Inputs of every Linear of a block on x (n, T, D), each (n, T, in)."""
    store: dict[str, list] = {}
    handles = [m.register_forward_pre_hook(
        lambda m, i, name=n: store.setdefault(name, []).append(i[0].detach()))
        for n, m in cal.linears(block).items()]
    try:
        for i in range(0, x.shape[0], batch_size):
            block(x[i:i + batch_size], cos, sin)
    finally:
        for h in handles:
            h.remove()
    return {n: torch.cat(v) for n, v in store.items()}


@torch.no_grad()
def awq_block(block: nn.Module, x: torch.Tensor, cos, sin, bits: int = 4,
              group_size: int = 128, symmetric: bool | None = None,
              n_grid: int = DEFAULT_GRID, clip: bool = True, search_windows: int = 8,
              batch_size: int = 16, scale_dtype: torch.dtype | None = None,
              log: dict | None = None, grid="course", scale_o_proj: bool = False) -> None:
    """AWQ on one Llama decoder block in place (lesson 07): scale search and folding for
    q/k/v (into input_layernorm), gate/up (into post_attention_layernorm) and down (into
    up_proj); optional clipping; then round-to-nearest on ``grid`` into GroupQuantLinear
    (grid: "course", "llm-compressor", "q4_0", "q4_1", see
    :func:`course_lib.methods.calibration.get_grid`; symmetric None: the grid's own).

    o_proj: scaled only with ``scale_o_proj=True``, its scale folded into v_proj's output rows
    (attention mixes value vectors over positions with weights that do not depend on V, so a
    per-channel factor on V comes out of the attention unchanged). Under grouped-query
    attention (both course models) a KV head serves several query heads, so o_proj's inputs
    from those heads share one scale per value channel (:func:`kv_expand`): a constraint, not
    an impossibility. llm-awq applies this scale only when v_proj and o_proj are square (no
    GQA), so the default here, like llm-awq on GQA models, leaves o_proj unscaled.
    """
    symmetric = cal.get_grid(grid).check(bits, group_size, symmetric, scale_dtype)
    attn, mlp = block.self_attn, block.mlp
    feats = _capture_inputs(block, x, cos, sin, batch_size)                  # fp block inputs
    n = min(search_windows, x.shape[0])
    xa = feats["self_attn.q_proj"][:n]                                       # (n, T, D)
    xm = feats["mlp.gate_proj"][:n]                                          # (n, T, D)
    expand = kv_expand(attn.K, attn.H, attn.hd)
    groups = [
        ("attn", block.input_layernorm, [attn.q_proj, attn.k_proj, attn.v_proj],
         "self_attn.q_proj", lambda: attn(xa, cos, sin)),
        ("out", attn.v_proj, [attn.o_proj], "self_attn.o_proj",
         lambda: attn.o_proj(feats["self_attn.o_proj"][:n])),
        ("mlp", block.post_attention_layernorm, [mlp.gate_proj, mlp.up_proj],
         "mlp.gate_proj", lambda: mlp(xm)),
        ("down", mlp.up_proj, [mlp.down_proj], "mlp.down_proj",
         lambda: mlp.down_proj(feats["mlp.down_proj"][:n])),
    ]
    for key, prev, lins, feat_name, run in groups:
        if key == "out" and not scale_o_proj:
            continue
        ex = expand if key == "out" else None
        mag = channel_magnitude(feats[feat_name])
        if ex is not None:                   # one magnitude per value channel (GQA)
            mag = kv_magnitude(mag, attn.K, attn.H, attn.hd)
        s, alpha, errors = search_scale(lins, mag, run, bits, group_size, symmetric, n_grid,
                                       grid, ex)
        fold_scale(prev, lins, s, ex)
        s_in = s if ex is None else ex(s)
        for name in [feat_name] + (["mlp.up_proj"] if key == "mlp" else []) + \
                (["self_attn.k_proj", "self_attn.v_proj"] if key == "attn" else []):
            feats[name] = feats[name] / s_in                                 # inputs are now x / s
        if log is not None:
            log[key] = {"alpha": alpha, "errors": errors, "s": s}
    for name, lin in cal.linears(block).items():
        if clip and not name.endswith(("q_proj", "k_proj")):   # q.k scores: the paper keeps them
            lin.weight.data = search_clip(lin.weight.data, feats[name], bits, group_size,
                                          symmetric, grid=grid)
        cal.replace(block, name, cal.rtn_linear(lin, bits, group_size, symmetric, scale_dtype,
                                                method="awq", grid=grid))


def awq_model(model: nn.Module, ids: torch.Tensor, bits: int = 4, group_size: int = 128,
              symmetric: bool | None = None, n_grid: int = DEFAULT_GRID, clip: bool = True,
              search_windows: int = 8, batch_size: int = 16,
              scale_dtype: torch.dtype | None = None, progress: bool = False,
              n_blocks: int | None = None, log: list | None = None, grid="course",
              inputs: str = "quantized", scale_o_proj: bool = False):
    """AWQ on every decoder block, block by block on calibration windows ``ids`` (n, T)
    (lesson 07). Returns ``(quantized copy, seconds)``; ``log`` collects, per block and per
    group ("attn", "mlp", "down"), the chosen alpha, the errors of the n_grid alphas tried and
    the scales s. grid: the quantization grid; scale_o_proj: also scale o_proj through v_proj
    (see :func:`awq_block`). inputs: "quantized" (default: each block calibrated on the
    quantized blocks' outputs) or "fp" (llm-awq's reference: the unquantized model's)."""
    symmetric = cal.check_model(model, bits, group_size, symmetric, grid, scale_dtype)

    def quantize_block(block, x, cos, sin):
        entry: dict = {}
        awq_block(block, x, cos, sin, bits, group_size, symmetric, n_grid, clip,
                  search_windows, batch_size, scale_dtype, entry, grid, scale_o_proj)
        if log is not None:
            log.append(entry)

    return cal.quantize_blockwise(model, ids, quantize_block, batch_size, progress=progress,
                                  desc="AWQ", n_blocks=n_blocks, inputs=inputs)


def effective_weights(block: nn.Module, entry: dict) -> dict[str, torch.Tensor]:
    """What each quantized Linear of an AWQ block computes, in the unscaled model's terms
    (lesson 07): the stored weight with the folded scales taken back out, (out, in) fp32: its
    input columns multiplied back by 1/s of its group, and up_proj's rows by the down group's s
    (folded there for down_proj), and likewise o_proj and v_proj's rows for the "out" scale
    when o_proj was scaled. Comparable with the original weight, on the original inputs.
    ``entry``: that block's ``log`` entry from :func:`awq_model`."""
    group_of = {"self_attn.q_proj": "attn", "self_attn.k_proj": "attn",
                "self_attn.v_proj": "attn", "mlp.gate_proj": "mlp", "mlp.up_proj": "mlp",
                "mlp.down_proj": "down", "self_attn.o_proj": "out"}
    attn = block.self_attn
    expand = kv_expand(attn.K, attn.H, attn.hd)
    out = {}
    for name, lin in block.named_modules():
        if isinstance(lin, cal.GroupQuantLinear):
            W = lin.dequantized()                                            # (out, in)
            key = group_of.get(name)
            if key in entry:
                s = entry[key]["s"]
                W = W / (expand(s) if key == "out" else s)[None, :]
            if name == "mlp.up_proj" and "down" in entry:
                W = W * entry["down"]["s"][:, None]
            if name == "self_attn.v_proj" and "out" in entry:
                W = W * entry["out"]["s"][:, None]
            out[name] = W
    return out


@torch.no_grad()
def scale_model(model: nn.Module, scales: list[dict[str, torch.Tensor]]) -> nn.Module:
    """Fold given per-block scales {"attn", "out", "mlp", "down"} into a copy of the model without
    quantizing (lesson 07's check that folding leaves the model's outputs unchanged)."""
    import copy
    model = copy.deepcopy(model)
    for block, sc in zip(model.model.layers, scales):
        a, m = block.self_attn, block.mlp
        if "attn" in sc:
            fold_scale(block.input_layernorm, [a.q_proj, a.k_proj, a.v_proj], sc["attn"])
        if "out" in sc:
            fold_scale(a.v_proj, [a.o_proj], sc["out"], kv_expand(a.K, a.H, a.hd))
        if "mlp" in sc:
            fold_scale(block.post_attention_layernorm, [m.gate_proj, m.up_proj], sc["mlp"])
        if "down" in sc:
            fold_scale(m.up_proj, [m.down_proj], sc["down"])
    return model
