"""W4A16: int4 weights packed two per byte, group-wise scales, 16-bit activations (lesson 09).

What you will learn
-------------------
* Packing: two 4-bit codes share a byte (``course_lib.quant.pack_int4``): element 2i in the
  low nibble, 2i+1 in the high nibble. The kernel unpacks them in registers with ``& 0xF``
  and ``>> 4``; signed codes come back from two's complement with ``(v ^ 8) - 8``.
* Group-wise scales: one scale per ``GROUP`` consecutive weights of a row (128 by default;
  32 and 64 too). The kernel steps through K a whole number of groups at a time, so it
  loads each scale exactly once, and applies it once per group to a partial sum (or, in
  the variant a GPU may pick by autotuning, ``DEFER_SUM``, broadcasts it over its group in
  registers and sums across K only once, after the loop).
* Optional zero points (asymmetric codes 0..15): ``w = (q - zero) * scale``.
* Even/odd split: instead of interleaving the unpacked nibbles back into order, load x
  contiguously, split it into even and odd columns (``tl.split``), and multiply the low
  nibbles by x[k0 + 0, 2, 4, ...] and the high nibbles by x[k0 + 1, 3, 5, ...].

The maths: ``y[m, n] = sum_g scale[n, g] * sum_{k in group g} x[m, k] * (q[n, k] - zero[n, g])``
with q unpacked from ``packed`` (N, K/2) uint8, ``scale``/``zero`` (N, K/GROUP).

Pseudo-code of the GEMV kernel (one program = one row m of x, BLOCK_N rows of W)::

    acc[BLOCK_N] = 0
    for g in this program's groups:                       # k0 = g * GROUP (on a GPU, GPI
                                                          # groups per step: wider loads)
        p   = load packed[n0:n0+BLOCK_N, k0/2 : k0/2 + GROUP/2]   # uint8, half a byte per weight
        lo  = p & 0xF ; hi = p >> 4                       # unpack in registers
        x_e, x_o = even, odd columns of load x[m, k0 : k0 + GROUP]
        part = sum(lo * x_e + hi * x_o) - zero[:, g] * sum(x_e + x_o)
        acc += scale[:, g] * part                         # one scale per group, once
    y[m, n0:n0+BLOCK_N] (+)= acc

The GEMM kernel (batch > 8) dequantizes each unpacked tile to 16 bits in registers and
feeds it to ``tl.dot`` twice (low nibbles with even columns of x, high with odd ones).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import triton
import triton.language as tl

from kernels import INTERPRET
from kernels._common import (GEMV_MAX_M, check_activations, check_device, choose, gemv_plan,
                             pow2_at_least)

GROUP_SIZES = (32, 64, 128)


# ---------------------------------------------------------------------------- kernels

@triton.jit
def _unpack(p, HAS_ZERO: tl.constexpr):
    """uint8 bytes -> (low, high) nibbles as fp32; signed two's complement unless HAS_ZERO."""
    p = p.to(tl.int32)
    lo = p & 0xF
    hi = (p >> 4) & 0xF
    if not HAS_ZERO:                 # symmetric codes are signed: 0xF means -1
        lo = (lo ^ 8) - 8
        hi = (hi ^ 8) - 8
    return lo.to(tl.float32), hi.to(tl.float32)


