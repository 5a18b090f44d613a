"""Shared plumbing of the kernel wrappers: input checks, launch plans (lesson 09).

Nothing here is a kernel; it keeps the kernel files short and their checks identical.
``CompileJob`` is how each kernel file lists what ``kernels.compile_check`` compiles, and
``Backend`` how it hands its kernel to the benchmark (``bench_backends``), so no kernel file
imports the benchmark.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Callable

import torch
from kernels._triton import tl, triton  # Triton, or its stand-in where it is not installed

from kernels import INTERPRET, TRITON, TRITON_MISSING

ACT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# Batch sizes up to this use the GEMV-style kernel: one program covers *every* row of x
# (up to 8) for its block of W, so each weight tile is loaded and dequantized once per
# batch, and the products are summed with tl.sum on the CUDA cores. Larger batches use the
# tl.dot kernel (tensor cores on a GPU). Why not 16: the GEMV does M fused multiply-adds per
# weight on the CUDA cores, and ``kernels.compile_check`` counts about 3 instructions per
# weight byte more for every extra row: past 8 rows that exceeds what a GPU issues while it
# streams the weights, and a tensor-core tile of 16 rows costs the same as one of 1.
GEMV_MAX_M = 8


def capability(interpret: bool, min_cc: tuple[int, int], interp_note: str,
               needs: str) -> tuple[bool, str]:
    """(True, why) when a kernel that needs compute capability ``min_cc`` can run here (the
    interpreter counts as yes, with ``interp_note``); else (False, why), where ``needs``
    says what the kernel requires. ``interpret`` is passed by the caller (tests patch it)."""
    if interpret and TRITON:
        return True, interp_note
    if not torch.cuda.is_available():
        return False, "no CUDA GPU" if TRITON else TRITON_MISSING
    cc = torch.cuda.get_device_capability(0)
    name = torch.cuda.get_device_name(0)
    if tuple(cc) < min_cc:
        return False, f"{name} has compute capability {cc[0]}.{cc[1]}; {needs}"
    if not TRITON:                   # a GPU that could, but no Triton to compile for it
        return False, TRITON_MISSING
    return True, f"{name}, compute capability {cc[0]}.{cc[1]}"


def check_row_scaled_weights(w_q: torch.Tensor, w_scale: torch.Tensor, dtype: torch.dtype,
                             dtype_text: str, maker: str) -> torch.Tensor:
    """Check W8A8 weights: 2-D ``dtype`` codes w_q (N, K) and one scale per output row;
    returns the scales as contiguous fp32 (N,). ``maker`` names the function that makes them."""
    if not isinstance(w_q, torch.Tensor) or w_q.dtype != dtype or w_q.dim() != 2:
        raise TypeError(f"w_q must be a 2-D {dtype_text} tensor (N, K); make one with {maker}")
    N = w_q.shape[0]
    if not isinstance(w_scale, torch.Tensor) or w_scale.numel() != N:
        raise ValueError(f"w_scale must hold one scale per output row: {N} values, shape "
                         f"({N},) or ({N}, 1)")
    return w_scale.reshape(N).float().contiguous()


def on_gpu() -> bool:
    """True when kernels run natively on a CUDA GPU (not the interpreter)."""
    return not INTERPRET and torch.cuda.is_available()


def check_activations(x: torch.Tensor, K: int, name: str = "x") -> torch.Tensor:
    """Check x (..., K) and return it as a contiguous (M, K) matrix."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in ACT_DTYPES:
        raise TypeError(f"{name} has dtype {x.dtype}; use float16, bfloat16 or float32 "
                        f"activations (convert with {name}.to(torch.bfloat16))")
    if x.dim() < 1 or x.shape[-1] != K:
        raise ValueError(f"{name} has shape {tuple(x.shape)} but the weight expects "
                         f"{K} input features in its last dimension")
    return x.reshape(-1, K).contiguous()  # (M, K)


