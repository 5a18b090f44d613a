"""Which tensors deserve more bits: per-tensor sensitivity and a bit allocation under a byte budget
(lesson 14).

**The scan** (:func:`scan`; ``python -m course_lib.experiments.sensitivity_scan scan`` writes
the committed one, ``results/kquants_sensitivity_smollm2.json``, that :func:`load_scan` reads):
every Linear of SmolLM2 is quantized *alone* to a 4.5-bit format its width allows (Q4_K for the
1536-wide ``ffn_down``, Q4_0 for the 576-wide rest; llama.cpp's own rounding,
:mod:`course_lib.kquants`), the rest kept at F16, and the KL divergence from the F16 model is
measured on fixed windows of the *calibration* text (:func:`scan_windows`, the clean
protocol's): the scan chooses the bits, so it never sees the evaluation windows that score the
files it chooses. Layers before the quantized one do not change, so their outputs are computed
once and reused.

**The other formats** are not all measured: a tensor's cost at format f is estimated from its
measured cost at the 4.5-bit format times the ratio of the importance-weighted weight errors,
``sum_j imatrix_j ||dW[:, j]||^2`` (:func:`course_lib.imatrix.weighted_error`), at f and at the
4.5-bit format: the expected squared output error of the Linear, which a small KL is
proportional to.

**The allocation** (:func:`allocate`): start every tensor at its smallest format; then, again
and again, take the one upgrade (a tensor to a larger format) that removes the most estimated
KL per byte added and still fits the budget; stop when none fits. Costs of several tensors are
added: a first-order assumption, checked in the lesson by running the file.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from course_lib import kquants

RESULTS_FILE = Path(__file__).resolve().parent.parent / "results" / \
    "kquants_sensitivity_smollm2.json"
#: GGUF tensor kind -> the course model's module inside a layer.
MODULES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
           "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
           "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
KINDS = tuple(MODULES)
#: the formats the allocation chooses from (each where the width allows it).
CANDIDATES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k")
#: the protocol of the committed scan: 2 windows of 512 tokens of the clean protocol's
#: calibration text (seed 1), and an importance matrix from 2 other draws (seed 0) of it
WINDOWS, WINDOW, CAL_WINDOWS = 2, 512, 2
PROTOCOL, SCAN_SEED = "clean", 1


def _whole(v, name: str, minimum: int = 1) -> int:
    """v as an int: a whole number >= ``minimum`` (NumPy ints and floats such as 512.0 too;
    not bools, not strings)."""
    ok = (not isinstance(v, bool) and isinstance(v, (int, float, np.integer, np.floating))
          and math.isfinite(v) and int(v) == v and v >= minimum)
    if not ok:
        raise ValueError(f"{name} must be a whole number >= {minimum}; got {v!r}")
    return int(v)


def _number(v, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) \
            or not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number; got {v!r}")
    return float(v)


def _names(v, name: str, known: tuple) -> list:
    """A list of names from ``known``: a string is refused (it would be read letter by
    letter), as are unknown names and an empty list."""
    if isinstance(v, str):
        raise TypeError(f"{name} must be a list of names such as ({known[0]!r},), not the string "
                        f"{v!r} (it would be read one letter at a time)")
    try:
        out = list(v)
    except TypeError:
        raise TypeError(f"{name} must be a list of names from {known}; got "
                        f"{type(v).__name__}") from None
    bad = [k for k in out if not isinstance(k, str) or k not in known]
    if bad or not out:
        raise ValueError(f"{name} must be a non-empty list of names from {known}; got "
                         f"{bad[0]!r}" if bad else f"{name} is empty: name at least one of {known}")
    return out


def scan_windows(n_windows: int = WINDOWS, window: int = WINDOW):
    """The token windows (n_windows, window) the scan measures on (window - 1 predictions
    each): calibration text of the clean protocol, drawn with :data:`SCAN_SEED` (lesson 14
    re-measures the first live)."""
    from course_lib.methods import calibration as cal
    n_windows = _whole(n_windows, "n_windows")
    window = _whole(window, "window", minimum=2)      # window - 1 predictions: at least one
    return cal.calibration_ids("smollm2", n_windows, window, SCAN_SEED, PROTOCOL)


def low_format(cols: int) -> str:
    """The 4.5-bit format the scan uses: Q4_K where rows are a multiple of 256, else Q4_0.
    ValueError when rows of ``cols`` fit neither (not a multiple of 32)."""
    cols = _whole(cols, "cols")
    if not kquants.fits("q4_0", cols):
        raise ValueError(f"cols={cols}: rows must be a multiple of 32 for a 4.5-bit format "
                         f"(Q4_0; Q4_K needs 256); such a tensor stays F16")
    return "q4_k" if kquants.fits("q4_k", cols) else "q4_0"


def candidates(cols: int) -> list[str]:
    """The formats of :data:`CANDIDATES` that rows of ``cols`` can be stored in (none when
    ``cols`` is not a multiple of 32)."""
    cols = _whole(cols, "cols")
    return [f for f in CANDIDATES if kquants.fits(f, cols)]


def roundtrip(w: torch.Tensor, fmt: str, imatrix=None) -> torch.Tensor:
    """w (out, in) quantized with llama.cpp's ``fmt`` and decoded again, fp32 (a torch
    tensor, whether ``w`` is one or a NumPy array)."""
    raw = kquants.quantize(w, fmt, imatrix)
    return torch.from_numpy(kquants.dequantize(raw, fmt, np.shape(w)[1]))


# ----------------------------------------------------------------------------- measuring
class Scanner:
    """KL of the model with one Linear replaced, on fixed windows, reusing the unchanged
    layers' outputs. ``model``: a course LlamaModel (the F16 reference); ``windows`` (n, T)."""

    def __init__(self, model, windows: torch.Tensor):
        from course_lib.imatrix import _check_windows
        _check_model(model)
        _check_windows(model, windows)
        if windows.shape[1] < 2:
            raise ValueError(f"windows must be at least 2 tokens long (window - 1 predictions "
                             f"each); got {windows.shape[1]}")
        self.model, self.windows = model, windows
        T = windows.shape[1] - 1
        self.cos, self.sin = model.rope(0, T)
        with torch.no_grad():
            x = model.model.embed_tokens(windows[:, :-1])                  # (n, T, D)
            self.inputs = []
            for block in model.model.layers:
                self.inputs.append(x)
                x = block(x, self.cos, self.sin)
            self.ref = self._logprobs(x)                                    # (n, T, V)
            self.p = self.ref.exp()

    def _logprobs(self, x):
        m = self.model
        return torch.log_softmax(m.lm_head(m.model.norm(x)).float(), -1)

    def kl(self, layer: int, kind: str, weight: torch.Tensor) -> tuple[list, list]:
        """(KL per window, top-1 agreement per window) with ``layer``'s ``kind`` weight set to
        ``weight`` (HF layout, out x in), everything else unchanged."""
        n = len(self.model.model.layers)
        layer = _whole(layer, "layer", minimum=0)
        if layer >= n:
            raise ValueError(f"layer {layer} is past the model: it has layers 0..{n - 1}")
        if not isinstance(kind, str) or kind not in MODULES:
            raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
        mod = self.model.model.layers[layer].get_submodule(MODULES[kind])
        if isinstance(weight, np.ndarray):
            weight = torch.from_numpy(weight)
        if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
            raise TypeError(f"weight must be a floating-point tensor (out, in); got "
                            f"{type(weight).__name__} {getattr(weight, 'dtype', '')}")
        if tuple(weight.shape) != tuple(mod.weight.shape):
            raise ValueError(f"weight must have the shape of layer {layer}'s {kind}, "
                             f"{tuple(mod.weight.shape)} (out, in); got {tuple(weight.shape)}")
        if not torch.isfinite(weight).all():
            raise ValueError(f"weight holds NaN or inf: the KL would be NaN; find where they "
                             f"come from")
        old = mod.weight.data
        mod.weight.data = weight.to(old.dtype)
        try:
            with torch.no_grad():
                x = self.inputs[layer]
                for block in self.model.model.layers[layer:]:
                    x = block(x, self.cos, self.sin)
                lp = self._logprobs(x)                                      # (n, T, V)
        finally:
            mod.weight.data = old
        kl = (self.p * (self.ref - lp)).sum(-1).mean(-1)                    # (n,)
        top1 = (lp.argmax(-1) == self.ref.argmax(-1)).float().mean(-1)
        return kl.tolist(), top1.tolist()


