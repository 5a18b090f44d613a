"""Exercises of lesson 00, "The bill" (``solutions/00_the_bill.ipynb``).

Each reference is the library's own function in ``course_lib.hardware``; the wrong answers
are the mistakes people make with these sums (bits for bytes, GiB for GB, forgetting the
factor 2 for K and V, attention heads for KV heads, group scales, rounding up a conversation).
"""
from __future__ import annotations

import math

from course_lib import hardware as hw
from course_lib.checks import Case, Exercise, register

# ---------------------------------------------------------------------------------------
# 00.weight_gb: weights in GB for a number of bits, with optional group scales
# ---------------------------------------------------------------------------------------


def _weight_cases():
    return [
        Case((70.6e9, 16), label="Llama 3.1 70B in BF16"),
        Case((70.6e9, 8), label="70B in 8 bits"),
        Case((70.6e9, 4, 128), label="70B in INT4 with group-128 16-bit scales"),
        Case((8.03e9, 4, 32), label="8B in INT4, group 32"),
        Case((116.83e9, 4, 32, 8), label="MXFP4-style: 8-bit scale per 32"),
        Case((1e6, 3), label="a small model at 3 bits"),
        Case((1e6, 4, 1, 4), label="group size 1: a 4-bit scale per weight doubles the bits",
             hint="With a scale for every single weight, how many extra bits per weight does the "
                  "scale add?"),
        Case((0, 16), raises=ValueError, label="zero parameters"),
        Case((-5e9, 8), raises=ValueError, label="negative parameters"),
        Case((1e9, 4, 0), raises=ValueError, label="group size 0"),
        Case((1e9, 4, -32), raises=ValueError, label="negative group size"),
    ]


def _weight_bits_for_bytes(params, bits, group_size=None, scale_bits=16):
    if params <= 0 or group_size == 0:
        raise ValueError("bad input")
    b = bits + (scale_bits / group_size if group_size else 0)
    return params * b / 1e9                      # forgot to divide by 8


def _weight_gib(params, bits, group_size=None, scale_bits=16):
    if params <= 0 or group_size == 0:
        raise ValueError("bad input")
    b = bits + (scale_bits / group_size if group_size else 0)
    return params * b / 8 / 2 ** 30              # GiB, not GB


def _weight_no_scales(params, bits, group_size=None, scale_bits=16):
    if params <= 0 or group_size == 0:
        raise ValueError("bad input")
    return params * bits / 8 / 1e9               # group scales forgotten


def _weight_group_zero_only(params, bits, group_size=None, scale_bits=16):
    if params <= 0 or group_size == 0:                      # a group of -32 slips through
        raise ValueError("bad input")
    b = bits + (scale_bits / group_size if group_size else 0)
    return params * b / 8 / 1e9


def _weight_scale_per_weight(params, bits, group_size=None, scale_bits=16):
    if params <= 0 or group_size == 0:
        raise ValueError("bad input")
    b = bits + (scale_bits * group_size / 1024 if group_size else 0)   # scale cost upside down
    return params * b / 8 / 1e9


register(Exercise(
    id="00.weight_gb",
    title="weights in GB for a format",
    reference=hw.weight_gb_from_bits,
    cases=_weight_cases,
    hint=["Each group of group_size weights shares one scale: how many extra bits does that "
          "add to every weight? Then think about the units: bits, bytes, and which GB.",
          "bits per weight = bits + scale_bits / group_size (nothing extra when group_size is "
          "None); bytes = params x bits per weight / 8; GB means 1e9 bytes, not 2**30.",
          "Refuse first: raise ValueError when params <= 0, or when group_size is given and "
          "below 1; then return params * (bits + scale_bits / group_size) / 8 / 1e9."],
    wrong=[_weight_bits_for_bytes, _weight_gib, _weight_no_scales, _weight_scale_per_weight,
           _weight_group_zero_only],
))

# ---------------------------------------------------------------------------------------
# 00.kv_bytes_per_token: from a config.json dict
# ---------------------------------------------------------------------------------------


