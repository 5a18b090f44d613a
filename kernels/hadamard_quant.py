"""A fast Walsh-Hadamard transform fused with per-token INT4 quantization (lesson 16).

What you will learn
-------------------
* Why fuse: QuaRot's online rotation (the ``down_proj`` input, 1536 = 12 x 128 wide on
  SmolLM2; the queries and keys per head, 64) is followed at once by 4-bit quantization of the
  same activations. Done apart, the rotated activations go to memory and come back; fused,
  each token is read once (16 bits a value) and written once as 4-bit codes plus one scale.
  Both steps do little arithmetic per byte, so the measure of the kernel is the bandwidth it
  achieves against the read + write bytes (:func:`benchmark`), and the question the compiled
  code answers (``kernels.compile_check``) is whether its instructions fit in the time those
  bytes take.
* A token as chunks. n = P x 2^k (:func:`layout`, as ``course_lib.hadamard.factor`` splits
  it: 1536 = 12 x 128, 640 = 20 x 32, 64 = 64); a token is P chunks of 2^k consecutive values,
  the Paley index outermost, as ``course_lib.hadamard.hadamard`` builds kron(paley, sylvester). The kernel loads each chunk of a block of tokens as its own
  (BLOCK_M, 2^k) tile (Triton's tiles must be powers of two; 12 is not, so there is no
  (12, 2^k) tile: a tuple of 12 tiles instead).
* The 2^k part in registers: k rounds of butterflies (a, b) -> (a + b, a - b), each a reshape
  that puts the partners (i, i + h) on an axis of size 2, then ``tl.split`` / ``tl.join`` or
  two sums over that axis (a warp shuffle when the partners sit in different threads). The
  same additions in the same order as ``course_lib.hadamard.butterflies_``: bit for bit the
  host's numbers.
* The Paley part without multiplications: each output chunk is a signed sum of the 12 input
  chunks, the signs read at compile time from one integer (bit 12 r + k set where
  H[r, k] = -1), 11 additions per value; all 12 chunks of a value sit in the same thread, so
  nothing moves between threads.
* The quantizer of ``course_lib.quant`` (lesson 02) on y = z / sqrt(n): scale = max|y| / 7,
  computed with the reference's two IEEE divisions (``div_rn``) so it matches bit for bit; an
  all-zero token gets scale 1. The codes come from z x (7 / max|z|), one multiplication a
  value, rounded half to even by adding 1.5 x 2^23 and reading the low mantissa bits as an
  integer (no float-to-int instruction, no clamp: |z| x 7 / max|z| rounds to at most 7). That
  differs from round(y / scale) only where y / scale lies within float rounding of a tie
  k + 1/2 (the tests check every difference is one). Codes come back as int8 in -7..7 (what
  ``course_lib.quant`` gives, so a lesson compares them directly) or with ``pack=True`` two
  per byte, element 2i in the low nibble (``course_lib.quant.pack_int4``'s layout): half the
  bytes written, and the form an INT4 tensor-core GEMM reads.

Where the design comes from: Dao-AILab/fast-hadamard-transform keeps a row in registers, runs
the power-of-two butterflies on the inner index, the last ones with warp shuffles, and mixes
12 chunks with generated signed sums, the 12 index outermost (``csrc/
fast_hadamard_transform_cuda.cu``, ``fast_hadamard_transform_12N_kernel_traits``, commit
0902fc6; ``hadamard_mult_thread_12`` in ``csrc/fast_hadamard_transform_special.h``, generated
by ``csrc/code_gen.py``, commit 1184a6b). QuaRot (spcl/QuaRot, commit 0f6acd8) runs the same
transform (``quarot/functional/hadamard.py``, ``matmul_hadU_cuda``: Dao's kernel on a (K, n/K)
view, then ``hadK @``) and the quantizer (``quarot/nn/quantization.py``: scale = max|x| / 7 in
fp16; ``quarot/kernels/quant.cu``: packed int4 codes) as separate kernels; this file fuses
them. HadaCore (arXiv 2412.08832) runs the power-of-two part as 16 x 16 matmuls on fp16/bf16
tensor cores, rounding to 16 bits between stages; here every stage stays in fp32, which keeps
the codes reproducible on a CPU.

Sizes: 2^k, 12 x 2^k and 20 x 2^k up to 16384 values a token: 64, 768, 1536, 640 (the
bundled model's FFN), ... Anything else is refused with a message that names these
(:func:`layout`), 576 = 12 x 12 x 4 (SmolLM2's hidden size) included: with two Paley factors a
token is 144 chunks, and written out that way the kernel needs 255 registers and 12 minutes
of compiling (sm_90); QuaRot rotates the hidden size offline only (R1, fused into the
weights), so no online transform of 576 runs. NaN or inf
in a token: its scale is NaN and its codes 0, so whatever consumes it turns NaN, never a finite
wrong number (the host reference raises instead). A token whose max|y| / 7 is below float32's
smallest normal number (about 1.2e-38) gets scale 1 and codes 0 (the reference raises).

Pseudo-code::

    # one program per block of BLOCK_M tokens; z: P chunks of (BLOCK_M, 2^k), fp32
    z[c] = x[rows, c 2^k : (c + 1) 2^k]
    for h in 1, 2, 4, ..., 2^(k-1):                      # butterflies inside each chunk
        (a, b) = values (i, i + h) ;  (a, b) <- (a + b, a - b)
    z[r] <- sum_k H[r, k] z[k]                           # the Paley factor, adds only
    z <- z * signs                                       # random_signs(n, seed), if a seed
    scale = (max|z| / sqrt(n)) / 7 per token (1 if 0; NaN if NaN / inf)
    q = round_half_even(z * (7 / max|z|)) -> int8 in -7..7, or two per byte
"""
from __future__ import annotations

