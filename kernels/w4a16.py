"""W4A16: int4 weights packed two per byte, group-wise scales, 16-bit activations (lesson 09).

What you will learn
-------------------
* Packing: two 4-bit codes share a byte (``course_lib.quant.pack_int4``): element 2i in the
  low nibble, 2i+1 in the high nibble. Four bytes make a 32-bit word holding 8 codes in
  order, code j in bits 4j..4j+3, each nibble a two's-complement code (-1 -> 0xF). That is
  the nibble *order* of compressed-tensors' ``pack-quantized`` checkpoints, not their codes:
  they store offset codes u = q + 8 (``course_lib.export.pack_int32``), which is also what
  the dot kernel's layout holds (``kernels.dequant16.prepack``). The kernels load whole
  words and unpack them in registers.
* Cheap dequantization, the bit trick (Marlin does it with one LOP3 instruction): a float32
  whose bit pattern is ``0x4B000000 | u`` is exactly 2**23 + u for a small integer u, so
  ``((word >> 4j) & 0xF) | 0x4B000000`` reinterpreted as float, minus 2**23, is the code as
  a float with no int-to-float conversion (``unpack_int4_words`` does exactly this). Signed
  codes (-8..7, two's complement) become 0..15 with one XOR of the whole word with
  0x88888888. The GEMV kernel saves the shift too: it leaves code j where it is, at bit
  4i (i = j % 5; one shift of the word by 20 after code 4), so its float is 2**23 + u *
  16**i, and the 16**i is divided out of x once per call, exactly (a power of two). Per
  code: one AND-OR (a LOP3), one subtraction, one multiply-add. The zero point (8 for
  signed codes) is applied once per word: sum x * (u - z) = sum x * u - z * sum x.
* Group-wise scales: one scale per ``GROUP`` consecutive weights of a row (128 by default;
  32 and 64 too). The kernel steps through K a whole number of groups at a time, sums each
  group's products first and multiplies by its scale once.
* Optional zero points (asymmetric codes 0..15): ``w = (q - zero) * scale``.
* One program covers every token of a small batch (up to ``GEMV_MAX_M`` rows): each weight
  tile is loaded and unpacked once, then used for all rows; x is loaded in the same
  (groups, weights-in-group) layout as the unpacked tile.

The maths: ``y[m, n] = sum_g scale[n, g] * sum_{k in group g} x[m, k] * (q[n, k] - zero[n, g])``
with q unpacked from ``packed`` (N, K/2) uint8 (seen by the kernels as (N, K/8) int32 words),
``scale``/``zero`` (N, K/GROUP).

Pseudo-code of the GEMV kernel (one program = all M rows of x, BLOCK_N rows of W)::

    xp[m, j, w] = x[m, 8w + j] / 16**(j % 5); xp[m, 8, w] = sum_j x[m, 8w + j]   # once per call
    acc[M, BLOCK_N, W] = 0                         # one partial sum per (token, output, word)
    for each step of BLOCK_K weights (W = BLOCK_K / 8 words, a whole number of groups):
        words = load packed[n0:n0+BLOCK_N, step] as int32   # 8 codes per word, evict-first
        words ^= 0x88888888 (signed codes)         # +8 to every nibble: codes now 0..15
        s, z  = scale and zero point of each word's group   # z = 8 for signed codes
        for j in 0..7:                             # unrolled; after j = 4, words >>= 20
            v = float_bits((words & (0xF << 4i)) | 0x4B000000) - 2**23   # i = j % 5: u * 16**i
            part += xp[:, j, step words] * v       # = x * u; no data moved between threads
        acc += (part - z * xp[:, 8, step words]) * s        # zero point and scale once per word
    y[:, n0:n0+BLOCK_N] (+)= sum of acc over words # one cross-thread sum, after the loop

The GEMM kernel (``kernel="gemm"``) reads the packed bytes, turns low and high nibbles
into floats with the same bit trick, multiplies by the scale, and feeds them to ``tl.dot``
(in its accumulator form) with the even and odd columns of x (x in the weight tile's layout).

The GEMV and that GEMM are the first version, kept as the teaching steps (lesson 09): the
GEMV relayouts x with 8-10 torch ops every call and has no software pipelining, the GEMM
dequantizes in fp32. The default at every batch is ``w4a16_dot_kernel`` (lesson 10):

* **one launch per call**: x is read as it is, y written once in x's dtype; the weight is
  permuted once, when it is made (``dequant16.prepack``: in each unit of U = max(G, 64)
  codes, 16-bit element e holds code e of each of the unit's four quarters, so a unit's
  elements give four tiles that meet four plain loads of x, x[:, jU/4 : (j+1)U/4]);
* **tensor cores and a pipelined weight stream at batch 1..16**: ``tl.dot`` on a 16-row
  tile (rows past M masked); 3 stages: two loop trips of cp.async loads in flight;
* **16-bit dequantization** (``dequant16.dequant_quad``): from int16 loads, one LOP3 and
  one packed FMA per two weights (and a shift per four), inline PTX on sm_80+; the group
  scale multiplies the dot's result, once per group and output, not every weight;
* **split-K** when the output tiles alone leave SMs idle (``dot_plan``): the slices meet in
  a self-resetting fp32 workspace (``_common.store_or_reduce``), CUDA-graph safe; and a
  narrower tile where even the split leaves SMs without a program (``_common.fill_plan``).

Pseudo-code of the dot kernel (one program = BLOCK_M tokens x BLOCK_N outputs x one K slice)::

    acc[BLOCK_M, BLOCK_N] = 0
    for each unit u of this slice (U = max(G, 64) codes, quarters of Q = U/4):
        q0, q1, q2, q3 = dequant_quad(load int16[n-block, u])   # (BLOCK_N, Q) each: q, exact
        part = sum over j of dot(x[m-block, uU + jQ : uU + (j+1)Q], qj.T)   # one group's
        acc += part * scale[n-block, g]           # (z - 8) * sum(x) off first if asymmetric
        (G = 32: a unit is two groups; quarters 0-1 make one part, 2-3 the other)
    y[m-block, n-block] = acc  (or: add into the workspace; the last slice writes y)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from kernels._triton import tl, triton  # Triton, or its stand-in where it is not installed

from kernels import INTERPRET, dequant16
from kernels._common import (GEMV_MAX_M, CompileJob, check_activations, check_device,
                             choose, config_jobs, fill_plan, gemv_plan, num_sms, on_gpu,
                             pow2_at_least, store_or_reduce, workspace)

GROUP_SIZES = (32, 64, 128)
# Globals a @triton.jit function reads must be tl.constexpr; ``.value`` is the plain number.
MAGIC = tl.constexpr(0x4B000000)     # the bits of float32 2**23: its low mantissa bits are free
TWO_23 = tl.constexpr(8388608.0)     # 2**23
FLIP = tl.constexpr(-0x77777778)     # 0x88888888 as a signed 32-bit number: +8 to every nibble


# ---------------------------------------------------------------------------- kernels

@triton.jit
def w4a16_gemv_kernel(
    x_ptr,        # activations in the weight's layout, (M, 9, K // 8) fp32 (gemv_activations)
    p_ptr,        # packed int4 weights seen as int32 words, (N, K // 8), 8 codes per word
    s_ptr,        # scales, (N, K // GROUP), any float dtype
    z_ptr,        # zero points, (N, K // GROUP) (ignored unless HAS_ZERO)
    y_ptr,        # output, (M, N); fp32 and zero-filled when SPLIT_K > 1
    M, N, K,      # problem size (K counts unpacked weights; M <= BLOCK_M)
    stride_xm,    # elements between tokens of x (9 * K // 8)
    stride_pn,    # int32 words between rows of packed
    stride_sn,    # elements between rows of scale (and of zero)
    stride_ym,    # elements between rows of y
    magic,        # 0x4B000000 (MAGIC), passed at run time: see the note in the wrapper
    GROUP: tl.constexpr,     # weights per scale along K (32, 64 or 128)
    BLOCK_K: tl.constexpr,   # weights per loop step: a whole number of groups (>= GROUP)
    BLOCK_M: tl.constexpr,   # rows of x per program: a power of 2 >= M (1, 2, 4 or 8)
    BLOCK_N: tl.constexpr,   # rows of W (outputs) per program
    SPLIT_K: tl.constexpr,   # programs sharing one output block along K
    HAS_ZERO: tl.constexpr,  # asymmetric codes 0..15 with zero points
):
    pid_n = tl.program_id(0)          # which block of outputs
    pid_k = tl.program_id(1)          # which slice of K
    WPG: tl.constexpr = GROUP // 8                           # int32 words per group and row
    W: tl.constexpr = BLOCK_K // 8                           # int32 words per row and step
    offs_m = tl.arange(0, BLOCK_M)                           # (BLOCK_M,) every token
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)        # (BLOCK_N,)
    offs_w = tl.arange(0, W)                                 # (W,) word within a step
    n_groups = K // GROUP
    g_per_split = tl.cdiv(n_groups, SPLIT_K)
    g_begin = pid_k * g_per_split
    g_end = tl.minimum(g_begin + g_per_split, n_groups)
    # Every tile is 3-D, (token, output, word), so that the weight tile and x broadcast
    # against each other without moving data between threads. One partial sum per (token,
    # output, word): products are added element-wise in the loop; the sum across words (a
    # cross-thread reduction) is done once, after the loop.
    t3 = offs_m[:, None, None]                               # (BLOCK_M, 1, 1) token
    n3 = offs_n[None, :, None]                               # (1, BLOCK_N, 1) output
    w3 = offs_w[None, None, :]                               # (1, 1, W) word in the step
    acc3 = tl.zeros((BLOCK_M, BLOCK_N, W), dtype=tl.float32)   # (BLOCK_M, BLOCK_N, W)
    for g0 in range(g_begin, g_end, BLOCK_K // GROUP):      # a whole number of groups a step
        kw_mask = (g0 + w3 // WPG) < g_end                   # (1, 1, W) words past the end
        w_mask = (n3 < N) & kw_mask                          # (1, BLOCK_N, W)
        # the weight tile: read once for the whole batch; evict_first because nothing else
        # reads it, so it should not push x out of the L2 cache
        words = tl.load(p_ptr + n3 * stride_pn + g0 * WPG + w3, mask=w_mask, other=0,
                        eviction_policy="evict_first")       # (1, BLOCK_N, W) int32
        if not HAS_ZERO:
            words = words ^ FLIP                             # signed codes -> 0..15 (+8)
        # scale and zero point of each word's group (repeated addresses: cached)
        sz_ptrs = n3 * stride_sn + g0 + w3 // WPG            # (1, BLOCK_N, W)
        s = tl.load(s_ptr + sz_ptrs, mask=w_mask, other=0.0).to(tl.float32)
        if HAS_ZERO:
            zero = tl.load(z_ptr + sz_ptrs, mask=w_mask, other=0).to(tl.float32)
        else:
            zero = tl.full((1, BLOCK_N, W), 8.0, tl.float32)  # the XOR shifted codes by 8
        x_mask = (t3 < M) & kw_mask                          # (BLOCK_M, 1, W)
        x_row = x_ptr + t3 * stride_xm + g0 * WPG + w3       # plane 0 of this step's words
        for j in tl.static_range(8):                         # code j of every word
            if j == 5:
                words = words >> 20                          # codes 5..7 down to bits 0..11
            # the code stays in place: bits 0x4B000000 | (u << 4i) are the float 2**23 + u * 16**i
            bits = (words & (0xF << (4 * (j % 5)))) | magic  # i = j % 5 (at most bits 16..19)
            v = bits.to(tl.float32, bitcast=True) - TWO_23   # (1, BLOCK_N, W) u * 16**i, exact
            # x in the weight tile's layout, plane j: x[:, 8w + j] / 16**i (exact), so that
            # x_j * v = x * u; contiguous along w
            x_j = tl.load(x_row + j * (K // 8), mask=x_mask, other=0.0)   # (BLOCK_M, 1, W)
            if j == 0:
                part = x_j * v                               # (BLOCK_M, BLOCK_N, W)
            else:
                part += x_j * v                              # sum over the word of x * u
        x_sum = tl.load(x_row + 8 * (K // 8), mask=x_mask, other=0.0)   # plane 8: sum of x
        # sum of x * (u - zero) = sum of x * u - zero * sum of x; the scale once per word
        acc3 += (part - zero * x_sum) * s
    acc = tl.sum(acc3, axis=2)                               # (BLOCK_M, BLOCK_N)
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    y_mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=y_mask)
    else:
        tl.atomic_add(y_ptrs, acc, mask=y_mask)


@triton.jit
def _nibbles_to_float(p, HAS_ZERO: tl.constexpr):
    """uint8 bytes (R, C) -> (low, high) nibbles as exact fp32 codes, by the bit trick."""
    p = p.to(tl.int32)
    if not HAS_ZERO:                 # symmetric codes are signed: 0xF means -1; XOR adds 8
        p = p ^ 0x88
    lo = ((p & 0xF) | MAGIC).to(tl.float32, bitcast=True)          # 2**23 + u
    hi = (((p >> 4) & 0xF) | MAGIC).to(tl.float32, bitcast=True)
    return lo, hi


@triton.jit
def w4a16_gemm_kernel(
    x_ptr,        # activations, (M, K) contiguous
    p_ptr,        # packed int4 weights, (N, K // 2) uint8, two codes per byte
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
                    mask=n_mask[:, None], other=0,
                    eviction_policy="evict_first")           # (BLOCK_N, HALF) uint8
        lo, hi = _nibbles_to_float(p, HAS_ZERO)              # (BLOCK_N, HALF) each, 2**23 + u
        s = tl.load(s_ptr + offs_n * stride_sn + g, mask=n_mask, other=0.0).to(tl.float32)
        if HAS_ZERO:
            zero = tl.load(z_ptr + offs_n * stride_sn + g, mask=n_mask, other=0).to(tl.float32)
        else:
            zero = tl.full((BLOCK_N,), 8.0, tl.float32)     # the XOR shifted codes by 8
        bias = (zero + TWO_23)[:, None]                      # (BLOCK_N, 1)
        w_lo = (lo - bias) * s[:, None]                      # (BLOCK_N, HALF) dequantized
        w_hi = (hi - bias) * s[:, None]
        # x in the weight tile's layout: even columns meet low nibbles, odd ones high
        offs_k = k0 + tl.arange(0, GROUP)                    # (GROUP,)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=m_mask[:, None], other=0.0)         # (BLOCK_M, GROUP), contiguous
        x_e, x_o = tl.split(tl.reshape(x, (BLOCK_M, HALF, 2)))        # (BLOCK_M, HALF) each
        # the accumulator form: the tensor cores add into acc directly
        if DOT_FP32:
            acc = tl.dot(x_e.to(tl.float32), tl.trans(w_lo), acc, input_precision="ieee")
            acc = tl.dot(x_o.to(tl.float32), tl.trans(w_hi), acc, input_precision="ieee")
        else:
            acc = tl.dot(x_e, tl.trans(w_lo.to(x_e.dtype)), acc)
            acc = tl.dot(x_o, tl.trans(w_hi.to(x_o.dtype)), acc)
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _quarter_dot(x_ptrs, x_mask, q, j: tl.constexpr, Q: tl.constexpr, part,
                 FIRST: tl.constexpr, W_DTYPE: tl.constexpr, DOT_FP32: tl.constexpr):
    """part (+)= x[:, quarter j] @ q.T: one tensor-core product of a unit's quarter j.

    x_ptrs (BLOCK_M, Q) point at the unit's first quarter of x; q (BLOCK_N, Q) holds the
    quarter's codes - 8 (``dequant16.dequant_quad``). FIRST starts a fresh product.
    Returns (part, the quarter's x) so that a zero point can sum x.
    """
    xj = tl.load(x_ptrs + j * Q, mask=x_mask, other=0.0)        # (BLOCK_M, Q), contiguous
    if DOT_FP32:
        a, w = xj.to(tl.float32), tl.trans(q.to(tl.float32))
        if FIRST:
            part = tl.dot(a, w, input_precision="ieee")      # fresh product: a new group
        else:
            part = tl.dot(a, w, part, input_precision="ieee")
    else:
        if FIRST:
            part = tl.dot(xj.to(W_DTYPE), tl.trans(q))       # fresh product: a new group
        else:
            part = tl.dot(xj.to(W_DTYPE), tl.trans(q), part)
    return part, xj


@triton.jit
def _group_epilogue(acc, part, xa, xb, s_ptr, z_ptr, offs_n, stride_sn, g, live_n,
                    HAS_ZERO: tl.constexpr):
    """acc += part * scale of group g, once per group and output (zero point first).

    xa, xb: the group's x (two quarters, or four summed in pairs by the caller), for
    sum x * (u - z) = sum x * (u - 8) - (z - 8) * sum x; unused (and compiled away)
    without zero points. The scales are loaded as a
    (1, BLOCK_N) row, the shape they multiply: Triton 3.6 then converts each fp16 scale to
    fp32 once, not in every thread that holds its column (2 HADD2 a trip instead of 16 on
    sm_90, kernels.compile_check; the same row load for the zero points costs Triton 3.9
    more instructions, so they stay a (BLOCK_N,) vector).
    """
    s_ptrs = s_ptr + offs_n[None, :] * stride_sn + g                     # (1, BLOCK_N)
    s = tl.load(s_ptrs, mask=live_n[None, :], other=0.0).to(tl.float32)
    if HAS_ZERO:
        z = tl.load(z_ptr + offs_n * stride_sn + g, mask=live_n, other=8)   # (BLOCK_N,)
        # 0..15 to float without an int-to-float conversion: the 2**23 bit trick
        z = (z | MAGIC).to(tl.float32, bitcast=True) - (TWO_23 + 8.0)
        x_sum = tl.sum(xa, axis=1) + tl.sum(xb, axis=1)                  # (BLOCK_M,)
        part -= x_sum[:, None] * z[None, :]
    return acc + part * s                            # the group scale, once per group


@triton.jit
def w4a16_dot_kernel(
    x_ptr,        # activations, (M, K) contiguous, in their own dtype (no relayout)
    p_ptr,        # int4 codes in the kernel layout (dequant16.prepack) seen as int16, (N, K // 4)
    s_ptr,        # scales, (N, K // GROUP), any float dtype
    z_ptr,        # zero points, (N, K // GROUP) int32 (ignored unless HAS_ZERO)
    y_ptr,        # output, (M, N), x's dtype: written once, by one program per tile
    ws_ptr,       # split-K workspace, (M, N) fp32, all zero between calls (SPLIT_K > 1)
    cnt_ptr,      # split-K arrival counters, one int32 per output tile, zero between calls
    M, N, K,      # problem size (K a multiple of the unit, max(GROUP, 64))
    stride_xm,    # elements between rows of x
    stride_pn,    # int16 elements between rows of packed
    stride_sn,    # elements between rows of scale (and of zero)
    stride_ym,    # elements between rows of y (and of the workspace)
    GROUP: tl.constexpr,     # weights per scale along K (32, 64 or 128)
    UNITS_PER_STEP: tl.constexpr,   # layout units one loop trip reads (bytes per stage)
    BLOCK_M: tl.constexpr,   # rows of x per program (16: the smallest tensor-core tile)
    BLOCK_N: tl.constexpr,   # rows of W per program
    SPLIT_K: tl.constexpr,   # programs sharing one output tile along K
    HAS_ZERO: tl.constexpr,  # asymmetric codes 0..15 with zero points
    W_DTYPE: tl.constexpr,   # tl.float16 or tl.bfloat16: the dequantized weights' dtype
    USE_ASM: tl.constexpr,   # dequantize with inline PTX (sm_80+) or the pure-Triton path
    DOT_FP32: tl.constexpr,  # tl.dot in fp32 (interpreter: its bf16 dot is broken; fp32 x)
):
    pid_n = tl.program_id(0)          # which block of outputs
    pid_m = tl.program_id(1)          # which block of tokens
    pid_k = tl.program_id(2)          # which slice of K
    UNIT: tl.constexpr = GROUP if GROUP >= 64 else 64       # codes per unit (one group or two)
    Q: tl.constexpr = UNIT // 4                              # codes per quarter = int16 per unit
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)        # (BLOCK_M,)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)        # (BLOCK_N,)
    offs_e = tl.arange(0, Q)                                 # (Q,) element in a unit
    # element e of a unit holds code e of each of its four quarters: dequant16.prepack
    m_mask = offs_m < M
    n_mask = offs_n < N
    n_units = K // UNIT
    u_per_split = tl.cdiv(tl.cdiv(n_units, SPLIT_K), UNITS_PER_STEP) * UNITS_PER_STEP
    u_begin = pid_k * u_per_split
    u_end = tl.minimum(u_begin + u_per_split, n_units)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)   # (BLOCK_M, BLOCK_N)
    for u0 in range(u_begin, u_end, UNITS_PER_STEP):
        for i in tl.static_range(UNITS_PER_STEP):
            u = u0 + i
            if UNITS_PER_STEP == 1:                          # the loop bound keeps u < u_end
                live = offs_e < Q                            # (Q,) all true: folded away
                live_n = n_mask
            else:                                            # the last step may be short
                live = (u + offs_e * 0) < u_end              # (Q,)
                live_n = n_mask & ((u + offs_n * 0) < u_end)     # (BLOCK_N,)
            p = tl.load(p_ptr + offs_n[:, None] * stride_pn + u * Q + offs_e[None, :],
                        mask=n_mask[:, None] & live[None, :], other=0,
                        eviction_policy="evict_first")       # (BLOCK_N, Q) int16
            q0, q1, q2, q3 = dequant16.dequant_quad(p, W_DTYPE, USE_ASM)   # (BLOCK_N, Q) each
            x_ptrs = x_ptr + offs_m[:, None] * stride_xm + u * UNIT + offs_e[None, :]
            x_mask = m_mask[:, None] & live[None, :]         # (BLOCK_M, Q)
            if GROUP >= 64:                                  # one group: four products
                part, x0 = _quarter_dot(x_ptrs, x_mask, q0, 0, Q, acc, True, W_DTYPE, DOT_FP32)
                part, x1 = _quarter_dot(x_ptrs, x_mask, q1, 1, Q, part, False, W_DTYPE, DOT_FP32)
                part, x2 = _quarter_dot(x_ptrs, x_mask, q2, 2, Q, part, False, W_DTYPE, DOT_FP32)
                part, x3 = _quarter_dot(x_ptrs, x_mask, q3, 3, Q, part, False, W_DTYPE, DOT_FP32)
                acc = _group_epilogue(acc, part, x0.to(tl.float32) + x1.to(tl.float32),
                                      x2.to(tl.float32) + x3.to(tl.float32), s_ptr, z_ptr,
                                      offs_n, stride_sn, u, live_n, HAS_ZERO)
            else:                                            # two groups of 32: two each
                pa, x0 = _quarter_dot(x_ptrs, x_mask, q0, 0, Q, acc, True, W_DTYPE, DOT_FP32)
                pa, x1 = _quarter_dot(x_ptrs, x_mask, q1, 1, Q, pa, False, W_DTYPE, DOT_FP32)
                pb, x2 = _quarter_dot(x_ptrs, x_mask, q2, 2, Q, acc, True, W_DTYPE, DOT_FP32)
                pb, x3 = _quarter_dot(x_ptrs, x_mask, q3, 3, Q, pb, False, W_DTYPE, DOT_FP32)
                acc = _group_epilogue(acc, pa, x0.to(tl.float32), x1.to(tl.float32), s_ptr,
                                      z_ptr, offs_n, stride_sn, 2 * u, live_n, HAS_ZERO)
                acc = _group_epilogue(acc, pb, x2.to(tl.float32), x3.to(tl.float32), s_ptr,
                                      z_ptr, offs_n, stride_sn, 2 * u + 1, live_n, HAS_ZERO)
    store_or_reduce(acc, y_ptr, ws_ptr, cnt_ptr, offs_m, offs_n, M, N, stride_ym, SPLIT_K)


# BLOCK_K: weights per GEMV step (2 or more groups of 64 or 32 per step, 1-2 of 128).
_GEMV_CONFIGS = [triton.Config({"BLOCK_K": bk}, num_warps=w, num_stages=s)
                 for bk, w, s in [(128, 4, 4), (128, 4, 3), (256, 4, 3), (256, 8, 3),
                                  (512, 4, 3), (512, 8, 2)]]
_GEMM_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
                 for bm, bn, w, s in [(16, 16, 2, 4), (16, 32, 4, 4), (16, 64, 4, 4),
                                      (32, 64, 4, 4), (64, 64, 4, 4),
                                      (64, 128, 4, 4), (128, 128, 8, 3), (128, 256, 8, 3)]]
_GEMV_DEFAULT = triton.Config({"BLOCK_K": 256}, num_warps=4, num_stages=3)
# the tensor-core kernel at decode sizes (the default plan on a GPU is dot_plan's)
# (BLOCK_N 256, one unit a step, 4 warps, 3 stages: two trips of weights loading ahead; the
# fewest SASS instructions per weight byte of those compile_check tried on sm_90, 4.4 bf16;
# 4 stages gave the same count, 512 x 8 warps 4.4 with twice the shared memory)
_DOT_CONFIGS = [triton.Config({"BLOCK_M": 16, "BLOCK_N": bn, "UNITS_PER_STEP": ups},
                              num_warps=w, num_stages=st)
                for bn, ups, w, st in [(256, 1, 4, 3), (128, 1, 4, 4), (128, 1, 2, 4),
                                       (64, 2, 4, 4), (32, 2, 4, 4)]]
_DOT_DEFAULT = _DOT_CONFIGS[0]
# the decode tiles dot_plan chooses from, widest first (kernels._common.fill_plan): a layer
# with few outputs takes a narrower tile so that every SM gets a program (4096 x 4096 on 132
# SMs: 16 tiles of 256 x 8 K slices = 128 programs; tiles of 128: 256). Narrower costs more
# SASS per weight byte on sm_90 (compile_check's launch plans record it): 4.4 at 256, 4.9 at
# 128 (4 warps), 4.9 at 64 with 2 warps (6.5 with 4)
_DOT_DECODE_TILES = [_DOT_DEFAULT,
                     triton.Config({"BLOCK_M": 16, "BLOCK_N": 128, "UNITS_PER_STEP": 1},
                                   num_warps=4, num_stages=3),
                     triton.Config({"BLOCK_M": 16, "BLOCK_N": 64, "UNITS_PER_STEP": 1},
                                   num_warps=2, num_stages=3)]
# fp32 activations at decode: BLOCK_N 256 needs 112 KB of shared memory (sm_86, compiled),
# past the 99 KB of sm_86/89/120; 128 rows halve the weight and conversion buffers
_DOT_FP32_DECODE = triton.Config({"BLOCK_M": 16, "BLOCK_N": 128, "UNITS_PER_STEP": 1},
                                 num_warps=4, num_stages=3)


def _dot_step_bytes(c) -> int:
    """Weight bytes one trip of w4a16_dot_kernel's loop reads (all its units)."""
    return c["BLOCK_N"] * dequant16.layout_unit(c["GROUP"]) // 2 * c["UNITS_PER_STEP"]
_GEMM_DEFAULT = triton.Config({"BLOCK_M": 16, "BLOCK_N": 64}, num_warps=4, num_stages=4)
# Split-K programs add into y: autotuning must leave it zero for the real call
# (reset before each trial, restored after: safe across Triton versions).
if INTERPRET:
    _gemv, _gemm = w4a16_gemv_kernel, w4a16_gemm_kernel
else:
    _gemv = triton.autotune(_GEMV_CONFIGS, key=["M", "N", "K", "GROUP", "BLOCK_M", "BLOCK_N",
                                                "SPLIT_K"],
                            reset_to_zero=["y_ptr"], restore_value=["y_ptr"])(w4a16_gemv_kernel)
    _gemm = triton.autotune(_GEMM_CONFIGS, key=["M", "N", "K", "GROUP"])(w4a16_gemm_kernel)


def gemv_activations(x: torch.Tensor) -> torch.Tensor:
    """x (M, K) -> (M, 9, K/8) fp32: the GEMV kernel's activations, in its weight tile's layout.

    Plane j (0..7) holds x[:, 8w + j] / 16**(j % 5): the kernel leaves code j of a word in
    place (shifted by 4 * (j % 5) bits), so its float is u * 16**(j % 5) and this exact
    power-of-two factor undoes that. Plane 8 holds the sum of each word's 8 activations,
    for the zero point: sum of x * (u - z) = sum of x * u - z * sum of x. M x K values, tiny
    next to the weights; computed once per call.
    """
    M, K = x.shape
    x8 = x.float().reshape(M, K // 8, 8)                                # (M, K/8, 8)
    undo = 16.0 ** -(torch.arange(8, device=x.device) % 5)              # (8,) powers of two
    planes = (x8 * undo).transpose(1, 2)                                # (M, 8, K/8)
    return torch.cat([planes, x8.sum(dim=2)[:, None, :]], dim=1).contiguous()   # (M, 9, K/8)


def unpack_int4_words(words: torch.Tensor, signed: bool = True) -> torch.Tensor:
    """The kernels' bit-trick unpacking in plain torch: int32 words (..., W) -> (..., 8W) fp32.

    Each word holds 8 codes, code j in bits 4j..4j+3. ``((word >> 4j) & 0xF) | 0x4B000000``
    read as a float32 is 2**23 + u; subtracting 2**23 (and 8 for signed codes, which the XOR
    with 0x88888888 moved to 0..15) leaves the code, exactly. Lesson 09's exercise
    re-implements this; ``tests/test_kernels_w4a16.py`` checks it against
    ``course_lib.quant.unpack_int4`` for every code.
    """
    if not isinstance(words, torch.Tensor) or words.dtype != torch.int32:
        raise TypeError("words must be an int32 tensor: view packed uint8 codes with "
                        "packed.view(torch.int32) (the last dim must be a multiple of 4 bytes)")
    if signed:
        words = words ^ FLIP.value                                       # (..., W)
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=words.device)   # (8,)
    bits = ((words[..., None] >> shifts) & 0xF) | MAGIC.value            # (..., W, 8)
    f = bits.view(torch.float32) - (TWO_23.value + (8.0 if signed else 0.0))   # exact codes
    return f.reshape(*words.shape[:-1], -1)                              # (..., 8W)


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
    _kernel_packed: torch.Tensor | None = field(default=None, repr=False, compare=False)

    def kernel_layout(self) -> torch.Tensor:
        """The codes in ``w4a16_dot_kernel``'s layout (``dequant16.prepack``), made on the
        first call and kept: the checkpoint layout ``packed`` stays as it is."""
        if self._kernel_packed is None or self._kernel_packed.device != self.packed.device:
            self._kernel_packed = dequant16.prepack(self.packed.contiguous(),
                                                    self.zero is None, self.group_size)
        return self._kernel_packed

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

KERNELS = ("dot", "gemv", "gemm")   # w4a16_linear(kernel=...): the default, two teaching steps


def dot_plan(M: int, N: int, K: int, group: int, sms: int | None = None,
             fp32: bool = False) -> dict:
    """Launch plan of ``w4a16_dot_kernel`` on a GPU: block sizes, K split, warps, stages.

    Decode (M <= 16) streams the weights once: each program keeps ``num_stages - 1`` steps
    of ``BLOCK_N x UNITS_PER_STEP x U / 2`` bytes in flight (cp.async; U = max(G, 64)
    codes, ``dequant16.layout_unit``), and the grid
    needs about two programs per SM so that every SM holds enough bytes in flight (Little's
    law: bandwidth x latency, about 36 KB per SM on an H200). When the output tiles alone
    are too few, K is split (the slices meet in a self-resetting fp32 workspace), and where
    even that leaves SMs without a program, a narrower tile is taken
    (``_DOT_DECODE_TILES``, ``kernels._common.fill_plan``). Larger
    batches take wider M tiles and no split. ``kernels.compile_check`` reports the bytes in
    flight per SM of this plan at the benchmark shapes. ``fp32``: x in float32, whose tiles
    (and their fp32 copies for the dot) take four times the shared memory of the 16-bit ones:
    the decode tile narrows to ``_DOT_FP32_DECODE`` (112 KB -> under 99 KB, the smallest limit
    of a supported GPU, sm_86/89/120; ``compile_check`` checks every architecture).
    """
    sms = sms or num_sms()
    if M > 16:
        unit = dequant16.layout_unit(group)
        return dict(BLOCK_M=64 if M >= 64 else 32, BLOCK_N=64, UNITS_PER_STEP=max(1, 128 // unit),
                    SPLIT_K=1, num_warps=4, num_stages=3)
    def steps(c):                                                      # trips, no split
        return max(1, (K // dequant16.layout_unit(group)) // c.kwargs["UNITS_PER_STEP"])

    f = fill_plan([_DOT_FP32_DECODE] if fp32 else _DOT_DECODE_TILES, N, steps, sms)
    c = f["config"]
    return {**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages,
            "SPLIT_K": f["rule"]["SPLIT_K"]}


def _which_kernel(kernel, force_gemm, config) -> str:
    if kernel is not None:
        if kernel not in KERNELS:
            raise ValueError(f"kernel={kernel!r}: choose one of {KERNELS}")
        return kernel
    if force_gemm:
        return "gemm"
    if config is not None:                           # a config of one of the three lists
        if "UNITS_PER_STEP" in config.kwargs:
            return "dot"
        return "gemv" if "BLOCK_K" in config.kwargs else "gemm"
    return "dot"


def use_asm(x_dtype: torch.dtype) -> bool:
    """True where ``dequant16.dequant_quad`` runs its inline PTX: a GPU of compute
    capability 8.0+ (bf16x2 and LOP3 there) and 16-bit activations."""
    if not on_gpu() or x_dtype == torch.float32:
        return False
    return torch.cuda.get_device_capability(0) >= (8, 0)


def w4a16_linear(x: torch.Tensor, wt: W4A16Weight, *, block_n: int | None = None,
                 split_k: int | None = None, force_gemm: bool = False,
                 block_k: int | None = None, config=None, kernel: str | None = None,
                 asm: bool | None = None) -> torch.Tensor:
    """y = x @ dequantize(wt).T with the Triton kernels (lessons 09 and 10).

    x: (..., K) fp16/bf16/fp32. Returns (..., N) in x's dtype. ``kernel`` picks the kernel
    by name: "dot" (the default at every batch: one launch, tensor cores, pipelined weight
    stream, 16-bit dequantization), "gemv" (the CUDA-core GEMV, batch <= 8: the teaching
    step of lesson 09) or "gemm" (the first tl.dot kernel, dequantizing in fp32; also
    ``force_gemm=True``). ``block_n``/``split_k`` override the launch plan; ``block_k``
    is the weights per loop step (a multiple of the group size); ``config`` forces one
    configuration of ``_DOT_CONFIGS``/``_GEMV_CONFIGS``/``_GEMM_CONFIGS``; ``asm``
    forces the inline-assembly dequantization on or off (GPU only).
    """
    _check_weight(wt)
    N, K, G = wt.N, wt.K, wt.group_size
    x2 = check_activations(x, K)                                       # (M, K)
    scale = wt.scale.contiguous()
    zero = wt.zero.contiguous() if wt.zero is not None else scale      # placeholder pointer
    check_device(x2, wt.packed, scale, zero)
    M = x2.shape[0]
    out_shape = (*x.shape[:-1], N)
    if M == 0:
        return torch.empty(out_shape, dtype=x.dtype, device=x.device)
    has_zero = wt.zero is not None
    which = _which_kernel(kernel, force_gemm, config)
    if which == "dot" and K % dequant16.layout_unit(G):
        if kernel == "dot" or config is not None:
            raise ValueError(f"kernel='dot' reads K in units of {dequant16.layout_unit(G)} "
                             f"codes (max(group size {G}, 64)); K = {K} is not a multiple: "
                             "use kernel='gemm' (the default does so for this weight)")
        which = "gemm"                           # group 32 with K = 32 mod 64: no whole unit
    if which == "dot":
        return _dot(x2, wt, scale, zero, block_n, split_k, block_k, config, asm).reshape(out_shape)
    if which == "gemv" and M <= GEMV_MAX_M:
        words = wt.packed.contiguous().view(torch.int32)               # (N, K/8): 8 codes a word
        bn, sk = gemv_plan(M, N, K, k_unit=G)
        bn, sk = block_n or bn, split_k or sk
        bk = block_k or max(G, 64)
        if bk % G or bk & (bk - 1):
            raise ValueError(f"block_k={bk} must be a power of two and a multiple of the "
                             f"group size {G}")
        y = (torch.zeros((M, N), dtype=torch.float32, device=x.device) if sk > 1
             else torch.empty((M, N), dtype=x.dtype, device=x.device))        # (M, N)
        grid = (triton.cdiv(N, bn), sk)          # one program per block of outputs (x K split)
        kern, meta = choose(_gemv, w4a16_gemv_kernel, _GEMV_DEFAULT, {"BLOCK_K": bk}, config)
        xp = gemv_activations(x2)                                       # (M, 9, K/8) fp32
        # MAGIC goes in as a run-time argument: as a compile-time constant, the GPU compiler
        # re-creates it in a register before every use (a LOP3 instruction holds only one
        # constant), about 1.5 instructions per weight byte more (kernels.compile_check)
        kern[grid](xp, words, scale, zero, y, M, N, K, xp.stride(0), words.stride(0),
                   scale.stride(0), y.stride(0), MAGIC.value, GROUP=G,
                   BLOCK_M=pow2_at_least(M, 1, GEMV_MAX_M),
                   BLOCK_N=bn, SPLIT_K=sk, HAS_ZERO=has_zero, **meta)
        return y.to(x.dtype).reshape(out_shape)
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)                   # (M, N)
    interp = {"BLOCK_M": pow2_at_least(M, 16, 32), "BLOCK_N": block_n or 32}
    kern, meta = choose(_gemm, w4a16_gemm_kernel, _GEMM_DEFAULT, interp, config)
    grid = lambda m: (triton.cdiv(M, m["BLOCK_M"]), triton.cdiv(N, m["BLOCK_N"]))  # noqa: E731
    packed = wt.packed.contiguous()                                     # (N, K/2) uint8
    kern[grid](x2, packed, scale, zero, y, M, N, K, x2.stride(0), packed.stride(0),
               scale.stride(0), y.stride(0), GROUP=G, HAS_ZERO=has_zero,
               DOT_FP32=INTERPRET or x.dtype == torch.float32, **meta)
    return y.reshape(out_shape)


def _dot(x2, wt, scale, zero, block_n, split_k, block_k, config, asm) -> torch.Tensor:
    """One launch of ``w4a16_dot_kernel``: y (M, N) in x's dtype, nothing else computed."""
    M, K = x2.shape
    N, G = wt.N, wt.group_size
    packed = wt.kernel_layout().view(torch.int16)                       # (N, K/4), made once
    if on_gpu():
        plan = dot_plan(M, N, K, G, fp32=x2.dtype == torch.float32)
    else:                                     # the interpreter: small tiles, speed is moot
        plan = dict(BLOCK_M=16, BLOCK_N=16 if N <= 16 else 32, UNITS_PER_STEP=1, SPLIT_K=1)
    if config is not None:
        plan.update(config.kwargs)
        if on_gpu():
            plan.update(num_warps=config.num_warps, num_stages=config.num_stages)
    if block_n:
        if block_n < 16 or block_n & (block_n - 1):
            raise ValueError(f"block_n={block_n} is too narrow for tl.dot: use a power of two "
                             f">= 16 (or kernel='gemv')")
        plan["BLOCK_N"] = block_n
    if split_k:
        plan["SPLIT_K"] = split_k
    if block_k:
        unit = dequant16.layout_unit(G)
        if block_k % unit:
            raise ValueError(f"block_k={block_k} must be a multiple of the kernel layout's "
                             f"unit of {unit} codes (max(group size {G}, 64))")
        plan["UNITS_PER_STEP"] = block_k // unit
    if asm and not use_asm(x2.dtype):
        raise ValueError("asm=True needs a GPU of compute capability 8.0+ and fp16/bf16 x; "
                         "the interpreter cannot run inline assembly")
    use = use_asm(x2.dtype) if asm is None else asm
    bm, bn, sk = plan["BLOCK_M"], plan["BLOCK_N"], plan["SPLIT_K"]
    grid = (triton.cdiv(N, bn), triton.cdiv(M, bm), sk)
    y = torch.empty((M, N), dtype=x2.dtype, device=x2.device)           # (M, N), written once
    ws, cnt = workspace(M, N, grid[0] * grid[1], x2.device) if sk > 1 else (y, y)
    w_dtype = tl.bfloat16 if x2.dtype == torch.bfloat16 else tl.float16
    w4a16_dot_kernel[grid](x2, packed, scale, zero, y, ws, cnt, M, N, K, x2.stride(0),
                           packed.stride(0), scale.stride(0), y.stride(0), GROUP=G,
                           HAS_ZERO=wt.zero is not None, W_DTYPE=w_dtype, USE_ASM=use,
                           DOT_FP32=INTERPRET or x2.dtype == torch.float32, **plan)
    return y


# ---------------------------------------------------------------------------- compile check

def compile_jobs(arch: int, all_configs: bool = False):
    """What ``kernels.compile_check`` compiles for this file: the GEMV at 1, 4 and 8 rows
    (and split-K), the GEMM; symmetric and with zero points; group 128 (every group size
    with ``all_configs``)."""
    acts = ["*bf16", "*fp16", "*fp32"] if all_configs else ["*fp16" if arch < 80 else "*bf16"]
    jobs = []
    for act in acts:
        for group in ((32, 64, 128) if all_configs else (128,)):
            for has_zero in (False, True):
                sig = dict(x_ptr="*fp32", p_ptr="*i32", s_ptr="*fp16",
                           z_ptr="*i32" if has_zero else "*fp16", y_ptr=act, M="i32", N="i32",
                           K="i32", stride_xm="i32", stride_pn="i32", stride_sn="i32",
                           stride_ym="i32", magic="i32")
                wbytes = lambda c: c["BLOCK_N"] * c["BLOCK_K"] // 2  # noqa: E731
                for rows in (1, 4, 8):
                    consts = dict(GROUP=group, BLOCK_M=rows, BLOCK_N=32 if rows <= 2 else 16,
                                  SPLIT_K=1, HAS_ZERO=has_zero)
                    jobs += config_jobs("w4a16_gemv", w4a16_gemv_kernel, sig, consts,
                                        _GEMV_CONFIGS, _GEMV_DEFAULT, all_configs, rows=rows,
                                        weight_bytes_per_step=wbytes)
                consts = dict(GROUP=group, BLOCK_M=1, BLOCK_N=8, SPLIT_K=4, HAS_ZERO=has_zero)
                jobs += config_jobs("w4a16_gemv split-K", w4a16_gemv_kernel,
                                    dict(sig, y_ptr="*fp32"), consts, _GEMV_CONFIGS,
                                    _GEMV_DEFAULT, all_configs, rows=1,
                                    weight_bytes_per_step=wbytes)
                dot_sig = dict(x_ptr=act, p_ptr="*i16", s_ptr="*fp16",
                               z_ptr="*i32" if has_zero else "*fp16", y_ptr=act, ws_ptr="*fp32",
                               cnt_ptr="*i32", M="i32", N="i32", K="i32", stride_xm="i32",
                               stride_pn="i32", stride_sn="i32", stride_ym="i32")
                w_dtype = tl.bfloat16 if act == "*bf16" else tl.float16
                for split in (1, 4):
                    consts = dict(GROUP=group, HAS_ZERO=has_zero, SPLIT_K=split, W_DTYPE=w_dtype,
                                  USE_ASM=arch >= 80 and act != "*fp32", DOT_FP32=act == "*fp32")
                    default = _DOT_FP32_DECODE if act == "*fp32" else _DOT_DEFAULT
                    jobs += config_jobs("w4a16_dot" + (" split-K" if split > 1 else ""),
                                        w4a16_dot_kernel, dot_sig, consts,
                                        _DOT_CONFIGS + [_DOT_FP32_DECODE] * (act == "*fp32"),
                                        default, all_configs, rows=lambda c: c["BLOCK_M"],
                                        weight_bytes_per_step=_dot_step_bytes)
                if not all_configs and act != "*fp32" and not has_zero:
                    # fp32 x at decode takes its own tile (a default path): fit it everywhere
                    fsig = dict(dot_sig, x_ptr="*fp32", y_ptr="*fp32")
                    c = _DOT_FP32_DECODE
                    jobs.append(CompileJob(
                        "w4a16_dot fp32-x", w4a16_dot_kernel, fsig,
                        dict(GROUP=group, HAS_ZERO=False, SPLIT_K=1, W_DTYPE=tl.float16,
                             USE_ASM=False, DOT_FP32=True, **c.kwargs),
                        c.num_warps, c.num_stages, rows=16, default=True,
                        weight_bytes_per_step=_dot_step_bytes({**c.kwargs, "GROUP": group})))
                if not all_configs:              # the plan's tile for batches above 16
                    p = dot_plan(64, 4096, 4096, group, sms=132)
                    jobs.append(CompileJob(
                        "w4a16_prefill", w4a16_dot_kernel, dot_sig,
                        dict(GROUP=group, HAS_ZERO=has_zero, SPLIT_K=1, W_DTYPE=w_dtype,
                             USE_ASM=arch >= 80 and act != "*fp32", DOT_FP32=act == "*fp32",
                             BLOCK_M=p["BLOCK_M"], BLOCK_N=p["BLOCK_N"],
                             UNITS_PER_STEP=p["UNITS_PER_STEP"]),
                        p["num_warps"], p["num_stages"], rows=p["BLOCK_M"], default=True,
                        weight_bytes_per_step=_dot_step_bytes({**p, "GROUP": group})))
                gemm_sig = {k: v for k, v in sig.items() if k != "magic"}
                jobs += config_jobs("w4a16_gemm", w4a16_gemm_kernel, dict(gemm_sig, x_ptr=act, p_ptr="*u8"),
                                    dict(GROUP=group, HAS_ZERO=has_zero, DOT_FP32=act == "*fp32"),
                                    _GEMM_CONFIGS, _GEMM_DEFAULT, all_configs,
                                    rows=lambda c: c["BLOCK_M"],
                                    weight_bytes_per_step=lambda c: c["BLOCK_N"] * c["GROUP"] // 2)
    return jobs


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

def bench_backends(act_dtype=torch.bfloat16, with_fp8: bool = False):
    """This file's entry in the GPU benchmark (``kernels.bench.GPU_KERNEL_MODULES``)."""
    from kernels._common import Backend

    return [Backend("w4a16 g128", lambda w: quantize_weight(w, 128),
                    lambda x, st: w4a16_linear(x, st), act_dtype, 4, 128)]


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