def _kv_cases():
    gpt2_like = {"num_hidden_layers": 12, "num_attention_heads": 12, "hidden_size": 768}
    smollm2_135m = {"num_hidden_layers": 30, "num_attention_heads": 9,   # no head_dim key
                    "num_key_value_heads": 3, "hidden_size": 576}
    return [
        Case((hw.get_model("Llama 3.1 70B").config(),), label="Llama 3.1 70B, BF16"),
        Case((hw.get_model("Llama 3.1 8B").config(),), label="Llama 3.1 8B, BF16"),
        Case((hw.get_model("Llama 3.1 70B").config(), 1), label="70B with an FP8 cache"),
        Case((hw.get_model("Gemma 2 27B").config(),),
             label="Gemma 2 27B: head_dim 128 is not hidden_size / heads = 144",
             hint="When the config gives head_dim, which wins: it, or hidden_size / "
                  "num_attention_heads?"),
        Case((hw.get_model("gpt-oss-120b").config(),), label="gpt-oss-120b, head_dim 64"),
        Case((gpt2_like,), label="no num_key_value_heads and no head_dim (plain multi-head)",
             hint="Without num_key_value_heads, how many KV heads does plain multi-head attention "
                  "have? Without head_dim, where does the head size come from?"),
        Case((smollm2_135m, 0.5), label="SmolLM2-135M: grouped-query (3 KV heads) without "
             "head_dim, a 4-bit cache"),
        Case(({**smollm2_135m, "head_dim": None},),
             label="head_dim present but null (as some config.json files write it): derive it",
             hint="A key present with the value None (null in config.json): does config.get(key, "
                  "default) give the default then? Treat None as missing."),
        Case(({**gpt2_like, "num_key_value_heads": None, "head_dim": None}, 1),
             label="num_key_value_heads and head_dim both null: plain multi-head",
             hint="A key present with the value None (null in config.json): does config.get(key, "
                  "default) give the default then? Treat None as missing."),
        Case(({"num_hidden_layers": 2, "num_attention_heads": 7, "hidden_size": 100},),
             label="no head_dim and hidden_size 100 over 7 heads: not a whole head_dim, raise "
             "ValueError", raises=ValueError,
             hint="100 / 7 is not a whole number of channels: what should a head_dim that "
                  "cannot be derived do, and does your division notice?"),
    ]


def _kv_true_division(config, bytes_per_value=2.0):   # hidden_size / heads: a float head_dim
    kv = config.get("num_key_value_heads") or config["num_attention_heads"]
    hd = config.get("head_dim") or config["hidden_size"] / config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * kv * hd * bytes_per_value


def _kv_no_factor_two(config, bytes_per_value=2.0):
    kv = config.get("num_key_value_heads") or config["num_attention_heads"]
    hd = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return config["num_hidden_layers"] * kv * hd * bytes_per_value          # K only


def _kv_attention_heads(config, bytes_per_value=2.0):
    hd = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * config["num_attention_heads"] * hd * bytes_per_value


def _kv_head_dim_from_hidden(config, bytes_per_value=2.0):
    kv = config.get("num_key_value_heads") or config["num_attention_heads"]
    hd = config["hidden_size"] // config["num_attention_heads"]             # ignores head_dim
    return 2 * config["num_hidden_layers"] * kv * hd * bytes_per_value


def _kv_bits(config, bytes_per_value=2.0):
    kv = config.get("num_key_value_heads") or config["num_attention_heads"]
    hd = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * kv * hd * bytes_per_value * 8   # bits, not bytes


def _kv_head_dim_only_for_mha(config, bytes_per_value=2.0):
    heads = config["num_attention_heads"]
    if "num_key_value_heads" in config:                       # assumes GQA configs carry head_dim
        kv, hd = config["num_key_value_heads"], config.get("head_dim", 128)
    else:
        kv, hd = heads, config["hidden_size"] // heads
    return 2 * config["num_hidden_layers"] * kv * hd * bytes_per_value


def _kv_head_dim_key_present(config, bytes_per_value=2.0):
    kv = config.get("num_key_value_heads") or config["num_attention_heads"]
    if "head_dim" in config:                                  # a null head_dim is taken as given
        hd = config["head_dim"]
    else:
        hd = config["hidden_size"] // config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * kv * hd * bytes_per_value


