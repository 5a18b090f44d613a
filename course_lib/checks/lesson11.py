"""Exercises of lesson 11, "The KV cache" (solutions/11_kv_cache.ipynb)."""
from __future__ import annotations

import torch

from course_lib import hardware, kv
from course_lib.checks import Case, Exercise, register


# ---------------------------------------------------------------- 11.keys_per_channel

def keys_per_channel_reference(k, bits, group):
    """kv's KIVI key quantizer on one head: k (S, hd) -> dequantized (S, hd)."""
    if not isinstance(k, torch.Tensor) or k.dim() != 2:
        raise ValueError("k must be a 2-D tensor (tokens, channels)")
    d = kv.kivi_quantize_keys(k[None, None].float(), bits, group)
    return kv.kivi_dequantize_keys(d, bits)[0, 0]


def _keys(S, hd, seed, outlier=None):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(S, hd, generator=g)
    if outlier is not None:
        k[:, outlier] = k[:, outlier] * 30 + 5
    return k


def _keys_cases():
    const = _keys(32, 8, 3)
    const[:, 2] = 0.75                                   # a constant channel: max == min
    return [
        Case((_keys(64, 16, 0), 2, 32), label="2 bits, two groups of 32 tokens"),
        Case((_keys(32, 16, 1, outlier=4), 2, 32), label="an outlier channel (as real keys have)"),
        Case((_keys(48, 8, 2), 4, 16), label="4 bits, groups of 16"),
        Case((const, 2, 32), label="a constant channel: scale 0 must not divide by zero"),
        Case((_keys(8, 4, 4) * 1e-3, 2, 8), label="tiny values"),
        Case((_keys(40, 8, 5), 2, 32), label="40 tokens, groups of 32: raise ValueError",
             raises=ValueError),
    ]


def _wrong_keys_per_token(k, bits, group):           # grouped along channels (values' rule)
    if k.shape[0] % group:
        raise ValueError("tokens not a multiple of group")
    d = kv.kivi_quantize_values(k[None, None].float(), bits, min(group, k.shape[1]))
    return kv.kivi_dequantize_values(d, bits)[0, 0]


def _wrong_keys_levels(k, bits, group):              # 2**bits steps instead of 2**bits - 1
    if k.shape[0] % group:
        raise ValueError("tokens not a multiple of group")
    x = k.reshape(-1, group, k.shape[1]).float()
    lo = x.amin(1, keepdim=True).half().float()
    scale = ((x.amax(1, keepdim=True) - lo) / 2 ** bits).half().float()
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round((x - lo) / scale).clamp(0, 2 ** bits - 1)
    return (q * scale + lo).reshape(k.shape)


def _wrong_keys_symmetric(k, bits, group):           # absmax, no minimum (zero point)
    if k.shape[0] % group:
        raise ValueError("tokens not a multiple of group")
    x = k.reshape(-1, group, k.shape[1]).float()
    qmax = 2 ** (bits - 1) - 1
    scale = (x.abs().amax(1, keepdim=True) / qmax).half().float()
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return (torch.round(x / scale).clamp(-qmax, qmax) * scale).reshape(k.shape)


def _wrong_keys_whole_channel(k, bits, group):       # one scale per channel over all tokens
    if k.shape[0] % group:
        raise ValueError("tokens not a multiple of group")
    return keys_per_channel_reference(k, bits, k.shape[0])


register(Exercise(
    id="11.keys_per_channel",
    title="KIVI keys: asymmetric, per channel, in groups of tokens",
    reference=keys_per_channel_reference,
    cases=_keys_cases,
    hint=["Which numbers should share a scale and a minimum: the channels of one token, or one "
          "channel across a run of tokens? Where does that put the outlier channel, and which "
          "of the group's values must the lowest and highest codes reach?",
          "Reshape k (S, hd) to (S/group, group, hd) and reduce over dim 1: lo = min, "
          "scale = (max - lo) / (2**bits - 1), both rounded through fp16 (.half().float()); "
          "a scale of 0 becomes 1.",
          "q = round((x - lo) / scale).clamp(0, 2**bits - 1); return (q * scale + lo) reshaped "
          "to (S, hd). Raise ValueError when S % group != 0."],
    wrong=[_wrong_keys_per_token, _wrong_keys_levels, _wrong_keys_symmetric,
           _wrong_keys_whole_channel],
    rtol=1e-5, atol=1e-6,
))


