"""Read a GGUF file (llama.cpp's format) of the llama, qwen2 or qwen3 architecture into the
course's own model (lesson 04; lesson 17 reads a learner's own file through
:mod:`course_lib.own_model`).

A GGUF file is one binary holding a model's metadata (architecture, widths, tokenizer) and its
tensors, most of them already quantized in llama.cpp's block formats. This module reads its header
with ``struct`` (:class:`GGUFFile`; the ``gguf`` package of the llama.cpp project supplies the
tables of tensor types and block sizes), maps the tensors' bytes, and turns them into
:class:`~course_lib.model.LlamaModel`'s names and layout. Two block formats matter here:

- **Q4_1** (SmolLM2's Linear weights): blocks of 32 weights along the input dimension, each with
  an fp16 scale ``d`` and an fp16 *float* minimum ``m``; codes ``q`` in 0..15; ``w = d * q + m``.
  20 bytes per 32 weights: 5 bits per weight. Unlike the integer zero point of lesson 02, the
  minimum is stored as a float, so the grid need not contain 0.
- **Q8_0** (its token embeddings): blocks of 32 with one fp16 scale; codes -127..127; ``w = d * q``.
  34 bytes per 32 weights: 8.5 bits per weight.

We keep the codes themselves (:class:`BlockQuantized`), so the course's "reference" model is
exactly the 4-bit model the file describes, and re-quantizing it with Q4_1's own rule
(:func:`quantize_q4_1`) reproduces it bit for bit.

One more detail: llama.cpp's converter reorders the rows of the query and key projections (it
interleaves the two halves of each head for its RoPE kernel); :func:`unpermute_rope_rows` undoes
that so the weights fit the Hugging Face layout that ``LlamaModel`` uses.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from course_lib.model import ModelConfig

BLOCK = 32                      # weights per block in Q4_0, Q4_1 and Q8_0
Q4_0_BYTES = 2 + BLOCK // 2      # fp16 scale, 16 bytes of nibbles
Q4_1_BYTES = 2 + 2 + BLOCK // 2  # fp16 scale, fp16 minimum, 16 bytes of nibbles
Q8_0_BYTES = 2 + BLOCK           # fp16 scale, 32 int8 codes
BLOCK_BYTES = {"q4_0": Q4_0_BYTES, "q4_1": Q4_1_BYTES, "q8_0": Q8_0_BYTES}
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0")
#: Every tensor type :func:`decode_tensor` decodes: the above and llama.cpp's 5-bit blocks
#: and k-quants, through :mod:`course_lib.kquants`' decoders.
DECODED_TYPES = SUPPORTED_TYPES + ("Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
#: GGUF architectures read here (``general.architecture``; llama.cpp's converter writes
#: Mistral as "llama") and the Hugging Face class each corresponds to.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}
#: What each architecture is, for messages.
ARCHITECTURE_EXAMPLES = ("the 'llama' architecture (SmolLM2, TinyLlama, Llama 2/3.x, Mistral), "
                         "'qwen2' (Qwen2, Qwen2.5) and 'qwen3' (Qwen3 dense)")

#: GGUF tensor names -> the course model's (Hugging Face) names; {i} is the layer.
GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}
#: The other tensors an architecture may hold (gguf-py's constants.py, llama-cpp-python 0.3.36:
#: MODEL_TENSOR.ATTN_Q ... "blk.{bid}.attn_q", ATTN_Q_NORM "blk.{bid}.attn_q_norm"): Qwen2's
#: q/k/v biases, Llama's optional o and MLP biases, Qwen3's per-head q/k norms.
GGUF_TO_HF_EXTRA = {
    **{f"blk.{{i}}.attn_{g}.bias": f"model.layers.{{i}}.self_attn.{h}_proj.bias"
       for g, h in (("q", "q"), ("k", "k"), ("v", "v"), ("output", "o"))},
    **{f"blk.{{i}}.ffn_{n}.bias": f"model.layers.{{i}}.mlp.{n}_proj.bias"
       for n in ("gate", "up", "down")},
    "blk.{i}.attn_q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
    "blk.{i}.attn_k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
}
#: llama.cpp's Llama 3 RoPE factors (one per frequency), folded into the config when read.
ROPE_FREQS = "rope_freqs.weight"


# ----------------------------------------------------------------------------- block formats
@dataclass
class BlockQuantized:
    """A weight (out, in) stored as llama.cpp block codes: ``w = scale * codes (+ minimum)``.

    kind "q4_0": codes int8 in -8..7 (the file stores q + 8), scale fp16 (out, in/32).
    kind "q4_1": codes uint8 in 0..15, scale and minimum fp16 (out, in/32).
    kind "q8_0": codes int8 in -127..127, scale fp16 (out, in/32), minimum None.
    """
    kind: str
    codes: torch.Tensor            # (out, in)
    scale: torch.Tensor            # (out, in/32) fp16
    minimum: torch.Tensor | None   # (out, in/32) fp16 for q4_1

    def dequantize(self) -> torch.Tensor:
        """fp32 weight (out, in), computed exactly as llama.cpp / gguf do (fp32 multiply, add)."""
        out, cols = self.codes.shape
        q = self.codes.reshape(out, cols // BLOCK, BLOCK).float()        # (out, nb, 32)
        w = self.scale.float()[..., None] * q                            # (out, nb, 32)
        if self.minimum is not None:
            w = w + self.minimum.float()[..., None]
        return w.reshape(out, cols)

    def rows(self, order: torch.Tensor) -> "BlockQuantized":
        """The same weight with its output rows reordered (order: (out,) int64, a permutation
        of the rows)."""
        n = self.codes.shape[0]
        if not isinstance(order, torch.Tensor) or order.dim() != 1 or order.is_floating_point() \
                or order.numel() != n or not torch.equal(torch.sort(order.long()).values,
                                                         torch.arange(n)):
            raise ValueError(f"order must be a permutation of the {n} rows, a 1-D integer tensor "
                             f"holding 0..{n - 1} once each (permute_rope_rows gives one); got "
                             + (f"{tuple(order.shape)} {order.dtype}"
                                if isinstance(order, torch.Tensor) else type(order).__name__))
        m = None if self.minimum is None else self.minimum[order]
        return BlockQuantized(self.kind, self.codes[order], self.scale[order], m)

    @property
    def bits_per_weight(self) -> float:
        return BLOCK_BYTES[self.kind] * 8 / BLOCK

    def to_bytes(self) -> np.ndarray:
        """The tensor as llama.cpp stores it: uint8 (out, in/32 * block bytes) (lesson 13)."""
        return pack_blocks(self)


def _whole(v, name: str, minimum: int = 1) -> int:
    """v as an int: a whole number >= ``minimum`` (not a bool, not a string)."""
    ok = (not isinstance(v, bool) and isinstance(v, (int, float, np.integer, np.floating))
          and np.isfinite(v) and int(v) == v and v >= minimum)
    if not ok:
        raise ValueError(f"{name} must be a whole number >= {minimum}; got {v!r}")
    return int(v)


def _raw_blocks(raw: np.ndarray, cols: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Raw bytes (rows, cols/32 * block bytes) of a llama.cpp block format, checked, as blocks
    (rows, nb, block bytes), and each block's fp16 scale d from its first two bytes (rows, nb)."""
    if isinstance(raw, torch.Tensor):
        raw = raw.detach().cpu().numpy()
    if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8 or raw.ndim != 2:
        raise ValueError(f"raw must be the tensor's bytes, a 2-D uint8 array (rows, bytes per "
                         f"row); got " + (f"{raw.shape} {raw.dtype}" if isinstance(raw, np.ndarray)
                                          else type(raw).__name__))
    cols = _whole(cols, "cols")
    if cols % BLOCK:
        raise ValueError(f"cols={cols}: a {kind.upper()} tensor stores blocks of {BLOCK} weights "
                         f"per row, so its column count is a multiple of {BLOCK}")
    rows, nb, size = raw.shape[0], cols // BLOCK, BLOCK_BYTES[kind]
    if raw.shape[1] != nb * size:
        raise ValueError(f"a {kind.upper()} tensor of {cols} columns needs {nb * size} bytes per "
                         f"row (blocks of 32); got {raw.shape[1]}: the file may be corrupt, or "
                         f"cols is not the tensor's column count")
    blocks = raw.reshape(rows, nb, size)                                 # (rows, nb, bytes)
    return blocks, _fp16_at(blocks, 0)


