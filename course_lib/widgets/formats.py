"""Lesson 01, "Number formats, bit by bit": a bit-layout explorer and two plots.

``bit_explorer()`` returns an ipywidgets box: pick a format, flip its bits with toggle buttons
(sign, exponent and mantissa coloured apart) and read the fields, the formula and the value;
or type a number and see the nearest representable value, its bits and the rounding error.
Every figure comes from ``course_lib.formats`` (one source for the codecs).

``plot_value_grids()`` draws the levels of INT4, FP4 E2M1 and NF4 on one axis (each scaled to
a maximum of 1); ``plot_spacing()`` draws the gap between neighbouring values against their
magnitude, which shows that a float's *relative* step stays the same across its range.
"""
from __future__ import annotations

import html

import numpy as np

from course_lib.formats import FORMAT_NAMES, explain_rounding, get_format

FIELD_COLOURS = {"sign": "#d95f02", "exponent": "#1f77b4", "mantissa": "#2ca02c",
                 "integer": "#7f7f7f", "code": "#9467bd"}


def bit_roles(name: str) -> list[str]:
    """The role of each bit, most significant first: "sign", "exponent", "mantissa", ... (lesson 01)."""
    s = get_format(name)
    if s.kind == "float":
        return ["sign"] * s.sign_bits + ["exponent"] * s.exponent_bits + ["mantissa"] * s.mantissa_bits
    if s.kind == "int":
        return (["sign"] if s.signed else []) + ["integer"] * (s.bits - (1 if s.signed else 0))
    return ["code"] * s.bits


def pattern_html(name: str, bits: int) -> str:
    """The explorer's readout for one bit pattern: fields, category, formula, value (lesson 01)."""
    s = get_format(name)
    d = s.describe(bits)
    roles = bit_roles(name)
    raw = format(int(bits), f"0{s.bits}b")
    coloured = "".join(f"<span style='color:{FIELD_COLOURS[r]};font-weight:bold'>{c}</span>"
                       for c, r in zip(raw, roles))
    rows = [("bits", f"<code>{coloured}</code> (0x{int(bits):0{(s.bits + 3) // 4}X})")]
    if s.kind == "float":
        exp_txt = "-" if d["exponent"] is None else str(d["exponent"])
        rows += [("sign", str(d["sign"])),
                 ("exponent field", f"{d['exponent_field']} (bias {s.bias}; exponent {exp_txt})"),
                 ("mantissa field", f"{d['mantissa_field']} of {1 << s.mantissa_bits}"
                                    if s.mantissa_bits else "none (0 bits)")]
    rows += [("kind", d["category"]), ("how", html.escape(d["formula"])),
             ("value", f"<b>{d['value']:.10g}</b>")]
    body = "".join(f"<tr><td style='text-align:left;padding-right:1em'>{k}</td>"
                   f"<td style='text-align:left'>{v}</td></tr>" for k, v in rows)
    return f"<b>{html.escape(s.name)}</b>: {html.escape(s.description)}<table>{body}</table>"


def nearest_html(name: str, x: float) -> str:
    """Readout for a typed number: nearest representable value, its bits, the error (lesson 01)."""
    s = get_format(name)
    try:
        code = int(s.encode(x))
    except ValueError as err:
        return f"<span style='color:#b3154f'>{html.escape(str(err))}</span>"
    value = float(s.decode(code))
    if np.isfinite(value) and np.isfinite(x):
        err = value - x
        rel = f", {abs(err) / abs(x):.3%} of |x|" if x != 0 else ""
        err_txt = f"{err:+.6g}{rel}"
    else:
        err_txt = "not a finite number: the format's overflow rule applied"
    steps = html.escape(explain_rounding(x, name))
    return (f"{x:.10g} is stored as <b>{value:.10g}</b> "
            f"(bits <code>{s.bit_string(code)}</code>); error {err_txt}"
            f"<pre style='font-size:90%;line-height:1.25'>{steps}</pre>")


