"""The inline PTX of kernels.dequant16, executed as written by kernels.ptx_interp (lessons 09, 10).

``emulate_asm`` models what the assembly is meant to do; these tests run the assembly strings
themselves, register routing included, on every byte value in every byte position, and
compare the 16-bit results with the plain dequantization formula and with ``emulate_asm``,
bit for bit. A mutated string (a wrong selector, lookup table, constant or operand) fails.
"""
import numpy as np
import pytest

from kernels import dequant16, ptx_interp

ASM = {"float16": dequant16._ASM_F16.value, "bfloat16": dequant16._ASM_BF16.value}


def every_byte_in_every_position() -> np.ndarray:
    """uint8 (1024,): 256 words; byte i of word w is (w + 67 i) mod 256, so each of the four
    byte positions of a register sees all 256 values."""
    w = np.arange(256)
    return np.stack([(w + 67 * i) % 256 for i in range(4)], axis=1).astype(np.uint8).reshape(-1)


def formula_bits(data: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """The plain dequantization, low and high nibble minus 8, as 16-bit patterns."""
    lo = (data & 0xF).astype(np.float64) - 8
    hi = (data >> 4).astype(np.float64) - 8
    return bits16(lo, dtype), bits16(hi, dtype)


def bits16(values: np.ndarray, dtype: str) -> np.ndarray:
    """Small integers (exact in both formats) -> their fp16 / bf16 bit patterns."""
    if dtype == "float16":
        return values.astype(np.float16).view(np.uint16)
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_assembly_as_written_dequantizes_every_byte(dtype):
    data = every_byte_in_every_position()
    lo, hi = ptx_interp.run_pack4(ASM[dtype], data)
    want_lo, want_hi = formula_bits(data, dtype)
    assert np.array_equal(lo, want_lo) and np.array_equal(hi, want_hi)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_assembly_agrees_with_the_numpy_model(dtype):
    data = every_byte_in_every_position()
    lo, hi = ptx_interp.run_pack4(ASM[dtype], data)
    mlo, mhi = dequant16.emulate_asm(data.view(np.uint32), dtype)           # (256, 4) each
    assert np.array_equal(lo, bits16(mlo.reshape(-1), dtype))
    assert np.array_equal(hi, bits16(mhi.reshape(-1), dtype))


# One mutation per kind of mistake: a byte selector, the LOP3 table, a mask, the magic number,
# the bias, the high nibble's scale, an output register, the bf16 shift, a dropped line.
MUTATIONS = [
    ("float16", "prmt.b32 t0, $4, 0, 0x4140;", "prmt.b32 t0, $4, 0, 0x4041;"),
    ("float16", "lop3.b32 $0, t0, 0x000F000F, m, 0xEA;", "lop3.b32 $0, t0, 0x000F000F, m, 0xE8;"),
    ("float16", "lop3.b32 $3, t1, 0x00F000F0, m, 0xEA;", "lop3.b32 $3, t1, 0x00F000F0, m, 0xEA;\n"
                                                            "lop3.b32 $3, t0, 0x00F000F0, m, 0xEA;"),
    ("float16", "mov.b32 m, 0x64006400;", "mov.b32 m, 0x64006480;"),
    ("float16", "mov.b32 k, 0x64086408;", "mov.b32 k, 0x64086400;"),
    ("float16", "mov.b32 s, 0x2C002C00;", "mov.b32 s, 0x2C003000;"),
    ("float16", "sub.f16x2 $1, $1, k;", ""),
    ("bfloat16", "shr.u32 u1, t1, 4;", "shr.u32 u1, t1, 3;"),
    ("bfloat16", "prmt.b32 t1, $4, 0, 0x4342;", "prmt.b32 t1, $4, 0, 0x4243;"),
    ("bfloat16", "mov.b32 k, 0xC308C308;", "mov.b32 k, 0xC300C308;"),
    ("bfloat16", "fma.rn.bf16x2 $2, $2, one, k;", "fma.rn.bf16x2 $2, $3, one, k;"),
]


@pytest.mark.parametrize("dtype,old,new", MUTATIONS)
def test_a_mutated_assembly_string_fails(dtype, old, new):
    assert ASM[dtype].count(old) == 1, "the mutation no longer matches the assembly: update it"
    data = every_byte_in_every_position()
    try:
        lo, hi = ptx_interp.run_pack4(ASM[dtype].replace(old, new), data)
    except ValueError:                     # e.g. a lane that is no longer a finite value
        return
    want_lo, want_hi = formula_bits(data, dtype)
    assert not (np.array_equal(lo, want_lo) and np.array_equal(hi, want_hi))


def test_lop3_and_prmt_follow_the_ptx_definitions():
    a, b, c = (np.array([v], np.uint64) for v in (0xF0F0F0F0, 0xCCCCCCCC, 0xAAAAAAAA))
    for lut in (0x00, 0xEA, 0x96, 0xFF, 0x80):      # the lookup table of a, b, c = F0, CC, AA is lut
        assert int(ptx_interp._lop3(a, b, c, lut)[0]) == lut * 0x01010101
    r = np.array([0x44332211], np.uint64)
    got = ptx_interp._prmt(r, np.array([0x88776655], np.uint64), np.array([0x7430], np.uint64))
    assert int(got[0]) == 0x88554411                # bytes 0, 3, 4, 7 of {b, a}, low first


def test_fused_multiply_add_rounds_once():
    """fma is the exact a * b + c, rounded once. With a = 1 - 2**-11, a * a = 1 - 2**-10 + 2**-22:
    rounded first to fp16 it is 1 - 2**-10, and adding c = -(1 - 2**-10) gives 0; computed
    exactly, the result is 2**-22 (an fp16 subnormal)."""
    f16_bits = lambda v: int(np.array([v], np.float16).view(np.uint16)[0])         # noqa: E731
    word = lambda v: np.array([f16_bits(v) * 0x10001], np.uint64)                  # both lanes  # noqa: E731
    a, c = 1 - 2 ** -11, -(1 - 2 ** -10)
    out = ptx_interp.run("{ fma.rn.f16x2 $0, $1, $2, $3; }",
                         {"$1": word(a), "$2": word(a), "$3": word(c)})["$0"]
    assert int(out[0]) == f16_bits(2 ** -22) * 0x10001                           # one rounding
    assert f16_bits(float(np.float16(a * a)) + c) == 0                           # two roundings: 0


def test_the_interpreter_refuses_what_it_does_not_model():
    with pytest.raises(ValueError, match="does not model 'cvt.rn.f16.f32'"):
        ptx_interp.run("{ cvt.rn.f16.f32 $0, $1; }", {"$1": np.zeros(1, np.uint32)})
    with pytest.raises(ValueError, match="read before it is written"):
        ptx_interp.run("{ mov.b32 $0, t9; }", {"$1": np.zeros(1, np.uint32)})
    with pytest.raises(ValueError, match="only round-to-nearest-even"):
        ptx_interp.run("{ fma.rz.f16x2 $0, $1, $1, $1; }", {"$1": np.zeros(1, np.uint32)})
    with pytest.raises(ValueError, match="multiple of 4"):
        ptx_interp.run_pack4(ASM["float16"], np.zeros(6, np.uint8))


def test_a_broken_interpreter_pair_is_named_once():
    """Triton 3.6's interpreter with NumPy >= 2.4 fails on every kernel: kernels._triton turns
    that pair into one message instead of a hundred failures (and only when interpreting)."""
    from kernels._triton import interpreter_problem
    why = interpreter_problem("3.6.0", "2.4.1", interpreting=True)
    assert "numpy<2.4" in why and "Triton 3.6.0" in why
    assert interpreter_problem("3.6.0", "2.3.5", interpreting=True) is None
    assert interpreter_problem("3.9.0", "2.4.6", interpreting=True) is None
    assert interpreter_problem("3.6.0", "2.4.1", interpreting=False) is None   # a GPU compiles
