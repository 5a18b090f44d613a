"""The quantization playground (lessons 02 and 03).

Pick a format, its bits, a granularity, a group size and the size of one outlier; see the
histogram of the weights with the levels the quantizer can store drawn on top, and the error
figures. ``playground_stats`` is the pure computation (testable without widgets);
``quantization_playground`` wraps it in ipywidgets and returns the box.
"""
from __future__ import annotations

import numpy as np

from course_lib import quant

FORMATS = ("int", "fp8_e4m3", "fp4_e2m1", "nf4")
GROUP_SIZES = (8, 16, 32, 64, 128, 256)


def playground_weights(rows: int = 8, cols: int = 256, std: float = 0.02, seed: int = 0):
    """Bell-shaped weights, (rows, cols) float32, with no outlier yet (lesson 02)."""
    for name, v in (("rows", rows), ("cols", cols)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {v!r}")
    if not (isinstance(std, (int, float)) and np.isfinite(std) and std > 0):
        raise ValueError(f"std must be a positive number (0.02 is weight-like), got {std!r}")
    rng = np.random.default_rng(seed)
    return (rng.normal(0.0, std, size=(rows, cols))).astype(np.float32)  # (rows, cols)


def _levels(fmt: str, bits: int) -> np.ndarray:
    """The format's grid before scaling (the values q can take)."""
    if fmt == "int":
        qmax = 2 ** (bits - 1) - 1
        return np.arange(-qmax, qmax + 1, dtype=np.float64)
    if fmt == "nf4":
        return quant.nf4_levels().astype(np.float64)
    from course_lib.formats import get_format

    v = np.asarray(get_format(fmt).values(), dtype=np.float64)
    return np.unique(v[np.isfinite(v)])


def playground_stats(fmt: str = "int", bits: int = 4, granularity: str = "per_group",
                     group_size: int = 32, outlier: float = 0.0, x=None) -> dict:
    """Quantize ``x`` (default: ``playground_weights()``) with one outlier of ``outlier``
    times the largest ordinary weight put at [0, 0]; return the error figures and the levels
    of the outlier's group and of an ordinary group (lessons 02-03)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown playground format {fmt!r}; choose one of {FORMATS}")
    if not (isinstance(outlier, (int, float)) and np.isfinite(outlier) and outlier >= 0):
        raise ValueError(f"outlier is a multiple of the largest weight, a number >= 0 "
                         f"(0 = no outlier); got {outlier!r}")
    x = playground_weights() if x is None else np.array(x, dtype=np.float32)
    if x.ndim != 2 or x.size == 0:
        raise ValueError(f"the playground needs a non-empty 2-D (rows, cols) matrix; got shape {x.shape}")
    if outlier:
        x[0, 0] = outlier * float(np.abs(x).max())
    name = f"int{bits}" if fmt == "int" else fmt
    gs = group_size if granularity == "per_group" else None
    qt = quant.quantize(x, name, granularity, gs)
    xh = quant.dequantize(qt)
    scale = np.asarray(qt.scale, dtype=np.float64)  # (rows, n_groups) or (1, 1)
    grid = _levels(fmt, bits)
    fmt_bits = {"fp8_e4m3": 8, "fp4_e2m1": 4, "nf4": 4}.get(fmt, bits)
    per_scale = {"per_tensor": x.size, "per_channel": x.shape[-1],
                 "per_group": qt.group_size}[granularity]
    flat_scale = scale.reshape(-1)
    return {
        "x": x, "x_hat": xh, "format": name,
        "mae": quant.mae(x, xh), "rmse": quant.rmse(x, xh),
        "relative_rms_error": quant.relative_rms_error(x, xh),
        "sqnr_db": quant.sqnr_db(x, xh),
        "zeroed_fraction": float(np.mean((xh == 0) & (x != 0))),
        "bits_per_weight": quant.bits_per_weight(fmt_bits, per_scale),
        "levels_outlier_group": grid * flat_scale[0],
        "levels_ordinary_group": grid * flat_scale[-1],
    }


def _summary_html(s: dict) -> str:
    return (f"<b>{s['format']}</b>: MAE {s['mae']:.5f} &middot; RMSE {s['rmse']:.5f} &middot; "
            f"relative RMS error {100 * s['relative_rms_error']:.2f}% &middot; "
            f"SQNR {s['sqnr_db']:.1f} dB &middot; rounded to zero "
            f"{100 * s['zeroed_fraction']:.1f}% &middot; {s['bits_per_weight']:.3f} bits/weight")


def _plot(s: dict, ax) -> None:
    x = s["x"].reshape(-1)
    lim = 4 * float(np.std(x)) + 1e-12
    ax.hist(x, bins=120, range=(-lim, lim), color="0.6")
    for v in s["levels_ordinary_group"]:
        if -lim <= v <= lim:
            ax.axvline(v, color="tab:blue", lw=0.8, alpha=0.8)
    for v in s["levels_outlier_group"]:
        if -lim <= v <= lim:
            ax.axvline(v, color="tab:red", lw=1.2, ls="--", alpha=0.8)
    ax.set_xlim(-lim, lim)
    ax.set_xlabel("weight value (outlier off the right edge when large)")
    ax.set_ylabel("count")
    ax.set_title("levels: blue = an ordinary group, red dashed = the outlier's group", fontsize=9)


def quantization_playground(x=None):
    """Format, bits, granularity, group size and outlier size -> histogram with the stored
    levels, and error figures (lessons 02-03). Returns the widget box; ``box.controls`` holds
    the controls and ``box.summary`` the HTML with the figures, ``box.stats`` the latest dict."""
    import ipywidgets as W
    import matplotlib.pyplot as plt

    controls = {
        "fmt": W.Dropdown(options=FORMATS, value="int", description="format"),
        "bits": W.IntSlider(value=4, min=2, max=8, description="int bits"),
        "granularity": W.Dropdown(options=("per_tensor", "per_channel", "per_group"),
                                  value="per_group", description="scales"),
        "group_size": W.Dropdown(options=GROUP_SIZES, value=32, description="group size"),
        "outlier": W.FloatSlider(value=0.0, min=0.0, max=20.0, step=0.5,
                                 description="outlier (x max)"),
    }
    summary = W.HTML()
    out = W.Output()
    box = W.VBox([W.HBox(list(controls.values())[:3]), W.HBox(list(controls.values())[3:]),
                  summary, out])
    box.controls, box.summary = controls, summary

    def update(_=None):
        s = playground_stats(controls["fmt"].value, controls["bits"].value,
                             controls["granularity"].value, controls["group_size"].value,
                             controls["outlier"].value, x)
        box.stats = s
        summary.value = _summary_html(s)
        controls["bits"].disabled = controls["fmt"].value != "int"
        controls["group_size"].disabled = controls["granularity"].value != "per_group"
        out.clear_output(wait=True)
        with out:
            fig, ax = plt.subplots(figsize=(8, 3))
            _plot(s, ax)
            plt.show()
            plt.close(fig)

    for c in controls.values():
        c.observe(update, names="value")
    update()
    return box
