"""W8A16: int8 weights with one scale per output channel, 16-bit activations (lesson 09).

What you will learn
-------------------
* Why a weight-only kernel reads int8 from memory and dequantizes *in registers*: the
  whole point is to move 1 byte per weight instead of 2; writing a dequantized copy of W
  back to memory first would move 2 + 2 + 1 bytes per weight and be slower than BF16.
* How a GEMV (batch 1 to 8) differs from a skinny GEMM (batch 9 to 64 and beyond): the
  first is a sum of products along K done with ``tl.sum``; the second uses ``tl.dot``
  (tensor cores on a GPU).
* One program per block of W for the *whole* small batch: a GEMV that gave each token its
  own program would read and convert every weight once per token, so batch 4 would cost
  four times the work of batch 1 for the same weights.
* Where the per-channel scale goes: it belongs to an output row of W, so it multiplies the
  finished dot product once, not every weight.
* Masks on the tail when N or K is not a multiple of the block, and split-K when N alone
  does not give the GPU enough programs.

The maths: ``y[m, n] = scale[n] * sum_k x[m, k] * w_q[n, k]`` with ``w_q`` int8 (N, K),
``scale`` (N,), x (M, K) in fp16/bf16 (fp32 also accepted), accumulation in fp32.

Pseudo-code of the GEMV kernel (one program = all M rows of x, BLOCK_N rows of W)::

    acc[M, BLOCK_N] = 0                           # fp32, in registers
    for k0 in range(k_begin, k_end, BLOCK_K):     # this program's slice of K
        w_blk = float(load w_q[n0:n0+BLOCK_N, k0:k0+BLOCK_K])   # int8 read once, converted once
        x_blk = load x[:, k0:k0+BLOCK_K]          # every token; masked past K
        acc  += sum over k of x_blk[:, None, :] * w_blk[None, :, :]
    y[:, n0:n0+BLOCK_N] (+)= acc * scale[n0:n0+BLOCK_N]   # scale once per output

The GEMM kernel is the same with a (BLOCK_M, BLOCK_K) tile of x and ``tl.dot``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels._triton import tl, triton  # Triton, or its stand-in where it is not installed

from kernels import INTERPRET
from kernels._common import (GEMV_MAX_M, check_activations, check_device, choose,
                             config_jobs, fill_plan, gemv_plan, num_sms, on_gpu, pow2_at_least,
                             store_or_reduce, workspace)


# ---------------------------------------------------------------------------- kernels

@triton.jit
def w8a16_gemv_kernel(
    x_ptr,        # activations, (M, K) contiguous, fp16/bf16/fp32
    w_ptr,        # int8 weights, (N, K) contiguous (the nn.Linear layout)
    s_ptr,        # per-output-channel scales, (N,), any float dtype
    y_ptr,        # output, (M, N); fp32 and zero-filled when SPLIT_K > 1
    M, N, K,      # problem size (M <= BLOCK_M: one program covers the whole batch)
    stride_xm,    # elements between rows of x
    stride_wn,    # elements between rows of W
    stride_ym,    # elements between rows of y
    BLOCK_M: tl.constexpr,   # rows of x per program: a power of 2 >= M (1, 2, 4 or 8)
    BLOCK_N: tl.constexpr,   # rows of W (outputs) per program
    BLOCK_K: tl.constexpr,   # K elements per loop step
    SPLIT_K: tl.constexpr,   # programs sharing one output block along K (1 = no split)
):
    pid_n = tl.program_id(0)          # which block of outputs
    pid_k = tl.program_id(1)          # which slice of K
    offs_m = tl.arange(0, BLOCK_M)                           # (BLOCK_M,) every token
    m_mask = offs_m < M
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)        # (BLOCK_N,)
    n_mask = offs_n < N
    k_per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_begin = pid_k * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    # products accumulate element-wise; the sum across K (a cross-thread reduction) is done
    # once, after the loop, instead of once per step
    acc3 = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)   # (BLOCK_M, BLOCK_N, BLOCK_K)
    for k0 in range(k_begin, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)                  # (BLOCK_K,)
        k_mask = offs_k < k_end
        # the weight tile is read once and converted once, for every token of the batch;
        # evict_first: nothing else reads it, so it should not push x out of the L2 cache
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :],
                    mask=n_mask[:, None] & k_mask[None, :], other=0,
                    eviction_policy="evict_first")           # (BLOCK_N, BLOCK_K) int8
        w = w.to(tl.float32)                                 # dequantize in registers
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=m_mask[:, None] & k_mask[None, :], other=0.0)  # (BLOCK_M, BLOCK_K)
        acc3 += x.to(tl.float32)[:, None, :] * w[None, :, :]  # (BLOCK_M, BLOCK_N, BLOCK_K)
    acc = tl.sum(acc3, axis=2)                               # (BLOCK_M, BLOCK_N)
    scale = tl.load(s_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)  # (BLOCK_N,)
    acc = acc * scale[None, :]                               # once per output, after the sum
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    y_mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=y_mask)
    else:
        tl.atomic_add(y_ptrs, acc, mask=y_mask)


@triton.jit
def w8a16_gemm_kernel(
    x_ptr,        # activations, (M, K) contiguous
    w_ptr,        # int8 weights, (N, K) contiguous
    s_ptr,        # per-output-channel scales, (N,)
    y_ptr,        # output, (M, N), x's dtype: written once
    ws_ptr,       # split-K workspace, (M, N) fp32, zero between calls (SPLIT_K > 1)
    cnt_ptr,      # split-K arrival counters, one int32 per output tile, zero between calls
    M, N, K,      # problem size
    stride_xm,    # elements between rows of x
    stride_wn,    # elements between rows of W
    stride_ym,    # elements between rows of y (and of the workspace)
    BLOCK_M: tl.constexpr,   # rows of x per program (16 at decode: masked rows)
    BLOCK_N: tl.constexpr,   # rows of W per program
    BLOCK_K: tl.constexpr,   # K per loop step
    DOT_FP32: tl.constexpr,  # True: tl.dot in fp32 (interpreter: its bf16 dot is broken)
    SPLIT_K: tl.constexpr,   # programs sharing one output tile along K (1: no split)
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)        # (BLOCK_M,)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)        # (BLOCK_N,)
    m_mask = offs_m < M
    n_mask = offs_n < N
    k_per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_end = tl.minimum((pid_k + 1) * k_per_split, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)   # (BLOCK_M, BLOCK_N)
    for k0 in range(pid_k * k_per_split, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)                  # (BLOCK_K,)
        k_mask = offs_k < k_end
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=m_mask[:, None] & k_mask[None, :], other=0.0)  # (BLOCK_M, BLOCK_K)
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :],
                    mask=n_mask[:, None] & k_mask[None, :], other=0,
                    eviction_policy="evict_first")           # (BLOCK_N, BLOCK_K) int8
        # the accumulator form tl.dot(a, b, acc): the tensor cores add into acc directly
        # (acc += tl.dot(a, b) would start each product from zero and add it separately)
        if DOT_FP32:
            acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc,
                         input_precision="ieee")
        else:  # int8 -> fp16/bf16 is exact; tensor cores take 16-bit operands
            acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc)
    scale = tl.load(s_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)   # (BLOCK_N,)
    acc = acc * scale[None, :]
    store_or_reduce(acc, y_ptr, ws_ptr, cnt_ptr, offs_m, offs_n, M, N, stride_ym, SPLIT_K)


# On a GPU, a small list of configurations is tried once per shape (autotuning); the
# interpreter skips this (it cannot time anything) and uses the defaults in the wrapper.
# Narrow BLOCK_N (16, 32) gives a batch-16 layer with N = 4096 enough programs to fill the GPU.
_GEMV_CONFIGS = [triton.Config({"BLOCK_K": bk}, num_warps=w, num_stages=s)
                  for bk, w, s in [(64, 4, 3), (128, 4, 3), (256, 4, 3), (128, 8, 4), (256, 8, 3)]]
_GEMM_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
                 for bm, bn, bk, w, s in [(16, 16, 256, 2, 4), (16, 32, 256, 4, 4),
                                          (16, 64, 128, 4, 4), (32, 64, 128, 4, 4), (64, 64, 128, 4, 4),
                                          (64, 128, 64, 4, 4), (128, 128, 64, 8, 3),
                                          (128, 256, 64, 8, 3)]]
_GEMV_DEFAULT = triton.Config({"BLOCK_K": 128}, num_warps=4, num_stages=3)  # autotune off
_GEMM_DEFAULT = triton.Config({"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128}, num_warps=4, num_stages=4)
# batch <= 16 on a GPU (sm_80+): 16-row tiles, wide N and K steps: 3.4 SASS instructions per
# weight byte on sm_90 against 4.5 for the 64 x 128 GEMM default (kernels.compile_check); 80
# KB of shared memory, so sm_75 (64 KB) keeps the GEMM default
_DECODE_DEFAULT = triton.Config({"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 256}, num_warps=4,
                                num_stages=3)
# fp32 activations: that tile needs 224 KB of shared memory (compiled for sm_86), past the
# A100's 163 KB and the 99 KB of sm_86/89/120; a quarter of the K step fits all of them
_DECODE_FP32 = triton.Config({"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 64}, num_warps=4,
                             num_stages=3)
# the decode tiles dot_plan chooses from, widest first (kernels._common.fill_plan): a layer
# with few outputs takes a narrower tile so that every SM gets a program (4096 x 4096 on 132
# SMs: 32 tiles of 128 x 4 K slices = 128 programs; tiles of 64: 256). SASS per weight byte
# on sm_90 (compile_check's launch plans record it): 3.4 at 128, 4.3 at 64, 4.2 at 32 (2 warps)
_DECODE_TILES = [_DECODE_DEFAULT,
                 triton.Config({"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256}, num_warps=4,
                               num_stages=3),
                 triton.Config({"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 256}, num_warps=2,
                               num_stages=3)]
# Split-K programs add into y: autotuning must leave it zero for the real call
# (reset before each trial, restored after: safe across Triton versions).
if INTERPRET:
    _gemv, _gemm = w8a16_gemv_kernel, w8a16_gemm_kernel
else:
    _gemv = triton.autotune(_GEMV_CONFIGS, key=["M", "N", "K", "BLOCK_M", "BLOCK_N", "SPLIT_K"],
                            reset_to_zero=["y_ptr"], restore_value=["y_ptr"])(w8a16_gemv_kernel)
    _gemm = triton.autotune(_GEMM_CONFIGS, key=["M", "N", "K"])(w8a16_gemm_kernel)


def dot_plan(M: int, N: int, K: int, sms: int | None = None, fp32: bool = False) -> dict:
    """Launch plan of ``w8a16_gemm_kernel`` at decode sizes (M <= 16) on a GPU: 16-row
    tiles, 3 pipeline stages, and K split until the grid has about two programs per SM;
    where even the split leaves SMs without a program, a narrower tile (``_DECODE_TILES``,
    ``kernels._common.fill_plan``; ``kernels.compile_check`` reports the bytes in flight per
    SM this gives). ``fp32``: x in float32 takes ``_DECODE_FP32``, whose shared memory fits
    every supported GPU."""
    sm80 = not on_gpu() or torch.cuda.get_device_capability(0) >= (8, 0)
    tiles = ([_DECODE_FP32] if fp32 else _DECODE_TILES) if sm80 else [_GEMM_DEFAULT]
    f = fill_plan(tiles, N, lambda c: triton.cdiv(K, c.kwargs["BLOCK_K"]), sms or num_sms())
    c = f["config"]
    return {**c.kwargs, "SPLIT_K": f["rule"]["SPLIT_K"], "num_warps": c.num_warps,
            "num_stages": c.num_stages}


# ---------------------------------------------------------------------------- wrapper

def _check_weights(w_q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    if not isinstance(w_q, torch.Tensor) or w_q.dtype != torch.int8 or w_q.dim() != 2:
        raise TypeError("w_q must be a 2-D int8 tensor (N, K); make one with "
                        "kernels.w8a16.quantize_weight(w)")
    if not isinstance(scale, torch.Tensor) or not scale.is_floating_point():
        raise TypeError("scale must be a floating-point tensor of shape (N,)")
    N = w_q.shape[0]
    if scale.numel() != N or (scale.dim() == 2 and scale.shape[1] != 1) or scale.dim() > 2:
        raise ValueError(f"scale has shape {tuple(scale.shape)}; a per-channel scale has one "
                         f"value per output row of w_q: shape ({N},) or ({N}, 1)")
    return scale.reshape(N).contiguous()


KERNELS = ("dot", "gemv")   # w8a16_linear(kernel=...): the default and the teaching step


def w8a16_linear(x: torch.Tensor, w_q: torch.Tensor, scale: torch.Tensor, *,
                 block_n: int | None = None, split_k: int | None = None,
                 force_gemm: bool = False, config=None, kernel: str | None = None) -> torch.Tensor:
    """y = x @ (w_q * scale[:, None]).T with the Triton kernels (lessons 09 and 10).

    x: (..., K) fp16/bf16/fp32; w_q: (N, K) int8; scale: (N,) or (N, 1). Returns (..., N)
    in x's dtype. ``kernel`` picks the kernel by name: "dot" (the default at every batch:
    one launch, the tl.dot kernel with 16-row tiles, so tensor cores and a pipelined weight
    stream even at batch 1) or "gemv" (the CUDA-core GEMV of lesson 09, batch <= 8: the
    teaching step). ``block_n``/``split_k`` override the GEMV launch plan (``block_n``
    also the dot kernel's); ``force_gemm`` is the old name of kernel="dot"; ``config``
    forces one configuration of ``_GEMV_CONFIGS``/``_GEMM_CONFIGS`` (tests reach every
    path with these).
    """
    scale = _check_weights(w_q, scale)
    N, K = w_q.shape
    x2 = check_activations(x, K)                        # (M, K)
    w_q = w_q.contiguous()
    check_device(x2, w_q, scale)
    M = x2.shape[0]
    out_shape = (*x.shape[:-1], N)
    if M == 0:
        return torch.empty(out_shape, dtype=x.dtype, device=x.device)
    if kernel is not None and kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r}: choose one of {KERNELS}")
    if kernel is None:
        gemv_config = config is not None and "BLOCK_M" not in config.kwargs
        kernel = "gemv" if gemv_config and not force_gemm else "dot"
    if kernel == "gemv" and M <= GEMV_MAX_M:
        bn, sk = gemv_plan(M, N, K, k_unit=128)
        bn, sk = block_n or bn, split_k or sk
        y = (torch.zeros((M, N), dtype=torch.float32, device=x.device) if sk > 1
             else torch.empty((M, N), dtype=x.dtype, device=x.device))        # (M, N)
        grid = (triton.cdiv(N, bn), sk)          # one program per block of outputs (x K split)
        kern, meta = choose(_gemv, w8a16_gemv_kernel, _GEMV_DEFAULT, {"BLOCK_K": 32}, config)
        kern[grid](x2, w_q, scale, y, M, N, K, x2.stride(0), w_q.stride(0), y.stride(0),
                   BLOCK_M=pow2_at_least(M, 1, GEMV_MAX_M), BLOCK_N=bn, SPLIT_K=sk, **meta)
        return y.to(x.dtype).reshape(out_shape)
    if block_n is not None and (block_n < 16 or block_n & (block_n - 1)):
        raise ValueError(f"block_n={block_n} is too narrow for tl.dot: use a power of two "
                         f">= 16 (or kernel='gemv')")
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)                   # (M, N), once
    interp = {"BLOCK_M": pow2_at_least(M, 16, 32), "BLOCK_N": block_n or 32, "BLOCK_K": 32}
    if on_gpu() and M <= 16 and config is None:      # decode: the plan, not the autotuner
        kern, meta = w8a16_gemm_kernel, dot_plan(M, N, K, fp32=x.dtype == torch.float32)
    else:
        kern, meta = choose(_gemm, w8a16_gemm_kernel, _GEMM_DEFAULT, interp, config)
        meta = {**meta, "SPLIT_K": 1}
    if split_k:
        meta["SPLIT_K"] = split_k
    if block_n and "BLOCK_N" in meta:
        meta["BLOCK_N"] = block_n
    sk = meta["SPLIT_K"]
    grid = lambda m: (triton.cdiv(N, m["BLOCK_N"]), triton.cdiv(M, m["BLOCK_M"]), sk)  # noqa: E731
    if sk > 1:                                       # counters for the smallest tiles there are
        ws, cnt = workspace(M, N, triton.cdiv(N, 16) * triton.cdiv(M, 16), x.device)
    else:
        ws, cnt = y, y
    kern[grid](x2, w_q, scale, y, ws, cnt, M, N, K, x2.stride(0), w_q.stride(0), y.stride(0),
               DOT_FP32=INTERPRET or x.dtype == torch.float32, **meta)
    return y.reshape(out_shape)


# ---------------------------------------------------------------------------- compile check

def compile_jobs(arch: int, all_configs: bool = False):
    """What ``kernels.compile_check`` compiles for this file (GEMV at 1, 4, 8 rows; GEMM)."""
    acts = ["*bf16", "*fp16", "*fp32"] if all_configs else ["*fp16" if arch < 80 else "*bf16"]
    jobs = []
    for act in acts:
        sig = dict(x_ptr=act, w_ptr="*i8", s_ptr="*fp32", y_ptr=act, M="i32", N="i32", K="i32",
                   stride_xm="i32", stride_wn="i32", stride_ym="i32")
        for rows in (1, 4, 8):
            for sk in ((1, 2) if all_configs else (1,)):
                consts = dict(BLOCK_M=rows, BLOCK_N=32 if rows <= 2 else 16, SPLIT_K=sk)
                jobs += config_jobs("w8a16_gemv", w8a16_gemv_kernel,
                                    dict(sig, y_ptr="*fp32" if sk > 1 else act), consts,
                                    _GEMV_CONFIGS, _GEMV_DEFAULT, all_configs, rows=rows,
                                    weight_bytes_per_step=lambda c: c["BLOCK_N"] * c["BLOCK_K"])
        gemm_sig = dict(x_ptr=act, w_ptr="*i8", s_ptr="*fp32", y_ptr=act, ws_ptr="*fp32",
                        cnt_ptr="*i32", M="i32", N="i32", K="i32", stride_xm="i32",
                        stride_wn="i32", stride_ym="i32")
        if arch >= 80:                       # the decode plan's tile, alone and split along K
            tile = _DECODE_FP32 if act == "*fp32" else _DECODE_DEFAULT
            for split in (1, 4):
                jobs += config_jobs("w8a16_dot" + (" split-K" if split > 1 else ""),
                                    w8a16_gemm_kernel, gemm_sig,
                                    dict(DOT_FP32=act == "*fp32", SPLIT_K=split),
                                    [tile], tile, False,
                                    rows=lambda c: c["BLOCK_M"],
                                    weight_bytes_per_step=lambda c: c["BLOCK_N"] * c["BLOCK_K"])
            if act != "*fp32" and not all_configs:
                # fp32 x at decode takes its own tile (a default path): fit it everywhere
                jobs += config_jobs("w8a16_dot fp32-x", w8a16_gemm_kernel,
                                    dict(gemm_sig, x_ptr="*fp32", y_ptr="*fp32"),
                                    dict(DOT_FP32=True, SPLIT_K=1), [_DECODE_FP32], _DECODE_FP32,
                                    False, rows=lambda c: c["BLOCK_M"],
                                    weight_bytes_per_step=lambda c: c["BLOCK_N"] * c["BLOCK_K"])
        jobs += config_jobs("w8a16_gemm", w8a16_gemm_kernel, gemm_sig, dict(DOT_FP32=act == "*fp32", SPLIT_K=1),
                            _GEMM_CONFIGS, _GEMM_DEFAULT, all_configs,
                            rows=lambda c: c["BLOCK_M"],
                            weight_bytes_per_step=lambda c: c["BLOCK_N"] * c["BLOCK_K"])
    return jobs


# ---------------------------------------------------------------------------- reference

def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(w_q (N, K) int8, scale (N,) fp32): symmetric per-channel int8 (course_lib.quant)."""
    from course_lib import quant

    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"w must be a 2-D floating-point weight (N out, K in); got "
                         f"{type(w).__name__} {tuple(getattr(w, 'shape', ()))} "
                         f"{getattr(w, 'dtype', '')}")

    qt = quant.quantize(w.float(), fmt="int8", granularity="per_channel")
    q = torch.as_tensor(qt.q).to(torch.int8)                           # (N, K)
    scale = torch.as_tensor(qt.scale).float().reshape(w.shape[0])      # (N,)
    return q.to(w.device), scale.to(w.device)


