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
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import math
import platform
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import kernels  # noqa: F401  (Triton mode first)
import torch
import torch.nn.functional as F
import triton

from course_lib import bench

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = 1

LAYERS_8B, LAYERS_70B = bench.LAYERS_8B, bench.LAYERS_70B   # (name, K in, N out)
BATCHES = (1, 4, 16, 64)
PREFILL_M = 2048


# ---------------------------------------------------------------------------- formats

@dataclass
class Backend:
    """One way to compute a linear layer: how to prepare W once, and how to apply it."""
    name: str
    prepare: Callable[[torch.Tensor], object]       # W (N, K) bf16/fp32 -> prepared state
    apply: Callable[[torch.Tensor, object], torch.Tensor]   # (x (M, K), state) -> (M, N)
    act_dtype: torch.dtype
    weight_bits: float
    group_size: int | None          # weights per scale (None: no scales)
    baseline: bool = False
    device: str | None = None       # "cpu": a CPU-only op (runs on CPU tensors even on a GPU
                                    # machine); None: the benchmark's device
    max_rel_err: float | None = None  # the output check before timing (None: from the bits)

    def tolerance(self) -> float:
        """Relative error against exact fp32 F.linear that still counts as a right answer.

        Quantization alone gives about 12% at INT4 group 128 on random weights, 1-3% at 8
        bits; a broken kernel is off by 100% or more.
        """
        if self.max_rel_err is not None:
            return self.max_rel_err
        return 0.3 if self.weight_bits <= 4 else 0.08 if self.weight_bits <= 8 else 0.02


# One line per kernel file: each has ``bench_backends(act_dtype) -> [Backend]`` (GPU side).
GPU_KERNEL_MODULES = [
    "kernels.w8a16",
    "kernels.w4a16",
    "kernels.fp8_w8a8",
    "kernels.w8a8_int8",
]


def _cpu_int8_prepare(w):
    from kernels.w8a16 import quantize_weight

    q, s = quantize_weight(w)
    return q.contiguous(), s.to(torch.bfloat16)   # bf16 x and scales: its fast path


def int4pack_params(wt) -> tuple[torch.Tensor, torch.Tensor]:
    """The course's W4A16 weight in torch's int4 kernels' terms (tinygemm convention).

    torch's ``_weight_int4pack_mm`` (CUDA) and ``_weight_int4pack_mm_for_cpu`` compute
    w = (u - 8) * scale + zero with unsigned codes u in 0..15 and (scale, zero) per group
    and output row. The course stores w = (q - z) * s (z = 0 with signed codes q in -8..7):
    u = q + 8 and zero = 0 when symmetric; u = q and zero = (8 - z) * s with zero points.
    Returns (u (N, K) int32, scales_and_zeros (K/G, N, 2) fp32); exact up to the dtype the
    caller casts them to.
    """
    from course_lib import quant

    signed = wt.zero is None
    q = quant.unpack_int4(wt.packed, signed=signed).to(torch.int32)     # (N, K)
    u = q + 8 if signed else q                                          # (N, K) 0..15
    s = wt.scale.float()                                                # (N, K/G)
    zero = torch.zeros_like(s) if signed else (8 - wt.zero.float()) * s  # (N, K/G)
    return u.contiguous(), torch.stack([s.T, zero.T], dim=-1).contiguous()   # (K/G, N, 2)


def _cpu_int4_prepare(w, group_size=128):
    """torch's CPU int4 layout from the course's own W4A16 codes (``int4pack_params``)."""
    from kernels.w4a16 import quantize_weight

    u, sz = int4pack_params(quantize_weight(w.float(), group_size))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(u, 1)
    return packed, sz.to(torch.bfloat16), group_size


def _cuda_int4_prepare(w, group_size=128):
    """torch's CUDA int4 (tinygemm) layout: two codes a byte, high nibble first, then
    ``_convert_weight_to_int4pack`` with 8 inner k-tiles (what gpt-fast and torchao use)."""
    from kernels.w4a16 import quantize_weight

    u, sz = int4pack_params(quantize_weight(w.float(), group_size))
    u8 = (u[:, ::2] << 4 | u[:, 1::2]).to(torch.uint8)                   # (N, K/2)
    packed = torch.ops.aten._convert_weight_to_int4pack(u8.contiguous(), 8)
    return packed, sz.to(w.dtype if w.dtype != torch.float32 else torch.bfloat16), group_size


