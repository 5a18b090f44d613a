"""INT4 dequantization in the 16-bit domain, from 32-bit words (lessons 09 and 10).

What you will learn
-------------------
* The 16-bit magic number (Marlin's trick, Frantar et al. 2024). An fp16 whose bits are
  ``0x6400 | u`` is exactly 1024 + u for u in 0..15 (1024 = 2**10 and fp16 has 10 mantissa
  bits, so the last 4 bits count units); a bf16 ``0x4300 | u`` is 128 + u (7 mantissa bits
  above 2**7). A 32-bit register holds *two* 16-bit lanes, so one AND-OR (a LOP3) turns two
  nibbles into two exact floats at once, and one packed subtraction (``sub.f16x2`` /
  ``fma.rn.bf16x2``) of 1024 + 8 (or 128 + 8) leaves the signed codes -8..7: the zero point
  of 8 is absorbed in the same instruction. No int-to-float conversion anywhere.
* The kernel layout (``prepack``, done once when the weight is made): the checkpoint keeps
  ``course_lib.quant.pack_int4`` (code 2i low nibble, 2i+1 high, two's complement). The
  kernels want (1) offset-binary codes u = q + 8 (symmetric; asymmetric codes are already
  0..15), so no XOR is left in the loop, and (2) in each group of G codes, byte c holding
  code c in its low nibble and code G/2 + c in its high nibble. A group's bytes then give
  a "low" tile (the group's first half) and a "high" tile (its second half), which meet two
  plain, contiguous loads of x: nothing is reshuffled in registers, and x is used as it is.
* ``tl.inline_asm_elementwise`` on sm_80 and newer (``dequant_pair``, ``USE_ASM=True``):
  four bytes per 32-bit register (pack 4); one PRMT spreads two bytes into the two lanes,
  LOP3 adds the exponent, FMA subtracts. A pure-Triton path (``USE_ASM=False``: the
  interpreter cannot run inline assembly, nor can GPUs before sm_80 run bf16x2) gives the
  same bits. ``emulate_asm`` replays the assembly's bit operations in NumPy so a CPU test
  (and lesson 09's exercise) can check them for all 16 codes in every byte position.

Pseudo-code of one 32-bit register r = bytes (b0, b1, b2, b3), fp16 flavour::

    t0 = prmt(r, 0, 0x4140)                 # (b0, 0, b1, 0): byte 0 -> lane 0, byte 1 -> lane 1
    t1 = prmt(r, 0, 0x4342)                 # (b2, 0, b3, 0)
    lo01 = (t0 & 0x000F000F) | 0x64006400   # lanes 1024 + low nibble of b0, b1
    hi01 = (t0 & 0x00F000F0) | 0x64006400   # lanes 1024 + 16 * high nibble (fp16 only)
    lo01 = lo01 - 1032 (both lanes)         # low codes - 8, exact
    hi01 = hi01 * (1/16) - 72 (both lanes)  # high codes - 8, exact (one FMA)
    (the same for t1; bf16 shifts t right by 4 for the high nibbles: its 7-bit mantissa has
    no room for 16 * u)
"""
from __future__ import annotations

import numpy as np
import torch

from kernels._triton import tl, triton  # Triton, or its stand-in where it is not installed

MAGIC16 = {"float16": 0x6400, "bfloat16": 0x4300}   # 1024.0 and 128.0 as 16-bit patterns
BIAS16 = {"float16": 1032.0, "bfloat16": 136.0}     # the magic number + the zero point 8


# ---------------------------------------------------------------------------- layout

