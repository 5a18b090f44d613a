"""Timing, achieved bandwidth and FLOP rate, arithmetic intensity and the roofline (lessons 09-10).

- ``time_gpu``: ``triton.testing.do_bench`` (L2 cache flushed before every run), median ms.
- ``time_gpu_graph``: calls replayed from a CUDA graph (no Python launch overhead, as in a
  serving engine's decode loop), rotating over weight copies larger than L2, median ms.
- ``time_cpu`` / ``compare_cpu``: warm-up, then the median of repeats; ``compare_cpu``
  interleaves the candidates (A B C, B C A, ...) so a slow moment of the machine hits all
  of them alike instead of one.
- ``linear_flops``, ``linear_bytes``, ``arithmetic_intensity``: what a linear layer
  y = x W^T with x (M, K) and W (N, K) computes and must move, for a weight format.
- ``roofline_tflops``, ``ridge_point``, ``plot_roofline``: attainable FLOP rate
  min(peak, intensity x bandwidth), with measured points on top.
- ``layer_floor_ms``, ``floor_speedup``: the fastest a layer can run, and the speed-up over
  BF16 that the roofline allows a format.

Bandwidth comes from ``course_lib.bandwidth.measure_copy_bandwidth`` and peaks from the GPU
catalogue ``course_lib.hardware`` (neither is duplicated here).
"""
from __future__ import annotations

import math
import statistics
import time
from numbers import Real
from pathlib import Path
from typing import Callable

# Bits per stored weight of each weight format a benchmark row can name (scales counted
# separately by ``linear_bytes``).
RESULTS = Path(__file__).resolve().parents[1] / "results"   # measured runs (lessons 09-10)
WEIGHT_BITS = {"fp32": 32, "bf16": 16, "fp16": 16, "int8": 8, "fp8": 8, "int4": 4}

# Linear layers of Llama 3.1 8B and of a 70B-class model: (name, K in, N out). Used by the
# benchmark (``kernels.bench``) and the roofline widget (lessons 09-10).
LAYERS_8B = [("8B q/o_proj", 4096, 4096), ("8B gate/up_proj", 4096, 14336),
             ("8B down_proj", 14336, 4096), ("8B k/v_proj", 4096, 1024)]
LAYERS_70B = [("70B q/o_proj", 8192, 8192), ("70B gate/up_proj", 8192, 28672)]


# ---------------------------------------------------------------------------- argument checks

def _number(name: str, v, minimum: float = 0.0, inclusive: bool = False) -> float:
    """``v`` as a float, refused unless it is a finite real above (or at) ``minimum``."""
    ok = (not isinstance(v, bool) and isinstance(v, Real) and math.isfinite(v)
          and (v >= minimum if inclusive else v > minimum))
    if not ok:
        rel = ">=" if inclusive else ">"
        raise ValueError(f"{name} must be a finite number {rel} {minimum:g}, got {v!r}")
    return float(v)


def _whole(name: str, v, minimum: int = 1) -> int:
    """``v`` as an int, refused unless it is a whole number >= ``minimum`` (not a bool)."""
    if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(v) or int(v) != v \
            or v < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {v!r}")
    return int(v)


def _callable(name: str, fn) -> None:
    if not callable(fn):
        raise TypeError(f"{name} must be a function to call with no arguments (e.g. "
                        f"lambda: layer(x)), got {type(fn).__name__}")


# ---------------------------------------------------------------------------- timing

