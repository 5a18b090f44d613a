"""Decode attention over a quantized KV cache: one new query per sequence (lesson 11).

What you will learn
-------------------
* Why decode attention is a memory-bound read of the cache: each step, every sequence's
  query heads meet *all* its cached keys and values once (REP FLOPs per byte at BF16, REP the
  query heads sharing a KV head: 4 for Llama 3.1 8B, 8 for 70B; lesson 11; far below any GPU's
  compute roof), so a cache stored in 8 bits should read about twice as fast.
* How to dequantize in registers: the kernel loads FP8 or INT8 codes (1 byte per value) and
  multiplies by the scale after the load, never writing a 16-bit copy of the cache to memory.
* Online softmax: a running maximum ``m``, a running sum ``l`` and a rescaled accumulator
  let one pass over the keys compute ``softmax(q k^T) v`` without storing the scores.
* Grouped-query attention: the ``H / K`` query heads that share a KV head are handled by one
  program, so each cached key and value is read once for all of them.
* A ragged batch (every sequence its own length) and split-K along the context: with few
  sequences there are too few programs to fill a GPU, so each sequence's context is cut into
  ``SPLIT`` slices whose partial (m, l, acc) a second small kernel combines.

The maths, for sequence b, query head h (served by KV head kh = h // (H / K)), length L_b::

    s_j = (q[b, h] . k[b, kh, j]) / sqrt(hd)            j < L_b
    out[b, h] = sum_j softmax(s)_j v[b, kh, j]

Cache formats (the dtype of ``k_cache`` says which):

====== ===================================== =============================================
bf16   k, v (B, K, S, hd) bf16/fp16/fp32      no scales
fp8    k, v (B, K, S, hd) float8_e4m3fn       ``k_scale``, ``v_scale``: (K,) or (1,) fp32,
                                              calibrated and fixed (``course_lib.kv``)
int8   k, v (B, K, S, hd) int8                ``k_scale``, ``v_scale``: (B, K, S) fp16, one
                                              per token and head (``course_lib.kv``)
====== ===================================== =============================================

Pseudo-code of one program (sequence b, KV head kh, context slice sp)::

    q[REP, hd] = queries of the REP heads that share kh, times 1/sqrt(hd)
    m = -inf, l = 0, acc[REP, hd] = 0
    for j0 in this slice, BLOCK_S at a time:
        k, v = load codes [b, kh, j0:j0+BLOCK_S]      # 1 byte per value for FP8/INT8
        s = (q @ k^T) x key scale            # (REP, BLOCK_S), masked past L_b; the scale is
                                             # per head (FP8) or per token = per column (INT8)
        m_new = max(m, max_j s);  p = exp(s - m_new);  alpha = exp(m - m_new)
        l = l * alpha + sum_j p
        acc = acc * alpha + ((p x INT8 per-token value scale) @ v) x FP8 value scale
        m = m_new
    SPLIT == 1: out = acc / l          else: store (m, l, acc) for the combine kernel
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kernels._triton import tl, triton  # Triton, or its stand-in where it is not installed

from kernels import INTERPRET
from kernels._common import check_device, num_sms, on_gpu

MODES = {"bf16": 0, "fp8": 1, "int8": 2}
Q_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ---------------------------------------------------------------------------- kernels

@triton.jit
def decode_attention_kernel(
    q_ptr,        # queries, (B, H, HD) contiguous, fp16/bf16/fp32
    k_ptr,        # cached keys, (B, K, S, HD) with strides below: bf16/fp16/fp32, fp8 or int8
    v_ptr,        # cached values, same layout and dtype as k
    ks_ptr,       # key scales: fp8 (K,) or (1,); int8 (B, K, S); unused for 16-bit caches
    vs_ptr,       # value scales, like ks_ptr
    len_ptr,      # sequence lengths, (B,) int32: sequence b reads cache positions 0..len-1
    o_ptr,        # SPLIT == 1: output (B, H, HD); else partial accumulators (B, H, SPLIT, HD) fp32
    ml_ptr,       # SPLIT > 1: running max and sum, (B, H, SPLIT, 2) fp32 (unused otherwise)
    stride_kb, stride_kh, stride_ks,   # elements between batches, heads, positions of k/v
    stride_sb, stride_sh,              # int8 scales: elements between batches, heads
    sm_scale,     # 1 / sqrt(HD)
    H: tl.constexpr,        # query heads
    REP: tl.constexpr,      # query heads per KV head (H / K)
    REP_P: tl.constexpr,    # REP rounded up to a power of two (block shapes must be)
    HD: tl.constexpr,       # head dimension
    HD_P: tl.constexpr,     # HD rounded up to a power of two
    BLOCK_S: tl.constexpr,  # cache positions per loop step
    SPLIT: tl.constexpr,    # slices of the context per sequence (1 = no split)
    MODE: tl.constexpr,     # 0: 16-bit cache, 1: fp8 with a scale per head, 2: int8 per token
    PER_HEAD: tl.constexpr, # fp8: one scale per KV head (True) or one for all heads (False)
    DOT: tl.constexpr = 0,  # 0: products summed with tl.sum; 1: tl.dot in fp32 (interpreter);
                            # 2: tl.dot in bf16 (tensor cores; REP_P padded to >= 16 rows);
                            # 3: tl.dot in fp16 (Turing: no bf16 tensor cores)
):
    b = tl.program_id(0)            # sequence
    kh = tl.program_id(1)           # KV head
    sp = tl.program_id(2)           # slice of the context
    L = tl.load(len_ptr + b)
    per_split = tl.cdiv(tl.cdiv(L, SPLIT), BLOCK_S) * BLOCK_S
    start = sp * per_split
    end = tl.minimum(start + per_split, L)

    offs_r = tl.arange(0, REP_P)                                      # (REP_P,)
    offs_d = tl.arange(0, HD_P)                                       # (HD_P,)
    r_mask = offs_r < REP
    d_mask = offs_d < HD
    heads = kh * REP + offs_r                                         # query heads of kh
    q = tl.load(q_ptr + (b * H + heads[:, None]) * HD + offs_d[None, :],
                mask=r_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32)
    q = q * sm_scale                                                  # (REP_P, HD_P)

    if MODE == 1:   # fp8: a fixed scale per KV head (or one for the layer)
        if PER_HEAD:
            k_sc = tl.load(ks_ptr + kh).to(tl.float32)
            v_sc = tl.load(vs_ptr + kh).to(tl.float32)
        else:
            k_sc = tl.load(ks_ptr).to(tl.float32)
            v_sc = tl.load(vs_ptr).to(tl.float32)

    m = tl.full((REP_P,), float("-inf"), dtype=tl.float32)           # running max
    l = tl.zeros((REP_P,), dtype=tl.float32)                          # running sum
    acc = tl.zeros((REP_P, HD_P), dtype=tl.float32)                   # running sum of p v
    base = b * stride_kb + kh * stride_kh
    for s0 in range(start, end, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)                           # (BLOCK_S,)
        s_mask = offs_s < end
        kv_off = base + offs_s[:, None] * stride_ks + offs_d[None, :]
        kv_mask = s_mask[:, None] & d_mask[None, :]
        # codes as they are (int8 and fp8 convert to bf16 exactly); the scales are applied
        # where they cost least: to the scores and to p, not to every cached value
        k = tl.load(k_ptr + kv_off, mask=kv_mask, other=0.0)         # (BLOCK_S, HD_P)
        v = tl.load(v_ptr + kv_off, mask=kv_mask, other=0.0)
        # the scores are a fresh product each block (nothing to accumulate into)
        if DOT == 0:
            s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)  # (REP_P, BLOCK_S)
        elif DOT == 1:
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")  # fresh product
        elif DOT == 2:
            s = tl.dot(q.to(tl.bfloat16), tl.trans(k.to(tl.bfloat16)))  # fresh product
        else:
            s = tl.dot(q.to(tl.float16), tl.trans(k.to(tl.float16)))    # fresh product
        if MODE == 1:   # fp8: the head's key scale multiplies every score
            s = s * k_sc
        if MODE == 2:   # int8: one fp16 scale per cached token and head -> one per column of s
            sc_off = b * stride_sb + kh * stride_sh + offs_s
            s = s * tl.load(ks_ptr + sc_off, mask=s_mask, other=0.0).to(tl.float32)[None, :]
        s = tl.where(s_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))                      # (REP_P,)
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])                                # (REP_P, BLOCK_S)
        l = l * alpha + tl.sum(p, axis=1)
        pw = p
        if MODE == 1:   # fp8: the head's value scale weighs p (fewer products than the output)
            pw = p * v_sc
        if MODE == 2:   # int8 values: token j's scale weighs p[:, j], not v[j, :]
            pw = p * tl.load(vs_ptr + sc_off, mask=s_mask, other=0.0).to(tl.float32)[None, :]
        acc = acc * alpha[:, None]                                    # rescale, then add p @ v
        if DOT == 0:
            acc += tl.sum(pw[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)  # (REP_P, HD_P)
        elif DOT == 1:   # the accumulator form: on Hopper the wgmma adds into acc itself
            acc = tl.dot(pw, v.to(tl.float32), acc, input_precision="ieee")
        elif DOT == 2:
            acc = tl.dot(pw.to(tl.bfloat16), v.to(tl.bfloat16), acc)
        else:
            acc = tl.dot(pw.to(tl.float16), v.to(tl.float16), acc)
        m = m_new

    out_mask = r_mask[:, None] & d_mask[None, :]
    if SPLIT == 1:
        out = acc / l[:, None]
        tl.store(o_ptr + (b * H + heads[:, None]) * HD + offs_d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=out_mask)
    else:           # partial results of this slice; an empty slice leaves m = -inf, l = 0
        row = (b * H + heads) * SPLIT + sp                            # (REP_P,)
        tl.store(o_ptr + row[:, None] * HD + offs_d[None, :], acc, mask=out_mask)
        tl.store(ml_ptr + row * 2, m, mask=r_mask)
        tl.store(ml_ptr + row * 2 + 1, l, mask=r_mask)


@triton.jit
def combine_splits_kernel(
    part_ptr,     # partial accumulators, (B*H, SPLIT, HD) fp32
    ml_ptr,       # partial max and sum, (B*H, SPLIT, 2) fp32
    o_ptr,        # output, (B*H, HD)
    SPLIT: tl.constexpr,    # slices per sequence
    SPLIT_P: tl.constexpr,  # SPLIT rounded up to a power of two
    HD: tl.constexpr,       # head dimension
    HD_P: tl.constexpr,     # HD rounded up to a power of two
):
    row = tl.program_id(0)                                            # one (sequence, head)
    offs_p = tl.arange(0, SPLIT_P)
    offs_d = tl.arange(0, HD_P)
    p_mask = offs_p < SPLIT
    d_mask = offs_d < HD
    m = tl.load(ml_ptr + (row * SPLIT + offs_p) * 2, mask=p_mask, other=float("-inf"))
    l = tl.load(ml_ptr + (row * SPLIT + offs_p) * 2 + 1, mask=p_mask, other=0.0)
    acc = tl.load(part_ptr + (row * SPLIT + offs_p)[:, None] * HD + offs_d[None, :],
                  mask=p_mask[:, None] & d_mask[None, :], other=0.0)  # (SPLIT_P, HD_P)
    m_all = tl.max(m, axis=0)                 # finite: slice 0 is never empty
    w = tl.where(m > float("-inf"), tl.exp(m - m_all), 0.0)           # (SPLIT_P,)
    out = tl.sum(w[:, None] * acc, axis=0) / tl.sum(w * l, axis=0)    # (HD_P,)
    tl.store(o_ptr + row * HD + offs_d, out.to(o_ptr.dtype.element_ty), mask=d_mask)


# ---------------------------------------------------------------------------- wrapper

def _pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def cache_mode(k_cache: torch.Tensor) -> str:
    """'bf16', 'fp8' or 'int8' from the cache's dtype."""
    if k_cache.dtype in (torch.bfloat16, torch.float16, torch.float32):
        return "bf16"
    if k_cache.dtype == torch.float8_e4m3fn:
        return "fp8"
    if k_cache.dtype == torch.int8:
        return "int8"
    raise TypeError(f"k_cache has dtype {k_cache.dtype}; the kernel reads a bf16/fp16/fp32, "
                    f"float8_e4m3fn or int8 cache (make one with course_lib.kv or "
                    f"kernels.decode_attention.quantize_cache)")