def _kv_requires_kv_heads(config, bytes_per_value=2.0):
    hd = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * hd * bytes_per_value


register(Exercise(
    id="00.kv_bytes_per_token",
    title="KV-cache bytes per token from a config.json",
    reference=hw.kv_bytes_per_token_from_config,
    cases=_kv_cases,
    hint=["Every token leaves two vectors (which?) in every layer, one per head that is "
          "*cached*: with grouped-query attention, how many heads is that? And how long is "
          "each vector when the config does not say?",
          "K and V: 2 x num_hidden_layers x KV heads x head_dim x bytes_per_value. KV heads: "
          "num_key_value_heads, or num_attention_heads when it is missing. head_dim: the "
          "config's own when present (Gemma 2's differs from hidden_size / heads).",
          "kv = config.get('num_key_value_heads') or config['num_attention_heads']; "
          "hd = config.get('head_dim') or config['hidden_size'] // config['num_attention_heads'] "
          "(ValueError when hidden_size % num_attention_heads is not 0)."],
    wrong=[_kv_no_factor_two, _kv_attention_heads, _kv_head_dim_from_hidden, _kv_bits,
           _kv_requires_kv_heads, _kv_head_dim_only_for_mha, _kv_head_dim_key_present,
           _kv_true_division],
))

# ---------------------------------------------------------------------------------------
# 00.decode_floor_ms
# ---------------------------------------------------------------------------------------


def _floor_cases():
    return [
        Case((141.2e9, 3.35), label="70B BF16 on one H100"),
        Case((70.6e9, 3.35), label="70B in 8 bits on one H100"),
        Case((141.2e9, 3.35, 2), label="70B BF16 split over two H100s"),
        Case((16.06e9, 4.8), label="8B BF16 on an H200"),
        Case((4.14e9, 0.02), label="8B INT4 at a laptop's 20 GB/s"),
        Case((70.6e9, 3.35, 8), label="eight GPUs"),
        Case((1e9, 0.0), raises=ValueError, label="zero bandwidth"),
        Case((-1e9, 3.35), raises=ValueError, label="negative bytes"),
        Case((1e9, 3.35, 0), raises=ValueError, label="zero GPUs"),
        Case((1e9, -3.35), raises=ValueError, label="negative bandwidth"),
        Case((0, 3.35), raises=ValueError,
             label="0 bytes of weights: a floor of 0 ms is no answer, refuse it"),
    ]


def _floor_checks(weight_bytes, bandwidth_tbps, n_gpus):
    if weight_bytes <= 0 or bandwidth_tbps <= 0 or n_gpus < 1:
        raise ValueError("sizes must be positive")


def _floor_seconds(weight_bytes, bandwidth_tbps, n_gpus=1):
    _floor_checks(weight_bytes, bandwidth_tbps, n_gpus)
    return weight_bytes / (n_gpus * bandwidth_tbps * 1e12)                 # seconds, not ms


def _floor_tib(weight_bytes, bandwidth_tbps, n_gpus=1):
    _floor_checks(weight_bytes, bandwidth_tbps, n_gpus)
    return weight_bytes / (n_gpus * bandwidth_tbps * 2 ** 40) * 1e3        # TiB/s, not TB/s


def _floor_ignores_gpus(weight_bytes, bandwidth_tbps, n_gpus=1):
    _floor_checks(weight_bytes, bandwidth_tbps, n_gpus)
    return weight_bytes / (bandwidth_tbps * 1e12) * 1e3                     # n_gpus forgotten


def _floor_times_gpus(weight_bytes, bandwidth_tbps, n_gpus=1):
    _floor_checks(weight_bytes, bandwidth_tbps, n_gpus)
    return weight_bytes * n_gpus / (bandwidth_tbps * 1e12) * 1e3            # more GPUs slower?


def _floor_zero_bytes(weight_bytes, bandwidth_tbps, n_gpus=1):
    if weight_bytes < 0 or bandwidth_tbps <= 0 or n_gpus < 1:     # 0 bytes accepted: 0 ms
        raise ValueError("sizes must be positive")
    return weight_bytes / (n_gpus * bandwidth_tbps * 1e12) * 1e3