def bit_explorer(format_name: str = "fp8_e4m3", value: float = 0.1):
    """Build the bit-layout explorer (lesson 01). Returns a ``VBox``.

    Its ``controls`` dict holds ``format`` (Dropdown), ``number`` (FloatText) and ``bits``
    (the current list of ToggleButtons, most significant bit first); ``result`` is the HTML
    readout of the pattern and ``nearest`` the readout of the typed number, so a test can
    drive it.
    """
    import ipywidgets as W

    fmt = W.Dropdown(options=list(FORMAT_NAMES), value=get_format(format_name).name,
                     description="format", layout=W.Layout(width="260px"))
    number = W.FloatText(value=value, description="type x", layout=W.Layout(width="260px"))
    result, nearest = W.HTML(), W.HTML()
    row = W.HBox(layout=W.Layout(flex_flow="row wrap"))
    box = W.VBox([W.HBox([fmt, number]), row, result, nearest])
    box.controls = {"format": fmt, "number": number, "bits": []}
    box.result, box.nearest = result, nearest
    busy = {"flag": False}

    def current_bits() -> int:
        return sum(int(b.value) << (len(box.controls["bits"]) - 1 - i)
                   for i, b in enumerate(box.controls["bits"]))

    def show_pattern(_change=None):
        if busy["flag"]:
            return
        result.value = pattern_html(fmt.value, current_bits())

    def set_bits(code: int):
        busy["flag"] = True
        try:
            n = len(box.controls["bits"])
            for i, b in enumerate(box.controls["bits"]):
                b.value = bool((code >> (n - 1 - i)) & 1)
        finally:
            busy["flag"] = False
        show_pattern()

    def build_buttons(_change=None):
        roles = bit_roles(fmt.value)
        buttons = []
        for i, role in enumerate(roles):
            b = W.ToggleButton(value=False, description="0", tooltip=f"bit {len(roles) - 1 - i}: {role}",
                               layout=W.Layout(width="34px", padding="0"))
            b.style.button_color = FIELD_COLOURS[role] + "40"
            b.observe(lambda ch, b=b: setattr(b, "description", "1" if ch["new"] else "0"), "value")
            b.observe(show_pattern, "value")
            buttons.append(b)
        box.controls["bits"] = buttons
        row.children = tuple(buttons)
        show_number()

    def show_number(_change=None):
        x = float(number.value)
        nearest.value = nearest_html(fmt.value, x)
        try:
            code = int(get_format(fmt.value).encode(x))
        except ValueError:
            show_pattern()
            return
        set_bits(code)

    fmt.observe(build_buttons, "value")
    number.observe(show_number, "value")
    build_buttons()
    return box


# ---- plots --------------------------------------------------------------------------------

def value_grids(names=("int4", "fp4_e2m1", "nf4")) -> dict[str, np.ndarray]:
    """The levels each format offers to symmetric absmax quantization, scaled to max 1.

    INT4 uses -7..7 (15 even levels; -8 goes unused by a symmetric scale), FP4 E2M1 its 15
    values divided by 6, NF4 its 16 levels as they are (lessons 01, 03).
    """
    out = {}
    for n in names:
        s = get_format(n)
        v = s.values()
        if s.kind == "int" and s.signed:
            v = v[v >= -s.max_value]                       # symmetric range
        out[n] = v / s.max_value
    return out


def plot_value_grids(names=("int4", "fp4_e2m1", "nf4"), ax=None):
    """Draw each format's levels (scaled to max 1) on its own row (lesson 01). Returns ax."""
    import matplotlib.pyplot as plt

    grids = value_grids(names)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.8 + 0.6 * len(grids)))
    for row, (n, v) in enumerate(grids.items()):
        ax.scatter(v, np.full(v.shape, row), s=40, zorder=3)
        ax.hlines(row, -1, 1, color="#cccccc", zorder=1)
    ax.set_yticks(range(len(grids)))
    ax.set_yticklabels([f"{n} ({len(v)} levels)" for n, v in grids.items()])
    ax.set_xlabel("value / largest value")
    ax.set_ylim(-0.6, len(grids) - 0.4)
    ax.set_title("Where each 4-bit format puts its levels")
    return ax


def spacing(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(positive values, gap to the next value up) for a format of up to 16 bits (lesson 01)."""
    v = get_format(name).values()
    v = v[v > 0]
    return v[:-1], np.diff(v)


def plot_spacing(names=("fp8_e4m3", "fp8_e5m2", "int8"), ax=None):
    """Relative gap between neighbours against magnitude, log-log (lesson 01). Returns ax.

    Integers have a fixed gap, so their relative gap falls as values grow; floats keep a
    roughly constant relative gap (between 2^-(M+1) and 2^-M) over their whole normal range.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4))
    for n in names:
        v, gap = spacing(n)
        ax.step(v, gap / v, where="post", label=n)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("value")
    ax.set_ylabel("gap to next value / value")
    ax.legend()
    ax.set_title("Relative step: floats keep it, integers do not")
    return ax
