"""The validation ladder: logits, then a task, then long generations (lesson 12,
``notebooks/12_validate_and_choose.ipynb``).

Rung 1 (cheap, most sensitive): KL divergence and top-1 agreement of the next-token
distributions against the unquantized model (``course_lib.eval.compare``, lesson 04), and
the tail that a mean hides (:func:`kl_tail`): the 99% and 99.9% quantiles and the maximum of
the per-token KL, as llama.cpp's ``llama-perplexity --kl-divergence`` reports them
(``tools/perplexity/README.md``), the flips (tokens whose top-1 choice changed; Dutta et al.,
"Accuracy is Not All You Need", arXiv:2407.09141) and the change of the probability of the
right token (llama.cpp's delta-p).
Rung 2: a task metric (``course_lib.eval.completion_accuracy`` on the bundled model); two
models scored on the same items are compared item by item with McNemar's paired test
(:func:`task_hits`, :func:`mcnemar`), not with two independent standard errors. Rung 3 (slowest): long greedy generations set beside the reference's,
and where they first part (:func:`continue_greedy`, :func:`first_divergence`,
:func:`divergence_points`).

Each rung has a resolution: :func:`rung_sees` says whether a measured difference is beyond
what that rung can tell from noise, so a lesson can show where each rung stops seeing a
difference.
"""
from __future__ import annotations

import math

import torch

RUNGS = ("kl", "top1", "task", "generation")


def _as_1d_ids(x, what: str) -> torch.Tensor:
    if isinstance(x, (list, tuple)) and len(x) == 0:
        return torch.zeros(0, dtype=torch.long)        # an empty generation: no ids, no dtype
    t = torch.as_tensor(x)
    if t.dim() != 1:
        raise ValueError(f"{what} must be a 1-D sequence of token ids; got shape {tuple(t.shape)}")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{what} must hold integer token ids; got {t.dtype}")
    return t.long()


