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
  kernel wants (1) offset-binary codes u = q + 8 (symmetric; asymmetric codes are already
  0..15), so no XOR is left in the loop, and (2) codes that land in the lanes where the
  dot needs them. K is cut into *units* of U = max(G, 64) codes (``layout_unit``: one group
  of 64 or 128, or two groups of 32), each unit into four *quarters* of Q = U/4 codes.
  16-bit element e of a unit (bytes 2e, 2e+1) holds code e of each quarter::

      nibble 0: code e        (quarter 0)      nibble 2: code Q + e   (quarter 1)
      nibble 1: code 2Q + e   (quarter 2)      nibble 3: code 3Q + e  (quarter 3)

  so a unit's Q elements give four (BLOCK_N, Q) tiles of codes, one per quarter, that meet
  four plain, contiguous loads of x (x[:, uU + jQ : uU + (j+1)Q] for quarter j of unit u).
  Nothing is reshuffled in registers, and x is used as it is.
* Why 16-bit elements: the kernel loads the weights as int16, two per 32-bit register, and
  one register carries the same nibble position of two elements into the two lanes. No
  byte permute (PRMT) is needed, and the compiler hands ``tl.dot`` the registers as they
  come (a uint8 load made it repack bytes first: kernels.compile_check counts both).
* ``tl.inline_asm_elementwise`` on sm_80 and newer (``dequant_quad``, ``USE_ASM=True``):
  two elements per 32-bit register (pack 2) -> four registers of two exact 16-bit values,
  one per quarter. A pure-Triton path (``USE_ASM=False``: the interpreter cannot run inline
  assembly, nor can GPUs before sm_80 run bf16x2) gives the same bits. ``emulate_asm``
  replays the assembly's bit operations in NumPy so a CPU test can check them for all 16
  codes in every nibble; ``kernels.ptx_interp`` runs the strings themselves (lesson 09).

Pseudo-code of one 32-bit register r = elements (a, b), a in bits 0-15, fp16 flavour::

    t  = r >> 8                             # nibbles 2, 3 of a and b down to nibbles 0, 1
    q0 = (r & 0x000F000F) | 0x64006400      # lanes 1024 + nibble 0 of a, b (quarter 0)
    q1 = (t & 0x000F000F) | 0x64006400      # nibble 2 (quarter 1)
    q2 = (r & 0x00F000F0) | 0x64006400      # 1024 + 16 * nibble 1 (quarter 2; fp16 only)
    q3 = (t & 0x00F000F0) | 0x64006400      # 1024 + 16 * nibble 3 (quarter 3)
    q0, q1 = q0 - 1032, q1 - 1032           # codes - 8, exact (both lanes)
    q2, q3 = q2 * (1/16) - 72, q3 * (1/16) - 72   # codes - 8, exact (one FMA each)
    (9 instructions for 8 weights; bf16 shifts by 4, 8 and 12 instead, since its 7-bit
    mantissa has no room for 16 * u, and subtracts with an FMA: 11)
"""
from __future__ import annotations

import numpy as np
import torch

from kernels._triton import tl, triton  # Triton, or its stand-in where it is not installed

MAGIC16 = {"float16": 0x6400, "bfloat16": 0x4300}   # 1024.0 and 128.0 as 16-bit patterns
BIAS16 = {"float16": 1032.0, "bfloat16": 136.0}     # the magic number + the zero point 8


# ---------------------------------------------------------------------------- layout

def layout_unit(group_size: int) -> int:
    """Codes per unit of the kernel layout: max(G, 64). A quarter (U/4 codes) is one
    ``tl.dot``'s K, which must be at least 16; a unit holds one group, or two of 32."""
    return max(group_size, 64)


def _check_layout_input(t: torch.Tensor, what: str, made_by: str, group_size: int) -> int:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.dim() != 2:
        raise TypeError(f"{what} must be a 2-D uint8 tensor (N, K/2) {made_by}")
    K = 2 * t.shape[1]
    if group_size < 2 or group_size % 2:
        raise ValueError(f"the group size must be even, got {group_size}")
    U = layout_unit(group_size)
    if K % U:
        raise ValueError(f"K = {K} must be a multiple of the kernel layout's unit of {U} "
                         f"codes (max(group size {group_size}, 64)); kernels.w4a16 runs such a "
                         "weight with kernel='gemm'")
    return K


