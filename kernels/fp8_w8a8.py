"""FP8 W8A8: E4M3 weights per channel, activations per token quantized on the fly (lesson 09).

What you will learn
-------------------
* Weight *and* activation quantization: both operands of the matmul are FP8, so the tensor
  cores multiply in FP8, at twice their BF16 rate on Hopper (989 -> 1,979 dense TFLOPS on an
  H100). That is what speeds up prefill, where weight-only formats gain nothing.
* Dynamic per-token scales: each row of x gets its own scale ``max|x_row| / 448`` computed
  at run time by a small kernel, then the matmul kernel applies both scales once per output:
  ``y[m, n] = xs[m] * ws[n] * sum_k xq[m, k] * wq[n, k]`` (fp32 accumulation).
* The hardware check: FP8 tensor-core maths needs compute capability 8.9 or higher (Ada,
  Hopper, Blackwell). On an older GPU the wrapper refuses with a clear message, and the
  lesson falls back to ``fp8_w8a8_reference`` (emulation: the same numbers, in fp32).

Pseudo-code::

    # kernel 1: one program per token m
    amax = max_k |x[m, k]| ;  xs[m] = amax / 448 (1 if amax == 0)
    xq[m, :] = fp8(clamp(x[m, :] / xs[m], -448, 448))
    # kernel 2: one program per (BLOCK_M, BLOCK_N) tile of y
    acc = 0 (fp32)
    for k0 in range(0, K, BLOCK_K):
        acc = dot(xq[m-tile, k0:], wq[n-tile, k0:].T, acc)   # FP8 x FP8, added into fp32 acc
    y = acc * xs[:, None] * ws[None, :]
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels._triton import tl, triton  # Triton, or its stand-in where it is not installed

from kernels import INTERPRET, TRITON, TRITON_MISSING, TritonMissing
from kernels._common import (CompileJob, capability, check_activations, check_device,
                             check_row_scaled_weights, choose, config_jobs, on_gpu,
                             pow2_at_least, token_scales)

FP8_MAX = 448.0                 # largest finite E4M3 value
FP8_MIN_CC = (8, 9)             # Ada; Hopper is 9.0, Blackwell 10.x and 12.x
FP8_DTYPE = torch.float8_e4m3fn


# ---------------------------------------------------------------------------- kernels

@triton.jit
def _round_to_e4m3_grid(q):
    """Round fp32 values (|q| <= 448) to the nearest E4M3 value, ties to even, in fp32.

    Only used in the interpreter, whose fp32 -> fp8 cast drops a carry out of the mantissa
    (7.94 becomes 4.0 instead of 8.0); casting a value already on the grid is exact. The
    grid step is 2**(e - 3) for a value with exponent e (3 mantissa bits), and 2**-9 below
    the smallest normal 2**-6 (subnormals).
    """
    bits = q.to(tl.int32, bitcast=True)
    e = tl.maximum((bits >> 23) & 0xFF, 127 - 6)             # biased exponent, >= 2**-6
    step = ((e - 3) << 23).to(tl.float32, bitcast=True)       # 2**(e - 127 - 3)
    y = q / step                                              # exact: step is a power of 2
    y = (y + 12582912.0) - 12582912.0                         # round half to even (1.5 * 2**23)
    return y * step


@triton.jit
def quantize_rows_fp8_kernel(
    x_ptr,        # activations, (M, K) contiguous, fp16/bf16/fp32
    xq_ptr,       # output codes, (M, K) float8 e4m3
    xs_ptr,       # output scales, (M,) fp32
    K,            # features per row
    stride_xm,    # elements between rows of x
    stride_qm,    # elements between rows of xq
    BLOCK_K: tl.constexpr,   # K elements per loop step
    ROUND_FIRST: tl.constexpr,  # interpreter only: round to the E4M3 grid in fp32 first
):
    m = tl.program_id(0)                                     # one program per token
    amax = tl.zeros((BLOCK_K,), dtype=tl.float32)
    probe = tl.zeros((BLOCK_K,), dtype=tl.float32)          # NaN once any x is NaN
    for k0 in range(0, K, BLOCK_K):                          # pass 1: the row's max |x|
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + m * stride_xm + offs_k, mask=offs_k < K, other=0.0)
        amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))   # max skips NaN (GPU fmax)
        probe += x.to(tl.float32)
    row_max = tl.max(amax, axis=0)
    # div_rn: IEEE round-to-nearest division, as the host's torch does; a plain "/" becomes
    # the GPU's approximate division (div.approx.f32), whose codes can differ by one step
    scale = tl.where(row_max > 0, tl.div_rn(row_max, 448.0), 1.0)
    nan_sum = tl.sum(probe, axis=0)
    scale = tl.where(nan_sum == nan_sum, scale, nan_sum)    # a NaN row: NaN out, not finite
    tl.store(xs_ptr + m, scale)
    for k0 in range(0, K, BLOCK_K):                          # pass 2: scale, clamp, cast
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        x = tl.load(x_ptr + m * stride_xm + offs_k, mask=k_mask, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(tl.div_rn(x, scale), -448.0), 448.0)
        if ROUND_FIRST:
            q = _round_to_e4m3_grid(q)
        tl.store(xq_ptr + m * stride_qm + offs_k, q.to(tl.float8e4nv), mask=k_mask)


@triton.jit
def fp8_gemm_kernel(
    a_ptr,        # quantized activations, (M, K) float8 e4m3
    as_ptr,       # per-token scales, (M,) fp32
    b_ptr,        # quantized weights, (N, K) float8 e4m3 (the nn.Linear layout)
    bs_ptr,       # per-channel scales, (N,) fp32
    y_ptr,        # output, (M, N), fp16/bf16/fp32
    M, N, K,      # problem size
    stride_am,    # elements between rows of a
    stride_bn,    # elements between rows of b
    stride_ym,    # elements between rows of y
    BLOCK_M: tl.constexpr,   # rows of a per program
    BLOCK_N: tl.constexpr,   # rows of b per program
    BLOCK_K: tl.constexpr,   # K per loop step
    FAST_ACC: tl.constexpr = True,  # Hopper: let the tensor cores' ~14-bit sum run all of K
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)        # (BLOCK_M,)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)        # (BLOCK_N,)
    m_mask = offs_m < M
    n_mask = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)   # (BLOCK_M, BLOCK_N)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + offs_k[None, :],
                    mask=m_mask[:, None] & k_mask[None, :], other=0.0)  # (BLOCK_M, BLOCK_K) fp8
        b = tl.load(b_ptr + offs_n[:, None] * stride_bn + offs_k[None, :],
                    mask=n_mask[:, None] & k_mask[None, :], other=0.0)  # (BLOCK_N, BLOCK_K) fp8
        # the accumulator form: on Hopper one wgmma adds into acc (acc += tl.dot(...) would
        # start every product from zero and add it with separate instructions).
        # Hopper's FP8 tensor cores keep only about 14 bits while they add (DeepSeek-V3
        # report, section 3.3.2). Triton's default there (FAST_ACC) lets a whole K-long sum
        # accumulate that way; max_num_imprecise_acc promotes it to true fp32 adds instead.
        # Measured on an H200 (results/sweep_gemv_nvidia_h200.json, logs in results/logs):
        # fast, a K = 4096 sum was off by about 2 * 2**-13 of sum|products| (the tests allow
        # 2**-13 per 32-long wgmma step); promoted, by ~2**-24; but at M = 4096 on an 8192 x
        # 8192 layer the promoted kernel ran at 0.49x BF16, the fast one at 1.45x. Elsewhere
        # (Ada, Blackwell's other paths, the interpreter) both give the same numbers.
        if FAST_ACC:
            acc = tl.dot(a, tl.trans(b), acc)                # FP8 x FP8 -> fp32
        else:
            acc = tl.dot(a, tl.trans(b), acc, max_num_imprecise_acc=BLOCK_K)
    a_s = tl.load(as_ptr + offs_m, mask=m_mask, other=0.0)  # (BLOCK_M,)
    b_s = tl.load(bs_ptr + offs_n, mask=n_mask, other=0.0)  # (BLOCK_N,)
    acc = acc * a_s[:, None] * b_s[None, :]
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def fp8_fused_kernel(
    x_ptr,        # activations, (M, K) fp16/bf16/fp32, M <= BLOCK_M: quantized in here
    b_ptr,        # quantized weights, (N, K) float8 e4m3
    bs_ptr,       # per-channel scales, (N,) fp32
    y_ptr,        # output, (M, N) in x's dtype
    M, N, K,      # problem size
    stride_xm,    # elements between rows of x
    stride_bn,    # elements between rows of b
    stride_ym,    # elements between rows of y
    BLOCK_M: tl.constexpr,   # rows of x: one tile holds the whole decode batch (16)
    BLOCK_N: tl.constexpr,   # rows of b per program
    BLOCK_K: tl.constexpr,   # K per loop step
    ROUND_FIRST: tl.constexpr,  # interpreter only: round to the E4M3 grid in fp32 first
):
    """Decode (M <= 16): the per-token FP8 quantization in the GEMM's prologue, one launch;
    the same codes as ``quantize_rows_fp8_kernel`` (lesson 09)."""
    pid_n = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)                           # (BLOCK_M,) every token
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)        # (BLOCK_N,)
    m_mask = offs_m < M
    n_mask = offs_n < N
    scale = token_scales(x_ptr, M, K, stride_xm, 448.0, BLOCK_M, BLOCK_K)   # prologue
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)   # (BLOCK_M, BLOCK_N)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=m_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(tl.div_rn(x, scale[:, None]), -448.0), 448.0)
        if ROUND_FIRST:
            q = _round_to_e4m3_grid(q)
        b = tl.load(b_ptr + offs_n[:, None] * stride_bn + offs_k[None, :],
                    mask=n_mask[:, None] & k_mask[None, :], other=0.0,
                    eviction_policy="evict_first")           # (BLOCK_N, BLOCK_K) fp8
        acc = tl.dot(q.to(tl.float8e4nv), tl.trans(b), acc)  # FP8 x FP8 -> fp32
    b_s = tl.load(bs_ptr + offs_n, mask=n_mask, other=0.0)  # (BLOCK_N,)
    acc = acc * scale[:, None] * b_s[None, :]
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


FUSED_MAX_M = 16                 # decode batches: quantization fused into the GEMM
_FUSED_DEFAULT = triton.Config({"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128}, num_warps=4,
                               num_stages=3)


_GEMM_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
                 for bm, bn, bk, w, s in [(16, 32, 128, 4, 4), (16, 64, 128, 4, 4), (32, 64, 128, 4, 4),
                                          (64, 64, 128, 4, 4), (64, 128, 128, 4, 4),
                                          (128, 128, 128, 8, 3), (128, 256, 128, 8, 3),
                                          (128, 128, 64, 4, 4)]]
_GEMM_DEFAULT = triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128}, num_warps=4, num_stages=4)
_gemm = fp8_gemm_kernel if INTERPRET else triton.autotune(_GEMM_CONFIGS, key=["M", "N", "K"])(
    fp8_gemm_kernel)


# ---------------------------------------------------------------------------- wrappers

def fp8_supported() -> tuple[bool, str]:
    """(True, why) when FP8 tensor-core maths can run here; the interpreter counts as yes."""
    return capability(INTERPRET, FP8_MIN_CC,
                      "Triton interpreter on the CPU: correct FP8 results, emulated, never timed",
                      "FP8 tensor-core maths needs 8.9 or higher (Ada, Hopper, Blackwell)")


def require_fp8() -> None:
    """Raise a RuntimeError that says what to do when FP8 maths is not available."""
    ok, why = fp8_supported()
    if not ok and not TRITON and why == TRITON_MISSING:
        raise TritonMissing(f"the FP8 W8A8 kernel cannot launch: {why}")
    if not ok:
        raise RuntimeError(f"FP8 W8A8 kernel refused: {why}. Use "
                           "kernels.fp8_w8a8.fp8_w8a8_reference (emulation in fp32: same "
                           "numbers, no speed-up), or a GPU with FP8 tensor cores.")


def _check_weights(w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    return check_row_scaled_weights(w_q, w_scale, FP8_DTYPE, "torch.float8_e4m3fn",
                                    "kernels.fp8_w8a8.quantize_weight(w)")


def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token FP8 quantization with the Triton kernel: (xq (M, K) fp8, xs (M,) fp32).

    In the interpreter, about 3-5% of fp32 -> fp8 casts lose a mantissa carry (a value that
    should round up to the next power of two comes out one power of two lower): a known
    interpreter bug. There the kernel first rounds to the E4M3 grid in fp32, so the cast is
    exact; on a GPU the native cast rounds correctly by itself. Refuses (RuntimeError) on a
    GPU without FP8 support (compute capability below 8.9).
    """
    require_fp8()
    K = x.shape[-1]
    x2 = check_activations(x, K)                                        # (M, K)
    check_device(x2)
    M = x2.shape[0]
    xq = torch.empty((M, K), dtype=FP8_DTYPE, device=x.device)          # (M, K)
    xs = torch.empty((M,), dtype=torch.float32, device=x.device)        # (M,)
    if M:
        block_k = 1024 if on_gpu() else pow2_at_least(K, 16, 128)
        quantize_rows_fp8_kernel[(M,)](x2, xq, xs, K, x2.stride(0), xq.stride(0),
                                       BLOCK_K=block_k, ROUND_FIRST=INTERPRET)
    return xq, xs


