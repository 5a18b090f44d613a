"""INT8 W8A8: int8 weights per channel, int8 activations per token, int32 accumulation (lesson 08).

What you will learn
-------------------
* Integer tensor cores: int8 x int8 products summed in int32 by ``tl.dot``, at twice the BF16
  rate on A100 and H100 (624 vs 312 dense TOPS on an A100). The sum is *exact*: an int32
  holds K * 127 * 127 for K up to 133,000, so the kernel's accumulator can be checked bit for
  bit against a plain-torch reference (``RAW_ACC=True`` returns it, scales skipped).
* The scales in the epilogue: ``y[m, n] = xs[m] * ws[n] * acc[m, n]``, once per output,
  after the K loop (vector-wise quantization, LLM.int8(); per-token x per-channel).
* A fused per-token quantization kernel: one program per token finds max|x|, divides by
  127, rounds half to even and stores int8 codes and the fp32 scale, the same numbers as
  ``course_lib.quant.quantize(x, "int8", "per_token")``.
* SmoothQuant (``course_lib.methods.smoothquant``) is folded into the weights beforehand, so
  this kernel needs nothing extra for it.

Pseudo-code::

    # kernel 1: one program per token m
    amax = max_k |x[m, k]| ;  xs[m] = amax / 127 (1 if amax == 0; NaN if any x is NaN)
    xq[m, :] = int8(clamp(round_half_even(x[m, :] / xs[m]), -127, 127))
    # kernel 2: one program per (BLOCK_M, BLOCK_N) tile of y
    acc = 0 (int32)
    for k0 in range(0, K, BLOCK_K):
        acc = dot(xq[m-tile, k0:], wq[n-tile, k0:].T, acc)   # int8 x int8 -> int32
    y = acc  if RAW_ACC  else  float(acc) * xs[:, None] * ws[None, :]
"""
from __future__ import annotations

import torch

from kernels._triton import tl, triton  # Triton, or its stand-in where it is not installed

from kernels import INTERPRET, TRITON, TRITON_MISSING, TritonMissing
from kernels._common import (CompileJob, capability, check_activations, check_device,
                             check_row_scaled_weights, choose, config_jobs, on_gpu,
                             pow2_at_least, token_scales)

QMAX = 127
INT8_MIN_CC = (8, 0)            # Triton's int8 tl.dot: Ampere and later
INT8_MIN_CC_X10 = 80


# ---------------------------------------------------------------------------- kernels

@triton.jit
def quantize_rows_int8_kernel(
    x_ptr,        # activations, (M, K) contiguous rows, fp16/bf16/fp32
    xq_ptr,       # output codes, (M, K) int8
    xs_ptr,       # output scales, (M,) fp32
    K,            # features per row
    stride_xm,    # elements between rows of x
    stride_qm,    # elements between rows of xq
    BLOCK_K: tl.constexpr,   # K elements per loop step
):
    m = tl.program_id(0)                                     # one program per token
    amax = tl.zeros((BLOCK_K,), dtype=tl.float32)
    probe = tl.zeros((BLOCK_K,), dtype=tl.float32)          # NaN once any x is NaN
    for k0 in range(0, K, BLOCK_K):                          # pass 1: the row's max |x|
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + m * stride_xm + offs_k, mask=offs_k < K, other=0.0)
        amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))   # max ignores NaN (GPU fmax)
        probe += x.to(tl.float32)
    row_max = tl.max(amax, axis=0)
    # div_rn: IEEE division, as torch's (a plain / may compile to an approximate one)
    scale = tl.where(row_max > 0, tl.math.div_rn(row_max, 127.0), 1.0)
    # a NaN in the row makes its scale NaN, so the layer's output row is NaN, never a
    # finite wrong number (the max above skips NaN and the codes would clamp it to +-127)
    nan_sum = tl.sum(probe, axis=0)
    scale = tl.where(nan_sum == nan_sum, scale, nan_sum)
    tl.store(xs_ptr + m, scale)
    for k0 in range(0, K, BLOCK_K):                          # pass 2: scale, round, clamp
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        x = tl.load(x_ptr + m * stride_xm + offs_k, mask=k_mask, other=0.0).to(tl.float32)
        y = tl.math.div_rn(x, scale)                         # |y| <= 127
        y = (y + 12582912.0) - 12582912.0                    # round half to even (1.5 * 2**23)
        y = tl.minimum(tl.maximum(y, -127.0), 127.0)
        tl.store(xq_ptr + m * stride_qm + offs_k, y.to(tl.int8), mask=k_mask)


