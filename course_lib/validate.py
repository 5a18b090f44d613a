"""The validation ladder: logits, then a task, then long generations (lesson 12,
``notebooks/12_validate_and_choose.ipynb``).

Rung 1 (cheap, most sensitive): KL divergence and top-1 agreement of the next-token
distributions against the unquantized model (``course_lib.eval.compare``, lesson 04).
Rung 2: a task metric with its standard error (``course_lib.eval.completion_accuracy`` on
the bundled model). Rung 3 (slowest): long greedy generations set beside the reference's,
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
    t = torch.as_tensor(x)
    if t.dim() != 1:
        raise ValueError(f"{what} must be a 1-D sequence of token ids; got shape {tuple(t.shape)}")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{what} must hold integer token ids; got {t.dtype}")
    return t.long()


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


def binomial_se(p: float, n: int) -> float:
    """Standard error of a proportion ``p`` measured on ``n`` independent items (lesson 12)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a whole number >= 1; got {n!r}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p is a proportion in [0, 1]; got {p!r}")
    return math.sqrt(p * (1 - p) / n)


#: Below this KL (nats per token) two fp32 runs of the same model on another machine differ.
KL_NOISE = 1e-6


def rung_sees(rung: str, value: float, reference: float | None = None, n: int | None = None,
              n_new: int | None = None) -> bool:
    """Does this rung see a difference from the reference model? (lesson 12)

    - ``kl``: the variant's KL is above fp32 noise (:data:`KL_NOISE`);
    - ``top1``: some of the ``n`` positions disagree (agreement below 1, counted on n);
    - ``task``: the score moved by more than two standard errors of the reference's score
      on ``n`` items (``reference`` = the reference model's score);
    - ``generation``: the mean number of agreeing new tokens is below ``n_new`` (some
      generation parted from the reference's).
    """
    if rung not in RUNGS:
        raise ValueError(f"unknown rung {rung!r}; known: {', '.join(RUNGS)}")
    if rung == "kl":
        return value > KL_NOISE
    if rung == "top1":
        if n is None:
            raise ValueError("top1 needs n, the number of positions compared")
        return round((1 - value) * n) >= 1
    if rung == "task":
        if reference is None or n is None:
            raise ValueError("task needs reference (the reference's score) and n (items)")
        return abs(value - reference) > 2 * binomial_se(reference, n)
    if n_new is None:
        raise ValueError("generation needs n_new, the number of new tokens generated")
    return value < n_new


__all__ = ["RUNGS", "KL_NOISE", "first_divergence", "continue_greedy", "divergence_points", "binomial_se",
           "rung_sees"]
