"""Exercises of lesson 12, "Validate and choose" (solutions/12_validate_and_choose.ipynb)."""
from __future__ import annotations

import torch

from course_lib import guide
from course_lib import hardware as hw
from course_lib import validate
from course_lib.checks import Case, Exercise, register


# ---------------------------------------------------------------- 12.first_divergence

def _t(xs):
    return torch.tensor(xs, dtype=torch.long)


def _div_cases():
    g = torch.Generator().manual_seed(0)
    long_ref = torch.randint(0, 49152, (200,), generator=g)
    late = long_ref.clone()
    late[150] = (late[150] + 1) % 49152
    late[170] = (late[170] + 7) % 49152                      # a second difference, later
    return [
        Case((_t([5, 6, 7, 8]), _t([5, 6, 9, 8])), label="one token differs in the middle"),
        Case((_t([1, 2, 3]), _t([4, 2, 3])), label="the very first token differs: 0"),
        Case((_t([3, 1, 4, 1, 5]), _t([3, 1, 4, 1, 5])), label="identical: they never part"),
        Case((_t([9, 9]), _t([9, 9, 9, 2])), label="the reference is a prefix of the other"),
        Case((_t([7, 8, 9, 10]), _t([7, 8])), label="the variant stopped early (a stop token)"),
        Case((long_ref, late), label="200 tokens, two differences: the first counts"),
        Case((_t([0, 1, 2]), _t([0, 1, 5])), label="token id 0 is a token like any other"),
        Case((_t([]), _t([1, 2])), label="an empty generation: 0"),
        Case((_t([[1, 2], [3, 4]]), _t([[1, 2], [3, 4]])),
             label="a (2, 2) batch, not one sequence: raise ValueError", raises=ValueError),
    ]


def _wrong_div_count(ref_ids, ids):                  # counts agreeing positions anywhere
    a, b = torch.as_tensor(ref_ids), torch.as_tensor(ids)
    if a.dim() != 1 or b.dim() != 1:
        raise ValueError("1-D only")
    n = min(len(a), len(b))
    return int((a[:n] == b[:n]).sum())


def _wrong_div_longer(ref_ids, ids):                 # a prefix counts as a difference at its end
    a, b = torch.as_tensor(ref_ids), torch.as_tensor(ids)
    if a.dim() != 1 or b.dim() != 1:
        raise ValueError("1-D only")
    n = min(len(a), len(b))
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0, 0]) if len(differ) else max(len(a), len(b))


def _wrong_div_plus_one(ref_ids, ids):               # the number of tokens up to the difference
    a, b = torch.as_tensor(ref_ids), torch.as_tensor(ids)
    if a.dim() != 1 or b.dim() != 1:
        raise ValueError("1-D only")
    n = min(len(a), len(b))
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0, 0]) + 1 if len(differ) else n


def _wrong_div_last(ref_ids, ids):                   # the last difference, not the first
    a, b = torch.as_tensor(ref_ids), torch.as_tensor(ids)
    if a.dim() != 1 or b.dim() != 1:
        raise ValueError("1-D only")
    n = min(len(a), len(b))
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[-1, 0]) if len(differ) else n


register(Exercise(
    id="12.first_divergence",
    title="where a generation first parts from the reference",
    reference=validate.first_divergence,
    cases=_div_cases,
    hint=["Walk both sequences together from the start: at which position do they first "
          "hold different tokens? And what should you answer when one simply ends before any "
          "difference?",
          "Compare only the first min(len(a), len(b)) positions; `(a[:n] != b[:n]).nonzero()` "
          "lists the differing positions in order.",
          "Raise ValueError unless both are 1-D; return the first differing index, or n when "
          "there is none."],
    wrong=[_wrong_div_count, _wrong_div_longer, _wrong_div_plus_one, _wrong_div_last],
    rtol=0, atol=0, check_dtype=False, int_results=True,
))


# ---------------------------------------------------------------- 12.choose_scheme

def _scheme_cases():
    c = []
    for limit, gpu, params, why in [
        ("prefill", "H100", 8.03e9, "Hopper has FP8 tensor cores"),
        ("prefill", "L40S", 70.6e9, "Ada (cc 8.9) has FP8 tensor cores too"),
        ("prefill", "A100 80GB", 8.03e9, "Ampere: no FP8 maths, INT8 yes"),
        ("prefill", "MI300X", 70.6e9, "AMD: no CUDA compute capability, FP8 maths yes"),
        ("decode", "H100", 8.03e9, "one user, memory-bound"),
        ("decode", "A100 40GB", 70.6e9, "memory-bound on any GPU"),
        ("memory", "H100", 8.03e9, "8-bit 8B weights leave room on an H100"),
        ("memory", "H100", 70.6e9, "8-bit 70B fits in 72 GB but leaves no room: fits is not servable"),
        ("memory", "A100 80GB", 8.03e9, "8 bits without FP8 maths"),
        ("memory", "B200", 70.6e9, "8-bit 70B leaves room on a 180 GB B200"),
        ("memory", "RTX 4090", 8.03e9, "8B in 8 bits on a 24 GB card: 8.03 of 10.8 GB"),
        ("accuracy", "H100", 8.03e9, "BF16 8B leaves room: do not quantize"),
        ("accuracy", "H200", 70.6e9, "BF16 70B is 141 GB: 8-bit weights"),
        ("accuracy", "RTX 4090", 8.03e9, "BF16 8B (16 GB) on a 24 GB card leaves too little"),
        ("accuracy", "MI300X", 2e9, "a small model"),
    ]:
        c.append(Case((limit, gpu, params), label=f"{limit} on {gpu}, {params / 1e9:g}B: {why}"))
    c.append(Case(("speed", "H100", 8e9), label="an unknown limit: raise ValueError",
                  raises=ValueError))
    c.append(Case(("decode", "H100", 0), label="0 parameters: raise ValueError", raises=ValueError))
    return c


