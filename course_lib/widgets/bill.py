"""Lesson 00, "The bill": a calculator widget and a plot of decode floor vs bits per weight.

``bill_widget()`` returns an ipywidgets box: pick a model, weight format, KV-cache format,
GPU, tensor-parallel size, batch and context, and it shows weights, KV cache, whether it
fits, whether it is servable, the decode floor and tokens per second. Every figure comes
from ``course_lib.hardware.plan`` (one source for the sums).

``plot_floor_vs_bits()`` draws the decode floor of several models against bits per weight
on one GPU and, when given, at this machine's measured bandwidth.
"""
from __future__ import annotations

import html

import numpy as np

from course_lib import hardware as hw

WIDGET_FORMATS = ["bf16", "fp8", "int8", "int4_g128", "mxfp4", "nvfp4", "int4"]
KV_FORMATS = ["bf16", "fp8"]
CONTEXTS = [1024, 2048, 4096, 8000, 8192, 16384, 32768, 65536, 131072]


def memory_bar_html(p: hw.Plan, width_px: int = 420) -> str:
    """One GPU's memory as a stacked bar: weights, workspace, KV cache, then what is left;
    a red end when the replica needs more than the GPU has (lesson 00)."""
    memory = hw.get_gpu(p.gpu).memory_gb
    parts = [("weights", p.weights_gb / p.n_gpus, "#0f6b63"),
             ("workspace", p.workspace_gb, "#9e9e9e"),
             ("KV cache", p.kv_gb / p.n_gpus, "#e0a030")]
    scale = max(memory, sum(gb for _, gb, _ in parts))
    cells, used = [], 0.0
    for name, gb, colour in parts:
        shown = max(0.0, min(gb, scale - used))
        used += shown
        cells.append(f"<div title='{name}: {gb:,.1f} GB' style='width:{100 * shown / scale:.2f}%;"
                     f"background:{colour}'></div>")
    over = sum(gb for _, gb, _ in parts) > memory
    if not over:
        cells.append(f"<div title='free' style='width:{100 * (scale - used) / scale:.2f}%;"
                     "background:#eeeeee'></div>")
    usable_at = 100 * p.usable_gb_per_gpu / scale
    border = "#b3154f" if over else "#888888"
    return (f"<div style='position:relative;display:flex;width:{width_px}px;height:14px;"
            f"border:1px solid {border}'>{''.join(cells)}<div title='usable limit' "
            f"style='position:absolute;left:{usable_at:.2f}%;top:-3px;height:20px;"
            "border-left:2px dashed #b3154f'></div></div>"
            f"<small>one GPU ({memory:g} GB): <span style='color:#0f6b63'>weights</span>, "
            "<span style='color:#9e9e9e'>workspace</span>, <span style='color:#e0a030'>KV "
            "cache</span>; dashed line: usable limit</small>")


def bill_html(p: hw.Plan) -> str:
    """The widget's readout for one ``Plan``, as an HTML table (lesson 00)."""
    if p.servable:
        verdict, colour = "servable", "#2b6a24"
    elif p.fits:
        verdict, colour = "fits, but not servable", "#b36b00"
    else:
        verdict, colour = "does not fit", "#b3154f"
    rows = [
        ("weights", f"{p.weights_gb:,.1f} GB ({p.weights_gb / p.n_gpus:,.1f} GB per GPU)"),
        ("KV cache", f"{p.kv_gb:,.1f} GB for {p.batch} x {p.context:,} tokens in {p.kv_format}"),
        ("memory per GPU", f"{p.need_gb_per_gpu:,.1f} GB needed (incl. {p.workspace_gb:.0f} GB "
                           f"workspace) of {p.usable_gb_per_gpu:,.1f} GB usable"),
        ("verdict", f"<b style='color:{colour}'>{verdict}</b>; room for "
                    f"{p.max_conversations:,} conversations of {p.context:,} tokens"),
        ("decode floor (1 user)", f"{p.floor_ms:,.2f} ms per token"),
        ("tokens/s (1 user)", f"{p.tokens_per_s_peak:,.0f} at peak bandwidth, "
                              f"{p.tokens_per_s_realistic:,.0f} at "
                              f"{hw.REALISTIC_EFFICIENCY:.0%}"),
        (f"batch of {p.batch}", f"step {p.step_ms:,.2f} ms (weights + KV) -> "
                                f"{p.batch_tokens_per_s:,.0f} tokens/s"),
    ]
    rows += [("note", html.escape(n)) for n in p.notes]
    body = "".join(f"<tr><td style='text-align:left;padding-right:1em'>{k}</td>"
                   f"<td style='text-align:left'>{v}</td></tr>" for k, v in rows)
    title = html.escape(f"{p.model} · {p.fmt} · {p.n_gpus} x {p.gpu}")
    return f"<b>{title}</b>{memory_bar_html(p)}<table>{body}</table>"