def time_gpu(fn: Callable[[], object], warmup_ms: int = 25, rep_ms: int = 100) -> float:
    """Median milliseconds of ``fn()`` on a CUDA GPU (lesson 10).

    Uses ``triton.testing.do_bench``, which clears the L2 cache before each run, so a
    weight that fits in L2 is still read from memory as in a real model's decode step.
    """
    from course_lib.device import ensure_triton_mode, require_gpu

    _callable("fn", fn)
    _number("warmup_ms", warmup_ms)
    _number("rep_ms", rep_ms)
    require_gpu("course_lib.bench.time_gpu")
    ensure_triton_mode()
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def speedup_vs_bf16(label: str, prepare: Callable, run: Callable, shapes, batches,
                    dtype=None) -> list[dict]:
    """Median GPU time of a quantized linear against torch BF16 ``F.linear`` (lesson 10).

    For each (K in, N out) in ``shapes`` a random weight (N, K) is made, ``prepare(w)`` turns
    it into the kernel's storage once, and for each batch M both ``F.linear(x, w)`` and
    ``run(x, prepared)`` are timed with ``time_gpu``. Each kernel file's ``benchmark()`` is this
    call; ``python -m kernels.bench`` is the full benchmark that writes a results JSON.
    """
    import torch
    import torch.nn.functional as F

    from course_lib.device import require_gpu

    if not isinstance(label, str) or not label:
        raise ValueError(f"label must be a non-empty name such as 'w4a16', got {label!r}")
    _callable("prepare", prepare)
    _callable("run", run)
    shapes, batches = list(shapes), list(batches)
    if not shapes or not batches:
        raise ValueError("give at least one (K, N) shape and one batch size M to time")
    for shape in shapes:
        if not isinstance(shape, (tuple, list)) or len(shape) != 2:
            raise ValueError(f"each shape must be a pair (K in, N out), got {shape!r}")
        _whole("K", shape[0]), _whole("N", shape[1])
    for M in batches:
        _whole("batch M", M)
    require_gpu(f"course_lib.bench.speedup_vs_bf16 ({label})")
    dtype = dtype or torch.bfloat16
    rows = []
    for K, N in shapes:
        w = torch.randn(N, K, device="cuda", dtype=dtype) / K ** 0.5    # (N, K)
        prepared = prepare(w)
        for M in batches:
            x = torch.randn(M, K, device="cuda", dtype=dtype)            # (M, K)
            t_ref = time_gpu(lambda: F.linear(x, w))
            t_q = time_gpu(lambda: run(x, prepared))
            rows.append({"K": K, "N": N, "M": M, "bf16_ms": t_ref, f"{label}_ms": t_q,
                         "speedup": t_ref / t_q})
    return rows


def time_gpu_graph(fns: list[Callable[[], object]], min_calls: int = 64,
                   replays: int = 10) -> float:
    """Median ms per call of ``fns`` called in turn inside one CUDA graph (lesson 10).

    Decode servers replay CUDA graphs, so Python's launch overhead is not part of a decode
    step; this timer leaves it out too. Pass several functions that read *different copies*
    of the weights (together larger than the L2 cache) so that no call finds its weight in
    L2, as with ``time_gpu``'s flush. Each function runs once before capture (autotuning).
    """
    import torch

    from course_lib.device import require_gpu

    fns = list(fns)
    if not fns:
        raise ValueError("give at least one function to time")
    for fn in fns:
        _callable("each of fns", fn)
    _whole("min_calls", min_calls)
    _whole("replays", replays)
    require_gpu("course_lib.bench.time_gpu_graph")
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    rounds = max(1, -(-min_calls // len(fns)))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(rounds):
            for fn in fns:
                fn()
    graph.replay()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) / (rounds * len(fns)))
    return float(statistics.median(per_call))


