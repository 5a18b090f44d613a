"""A small interpreter for the PTX the course's inline assembly uses (lessons 09 and 10).

What you will learn
-------------------
``kernels.dequant16`` hands two strings of PTX to ``tl.inline_asm_elementwise``. No CPU can
run PTX, so how does a CPU test know the strings do what the lesson says? ``emulate_asm``
replays the *intended* operations in NumPy; this module runs the strings themselves, line by
line, as a GPU would: it parses each instruction, keeps a table of 32-bit registers, and
executes the opcodes the course uses:

==============================  ===========================================================
``mov.b32 d, a``                copy a register or an immediate
``prmt.b32 d, a, b, sel``       byte permute: byte i of d = byte ``sel`` nibble i of {b:a}
``lop3.b32 d, a, b, c, lut``    any 3-input logic function; bit i of the 8-bit ``lut`` is the
                                result for a, b, c = bits 2, 1, 0 of i (0xEA = (a & b) | c)
``and/or/xor.b32 d, a, b``      bitwise
``shr.u32 / shl.b32 d, a, n``   logical shifts
``sub/add/mul.{f16,bf16}x2``    two 16-bit lanes at once, rounded to nearest even
``fma.rn.{f16,bf16}x2 d,a,b,c`` a * b + c per lane, computed exactly and rounded *once*
==============================  ===========================================================

Arithmetic is exact (Python ``Fraction``) followed by one round-to-nearest-even to the lane's
format, which is what the PTX ISA specifies for ``.rn`` (and the default rounding of add, sub
and mul). Anything else (another opcode, a modifier, a non-finite lane) raises: the
interpreter never guesses.

Register routing. ``tl.inline_asm_elementwise(asm, "=r,=r,=r,=r,r", [p], dtype=(f16,) * 4,
pack=2)`` names the four output registers ``$0..$3`` and the input ``$4``. With ``pack=2``,
one call sees two consecutive int16 elements in ``$4`` (element 0 in bits 0-15), and each of
the four 16-bit outputs takes one register of two lanes (element 0 in the low lane).
``run_pack2`` applies that routing, so a test compares the strings' results element by
element with the plain dequantization formula.
"""
from __future__ import annotations

import re
from fractions import Fraction

import numpy as np

# (significand bits including the implicit one, smallest normal exponent, largest exponent)
_FORMATS = {"f16": (11, -14, 15), "bf16": (8, -126, 127)}
_LOGIC = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}
_MASK32 = 0xFFFFFFFF


# ---------------------------------------------------------------------------- parsing

def parse(asm: str) -> list[tuple[str, list[str]]]:
    """PTX text -> [(opcode with modifiers, [operands])], register declarations included.

    Braces (a scope) and blank lines are dropped; every statement ends with ';'.
    """
    body = asm.replace("{", " ").replace("}", " ")
    statements = [s.strip() for s in body.split(";")]
    out = []
    for s in statements:
        if not s:
            continue
        m = re.fullmatch(r"(\.?[\w.]+)\s+(.*)", s, flags=re.S)
        if not m:
            raise ValueError(f"cannot parse the PTX statement {s!r}")
        opcode, rest = m.group(1), m.group(2)
        if opcode == ".reg":                                    # .reg .b32 a, b, c
            kind, _, names = rest.partition(" ")
            if kind != ".b32":
                raise ValueError(f"only .reg .b32 declarations are modelled, got {s!r}")
            out.append((".reg", [n.strip() for n in names.split(",")]))
            continue
        out.append((opcode, [o.strip() for o in rest.split(",")]))
    return out


# ---------------------------------------------------------------------------- 16-bit lanes

def _to_fraction(bits: int, fmt: str) -> Fraction:
    """One 16-bit lane's bit pattern -> its exact value (finite lanes only)."""
    if fmt == "f16":
        value = float(np.array([bits], np.uint16).view(np.float16)[0])
    else:                                                        # bf16: top half of an fp32
        value = float(np.array([bits << 16], np.uint32).view(np.float32)[0])
    if not np.isfinite(value):
        raise ValueError(f"lane 0x{bits:04X} is not finite in {fmt}: the course's asm never "
                         "makes inf or NaN, so the interpreter does not model them")
    return Fraction(value)


def _round(x: Fraction, fmt: str) -> int:
    """Round an exact value to the nearest ``fmt`` value, ties to even -> its 16 bits."""
    p, emin, emax = _FORMATS[fmt]
    if x == 0:
        return 0
    sign, a = (1, -x) if x < 0 else (0, x)
    e = a.numerator.bit_length() - a.denominator.bit_length()   # 2**e <= a < 2**(e+2)
    if Fraction(2) ** e > a:
        e -= 1
    elif Fraction(2) ** (e + 1) <= a:
        e += 1                                                   # now 2**e <= a < 2**(e+1)
    quantum = Fraction(2) ** (max(e, emin) - (p - 1))            # spacing of the format there
    r = round(a / quantum) * quantum                             # Fraction round: half to even
    if r >= Fraction(2) ** (emax + 1):
        raise ValueError(f"{float(x)} overflows {fmt}: the interpreter does not model inf")
    value = float(-r if sign else r)
    if fmt == "f16":
        return int(np.array([value], np.float16).view(np.uint16)[0])
    return int(np.array([value], np.float32).view(np.uint32)[0]) >> 16


