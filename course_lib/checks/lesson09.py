"""Lesson 09 exercises: a W8A16 GEMV kernel in Triton, arithmetic intensity, and unpacking
INT4 with the exponent-bias bit trick.

The GEMV is checked in Triton's interpreter on a CPU (small shapes: N, K <= 96), natively
on a GPU. Its reference is the course kernel's plain-torch reference,
``kernels.w8a16.w8a16_reference`` (imported when a check runs, so that loading the
checks never imports triton before ``course_lib.device.ensure_triton_mode``).
The wrong answers below are plain-torch versions of what plausible buggy kernels compute.
"""
from __future__ import annotations

import torch

from course_lib import bench
from course_lib.checks import Case, Exercise, register


# ---------------------------------------------------------------------------- 09.w8a16_gemv

def w8a16_gemv_reference(x, w_q, scale):
    """y = x @ (w_q * scale[:, None]).T in x's dtype: ``kernels.w8a16.w8a16_reference``."""
    if x.shape[-1] != w_q.shape[1]:
        raise ValueError(f"x has {x.shape[-1]} features but w_q expects {w_q.shape[1]}")
    from kernels.w8a16 import w8a16_reference

    return w8a16_reference(x, w_q, scale)


def _weights(N, K, seed, zero_row=False):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) / K ** 0.5                       # (N, K)
    if zero_row:
        w[1] = 0.0
    amax = w.abs().amax(dim=1)                                          # (N,)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))    # per output channel
    w_q = torch.clamp(torch.round(w / scale[:, None]), -127, 127).to(torch.int8)
    return w_q, scale


def _gemv_case(M, N, K, dtype, label, seed=0, zero_row=False):
    w_q, scale = _weights(N, K, seed, zero_row)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    return Case((x, w_q, scale), label=label)


def _gemv_cases():
    return [
        _gemv_case(1, 16, 32, torch.float32, "one block, batch 1"),
        _gemv_case(1, 33, 50, torch.float32, "N and K not multiples of the blocks (tails)", 1),
        _gemv_case(1, 64, 96, torch.float32, "several K steps", 2),
        _gemv_case(3, 20, 40, torch.float32, "batch 3", 3),
        _gemv_case(2, 24, 72, torch.bfloat16, "bf16 activations: output in bf16", 4),
        _gemv_case(1, 8, 32, torch.float16, "fp16 activations, a row of zero weights", 5, True),
        Case((torch.randn(1, 33), *_weights(8, 32, 6)), label="x with the wrong K",
             raises=ValueError),
    ]


def _wrong_scale_per_column(x, w_q, scale):
    """Loaded the scale at the K offsets (per input column) instead of the N offsets."""
    K = w_q.shape[1]
    s_k = scale[torch.arange(K) % scale.numel()]                        # (K,)
    return ((x.float() * s_k) @ w_q.float().T).to(x.dtype)


