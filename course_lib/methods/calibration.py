"""Calibration shared by the weight-only methods: text, block-by-block runs, group-quantized
Linears (lessons 06 and 07).

GPTQ and AWQ both look at what flows into each Linear on a small *calibration* text (never the
evaluation text). They quantize the model one decoder block at a time:

    x = embed(calibration ids)                        # (n, T, D), the first block's inputs
    for block in model.model.layers:
        method(block, x, cos, sin)                    # look at x, quantize this block in place
        x = block(x)                                  # inputs of the next block, produced by
                                                      # the already-quantized blocks before it

so memory holds one block's activations at a time and every block sees the errors of the blocks
already quantized, as it will when the model runs (``inputs="fp"`` calibrates every block on
the unquantized model's activations instead, as llm-awq's code does). Any
:class:`~course_lib.model.LlamaModel`
works (the bundled model, SmolLM2 from ``course_lib.smollm``, or a downloaded Llama checkpoint).

What a method produces is a :class:`GroupQuantLinear`: the integer codes, group scales (and zero
points) it chose, and the dequantized weight it computes with. ``course_lib.export`` writes those
codes, unchanged, into a checkpoint a serving engine loads.
"""
from __future__ import annotations

import copy
import time
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib import quant
from course_lib.gguf_model import reciprocal_or_zero

#: What each block is calibrated on (see :func:`quantize_blockwise`).
INPUTS = ("quantized", "fp")
#: The bundled model's default calibration: 64 windows of 256 bytes from its training split.
BUNDLED_WINDOWS, BUNDLED_WINDOW = 64, 256


