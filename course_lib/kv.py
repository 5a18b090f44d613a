"""Quantized KV caches: what they store, what they cost, what they do to a model (lesson 11).

A decode step reads every cached key and value of every sequence in the batch. At long
context and large batch that read, not the weights, dominates (lesson 00), so engines store
the cache in fewer bits. The formats here, all selectable per run:

======== ================================================================================
``bf16``       the 16-bit cache a model normally keeps (the reference of this lesson)
``fp8_tensor`` FP8 E4M3, one scale per layer for K and one for V, calibrated once, then
               fixed (vLLM's ``--kv-cache-dtype fp8`` with calibrated scales)
``fp8_head``   FP8 E4M3 with one calibrated scale per layer and KV head
``int8``       INT8 with one scale per token and head, computed as each token is stored
``kivi4``      KIVI 4-bit: keys per channel (groups of 32 tokens), values per token
               (groups of 32 channels), asymmetric (scale and minimum in fp16), with KIVI's
               full-precision residual of R = ``window`` tokens (128 by default): values keep
               the last R tokens in BF16, keys are quantized R tokens at a time, so
               ``n mod R`` of them (0 to R - 1) are in BF16
``kivi2``      the same in 2 bits
======== ================================================================================

Two ways to run a model with one of them (``model.py`` hands attention to any cache that has
an ``attend`` method):

- :class:`QuantizedKVCache`: the real thing. Codes, scales and the BF16 part are stored
  (KIVI codes packed 2 or 4 per byte); every new token is appended, and tokens leaving the
  full-precision part are quantized. ``cache.nbytes()`` is what it holds, byte for byte.
- :class:`PerQueryEmulation`: scores a whole window in one forward pass. For each query,
  the keys and values the real cache holds quantized when that token is decoded are read
  quantized and the others in BF16. Decoding token by token with the real cache gives the
  same logits (``tests/test_kv.py`` checks it).

KIVI's residual follows its reference code (github.com/jy-yuan/KIVI, ``models/llama_kivi.py``,
``LlamaAttention_KIVI.forward``): at prefill, keys keep the last ``l mod R`` tokens in full
precision and values the last R; at each decode step the new token is attended in full
precision first, then keys are quantized once R of them have gathered, and the oldest value
beyond R is quantized. FP8 and INT8 tokens are quantized as they are stored, before they are
attended (as an engine writes its cache and then reads it).

Shape letters: B batch, K KV heads, H query heads, S cached tokens, T new tokens, hd head size.
Everything is first rounded to BF16 (the model's 16-bit cache); quantized formats quantize
those BF16 values, so the difference from ``bf16`` is the quantization alone.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

FP8_MAX = 448.0          # largest FP8 E4M3 value (lesson 01)
SCALE_BYTES = 2          # INT8 and KIVI scales (and KIVI minima) are stored in fp16
FIXED_SCALE_BYTES = 4    # FP8's calibrated scales are fp32, one per layer (and head)
DEFAULT_WINDOW = 128     # KIVI's residual length R: full-precision tokens (tokens)
DEFAULT_GROUP = 32       # KIVI's group size


# ----------------------------------------------------------------------------- formats
@dataclass(frozen=True)
class KVFormat:
    """How a cache stores keys and values (lesson 11).

    ``window``: for FP8 and INT8, the most recent tokens kept in BF16 (0 by default); for KIVI,
    the residual length R (see :meth:`quantized_counts`). ``group``: KIVI's group (tokens for
    keys, channels for values); 1 for the other formats. ``per_head``: FP8 scale per head.
    """
    name: str
    kind: str          # "bf16", "fp8", "int8" or "kivi"
    bits: int          # bits per stored value, scales not counted
    window: int = 0
    group: int = 1
    per_head: bool = False

    def quantized_counts(self, n_tokens: int) -> tuple[int, int]:
        """(keys, values): how many of ``n_tokens`` stored tokens are held quantized (the
        oldest ones) once the cache has stored them.

        FP8 and INT8: every token older than ``window`` (0 by default: all of them), keys and
        values alike. KIVI, as its reference code keeps them (R = ``window``): values keep the
        last R tokens in BF16, ``max(n - R, 0)`` quantized; keys are quantized R tokens at a
        time (in per-channel groups of ``group`` tokens), ``n - n mod R`` of them, so 0 to
        R - 1 keys are in BF16. With R = 128: 100 tokens -> (0, 0); 128 -> (128, 0); 200 ->
        (128, 72); 256 -> (256, 128). With ``window=0`` keys go in whole groups, values all.
        """
        if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 0:
            raise ValueError(f"n_tokens must be a whole number >= 0; got {n_tokens!r}")
        if self.kind == "bf16":
            return 0, 0
        values = max(n_tokens - self.window, 0)
        if self.kind != "kivi":
            return values, values
        chunk = self.window or self.group
        return n_tokens // chunk * chunk, values

    def read_counts(self, position: int) -> tuple[int, int]:
        """(keys, values) that the query at ``position`` reads quantized when it is decoded
        token by token: FP8 and INT8 store the new token first (:meth:`quantized_counts` of
        ``position + 1``); KIVI attends first and quantizes after (:meth:`quantized_counts`
        of ``position``: the query's own key and value are always read in BF16)."""
        return self.quantized_counts(position if self.kind == "kivi" else position + 1)


FORMAT_NAMES = ("bf16", "fp8_tensor", "fp8_head", "int8", "kivi4", "kivi2")
LIVE_FORMATS = ("fp8_tensor", "int8", "kivi2")   # what lesson 11 recomputes live


def get_format(name, window: int | None = None, group: int = DEFAULT_GROUP) -> KVFormat:
    """The :class:`KVFormat` called ``name`` (one of :data:`FORMAT_NAMES`); lesson 11.

    ``window`` defaults to 128 for KIVI (its residual length R, a multiple of ``group``, as
    KIVI's code asserts) and 0 (every token quantized) for FP8 and INT8. ``group`` applies to
    KIVI only.
    """
    if isinstance(name, KVFormat):
        return name
    if name not in FORMAT_NAMES:
        raise ValueError(f"unknown KV-cache format {name!r}; known: {', '.join(FORMAT_NAMES)}")
    kivi = name.startswith("kivi")
    if window is None:
        window = DEFAULT_WINDOW if kivi else 0
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"window (recent tokens kept in BF16) must be a whole number >= 0, "
                         f"got {window!r}")
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ValueError(f"group must be a whole number >= 1, got {group!r}")
    if name == "bf16":
        return KVFormat("bf16", "bf16", 16)
    if name.startswith("fp8"):
        return KVFormat(name, "fp8", 8, window, 1, per_head=name == "fp8_head")
    if name == "int8":
        return KVFormat(name, "int8", 8, window, 1)
    bits = int(name[4:])
    if group % (8 // bits):
        raise ValueError(f"group {group} must be a multiple of {8 // bits} so {bits}-bit codes "
                         f"pack whole bytes")
    if window % group:
        raise ValueError(f"{name}: the residual window {window} must be a multiple of the group "
                         f"{group} (keys are quantized {window} tokens at a time, in groups of "
                         f"{group} tokens per channel); try window={max(window // group, 1) * group}")
    return KVFormat(name, "kivi", bits, window, group)


def check_head_dim(fmt: KVFormat, head_dim: int) -> None:
    """KIVI groups values along the head dimension: the group must divide it."""
    if fmt.kind == "kivi" and head_dim % fmt.group:
        raise ValueError(f"{fmt.name}: group {fmt.group} does not divide the head dimension "
                         f"{head_dim}; choose a group among "
                         f"{[g for g in range(8 // fmt.bits, head_dim + 1) if head_dim % g == 0]}")


# ----------------------------------------------------------------------------- bytes
def cache_bytes(fmt, layers: int, kv_heads: int, head_dim: int, tokens: int,
                batch: int = 1) -> int:
    """Exact bytes a cache of ``tokens`` tokens per sequence holds (lesson 11).

    Codes, scales (and KIVI's minima) and the BF16 window, for ``batch`` sequences, plus
    FP8's fixed calibrated scales (fp32, per layer, or per layer and head). Per layer and
    head, with Qk keys and Qv values quantized (:meth:`KVFormat.quantized_counts`; Qk = Qv =
    Q except for KIVI) and the others in BF16:

    - bf16: ``2 x tokens x hd x 2``
    - fp8:  ``2 x Q x hd x 1 + 2 x (tokens - Q) x hd x 2``
    - int8: ``2 x Q x (hd + 2) + 2 x (tokens - Q) x hd x 2``  (one fp16 scale per token and head)
    - kivi: ``(Qk + Qv) x hd x bits / 8 + Qk x hd / G x 4 (keys: scale+min per channel per G
      tokens) + Qv x hd / G x 4 (values: per token per G channels) + (2 x tokens - Qk - Qv)
      x hd x 2``
    """
    fmt = get_format(fmt)
    check_head_dim(fmt, head_dim)
    for what, x in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim),
                    ("batch", batch)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ValueError(f"{what} must be a whole number >= 1, got {x!r}")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens must be a whole number >= 0, got {tokens!r}")
    Qk, Qv = fmt.quantized_counts(tokens)
    full = (2 * tokens - Qk - Qv) * head_dim * 2               # K and V of the BF16 tokens
    if fmt.kind == "bf16":
        quant = 0
    elif fmt.kind == "fp8":
        quant = (Qk + Qv) * head_dim
    elif fmt.kind == "int8":
        quant = (Qk + Qv) * (head_dim + SCALE_BYTES)
    else:
        per_group = 2 * SCALE_BYTES                            # fp16 scale + fp16 minimum
        quant = (Qk + Qv) * head_dim * fmt.bits // 8 + (Qk + Qv) * head_dim // fmt.group * per_group
    per_head = layers * kv_heads * batch * (quant + full)
    fixed = 0
    if fmt.kind == "fp8":
        fixed = layers * 2 * (kv_heads if fmt.per_head else 1) * FIXED_SCALE_BYTES
    return per_head + fixed


