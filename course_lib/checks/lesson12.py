"""Exercises of lesson 12, "Validate and choose" (solutions/12_validate_and_choose.ipynb)."""
from __future__ import annotations

import numpy as np
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
        Case((_t([3, 1, 4, 1, 5]), _t([3, 1, 4, 1, 5])), label="identical: they never part",
             hint="What does the task return when the two never part?"),
        Case((_t([9, 9]), _t([9, 9, 9, 2])), label="the reference is a prefix of the other",
             hint="When one generation is a prefix of the other, where do they part: at the "
                  "shorter one's end?"),
        Case((_t([7, 8, 9, 10]), _t([7, 8])), label="the variant stopped early (a stop token)",
             hint="When one generation is a prefix of the other, where do they part: at the "
                  "shorter one's end?"),
        Case((long_ref, late), label="200 tokens, two differences: the first counts"),
        Case((_t([0, 1, 2]), _t([0, 1, 5])), label="token id 0 is a token like any other"),
        Case((_t([]), _t([1, 2])), label="an empty generation: 0"),
        Case((_t([[1, 2], [3, 4]]), _t([[1, 2], [3, 4]])),
             label="a (2, 2) batch, not one sequence: raise ValueError", raises=ValueError),
        Case((torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5])),
             label="float scores, not token ids: raise TypeError", raises=TypeError),
        Case((_t([4, 4, 4]), torch.tensor([4, 4, 5], dtype=torch.int32)),
             label="int64 against int32 ids: the values count, not the dtype",
             hint="Compare the token values, not the tensors' dtypes."),
    ]


def _wrong_div_floats(ref_ids, ids):                 # accepts logits or scores as "ids"
    a, b = torch.as_tensor(ref_ids), torch.as_tensor(ids)
    if a.dim() != 1 or b.dim() != 1:
        raise ValueError("1-D only")
    n = min(len(a), len(b))
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0, 0]) if len(differ) else n


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
          "Raise ValueError unless both are 1-D, TypeError when either holds floats "
          "(`t.is_floating_point()`); return int(first differing index), or n when there is none."],
    wrong=[_wrong_div_count, _wrong_div_longer, _wrong_div_plus_one, _wrong_div_last,
           _wrong_div_floats],
    rtol=0, atol=0, check_dtype=False, int_results=True,
))


# ---------------------------------------------------------------- 12.choose_scheme

def _edge_params(gpu, batch, context, side):
    """A parameter count whose 8-bit weights sit just inside (side -1) or outside (+1) the
    room the rule leaves next to the cache and the workspace."""
    g = hw.get_gpu(gpu)
    p = 70.6e9
    for _ in range(4):                                   # the KV shape depends on the size
        kv = batch * context * guide.kv_bytes_per_token_for(p) / 1e9
        p = (g.usable_gb() - hw.DEFAULT_WORKSPACE_GB - kv) * 1e9
    return p * (1 + side * 2e-3)


