"""Layer timing and the results JSON: one part of the benchmark ``python -m kernels.bench``
(lesson 10; ``kernels/bench.py`` runs the parts in order).

- before timing, every backend's output is checked against exact fp32 ``F.linear``
  (``output_error``, ``usable_backends``): a broken op is left out, a wrong one is marked;
- ``time_layers``: every backend on every (layer, batch), interleaved on a CPU, from CUDA
  graphs over weight copies larger than L2 on a GPU (``FIELDS`` says what each time means);
- the JSON: ``device_record``, ``versions``, ``write_results`` / ``load_results``, and the
  readings lesson 10 makes of it (``layer_table``, ``gain_by_batch``).
"""
from __future__ import annotations

import dataclasses
import json
import math
import platform
import re
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from course_lib import bench
from course_lib.paths import ROOT
from kernels._common import Backend

SCHEMA = 1


# What each timing field means (written into every results JSON).
FIELDS = {
    "ms": "headline time per call. GPU: median per call replayed from a CUDA graph over weight "
          "copies that together exceed 3x L2 (no launch overhead, no L2 reuse). CPU: median "
          "of repeats, candidates interleaved",
    "ms_eager": "GPU only: triton.testing.do_bench median with the L2 cache flushed before "
                "each call, called from Python: includes the launch overhead (a few us), which "
                "dominates small layers; not the figure a serving engine sees",
    "gbps": "bytes the layer must move (weights, 16-bit scales, x, y once) / ms",
    "ratio_vs_baseline": "baseline ms / this ms (the baseline is bf16, or fp16 below cc 8.0; "
                         "fp32 on a CPU)",
    "check_rel_err": "relative error of the output against exact fp32 F.linear, checked once "
                     "per layer before timing; output_ok: below the format's tolerance",
}


# ----------------------------------------------------------- the output check before timing

def backend_device(b: Backend, device: str) -> str:
    """Where a backend's tensors live: CPU-only ops always get CPU tensors."""
    return b.device or device


def output_error(b: Backend, w: torch.Tensor, x: torch.Tensor, state=None) -> float:
    """Relative error of a backend's output against exact fp32 ``F.linear(x, w)``."""
    dev = backend_device(b, str(w.device))
    w_b, x_b = w.to(dev), x.to(dev)
    state = b.prepare(w_b) if state is None else state
    y = b.apply(x_b.to(b.act_dtype), state).float()                      # (M, N)
    exact = F.linear(x_b.float(), w_b.float())                           # (M, N)
    return ((y - exact).norm() / exact.norm()).item()