def cpu_backends(probe: bool = True, log=print) -> list[Backend]:
    """fp32 (baseline), bf16, and torch's weight-only int8 and int4 CPU kernels.

    The two weight-only kernels are private torch ops that change between releases: with
    ``probe`` each backend is first tried on a small layer against the fp32 result, and one
    that fails or disagrees is left out with a note instead of stopping the lesson.
    """
    backends = [
        Backend("fp32", lambda w: w.float().contiguous(), lambda x, w: F.linear(x, w),
                torch.float32, 32, None, baseline=True, device="cpu"),
        Backend("bf16", lambda w: w.to(torch.bfloat16).contiguous(), lambda x, w: F.linear(x, w),
                torch.bfloat16, 16, None, device="cpu"),
        Backend("int8 (_weight_int8pack_mm)", _cpu_int8_prepare,
                lambda x, st: torch.ops.aten._weight_int8pack_mm(x, st[0], st[1]),
                torch.bfloat16, 8, "per_channel", device="cpu"),
        Backend("int4 g128 (_weight_int4pack_mm_for_cpu)", _cpu_int4_prepare,
                lambda x, st: torch.ops.aten._weight_int4pack_mm_for_cpu(x, st[0], st[2], st[1]),
                torch.bfloat16, 4, 128, device="cpu"),
    ]
    return usable_backends(backends, log) if probe else backends


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


def _int8_weight_only_prepare(w):
    from kernels.w8a16 import quantize_weight

    q, s = quantize_weight(w)
    return q.contiguous(), s.to(torch.bfloat16)


def _int8_weight_only(x, q, s):
    """gpt-fast's int8 weight-only linear: convert W to x's dtype, matmul, scale the rows."""
    return F.linear(x, q.to(x.dtype)) * s.to(x.dtype)


def _fp8_rowwise_prepare(w):
    from kernels.fp8_w8a8 import quantize_weight

    q, s = quantize_weight(w, fast=True)
    return q.contiguous(), s.float().reshape(1, -1)                     # (N, K), (1, N)


def _fp8_quantize_rows(x):
    """Per-token FP8 of x padded to a multiple of 16 rows (``_scaled_mm`` needs that)."""
    from kernels.fp8_w8a8 import FP8_DTYPE, FP8_MAX

    pad = (-x.shape[0]) % 16
    xp = F.pad(x, (0, 0, 0, pad)) if pad else x                         # (M + pad, K)
    amax = xp.float().abs().amax(dim=1, keepdim=True)                   # (M + pad, 1)
    xs = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return (xp.float() / xs).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), xs


def _fp8_rowwise(x, st, quantize=_fp8_quantize_rows):
    """torch._scaled_mm with per-token and per-channel scales (what vLLM-style FP8 does);
    its operands need multiples of 16 rows, so a decode batch is padded (cost included).
    ``quantize``: the activation quantization (eager, or ``torch.compile``d into one kernel)."""
    q, ws = st
    xq, xs = quantize(x)
    y = torch._scaled_mm(xq, q.t(), scale_a=xs, scale_b=ws, out_dtype=x.dtype)
    return y[:x.shape[0]]


# gpt-fast's inductor settings (generate.py): coordinate-descent tuning of the generated
# kernels; compiled with fullgraph and no dynamic shapes
GPT_FAST_INDUCTOR = {"coordinate_descent_tuning": True, "fx_graph_cache": True}


def compiled_kernel_count(fn, *args) -> int | None:
    """Kernels inductor generated for one compiled call of ``fn`` (1 = fully fused), or
    None when this torch does not say."""
    try:
        from torch._inductor import metrics
    except ImportError:
        return None
    metrics.reset()
    fn(*args)
    return getattr(metrics, "generated_kernel_count", None)