def fp8_gemm(xq: torch.Tensor, xs: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
             out_dtype: torch.dtype = torch.bfloat16, config=None,
             fast_accum: bool = True) -> torch.Tensor:
    """y = (xq * xs[:, None]) @ (w_q * w_scale[:, None]).T with FP8 tensor-core maths.

    ``config`` forces one configuration of ``_GEMM_CONFIGS`` (the tests run each).
    ``fast_accum=False`` promotes Hopper's reduced-precision tensor-core sums to fp32 once
    per BLOCK_K: exact to fp32 rounding, and slower (see the kernel's comment).
    """
    require_fp8()
    ws = _check_weights(w_q, w_scale)
    N, K = w_q.shape
    if xq.dtype != FP8_DTYPE or xq.dim() != 2 or xq.shape[1] != K:
        raise ValueError(f"xq must be float8_e4m3fn of shape (M, {K}); got {xq.dtype} "
                         f"{tuple(xq.shape)} (make it with quantize_rows_fp8(x))")
    M = xq.shape[0]
    if xs.numel() != M:
        raise ValueError(f"xs must hold one scale per row of xq ({M}), got {xs.numel()}")
    xq, w_q, xs = xq.contiguous(), w_q.contiguous(), xs.reshape(M).float().contiguous()
    check_device(xq, xs, w_q, ws)
    y = torch.empty((M, N), dtype=out_dtype, device=xq.device)          # (M, N)
    if M == 0:
        return y
    interp = {"BLOCK_M": pow2_at_least(M, 16, 32), "BLOCK_N": 32, "BLOCK_K": 32}
    kernel, meta = choose(_gemm, fp8_gemm_kernel, _GEMM_DEFAULT, interp, config)
    grid = lambda m: (triton.cdiv(M, m["BLOCK_M"]), triton.cdiv(N, m["BLOCK_N"]))  # noqa: E731
    kernel[grid](xq, xs, w_q, ws, y, M, N, K, xq.stride(0), w_q.stride(0), y.stride(0),
                 FAST_ACC=bool(fast_accum), **meta)
    return y