@triton.jit
def w4a16_gemv_kernel(
    x_ptr,        # activations, (M, K) contiguous, fp16/bf16/fp32
    p_ptr,        # packed int4 weights, (N, K // 2) uint8, two codes per byte
    s_ptr,        # scales, (N, K // GROUP), any float dtype
    z_ptr,        # zero points, (N, K // GROUP) (ignored unless HAS_ZERO)
    y_ptr,        # output, (M, N); fp32 and zero-filled when SPLIT_K > 1
    M, N, K,      # problem size (K counts unpacked weights)
    stride_xm,    # elements between rows of x
    stride_pn,    # bytes between rows of packed
    stride_sn,    # elements between rows of scale (and of zero)
    stride_ym,    # elements between rows of y
    GROUP: tl.constexpr,     # weights per scale along K (32, 64 or 128)
    GPI: tl.constexpr,       # groups per loop step (1, 2, 4: wider loads on a GPU)
    BLOCK_N: tl.constexpr,   # rows of W (outputs) per program
    SPLIT_K: tl.constexpr,   # programs sharing one output block along K
    HAS_ZERO: tl.constexpr,  # asymmetric codes 0..15 with zero points
    DEFER_SUM: tl.constexpr,  # True: sum across K once after the loop (autotuned on a GPU)
):
    m = tl.program_id(0)              # which row of x: fastest-varying, so the programs
    pid_n = tl.program_id(1)          # sharing a block of W run together (L2 reuse)
    pid_k = tl.program_id(2)
    HALF: tl.constexpr = GROUP // 2                          # bytes per group and row
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)        # (BLOCK_N,)
    n_mask = offs_n < N
    offs_j = tl.arange(0, GPI * HALF)                        # (GPI*HALF,) byte within a step
    offs_gi = tl.arange(0, GPI)                              # (GPI,) group within a step
    n_groups = K // GROUP
    g_per_split = tl.cdiv(n_groups, SPLIT_K)
    g_begin = pid_k * g_per_split
    g_end = tl.minimum(g_begin + g_per_split, n_groups)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)            # (BLOCK_N,)
    acc2 = tl.zeros((BLOCK_N, GPI * HALF), dtype=tl.float32)  # used when DEFER_SUM
    for g0 in range(g_begin, g_end, GPI):
        col_mask = g0 + offs_j // HALF < g_end               # (GPI*HALF,) groups past the end
        p = tl.load(p_ptr + offs_n[:, None] * stride_pn + (g0 * HALF + offs_j)[None, :],
                    mask=n_mask[:, None] & col_mask[None, :], other=0)  # (BLOCK_N, GPI*HALF) uint8
        lo, hi = _unpack(p, HAS_ZERO)                        # (BLOCK_N, GPI*HALF) each
        offs_k = g0 * GROUP + tl.arange(0, 2 * GPI * HALF)   # (GPI*GROUP,) one contiguous load
        x = tl.load(x_ptr + m * stride_xm + offs_k, mask=offs_k < g_end * GROUP, other=0.0)
        x_e, x_o = tl.split(tl.reshape(x.to(tl.float32), (GPI * HALF, 2)))  # even, odd columns
        offs_g = g0 + offs_gi                                # (GPI,)
        sz_mask = n_mask[:, None] & (offs_g < g_end)[None, :]
        sz_off = offs_n[:, None] * stride_sn + offs_g[None, :]          # (BLOCK_N, GPI)
        s = tl.load(s_ptr + sz_off, mask=sz_mask, other=0.0).to(tl.float32)   # once per group
        if DEFER_SUM:   # scale (and zero) broadcast over the group in registers; sum at the end
            s_full = tl.reshape(tl.broadcast_to(s[:, :, None], (BLOCK_N, GPI, HALF)),
                                (BLOCK_N, GPI * HALF))
            if HAS_ZERO:
                z = tl.load(z_ptr + sz_off, mask=sz_mask, other=0).to(tl.float32)
                z_full = tl.reshape(tl.broadcast_to(z[:, :, None], (BLOCK_N, GPI, HALF)),
                                    (BLOCK_N, GPI * HALF))
                lo -= z_full
                hi -= z_full
            acc2 += s_full * (lo * x_e[None, :] + hi * x_o[None, :])
        else:           # sum each group now, then one multiply by its scale
            prod = lo * x_e[None, :] + hi * x_o[None, :]     # (BLOCK_N, GPI*HALF)
            part = tl.sum(tl.reshape(prod, (BLOCK_N, GPI, HALF)), axis=2)   # (BLOCK_N, GPI)
            if HAS_ZERO:
                z = tl.load(z_ptr + sz_off, mask=sz_mask, other=0).to(tl.float32)
                x_sum = tl.sum(tl.reshape(x_e + x_o, (GPI, HALF)), axis=1)  # (GPI,)
                part -= z * x_sum[None, :]
            acc += tl.sum(s * part, axis=1)                  # one scale per group
    if DEFER_SUM:
        acc = tl.sum(acc2, axis=1)
    y_ptrs = y_ptr + m * stride_ym + offs_n
    if SPLIT_K == 1:
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=n_mask)
    else:
        tl.atomic_add(y_ptrs, acc, mask=n_mask)


