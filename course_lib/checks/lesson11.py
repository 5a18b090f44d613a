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
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 8:
        raise ValueError(f"bits must be a whole number 1..8; got {bits!r}")
    d = kv.kivi_quantize_keys(k[None, None].float(), bits, group)
    return kv.kivi_dequantize_keys(d, bits)[0, 0]


def _keys(S, hd, seed, outlier=None, fp16=False):
    """Random keys; ``fp16``: every value an fp16 number, so each group's minimum is stored
    exactly and the order of the two fp16 roundings cannot matter (the cases that test the
    axes, before the one that tests that order)."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(S, hd, generator=g)
    if outlier is not None:
        k[:, outlier] = k[:, outlier] * 30 + 5
    return k.half().float() if fp16 else k


STORED_LO = ("The cache decodes with the lo it stores, in fp16, not the exact minimum. From "
             "which lo must the scale be computed so that the top code still reaches the "
             "group's maximum?")


def _keys_cases():
    const = _keys(32, 8, 3)
    const[:, 2] = 0.75                                   # a constant channel: max == min
    ties = torch.tensor([[0.0, 1.0], [3.0, 2.0], [0.5, 1.5], [2.5, 2.0]])  # exact .5 steps
    nan = _keys(32, 4, 6)
    nan[3, 1] = float("nan")
    return [
        Case((ties, 2, 4), label="codes exactly halfway (0.5, 1.5, 2.5): round half to even"),
        Case((_keys(32, 8, 7).half(), 2, 32), label="fp16 keys: the result in float32"),
        Case((torch.zeros(32, 4), 2, 32), label="all-zero keys: zeros back, no NaN",
             hint="An all-zero group has a largest magnitude of 0: which scale keeps the "
                  "division away from 0 / 0 (no NaN back)?"),
        Case((nan, 2, 32), label="a NaN key: raise ValueError", raises=ValueError),
        Case((_keys(32, 4, 8), 0, 32), label="0 bits: raise ValueError", raises=ValueError),
        Case((_keys(32, 4, 8), True, 32), label="bits=True (a bool, not a number of bits): "
             "raise ValueError", raises=ValueError),
        Case((_keys(32, 4, 8), 2.5, 32), label="bits=2.5: not a whole number, raise ValueError",
             raises=ValueError),
        Case((_keys(64, 16, 0, fp16=True), 2, 32), label="2 bits, two groups of 32 tokens"),
        Case((_keys(32, 16, 1, outlier=4, fp16=True), 2, 32),
             label="an outlier channel (as real keys have)"),
        Case((_keys(48, 8, 2), 4, 16), label="minima that are not fp16 numbers: the scale "
             "comes from the stored (rounded) lo", hint=STORED_LO),
        Case((_keys(64, 16, 0), 2, 32), label="2 bits, float32 keys", hint=STORED_LO),
        Case((const, 2, 32), label="a constant channel: scale 0 must not divide by zero",
             hint="A constant channel's range is 0: what scale does it get, so that nothing "
                  "divides by 0?"),
        Case((_keys(8, 4, 4) * 1e-3, 2, 8), label="tiny values", hint=STORED_LO),
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


def _wrong_keys_half_up(k, bits, group):             # floor(x + 0.5): ties go up
    if k.shape[0] % group or not 1 <= bits <= 8 or torch.isnan(k).any():
        raise ValueError("bad input")
    x = k.reshape(-1, group, k.shape[1]).float()
    lo = x.amin(1, keepdim=True).half().float()
    scale = ((x.amax(1, keepdim=True) - lo) / (2 ** bits - 1)).half().float()
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.floor((x - lo) / scale + 0.5).clamp(0, 2 ** bits - 1)
    return (q * scale + lo).reshape(k.shape)


def _wrong_keys_scale_from_exact_lo(k, bits, group):  # scale from the unrounded minimum
    keys_per_channel_reference(k, bits, group)           # the same input checks
    x = k.reshape(-1, group, k.shape[1]).float()
    lo_exact = x.amin(1, keepdim=True)
    scale = ((x.amax(1, keepdim=True) - lo_exact) / (2 ** bits - 1)).half().float()
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    lo = lo_exact.half().float()
    q = torch.round((x - lo) / scale).clamp(0, 2 ** bits - 1)
    return (q * scale + lo).reshape(k.shape)


def _wrong_keys_any_bits(k, bits, group):             # checks the range of bits, not its type
    if k.shape[0] % group or not 1 <= bits <= 8 or torch.isnan(k).any():
        raise ValueError("bad input")
    return keys_per_channel_reference(k, int(bits), group)


def _wrong_keys_input_dtype(k, bits, group):         # the result in the keys' own dtype
    return keys_per_channel_reference(k, bits, group).to(k.dtype)


def _wrong_keys_nan_through(k, bits, group):         # no NaN check: NaN groups come back NaN
    if k.shape[0] % group or not 1 <= bits <= 8:
        raise ValueError("bad input")
    x = k.reshape(-1, group, k.shape[1]).float()
    lo = x.amin(1, keepdim=True).half().float()
    scale = ((x.amax(1, keepdim=True) - lo) / (2 ** bits - 1)).half().float()
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round((x - lo) / scale).clamp(0, 2 ** bits - 1)
    return (q * scale + lo).reshape(k.shape)


register(Exercise(
    id="11.keys_per_channel",
    title="KIVI keys: asymmetric, per channel, in groups of tokens",
    reference=keys_per_channel_reference,
    cases=_keys_cases,
    hint=["Which numbers should share a scale and a minimum: the channels of one token, or one "
          "channel across a run of tokens? Where does that put the outlier channel, and which "
          "of the group's values must the lowest and highest codes reach?",
          "Reshape k (S, hd) to (S/group, group, hd) and reduce over dim 1. First lo = min, "
          "rounded through fp16 (.half().float()); then scale = (max - lo) / (2**bits - 1) "
          "from that rounded lo, itself rounded through fp16; a scale of 0 becomes 1.",
          "q = torch.round((x - lo) / scale).clamp(0, 2**bits - 1) (round half to even); return "
          "(q * scale + lo) reshaped to (S, hd), float32. Raise ValueError when S % group != 0, "
          "when bits is not 1..8 or when k holds NaN."],
    wrong=[_wrong_keys_per_token, _wrong_keys_levels, _wrong_keys_symmetric,
           _wrong_keys_whole_channel, _wrong_keys_half_up, _wrong_keys_input_dtype,
           _wrong_keys_nan_through, _wrong_keys_scale_from_exact_lo, _wrong_keys_any_bits],
    rtol=1e-5, atol=1e-6,
))


# ---------------------------------------------------------------- 11.kivi_bytes

def kivi_bytes_reference(tokens, head_dim, bits, window=128, group=32):
    """kv.cache_bytes for one layer and one KV head of a KIVI cache."""
    if bits not in (2, 4):
        raise ValueError(f"KIVI caches here have 2 or 4 bits; got {bits!r}")
    return kv.cache_bytes(kv.get_format(f"kivi{bits}", window, group), 1, 1, head_dim, tokens)


def _kivi_bytes_cases():
    return [
        Case((100, 64, 2), label="shorter than the residual: all BF16"),
        Case((127, 64, 2), label="R - 1 tokens: all BF16"),
        Case((128, 64, 2), label="R tokens: the keys are quantized at once, the values stay"),
        Case((159, 64, 2), label="R + 31: keys quantized, 31 values quantized"),
        Case((200, 64, 2), label="keys 128 quantized + 72 BF16; values 72 + the last 128"),
        Case((256, 64, 2), label="two chunks of keys quantized"),
        Case((4096, 64, 2), label="SmolLM2 at 4,096 tokens"),
        Case((4100, 128, 4), label="4 bits, head dim 128, 4 keys in BF16"),
        Case((1000, 64, 2), {"window": 0}, label="no residual: keys in whole groups, all values"),
        Case((1000, 64, 4), {"window": 64, "group": 16}, label="R = 64, groups of 16"),
        Case((0, 64, 2), label="an empty cache"),
        Case((500, 48, 2), {"group": 32}, label="group 32 does not divide head dim 48: ValueError",
             raises=ValueError),
        Case((500, 64, 2), {"window": 100}, label="R = 100 is not a multiple of the group 32: "
             "ValueError", raises=ValueError),
        Case((-5, 64, 2), label="a negative token count: raise ValueError", raises=ValueError),
        Case((100.5, 64, 2), label="half a token: raise ValueError", raises=ValueError),
    ]


def _qk(tokens, window, group):
    chunk = window or group
    return tokens // chunk * chunk


def _qv(tokens, window):
    return max(tokens - window, 0)


def _bytes(tokens, head_dim, bits, qk, qv, group, per_group=4, parts=2):
    return ((2 * tokens - qk - qv) * head_dim * 2 + (qk + qv) * head_dim * bits // 8
            + (qk + qv) * head_dim // group * per_group) * parts // 2


def _checks(tokens, head_dim, window, group):
    if head_dim % group or window % group:
        raise ValueError("group must divide head_dim and the window")


def _wrong_bytes_no_checks(tokens, head_dim, bits, window=128, group=32):  # counts anything
    _checks(tokens, head_dim, window, group)
    t = int(tokens)
    return int(_bytes(tokens, head_dim, bits, _qk(t, window, group), _qv(t, window), group))


def _wrong_bytes_sliding_keys(tokens, head_dim, bits, window=128, group=32):
    """Keys leave a sliding window in whole groups (R to R + group - 1 BF16 keys): not KIVI."""
    _checks(tokens, head_dim, window, group)
    qk = max(tokens - window, 0) // group * group
    return _bytes(tokens, head_dim, bits, qk, qk, group)


def _wrong_bytes_values_in_chunks(tokens, head_dim, bits, window=128, group=32):
    """Values quantized R at a time like the keys: KIVI quantizes them one token at a time."""
    _checks(tokens, head_dim, window, group)
    q = _qk(tokens, window, group)
    return _bytes(tokens, head_dim, bits, q, q, group)


def _wrong_bytes_no_scales(tokens, head_dim, bits, window=128, group=32):
    _checks(tokens, head_dim, window, group)
    return _bytes(tokens, head_dim, bits, _qk(tokens, window, group), _qv(tokens, window), group,
                  per_group=0)


def _wrong_bytes_k_only(tokens, head_dim, bits, window=128, group=32):     # forgot the values
    _checks(tokens, head_dim, window, group)
    qk = _qk(tokens, window, group)
    return (tokens - qk) * head_dim * 2 + qk * head_dim * bits // 8 + qk * head_dim // group * 4


def _wrong_bytes_scale_only(tokens, head_dim, bits, window=128, group=32):  # no minimum stored
    _checks(tokens, head_dim, window, group)
    return _bytes(tokens, head_dim, bits, _qk(tokens, window, group), _qv(tokens, window), group,
                  per_group=2)


register(Exercise(
    id="11.kivi_bytes",
    title="bytes of a KIVI cache, window and scales included",
    reference=kivi_bytes_reference,
    cases=_kivi_bytes_cases,
    hint=["Keys and values leave BF16 at different times in KIVI: count each. Keys wait until "
          "the residual length (window) of them have gathered; values keep the last window. Does a quantized group "
          "store anything besides its codes?",
          "Qk = tokens // window * window (window 0: tokens // group * group), Qv = max(tokens - "
          "window, 0). BF16 part: (2 x tokens - Qk - Qv) x hd x 2 bytes. Codes: (Qk + Qv) x hd x "
          "bits / 8.",
          "Scales: keys have Qk/group x hd groups, values Qv x hd/group groups: (Qk + Qv) x hd / "
          "group in all, and each group stores an fp16 scale and an fp16 minimum (4 bytes). "
          "Raise ValueError when group does not divide head_dim or the window, or when tokens is "
          "not a whole number >= 0."],
    wrong=[_wrong_bytes_sliding_keys, _wrong_bytes_values_in_chunks, _wrong_bytes_no_scales,
           _wrong_bytes_k_only, _wrong_bytes_scale_only, _wrong_bytes_no_checks],
    rtol=0, atol=0, check_dtype=False,
))


# ---------------------------------------------------------------- 11.conversations

def conversations_reference(gpu_memory_gb, usable_fraction, weight_gb, kv_bytes_per_token,
                            context):
    """hardware.conversations_that_fit (the same order of arguments)."""
    return hardware.conversations_that_fit(gpu_memory_gb, usable_fraction, weight_gb,
                                           kv_bytes_per_token, context)


RESERVE = ("Which memory is usable_fraction a share of: the whole GPU, or what the weights "
           "leave? Serving engines (vLLM's gpu_memory_utilization) take it of the whole GPU.")


def _conv_cases():
    kv70 = 327680
    return [
        Case((80, 0.9, 70.6, kv70, 8000), label="70B FP8 weights, BF16 cache, 8k tokens, one "
             "H100 at 90%", hint=RESERVE),
        Case((80, 0.9, 70.6, kv70 / 2, 8000), label="the same with an FP8 cache", hint=RESERVE),
        Case((80, 0.9, 36.4, kv70, 8000), label="70B INT4 g128 weights (lesson 00: 13)",
             hint=RESERVE),
        Case((141, 0.9, 16.06, 131072, 4096), label="8B BF16 on an H200, 4k tokens"),
        Case((80, 0.9, 16.06, 131072 * 3 / 16, 32768), label="8B with a 3-bit (KIVI-2) cache, 32k"),
        Case((80, 0.9, 75.0, kv70, 8000), label="weights over the usable 72 GB: 0, not negative",
             hint=RESERVE),
        Case((24, 0.5, 1.0, 23040, 8192), label="a 24 GB card at 50%", hint=RESERVE),
        Case((10, 1.0, 0.0, 1e6, 1000), label="exactly 10 conversations' worth: 10, not 9",
             hint="Only whole conversations count, rounded down: does your arithmetic give exactly "
                  "10 here, or 9.99999 that floors to 9?"),
        Case((10, 1.0, 0.0, 1e6, 4000), label="2.5 conversations' worth: 2 (whole ones only)",
             hint="Only whole conversations count: round down."),
        Case((80, 0.9, 10.0, 0, 8000), label="0 bytes per token: raise ValueError",
             raises=ValueError),
        Case((80, 90, 10.0, 327680, 8000),
             label="90 (a percent) where a fraction is meant: raise ValueError", raises=ValueError),
        Case((80, 0.0, 10.0, 327680, 8000), label="usable_fraction 0: no memory at all, raise "
             "ValueError", raises=ValueError),
        Case((80, float("nan"), 10.0, 327680, 8000), label="usable_fraction NaN: outside (0, 1], "
             "raise ValueError", raises=ValueError, hint="A NaN fails every comparison: `x < 0 or x > 1` lets it through, `not 0 <= x <= 1` does not."),
        Case((float("nan"), 0.9, 10.0, 327680, 8000), label="NaN GB: raise ValueError",
             raises=ValueError),
        Case((80, 0.9, -5.0, 327680, 8000), label="negative weights: raise ValueError",
             raises=ValueError),
        Case((80, 0.9, 10.0, 327680, 4096.5), label="half a token: raise ValueError",
             raises=ValueError),
        Case((80, 0.9, 10.0, 327680, True), label="context=True (a bool, not a count): raise "
             "ValueError", raises=ValueError),
    ]


def _conv_guard(gpu_memory_gb, usable_fraction, weight_gb, kv_bytes_per_token, context):
    if kv_bytes_per_token <= 0:
        raise ValueError("kv_bytes_per_token must be > 0")


def _wrong_conv_no_fraction(gpu_memory_gb, usable_fraction, weight_gb, kv_bytes_per_token,
                            context):
    conversations_reference(gpu_memory_gb, usable_fraction, weight_gb, kv_bytes_per_token,
                            context)                     # the same input checks
    return max(0, int((gpu_memory_gb - weight_gb) * 1e9 // (kv_bytes_per_token * context)))


def _wrong_conv_reserve_after_weights(gpu_memory_gb, usable_fraction, weight_gb,
                                      kv_bytes_per_token, context):  # (gpu - weights) x fraction
    conversations_reference(gpu_memory_gb, usable_fraction, weight_gb, kv_bytes_per_token,
                            context)
    free = (gpu_memory_gb - weight_gb) * usable_fraction * 1e9
    return max(0, int(free // (kv_bytes_per_token * context)))


def _wrong_conv_round(gpu_memory_gb, usable_fraction, weight_gb, kv_bytes_per_token, context):
    _conv_guard(gpu_memory_gb, usable_fraction, weight_gb, kv_bytes_per_token, context)
    free = (gpu_memory_gb * usable_fraction - weight_gb) * 1e9
    return max(0, round(free / (kv_bytes_per_token * context)))


def _wrong_conv_gib(gpu_memory_gb, usable_fraction, weight_gb, kv_bytes_per_token, context):
    _conv_guard(gpu_memory_gb, usable_fraction, weight_gb, kv_bytes_per_token, context)
    free = (gpu_memory_gb * usable_fraction - weight_gb) * 2 ** 30
    return max(0, int(free // (kv_bytes_per_token * context)))


def _wrong_conv_percent_ok(gpu_memory_gb, usable_fraction, weight_gb, kv_bytes_per_token,
                           context):                     # never checks the fraction
    if not kv_bytes_per_token > 0 or not gpu_memory_gb > 0 or weight_gb < 0:
        raise ValueError("bad input")
    free = (gpu_memory_gb * usable_fraction - weight_gb) * 1e9
    return max(0, int(free // (kv_bytes_per_token * context)))


def _wrong_conv_half_token(gpu_memory_gb, usable_fraction, weight_gb, kv_bytes_per_token,
                           context):                     # every check but a whole context
    import math
    if not kv_bytes_per_token > 0 or not 0 < usable_fraction <= 1 or weight_gb < 0 or \
            not (math.isfinite(gpu_memory_gb) and gpu_memory_gb > 0) or not context > 0:
        raise ValueError("bad input")
    free = (gpu_memory_gb * usable_fraction - weight_gb) * 1e9
    return max(0, int(free // (kv_bytes_per_token * context)))


def _wrong_conv_nan_fraction(gpu_memory_gb, usable_fraction, weight_gb, kv_bytes_per_token,
                             context):                   # range checked with < and >
    if usable_fraction <= 0 or usable_fraction > 1:
        raise ValueError("bad fraction")
    if usable_fraction != usable_fraction:
        return 0
    return conversations_reference(gpu_memory_gb, usable_fraction, weight_gb,
                                   kv_bytes_per_token, context)


def _wrong_conv_half_up(gpu_memory_gb, usable_fraction, weight_gb, kv_bytes_per_token,
                        context):                        # floor(x + 0.5): 2.5 conversations -> 3
    import math
    conversations_reference(gpu_memory_gb, usable_fraction, weight_gb, kv_bytes_per_token,
                            context)                     # the same input checks
    free = (gpu_memory_gb * usable_fraction - weight_gb) * 1e9
    return max(0, math.floor(free / (kv_bytes_per_token * context) + 0.5))


def _wrong_conv_negative(gpu_memory_gb, usable_fraction, weight_gb, kv_bytes_per_token, context):
    _conv_guard(gpu_memory_gb, usable_fraction, weight_gb, kv_bytes_per_token, context)
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
          "datasheets count; the share is of the whole GPU, as vLLM's gpu_memory_utilization "
          "is); one conversation = kv_bytes_per_token x context.",
          "Return int(free // per_conversation), or 0 when free <= 0; raise ValueError when "
          "kv_bytes_per_token <= 0, when usable_fraction is not in (0, 1], when context is not "
          "a whole number >= 1, or when a memory figure is NaN or negative."],
    wrong=[_wrong_conv_no_fraction, _wrong_conv_round, _wrong_conv_gib, _wrong_conv_negative,
           _wrong_conv_percent_ok, _wrong_conv_half_up, _wrong_conv_reserve_after_weights,
           _wrong_conv_half_token, _wrong_conv_nan_fraction],
    int_results=True, rtol=0, atol=0, check_dtype=False,
))


# ---------------------------------------------------------------- 11.online_softmax_step

_INF = float("-inf")


def _fresh(R, hd):
    return torch.full((R,), _INF), torch.zeros(R), torch.zeros(R, hd)


def _block(R, n, hd, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(R, n, generator=g) * scale, torch.randn(n, hd, generator=g)


def _state(R, hd, seed, blocks=2, n=5):
    m, l, acc = _fresh(R, hd)
    for i in range(blocks):
        m, l, acc = kv.online_softmax_step(m, l, acc, *_block(R, n, hd, seed + i))
    return m, l, acc


def _step_cases():
    s_mask, v_mask = _block(3, 6, 8, 11)
    s_mask[:, 4:] = _INF                                  # the block runs past the sequence
    s_dead, v_dead = _block(2, 4, 8, 12)
    s_dead[:] = _INF                                      # a block wholly past the end
    s_hi, v_hi = _block(2, 5, 8, 13, scale=1.0)
    s_hi += 1000.0                                        # exp(1000) overflows float32
    m_b, l_b, acc_b = _state(2, 8, 14)
    s_b, v_b = _block(2, 5, 8, 15)
    s_low = s_b - 50                                      # all below the running maximum
    return [
        Case((*_fresh(4, 8), *_block(4, 5, 8, 1)), label="the first block (m = -inf, l = 0)"),
        Case((*_state(4, 8, 2), *_block(4, 5, 8, 4, scale=3.0)),
             label="a block whose scores beat the running maximum: rescale l AND acc",
             hint="When the maximum moves, l and acc were both taken against the old one: are both "
                  "rescaled?"),
        Case((m_b, l_b, acc_b, s_low, v_b), label="a block entirely below the running maximum"),
        Case((*_state(3, 8, 5), s_mask, v_mask), label="masked columns (-inf) contribute nothing"),
        Case((*_state(2, 8, 6), s_dead, v_dead),
             label="an all -inf block leaves the state as it was",
             hint="-inf - -inf is NaN: while the maximum is still -inf (nothing seen), subtract 0 "
                  "instead."),
        Case((*_fresh(2, 8), s_dead, v_dead),
             label="an all -inf first block: no NaN, the state stays empty",
             hint="-inf - -inf is NaN: while the maximum is still -inf (nothing seen), subtract 0 "
                  "instead."),
        Case((*_fresh(2, 8), s_hi, v_hi), label="scores near 1000: subtract the maximum first",
             hint="exp(1000) overflows float32: subtract the largest maximum before "
                  "exponentiating."),
        Case((*_fresh(1, 4), torch.tensor([[0.5]]), torch.tensor([[1.0, -2.0, 3.0, 0.0]])),
             label="one head, one token"),
        Case(tuple(x.to(torch.bfloat16) for x in (*_state(2, 8, 7), *_block(2, 3, 8, 8))),
             label="bfloat16 inputs: computed in float32, the state comes back in float32",
             hint="In which dtype did the exponentials and sums happen? The task computes in "
                  "float32: convert the inputs first; casting a bfloat16 result at the end is "
                  "too late."),
        Case((*_fresh(2, 8), *_block(2, 5, 6, 9)), label="v of width 6 for acc of width 8: "
             "raise ValueError", raises=ValueError),
        Case((*_fresh(2, 8), torch.full((2, 3), float("nan")), torch.zeros(3, 8)),
             label="NaN scores: raise ValueError", raises=ValueError),
        Case((*_fresh(2, 8), torch.zeros(2, 0), torch.zeros(0, 8)),
             label="an empty block: raise ValueError", raises=ValueError),
    ]


def _checked(m, l, acc, s, v):
    if s.shape[1] == 0 or v.shape[1] != acc.shape[1] or torch.isnan(s).any():
        raise ValueError("bad block")
    return m.float(), l.float(), acc.float(), s.float(), v.float()


def _wrong_step_no_acc_rescale(m, l, acc, s, v):         # forgets to rescale the accumulator
    m, l, acc, s, v = _checked(m, l, acc, s, v)
    m_new = torch.maximum(m, s.amax(-1))
    safe = torch.where(m_new == _INF, torch.zeros_like(m_new), m_new)
    p = torch.exp(s - safe[:, None])
    return m_new, l * torch.exp(m - safe) + p.sum(-1), acc + p @ v


def _wrong_step_no_max(m, l, acc, s, v):                 # plain exp: overflows at large scores
    m, l, acc, s, v = _checked(m, l, acc, s, v)
    p = torch.exp(s)
    return torch.maximum(m, s.amax(-1)), l + p.sum(-1), acc + p @ v


def _wrong_step_nan_on_empty(m, l, acc, s, v):           # exp(-inf - -inf) = NaN
    m, l, acc, s, v = _checked(m, l, acc, s, v)
    m_new = torch.maximum(m, s.amax(-1))
    alpha, p = torch.exp(m - m_new), torch.exp(s - m_new[:, None])
    return m_new, l * alpha + p.sum(-1), acc * alpha[:, None] + p @ v


def _wrong_step_input_dtype(m, l, acc, s, v):            # the result in the inputs' dtype
    dt = s.dtype
    return tuple(x.to(dt) for x in kv.online_softmax_step(m, l, acc, s, v))


def _wrong_step_block_softmax(m, l, acc, s, v):          # normalizes each block on its own
    m, l, acc, s, v = _checked(m, l, acc, s, v)
    m_new = torch.maximum(m, s.amax(-1))
    safe = torch.where(m_new == _INF, torch.zeros_like(m_new), m_new)
    p = torch.softmax(s, -1).nan_to_num()
    alpha = torch.exp(m - safe)
    return m_new, l * alpha + p.sum(-1), acc * alpha[:, None] + p @ v


def _wrong_step_cast_after(m, l, acc, s, v):            # computed in bf16, returned float32
    if s.shape[1] == 0 or v.shape[1] != acc.shape[1] or torch.isnan(s).any():
        raise ValueError("bad block")
    m_new = torch.maximum(m, s.amax(-1))
    safe = torch.where(m_new == _INF, torch.zeros_like(m_new), m_new)
    alpha, p = torch.exp(m - safe), torch.exp(s - safe[:, None])
    return (m_new.float(), (l * alpha + p.sum(-1)).float(),
            (acc * alpha[:, None] + p @ v).float())


def _wrong_step_in_place(m, l, acc, s, v):               # updates the caller's state in place
    m2, l2, acc2 = kv.online_softmax_step(m, l, acc, s, v)
    m.copy_(m2), l.copy_(l2), acc.copy_(acc2)
    return m.float(), l.float(), acc.float()


register(Exercise(
    id="11.online_softmax_step",
    title="one block of the online softmax: running max, running sum, rescaled accumulator",
    reference=kv.online_softmax_step,
    cases=_step_cases,
    hint=["When a new block raises the largest score seen, every exp(score - m) summed so far "
          "was taken against an old, smaller maximum. By what factor must the running sum AND "
          "the accumulator change? What should happen when nothing in the block counts (every "
          "score -inf), even on the very first block?",
          "m_new = max(m, s.amax(-1)); alpha = exp(m - m_new); p = exp(s - m_new[:, None]). "
          "Guard m_new = -inf (subtract 0 instead) so that -inf - -inf never makes a NaN.",
          "Convert the inputs to float32 first, then return (m_new, l * alpha + p.sum(-1), "
          "acc * alpha[:, None] + p @ v), new tensors; ValueError for an empty block, NaN "
          "scores or widths that do not match."],
    wrong=[_wrong_step_no_acc_rescale, _wrong_step_no_max, _wrong_step_nan_on_empty,
           _wrong_step_input_dtype, _wrong_step_block_softmax, _wrong_step_cast_after],
    rtol=1e-5, atol=1e-6,
))


# ---------------------------------------------------------------- 11.combine_splits

def _slices(P, R, hd, seed, empty=()):
    states = [_fresh(R, hd) if i in empty else _state(R, hd, seed + 10 * i, blocks=1 + i % 2)
              for i in range(P)]
    return tuple(torch.stack(x) for x in zip(*states))


def _combine_cases():
    far_m, far_l, far_acc = _slices(2, 3, 8, 40)
    far_m = far_m.clone()
    far_m[0] += 1000.0                                    # slice 0's maximum far above slice 1's
    dead_m, dead_l, dead_acc = _slices(2, 2, 8, 50, empty=(0, 1))
    return [
        Case(_slices(1, 4, 8, 20), label="one slice: acc / l"),
        Case(_slices(3, 4, 8, 21), label="three slices of one context"),
        Case(_slices(3, 2, 8, 22, empty=(1,)), label="a slice that saw no token (m = -inf, l = 0)",
             hint="A slice with m = -inf weighs exp(m - M) = 0: is it 0 in your code, not NaN?"),
        Case((far_m, far_l, far_acc), label="maxima 1000 apart: rescale against the largest",
             hint="exp(1000) overflows float32: subtract the largest maximum before "
                  "exponentiating."),
        Case(tuple(x.to(torch.bfloat16) for x in _slices(2, 2, 8, 23)),
             label="bfloat16 states: computed in float32, the output in float32",
             hint="In which dtype were the slices rescaled and summed? The task computes in "
                  "float32: convert the states first; casting a bfloat16 result at the end is "
                  "too late."),
        Case((dead_m, dead_l, dead_acc), label="no slice saw a token: raise ValueError",
             raises=ValueError),
        Case((torch.zeros(2, 3), torch.ones(2, 4), torch.zeros(2, 3, 8)),
             label="ms (2, 3) but ls (2, 4): raise ValueError", raises=ValueError),
    ]


def _combine_checked(ms, ls, accs):
    if ms.shape != ls.shape or accs.shape[:2] != ms.shape:
        raise ValueError("shapes")
    if (ms.amax(0) == _INF).any():
        raise ValueError("empty")
    return ms.float(), ls.float(), accs.float()


def _wrong_combine_mean(ms, ls, accs):                   # averages the slices' outputs
    ms, ls, accs = _combine_checked(ms, ls, accs)
    live = (ms > _INF).float()
    out = accs / ls.clamp_min(1e-30)[..., None]
    return (out * live[..., None]).sum(0) / live.sum(0)[:, None]


def _wrong_combine_no_max(ms, ls, accs):                 # weights exp(m_i): overflows
    ms, ls, accs = _combine_checked(ms, ls, accs)
    w = torch.exp(ms)
    return (w[..., None] * accs).sum(0) / (w * ls).sum(0)[:, None]


def _wrong_combine_ignore_m(ms, ls, accs):               # sums as if every m were equal
    ms, ls, accs = _combine_checked(ms, ls, accs)
    return accs.sum(0) / ls.sum(0)[:, None]


def _wrong_combine_nan_when_empty(ms, ls, accs):         # no check: 0 / 0 = NaN comes back
    if ms.shape != ls.shape or accs.shape[:2] != ms.shape:
        raise ValueError("shapes")
    ms, ls, accs = ms.float(), ls.float(), accs.float()
    M = ms.amax(0)
    w = torch.exp(ms - M)
    return (w[..., None] * accs).sum(0) / (w * ls).sum(0)[:, None]


def _wrong_combine_cast_after(ms, ls, accs):             # computed in bf16, output float32
    if ms.shape != ls.shape or accs.shape[:2] != ms.shape:
        raise ValueError("shapes")
    if (ms.amax(0) == _INF).any():
        raise ValueError("empty")
    M = ms.amax(0)
    w = torch.where(ms == _INF, torch.zeros_like(ms), torch.exp(ms - M))
    return ((w[..., None] * accs).sum(0) / (w * ls).sum(0)[:, None]).float()


def _wrong_combine_dtype(ms, ls, accs):                  # output in the states' dtype
    return kv.combine_splits(ms, ls, accs).to(ms.dtype)


register(Exercise(
    id="11.combine_splits",
    title="merge the online-softmax states of the context's slices",
    reference=kv.combine_splits,
    cases=_combine_cases,
    hint=["Each slice's sum and accumulator were taken against its own maximum. Against which "
          "common maximum can they be added, and what weight does a slice that saw no token get?",
          "M = ms.amax(0); w = exp(ms - M), and 0 where ms is -inf; a head whose M is -inf saw "
          "nothing at all: raise ValueError.",
          "Convert the states to float32 first, then return (w[..., None] * accs).sum(0) / "
          "(w * ls).sum(0)[:, None]; ValueError when the shapes are not (P, R), (P, R), "
          "(P, R, hd)."],
    wrong=[_wrong_combine_mean, _wrong_combine_no_max, _wrong_combine_ignore_m,
           _wrong_combine_nan_when_empty, _wrong_combine_dtype, _wrong_combine_cast_after],
    rtol=1e-5, atol=1e-6,
))