def bytes_per_token(fmt, layers: int, kv_heads: int, head_dim: int, tokens: int) -> float:
    """:func:`cache_bytes` of one sequence divided by its ``tokens`` (lesson 11)."""
    if not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens must be a whole number >= 1, got {tokens!r}")
    return cache_bytes(fmt, layers, kv_heads, head_dim, tokens) / tokens


def bits_per_value(fmt, head_dim: int) -> float:
    """Bits per cached value far from the BF16 part, scales included (lesson 11).

    bf16 16, fp8 8, int8 8 + 16/hd, kivi ``bits + 32/group`` (an fp16 scale and minimum per
    group, for keys and values alike): KIVI-2 with groups of 32 costs 3 bits, not 2. Pass it
    to ``hardware.plan(kv_format=...)`` as a number of bits.
    """
    fmt = get_format(fmt)
    check_head_dim(fmt, head_dim)
    if fmt.kind in ("bf16", "fp8"):
        return float(fmt.bits)
    if fmt.kind == "int8":
        return 8 + 8 * SCALE_BYTES / head_dim
    return fmt.bits + 8 * 2 * SCALE_BYTES / fmt.group


def shape_of(model) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of a ``LlamaModel``, a ``ModelConfig`` or a catalogue
    model name / ``hardware.Model`` (lesson 11)."""
    from course_lib import hardware

    cfg = getattr(model, "config", model)
    if hasattr(cfg, "num_key_value_heads"):
        return cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
    m = hardware.get_model(model)
    if m.kv_latent_dim is not None:
        raise ValueError(f"{m.name} caches a latent (MLA), not per-head keys and values")
    return m.layers, m.kv_heads, m.head_dim


# ----------------------------------------------------------------------------- quantizers
def to_bf16(x: torch.Tensor) -> torch.Tensor:
    """Round to BF16 and back to fp32: the model's own 16-bit cache."""
    return x.to(torch.bfloat16).float()


FP16_MAX = 65504.0       # largest fp16 value: INT8 and KIVI store their scales (and minima) in fp16