def fp8_w8a8_linear(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, *,
                    fast_accum: bool = True, fused: bool | None = None) -> torch.Tensor:
    """The whole FP8 W8A8 layer: quantize x per token on the fly, then the FP8 GEMM (lesson 09).

    x: (..., K) fp16/bf16/fp32; w_q: (N, K) float8_e4m3fn; w_scale: (N,). Returns (..., N)
    in x's dtype. Up to ``FUSED_MAX_M`` tokens the quantization runs in the GEMM's prologue
    (one launch, ``fp8_fused_kernel``); ``fused=False`` forces the two kernels. Refuses
    (RuntimeError) on a GPU below compute capability 8.9.
    """
    require_fp8()
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
        xq, xs = quantize_rows_fp8(x2)                                  # (M, K), (M,)
        y = fp8_gemm(xq, xs, w_q, w_scale, out_dtype=x.dtype, fast_accum=fast_accum)
        return y.reshape(*x.shape[:-1], N)
    w_q = w_q.contiguous()
    check_device(x2, w_q, ws)
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)            # (M, N), written once
    c = _FUSED_DEFAULT
    meta = dict(c.kwargs) if on_gpu() else {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32}
    if on_gpu():
        meta.update(num_warps=c.num_warps, num_stages=c.num_stages)
    fp8_fused_kernel[(triton.cdiv(N, meta["BLOCK_N"]),)](
        x2, w_q, ws, y, M, N, K, x2.stride(0), w_q.stride(0), y.stride(0),
        ROUND_FIRST=INTERPRET, **meta)
    return y.reshape(*x.shape[:-1], N)


