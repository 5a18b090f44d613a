"""Read a Llama-family GGUF file (llama.cpp's format) into the course's own model (lesson 04).

A GGUF file is one binary holding a model's metadata (architecture, widths, tokenizer) and its
tensors, most of them already quantized in llama.cpp's block formats. This module reads it with
the ``gguf`` package (the reader of the llama.cpp project) and turns it into
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

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from course_lib.model import ModelConfig

BLOCK = 32                      # weights per block in Q4_1 and Q8_0
Q4_1_BYTES = 2 + 2 + BLOCK // 2  # fp16 scale, fp16 minimum, 16 bytes of nibbles
Q8_0_BYTES = 2 + BLOCK           # fp16 scale, 32 int8 codes
SUPPORTED_TYPES = ("F32", "F16", "Q4_1", "Q8_0")

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


# ----------------------------------------------------------------------------- block formats
@dataclass
class BlockQuantized:
    """A weight (out, in) stored as llama.cpp block codes: ``w = scale * codes (+ minimum)``.

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
        """The same weight with its output rows reordered (order: (out,) int64)."""
        m = None if self.minimum is None else self.minimum[order]
        return BlockQuantized(self.kind, self.codes[order], self.scale[order], m)

    @property
    def bits_per_weight(self) -> float:
        per_block = Q4_1_BYTES if self.kind == "q4_1" else Q8_0_BYTES
        return per_block * 8 / BLOCK


def unpack_q4_1(raw: np.ndarray, cols: int) -> BlockQuantized:
    """Raw Q4_1 bytes (rows, cols/32 * 20) -> codes uint8 (rows, cols), fp16 scale and minimum.

    In each 20-byte block: bytes 0-1 the scale, 2-3 the minimum, then 16 bytes whose low
    nibbles are weights 0..15 of the block and whose high nibbles are weights 16..31.
    """
    rows = raw.shape[0]
    nb = cols // BLOCK
    if cols % BLOCK or raw.shape[1] != nb * Q4_1_BYTES:
        raise ValueError(f"a Q4_1 tensor of {cols} columns needs {nb * Q4_1_BYTES} bytes per row "
                         f"(blocks of 32); got {raw.shape[1]}: the file may be corrupt")
    blocks = raw.reshape(rows, nb, Q4_1_BYTES)                           # (rows, nb, 20)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]                 # (rows, nb)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0]                 # (rows, nb)
    qs = blocks[..., 4:]                                                 # (rows, nb, 16)
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)                # (rows, nb, 32)
    return BlockQuantized("q4_1", torch.from_numpy(codes.reshape(rows, cols).copy()),
                          torch.from_numpy(d.copy()), torch.from_numpy(m.copy()))