@triton.jit
def w4a16_gemm_kernel(
    x_ptr,        # activations, (M, K) contiguous
    p_ptr,        # packed int4 weights, (N, K // 2) uint8
    s_ptr,        # scales, (N, K // GROUP)
    z_ptr,        # zero points, (N, K // GROUP) (ignored unless HAS_ZERO)
    y_ptr,        # output, (M, N)
    M, N, K,      # problem size
    stride_xm,    # elements between rows of x
    stride_pn,    # bytes between rows of packed
    stride_sn,    # elements between rows of scale (and of zero)
    stride_ym,    # elements between rows of y
    GROUP: tl.constexpr,     # weights per scale; one loop step
    BLOCK_M: tl.constexpr,   # rows of x per program
    BLOCK_N: tl.constexpr,   # rows of W per program
    HAS_ZERO: tl.constexpr,  # asymmetric codes with zero points
    DOT_FP32: tl.constexpr,  # True: tl.dot in fp32 (interpreter: its bf16 dot is broken)
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    HALF: tl.constexpr = GROUP // 2
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)        # (BLOCK_M,)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)        # (BLOCK_N,)
    offs_j = tl.arange(0, HALF)                              # (HALF,)
    m_mask = offs_m < M
    n_mask = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)   # (BLOCK_M, BLOCK_N)
    for g in range(0, K // GROUP):
        k0 = g * GROUP
        p = tl.load(p_ptr + offs_n[:, None] * stride_pn + (k0 // 2 + offs_j)[None, :],
                    mask=n_mask[:, None], other=0)           # (BLOCK_N, HALF) uint8
        lo, hi = _unpack(p, HAS_ZERO)
        s = tl.load(s_ptr + offs_n * stride_sn + g, mask=n_mask, other=0.0).to(tl.float32)
        if HAS_ZERO:
            z = tl.load(z_ptr + offs_n * stride_sn + g, mask=n_mask, other=0).to(tl.float32)
            lo -= z[:, None]
            hi -= z[:, None]
        w_lo = lo * s[:, None]                               # (BLOCK_N, HALF) dequantized
        w_hi = hi * s[:, None]
        offs_k = k0 + tl.arange(0, GROUP)                    # (GROUP,)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=m_mask[:, None], other=0.0)         # (BLOCK_M, GROUP), contiguous
        x_e, x_o = tl.split(tl.reshape(x, (BLOCK_M, HALF, 2)))        # (BLOCK_M, HALF) each
        if DOT_FP32:
            acc += tl.dot(x_e.to(tl.float32), tl.trans(w_lo), input_precision="ieee")
            acc += tl.dot(x_o.to(tl.float32), tl.trans(w_hi), input_precision="ieee")
        else:
            acc += tl.dot(x_e, tl.trans(w_lo.to(x_e.dtype)))
            acc += tl.dot(x_o, tl.trans(w_hi.to(x_o.dtype)))
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


_GEMV_CONFIGS = [triton.Config({"GPI": gpi, "DEFER_SUM": d}, num_warps=w, num_stages=s)
                 for d in (False, True)
                 for gpi, w, s in [(1, 4, 4), (2, 4, 3), (2, 4, 4), (4, 4, 3), (4, 8, 3), (8, 8, 2)]]
_GEMM_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
                 for bm, bn, w, s in [(16, 16, 2, 4), (16, 32, 4, 4), (16, 64, 4, 4),
                                      (32, 64, 4, 4), (64, 64, 4, 4),
                                      (64, 128, 4, 4), (128, 128, 8, 3), (128, 256, 8, 3)]]
_GEMV_DEFAULT = triton.Config({"GPI": 2, "DEFER_SUM": False}, num_warps=4, num_stages=3)
_GEMM_DEFAULT = triton.Config({"BLOCK_M": 16, "BLOCK_N": 64}, num_warps=4, num_stages=4)
# Split-K programs add into y: autotuning must leave it zero for the real call
# (reset before each trial, restored after: safe across Triton versions).
if INTERPRET:
    _gemv, _gemm = w4a16_gemv_kernel, w4a16_gemm_kernel
else:
    _gemv = triton.autotune(_GEMV_CONFIGS, key=["M", "N", "K", "GROUP", "SPLIT_K"],
                            reset_to_zero=["y_ptr"], restore_value=["y_ptr"])(w4a16_gemv_kernel)
    _gemm = triton.autotune(_GEMM_CONFIGS, key=["M", "N", "K", "GROUP"])(w4a16_gemm_kernel)


# ---------------------------------------------------------------------------- weights

@dataclass
class W4A16Weight:
    """A linear layer's weight in W4A16 form (lesson 09).

    packed (N, K//2) uint8; scale (N, K//group_size) fp32; zero (N, K//group_size) int32 or
    None (symmetric); group_size; N, K.
    """
    packed: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None
    group_size: int

    @property
    def N(self) -> int:
        return self.packed.shape[0]

    @property
    def K(self) -> int:
        return 2 * self.packed.shape[1]

    def nbytes(self) -> int:
        """Bytes a kernel reads for this weight: packed codes, scales and zero points."""
        size = lambda t: 0 if t is None else t.numel() * t.element_size()  # noqa: E731
        return size(self.packed) + size(self.scale) + size(self.zero)


def quantize_weight(w: torch.Tensor, group_size: int = 128, symmetric: bool = True,
                    scale_dtype: torch.dtype = torch.float16) -> W4A16Weight:
    """Group-wise int4 round-to-nearest, packed two per byte (course_lib.quant).

    Scales are stored in ``scale_dtype``, fp16 by default as GPTQ/AWQ checkpoints do: 4 +
    16/128 = 4.125 bits per weight at group 128. The codes come from the fp32 scales, and
    the kernel and ``dequantize_weight`` both use the stored ones.
    """
    from course_lib import quant

    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"w must be a 2-D floating-point weight (N out, K in); got "
                         f"{type(w).__name__} {tuple(getattr(w, 'shape', ()))} "
                         f"{getattr(w, 'dtype', '')}")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size {group_size} is not supported; use one of {GROUP_SIZES}")
    qt = quant.quantize(w.float(), fmt="int4", granularity="per_group", group_size=group_size,
                        symmetric=symmetric)
    packed = quant.pack_int4(qt.q)                                      # (N, K/2) uint8
    zero = None if qt.zero is None else qt.zero.to(torch.int32)        # (N, K/G)
    return W4A16Weight(packed, qt.scale.to(scale_dtype), zero, group_size)


