"""The decode-speed benchmark: ``python -m kernels.bench`` (``make bench``), lesson 10.

Runs on whatever is there and writes ``results/bench_<device>.json``:

* on a CUDA GPU: torch BF16 ``F.linear`` (FP16 below compute capability 8.0, where there
  are no BF16 tensor cores) against the course's Triton kernels (``GPU_KERNEL_MODULES``:
  W8A16, W4A16 group 128, FP8 W8A8 with activation quantization when compute capability
  >= 8.9) and against what a user would pick instead (``peer_backends``: torch's int4
  ``_weight_int4pack_mm``, ``torch.compile``d int8 weight-only with gpt-fast's settings,
  ``torch._scaled_mm`` row-wise FP8, gemlite when bundled), on Llama-3.1-8B layer
  shapes (4096x4096, 4096x14336, 14336x4096, 4096x1024) and 70B-like ones (8192x8192,
  8192x28672), batch 1, 4, 16, 64, prefill M=2048 (and M=4096 for W8A8), timed from CUDA
  graphs over weight copies larger than L2 (``FIELDS`` says what each timing means); then
  end-to-end decode tokens/s of a stack of 8B-shaped decoder layers (random weights;
  attention left out; as many layers as half the free GPU memory holds, up to 32);
* on a CPU: what a CPU can run fast, never the Triton interpreter: fp32 and bf16
  ``F.linear`` against torch's weight-only CPU kernels ``_weight_int8pack_mm`` (int8,
  per channel) and ``_weight_int4pack_mm_for_cpu`` (int4, group 128), A/B interleaved,
  within a time budget (``--quick`` for notebooks and tests). These backends are CPU-only:
  they always get CPU tensors, even on a GPU machine.

Every backend's output is checked against exact fp32 ``F.linear`` once per layer before it
is timed (``check_rel_err``, ``output_ok``). Copy *and* read-only bandwidth are measured:
a GEMV only reads, so bandwidth targets are shares of the read figure.
Shapes are written (K in) x (N out), as the layers map K features to N.
The JSON holds the device, versions, every timing (median ms, GB/s, TFLOP/s, ratio to the
baseline) and, for each performance target of the course, the measured value and whether
it was met (null when this machine cannot measure it).

This file runs the benchmark; its parts, each readable in one sitting:

- ``kernels/bench_layers.py``   the output check, layer timing, the results JSON
- ``kernels/bench_peers.py``    what a user would pick instead (CPU and GPU peers)
- ``kernels/bench_decode.py``   the decoder stack and end-to-end decode tokens/s
- ``kernels/bench_targets.py``  the course's performance targets; ``--separate``
- here: which backends this machine compares (``GPU_KERNEL_MODULES``: one line per kernel
  file, each providing ``bench_backends``), ``run`` and the command line. The names the
  notebooks use (``kbench.run``, ``load_results``, ``layer_table``...) are all importable
  from here.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import time
from pathlib import Path

import kernels  # noqa: F401  (Triton mode first)
import torch
import torch.nn.functional as F

from course_lib import bench, device
from course_lib.paths import ROOT
from kernels._common import Backend
from kernels.bench_decode import DecoderStack, decode_layers_that_fit, decode_tokens_per_s
from kernels.bench_layers import (FIELDS, SCHEMA, backend_device, device_record, device_slug,
                                  gain_by_batch, layer_table, load_results, output_error,
                                  time_layers, usable_backends, versions, write_results)
from kernels.bench_peers import (GEMLITE_DIR, cpu_backends, gemlite_backends, int4pack_params,
                                 peer_backends)
from kernels.bench_targets import evaluate_targets, separating_measurements, targets_table

LAYERS_8B, LAYERS_70B = bench.LAYERS_8B, bench.LAYERS_70B   # (name, K in, N out)
BATCHES = (1, 4, 16, 64)
PREFILL_M = 2048


# --------------------------------------------------------------- what this machine compares

# One line per kernel file: each has ``bench_backends(act_dtype) -> [Backend]`` (GPU side).
GPU_KERNEL_MODULES = [
    "kernels.w8a16",
    "kernels.w4a16",
    "kernels.fp8_w8a8",
    "kernels.w8a8_int8",
]


def gpu_backends(with_fp8: bool, act_dtype: torch.dtype = torch.bfloat16,
                 peers: bool = False) -> list[Backend]:
    """The 16-bit baseline (BF16 ``F.linear``; FP16 on GPUs without BF16 tensor cores,
    compute capability below 8.0), the course's Triton kernels (``GPU_KERNEL_MODULES``),
    and with ``peers`` what a user would pick instead (``peer_backends``)."""
    import importlib

    name = "bf16" if act_dtype == torch.bfloat16 else "fp16"
    out = [Backend(name, lambda w: w.to(act_dtype).contiguous(), lambda x, w: F.linear(x, w),
                   act_dtype, 16, None, baseline=True)]
    for mod in GPU_KERNEL_MODULES:
        out += importlib.import_module(mod).bench_backends(act_dtype, with_fp8=with_fp8)
    if peers:
        out += peer_backends(act_dtype, with_fp8)
    return out


def machine_backends(log=print, probe: bool = True) -> list[Backend]:
    """What ``run()`` compares on this machine (lesson 10 lists them).

    A GPU: the 16-bit baseline (BF16; FP16 below compute capability 8.0, no BF16 tensor
    cores there), the course's kernels (FP8 from 8.9) and the peer baselines, each probed on
    a small layer. A CPU (or the interpreter): fp32, bf16 and torch's CPU weight-only ops.
    """
    if torch.cuda.is_available() and not kernels.INTERPRET:
        cc = torch.cuda.get_device_capability(0)
        act = torch.bfloat16 if cc >= (8, 0) else torch.float16
        out = gpu_backends(tuple(cc) >= (8, 9), act, peers=True)
        return usable_backends(out, log, "cuda") if probe else out
    return cpu_backends(probe=probe, log=log)


# -------------------------------------------------------------------------------------- run

def _copy_bandwidth(device: str, quick: bool) -> float:
    """Measured copy bandwidth (course_lib.bandwidth). A quick CPU run copies 64 MB; a GPU
    always copies its default 1 GB, far past any L2 cache."""
    from course_lib.bandwidth import measure_copy_bandwidth

    kwargs = {"size_mb": 64, "repeats": 3} if (quick and device == "cpu") else {}
    return float(measure_copy_bandwidth(device, **kwargs).median_gbps)


def _read_bandwidth(device: str, quick: bool) -> float:
    """Measured read-only bandwidth (a sum over a large tensor), sized as the copy."""
    from course_lib.bandwidth import measure_read_bandwidth

    kwargs = {"size_mb": 64, "repeats": 3} if (quick and device == "cpu") else {}
    return float(measure_read_bandwidth(device, **kwargs).median_gbps)


def placement(backends, gpu: bool) -> tuple[str, str]:
    """(device, timer) for a run: CPU-only backends are timed on the CPU even when a GPU
    is present (``kernels/gpu_check.sh`` runs the CPU tests on a GPU machine)."""
    if backends is not None and all(b.device == "cpu" for b in backends):
        return "cpu", "cpu"
    return ("cuda", "gpu") if gpu else ("cpu", "cpu")


def run(quick: bool = False, budget_s: float = 150.0, log=print, decode_layers: int | None = None,
        layers=None, batches=None, prefill_m: int | None = None, backends=None,
        timer: str | None = None, decode_cfg: dict | None = None, repeats: int = 7,
        threads: int | None = 1, checkpoint=None) -> dict:
    """Run the benchmark on this machine and return the results dict (see module docstring).

    ``quick``: a subset sized for a notebook or a test (well under a minute on a CPU).
    ``prefill_m``: None = 2048 (256 in a quick CPU run), 0 = skip prefill. The other keyword
    overrides exist for tests (tiny shapes through the GPU code path, fewer repeats).
    ``checkpoint(partial_result)`` is called after every timed row, so a run cut short
    (a time limit on a lent GPU) still leaves its measurements behind.
    ``threads``: torch's CPU threads during a CPU run (restored afterwards); 1 by default,
    because on a shared or busy machine multi-threaded timings wait on the OS scheduler
    (steps of several ms) and the ratios turn to noise. None keeps torch's setting.
    """
    gpu = torch.cuda.is_available() and not kernels.INTERPRET
    old_threads = torch.get_num_threads()
    if threads and not gpu:
        torch.set_num_threads(threads)
    try:
        return _run(quick, budget_s, log, decode_layers, layers, batches, prefill_m, backends,
                    timer, decode_cfg, repeats, gpu, checkpoint)
    finally:
        torch.set_num_threads(old_threads)


def _run(quick, budget_s, log, decode_layers, layers, batches, prefill_m, backends, timer,
         decode_cfg, repeats, gpu, checkpoint=None) -> dict:
    t0 = time.perf_counter()
    dev, auto_timer = placement(backends, gpu)
    gpu = dev == "cuda"
    timer = timer or auto_timer
    rec = device_record()
    log(f"device: {rec['name']} ({dev}); quick={quick}"
        + ("" if gpu else f"; {torch.get_num_threads()} CPU thread(s)"))
    copy_gbps = _copy_bandwidth(dev, quick)
    read_gbps = _read_bandwidth(dev, quick)
    log(f"copy bandwidth: {copy_gbps:.1f} GB/s, read bandwidth: {read_gbps:.1f} GB/s")
    cat = bench.catalogue_gpu(rec["name"], rec["memory_gb"]) if gpu else None
    cc = tuple(rec["compute_capability"] or (0, 0))
    with_fp8 = gpu and cc >= (8, 9)
    if backends is None:
        backends = machine_backends(log)
    is_hopper = cc[0] == 9
    result = {
        "schema": SCHEMA,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": rec, "machine": device.machine_record(), "versions": versions(),
        "quick": quick,
        "cpu_threads": None if gpu else torch.get_num_threads(),
        "timing": ("GPU: ms = median per call replayed from a CUDA graph, rotating over weight "
                   "copies that together exceed 3x L2 (no launch overhead, no L2 reuse); "
                   "ms_eager = triton.testing.do_bench median with L2 flushed (Python launch "
                   "overhead included); decode: one CUDA graph per step timed with do_bench"
                   if timer == "gpu" else
                   "CPU: warm-up then median of repeats, candidates A/B interleaved"),
        "shapes_note": "layers are K (in) x N (out); x is (M, K); bytes count weights, scales "
                       "(16-bit), x and y once",
        "copy_bandwidth_gbps": copy_gbps,
        "read_bandwidth_gbps": read_gbps,
        "fields": FIELDS,
        "catalogue": None if cat is None else {
            "name": cat.name, "bandwidth_gbps": cat.bandwidth_tbps * 1e3,
            "bf16_tflops": cat.bf16_tflops, "fp8_tflops": cat.fp8_tflops},
        "baseline": next(b.name for b in backends if b.baseline),
        "partial": True, "layers": [], "decode": None, "targets": [],
    }
    rows = result["layers"]

    def on_row(row):
        rows.append(row)
        if checkpoint is not None:
            result["wall_s"] = round(time.perf_counter() - t0, 1)
            checkpoint(result)

    custom_layers = layers is not None
    if layers is None:
        if gpu:
            layers = LAYERS_8B[:1] + LAYERS_70B[1:] if quick else LAYERS_8B + LAYERS_70B
        else:
            layers = ([LAYERS_8B[3], LAYERS_8B[0]] if quick else LAYERS_8B + LAYERS_70B)
    if batches is None:
        batches = (1, 16) if quick else BATCHES
    time_layers(backends, layers, batches, timer, dev, repeats=repeats, on_row=on_row,
                budget_s=None if gpu else budget_s * (0.35 if quick else 0.6), log=log)
    if prefill_m is None:
        prefill_m = 256 if (quick and not gpu) else PREFILL_M
    if prefill_m:
        # a GPU times prefill on every layer; a CPU (seconds per call at M=2048) on the
        # smallest 8B layer only, and at M=256 in a quick run
        pre_layers = layers if (gpu or custom_layers) else [LAYERS_8B[3]]
        time_layers(backends, pre_layers, (prefill_m,), timer, dev, on_row=on_row,
                    repeats=min(3, repeats), log=log)
        if gpu:   # the FP8 and INT8 W8A8 prefill targets: M=4096 at 8192x8192
            time_layers(backends, [LAYERS_70B[0]], (4096,), timer, dev, on_row=on_row, log=log)
    # end-to-end decode: 8B layer shapes on a GPU; a quarter-width stack on a CPU (say so)
    if decode_cfg is not None:
        cfg = dict(decode_cfg)
    elif gpu:
        want = decode_layers or (8 if quick else 32)
        n = decode_layers_that_fit(4096, 1024, 14336, want)
        cfg = {"n_layers": n, "d": 4096, "d_kv": 1024,
               "d_ff": 14336, "note": "Llama-3.1-8B layer shapes, random weights, attention "
               f"and embeddings left out, batch 1; {n} of {want} layers (sized from free GPU "
               "memory)"}
    else:
        cfg = {"n_layers": decode_layers or 2, "d": 1024, "d_kv": 256, "d_ff": 3584,
               "note": "quarter-width 8B-like layers (d 1024, ffn 3584), random weights, "
               "attention and embeddings left out, batch 1: a CPU cannot hold 8B-sized fp32 "
               "layers in a quick run"}
    dec_res = decode_tokens_per_s(backends, cfg["n_layers"], cfg["d"], cfg["d_kv"],
                                  cfg["d_ff"], timer, dev, repeats=min(5, repeats), log=log)
    result["decode"] = {"config": cfg, "results": dec_res}
    result["targets"] = evaluate_targets(rows, result["decode"], read_gbps, gpu, is_hopper)
    result["partial"] = False
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    if quick and not gpu:   # the CPU promise of lesson 10: its measurements take under a minute
        result["targets"].append({
            "id": "cpu_quick_under_60s", "description": "CPU quick run (lesson 10) under 60 s",
            "threshold": 60.0, "value": result["wall_s"], "met": result["wall_s"] < 60.0})
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a small subset (notebooks, tests)")
    p.add_argument("--budget-s", type=float, default=150.0, help="CPU time budget for layers")
    p.add_argument("--out", default=str(ROOT / "results"), help="folder for the JSON")
    p.add_argument("--separate", action="store_true",
                   help="only the measurements that separate the slow-decode hypotheses (GPU)")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads for a CPU run (default 1: stable on shared machines; 0 = torch's default)")
    args = p.parse_args(argv)
    if args.separate:
        res = separating_measurements()
        res["machine"] = device.machine_record()
        path = Path(args.out) / f"separate_{device_slug(torch.cuda.get_device_name(0))}.json"
        path.write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {path}")
        return 0
    result = run(quick=args.quick, budget_s=args.budget_s, threads=args.threads or None,
                 checkpoint=lambda partial: write_results(partial, args.out))
    path = write_results(result, args.out)
    print(f"wrote {path} in {result['wall_s']} s")
    print(targets_table(result))
    return 0


__all__ = [
    "ROOT", "SCHEMA", "FIELDS", "LAYERS_8B", "LAYERS_70B", "BATCHES", "PREFILL_M", "Backend",
    "GPU_KERNEL_MODULES", "gpu_backends", "machine_backends", "placement", "run", "main",
    # from the parts
    "backend_device", "output_error", "usable_backends", "time_layers", "device_record",
    "versions", "device_slug", "write_results", "load_results", "layer_table", "gain_by_batch",
    "cpu_backends", "int4pack_params", "peer_backends", "gemlite_backends", "GEMLITE_DIR",
    "DecoderStack", "decode_tokens_per_s", "decode_layers_that_fit",
    "evaluate_targets", "targets_table", "separating_measurements",
]


if __name__ == "__main__":
    sys.exit(main())