def _check(q, k_cache, v_cache, lengths, k_scale, v_scale):
    """Check the inputs; return (mode, lengths as int32)."""
    if not isinstance(q, torch.Tensor) or q.dtype not in Q_DTYPES or q.dim() != 3:
        raise TypeError("q must be a (B, H, hd) float16, bfloat16 or float32 tensor: one new "
                        "query per sequence")
    mode = cache_mode(k_cache)
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"k_cache and v_cache must both be (B, K, S, hd) of one dtype; got "
                         f"{tuple(k_cache.shape)} {k_cache.dtype} and {tuple(v_cache.shape)} "
                         f"{v_cache.dtype}")
    B, H, hd = q.shape
    Bk, K, S, hdk = k_cache.shape
    if Bk != B:
        raise ValueError(f"q holds {B} sequences but the cache {Bk}")
    if hdk != hd:
        raise ValueError(f"q has head dimension {hd} but the cache {hdk}; they must match")
    if H % K:
        raise ValueError(f"q has {H} heads, not a multiple of the cache's {K} KV heads")
    if not isinstance(lengths, torch.Tensor) or lengths.shape != (B,) or lengths.is_floating_point():
        raise ValueError(f"lengths must be an integer tensor of shape ({B},)")
    if B and (int(lengths.min()) < 1 or int(lengths.max()) > S):
        raise ValueError(f"lengths must lie in 1..{S} (the cache's positions); got "
                         f"{int(lengths.min())}..{int(lengths.max())}")
    if mode == "bf16":
        if k_scale is not None or v_scale is not None:
            raise ValueError("a 16-bit cache takes no scales")
    elif k_scale is None or v_scale is None:
        raise ValueError(f"an {mode} cache needs k_scale and v_scale")
    elif mode == "fp8" and not (k_scale.numel() in (1, K) and v_scale.numel() == k_scale.numel()):
        raise ValueError(f"fp8 scales are one per KV head ({K},) or one for all (1,); got "
                         f"{tuple(k_scale.shape)} and {tuple(v_scale.shape)}")
    elif mode == "int8" and not (k_scale.shape == (B, K, S) and v_scale.shape == (B, K, S)):
        raise ValueError(f"int8 scales are one per token and head, ({B}, {K}, {S}); got "
                         f"{tuple(k_scale.shape)} and {tuple(v_scale.shape)}")
    if k_cache.stride(-1) != 1 or v_cache.stride() != k_cache.stride():
        raise ValueError("k_cache and v_cache need the same strides with the head dimension "
                         "contiguous; pass .contiguous() copies")
    return mode, lengths.to(torch.int32).contiguous()