# ---------------------------------------------------------------------------- compile check

def compile_jobs(arch: int, all_configs: bool = False):
    """What ``kernels.compile_check`` compiles for this file; FP8 needs sm_89 or newer.

    With ``BLOCK_M`` below 64, Hopper's compiler uses ``mma.sync`` on fp16 operands (the
    FP8 codes converted), not FP8 ``wgmma``: the report's ``mma`` column shows which.
    """
    acts = ["*bf16", "*fp16", "*fp32"] if all_configs else ["*fp16" if arch < 80 else "*bf16"]
    jobs = []
    for act in acts:
        jobs.append(CompileJob(
            "quantize_rows_fp8", quantize_rows_fp8_kernel,
            dict(x_ptr=act, xq_ptr="*fp8e4nv", xs_ptr="*fp32", K="i32", stride_xm="i32",
                 stride_qm="i32"),
            dict(BLOCK_K=1024, ROUND_FIRST=False), 4, 3, min_cc=89, default=True))
        jobs += config_jobs(
            "fp8_gemm", fp8_gemm_kernel,
            dict(a_ptr="*fp8e4nv", as_ptr="*fp32", b_ptr="*fp8e4nv", bs_ptr="*fp32", y_ptr=act,
                 M="i32", N="i32", K="i32", stride_am="i32", stride_bn="i32", stride_ym="i32"),
            dict(FAST_ACC=True), _GEMM_CONFIGS, _GEMM_DEFAULT, all_configs, min_cc=89,
            rows=lambda c: c["BLOCK_M"],
            weight_bytes_per_step=lambda c: c["BLOCK_N"] * c["BLOCK_K"])
        jobs += config_jobs(   # no per-byte count: the loop finder would pick the prologue
            "fp8_fused", fp8_fused_kernel,
            dict(x_ptr=act, b_ptr="*fp8e4nv", bs_ptr="*fp32", y_ptr=act, M="i32", N="i32",
                 K="i32", stride_xm="i32", stride_bn="i32", stride_ym="i32"),
            dict(ROUND_FIRST=False), [_FUSED_DEFAULT], _FUSED_DEFAULT, False, min_cc=89,
            rows=lambda c: c["BLOCK_M"])
    return jobs