def _finite(x: torch.Tensor, what: str) -> None:
    if not torch.isfinite(x).all():
        raise ValueError(f"{what} hold NaN or inf: a cache of finite keys/values is expected")


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x (B, K, S, hd) -> FP8 E4M3 codes of x / scale, saturating at +-448; scale (K,) or (1,)."""
    _finite(x, "the keys/values to store in FP8")
    if not torch.isfinite(scale).all() or (scale <= 0).any():
        raise ValueError(f"FP8 scales must be finite and > 0 (absmax / 448); got {scale.tolist()}")
    s = scale.float().reshape(1, -1, 1, 1)                                # (1, K or 1, 1, 1)
    return (x.float() / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)  # (B, K, S, hd)


def dequantize_fp8(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return codes.float() * scale.float().reshape(1, -1, 1, 1)             # (B, K, S, hd)


def quantize_int8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (B, K, S, hd) -> (codes int8 (B, K, S, hd), scale fp16 (B, K, S)): absmax / 127 per
    token and head. The scale is rounded to fp16 first and the codes use the stored scale."""
    _finite(x, "the keys/values to store in INT8")
    amax = x.float().abs().amax(-1)                                       # (B, K, S)
    if (amax.detach() / 127 > FP16_MAX).any():
        raise ValueError(f"a token holds |x| = {float(amax.max()):.4g}: its INT8 scale "
                         f"(|x| / 127) would overflow the fp16 the scale is stored in "
                         f"(max {FP16_MAX:g}), so |x| must stay below {FP16_MAX * 127:.4g}. A BF16 "
                         f"cache holds such values; an INT8 cache with fp16 scales cannot")
    scale = (amax / 127).to(torch.float16)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)        # all-zero token
    q = torch.round(x.float() / scale.float()[..., None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8_per_token(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.float()[..., None]                           # (B, K, S, hd)


def minmax_quantize(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric quantization of each row of x (..., G) to ``bits`` bits (KIVI, lesson 11).

    scale = (max - min) / (2**bits - 1) and the minimum, both stored in fp16;
    q = clamp(round((x - min) / scale), 0, 2**bits - 1); x^ = q * scale + min.
    Returns (codes uint8 (..., G), scale fp16 (..., 1), minimum fp16 (..., 1)).
    """
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 8:
        raise ValueError(f"bits must be a whole number 1..8 (codes are stored in uint8); got "
                         f"{bits!r}")
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError("x must be a tensor (..., G) with at least one value per row")
    if not torch.isfinite(x).all():
        raise ValueError("x holds NaN or inf: a cache of finite keys/values is expected")
    levels = 2 ** bits - 1
    x = x.float()
    xd = x.detach()
    big = float(xd.abs().max())
    if big > FP16_MAX or float((xd.amax(-1) - xd.amin(-1)).max()) / levels > FP16_MAX:
        raise ValueError(f"values up to |x| = {big:.4g}: the group's minimum and scale are stored "
                         f"in fp16 (max {FP16_MAX:g}) and would overflow; a BF16 cache holds such "
                         f"values, a KIVI cache with fp16 scales cannot")
    lo = x.amin(-1, keepdim=True).to(torch.float16)                       # (..., 1)
    hi = x.amax(-1, keepdim=True)
    scale = ((hi - lo.float()) / levels).to(torch.float16)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)        # a constant row
    q = torch.round((x - lo.float()) / scale.float()).clamp(0, levels).to(torch.uint8)
    return q, scale, lo


def minmax_dequantize(q, scale, lo) -> torch.Tensor:
    return q.float() * scale.float() + lo.float()


def pack_codes(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack ``8 // bits`` codes per byte along the last dimension (first code lowest bits)."""
    per = 8 // bits
    q = q.reshape(*q.shape[:-1], q.shape[-1] // per, per).to(torch.int32)
    shifts = torch.arange(per, dtype=torch.int32) * bits                  # (per,)
    return (q << shifts).sum(-1).to(torch.uint8)


def unpack_codes(p: torch.Tensor, bits: int) -> torch.Tensor:
    per = 8 // bits
    shifts = torch.arange(per, dtype=torch.int32) * bits
    q = (p.to(torch.int32)[..., None] >> shifts) & (2 ** bits - 1)        # (..., n, per)
    return q.reshape(*p.shape[:-1], p.shape[-1] * per).to(torch.uint8)


def kivi_quantize_keys(k: torch.Tensor, bits: int, group: int) -> dict:
    """Keys per channel: each channel of each run of ``group`` tokens gets a scale and minimum.
    k (B, K, S, hd) with S a multiple of ``group``."""
    B, K, S, hd = k.shape
    if S % group:
        raise ValueError(f"keys are quantized per channel in groups of {group} tokens; got "
                         f"{S} tokens, not a multiple of {group}: keep the rest in BF16")
    g = k.reshape(B, K, S // group, group, hd).transpose(-1, -2)          # (B, K, S/G, hd, G)
    q, scale, lo = minmax_quantize(g, bits)
    return {"q": pack_codes(q, bits), "scale": scale, "min": lo}


def kivi_dequantize_keys(d: dict, bits: int) -> torch.Tensor:
    x = minmax_dequantize(unpack_codes(d["q"], bits), d["scale"], d["min"])  # (B, K, S/G, hd, G)
    B, K, n, hd, G = x.shape
    return x.transpose(-1, -2).reshape(B, K, n * G, hd)                   # (B, K, S, hd)


def kivi_quantize_values(v: torch.Tensor, bits: int, group: int) -> dict:
    """Values per token: each token's channels in runs of ``group`` share a scale and minimum."""
    B, K, S, hd = v.shape
    if hd % group:
        raise ValueError(f"values are quantized per token in groups of {group} channels; the "
                         f"head dimension {hd} is not a multiple of {group}")
    q, scale, lo = minmax_quantize(v.reshape(B, K, S, hd // group, group), bits)
    return {"q": pack_codes(q, bits), "scale": scale, "min": lo}


def kivi_dequantize_values(d: dict, bits: int) -> torch.Tensor:
    x = minmax_dequantize(unpack_codes(d["q"], bits), d["scale"], d["min"])  # (B, K, S, hd/G, G)
    return x.flatten(-2)                                                  # (B, K, S, hd)


def quantize_part(fmt: KVFormat, x16, part: str, scale=None) -> dict:
    """Quantize BF16-rounded keys (``part="k"``) or values (``"v"``) (B, K, n, hd) leaving the
    BF16 part of the cache. KIVI keys need n to be a multiple of the group."""
    if fmt.kind == "fp8":
        return {"c": quantize_fp8(x16, scale)}
    if fmt.kind == "int8":
        q, s = quantize_int8_per_token(x16)
        return {"c": q, "s": s}
    if part == "k":
        return kivi_quantize_keys(x16, fmt.bits, fmt.group)
    return kivi_quantize_values(x16, fmt.bits, fmt.group)


def dequantize_part(fmt: KVFormat, d: dict, part: str, scale=None) -> torch.Tensor:
    """The inverse of :func:`quantize_part`: fp32 (B, K, n, hd)."""
    if fmt.kind == "fp8":
        return dequantize_fp8(d["c"], scale)
    if fmt.kind == "int8":
        return dequantize_int8_per_token(d["c"], d["s"])
    if part == "k":
        return kivi_dequantize_keys(d, fmt.bits)
    return kivi_dequantize_values(d, fmt.bits)


def quantize_block(fmt: KVFormat, k16, v16, k_scale=None, v_scale=None) -> dict:
    """Quantize BF16-rounded keys and values (B, K, n, hd) of tokens leaving the window.
    For KIVI, n must be a multiple of the group. Returns the stored tensors by name."""
    if fmt.kind == "fp8":
        return {"k": quantize_fp8(k16, k_scale), "v": quantize_fp8(v16, v_scale)}
    if fmt.kind == "int8":
        (kq, ks), (vq, vs) = quantize_int8_per_token(k16), quantize_int8_per_token(v16)
        return {"k": kq, "k_scale": ks, "v": vq, "v_scale": vs}
    kd = kivi_quantize_keys(k16, fmt.bits, fmt.group)
    vd = kivi_quantize_values(v16, fmt.bits, fmt.group)
    return {**{f"k_{n}": t for n, t in kd.items()}, **{f"v_{n}": t for n, t in vd.items()}}


def dequantize_block(fmt: KVFormat, d: dict, k_scale=None, v_scale=None):
    """The inverse of :func:`quantize_block`: (k, v) fp32 (B, K, n, hd)."""
    if fmt.kind == "fp8":
        return dequantize_fp8(d["k"], k_scale), dequantize_fp8(d["v"], v_scale)
    if fmt.kind == "int8":
        return (dequantize_int8_per_token(d["k"], d["k_scale"]),
                dequantize_int8_per_token(d["v"], d["v_scale"]))
    kd = {n[2:]: t for n, t in d.items() if n.startswith("k_")}
    vd = {n[2:]: t for n, t in d.items() if n.startswith("v_")}
    return kivi_dequantize_keys(kd, fmt.bits), kivi_dequantize_values(vd, fmt.bits)


def fake_quantize_kv(fmt, k, v, k_scale=None, v_scale=None):
    """Every token's key and value as the cache would return it once quantized: (kq, vq),
    fp32 (B, K, S, hd). KIVI keys are quantized in whole groups of tokens from position 0 (the
    real cache quantizes them R tokens at a time, R a multiple of the group, so its groups
    start at the same positions); a trailing partial group is returned in BF16 (no query
    ever sees it quantized)."""
    fmt = get_format(fmt)
    k16, v16 = to_bf16(k), to_bf16(v)
    if fmt.kind == "bf16":
        return k16, v16
    n = k.shape[2] // fmt.group * fmt.group
    kq, vq = dequantize_block(fmt, quantize_block(fmt, k16[:, :, :n], v16[:, :, :n],
                                                  k_scale, v_scale), k_scale, v_scale)
    return torch.cat([kq, k16[:, :, n:]], 2), torch.cat([vq, v16[:, :, n:]], 2)


# ----------------------------------------------------------------------------- attention
def attention(q, k, v, q_pos, kq=None, vq=None, n_quant=None, n_quant_v=None):
    """Causal grouped-query attention of queries at absolute positions ``q_pos`` (lesson 11).

    q (B, H, T, hd); k, v (B, K, S, hd); q_pos (T,) int64. With ``kq``, ``vq`` (quantized
    copies of k, v) and ``n_quant`` (T,), query i reads keys/values ``j < n_quant[i]`` from
    the quantized copies and the others from k, v: the per-query emulation. It is one
    attention over both copies side by side, [kq | k], with a mask that lets each query see
    each token once, from the copy it would read. ``n_quant_v`` (T,), when it differs from
    ``n_quant``: query i reads values ``j < n_quant_v[i]`` quantized and keys ``j <
    n_quant[i]`` (KIVI, whose keys and values leave full precision at different times).
    Returns (B, H, T, hd) in fp32 (fp64 for fp64 inputs).
    """
    dt = torch.promote_types(q.dtype, torch.float32)   # fp32, or fp64 in exactness tests
    if n_quant_v is not None and kq is not None and not torch.equal(n_quant_v, n_quant):
        return _attention_split_counts(q, k, v, q_pos, kq, vq, n_quant, n_quant_v, dt)
    S = k.shape[2]
    cols = torch.arange(S, device=q.device)
    allowed = cols[None, :] <= q_pos[:, None]                              # (T, S) causal
    if kq is not None:
        use_q = cols[None, :] < n_quant[:, None]                           # (T, S)
        allowed = torch.cat([allowed & use_q, allowed & ~use_q], 1)        # (T, 2S)
        k, v = torch.cat([kq, k], 2), torch.cat([vq, v], 2)                # (B, K, 2S, hd)
    return F.scaled_dot_product_attention(q.to(dt), k.to(dt), v.to(dt), attn_mask=allowed,
                                          enable_gqa=True)                 # (B, H, T, hd)


def _attention_split_counts(q, k, v, q_pos, kq, vq, nk, nv, dt, chunk: int = 256):
    """:func:`attention` when keys and values switch to their quantized copies at different
    positions: scores from [kq | k] per key, weights applied to [vq | v] per value, written
    out (a few hundred queries at a time, to bound memory)."""
    B, H, T, hd = q.shape
    plain = int(((nk == 0) & (nv == 0)).sum())         # a prefix: counts grow with the position
    out = [attention(q[:, :, :plain], k, v, q_pos[:plain])] if plain else []  # as the BF16 cache
    rep = H // k.shape[1]
    k, v, kq, vq = (x.to(dt).repeat_interleave(rep, 1) for x in (k, v, kq, vq))  # (B, H, S, hd)
    S = k.shape[2]
    cols = torch.arange(S, device=q.device)
    for a in range(plain, T, chunk):
        qs = q[:, :, a:a + chunk].to(dt) / math.sqrt(hd)                    # (B, H, t, hd)
        pos, ki, vi = q_pos[a:a + chunk], nk[a:a + chunk], nv[a:a + chunk]
        use_kq = cols[None, :] < ki[:, None]                                 # (t, S)
        s = torch.where(use_kq, qs @ kq.transpose(-1, -2), qs @ k.transpose(-1, -2))
        s = s.masked_fill(~(cols[None, :] <= pos[:, None]), float("-inf"))
        p = torch.softmax(s, -1)                                             # (B, H, t, S)
        use_vq = (cols[None, :] < vi[:, None]).to(dt)                        # (t, S)
        out.append((p * use_vq) @ vq + (p * (1 - use_vq)) @ v)
    return torch.cat(out, 2)                                                 # (B, H, T, hd)


# ----------------------------------------------------------------------------- online softmax
def _float_tensor(name: str, x, dims: int) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() != dims:
        raise ValueError(f"{name} must be a {dims}-D tensor; got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be floating point; got {x.dtype}")
    if torch.isnan(x).any():
        raise ValueError(f"{name} holds NaN")
    return x


def online_softmax_step(m, l, acc, s, v):
    """One block of the decode-attention kernel's online softmax (lesson 11), in float32.

    The state of the R query heads that share one KV head: ``m`` (R,) the largest score seen,
    ``l`` (R,) the sum of exp(score - m), ``acc`` (R, hd) the sum of exp(score - m) x value.
    A new block brings ``s`` (R, n) scores (already scaled by 1/sqrt(hd); -inf where masked)
    and ``v`` (n, hd) the block's values, shared by the R heads. Returns the new (m, l, acc);
    the inputs are not modified. A block whose scores are all -inf leaves the state as it was.
    Start from m = -inf, l = 0, acc = 0; the attention output is acc / l.
    """
    m, l = _float_tensor("m", m, 1), _float_tensor("l", l, 1)
    acc, s, v = _float_tensor("acc", acc, 2), _float_tensor("s", s, 2), _float_tensor("v", v, 2)
    R, n = s.shape
    if n == 0:
        raise ValueError("s has no column: a block holds at least one token")
    if not (len(m) == len(l) == acc.shape[0] == R):
        raise ValueError(f"m {tuple(m.shape)}, l {tuple(l.shape)}, acc {tuple(acc.shape)} and "
                         f"s {tuple(s.shape)} must agree on the number of heads R")
    if v.shape[0] != n or v.shape[1] != acc.shape[1]:
        raise ValueError(f"v must be (n, hd) = ({n}, {acc.shape[1]}) to match s {tuple(s.shape)} "
                         f"and acc {tuple(acc.shape)}; got {tuple(v.shape)}")
    m, l, acc, s, v = m.float(), l.float(), acc.float(), s.float(), v.float()
    m_new = torch.maximum(m, s.amax(-1))                                   # (R,)
    safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
    alpha = torch.exp(m - safe)                                            # (R,) 0 when m = -inf
    p = torch.exp(s - safe[:, None])                                       # (R, n)
    return m_new, l * alpha + p.sum(-1), acc * alpha[:, None] + p @ v      # (R,), (R,), (R, hd)


def combine_splits(ms, ls, accs):
    """Merge the states of P context slices into the attention output (lesson 11; the
    decode kernel's combine step). ``ms``, ``ls`` (P, R), ``accs`` (P, R, hd), each slice's
    (m, l, acc) from :func:`online_softmax_step`; a slice that saw no token has m = -inf and
    l = 0 and counts for nothing. Returns (R, hd) float32: sum_i acc_i e^(m_i - M) /
    sum_i l_i e^(m_i - M) with M the largest m_i."""
    ms, ls, accs = _float_tensor("ms", ms, 2), _float_tensor("ls", ls, 2), _float_tensor("accs", accs, 3)
    if ms.shape != ls.shape or accs.shape[:2] != ms.shape:
        raise ValueError(f"ms {tuple(ms.shape)} and ls {tuple(ls.shape)} must be (P, R) and accs "
                         f"(P, R, hd); got accs {tuple(accs.shape)}")
    if ms.shape[0] == 0:
        raise ValueError("no slice to combine: give at least one (m, l, acc)")
    ms, ls, accs = ms.float(), ls.float(), accs.float()
    M = ms.amax(0)                                                         # (R,)
    if (M == float("-inf")).any():
        raise ValueError("a head saw no token in any slice: its attention is undefined")
    w = torch.where(ms > float("-inf"), torch.exp(ms - M), torch.zeros_like(ms))  # (P, R)
    return (w[..., None] * accs).sum(0) / (w * ls).sum(0)[:, None]         # (R, hd)


def decode_attention_blockwise(q, k, v, lengths, block: int = 16, split: int = 1,
                               step=online_softmax_step, combine=combine_splits):
    """Decode attention the way the kernel computes it, in plain torch (lesson 11): per
    sequence and KV head, the context cut into ``split`` slices, each read ``block`` tokens at
    a time through ``step`` (:func:`online_softmax_step`), the slices merged by ``combine``
    (:func:`combine_splits`). q (B, H, hd); k, v (B, K, S, hd) fp; lengths (B,). Returns
    (B, H, hd) float32. ``step`` and ``combine`` may be a learner's own."""
    if q.dim() != 3 or k.dim() != 4 or v.shape != k.shape or q.shape[0] != k.shape[0] \
            or q.shape[-1] != k.shape[-1] or q.shape[1] % k.shape[1]:
        raise ValueError(f"expected q (B, H, hd) and k, v (B, K, S, hd) with K dividing H; got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    for name, x in (("block", block), ("split", split)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ValueError(f"{name} must be a whole number >= 1; got {x!r}")
    B, H, hd = q.shape
    K, S = k.shape[1], k.shape[2]
    lengths = torch.as_tensor(lengths)
    if lengths.shape != (B,) or (lengths < 1).any() or (lengths > S).any():
        raise ValueError(f"lengths must be (B,) = ({B},) with each in 1..{S}; got {lengths.tolist()}")
    R = H // K
    out = torch.empty(B, H, hd)
    for b in range(B):
        L = int(lengths[b])
        cuts = [round(i * L / split) for i in range(split + 1)]            # slice bounds
        for kh in range(K):
            qs = q[b, kh * R:(kh + 1) * R].float() / math.sqrt(hd)          # (R, hd)
            states = []
            for lo, hi in zip(cuts[:-1], cuts[1:]):
                m, l, acc = torch.full((R,), float("-inf")), torch.zeros(R), torch.zeros(R, hd)
                for j in range(lo, hi, block):
                    kb, vb = k[b, kh, j:min(j + block, hi)].float(), v[b, kh, j:min(j + block, hi)].float()
                    m, l, acc = step(m, l, acc, qs @ kb.T, vb)             # (R,), (R,), (R, hd)
                states.append((m, l, acc))
            out[b, kh * R:(kh + 1) * R] = combine(*(torch.stack(x) for x in zip(*states)))
    return out


# ----------------------------------------------------------------------------- the caches
def _check_kv(config, layer, q, k):
    if k.shape[-1] != config.head_dim or q.shape[-1] != config.head_dim:
        raise ValueError(f"keys have head dimension {k.shape[-1]} but this cache was made for "
                         f"head_dim {config.head_dim}; make the cache from the model's config")
    if k.shape[1] != config.num_key_value_heads:
        raise ValueError(f"keys have {k.shape[1]} KV heads but the cache expects "
                         f"{config.num_key_value_heads}")
    if not 0 <= layer < config.num_hidden_layers:
        raise ValueError(f"layer {layer} out of range 0..{config.num_hidden_layers - 1}")


def _fp8_scales(fmt, scales, config, layer):
    if fmt.kind != "fp8":
        return None, None
    return scales.k[layer], scales.v[layer]


class QuantizedKVCache:
    """The model's KV cache stored in ``fmt`` (lesson 11): pass it to ``model(ids, cache)`` or
    ``model.generate(..., cache=QuantizedKVCache(...))``.

    Per layer it holds the quantized keys' and values' codes and scales and a BF16 tail of
    each (the recent tokens; for KIVI the two tails differ in length, see
    :meth:`KVFormat.quantized_counts`). FP8 needs ``scales`` from :func:`calibrate`. FP8 and
    INT8 quantize new tokens as they are stored, then attend; KIVI attends with the new
    tokens in BF16 and quantizes afterwards, as its reference code does. A chunk of several
    new tokens (a prompt) is stored first and then attended to, so every query of the chunk
    sees the cache as it stands after the chunk; token-by-token decode sees exactly what
    :class:`PerQueryEmulation` models.
    """

    def __init__(self, config, fmt="bf16", scales: "FP8Scales | None" = None,
                 window: int | None = None, group: int = DEFAULT_GROUP):
        self.config = getattr(config, "config", config)
        self.fmt = get_format(fmt, window, group)
        check_head_dim(self.fmt, self.config.head_dim)
        if self.fmt.kind == "fp8":
            if scales is None:
                raise ValueError(f"{self.fmt.name} needs calibrated scales: "
                                 f"scales = kv.calibrate(model, ids, per_head=...)")
            self.scales = scales.for_format(self.fmt, self.config)
        else:
            self.scales = None
        L = self.config.num_hidden_layers
        # per part ("k", "v") and layer: stored codes and scales, their count, the BF16 tail
        self.quant: dict[str, list[dict | None]] = {"k": [None] * L, "v": [None] * L}
        self.n_quant: dict[str, list[int]] = {"k": [0] * L, "v": [0] * L}
        self.tail: dict[str, list[torch.Tensor | None]] = {"k": [None] * L, "v": [None] * L}

    def layer_length(self, layer: int) -> int:
        t = self.tail["k"][layer]
        return self.n_quant["k"][layer] + (0 if t is None else t.shape[2])

    def length(self) -> int:
        return self.layer_length(0)

    def append(self, layer: int, k, v) -> None:
        """Store new keys and values (B, K, T, hd) in the BF16 tails (:meth:`settle` then
        quantizes what has left them)."""
        for part, x in (("k", k), ("v", v)):
            old = self.tail[part][layer]
            x = to_bf16(x).to(torch.bfloat16)
            self.tail[part][layer] = x if old is None else torch.cat([old, x], 2)

    def settle(self, layer: int) -> None:
        """Quantize the oldest BF16 tokens that the format no longer keeps in BF16."""
        counts = dict(zip("kv", self.fmt.quantized_counts(self.layer_length(layer))))
        ks, vs = _fp8_scales(self.fmt, self.scales, self.config, layer)
        for part, scale in (("k", ks), ("v", vs)):
            move = counts[part] - self.n_quant[part][layer]
            if move <= 0:
                continue
            tail = self.tail[part][layer]
            block = quantize_part(self.fmt, tail[:, :, :move].float(), part, scale)
            old = self.quant[part][layer]
            self.quant[part][layer] = block if old is None else {
                n: torch.cat([old[n], t], 2) for n, t in block.items()}
            self.n_quant[part][layer] += move
            self.tail[part][layer] = tail[:, :, move:]

    def keys_values(self, layer: int):
        """Everything cached for ``layer`` as attention reads it: (k, v) fp32 (B, K, S, hd)."""
        ks, vs = _fp8_scales(self.fmt, self.scales, self.config, layer)
        out = []
        for part, scale in (("k", ks), ("v", vs)):
            x = self.tail[part][layer].float()
            if self.quant[part][layer] is not None:
                x = torch.cat([dequantize_part(self.fmt, self.quant[part][layer], part, scale), x], 2)
            out.append(x)
        return tuple(out)

    def attend(self, layer: int, q, k, v):
        """The model's hook: store k, v (B, K, T, hd), attend q (B, H, T, hd) to the cache."""
        _check_kv(self.config, layer, q, k)
        past, T = self.layer_length(layer), q.shape[2]
        limit = self.config.max_position_embeddings
        if past + T > limit:
            raise ValueError(f"the cache would hold {past + T} tokens, past the model's context "
                             f"of {limit}; trim the prompt or generate fewer tokens")
        self.append(layer, k, v)
        kivi = self.fmt.kind == "kivi"
        if not kivi:                     # FP8 / INT8: written quantized, then read
            self.settle(layer)
        K_all, V_all = self.keys_values(layer)
        pos = torch.arange(past, past + T, device=q.device)
        out = attention(q, K_all, V_all, pos).to(q.dtype)
        if kivi:                         # KIVI: attend in full precision, then quantize
            self.settle(layer)
        return out

    def nbytes(self) -> int:
        """Bytes this cache holds: codes, scales, BF16 tails, and FP8's fixed scales."""
        total = 0
        for part in ("k", "v"):
            for layer in range(self.config.num_hidden_layers):
                t = self.tail[part][layer]
                total += 0 if t is None else t.numel() * t.element_size()
                for x in (self.quant[part][layer] or {}).values():
                    total += x.numel() * x.element_size()
        if self.scales is not None:
            total += sum(t.numel() * t.element_size() for t in self.scales.k + self.scales.v)
        return total


class PerQueryEmulation:
    """Score a whole window in one forward pass as if it were decoded token by token (lesson 11).

    Use once per forward, on an empty context: ``model(ids, PerQueryEmulation(model, fmt))``.
    Query i reads keys ``j < nk`` and values ``j < nv`` quantized, ``(nk, nv) =
    fmt.read_counts(i)``, and the rest in BF16: the state of :class:`QuantizedKVCache` when
    token i is decoded.
    """

    def __init__(self, config, fmt="bf16", scales: "FP8Scales | None" = None,
                 window: int | None = None, group: int = DEFAULT_GROUP):
        self.config = getattr(config, "config", config)
        self.fmt = get_format(fmt, window, group)
        check_head_dim(self.fmt, self.config.head_dim)
        if self.fmt.kind == "fp8" and scales is None:
            raise ValueError(f"{self.fmt.name} needs calibrated scales: kv.calibrate(model, ids)")
        self.scales = scales.for_format(self.fmt, self.config) if self.fmt.kind == "fp8" else None

    def length(self) -> int:
        return 0          # every forward starts a fresh window

    def attend(self, layer: int, q, k, v):
        _check_kv(self.config, layer, q, k)
        T = q.shape[2]
        if T > self.config.max_position_embeddings:
            raise ValueError(f"a window of {T} tokens is past the model's context of "
                             f"{self.config.max_position_embeddings}; use a shorter window")
        pos = torch.arange(T, device=q.device)
        if self.fmt.kind == "bf16":
            return attention(q, to_bf16(k), to_bf16(v), pos).to(q.dtype)
        ks, vs = _fp8_scales(self.fmt, self.scales, self.config, layer)
        kq, vq = fake_quantize_kv(self.fmt, k, v, ks, vs)                 # (B, K, T, hd)
        if self.fmt.window == 0 and self.fmt.group == 1:   # every token read quantized
            return attention(q, kq, vq, pos).to(q.dtype)
        counts = torch.tensor([self.fmt.read_counts(i) for i in range(T)], device=q.device)
        return attention(q, to_bf16(k), to_bf16(v), pos, kq, vq, counts[:, 0],
                         counts[:, 1]).to(q.dtype)


# ----------------------------------------------------------------------------- calibration
@dataclass
class FP8Scales:
    """Largest |key| and |value| seen per layer and KV head on calibration text (lesson 11).
    ``k``, ``v``: lists (one per layer) of (K,) fp32 absmax tensors."""
    k: list
    v: list

    def for_format(self, fmt: KVFormat, config) -> "FP8Scales":
        """Scales = absmax / 448, per head (``fp8_head``) or one per layer (``fp8_tensor``)."""
        if len(self.k) != config.num_hidden_layers or self.k[0].numel() != config.num_key_value_heads:
            raise ValueError("these FP8 scales were calibrated on a model of another shape")

        def one(a):
            a = a.float() if fmt.per_head else a.float().max().reshape(1)
            return torch.where(a > 0, a / FP8_MAX, torch.ones_like(a))
        return FP8Scales([one(a) for a in self.k], [one(a) for a in self.v])


class _Recorder:
    """A cache-shaped hook that records |k|, |v| maxima and attends in full precision."""

    def __init__(self, config):
        self.config = config
        L, K = config.num_hidden_layers, config.num_key_value_heads
        self.k = [torch.zeros(K) for _ in range(L)]
        self.v = [torch.zeros(K) for _ in range(L)]

    def length(self):
        return 0

    def attend(self, layer, q, k, v):
        self.k[layer] = torch.maximum(self.k[layer], to_bf16(k).abs().amax((0, 2, 3)))
        self.v[layer] = torch.maximum(self.v[layer], to_bf16(v).abs().amax((0, 2, 3)))
        return attention(q, to_bf16(k), to_bf16(v), torch.arange(q.shape[2])).to(q.dtype)


@torch.no_grad()
def calibrate(model, ids, window: int = 512) -> FP8Scales:
    """Run ``model`` over calibration ids (N,) in windows and record per-layer, per-head key
    and value maxima (lesson 11). Never calibrate on the text you evaluate on."""
    from course_lib import eval as ceval

    ids = _check_ids(ids)
    if len(ids) < 2:
        raise ValueError("calibration needs at least 2 token ids (a window of 1 token and its "
                         "next); give the calibration text, never the evaluation text")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a whole number of tokens >= 1; got {window!r}")
    rec = _Recorder(model.config)
    window = min(window, model.config.max_position_embeddings, len(ids) - 1)
    w = ceval.make_windows(ids, window)                                   # (n, W+1)
    for row in w:
        model(row[None, :-1], rec)
    return FP8Scales(rec.k, rec.v)


def _check_layer(model, layer) -> int:
    n = model.config.num_hidden_layers
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < n:
        raise ValueError(f"layer must be a whole number in 0..{n - 1} (the model has {n} layers); "
                         f"got {layer!r}")
    return layer


def _check_ids(ids) -> torch.Tensor:
    t = torch.as_tensor(ids)
    if t.dim() != 1 or len(t) == 0:
        hint = "; a (1, T) batch: pass ids[0]" if t.dim() == 2 and t.shape[0] == 1 else ""
        raise ValueError(f"ids must be a non-empty 1-D sequence of token ids; got shape "
                         f"{tuple(t.shape)}{hint}")
    if t.is_floating_point() or t.dtype == torch.bool:
        raise TypeError(f"ids must hold integer token ids; got {t.dtype}")
    return t


@torch.no_grad()
def record_qkv(model, ids, layer: int):
    """Queries, keys and values of one layer on ids (T,) after RoPE (lesson 11): q (H, T, hd),
    k and v (K, T, hd)."""
    layer, ids = _check_layer(model, layer), _check_ids(ids)
    out = {}

    class _Grab(_Recorder):
        def attend(self, l, q, k, v):
            if l == layer:
                out["q"], out["k"], out["v"] = q[0].float(), k[0].float(), v[0].float()
            return super().attend(l, q, k, v)

    model(ids[None], _Grab(model.config))
    return out["q"], out["k"], out["v"]


def record_keys_values(model, ids, layer: int):
    """Keys and values of one layer on ids (T,) after RoPE: (k, v) each (K, T, hd) (lesson 11's
    outlier plot)."""
    return record_qkv(model, ids, layer)[1:]


# ----------------------------------------------------------------------------- quality
@torch.no_grad()
def window_scores(model, ids, formats, scales: FP8Scales | None = None,
                  window: int | None = None, group: int = DEFAULT_GROUP) -> dict:
    """Score one window ids (T+1,) with every cache format in one forward pass each (lesson 11).

    Returns {format: {"nll": (T,), "kl": (T,), "agree": (T,) bool}}: next-token negative
    log-likelihood, KL(bf16 cache || format) in nats and top-1 agreement with the bf16 cache,
    per position. ``window``: KIVI's residual length R (None: 128).
    """
    ids = _check_ids(ids)
    T = ids.numel() - 1
    if T < 1:
        raise ValueError("ids must hold at least 2 tokens: one to read, one to predict")
    if not formats:
        raise ValueError(f"formats is empty: name at least one of {', '.join(FORMAT_NAMES)}")
    if T > model.config.max_position_embeddings:
        raise ValueError(f"a window of {T} tokens is past the model's context of "
                         f"{model.config.max_position_embeddings}; use a shorter context")
    if window is not None and window >= T:
        raise ValueError(f"the recent window ({window} tokens) is not shorter than the context "
                         f"({T}): nothing would be quantized; use a longer context or a "
                         f"smaller window")
    x, tgt = ids[None, :-1], ids[1:]
    out, ref = {}, None
    for name in ["bf16"] + [f for f in formats if f != "bf16"]:
        fmt = get_format(name, window if name.startswith("kivi") else None, group)
        lp = F.log_softmax(model(x, PerQueryEmulation(model, fmt, scales))[0].float(), -1)
        if ref is None:
            ref = lp
        out[name] = {"nll": -lp.gather(1, tgt[:, None])[:, 0],
                     "kl": (ref.exp() * (ref - lp)).sum(-1).clamp_min(0),
                     "agree": lp.argmax(-1) == ref.argmax(-1)}
        del lp
    return {f: out[f] for f in formats}


def by_position(scores: list[dict], bins) -> dict:
    """Average per-position scores of several windows into position bins (lesson 11).

    ``bins``: edges such as (0, 128, 512, 1024, 4096). Returns {format: [ {"from", "to",
    "ppl", "kl", "top1"} per bin ]}.
    """
    if not scores:
        raise ValueError("scores is empty: pass the per-window scores of window_scores()")
    if len(bins) < 2 or any(b <= a for a, b in zip(bins[:-1], bins[1:])) or bins[0] < 0:
        raise ValueError(f"bins must be at least two increasing edges from 0 such as "
                         f"(0, 128, 512); got {bins!r}")
    out = {}
    for f in scores[0]:
        nll = torch.stack([s[f]["nll"] for s in scores])                  # (n, T)
        kl = torch.stack([s[f]["kl"] for s in scores])
        agree = torch.stack([s[f]["agree"] for s in scores]).float()
        rows = []
        for a, b in zip(bins[:-1], bins[1:]):
            b = min(b, nll.shape[1])
            if a >= b:
                break
            rows.append({"from": int(a), "to": int(b), "ppl": math.exp(float(nll[:, a:b].mean())),
                         "kl": float(kl[:, a:b].mean()), "top1": float(agree[:, a:b].mean())})
        out[f] = rows
    return out


# ----------------------------------------------------------------------------- results command
def _bins(context: int):
    edges = [0, 128, 256, 512, 1024, 2048, 4096, 8192]
    return [e for e in edges if e < context] + [context]


#: SmolLM2's text protocol (``course_lib.smollm.PROTOCOLS``): calibration and evaluation text
#: share no verbatim run of 50 characters.
PROTOCOL = "clean"


def _load(model_name: str):
    """(model, calibration ids, evaluation ids) for 'smollm2' or 'tiny'."""
    from course_lib import data
    if model_name == "smollm2":
        from course_lib import smollm
        if not smollm.available():
            raise RuntimeError("SmolLM2 is not available here (see course_lib.smollm)")
        model = smollm.load()
        return (model, smollm.calibration_ids(protocol=PROTOCOL),
                smollm.eval_ids(protocol=PROTOCOL))
    from course_lib.model import load_pretrained
    text = data.heldout_text()
    half = len(text) // 2   # the bundled model: calibrate on the second half, evaluate on the first
    return load_pretrained(), data.to_tensor(text[half:]), data.to_tensor(text[:half])


def eval_windows(eval_ids: torch.Tensor, context: int, n_windows: int) -> torch.Tensor:
    """``n_windows`` windows of ``context`` + 1 tokens spread evenly over the evaluation ids
    (different topics), (n, context + 1) (lesson 11)."""
    n_fit = (len(eval_ids) - 1) // context
    if n_fit < n_windows:
        raise ValueError(f"the evaluation text holds {n_fit} windows of {context} tokens; "
                         f"asked for {n_windows}")
    return torch.stack([eval_ids[s:s + context + 1]
                        for s in window_starts(len(eval_ids), context, n_windows)])


def window_starts(n_ids: int, context: int, n_windows: int) -> list[int]:
    """Where :func:`eval_windows` starts each window in ``n_ids`` evaluation ids."""
    n_fit = (n_ids - 1) // context
    return [round(i * (n_fit - 1) / max(n_windows - 1, 1)) * context for i in range(n_windows)]


def per_window(scores: list[dict], formats) -> dict:
    """Each window's whole-window figures and, from 2 windows on, a bootstrap interval per
    mean (``course_lib.protocol``), and each format's KL paired against int8's (lesson 11).

    Returns {"windows": {format: {"ppl", "kl", "top1": [one per window]}},
    "interval": {format: {"kl", "top1": [lo, hi]}} or None, "paired_kl_vs_int8": ...}."""
    from course_lib import protocol
    win = {f: {"ppl": [math.exp(float(s[f]["nll"].mean())) for s in scores],
               "kl": [float(s[f]["kl"].mean()) for s in scores],
               "top1": [float(s[f]["agree"].float().mean()) for s in scores]} for f in formats}
    out = {"windows": win, "interval": None, "paired_kl_vs_int8": None}
    if len(scores) >= 2:
        out["interval"] = {f: {k: protocol.interval(win[f][k]) for k in ("kl", "top1")}
                           for f in formats}
        if "int8" in formats:
            out["paired_kl_vs_int8"] = {f: protocol.paired(win[f]["kl"], win["int8"]["kl"])
                                        for f in formats if f not in ("int8", "bf16")}
    return out


def _protocol_record(n_ids: int, context: int, n_windows: int) -> dict:
    from course_lib import protocol
    return {"name": PROTOCOL, "text": f"course_lib.smollm.texts({PROTOCOL!r})[1]",
            "calibration": f"course_lib.smollm.texts({PROTOCOL!r})[0] (no 50-character run "
                           f"shared with the evaluation text)",
            "window_starts": window_starts(n_ids, context, n_windows), "eval_tokens": n_ids,
            "spread": f"per-window figures; {protocol.LEVEL:.0%} bootstrap intervals over "
                      f"windows ({protocol.N_BOOT} resamples)"}


def run(model_name: str = "smollm2", context: int = 4096, n_windows: int = 3,
        formats=FORMAT_NAMES, cal_tokens: int = 1024, live: dict | None = None,
        out: str | Path | None = None, log=print) -> dict:
    """Quality against context length for every format; writes ``results/kv_<model>.json``.

    ``live``: the short slice the lesson recomputes (context, formats), stored beside it.
    """
    from course_lib import device
    torch.manual_seed(0)
    t0 = time.time()
    model, cal_ids, eval_ids = _load(model_name)
    scales = calibrate(model, cal_ids[:cal_tokens + 1])
    L, K, hd = shape_of(model)
    res = {"model": model_name, "context": context, "n_windows": n_windows,
           "window": DEFAULT_WINDOW, "group": DEFAULT_GROUP, "calibration_tokens": cal_tokens,
           "shape": {"layers": L, "kv_heads": K, "head_dim": hd},
           "bytes_per_token": {f: bytes_per_token(f, L, K, hd, context) for f in formats},
           "bits_per_value": {f: bits_per_value(f, hd) for f in formats},
           "machine": device.machine_record()}
    if model_name == "smollm2":
        res["protocol"] = _protocol_record(len(eval_ids), context, n_windows)
    path = Path(out or Path(__file__).resolve().parent.parent / "results" / f"kv_{model_name}.json")
    if path.exists() and "decode_attention" in json.loads(path.read_text()):
        # the GPU timing rows (kernels.decode_attention) are measured by another command: kept
        res["decode_attention"] = json.loads(path.read_text())["decode_attention"]
    if live:
        res["live"] = live_slice(model, eval_ids, scales, **live)
        log(f"live slice done, {time.time() - t0:.0f} s")
    path.parent.mkdir(parents=True, exist_ok=True)
    scores = []
    for i, w in enumerate(eval_windows(eval_ids, context, n_windows)):
        scores.append(window_scores(model, w, formats, scales))
        res["windows_done"] = i + 1          # written after every window: a partial run counts
        res["by_position"] = by_position(scores, _bins(context))
        res["overall"] = {f: by_position(scores, [0, context])[f][0] for f in formats}
        res.update(per_window(scores, formats))
        res["seconds"] = round(time.time() - t0, 1)
        path.write_text(json.dumps(res, indent=1) + "\n")
        log(f"window {i + 1}/{n_windows} done, {time.time() - t0:.0f} s; wrote {path}")
    return res


def live_slice(model, eval_ids, scales, context: int = 320, formats=LIVE_FORMATS,
               window: int = 64) -> dict:
    """The slice lesson 11 recomputes live: the first window of ``context`` tokens, KIVI's
    window shortened to ``window``. {format: {"ppl", "kl", "top1"}}."""
    s = window_scores(model, eval_ids[:context + 1], formats, scales, window=window)
    rows = by_position([s], [0, context])
    return {"context": context, "window": window,
            "scores": {f: rows[f][0] for f in formats}}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="KV-cache quality against context length (lesson 11)")
    p.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--windows", type=int, default=3)
    a = p.parse_args(argv)
    live = {"context": 320, "window": 64} if a.model == "smollm2" else {"context": 192, "window": 32}
    run(a.model, a.context, a.windows, live=live)


if __name__ == "__main__":
    main()