def _check_weight(wt: W4A16Weight) -> None:
    if not isinstance(wt, W4A16Weight):
        raise TypeError("pass a W4A16Weight (make one with kernels.w4a16.quantize_weight(w))")
    if wt.packed.dtype != torch.uint8 or wt.packed.dim() != 2:
        raise TypeError(f"packed must be a 2-D uint8 tensor (N, K/2), got {wt.packed.dtype} "
                        f"with shape {tuple(wt.packed.shape)}")
    if wt.group_size not in GROUP_SIZES:
        raise ValueError(f"group_size {wt.group_size} is not supported; use one of {GROUP_SIZES}")
    if wt.K % wt.group_size:
        raise ValueError(f"K = {wt.K} is not a multiple of group_size {wt.group_size}")
    want = (wt.N, wt.K // wt.group_size)
    if tuple(wt.scale.shape) != want:
        raise ValueError(f"scale has shape {tuple(wt.scale.shape)}; expected {want} "
                         f"(one per row and group of {wt.group_size})")
    if wt.zero is not None and tuple(wt.zero.shape) != want:
        raise ValueError(f"zero has shape {tuple(wt.zero.shape)}; expected {want}")


# ---------------------------------------------------------------------------- wrapper

def w4a16_linear(x: torch.Tensor, wt: W4A16Weight, *, block_n: int | None = None,
                 split_k: int | None = None, force_gemm: bool = False,
                 gpi: int | None = None, defer_sum: bool = False) -> torch.Tensor:
    """y = x @ dequantize(wt).T with the Triton kernels (lesson 09).

    x: (..., K) fp16/bf16/fp32. Returns (..., N) in x's dtype. ``block_n``/``split_k``
    override the GEMV launch plan; ``gpi`` (groups per loop step) and ``defer_sum`` (sum
    across K after the loop) choose the GEMV variant in the interpreter, where a GPU
    autotunes them; ``force_gemm`` takes the tl.dot kernel at any batch.
    """
    _check_weight(wt)
    N, K, G = wt.N, wt.K, wt.group_size
    x2 = check_activations(x, K)                                       # (M, K)
    packed, scale = wt.packed.contiguous(), wt.scale.contiguous()
    zero = wt.zero.contiguous() if wt.zero is not None else scale      # placeholder pointer
    check_device(x2, packed, scale, zero)
    M = x2.shape[0]
    out_shape = (*x.shape[:-1], N)
    if M == 0:
        return torch.empty(out_shape, dtype=x.dtype, device=x.device)
    has_zero = wt.zero is not None
    if M <= GEMV_MAX_M and not force_gemm:
        bn, sk = gemv_plan(M, N, K, k_unit=G)
        bn, sk = block_n or bn, split_k or sk
        y = (torch.zeros((M, N), dtype=torch.float32, device=x.device) if sk > 1
             else torch.empty((M, N), dtype=x.dtype, device=x.device))        # (M, N)
        grid = (M, triton.cdiv(N, bn), sk)
        kernel, meta = choose(_gemv, w4a16_gemv_kernel, _GEMV_DEFAULT,
                              {"GPI": gpi or 2, "DEFER_SUM": defer_sum})
        kernel[grid](x2, packed, scale, zero, y, M, N, K, x2.stride(0), packed.stride(0),
                     scale.stride(0), y.stride(0), GROUP=G, BLOCK_N=bn, SPLIT_K=sk,
                     HAS_ZERO=has_zero, **meta)
        return y.to(x.dtype).reshape(out_shape)
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)                   # (M, N)
    interp = {"BLOCK_M": pow2_at_least(M, 16, 32), "BLOCK_N": block_n or 32}
    kernel, meta = choose(_gemm, w4a16_gemm_kernel, _GEMM_DEFAULT, interp)
    grid = lambda m: (triton.cdiv(M, m["BLOCK_M"]), triton.cdiv(N, m["BLOCK_N"]))  # noqa: E731
    kernel[grid](x2, packed, scale, zero, y, M, N, K, x2.stride(0), packed.stride(0),
                 scale.stride(0), y.stride(0), GROUP=G, HAS_ZERO=has_zero,
                 DOT_FP32=INTERPRET or x.dtype == torch.float32, **meta)
    return y.reshape(out_shape)


