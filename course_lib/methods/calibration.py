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
already quantized, as it will when the model runs. Any :class:`~course_lib.model.LlamaModel`
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
                    window: int | None = None, seed: int = 0) -> torch.Tensor:
    """Calibration token windows (n, T) for ``"bundled"`` or ``"smollm2"`` (lesson 06).

    bundled: windows of its training split (default 64 x 256 bytes); smollm2: windows of the
    calibration part of the bundled reference text (default 64 x 512 tokens, the protocol
    llm-compressor's figures in lesson 06 use).
    """
    if model_name == "bundled":
        from course_lib import data
        ids = data.to_tensor(bundled_calibration_text())                   # (N,)
        return windows_from_ids(ids, n_windows or BUNDLED_WINDOWS, window or BUNDLED_WINDOW, seed)
    if model_name == "smollm2":
        from course_lib import smollm
        ids = smollm.calibration_ids()                                      # (N,)
        return windows_from_ids(ids, n_windows or 64, window or 512, seed)
    raise ValueError(f"unknown model {model_name!r}; known: 'bundled', 'smollm2'")


# ----------------------------------------------------------------------------- quantized Linear
def group_params(w: torch.Tensor, bits: int, symmetric: bool = True):
    """Scale (and zero point) per row of a group of columns w (..., g), as lessons 02-03 define
    them (``quant.quantize``, written out in torch for speed; tests check they agree):
    symmetric: scale = max|w| / (2**(bits-1) - 1); asymmetric: the range widened to include 0,
    scale = (max - min) / (2**bits - 1), zero = round(-min / scale). An all-zero row gets
    scale 1. Returns (scale (...,), zero (...,) int32 or None), fp32 (fp64 stays fp64).
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


def fake_quant(w: torch.Tensor, bits: int, group_size: int, symmetric: bool = True):
    """Round-to-nearest of w (out, in) in groups of ``group_size`` columns, dequantized: equal
    to ``quant.fake_quantize(w, f"int{bits}", "per_group", group_size, symmetric)`` (fp32)."""
    out_f, in_f = w.shape
    check_group_size(in_f, group_size)
    wg = w.float().reshape(out_f, in_f // group_size, group_size)           # (out, G, gs)
    scale, zero = group_params(wg, bits, symmetric)                         # (out, G)
    q = quantize_with(wg, scale[..., None], None if zero is None else zero[..., None], bits)
    return dequantize_with(q, scale[..., None],
                           None if zero is None else zero[..., None]).reshape(out_f, in_f)


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


class GroupQuantLinear(nn.Module):
    """A Linear whose weight is group-wise integer codes + scales (+ zero points) chosen by a
    method (RTN, GPTQ, AWQ); ``forward`` uses the dequantized weight (lessons 06-07).

    Buffers: ``codes`` (out, in) int8 (symmetric, -qmax..qmax) or uint8 (asymmetric,
    0..2**bits-1); ``scale`` (out, in/group_size) in ``scale_dtype``; ``zero`` (out, in/group)
    int32 or None. ``weight`` is (codes - zero) * scale in the original weight's dtype.
    """

    def __init__(self, codes, scale, zero, bits: int, group_size: int, bias=None,
                 dtype=torch.float32, method: str = "rtn"):
        super().__init__()
        out_f, in_f = codes.shape
        self.out_features, self.in_features = out_f, in_f
        self.bits, self.group_size, self.symmetric, self.method = bits, group_size, zero is None, method
        self.register_buffer("codes", codes)                                 # (out, in)
        self.register_buffer("scale", scale)                                 # (out, G)
        self.register_buffer("zero", zero)                                   # (out, G) or None
        self.weight = nn.Parameter(self.dequantized().to(dtype), requires_grad=False)
        self.bias = bias

    def dequantized(self) -> torch.Tensor:
        """(out, in) fp32 weight from the codes."""
        G = self.scale.shape[1]
        q = self.codes.float().view(self.out_features, G, self.group_size)  # (out, G, gs)
        if self.zero is not None:
            q = q - self.zero.float()[..., None]
        return (q * self.scale.float()[..., None]).reshape(self.out_features, self.in_features)

    def forward(self, x):                                                   # (..., in) -> (..., out)
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        kind = "sym" if self.symmetric else "asym"
        return (f"{self.in_features}, {self.out_features}, int{self.bits} {kind} "
                f"g{self.group_size}, {self.method}")


def check_group_size(in_features: int, group_size: int) -> int:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
        raise ValueError(f"group_size must be a positive integer; got {group_size!r}")
    if in_features % group_size:
        divs = quant.divisors(in_features)
        raise ValueError(f"group_size {group_size} does not divide the layer's {in_features} "
                         f"inputs; group sizes that do: {divs[:16]}")
    return group_size


def check_model(model: nn.Module, bits: int, group_size: int) -> None:
    """Refuse bits outside 2..8 and a group size that does not divide every block Linear's
    inputs, before any work is done."""
    check_bits(bits)
    for block in model.model.layers:
        for name, lin in linears(block).items():
            try:
                check_group_size(lin.in_features, group_size)
            except ValueError as e:
                raise ValueError(f"{name}: {e}") from None


def rtn_linear(linear: nn.Linear, bits: int = 4, group_size: int = 128, symmetric: bool = True,
               scale_dtype: torch.dtype = torch.float32, method: str = "rtn") -> GroupQuantLinear:
    """Round-to-nearest of one Linear into a :class:`GroupQuantLinear` (the baseline of lesson
    04, with the codes kept). Its weight equals ``quant.fake_quantize(w, f"int{bits}",
    "per_group", group_size, symmetric)`` when ``scale_dtype`` is fp32."""
    check_bits(bits)
    w = linear.weight.detach().float()                                      # (out, in)
    check_group_size(w.shape[1], group_size)
    qt = quant.quantize(w, f"int{bits}", "per_group", group_size, symmetric)
    scale = qt.scale.to(scale_dtype)                                        # (out, G)
    return GroupQuantLinear(qt.q, scale, qt.zero, bits, group_size, linear.bias,
                            linear.weight.dtype, method)


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
                       desc: str = "blocks", n_blocks: int | None = None):
    """Run ``quantize_block(block, x, cos, sin)`` on each decoder block in turn, x being that
    block's inputs on the calibration windows ``ids`` (n, T) as produced by the blocks already
    quantized (lessons 06-07). Returns ``(model, seconds)``; a copy unless ``inplace``.

    ``n_blocks``: quantize only the first n blocks (a quick slice for the lessons).
    """
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
        quantize_block(block, x, cos, sin)
        if i + 1 < len(layers):
            x = run_block(block, x, cos, sin, batch_size)                   # (n, T, D)
    return model, time.perf_counter() - t0


def rtn_model(model: nn.Module, bits: int = 4, group_size: int = 128, symmetric: bool = True,
              scale_dtype: torch.dtype = torch.float32, n_blocks: int | None = None):
    """Round-to-nearest on every Linear of the decoder blocks (not the head), as GroupQuantLinear
    (so it can be exported like GPTQ and AWQ). Returns a quantized copy."""
    check_model(model, bits, group_size)
    model = copy.deepcopy(model)
    for block in list(model.model.layers)[:n_blocks]:
        for name, lin in linears(block).items():
            replace(block, name, rtn_linear(lin, bits, group_size, symmetric, scale_dtype))
    return model
