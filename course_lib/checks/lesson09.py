"""Lesson 09 exercises: a W8A16 GEMV kernel in Triton (one program for the whole small
batch), arithmetic intensity, unpacking INT4 with the exponent-bias bit trick in fp32, and the
16-bit magic-number unpacking of the rebuilt kernels (Marlin's trick).

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
        _gemv_case(3, 20, 40, torch.float32, "batch 3: one program serves every token", 3),
        _gemv_case(8, 17, 33, torch.float32, "batch 8, the most a GEMV takes; tails in N and K", 7),
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


def _wrong_first_token_only(x, w_q, scale):
    """Kept a one-program-per-token kernel (row m = program_id(1)) under the whole-batch grid:
    only token 0 is computed, the other rows stay as torch.empty left them (zeros here)."""
    y = torch.zeros(x.shape[0], w_q.shape[0])
    y[0] = x.float()[0] @ (w_q.float() * scale[:, None]).T
    return y.to(x.dtype)


def _wrong_sum_over_batch(x, w_q, scale):
    """Reduced the (BLOCK_M, BLOCK_N, BLOCK_K) products over the batch axis too: every token
    gets the sum of all the tokens' outputs."""
    y = x.float() @ (w_q.float() * scale[:, None]).T                     # (M, N)
    return y.sum(dim=0, keepdim=True).expand_as(y).to(x.dtype)


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
    title="a W8A16 GEMV kernel in Triton, one program for the whole small batch",
    reference=w8a16_gemv_reference,
    cases=_gemv_cases,
    hint=["One program owns a block of outputs for every token of the batch: which tiles does "
          "it load at each step of K, how often is each weight converted, and what guards the "
          "loads past the last full block of N, of K and of the batch? Where must the scale go?",
          "Loop k0 over K in steps of BLOCK_K; load the (BLOCK_M, BLOCK_K) tile of x (mask "
          "offs_m < M and offs_k < K) and the (BLOCK_N, BLOCK_K) int8 tile (mask offs_n < N and "
          "offs_k < K, other=0); convert the weights once; keep a (BLOCK_M, BLOCK_N) fp32 sum.",
          "acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2) with both in fp32; after the "
          "loop acc * scale[offs_n][None, :], cast to y_ptr.dtype.element_ty, store with mask "
          "(offs_m < M)[:, None] & (offs_n < N)[None, :]"],
    wrong=[_wrong_scale_per_column, _wrong_no_tail_mask, _wrong_int8_accumulator,
           _wrong_output_dtype, _wrong_scale_in_loop, _wrong_first_token_only,
           _wrong_sum_over_batch],
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
        Case((1, 4096, 4100, 4), {"group_size": 128}, label="K = 4100: groups of 128 do not "
             "divide it", raises=ValueError),
        Case((0, 4096, 4096, 16), label="no tokens", raises=ValueError),
        Case((1, 4096, 4096, 0), label="0 bits per weight", raises=ValueError),
        Case((1, 4096, 4096, 4), {"group_size": 0}, label="group size 0", raises=ValueError),
        Case((1, 4096, 4096, float("nan")), label="NaN bits per weight", raises=ValueError),
        Case((1, 4096, 4096, -4), label="negative bits per weight", raises=ValueError),
    ]


def _bytes_wrong(M, N, K, weight_bits, group_size, *, factor=2, bits_as_bytes=False,
                 scales=True, acts=True):
    w = N * K * (weight_bits if bits_as_bytes else weight_bits / 8)
    s = N * (K / group_size) * 2 if (group_size and scales) else 0
    a = (M * K + M * N) * 2 if acts else 0
    if min(M, N, K) < 1 or not weight_bits > 0:
        raise ValueError("M, N, K and weight_bits must be positive")
    return factor * M * N * K / (w + s + a)


def _wrong_no_checks(M, N, K, weight_bits=16, group_size=None):
    """Right sum, but accepts 0, NaN or negative bits and a group size that does not divide K."""
    if min(M, N, K) < 1:
        raise ValueError("M, N and K must be positive")
    s = N * (K / group_size) * 2 if group_size else 0
    return 2 * M * N * K / (N * K * weight_bits / 8 + s + 2 * M * K + 2 * M * N)