def _fp16_at(blocks: np.ndarray, at: int) -> np.ndarray:
    """The fp16 stored at byte ``at`` of every block: (rows, nb)."""
    return blocks[..., at:at + 2].copy().view(np.float16)[..., 0]


def _unnibble(qs: np.ndarray) -> np.ndarray:
    """16 bytes per block -> 32 codes 0..15: the low nibbles are weights 0..15, the high
    nibbles weights 16..31. (rows, nb, 16) uint8 -> (rows, nb, 32)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _result(kind, codes, d, m=None) -> BlockQuantized:
    rows, nb = d.shape
    """The codes (rows, nb, 32), scales and minimums (rows, nb) as a BlockQuantized."""
    return BlockQuantized(kind, torch.from_numpy(codes.reshape(rows, nb * BLOCK).copy()),
                          torch.from_numpy(d.copy()),
                          None if m is None else torch.from_numpy(m.copy()))


def unpack_q4_1(raw: np.ndarray, cols: int) -> BlockQuantized:
    """Raw Q4_1 bytes (rows, cols/32 * 20) -> codes uint8 (rows, cols), fp16 scale and minimum.

    In each 20-byte block: bytes 0-1 the scale, 2-3 the minimum, then 16 bytes of nibbles.
    """
    blocks, d = _raw_blocks(raw, cols, "q4_1")                               # (rows, nb, 20)
    return _result("q4_1", _unnibble(blocks[..., 4:]), d, _fp16_at(blocks, 2))


def unpack_q4_0(raw: np.ndarray, cols: int) -> BlockQuantized:
    """Raw Q4_0 bytes (rows, cols/32 * 18) -> codes int8 in -8..7 (rows, cols) and fp16 scale.

    In each 18-byte block: bytes 0-1 the scale d, then 16 bytes of nibbles, each weight stored
    as q + 8; ``w = d * q``.
    """
    blocks, d = _raw_blocks(raw, cols, "q4_0")                               # (rows, nb, 18)
    return _result("q4_0", _unnibble(blocks[..., 2:]).astype(np.int8) - np.int8(8), d)


def unpack_q8_0(raw: np.ndarray, cols: int) -> BlockQuantized:
    """Raw Q8_0 bytes (rows, cols/32 * 34) -> codes int8 (rows, cols) and fp16 scale."""
    blocks, d = _raw_blocks(raw, cols, "q8_0")                               # (rows, nb, 34)
    return _result("q8_0", blocks[..., 2:].copy().view(np.int8), d)


def dequantize_q4_1_blocks(raw: torch.Tensor) -> torch.Tensor:
    """Raw Q4_1 blocks (n, 20) uint8 -> their 32 weights each, (n, 32) fp32 (lesson 04).

    Bytes 0-1: scale d (fp16); 2-3: minimum m (fp16); byte 4 + i holds weight i in its low
    nibble and weight i + 16 in its high nibble. w = d * q + m, computed in fp32.
    """
    if not isinstance(raw, torch.Tensor) or raw.dtype != torch.uint8:
        raise TypeError(f"raw must be a uint8 torch tensor of bytes; got "
                        f"{type(raw).__name__} {getattr(raw, 'dtype', '')}")
    if raw.dim() != 2 or raw.shape[1] != Q4_1_BYTES:
        raise ValueError(f"raw must have shape (n_blocks, {Q4_1_BYTES}); got {tuple(raw.shape)}")
    return unpack_q4_1(raw.numpy(), BLOCK).dequantize()                      # (n, 32)


def quantize_q4_1(w: torch.Tensor) -> BlockQuantized:
    """Quantize w (out, in) with llama.cpp's Q4_1 rule (lesson 04).

    Per block of 32: min and max; d = (max - min) / 15; q = trunc((w - min) / d + 0.5) clipped
    to 0..15 (computed with the unrounded d and min, then both stored as fp16).
    """
    b = _blocks(w, "q4_1")                                               # (out, nb, 32)
    out, cols = w.shape
    lo = b.amin(-1, keepdim=True)                                        # (out, nb, 1)
    d = (b.amax(-1, keepdim=True) - lo) / 15                             # (out, nb, 1)
    fp16_max = float(torch.finfo(torch.float16).max)                     # 65504
    if float(lo.abs().max()) > fp16_max or float(d.max()) > fp16_max:
        where = int(torch.maximum(lo.abs(), d).flatten().argmax())
        raise ValueError(f"block {where} (row {where // (cols // BLOCK)}) has a minimum or a "
                         f"scale beyond fp16's range (|value| up to {fp16_max:g}): Q4_1 stores "
                         f"both as fp16, so they would become inf and the block would decode "
                         f"as inf/NaN (llama.cpp would write it so, silently). Rescale the "
                         f"weight, or keep this tensor in F32/BF16")
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = torch.trunc((b - lo) * inv + 0.5).clamp(0, 15).to(torch.uint8)   # (out, nb, 32)
    dh, mh = d[..., 0].half(), lo[..., 0].half()
    _no_lost_blocks(b, (dh == 0) & (mh == 0), "q4_1")                    # w = d q + m: both 0
    return BlockQuantized("q4_1", q.reshape(out, cols), dh, mh)


def _blocks(w: torch.Tensor, kind: str) -> torch.Tensor:
    """w (out, in) -> fp32 blocks (out, in/32, 32), refusing what a block format cannot hold."""
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"{kind.upper()} quantizes a 2-D floating-point weight (out, in), a "
                         f"torch tensor (torch.from_numpy for an array); got "
                         + (f"{tuple(w.shape)} {w.dtype}" if isinstance(w, torch.Tensor)
                            else type(w).__name__))
    if w.shape[0] == 0:
        raise ValueError(f"w has no rows (shape {tuple(w.shape)}): nothing to quantize")
    if w.shape[1] % BLOCK or w.shape[1] == 0:
        raise ValueError(f"{kind.upper()} stores blocks of {BLOCK} weights along each row: the "
                         f"input width must be a multiple of {BLOCK}; got {w.shape[1]}")
    if not torch.isfinite(w).all():
        raise ValueError(f"the weight holds NaN or inf: {kind.upper()} cannot represent them")
    out, cols = w.shape
    return w.detach().float().reshape(out, cols // BLOCK, BLOCK)         # (out, nb, 32)


def _fp16_scales(d: torch.Tensor, kind: str) -> torch.Tensor:
    """Block scales as the file stores them (fp16), refusing one that overflows to inf."""
    h = d.half()
    if not bool(torch.isfinite(h).all()):
        big = float(d[~torch.isfinite(h)].abs().max())
        raise ValueError(f"a {kind.upper()} scale of {big:.4g} overflows fp16 (largest 65504): "
                         f"the block would decode as inf/NaN (llama.cpp would store it so, "
                         f"silently). Rescale the weight, or keep this tensor in F32/BF16")
    return h


def _no_lost_blocks(b: torch.Tensor, zero: torch.Tensor, kind: str) -> None:
    """Refuse blocks b (out, nb, 32) that hold nonzero weights but whose fp16 scale (and
    minimum) rounded to 0 (``zero`` (out, nb)): they would decode as all zeros."""
    lost = zero & (b.abs().amax(-1) > 0)
    if bool(lost.any()):
        r, k = (int(i) for i in lost.nonzero()[0])
        raise ValueError(f"{int(lost.sum())} {kind.upper()} block(s) hold nonzero weights (the "
                         f"first: row {r}, columns {k * BLOCK}..{k * BLOCK + BLOCK - 1}, largest "
                         f"|w| {float(b[r, k].abs().max()):.3g}) but their scale rounds to 0 in "
                         f"fp16 (its smallest step is 6e-08): they would decode as all zeros "
                         f"(llama.cpp would store them so, silently). Scale the weight up, or "
                         f"keep this tensor in F16/F32")


def reciprocal_or_zero(d: torch.Tensor) -> torch.Tensor:
    """llama.cpp's ``id = d ? 1.0f/d : 0.0f`` in fp32 (an all-zero block gets codes 0)."""
    if not isinstance(d, torch.Tensor):
        raise TypeError(f"d must be a torch tensor of scales (torch.from_numpy for an array); "
                        f"got {type(d).__name__}")
    d = d.float()
    return torch.where(d != 0, 1.0 / d, 0.0)