def bill_widget(model: str = "Llama 3.1 70B", fmt: str = "bf16", gpu: str = "H100 SXM",
                batch: int = 1, context: int = 8000, kv_format: str = "bf16",
                n_gpus: int = 1):
    """Build the bill calculator (lesson 00). Returns a ``VBox``; its ``controls`` dict
    holds the input widgets and ``result`` the HTML readout, so a test can drive it."""
    import ipywidgets as W

    hw.plan(model, fmt, gpu, batch, context, kv_format, n_gpus)   # refuses bad values, saying why
    if context not in CONTEXTS:
        raise ValueError(f"context {context} is not on the widget's slider; choose one of {CONTEXTS}")
    if batch > 256 or n_gpus not in (1, 2, 4, 8):
        raise ValueError(f"the widget offers batch 1..256 and 1, 2, 4 or 8 GPUs; got batch "
                         f"{batch}, n_gpus {n_gpus}")
    style = {"description_width": "110px"}
    layout = W.Layout(width="420px")
    controls = {
        "model": W.Dropdown(options=list(hw.MODELS), value=hw.get_model(model).name,
                            description="model", style=style, layout=layout),
        "fmt": W.Dropdown(options=WIDGET_FORMATS, value=fmt, description="weights",
                          style=style, layout=layout),
        "kv_format": W.Dropdown(options=KV_FORMATS, value=kv_format, description="KV cache",
                                style=style, layout=layout),
        "gpu": W.Dropdown(options=list(hw.GPUS), value=hw.get_gpu(gpu).name, description="GPU",
                          style=style, layout=layout),
        "n_gpus": W.Dropdown(options=[1, 2, 4, 8], value=n_gpus, description="GPUs (TP)",
                             style=style, layout=layout),
        "batch": W.IntSlider(value=batch, min=1, max=256, description="users (batch)",
                             style=style, layout=layout, continuous_update=False),
        "context": W.SelectionSlider(options=CONTEXTS, value=context, description="context",
                                     style=style, layout=layout, continuous_update=False),
    }
    result = W.HTML()

    def update(_change=None):
        values = {k: c.value for k, c in controls.items()}
        result.value = bill_html(hw.plan(**values))

    for c in controls.values():
        c.observe(update, names="value")
    update()
    box = W.VBox([W.HBox([W.VBox(list(controls.values())[:4]),
                          W.VBox(list(controls.values())[4:])]), result])
    box.controls, box.result = controls, result
    return box