def _scheme_cases():
    c = []
    for args, why in [
        (("prefill", "H100", 8.03e9), "Hopper has FP8 tensor cores"),
        (("prefill", "L40S", 70.6e9), "Ada (cc 8.9) has FP8 tensor cores too"),
        (("prefill", "A100 80GB", 8.03e9), "Ampere: no FP8 maths, INT8 yes"),
        (("prefill", "MI300X", 70.6e9), "AMD: no CUDA compute capability, FP8 maths yes"),
        (("decode", "H100", 8.03e9), "measured: W8A8 beat BF16 at decode, W4A16 did not"),
        (("decode", "A100 80GB", 8.03e9), "decode without FP8 maths: INT8 W8A8"),
        (("decode", "A100 40GB", 70.6e9), "8-bit 70B leaves no room on 40 GB: 4 bits"),
        (("decode", "H100", 8.03e9, 64, 4096), "64 users: the cache outweighs the weights"),
        (("memory", "H100", 8.03e9), "8-bit 8B weights leave room on an H100"),
        (("memory", "H100", 70.6e9), "8-bit 70B + cache + workspace > 72 GB: fits is not servable"),
        (("memory", "A100 80GB", 8.03e9), "8 bits without FP8 maths"),
        (("memory", "B200", 70.6e9), "8-bit 70B leaves room on a 180 GB B200"),
        (("memory", "RTX 4090", 8.03e9), "8B in 8 bits on a 24 GB card"),
        (("memory", "H100", 60e9, 8, 4096), "8 users' cache pushes 60B in 8 bits out of room"),
        (("memory", "H100", 8.03e9, 1, 131072), "one 128k-token conversation: FP8 cache"),
        (("memory", "H100", _edge_params("H100", 1, 4096, -1)),
         "8-bit weights just inside the room"),
        (("memory", "H100", _edge_params("H100", 1, 4096, +1)),
         "8-bit weights just outside the room"),
        (("decode", "H200", _edge_params("H200", 4, 8192, +1), 4, 8192),
         "decode just outside the room: 4 bits"),
        (("accuracy", "H100", 8.03e9), "BF16 8B leaves room: do not quantize"),
        (("accuracy", "H200", 70.6e9), "BF16 70B is 141 GB: 8-bit weights"),
        (("accuracy", "RTX 4090", 8.03e9, 8, 8192), "BF16 8B + 8 users' cache > 21.6 GB"),
        (("accuracy", "H200", 8.03e9, 64, 4096), "accuracy first: no FP8 cache even for 64 users"),
        (("accuracy", "MI300X", 2e9), "a small model"),
        (("decode", "H100", 4294967296.0, 1, 16384),
         "a tie: the BF16 cache is exactly a quarter of the BF16 weights (FP8 cache)"),
        (("decode", "H100", 4294967296.0, 1, 16383), "one token below the tie: BF16 cache"),
        (("decode", "H100", 8.03e9, np.int64(64), np.int64(4096)),
         "batch and context as NumPy integers (np.int64): whole numbers too"),
    ]:
        c.append(Case(args, label=why))
    c[-3].hint = ("'At least a quarter': is a cache of exactly a quarter of the weights FP8? "
                  ">=, not >.")
    c[-1].hint = ("np.int64(64) is a whole number: isinstance(v, int) is False for it, "
                  "isinstance(v, (int, np.integer)) is True (and leaves bool out if you "
                  "test bool first).")
    for args, why in [(("speed", "H100", 8e9), "an unknown limit"),
                      (("decode", "H100", 0), "0 parameters"),
                      (("decode", "H100", -8e9), "negative parameters"),
                      (("decode", "H100", float("nan")), "NaN parameters"),
                      (("decode", "H100", 8e9, 0, 4096), "a batch of 0"),
                      (("decode", "H100", 8e9, 1, 4096.5), "a context that is not whole")]:
        c.append(Case(args, label=f"{why}: raise ValueError", raises=ValueError))
    return c


def _native(gpu, fmt):
    return hw.get_gpu(gpu).native_tflops(fmt) is not None


def _whole(v):
    """A NumPy integer as the int it is (the task's whole numbers include np.int64)."""
    return int(v) if isinstance(v, np.integer) else v


def choose_scheme_reference(limit, gpu, params, batch=1, context=4096):
    """``guide.choose_scheme``, with NumPy integers for batch and context taken as the whole
    numbers they are."""
    return guide.choose_scheme(limit, gpu, params, _whole(batch), _whole(context))


def _check(limit, params, batch=1, context=4096):
    if limit not in guide.LIMITS or not params > 0:
        raise ValueError("bad input")
    for v in (batch, context):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError("bad input")


