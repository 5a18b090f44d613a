"""AWQ: activation-aware weight quantization (lesson 07). Lin, Tang, Tang, Yang, Dang, Gan, Han,
"AWQ: Activation-aware Weight Quantization for On-Device LLM Compression and Acceleration",
2023 (arXiv:2306.00978; MLSys 2024).

The observation: the weights that matter are those multiplied by large activations. Keeping
the 1% of input channels with the largest mean |x| in 16 bits recovers much of the error;
keeping 1% chosen by weight magnitude or at random does not (:func:`keep_salient`).

Mixed precision is awkward to serve, so AWQ scales instead: multiply input channel c of the
weight by s_c > 1 and divide the activation by s_c. The product is unchanged, but the scaled
weights lose less to rounding (relative to their size). The steps, per decoder block:

1. mean |x| per input channel of each group of Linears that share an input (q/k/v, gate/up,
   down) on the calibration text (:func:`channel_magnitude`);
2. for alpha on a grid in [0, 1): s = mean|x|^alpha, quantize W * s, divide the input by s, and
   measure the error of what those Linears feed (the attention, the MLP, the down projection);
   keep the best alpha (:func:`search_scale`);
3. fold 1/s into the operation before: the RMSNorm's weight, or the rows of ``up_proj`` for
   ``down_proj`` (:func:`fold_scale`): the unquantized model computes exactly what it did;
4. optionally, the paper's clipping search: shrink each group's range where that lowers the
   group's output error (:func:`search_clip`);
5. round to nearest: the codes a serving engine stores.
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
    x = x.reshape(-1, x.shape[-1]).float()                                   # (N, in)
    if x.shape[0] == 0:
        raise ValueError("no activations: capture some calibration inputs first")
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
                 n_grid: int = DEFAULT_GRID, grid="course"):
    """Grid search of alpha for Linears sharing one input (lesson 07).

    magnitude: mean |x| of that input (in,); run(): the output the Linears feed (the attention,
    the MLP, the projection itself), computed with their current weights. Each alpha in
    0, 1/n_grid, ..., (n_grid-1)/n_grid sets every Linear's weight to Q(W s) / s (Q: round to
    nearest on ``grid``), runs, and compares with the unquantized output (mean squared error).
    Weights are restored afterwards.
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
            for lin, W in zip(lins, originals):
                lin.weight.data = scaled_fake_quant(W, s, bits, group_size, symmetric,
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
    if prev_weight.shape != s.shape or any(W.dim() != 2 or W.shape[1] != s.shape[0]
                                           for W in weights):
        raise ValueError(f"s ({tuple(s.shape)}) must match the norm weight "
                         f"({tuple(prev_weight.shape)}) and each weight's inputs "
                         f"{[tuple(W.shape) for W in weights]}")
    return prev_weight / s, tuple(W * s[None, :] for W in weights)


def fold_scale(prev: nn.Module, lins: list[nn.Linear], s: torch.Tensor) -> None:
    """Divide what ``prev`` outputs by s and multiply the Linears' input columns by s, in place
    (lesson 07). prev: an RMSNorm (its weight) or a Linear (its output rows and bias).
    Without quantization the model computes the same thing."""
    if isinstance(prev, RMSNorm) or (hasattr(prev, "weight") and prev.weight.dim() == 1):
        prev.weight.data = prev.weight.data / s.to(prev.weight.dtype)
    elif isinstance(prev, nn.Linear):
        prev.weight.data = prev.weight.data / s[:, None].to(prev.weight.dtype)
        if prev.bias is not None:
            prev.bias.data = prev.bias.data / s.to(prev.bias.dtype)
    else:
        raise TypeError(f"cannot fold a scale into {type(prev).__name__}: only RMSNorm or Linear")
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
              log: dict | None = None, grid="course") -> None:
    """AWQ on one Llama decoder block in place (lesson 07): scale search and folding for
    q/k/v (into input_layernorm), gate/up (into post_attention_layernorm) and down (into
    up_proj); optional clipping; then round-to-nearest on ``grid`` into GroupQuantLinear
    (grid: "course", "llm-compressor", "q4_0", "q4_1", see
    :func:`course_lib.methods.calibration.get_grid`; symmetric None: the grid's own).

    o_proj is not scaled: its input comes from the attention's value heads, and with grouped
    query attention (both course models) v_proj has fewer outputs than o_proj has inputs,
    so there is no per-channel place to fold a scale (the paper's code skips it too).
    """
    symmetric = cal.get_grid(grid).check(bits, group_size, symmetric, scale_dtype)
    attn, mlp = block.self_attn, block.mlp
    feats = _capture_inputs(block, x, cos, sin, batch_size)                  # fp block inputs
    n = min(search_windows, x.shape[0])
    xa = feats["self_attn.q_proj"][:n]                                       # (n, T, D)
    xm = feats["mlp.gate_proj"][:n]                                          # (n, T, D)
    groups = [
        ("attn", block.input_layernorm, [attn.q_proj, attn.k_proj, attn.v_proj],
         "self_attn.q_proj", lambda: attn(xa, cos, sin)),
        ("mlp", block.post_attention_layernorm, [mlp.gate_proj, mlp.up_proj],
         "mlp.gate_proj", lambda: mlp(xm)),
        ("down", mlp.up_proj, [mlp.down_proj], "mlp.down_proj",
         lambda: mlp.down_proj(feats["mlp.down_proj"][:n])),
    ]
    for key, prev, lins, feat_name, run in groups:
        mag = channel_magnitude(feats[feat_name])
        s, alpha, errors = search_scale(lins, mag, run, bits, group_size, symmetric, n_grid,
                                       grid)
        fold_scale(prev, lins, s)
        for name in [feat_name] + (["mlp.up_proj"] if key == "mlp" else []) + \
                (["self_attn.k_proj", "self_attn.v_proj"] if key == "attn" else []):
            feats[name] = feats[name] / s                                    # inputs are now x / s
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
              n_blocks: int | None = None, log: list | None = None, grid="course"):
    """AWQ on every decoder block, block by block on calibration windows ``ids`` (n, T)
    (lesson 07). Returns ``(quantized copy, seconds)``; ``log`` collects, per block and per
    group ("attn", "mlp", "down"), the chosen alpha, the errors of the n_grid alphas tried and
    the scales s. grid: the quantization grid (see :func:`awq_block`)."""
    symmetric = cal.check_model(model, bits, group_size, symmetric, grid, scale_dtype)

    def quantize_block(block, x, cos, sin):
        entry: dict = {}
        awq_block(block, x, cos, sin, bits, group_size, symmetric, n_grid, clip,
                  search_windows, batch_size, scale_dtype, entry, grid)
        if log is not None:
            log.append(entry)

    return cal.quantize_blockwise(model, ids, quantize_block, batch_size, progress=progress,
                                  desc="AWQ", n_blocks=n_blocks)


