"""What flows into each Linear: capture, per-channel statistics, outlier channels, plots (lesson 04).

Weights are fixed and easy to inspect; activations only exist while the model runs. Forward
pre-hooks on every ``nn.Linear`` record its input on some calibration text:

    acts = capture_linear_inputs(model, ids)          # {name: (tokens, in_features)}
    stats = channel_stats(acts)                       # {name: {"absmax": (in,), ...}}
    outlier_table(stats)                              # which layers have outlier channels

Outlier channels (a few input features far larger than the rest, for every token) are why
activation quantization is hard and what SmoothQuant and AWQ work around (lessons 06-07).
"""
from __future__ import annotations

import torch
import torch.nn as nn


def _linear_modules(model: nn.Module, names=None):
    from course_lib.qmodel import FakeQuantLinear, PackedLinear
    kinds = (nn.Linear, FakeQuantLinear, PackedLinear)
    mods = [(n, m) for n, m in model.named_modules() if isinstance(m, kinds)]
    if names is not None:
        known = [n for n, _ in mods]
        missing = [n for n in names if n not in known]
        if missing:
            raise ValueError(f"no Linear named {missing}; known: {known[:8]}"
                             f"{' ...' if len(known) > 8 else ''}")
        mods = [(n, m) for n, m in mods if n in names]
    if not mods:
        raise ValueError("the model has no nn.Linear layers to hook")
    return mods


@torch.no_grad()
def capture_linear_inputs(model: nn.Module, ids: torch.Tensor, names=None,
                          batch_size: int = 16) -> dict[str, torch.Tensor]:
    """Run ``model`` on ids (B, T) and return each Linear's input flattened to (B*T, in_features).

    ``names``: only these Linears (default all). Hooks are removed afterwards, even on error.
    """
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"ids must be a torch tensor (token ids (B, T) for a language model, "
                        f"or the inputs of any other model); got {type(ids).__name__}")
    if hasattr(model, "config") and (ids.is_floating_point() or ids.dtype == torch.bool):
        raise TypeError(f"ids must be an integer tensor of token ids (B, T) for a language "
                        f"model; got {ids.dtype}")
    if ids.numel() == 0:
        raise ValueError("ids is empty: give the model some calibration tokens")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number >= 1; got {batch_size!r}")
    if ids.dim() == 1:
        ids = ids[None]
    store: dict[str, list[torch.Tensor]] = {}
    handles = []
    for name, mod in _linear_modules(model, names):
        def hook(module, inputs, name=name):
            x = inputs[0].detach()                                          # (b, T, in)
            store.setdefault(name, []).append(x.reshape(-1, x.shape[-1]).float())
        handles.append(mod.register_forward_pre_hook(hook))
    try:
        for i in range(0, ids.shape[0], batch_size):
            model(ids[i:i + batch_size])
    finally:
        for h in handles:
            h.remove()
    return {n: torch.cat(v) for n, v in store.items()}                      # (N, in) each


def channel_stats(acts: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """Per input channel: max |x| over tokens, mean |x| and RMS, each (in_features,)."""
    out = {}
    for n, x in acts.items():                                               # x: (N, in)
        if x.dim() != 2 or x.shape[0] == 0:
            raise ValueError(f"{n}: activations must be (tokens, channels) with at least one "
                             f"token; got shape {tuple(x.shape)}")
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{n}: activations hold NaN or inf; check the model's outputs first")
        out[n] = {"absmax": x.abs().amax(0), "mean_abs": x.abs().mean(0),
                  "rms": x.pow(2).mean(0).sqrt()}
    return out


def outlier_channels(absmax: torch.Tensor, ratio: float = 5.0) -> torch.Tensor:
    """Indices of channels whose max |x| exceeds ``ratio`` times the median channel's max."""
    if not ratio > 0:
        raise ValueError(f"ratio must be positive; got {ratio}")
    absmax = torch.as_tensor(absmax)
    if absmax.dim() != 1 or absmax.numel() == 0:
        raise ValueError(f"absmax must be a non-empty 1-D tensor, one max |x| per channel; got "
                         f"shape {tuple(absmax.shape)} (for activations (tokens, channels) pass "
                         f"x.abs().amax(dim=0))")
    if not bool(torch.isfinite(absmax).all()) or bool((absmax < 0).any()):
        raise ValueError("absmax must hold finite, non-negative values (max |x| per channel); "
                         "got NaN, inf or a negative value: did you pass x.amax(0) without abs()?")
    med = absmax.median()
    return torch.nonzero(absmax > ratio * med).flatten()


def outlier_table(stats: dict, ratio: float = 5.0) -> list[dict]:
    """One row per Linear: largest channel max, median channel max, their ratio, #outliers."""
    rows = []
    for n, s in stats.items():
        a = s["absmax"]
        rows.append({"layer": n, "max": float(a.max()), "median": float(a.median()),
                     "max_over_median": float(a.max() / a.median().clamp_min(1e-12)),
                     "n_outliers": int(outlier_channels(a, ratio).numel()),
                     "channels": a.numel()})
    return rows


def plot_channel_max(stats: dict, names=None, ax=None, ratio: float = 5.0):
    """Per-channel max |x| of some Linears' inputs, with the outlier threshold drawn."""
    import matplotlib.pyplot as plt
    names = list(stats) if names is None else names
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3))
    for n in names:
        a = stats[n]["absmax"].numpy()
        ax.plot(a, lw=0.8, label=n)
        ax.axhline(ratio * float(stats[n]["absmax"].median()), ls=":", lw=0.8,
                   color=ax.lines[-1].get_color())
    ax.set_xlabel("input channel"), ax.set_ylabel("max |x| over tokens")
    ax.set_title(f"per-channel input maxima (dotted: {ratio:g}x the median)")
    ax.legend(fontsize=7)
    return ax


def plot_heatmap(x: torch.Tensor, ax=None, title: str = "|activation|", max_tokens: int = 128):
    """|x| as an image: tokens down, channels across. Outlier channels show as bright columns."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3))
    im = ax.imshow(x[:max_tokens].abs().numpy(), aspect="auto", cmap="magma",
                   interpolation="nearest")
    ax.set_xlabel("input channel"), ax.set_ylabel("token")
    ax.set_title(title)
    plt.colorbar(im, ax=ax)
    return ax