def usable_backends(backends: list[Backend], log=print, device: str = "cpu") -> list[Backend]:
    """The backends that run on a small layer and agree with fp32 F.linear.

    "Agree" allows for quantization (``Backend.tolerance``); a broken op is off by 100% or
    more. ``device``: where backends without a fixed device run (the benchmark's device).
    """
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 256, generator=gen) / 16                       # (N, K)
    x = torch.randn(2, 256, generator=gen)                              # (M, K)
    out = []
    for b in backends:
        try:
            err = output_error(b, w.to(backend_device(b, device)), x)
            if not err < b.tolerance():
                raise ValueError(f"relative error {err:.3f} against fp32 F.linear")
        except Exception as e:  # noqa: BLE001  (a private op missing or changed: say so, go on)
            if b.baseline:
                raise
            log(f"  skipping {b.name}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            continue
        out.append(b)
    return out


# ---------------------------------------------------------------------------- layer timings

def _bytes(b: Backend, M: int, N: int, K: int) -> float:
    gs = K if b.group_size == "per_channel" else b.group_size
    act = 4 if b.act_dtype == torch.float32 else 2
    return bench.linear_bytes(M, N, K, b.weight_bits, act, act, gs)


def time_layers(backends: list[Backend], layers, batches, timer: str, device: str,
                budget_s: float | None = None, repeats: int = 7, log=print,
                on_row=None) -> list[dict]:
    """Time every backend on every (layer, batch); one row per (layer, batch)."""
    rows = []
    start = time.perf_counter()
    gen = torch.Generator(device=device).manual_seed(0)
    for name, K, N in layers:
        if budget_s is not None and time.perf_counter() - start > budget_s:
            log(f"  time budget spent: skipping {name} {K}x{N} and later shapes")
            break
        w = torch.randn(N, K, generator=gen, device=device) / math.sqrt(K)    # (N, K)
        dev = {b.name: backend_device(b, device) for b in backends}   # CPU ops: CPU tensors
        w_on = {d: w.to(d) for d in set(dev.values())}
        states = {b.name: b.prepare(w_on[dev[b.name]]) for b in backends}
        checks = {}
        for M in batches:
            x = torch.randn(M, K, generator=gen, device=device)               # (M, K)
            xs = {b.name: x.to(dev[b.name], b.act_dtype) for b in backends}
            fns = {b.name: (lambda b=b: b.apply(xs[b.name], states[b.name])) for b in backends}
            if not checks:   # every backend's output, checked once per layer before timing
                for b in backends:
                    err = output_error(b, w_on[dev[b.name]], x[:min(M, 4)], states[b.name])
                    checks[b.name] = {"check_rel_err": err, "output_ok": bool(err < b.tolerance())}
                    if not checks[b.name]["output_ok"]:
                        log(f"  WRONG OUTPUT: {b.name} on {name} {K}x{N}: relative error "
                            f"{err:.3f} > {b.tolerance()} (timed anyway, marked output_ok false)")
            extra = {}
            if timer == "gpu":
                ms, extra = _time_gpu_layer(backends, states, xs)
            else:
                left = None if budget_s is None else max(0.5, budget_s - (time.perf_counter() - start))
                reps = repeats if M <= 64 else min(3, repeats)
                samples = bench.compare_cpu(fns, warmup=1, repeats=reps, budget_s=left / 4 if left else None)
                ms = {n: bench.median_ms(s) for n, s in samples.items()}
            base = next(b.name for b in backends if b.baseline)
            res = {}
            for b in backends:
                nbytes = _bytes(b, M, N, K)
                res[b.name] = {"ms": ms[b.name], "bytes": nbytes,
                               "gbps": bench.achieved_gbps(nbytes, ms[b.name]),
                               "tflops": bench.achieved_tflops(bench.linear_flops(M, N, K), ms[b.name]),
                               "ratio_vs_baseline": ms[base] / ms[b.name],
                               "ratio_vs_bf16": ms["bf16"] / ms[b.name] if "bf16" in ms else None}
                res[b.name].update(extra.get(b.name, {}))
                res[b.name].update(checks[b.name])
            rows.append({"layer": name, "K": K, "N": N, "M": M,
                         "phase": "decode" if M <= 64 else "prefill", "baseline": base,
                         "results": res})
            if on_row is not None:
                on_row(rows[-1])
            log(f"  {name:18s} {K:5d}x{N:<5d} M={M:<4d} " + "  ".join(
                f"{n.split(' ')[0]} {r['ms']:.3f} ms ({r['ratio_vs_baseline']:.2f}x)"
                for n, r in res.items()))
        del w, states
    return rows


def _clone(state):
    """A copy of a prepared weight (tensors cloned), for rotating buffers."""
    if isinstance(state, torch.Tensor):
        return state.clone()
    if isinstance(state, tuple):
        return tuple(_clone(s) for s in state)
    if dataclasses.is_dataclass(state):
        return dataclasses.replace(state, **{f.name: _clone(getattr(state, f.name))
                                            for f in dataclasses.fields(state)})
    return state


def _state_bytes(state) -> int:
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, tuple):
        return sum(_state_bytes(s) for s in state)
    if dataclasses.is_dataclass(state):
        return sum(_state_bytes(getattr(state, f.name)) for f in dataclasses.fields(state))
    return 0