def scan(model=None, n_windows: int = WINDOWS, window: int = WINDOW,
         cal_windows: int = CAL_WINDOWS, layers=None, kinds=KINDS, progress: bool = True
         ) -> dict:
    """Sensitivity of every (layer, kind) of SmolLM2, as the module docstring says; returns the
    table (``course_lib.experiments.sensitivity_scan.write`` saves it). ``layers``/``kinds``
    restrict it (the lesson's slice)."""
    from course_lib import imatrix, smollm
    from course_lib.methods import calibration as cal
    n_windows, cal_windows = _whole(n_windows, "n_windows"), _whole(cal_windows, "cal_windows")
    window = _whole(window, "window", minimum=2)
    kinds = _names(kinds, "kinds", KINDS)
    if layers is not None:
        if isinstance(layers, (int, np.integer)) and not isinstance(layers, bool):
            raise TypeError(f"layers must be a list of layer indices, e.g. [{layers}]; got the "
                            f"number {layers}")
        try:
            layers = [_whole(i, "each of layers", minimum=0) for i in layers]
        except TypeError:
            raise TypeError(f"layers must be None (all) or a list of layer indices; got "
                            f"{type(layers).__name__}") from None
        if not layers:
            raise ValueError("layers is empty: pass None for every layer, or a list of indices")
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be True or False; got {progress!r}")
    if model is not None:
        _check_model(model)
    if model is None:
        model = f16_model()
    n_layers = model.config.num_hidden_layers
    past = [i for i in (layers or []) if i >= n_layers]
    if past:
        raise ValueError(f"layers holds {past[0]}, past the model: it has layers "
                         f"0..{n_layers - 1}")
    context = model.config.max_position_embeddings
    for label, T in (("window", window), ("the importance matrix's window", 512)):
        if T > context:
            raise ValueError(f"{label} of {T} tokens is past the model's context of {context} "
                             f"positions: use a shorter window")
    layers = list(range(n_layers)) if layers is None else layers
    ids = scan_windows(n_windows, window)                    # (n, window), calibration text
    t0 = time.perf_counter()
    sc = Scanner(model, ids)
    imx = imatrix.collect(model, cal.calibration_ids("smollm2", cal_windows, 512,
                                                     protocol=PROTOCOL))
    jobs = [(i, k) for i in layers for k in kinds]
    if progress:
        from tqdm.auto import tqdm
        jobs = tqdm(jobs, desc="sensitivity", unit="tensor")
    rows = []
    for i, kind in jobs:
        name = f"model.layers.{i}.{MODULES[kind]}"
        w = model.get_submodule(name).weight.detach()
        cols = w.shape[1]
        low = low_format(cols)
        kl, top1 = sc.kl(i, kind, roundtrip(w, low))
        err = {f: imatrix.weighted_error(w, roundtrip(w, f), imx[name])
               for f in candidates(cols)}
        rows.append({"tensor": f"blk.{i}.{kind}.weight", "layer": i, "kind": kind,
                     "shape": list(w.shape), "format": low, "kl_nats": kl, "top1": top1,
                     "kl_mean": float(np.mean(kl)),
                     "bytes": {f: w.shape[0] * kquants.row_bytes(f, cols)
                               for f in candidates(cols)},
                     "weighted_error": err})
    return {"protocol": {"name": PROTOCOL, "n_windows": n_windows, "window_tokens": window,
                         "text": f"calibration text of the clean protocol "
                                 f"(sensitivity.scan_windows, seed {SCAN_SEED}): the scan "
                                 f"chooses, so it never reads the evaluation text",
                         "reference": "course fp32 LlamaModel, weights rounded to fp16",
                         "quantized_alone_to": "q4_k (1536 wide), q4_0 (576 wide)",
                         "importance_matrix": {"windows": cal_windows, "tokens": 512,
                                               "text": "calibration text, seed 0"}},
            "seconds": round(time.perf_counter() - t0, 1), "rows": rows}


