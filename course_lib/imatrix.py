"""The importance matrix: how much each input column of each Linear matters (lesson 14).

llama.cpp's ``llama-imatrix`` tool runs the model on calibration text and keeps, for every
matrix multiplication, the mean of the *squared* input activation of each column:
``imatrix_j = (1 / N) * sum_t x_tj^2`` over the N tokens seen. The quantizer then weights the
squared rounding error of weight ``W_ij`` by it (times a term from the weight itself) when it
searches each block's scale (every format but Q8_0, which ignores it), so columns that see
large inputs get the accurate codes. ``llama-imatrix`` came with llama.cpp's PR #4861; the
weighting with PR #4930 (k-quants) and PR #4969 (Q4_0, Q4_1, Q5_0, Q5_1).

The same number appears in two earlier lessons in other roles:

- GPTQ (lesson 06) uses the Hessian of the layer's output error, ``H = (2 / N) X^T X``
  (``course_lib.methods.gptq.hessian``): its diagonal is ``2 * imatrix``. GPTQ uses all of H
  (the correlations between columns too) to *update* the weights not yet rounded; the
  importance matrix keeps only the diagonal and changes no weight, only how each is rounded.
- AWQ (lesson 07) ranks columns by the mean *absolute* input ``mean_t |x_tj|``
  (``course_lib.methods.awq.channel_magnitude``) and rescales the salient ones before rounding.

A Linear's output error from a weight error ``dW`` is ``dW x``; its expected square, when the
input columns are uncorrelated, is ``sum_j imatrix_j * ||dW[:, j]||^2``: :func:`weighted_error`,
the cheap proxy that lesson 14's bit allocation uses between measured points.
"""
from __future__ import annotations

import torch
from torch import nn


def _linears(model: nn.Module) -> dict[str, nn.Linear]:
    """The Linears inside the decoder layers (the head is left out: tied to the embedding)."""
    return {n: m for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and ".layers." in f".{n}."}


def collect(model: nn.Module, windows: torch.Tensor, progress: bool = False) -> dict:
    """The importance vector of every Linear of the decoder layers: the mean squared input of
    each column over every token of ``windows`` (n, T) (each window run on its own, as
    llama-imatrix runs chunks of 512 tokens). Returns {module name: (in,) float32}."""
    if not isinstance(windows, torch.Tensor) or windows.dim() != 2 or windows.numel() == 0 \
            or windows.is_floating_point():
        raise ValueError(f"windows must be token ids (n_windows, tokens); got "
                         f"{getattr(windows, 'shape', type(windows).__name__)}")
    mods = _linears(model)
    if not mods:
        raise ValueError("the model has no Linear inside .layers.: is it a course LlamaModel?")
    sums = {n: torch.zeros(m.in_features, dtype=torch.float64) for n, m in mods.items()}
    count = {"n": 0}

    def hook(name):
        def f(mod, inputs):
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).double()   # (N, in)
            sums[name] += (x * x).sum(0)
        return f

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in mods.items()]
    it = range(windows.shape[0])
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc="importance matrix", unit="window")
    try:
        with torch.no_grad():
            for i in it:
                model(windows[i:i + 1])
                count["n"] += windows.shape[1]
    finally:
        for h in handles:
            h.remove()
    return {n: (s / count["n"]).float() for n, s in sums.items()}


def from_inputs(x: torch.Tensor) -> torch.Tensor:
    """The importance vector of one Linear from its captured inputs x (..., in): the mean of
    x^2 over every token, per column (in,)."""
    if not isinstance(x, torch.Tensor) or x.dim() < 2 or not x.is_floating_point():
        raise ValueError(f"x must be captured inputs (..., tokens, in) as floats; got "
                         f"{getattr(x, 'shape', type(x).__name__)}")
    if not torch.isfinite(x).all():
        raise ValueError("x holds NaN or inf: capture the inputs of a model with finite weights")
    x = x.reshape(-1, x.shape[-1]).double()
    return (x * x).mean(0).float()


def gguf_names(imx: dict) -> dict:
    """{course module name: vector} -> {GGUF tensor name: vector} (what the writer takes)."""
    from course_lib.gguf_model import GGUF_TO_HF
    back = {}
    for g, h in GGUF_TO_HF.items():
        back[h[:-len(".weight")]] = g
    out = {}
    for name, v in imx.items():
        parts = name.split(".")
        if len(parts) > 3 and parts[:2] == ["model", "layers"]:
            key = "model.layers.{i}." + ".".join(parts[3:])
            if key in back:
                out[back[key].format(i=parts[2])] = v.numpy() if hasattr(v, "numpy") else v
                continue
        raise ValueError(f"{name!r} is not a decoder-layer Linear of a llama model")
    return out


def weighted_error(w: torch.Tensor, w_q: torch.Tensor, imx: torch.Tensor) -> float:
    """sum_j imx_j * ||w_q[:, j] - w[:, j]||^2: the expected squared output error of a Linear
    whose weight w (out, in) is replaced by w_q, for inputs with mean squares imx (in,) and
    uncorrelated columns."""
    w, w_q, imx = (torch.as_tensor(t).double() for t in (w, w_q, imx))
    if w.shape != w_q.shape or w.dim() != 2 or imx.shape != (w.shape[1],):
        raise ValueError(f"need w and w_q of one shape (out, in) and imx (in,); got "
                         f"{tuple(w.shape)}, {tuple(w_q.shape)}, {tuple(imx.shape)}")
    return float((((w_q - w) ** 2).sum(0) * imx).sum())
