"""Exercises of lesson 04, "A real model" (solutions/04_a_real_model.ipynb)."""
from __future__ import annotations

import math

import torch

from course_lib import activations, eval as ceval
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