def _wrong_groups_rounded_up(M, N, K, weight_bits=16, group_size=None):
    """Counted ceil(K / group_size) scales and accepted a group size that does not divide K."""
    import math

    if min(M, N, K) < 1 or not weight_bits > 0 or (group_size is not None and group_size < 1):
        raise ValueError("M, N, K, weight_bits and group_size must be positive")
    s = N * math.ceil(K / group_size) * 2 if group_size else 0
    return 2 * M * N * K / (N * K * weight_bits / 8 + s + 2 * M * K + 2 * M * N)


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
          "refuse M, N or K below 1, bits that are not a positive number, and a group size "
          "that is not a positive divisor of K.",
          "2*M*N*K / (N*K*weight_bits/8 + N*(K/group_size)*2 + 2*M*K + 2*M*N); the scale term "
          "only when group_size is given"],
    wrong=[_wrong_flops_without_two, _wrong_bits_as_bytes, _wrong_no_scales, _wrong_weights_only,
           _wrong_no_checks, _wrong_groups_rounded_up],
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
        Case((torch.zeros(2, 0, dtype=torch.int32), True), label="no words: an empty (2, 0) result"),
        Case((torch.tensor([-1, 2 ** 31 - 1, -2 ** 31], dtype=torch.int32), True),
             label="words with the sign bit set: an arithmetic shift must not leak into nibble 7",
             hint="On int32 words, >> keeps the sign bit: is each nibble masked with & 0xF after "
                  "the shift?"),
        Case((torch.arange(8, dtype=torch.uint8), True), label="uint8 bytes, not int32 words",
             raises=TypeError),
        Case((torch.arange(8, dtype=torch.int64), True), label="int64, not int32 words",
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


def _wrong_returns_float64(words, signed=True):
    """Right values in float64 (subtracted a Python float from an upcast array), not float32."""
    return unpack_int4_bits_reference(words, signed).double()


def _wrong_no_mask_top_nibble(words, signed=True):
    """Left out `& 0xF` for the top nibble (shift by 28 only): an arithmetic shift of a
    negative word keeps the sign bits there."""
    words = _as_words(words)
    if signed:
        words = words ^ -0x77777778
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    u = (words[..., None] >> shifts)
    u = torch.where(shifts == 28, u, u & 0xF)
    f = (u | 0x4B000000).view(torch.float32) - (8388608.0 + (8.0 if signed else 0.0))
    return f.reshape(*words.shape[:-1], -1)


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
    wrong=[_wrong_high_nibble_first, _wrong_no_flip, _wrong_forgot_the_eight, _wrong_magic_one,
           _wrong_returns_float64, _wrong_no_mask_top_nibble],
    rtol=0.0, atol=0.0,
))


# ---------------------------------------------------------------------------- 09.magic_unpack16

MAGIC16 = {torch.bfloat16: 0x4300, torch.float16: 0x6400}   # the bits of 128.0 and 1024.0
BIAS16 = {torch.bfloat16: 128.0, torch.float16: 1024.0}


def magic_unpack16_reference(words, dtype=torch.bfloat16):
    """int32 words (..., W) of 8 offset-binary codes (u = q + 8, element j in bits 4j..4j+3)
    -> (..., 8W) signed codes q in ``dtype`` (bf16 or fp16), by plain integer arithmetic:
    the independent answer the magic-number unpacking must equal bit for bit (lesson 09)."""
    if not isinstance(words, torch.Tensor) or words.dtype != torch.int32:
        raise TypeError(f"words must be an int32 tensor, got "
                        f"{getattr(words, 'dtype', type(words).__name__)}")
    if dtype not in MAGIC16:
        raise ValueError(f"dtype must be torch.bfloat16 or torch.float16, got {dtype}")
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)                   # (8,)
    u = (words[..., None] >> shifts) & 0xF                               # (..., W, 8) 0..15
    return (u - 8).to(dtype).reshape(*words.shape[:-1], -1)              # (..., 8W)


def _offset_words(codes_per_word):
    """Pack rows of 8 codes (-8..7) into int32 words as u = q + 8, element j at bits 4j."""
    q = torch.as_tensor(codes_per_word, dtype=torch.int64)              # (..., 8)
    u = (q + 8) << torch.arange(0, 32, 4)                                # (..., 8)
    w = u.sum(dim=-1)                                                    # (...,) < 2**32
    return torch.where(w >= 2 ** 31, w - 2 ** 32, w).to(torch.int32)


def _every_code_everywhere():
    """16 words: word c holds code c - 8 in every nibble... and 16 more that rotate the 16
    codes through the 8 positions: every code in every position, next to every other code."""
    same = [[c - 8] * 8 for c in range(16)]
    rotated = [[((r + j) % 16) - 8 for j in range(8)] for r in range(16)]
    return _offset_words(same + rotated)                                 # (32,)


def _magic_cases():
    g = torch.Generator().manual_seed(9)
    rand = torch.randint(-2 ** 31, 2 ** 31 - 1, (4, 6), generator=g, dtype=torch.int64)
    return [
        Case((_every_code_everywhere(), torch.bfloat16),
             label="bf16: all 16 codes in all 8 nibble positions"),
        Case((_every_code_everywhere(), torch.float16),
             label="fp16: all 16 codes in all 8 nibble positions"),
        Case((_offset_words([[0, 1, 2, 3, 4, 5, 6, 7]]),), label="codes 0..7 in order, bf16 (the default)"),
        Case((rand.to(torch.int32), torch.bfloat16), label="random words (sign bit set in half of them)"),
        Case((rand.to(torch.int32)[:1, :1], torch.float16), label="a single word, fp16"),
        Case((torch.arange(8, dtype=torch.uint8),), label="uint8 bytes, not int32 words",
             raises=TypeError),
        Case((_offset_words([[0] * 8]), torch.float32), label="float32 asked: the trick is for 16-bit "
             "floats", raises=ValueError),
    ]