def effective_weights(block: nn.Module, entry: dict) -> dict[str, torch.Tensor]:
    """What each quantized Linear of an AWQ block computes, in the unscaled model's terms
    (lesson 07): the stored weight with the folded scales taken back out, (out, in) fp32: its
    input columns multiplied back by 1/s of its group, and up_proj's rows by the down group's s
    (folded there for down_proj). Comparable with the original weight, on the original inputs.
    ``entry``: that block's ``log`` entry from :func:`awq_model`. o_proj has no scale."""
    group_of = {"self_attn.q_proj": "attn", "self_attn.k_proj": "attn",
                "self_attn.v_proj": "attn", "mlp.gate_proj": "mlp", "mlp.up_proj": "mlp",
                "mlp.down_proj": "down"}
    out = {}
    for name, lin in block.named_modules():
        if isinstance(lin, cal.GroupQuantLinear):
            W = lin.dequantized()                                            # (out, in)
            key = group_of.get(name)
            if key in entry:
                W = W / entry[key]["s"][None, :]
            if name == "mlp.up_proj" and "down" in entry:
                W = W * entry["down"]["s"][:, None]
            out[name] = W
    return out


@torch.no_grad()
def scale_model(model: nn.Module, scales: list[dict[str, torch.Tensor]]) -> nn.Module:
    """Fold given per-block scales {"attn", "mlp", "down"} into a copy of the model without
    quantizing (lesson 07's check that folding leaves the model's outputs unchanged)."""
    import copy
    model = copy.deepcopy(model)
    for block, sc in zip(model.model.layers, scales):
        a, m = block.self_attn, block.mlp
        if "attn" in sc:
            fold_scale(block.input_layernorm, [a.q_proj, a.k_proj, a.v_proj], sc["attn"])
        if "mlp" in sc:
            fold_scale(block.post_attention_layernorm, [m.gate_proj, m.up_proj], sc["mlp"])
        if "down" in sc:
            fold_scale(m.up_proj, [m.down_proj], sc["down"])
    return model