def _native(gpu, fmt):
    return hw.get_gpu(gpu).native_tflops(fmt) is not None


def _check(limit, params):
    if limit not in guide.LIMITS or not params > 0:
        raise ValueError("bad input")


def _wrong_scheme_hopper_only(limit, gpu, params):    # FP8 only from cc 9.0 (forgets Ada)
    _check(limit, params)
    g = hw.get_gpu(gpu)
    fp8 = g.compute_capability is not None and g.compute_capability >= (9, 0)
    if limit == "prefill":
        return "fp8_w8a8" if fp8 else "int8_w8a8"
    return guide.choose_scheme(limit, gpu, params)


def _wrong_scheme_fits(limit, gpu, params):           # all usable memory for weights
    _check(limit, params)
    usable = hw.get_gpu(gpu).usable_gb()
    if limit == "memory":
        if params / 1e9 <= usable:
            return "fp8_w8a8" if _native(gpu, "fp8") else "w8a16"
        return "w4a16"
    if limit == "accuracy":
        return "bf16" if 2 * params / 1e9 <= usable else "w8a16"
    return guide.choose_scheme(limit, gpu, params)


def _wrong_scheme_w4_prefill(limit, gpu, params):     # fewest bytes for everything
    _check(limit, params)
    if limit == "prefill":
        return "w4a16"
    return guide.choose_scheme(limit, gpu, params)


def _wrong_scheme_fp8_everywhere(limit, gpu, params):  # FP8 W8A8 whatever the GPU
    _check(limit, params)
    if limit in ("prefill", "memory") and guide.choose_scheme(limit, gpu, params) != "w4a16":
        return "fp8_w8a8"
    return guide.choose_scheme(limit, gpu, params)


def _wrong_scheme_accuracy_fp8(limit, gpu, params):    # quantizes even when BF16 fits
    _check(limit, params)
    if limit == "accuracy":
        return "fp8_w8a8" if _native(gpu, "fp8") else "w8a16"
    return guide.choose_scheme(limit, gpu, params)


register(Exercise(
    id="12.choose_scheme",
    title="the decision rule: what limits you, GPU, model size -> scheme",
    reference=guide.choose_scheme,
    cases=_scheme_cases,
    hint=["Which of the four limits is about bytes read, which about maths, which about room "
          "in memory? Which GPUs compute FP8, and how do you find out without a compute "
          "capability (AMD has none)?",
          "Read the catalogue: `hw.get_gpu(gpu).native_tflops('fp8') is None` means no FP8 "
          "maths. Room for the weights is `guide.WEIGHT_SHARE * gpu.usable_gb()` GB, and "
          "weights take params x bytes per weight / 1e9 GB.",
          "accuracy: 'bf16' if 2 x params / 1e9 fits the room, else 'w8a16'. memory: 8-bit "
          "weights fit the room -> 'fp8_w8a8' (FP8 native) or 'w8a16'; else 'w4a16'. decode: "
          "'w4a16'. prefill: 'fp8_w8a8', else 'int8_w8a8' (INT8 native), else 'bf16'."],
    wrong=[_wrong_scheme_hopper_only, _wrong_scheme_fits, _wrong_scheme_w4_prefill,
           _wrong_scheme_fp8_everywhere, _wrong_scheme_accuracy_fp8],
))


# ---------------------------------------------------------------- 12.mistakes_quiz

def _quiz_cases():
    return ([Case((q,), label=guide.QUIZ[q][0]) for q in guide.QUIZ]
            + [Case(("q99",), label="a question that does not exist: raise KeyError",
                    raises=KeyError)])


def _answers(table):
    def answer(question):
        if question not in guide.QUIZ:
            raise KeyError(question)
        return table[question]
    return answer


_wrong_quiz_bytes = _answers({**{q: v[2] for q, v in guide.QUIZ.items()}, "q1": "a"})
_wrong_quiz_bytes.__name__ = "_wrong_quiz_bytes"          # "fewer bytes always means faster"
_wrong_quiz_four_bits = _answers({**{q: v[2] for q, v in guide.QUIZ.items()}, "q4": "a"})
_wrong_quiz_four_bits.__name__ = "_wrong_quiz_four_bits"  # "4 bits means 4 bits"
_wrong_quiz_fits = _answers({**{q: v[2] for q, v in guide.QUIZ.items()}, "q6": "a", "q2": "a"})
_wrong_quiz_fits.__name__ = "_wrong_quiz_fits"            # "fits means servable", "FP4 anywhere"

register(Exercise(
    id="12.mistakes_quiz",
    title="common mistakes: a quiz",
    reference=guide.quiz_answer,
    cases=_quiz_cases,
    hint=["For each claim, which number from this course settles it: a speed ratio from the "
          "GPU benchmark, a compute capability, bits per weight with scales, or a memory sum?",
          "Sections 3 (the summary), 4 (the hardware table) and 5 (the decision rule) of "
          "the lesson hold the evidence; `show_question(q)` prints a question and its options.",
          "Return the letter of the option the evidence supports, e.g. {'q1': ..., ...}[question]; "
          "an unknown question raises KeyError."],
    wrong=[_wrong_quiz_bytes, _wrong_quiz_four_bits, _wrong_quiz_fits],
))
