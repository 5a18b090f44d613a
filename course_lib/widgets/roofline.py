"""Lessons 09-10: a roofline calculator for one linear layer on a catalogue GPU.

``roofline_widget()`` returns an ipywidgets box: pick a GPU, a Llama layer shape and the
number of tokens in the batch, and it shows, for BF16, W8A16, W4A16 (group 128) and FP8
W8A8, the bytes moved, the arithmetic intensity, the floor time max(bytes / bandwidth,
FLOPs / peak), what bounds it, and the speed-up over BF16 the roofline allows. The sums
are ``course_lib.bench``'s (one source); the figures are the catalogue's (``hardware``).
"""
from __future__ import annotations

import html

from course_lib import bench
from course_lib import hardware as hw

BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
# (label, weight bits, group size: None / "K" for per channel / int, maths format)
FORMATS = [("BF16", 16, None, "bf16"), ("W8A16 (int8, per channel)", 8, "K", "bf16"),
           ("W4A16 (int4, group 128)", 4, 128, "bf16"), ("FP8 W8A8", 8, "K", "fp8")]


def sixteen_bit(gpu) -> str:
    """The 16-bit format a GPU's tensor cores multiply: BF16 from compute capability 8.0
    (Ampere), FP16 before (a T4 has no BF16). Lessons 09-10."""
    g = hw.get_gpu(gpu)
    return "FP16" if g.compute_capability is not None and g.compute_capability < (8, 0) else "BF16"


def roofline_rows(gpu: str, K: int, N: int, M: int) -> list[dict]:
    """One dict per format: bytes, intensity, floor (us), bound, speed-up (lessons 09-10).

    FP8 W8A8 gets ``None`` figures on a GPU without FP8 maths (it would be emulated). On a GPU
    without BF16 (a T4) the 16-bit baseline is FP16, at the same rate and bytes."""
    g = hw.get_gpu(gpu)
    bw = g.bandwidth_tbps * 1e3
    half = sixteen_bit(g)
    rows = []
    for label, bits, gs, maths in FORMATS:
        label = label.replace("BF16", half) if half != "BF16" else label
        group = K if gs == "K" else gs
        peak = g.native_tflops(maths)
        if peak is None:
            rows.append({"format": label, "native": False})
            continue
        n_bytes = bench.linear_bytes(M, N, K, bits, group_size=group)
        floor_ms = bench.layer_floor_ms(M, N, K, bits, group, bw, peak)
        t_mem = n_bytes / (bw * 1e9) * 1e3
        rows.append({"format": label, "native": True, "mb": n_bytes / 1e6,
                     "intensity": bench.arithmetic_intensity(M, N, K, bits, group_size=group),
                     "floor_us": floor_ms * 1e3,
                     "bound": "memory" if t_mem >= floor_ms else "compute",
                     "speedup": bench.floor_speedup(M, N, K, bits, group, bw, g.bf16_tflops,
                                                    None if maths == "bf16" else peak)})
    return rows


def roofline_html(gpu: str, layer: str, M: int) -> str:
    """The widget's readout as an HTML table (lessons 09-10)."""
    name, K, N = next(x for x in bench.LAYERS_8B + bench.LAYERS_70B if x[0] == layer)
    g = hw.get_gpu(gpu)
    ridge = bench.ridge_point(g.bf16_tflops, g.bandwidth_tbps * 1e3)
    head = ("<tr><th style='text-align:left'>format</th><th>MB moved</th><th>FLOP/byte</th>"
            f"<th>floor (µs)</th><th>bound by</th><th>speed-up vs {sixteen_bit(g)}</th></tr>")
    body = []
    for r in roofline_rows(gpu, K, N, M):
        if not r["native"]:
            body.append(f"<tr><td style='text-align:left'>{html.escape(r['format'])}</td>"
                        "<td colspan='5'>no FP8 maths on this GPU (compute capability < 8.9): "
                        "emulated, no speed-up</td></tr>")
            continue
        body.append(f"<tr><td style='text-align:left'>{html.escape(r['format'])}</td>"
                    f"<td>{r['mb']:,.1f}</td><td>{r['intensity']:,.1f}</td>"
                    f"<td>{r['floor_us']:,.1f}</td><td>{r['bound']}</td>"
                    f"<td><b>{r['speedup']:.2f}x</b></td></tr>")
    title = html.escape(f"{name} ({K} in x {N} out), {M} token(s), {g.name}: "
                        f"{g.bandwidth_tbps:g} TB/s, {g.bf16_tflops:g} {sixteen_bit(g)} TFLOPS, "
                        f"ridge {ridge:.0f} FLOP/byte")
    return f"<b>{title}</b><table>{head}{''.join(body)}</table>"


def roofline_widget(gpu: str = "H100 SXM", layer: str = "70B gate/up_proj", batch: int = 1):
    """Build the roofline calculator (lessons 09-10). Returns a ``VBox``; its ``controls``
    dict holds the input widgets and ``result`` the HTML readout, so a test can drive it."""
    import ipywidgets as W

    style = {"description_width": "110px"}
    layout = W.Layout(width="480px")
    gpus = [n for n, g in hw.GPUS.items() if g.compute_capability is not None]
    layers = [x[0] for x in bench.LAYERS_8B + bench.LAYERS_70B]
    if layer not in layers:
        raise ValueError(f"layer {layer!r} is not one of the widget's layers: {layers}")
    if batch not in BATCHES:
        raise ValueError(f"batch {batch!r} is not on the widget's slider; choose one of {BATCHES}")
    controls = {
        "gpu": W.Dropdown(options=gpus, value=hw.get_gpu(gpu).name, description="GPU",
                          style=style, layout=layout),
        "layer": W.Dropdown(options=[x[0] for x in bench.LAYERS_8B + bench.LAYERS_70B],
                            value=layer, description="layer", style=style, layout=layout),
        "batch": W.SelectionSlider(options=BATCHES, value=batch, description="tokens (M)",
                                   style=style, layout=layout, continuous_update=False),
    }
    result = W.HTML()

    def update(_change=None):
        result.value = roofline_html(controls["gpu"].value, controls["layer"].value,
                                     controls["batch"].value)

    for c in controls.values():
        c.observe(update, names="value")
    update()
    box = W.VBox([*controls.values(), result])
    box.controls, box.result = controls, result
    return box