def _check_model(model) -> None:
    cfg = getattr(model, "config", None)
    if not isinstance(model, torch.nn.Module) or not hasattr(cfg, "num_hidden_layers") \
            or not hasattr(getattr(model, "model", None), "layers"):
        raise TypeError(f"model must be a course LlamaModel (course_lib.model; e.g. "
                        f"sensitivity.f16_model()); got {type(model).__name__}")


def f16_model():
    """SmolLM2 with every weight rounded to fp16: what the course's F16 file holds."""
    from course_lib import smollm
    m = smollm.load()
    for p in m.parameters():
        p.data = p.data.half().float()
    return m


def load_scan(path: Path = RESULTS_FILE) -> dict:
    """The committed scan."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} is missing: run `python -m course_lib.experiments."
                                f"sensitivity_scan scan` (about 15 minutes on 2 cores)")
    return json.loads(Path(path).read_text())


def heat_map(scan_rows: list[dict], n_layers: int = 30) -> np.ndarray:
    """KL (layers, kinds) from the scan's rows (NaN where a cell was not scanned)."""
    rows = _rows(scan_rows, ("layer", "kind", "kl_mean"))
    n_layers = _whole(n_layers, "n_layers")
    out = np.full((n_layers, len(KINDS)), np.nan)
    for i, r in enumerate(rows):
        layer = _whole(r["layer"], f"scan_rows[{i}]['layer']", minimum=0)
        if layer >= n_layers:
            raise ValueError(f"scan_rows[{i}] is layer {layer}, past n_layers={n_layers}: pass "
                             f"the model's layer count")
        if r["kind"] not in KINDS:
            raise ValueError(f"scan_rows[{i}]['kind'] must be one of {KINDS}; got {r['kind']!r}")
        out[layer, KINDS.index(r["kind"])] = _number(r["kl_mean"], f"scan_rows[{i}]['kl_mean']")
    return out