def _check_counts(warmup: int, repeats: int) -> None:
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a whole number >= 0, got {warmup!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a whole number >= 1, got {repeats!r}")


def time_cpu(fn: Callable[[], object], warmup: int = 2, repeats: int = 7) -> float:
    """Median milliseconds of ``fn()`` on the CPU after ``warmup`` untimed calls (lesson 10)."""
    _callable("fn", fn)
    return statistics.median(compare_cpu({"fn": fn}, warmup, repeats)["fn"])


def compare_cpu(fns: dict[str, Callable[[], object]], warmup: int = 2, repeats: int = 7,
                budget_s: float | None = None, sync: Callable[[], None] | None = None
                ) -> dict[str, list[float]]:
    """Time several functions A/B-interleaved on the CPU: {name: [ms per repeat]} (lesson 10).

    Each round calls every function once, starting from a different one each round. With
    ``budget_s``, rounds stop early (after at least 3) once the budget is spent. ``sync``
    (for a device that queues work: ``compare_mps``) is called before and after each timed call.
    """
    _check_counts(warmup, repeats)
    if not isinstance(fns, dict) or not fns:
        raise ValueError("give at least one function to time, as {name: function}")
    for name, fn in fns.items():
        _callable(f"fns[{name!r}]", fn)
    if budget_s is not None:
        _number("budget_s", budget_s)
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    samples: dict[str, list[float]] = {n: [] for n in names}
    start = time.perf_counter()
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            if sync is not None:
                sync()
            t0 = time.perf_counter()
            fns[name]()
            if sync is not None:
                sync()
            samples[name].append((time.perf_counter() - t0) * 1e3)
        if budget_s is not None and r >= 2 and time.perf_counter() - start > budget_s:
            break
    return samples


def compare_mps(fns: dict[str, Callable[[], object]], warmup: int = 2, repeats: int = 7,
                budget_s: float | None = None) -> dict[str, list[float]]:
    """``compare_cpu`` on Apple Silicon's GPU: MPS queues work, so each timed call is
    synchronized either side (lesson 10; untested by CI, which has no Mac)."""
    from course_lib.device import require_mps, synchronize

    require_mps("course_lib.bench.compare_mps")
    return compare_cpu(fns, warmup, repeats, budget_s, sync=lambda: synchronize("mps"))


def time_linears(device: str, K: int, N: int, batches=(1, 16), dtypes=("float16", "bfloat16"),
                 warmup: int = 3, repeats: int = 9) -> dict[str, list[dict]]:
    """Median ms of torch's ``F.linear`` for x (M, K) and a random weight (N, K), each batch M and
    16-bit dtype, interleaved, on ``"cpu"`` or ``"mps"`` (lesson 10's Apple-GPU section).
    Returns ``{"rows": [...], "refused": [...]}``: a row per (M, dtype) with ms, bytes (weight
    + x + y), GB/s and TFLOP/s; a dtype the device refuses (bf16 on an older macOS) is listed
    in ``refused`` with the error, not timed."""
    import torch
    import torch.nn.functional as F

    from course_lib.device import synchronize

    if device not in ("cpu", "mps"):
        raise ValueError(f"device must be 'cpu' or 'mps' (a CUDA GPU has its own timer, "
                         f"time_gpu), got {device!r}")
    K, N = _whole("K", K), _whole("N", N)
    batches = [_whole("each batch", M) for M in batches]
    fns, rows, refused = {}, [], []
    for name in dtypes:
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype) or dtype.itemsize != 2:
            raise ValueError(f"dtypes must name 16-bit torch dtypes such as 'float16', got {name!r}")
        try:
            w = torch.randn(N, K, device=device, dtype=dtype) / K ** 0.5          # (N, K)
            xs = {M: torch.randn(M, K, device=device, dtype=dtype) for M in batches}   # (M, K)
            F.linear(xs[batches[0]], w)
            synchronize(device)
        except (RuntimeError, TypeError) as err:        # e.g. bf16 on an older macOS
            refused.append({"dtype": name, "error": f"{type(err).__name__}: {err}".splitlines()[0]})
            continue
        for M in batches:
            fns[(M, name)] = lambda x=xs[M], w=w: F.linear(x, w)
    if fns:
        timed = (compare_mps if device == "mps" else compare_cpu)(
            {f"{M} {n}": f for (M, n), f in fns.items()}, warmup, repeats)
        for (M, name) in fns:
            ms = median_ms(timed[f"{M} {name}"])
            nbytes = linear_bytes(M, N, K, 16, 2, 2)
            rows.append({"M": M, "dtype": name, "ms": ms, "bytes": nbytes,
                         "gbps": achieved_gbps(nbytes, ms),
                         "tflops": achieved_tflops(linear_flops(M, N, K), ms)})
    return {"rows": rows, "refused": refused}


def median_ms(samples: list[float]) -> float:
    """The median of a list of timings (lesson 10)."""
    samples = list(samples)
    if not samples:
        raise ValueError("no timings to take the median of: time at least one repeat")
    for t in samples:
        _number("each timing (ms)", t, 0.0, inclusive=True)
    return float(statistics.median(samples))


# ---------------------------------------------------------------------------- counting

def linear_flops(M: int, N: int, K: int) -> float:
    """FLOPs of y = x W^T with x (M, K), W (N, K): one multiply and one add per term (lesson 09)."""
    M, N, K = _whole("M", M), _whole("N", N), _whole("K", K)
    return 2.0 * M * N * K