# ---------------------------------------------------------------------------- reference

def dequantize_weight(wt: W4A16Weight) -> torch.Tensor:
    """(N, K) fp32: unpack with course_lib.quant.unpack_int4, subtract zeros, apply scales."""
    from course_lib import quant

    _check_weight(wt)
    q = quant.unpack_int4(wt.packed, signed=wt.zero is None).float()   # (N, K)
    q = q.reshape(wt.N, -1, wt.group_size)                             # (N, K/G, G)
    if wt.zero is not None:
        q = q - wt.zero.float()[..., None]
    return (q * wt.scale.float()[..., None]).reshape(wt.N, wt.K)       # (N, K)


def w4a16_reference(x: torch.Tensor, wt: W4A16Weight) -> torch.Tensor:
    """Plain torch: dequantize the whole weight, then F.linear in fp32; result in x's dtype."""
    _check_weight(wt)
    check_activations(x, wt.K)                  # an int x would come back truncated to int
    return F.linear(x.float(), dequantize_weight(wt)).to(x.dtype)     # (..., N)


# ---------------------------------------------------------------------------- benchmark

def benchmark(shapes=((4096, 4096), (8192, 28672)), batches=(1, 16), group_size=128,
              dtype=torch.bfloat16):
    """Median time of the kernel against torch BF16 F.linear (GPU only; lesson 10).

    ``shapes`` are (K in, N out). ``python -m kernels.bench`` is the full benchmark.
    """
    from course_lib import bench
    from course_lib.device import require_gpu

    require_gpu("kernels.w4a16.benchmark")
    return bench.speedup_vs_bf16("w4a16", lambda w: quantize_weight(w, group_size),
                                 w4a16_linear, shapes, batches, dtype)