def split_plan(B: int, K: int, max_len: int, block_s: int) -> int:
    """Slices of the context per sequence so the GPU gets enough programs (1 in the interpreter).

    ``B x K`` programs fill an H100's 132 SMs only for large batches; with few sequences each
    one's context is split, keeping at least four loop steps per slice.
    """
    if not on_gpu():
        return 1
    programs = B * K
    target = 2 * num_sms()
    if programs >= target:
        return 1
    most = max(1, max_len // (4 * block_s))
    return max(1, min(most, math.ceil(target / programs), 64))


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     lengths: torch.Tensor, k_scale: torch.Tensor | None = None,
                     v_scale: torch.Tensor | None = None, *, split: int | None = None,
                     block_s: int | None = None, dot: int | None = None) -> torch.Tensor:
    """One decode step's attention with the Triton kernel (lesson 11): (B, H, hd) in q's dtype.

    q (B, H, hd); k_cache, v_cache (B, K, S, hd) in bf16/fp16/fp32, float8_e4m3fn or int8;
    lengths (B,): positions each sequence reads; scales as the module docstring lists.
    ``split``/``block_s`` override the launch plan (tests use them to reach every path);
    ``dot``: 0 products and tl.sum, 1 tl.dot in fp32, 2 tl.dot in bf16 (the GPU default;
    the query heads of a KV head are padded to 16 rows, which costs maths, not bytes), 3 in
    fp16 (the default below compute capability 8.0).
    """
    mode, lens = _check(q, k_cache, v_cache, lengths, k_scale, v_scale)
    check_device(q, k_cache, v_cache, lens)
    B, H, hd = q.shape
    K, S = k_cache.shape[1], k_cache.shape[2]
    if B == 0:
        return torch.empty_like(q)
    q = q.contiguous()
    bs = block_s or (16 if INTERPRET else 64)
    sp = split or split_plan(B, K, int(lens.max()), bs)
    rep = H // K
    if dot is None:
        dot = (2 if torch.cuda.get_device_capability() >= (8, 0) else 3) if on_gpu() else 0
    rep_p = max(16, _pow2(rep)) if dot else _pow2(rep)
    dummy = torch.zeros(1, dtype=torch.float32, device=q.device)
    ks = dummy if k_scale is None else k_scale.contiguous()
    vs = dummy if v_scale is None else v_scale.contiguous()
    stride_sb, stride_sh = (ks.stride(0), ks.stride(1)) if mode == "int8" else (0, 0)
    if sp == 1:
        out = torch.empty_like(q)
        part, ml = out, dummy
    else:
        out = torch.empty_like(q)
        part = torch.empty((B, H, sp, hd), dtype=torch.float32, device=q.device)
        ml = torch.empty((B, H, sp, 2), dtype=torch.float32, device=q.device)
    meta = {} if INTERPRET else {"num_warps": 4, "num_stages": 2}
    decode_attention_kernel[(B, K, sp)](
        q, k_cache, v_cache, ks, vs, lens, part, ml,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), stride_sb, stride_sh,
        1.0 / math.sqrt(hd), H=H, REP=rep, REP_P=rep_p, HD=hd, HD_P=_pow2(hd),
        BLOCK_S=bs, SPLIT=sp, MODE=MODES[mode], PER_HEAD=mode == "fp8" and ks.numel() > 1,
        DOT=dot, **meta)
    if sp > 1:
        combine_splits_kernel[(B * H,)](part, ml, out, SPLIT=sp, SPLIT_P=_pow2(sp), HD=hd,
                                        HD_P=_pow2(hd), **meta)
    return out