def w8a16_reference(x: torch.Tensor, w_q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Plain torch: dequantize the whole weight, then F.linear in fp32; result in x's dtype."""
    scale = _check_weights(w_q, scale)
    check_activations(x, w_q.shape[1])          # an int x would come back truncated to int
    w = w_q.float() * scale.float()[:, None]                            # (N, K)
    return F.linear(x.float(), w).to(x.dtype)                           # (..., N)


# ---------------------------------------------------------------------------- benchmark

def bench_backends(act_dtype=torch.bfloat16, with_fp8: bool = False):
    """This file's entry in the GPU benchmark (``kernels.bench.GPU_KERNEL_MODULES``)."""
    from kernels._common import Backend

    return [Backend("w8a16", quantize_weight, lambda x, st: w8a16_linear(x, *st),
                    act_dtype, 8, "per_channel")]


def benchmark(shapes=((4096, 4096), (8192, 28672)), batches=(1, 16), dtype=torch.bfloat16):
    """Median time of the kernel against torch BF16 F.linear (GPU only; lesson 10).

    ``shapes`` are (K in, N out). Returns a list of dicts. Use ``python -m kernels.bench``
    for the full benchmark that writes a results JSON.
    """
    from course_lib import bench
    from course_lib.device import require_gpu

    require_gpu("kernels.w8a16.benchmark")
    return bench.speedup_vs_bf16("w8a16", quantize_weight,
                                 lambda x, wq: w8a16_linear(x, *wq), shapes, batches, dtype)