def _lanewise(fn, fmt: str, *regs: np.ndarray) -> np.ndarray:
    """Apply an exact per-lane function to 32-bit registers of two ``fmt`` lanes."""
    out = np.zeros_like(regs[0])
    for idx in np.ndindex(regs[0].shape):
        word = 0
        for lane in (0, 1):
            args = [_to_fraction((int(r[idx]) >> (16 * lane)) & 0xFFFF, fmt) for r in regs]
            word |= _round(fn(*args), fmt) << (16 * lane)
        out[idx] = word
    return out


# ---------------------------------------------------------------------------- execution

def _prmt(a: np.ndarray, b: np.ndarray, sel: np.ndarray) -> np.ndarray:
    """``prmt.b32`` default mode: the eight bytes {b, a} (a = bytes 0-3), picked by selector
    nibbles; bit 3 of a nibble (sign replication) is not modelled and raises."""
    if np.any(sel & 0x8888):
        raise ValueError("prmt selectors with bit 3 set (sign replication) are not modelled")
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = np.zeros_like(a)
    for i in range(4):
        pick = ((sel >> (4 * i)) & 0x7).astype(np.intp)
        byte = np.choose(pick, src)
        out |= byte << (8 * i)
    return out


def _lop3(a, b, c, lut: int) -> np.ndarray:
    """``lop3.b32``: bit k of the result = bit (4 a_k + 2 b_k + c_k) of ``lut``."""
    out = np.zeros_like(a)
    for i in range(8):
        if lut >> i & 1:
            ta = a if i & 4 else ~a & _MASK32
            tb = b if i & 2 else ~b & _MASK32
            tc = c if i & 1 else ~c & _MASK32
            out |= ta & tb & tc
    return out


def run(asm: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Execute PTX text on uint32 registers; returns every register's final value.

    ``inputs``: register name (``"$4"``) -> uint32 array (all the same shape; one GPU thread
    per element). Registers the code writes before reading need no input.
    """
    regs: dict[str, np.ndarray] = {k: np.asarray(v, dtype=np.uint64) for k, v in inputs.items()}
    shape = next(iter(regs.values())).shape
    declared = set(regs)

    def value(op: str) -> np.ndarray:
        if re.fullmatch(r"-?(0x[0-9A-Fa-f]+|\d+)", op):
            return np.full(shape, int(op, 0) & _MASK32, dtype=np.uint64)
        if op not in regs:
            raise ValueError(f"register {op} is read before it is written")
        return regs[op]

    for opcode, ops in parse(asm):
        if opcode == ".reg":
            declared.update(ops)
            continue
        dest, args = ops[0], [value(o) for o in ops[1:]]
        if dest not in declared and not dest.startswith("$"):
            raise ValueError(f"register {dest} is written but never declared")
        parts = opcode.split(".")
        name = parts[0]
        if opcode == "mov.b32":
            result = args[0]
        elif opcode == "prmt.b32":
            result = _prmt(*args)
        elif opcode == "lop3.b32":
            if len(set(int(v) for v in args[3].ravel())) != 1:
                raise ValueError("lop3's lookup table must be an immediate")
            result = _lop3(args[0], args[1], args[2], int(args[3].ravel()[0]))
        elif name in _LOGIC and parts[1:] == ["b32"]:
            result = _LOGIC[name](args[0], args[1])
        elif opcode == "shr.u32":
            result = np.where(args[1] >= 32, 0, args[0] >> np.minimum(args[1], 31))
        elif opcode == "shl.b32":
            result = np.where(args[1] >= 32, 0, args[0] << np.minimum(args[1], 31))
        elif name in ("add", "sub", "mul", "fma") and parts[-1] in ("f16x2", "bf16x2"):
            mods = parts[1:-1]
            if mods not in ([], ["rn"]) or (name == "fma" and mods != ["rn"]):
                raise ValueError(f"{opcode}: only round-to-nearest-even is modelled")
            fmt = parts[-1][:-2]
            fn = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b,
                  "mul": lambda a, b: a * b, "fma": lambda a, b, c: a * b + c}[name]
            result = _lanewise(fn, fmt, *args)
        else:
            raise ValueError(f"the interpreter does not model {opcode!r} (statement: "
                             f"{opcode} {', '.join(ops)})")
        regs[dest] = np.asarray(result, dtype=np.uint64) & _MASK32
    return {k: v.astype(np.uint32) for k, v in regs.items()}


def run_pack2(asm: str, data: np.ndarray, n_outputs: int = 4) -> list[np.ndarray]:
    """Run ``asm`` as ``tl.inline_asm_elementwise(..., pack=2)`` would on 16-bit ``data``.

    data: uint16 (or int16) (n,) with n even. The input register is ``$n_outputs`` (after
    the outputs' registers); each output takes one register of two 16-bit lanes. Returns
    ``n_outputs`` uint16 arrays (n,): the lanes' bit patterns, element i from element i.
    """
    data = np.asarray(data)
    if data.dtype not in (np.uint16, np.int16) or data.ndim != 1 or data.size % 2:
        raise ValueError("data must be 1-D 16-bit integers with an even number of elements "
                         "(pack=2)")
    words = data.view(np.uint16).view(np.uint32)             # element 0 in bits 0-15
    regs = run(asm, {f"${n_outputs}": words})
    outs = []
    for k in range(n_outputs):
        r = regs[f"${k}"]
        lanes = np.stack([r & 0xFFFF, r >> 16], axis=-1)     # elements 0, 1 of each call
        outs.append(lanes.astype(np.uint16).reshape(-1))
    return outs


__all__ = ["parse", "run", "run_pack2"]