# ---------------------------------------------------------------- 11.kivi_bytes

def kivi_bytes_reference(tokens, head_dim, bits, window=128, group=32):
    """kv.cache_bytes for one layer and one KV head of a KIVI cache."""
    return kv.cache_bytes(kv.get_format(f"kivi{bits}", window, group), 1, 1, head_dim, tokens)


def _kivi_bytes_cases():
    return [
        Case((100, 64, 2), label="shorter than the window: all BF16"),
        Case((128, 64, 2), label="exactly the window"),
        Case((159, 64, 2), label="window + 31: no whole group has left it yet"),
        Case((160, 64, 2), label="window + 32: one group quantized"),
        Case((4096, 64, 2), label="SmolLM2 at 4,096 tokens"),
        Case((8192, 128, 4), label="4 bits, head dim 128"),
        Case((1000, 64, 2), {"window": 0}, label="no window"),
        Case((1000, 64, 4), {"window": 64, "group": 16}, label="window 64, groups of 16"),
        Case((0, 64, 2), label="an empty cache"),
        Case((500, 48, 2), {"group": 32}, label="group 32 does not divide head dim 48: ValueError",
             raises=ValueError),
    ]


def _q(tokens, window, group):
    return max(tokens - window, 0) // group * group


def _wrong_bytes_no_scales(tokens, head_dim, bits, window=128, group=32):
    if head_dim % group:
        raise ValueError("group must divide head_dim")
    Q = _q(tokens, window, group)
    return 2 * Q * head_dim * bits // 8 + 2 * (tokens - Q) * head_dim * 2


def _wrong_bytes_no_groups(tokens, head_dim, bits, window=128, group=32):  # every old token
    if head_dim % group:
        raise ValueError("group must divide head_dim")
    Q = max(tokens - window, 0)
    return 2 * Q * head_dim * bits // 8 + 2 * (Q * head_dim // group) * 4 + \
        2 * (tokens - Q) * head_dim * 2


def _wrong_bytes_k_only(tokens, head_dim, bits, window=128, group=32):     # forgot the values
    if head_dim % group:
        raise ValueError("group must divide head_dim")
    Q = _q(tokens, window, group)
    return Q * head_dim * bits // 8 + (Q * head_dim // group) * 4 + (tokens - Q) * head_dim * 2


def _wrong_bytes_scale_only(tokens, head_dim, bits, window=128, group=32):  # no minimum stored
    if head_dim % group:
        raise ValueError("group must divide head_dim")
    Q = _q(tokens, window, group)
    return 2 * Q * head_dim * bits // 8 + 2 * (Q * head_dim // group) * 2 + \
        2 * (tokens - Q) * head_dim * 2


register(Exercise(
    id="11.kivi_bytes",
    title="bytes of a KIVI cache, window and scales included",
    reference=kivi_bytes_reference,
    cases=_kivi_bytes_cases,
    hint=["Which tokens have been quantized (only whole groups that have left the window), "
          "and which are still in BF16? Both parts hold keys and values, and does a quantized "
          "group store anything besides its codes?",
          "Q = max(tokens - window, 0) // group * group. BF16 part: 2 x (tokens - Q) x hd x 2 "
          "bytes. Codes: 2 x Q x hd x bits / 8.",
          "Scales: keys have Q/group x hd groups, values Q x hd/group groups: the same count, "
          "Q x hd / group each, and each group stores an fp16 scale and an fp16 minimum "
          "(4 bytes). Raise ValueError when group does not divide head_dim."],
    wrong=[_wrong_bytes_no_scales, _wrong_bytes_no_groups, _wrong_bytes_k_only,
           _wrong_bytes_scale_only],
    rtol=0, atol=0, check_dtype=False,
))