def _wrong_no_tail_mask(x, w_q, scale):
    """Skipped the last partial blocks (no mask): the tail of K and of N are lost."""
    N, K = w_q.shape
    k_full, n_full = (K // 32) * 32, (N // 16) * 16
    y = torch.zeros(x.shape[0], N)
    y[:, :n_full] = x.float()[:, :k_full] @ (w_q.float()[:n_full, :k_full] * scale[:n_full, None]).T
    return y.to(x.dtype)


def _wrong_int8_accumulator(x, w_q, scale):
    """Multiplied and accumulated in int8: x truncated to integers, the sum wraps at 127."""
    acc = x.to(torch.int8).to(torch.int32) @ w_q.to(torch.int32).T     # (M, N)
    acc = ((acc + 128) % 256) - 128                                     # int8 wrap-around
    return (acc.float() * scale).to(x.dtype)


def _wrong_output_dtype(x, w_q, scale):
    """Returned the fp32 accumulator without casting to the activations' dtype."""
    return x.float() @ (w_q.float() * scale[:, None]).T


def _wrong_scale_in_loop(x, w_q, scale):
    """Applied the scale to every weight inside the loop *and* again after it."""
    return (x.float() @ (w_q.float() * scale[:, None]).T * scale).to(x.dtype)


register(Exercise(
    id="09.w8a16_gemv",
    title="a W8A16 GEMV kernel in Triton",
    reference=w8a16_gemv_reference,
    cases=_gemv_cases,
    hint=["Which outputs and which K slice does one program own, and what happens to the "
          "loads past the last full block of N and of K? Where must the scale go: per weight, "
          "or once per output?",
          "Loop k0 over K in steps of BLOCK_K; load x[m, k0:k0+BLOCK_K] and the (BLOCK_N, "
          "BLOCK_K) int8 tile with masks offs_k < K and offs_n < N (other=0); sum in fp32.",
          "acc += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1); after the loop "
          "acc * scale[offs_n], cast to y_ptr.dtype.element_ty, store with mask offs_n < N"],
    wrong=[_wrong_scale_per_column, _wrong_no_tail_mask, _wrong_int8_accumulator,
           _wrong_output_dtype, _wrong_scale_in_loop],
    rtol=1e-2, atol=1e-2,
))


# ---------------------------------------------------------------------------- 09.arithmetic_intensity

def arithmetic_intensity_reference(M, N, K, weight_bits=16, group_size=None):
    """FLOP per byte of y = x W^T with 16-bit x, y and scales: ``course_lib.bench``."""
    return bench.arithmetic_intensity(M, N, K, weight_bits, group_size=group_size)


def _intensity_cases():
    return [
        Case((1, 4096, 4096, 16), label="BF16 GEMV, batch 1"),
        Case((1, 8192, 28672, 4), {"group_size": 128}, label="INT4 group-128, batch 1"),
        Case((16, 4096, 14336, 8), {"group_size": 14336}, label="INT8 per channel, batch 16"),
        Case((2048, 4096, 4096, 16), label="BF16 prefill, 2048 tokens"),
        Case((1, 1024, 4096, 4), {"group_size": 32}, label="INT4 group-32: scales matter"),
        Case((0, 4096, 4096, 16), label="no tokens", raises=ValueError),
    ]


def _bytes_wrong(M, N, K, weight_bits, group_size, *, factor=2, bits_as_bytes=False,
                 scales=True, acts=True):
    w = N * K * (weight_bits if bits_as_bytes else weight_bits / 8)
    s = N * (K / group_size) * 2 if (group_size and scales) else 0
    a = (M * K + M * N) * 2 if acts else 0
    if M < 1:
        raise ValueError("M must be positive")
    return factor * M * N * K / (w + s + a)


def _wrong_flops_without_two(M, N, K, weight_bits=16, group_size=None):
    """Counted one FLOP per multiply-add instead of two."""
    return _bytes_wrong(M, N, K, weight_bits, group_size, factor=1)


def _wrong_bits_as_bytes(M, N, K, weight_bits=16, group_size=None):
    """Counted the weight in bits, not bytes."""
    return _bytes_wrong(M, N, K, weight_bits, group_size, bits_as_bytes=True)


def _wrong_no_scales(M, N, K, weight_bits=16, group_size=None):
    """Forgot the bytes of the group scales."""
    return _bytes_wrong(M, N, K, weight_bits, group_size, scales=False)


def _wrong_weights_only(M, N, K, weight_bits=16, group_size=None):
    """Counted only the weight bytes (no activations in or out)."""
    return _bytes_wrong(M, N, K, weight_bits, group_size, acts=False)


register(Exercise(
    id="09.arithmetic_intensity",
    title="arithmetic intensity of a linear layer",
    reference=arithmetic_intensity_reference,
    cases=_intensity_cases,
    hint=["Count what one multiply-add is worth in FLOPs, and every group of bytes the layer "
          "must move at least once: not only the weights.",
          "bytes = weights (bits / 8 each) + one 16-bit scale per group + x and y in 16 bits; "
          "refuse M, N or K below 1.",
          "2*M*N*K / (N*K*weight_bits/8 + N*(K/group_size)*2 + 2*M*K + 2*M*N); the scale term "
          "only when group_size is given"],
    wrong=[_wrong_flops_without_two, _wrong_bits_as_bytes, _wrong_no_scales, _wrong_weights_only],
    rtol=1e-9, atol=0.0,
))


# ---------------------------------------------------------------------------- 09.unpack_int4_bits

def unpack_int4_bits_reference(words, signed=True):
    """int32 words (..., W), 8 codes each -> (..., 8W) fp32: ``kernels.w4a16.unpack_int4_words``."""
    from kernels.w4a16 import unpack_int4_words

    return unpack_int4_words(words, signed)


def _words(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-2 ** 31, 2 ** 31 - 1, shape, generator=g, dtype=torch.int64).to(torch.int32)


def _every_byte():
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(8, 32).view(torch.int32)


def _unpack_cases():
    return [
        Case((_every_byte(), True), label="every byte value: all 16 signed codes in both nibbles"),
        Case((_every_byte(), False), label="every byte value, unsigned codes 0..15"),
        Case((_words((3, 5), 1),), label="random words, signed (the default)"),
        Case((_words((7,), 2), False), label="one row of 7 words, unsigned"),
        Case((torch.tensor([[0x76543210, 0xFEDCBA98 - 2 ** 32]], dtype=torch.int32), True),
             label="codes 0..7 then 8..15 in order: nibble j holds element j"),
        Case((torch.arange(8, dtype=torch.uint8), True), label="uint8 bytes, not int32 words",
             raises=TypeError),
    ]


def _as_words(words):
    if not isinstance(words, torch.Tensor) or words.dtype != torch.int32:
        raise TypeError("words must be int32")
    return words


def _wrong_high_nibble_first(words, signed=True):
    """Read the nibbles from the top of the word down (element 0 taken from bits 28..31)."""
    words = _as_words(words)
    shifts = torch.arange(28, -1, -4, dtype=torch.int32)
    u = (words[..., None] >> shifts) & 0xF
    q = torch.where(u >= 8, u - 16, u) if signed else u
    return q.float().reshape(*words.shape[:-1], -1)


def _wrong_no_flip(words, signed=True):
    """Subtracted 2**23 + 8 for signed codes without first flipping the nibbles' top bits."""
    words = _as_words(words)
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    bits = ((words[..., None] >> shifts) & 0xF) | 0x4B000000
    f = bits.view(torch.float32) - (8388608.0 + (8.0 if signed else 0.0))
    return f.reshape(*words.shape[:-1], -1)


def _wrong_forgot_the_eight(words, signed=True):
    """Flipped the top bits (codes + 8) but subtracted only 2**23: signed codes come back + 8."""
    words = _as_words(words)
    if signed:
        words = words ^ -0x77777778
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    bits = ((words[..., None] >> shifts) & 0xF) | 0x4B000000
    return (bits.view(torch.float32) - 8388608.0).reshape(*words.shape[:-1], -1)


def _wrong_magic_one(words, signed=True):
    """Used the bits of 1.0 (0x3F800000): the code lands in the last mantissa bits, 1 + u * 2**-23."""
    words = _as_words(words)
    if signed:
        words = words ^ -0x77777778
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    bits = ((words[..., None] >> shifts) & 0xF) | 0x3F800000
    f = bits.view(torch.float32) - 1.0 - (8.0 if signed else 0.0)
    return f.reshape(*words.shape[:-1], -1)


register(Exercise(
    id="09.unpack_int4_bits",
    title="unpack INT4 codes from 32-bit words with the exponent-bias trick",
    reference=unpack_int4_bits_reference,
    cases=_unpack_cases,
    hint=["A float32 with exponent bits for 2**23 has a mantissa step of exactly 1: what is the "
          "float whose bits are 0x4B000000 | u for a 4-bit u? And how does a signed nibble "
          "(two's complement) become 0..15 without a branch?",
          "Nibble j of a word sits in bits 4j..4j+3 (element j, lowest first). XOR the word "
          "with 0x88888888 (-0x77777778 as an int32) when signed; that adds 8 to each code.",
          "shifts = torch.arange(0, 32, 4, dtype=torch.int32); bits = ((words[..., None] >> "
          "shifts) & 0xF) | 0x4B000000; bits.view(torch.float32) - (8388608.0 + 8 if signed "
          "else 8388608.0); reshape to (..., 8 * W)"],
    wrong=[_wrong_high_nibble_first, _wrong_no_flip, _wrong_forgot_the_eight, _wrong_magic_one],
    rtol=0.0, atol=0.0,
))