@triton.jit
def int8_gemm_kernel(
    a_ptr,        # quantized activations, (M, K) int8
    as_ptr,       # per-token scales, (M,) fp32
    b_ptr,        # quantized weights, (N, K) int8 (the nn.Linear layout)
    bs_ptr,       # per-channel scales, (N,) fp32
    y_ptr,        # output, (M, N): fp16/bf16/fp32, or int32 when RAW_ACC
    M, N, K,      # problem size
    stride_am,    # elements between rows of a
    stride_bn,    # elements between rows of b
    stride_ym,    # elements between rows of y
    BLOCK_M: tl.constexpr,   # rows of a per program
    BLOCK_N: tl.constexpr,   # rows of b per program
    BLOCK_K: tl.constexpr,   # K per loop step
    RAW_ACC: tl.constexpr,   # store the int32 accumulator itself (tests), scales skipped
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)        # (BLOCK_M,)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)        # (BLOCK_N,)
    m_mask = offs_m < M
    n_mask = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)     # (BLOCK_M, BLOCK_N)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + offs_k[None, :],
                    mask=m_mask[:, None] & k_mask[None, :], other=0)   # (BLOCK_M, BLOCK_K) int8
        b = tl.load(b_ptr + offs_n[:, None] * stride_bn + offs_k[None, :],
                    mask=n_mask[:, None] & k_mask[None, :], other=0)   # (BLOCK_N, BLOCK_K) int8
        acc = tl.dot(a, tl.trans(b), acc, out_dtype=tl.int32)   # int8 x int8 -> int32, exact
    out_mask = m_mask[:, None] & n_mask[None, :]
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    if RAW_ACC:
        tl.store(y_ptrs, acc, mask=out_mask)
    else:
        a_s = tl.load(as_ptr + offs_m, mask=m_mask, other=0.0)  # (BLOCK_M,)
        b_s = tl.load(bs_ptr + offs_n, mask=n_mask, other=0.0)  # (BLOCK_N,)
        y = acc.to(tl.float32) * a_s[:, None] * b_s[None, :]
        tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def int8_fused_kernel(
    x_ptr,        # activations, (M, K) fp16/bf16/fp32, M <= BLOCK_M: quantized in here
    b_ptr,        # quantized weights, (N, K) int8
    bs_ptr,       # per-channel scales, (N,) fp32
    y_ptr,        # output, (M, N) in x's dtype
    M, N, K,      # problem size
    stride_xm,    # elements between rows of x
    stride_bn,    # elements between rows of b
    stride_ym,    # elements between rows of y
    BLOCK_M: tl.constexpr,   # rows of x: one tile holds the whole decode batch (16)
    BLOCK_N: tl.constexpr,   # rows of b per program
    BLOCK_K: tl.constexpr,   # K per loop step
):
    """Decode (M <= 16): the per-token quantization fused into the GEMM's prologue, one
    launch. Every program finds each token's max |x| (x is a few KB, read from L2), then
    quantizes its x tiles in registers exactly as ``quantize_rows_int8_kernel`` does."""
    pid_n = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)                           # (BLOCK_M,) every token
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)        # (BLOCK_N,)
    m_mask = offs_m < M
    n_mask = offs_n < N
    scale = token_scales(x_ptr, M, K, stride_xm, 127.0, BLOCK_M, BLOCK_K)   # prologue
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)     # (BLOCK_M, BLOCK_N)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=m_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
        a = tl.math.div_rn(x, scale[:, None])                # |a| <= 127
        a = (a + 12582912.0) - 12582912.0                    # round half to even
        a = tl.minimum(tl.maximum(a, -127.0), 127.0).to(tl.int8)   # (BLOCK_M, BLOCK_K)
        b = tl.load(b_ptr + offs_n[:, None] * stride_bn + offs_k[None, :],
                    mask=n_mask[:, None] & k_mask[None, :], other=0,
                    eviction_policy="evict_first")           # (BLOCK_N, BLOCK_K) int8
        acc = tl.dot(a, tl.trans(b), acc, out_dtype=tl.int32)   # int8 x int8 -> int32, exact
    b_s = tl.load(bs_ptr + offs_n, mask=n_mask, other=0.0)  # (BLOCK_N,)
    y = acc.to(tl.float32) * scale[:, None] * b_s[None, :]
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :],
             y.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