# ---------------------------------------------------------------- 11.conversations

def conversations_reference(gpu_memory_gb, weight_gb, kv_bytes_per_token, context,
                            usable_fraction=0.9):
    """hardware.conversations_that_fit, argument order of the exercise."""
    return hardware.conversations_that_fit(gpu_memory_gb, usable_fraction, weight_gb,
                                           kv_bytes_per_token, context)


def _conv_cases():
    kv70 = 327680
    return [
        Case((80, 70.6, kv70, 8000), label="70B FP8 weights, BF16 cache, 8k tokens, one H100"),
        Case((80, 70.6, kv70 / 2, 8000), label="the same with an FP8 cache"),
        Case((80, 36.4, kv70, 8000), label="70B INT4 g128 weights (lesson 00: 13)"),
        Case((141, 16.06, 131072, 4096), label="8B BF16 on an H200, 4k tokens"),
        Case((80, 16.06, 131072 * 3 / 16, 32768), label="8B with a 3-bit (KIVI-2) cache, 32k"),
        Case((80, 75.0, kv70, 8000), label="weights over the usable 72 GB: 0, not negative"),
        Case((24, 1.0, 23040, 8192), {"usable_fraction": 0.5}, label="a 24 GB card at 50%"),
        Case((80, 10.0, 0, 8000), label="0 bytes per token: raise ValueError", raises=ValueError),
    ]


def _wrong_conv_no_fraction(gpu_memory_gb, weight_gb, kv_bytes_per_token, context,
                            usable_fraction=0.9):
    if kv_bytes_per_token <= 0:
        raise ValueError("kv_bytes_per_token must be > 0")
    return max(0, int((gpu_memory_gb - weight_gb) * 1e9 // (kv_bytes_per_token * context)))


def _wrong_conv_round(gpu_memory_gb, weight_gb, kv_bytes_per_token, context, usable_fraction=0.9):
    if kv_bytes_per_token <= 0:
        raise ValueError("kv_bytes_per_token must be > 0")
    free = (gpu_memory_gb * usable_fraction - weight_gb) * 1e9
    return max(0, round(free / (kv_bytes_per_token * context)))


def _wrong_conv_gib(gpu_memory_gb, weight_gb, kv_bytes_per_token, context, usable_fraction=0.9):
    if kv_bytes_per_token <= 0:
        raise ValueError("kv_bytes_per_token must be > 0")
    free = (gpu_memory_gb * usable_fraction - weight_gb) * 2 ** 30
    return max(0, int(free // (kv_bytes_per_token * context)))


def _wrong_conv_negative(gpu_memory_gb, weight_gb, kv_bytes_per_token, context,
                         usable_fraction=0.9):
    if kv_bytes_per_token <= 0:
        raise ValueError("kv_bytes_per_token must be > 0")
    free = (gpu_memory_gb * usable_fraction - weight_gb) * 1e9
    return int(free / (kv_bytes_per_token * context))


register(Exercise(
    id="11.conversations",
    title="conversations whose cache fits next to the weights",
    reference=conversations_reference,
    cases=_conv_cases,
    hint=["What is left for caches once an engine takes its share of the GPU and the weights "
          "are loaded? Each conversation needs its whole context's cache; only whole "
          "conversations count, and never fewer than none.",
          "free bytes = (gpu_memory_gb x usable_fraction - weight_gb) x 1e9 (decimal GB, as "
          "datasheets count); one conversation = kv_bytes_per_token x context.",
          "Return int(free // per_conversation), or 0 when free <= 0; raise ValueError when "
          "kv_bytes_per_token <= 0."],
    wrong=[_wrong_conv_no_fraction, _wrong_conv_round, _wrong_conv_gib, _wrong_conv_negative],
    rtol=0, atol=0, check_dtype=False,
))