def _floor_gpus_unchecked(weight_bytes, bandwidth_tbps, n_gpus=1):
    if weight_bytes <= 0 or bandwidth_tbps <= 0:             # n_gpus = 0 divides by zero
        raise ValueError("sizes must be positive")
    return weight_bytes / (max(n_gpus, 1) * bandwidth_tbps * 1e12) * 1e3


def _floor_no_checks(weight_bytes, bandwidth_tbps, n_gpus=1):
    return weight_bytes / (n_gpus * bandwidth_tbps * 1e12) * 1e3 if bandwidth_tbps else math.inf


register(Exercise(
    id="00.decode_floor_ms",
    title="decode floor in ms per token",
    reference=hw.decode_floor_ms,
    cases=_floor_cases,
    hint=["Time is amount over rate. What is the amount, what is the rate when several GPUs each "
          "read their own share at the same time, and which units come out?",
          "seconds = weight_bytes / (n_gpus x bandwidth_tbps x 1e12), since TB/s is 1e12 "
          "bytes per second (not 2**40); multiply by 1000 for ms.",
          "Raise ValueError when weight_bytes <= 0, bandwidth_tbps <= 0 or n_gpus < 1, "
          "before dividing."],
    wrong=[_floor_seconds, _floor_tib, _floor_ignores_gpus, _floor_times_gpus, _floor_no_checks,
           _floor_gpus_unchecked, _floor_zero_bytes],
))

# ---------------------------------------------------------------------------------------
# 00.conversations_that_fit
# ---------------------------------------------------------------------------------------


def _conv_cases():
    kv70 = hw.model_kv_bytes_per_token("Llama 3.1 70B")        # 327,680 bytes
    return [
        Case((80, 0.9, 36.4, kv70, 8000), label="70B INT4 g128 on one H100, 8,000-token chats"),
        Case((80, 1.0, 70.6, kv70, 4096), label="70B FP8 on a whole H100, 4,096 tokens"),
        Case((80, 1.0, 70.6, kv70 / 2, 4096), label="the same with an FP8 KV cache"),
        Case((80, 0.9, 141.2, kv70, 8000), label="weights larger than the GPU: none fit",
             hint="When the weights alone take more than the usable memory, how many conversations "
                  "fit? Not a negative number."),
        Case((24, 0.9, 4.14, 131072, 32768), label="8B INT4 on an RTX 4090, 32k context"),
        Case((80, 0.9, 72.0, kv70, 100), label="weights fill the usable memory exactly",
             hint="With no memory left for the cache, how many conversations fit?"),
        Case((80, 1.0, 16.0, 1e6, 1000), label="exactly 64 conversations: no rounding either way",
             hint="Only whole conversations count, rounded down: does your arithmetic give exactly "
                  "64 here, or 63.99999 that floors to 63?"),
        Case((80, 0.9, 30.0, kv70, 0), raises=ValueError, label="zero-token conversations"),
        Case((80, 0.9, 30.0, kv70, -8000), raises=ValueError, label="negative tokens"),
        Case((80, 1.5, 30.0, kv70, 8000), raises=ValueError,
             label="usable_fraction 1.5: more than the whole GPU"),
        Case((80, 0.9, 30.0, kv70, 8000.5), raises=ValueError,
             label="8000.5 tokens: half a token, raise ValueError"),
        Case((80, float("nan"), 30.0, kv70, 8000), raises=ValueError,
             label="usable_fraction NaN: outside (0, 1], raise ValueError", hint="A NaN fails every comparison: `x < 0 or x > 1` lets it through, `not 0 <= x <= 1` does not."),
    ]


def _conv_nan_fraction(gpu_memory_gb, usable_fraction, weight_gb, kv_bytes_per_token,
                       tokens_per_conversation):          # range checked with < and >: NaN passes
    if tokens_per_conversation <= 0 or tokens_per_conversation != int(tokens_per_conversation) \
            or usable_fraction <= 0 or usable_fraction > 1:
        raise ValueError("bad input")
    free = (gpu_memory_gb * usable_fraction - weight_gb) * 1e9
    return max(0, math.floor(free / (kv_bytes_per_token * tokens_per_conversation))) \
        if free == free else 0