def plot_floor_vs_bits(models=("Llama 3.1 8B", "Gemma 2 27B", "Llama 3.1 70B"),
                       gpu: str = "H100 SXM", measured_gbps: float | None = None,
                       machine_name: str = "this machine"):
    """Decode floor (ms per token, one user) against bits per weight for several models on
    ``gpu``; with ``measured_gbps`` a second panel at this machine's measured bandwidth.
    Marks the named formats. The y axis is linear: halve the bits, halve the floor.
    Returns the matplotlib figure (lesson 00)."""
    import matplotlib.pyplot as plt

    g = hw.get_gpu(gpu)
    bits = np.linspace(2, 16, 57)                            # (57,)
    panels = [(f"one {g.name} ({g.bandwidth_tbps} TB/s)", g.bandwidth_tbps)]
    if measured_gbps is not None:
        panels.append((f"{machine_name} (measured {measured_gbps:.1f} GB/s)",
                       hw._positive("measured_gbps", measured_gbps) / 1e3))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (title, tbps) in zip(axes[0], panels):
        for name in models:
            floors = [hw.decode_floor_ms(hw.bytes_read_per_token(name, b), tbps) for b in bits]
            ax.plot(bits, floors, label=hw.get_model(name).name)
        for fmt in ("int4_g128", "nvfp4", "fp8", "bf16"):
            ax.axvline(hw.bits_per_weight(fmt), color="grey", lw=0.6, ls=":")
            ax.text(hw.bits_per_weight(fmt), 1.0, fmt, rotation=90, va="top", ha="right",
                    fontsize=7, color="grey", transform=ax.get_xaxis_transform())
        ax.set_ylim(bottom=0)
        ax.set_xlabel("bits per weight (scales included)")
        ax.set_ylabel("decode floor, ms per token")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def step_parts_ms(model, fmt: str = "bf16", gpu: str = "H100 SXM", context: int = 4096,
                  kv_format: str = "bf16", batches=(1, 2, 4, 8, 16, 32, 64, 128)) -> dict:
    """For each batch size, one decode step split into the time spent reading weights and
    the time spent reading every user's KV cache at ``context`` tokens, in ms at the GPU's
    peak bandwidth (lesson 00). Returns ``{"batch", "weights_ms", "kv_ms"}`` (lists)."""
    batches = [hw._positive_int("batch", b) for b in batches]
    if not batches:
        raise ValueError("batches is empty: give the batch sizes to draw, e.g. (1, 8, 64)")
    context = hw._positive_int("context", context)
    g = hw.get_gpu(gpu)
    w_bytes = hw.weight_bytes(model, fmt)
    kv_token = hw.model_kv_bytes_per_token(model, kv_format)
    weights_ms = [hw.decode_floor_ms(min(w_bytes, hw.bytes_read_per_token(model, fmt) * b),
                                     g.bandwidth_tbps) for b in batches]
    kv_ms = [kv_token * b * context / (g.bandwidth_tbps * hw.TB) * 1e3 for b in batches]
    return {"batch": batches, "weights_ms": weights_ms, "kv_ms": kv_ms}


def plot_step_vs_batch(model="Llama 3.1 8B", gpu: str = "H100 SXM", context: int = 4096,
                       setups=(("bf16", "bf16"), ("fp8", "fp8")),
                       batches=(1, 2, 4, 8, 16, 32, 64, 128)):
    """Decode step time against batch size, stacked into reading the weights (shared by the
    batch) and reading the KV caches (one per user), one panel per (weight format, KV
    format) in ``setups``. Returns the
    figure (lesson 00: where the bytes go at large batch, the lead-in to lesson 11)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(setups), figsize=(5.2 * len(setups), 3.8), sharey=True,
                             squeeze=False)
    for ax, (fmt, kv_format) in zip(axes[0], setups):
        parts = step_parts_ms(model, fmt, gpu, context, kv_format, batches)
        x = np.arange(len(parts["batch"]))                           # (n_batches,)
        ax.bar(x, parts["weights_ms"], color="#0f6b63", label="weights (read once per step)")
        ax.bar(x, parts["kv_ms"], bottom=parts["weights_ms"], color="#e0a030",
               label="KV caches (one per user)")
        ax.set_xticks(x, [str(b) for b in parts["batch"]])
        ax.set_xlabel("users in the batch")
        ax.set_title(f"{hw.get_model(model).name}, weights {fmt}, KV {kv_format}\n"
                     f"{context:,} tokens each, one {hw.get_gpu(gpu).name}", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].set_ylabel("one decode step, ms")
    axes[0][0].legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


__all__ = ["bill_widget", "bill_html", "memory_bar_html", "plot_floor_vs_bits",
           "step_parts_ms", "plot_step_vs_batch"]