import math

import torch

from kernels._triton import tl, triton  # Triton, or its stand-in where it is not installed

from kernels import INTERPRET, TRITON, TRITON_MISSING, TritonMissing
from kernels._common import ACT_DTYPES, CompileJob, capability, check_device, on_gpu

QMAX = 7                         # symmetric INT4 codes -7..7 (course_lib.quant's convention)
MIN_CC = (7, 5)                  # no tensor-core or FP8 instruction: every GPU Triton supports
MAX_PALEY = 20                   # largest Paley factor: 12, 20 (SmolLM2, the bundled model)
MAX_ROW = 16384                  # one token in one program's registers: 16 warps x 32 values
TILE = 4096                      # values per program (a few tokens)


# ---------------------------------------------------------------------------- kernel

@triton.jit
def _butterflies(t, BM: tl.constexpr, MM: tl.constexpr, LOG_MM: tl.constexpr,
                 SPLIT_STAGES: tl.constexpr):
    """t (BM, MM) -> t @ sylvester(MM), unnormalised: LOG_MM rounds of (a, b) -> (a + b, a - b)
    on the partners (i, i + h), h = 1, 2, 4, ... (``course_lib.hadamard.butterflies_``'s order).

    Each round views t as (BM, MM/2h, 2, h): the partners face each other on axis 2. The first
    SPLIT_STAGES rounds pull the two halves apart (``tl.split``) and put the sum and the
    difference back (``tl.join``): cheap while partners sit in one thread's registers. Later
    rounds, whose partners sit in other threads, reduce over axis 2 instead (``tl.sum``: a
    warp shuffle), once for a + b and once for a - b."""
    for s in tl.static_range(LOG_MM):                        # h = 2^s
        v = tl.reshape(t, (BM, MM // (2 << s), 2, 1 << s))   # (BM, MM/2h, 2, h): partners on axis 2
        if s < SPLIT_STAGES:
            a, b = tl.split(tl.permute(v, (0, 1, 3, 2)))      # (BM, MM/2h, h) each
            v = tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2))
        else:
            first = (tl.arange(0, 2) == 0)[None, None, :, None]   # a's place on axis 2
            plus = tl.sum(v, axis=2)[:, :, None, :]                 # a + b
            minus = tl.sum(tl.where(first, v, -v), axis=2)[:, :, None, :]   # a - b
            v = tl.where(first, plus, minus)                 # (BM, MM/2h, 2, h)
        t = tl.reshape(v, (BM, MM))                           # (BM, MM)
    return t