def _gpt_fast_int8():
    """The gpt-fast int8 weight-only peer: compiled with gpt-fast's settings, and checked
    on a small layer that inductor fused it into one kernel; the name says which."""
    import torch._inductor.config as ic

    for key, value in GPT_FAST_INDUCTOR.items():
        if hasattr(ic, key):
            setattr(ic, key, value)
    if hasattr(ic, "triton") and hasattr(ic.triton, "unique_kernel_names"):
        ic.triton.unique_kernel_names = True
    compiled = torch.compile(_int8_weight_only, dynamic=False, fullgraph=True)
    name = "int8 wo (torch.compile, gpt-fast settings)"
    if torch.cuda.is_available():
        q = torch.randint(-127, 128, (256, 512), dtype=torch.int8, device="cuda")
        s = torch.rand(256, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(1, 512, device="cuda", dtype=torch.bfloat16)
        n = compiled_kernel_count(compiled, x, q, s)
        name += "" if n == 1 else f" [not fused: {n} kernels]"
    return name, compiled


def peer_backends(act_dtype: torch.dtype = torch.bfloat16, with_fp8: bool = True) -> list[Backend]:
    """What a user would run instead of the course's kernels (GPU benchmark, issue 18):
    torch's own int4 kernel (tinygemm ``_weight_int4pack_mm``, the course's codes mapped
    exactly by ``int4pack_params``), gpt-fast-style int8 weight-only (``torch.compile``
    with gpt-fast's settings, labelled unfused when inductor did not fuse it), with FP8
    maths ``torch._scaled_mm`` row-wise FP8 with its activation quantization compiled, and
    gemlite (W4A16 g128) when ``make gpu-bundle`` put it in ``third_party/``. Each is
    probed before use and left out with a note when this torch or GPU cannot run it."""
    name, compiled = _gpt_fast_int8()
    out = [Backend("int4 g128 (torch _weight_int4pack_mm)", _cuda_int4_prepare,
                   lambda x, st: torch.ops.aten._weight_int4pack_mm(x, st[0], st[2], st[1]),
                   act_dtype, 4, 128),
           Backend(name, _int8_weight_only_prepare, lambda x, st: compiled(x, *st),
                   act_dtype, 8, "per_channel")]
    if with_fp8:
        quant = torch.compile(_fp8_quantize_rows, dynamic=False)
        out.append(Backend("fp8 rowwise (_scaled_mm, compiled quantization)",
                           _fp8_rowwise_prepare, lambda x, st: _fp8_rowwise(x, st, quant),
                           act_dtype, 8, "per_channel"))
    out += gemlite_backends(act_dtype)
    return out


GEMLITE_DIR = ROOT / "third_party" / "gemlite"   # ``make gpu-bundle`` (git-ignored)


def gemlite_backends(act_dtype: torch.dtype = torch.bfloat16) -> list[Backend]:
    """gemlite W4A16 g128 when its bundled copy is there and a GPU is (its import touches
    CUDA: never on a CPU). The course's codes map exactly: w = (u - zero) * scale with
    u = q + 8 and zero = 8 (symmetric)."""
    if not (torch.cuda.is_available() and not kernels.INTERPRET and GEMLITE_DIR.is_dir()):
        return []
    if str(GEMLITE_DIR) not in sys.path:
        sys.path.insert(0, str(GEMLITE_DIR))
    try:
        from gemlite.core import DType, GemLiteLinear
    except Exception as e:  # noqa: BLE001  (an optional peer: say why, go on)
        print(f"  gemlite not usable: {type(e).__name__}: {e}")
        return []

    def prepare(w, G=128):
        from course_lib import quant
        from kernels.w4a16 import quantize_weight

        wt = quantize_weight(w.float(), G)
        u = (quant.unpack_int4(wt.packed, signed=True).to(torch.int16) + 8).to(torch.uint8)
        N, K = u.shape
        dt = DType.BF16 if act_dtype == torch.bfloat16 else DType.FP16
        layer = GemLiteLinear(W_nbits=4, group_size=G, in_features=K, out_features=N,
                              input_dtype=dt, output_dtype=dt)
        s = wt.scale.to(act_dtype)
        layer.pack(u.to(w.device), s.to(w.device), torch.full_like(s, 8).to(w.device), None)
        return layer

    return [Backend("int4 g128 (gemlite)", prepare, lambda x, layer: layer(x), act_dtype, 4, 128)]


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


def _bytes(b: Backend, M: int, N: int, K: int) -> float:
    gs = K if b.group_size == "per_channel" else b.group_size
    act = 4 if b.act_dtype == torch.float32 else 2
    return bench.linear_bytes(M, N, K, b.weight_bits, act, act, gs)


# ---------------------------------------------------------------------------- layer timings

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


# ---------------------------------------------------------------------------- decode

class DecoderStack(torch.nn.Module):
    """Decoder layers with Llama's linear shapes (random weights; attention left out).

    Each layer: RMSNorm, q/k/v/o projections (the attention itself skipped: at short context
    its cost is small next to the weight reads), RMSNorm, SwiGLU MLP. Enough to time what
    weight quantization changes in a decode step: every weight is read once per token.
    """

    def __init__(self, backend: Backend, n_layers: int, d: int, d_kv: int, d_ff: int,
                 device: str, seed: int = 0):
        super().__init__()
        gen = torch.Generator(device=device).manual_seed(seed)
        self.backend = backend
        shapes = {"q": (d, d), "k": (d_kv, d), "v": (d_kv, d), "o": (d, d),
                  "gate": (d_ff, d), "up": (d_ff, d), "down": (d, d_ff)}
        self.layers = []
        for _ in range(n_layers):
            layer = {}
            for key, (n, k) in shapes.items():
                w = torch.randn(n, k, generator=gen, device=device) / math.sqrt(k)
                layer[key] = backend.prepare(w)
            self.layers.append(layer)

    def _lin(self, x, st):
        return self.backend.apply(x, st)

    def forward(self, h):                        # h: (B, d)
        for L in self.layers:
            a = F.rms_norm(h, h.shape[-1:])
            q = self._lin(a, L["q"])                                    # (B, d)
            self._lin(a, L["k"]), self._lin(a, L["v"])                  # read, then unused:
            h = h + self._lin(q, L["o"])                                # attention skipped
            a = F.rms_norm(h, h.shape[-1:])
            h = h + self._lin(F.silu(self._lin(a, L["gate"])) * self._lin(a, L["up"]), L["down"])
        return h


def decode_tokens_per_s(backends: list[Backend], n_layers: int, d: int, d_kv: int, d_ff: int,
                        timer: str, device: str, batch: int = 1, repeats: int = 5,
                        log=print) -> dict:
    """Tokens/s of one decode step (batch ``batch``) through a DecoderStack, per backend."""
    out = {}
    for b in backends:
        dev = backend_device(b, device)
        model = DecoderStack(b, n_layers, d, d_kv, d_ff, dev)
        h = torch.randn(batch, d).to(dev, b.act_dtype)                       # (B, d)
        step, graphed = (lambda: model(h)), False
        if timer == "gpu" and dev != "cpu":
            step, graphed = _cuda_graph(step)
            ms = bench.time_gpu(step)
        else:
            ms = bench.time_cpu(step, warmup=1, repeats=repeats)
        out[b.name] = {"ms_per_step": ms, "tokens_per_s": batch * 1e3 / ms, "cuda_graph": graphed}
        log(f"  decode {b.name:40s} {ms:8.2f} ms/step  {batch * 1e3 / ms:9.1f} tokens/s")
        del model
    base = next(b.name for b in backends if b.baseline)
    for r in out.values():
        r["ratio_vs_baseline"] = r["tokens_per_s"] / out[base]["tokens_per_s"]
    return out


def _cuda_graph(step):
    """Capture a decode step in a CUDA graph (removes launch overhead); eager on failure."""
    try:
        for _ in range(3):                      # autotuning happens here, outside the capture
            step()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        return g.replay, True
    except Exception as err:  # noqa: BLE001  (reported in the JSON as "cuda_graph": false)
        print(f"  (CUDA graph capture failed, timing eagerly: {type(err).__name__}: {err})")
        return step, False


# ---------------------------------------------------------------------------- separating measurements

def separating_measurements(shapes=((4096, 4096), (8192, 28672)), log=print) -> dict:
    """The measurements that separate the hypotheses of issue 18 (GPU only; CUDA graphs):

    * W8A16 at batch 1 through the tensor-core kernel against the CUDA-core GEMV on the same
      bytes (pipelining and tensor cores, or the dequantization maths?);
    * the W4A16 kernel alone (one launch, x used as it is) against the first version's
      activation preparation alone (``gemv_activations``) and its GEMV kernel alone;
    * the decode-attention kernel (lesson 11) at its benchmark sizes.
    Each output is checked against the plain-torch reference before it is timed.
    """
    from course_lib.device import require_gpu
    from kernels import w4a16, w8a16
    from kernels.decode_attention import benchmark_rows

    require_gpu("kernels.bench.separating_measurements")
    out = {"device": device_record(), "versions": versions(), "layers": []}
    for K, N in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)
        w = torch.randn(N, K, device="cuda", generator=g) / K ** 0.5      # (N, K)
        x = torch.randn(1, K, device="cuda", generator=g).to(torch.bfloat16)
        w_q, s8 = w8a16.quantize_weight(w)
        wt = w4a16.quantize_weight(w, 128)
        words = wt.packed.view(torch.int32)
        xp = w4a16.gemv_activations(x)
        y = torch.empty((1, N), device="cuda", dtype=torch.bfloat16)

        def gemv_kernel_alone():
            w4a16.w4a16_gemv_kernel[(triton.cdiv(N, 32), 1)](
                xp, words, wt.scale, wt.scale, y, 1, N, K, xp.stride(0), words.stride(0),
                wt.scale.stride(0), y.stride(0), w4a16.MAGIC.value, GROUP=128, BLOCK_M=1,
                BLOCK_N=32, SPLIT_K=1, HAS_ZERO=False, BLOCK_K=256, num_warps=4, num_stages=3)

        calls = {
            "w8a16 dot M=1": lambda: w8a16.w8a16_linear(x, w_q, s8),
            "w8a16 gemv M=1": lambda: w8a16.w8a16_linear(x, w_q, s8, kernel="gemv"),
            "w4a16 dot kernel (whole call)": lambda: w4a16.w4a16_linear(x, wt),
            "w4a16 gemv: activation preparation alone": lambda: w4a16.gemv_activations(x),
            "w4a16 gemv: kernel alone": gemv_kernel_alone,
            "w4a16 gemv (whole call)": lambda: w4a16.w4a16_linear(x, wt, kernel="gemv"),
        }
        ref8, ref4 = w8a16.w8a16_reference(x, w_q, s8).float(), w4a16.w4a16_reference(x, wt).float()
        for name, ref in (("w8a16 dot M=1", ref8), ("w8a16 gemv M=1", ref8),
                          ("w4a16 dot kernel (whole call)", ref4), ("w4a16 gemv (whole call)", ref4)):
            err = ((calls[name]().float() - ref).norm() / ref.norm()).item()
            assert err < 2e-2, f"{name} at {K}x{N}: relative error {err:.3g}"
        row = {"K": K, "N": N, "us": {}}
        for name, fn in calls.items():
            step, graph = _cuda_graph(fn)
            row["us"][name] = round(1e3 * bench.time_gpu(step), 2)
            row.setdefault("cuda_graph", {})[name] = graph
            log(f"  {K}x{N} {name}: {row['us'][name]} us")
        out["layers"].append(row)
    try:
        out["decode_attention"] = benchmark_rows()
    except Exception as e:  # noqa: BLE001  (never timed on a GPU before: record, go on)
        out["decode_attention"] = {"error": f"{type(e).__name__}: {e}"}
    return out