def linear_bytes(M: int, N: int, K: int, weight_bits: float = 16, act_bytes: float = 2,
                 out_bytes: float = 2, group_size: int | None = None,
                 scale_bytes: float = 2) -> float:
    """Bytes a linear layer must move at least once: weights, their scales, x and y (lesson 09).

    ``group_size``: one scale of ``scale_bytes`` per that many weights (None: no scales).
    Per-channel scales are ``group_size=K``.
    """
    for name, v in (("M", M), ("N", N), ("K", K)):
        if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(v) or int(v) != v \
                or v < 1:
            raise ValueError(f"{name} must be a positive whole number, got {v!r}")
    _number("weight_bits", weight_bits)
    for name, v in (("act_bytes", act_bytes), ("out_bytes", out_bytes),
                    ("scale_bytes", scale_bytes)):
        _number(name, v, 0.0, inclusive=True)
    if group_size is not None and (isinstance(group_size, bool) or int(group_size) != group_size
                                   or group_size < 1 or K % group_size):
        raise ValueError(f"group_size {group_size!r} must be a positive whole number that divides "
                         f"K = {K} (one scale per group of inputs); per-channel scales are "
                         f"group_size=K, no scales group_size=None")
    weights = N * K * weight_bits / 8
    scales = 0.0 if group_size is None else N * (K / group_size) * scale_bytes
    return weights + scales + M * K * act_bytes + M * N * out_bytes


def arithmetic_intensity(M: int, N: int, K: int, weight_bits: float = 16, act_bytes: float = 2,
                         out_bytes: float = 2, group_size: int | None = None,
                         scale_bytes: float = 2) -> float:
    """FLOPs per byte moved for a linear layer (lesson 09): ``linear_flops / linear_bytes``.

    Batch 1 in BF16 is about 1 FLOP/byte; an H100 needs about 295 to keep its tensor cores
    busy, so decode is memory-bound and fewer bytes per weight is a direct speed-up.
    """
    return linear_flops(M, N, K) / linear_bytes(M, N, K, weight_bits, act_bytes, out_bytes,
                                                group_size, scale_bytes)


def achieved_gbps(n_bytes: float, ms: float) -> float:
    """Bytes moved per second, in GB/s (1e9 bytes), for a kernel that took ``ms`` (lesson 10)."""
    _number("n_bytes", n_bytes, 0.0, inclusive=True)
    _number("ms", ms)
    return n_bytes / (ms * 1e-3) / 1e9


def achieved_tflops(flops: float, ms: float) -> float:
    """FLOP rate in TFLOP/s for ``flops`` done in ``ms`` (lesson 10)."""
    _number("flops", flops, 0.0, inclusive=True)
    _number("ms", ms)
    return flops / (ms * 1e-3) / 1e12


# ---------------------------------------------------------------------------- roofline

def ridge_point(peak_tflops: float, bandwidth_gbps: float) -> float:
    """Intensity (FLOP/byte) where the roofline turns: peak / bandwidth (lesson 09)."""
    _number("peak_tflops", peak_tflops)
    _number("bandwidth_gbps", bandwidth_gbps)
    return peak_tflops * 1e12 / (bandwidth_gbps * 1e9)


def roofline_tflops(intensity: float, peak_tflops: float, bandwidth_gbps: float) -> float:
    """Attainable TFLOP/s at this intensity: min(peak, intensity x bandwidth) (lesson 09)."""
    _number("intensity", intensity)
    _number("peak_tflops", peak_tflops)
    _number("bandwidth_gbps", bandwidth_gbps)
    return min(peak_tflops, intensity * bandwidth_gbps * 1e9 / 1e12)


def layer_floor_ms(M: int, N: int, K: int, weight_bits: float = 16, group_size: int | None = None,
                   bandwidth_gbps: float = 3350.0, peak_tflops: float | None = 989.0) -> float:
    """The time a linear layer cannot beat: max(bytes / bandwidth, FLOPs / peak), in ms.

    Lessons 09-10. Bytes as ``linear_bytes`` (16-bit x, y and scales); ``peak_tflops`` is the
    rate of the maths the format runs (BF16 for weight-only formats, FP8 for FP8 W8A8);
    None ignores compute (a CPU, whose peak we do not catalogue). Defaults: an H100 SXM.
    """
    if not 0 < bandwidth_gbps < math.inf:
        raise ValueError(f"bandwidth_gbps must be a positive number, got {bandwidth_gbps}")
    if peak_tflops is not None and not 0 < peak_tflops < math.inf:
        raise ValueError(f"peak_tflops must be a positive number, or None to ignore compute; "
                         f"got {peak_tflops}")
    t_mem = linear_bytes(M, N, K, weight_bits, group_size=group_size) / (bandwidth_gbps * 1e9)
    t_flop = 0.0 if peak_tflops is None else linear_flops(M, N, K) / (peak_tflops * 1e12)
    return max(t_mem, t_flop) * 1e3


