"""Which tensors deserve more bits: per-tensor sensitivity and a bit allocation under a byte budget
(lesson 14).

**The scan** (:func:`scan`, ``python -m course_lib.sensitivity scan`` writes
``results/kquants_sensitivity_smollm2.json``): every Linear of SmolLM2 is quantized *alone* to
a 4.5-bit format its width allows (Q4_K for the 1536-wide ``ffn_down``, Q4_0 for the 576-wide
rest; llama.cpp's own rounding, :mod:`course_lib.kquants`), the rest kept at F16, and the KL
divergence from the F16 model is measured on fixed windows of the *calibration* text
(:func:`scan_windows`, the clean protocol's): the scan chooses the bits, so it never sees the
evaluation windows that score the files it chooses. Layers before the quantized one do not
change, so their outputs are computed once and reused.

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
import os
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


def scan_windows(n_windows: int = WINDOWS, window: int = WINDOW):
    """The token windows (n_windows, window) the scan measures on (window - 1 predictions
    each): calibration text of the clean protocol, drawn with :data:`SCAN_SEED` (lesson 14
    re-measures the first live)."""
    from course_lib.methods import calibration as cal
    return cal.calibration_ids("smollm2", n_windows, window, SCAN_SEED, PROTOCOL)


def low_format(cols: int) -> str:
    """The 4.5-bit format the scan uses: Q4_K where rows are a multiple of 256, else Q4_0."""
    return "q4_k" if kquants.fits("q4_k", cols) else "q4_0"


def candidates(cols: int) -> list[str]:
    """The formats of :data:`CANDIDATES` that rows of ``cols`` can be stored in."""
    return [f for f in CANDIDATES if kquants.fits(f, cols)]


def roundtrip(w: torch.Tensor, fmt: str, imatrix=None) -> torch.Tensor:
    """w (out, in) quantized with llama.cpp's ``fmt`` and decoded again, fp32."""
    raw = kquants.quantize(w, fmt, imatrix)
    return torch.from_numpy(kquants.dequantize(raw, fmt, w.shape[1]))


# ----------------------------------------------------------------------------- measuring
class Scanner:
    """KL of the model with one Linear replaced, on fixed windows, reusing the unchanged
    layers' outputs. ``model``: a course LlamaModel (the F16 reference); ``windows`` (n, T)."""

    def __init__(self, model, windows: torch.Tensor):
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
        mod = self.model.model.layers[layer].get_submodule(MODULES[kind])
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
    table (and :func:`write` saves it). ``layers``/``kinds`` restrict it (the lesson's slice)."""
    from course_lib import imatrix, smollm
    from course_lib.methods import calibration as cal
    if model is None:
        model = f16_model()
    n_layers = model.config.num_hidden_layers
    layers = list(range(n_layers)) if layers is None else list(layers)
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


def f16_model():
    """SmolLM2 with every weight rounded to fp16: what the course's F16 file holds."""
    from course_lib import smollm
    m = smollm.load()
    for p in m.parameters():
        p.data = p.data.half().float()
    return m


def write(path: Path = RESULTS_FILE, **kw) -> dict:
    """The full scan, saved with the machine it ran on."""
    from course_lib import device
    torch.manual_seed(0)
    out = scan(**kw)
    out["machine"] = {**device.machine_record(), "cpus": os.cpu_count(),
                      "load_avg_1min": os.getloadavg()[0]}
    load = out["machine"]["load_avg_1min"]
    out["note"] = (f"1-minute load average {load:.1f} on {os.cpu_count()} CPUs when it finished"
                   + (": a shared machine, so the seconds are an upper bound; the KL values do "
                      "not depend on load" if load > 0.5 * (os.cpu_count() or 1) else ""))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    return out


def load_scan(path: Path = RESULTS_FILE) -> dict:
    """The committed scan."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} is missing: run `python -m course_lib.sensitivity "
                                f"scan` (about 15 minutes on 2 cores)")
    return json.loads(Path(path).read_text())


def heat_map(scan_rows: list[dict], n_layers: int = 30) -> np.ndarray:
    """KL (layers, kinds) from the scan's rows (NaN where a cell was not scanned)."""
    out = np.full((n_layers, len(KINDS)), np.nan)
    for r in scan_rows:
        out[r["layer"], KINDS.index(r["kind"])] = r["kl_mean"]
    return out


# ----------------------------------------------------------------------------- allocating
def costs_from_scan(scan_rows: list[dict]) -> tuple[dict, dict]:
    """({tensor: {format: estimated KL}}, {tensor: {format: bytes}}) from the scan: measured
    at the 4.5-bit format, scaled by the weighted-error ratio for the others."""
    costs, sizes = {}, {}
    for r in scan_rows:
        base = r["weighted_error"][r["format"]]
        costs[r["tensor"]] = {f: r["kl_mean"] * (e / base if base > 0 else 0.0)
                              for f, e in r["weighted_error"].items()}
        sizes[r["tensor"]] = {f: int(b) for f, b in r["bytes"].items()}
    return costs, sizes


def _check_tables(costs, sizes):
    if not isinstance(costs, dict) or not costs or set(costs) != set(sizes):
        raise ValueError("costs and sizes must be dicts with the same tensors: "
                         "{tensor: {format: value}}")
    for t in costs:
        if not costs[t] or set(costs[t]) != set(sizes[t]):
            raise ValueError(f"{t}: costs and sizes must name the same formats")
        for f, c in costs[t].items():
            if not (isinstance(c, (int, float)) and math.isfinite(c) and c >= 0):
                raise ValueError(f"costs[{t!r}][{f!r}] must be a finite number >= 0; got {c!r}")


def smallest(sizes: dict) -> int:
    """Bytes of the smallest possible allocation: every tensor at its smallest format."""
    return sum(min(s.values()) for s in sizes.values())


def allocate(costs: dict, sizes: dict, budget: int) -> dict:
    """Greedy bit allocation (lesson 14): {tensor: format} under ``budget`` bytes (of these
    tensors), as the module docstring says. Ties go to the first tensor, then the first format
    in the tables' order. ValueError when even the smallest allocation does not fit."""
    _check_tables(costs, sizes)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0:
        raise ValueError(f"budget must be a positive number of bytes; got {budget!r}")
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
    return float(sum(costs[t][f] for t, f in pick.items()))


def main(argv=None) -> None:
    import argparse
    p = argparse.ArgumentParser(prog="python -m course_lib.sensitivity",
                                description="lesson 14's per-tensor sensitivity scan")
    p.add_argument("command", choices=["scan"])
    p.add_argument("--windows", type=int, default=WINDOWS)
    p.add_argument("--window", type=int, default=WINDOW)
    p.add_argument("--cal-windows", type=int, default=CAL_WINDOWS)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: the machine "
                   "it was written on was shared)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    out = write(n_windows=a.windows, window=a.window, cal_windows=a.cal_windows)
    top = sorted(out["rows"], key=lambda r: -r["kl_mean"])[:10]
    for r in top:
        print(r["tensor"], r["format"], f"{r['kl_mean']:.5f}")
    print(f"{len(out['rows'])} tensors in {out['seconds']} s -> {RESULTS_FILE}")


if __name__ == "__main__":
    main()