def _rule(limit, gpu, params, batch, context, workspace=hw.DEFAULT_WORKSPACE_GB, count_kv=True,
          decode=None, kv=None, fp8=None):
    """The rule with one piece swapped out (the wrong answers below)."""
    _check(limit, params, batch, context)
    g = hw.get_gpu(gpu)
    kv_cache = kv(limit, params, batch, context) if kv else guide.choose_kv_cache(
        limit, params, batch, context)
    has_fp8 = fp8(g) if fp8 else _native(gpu, "fp8")
    cache = batch * context * guide.kv_bytes_per_token_for(params) / 1e9 / (
        2 if kv_cache == "fp8" else 1)
    room = g.usable_gb() - workspace - (cache if count_kv else 0)
    if limit == "accuracy":
        return ("bf16" if 2 * params / 1e9 <= room else "w8a16"), kv_cache
    if limit == "memory":
        return (("fp8_w8a8" if has_fp8 else "w8a16") if params / 1e9 <= room else "w4a16"), kv_cache
    if limit == "decode":
        if decode:
            return decode(params / 1e9 <= room, has_fp8, _native(gpu, "int8")), kv_cache
        if params / 1e9 > room:
            return "w4a16", kv_cache
        return ("fp8_w8a8" if has_fp8 else "int8_w8a8" if _native(gpu, "int8") else "w8a16"), kv_cache
    return ("fp8_w8a8" if has_fp8 else "int8_w8a8" if _native(gpu, "int8") else "bf16"), kv_cache


def _wrong_scheme_hopper_only(limit, gpu, params, batch=1, context=4096):   # forgets Ada
    return _rule(limit, gpu, params, batch, context, fp8=lambda g: g.compute_capability is not None
                 and g.compute_capability >= (9, 0))


def _wrong_scheme_no_kv_room(limit, gpu, params, batch=1, context=4096):    # weights + workspace
    return _rule(limit, gpu, params, batch, context, count_kv=False)


def _wrong_scheme_no_workspace(limit, gpu, params, batch=1, context=4096):  # weights + cache
    return _rule(limit, gpu, params, batch, context, workspace=0.0)


def _wrong_scheme_decode_bytes(limit, gpu, params, batch=1, context=4096):  # fewest bytes
    return _rule(limit, gpu, params, batch, context, decode=lambda room, fp8, int8: "w4a16")


def _wrong_scheme_decode_w8a16(limit, gpu, params, batch=1, context=4096):  # weight-only 8-bit
    return _rule(limit, gpu, params, batch, context,
                 decode=lambda room, fp8, int8: "w8a16" if room else "w4a16")


def _wrong_scheme_kv_always(limit, gpu, params, batch=1, context=4096):     # FP8 cache always
    return _rule(limit, gpu, params, batch, context, kv=lambda *a: "fp8")


def _wrong_scheme_kv_for_accuracy(limit, gpu, params, batch=1, context=4096):
    def kv(lim, p, b, c):                                    # the cache rule ignores the limit
        return guide.choose_kv_cache("decode", p, b, c)
    return _rule(limit, gpu, params, batch, context, kv=kv)


def _wrong_scheme_kv_strict(limit, gpu, params, batch=1, context=4096):     # > where >= is asked
    def kv(lim, p, b, c):
        share = b * c * guide.kv_bytes_per_token_for(p) / (p * 2)
        return "fp8" if lim != "accuracy" and share > guide.KV_FP8_SHARE else "bf16"
    return _rule(limit, gpu, params, batch, context, kv=kv)


def _wrong_scheme_kv_per_user(limit, gpu, params, batch=1, context=4096):   # forgets the batch
    return _rule(limit, gpu, params, batch, context,
                 kv=lambda lim, p, b, c: guide.choose_kv_cache(lim, p, 1, c))


def _wrong_scheme_no_input_checks(limit, gpu, params, batch=1, context=4096):
    if limit not in guide.LIMITS or not params > 0:           # batch and context unchecked
        raise ValueError("bad input")
    return guide.choose_scheme(limit, gpu, params, max(int(batch), 1), max(int(context), 1))


def _wrong_scheme_python_int_only(limit, gpu, params, batch=1, context=4096):
    """Refuses np.int64: `isinstance(v, int)` calls a NumPy integer "not a whole number"."""
    for v in (batch, context):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError("batch and context must be whole numbers >= 1")
    return choose_scheme_reference(limit, gpu, params, batch, context)