@triton.jit
def _paley(xs, P: tl.constexpr, NEG: tl.constexpr):
    """H_P @ (the P chunks of xs): output chunk r = sum_k H[r, k] xs[k]. NEG has bit r P + k
    set where H[r, k] = -1, read at compile time: each output is P - 1 additions or
    subtractions of whole chunks, no multiplication (as Dao-AILab's
    ``hadamard_mult_thread_12``). Returns the P new chunks, in order."""
    ys = ()
    for r in tl.static_range(P):
        acc = xs[0]
        if (NEG >> (r * P)) & 1:
            acc = -acc
        for k in tl.static_range(1, P):
            if (NEG >> (r * P + k)) & 1:
                acc = acc - xs[k]
            else:
                acc = acc + xs[k]
        ys = ys + (acc,)                                             # chunk r
    return ys


@triton.jit
def hadamard_quant_int4_kernel(
    x_ptr,        # activations, (M, n) with unit stride along n, fp16/bf16/fp32
    signs_ptr,    # random sign flips, (n,) fp32 +-1 (read only when HAS_SIGNS)
    q_ptr,        # output codes: (M, n) int8, or (M, n / 2) uint8 when PACK
    s_ptr,        # output scales, (M,) fp32
    M,            # tokens
    stride_xm,    # elements between tokens of x
    stride_qm,    # elements between tokens of q
    sqrt_n,       # sqrt(n) rounded to fp32 (the normalisation, divided as torch divides)
    P: tl.constexpr,         # the Paley factor (1: none): chunks per token, outermost
    NEG: tl.constexpr,       # its sign pattern: bit r P + k set where H[r, k] = -1
    MM: tl.constexpr,        # the power-of-two part 2^k, innermost: one chunk of a token
    LOG_MM: tl.constexpr,    # k
    BLOCK_M: tl.constexpr,   # tokens per program
    HAS_SIGNS: tl.constexpr,  # multiply by signs after the transform
    PACK: tl.constexpr,      # two codes per byte, element 2i in the low nibble
    SPLIT_STAGES: tl.constexpr,   # butterfly rounds done with split / join (in-thread)
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)                        # (BLOCK_M,)
    row_ok = (rows < M)[:, None]                                        # (BLOCK_M, 1)
    j = tl.arange(0, MM)[None, :]                                       # (1, MM)
    x_row = x_ptr + rows.to(tl.int64)[:, None] * stride_xm              # (BLOCK_M, 1)
    zs = ()                                                             # P chunks (BLOCK_M, MM)
    for c in tl.static_range(P):                                        # load, 2^k part
        xc = tl.load(x_row + c * MM + j, mask=row_ok, other=0.0).to(tl.float32)
        zs = zs + (_butterflies(xc, BLOCK_M, MM, LOG_MM, SPLIT_STAGES),)
    if P > 1:
        zs = _paley(zs, P, NEG)                                         # across the chunks
    if HAS_SIGNS:                                                       # exact: +-1
        zs2 = ()
        for c in tl.static_range(P):
            zs2 = zs2 + (zs[c] * tl.load(signs_ptr + c * MM + j),)
        zs = zs2
    mag = tl.abs(zs[0])                                                 # (BLOCK_M, MM)
    for c in tl.static_range(1, P):
        mag = tl.maximum(mag, tl.abs(zs[c]))                            # elementwise first
    amax = tl.max(mag, axis=1)                                          # (BLOCK_M,) max |z|
    # scale = max|y| / 7 with y = z / sqrt(n), rounded as the reference rounds it. A NaN or
    # inf anywhere in a token reaches every z of it (each z sums all of x): z turns NaN, which
    # a GPU's max skips, so one chunk's sum is checked too; or +-inf, which the max sees
    probe = tl.sum(zs[0], axis=1)                                       # (BLOCK_M,)
    finite = (amax <= 3.4028234663852886e38) & (probe == probe)        # False for NaN and inf
    scale = tl.math.div_rn(tl.math.div_rn(amax, sqrt_n), 7.0)           # (BLOCK_M,)
    normal = scale >= 1.1754943508222875e-38                            # else a 0 (or ~0) token
    mult = tl.where(normal, 7.0 / tl.where(normal, amax, 1.0), 0.0)      # 7 / max|z|, approx.
    tl.store(s_ptr + rows, tl.where(finite, tl.where(normal, scale, 1.0), float("nan")),
             mask=rows < M)
    mult = tl.where(finite, mult, 0.0)[:, None]                         # (BLOCK_M, 1)
    keep = finite[:, None]                                              # (BLOCK_M, 1)
    q_row = q_ptr + rows.to(tl.int64)[:, None] * stride_qm              # (BLOCK_M, 1)
    for c in tl.static_range(P):
        # |z| x 7 / max|z| <= 7 (1 + 2^-22): it rounds to at most 7, no clamp needed
        v = tl.where(keep, zs[c] * mult, 0.0)                           # (BLOCK_M, MM)
        # round half to even into the low mantissa bits (1.5 x 2^23), then read them as an
        # integer: no float-to-int conversion (a slow instruction on a GPU)
        code = (v + 12582912.0).to(tl.int32, bitcast=True) - 0x4B400000   # -7..7
        if PACK:
            lo, hi = tl.split(tl.reshape(code, (BLOCK_M, MM // 2, 2)))  # elements 2i, 2i + 1
            byte = ((lo & 15) | ((hi & 15) << 4)).to(tl.uint8)          # (BLOCK_M, MM/2)
            tl.store(q_row + c * (MM // 2) + tl.arange(0, MM // 2)[None, :], byte, mask=row_ok)
        else:
            tl.store(q_row + c * MM + j, code.to(tl.int8), mask=row_ok)


# ---------------------------------------------------------------------------- sizes

def _negative_bits(p: int) -> int:
    """The sign pattern of paley(p - 1) as one integer: bit r p + k set where H[r, k] = -1 (the
    kernel reads it at compile time); 0 for p = 1."""
    from course_lib.hadamard import paley

    if p == 1:
        return 0
    H = paley(p - 1)
    return sum(1 << (r * p + k) for r in range(p) for k in range(p) if H[r, k] < 0)


def layout(n: int) -> dict:
    """How the kernel splits a token of n values, or a ValueError naming the sizes it takes.

    n = P x MM with MM = 2^k and P a Paley order (1: none) as ``course_lib.hadamard.factor``
    splits n (1536 -> 12 x 128, 640 -> 20 x 32, 64 -> 64): a token is P chunks of MM
    consecutive values; NEG is the Paley matrix's sign pattern (:func:`_negative_bits`)
    (lesson 16).
    """
    from course_lib.hadamard import factor

    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be a whole number >= 2 (the width of a token); got {n!r}")
    sizes = (f"n = 2^k, 12 x 2^k and 20 x 2^k up to {MAX_ROW} values (64, 768, 1536, 640, "
             f"...); SmolLM2's online rotations need 1536 (the down_proj input) and 64 (a "
             f"query or key head)")
    try:
        orders, mm = factor(n)
    except ValueError as err:
        raise ValueError(f"no Hadamard transform of size {n} in this kernel: it takes {sizes}. "
                         f"({err})") from None
    if len(orders) > 1 or any(p > MAX_PALEY for p in orders) or n > MAX_ROW:
        split = " x ".join(map(str, orders + (mm,)))
        why = ""
        if len(orders) > 1:
            why = (" Two Paley factors (576 = 12 x 12 x 4, SmolLM2's hidden size) would make "
                   "144 chunks a token: written out that way the kernel takes 255 registers and "
                   "12 minutes to compile. No online rotation of that size runs in QuaRot: R1 "
                   "on the residual stream is fused into the weights "
                   "(course_lib.rotate.rotate_residual).")
        raise ValueError(f"n = {n} = {split} is not a size this kernel takes: it takes {sizes}."
                         f"{why} Use course_lib.hadamard.fwht (plain torch) for it")
    p = orders[0] if orders else 1
    return dict(P=p, NEG=_negative_bits(p), MM=mm, LOG_MM=mm.bit_length() - 1)


def block_rows(n: int) -> int:
    """Tokens per program: the largest power of two whose tokens hold at most ``TILE`` values
    (at least 1), and enough that one chunk spans a warp (32 values; n = 12: 32 tokens)."""
    mm = layout(n)["MM"]
    bm = 1
    while 2 * bm * n <= TILE:
        bm *= 2
    while bm * mm < 32:
        bm *= 2
    return bm


def num_warps_for(n: int) -> int:
    """Warps per program on a GPU: about 32 values a thread (a 1024-value chunk tile needs no
    more), never more threads than a chunk (BLOCK_M x MM) has values, at most 16."""
    bm, mm = block_rows(n), layout(n)["MM"]
    w = 1
    while 2 * w <= min(16, bm * mm // 32, max(1, bm * n // 1024)):
        w *= 2
    return w


# ---------------------------------------------------------------------------- wrappers

def hadamard_quant_supported() -> tuple[bool, str]:
    """(True, why) when the kernel can run here; the interpreter counts as yes."""
    return capability(INTERPRET, MIN_CC,
                      "Triton interpreter on the CPU: exact codes, emulated, never timed",
                      "Triton needs compute capability 7.5 or higher")


def require_kernel() -> None:
    """Raise a clear error when the kernel cannot launch here (no Triton, no GPU and no
    interpreter), saying what to use instead."""
    ok, why = hadamard_quant_supported()
    if not ok and not TRITON and why == TRITON_MISSING:
        raise TritonMissing(f"the Hadamard + INT4 kernel cannot launch: {why}")
    if not ok:
        raise RuntimeError(f"Hadamard + INT4 kernel refused: {why}. Use "
                           f"kernels.hadamard_quant.hadamard_quant_int4_reference (plain torch, "
                           f"the same codes)")


def _check_x(x) -> tuple[torch.Tensor, int]:
    """x (..., n) fp16/bf16/fp32 -> (x as a contiguous (M, n) matrix, n), or a clear error."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor of activations (..., n); got {type(x).__name__}")
    if x.dtype not in ACT_DTYPES:
        raise TypeError(f"x has dtype {x.dtype}; the kernel reads float16, bfloat16 or float32 "
                        f"activations (convert with x.float() or x.to(torch.bfloat16))")
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (tokens along the last one); got a "
                         "scalar")
    n = x.shape[-1]
    layout(n)                                          # refuses a size the kernel does not take
    return x.reshape(-1, n).contiguous(), n           # (M, n)


def _check_seed(seed) -> None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"seed must be None (no sign flips) or a whole number (the signs "
                         f"course_lib.hadamard.random_signs(n, seed) draws); got {seed!r}")


def _check_pack(pack, n: int) -> None:
    if not isinstance(pack, bool):
        raise ValueError(f"pack must be True or False; got {pack!r}")
    if pack and layout(n)["MM"] < 2:
        raise ValueError(f"pack=True puts elements 2i and 2i + 1 in one byte, which needs the "
                         f"power-of-two part of n to be at least 2; n = {n} has none: use "
                         f"pack=False")


_CONSTANTS: dict = {}


def _constant(key, make):
    """A small tensor made once per key (Paley blocks, signs, a dummy pointer)."""
    if key not in _CONSTANTS:
        _CONSTANTS[key] = make()
    return _CONSTANTS[key]


def _signs(n: int, seed, device) -> torch.Tensor:
    from course_lib.hadamard import random_signs

    if seed is None:
        return _constant(("dummy", str(device)),
                         lambda: torch.zeros(1, dtype=torch.float32, device=device))
    return _constant(("signs", n, seed, str(device)),
                     lambda: random_signs(n, seed).to(device))


def split_stages(n: int) -> int:
    """Butterfly rounds done by ``tl.split`` / ``tl.join`` (the rest by reductions over the
    pair axis): all of them when a program holds at most 2 tokens, none otherwise. Chosen from
    the compiled code (``kernels.compile_check``, sm_90, SASS instructions per byte moved): at
    1536 (2 tokens a program) split / join 13.6 against 15.7 by reductions; at 64 (64 tokens a
    program, where Triton moves the split halves between threads with many shuffles) 43
    against 15."""
    return layout(n)["LOG_MM"] if block_rows(n) <= 2 else 0


def _constexprs(n: int, block_m: int, has_signs: bool, pack: bool) -> dict:
    """The kernel's compile-time arguments for tokens of n values."""
    lay = layout(n)
    return dict(P=lay["P"], NEG=lay["NEG"], MM=lay["MM"], LOG_MM=lay["LOG_MM"], BLOCK_M=block_m,
                HAS_SIGNS=has_signs, PACK=pack, SPLIT_STAGES=split_stages(n))


def hadamard_quant_int4(x: torch.Tensor, seed: int | None = None, *, pack: bool = False
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate each token by a Hadamard transform and quantize it to INT4, one kernel (lesson 16).

    x: (..., n) fp16/bf16/fp32, n a size :func:`layout` takes (1536, 64, 640, 2^k, 12 x 2^k,
    ...). The rotation is ``course_lib.rotate.OnlineHadamard(n, seed)``: y = fwht(x) (times
    ``random_signs(n, seed)`` when a seed is given), kept in fp32 (never rounded to x's dtype).
    Returns (codes, scale): codes (..., n) int8 in -7..7, or (..., n / 2) uint8 two per byte
    with ``pack=True`` (``course_lib.quant.pack_int4``'s layout); scale (...,) fp32, max|y| / 7
    per token, 1 for an all-zero token, NaN for a token holding NaN or inf (its codes are 0).
    y is approximately codes * scale[..., None].
    """
    require_kernel()
    x2, n = _check_x(x)                                                 # (M, n)
    _check_seed(seed)
    _check_pack(pack, n)
    check_device(x2)
    M, dev = x2.shape[0], x2.device
    q = torch.empty((M, n // 2 if pack else n), dtype=torch.uint8 if pack else torch.int8,
                    device=dev)                                         # (M, n) or (M, n/2)
    s = torch.empty((M,), dtype=torch.float32, device=dev)              # (M,)
    if M:
        bm = block_rows(n)
        launch = {"num_warps": num_warps_for(n), "num_stages": 1} if on_gpu() else {}
        hadamard_quant_int4_kernel[(triton.cdiv(M, bm),)](
            x2, _signs(n, seed, dev), q, s, M, x2.stride(0), q.stride(0), float(math.sqrt(n)),
            **_constexprs(n, bm, seed is not None, pack), **launch)
    lead = tuple(x.shape[:-1])
    return q.reshape(*lead, q.shape[-1]), s.reshape(lead)


def dequantize_int4(codes: torch.Tensor, scale: torch.Tensor, pack: bool = False) -> torch.Tensor:
    """codes * scale per token, fp32 (..., n): the rotated activations the codes stand for
    (``pack=True``: codes two per byte, as :func:`hadamard_quant_int4` packs them)."""
    from course_lib import quant

    if not isinstance(codes, torch.Tensor) or codes.dtype != (torch.uint8 if pack else torch.int8):
        raise TypeError(f"codes must be {'uint8 (packed)' if pack else 'int8'} as "
                        f"hadamard_quant_int4(x, pack={pack}) returns them; got "
                        f"{getattr(codes, 'dtype', type(codes).__name__)}")
    if not isinstance(scale, torch.Tensor) or tuple(scale.shape) != tuple(codes.shape[:-1]):
        raise ValueError(f"scale must hold one value per token, shape {tuple(codes.shape[:-1])}; "
                         f"got {tuple(getattr(scale, 'shape', ()))}")
    q = quant.unpack_int4(codes) if pack else codes                    # (..., n) int8
    return q.float() * scale.float()[..., None]


# ---------------------------------------------------------------------------- reference

def rotate_reference(x: torch.Tensor, seed: int | None = None) -> torch.Tensor:
    """The rotated activations in plain torch, fp32: fwht(x.float()) [* random_signs(n, seed)],
    (..., n) (float64 input stays float64). What the kernel quantizes."""
    from course_lib.hadamard import fwht, random_signs

    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a floating-point torch.Tensor; got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    _check_seed(seed)
    y = fwht(x if x.dtype == torch.float64 else x.float())             # (..., n)
    if seed is not None:
        y = y * random_signs(x.shape[-1], seed, y.dtype).to(y.device)
    return y


def hadamard_quant_int4_reference(x: torch.Tensor, seed: int | None = None, *,
                                  pack: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`hadamard_quant_int4` in plain torch: ``course_lib.hadamard.fwht`` in fp32, then
    ``course_lib.quant.quantize(y, "int4", "per_token")`` (and ``pack_int4``) (lesson 16).

    Same outputs as the kernel; the codes are equal except where y / scale sits within float
    rounding of a tie k + 0.5 (the kernel's 12 x 12 matmul adds in another order than torch's).
    Refuses NaN / inf (ValueError), where the kernel returns a NaN scale.
    """
    from course_lib import quant

    x2, n = _check_x(x)
    _check_seed(seed)
    _check_pack(pack, n)
    y = rotate_reference(x2, seed)                                      # (M, n) fp32
    lead = tuple(x.shape[:-1])
    if y.shape[0] == 0:
        q = torch.empty((0, n // 2 if pack else n), dtype=torch.uint8 if pack else torch.int8)
        return q.reshape(*lead, q.shape[-1]).to(x.device), torch.empty(lead, device=x.device)
    qt = quant.quantize(y, "int4", "per_token")
    q = quant.pack_int4(qt.q) if pack else qt.q
    return q.reshape(*lead, q.shape[-1]), qt.scale.float().reshape(lead)


# ---------------------------------------------------------------------------- benchmark

#: (tokens, n): SmolLM2's down_proj input at a 4096-token prefill and four times that, its
#: query heads (9 per token) at 4096 tokens, and a power of two as wide as Llama's hidden size
BENCH_SHAPES = ((4096, 1536), (16384, 1536), (4096 * 9, 64), (4096, 4096))


def bytes_moved(tokens: int, n: int, dtype: torch.dtype = torch.bfloat16,
                pack: bool = False) -> dict:
    """The bytes the fused kernel must move at least: read x once, write the codes and one
    fp32 scale per token (the Paley blocks and signs are a few KB, left out)."""
    if dtype not in ACT_DTYPES:
        raise TypeError(f"dtype must be one of {ACT_DTYPES}; got {dtype}")
    read = tokens * n * torch.empty(0, dtype=dtype).element_size()
    written = tokens * (n // 2 if pack else n) + tokens * 4
    return {"read": read, "written": written, "total": read + written}


def benchmark(shapes=BENCH_SHAPES, dtype: torch.dtype = torch.bfloat16) -> list[dict]:
    """Achieved bandwidth of the fused kernel on a GPU: (read + write bytes) / median time,
    against the GPU's datasheet bandwidth and a plain copy of x measured here (lesson 16).

    Per shape, int8 codes and packed codes: ``ms``, ``gbps``, ``of_datasheet`` (fraction of
    the catalogue's bandwidth, None for a GPU not in ``course_lib.hardware``), ``of_copy``
    (fraction of what ``x.clone()`` achieves: the bandwidth a memory-bound op can reach), and
    ``unfused_ms``: the plain-torch reference (``fwht`` + ``quant.quantize``), the unfused way.
    Refuses on a CPU and in the interpreter (never time it)."""
    from course_lib import bench, hardware
    from course_lib.device import require_gpu

    require_gpu("kernels.hadamard_quant.benchmark")
    if INTERPRET:
        raise RuntimeError("never time the Triton interpreter (TRITON_INTERPRET=1): unset it "
                           "to benchmark the native kernel on this GPU")
    require_kernel()
    gpu = hardware.catalogue_gpu(torch.cuda.get_device_name(0))
    peak_gbps = gpu.bandwidth_tbps * 1e3 if gpu else None
    rows = []
    for tokens, n in shapes:
        x = torch.randn(tokens, n, device="cuda", dtype=dtype)          # (tokens, n)
        copy_ms = bench.time_gpu(lambda: x.clone())
        copy_gbps = 2 * x.numel() * x.element_size() / (copy_ms * 1e-3) / 1e9
        unfused_ms = bench.time_gpu(lambda: hadamard_quant_int4_reference(x))
        for pack in (False, True):
            ms = bench.time_gpu(lambda: hadamard_quant_int4(x, pack=pack))
            moved = bytes_moved(tokens, n, dtype, pack)
            gbps = moved["total"] / (ms * 1e-3) / 1e9
            rows.append(dict(tokens=tokens, n=n, dtype=str(dtype).replace("torch.", ""),
                             pack=pack, bytes=moved, ms=ms, gbps=round(gbps, 1),
                             copy_gbps=round(copy_gbps, 1), of_copy=round(gbps / copy_gbps, 3),
                             datasheet_gbps=peak_gbps,
                             of_datasheet=round(gbps / peak_gbps, 3) if peak_gbps else None,
                             unfused_ms=unfused_ms, speedup_vs_unfused=round(unfused_ms / ms, 2),
                             gpu=torch.cuda.get_device_name(0)))
    return rows


# ---------------------------------------------------------------------------- compile check

#: (n, pack) compiled by default: SmolLM2's online sizes (1536 for down_proj, 64 per head,
#: packed as a 4-bit KV cache would store keys) and the bundled model's FFN (640 = 20 x 32)
COMPILE_SIZES = ((1536, False), (1536, True), (64, True), (640, False))


def compile_jobs(arch: int, all_configs: bool = False):
    """What ``kernels.compile_check`` compiles for this file (``KERNEL_MODULES``): the kernel at
    ``COMPILE_SIZES`` (every size, bf16 activations; fp16 below sm_80), as the wrapper launches
    it; ``all_configs`` adds fp32 and fp16 activations and the random signs. No tensor-core or
    FP8 instruction: expected to compile on every architecture."""
    acts = ["*bf16", "*fp16", "*fp32"] if all_configs else ["*fp16" if arch < 80 else "*bf16"]
    jobs = []
    for act in acts:
        for n, pack in COMPILE_SIZES:
            for signs in ((False, True) if all_configs else (False,)):
                sig = dict(x_ptr=act, signs_ptr="*fp32", q_ptr="*u8" if pack else "*i8",
                           s_ptr="*fp32", M="i32", stride_xm="i32", stride_qm="i32",
                           sqrt_n="fp32")
                name = f"hadamard_quant {n}" + (" packed" if pack else "") + (" signs" if signs else "")
                jobs.append(CompileJob(name, hadamard_quant_int4_kernel, sig,
                                       _constexprs(n, block_rows(n), signs, pack),
                                       num_warps=num_warps_for(n), num_stages=1, min_cc=0,
                                       rows=block_rows(n), default=act != "*fp32" and not signs,
                                       notes={"n": n, "pack": pack}))
    return jobs