def kl_tail(ref_lp: torch.Tensor, lp: torch.Tensor, targets: torch.Tensor | None = None) -> dict:
    """The per-token KL and its tail, the flips and delta-p, from next-token log-probs (N, V)
    of the reference and of a variant on the same positions (lesson 12, rung 1).

    A mean KL can hide a few positions where the variant is badly wrong; llama.cpp's
    ``--kl-divergence`` therefore prints quantiles of the per-token KL besides its mean, and
    Dutta et al. (arXiv:2407.09141) count *flips*, positions whose top-1 token changed, which
    a small change of accuracy can hide. Returns {n, kl_mean, kl_median, kl_q99, kl_q999,
    kl_max (nats), flips (count), flip_rate, top1_agreement (= 1 - flip_rate)}, and with
    ``targets`` (N,) also dp_mean, dp_rms, dp_min, dp_max: the variant's probability of the
    right token minus the reference's (llama.cpp's delta-p), as fractions (0.01 = 1 point).
    Quantiles are torch.quantile's (linear interpolation).
    """
    from course_lib.eval import _check_logprobs
    for name, x in (("ref_lp", ref_lp), ("lp", lp)):
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            raise ValueError(f"{name} must be next-token log-probs, a (N, V) tensor; got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if ref_lp.shape != lp.shape:
        raise ValueError(f"ref_lp {tuple(ref_lp.shape)} and lp {tuple(lp.shape)} must score the "
                         f"same positions over the same vocabulary")
    if ref_lp.shape[0] == 0:
        raise ValueError("no positions to compare: the log-probs are empty")
    _check_logprobs(ref_lp, "ref_lp")
    _check_logprobs(lp, "lp")
    ref, var = ref_lp.double(), lp.double()
    p = ref.exp()
    per_token = torch.where(p > 0, p * (ref - var), torch.zeros_like(p)).sum(-1).clamp_min(0)
    flips = int((ref.argmax(-1) != var.argmax(-1)).sum())
    n = ref.shape[0]
    q = torch.quantile(per_token, torch.tensor([0.5, 0.99, 0.999], dtype=torch.float64))
    out = {"n": n, "kl_mean": float(per_token.mean()), "kl_median": float(q[0]),
           "kl_q99": float(q[1]), "kl_q999": float(q[2]), "kl_max": float(per_token.max()),
           "flips": flips, "flip_rate": flips / n, "top1_agreement": 1 - flips / n}
    if targets is not None:
        t = torch.as_tensor(targets)
        if t.shape != (n,) or t.is_floating_point() or t.dtype == torch.bool:
            raise ValueError(f"targets must be ({n},) integer token ids, one per position; got "
                             f"{tuple(t.shape)} {t.dtype}")
        if int(t.min()) < 0 or int(t.max()) >= ref.shape[1]:
            raise ValueError(f"targets span [{int(t.min())}, {int(t.max())}] but the vocabulary "
                             f"has {ref.shape[1]} entries")
        dp = (var.gather(1, t.long()[:, None]).exp() - ref.gather(1, t.long()[:, None]).exp())[:, 0]
        out.update({"dp_mean": float(dp.mean()), "dp_rms": float(dp.pow(2).mean().sqrt()),
                    "dp_min": float(dp.min()), "dp_max": float(dp.max())})
    return out


def first_divergence(ref_ids, ids) -> int:
    """Index of the first position where two token sequences differ (lesson 12).

    When one is a prefix of the other (identical included), the length of the shorter:
    the generations never parted within what both produced. ``[5, 6, 7]`` vs ``[5, 6, 9]``
    -> 2; ``[5, 6]`` vs ``[5, 6, 7]`` -> 2; ``[1]`` vs ``[2]`` -> 0.
    """
    a, b = _as_1d_ids(ref_ids, "ref_ids"), _as_1d_ids(ids, "ids")
    n = min(len(a), len(b))
    differ = (a[:n] != b[:n]).nonzero()                                      # (k, 1)
    return int(differ[0, 0]) if len(differ) else n


@torch.no_grad()
def continue_greedy(model, prompts: torch.Tensor, n_new: int) -> torch.Tensor:
    """The ``n_new`` tokens ``model`` writes greedily after each prompt: (B, T) -> (B, n_new).
    Lesson 12, rung 3 (greedy, so that two models are compared token for token)."""
    from course_lib.model import generate
    if isinstance(n_new, bool) or not isinstance(n_new, int) or n_new < 1:
        raise ValueError(f"n_new is the number of tokens to generate, a whole number >= 1; got {n_new!r}")
    if not isinstance(prompts, torch.Tensor) or prompts.dim() != 2:
        raise ValueError(f"prompts must be a (B, T) tensor of token ids, prompts of equal "
                         f"length; got {tuple(getattr(prompts, 'shape', ()))}")
    return generate(model, prompts, n_new)[:, prompts.shape[1]:]            # (B, n_new)


def divergence_points(ref_new: torch.Tensor, new: torch.Tensor,
                      first_divergence_fn=first_divergence) -> list[int]:
    """Per row of two generations (B, n) (:func:`continue_greedy`), how many tokens agree
    before the first difference (n: never parted). Lesson 12, rung 3.
    ``first_divergence_fn``: the learner's, once it passes its check."""
    if ref_new.dim() != 2 or ref_new.shape[0] != new.shape[0]:
        raise ValueError(f"expected two (B, n) batches of generations with the same B; got "
                         f"{tuple(ref_new.shape)} and {tuple(new.shape)}")
    return [int(first_divergence_fn(ref_new[i], new[i])) for i in range(len(ref_new))]


@torch.no_grad()
def task_hits(model, text: bytes, n: int = 96, prompt_bytes: int = 128, seed: int = 0) -> list[bool]:
    """Per item, whether ``model`` completes the held-out identifier exactly (lesson 12, rung 2):
    the items of ``course_lib.eval.completion_accuracy``, kept one by one so that two models
    scored on the same items can be compared pair by pair (:func:`mcnemar`)."""
    from course_lib.eval import as_ids, completion_cases
    from course_lib.model import generate
    cases = completion_cases(text, n, prompt_bytes, "identifier", seed)
    if not cases:
        raise ValueError("the text holds no identifier to complete: give a longer held-out text")
    prompts = torch.stack([as_ids(p) for p, _ in cases])                    # (n, P)
    longest = max(len(t) for _, t in cases)
    out = generate(model, prompts, longest)[:, prompt_bytes:]              # (n, longest)
    return [bytes(out[i, :len(t)].tolist()) == t for i, (_, t) in enumerate(cases)]


def _as_hits(x, what: str) -> list[bool]:
    if isinstance(x, torch.Tensor):
        x = x.tolist()
    if isinstance(x, (str, bytes)) or not hasattr(x, "__len__"):
        raise TypeError(f"{what} must be a list of True/False per item (right or wrong); got "
                        f"{type(x).__name__}")
    out = []
    for v in x:
        if isinstance(v, bool) or v in (0, 1):
            out.append(bool(v))
        else:
            raise ValueError(f"{what} must hold True/False (or 1/0) per item; got {v!r}")
    return out


def mcnemar(ref_hits, hits) -> dict:
    """McNemar's exact test: did a variant change a task score measured on the SAME items as
    the reference? (lesson 12, rung 2)

    Only the discordant items carry information: ``b`` right for the reference and wrong for
    the variant, ``c`` the other way round. Under "no change" each discordant item is a fair
    coin, so ``b`` is Binomial(b + c, 1/2); the two-sided p-value is the probability of a
    split at least as uneven. Returns {n, b, c, change (the difference of the two accuracies,
    (c - b) / n), se_paired (its standard error from the pairs), p_value}.

    ``[1, 1, 0, 1]`` vs ``[1, 0, 0, 1]`` -> b = 1, c = 0, p = 1.0 (one flip is no evidence).
    """
    a, v = _as_hits(ref_hits, "ref_hits"), _as_hits(hits, "hits")
    if not a:
        raise ValueError("ref_hits is empty: score at least one item")
    if len(a) != len(v):
        raise ValueError(f"the two models must be scored on the same items: ref_hits has "
                         f"{len(a)} items, hits {len(v)}")
    n = len(a)
    b = sum(x and not y for x, y in zip(a, v))
    c = sum(y and not x for x, y in zip(a, v))
    m = b + c
    tail = sum(math.comb(m, k) for k in range(min(b, c) + 1)) / 2 ** m if m else 1.0
    change = (c - b) / n
    se_paired = math.sqrt(max(m / n - change ** 2, 0.0) / n)
    return {"n": n, "b": b, "c": c, "change": change, "se_paired": se_paired,
            "p_value": min(1.0, 2 * tail)}


def binomial_se(p: float, n: int) -> float:
    """Standard error of a proportion ``p`` measured on ``n`` independent items (lesson 12)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a whole number >= 1; got {n!r}")
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        hint = " (a percent? give a fraction: 0.42, not 42)" if isinstance(p, (int, float)) \
            and 1 < p <= 100 else ""
        raise ValueError(f"p is a proportion in [0, 1]{hint}; got {p!r}")
    return math.sqrt(p * (1 - p) / n)


#: A paired test "sees" a change of task score when its p-value is below this.
P_SEES = 0.05

#: Below this KL (nats per token) two fp32 runs of the same model on another machine differ.
KL_NOISE = 1e-6


def rung_sees(rung: str, value: float, reference: float | None = None, n: int | None = None,
              n_new: int | None = None) -> bool:
    """Does this rung see a difference from the reference model? (lesson 12)

    - ``kl``: the variant's KL is above fp32 noise (:data:`KL_NOISE`);
    - ``top1``: some of the ``n`` positions disagree (agreement below 1, counted on n);
    - ``task``: ``value`` is the p-value of McNemar's paired test (:func:`mcnemar`) on the
      items both models answered; it sees a change below :data:`P_SEES` (0.05);
    - ``generation``: the mean number of agreeing new tokens is below ``n_new`` (some
      generation parted from the reference's).
    """
    if rung not in RUNGS:
        raise ValueError(f"unknown rung {rung!r}; known: {', '.join(RUNGS)}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"value must be a finite number; got {value!r}")
    if rung == "kl":
        if value < 0:
            raise ValueError(f"a KL divergence is >= 0; got {value!r}")
        return value > KL_NOISE
    if rung == "top1":
        if n is None:
            raise ValueError("top1 needs n, the number of positions compared")
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"top1 takes the agreement as a fraction in [0, 1] (0.97, not 97); "
                             f"got {value!r}")
        return round((1 - value) * n) >= 1
    if rung == "task":
        if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
            raise ValueError(f"task takes the p-value of validate.mcnemar, in [0, 1]; got {value!r}")
        return value < P_SEES
    if n_new is None:
        raise ValueError("generation needs n_new, the number of new tokens generated")
    return value < n_new


__all__ = ["RUNGS", "KL_NOISE", "P_SEES", "kl_tail", "first_divergence", "continue_greedy", "divergence_points",
           "task_hits", "mcnemar", "binomial_se", "rung_sees"]