register(Exercise(
    id="12.choose_scheme",
    title="the decision rule: what limits you, GPU, model size, users, context -> scheme",
    reference=choose_scheme_reference,
    cases=_scheme_cases,
    hint=["Settle the cache first: how big is the batch's BF16 cache next to the model's BF16 "
          "weights, and does the limit allow any loss? Then ask, for each limit, whether the "
          "weights still have room once that cache and the workspace are placed, and which "
          "scheme the course's measurements (not the byte count) favour for decode.",
          "cache_gb = batch x context x guide.kv_bytes_per_token_for(params) / 1e9 (BF16); FP8 "
          "cache when the limit is not accuracy and cache_gb >= guide.KV_FP8_SHARE x 2 x params "
          "/ 1e9 (halve cache_gb then). room = g.usable_gb() - hw.DEFAULT_WORKSPACE_GB - cache.",
          "accuracy: bf16 if 2 x params / 1e9 <= room else w8a16. memory: 8-bit fits -> "
          "fp8_w8a8 (FP8 native) or w8a16, else w4a16. decode: 8-bit does not fit -> w4a16, "
          "else fp8_w8a8 / int8_w8a8 / w8a16 by what is native. prefill: fp8_w8a8 / int8_w8a8 "
          "/ bf16. Return (scheme, kv_cache); ValueError for a bad limit, params, batch or context."],
    wrong=[_wrong_scheme_hopper_only, _wrong_scheme_no_kv_room, _wrong_scheme_no_workspace,
           _wrong_scheme_decode_bytes, _wrong_scheme_decode_w8a16, _wrong_scheme_kv_always,
           _wrong_scheme_kv_for_accuracy, _wrong_scheme_kv_strict, _wrong_scheme_kv_per_user,
           _wrong_scheme_no_input_checks, _wrong_scheme_python_int_only],
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


def _with(**changes):
    return _answers({**{q: v[2] for q, v in guide.QUIZ.items()}, **changes})


_wrong_quiz_bytes = _with(q1="a")                           # "fewer bytes always means faster"
_wrong_quiz_bytes.__name__ = "_wrong_quiz_bytes"
_wrong_quiz_four_bits = _with(q4="a")                       # "4 bits means 4 bits"
_wrong_quiz_four_bits.__name__ = "_wrong_quiz_four_bits"
_wrong_quiz_fits = _with(q6="a")                            # "fits means servable"
_wrong_quiz_fits.__name__ = "_wrong_quiz_fits"
_wrong_quiz_fp4 = _with(q2="b")                             # "FP4 maths anywhere"
_wrong_quiz_fp4.__name__ = "_wrong_quiz_fp4"
_wrong_quiz_all_b = _answers({q: "b" for q in guide.QUIZ})  # one letter for every question
_wrong_quiz_all_b.__name__ = "_wrong_quiz_all_b"
_wrong_quiz_head = _with(q5="b")                            # "every byte counts"
_wrong_quiz_head.__name__ = "_wrong_quiz_head"


def _wrong_quiz_upper(question):                            # "C" is not "c"
    return guide.quiz_answer(question).upper()


register(Exercise(
    id="12.mistakes_quiz",
    title="common mistakes: a quiz",
    reference=guide.quiz_answer,
    cases=_quiz_cases,
    hint=["For each claim, which number from this course settles it: a speed ratio from the "
          "GPU benchmark, a compute capability, bits per weight with scales, or a memory sum?",
          "Section 6 of the lesson (Common mistakes) points each claim to its evidence: "
          "sections 1 (the validation ladder), 2 (the measured summary) and 3 (the hardware "
          "table), and lessons 00, 03 and 04; `show_question(q)` prints a question and its "
          "options.",
          "Return the letter of the option the evidence supports, e.g. {'q1': ..., ...}[question]; "
          "an unknown question raises KeyError."],
    wrong=[_wrong_quiz_bytes, _wrong_quiz_four_bits, _wrong_quiz_fits, _wrong_quiz_fp4,
           _wrong_quiz_all_b, _wrong_quiz_head, _wrong_quiz_upper],
))
