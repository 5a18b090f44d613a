"""How a comparison on SmolLM2 is scored so that it can be trusted (lesson 04).

Three rules, each a function here:

1. **What chooses never sees what scores.** Calibration and evaluation text share no verbatim run
   (:func:`course_lib.data.clean_split`, the "clean" protocol of :mod:`course_lib.smollm`):
   GPTQ's Hessians, AWQ's and SmoothQuant's scales, a sensitivity scan, an importance matrix, a
   search or a training run read calibration text only.
2. **Every figure comes with its windows.** A score is the mean over evaluation windows scored on
   their own (512 tokens each), so :func:`window_scores` keeps one figure per window: KL, top-1
   agreement and negative log-likelihood.
3. **A comparison reports its spread.** Two methods scored on the same windows are compared window
   by window (:func:`paired`): the mean difference, a bootstrap interval over windows, and in how
   many windows one beats the other. A ranking the interval does not support is not stated.

Used by the module commands that write SmolLM2's tables in ``results/`` and by the lessons that
read them.
"""
from __future__ import annotations

import math

import torch

from course_lib import eval as ceval

#: Bootstrap settings: resamples of the windows, and the interval's coverage.
N_BOOT = 2000
LEVEL = 0.95


def _per_window(ref: ceval.Reference, values: torch.Tensor, what: str) -> torch.Tensor:
    """(n_windows,) means of a per-prediction tensor ``values`` (N,) over ``ref``'s windows."""
    per = ref.window                                    # predictions per window
    n = values.shape[0]
    if n % per:
        raise ValueError(f"{what}: {n} predictions do not split into windows of {per}; "
                         f"score with smollm.reference, whose windows are disjoint")
    return values.reshape(n // per, per).mean(1)                            # (n_windows,)


def window_scores(ref: ceval.Reference, lp: torch.Tensor) -> dict[str, list[float]]:
    """One figure per evaluation window of ``ref`` for a model whose log-probabilities on the
    same windows are ``lp`` (N, V): ``kl_nats`` (KL(ref || model), nats per token),
    ``top1_agreement``, and ``nll_nats`` (the model's negative log-likelihood of the text, nats
    per token; exp of its mean is the perplexity)."""
    if not isinstance(ref, ceval.Reference):
        raise TypeError(f"ref must be a course_lib.eval.Reference (smollm.reference(model, "
                        f"protocol='clean')); got {type(ref).__name__}")
    if not isinstance(lp, torch.Tensor) or lp.shape != ref.logprobs.shape:
        raise ValueError(f"lp must be the model's log-probs on ref's windows, shape "
                         f"{tuple(ref.logprobs.shape)}; got "
                         f"{tuple(lp.shape) if isinstance(lp, torch.Tensor) else type(lp).__name__}")
    if not torch.isfinite(lp).any(-1).all():
        raise ValueError("lp has a position with no finite log-probability: the model produced "
                         "NaN or inf logits")
    p = ref.logprobs.exp()                                                   # (N, V)
    kl = torch.where(p > 0, p * (ref.logprobs - lp), torch.zeros_like(p)).sum(-1)  # (N,)
    top1 = (ref.logprobs.argmax(-1) == lp.argmax(-1)).double()               # (N,)
    nll = -lp.gather(-1, ref.targets[:, None])[:, 0]                         # (N,)
    return {name: _per_window(ref, v.double(), name).tolist()
            for name, v in (("kl_nats", kl), ("top1_agreement", top1), ("nll_nats", nll))}


def score(model, ref: ceval.Reference, batch_size: int = 4) -> dict:
    """``model`` on ``ref``'s windows: the means (``kl_nats``, ``top1_agreement``,
    ``perplexity``, ``bits_per_byte``) as :func:`course_lib.eval.compare` gives them, plus
    ``windows`` (the per-window figures of :func:`window_scores`) and a bootstrap ``interval``
    for each mean (None for a single window)."""
    lp = ceval.logprobs(model, ref.ids, ref.window, batch_size, ref.stride)  # (N, V)
    w = window_scores(ref, lp)
    kl, top1 = ceval.kl_and_top1(ref.logprobs, lp)
    out = {"bits_per_byte": ceval.bits_from_logprobs(lp, ref.targets, ref.bytes_per_token),
           "perplexity": ceval.perplexity_from_logprobs(lp, ref.targets),
           "kl_nats": kl, "top1_agreement": top1, "windows": w}
    if len(w["kl_nats"]) < 2:                        # one window: nothing to resample
        out["interval"] = None
        return out
    out["interval"] = {"kl_nats": interval(w["kl_nats"]),
                       "top1_agreement": interval(w["top1_agreement"]),
                       "perplexity": [math.exp(v) for v in interval(w["nll_nats"])]}
    return out


def _values(v, what: str) -> torch.Tensor:
    t = torch.as_tensor(v, dtype=torch.float64)
    if t.dim() != 1 or t.numel() < 2:
        raise ValueError(f"{what} must be one figure per window, at least 2 windows; got shape "
                         f"{tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise ValueError(f"{what} holds NaN or inf: score the model again (a window diverged)")
    return t


def _boot_means(t: torch.Tensor, n_boot: int, seed: int) -> torch.Tensor:
    """(n_boot,) means of ``t`` resampled with replacement (a fixed seed: the same interval
    on every machine)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, t.numel(), (n_boot, t.numel()), generator=g)      # (n_boot, n)
    return t[idx].mean(1)


def _quantiles(m: torch.Tensor, level: float) -> list[float]:
    if not 0 < level < 1:
        raise ValueError(f"level is a coverage in (0, 1), 0.95 for 95%; got {level!r}")
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    return torch.quantile(m, q).tolist()


def interval(values, level: float = LEVEL, n_boot: int = N_BOOT, seed: int = 0) -> list[float]:
    """[lo, hi]: a bootstrap interval for the mean of per-window ``values`` (windows resampled
    with replacement, ``n_boot`` times; percentile interval of coverage ``level``)."""
    return _quantiles(_boot_means(_values(values, "values"), n_boot, seed), level)


def paired(a, b, level: float = LEVEL, n_boot: int = N_BOOT, seed: int = 0) -> dict:
    """Method A against method B on the same windows, from their per-window figures ``a`` and
    ``b`` (lower is better, e.g. KL): ``diff`` = mean(a - b), its bootstrap ``interval``,
    ``a_better`` (windows where a < b) of ``n_windows``, and ``clear``: True when the interval
    excludes 0 (the ranking holds on these windows), False when it does not."""
    ta, tb = _values(a, "a"), _values(b, "b")
    if ta.shape != tb.shape:
        raise ValueError(f"a and b must be scored on the same windows; got {ta.numel()} and "
                         f"{tb.numel()} figures")
    d = ta - tb                                                              # (n_windows,)
    lo, hi = _quantiles(_boot_means(d, n_boot, seed), level)
    return {"diff": float(d.mean()), "interval": [lo, hi], "a_better": int((d < 0).sum()),
            "n_windows": int(d.numel()), "clear": bool(lo > 0 or hi < 0)}