def _rows(scan_rows, keys: tuple) -> list:
    """The scan's rows (load_scan()["rows"]): a non-empty list of dicts holding ``keys``."""
    if isinstance(scan_rows, dict) and "rows" in scan_rows:
        raise TypeError("scan_rows must be the scan's rows, load_scan()['rows'], not the whole "
                        "scan")
    if not isinstance(scan_rows, (list, tuple)) or not scan_rows:
        empty = " (empty)" if isinstance(scan_rows, (list, tuple)) else ""
        raise ValueError(f"scan_rows must be a non-empty list of the scan's rows "
                         f"(load_scan()['rows']); got {type(scan_rows).__name__}{empty}")
    for i, r in enumerate(scan_rows):
        missing = [k for k in keys if not isinstance(r, dict) or k not in r]
        if missing:
            raise ValueError(f"scan_rows[{i}] must be a row of the scan, a dict with "
                             f"{', '.join(keys)}; missing {', '.join(missing)}")
    return list(scan_rows)


# ----------------------------------------------------------------------------- allocating
def costs_from_scan(scan_rows: list[dict]) -> tuple[dict, dict]:
    """({tensor: {format: estimated KL}}, {tensor: {format: bytes}}) from the scan: measured
    at the 4.5-bit format, scaled by the weighted-error ratio for the others."""
    costs, sizes = {}, {}
    for i, r in enumerate(_rows(scan_rows, ("tensor", "format", "kl_mean", "weighted_error",
                                            "bytes"))):
        if r["format"] not in r["weighted_error"]:
            raise ValueError(f"scan_rows[{i}]: its format {r['format']!r} has no weighted error")
        _number(r["kl_mean"], f"scan_rows[{i}]['kl_mean']")
        base = r["weighted_error"][r["format"]]
        costs[r["tensor"]] = {f: r["kl_mean"] * (e / base if base > 0 else 0.0)
                              for f, e in r["weighted_error"].items()}
        sizes[r["tensor"]] = {f: int(b) for f, b in r["bytes"].items()}
    return costs, sizes