# ---------------------------------------------------------------------------- reference

def quantize_cache(k: torch.Tensor, v: torch.Tensor, fmt: str):
    """(k_cache, v_cache, k_scale, v_scale) for the kernel from fp k, v (B, K, S, hd), with
    ``course_lib.kv``'s quantizers: 'bf16', 'fp8' (a per-head scale from these very values:
    a test helper, where a model would use calibrated scales), 'fp8_tensor' or 'int8'."""
    from course_lib import kv

    if fmt == "bf16":
        return k.to(torch.bfloat16), v.to(torch.bfloat16), None, None
    if fmt in ("fp8", "fp8_tensor"):
        dims = (0, 2, 3) if fmt == "fp8" else (0, 1, 2, 3)
        ks = (k.float().abs().amax(dims) / kv.FP8_MAX).clamp_min(1e-12).reshape(-1)
        vs = (v.float().abs().amax(dims) / kv.FP8_MAX).clamp_min(1e-12).reshape(-1)
        return kv.quantize_fp8(k, ks), kv.quantize_fp8(v, vs), ks, vs
    if fmt == "int8":
        (kq, ks), (vq, vs) = kv.quantize_int8_per_token(k), kv.quantize_int8_per_token(v)
        return kq, vq, ks, vs
    raise ValueError(f"unknown cache format {fmt!r}; use 'bf16', 'fp8', 'fp8_tensor' or 'int8'")