def _nibbles(words, order=range(0, 32, 4)):
    if not isinstance(words, torch.Tensor) or words.dtype != torch.int32:
        raise TypeError("words must be int32")
    return (words[..., None] >> torch.tensor(list(order), dtype=torch.int32)) & 0xF


def _as16(bits, dtype):
    if dtype not in MAGIC16:
        raise ValueError("dtype must be bf16 or fp16")
    return bits.to(torch.int16).view(dtype)


def _magic(words, dtype, magic=None, bias=None, order=range(0, 32, 4)):
    u = _nibbles(words, order)
    v = _as16(u | (MAGIC16[dtype] if magic is None else magic), dtype)
    return (v - torch.tensor(BIAS16[dtype] + 8 if bias is None else bias, dtype=dtype)
            ).reshape(*words.shape[:-1], -1)


def _wrong_magic_shift_order(words, dtype=torch.bfloat16):
    """Took the nibbles from the top of the word down (element 0 from bits 28..31)."""
    return _magic(words, dtype, order=range(28, -1, -4))


def _wrong_magic_no_zero_point(words, dtype=torch.bfloat16):
    """Subtracted only 128 (or 1024): the codes come back as u = q + 8, not q."""
    return _magic(words, dtype, bias=BIAS16[dtype])


def _wrong_magic_fp16_constant_in_bf16(words, dtype=torch.bfloat16):
    """Used fp16's 0x6400 whatever the dtype: in a bf16 view those bits are about 1e22."""
    return _magic(words, dtype, magic=0x6400, bias=(1024.0 + 8) if dtype == torch.float16 else 136.0)


def _wrong_magic_bf16_constant_in_fp16(words, dtype=torch.bfloat16):
    """Used bf16's 0x4300 whatever the dtype: in an fp16 view those bits are 3.5 + u / 512."""
    return _magic(words, dtype, magic=0x4300, bias=136.0 if dtype == torch.bfloat16 else 1032.0)


def _wrong_magic_float32_result(words, dtype=torch.bfloat16):
    """Right codes, returned in float32 instead of the 16-bit dtype asked for."""
    return _magic(words, dtype).float()


def _wrong_magic_shift_no_mask(words, dtype=torch.bfloat16):
    """Shifted without masking: the higher nibbles reach the exponent bits."""
    if not isinstance(words, torch.Tensor) or words.dtype != torch.int32:
        raise TypeError("words must be int32")
    u = (words[..., None] >> torch.arange(0, 32, 4, dtype=torch.int32)) & 0xFFFF
    v = _as16(u | MAGIC16[dtype], dtype)
    return (v - torch.tensor(BIAS16[dtype] + 8, dtype=dtype)).reshape(*words.shape[:-1], -1)


def _wrong_magic_twos_complement(words, dtype=torch.bfloat16):
    """Read the nibbles as two's complement (lesson 03's layout) instead of u = q + 8."""
    u = _nibbles(words)
    q = torch.where(u >= 8, u - 16, u)
    return q.to(dtype).reshape(*words.shape[:-1], -1)


register(Exercise(
    id="09.magic_unpack16",
    title="unpack INT4 codes into 16-bit floats with a magic exponent (Marlin's trick)",
    reference=magic_unpack16_reference,
    cases=_magic_cases,
    hint=["Which 16-bit float has a mantissa step of exactly 1, so that its low bits can hold a "
          "4-bit number as is? It differs between bf16 and fp16. And what must you take away "
          "afterwards to land on -8..7?",
          "Shift each word right by 4j and keep four bits; OR in the 16-bit pattern of 128.0 "
          "(bf16) or 1024.0 (fp16); narrow to int16 and reinterpret with .view(dtype); then one "
          "subtraction, in that dtype, removes the exponent's value and the zero point 8.",
          "u = (words[..., None] >> torch.arange(0, 32, 4, dtype=torch.int32)) & 0xF; "
          "(u | 0x4300).to(torch.int16).view(torch.bfloat16) - 136 (fp16: 0x6400 and 1032); "
          "reshape to (..., 8 * W)"],
    wrong=[_wrong_magic_shift_order, _wrong_magic_no_zero_point,
           _wrong_magic_fp16_constant_in_bf16, _wrong_magic_bf16_constant_in_fp16,
           _wrong_magic_float32_result, _wrong_magic_shift_no_mask, _wrong_magic_twos_complement],
    rtol=0.0, atol=0.0, signed_zero=True,
))