def _conv_half_token(gpu_memory_gb, usable_fraction, weight_gb, kv_bytes_per_token,
                     tokens_per_conversation):            # every check but a whole token count
    _conv_check(tokens_per_conversation, usable_fraction)
    free = (gpu_memory_gb * usable_fraction - weight_gb) * 1e9
    return max(0, math.floor(free / (kv_bytes_per_token * tokens_per_conversation)))


def _conv_check(tokens_per_conversation, usable_fraction=1.0):
    if tokens_per_conversation <= 0 or not 0 < usable_fraction <= 1:
        raise ValueError("tokens_per_conversation must be positive")


def _conv_round(gpu_memory_gb, usable_fraction, weight_gb, kv_bytes_per_token, tokens_per_conversation):
    _conv_check(tokens_per_conversation, usable_fraction)
    free = (gpu_memory_gb * usable_fraction - weight_gb) * 1e9
    return max(0, round(free / (kv_bytes_per_token * tokens_per_conversation)))   # rounds up too


def _conv_all_memory(gpu_memory_gb, usable_fraction, weight_gb, kv_bytes_per_token, tokens_per_conversation):
    _conv_check(tokens_per_conversation, usable_fraction)
    free = (gpu_memory_gb - weight_gb) * 1e9                                     # fraction ignored
    return max(0, int(free // (kv_bytes_per_token * tokens_per_conversation)))


def _conv_gib(gpu_memory_gb, usable_fraction, weight_gb, kv_bytes_per_token, tokens_per_conversation):
    _conv_check(tokens_per_conversation, usable_fraction)
    free = (gpu_memory_gb * usable_fraction - weight_gb) * 2 ** 30               # GiB, not GB
    return max(0, int(free // (kv_bytes_per_token * tokens_per_conversation)))


def _conv_fraction_unchecked(gpu_memory_gb, usable_fraction, weight_gb, kv_bytes_per_token,
                             tokens_per_conversation):
    _conv_check(tokens_per_conversation)                 # lets usable_fraction 1.5 through
    free = (gpu_memory_gb * usable_fraction - weight_gb) * 1e9
    return max(0, math.floor(free / (kv_bytes_per_token * tokens_per_conversation)))


def _conv_ceil(gpu_memory_gb, usable_fraction, weight_gb, kv_bytes_per_token,
               tokens_per_conversation):
    _conv_check(tokens_per_conversation, usable_fraction)
    free = (gpu_memory_gb * usable_fraction - weight_gb) * 1e9
    return max(0, math.ceil(free / (kv_bytes_per_token * tokens_per_conversation)))  # a part-chat


def _conv_negative(gpu_memory_gb, usable_fraction, weight_gb, kv_bytes_per_token, tokens_per_conversation):
    _conv_check(tokens_per_conversation, usable_fraction)
    free = (gpu_memory_gb * usable_fraction - weight_gb) * 1e9
    return math.floor(free / (kv_bytes_per_token * tokens_per_conversation))    # can go below 0


register(Exercise(
    id="00.conversations_that_fit",
    title="conversations whose KV cache fits next to the weights",
    reference=hw.conversations_that_fit,
    cases=_conv_cases,
    int_results=True,
    hint=["Two amounts of memory: what is left for caches once the weights are in (of the "
          "part an engine may use), and what one conversation's cache needs. How many whole "
          "ones fit, and what if the weights leave nothing?",
          "free bytes = (gpu_memory_gb x usable_fraction - weight_gb) x 1e9; one conversation "
          "= kv_bytes_per_token x tokens_per_conversation; round the quotient down, never "
          "below 0.",
          "Refuse a tokens_per_conversation that is not a whole number >= 1 and a "
          "usable_fraction outside (0, 1] with ValueError; then "
          "max(0, math.floor(free / per_conversation))."],
    wrong=[_conv_round, _conv_all_memory, _conv_gib, _conv_negative, _conv_fraction_unchecked,
           _conv_ceil, _conv_half_token, _conv_nan_fraction],
))
