"""The inline PTX of kernels.dequant16, executed as written by kernels.ptx_interp (lessons 09, 10).

``emulate_asm`` models what the assembly is meant to do; these tests run the assembly strings
themselves, register routing included, on every byte value in every byte position of a
register (both 16-bit elements), and compare the 16-bit results with the plain dequantization formula and with ``emulate_asm``,
bit for bit. A mutated string (a wrong selector, lookup table, constant or operand) fails.
"""
import numpy as np
import pytest

from kernels import dequant16, ptx_interp

ASM = {"float16": dequant16._ASM_F16.value, "bfloat16": dequant16._ASM_BF16.value}


def every_byte_in_every_position() -> np.ndarray:
    """uint16 (512,): 256 registers of two elements; byte i of register w is (w + 67 i) mod
    256, so each of the four byte positions (both bytes of both elements) sees all 256
    values, and each nibble all 16."""
    w = np.arange(256)
    data = np.stack([(w + 67 * i) % 256 for i in range(4)], axis=1).astype(np.uint8)
    return data.reshape(-1).view(np.uint16)


SOME = every_byte_in_every_position()


def formula_bits(data: np.ndarray, dtype: str) -> list[np.ndarray]:
    """The plain dequantization, quarter j = nibble (0, 2, 1, 3)[j] minus 8, as 16-bit
    patterns (the kernel layout of kernels.dequant16.prepack)."""
    return [bits16(((data >> (4 * nib)) & 0xF).astype(np.float64) - 8, dtype)
            for nib in (0, 2, 1, 3)]


def bits16(values: np.ndarray, dtype: str) -> np.ndarray:
    """Small integers (exact in both formats) -> their fp16 / bf16 bit patterns."""
    if dtype == "float16":
        return values.astype(np.float16).view(np.uint16)
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _same(got, want) -> bool:
    return all(np.array_equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_assembly_as_written_dequantizes_every_byte(dtype):
    data = every_byte_in_every_position()
    assert _same(ptx_interp.run_pack2(ASM[dtype], data), formula_bits(data, dtype))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_assembly_agrees_with_the_numpy_model(dtype):
    data = SOME
    model = dequant16.emulate_asm(data.view(np.uint32), dtype)              # 4 x (n/2, 2)
    assert _same(ptx_interp.run_pack2(ASM[dtype], data),
                 [bits16(m.reshape(-1), dtype) for m in model])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_input_is_read_before_any_output_is_written(dtype):
    """The compiler may give an output the input's register ("=r" is not early-clobber):
    no read of $4 may come after the first write of $0..$3 (an instruction reads its
    sources before it writes)."""
    ops = [(op, args) for op, args in ptx_interp.parse(ASM[dtype]) if op != ".reg"]
    first_write = min(i for i, (_, args) in enumerate(ops) if args[0] in ("$0", "$1", "$2", "$3"))
    last_read = max(i for i, (_, args) in enumerate(ops) if "$4" in args[1:])
    assert last_read <= first_write


# One mutation per kind of mistake: the LOP3 table, a mask, the magic number, the bias, the
# high nibbles' scale, an output register, a shift, a dropped line, a swapped source.
MUTATIONS = [
    ("float16", "lop3.b32 $0, $4, 0x000F000F, m, 0xEA;", "lop3.b32 $0, $4, 0x000F000F, m, 0xE8;"),
    ("float16", "lop3.b32 $3, t, 0x00F000F0, m, 0xEA;", "lop3.b32 $3, $4, 0x00F000F0, m, 0xEA;"),
    ("float16", "lop3.b32 $1, t, 0x000F000F, m, 0xEA;", "lop3.b32 $1, t, 0x000F00F0, m, 0xEA;"),
    ("float16", "mov.b32 m, 0x64006400;", "mov.b32 m, 0x64006480;"),
    ("float16", "mov.b32 k, 0x64086408;", "mov.b32 k, 0x64086400;"),
    ("float16", "mov.b32 f, 0x2C002C00;", "mov.b32 f, 0x2C003000;"),
    ("float16", "shr.u32 t, $4, 8;", "shr.u32 t, $4, 4;"),
    ("float16", "sub.f16x2 $1, $1, k;", ""),
    ("float16", "fma.rn.f16x2 $2, a, f, c;", "fma.rn.f16x2 $2, $3, f, c;"),
    ("bfloat16", "shr.u32 t12, $4, 12;", "shr.u32 t12, $4, 11;"),
    ("bfloat16", "lop3.b32 $1, t8, 0x000F000F, m, 0xEA;", "lop3.b32 $1, t4, 0x000F000F, m, 0xEA;"),
    ("bfloat16", "mov.b32 k, 0xC308C308;", "mov.b32 k, 0xC300C308;"),
    ("bfloat16", "fma.rn.bf16x2 $2, $2, one, k;", "fma.rn.bf16x2 $2, $3, one, k;"),
]


@pytest.mark.parametrize("dtype,old,new", MUTATIONS)
def test_a_mutated_assembly_string_fails(dtype, old, new):
    assert ASM[dtype].count(old) == 1, "the mutation no longer matches the assembly: update it"
    try:
        got = ptx_interp.run_pack2(ASM[dtype].replace(old, new), SOME)
    except ValueError:                     # e.g. a lane that is no longer a finite value
        return
    assert not _same(got, formula_bits(SOME, dtype))


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
    with pytest.raises(ValueError, match="even number of elements"):
        ptx_interp.run_pack2(ASM["float16"], np.zeros(3, np.uint16))
    with pytest.raises(ValueError, match="16-bit integers"):
        ptx_interp.run_pack2(ASM["float16"], np.zeros(4, np.uint8))


def test_a_broken_interpreter_pair_is_named_once():
    """Triton 3.6's interpreter with NumPy >= 2.4 fails on every kernel: kernels._triton turns
    that pair into one message instead of a hundred failures (and only when interpreting)."""
    from kernels._triton import interpreter_problem
    why = interpreter_problem("3.6.0", "2.4.1", interpreting=True)
    assert "numpy<2.4" in why and "Triton 3.6.0" in why
    assert interpreter_problem("3.6.0", "2.3.5", interpreting=True) is None
    assert interpreter_problem("3.9.0", "2.4.6", interpreting=True) is None
    assert interpreter_problem("3.6.0", "2.4.1", interpreting=False) is None   # a GPU compiles
