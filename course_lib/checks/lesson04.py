"""Exercises of lesson 04, "A real model" (solutions/04_a_real_model.ipynb)."""
from __future__ import annotations

import math

import torch

from course_lib import activations, eval as ceval, gguf_model
from course_lib.checks import Case, Exercise, register


def _lp(n, v, seed, sharp=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(sharp * torch.randn(n, v, generator=g), -1)   # (n, v)


def _tgt(n, v, seed):
    return torch.randint(0, v, (n,), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- 04.bits_per_byte

def _bpb_cases():
    uniform = torch.full((5, 256), -math.log(256.0))
    return [
        Case((uniform, torch.tensor([0, 1, 2, 3, 255])), label="uniform over 256 bytes: 8 bits"),
        Case((_lp(40, 256, 0), _tgt(40, 256, 1)), label="random model, byte vocabulary"),
        Case((_lp(30, 50, 2, 3.0), _tgt(30, 50, 3), 3.5),
             label="a 50-token vocabulary at 3.5 bytes per token"),
        Case((torch.log(torch.tensor([[0.5, 0.25, 0.25], [1.0 - 2e-9, 1e-9, 1e-9]])),
              torch.tensor([1, 0])), label="hand-checkable: (2 + ~0) / 2 = 1 bit"),
        Case((_lp(4, 10, 4), torch.tensor([0, 1, 2, 10])),
             label="target 10 with a vocabulary of 10: raise ValueError", raises=ValueError),
    ]


def _wrong_bpb_nats(lp, tgt, bytes_per_token=1.0):      # forgot / ln 2: nats, not bits
    if int(tgt.max()) >= lp.shape[1]:
        raise ValueError("target out of range")
    return float(-lp.gather(1, tgt[:, None]).mean()) / bytes_per_token


def _wrong_bpb_argmax(lp, tgt, bytes_per_token=1.0):    # scored the model's own guess
    if int(tgt.max()) >= lp.shape[1]:
        raise ValueError("target out of range")
    return float(-lp.max(-1).values.mean()) / math.log(2) / bytes_per_token


def _wrong_bpb_times(lp, tgt, bytes_per_token=1.0):     # multiplied by bytes per token
    if int(tgt.max()) >= lp.shape[1]:
        raise ValueError("target out of range")
    return float(-lp.gather(1, tgt[:, None]).mean()) / math.log(2) * bytes_per_token


def _wrong_bpb_entropy(lp, tgt, bytes_per_token=1.0):   # entropy of the prediction, not loss
    if int(tgt.max()) >= lp.shape[1]:
        raise ValueError("target out of range")
    return float(-(lp.exp() * lp).sum(-1).mean()) / math.log(2) / bytes_per_token


register(Exercise(
    id="04.bits_per_byte",
    title="bits per byte from next-token log-probabilities",
    reference=ceval.bits_from_logprobs,
    cases=_bpb_cases,
    hint=("Pick each position's log-probability of its *target* (lp[i, tgt[i]], e.g. with "
          "lp.gather(1, tgt[:, None])), negate and average: nats per token. Divide by ln 2 for "
          "bits, then by bytes_per_token. Raise ValueError if a target is >= lp.shape[1]. "
          "Return a Python float."),
    wrong=[_wrong_bpb_nats, _wrong_bpb_argmax, _wrong_bpb_times, _wrong_bpb_entropy],
    rtol=1e-4, atol=1e-6,
))


# ---------------------------------------------------------------- 04.kl_top1

def _kl_cases():
    p = _lp(64, 256, 10)
    q = torch.log_softmax(p + 0.3 * torch.randn(64, 256, generator=torch.Generator().manual_seed(11)), -1)
    flat = torch.full((3, 4), -math.log(4.0))
    peaked = torch.log(torch.tensor([[0.7, 0.1, 0.1, 0.1], [0.1, 0.7, 0.1, 0.1],
                                     [0.1, 0.1, 0.1, 0.7]]))
    return [
        Case((p, p.clone()), label="identical distributions: KL 0, agreement 1"),
        Case((p, q), label="a slightly perturbed model"),
        Case((peaked, flat), label="peaked reference vs flat variant (direction matters)"),
        Case((peaked, peaked[[1, 1, 2]]), label="one of three argmaxes differs: agreement 2/3"),
        Case((p, p[:10]), label="different shapes: raise ValueError", raises=ValueError),
    ]


def _wrong_kl_reversed(ref_lp, lp):                     # KL(variant || reference)
    if ref_lp.shape != lp.shape:
        raise ValueError("shapes differ")
    kl = (lp.exp() * (lp - ref_lp)).sum(-1).mean()
    return float(kl), float((ref_lp.argmax(-1) == lp.argmax(-1)).float().mean())


def _wrong_kl_bits(ref_lp, lp):                         # in bits, not nats
    if ref_lp.shape != lp.shape:
        raise ValueError("shapes differ")
    kl = (ref_lp.exp() * (ref_lp - lp)).sum(-1).mean() / math.log(2)
    return float(kl), float((ref_lp.argmax(-1) == lp.argmax(-1)).float().mean())


def _wrong_kl_no_weights(ref_lp, lp):                   # forgot to weight by P
    if ref_lp.shape != lp.shape:
        raise ValueError("shapes differ")
    kl = (ref_lp - lp).sum(-1).mean()
    return float(kl), float((ref_lp.argmax(-1) == lp.argmax(-1)).float().mean())


def _wrong_top1_count(ref_lp, lp):                      # a count, not a fraction
    if ref_lp.shape != lp.shape:
        raise ValueError("shapes differ")
    kl = (ref_lp.exp() * (ref_lp - lp)).sum(-1).mean()
    return float(kl), float((ref_lp.argmax(-1) == lp.argmax(-1)).sum())


register(Exercise(
    id="04.kl_top1",
    title="KL divergence and top-1 agreement against the reference",
    reference=ceval.kl_and_top1,
    cases=_kl_cases,
    hint=("KL(P || Q) = sum over the vocabulary of P * (ln P - ln Q), with P = ref_lp.exp() the "
          "*reference*; average over positions (nats). Top-1 agreement = mean of "
          "(ref_lp.argmax(-1) == lp.argmax(-1)) as a fraction. Return (kl, top1) as floats; "
          "raise ValueError when the shapes differ."),
    wrong=[_wrong_kl_reversed, _wrong_kl_bits, _wrong_kl_no_weights, _wrong_top1_count],
    rtol=1e-4, atol=1e-6,
))


# ---------------------------------------------------------------- 04.outlier_channels

def _outlier_cases():
    g = torch.Generator().manual_seed(20)
    a = torch.rand(64, generator=g) + 0.5
    a[[7, 50]] = torch.tensor([9.0, 30.0])
    tie = torch.tensor([1.0, 1.0, 1.0, 5.0, 6.0])       # median 1: 5.0 is exactly 5x, not above
    skewed = torch.tensor([1.0, 1.0, 1.0, 1.0, 100.0, 100.0, 100.0])  # mean would hide them
    return [
        Case((a, 5.0), label="two planted outliers among 64 channels"),
        Case((a, 20.0), label="a higher threshold keeps only the biggest"),
        Case((tie, 5.0), label="exactly 5x the median is not an outlier (strictly greater)"),
        Case((skewed, 5.0), label="three huge channels: the median, not the mean, is the yardstick"),
        Case((torch.ones(8), 2.0), label="no outliers: an empty tensor"),
        Case((a, 0.0), label="ratio 0: raise ValueError", raises=ValueError),
    ]


def _wrong_outlier_mean(absmax, ratio=5.0):              # mean instead of median
    if ratio <= 0:
        raise ValueError("ratio must be positive")
    return torch.nonzero(absmax > ratio * absmax.mean()).flatten()


def _wrong_outlier_ge(absmax, ratio=5.0):                # >= instead of >
    if ratio <= 0:
        raise ValueError("ratio must be positive")
    return torch.nonzero(absmax >= ratio * absmax.median()).flatten()


def _wrong_outlier_mask(absmax, ratio=5.0):              # a boolean mask, not indices
    if ratio <= 0:
        raise ValueError("ratio must be positive")
    return absmax > ratio * absmax.median()


def _wrong_outlier_max(absmax, ratio=5.0):               # relative to the largest channel
    if ratio <= 0:
        raise ValueError("ratio must be positive")
    return torch.nonzero(absmax * ratio > absmax.max()).flatten()


register(Exercise(
    id="04.outlier_channels",
    title="outlier channels from per-channel maxima",
    reference=activations.outlier_channels,
    cases=_outlier_cases,
    hint=("Compare each channel's max |x| with ratio * (the median over channels); keep those "
          "strictly greater and return their indices as a 1-D int64 tensor "
          "(torch.nonzero(mask).flatten()). Raise ValueError for ratio <= 0."),
    wrong=[_wrong_outlier_mean, _wrong_outlier_ge, _wrong_outlier_mask, _wrong_outlier_max],
))


# ---------------------------------------------------------------- 04.dequantize_q4_1

def _q4_1_raw(w) -> torch.Tensor:
    """gguf's own Q4_1 quantizer (the llama.cpp project's): floats (n, 32) -> raw (n, 20)."""
    import numpy as np
    from gguf import GGMLQuantizationType, quants
    raw = quants.quantize(np.asarray(w, dtype=np.float32), GGMLQuantizationType.Q4_1)
    return torch.from_numpy(raw.reshape(-1, 20).copy())


def _q4_1_cases():
    import numpy as np
    rng = np.random.default_rng(4)
    ramp = np.linspace(-1.0, 2.0, 32, dtype=np.float32)[None]           # codes 0..15 all used
    const = np.full((1, 32), 0.75, np.float32)                            # d = 0: every w = m
    tiny = (rng.standard_normal((2, 32)) * 1e-5).astype(np.float32)       # fp16 subnormal scales
    big = (rng.standard_normal((3, 32)) * 40 + 100).astype(np.float32)    # all positive: m > 0
    return [
        Case((_q4_1_raw(ramp),), label="one block, a ramp: every code 0..15"),
        Case((_q4_1_raw(rng.standard_normal((6, 32)).astype(np.float32)),),
             label="six random blocks"),
        Case((_q4_1_raw(const),), label="a constant block: scale 0, every weight = the minimum"),
        Case((_q4_1_raw(tiny),), label="tiny weights: subnormal fp16 scales"),
        Case((_q4_1_raw(big),), label="large positive weights: the minimum is not 0"),
        Case((torch.zeros(2, 18, dtype=torch.uint8),), label="rows of 18 bytes: raise ValueError",
             raises=ValueError),
        Case((torch.zeros(2, 20, dtype=torch.int8),), label="int8, not uint8: raise TypeError",
             raises=TypeError),
    ]


def _q4_1_refuse(raw):
    if not isinstance(raw, torch.Tensor) or raw.dtype != torch.uint8:
        raise TypeError("uint8 bytes expected")
    if raw.dim() != 2 or raw.shape[1] != 20:
        raise ValueError("blocks of 20 bytes expected")


def _wrong_q4_1_interleaved(raw):          # byte i holds weights 2i and 2i+1
    _q4_1_refuse(raw)
    d = raw[:, 0:2].contiguous().view(torch.float16).float()
    m = raw[:, 2:4].contiguous().view(torch.float16).float()
    qs = raw[:, 4:]
    q = torch.stack([qs & 0x0F, qs >> 4], dim=2).reshape(-1, 32).float()
    return d * q + m


def _wrong_q4_1_high_first(raw):           # high nibbles are weights 0..15
    _q4_1_refuse(raw)
    d = raw[:, 0:2].contiguous().view(torch.float16).float()
    m = raw[:, 2:4].contiguous().view(torch.float16).float()
    qs = raw[:, 4:]
    return d * torch.cat([qs >> 4, qs & 0x0F], dim=1).float() + m


def _wrong_q4_1_no_minimum(raw):           # treated like a symmetric format
    _q4_1_refuse(raw)
    d = raw[:, 0:2].contiguous().view(torch.float16).float()
    qs = raw[:, 4:]
    return d * torch.cat([qs & 0x0F, qs >> 4], dim=1).float()


def _wrong_q4_1_signed(raw):               # codes - 8, as in Q4_0
    _q4_1_refuse(raw)
    d = raw[:, 0:2].contiguous().view(torch.float16).float()
    m = raw[:, 2:4].contiguous().view(torch.float16).float()
    qs = raw[:, 4:]
    return d * (torch.cat([qs & 0x0F, qs >> 4], dim=1).float() - 8) + m


def _wrong_q4_1_swapped(raw):              # minimum first, then scale
    _q4_1_refuse(raw)
    m = raw[:, 0:2].contiguous().view(torch.float16).float()
    d = raw[:, 2:4].contiguous().view(torch.float16).float()
    qs = raw[:, 4:]
    return d * torch.cat([qs & 0x0F, qs >> 4], dim=1).float() + m


def _wrong_q4_1_half(raw):                 # arithmetic in fp16: rounds the result again
    _q4_1_refuse(raw)
    d = raw[:, 0:2].contiguous().view(torch.float16)
    m = raw[:, 2:4].contiguous().view(torch.float16)
    qs = raw[:, 4:]
    return (d * torch.cat([qs & 0x0F, qs >> 4], dim=1).half() + m).float()


register(Exercise(
    id="04.dequantize_q4_1",
    title="dequantize llama.cpp's Q4_1 blocks (SmolLM2's weights)",
    reference=gguf_model.dequantize_q4_1_blocks,
    cases=_q4_1_cases,
    hint=["A block is 20 bytes: two 16-bit floats, then 16 bytes that each carry two 4-bit codes. "
          "Which two floats are they, in which order, and which weight of the 32 does each half "
          "of a byte belong to? The layout is in the exercise text.",
          "raw[:, 0:2].contiguous().view(torch.float16) reads two bytes as one fp16 number. The "
          "low nibble of byte 4 + i is (b & 0x0F) and is weight i; the high nibble (b >> 4) is "
          "weight i + 16. Check the dtype and the width of raw first.",
          "w = d.float() * q.float() + m.float(), with q the 32 codes of each block in order "
          "(torch.cat of the low nibbles, then the high nibbles, along dim 1)."],
    wrong=[_wrong_q4_1_interleaved, _wrong_q4_1_high_first, _wrong_q4_1_no_minimum,
           _wrong_q4_1_signed, _wrong_q4_1_swapped, _wrong_q4_1_half],
    rtol=0.0, atol=0.0,
))