FUSED_MAX_M = 16                 # decode batches: quantization fused into the GEMM
_FUSED_DEFAULT = triton.Config({"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128}, num_warps=4,
                               num_stages=3)


_GEMM_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w,
                               num_stages=s)
                 for bm, bn, bk, w, s in [(16, 32, 128, 4, 4), (16, 64, 128, 4, 4),
                                          (32, 64, 128, 4, 4), (64, 64, 128, 4, 4),
                                          (64, 128, 128, 4, 4), (128, 128, 128, 8, 3),
                                          (128, 256, 128, 8, 3), (128, 128, 64, 4, 4)]]
# the config a GPU runs with autotuning off: 64 KB of shared memory fits every architecture
_GEMM_DEFAULT = _GEMM_CONFIGS[-1]                       # 128 x 128 x 64, 4 warps, 4 stages
_gemm = int8_gemm_kernel if INTERPRET else triton.autotune(
    _GEMM_CONFIGS, key=["M", "N", "K"])(int8_gemm_kernel)


# ---------------------------------------------------------------------------- wrappers

def int8_supported() -> tuple[bool, str]:
    """(True, why) when Triton's INT8 tensor-core path can run here; the interpreter counts."""
    return capability(INTERPRET, INT8_MIN_CC,
                      "Triton interpreter on the CPU: exact INT8 results, emulated, never timed",
                      "this kernel's int8 tl.dot needs 8.0 or higher (Ampere, Ada, Hopper, "
                      "Blackwell)")


def require_int8() -> None:
    """Raise a RuntimeError that says what to do when the INT8 kernel cannot run."""
    ok, why = int8_supported()
    if not ok and not TRITON and why == TRITON_MISSING:
        raise TritonMissing(f"the INT8 W8A8 kernel cannot launch: {why}")
    if not ok:
        raise RuntimeError(f"INT8 W8A8 kernel refused: {why}. Use "
                           "kernels.w8a8_int8.w8a8_int8_reference (plain torch, the same "
                           "numbers) or a GPU of compute capability 8.0 or higher.")