# ----------------------------------------------------------------------------- calibration text
def check_bits(bits) -> int:
    """Refuse a bit width outside 2..8 (what the methods and the export support)."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"bits must be a whole number from 2 to 8 (4 and 3 are the usual "
                         f"weight-only widths); got {bits!r}")
    return bits


def windows_from_ids(ids: torch.Tensor, n_windows: int, window: int, seed: int = 0
                     ) -> torch.Tensor:
    """``n_windows`` non-overlapping windows of ``window`` tokens, chosen at random (seeded)
    from the 1-D token ids of a calibration text: (n_windows, window) int64."""
    ids = torch.as_tensor(ids).long().flatten()                          # (N,)
    if window < 1 or n_windows < 1:
        raise ValueError(f"window and n_windows must be >= 1; got {window}, {n_windows}")
    available = len(ids) // window
    if available < 1:
        raise ValueError(f"the calibration text has {len(ids)} tokens, shorter than one window "
                         f"of {window}: use a longer text or a smaller window")
    if n_windows > available:
        raise ValueError(f"asked for {n_windows} calibration windows of {window} tokens but the "
                         f"text holds only {available}; ask for fewer or use a longer text")
    g = torch.Generator().manual_seed(seed)
    pick = torch.randperm(available, generator=g)[:n_windows].sort().values  # (n,)
    return ids[pick[:, None] * window + torch.arange(window)[None, :]]       # (n, window)


def bundled_calibration_text(max_bytes: int = 4_000_000) -> bytes:
    """The bundled model's calibration text: its own training split (stdlib files, see
    ``course_lib.data``), never the held-out evaluation text; at most ``max_bytes``."""
    from course_lib import data
    train, _ = data.split()
    parts, total = [], 0
    for rel in train:          # sorted paths: the same bytes on every machine with this Python
        b = (data.stdlib_dir() / rel).read_bytes()
        parts.append(b)
        total += len(b) + len(data.FILE_SEPARATOR)
        if total >= max_bytes:
            break
    return data.FILE_SEPARATOR.join(parts)[:max_bytes]


def calibration_ids(model_name: str = "bundled", n_windows: int | None = None,
                    window: int | None = None, seed: int = 0,
                    protocol: str | None = None) -> torch.Tensor:
    """Calibration token windows (n, T) for ``"bundled"`` or ``"smollm2"`` (lesson 06).

    bundled: windows of its training split (default 64 x 256 bytes); smollm2: windows of the
    calibration part of the bundled reference text (default 64 x 512 tokens, the protocol
    llm-compressor's figures in lesson 06 use) under ``protocol`` ("clean" or "v1": see
    ``course_lib.smollm.PROTOCOLS``; None: its default).
    """
    if model_name == "bundled":
        from course_lib import data
        if protocol is not None:
            raise ValueError("protocol applies to SmolLM2's English text only; the bundled "
                             "model's calibration is its training split")
        ids = data.to_tensor(bundled_calibration_text())                   # (N,)
        return windows_from_ids(ids, n_windows or BUNDLED_WINDOWS, window or BUNDLED_WINDOW, seed)
    if model_name == "smollm2":
        from course_lib import smollm
        ids = smollm.calibration_ids(protocol=protocol)                     # (N,)
        return windows_from_ids(ids, n_windows or 64, window or 512, seed)
    raise ValueError(f"unknown model {model_name!r}; known: 'bundled', 'smollm2'")


# ----------------------------------------------------------------------------- quantized Linear
def group_params(w: torch.Tensor, bits: int, symmetric: bool = True):
    """Scale (and zero point) per row of a group of columns w (..., g), as lessons 02-03 define
    them (``quant.quantize``, written out in torch for speed; tests check they agree):
    symmetric: scale = max|w| / (2**(bits-1) - 1); asymmetric: the range widened to include 0,
    scale = (max - min) / (2**bits - 1), zero = round(-min / scale). An all-zero row gets
    scale 1. Returns (scale (...,), zero (...,) int32 or None), fp32 (fp64 stays fp64).
    This is the course's grid; :func:`get_grid` gives the others (llm-compressor, llama.cpp).
    """
    check_bits(bits)
    w = w.to(torch.float64 if w.dtype == torch.float64 else torch.float32)
    if symmetric:
        scale = w.abs().amax(-1) / (2 ** (bits - 1) - 1)
        return torch.where(scale == 0, torch.ones_like(scale), scale), None
    levels = 2 ** bits - 1
    lo, hi = w.amin(-1).clamp(max=0.0), w.amax(-1).clamp(min=0.0)
    scale = (hi - lo) / levels
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    zero = torch.clamp(torch.round(-lo / scale), 0, levels)
    return scale, zero.to(torch.int32)


def quantize_with(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, bits: int):
    """Codes of w (..., rows) with given per-row scale/zero (the grid of ``group_params``):
    symmetric int8 codes in -qmax..qmax, or asymmetric uint8 codes in 0..2**bits-1."""
    if zero is None:
        qmax = 2 ** (bits - 1) - 1
        return torch.clamp(torch.round(w / scale), -qmax, qmax).to(torch.int8)
    return torch.clamp(torch.round(w / scale) + zero, 0, 2 ** bits - 1).to(torch.uint8)


def dequantize_with(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None):
    """(q - zero) * scale in fp32."""
    q = q.float()
    return (q if zero is None else q - zero.float()) * scale.float()


# ----------------------------------------------------------------------------- grids
class Grid:
    """How a group of weights becomes integer codes and back (lessons 06, 07 and 13).

    A grid answers four questions for GPTQ, AWQ and round-to-nearest:

    - ``params(w, bits, symmetric)``: the group's parameters (scale, second) from its weights
      w (..., g), in fp32 (``second``: an integer zero point, a float offset, or None);
    - ``store(scale, second, scale_dtype)``: the same parameters as a checkpoint stores them;
    - ``quantize(w, scale, second, bits)``: codes of values w (...,) given per-row parameters:
      the stored ones when ``codes_from_stored`` (the course, llm-compressor), the fp32 ones
      otherwise (llama.cpp computes codes with 1/d of its fp32 d, then stores d as fp16);
    - ``dequantize(codes, scale, second)``: the weight a layer computes with (stored params).

    ``up_front``: GPTQ takes every group's parameters from the original weight before the
    column loop (llm-compressor 0.14: ``modifiers/gptq/base.py:235, 313, 340-347``), instead of
    from the updated columns when the loop reaches the group (the paper's code and the course).
    llm-compressor pairs this with static act-order by default (``GPTQModifier.actorder``,
    ``base.py:132, 154-158``). Get one with :func:`get_grid`.
    """
    name = "course"
    symmetric: bool | None = None        # None: the caller chooses (the course's grid)
    bits: int | None = None              # None: any width 2..8
    group_size: int | None = None        # None: any group size that divides the inputs
    up_front = False
    codes_from_stored = True
    default_scale_dtype = torch.float32

    def check(self, bits, group_size=None, symmetric=None, scale_dtype=None) -> bool:
        """Refuse what this grid does not define; returns the symmetry the grid uses."""
        check_bits(bits)
        if self.bits is not None and bits != self.bits:
            raise ValueError(f"grid {self.name!r} is {self.bits}-bit only; got bits={bits} "
                             f"(use grid='course' or 'llm-compressor' for other widths)")
        if self.group_size is not None and group_size is not None \
                and group_size != self.group_size:
            raise ValueError(f"grid {self.name!r} uses blocks of {self.group_size} weights only; "
                             f"got group_size={group_size} (pass group_size={self.group_size})")
        if symmetric is not None and self.symmetric is not None and symmetric != self.symmetric:
            kind = "symmetric" if self.symmetric else "asymmetric (a per-block minimum)"
            raise ValueError(f"grid {self.name!r} is {kind}; got symmetric={symmetric} (leave "
                             f"symmetric=None to use the grid's own)")
        if scale_dtype is not None and self.default_scale_dtype == torch.float16 \
                and scale_dtype != torch.float16:
            raise ValueError(f"grid {self.name!r} stores its scales as torch.float16 (llama.cpp's "
                             f"blocks); got scale_dtype={scale_dtype} (leave it None)")
        return self.symmetric if self.symmetric is not None else \
            (True if symmetric is None else bool(symmetric))

    def params(self, w, bits, symmetric=True):
        return group_params(w, bits, symmetric)

    def store(self, scale, second, scale_dtype=None):
        return scale.to(scale_dtype or self.default_scale_dtype), second

    def quantize(self, w, scale, second, bits):
        return quantize_with(w, scale.to(w.dtype), second, bits)

    def dequantize(self, q, scale, second):
        return dequantize_with(q, scale, second)

    def code_dtype(self, symmetric):
        return torch.int8 if symmetric else torch.uint8

    def linear(self, codes, scale, second, bits, group_size, bias, dtype, method):
        """A :class:`GroupQuantLinear` holding the stored codes and parameters."""
        return GroupQuantLinear(codes, scale, second, bits, group_size, bias, dtype, method,
                                grid=self.name)

    def __repr__(self):
        return f"<grid {self.name!r}>"


class LLMCompressorGrid(Grid):
    """llm-compressor's symmetric integer grid (compressed-tensors' ``calculate_qparams``):
    scale = max|w| / ((2**bits - 1) / 2) (absmax / 7.5 at 4 bits), codes round(w / scale)
    clamped to -2**(bits-1)..2**(bits-1)-1 (-8..7 at 4 bits): the largest |w| of a group sits
    7.5 steps from 0, so a negative one reaches code -8 and a positive one rounds to 8 and is
    clamped to 7. At 3 bits: absmax / 3.5, codes -4..3, 8 levels (the course's symmetric INT3
    has 7). With GPTQ every group's scale is computed up front from the original weight
    (``up_front``). An all-zero group gets scale 1 (codes 0)."""
    name, symmetric, up_front = "llm-compressor", True, True

    def params(self, w, bits, symmetric=True):
        w = w.to(torch.float64 if w.dtype == torch.float64 else torch.float32)
        scale = w.abs().amax(-1) / ((2 ** bits - 1) / 2)
        return torch.where(scale == 0, torch.ones_like(scale), scale), None

    def quantize(self, w, scale, second, bits):
        lo, hi = -2 ** (bits - 1), 2 ** (bits - 1) - 1
        return torch.clamp(torch.round(w / scale.to(w.dtype)), lo, hi).to(torch.int8)


class LLMCompressorGridOnly(LLMCompressorGrid):
    """llm-compressor's grid (absmax / 7.5, codes -8..7) with the course's timing: GPTQ sets a
    group's scale when the loop reaches it, from the corrected columns. Beside
    'llm-compressor' it separates the effect of the grid from that of scales set up front
    (lesson 06's experiment)."""
    name, up_front = "llm-compressor-grid", False


class Q4_0Grid(Grid):
    """llama.cpp's Q4_0 (``quantize_row_q4_0_ref`` in ggml-quants.c), blocks of 32, 4 bits:
    m = the block's value with the largest |w| (sign kept; the first one on a tie),
    d = m / -8 in fp32, id = 1/d (0 when d = 0) from that fp32 d, code
    q = clamp(floor(w * id + 8.5), 0, 15) - 8 (so -8..7; m lands on -8), all in fp32. The
    block stores fp16(d) and the weight is q * fp16(d). Codes come from the fp32 d's
    reciprocal, as in llama.cpp, not from the stored fp16 d (``codes_from_stored`` False).
    An all-zero block gets d = 0 and codes 0. Codes are kept here as -8..7 (int8); llama.cpp's
    nibble is code + 8."""
    name, symmetric, bits, group_size = "q4_0", True, 4, 32
    codes_from_stored = False
    default_scale_dtype = torch.float16

    def params(self, w, bits=4, symmetric=True):
        w = w.float()
        i = w.abs().argmax(-1, keepdim=True)                  # first index of the largest |w|
        m = w.gather(-1, i).squeeze(-1)                       # (...,) signed
        return m / -8.0, None

    def store(self, scale, second, scale_dtype=None):
        return scale.float().to(torch.float16), None

    def quantize(self, w, scale, second, bits=4):
        inv = reciprocal_or_zero(scale)                                                 # fp32, as in C
        return (w.float() * inv).add_(8.5).floor_().clamp_(0, 15).sub_(8).to(torch.int8)


class Q4_1Grid(Grid):
    """llama.cpp's Q4_1 (``quantize_row_q4_1_ref``), blocks of 32, 4 bits: min and max of the
    block (0 need not lie between them), d = (max - min) / 15 and id = 1/d (0 when d = 0) in
    fp32, code q = clamp(floor((w - min) * id + 0.5), 0, 15) with the fp32 min and id; the
    block stores d and m = min as fp16 and the weight is fp16(d) * q + fp16(m). ``second`` is
    that float offset m (not an integer zero point)."""
    name, symmetric, bits, group_size = "q4_1", False, 4, 32
    codes_from_stored = False
    default_scale_dtype = torch.float16

    def params(self, w, bits=4, symmetric=False):
        w = w.float()
        lo, hi = w.amin(-1), w.amax(-1)
        return (hi - lo) / 15.0, lo

    def store(self, scale, second, scale_dtype=None):
        return scale.float().to(torch.float16), second.float().to(torch.float16)

    def quantize(self, w, scale, second, bits=4):
        x = (w.float() - second.float()).mul_(reciprocal_or_zero(scale))
        return x.add_(0.5).floor_().clamp_(0, 15).to(torch.uint8)

    def dequantize(self, q, scale, second):
        return q.float() * scale.float() + second.float()

    def code_dtype(self, symmetric):
        return torch.uint8

    def linear(self, codes, scale, second, bits, group_size, bias, dtype, method):
        return GroupQuantLinear(codes, scale, None, bits, group_size, bias, dtype, method,
                                offset=second, grid=self.name)


GRIDS = {"course": Grid(), "llm-compressor": LLMCompressorGrid(),
         "llm-compressor-grid": LLMCompressorGridOnly(), "q4_0": Q4_0Grid(), "q4_1": Q4_1Grid()}


def get_grid(grid) -> Grid:
    """The :class:`Grid` named ``grid`` ("course", "llm-compressor", "q4_0", "q4_1"), or the
    grid object itself (lessons 06, 07, 13)."""
    if isinstance(grid, Grid):
        return grid
    if not isinstance(grid, str) or grid not in GRIDS:
        raise ValueError(f"unknown grid {grid!r}; known: {sorted(GRIDS)} ('course': absmax/7, "
                         f"codes -7..7 at 4 bits; 'llm-compressor': absmax/7.5, codes -8..7; "
                         f"'q4_0', 'q4_1': llama.cpp's 4-bit blocks of 32)")
    return GRIDS[grid]


def grid_quantize(w: torch.Tensor, bits: int, group_size: int, symmetric: bool | None = None,
                  grid="course", scale_dtype: torch.dtype | None = None):
    """Round-to-nearest of w (out, in) in groups of ``group_size`` on a grid: (codes (out, in),
    stored scale (out, G), stored second (out, G) or None) (lessons 06, 07, 13)."""
    gr = get_grid(grid)
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise ValueError(f"w must be a 2-D weight (out, in); got "
                         f"{tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__}")
    out_f, in_f = w.shape
    check_group_size(in_f, group_size)
    sym = gr.check(bits, group_size, symmetric, scale_dtype)
    wg = w.float().reshape(out_f, in_f // group_size, group_size)           # (out, G, gs)
    scale, second = gr.params(wg, bits, sym)                                # (out, G)
    st_scale, st_second = gr.store(scale, second, scale_dtype)
    qs, qz = (st_scale, st_second) if gr.codes_from_stored else (scale, second)
    codes = gr.quantize(wg, qs[..., None], None if qz is None else qz[..., None], bits)
    return codes.reshape(out_f, in_f), st_scale, st_second


def fake_quant_groups(wg: torch.Tensor, bits: int, symmetric: bool | None = None,
                      grid="course") -> torch.Tensor:
    """Round-to-nearest of every group along the last dim of wg (..., gs) on a grid,
    dequantized with the stored parameters, fp32 (AWQ's clipping search, lesson 07)."""
    gr = get_grid(grid)
    sym = gr.check(bits, None, symmetric)
    scale, second = gr.params(wg, bits, sym)                                # (...,)
    st_scale, st_second = gr.store(scale, second)
    qs, qz = (st_scale, st_second) if gr.codes_from_stored else (scale, second)
    codes = gr.quantize(wg, qs[..., None], None if qz is None else qz[..., None], bits)
    return gr.dequantize(codes, st_scale[..., None],
                         None if st_second is None else st_second[..., None])


def fake_quant(w: torch.Tensor, bits: int, group_size: int, symmetric: bool | None = None,
               grid="course"):
    """Round-to-nearest of w (out, in) in groups of ``group_size`` columns on a grid,
    dequantized, fp32 (lessons 06-07). On the course's grid it equals
    ``quant.fake_quantize(w, f"int{bits}", "per_group", group_size, symmetric)``."""
    codes, scale, second = grid_quantize(w, bits, group_size, symmetric, grid)
    out_f, in_f = w.shape
    G = in_f // group_size
    wq = get_grid(grid).dequantize(codes.view(out_f, G, group_size), scale[..., None],
                                   None if second is None else second[..., None])
    return wq.reshape(out_f, in_f)


class GroupQuantLinear(nn.Module):
    """A Linear whose weight is group-wise integer codes + scales (+ zero points or offsets)
    chosen by a method (RTN, GPTQ, AWQ) on a grid; ``forward`` uses the dequantized weight
    (lessons 06-07).

    Buffers: ``codes`` (out, in) int8 (symmetric grids: -qmax..qmax on the course's grid,
    -8..7 on 'llm-compressor' and 'q4_0') or uint8 (asymmetric, 0..2**bits-1); ``scale``
    (out, in/group_size) in the scale dtype; ``zero`` (out, G) int32 or None; ``offset``
    (out, G) fp16 or None (llama.cpp's Q4_1 minimum m). ``weight`` is
    (codes - zero) * scale + offset in the original weight's dtype. ``grid``: the grid's name.
    """

    def __init__(self, codes, scale, zero, bits: int, group_size: int, bias=None,
                 dtype=torch.float32, method: str = "rtn", offset=None, grid: str = "course"):
        super().__init__()
        if not isinstance(codes, torch.Tensor) or codes.dim() != 2:
            raise ValueError(f"codes must be a 2-D tensor (out, in); got "
                             f"{tuple(getattr(codes, 'shape', ())) or type(codes).__name__}")
        out_f, in_f = codes.shape
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1 \
                or in_f % group_size:
            raise ValueError(f"group_size must be a whole number that divides the {in_f} inputs; "
                             f"got {group_size!r}")
        want = (out_f, in_f // group_size)
        for what, t in (("scale", scale), ("zero", zero), ("offset", offset)):
            if t is not None and tuple(t.shape) != want:
                raise ValueError(f"{what} has shape {tuple(t.shape)}; codes {tuple(codes.shape)} "
                                 f"in groups of {group_size} need one per row and group: "
                                 f"{want} ({in_f} / {group_size} = {in_f // group_size} groups)")
        self.out_features, self.in_features = out_f, in_f
        self.bits, self.group_size, self.method, self.grid = bits, group_size, method, grid
        self.symmetric = zero is None and offset is None
        self.register_buffer("codes", codes)                                 # (out, in)
        self.register_buffer("scale", scale)                                 # (out, G)
        self.register_buffer("zero", zero)                                   # (out, G) or None
        self.register_buffer("offset", offset)                               # (out, G) or None
        self.weight = nn.Parameter(self.dequantized().to(dtype), requires_grad=False)
        self.bias = bias

    def dequantized(self) -> torch.Tensor:
        """(out, in) fp32 weight from the codes."""
        G = self.scale.shape[1]
        q = self.codes.float().view(self.out_features, G, self.group_size)  # (out, G, gs)
        if self.zero is not None:
            q = q - self.zero.float()[..., None]
        w = q * self.scale.float()[..., None]
        if self.offset is not None:
            w = w + self.offset.float()[..., None]
        return w.reshape(self.out_features, self.in_features)

    def forward(self, x):                                                   # (..., in) -> (..., out)
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        kind = "sym" if self.symmetric else "asym"
        grid = "" if self.grid == "course" else f" grid={self.grid}"
        return (f"{self.in_features}, {self.out_features}, int{self.bits} {kind} "
                f"g{self.group_size}{grid}, {self.method}")


def check_group_size(in_features: int, group_size: int) -> int:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
        raise ValueError(f"group_size must be a positive integer; got {group_size!r}")
    if in_features % group_size:
        divs = quant.divisors(in_features)
        raise ValueError(f"group_size {group_size} does not divide the layer's {in_features} "
                         f"inputs; group sizes that do: {divs[:16]}")
    return group_size


def check_model(model: nn.Module, bits: int, group_size: int, symmetric=None, grid="course",
                scale_dtype=None) -> bool:
    """Refuse bits outside 2..8, a group size that does not divide every block Linear's
    inputs, or what the grid does not define, before any work is done. Returns the symmetry
    the grid uses."""
    sym = get_grid(grid).check(bits, group_size, symmetric, scale_dtype)
    for block in model.model.layers:
        for name, lin in linears(block).items():
            try:
                check_group_size(lin.in_features, group_size)
            except ValueError as e:
                raise ValueError(f"{name}: {e}") from None
    return sym


def rtn_linear(linear: nn.Linear, bits: int = 4, group_size: int = 128,
               symmetric: bool | None = None, scale_dtype: torch.dtype | None = None,
               method: str = "rtn", grid="course") -> GroupQuantLinear:
    """Round-to-nearest of one Linear into a :class:`GroupQuantLinear` (the baseline of lesson
    04, with the codes kept). On the course's grid its weight equals ``quant.fake_quantize(w,
    f"int{bits}", "per_group", group_size, symmetric)`` when ``scale_dtype`` is fp32.
    symmetric / scale_dtype None: the grid's own (the course: symmetric, fp32 scales)."""
    gr = get_grid(grid)
    sym = gr.check(bits, group_size, symmetric, scale_dtype)
    w = linear.weight.detach().float()                                      # (out, in)
    check_group_size(w.shape[1], group_size)
    if gr.name == "course":
        qt = quant.quantize(w, f"int{bits}", "per_group", group_size, sym)
        scale = qt.scale.to(scale_dtype or torch.float32)                   # (out, G)
        return GroupQuantLinear(qt.q, scale, qt.zero, bits, group_size, linear.bias,
                                linear.weight.dtype, method)
    codes, scale, second = grid_quantize(w, bits, group_size, sym, gr, scale_dtype)
    return gr.linear(codes, scale, second, bits, group_size, linear.bias, linear.weight.dtype,
                     method)


# ----------------------------------------------------------------------------- block by block
def linears(module: nn.Module) -> dict[str, nn.Linear]:
    """The plain nn.Linear layers inside a module (a decoder block), by name."""
    return {n: m for n, m in module.named_modules() if type(m) is nn.Linear}


def replace(module: nn.Module, name: str, new: nn.Module) -> None:
    """Put ``new`` where the submodule ``name`` is."""
    parent_name, _, child = name.rpartition(".")
    parent = module.get_submodule(parent_name) if parent_name else module
    setattr(parent, child, new)


@torch.no_grad()
def run_block(block: nn.Module, x: torch.Tensor, cos, sin, batch_size: int = 16) -> torch.Tensor:
    """A decoder block on x (n, T, D) in batches: (n, T, D)."""
    return torch.cat([block(x[i:i + batch_size], cos, sin)
                      for i in range(0, x.shape[0], batch_size)])


def _progress(iterable, enabled: bool, desc: str):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm
    return tqdm(iterable, desc=desc, leave=False)


@torch.no_grad()
def quantize_blockwise(model: nn.Module, ids: torch.Tensor,
                       quantize_block: Callable[[nn.Module, torch.Tensor, torch.Tensor,
                                                 torch.Tensor], None],
                       batch_size: int = 16, inplace: bool = False, progress: bool = False,
                       desc: str = "blocks", n_blocks: int | None = None,
                       inputs: str = "quantized"):
    """Run ``quantize_block(block, x, cos, sin)`` on each decoder block in turn, x being that
    block's inputs on the calibration windows ``ids`` (n, T) as produced by the blocks already
    quantized (lessons 06-07). Returns ``(model, seconds)``; a copy unless ``inplace``.

    ``n_blocks``: quantize only the first n blocks (a quick slice for the lessons).
    ``inputs``: what the next block is calibrated on: "quantized" (the default) runs the block
    after quantizing it, so each block sees the errors of those before it (GPTQ's reference
    code does this); "fp" runs it before, so every block sees the unquantized model's
    activations (llm-awq's reference code does this).
    """
    if inputs not in INPUTS:
        raise ValueError(f"inputs must be one of {INPUTS} (what each block is calibrated on); "
                         f"got {inputs!r}")
    if not hasattr(model, "model") or not hasattr(model.model, "layers"):
        raise TypeError("quantize_blockwise needs a course_lib.model.LlamaModel (model.model."
                        "layers); load one with course_lib.model.load_pretrained or "
                        "course_lib.smollm.load")
    ids = torch.as_tensor(ids)
    if ids.dim() != 2:
        raise ValueError(f"calibration ids must be (windows, tokens); got {tuple(ids.shape)}")
    model.check_ids(ids)
    if ids.shape[1] > model.config.max_position_embeddings:
        raise ValueError(f"calibration windows of {ids.shape[1]} tokens exceed the model's "
                         f"context of {model.config.max_position_embeddings}")
    t0 = time.perf_counter()
    if not inplace:
        model = copy.deepcopy(model)
    layers = list(model.model.layers)[:n_blocks]
    cos, sin = model.rope(0, ids.shape[1])                                  # (T, hd) each
    x = torch.cat([model.model.embed_tokens(ids[i:i + batch_size])
                   for i in range(0, ids.shape[0], batch_size)])           # (n, T, D)
    for i, block in enumerate(_progress(layers, progress, desc)):
        last = i + 1 == len(layers)
        if inputs == "fp" and not last:
            x_next = run_block(block, x, cos, sin, batch_size)              # before quantizing
        quantize_block(block, x, cos, sin)
        if not last:
            x = x_next if inputs == "fp" else run_block(block, x, cos, sin, batch_size)
    return model, time.perf_counter() - t0


def rtn_model(model: nn.Module, bits: int = 4, group_size: int = 128,
              symmetric: bool | None = None, scale_dtype: torch.dtype | None = None,
              n_blocks: int | None = None, grid="course"):
    """Round-to-nearest on every Linear of the decoder blocks (not the head), as GroupQuantLinear
    (so it can be exported like GPTQ and AWQ), on a grid. Returns a quantized copy."""
    sym = check_model(model, bits, group_size, symmetric, grid, scale_dtype)
    model = copy.deepcopy(model)
    for block in list(model.model.layers)[:n_blocks]:
        for name, lin in linears(block).items():
            replace(block, name, rtn_linear(lin, bits, group_size, sym, scale_dtype, grid=grid))
    return model