def quantize_q4_0(w: torch.Tensor) -> BlockQuantized:
    """Quantize w (out, in) with llama.cpp's Q4_0 rule (lesson 13), bit for bit.

    Per block of 32: ``max`` is the weight with the largest magnitude, *with its sign* (the
    first one on a tie); d = max / -8; q = min(15, trunc(w / d + 8.5)) in 0..15, stored as
    q - 8 (so the largest weight gets code -8 exactly, and its opposite is clipped to 7);
    all in fp32 with the unrounded d, which is then stored as fp16.
    """
    b = _blocks(w, "q4_0")                                               # (out, nb, 32)
    out, nb, _ = b.shape
    idx = b.abs().argmax(-1, keepdim=True)                               # first largest |w|
    mx = b.gather(-1, idx)                                               # (out, nb, 1), signed
    d = mx / -8.0
    q = torch.trunc(b * reciprocal_or_zero(d) + 8.5).clamp(max=15)              # (out, nb, 32) 0..15
    codes = (q.to(torch.int16) - 8).to(torch.int8)
    dh = _fp16_scales(d[..., 0], "q4_0")
    _no_lost_blocks(b, dh == 0, "q4_0")
    return BlockQuantized("q4_0", codes.reshape(out, nb * BLOCK), dh, None)