def check_device(*tensors: torch.Tensor) -> None:
    """All tensors on one device; on a GPU machine that device must be CUDA."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"inputs are on different devices {sorted(map(str, devices))}; "
                         "move them to one device with .to(device)")
    dev = tensors[0].device
    if on_gpu() and dev.type != "cuda":
        raise ValueError(f"this machine runs Triton natively on the GPU but the inputs are on "
                         f"{dev}; move them with .cuda()")
    if INTERPRET and dev.type != "cpu":
        raise ValueError("Triton is in interpreter mode (TRITON_INTERPRET=1): pass CPU tensors")


def num_sms() -> int:
    """Streaming multiprocessors on the GPU (a CPU stand-in of 1 in the interpreter)."""
    if on_gpu():
        return torch.cuda.get_device_properties(0).multi_processor_count
    return 1


def gemv_plan(M: int, N: int, K: int, k_unit: int) -> tuple[int, int]:
    """Choose (BLOCK_N, SPLIT_K) for the GEMV kernels so the GPU has enough programs.

    A small-batch GEMV reads each weight once; to reach memory bandwidth every SM needs
    several programs in flight. One program covers all M rows of x, so the programs come
    from N alone: we split N into blocks of rows (fewer rows per block when the batch is
    larger, which keeps the per-program work and registers about constant), as small as 8
    rows, and when that is still too few programs we also split K (each split adds its
    partial sums into the output with an atomic add). ``k_unit`` is the smallest K step (a
    group). In the interpreter we pick small blocks and no split (speed does not matter).
    """
    if not on_gpu():
        return 16, 1
    target = 4 * num_sms()  # programs wanted: a few waves of the whole GPU
    widest = 32 if M <= 2 else 16   # rows x BLOCK_N x BLOCK_K products live in registers
    for block_n in (64, 32, 16, 8):
        if block_n <= widest and math.ceil(N / block_n) >= target:
            return block_n, 1
    programs = math.ceil(N / 8)
    if programs >= 2 * num_sms():  # two waves already: a split's extra zero-fill and cast
        return 8, 1                # kernels would cost more than they bring
    max_split = max(1, K // (4 * k_unit))  # each split keeps at least four K steps
    split_k = min(max_split, math.ceil(target / programs))
    return 8, max(1, split_k)


def pow2_at_least(n: int, lo: int = 16, hi: int = 128) -> int:
    """The smallest power of two >= n, clamped to [lo, hi] (block sizes must be powers of 2)."""
    return max(lo, min(hi, 1 << max(0, math.ceil(math.log2(max(n, 1))))))


def autotune_enabled() -> bool:
    """Autotune on a GPU unless COURSE_KERNELS_AUTOTUNE=0 (read at every call).

    Autotuning compiles and times every configuration for every new shape: right for a
    benchmark, slow for a test sweep over many small shapes (the GPU check runs its
    correctness tests with it off, and one test with it on).
    """
    return on_gpu() and os.environ.get("COURSE_KERNELS_AUTOTUNE", "1") != "0"


def choose(tuned, raw, gpu_default, interp_meta: dict, config=None):
    """(kernel, launch keywords) for one call: autotuned, a fixed GPU config, or interpreter.

    ``config`` (a ``triton.Config``, e.g. one of a kernel file's ``_GEMV_CONFIGS``) forces
    that configuration: the tests run every configuration of every autotune list this way,
    through the interpreter on a CPU (block sizes only: it ignores warps and stages) and
    natively on a GPU.
    """
    if config is not None:
        meta = dict(config.kwargs)
        if on_gpu():
            meta.update(num_warps=config.num_warps, num_stages=config.num_stages)
        return raw, meta
    if autotune_enabled():
        return tuned, {}
    if on_gpu():
        return raw, {**gpu_default.kwargs, "num_warps": gpu_default.num_warps,
                     "num_stages": gpu_default.num_stages}
    return raw, interp_meta


def distinct_configs(configs) -> list:
    """The configurations of an autotune list that differ in their block sizes (kwargs).

    The interpreter ignores num_warps and num_stages, so on a CPU these are all the
    variants there are to check; on a GPU the tests run the whole list.
    """
    seen, out = set(), []
    for c in configs:
        key = tuple(sorted(c.kwargs.items()))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


@dataclass
class CompileJob:
    """One kernel specialization for ``kernels.compile_check`` (ahead-of-time, no GPU).

    ``signature`` maps each pointer/scalar argument to a Triton type ("*bf16", "i32", ...);
    ``constexprs`` the compile-time arguments. ``min_cc``: the compute capability (x10)
    below which compiling is expected to fail (FP8: 89). ``weight_bytes_per_step``: the
    weight bytes one program reads per trip of its main loop, for the instructions-per-
    weight-byte report; ``rows``: rows of x one program covers. ``default``: a
    configuration the kernel runs with autotuning off (it must fit every architecture's
    shared memory; the others are skipped by the autotuner where they do not fit).
    """
    name: str
    kernel: object
    signature: dict
    constexprs: dict
    num_warps: int = 4
    num_stages: int = 3
    min_cc: int = 0
    weight_bytes_per_step: int | None = None
    rows: int | None = None
    default: bool = False
    notes: dict = field(default_factory=dict)


def config_jobs(name, kernel, signature, constexprs, configs, default, all_configs,
                **extra) -> list[CompileJob]:
    """CompileJobs for a kernel: the default config always, every config with all_configs.

    ``extra`` goes to every job; ``weight_bytes_per_step`` and ``rows`` may be functions of
    the job's constexprs (they depend on the block sizes).
    """
    def same(a, b):
        return (a.kwargs == b.kwargs and a.num_warps == b.num_warps
                and a.num_stages == b.num_stages)

    chosen = list(configs) if all_configs else [default]
    jobs = []
    for cfg in chosen:
        consts = {**constexprs, **cfg.kwargs}
        kw = {k: (v(consts) if callable(v) else v) for k, v in extra.items()}
        jobs.append(CompileJob(name, kernel, dict(signature), consts, cfg.num_warps,
                               cfg.num_stages, default=same(cfg, default), **kw))
    return jobs


# ---------------------------------------------------------------------------- split-K

def split_plan(tiles: int, steps: int, sms: int, depth: int, programs_per_sm: int = 2) -> dict:
    """How many K slices per output tile: the rule of lessons 09-10, as a score.

    A decode kernel streams its weights once, so it wants (a) every SM busy: the grid of
    ``tiles x split`` programs fills ``sms x programs_per_sm`` slots, and a last wave that is
    half empty wastes half a wave; and (b) every program in a steady state: its pipeline keeps
    ``depth`` (= num_stages - 1) steps loading ahead, so the first ``depth`` of its ``trips``
    loop trips only fill the pipe. The rule: a slice keeps at least ``2 x depth`` trips;
    among the power-of-two splits that do, take the one with the best
    ``busy x steady x even`` (busy = programs / (waves x slots), steady = (trips - depth) /
    trips, even = steps / (split x trips)); ties go to fewer slices (less reduction work).
    Returns the split and each factor (``kernels.compile_check`` records them).
    """
    for name, v in (("tiles", tiles), ("steps", steps), ("sms", sms), ("depth", depth),
                    ("programs_per_sm", programs_per_sm)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {v!r}")
    slots = sms * programs_per_sm

    def factors(split: int) -> dict:
        trips = math.ceil(steps / split)
        programs = tiles * split
        waves = math.ceil(programs / slots)
        busy, steady, even = programs / (waves * slots), (trips - depth) / trips, steps / (split * trips)
        return dict(SPLIT_K=split, trips=trips, programs=programs, waves=round(programs / slots, 2),
                    busy=round(busy, 3), steady=round(max(steady, 0.0), 3), even=round(even, 3),
                    score=round(busy * max(steady, 0.0) * even, 4))

    candidates = [1 << i for i in range(int(math.log2(steps)) + 1)
                  if math.ceil(steps / (1 << i)) >= 2 * depth]
    if not candidates:                          # too few steps for any steady state: no split
        return factors(1)
    return max((factors(s) for s in candidates), key=lambda f: (f["score"], -f["SPLIT_K"]))


def fill_plan(tiles: list, N: int, steps_of, sms: int) -> dict:
    """The decode tile and K split that give every SM a program (lesson 10).

    ``tiles``: the candidate ``triton.Config``s, widest ``BLOCK_N`` first; ``steps_of(cfg)``:
    the loop trips of one unsplit program. For each, ``split_plan`` picks the K split (each
    slice keeps >= 2 x pipeline depth trips); the first whose grid has at least ``sms``
    programs wins: a narrower tile costs more instructions per weight byte (its x loads and
    loop overhead serve fewer weights), so no narrower than needed. When none fills the GPU
    (a small layer: N / BLOCK_N tiles x the largest split that keeps a steady state < SMs),
    the one with the most programs, and ``why`` says so. Returns {"config", "rule",
    "fills", "why"}.
    """
    best = None
    for cfg in tiles:
        rule = split_plan(math.ceil(N / cfg.kwargs["BLOCK_N"]), steps_of(cfg), sms,
                          cfg.num_stages - 1)
        if rule["programs"] >= sms:
            return {"config": cfg, "rule": rule, "fills": True, "why": ""}
        if best is None or rule["programs"] > best[1]["programs"]:
            best = (cfg, rule)
    cfg, rule = best
    tiles_n = math.ceil(N / cfg.kwargs["BLOCK_N"])
    why = (f"{tiles_n} tiles of {cfg.kwargs['BLOCK_N']} outputs x {rule['SPLIT_K']} K slices of "
           f"{rule['trips']} trips = {rule['programs']} programs < {sms} SMs: a finer split would "
           f"leave fewer than 2 x {cfg.num_stages - 1} trips (no steady state), and "
           f"{cfg.kwargs['BLOCK_N']} is the narrowest decode tile")
    return {"config": cfg, "rule": rule, "fills": False, "why": why}


def split_k_for(tiles: int, steps: int, sms: int, depth: int = 2) -> int:
    """K slices per output tile by ``split_plan``'s rule (each slice keeps >= 2 x depth loop
    trips; whole waves of about two programs per SM)."""
    return split_plan(tiles, steps, sms, depth)["SPLIT_K"]


_WORKSPACES: dict = {}


def workspace(M: int, N: int, tiles: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The split-K workspace (M, N) fp32 and one arrival counter per output tile, made once
    per shape and device (``store_or_reduce`` leaves both at zero after every call, so a
    call, or a CUDA graph replay, launches nothing else). One stream at a time per shape."""
    key = (str(device), M, N, tiles)
    if key not in _WORKSPACES:
        _WORKSPACES[key] = (torch.zeros((M, N), dtype=torch.float32, device=device),
                            torch.zeros((tiles,), dtype=torch.int32, device=device))
    return _WORKSPACES[key]