# ---------------------------------------------------------------------------- targets

def _find(rows, layer_kn, M, fmt):
    for r in rows:
        if (r["K"], r["N"], r["M"]) == (*layer_kn, M) and fmt in r["results"]:
            return r["results"][fmt]
    return None


def evaluate_targets(rows: list[dict], decode: dict | None, read_gbps: float | None,
                     on_gpu: bool, is_hopper: bool) -> list[dict]:
    """The course's GPU performance targets, each with value and met (null if unmeasured).

    Bandwidth shares are of the measured *read* bandwidth: a GEMV only reads its weights,
    so against a copy (read + write) it can pass 100%.
    """
    copy_gbps = read_gbps
    def ratio(kn, M, fmt):
        r = _find(rows, kn, M, fmt) if on_gpu else None
        return None if r is None else r["ratio_vs_baseline"]

    def bw_share(kn, M, fmt):
        r = _find(rows, kn, M, fmt) if on_gpu else None
        return None if r is None or not copy_gbps else r["gbps"] / copy_gbps

    dec = None
    if on_gpu and decode and "w4a16 g128" in decode.get("results", {}):
        dec = decode["results"]["w4a16 g128"]["ratio_vs_baseline"]
    fp8 = ratio((8192, 8192), 4096, "fp8 w8a8") if is_hopper else None
    spec = [
        ("bf16_gemv_read_bw", "BF16 GEMV (8192x28672, batch 1) >= 65% of measured read bandwidth",
         0.65, bw_share((8192, 28672), 1, "bf16")),
        ("w4a16_b1_70b_mlp", "W4A16 g128 batch 1 at 8192x28672 >= 2.8x BF16", 2.8,
         ratio((8192, 28672), 1, "w4a16 g128")),
        ("w4a16_b1_4096", "W4A16 g128 batch 1 at 4096x4096 >= 2.0x BF16", 2.0,
         ratio((4096, 4096), 1, "w4a16 g128")),
        ("w4a16_b1_read_bw", "W4A16 g128 batch 1 at 8192x28672 >= 60% of read bandwidth "
         "(quantized bytes)", 0.60, bw_share((8192, 28672), 1, "w4a16 g128")),
        ("w8a16_b1_70b_mlp", "W8A16 batch 1 at 8192x28672 >= 1.7x BF16", 1.7,
         ratio((8192, 28672), 1, "w8a16")),
        ("w4a16_b16_70b_mlp", "W4A16 g128 batch 16 at 8192x28672 >= 1.5x BF16", 1.5,
         ratio((8192, 28672), 16, "w4a16 g128")),
        ("fp8_prefill_m4096", "FP8 W8A8 incl. activation quantization, M=4096 at 8192x8192 "
         "(Hopper) >= 1.3x BF16", 1.3, fp8),
        ("int8_prefill_m4096", "INT8 W8A8 incl. activation quantization, M=4096 at 8192x8192 "
         "(cc >= 8.0: INT8 tensor cores at twice the BF16 rate) >= 1.4x BF16", 1.4,
         ratio((8192, 8192), 4096, "int8 w8a8")),
        ("decode_w4a16_b1", "End-to-end decode batch 1: W4A16 >= 2x BF16 tokens/s", 2.0, dec),
    ]
    return [{"id": i, "description": d, "threshold": t, "value": v,
             "met": None if v is None else bool(v >= t)} for i, d, t, v in spec]


