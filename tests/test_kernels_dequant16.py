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
    packed = quant.pack_int4(q)
    kp = dequant16.prepack(packed, symmetric, G)
    assert kp.shape == packed.shape and kp.dtype == torch.uint8
    assert torch.equal(dequant16.unprepack(kp, symmetric, G), packed)
    # the layout: byte c of a group = code c (low nibble) | code G/2 + c (high), offset binary
    u = q.to(torch.int16) + (8 if symmetric else 0)                          # (16, 2G) 0..15
    c = 5
    assert torch.equal(kp[:, c].to(torch.int16), u[:, c] | (u[:, G // 2 + c] << 4))
    assert torch.equal(kp[:, G // 2 + c].to(torch.int16), u[:, G + c] | (u[:, G + G // 2 + c] << 4))


def test_prepack_refuses_bad_input():
    with pytest.raises(TypeError, match="uint8"):
        dequant16.prepack(torch.zeros(2, 8, dtype=torch.int8))
    with pytest.raises(ValueError, match="multiple of the .even. group size 64"):
        dequant16.prepack(torch.zeros(2, 48, dtype=torch.uint8), True, 64)
    with pytest.raises(ValueError, match="'float16' or 'bfloat16'"):
        dequant16.emulate_asm(np.zeros(4, np.uint32), "float32")


def _dequant_by_emulation(kp: torch.Tensor, G: int, dtype: str) -> np.ndarray:
    """Kernel-layout bytes (N, K/2) -> codes - 8 in k order, through ``emulate_asm``."""
    N, half = kp.shape
    regs = kp.numpy().view(np.uint32)                                        # (N, K/8)
    lo, hi = dequant16.emulate_asm(regs, dtype)                              # (N, K/8, 4)
    lo = lo.reshape(N, half // (G // 2), G // 2)                             # (N, groups, G/2)
    hi = hi.reshape(N, half // (G // 2), G // 2)
    return np.concatenate([lo, hi], axis=2).reshape(N, 2 * half)             # (N, K)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("G", [32, 128])
@pytest.mark.parametrize("symmetric", [True, False])
def test_emulated_assembly_equals_reference_unpacking_for_every_code(dtype, G, symmetric):
    q = _every_code_everywhere(G, symmetric)                                 # (16, 2G)
    packed = quant.pack_int4(q)
    ref = quant.unpack_int4(packed, signed=symmetric).numpy().astype(np.float64)
    got = _dequant_by_emulation(dequant16.prepack(packed, symmetric, G), G, dtype)
    assert np.array_equal(got, ref - (0 if symmetric else 8))


def test_emulated_assembly_reads_each_byte_into_its_own_element():
    """Output element i depends on byte i only (Triton may group any 4 elements per call)."""
    for pos in range(4):
        for b in range(256):
            reg = np.array([b << (8 * pos)], dtype=np.uint32)
            for dtype in ("float16", "bfloat16"):
                lo, hi = dequant16.emulate_asm(reg, dtype)
                want_lo = np.full(4, -8.0)
                want_hi = np.full(4, -8.0)
                want_lo[pos], want_hi[pos] = (b & 0xF) - 8, (b >> 4) - 8
                assert np.array_equal(lo[0], want_lo) and np.array_equal(hi[0], want_hi)


@triton.jit
def _dequant_kernel(p_ptr, lo_ptr, hi_ptr, C: tl.constexpr, W_DTYPE: tl.constexpr):
    o = tl.arange(0, C)
    lo, hi = dequant16.dequant_pair(tl.load(p_ptr + o), W_DTYPE, False)
    tl.store(lo_ptr + o, lo)
    tl.store(hi_ptr + o, hi)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_pure_triton_path_gives_the_assembly_bits(dtype):
    """Every byte value through the pure-Triton path (the interpreter) equals the NumPy
    model of the assembly, bit for bit (16-bit patterns compared)."""
    dev = "cuda" if on_gpu() else "cpu"                  # native on a GPU, the interpreter here
    p = torch.arange(256, dtype=torch.uint8, device=dev)
    lo, hi = torch.empty(256, dtype=dtype, device=dev), torch.empty(256, dtype=dtype, device=dev)
    _dequant_kernel[(1,)](p, lo, hi, 256, tl.float16 if dtype == torch.float16 else tl.bfloat16)
    name = "float16" if dtype == torch.float16 else "bfloat16"
    elo, ehi = dequant16.emulate_asm(p.cpu().numpy().view(np.uint32), name)  # (64, 4) each
    for got, want in ((lo.cpu(), elo), (hi.cpu(), ehi)):
        want16 = torch.tensor(want.reshape(-1), dtype=torch.float64).to(dtype)
        assert torch.equal(got.view(torch.int16), want16.view(torch.int16))


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
    assert f16 == {"m": 1024.0, "k": 1032.0, "s": 1 / 16, "c": -72.0}
    bf16 = {m[0]: lanes(m[1], "bfloat16")
            for m in re.findall(r"mov\.b32 (\w+), (0x[0-9A-F]{8});", dequant16._ASM_BF16.value)}
    assert bf16 == {"m": 128.0, "one": 1.0, "k": -136.0}
    assert dequant16.MAGIC16 == {"float16": 0x6400, "bfloat16": 0x4300}
    assert "lop3.b32 $2, t0, 0x00F000F0, m, 0xEA;" in dequant16._ASM_F16.value
    assert "fma.rn.f16x2 $2, $2, s, c;" in dequant16._ASM_F16.value
    assert "shr.u32 u0, t0, 4;" in dequant16._ASM_BF16.value
    assert "lop3.b32 $2, u0, 0x000F000F, m, 0xEA;" in dequant16._ASM_BF16.value
    for asm in (dequant16._ASM_F16.value, dequant16._ASM_BF16.value):
        assert asm.count("prmt.b32") == 2 and "0x4140" in asm and "0x4342" in asm
        assert asm.count("lop3.b32") == 4 and asm.count(", 0xEA;") == 4   # (a & b) | c
