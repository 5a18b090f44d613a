"""Exercises of lesson 04, "A real model" (solutions/04_a_real_model.ipynb)."""
from __future__ import annotations

import math

import torch

from course_lib import activations, eval as ceval, gguf_model, qmodel
from course_lib.checks import Case, Exercise, register


def _lp(n, v, seed, sharp=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(sharp * torch.randn(n, v, generator=g), -1)   # (n, v)


def _tgt(n, v, seed):
    return torch.randint(0, v, (n,), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- 04.bits_per_byte

def _confident_miss():
    """Two positions over 4 tokens whose targets got log-prob -120 and -2 (float32)."""
    lp = torch.tensor([[-120.0, 0.0, -150.0, -150.0], [-0.5, -2.0, -1.5, -10.0]])
    return torch.log_softmax(lp, -1)


def _wrong_bpb_through_probs(lp, tgt, bytes_per_token=1.0):  # log(exp(lp)): underflows
    if int(tgt.min()) < 0 or int(tgt.max()) >= lp.shape[1]:
        raise ValueError("target out of range")
    return float(-torch.log(lp.exp().gather(1, tgt[:, None])).mean()) / math.log(2) / \
        bytes_per_token


def _bpb_cases():
    uniform = torch.full((5, 256), -math.log(256.0))
    return [
        Case((uniform, torch.tensor([0, 1, 2, 3, 255])), label="uniform over 256 bytes: 8 bits"),
        Case((_lp(40, 256, 0), _tgt(40, 256, 1)), label="random model, byte vocabulary"),
        Case((_lp(30, 50, 2, 3.0), _tgt(30, 50, 3), 3.5),
             label="a 50-token vocabulary at 3.5 bytes per token"),
        Case((torch.log(torch.tensor([[0.5, 0.25, 0.25], [1.0 - 2e-9, 1e-9, 1e-9]])),
              torch.tensor([1, 0])), label="hand-checkable: (2 + ~0) / 2 = 1 bit"),
        Case((_lp(6, 256, 5), _tgt(6, 256, 6)), {"bytes_per_token": 2.0},
             label="bytes_per_token passed by name"),
        Case((_confident_miss(), torch.tensor([0, 1])),
             label="a target given log-prob -120 (a confident miss): exp(-120) is 0 in float32",
             hint="Work with the log-probabilities themselves: exp(-120) underflows to 0 in "
                  "float32, and log(0) is -inf, though -120 was there all along."),
        Case((_lp(4, 10, 4), torch.tensor([0, 1, 2, 10])),
             label="target 10 with a vocabulary of 10: raise ValueError", raises=ValueError),
        Case((_lp(4, 10, 4), torch.tensor([0, -1, 2, 3])),
             label="a negative target: raise ValueError", raises=ValueError),
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


def _wrong_bpb_tensor(lp, tgt, bytes_per_token=1.0):    # right number, but a 0-d tensor
    if int(tgt.min()) < 0 or int(tgt.max()) >= lp.shape[1]:
        raise ValueError("target out of range")
    return -lp.gather(1, tgt[:, None]).mean() / math.log(2) / bytes_per_token


register(Exercise(
    id="04.bits_per_byte",
    title="bits per byte from next-token log-probabilities",
    reference=ceval.bits_from_logprobs,
    cases=_bpb_cases,
    hint=["At each position, which probability measures the model's surprise: the one it gave "
          "its favourite token, or the one it gave the token that actually came next? And how "
          "do nats, bits and bits per byte differ from one another?",
          "Pick each position's log-probability of its target (lp.gather(1, tgt[:, None]) "
          "picks lp[i, tgt[i]] for every i), negate it and average: nats per token. A target "
          "below 0 or at least lp.shape[1] is not a valid index: raise ValueError first.",
          "Divide the nats by math.log(2) for bits, then by bytes_per_token, and return "
          "float(...) (a Python float, not a 0-d tensor)."],
    wrong=[_wrong_bpb_nats, _wrong_bpb_argmax, _wrong_bpb_times, _wrong_bpb_entropy,
           _wrong_bpb_tensor, _wrong_bpb_through_probs],
    rtol=1e-4, atol=1e-6, float_results=True,
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
        Case((peaked, flat), label="peaked reference vs flat variant (direction matters)",
             hint="KL from which distribution to which? The reference's probabilities weight the "
                  "log ratio."),
        Case((peaked, peaked[[1, 1, 2]]), label="one of three argmaxes differs: agreement 2/3"),
        Case((torch.log(torch.tensor([[0.4, 0.4, 0.2], [0.2, 0.4, 0.4]])),
              torch.log(torch.tensor([[0.3, 0.5, 0.2], [0.2, 0.4, 0.4]]))),
             label="exact ties: the first of the tied tokens is the top-1 (as argmax does)",
             hint="On a tie for the largest probability, which token is the top-1? argmax returns "
                  "the first."),
        Case((torch.log(torch.tensor([[0.5, 0.5, 0.0], [0.0, 1.0, 0.0]])),
              torch.log(torch.tensor([[0.25, 0.5, 0.25], [0.1, 0.8, 0.1]]))),
             label="reference probabilities of exactly 0 (log-prob -inf): 0 ln 0 counts as 0",
             hint="Where the reference probability is 0 (log-prob -inf), what does p ln(p / q) "
                  "add? 0 ln 0 counts as 0: no NaN."),
        Case((torch.log_softmax(torch.tensor([[0.0, -1.0, -3.0]]), -1),
              torch.log_softmax(torch.tensor([[0.0, -120.0, -3.0]]), -1)),
             label="the variant gives a likely token log-prob -120: exp(-120) is 0 in float32",
             hint="Subtract log-probabilities directly: log(exp(-120)) is -inf in float32 and "
                  "turns a finite KL into inf."),
        Case((p, p[:10]), label="different shapes: raise ValueError", raises=ValueError),
    ]


def _wrong_kl_through_probs(ref_lp, lp):                # log(P) - log(Q) from probabilities
    if ref_lp.shape != lp.shape:
        raise ValueError("shapes differ")
    p, q = ref_lp.exp(), lp.exp()
    kl = torch.where(p > 0, p * (torch.log(p) - torch.log(q)), torch.zeros_like(p)).sum(-1).mean()
    return float(kl), float((ref_lp.argmax(-1) == lp.argmax(-1)).float().mean())


def _wrong_kl_reversed(ref_lp, lp):                     # KL(variant || reference)
    if ref_lp.shape != lp.shape:
        raise ValueError("shapes differ")
    kl = (lp.exp() * (lp - ref_lp)).sum(-1).mean()
    return float(kl), float((ref_lp.argmax(-1) == lp.argmax(-1)).float().mean())


def _kl_terms(ref_lp, lp):                              # the right KL, 0 ln 0 = 0 handled
    p = ref_lp.exp()
    return torch.where(p > 0, p * (ref_lp - lp), torch.zeros_like(p)).sum(-1).mean()


def _wrong_kl_nan_at_zero(ref_lp, lp):                  # 0 * (-inf - x) = NaN, not 0
    if ref_lp.shape != lp.shape:
        raise ValueError("shapes differ")
    kl = (ref_lp.exp() * (ref_lp - lp)).sum(-1).mean()
    return float(kl), float((ref_lp.argmax(-1) == lp.argmax(-1)).float().mean())


def _wrong_top1_last_tie(ref_lp, lp):                   # a tie goes to the LAST maximum
    if ref_lp.shape != lp.shape:
        raise ValueError("shapes differ")
    last = lambda t: t.shape[-1] - 1 - t.flip(-1).argmax(-1)     # noqa: E731
    return float(_kl_terms(ref_lp, lp)), float((last(ref_lp) == last(lp)).float().mean())


def _wrong_top1_any_max(ref_lp, lp):                    # agree if the variant's pick ties the top
    if ref_lp.shape != lp.shape:
        raise ValueError("shapes differ")
    pick = lp.argmax(-1, keepdim=True)
    hit = ref_lp.gather(-1, pick)[:, 0] == ref_lp.max(-1).values
    return float(_kl_terms(ref_lp, lp)), float(hit.float().mean())


def _wrong_kl_tensors(ref_lp, lp):                      # right numbers, returned as tensors
    if ref_lp.shape != lp.shape:
        raise ValueError("shapes differ")
    return _kl_terms(ref_lp, lp), (ref_lp.argmax(-1) == lp.argmax(-1)).float().mean()


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
    hint=["KL is not symmetric: whose probabilities weight the sum, the reference's or the "
          "variant's? What should a token the reference gives probability exactly 0 contribute? "
          "And when two tokens tie for first place, which one is 'the' top-1?",
          "With P = ref_lp.exp(), each position contributes the sum over the vocabulary of "
          "P * (ref_lp - lp), in nats; where P is 0 the term is 0 (torch.where(P > 0, ..., 0): "
          "0 * -inf would be NaN). Average over positions. Refuse different shapes first.",
          "top1 = (ref_lp.argmax(-1) == lp.argmax(-1)).float().mean() (argmax takes the first "
          "of tied maxima); return float(kl), float(top1)."],
    wrong=[_wrong_kl_reversed, _wrong_kl_bits, _wrong_kl_no_weights, _wrong_top1_count,
           _wrong_kl_nan_at_zero, _wrong_top1_last_tie, _wrong_top1_any_max, _wrong_kl_tensors,
           _wrong_kl_through_probs],
    rtol=1e-4, atol=1e-6, float_results=True,
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
        Case((tie, 5.0), label="exactly 5x the median is not an outlier (strictly greater)",
             hint="Is a channel exactly at the threshold an outlier? The task says strictly "
                  "greater."),
        Case((skewed, 5.0), label="three huge channels: the median, not the mean, is the yardstick",
             hint="Which yardstick: the median or the mean of the channels' magnitudes?"),
        Case((torch.ones(8), 2.0), label="no outliers: an empty tensor"),
        Case((a, 0.0), label="ratio 0: raise ValueError", raises=ValueError),
        Case((a, -5.0), label="a negative ratio: raise ValueError", raises=ValueError),
        Case((torch.zeros(0), 5.0), label="no channels at all: raise ValueError", raises=ValueError),
    ]


def _wrong_outlier_mean(absmax, ratio=5.0):              # mean instead of median
    if ratio <= 0 or absmax.numel() == 0:
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
    hint=["What is a 'typical' channel here: would the mean do, when a few channels are "
          "a hundred times the rest? And is a channel at exactly the threshold an outlier?",
          "The yardstick is absmax.median(); the outliers are the channels with absmax strictly "
          "greater than ratio times it. Refuse ratio <= 0 and an empty absmax first.",
          "torch.nonzero(mask).flatten() turns the boolean mask into ascending int64 indices."],
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
        Case((_q4_1_raw(tiny),), label="tiny weights: subnormal fp16 scales",
             hint="Do you read bytes 0-3 as two float16 numbers (a view of the bytes), subnormals "
                  "included?"),
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


# ---------------------------------------------------------------- 04.fake_quant_weight

def _fq_cases():
    g = torch.Generator().manual_seed(40)
    w = torch.randn(16, 64, generator=g)
    ties = torch.tensor([[7.0, 0.5, 1.5, 2.5, -2.5, -0.5, 3.5, 0.0]])   # scale 1: exact .5 ties
    zero_row = torch.randn(3, 32, generator=g)
    zero_row[1] = 0.0
    spike = torch.randn(4, 64, generator=g) * 0.02
    spike[:, 5] = 3.0                                                      # one big input channel
    return [
        Case((ties, 4), label="INT4 per row, scale exactly 1: ties round half to even"),
        Case((w, 8), label="INT8, one scale per row"),
        Case((w, 4, 32), label="INT4 in groups of 32"),
        Case((w[:8, :32], 3, 8), label="INT3 in groups of 8"),
        Case((spike, 4), {"group_size": 16},
             label="an outlier input: only its own group's scale grows"),
        Case((zero_row, 4, 8), label="an all-zero row: zeros back, no NaN",
             hint="An all-zero group has a largest magnitude of 0: which scale keeps the "
                  "division away from 0 / 0 (no NaN back)?"),
        Case((torch.randn(4, 64, generator=g).bfloat16(), 4, 16),
             label="a bf16 weight comes back in bf16"),
        Case((w, 1), label="bits=1: raise ValueError", raises=ValueError),
        Case((w, 9), label="bits=9: raise ValueError", raises=ValueError),
        Case((w, 4, 24), label="group 24 does not divide 64: raise ValueError", raises=ValueError),
        Case((w[0], 4), label="a 1-D weight: raise ValueError", raises=ValueError),
    ]


def _fq_refuse(w, bits, group_size):
    if w.dim() != 2 or not 2 <= bits <= 8 or (group_size and w.shape[1] % group_size):
        raise ValueError("bad input")


def _fq_groups(w, group_size):                          # (out, in) -> (out, G, g) fp32
    g = w.shape[1] if group_size is None else group_size
    return w.float().reshape(w.shape[0], -1, g)


def _wrong_fq_per_tensor(w, bits, group_size=None):     # one scale for the whole matrix
    _fq_refuse(w, bits, group_size)
    qmax = 2 ** (bits - 1) - 1
    s = (w.float().abs().max() / qmax).clamp_min(1e-30)
    return ((w.float() / s).round().clamp(-qmax, qmax) * s).to(w.dtype)


def _wrong_fq_half_up(w, bits, group_size=None):        # floor(x + 0.5): ties go up
    _fq_refuse(w, bits, group_size)
    qmax = 2 ** (bits - 1) - 1
    wg = _fq_groups(w, group_size)
    s = wg.abs().amax(-1, keepdim=True) / qmax
    s = torch.where(s == 0, torch.ones_like(s), s)
    return ((wg / s + 0.5).floor().clamp(-qmax, qmax) * s).reshape(w.shape).to(w.dtype)


def _wrong_fq_qmax(w, bits, group_size=None):           # 2**(bits-1) levels: the top one wasted
    _fq_refuse(w, bits, group_size)
    qmax = 2 ** (bits - 1)
    wg = _fq_groups(w, group_size)
    s = wg.abs().amax(-1, keepdim=True) / qmax
    s = torch.where(s == 0, torch.ones_like(s), s)
    return ((wg / s).round().clamp(-qmax, qmax - 1) * s).reshape(w.shape).to(w.dtype)


def _wrong_fq_columns(w, bits, group_size=None):        # scales per input column, not per row
    _fq_refuse(w, bits, group_size)
    return qmodel.fake_quant_weight(w.t().contiguous(), bits, None).t()


def _wrong_fq_nan_at_zero(w, bits, group_size=None):    # no guard: 0 / 0 in an all-zero group
    _fq_refuse(w, bits, group_size)
    qmax = 2 ** (bits - 1) - 1
    wg = _fq_groups(w, group_size)
    s = wg.abs().amax(-1, keepdim=True) / qmax
    return ((wg / s).round().clamp(-qmax, qmax) * s).reshape(w.shape).to(w.dtype)


def _wrong_fq_fp32_out(w, bits, group_size=None):       # forgot to cast back to w's dtype
    _fq_refuse(w, bits, group_size)
    return qmodel.fake_quant_weight(w.float(), bits, group_size)


register(Exercise(
    id="04.fake_quant_weight",
    title="fake-quantize a Linear weight (symmetric INT, per row or per group)",
    reference=qmodel.fake_quant_weight,
    cases=_fq_cases,
    hint=["How many scales does one row get without groups, and with groups of 32? Which value "
          "of a group decides its scale, and onto which integer must it land at `bits` bits? "
          "What should a group of zeros give back?",
          "View w (out, in) as (out, in // g, g), with g = in when group_size is None. Per "
          "group: scale = max |w| over the last dimension / (2 ** (bits - 1) - 1), replaced "
          "by 1.0 where it is 0. Refuse bits outside 2..8, a group size that does not divide "
          "in, and a weight that is not 2-D first.",
          "Work in fp32: q = torch.round(wg / scale).clamp(-qmax, qmax) (torch.round rounds "
          "half to even), then return (q * scale).reshape(w.shape).to(w.dtype)."],
    wrong=[_wrong_fq_per_tensor, _wrong_fq_half_up, _wrong_fq_qmax, _wrong_fq_columns,
           _wrong_fq_nan_at_zero, _wrong_fq_fp32_out],
    rtol=1e-5, atol=1e-7,
))


# ---------------------------------------------------------------- 04.layer_sensitivity

def _bundled_and_ref():
    """The bundled model and a 2-window reference (128 held-out bytes): quick to score."""
    from course_lib import data, device
    from course_lib.model import load_pretrained
    global _BUNDLED
    if _BUNDLED is None:
        # building a model on the meta device imports torch._dynamo, which imports triton: set
        # Triton's mode first, or lesson 09's kernels could not run later in this process
        device.ensure_triton_mode()
        model = load_pretrained()
        _BUNDLED = model, ceval.reference(model, data.heldout_text(129), window=64)
    return _BUNDLED


_BUNDLED = None


def _sens_cases():
    model, ref = _bundled_and_ref()
    return [
        Case((model, ref, [".q_proj", ".down_proj"]), label="INT3 per row, two layer kinds"),
        Case((model, ref, ["layers.0.", "layers.3."], 4, 32),
             label="INT4 g32, the first and the last block"),
        Case((model, ref, [".k_proj"]), {"bits": 2}, label="INT2, the key projections alone"),
        Case((model, ref, [".v_proj", ".o_proj"], 8),
             label="INT8: tiny but nonzero KL"),
        Case((model, ref, []), label="no fragments: raise ValueError", raises=ValueError),
        Case((model, ref, ["no_such_layer"]), label="a fragment that matches no Linear: "
             "raise ValueError", raises=ValueError),
    ]


def _sens_refuse(fragments):
    if not fragments:
        raise ValueError("no fragments")


def _wrong_sens_cumulative(model, ref, fragments, bits=3, group_size=None):
    _sens_refuse(fragments)                      # keeps quantizing the same copy: damage adds up
    gran = "per_channel" if group_size is None else "per_group"
    out, qm = {}, model
    for f in fragments:
        qm, _ = qmodel.quantize_model(qm, f"int{bits}", gran, group_size, only=[f])
        out[f] = ceval.compare(qm, ref)["kl_nats"]
    return out


def _wrong_sens_everything(model, ref, fragments, bits=3, group_size=None):
    _sens_refuse(fragments)                      # quantizes every Linear each time
    gran = "per_channel" if group_size is None else "per_group"
    for f in fragments:
        qmodel.quantize_model(model, f"int{bits}", gran, group_size, only=[f])   # the refusal
    qm, _ = qmodel.quantize_model(model, f"int{bits}", gran, group_size)
    kl = ceval.compare(qm, ref)["kl_nats"]
    return {f: kl for f in fragments}


def _wrong_sens_delta_bpb(model, ref, fragments, bits=3, group_size=None):
    _sens_refuse(fragments)                      # bits-per-byte increase, not KL
    gran = "per_channel" if group_size is None else "per_group"
    return {f: ceval.compare(qmodel.quantize_model(model, f"int{bits}", gran, group_size,
                                                   only=[f])[0], ref)["bits_per_byte"]
            - ref.bits_per_byte for f in fragments}


def _wrong_sens_ignores_groups(model, ref, fragments, bits=3, group_size=None):
    _sens_refuse(fragments)                      # always one scale per row
    return {f: ceval.compare(qmodel.quantize_model(model, f"int{bits}", "per_channel", None,
                                                   only=[f])[0], ref)["kl_nats"]
            for f in fragments}


def _wrong_sens_top1(model, ref, fragments, bits=3, group_size=None):
    _sens_refuse(fragments)                      # 1 - top-1 agreement instead of KL
    gran = "per_channel" if group_size is None else "per_group"
    return {f: 1.0 - ceval.compare(qmodel.quantize_model(model, f"int{bits}", gran, group_size,
                                                         only=[f])[0], ref)["top1_agreement"]
            for f in fragments}


register(Exercise(
    id="04.layer_sensitivity",
    title="a layer sensitivity sweep on the bundled model",
    reference=qmodel.layer_sensitivity,
    cases=_sens_cases,
    hint=["To learn what one kind of layer costs, what must stay unquantized while you measure "
          "it, and what must you start again from before measuring the next kind? Which of the "
          "section 2 numbers separates small damages best?",
          "For each fragment: qmodel.quantize_model(model, f'int{bits}', granularity, "
          "group_size, only=[fragment]) quantizes a copy, only the matching Linears "
          "(granularity 'per_channel' when group_size is None, else 'per_group'). Refuse an "
          "empty list first; quantize_model already refuses a fragment that matches nothing.",
          "ceval.compare(quantized, ref)['kl_nats'] is the number; collect "
          "{fragment: kl} in the order given and return it."],
    wrong=[_wrong_sens_cumulative, _wrong_sens_everything, _wrong_sens_delta_bpb,
           _wrong_sens_ignores_groups, _wrong_sens_top1],
    rtol=1e-4, atol=1e-9, float_results=True,
))