def _time_gpu_layer(backends, states, xs):
    """Per backend: CUDA-graph time over weight copies that overflow L2 (the headline "ms"),
    and the eager ``do_bench`` time with L2 flushed ("ms_eager", Python overhead included)."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size or 50 * 2 ** 20
    ms, extra = {}, {}
    for b in backends:
        st, x = states[b.name], xs[b.name]
        copies = min(64, max(1, math.ceil(3 * l2 / max(1, _state_bytes(st)))))
        rot = [st] + [_clone(st) for _ in range(copies - 1)]
        eager = bench.time_gpu(lambda: b.apply(x, st))
        try:
            ms[b.name] = bench.time_gpu_graph([lambda s=s: b.apply(x, s) for s in rot])
            extra[b.name] = {"ms_eager": eager, "cuda_graph": True, "weight_copies": copies}
        except Exception as err:  # noqa: BLE001  (recorded: the eager time is used instead)
            print(f"  ({b.name}: CUDA graph timing failed, eager time used: {type(err).__name__}: {err})")
            ms[b.name] = eager
            extra[b.name] = {"ms_eager": eager, "cuda_graph": False, "weight_copies": 1}
        del rot
    return ms, extra


# ------------------------------------------------------------------------- the results JSON

def device_record() -> dict:
    from course_lib import device

    info = device.detect()
    return {"kind": info.kind, "name": info.name,
            "compute_capability": list(info.compute_capability) if info.compute_capability else None,
            "memory_gb": info.memory_gb, "cpu_count": info.cpu_count,
            "triton_interpret": info.triton_interpret}


def versions() -> dict:
    import numpy

    from kernels._triton import triton  # its version is None where Triton is not installed

    return {"python": platform.python_version(), "torch": torch.__version__,
            "triton": triton.__version__, "numpy": numpy.__version__,
            "cuda": torch.version.cuda, "platform": platform.platform()}


def device_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia_h100_80gb_hbm3' (file-name safe)."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")[:60] or "device"


def write_results(result: dict, out_dir: Path | str = ROOT / "results") -> Path:
    """Write ``result`` as results/bench_<kind>_<device>.json and return the path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if "machine" not in result:     # what the numbers were computed on
        from course_lib import device
        result["machine"] = device.machine_record()
    dev = result["device"]
    suffix = "_quick" if result.get("quick") else ""
    path = out_dir / f"bench_{dev['kind']}_{device_slug(dev['name'])}{suffix}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path


def load_results(path: Path | str) -> dict:
    """Read a results JSON (lesson 10 reads the committed ones)."""
    data = json.loads(Path(path).read_text())
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: results schema {data.get('schema')!r}, expected {SCHEMA}")
    return data


def layer_table(result: dict, phase: str | None = None) -> str:
    """The layer timings as text: one line per (layer, batch), ms and ratio per format."""
    rows = [r for r in result["layers"] if phase is None or r["phase"] == phase]
    if not rows:
        return "(no rows)"
    names = list(rows[0]["results"])
    short = [n.split(" (")[0] for n in names]
    head = f"{'layer':18s} {'K x N':>12s} {'M':>5s} " + " ".join(f"{s:>18s}" for s in short)
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = " ".join(f"{r['results'][n]['ms']:8.3f} ms {r['results'][n]['ratio_vs_baseline']:5.2f}x"
                         for n in names)
        lines.append(f"{r['layer']:18s} {r['K']:>5d}x{r['N']:<6d} {r['M']:5d} {cells}")
    return "\n".join(lines)


def gain_by_batch(result: dict, fmt: str, layer_kn: tuple[int, int]) -> dict[int, float]:
    """{batch M: baseline ms / ``fmt`` ms} over one layer's decode rows of a results JSON.

    Lesson 10 reads how a format's gain changes with the batch, from any machine's JSON
    (``load_results``). ``layer_kn`` is (K in, N out); the baseline is the row's own
    (``row["baseline"]``: bf16 on a GPU, fp16 below cc 8.0, fp32 on a CPU).
    """
    K, N = layer_kn
    rows = [r for r in result["layers"] if (r["K"], r["N"]) == (K, N) and r["phase"] == "decode"]
    if not rows:
        have = sorted({(r["K"], r["N"]) for r in result["layers"]})
        raise ValueError(f"no decode rows for layer {K}x{N} in this result; layers: {have}")
    if fmt not in rows[0]["results"]:
        raise ValueError(f"format {fmt!r} was not measured; formats: {list(rows[0]['results'])}")
    return {r["M"]: r["results"][r["baseline"]]["ms"] / r["results"][fmt]["ms"]
            for r in sorted(rows, key=lambda r: r["M"])}
