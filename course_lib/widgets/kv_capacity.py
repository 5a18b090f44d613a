"""Lesson 11: how many conversations fit, and what a decode step reads, per KV-cache format.

``kv_capacity_widget()`` returns an ipywidgets box: pick a GPU, a model, the weight format,
the KV-cache format and the context, and it shows the cache's bytes per token, how many
conversations of that length fit next to the weights, and the batched decode step at that
many users split into the time spent reading weights and reading the cache. The sums are
``course_lib.hardware``'s (one source); KV formats are priced in bits per value by
``course_lib.kv.bits_per_value`` (scales included: KIVI-2 costs 3 bits, not 2).
"""
from __future__ import annotations

import html

from course_lib import hardware as hw
from course_lib import kv

KV_FORMATS = ["bf16", "fp8_tensor", "int8", "kivi4", "kivi2"]
WEIGHT_FORMATS = ["bf16", "fp8", "int4_g128"]
CONTEXTS = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]


def capacity(model: str, gpu: str, weight_fmt: str, kv_fmt: str, context: int,
             n_gpus: int = 1) -> dict:
    """Conversations that fit and the decode step at that batch (lesson 11).

    Returns kv_bytes_per_token, conversations, weights_gb, kv_gb, step_ms and its split
    weights_ms + kv_ms (at peak bandwidth), and tokens_per_s for the whole batch.
    """
    m = hw.get_model(model)
    bits = kv.bits_per_value(kv_fmt, m.head_dim)
    first = hw.plan(m, weight_fmt, gpu, 1, context, bits, n_gpus)
    n = first.max_conversations
    out = {"model": m.name, "gpu": hw.get_gpu(gpu).name, "kv_bits": bits,
           "kv_bytes_per_token": hw.model_kv_bytes_per_token(m, bits),
           "conversations": n, "weights_gb": first.weights_gb}
    if n == 0:
        return {**out, "kv_gb": 0.0, "step_ms": None, "weights_ms": None, "kv_ms": None,
                "tokens_per_s": 0.0}
    p = hw.plan(m, weight_fmt, gpu, n, context, bits, n_gpus)
    kv_ms = p.kv_gb * hw.GB / (n_gpus * hw.get_gpu(gpu).bandwidth_tbps * hw.TB) * 1e3
    return {**out, "kv_gb": p.kv_gb, "step_ms": p.step_ms, "weights_ms": p.step_ms - kv_ms,
            "kv_ms": kv_ms, "tokens_per_s": p.batch_tokens_per_s}


def capacity_html(model, gpu, weight_fmt, context) -> str:
    """The readout: one row per KV format, with a bar of the step split weights | cache."""
    rows = [capacity(model, gpu, weight_fmt, f, context) for f in KV_FORMATS]
    longest = max((r["step_ms"] or 0) for r in rows) or 1.0
    head = ("<tr><th style='text-align:left'>KV format</th><th>bits/value</th><th>KB/token</th>"
            "<th>conversations</th><th>step (ms)</th><th>tok/s</th>"
            "<th style='text-align:left'>step: <span style='color:#4c72b0'>weights</span> | "
            "<span style='color:#dd8452'>cache</span></th></tr>")
    body = []
    for f, r in zip(KV_FORMATS, rows):
        if r["conversations"] == 0:
            body.append(f"<tr><td style='text-align:left'>{f}</td><td>{r['kv_bits']:g}</td>"
                        f"<td>{r['kv_bytes_per_token'] / 1024:,.0f}</td><td>0</td>"
                        "<td colspan='3'>the weights leave no room for one conversation</td></tr>")
            continue
        w = 300 * r["weights_ms"] / longest
        c = 300 * r["kv_ms"] / longest
        bar = (f"<span style='display:inline-block;background:#4c72b0;height:12px;width:{w:.0f}px'>"
               f"</span><span style='display:inline-block;background:#dd8452;height:12px;"
               f"width:{c:.0f}px'></span>")
        body.append(f"<tr><td style='text-align:left'>{f}</td><td>{r['kv_bits']:g}</td>"
                    f"<td>{r['kv_bytes_per_token'] / 1024:,.0f}</td><td>{r['conversations']}</td>"
                    f"<td>{r['step_ms']:.1f}</td><td>{r['tokens_per_s']:,.0f}</td>"
                    f"<td style='text-align:left'>{bar}</td></tr>")
    g = hw.get_gpu(gpu)
    title = html.escape(f"{rows[0]['model']} in {weight_fmt} ({rows[0]['weights_gb']:.1f} GB) on "
                        f"one {g.name} ({g.memory_gb:g} GB, {g.bandwidth_tbps:g} TB/s), "
                        f"{context:,}-token conversations, every one at full length")
    return f"<b>{title}</b><table>{head}{''.join(body)}</table>"


def kv_capacity_widget(model: str = "Llama 3.1 8B", gpu: str = "H100 SXM",
                       weight_fmt: str = "fp8", context: int = 8192):
    """Build the capacity calculator (lesson 11). Returns a ``VBox``; ``controls`` holds the
    input widgets and ``result`` the HTML readout, so a test can drive it."""
    import ipywidgets as W

    style = {"description_width": "110px"}
    layout = W.Layout(width="480px")
    dense = [n for n, m in hw.MODELS.items() if m.kv_latent_dim is None]
    if hw.get_model(model).name not in dense:
        raise ValueError(f"{model!r} stores a latent KV cache (MLA), which this widget does not "
                         f"price; choose one of {dense}")
    if weight_fmt not in WEIGHT_FORMATS:
        raise ValueError(f"weight_fmt {weight_fmt!r} is not in the widget's list; choose one of "
                         f"{WEIGHT_FORMATS}")
    if context not in CONTEXTS:
        raise ValueError(f"context {context!r} is not on the widget's slider; choose one of "
                         f"{CONTEXTS}")
    controls = {
        "model": W.Dropdown(options=dense, value=hw.get_model(model).name, description="model",
                            style=style, layout=layout),
        "gpu": W.Dropdown(options=list(hw.GPUS), value=hw.get_gpu(gpu).name, description="GPU",
                          style=style, layout=layout),
        "weights": W.Dropdown(options=WEIGHT_FORMATS, value=weight_fmt, description="weights",
                              style=style, layout=layout),
        "context": W.SelectionSlider(options=CONTEXTS, value=context, description="context",
                                     style=style, layout=layout, continuous_update=False),
    }
    result = W.HTML()

    def update(_change=None):
        result.value = capacity_html(controls["model"].value, controls["gpu"].value,
                                     controls["weights"].value, controls["context"].value)

    for c in controls.values():
        c.observe(update, names="value")
    update()
    box = W.VBox([*controls.values(), result])
    box.controls, box.result = controls, result
    return box