def dequantize_cache(k_cache, v_cache, k_scale=None, v_scale=None):
    """The cache as fp32 (B, K, S, hd), with ``course_lib.kv``'s dequantizers."""
    from course_lib import kv

    mode = cache_mode(k_cache)
    if mode == "bf16":
        return k_cache.float(), v_cache.float()
    if mode == "fp8":
        return kv.dequantize_fp8(k_cache, k_scale), kv.dequantize_fp8(v_cache, v_scale)
    return (kv.dequantize_int8_per_token(k_cache, k_scale),
            kv.dequantize_int8_per_token(v_cache, v_scale))


def decode_attention_reference(q, k_cache, v_cache, lengths, k_scale=None, v_scale=None):
    """Plain torch: dequantize the whole cache, then attention of each sequence over its own
    length, in fp32; result in q's dtype, (B, H, hd)."""
    _check(q, k_cache, v_cache, lengths, k_scale, v_scale)
    k, v = dequantize_cache(k_cache, v_cache, k_scale, v_scale)          # (B, K, S, hd)
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        L = int(lengths[b])
        y = F.scaled_dot_product_attention(q[b, :, None].float(), k[b, :, :L], v[b, :, :L],
                                           enable_gqa=True)              # (H, 1, hd)
        out[b] = y[:, 0].to(q.dtype)
    return out