def floor_speedup(M: int, N: int, K: int, weight_bits: float, group_size: int | None = None,
                  bandwidth_gbps: float = 3350.0, base_tflops: float = 989.0,
                  fmt_tflops: float | None = None) -> float:
    """Roofline speed-up of a format over BF16 for one layer: floor(BF16) / floor(format).

    Lessons 09-10. ``fmt_tflops``: the format's maths rate (None: the BF16 rate, as for
    weight-only W8A16/W4A16; an H100's FP8 rate, 1979, for FP8 W8A8).
    """
    base = layer_floor_ms(M, N, K, 16, None, bandwidth_gbps, base_tflops)
    fmt = layer_floor_ms(M, N, K, weight_bits, group_size, bandwidth_gbps,
                         base_tflops if fmt_tflops is None else fmt_tflops)
    return base / fmt


def gain_by_batch(result: dict, fmt: str, layer_kn) -> dict[int, float]:
    """{batch M: baseline ms / ``fmt`` ms} over one layer's decode rows of a results JSON,
    batches in increasing order (lesson 10, whose third exercise has you write it).

    ``layer_kn`` is (K in, N out); each row's ratio is against its own baseline
    (``row["baseline"]``: bf16 on a GPU, fp16 below compute capability 8.0, fp32 on a CPU).
    A time that is missing, zero, negative or NaN (a failed measurement) and two rows for the
    same batch are refused: a ratio from them would be silently wrong.
    """
    if not (isinstance(layer_kn, (tuple, list)) and len(layer_kn) == 2):
        raise ValueError(f"layer_kn must be a (K, N) pair such as (4096, 4096), got {layer_kn!r}")
    K, N = layer_kn
    rows = [r for r in result["layers"] if (r["K"], r["N"]) == (K, N) and r["phase"] == "decode"]
    if not rows:
        have = sorted({(r["K"], r["N"]) for r in result["layers"]})
        raise ValueError(f"no decode rows for layer {K}x{N} in this result; layers: {have}")
    out: dict[int, float] = {}
    for r in sorted(rows, key=lambda r: r["M"]):
        if fmt not in r["results"]:
            raise ValueError(f"format {fmt!r} was not measured at batch {r['M']}; formats: "
                             f"{list(r['results'])}")
        if r["M"] in out:
            raise ValueError(f"two decode rows for batch {r['M']} of layer {K}x{N}: which one "
                             f"is the measurement? Keep one row per batch")
        times = {}
        for name in (r["baseline"], fmt):
            ms = r["results"][name].get("ms")
            if isinstance(ms, bool) or not isinstance(ms, Real) or not 0 < ms < math.inf:
                raise ValueError(f"batch {r['M']}: the time of {name!r} is {ms!r}, not a positive "
                                 f"number of ms (a failed or missing measurement)")
            times[name] = ms
        out[r["M"]] = times[r["baseline"]] / times[fmt]
    return out


def catalogue_gpu(device_name: str, memory_gb: float | None = None):
    """The ``course_lib.hardware`` catalogue entry for a CUDA device name, or None (lesson 10).

    It lives in ``hardware.catalogue_gpu`` (the catalogue's own module, below this one); this
    name stays for the notebooks that import it from here."""
    from course_lib.hardware import catalogue_gpu as from_catalogue

    return from_catalogue(device_name, memory_gb)