@triton.jit
def token_scales(x_ptr, M, K, stride_xm, QMAX: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """Per-token scales of x (M, K), M <= BLOCK_M: max|x_row| / QMAX, 1 for an all-zero row,
    NaN for a row holding a NaN (so its output row is NaN, never a finite wrong number). The
    prologue of the fused W8A8 kernels (QMAX 127 for INT8, 448 for FP8; lessons 08-09): x is a
    few KB, read from L2 by every program. Returns (BLOCK_M,) fp32."""
    offs_m = tl.arange(0, BLOCK_M)                           # (BLOCK_M,) every token
    m_mask = offs_m < M
    amax = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)   # max |x| per token
    probe = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)  # NaN once any x is NaN
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=m_mask[:, None] & (offs_k < K)[None, :], other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
        probe += x
    row_max = tl.max(amax, axis=1)                           # (BLOCK_M,)
    # div_rn: IEEE division, as torch's (a plain / may compile to an approximate one)
    scale = tl.where(row_max > 0, tl.math.div_rn(row_max, QMAX), 1.0)
    nan_sum = tl.sum(probe, axis=1)
    return tl.where(nan_sum == nan_sum, scale, nan_sum)     # (BLOCK_M,) NaN rows stay NaN


@triton.jit
def store_or_reduce(acc, y_ptr, ws_ptr, cnt_ptr, offs_m, offs_n, M, N, stride_ym,
                    SPLIT_K: tl.constexpr):
    """Write a (BLOCK_M, BLOCK_N) fp32 tile into y once, in y's dtype (lessons 09-10).

    SPLIT_K > 1: every K slice adds into the fp32 workspace; the last one to arrive (a
    counter per tile; grid axes 0 and 1 are the N and M tiles) reads the sum back where the
    atomics left it, writes y, and sets workspace and counter to zero again.
    """
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    y_mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=y_mask)
    else:
        ws_ptrs = ws_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
        tl.atomic_add(ws_ptrs, acc, mask=y_mask)
        tl.debug_barrier()                                   # every thread's adds are done
        tile = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
        arrived = tl.atomic_add(cnt_ptr + tile, 1)           # acq_rel: after the adds
        if arrived == SPLIT_K - 1:
            zeros = tl.zeros(acc.shape, tl.float32)
            total = tl.atomic_add(ws_ptrs, zeros, mask=y_mask)   # read at L2, where the sums are
            tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=y_mask)
            tl.store(ws_ptrs, zeros, mask=y_mask)            # zero again for the next call
            tl.store(cnt_ptr + tile, 0)                      # every slice has arrived


# ---------------------------------------------------------------- what the benchmark times

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