# ---------------------------------------------------------------------------- benchmark

BENCH_CONTEXTS = (1024, 4096, 8192, 16384, 32768)
BENCH_BATCHES = (1, 8, 16, 32, 64)
BENCH_SHAPE = {"name": "Llama 3.1 8B attention", "heads": 32, "kv_heads": 8, "head_dim": 128}


def benchmark_rows(contexts=BENCH_CONTEXTS, batches=BENCH_BATCHES, shape=None) -> dict:
    """Benchmark rows (lesson 11): the kernel on BF16, FP8 and INT8 caches and torch's
    scaled_dot_product_attention on the BF16 cache, one layer, every sequence at the full
    context. Without a GPU every row says "not measured" (no time is ever invented)."""
    shape = shape or BENCH_SHAPE
    H, K, hd = shape["heads"], shape["kv_heads"], shape["head_dim"]
    rows = []
    for S in contexts:
        for B in batches:
            row = {"context": S, "batch": B,
                   "kv_bytes_bf16": 2 * B * K * S * hd * 2, "kv_bytes_8bit": 2 * B * K * S * hd}
            if on_gpu():
                row.update(_time_one(B, H, K, S, hd))
            else:
                row.update({"measured": False, "ms": None})
            rows.append(row)
    why = None if on_gpu() else "no CUDA GPU on the machine that ran this; rows not measured"
    return {"shape": shape, "measured": on_gpu(), "why_not": why, "rows": rows,
            "target": target_met(rows)}


def target_met(rows) -> dict:
    """The Hopper target: an FP8 or INT8 cache at least 1.3x faster than BF16 at every
    measured batch >= 8 and context >= 8k. ``met`` is None when nothing was measured."""
    big = [r for r in rows if r["batch"] >= 8 and r["context"] >= 8192 and r.get("measured")]
    desc = "FP8 or INT8 cache >= 1.3x the BF16 cache at batch >= 8 and context >= 8k"
    if not big:
        return {"target": desc, "met": None, "worst": None}
    worst = min(max(r["speedup_fp8"], r["speedup_int8"]) for r in big)
    return {"target": desc, "met": worst >= 1.3, "worst": worst}