def quantize_q8_0(w: torch.Tensor) -> BlockQuantized:
    """Quantize w (out, in) with llama.cpp's Q8_0 rule (lessons 04, 13), bit for bit.

    Per block of 32: d = max|w| / 127; q = roundf(w / d) (C's roundf: halves away from zero,
    not torch.round's halves to even), in -127..127; d stored as fp16.
    """
    b = _blocks(w, "q8_0")                                               # (out, nb, 32)
    out, nb, _ = b.shape
    d = b.abs().amax(-1, keepdim=True) / 127.0                           # (out, nb, 1) fp32
    x = (b * reciprocal_or_zero(d)).double()                                    # exact copy of fp32
    q = torch.trunc(x + 0.5 * torch.sign(x))                             # roundf
    dh = _fp16_scales(d[..., 0], "q8_0")
    _no_lost_blocks(b, dh == 0, "q8_0")
    return BlockQuantized("q8_0", q.to(torch.int8).reshape(out, nb * BLOCK), dh, None)


QUANTIZERS = {"q4_0": quantize_q4_0, "q4_1": quantize_q4_1, "q8_0": quantize_q8_0}


def _nibbles(u: torch.Tensor) -> np.ndarray:
    """Codes 0..15 (rows, nb, 32) -> 16 bytes per block: weight j low, weight j + 16 high."""
    u = u.to(torch.uint8).numpy()
    return u[..., :BLOCK // 2] | (u[..., BLOCK // 2:] << 4)             # (rows, nb, 16)


def pack_blocks(bq: BlockQuantized) -> np.ndarray:
    """A :class:`BlockQuantized` weight as llama.cpp's bytes, uint8 (rows, nb * block bytes)."""
    if not isinstance(bq, BlockQuantized) or bq.kind not in BLOCK_BYTES:
        raise ValueError(f"pack_blocks takes a BlockQuantized of kind {sorted(BLOCK_BYTES)}; got "
                         f"{getattr(bq, 'kind', type(bq).__name__)!r}")
    rows, cols = bq.codes.shape
    if cols % BLOCK or tuple(bq.scale.shape) != (rows, cols // BLOCK):
        raise ValueError(f"codes (rows, cols) need cols a multiple of {BLOCK} and one scale per "
                         f"block, (rows, cols/32); got codes {tuple(bq.codes.shape)}, scale "
                         f"{tuple(bq.scale.shape)}")
    nb = cols // BLOCK
    lo, hi = {"q4_0": (-8, 7), "q4_1": (0, 15), "q8_0": (-127, 127)}[bq.kind]
    c = bq.codes.to(torch.int16)
    if int(c.min()) < lo or int(c.max()) > hi:
        raise ValueError(f"{bq.kind.upper()} codes lie in {lo}..{hi}; got {int(c.min())}.."
                         f"{int(c.max())}")
    c = c.reshape(rows, nb, BLOCK)
    d = bq.scale.to(torch.float16).numpy().reshape(rows, nb, 1).view(np.uint8)  # (rows, nb, 2)
    if bq.kind == "q4_0":
        parts = [d, _nibbles(c + 8)]
    elif bq.kind == "q4_1":
        if bq.minimum is None:
            raise ValueError("a Q4_1 weight needs its fp16 minimum per block")
        m = bq.minimum.to(torch.float16).numpy().reshape(rows, nb, 1).view(np.uint8)
        parts = [d, m, _nibbles(c)]
    else:
        parts = [d, c.to(torch.int8).numpy().view(np.uint8)]
    return np.concatenate(parts, axis=-1).reshape(rows, nb * BLOCK_BYTES[bq.kind])


def permute_rope_rows(n_rows: int, n_heads: int) -> torch.Tensor:
    """Row order that applies llama.cpp's query/key permutation: ``w_gguf = w_hf[order]``
    (the inverse of :func:`unpermute_rope_rows`; the GGUF writer of lesson 13 uses it)."""
    return torch.argsort(unpermute_rope_rows(n_rows, n_heads))


def unpermute_rope_rows(n_rows: int, n_heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's query/key permutation: ``w_hf = w_gguf[order]``.

    The converter stores head h's rows as (pair p, half j) -> p * 2 + j; Hugging Face keeps the
    two halves apart: j * (hd/2) + p. Returns a (n_rows,) index.
    """
    n_rows, n_heads = _whole(n_rows, "n_rows"), _whole(n_heads, "n_heads")
    if n_rows % n_heads or (n_rows // n_heads) % 2:
        raise ValueError(f"n_rows ({n_rows}) must split into n_heads ({n_heads}) heads of an "
                         f"even size (RoPE rotates pairs)")
    hd = n_rows // n_heads
    idx = torch.arange(n_rows).reshape(n_heads, hd // 2, 2)              # gguf rows by (h, p, j)
    return idx.transpose(1, 2).reshape(n_rows)                           # (h, j, p) order


# ----------------------------------------------------------------------------- the file
def write_gguf(path: str | Path, fields, file_type: int, tensors, overwrite: bool = False
               ) -> Path:
    """Write a GGUF file atomically (lessons 13, 14): ``fields`` as read from another GGUF file,
    ``(key, value type, value, sub type)``, copied except the reader's own ``GGUF.*`` entries and
    the architecture and file type (set here: the architecture is the one ``fields`` name,
    "llama" when they name none; ``file_type`` is llama.cpp's number);
    ``tensors`` ``[(name, data, raw type or None)]``: ``data`` a NumPy array, float32 or
    float16 (finite) when ``raw`` is None, else the block format's bytes (rows, bytes per row).
    The file appears complete or not at all. An existing file is refused unless
    ``overwrite=True``.
    """
    import tempfile

    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter

    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a file path (str or Path); got {type(path).__name__}")
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite must be True or False; got {overwrite!r}")
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{str(path)!r} is a folder; pass the path of the .gguf file to "
                                f"write")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True to replace it (or choose "
                              f"another name)")
    _whole(file_type, "file_type (llama.cpp's number, e.g. 1 for F16)", minimum=0)
    if isinstance(fields, (str, bytes, dict)) or not all(
            isinstance(f, (tuple, list)) and len(f) == 4 and isinstance(f[0], str)
            for f in fields):
        raise TypeError("fields must be a list of (key, value type, value, sub type) entries, "
                        "as read_metadata returns")
    if isinstance(tensors, (str, bytes, dict)):
        raise TypeError(f"tensors must be a list of (name, data, raw type or None); got "
                        f"{type(tensors).__name__}")
    tensors = list(tensors)
    seen = set()
    for i, t in enumerate(tensors):
        if not isinstance(t, (tuple, list)) or len(t) != 3 or not isinstance(t[0], str):
            raise TypeError(f"tensors[{i}] must be (name, data, raw type or None); got "
                            f"{type(t).__name__}")
        name, data, raw = t
        if name in seen:
            raise ValueError(f"tensor name {name!r} appears twice in tensors")
        seen.add(name)
        if not isinstance(data, np.ndarray):
            raise TypeError(f"{name}: data must be a NumPy array; got {type(data).__name__}"
                            f"{' (call .numpy())' if isinstance(data, torch.Tensor) else ''}")
        if raw is None:
            if data.dtype not in (np.float32, np.float16):
                raise ValueError(f"{name}: unquantized data must be float32 or float16 (what "
                                 f"llama.cpp reads as F32/F16); got {data.dtype}")
            if not np.isfinite(data).all():
                raise ValueError(f"{name}: the data holds NaN or inf (a value past fp16's range "
                                 f"becomes inf in float16): refusing to write a broken weight")
        else:
            kind = GGMLQuantizationType(raw)
            block, size = GGML_QUANT_SIZES[kind]
            if data.dtype != np.uint8 or data.ndim < 1 or data.shape[-1] % size:
                raise ValueError(f"{name}: {kind.name} data must be uint8 bytes, rows a multiple "
                                 f"of {size} bytes ({block} weights per block); got "
                                 f"{data.shape} {data.dtype}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    os.close(fd)
    try:
        arch = next((v for k, _, v, _ in fields if k == "general.architecture"), "llama")
        writer = GGUFWriter(tmp, arch)
        for key, vtype, val, sub in fields:
            if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
                continue
            writer.add_key_value(key, val, GGUFValueType(vtype),
                                 sub_type=None if sub is None else GGUFValueType(sub))
        writer.add_file_type(file_type)
        for name, data, raw in tensors:
            writer.add_tensor(name, data, raw_dtype=raw)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def open_gguf(path: str | Path) -> "GGUFFile":
    """A GGUF file's metadata and tensors (:class:`GGUFFile`), with clear errors for the usual
    problems. Shaped like ``gguf.GGUFReader`` (``.fields[key].contents()``, ``.tensors``)."""
    try:
        import gguf  # noqa: F401 (tensor types and block sizes)
    except ImportError:
        raise ImportError("reading GGUF files needs the 'gguf' package: pip install gguf==0.19.0 "
                          "(make setup installs it)") from None
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be the path of a .gguf file (str or Path); got "
                        f"{type(path).__name__}")
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{str(path)!r} is a folder; pass the .gguf file itself "
                                f"(smollm.gguf_path() finds SmolLM2's)")
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {str(path)!r} does not exist")
    try:
        return GGUFFile(path)
    except Exception as e:  # struct/numpy/unicode errors on damaged files
        raise ValueError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e}); it may "
                         f"be truncated or corrupt: reinstall it") from None


@dataclass
class _Field:
    """One metadata entry, as ``gguf.ReaderField.contents()`` gives it."""
    value: object

    def contents(self):
        return self.value


class GGUFFile:
    """A GGUF file read straight from its header with ``struct`` (lesson 04): ``fields``
    (metadata key -> entry with ``.contents()``) and ``tensors`` (``gguf.ReaderTensor``: name,
    tensor_type, shape (GGUF order: in, out), n_elements, n_bytes, data_offset, data: a numpy
    view of the file, mapped, not read). ``gguf.GGUFReader`` gives the same values but builds a
    numpy view per token of the vocabulary, which takes seconds for SmolLM2's 49152 tokens."""

    def __init__(self, path: str | Path):
        import gguf
        self.path = Path(path)
        stat = self.path.stat()
        meta, infos, data_start = _read_header(str(self.path.resolve()), stat.st_mtime_ns,
                                               stat.st_size)
        self.fields = {key: _Field(value) for key, _, value, _ in meta}
        mm = np.memmap(self.path, np.uint8, mode="r")
        self.tensors = []
        for name, dims, raw_type, offset in infos:
            kind = gguf.GGMLQuantizationType(raw_type)
            n = int(np.prod(dims))
            block, type_size = gguf.GGML_QUANT_SIZES[kind]
            n_bytes = n * type_size // block
            start = data_start + offset
            if start + n_bytes > stat.st_size:
                raise ValueError(f"tensor {name} ends past the end of the file")
            np_dims = tuple(reversed(dims))
            item = _ITEM_TYPES.get(kind.name)
            if item is None:                     # block formats: rows of bytes
                item, np_dims = np.uint8, gguf.quant_shape_to_byte_shape(np_dims, kind)
            data = mm[start:start + n_bytes].view(item).reshape(np_dims)
            self.tensors.append(gguf.ReaderTensor(
                name=name, tensor_type=kind, shape=np.array(dims, dtype=np.uint64),
                n_elements=n, n_bytes=n_bytes, data_offset=start, data=data, field=None))


_ITEM_TYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8,
               "I16": np.int16, "I32": np.int32, "I64": np.int64}


#: GGUF metadata value types (gguf.GGUFValueType): struct format of the fixed-size ones.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def read_metadata(path: str | Path) -> list[tuple[str, int, object, int | None]]:
    """Every metadata entry of a GGUF file as (key, value type, value, array item type), in
    file order (lesson 13's writer copies them). The same values as ``gguf.GGUFReader``'s
    fields, read straight from the header with ``struct``: the reader builds a numpy view per
    token of the vocabulary, which takes seconds for SmolLM2's 49152 tokens and 48900 merges.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be the path of a .gguf file (str or Path); got "
                        f"{type(path).__name__}")
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{str(path)!r} is a folder; pass the .gguf file itself")
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {str(path)!r} does not exist")
    stat = path.stat()
    return list(_read_header(str(path.resolve()), stat.st_mtime_ns, stat.st_size)[0])


@functools.lru_cache(maxsize=8)
def _read_header(path: str, mtime_ns: int, size: int) -> tuple:
    """(metadata entries, tensor infos (name, dims, type, offset), where the data starts)."""
    import struct
    with open(path, "rb") as f:
        head = f.read(24)
        if len(head) < 24 or head[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (it does not start with b'GGUF')")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", head, 4)
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version}; this reader knows versions 2 "
                             f"and 3")
        buf = f.read(min(size, 64 * 2**20))          # metadata sits before the tensor data
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, buf, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def string():
        nonlocal pos
        n = take("<Q")
        s = buf[pos:pos + n].decode("utf-8")
        pos += n
        return s

    def value(vtype):
        nonlocal pos
        if vtype == _STRING:
            return string()
        if vtype in _SCALARS:
            return take(_SCALARS[vtype])
        raise ValueError(f"{path}: unknown metadata type {vtype}: the file may be corrupt")

    out = []
    try:
        for _ in range(n_kv):
            key, vtype = string(), take("<I")
            if vtype != _ARRAY:
                out.append((key, vtype, value(vtype), None))
                continue
            sub, n = take("<I"), take("<Q")
            if sub in _SCALARS:
                dt = np.dtype(_SCALARS[sub])
                items = np.frombuffer(buf, dt, n, pos).tolist()
                pos += n * dt.itemsize
            else:
                items = [value(sub) for _ in range(n)]
            out.append((key, vtype, items, sub))
        infos, names = [], set()
        for _ in range(n_tensors):
            name = string()
            n_dims = take("<I")
            dims = tuple(take("<Q") for _ in range(n_dims))                  # GGUF order
            infos.append((name, dims, take("<I"), take("<Q")))
            if name in names:
                raise ValueError(f"tensor {name} appears twice")
            names.add(name)
    except (struct.error, ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: damaged GGUF header ({e}); reinstall the file") from None
    align = next((v for k, _, v, _ in out if k == "general.alignment"), 32)
    data_start = 24 + pos
    data_start += -data_start % align                                   # padded to alignment
    return tuple(out), tuple(infos), data_start


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is not None:
            return default
        raise ValueError(f"the GGUF file has no {key!r} entry; is it a complete model file?")
    return f.contents()


def gguf_architecture(reader) -> str:
    """The file's ``general.architecture`` if the course reads it, else a ValueError naming
    the ones it reads."""
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"this GGUF holds a {arch!r} model; the course's loader reads the "
                         f"{ARCHITECTURE_EXAMPLES[4:]}: their decoders are the one "
                         f"course_lib.model computes")
    return arch


def _rope_factor_rule(inv_freq: np.ndarray, factor: float, lo: float, hi: float,
                      old_len: float) -> np.ndarray:
    """llama.cpp's converter's Llama 3 factors (conversion/llama.py, LlamaModel.
    generate_extra_tensors, llama-cpp-python 0.3.36): 1 where the wavelength is below
    old_len / hi, ``factor`` above old_len / lo, a smooth blend between; float32 as stored."""
    wavelen = 2 * np.pi / inv_freq
    smooth = (old_len / wavelen - lo) / (hi - lo)
    mid = 1 / ((1 - smooth) / factor + smooth)
    out = np.where(wavelen < old_len / hi, 1.0, np.where(wavelen > old_len / lo, factor, mid))
    return out.astype(np.float32)


def llama3_rope_from_factors(factors, rope_theta: float, head_dim: int) -> dict | None:
    """The ``rope_scaling`` dict (Llama 3's rule) that gives a file's ``rope_freqs`` factors.

    llama.cpp's converter stores one factor per frequency, not the four numbers of
    config.json. Only two of them can be recovered: the factor, and the two wavelengths where
    the blend starts and ends. This returns ``low_freq_factor`` 1 and an
    ``original_max_position_embeddings`` and ``high_freq_factor`` with those wavelengths: the
    same frequencies, checked by recomputing the factors. None when every factor is 1; a
    ValueError when no Llama 3 rule gives them.
    """
    rf = np.asarray(factors, dtype=np.float64).reshape(-1)
    n = head_dim // 2
    if rf.size != n:
        raise ValueError(f"{ROPE_FREQS} holds {rf.size} factors; a head of {head_dim} has {n} "
                         f"frequencies")
    if not np.isfinite(rf).all() or (rf <= 0).any():
        raise ValueError(f"{ROPE_FREQS} holds factors that are not finite and positive")
    if np.allclose(rf, 1.0, rtol=0, atol=1e-7):
        return None
    inv = 1.0 / (rope_theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    x = inv / (2 * np.pi)                                          # 1 / wavelength, decreasing
    factor = float(rf.max())
    high = np.isclose(rf, 1.0, rtol=1e-6, atol=0)
    low = np.isclose(rf, factor, rtol=1e-6, atol=0)
    mid = ~(high | low)
    xl = float(x[low].max()) if low.any() else 0.0                # below x_low: factor
    xh = float(x[high].min()) if high.any() else float(x.max()) * 2   # above x_high: 1
    candidates = []
    if mid.sum() >= 2:                         # a line: s = (x - x_low) / (x_high - x_low)
        s = (1 / rf[mid] - 1 / factor) / (1 - 1 / factor)
        a, b = np.polyfit(x[mid], s, 1)
        candidates.append((-b / a, (1 - b) / a))
    elif mid.sum() == 1:
        xm = float(x[mid][0])
        sm = float((1 / rf[mid][0] - 1 / factor) / (1 - 1 / factor))
        for t in (0.5, 0.25, 0.1, 0.01):
            x_low = xm - t * (xm - xl)
            candidates.append((x_low, x_low + (xm - x_low) / sm))
    else:
        candidates.append((xl + (xh - xl) / 3, xl + 2 * (xh - xl) / 3))
    for x_low, x_high in candidates:
        if not 0 < x_low < x_high:
            continue
        scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
                   "high_freq_factor": float(x_high / x_low),
                   "original_max_position_embeddings": float(1 / x_low)}
        again = _rope_factor_rule(inv, factor, 1.0, scaling["high_freq_factor"],
                                  scaling["original_max_position_embeddings"])
        if np.allclose(again, rf, rtol=1e-5, atol=0):
            return scaling
    raise ValueError(f"the file's {ROPE_FREQS} factors ({rf.min():.4g}..{rf.max():.4g}) follow "
                     f"no Llama 3 RoPE scaling, the only one the course's decoder computes")


def config_from_gguf(reader) -> ModelConfig:
    """The model's hyper-parameters from the GGUF metadata: the llama, qwen2 and qwen3
    architectures (keys ``<arch>.block_count`` ...; the head size from
    ``<arch>.attention.key_length`` when present; Llama 3's RoPE scaling from the
    ``rope_freqs`` tensor, :func:`llama3_rope_from_factors`; q/k/v biases and q/k norms from
    the tensors present). ``reader``: what :func:`open_gguf` returns (or the file's path)."""
    if isinstance(reader, (str, os.PathLike)):
        reader = open_gguf(reader)
    if not hasattr(reader, "fields") or not hasattr(reader, "tensors"):
        raise TypeError(f"reader must be an opened GGUF file (gguf_model.open_gguf(path)); got "
                        f"{type(reader).__name__}")
    arch = gguf_architecture(reader)
    a = f"{arch}."
    n_heads = int(_field(reader, a + "attention.head_count"))
    hidden = int(_field(reader, a + "embedding_length"))
    names = {t.name: t for t in reader.tensors}
    has_head = "output.weight" in names
    head_dim = int(_field(reader, a + "attention.key_length", hidden // n_heads))
    v_dim = int(_field(reader, a + "attention.value_length", head_dim))
    rot = int(_field(reader, a + "rope.dimension_count", head_dim))
    if v_dim != head_dim or rot != head_dim:
        raise ValueError(f"this {arch} GGUF has key length {head_dim}, value length {v_dim} and "
                         f"RoPE on {rot} dimensions; the course's decoder needs all three equal "
                         f"(RoPE on the whole head)")
    kind = _field(reader, a + "rope.scaling.type", "none")
    if kind not in ("none", "", None):
        raise ValueError(f"this GGUF sets RoPE scaling {kind!r} ({a}rope.scaling.type); the "
                         f"course's decoder computes none, or Llama 3's (a rope_freqs tensor)")
    theta = float(_field(reader, a + "rope.freq_base", 10000.0))
    scaling = None
    if ROPE_FREQS in names:
        scaling = llama3_rope_from_factors(np.asarray(names[ROPE_FREQS].data), theta, head_dim)
    if "token_embd.weight" in names:                     # the embedding's rows are the truth
        vocab = int(names["token_embd.weight"].shape[-1])
    else:
        vocab = _field(reader, a + "vocab_size",
                       len(_field(reader, "tokenizer.ggml.tokens", [])) or None)
    extra = {}
    if "blk.0.attn_output.bias" in names:
        extra["attention_bias"] = True
    elif "blk.0.attn_q.bias" in names:
        extra["qkv_bias"] = True
    if "blk.0.ffn_up.bias" in names:
        extra["mlp_bias"] = True
    if "blk.0.attn_q_norm.weight" in names:
        extra["qk_norm"] = True
    if arch == "qwen2" and names and "qkv_bias" not in extra:
        raise ValueError("this qwen2 GGUF has no q/k/v biases (blk.0.attn_q.bias): a Qwen2 "
                         "model always carries them; the file is incomplete")
    if arch == "qwen3" and names and "qk_norm" not in extra:
        raise ValueError("this qwen3 GGUF has no q/k norms (blk.0.attn_q_norm.weight): a "
                         "Qwen3 model always carries them; the file is incomplete")
    return ModelConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        num_hidden_layers=int(_field(reader, a + "block_count")),
        num_attention_heads=n_heads,
        num_key_value_heads=int(_field(reader, a + "attention.head_count_kv", n_heads)),
        intermediate_size=int(_field(reader, a + "feed_forward_length")),
        max_position_embeddings=int(_field(reader, a + "context_length")),
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=float(_field(reader, a + "attention.layer_norm_rms_epsilon")),
        tie_word_embeddings=not has_head,
        head_dim=head_dim,
        **extra,
    )


def hf_name(gguf_name: str, arch: str = "llama") -> str:
    """A GGUF tensor name -> the course model's (Hugging Face) name."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) > 2:
        key = "blk.{i}." + ".".join(parts[2:])
        for table in (GGUF_TO_HF, GGUF_TO_HF_EXTRA):
            if key in table:
                return table[key].format(i=parts[1])
    elif gguf_name in GGUF_TO_HF:
        return GGUF_TO_HF[gguf_name]
    raise ValueError(f"unexpected tensor {gguf_name!r} in a {arch} GGUF file")


_hf_name = hf_name


def rope_rows_permuted(arch: str) -> bool:
    """Whether the file stores q and k rows in llama.cpp's interleaved order: the llama
    architecture does (its converter permutes them, conversion/llama.py ``undo_permute``);
    qwen2 and qwen3 keep Hugging Face's order (llama.cpp rotates them NeoX-style)."""
    return arch == "llama"


def _bf16(data: np.ndarray) -> np.ndarray:
    """BF16 stored as uint8 pairs (.., 2 n) -> float32 (.., n): the 16 high bits of an fp32."""
    u = np.ascontiguousarray(data).view(np.uint16).astype(np.uint32) << 16
    return u.view(np.float32)


def decode_tensor(t, arch: str = "llama", cfg: ModelConfig | None = None,
                  keep_blocks: bool = True):
    """One tensor of an opened GGUF file (an entry of ``reader.tensors``) as the course model
    holds it: (course name, value). Q4_0/Q4_1/Q8_0 come back as :class:`BlockQuantized` when
    ``keep_blocks`` (codes kept), every other type as an fp32 tensor (F32, F16, BF16, and
    Q5_0, Q5_1, Q4_K, Q5_K, Q6_K through :mod:`course_lib.kquants`' decoders, which give
    llama.cpp's values bit for bit). The q/k rows (and biases) of a llama file are put back in
    Hugging Face's order, which needs ``cfg`` for the head counts."""
    from course_lib import kquants
    kind = t.tensor_type.name
    if kind not in DECODED_TYPES:
        raise ValueError(f"tensor {t.name} is stored as {kind}; the course decodes "
                         f"{', '.join(DECODED_TYPES)} (requantize the file with llama.cpp's "
                         f"llama-quantize to one of them, e.g. Q8_0 or Q4_K_M)")
    name = hf_name(t.name, arch)
    shape = [int(s) for s in reversed(t.shape.tolist())]                 # numpy order (out, in)
    data = np.asarray(t.data)
    if kind in ("Q4_0", "Q4_1", "Q8_0") and keep_blocks:
        value = {"Q4_0": unpack_q4_0, "Q4_1": unpack_q4_1, "Q8_0": unpack_q8_0}[kind](
            data.reshape(shape[0], -1), shape[-1])
    elif kind in ("F32", "F16"):
        value = torch.from_numpy(data.astype(np.float32).reshape(shape).copy())
    elif kind == "BF16":
        value = torch.from_numpy(_bf16(data).reshape(shape).copy())
    else:
        rows = int(np.prod(shape[:-1]))
        value = torch.from_numpy(kquants.dequantize(data.reshape(rows, -1), kind.lower(),
                                                    shape[-1]).reshape(shape))
    if rope_rows_permuted(arch) and name.endswith(("q_proj.weight", "k_proj.weight",
                                                   "q_proj.bias", "k_proj.bias")):
        if cfg is None:
            raise ValueError(f"{t.name}: cfg (the file's config) is needed to put q/k rows "
                             f"back in order")
        heads = cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads
        order = unpermute_rope_rows(shape[0], heads)
        value = value.rows(order) if isinstance(value, BlockQuantized) else value[order]
    return name, value


def read_tensors(reader, cfg: ModelConfig) -> dict[str, torch.Tensor | BlockQuantized]:
    """Every tensor of the file under the course model's name, in its layout.

    Q4_0 / Q4_1 / Q8_0 weights come back as :class:`BlockQuantized` (codes kept), F32/F16/BF16
    as fp32 tensors (other types: :func:`decode_tensor`, through
    :mod:`course_lib.own_model`). Query and key rows of a llama file are put back in the
    Hugging Face order; the ``rope_freqs`` factors are in ``cfg.rope_scaling`` already.
    """
    if not hasattr(reader, "tensors"):
        raise TypeError(f"reader must be an opened GGUF file (gguf_model.open_gguf(path)); got "
                        f"{type(reader).__name__}")
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"cfg must be the file's ModelConfig (gguf_model.config_from_gguf("
                        f"reader)); got {type(cfg).__name__}")
    arch = gguf_architecture(reader)
    out = {}
    for t in reader.tensors:
        kind = t.tensor_type.name
        if kind not in SUPPORTED_TYPES:
            raise ValueError(f"tensor {t.name} is stored as {kind}; this loader supports "
                             f"{', '.join(SUPPORTED_TYPES)} (convert the file with llama.cpp's "
                             f"llama-quantize to Q4_1, Q8_0 or F16; own_model.load also decodes "
                             f"the k-quants)")
        if t.name == ROPE_FREQS:
            continue
        name, value = decode_tensor(t, arch, cfg)
        out[name] = value
    return out


def pack_q4_0_block(block: torch.Tensor) -> torch.Tensor:
    """One block of 32 weights as llama.cpp's 18 Q4_0 bytes, uint8 (18,) (lesson 13)."""
    if not isinstance(block, torch.Tensor) or block.shape != (BLOCK,) or \
            not block.is_floating_point():
        raise ValueError(f"block must be a float tensor of shape ({BLOCK},); got "
                         + (f"{tuple(block.shape)} {block.dtype}" if isinstance(block, torch.Tensor)
                            else type(block).__name__))
    return torch.from_numpy(quantize_q4_0(block[None]).to_bytes()[0].copy())