def prepack(packed: torch.Tensor, symmetric: bool = True, group_size: int = 128) -> torch.Tensor:
    """Checkpoint layout (``pack_int4``) -> kernel layout, (N, K/2) uint8 both (lesson 09).

    Codes become offset binary (u = q + 8 when ``symmetric``; asymmetric codes 0..15 stay).
    In each unit of U = ``layout_unit(group_size)`` codes (quarters of Q = U/4), 16-bit
    element e (bytes 2e, 2e+1) holds codes e, 2Q + e (byte 2e, low and high nibble) and
    Q + e, 3Q + e (byte 2e + 1). Done once per weight; ``unprepack`` inverts it.
    """
    from course_lib import quant

    K = _check_layout_input(packed, "packed", "from course_lib.quant.pack_int4", group_size)
    N, U = packed.shape[0], layout_unit(group_size)
    q = quant.unpack_int4(packed, signed=symmetric).to(torch.int16)    # (N, K)
    u = (q + 8 if symmetric else q).to(torch.uint8)                    # (N, K) 0..15
    u = u.reshape(N, K // U, 4, U // 4)                                # (N, units, quarter, Q)
    even = u[:, :, 0] | (u[:, :, 2] << 4)                              # byte 2e: quarters 0, 2
    odd = u[:, :, 1] | (u[:, :, 3] << 4)                               # byte 2e+1: 1, 3
    return torch.stack([even, odd], dim=-1).reshape(N, K // 2)         # (N, K/2)


def unprepack(kpacked: torch.Tensor, symmetric: bool = True, group_size: int = 128) -> torch.Tensor:
    """Kernel layout -> checkpoint layout: the inverse of ``prepack`` (lesson 09)."""
    from course_lib import quant

    K = _check_layout_input(kpacked, "kpacked", "made by prepack", group_size)
    N, U = kpacked.shape[0], layout_unit(group_size)
    b = kpacked.reshape(N, K // U, U // 4, 2)                          # (N, units, Q, even/odd)
    quarters = [b[..., 0] & 0xF, b[..., 1] & 0xF, b[..., 0] >> 4, b[..., 1] >> 4]
    u = torch.stack(quarters, dim=2).reshape(N, K).to(torch.int16)     # (N, K) 0..15
    q = (u - 8).to(torch.int8) if symmetric else u.to(torch.uint8)
    return quant.pack_int4(q)                                          # (N, K/2)


# ---------------------------------------------------------------------------- NumPy model

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


def emulate_asm(regs: np.ndarray, dtype: str = "float16") -> tuple[np.ndarray, ...]:
    """The inline assembly of ``dequant_quad`` replayed in NumPy, bit for bit (lesson 09).

    regs: uint32 (...,) registers, each two kernel-layout 16-bit elements (element 0 in bits
    0-15). Returns four float64 arrays (..., 2), quarters 0..3: element i of quarter j is
    the code that quarter j keeps in element i, minus 8, as the 16-bit lanes hold it.
    ``dtype``: "float16" (x in fp16) or "bfloat16".
    """
    if dtype not in MAGIC16:
        raise ValueError(f"dtype must be 'float16' or 'bfloat16', got {dtype!r}")
    r = np.asarray(regs, dtype=np.uint32)
    magic = np.uint32(MAGIC16[dtype] * 0x10001)                         # both lanes
    low = np.uint32(0x000F000F)                                         # nibble 0 of each lane

    def exact(t, mask, a, b):                                           # LOP3 + one FMA
        return _fma16(_lanes((t & np.uint32(mask)) | magic, dtype), a, b, dtype)

    t8 = r >> np.uint32(8)                                              # nibbles 2, 3 -> 0, 1
    q0 = exact(r, low, 1.0, -BIAS16[dtype])
    q1 = exact(t8, low, 1.0, -BIAS16[dtype])
    if dtype == "float16":                                              # 1024 + 16u, no shift
        q2 = exact(r, 0x00F000F0, 1 / 16, -72.0)
        q3 = exact(t8, 0x00F000F0, 1 / 16, -72.0)
    else:                                                               # bf16: shift first
        q2 = exact(r >> np.uint32(4), low, 1.0, -BIAS16[dtype])
        q3 = exact(r >> np.uint32(12), low, 1.0, -BIAS16[dtype])
    return q0, q1, q2, q3                                               # (..., 2) each


# ---------------------------------------------------------------------------- Triton

# One asm block = one 32-bit register ($4): two kernel-layout int16 elements -> four registers
# ($0..$3, quarters 0..3) of two 16-bit lanes each (element 0 in the low lane). Every read of
# $4 comes before the first write of an output, so the strings stay right even if the
# compiler gives an output the input's register. ptxas keeps the constants in registers
# across the loop (kernels.compile_check finds no MOV of them in the main loop).
_ASM_F16 = tl.constexpr("""
{
.reg .b32 t, a, m, k, f, c;
mov.b32 m, 0x64006400;
mov.b32 k, 0x64086408;
mov.b32 f, 0x2C002C00;
mov.b32 c, 0xD480D480;
shr.u32 t, $4, 8;
lop3.b32 a, $4, 0x00F000F0, m, 0xEA;
lop3.b32 $0, $4, 0x000F000F, m, 0xEA;
lop3.b32 $1, t, 0x000F000F, m, 0xEA;
lop3.b32 $3, t, 0x00F000F0, m, 0xEA;
sub.f16x2 $0, $0, k;
sub.f16x2 $1, $1, k;
fma.rn.f16x2 $2, a, f, c;
fma.rn.f16x2 $3, $3, f, c;
}
""")
_ASM_BF16 = tl.constexpr("""
{
.reg .b32 t4, t8, t12, m, one, k;
mov.b32 m, 0x43004300;
mov.b32 one, 0x3F803F80;
mov.b32 k, 0xC308C308;
shr.u32 t4, $4, 4;
shr.u32 t8, $4, 8;
shr.u32 t12, $4, 12;
lop3.b32 $0, $4, 0x000F000F, m, 0xEA;
lop3.b32 $1, t8, 0x000F000F, m, 0xEA;
lop3.b32 $2, t4, 0x000F000F, m, 0xEA;
lop3.b32 $3, t12, 0x000F000F, m, 0xEA;
fma.rn.bf16x2 $0, $0, one, k;
fma.rn.bf16x2 $1, $1, one, k;
fma.rn.bf16x2 $2, $2, one, k;
fma.rn.bf16x2 $3, $3, one, k;
}
""")
_CONSTRAINTS = tl.constexpr("=r,=r,=r,=r,r")


@triton.jit
def _code16(n, W_DTYPE: tl.constexpr):
    """Codes 0..15 (int32) -> code - 8 as an exact W_DTYPE value, by the magic number."""
    magic = 0x6400 if W_DTYPE == tl.float16 else 0x4300          # 1024.0 or 128.0
    bias = 1032.0 if W_DTYPE == tl.float16 else 136.0            # magic + zero point 8
    v = (n | magic).to(tl.int16).to(W_DTYPE, bitcast=True)       # magic + code
    return (v - bias).to(W_DTYPE)                                # code - 8, exact


@triton.jit
def dequant_quad(p, W_DTYPE: tl.constexpr, USE_ASM: tl.constexpr):
    """Kernel-layout int16 elements (R, C) -> the four quarters' codes - 8, (R, C) each,
    as exact W_DTYPE values (lessons 09 and 10).

    ``W_DTYPE`` is tl.float16 or tl.bfloat16; ``USE_ASM`` picks the inline assembly
    (sm_80+) or the pure-Triton path, which gives the same bits.
    """
    if USE_ASM:
        if W_DTYPE == tl.float16:
            q0, q1, q2, q3 = tl.inline_asm_elementwise(
                _ASM_F16, _CONSTRAINTS, [p], dtype=(tl.float16,) * 4, is_pure=True, pack=2)
        else:
            q0, q1, q2, q3 = tl.inline_asm_elementwise(
                _ASM_BF16, _CONSTRAINTS, [p], dtype=(tl.bfloat16,) * 4, is_pure=True, pack=2)
    else:
        u = p.to(tl.int32) & 0xFFFF                          # the element's 16 bits
        q0 = _code16(u & 0xF, W_DTYPE)                       # nibble 0: quarter 0
        q2 = _code16((u >> 4) & 0xF, W_DTYPE)                # nibble 1: quarter 2
        q1 = _code16((u >> 8) & 0xF, W_DTYPE)                # nibble 2: quarter 1
        q3 = _code16((u >> 12) & 0xF, W_DTYPE)               # nibble 3: quarter 3
    return q0, q1, q2, q3