def plot_roofline(points, bandwidth_gbps: float, peak_tflops: float | None = None,
                  peak_label: str = "peak", ax=None, title: str = "Roofline",
                  bandwidth_label: str = "measured copy bandwidth"):
    """Log-log roofline: the bandwidth slope, the compute roof, and measured points.

    points: iterable of (label, intensity FLOP/byte, achieved TFLOP/s). Returns the axes.
    Without ``peak_tflops`` only the bandwidth slope is drawn (a CPU run: no catalogue).
    """
    import matplotlib.pyplot as plt
    import numpy as np

    _number("bandwidth_gbps", bandwidth_gbps)
    if peak_tflops is not None:
        _number("peak_tflops", peak_tflops)
    points = list(points)
    for p in points:
        if not isinstance(p, (tuple, list)) or len(p) != 3:
            raise ValueError(f"each point must be (label, intensity, TFLOP/s), got {p!r}")
        _number(f"intensity of {p[0]!r}", p[1])        # log axes: zero or negative cannot show
        _number(f"TFLOP/s of {p[0]!r}", p[2])
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 4.5))
    xs = [p[1] for p in points] or [1.0]
    lo = min(0.25, min(xs) / 2)
    hi = max(4 * max(xs), 2 * ridge_point(peak_tflops, bandwidth_gbps) if peak_tflops else 1e3)
    grid = np.logspace(np.log10(lo), np.log10(hi), 200)
    slope = grid * bandwidth_gbps * 1e9 / 1e12
    ax.loglog(grid, slope if peak_tflops is None else np.minimum(slope, peak_tflops), "k-",
              label=f"{bandwidth_label} {bandwidth_gbps:.0f} GB/s")
    if peak_tflops:
        ax.axhline(peak_tflops, color="grey", ls=":", label=f"{peak_label} {peak_tflops:g} TFLOP/s")
    markers = "osD^v<>ph*"
    for i, (label, x, y) in enumerate(points):
        ax.loglog([x], [y], markers[(i // 10) % len(markers)], label=label)
    ax.set_xlabel("arithmetic intensity (FLOP per byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), ncol=1 + len(points) // 16)
    ax.figure.tight_layout()
    ax.grid(True, which="both", alpha=0.3)
    return ax


# torch ops that launch no compute kernel: views, metadata, allocation, and the copies Triton's
# interpreter makes of a kernel's arguments (``new_empty``/``set_``/``copy_``) on a CPU
_NO_KERNEL_OPS = {"view", "_unsafe_view", "reshape", "detach", "alias", "as_strided", "t",
                  "transpose", "permute", "unsqueeze", "squeeze", "expand", "slice", "select",
                  "split", "empty", "empty_like", "empty_strided", "new_empty", "set_", "copy_",
                  "lift_fresh", "_reshape_alias", "contiguous"}


def count_torch_ops(fn: Callable[[], object], warmup: bool = True) -> list[str]:
    """The torch ops that launch a kernel of their own during one call of ``fn`` (lesson 10):
    each is one more launch on a GPU besides the Triton kernel. Views, allocations and the
    Triton interpreter's argument copies are left out. Works on a CPU (a dispatch mode).
    ``warmup``: call ``fn`` once first, unrecorded, so that a GPU's first-call autotuning
    (which runs torch ops of its own) is not counted."""
    from torch.utils._python_dispatch import TorchDispatchMode

    _callable("fn", fn)
    if warmup:
        fn()
    seen: list[str] = []

    class _Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name not in _NO_KERNEL_OPS:
                seen.append(name)
            return func(*args, **(kwargs or {}))

    with _Record():
        fn()
    return seen


def cuda_kernels_launched(fn: Callable[[], object]) -> list[str]:
    """Names of the CUDA kernels one call of ``fn`` launches, from torch's profiler (lesson 10:
    which kernel a batch size runs). Needs a CUDA GPU; ``fn`` is called once untimed first."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    _callable("fn", fn)
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_kernels_launched needs a CUDA GPU; on a CPU use count_torch_ops")
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if str(e.device_type).endswith("CUDA")]


def nibbles_of_word(word: int) -> list[int]:
    """The 8 nibbles of a 32-bit word, element j = bits 4j..4j+3, lowest first (lesson 09)."""
    if isinstance(word, bool) or not isinstance(word, int) or not -2 ** 31 <= word < 2 ** 32:
        raise ValueError(f"word must be a 32-bit integer (signed or unsigned), got {word!r}")
    return [(word & 0xFFFFFFFF) >> (4 * j) & 0xF for j in range(8)]


def plot_nibble_layout(word: int, ax=None):
    """Draw a 32-bit word as its 32 bits, grouped into the 8 nibbles that hold codes 0..7
    (element j in bits 4j..4j+3; bit 31 on the left as a register prints it). Lesson 09."""
    import matplotlib.pyplot as plt

    nib = nibbles_of_word(word)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 1.9))
    for bit in range(32):
        x = 31 - bit                                                    # bit 31 drawn first
        j = bit // 4
        ax.add_patch(plt.Rectangle((x, 0), 1, 1, fc=plt.cm.tab10(j % 10), alpha=0.35, ec="k", lw=0.5))
        ax.text(x + 0.5, 0.5, str((nib[j] >> (bit % 4)) & 1), ha="center", va="center", fontsize=8)
        if bit % 4 == 0:
            ax.text(x + 0.5, -0.35, str(bit), ha="center", va="center", fontsize=7)
    for j in range(8):
        x = 31 - 4 * j - 3
        ax.text(x + 2, 1.4, f"element {j}\nu = {nib[j]}", ha="center", va="center", fontsize=7)
    ax.set_xlim(-0.5, 32.5)
    ax.set_ylim(-0.7, 2.0)
    ax.set_axis_off()
    ax.set_title(f"0x{word & 0xFFFFFFFF:08X}: eight 4-bit codes, element j in bits 4j..4j+3 "
                 f"(bit numbers below)", fontsize=9)
    return ax


def plot_gemv_tile(N: int, K: int, M: int, block_n: int, block_k: int, program: int = 0,
                   step: int = 0, ax=None):
    """One GEMV program's work (lesson 09): the weight W (N x K) cut into block_n x block_k
    tiles, the rows ``program`` owns (for every token of the batch), the tile it loads at K
    step ``step``, and the x tile (M x block_k) it multiplies that tile with."""
    import matplotlib.pyplot as plt

    for name, v in (("N", N), ("K", K), ("M", M), ("block_n", block_n), ("block_k", block_k)):
        _whole(name, v)
    n_prog, n_step = math.ceil(N / block_n), math.ceil(K / block_k)
    _whole("program", program, 0)
    _whole("step", step, 0)
    if program >= n_prog or step >= n_step:
        raise ValueError(f"program must be below {n_prog} and step below {n_step} for "
                         f"N={N}, K={K} in {block_n} x {block_k} tiles")
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4.2))
    gap = max(K, N) * 0.08
    ax.add_patch(plt.Rectangle((0, 0), K, N, fc="white", ec="k"))                # W (N, K)
    for i in range(1, n_prog):
        ax.plot([0, K], [N - i * block_n] * 2, color="0.8", lw=0.6)
    for s_ in range(1, n_step):
        ax.plot([s_ * block_k] * 2, [0, N], color="0.8", lw=0.6)
    top = N - program * block_n
    rows = min(block_n, N - program * block_n)
    ax.add_patch(plt.Rectangle((0, top - rows), K, rows, fc="tab:blue", alpha=0.15))
    cols = min(block_k, K - step * block_k)
    ax.add_patch(plt.Rectangle((step * block_k, top - rows), cols, rows, fc="tab:blue", alpha=0.6))
    xh = max(M, 1) * N / 16                                                       # x drawn above W
    ax.add_patch(plt.Rectangle((0, N + gap), K, xh, fc="white", ec="k"))
    ax.add_patch(plt.Rectangle((step * block_k, N + gap), cols, xh, fc="tab:orange", alpha=0.6))
    ax.text(-gap / 4, N + gap + xh / 2, f"x: {M} tokens", ha="right", va="center", fontsize=8)
    ax.text(-gap / 4, top - rows / 2, f"program {program}:\n{rows} outputs", ha="right",
            va="center", fontsize=8)
    ax.text(K / 2, -gap / 2, f"W: N = {N} outputs x K = {K} inputs; {n_prog} programs, "
            f"{n_step} steps of {block_k} along K", ha="center", va="top", fontsize=8)
    ax.set_xlim(-gap * 2.2, K + gap / 2)
    ax.set_ylim(-gap * 1.5, N + gap + xh + gap / 2)
    ax.set_aspect("auto")
    ax.set_axis_off()
    ax.set_title(f"One program, step {step}: a {rows} x {cols} weight tile (blue) times the "
                 f"{M} x {cols} x tile (orange), for every token at once", fontsize=9)
    return ax


__all__ = ["compare_mps", "time_linears", "LAYERS_8B", "LAYERS_70B", "time_gpu", "time_gpu_graph", "time_cpu", "compare_cpu", "median_ms", "linear_flops", "linear_bytes",
           "arithmetic_intensity", "achieved_gbps", "achieved_tflops", "ridge_point",
           "roofline_tflops", "layer_floor_ms", "floor_speedup", "catalogue_gpu", "plot_roofline", "WEIGHT_BITS",
           "RESULTS", "gain_by_batch", "count_torch_ops", "cuda_kernels_launched", "nibbles_of_word", "plot_nibble_layout", "plot_gemv_tile"]