def prepack(packed: torch.Tensor, symmetric: bool = True, group_size: int = 128) -> torch.Tensor:
    """Checkpoint layout (``pack_int4``) -> kernel layout, (N, K/2) uint8 both (lesson 09).

    Codes become offset binary (u = q + 8 when ``symmetric``; asymmetric codes 0..15 stay),
    and in each group of G = ``group_size`` codes, byte c holds code c (low nibble) and code
    G/2 + c (high nibble). Done once per weight; ``unprepack`` inverts it.
    """
    from course_lib import quant

    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8 or packed.dim() != 2:
        raise TypeError("packed must be a 2-D uint8 tensor (N, K/2) from course_lib.quant.pack_int4")
    N, K = packed.shape[0], 2 * packed.shape[1]
    if group_size < 2 or group_size % 2 or K % group_size:
        raise ValueError(f"K = {K} must be a multiple of the (even) group size {group_size}")
    q = quant.unpack_int4(packed, signed=symmetric).to(torch.int16)    # (N, K)
    u = (q + 8 if symmetric else q).to(torch.uint8)                    # (N, K) 0..15
    u = u.reshape(N, K // group_size, 2, group_size // 2)              # (N, groups, lo/hi, G/2)
    return (u[:, :, 0] | (u[:, :, 1] << 4)).reshape(N, K // 2)         # (N, K/2)


def unprepack(kpacked: torch.Tensor, symmetric: bool = True, group_size: int = 128) -> torch.Tensor:
    """Kernel layout -> checkpoint layout: the inverse of ``prepack`` (lesson 09)."""
    from course_lib import quant

    if not isinstance(kpacked, torch.Tensor) or kpacked.dtype != torch.uint8 or kpacked.dim() != 2:
        raise TypeError("kpacked must be a 2-D uint8 tensor (N, K/2) made by prepack")
    N, K = kpacked.shape[0], 2 * kpacked.shape[1]
    if group_size < 2 or group_size % 2 or K % group_size:
        raise ValueError(f"K = {K} must be a multiple of the (even) group size {group_size}")
    b = kpacked.reshape(N, K // group_size, 1, group_size // 2)        # (N, groups, 1, G/2)
    u = torch.cat([b & 0xF, b >> 4], dim=2).reshape(N, K).to(torch.int16)   # (N, K) 0..15
    q = (u - 8).to(torch.int8) if symmetric else u.to(torch.uint8)
    return quant.pack_int4(q)                                          # (N, K/2)


# ---------------------------------------------------------------------------- NumPy model

def _prmt(a: np.ndarray, b: int, sel: int) -> np.ndarray:
    """PTX ``prmt.b32 d, a, b, sel`` (default mode): byte i of d = byte sel_i of {b, a}."""
    src = [(a >> np.uint32(8 * i)) & np.uint32(0xFF) for i in range(4)]     # bytes 0..3: a
    src += [np.full_like(a, (b >> (8 * i)) & 0xFF) for i in range(4)]     # bytes 4..7: b
    out = np.zeros_like(a)
    for i in range(4):
        out |= src[(sel >> (4 * i)) & 0x7] << np.uint32(8 * i)
    return out


def _lanes(r: np.ndarray, dtype: str) -> np.ndarray:
    """A 32-bit register's two 16-bit lanes as float64 values, (...,) -> (..., 2)."""
    lanes = np.stack([r & 0xFFFF, r >> 16], axis=-1).astype(np.uint32)   # (..., 2)
    if dtype == "float16":
        return lanes.astype(np.uint16).view(np.float16).astype(np.float64)
    return (lanes << 16).view(np.float32).astype(np.float64)           # bf16: top half of fp32


def _fma16(v: np.ndarray, a: float, b: float, dtype: str) -> np.ndarray:
    """``fma.rn.{f16,bf16}x2`` on lanes whose exact result is a small integer (checked)."""
    out = v * a + b
    back = out.astype(np.float16) if dtype == "float16" else out.astype(np.float32)
    assert np.array_equal(back.astype(np.float64), out), "result not exact in 16 bits"
    return out


def emulate_asm(regs: np.ndarray, dtype: str = "float16") -> tuple[np.ndarray, np.ndarray]:
    """The inline assembly of ``dequant_pair`` replayed in NumPy, bit for bit (lesson 09).

    regs: uint32 (...,) registers, each four kernel-layout bytes (b0 lowest). Returns (lo,
    hi) float64 (..., 4): element i is the low / high nibble of byte i minus 8, as the
    16-bit lanes hold it. ``dtype``: "float16" (x in fp16) or "bfloat16".
    """
    if dtype not in MAGIC16:
        raise ValueError(f"dtype must be 'float16' or 'bfloat16', got {dtype!r}")
    r = np.asarray(regs, dtype=np.uint32)
    magic = np.uint32(MAGIC16[dtype] * 0x10001)                         # both lanes
    lo, hi = [], []
    for sel in (0x4140, 0x4342):                                        # bytes (0, 1), (2, 3)
        t = _prmt(r, 0, sel)                                            # lanes hold a byte each
        lo.append(_fma16(_lanes((t & np.uint32(0x000F000F)) | magic, dtype), 1.0,
                         -BIAS16[dtype], dtype))
        if dtype == "float16":                                          # 1024 + 16u, no shift
            hi.append(_fma16(_lanes((t & np.uint32(0x00F000F0)) | magic, dtype), 1 / 16,
                             -72.0, dtype))
        else:                                                           # bf16: shift first
            hi.append(_fma16(_lanes(((t >> np.uint32(4)) & np.uint32(0x000F000F)) | magic,
                                    dtype), 1.0, -BIAS16[dtype], dtype))
    return np.concatenate(lo, axis=-1), np.concatenate(hi, axis=-1)    # (..., 4) each


# ---------------------------------------------------------------------------- Triton

# One asm block = four bytes (one 32-bit register, $4) -> four low codes ($0, $1: two lanes
# each) and four high codes ($2, $3). Element i of the outputs comes from byte i of the
# input, whatever bytes Triton groups into one call. ptxas keeps the constants in registers
# across the loop (kernels.compile_check finds no MOV of them in the main loop).
_ASM_F16 = tl.constexpr("""
{
.reg .b32 t0, t1, m, k, s, c;
mov.b32 m, 0x64006400;
mov.b32 k, 0x64086408;
mov.b32 s, 0x2C002C00;
mov.b32 c, 0xD480D480;
prmt.b32 t0, $4, 0, 0x4140;
prmt.b32 t1, $4, 0, 0x4342;
lop3.b32 $0, t0, 0x000F000F, m, 0xEA;
lop3.b32 $1, t1, 0x000F000F, m, 0xEA;
lop3.b32 $2, t0, 0x00F000F0, m, 0xEA;
lop3.b32 $3, t1, 0x00F000F0, m, 0xEA;
sub.f16x2 $0, $0, k;
sub.f16x2 $1, $1, k;
fma.rn.f16x2 $2, $2, s, c;
fma.rn.f16x2 $3, $3, s, c;
}
""")
_ASM_BF16 = tl.constexpr("""
{
.reg .b32 t0, t1, u0, u1, m, one, k;
mov.b32 m, 0x43004300;
mov.b32 one, 0x3F803F80;
mov.b32 k, 0xC308C308;
prmt.b32 t0, $4, 0, 0x4140;
prmt.b32 t1, $4, 0, 0x4342;
shr.u32 u0, t0, 4;
shr.u32 u1, t1, 4;
lop3.b32 $0, t0, 0x000F000F, m, 0xEA;
lop3.b32 $1, t1, 0x000F000F, m, 0xEA;
lop3.b32 $2, u0, 0x000F000F, m, 0xEA;
lop3.b32 $3, u1, 0x000F000F, m, 0xEA;
fma.rn.bf16x2 $0, $0, one, k;
fma.rn.bf16x2 $1, $1, one, k;
fma.rn.bf16x2 $2, $2, one, k;
fma.rn.bf16x2 $3, $3, one, k;
}
""")
_CONSTRAINTS = tl.constexpr("=r,=r,=r,=r,r")


@triton.jit
def dequant_pair(p, W_DTYPE: tl.constexpr, USE_ASM: tl.constexpr):
    """Kernel-layout bytes (R, C) uint8 -> (low, high) codes - 8 as exact W_DTYPE values.

    ``W_DTYPE`` is tl.float16 or tl.bfloat16; ``USE_ASM`` picks the inline assembly
    (sm_80+) or the pure-Triton path, which gives the same bits (lessons 09 and 10).
    """
    if USE_ASM:
        if W_DTYPE == tl.float16:
            lo, hi = tl.inline_asm_elementwise(_ASM_F16, _CONSTRAINTS, [p],
                                               dtype=(tl.float16, tl.float16), is_pure=True,
                                               pack=4)
        else:
            lo, hi = tl.inline_asm_elementwise(_ASM_BF16, _CONSTRAINTS, [p],
                                               dtype=(tl.bfloat16, tl.bfloat16), is_pure=True,
                                               pack=4)
    else:
        q = p.to(tl.int16)                                   # 0..255, zero-extended
        magic = 0x6400 if W_DTYPE == tl.float16 else 0x4300      # 1024.0 or 128.0
        bias = 1032.0 if W_DTYPE == tl.float16 else 136.0        # magic + zero point 8
        lo = ((q & 0xF) | magic).to(tl.int16).to(W_DTYPE, bitcast=True)   # magic + code
        hi = (((q >> 4) & 0xF) | magic).to(tl.int16).to(W_DTYPE, bitcast=True)
        lo = (lo - bias).to(W_DTYPE)                         # low code - 8, exact
        hi = (hi - bias).to(W_DTYPE)
    return lo, hi