def _check_weights(w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    return check_row_scaled_weights(w_q, w_scale, torch.int8, "int8",
                                    "kernels.w8a8_int8.quantize_weight(w)")


def quantize_rows_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token INT8 with the Triton kernel: (xq (M, K) int8, xs (M,) fp32)."""
    require_int8()
    K = x.shape[-1] if isinstance(x, torch.Tensor) and x.dim() else 0
    x2 = check_activations(x, K)                                        # (M, K)
    check_device(x2)
    M = x2.shape[0]
    xq = torch.empty((M, K), dtype=torch.int8, device=x2.device)        # (M, K)
    xs = torch.empty((M,), dtype=torch.float32, device=x2.device)       # (M,)
    if M and K:
        block_k = 1024 if on_gpu() else pow2_at_least(K, 16, 128)
        quantize_rows_int8_kernel[(M,)](x2, xq, xs, K, x2.stride(0), xq.stride(0),
                                        BLOCK_K=block_k)
    return xq, xs


def int8_gemm(xq: torch.Tensor, xs: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
              out_dtype: torch.dtype = torch.bfloat16, raw_acc: bool = False) -> torch.Tensor:
    """y = xs[:, None] * ws[None, :] * (xq @ w_q.T) with INT8 tensor-core maths.

    ``raw_acc=True`` returns the int32 accumulator xq @ w_q.T itself (scales skipped): the
    tests compare it bit for bit with :func:`int8_gemm_reference`.
    """
    require_int8()
    ws = _check_weights(w_q, w_scale)
    N, K = w_q.shape
    if not isinstance(xq, torch.Tensor) or xq.dtype != torch.int8 or xq.dim() != 2 \
            or xq.shape[1] != K:
        raise ValueError(f"xq must be int8 of shape (M, {K}); got "
                         f"{getattr(xq, 'dtype', type(xq).__name__)} "
                         f"{tuple(getattr(xq, 'shape', ()))} (make it with quantize_rows_int8(x))")
    M = xq.shape[0]
    if not isinstance(xs, torch.Tensor) or xs.numel() != M:
        raise ValueError(f"xs must hold one scale per row of xq ({M})")
    xq, w_q, xs = xq.contiguous(), w_q.contiguous(), xs.reshape(M).float().contiguous()
    check_device(xq, xs, w_q, ws)
    y = torch.empty((M, N), dtype=torch.int32 if raw_acc else out_dtype, device=xq.device)
    if M == 0:
        return y
    interp = {"BLOCK_M": pow2_at_least(M, 16, 32), "BLOCK_N": 32, "BLOCK_K": 32}
    kernel, meta = choose(_gemm, int8_gemm_kernel, _GEMM_DEFAULT, interp)
    grid = lambda m: (triton.cdiv(M, m["BLOCK_M"]), triton.cdiv(N, m["BLOCK_N"]))  # noqa: E731
    kernel[grid](xq, xs, w_q, ws, y, M, N, K, xq.stride(0), w_q.stride(0), y.stride(0),
                 RAW_ACC=raw_acc, **meta)
    return y


def w8a8_int8_linear(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, *,
                     fused: bool | None = None) -> torch.Tensor:
    """The whole INT8 W8A8 layer: quantize x per token, then the INT8 GEMM (lesson 08).

    x: (..., K) fp16/bf16/fp32; w_q: (N, K) int8; w_scale: (N,). Returns (..., N) in x's
    dtype. Up to ``FUSED_MAX_M`` tokens (decode) the quantization runs in the GEMM's
    prologue, one launch (``int8_fused_kernel``); ``fused=False`` forces the two kernels,
    ``fused=True`` the fused one (same codes, same result).
    """
    require_int8()
    ws = _check_weights(w_q, w_scale)
    N, K = w_q.shape
    x2 = check_activations(x, K)                                        # (M, K)
    M = x2.shape[0]
    if fused is None:
        fused = 0 < M <= FUSED_MAX_M
    if fused and M > FUSED_MAX_M:
        raise ValueError(f"fused=True takes at most {FUSED_MAX_M} tokens (got {M}): the "
                         f"fused kernel holds the whole batch in one tile")
    if not fused:
        xq, xs = quantize_rows_int8(x2)                                 # (M, K), (M,)
        y = int8_gemm(xq, xs, w_q, w_scale, out_dtype=x.dtype)          # (M, N)
        return y.reshape(*x.shape[:-1], N)
    w_q = w_q.contiguous()
    check_device(x2, w_q, ws)
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)            # (M, N), written once
    c = _FUSED_DEFAULT
    meta = dict(c.kwargs) if on_gpu() else {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32}
    if on_gpu():
        meta.update(num_warps=c.num_warps, num_stages=c.num_stages)
    int8_fused_kernel[(triton.cdiv(N, meta["BLOCK_N"]),)](
        x2, w_q, ws, y, M, N, K, x2.stride(0), w_q.stride(0), y.stride(0), **meta)
    return y.reshape(*x.shape[:-1], N)


# ---------------------------------------------------------------------------- reference

def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(w_q (N, K) int8, scale (N,) fp32): per-channel INT8 (``course_lib.quant``)."""
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"w must be a 2-D floating-point weight (N out, K in); got "
                         f"{type(w).__name__} {tuple(getattr(w, 'shape', ()))} "
                         f"{getattr(w, 'dtype', '')}")
    from course_lib import quant

    qt = quant.quantize(w.detach().float(), "int8", "per_channel")   # refuses NaN / inf
    return qt.q.to(w.device), qt.scale.float().reshape(w.shape[0]).to(w.device)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token INT8 on the host (``course_lib.quant``): (xq (M, K) int8, xs (M,) fp32)."""
    from course_lib import quant

    x2 = x.reshape(-1, x.shape[-1]).float()                             # (M, K)
    qt = quant.quantize(x2, "int8", "per_token")
    return qt.q, qt.scale.float().reshape(-1)


def int8_gemm_reference(xq: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    """The exact int32 accumulator xq @ w_q.T in plain torch (int64 sums, then int32)."""
    if xq.dtype != torch.int8 or w_q.dtype != torch.int8:
        raise TypeError(f"both operands must be int8; got {xq.dtype} and {w_q.dtype}")
    return (xq.cpu().long() @ w_q.cpu().long().T).to(torch.int32)      # (M, N)


def w8a8_int8_reference(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor
                        ) -> torch.Tensor:
    """Plain-torch emulation: quantize x per token on the host, exact int32 sums, then scales.

    The same numbers as the kernels (the scales are applied in the same order, in fp32).
    """
    ws = _check_weights(w_q, w_scale)
    check_activations(x, w_q.shape[1])
    xq, xs = quantize_activations(x.cpu())                              # (M, K), (M,)
    acc = int8_gemm_reference(xq, w_q)                                  # (M, N) int32
    y = acc.float() * xs[:, None] * ws.cpu()[None, :]                   # (M, N)
    return y.to(x.dtype).reshape(*x.shape[:-1], w_q.shape[0]).to(x.device)


# ---------------------------------------------------------------------------- benchmark

def benchmark(shapes=((4096, 4096), (8192, 8192)), batches=(1, 16, 256, 4096),
              dtype=torch.bfloat16):
    """Median time, quantization of x included, against torch BF16 F.linear (GPU, cc >= 8.0).

    Target: >= 1.4x BF16 at M = 4096 on 8192 x 8192 (INT8 tensor cores run at twice the BF16
    rate on A100 and H100)."""
    from course_lib import bench

    require_int8()
    if INTERPRET:
        raise RuntimeError("never time the Triton interpreter: benchmark on a GPU")
    return bench.speedup_vs_bf16("int8", quantize_weight,
                                 lambda x, wq: w8a8_int8_linear(x, *wq), shapes, batches, dtype)


def bench_backends(act_dtype=torch.bfloat16, with_fp8: bool = False):
    """This file's entry in the GPU benchmark (``kernels.bench.GPU_KERNEL_MODULES``): only
    where the INT8 kernel runs (compute capability 8.0+, or the interpreter)."""
    from kernels._common import Backend

    if not int8_supported()[0]:
        return []
    return [Backend("int8 w8a8", quantize_weight, lambda x, st: w8a8_int8_linear(x, *st),
                    act_dtype, 8, "per_channel")]


# ---------------------------------------------------------------------------- compile check

def compile_jobs(arch: int, all_configs: bool = False):
    """What ``kernels.compile_check`` compiles for this file (``KERNEL_MODULES``): the
    quantization kernel everywhere, the GEMM (both output modes) from sm_80, where Triton's
    int8 ``tl.dot`` maps to integer tensor-core instructions (``mma ... s8``)."""
    acts = ["*bf16", "*fp16", "*fp32"] if all_configs else ["*fp16" if arch < 80 else "*bf16"]
    jobs = []
    for act in acts:
        jobs.append(CompileJob(
            "quantize_rows_int8", quantize_rows_int8_kernel,
            dict(x_ptr=act, xq_ptr="*i8", xs_ptr="*fp32", K="i32", stride_xm="i32",
                 stride_qm="i32"),
            dict(BLOCK_K=1024), 4, 3, min_cc=0, default=True))
        for raw in (False, True):
            jobs += config_jobs(
                "int8_gemm raw" if raw else "int8_gemm", int8_gemm_kernel,
                dict(a_ptr="*i8", as_ptr="*fp32", b_ptr="*i8", bs_ptr="*fp32",
                     y_ptr="*i32" if raw else act, M="i32", N="i32", K="i32", stride_am="i32",
                     stride_bn="i32", stride_ym="i32"),
                dict(RAW_ACC=raw), _GEMM_CONFIGS, _GEMM_DEFAULT, all_configs, min_cc=INT8_MIN_CC_X10,
                rows=lambda c: c["BLOCK_M"],
                weight_bytes_per_step=lambda c: c["BLOCK_N"] * c["BLOCK_K"])
        jobs += config_jobs(
            "int8_fused", int8_fused_kernel,
            dict(x_ptr=act, b_ptr="*i8", bs_ptr="*fp32", y_ptr=act, M="i32", N="i32", K="i32",
                 stride_xm="i32", stride_bn="i32", stride_ym="i32"),
            {}, [_FUSED_DEFAULT], _FUSED_DEFAULT, False, min_cc=INT8_MIN_CC_X10,
            rows=lambda c: c["BLOCK_M"])   # no per-byte count: the loop finder would
            # pick the prologue (it reads x only), not the weight loop
    return jobs