def _time_one(B, H, K, S, hd) -> dict:
    """Median ms of each variant at batch B, context S (GPU only)."""
    from course_lib import bench

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, hd, device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.randn(B, K, S, hd, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn(B, K, S, hd, device="cuda", generator=g, dtype=torch.bfloat16)
    lens = torch.full((B,), S, device="cuda", dtype=torch.int32)
    ms = {}
    for fmt in ("bf16", "fp8", "int8"):
        cache = quantize_cache(k, v, fmt)
        ms[fmt] = bench.time_gpu(lambda c=cache: decode_attention(q, c[0], c[1], lens, c[2], c[3]))
    ms["sdpa_bf16"] = bench.time_gpu(lambda: F.scaled_dot_product_attention(
        q[:, :, None], k, v, enable_gqa=True))
    return {"measured": True, "ms": ms, "speedup_fp8": ms["bf16"] / ms["fp8"],
            "speedup_int8": ms["bf16"] / ms["int8"], "vs_sdpa_bf16": ms["sdpa_bf16"] / ms["bf16"]}


# ---------------------------------------------------------------------------- ahead-of-time compile

def compile_jobs(arch: int, all_configs: bool = False):
    """What ``kernels.compile_check`` compiles for this file: the decode kernel on a BF16 (FP16
    below sm_80), FP8 (sm_89+) and INT8 cache, unsplit and split, and the combine kernel.
    Every job is the configuration the wrapper launches (BLOCK_S 64, 4 warps, 2 stages)."""
    from kernels._common import CompileJob

    I = "i32"
    half = "*fp16" if arch < 80 else "*bf16"
    shapes = [(32, 8, 128), (9, 3, 64)] if all_configs else [(32, 8, 128)]
    jobs = []
    for H, K, hd in shapes:
        rep = H // K
        for mode, cache_t, scale_t, value_bytes in (("bf16", half, "*fp32", 2),
                                                    ("fp8", "*fp8e4nv", "*fp32", 1),
                                                    ("int8", "*i8", "*fp16", 1)):
            # one split per format by default (both paths covered), both with all_configs
            splits = (1, 4) if all_configs else ({"bf16": 1, "fp8": 4, "int8": 1}[mode],)
            for split in splits:
                sig = dict(q_ptr=half, k_ptr=cache_t, v_ptr=cache_t, ks_ptr=scale_t,
                           vs_ptr=scale_t, len_ptr="*i32", o_ptr=half if split == 1 else "*fp32",
                           ml_ptr="*fp32", stride_kb=I, stride_kh=I, stride_ks=I, stride_sb=I,
                           stride_sh=I, sm_scale="fp32")
                consts = dict(H=H, REP=rep, REP_P=max(16, _pow2(rep)), HD=hd, HD_P=_pow2(hd),
                              BLOCK_S=64, SPLIT=split, MODE=MODES[mode], PER_HEAD=True,
                              DOT=2 if arch >= 80 else 3)
                jobs.append(CompileJob(f"decode_attn_{mode}", decode_attention_kernel, sig, consts,
                                       num_warps=4, num_stages=2, min_cc=89 if mode == "fp8" else 0,
                                       weight_bytes_per_step=2 * 64 * hd * value_bytes,
                                       default=True))
        jobs.append(CompileJob("decode_attn_combine", combine_splits_kernel,
                               dict(part_ptr="*fp32", ml_ptr="*fp32", o_ptr=half),
                               dict(SPLIT=4, SPLIT_P=4, HD=hd, HD_P=_pow2(hd)), num_warps=4,
                               num_stages=2, default=True))
    return jobs


# ---------------------------------------------------------------------------- command

def main(argv=None) -> None:
    """``python -m kernels.decode_attention [--json results/kv_smollm2.json]``: write the
    benchmark rows (measured on a GPU, marked not measured elsewhere) into a results JSON
    under the key ``decode_attention`` (lesson 11 reads them there)."""
    import argparse
    import json
    from pathlib import Path

    p = argparse.ArgumentParser(description="decode-attention benchmark rows (lesson 11)")
    p.add_argument("--json", default=str(Path(__file__).resolve().parent.parent / "results"
                                         / "kv_smollm2.json"))
    a = p.parse_args(argv)
    path = Path(a.json)
    from course_lib import device
    res = json.loads(path.read_text()) if path.exists() else {}
    res["decode_attention"] = {**benchmark_rows(), "machine": device.machine_record()}
    res.setdefault("machine", res["decode_attention"]["machine"])   # a file of these rows only
    path.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote decode_attention rows ({'measured' if on_gpu() else 'not measured'}) to {path}")


if __name__ == "__main__":
    main()