def _check_tables(costs, sizes):
    if not isinstance(costs, dict) or not isinstance(sizes, dict) or not costs \
            or set(costs) != set(sizes):
        raise ValueError("costs and sizes must be dicts with the same tensors: "
                         "{tensor: {format: value}}")
    _check_sizes(sizes)
    for t in costs:
        if not isinstance(costs[t], dict) or not costs[t] or set(costs[t]) != set(sizes[t]):
            raise ValueError(f"{t}: costs and sizes must name the same formats")
        for f, c in costs[t].items():
            if not (not isinstance(c, bool) and isinstance(c, (int, float, np.integer, np.floating))
                    and math.isfinite(c) and c >= 0):
                raise ValueError(f"costs[{t!r}][{f!r}] must be a finite number >= 0; got {c!r}")


def _check_sizes(sizes) -> None:
    if not isinstance(sizes, dict) or not sizes:
        raise ValueError(f"sizes must be a non-empty dict {{tensor: {{format: bytes}}}}; got "
                         f"{sizes!r:.80}")
    for t, s in sizes.items():
        if not isinstance(s, dict) or not s:
            raise ValueError(f"sizes[{t!r}] must be a non-empty dict {{format: bytes}}; got "
                             f"{s!r:.80}")
        for f, b in s.items():
            _whole(b, f"sizes[{t!r}][{f!r}] (bytes)")


def smallest(sizes: dict) -> int:
    """Bytes of the smallest possible allocation: every tensor at its smallest format."""
    _check_sizes(sizes)
    return sum(min(s.values()) for s in sizes.values())


def allocate(costs: dict, sizes: dict, budget: int) -> dict:
    """Greedy bit allocation (lesson 14): {tensor: format} under ``budget`` bytes (of these
    tensors), as the module docstring says. Ties go to the first tensor, then the first format
    in the tables' order. ValueError when even the smallest allocation does not fit."""
    _check_tables(costs, sizes)
    if isinstance(budget, bool) or not isinstance(budget, (int, float, np.integer, np.floating)) \
            or not math.isfinite(budget) or budget <= 0:
        raise ValueError(f"budget must be a positive number of bytes (finite); got {budget!r}")
    least = smallest(sizes)
    if least > budget:
        raise ValueError(f"no allocation fits {int(budget)} bytes: the smallest possible is "
                         f"{least} bytes (every tensor at its smallest format)")
    pick = {t: min(s, key=lambda f: (s[f], costs[t][f])) for t, s in sizes.items()}
    total = sum(sizes[t][f] for t, f in pick.items())
    while True:
        best = None
        for t, f0 in pick.items():
            for f, b in sizes[t].items():
                extra = b - sizes[t][f0]
                gain = costs[t][f0] - costs[t][f]
                if extra <= 0 or gain <= 0 or total + extra > budget:
                    continue
                if best is None or gain / extra > best[0]:
                    best = (gain / extra, t, f, extra)
        if best is None:
            return pick
        _, t, f, extra = best
        pick[t] = f
        total += extra


def estimated_cost(costs: dict, pick: dict) -> float:
    """The allocation's estimated KL: the sum of its tensors' costs."""
    if not isinstance(costs, dict) or not isinstance(pick, dict):
        raise TypeError(f"costs and pick must be dicts ({{tensor: {{format: cost}}}} and "
                        f"{{tensor: format}}, what allocate returns); got "
                        f"{type(costs).__name__} and {type(pick).__name__}")
    for t, f in pick.items():
        if t not in costs:
            raise ValueError(f"pick names {t!r}, which costs does not hold")
        if not isinstance(costs[t], dict) or f not in costs[t]:
            known = ", ".join(map(str, costs[t])) if isinstance(costs[t], dict) else repr(costs[t])
            raise ValueError(f"pick[{t!r}] = {f!r} is not a format costs[{t!r}] prices ({known})")
    return float(sum(costs[t][f] for t, f in pick.items()))