def unpack_q8_0(raw: np.ndarray, cols: int) -> BlockQuantized:
    """Raw Q8_0 bytes (rows, cols/32 * 34) -> codes int8 (rows, cols) and fp16 scale."""
    rows = raw.shape[0]
    nb = cols // BLOCK
    if cols % BLOCK or raw.shape[1] != nb * Q8_0_BYTES:
        raise ValueError(f"a Q8_0 tensor of {cols} columns needs {nb * Q8_0_BYTES} bytes per row "
                         f"(blocks of 32); got {raw.shape[1]}: the file may be corrupt")
    blocks = raw.reshape(rows, nb, Q8_0_BYTES)                           # (rows, nb, 34)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]                 # (rows, nb)
    codes = blocks[..., 2:].copy().view(np.int8)                         # (rows, nb, 32)
    return BlockQuantized("q8_0", torch.from_numpy(codes.reshape(rows, cols).copy()),
                          torch.from_numpy(d.copy()), None)


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
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"expected a 2-D floating-point weight; got {tuple(w.shape)} {w.dtype}")
    if w.shape[1] % BLOCK:
        raise ValueError(f"Q4_1 needs the input width to be a multiple of 32; got {w.shape[1]}")
    if not torch.isfinite(w).all():
        raise ValueError("the weight holds NaN or inf: Q4_1 cannot represent them")
    out, cols = w.shape
    b = w.float().reshape(out, cols // BLOCK, BLOCK)                     # (out, nb, 32)
    lo = b.amin(-1, keepdim=True)                                        # (out, nb, 1)
    d = (b.amax(-1, keepdim=True) - lo) / 15                             # (out, nb, 1)
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = torch.trunc((b - lo) * inv + 0.5).clamp(0, 15).to(torch.uint8)   # (out, nb, 32)
    return BlockQuantized("q4_1", q.reshape(out, cols), d[..., 0].half(), lo[..., 0].half())


def unpermute_rope_rows(n_rows: int, n_heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's query/key permutation: ``w_hf = w_gguf[order]``.

    The converter stores head h's rows as (pair p, half j) -> p * 2 + j; Hugging Face keeps the
    two halves apart: j * (hd/2) + p. Returns a (n_rows,) index.
    """
    if n_heads < 1 or n_rows % n_heads or (n_rows // n_heads) % 2:
        raise ValueError(f"n_rows ({n_rows}) must split into n_heads ({n_heads}) heads of an "
                         f"even size (RoPE rotates pairs)")
    hd = n_rows // n_heads
    idx = torch.arange(n_rows).reshape(n_heads, hd // 2, 2)              # gguf rows by (h, p, j)
    return idx.transpose(1, 2).reshape(n_rows)                           # (h, j, p) order


# ----------------------------------------------------------------------------- the file
def open_gguf(path: str | Path):
    """A ``gguf.GGUFReader`` for ``path``, with clear errors for the usual problems."""
    try:
        import gguf
    except ImportError:
        raise ImportError("reading GGUF files needs the 'gguf' package: pip install gguf==0.19.0 "
                          "(make setup installs it)") from None
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{str(path)!r} is a folder; pass the .gguf file itself "
                                f"(smollm.gguf_path() finds SmolLM2's)")
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {str(path)!r} does not exist")
    try:
        return gguf.GGUFReader(str(path))
    except Exception as e:  # the reader raises ValueError/IndexError/... on damaged files
        raise ValueError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e}); it may "
                         f"be truncated or corrupt: reinstall it") from None


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is not None:
            return default
        raise ValueError(f"the GGUF file has no {key!r} entry; is it a complete model file?")
    return f.contents()


def config_from_gguf(reader) -> ModelConfig:
    """The model's hyper-parameters from the GGUF metadata (Llama architecture only)."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"this GGUF holds a {arch!r} model; the course's loader reads the 'llama' "
                         f"architecture only (SmolLM2, TinyLlama, Llama 2/3)")
    a = "llama."
    n_heads = int(_field(reader, a + "attention.head_count"))
    has_head = any(t.name == "output.weight" for t in reader.tensors)
    return ModelConfig(
        vocab_size=int(_field(reader, a + "vocab_size",
                              len(_field(reader, "tokenizer.ggml.tokens", [])) or None)),
        hidden_size=int(_field(reader, a + "embedding_length")),
        num_hidden_layers=int(_field(reader, a + "block_count")),
        num_attention_heads=n_heads,
        num_key_value_heads=int(_field(reader, a + "attention.head_count_kv", n_heads)),
        intermediate_size=int(_field(reader, a + "feed_forward_length")),
        max_position_embeddings=int(_field(reader, a + "context_length")),
        rope_theta=float(_field(reader, a + "rope.freq_base", 10000.0)),
        rms_norm_eps=float(_field(reader, a + "attention.layer_norm_rms_epsilon")),
        tie_word_embeddings=not has_head,
    )


def _hf_name(gguf_name: str) -> str:
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        key = "blk.{i}." + ".".join(parts[2:])
        if key in GGUF_TO_HF:
            return GGUF_TO_HF[key].format(i=parts[1])
    elif gguf_name in GGUF_TO_HF:
        return GGUF_TO_HF[gguf_name]
    raise ValueError(f"unexpected tensor {gguf_name!r} in a llama GGUF file")


def read_tensors(reader, cfg: ModelConfig) -> dict[str, torch.Tensor | BlockQuantized]:
    """Every tensor of the file under the course model's name, in its layout.

    Q4_1 / Q8_0 weights come back as :class:`BlockQuantized` (codes kept), F32/F16 as fp32
    tensors. Query and key rows are put back in the Hugging Face order.
    """
    out = {}
    for t in reader.tensors:
        kind = t.tensor_type.name
        if kind not in SUPPORTED_TYPES:
            raise ValueError(f"tensor {t.name} is stored as {kind}; this loader supports "
                             f"{', '.join(SUPPORTED_TYPES)} (convert the file with llama.cpp's "
                             f"llama-quantize to Q4_1, Q8_0 or F16)")
        name = _hf_name(t.name)
        shape = [int(s) for s in reversed(t.shape.tolist())]             # numpy order (out, in)
        data = np.asarray(t.data)
        if kind == "Q4_1":
            value = unpack_q4_1(data.reshape(shape[0], -1), shape[-1])
        elif kind == "Q8_0":
            value = unpack_q8_0(data.reshape(shape[0], -1), shape[-1])
        else:
            value = torch.from_numpy(data.astype(np.float32).reshape(shape).copy())
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg.num_attention_heads if "q_proj" in name else cfg.num_key_value_heads
            order = unpermute_rope_rows(shape[0], heads)
            value = value.rows(order) if isinstance(value, BlockQuantized) else value[order]
        out[name] = value
    return out
