"""16-bit dequantization from 32-bit words (kernels.dequant16): the kernel layout, the NumPy
model of the inline assembly, and the pure-Triton path, all against course_lib.quant."""
import kernels  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
import numpy as np
import pytest
import torch
from kernels._triton import tl, triton  # the stand-in where Triton is not installed

from course_lib import quant
from kernels import dequant16
from kernels._common import on_gpu


def _every_code_everywhere(G: int, symmetric: bool) -> torch.Tensor:
    """(16, 2G) codes: row r, column k holds (r + k) % 16 (- 8 when signed), so every byte
    position of a register and both nibbles see all 16 codes over the rows."""
    u = (torch.arange(16)[:, None] + torch.arange(2 * G)[None, :]) % 16     # (16, 2G)
    return (u - 8).to(torch.int8) if symmetric else u.to(torch.uint8)


@pytest.mark.parametrize("G", [32, 64, 128])
@pytest.mark.parametrize("symmetric", [True, False])
def test_prepack_round_trips_and_documents_its_layout(G, symmetric):
    q = _every_code_everywhere(G, symmetric)                                 # (16, 2G)
    if 2 * G % dequant16.layout_unit(G):
        q = torch.cat([q, q], dim=1)                                         # whole units
    packed = quant.pack_int4(q)
    kp = dequant16.prepack(packed, symmetric, G)
    assert kp.shape == packed.shape and kp.dtype == torch.uint8
    assert torch.equal(dequant16.unprepack(kp, symmetric, G), packed)
    # the layout: in unit 1 (U = max(G, 64) codes, quarters of Q), int16 element e holds
    # codes e, 2Q + e (byte 2e: low, high nibble), Q + e, 3Q + e (byte 2e + 1)
    U = dequant16.layout_unit(G)
    Q = U // 4
    u = q.to(torch.int16) + (8 if symmetric else 0)                          # (16, 2G) 0..15
    if u.shape[1] < 2 * U:
        u, kp = torch.cat([u, u], dim=1), torch.cat([kp, kp], dim=1)
    e = 5
    b0, b1 = kp[:, U // 2 + 2 * e].to(torch.int16), kp[:, U // 2 + 2 * e + 1].to(torch.int16)
    assert torch.equal(b0, u[:, U + e] | (u[:, U + 2 * Q + e] << 4))
    assert torch.equal(b1, u[:, U + Q + e] | (u[:, U + 3 * Q + e] << 4))


def test_prepack_refuses_bad_input():
    with pytest.raises(TypeError, match="uint8"):
        dequant16.prepack(torch.zeros(2, 8, dtype=torch.int8))
    with pytest.raises(ValueError, match="multiple of the kernel layout's unit of 64"):
        dequant16.prepack(torch.zeros(2, 48, dtype=torch.uint8), True, 64)
    with pytest.raises(ValueError, match="unit of 64 codes .max.group size 32, 64.*gemm"):
        dequant16.prepack(torch.zeros(2, 16, dtype=torch.uint8), True, 32)      # K = 32
    with pytest.raises(ValueError, match="must be even"):
        dequant16.prepack(torch.zeros(2, 64, dtype=torch.uint8), True, 33)
    with pytest.raises(ValueError, match="'float16' or 'bfloat16'"):
        dequant16.emulate_asm(np.zeros(4, np.uint32), "float32")


def _dequant_by_emulation(kp: torch.Tensor, G: int, dtype: str) -> np.ndarray:
    """Kernel-layout bytes (N, K/2) -> codes - 8 in k order, through ``emulate_asm``."""
    N, half = kp.shape
    U = dequant16.layout_unit(G)
    regs = kp.numpy().view(np.uint32)                                        # (N, K/8)
    quarters = dequant16.emulate_asm(regs, dtype)                            # 4 x (N, K/8, 2)
    e = np.stack([qj.reshape(N, 2 * half // U, U // 4) for qj in quarters], axis=2)
    return e.reshape(N, 2 * half)                                            # (N, units, 4, Q)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("G", [32, 64, 128])
@pytest.mark.parametrize("symmetric", [True, False])
def test_emulated_assembly_equals_reference_unpacking_for_every_code(dtype, G, symmetric):
    q = _every_code_everywhere(G, symmetric)                                 # (16, 2G)
    if 2 * G % dequant16.layout_unit(G):
        q = torch.cat([q, q.flip(1)], dim=1)                                 # whole units
    packed = quant.pack_int4(q)
    ref = quant.unpack_int4(packed, signed=symmetric).numpy().astype(np.float64)
    got = _dequant_by_emulation(dequant16.prepack(packed, symmetric, G), G, dtype)
    assert np.array_equal(got, ref - (0 if symmetric else 8))


def test_emulated_assembly_reads_each_nibble_into_its_own_quarter():
    """Quarter j of element i depends on one nibble of element i only (Triton may pair any
    two elements in one call): nibble 0 -> quarter 0, 1 -> 2, 2 -> 1, 3 -> 3."""
    where = {0: 0, 1: 2, 2: 1, 3: 3}                                         # nibble -> quarter
    for elem in range(2):
        for nib in range(4):
            for v in range(16):
                reg = np.array([v << (4 * nib + 16 * elem)], dtype=np.uint32)
                for dtype in ("float16", "bfloat16"):
                    got = dequant16.emulate_asm(reg, dtype)
                    for j in range(4):
                        want = np.full(2, -8.0)
                        if j == where[nib]:
                            want[elem] = v - 8
                        assert np.array_equal(got[j][0], want), (elem, nib, v, j, dtype)


@triton.jit
def _dequant_kernel(p_ptr, o_ptr, C, BLOCK: tl.constexpr, W_DTYPE: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)                  # (BLOCK,)
    q0, q1, q2, q3 = dequant16.dequant_quad(tl.load(p_ptr + o), W_DTYPE, False)
    tl.store(o_ptr + o, q0)                                             # out (4, C)
    tl.store(o_ptr + C + o, q1)
    tl.store(o_ptr + 2 * C + o, q2)
    tl.store(o_ptr + 3 * C + o, q3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_pure_triton_path_gives_the_assembly_bits(dtype):
    """Every 16-bit element value through the pure-Triton path (the interpreter; natively
    on a GPU) equals the NumPy model of the assembly, bit for bit (16-bit patterns)."""
    dev = "cuda" if on_gpu() else "cpu"
    C, BLOCK = 1 << 16, 4096
    p = torch.arange(C, dtype=torch.int32).to(torch.int16).to(dev)           # every value
    out = torch.empty(4 * C, dtype=dtype, device=dev)
    _dequant_kernel[(C // BLOCK,)](p, out, C, BLOCK,
                                   tl.float16 if dtype == torch.float16 else tl.bfloat16)
    name = "float16" if dtype == torch.float16 else "bfloat16"
    want = dequant16.emulate_asm(p.cpu().numpy().view(np.uint32), name)      # 4 x (C/2, 2)
    got = out.cpu().reshape(4, C)
    for j in range(4):
        want16 = torch.tensor(want[j].reshape(-1), dtype=torch.float64).to(dtype)
        assert torch.equal(got[j].view(torch.int16), want16.view(torch.int16)), j


def test_assembly_constants_are_the_numbers_the_model_uses():
    """The hex constants in the inline PTX decode to the magic numbers, biases and
    multipliers ``emulate_asm`` computes with (a typo there would pass every CPU test)."""
    import re

    def lanes(hex_word, dtype):
        v = int(hex_word, 16)
        assert v >> 16 == v & 0xFFFF, hex_word                       # both lanes equal
        bits = np.array([v & 0xFFFF], dtype=np.uint32)
        if dtype == "float16":
            return float(bits.astype(np.uint16).view(np.float16)[0])
        return float((bits << 16).view(np.float32)[0])

    f16 = {m[0]: lanes(m[1], "float16")
           for m in re.findall(r"mov\.b32 (\w+), (0x[0-9A-F]{8});", dequant16._ASM_F16.value)}
    assert f16 == {"m": 1024.0, "k": 1032.0, "f": 1 / 16, "c": -72.0}
    bf16 = {m[0]: lanes(m[1], "bfloat16")
            for m in re.findall(r"mov\.b32 (\w+), (0x[0-9A-F]{8});", dequant16._ASM_BF16.value)}
    assert bf16 == {"m": 128.0, "one": 1.0, "k": -136.0}
    assert dequant16.MAGIC16 == {"float16": 0x6400, "bfloat16": 0x4300}
    f, b = dequant16._ASM_F16.value, dequant16._ASM_BF16.value
    # what the lessons count: fp16 1 shift + 4 LOP3 + 2 sub + 2 FMA, bf16 3 + 4 + 4 FMA; no PRMT
    assert (f.count("shr.u32"), f.count("lop3.b32"), f.count("sub.f16x2"),
            f.count("fma.rn.f16x2")) == (1, 4, 2, 2)
    assert (b.count("shr.u32"), b.count("lop3.b32"), b.count("fma.rn.bf16x2")) == (3, 4, 4)
    for asm in (f, b):
        assert "prmt" not in asm and asm.count(", 0xEA;") == 4               # (a & b) | c
