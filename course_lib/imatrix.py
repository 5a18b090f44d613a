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


def _check_windows(model: nn.Module, windows, what: str = "windows") -> None:
    """Refuse what a course model cannot run: not a 2-D integer tensor of token ids, ids
    outside the vocabulary, windows longer than the model's context."""
    if not isinstance(windows, torch.Tensor):
        raise ValueError(f"{what} must be token ids (n_windows, tokens), a torch integer tensor "
                         f"(torch.as_tensor for an array or a list); got "
                         f"{type(windows).__name__}"
                         f"{f' of shape {windows.shape}' if hasattr(windows, 'shape') else ''}")
    if windows.dim() != 2 or windows.numel() == 0 or windows.is_floating_point() \
            or windows.is_complex() or windows.dtype == torch.bool:
        raise ValueError(f"{what} must be token ids (n_windows, tokens), a non-empty 2-D integer "
                         f"tensor; got {tuple(windows.shape)} {windows.dtype}")
    cfg = getattr(model, "config", None)
    vocab = getattr(cfg, "vocab_size", None)
    lo, hi = int(windows.min()), int(windows.max())
    if lo < 0 or (isinstance(vocab, int) and hi >= vocab):
        raise ValueError(f"{what}: token id out of range: ids span [{lo}, {hi}] but the "
                         f"vocabulary has {vocab} entries (valid ids 0..{vocab - 1}): were they "
                         f"made by another model's tokenizer?")
    context = getattr(cfg, "max_position_embeddings", None)
    if isinstance(context, int) and windows.shape[1] > context:
        raise ValueError(f"{what} are {windows.shape[1]} tokens long, past the model's context "
                         f"of {context} positions (config.max_position_embeddings): use windows "
                         f"of at most {context} tokens")


def collect(model: nn.Module, windows: torch.Tensor, progress: bool = False) -> dict:
    """The importance vector of every Linear of the decoder layers: the mean squared input of
    each column over every token of ``windows`` (n, T) (each window run on its own, as
    llama-imatrix runs chunks of 512 tokens). Returns {module name: (in,) float32}."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a course LlamaModel (an nn.Module); got "
                        f"{type(model).__name__}")
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be True or False; got {progress!r}")
    _check_windows(model, windows)
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
    out = {n: (s / count["n"]).float() for n, s in sums.items()}
    for n, v in out.items():
        if not torch.isfinite(v).all():
            raise ValueError(f"the importance vector of {n} holds NaN or inf: the model's "
                             f"activations overflowed or its weights are not finite; check the "
                             f"model (e.g. run it in float32) before collecting")
    return out


def from_inputs(x: torch.Tensor) -> torch.Tensor:
    """The importance vector of one Linear from its captured inputs x (..., in): the mean of
    x^2 over every token, per column (in,)."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be captured inputs (..., tokens, in) as floats, a torch tensor "
                         f"(torch.from_numpy for an array); got {type(x).__name__}")
    if x.dim() < 2 or not x.is_floating_point():
        raise ValueError(f"x must be captured inputs (..., tokens, in) as floats; got "
                         f"{tuple(x.shape)} {x.dtype}")
    if x.numel() == 0:
        raise ValueError(f"x must be captured inputs (..., tokens, in) with at least one token "
                         f"and one column; got shape {tuple(x.shape)}")
    if not torch.isfinite(x).all():
        raise ValueError("x holds NaN or inf: capture the inputs of a model with finite weights")
    x = x.reshape(-1, x.shape[-1]).double()
    return (x * x).mean(0).float()


def gguf_names(imx: dict) -> dict:
    """{course module name: vector} -> {GGUF tensor name: vector} (what the writer takes)."""
    from course_lib.gguf_model import GGUF_TO_HF
    if not isinstance(imx, dict):
        raise TypeError(f"imx must be a dict {{course module name: importance vector}} (what "
                        f"imatrix.collect returns); got {type(imx).__name__}")
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
    args = {}
    for name, t in (("w", w), ("w_q", w_q), ("imx", imx)):
        if isinstance(t, (str, bytes, dict)) or t is None:
            raise TypeError(f"{name} must be a tensor or array of numbers; got {type(t).__name__}")
        try:
            args[name] = torch.as_tensor(t).double()
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"{name} must be a tensor or array of numbers; got "
                            f"{type(t).__name__}") from None
    w, w_q, imx = args["w"], args["w_q"], args["imx"]
    if w.shape != w_q.shape or w.dim() != 2 or imx.shape != (w.shape[1],):
        raise ValueError(f"need w and w_q of one shape (out, in) and imx (in,); got "
                         f"{tuple(w.shape)}, {tuple(w_q.shape)}, {tuple(imx.shape)}")
    for name, t in args.items():
        if not torch.isfinite(t).all():
            raise ValueError(f"{name} holds NaN or inf: the weighted error would be NaN; find "
                             f"where they come from")
    if (imx < 0).any():
        raise ValueError(f"imx holds mean squared activations, never negative; got a minimum of "
                         f"{float(imx.min()):g}")
    return float((((w_q - w) ** 2).sum(0) * imx).sum())