# ---------------------------------------------------------------------------- reference

def quantize_weight(w: torch.Tensor, fast: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(w_q (N, K) float8_e4m3fn, scale (N,) fp32): per-channel FP8 (course_lib.quant).

    ``fast=True`` does the same with torch's own round-to-nearest-even cast on the tensor's
    device (the benchmark uses it for 8B-sized stacks; a test checks both agree).
    """
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"w must be a 2-D floating-point weight (N out, K in); got "
                         f"{type(w).__name__} {tuple(getattr(w, 'shape', ()))} "
                         f"{getattr(w, 'dtype', '')}")
    if fast:
        if not bool(torch.isfinite(w).all()):
            bad = int((~torch.isfinite(w)).sum())
            raise ValueError(f"w holds {bad} NaN or inf value(s): their row's absmax scale would "
                             f"be meaningless (a NaN row got scale 1.0); fix or replace them "
                             f"(e.g. torch.nan_to_num) before quantizing")
        amax = w.float().abs().amax(dim=1)                                # (N,)
        scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
        q = (w.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX)         # (N, K)
        return q.to(FP8_DTYPE), scale
    from course_lib import quant

    qt = quant.quantize(w.float(), fmt="fp8_e4m3", granularity="per_channel")
    return qt.q.to(FP8_DTYPE), qt.scale.float().reshape(w.shape[0])  # exact: grid values


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token FP8 on the host (course_lib.quant): (xq (M, K) fp8, xs (M,) fp32)."""
    from course_lib import quant

    x2 = x.reshape(-1, x.shape[-1]).float()                             # (M, K)
    qt = quant.quantize(x2, fmt="fp8_e4m3", granularity="per_token")
    return qt.q.to(FP8_DTYPE), qt.scale.float().reshape(-1)


def fp8_w8a8_reference(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """Emulation in plain torch: quantize x per token on the host, multiply in fp32.

    The same numbers the FP8 kernel computes (up to fp32 summation order), on any device;
    it is the fallback on GPUs without FP8 maths (and on CPUs).
    """
    ws = _check_weights(w_q, w_scale)
    check_activations(x, w_q.shape[1])          # an int x would come back truncated to int
    xq, xs = quantize_activations(x)                                    # (M, K), (M,)
    y = F.linear(xq.float(), w_q.float()) * xs[:, None] * ws[None, :]   # (M, N)
    return y.to(x.dtype).reshape(*x.shape[:-1], w_q.shape[0])


# ---------------------------------------------------------------------------- benchmark

def bench_backends(act_dtype=torch.bfloat16, with_fp8: bool = False):
    """This file's entry in the GPU benchmark (``kernels.bench.GPU_KERNEL_MODULES``): only
    where FP8 maths runs (``with_fp8``: compute capability 8.9+ or the interpreter)."""
    from kernels._common import Backend

    if not with_fp8:
        return []
    return [Backend("fp8 w8a8", lambda w: quantize_weight(w, fast=True),
                    lambda x, st: fp8_w8a8_linear(x, *st), act_dtype, 8, "per_channel")]


def benchmark(shapes=((4096, 4096), (8192, 28672)), batches=(1, 16, 4096), dtype=torch.bfloat16):
    """Median time, quantization of x included, against torch BF16 F.linear (GPU, cc >= 8.9)."""
    from course_lib import bench

    require_fp8()
    if INTERPRET:
        raise RuntimeError("never time the Triton interpreter: benchmark on a GPU")
    return bench.speedup_vs_bf16("fp8", quantize_weight,
                                 lambda x, wq: fp8_w8a8_linear(x, *wq), shapes, batches, dtype)