# ---------------------------------------------------------------------------- run

def device_record() -> dict:
    from course_lib import device

    info = device.detect()
    return {"kind": info.kind, "name": info.name,
            "compute_capability": list(info.compute_capability) if info.compute_capability else None,
            "memory_gb": info.memory_gb, "cpu_count": info.cpu_count,
            "triton_interpret": info.triton_interpret}


def versions() -> dict:
    import numpy
    import triton

    return {"python": platform.python_version(), "torch": torch.__version__,
            "triton": triton.__version__, "numpy": numpy.__version__,
            "cuda": torch.version.cuda, "platform": platform.platform()}


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


def decode_layers_that_fit(d: int, d_kv: int, d_ff: int, want: int, bytes_per_weight: float = 2.0,
                           free_bytes: float | None = None, share: float = 0.5) -> int:
    """How many decoder layers of this shape fit in ``share`` of the free GPU memory (the
    16-bit stack is the largest; one stack is alive at a time). At least 1, at most want."""
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info()[0]
    per_layer = (2 * d * d + 2 * d_kv * d + 3 * d_ff * d) * bytes_per_weight
    return max(1, min(want, int(share * free_bytes // per_layer)))


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
        "device": rec, "versions": versions(), "quick": quick,
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


def targets_table(result: dict) -> str:
    """The performance targets as text: met / MISSED / - (not measured), with the value."""
    out = []
    for t in result["targets"]:
        v = "not measured" if t["value"] is None else f"{t['value']:.2f}"
        if t["id"] == "cpu_quick_under_60s" and t["value"] is not None:
            v = f"{t['value']:.1f} s"
        out.append(f"[{ {True: 'met', False: 'MISSED', None: '-'}[t['met']]:6s}] {t['description']}: {v}")
    return "\n".join(out)


def device_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia_h100_80gb_hbm3' (file-name safe)."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")[:60] or "device"


def write_results(result: dict, out_dir: Path | str = ROOT / "results") -> Path:
    """Write ``result`` as results/bench_<kind>_<device>.json and return the path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a small subset (notebooks, tests)")
    p.add_argument("--budget-s", type=float, default=150.0, help="CPU time budget for layers")
    p.add_argument("--out", default=str(ROOT / "results"), help="folder for the JSON")
    p.add_argument("--separate", action="store_true",
                   help="only the measurements that separate issue 18's hypotheses (GPU)")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads for a CPU run (default 1: stable on shared machines; 0 = torch's default)")
    args = p.parse_args(argv)
    if args.separate:
        res = separating_measurements()
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


if __name__ == "__main__":
    sys.exit(main())
