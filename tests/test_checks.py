"""Every registered exercise: the reference passes, and every known wrong answer is rejected.

Plus the checker's own behaviour on unsolved, crashing, mis-shaped and NaN answers.
"""
import numpy as np
import pytest

from course_lib import checks
from course_lib.checks import Case, Exercise, check

EXERCISES = checks.load_all()


@pytest.fixture(autouse=True)
def learner_mode(monkeypatch):
    monkeypatch.setenv("COURSE_CHECKS", "learner")


def test_there_are_exercises():
    assert len(EXERCISES) >= 2


@pytest.mark.parametrize("ex_id", sorted(EXERCISES))
def test_reference_passes(ex_id):
    ex = EXERCISES[ex_id]
    assert len(ex.cases()) >= 3, f"{ex_id}: a checker tries at least three inputs"
    result = check(ex_id, ex.reference, quiet=True)
    assert result, result.report


@pytest.mark.parametrize("ex_id", sorted(EXERCISES))
def test_every_known_wrong_answer_is_rejected(ex_id):
    ex = EXERCISES[ex_id]
    assert len(ex.wrong) >= 3, f"{ex_id}: give at least three plausible wrong implementations"
    for i, wrong in enumerate(ex.wrong):
        result = check(ex_id, wrong, quiet=True)
        assert result.status == "failed", f"{ex_id}: wrong answer #{i} ({wrong.__name__}) passed"
        assert "input:" in result.report and "hint:" in result.report


@pytest.mark.parametrize("ex_id", sorted(i for i in EXERCISES if EXERCISES[i].right))
def test_every_other_right_reading_passes(ex_id):
    """A task sentence read another reasonable way (another precision, another order of exact
    steps) that is right in exact arithmetic must pass too: the checker does not reward
    guessing which reading it holds."""
    for i, right in enumerate(EXERCISES[ex_id].right):
        result = check(ex_id, right, quiet=True)
        assert result, f"{ex_id}: right reading #{i} ({right.__name__}) failed:\n{result.report}"


# ---- the checker itself, on a toy exercise ---------------------------------------------------

def _double(x):
    return 2 * x


TOY = Exercise(
    id="toy.double", title="double an array", reference=_double,
    cases=lambda: [Case((np.arange(4.0),), label="small"), Case((np.zeros(3),), label="zeros"),
                   Case((np.array([1e30, -1e30]),), label="huge"),
                   Case(("not an array",), raises=TypeError, label="bad input")],
    hint="multiply by two")


def _bad_input_double(x):
    if isinstance(x, str):
        raise TypeError("x must be an array")
    return 2 * x


@pytest.fixture
def toy():
    checks.EXERCISES[TOY.id] = TOY
    yield TOY.id
    del checks.EXERCISES[TOY.id]


def test_checker_passes_a_right_answer(toy):
    assert check(toy, _bad_input_double, quiet=True)


def test_not_implemented_does_not_raise(toy, capsys):
    def unsolved(x):
        raise NotImplementedError
    result = check(toy, unsolved)
    assert result.status == "not implemented" and not result
    assert "not yet implemented" in capsys.readouterr().out


KIND = "hint:     the values may well be right; the kind of answer is not"
REFUSE = "hint:     the task asks for TypeError on an input like this one"


@pytest.mark.parametrize("fn, words, hint_words", [
    (lambda x: (_ for _ in ()).throw(ZeroDivisionError("boom")), "raised ZeroDivisionError: boom",
     "hint:     multiply by two"),
    (lambda x: (2 * x)[:-1] if not isinstance(x, str) else _bad_input_double(x), "expected shape",
     "hint:     multiply by two"),
    (lambda x: (2 * x).astype(np.float32) if not isinstance(x, str) else _bad_input_double(x),
     "dtype", KIND),
    (lambda x: x * np.nan if not isinstance(x, str) else _bad_input_double(x), "NaN",
     "hint:     multiply by two"),
    (lambda x: None, "returned None", KIND),
    (lambda x: list(2 * x) if not isinstance(x, str) else _bad_input_double(x),
     "expected a numpy.ndarray", KIND),
    (lambda x: 3 * x if not isinstance(x, str) else _bad_input_double(x), "values differ",
     "hint:     multiply by two"),
    (lambda x: 2 * x if not isinstance(x, str) else "oops",
     "expected your function to raise TypeError", REFUSE),
])
def test_failures_say_what_is_wrong(toy, fn, words, hint_words, capsys):
    """Each failure names what is wrong and quotes the hint for it: the exercise's first step
    where the values are wrong, a hint on the kind of answer where its type or dtype is, and
    one naming the exception where the case expects one."""
    result = check(toy, fn)
    out = capsys.readouterr().out
    assert result.status == "failed"
    assert words in out and "input:" in out and hint_words in out, out


def test_strict_modes(toy, monkeypatch):
    def unsolved(x):
        raise NotImplementedError
    monkeypatch.setenv("COURSE_CHECKS", "exercises")
    assert check(toy, unsolved, quiet=True).status == "not implemented"
    with pytest.raises(AssertionError, match="values differ"):
        check(toy, lambda x: 3 * x, quiet=True)
    monkeypatch.setenv("COURSE_CHECKS", "solutions")
    with pytest.raises(AssertionError, match="not yet implemented"):
        check(toy, unsolved, quiet=True)


def test_unknown_exercise_lists_known_ones():
    with pytest.raises(KeyError, match="known:"):
        check("no.such.exercise", _double)


def test_cmp_handles_infinities_and_mismatches():
    from course_lib.compare import cmp
    assert cmp("x", np.array([np.inf, 1.0]), np.array([np.inf, 1.0])).exact
    bad = cmp("x", np.array([np.inf, 1.0]), np.array([-np.inf, 1.0]))
    assert not bad and "flat index 0" in bad.problem
    assert not cmp("x", np.array([1.0, 2.0]), np.array([1.0, 2.1]))
    assert cmp("x", np.array([1.0, 2.0]), np.array([1.0, 2.0 + 1e-9]))


def test_grading_mode_raises_on_unsolved_and_wrong(toy, monkeypatch):
    def unsolved(x):
        raise NotImplementedError
    monkeypatch.setenv("COURSE_CHECKS", "grading")
    with pytest.raises(AssertionError, match="not yet implemented"):
        check(toy, unsolved, quiet=True)
    with pytest.raises(AssertionError, match="values differ"):
        check(toy, lambda x: 3 * x, quiet=True)
    assert check(toy, _bad_input_double, quiet=True)


def test_hints_come_in_steps(monkeypatch, capsys):
    stepped = Exercise(id="toy.stepped", title="double", reference=_double,
                       cases=lambda: [Case((np.arange(3.0),))],
                       hint=["think about what doubling means", "return 2 * x"])
    monkeypatch.setitem(checks.EXERCISES, stepped.id, stepped)
    result = check(stepped.id, lambda x: 3 * x)
    out = capsys.readouterr().out
    assert "think about what doubling means" in out and "level=2" in out
    assert "return 2 * x" not in out                      # the code-level step stays hidden
    assert "2/2: return 2 * x" in checks.hint(stepped.id, level=2)
    assert "1/2: think about" in checks.hint(stepped.id)
    assert "here is the last" in checks.hint(stepped.id, level=5)
    with pytest.raises(ValueError, match="level must be"):
        checks.hint(stepped.id, level=0)
    assert not result


def test_an_expected_nan_is_named_in_the_failure(toy, capsys):
    nan_ex = Exercise(id="toy.nan", title="decode", reference=lambda b: float("nan"),
                      cases=lambda: [Case((0x7F,), label="0x7F")], hint="think about NaN")
    checks.EXERCISES[nan_ex.id] = nan_ex
    try:
        result = check(nan_ex.id, lambda b: 480.0)
    finally:
        del checks.EXERCISES[nan_ex.id]
    out = capsys.readouterr().out
    assert not result and "expected NaN" in out and "got 480" in out
    assert "max abs diff 0" not in out


def test_signed_zero_and_int_results_are_opt_in(monkeypatch):
    from course_lib.checks import compare_answer
    assert compare_answer(-0.0, 0.0, 1e-5, 1e-8, True) is None
    assert "sign of zero" in compare_answer(-0.0, 0.0, 1e-5, 1e-8, True, signed_zero=True)
    assert compare_answer(np.array([0.0, -0.0]), np.array([0.0, -0.0]), 1e-5, 1e-8, True,
                          signed_zero=True) is None
    assert compare_answer(4, 4.0, 1e-5, 1e-8, True) is None
    assert "whole number" in compare_answer(4, 4.0, 1e-5, 1e-8, True, int_results=True)
    assert compare_answer((0.1, 4), (0.1, np.int64(4)), 1e-5, 1e-8, True, int_results=True) is None
    import torch
    assert compare_answer(2.0, torch.tensor(2.0), 1e-5, 1e-8, True) is None
    assert "Python float" in compare_answer(2.0, torch.tensor(2.0), 1e-5, 1e-8, True,
                                            float_results=True)
    assert compare_answer((0.5, 1.0), (0.5, np.float64(1.0)), 1e-5, 1e-8, True,
                          float_results=True) is None


# Independent values: each computed by hand from the lesson's text, not by the reference.
HAND_VALUES = [
    ("00.weight_gb", (70.6e9, 4, 128), 36.403125),             # 70.6e9 x 4.125 / 8 / 1e9
    ("00.weight_gb", (1e6, 4, 1, 4), 0.001),                   # 8 bits per weight
    ("00.kv_bytes_per_token", ({"num_hidden_layers": 30, "num_attention_heads": 9,
                                "num_key_value_heads": 3, "hidden_size": 576}, 0.5), 5760),
    ("00.decode_floor_ms", (141.2e9, 3.35, 2), 141.2 / 3.35 / 2),
    ("00.conversations_that_fit", (80, 1.0, 16.0, 1e6, 1000), 64),
    ("01.decode_e4m3", (0x7E,), 448.0),
    ("01.decode_e4m3", (0x01,), 2.0 ** -9),
    ("01.bf16_bits", (1.0,), 0x3F80),
    ("01.bf16_bits", (1.0 + 3 * 2.0 ** -8,), 0x3F82),
    ("01.round_e4m3", (1.1875,), 1.25),
    ("01.round_e4m3", (300.0,), 288.0),
    ("02.zero_point", (-0.4, 1.1, 4), (0.1, 4)),
    ("02.zero_point", (-0.25, 1.25, 2), (0.5, 0)),
    ("02.dequantize", (np.array([0, 15], dtype=np.uint8), 0.1, 4), np.array([-0.4, 1.1])),
    # FP4 E2M1 (bias 1) and E1M2 with bias 0: subnormals m/4 * 2, normals (1 + m/4) * 2
    ("01.float_values", (2, 1, 1), np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])),
    ("01.float_values", (1, 2, 0), np.array([0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5])),
    # range 1..4.5 widened to 0..4.5, 2 bits: step 1.5, zero 0; 1 and 2 round to 1 step
    ("03.asym_groupwise", (np.array([[1.0, 2.0, 3.0, 4.5]]), 4, 2), np.array([[1.5, 1.5, 3.0, 4.5]])),
    # row RMS sqrt(107 / 8) = 3.66: only the 10 is above 2 x RMS
    ("03.remove_outliers", (np.array([[1.0, -1, 1, -1, 1, -1, 1, 10]]), 2.0),
     np.array([[1.0, -1, 1, -1, 1, -1, 1, 0]])),
    # one group of 8: step 1, the four 0.1 round to 0 (relative error 0.0143); groups of 4 are
    # exact (0.1 = 7 steps of 0.1 / 7)
    ("03.largest_group_within", (np.array([[0.1] * 4 + [7.0] * 4]), 0.01), 4),
    ("03.largest_group_within", (np.array([[0.1] * 4 + [7.0] * 4]), 0.02), 8),
]


@pytest.mark.parametrize("ex_id, args, value", HAND_VALUES)
def test_references_agree_with_hand_computed_values(ex_id, args, value):
    got = EXERCISES[ex_id].reference(*args)
    if isinstance(value, tuple):
        assert np.allclose(got, value, rtol=1e-9)
    else:
        assert np.allclose(got, value, rtol=1e-9, atol=1e-12)


def test_hand_values_for_quantizers():
    q, scale = EXERCISES["02.absmax_quantize"].reference(
        np.array([7.0, 0.5, 1.5, 2.5, -2.5, -0.5, 3.5]), 4)
    assert scale == 1.0 and q.tolist() == [7, 0, 2, 2, -2, 0, 4]       # ties to even
    q, s = EXERCISES["03.groupwise_quantize"].reference(
        np.array([[0.423, -1.270, 0.081, 9.0, -0.337, 0.562, -0.708, 1.049]]), 4)
    assert np.allclose(s, [[9 / 7, 1.049 / 7]]) and q[0, :4].tolist() == [0, -1, 0, 7]
    assert EXERCISES["03.pack_int4"].reference(np.array([1, -1, 7, -8], np.int8)).tolist() == [0xF1, 0x87]
    block = np.zeros(32, np.float32)
    block[:3] = [0.9, -0.2, 0.05]
    scale, el = EXERCISES["03.mxfp4_block"].reference(block)
    assert scale == 0.125 and el[:3].tolist() == [6.0, -1.5, 0.5]      # 7.2 saturates to 6


def test_lesson04_references_agree_with_hand_computed_values():
    import math

    import torch
    ex = EXERCISES
    uniform = torch.full((3, 256), -math.log(256.0))
    assert ex["04.bits_per_byte"].reference(uniform, torch.tensor([0, 7, 255])) == pytest.approx(8.0)
    lp = torch.log(torch.tensor([[0.5, 0.25, 0.25]]))
    assert ex["04.bits_per_byte"].reference(lp, torch.tensor([1])) == pytest.approx(2.0)     # -log2 1/4
    assert ex["04.bits_per_byte"].reference(lp, torch.tensor([1]), 4.0) == pytest.approx(0.5)
    p, q = torch.log(torch.tensor([[0.5, 0.5]])), torch.log(torch.tensor([[0.25, 0.75]]))
    kl, top1 = ex["04.kl_top1"].reference(p, q)
    assert kl == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(0.5 / 0.75))   # 0.143841
    assert top1 == 0.0                                   # the tie goes to token 0, q picks 1
    zero = torch.log(torch.tensor([[1.0, 0.0]]))
    assert ex["04.kl_top1"].reference(zero, q)[0] == pytest.approx(math.log(4))   # 1 * ln(1/.25)
    got = ex["04.outlier_channels"].reference(torch.tensor([1.0, 1.0, 1.0, 5.0, 6.0]), 5.0)
    assert got.tolist() == [4] and got.dtype == torch.int64
    w = torch.tensor([[7.0, 0.5, 1.5, 2.5, -2.5, -0.5, 3.5, 0.0]])
    assert ex["04.fake_quant_weight"].reference(w, 4).tolist() == [[7, 0, 2, 2, -2, 0, 4, 0]]
    w2 = torch.tensor([[1.0, 0.4, 0.0, 0.0, 2.0, 0.5, -0.3, 0.1]])
    got = ex["04.fake_quant_weight"].reference(w2, 2, 4)       # qmax 1: codes -1, 0, 1
    assert got.tolist() == [[1.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0]]
    block = torch.zeros(1, 20, dtype=torch.uint8)
    block[0, 0:2] = torch.tensor([0x00, 0x38])              # fp16 0x3800 = 0.5 (little-endian)
    block[0, 2:4] = torch.tensor([0x00, 0xBC])              # fp16 0xBC00 = -1.0
    block[0, 4] = 0x21                                       # weight 0: code 1, weight 16: code 2
    w = ex["04.dequantize_q4_1"].reference(block)[0]
    assert (w[0].item(), w[16].item(), w[1].item()) == (-0.5, 0.0, -1.0)


def test_error_metrics_and_layer_sensitivity_against_hand_values():
    import math

    import torch

    from course_lib import eval as ceval
    from course_lib.model import LlamaModel, ModelConfig
    m = EXERCISES["02.error_metrics"].reference(np.array([1.0, -2.0, 2.0]), np.array([1.0, -1.0, 2.0]))
    assert m["mae"] == pytest.approx(1 / 3) and m["rmse"] == pytest.approx(math.sqrt(1 / 3))
    assert m["sqnr_db"] == pytest.approx(10 * math.log10(9 / 1))          # signal 9, noise 1
    # a layer whose weights already lie on the INT3 grid (row absmax 0.75 = 3 steps of 0.25)
    # is untouched by quantizing it: KL exactly 0; a random layer is not
    torch.manual_seed(0)
    model = LlamaModel(ModelConfig(vocab_size=256, hidden_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=96)).eval()
    q = model.model.layers[0].self_attn.q_proj.weight
    on_grid = torch.randint(-3, 4, q.shape).float() * 0.25                # (64, 64)
    on_grid[:, 0] = 0.75
    with torch.no_grad():
        q.copy_(on_grid)
    ref = ceval.reference(model, torch.randint(0, 256, (65,)), window=32)
    kl = EXERCISES["04.layer_sensitivity"].reference(model, ref, [".q_proj", ".down_proj"], 3)
    assert kl[".q_proj"] == 0.0 and kl[".down_proj"] > 1e-6


def test_yours_or_library_says_which(capsys):
    from course_lib.checks import CheckResult, yours_or_library
    mine, lib = (lambda: "mine"), (lambda: "lib")
    assert yours_or_library(CheckResult("x", "passed", 3, 3), mine, lib, "thing") is mine
    assert "YOUR function" in capsys.readouterr().out
    assert yours_or_library(CheckResult("x", "not implemented"), mine, lib, "thing") is lib
    assert "library's is used" in capsys.readouterr().out


@pytest.mark.parametrize("ex_id", sorted(k for k in EXERCISES
                                         if k[:2] in ("00", "01", "02", "03", "04", "12")))
def test_first_hint_step_is_a_question_not_code(ex_id):
    steps = EXERCISES[ex_id].hints
    assert len(steps) >= 2, f"{ex_id}: give a first step to think about and a later code-level one"
    first = steps[0]
    for token in ("np.", " = ", "**", "<<", ">>", "return ", "0x7FFF", "round("):
        assert token not in first, f"{ex_id}: hint step 1 gives code away ({token!r}): {first}"
    assert "?" in first, f"{ex_id}: hint step 1 should ask the learner something"


# ---- inputs changed in place (issue 19): the harness compares every argument after the call ---

def _spoil(x) -> bool:
    """Change ``x`` in place (the first tensor, array or module weight found); True if done."""
    import torch
    if isinstance(x, torch.nn.Module):
        for p in x.parameters():
            with torch.no_grad():
                p.mul_(0.5)
            return True
        return False
    if isinstance(x, torch.Tensor) and x.numel():
        with torch.no_grad():
            if x.dtype == torch.bool:
                x.logical_not_()
            elif x.is_floating_point():
                x.add_(1.0)
            else:
                x.bitwise_xor_(1)
        return True
    if isinstance(x, np.ndarray) and x.size and x.flags.writeable:
        if x.dtype == bool:
            np.logical_not(x, out=x)
        elif x.dtype.kind in "iu":
            x ^= 1
        else:
            x += 1.0
        return True
    if isinstance(x, tuple):
        return any(_spoil(v) for v in x)
    if isinstance(x, list):
        if not any(_spoil(v) for v in x):
            x.append(None)
        return True
    if isinstance(x, dict):
        if not any(_spoil(v) for v in x.values()):
            x["spoiled"] = True                        # e.g. a config filled in with defaults
        return True
    return False


def _has_mutable(x) -> bool:
    import torch
    if isinstance(x, (torch.Tensor, np.ndarray, torch.nn.Module, list, dict)):
        return True
    if isinstance(x, tuple):
        return any(_has_mutable(v) for v in x)
    return False


MUTABLE = sorted(k for k, ex in EXERCISES.items()
                 if any(c.raises is None and _has_mutable(c.args + tuple(c.kwargs.values()))
                        for c in ex.cases()))


def test_most_exercises_take_something_that_can_be_changed_in_place():
    assert len(MUTABLE) >= 25, MUTABLE


@pytest.mark.parametrize("ex_id", MUTABLE)
def test_the_reference_that_spoils_its_input_is_rejected(ex_id):
    """Every exercise of the course: the right answer, computed, and then an input changed in
    place, fails its check with a message naming the argument."""
    ex = EXERCISES[ex_id]

    def spoils(*args, **kwargs):
        result = ex.reference(*args, **kwargs)
        _spoil(args + tuple(kwargs.values()))
        return result

    result = check(ex_id, spoils, quiet=True)
    assert result.status == "failed", f"{ex_id}: a function that changes its input passed"
    assert "changed its input `argument " in result.report, result.report


def _normalise(w):
    return w / np.abs(w).max()


NORM = Exercise(id="toy.normalise", title="scale to max 1", reference=_normalise,
                cases=lambda: [Case((np.array([1.0, -4.0, 2.0]),), label="small"),
                               Case((np.array([[0.5, 0.25]]),), label="2-D")],
                hint="divide by the largest magnitude")


@pytest.fixture
def norm(monkeypatch):
    monkeypatch.setitem(checks.EXERCISES, NORM.id, NORM)
    return NORM.id


def test_an_answer_that_divides_in_place_is_rejected_naming_the_argument(norm, capsys):
    def in_place(W):
        W /= np.abs(W).max()                  # right values, but the caller's W is gone
        return W

    result = check(norm, in_place)
    out = capsys.readouterr().out
    assert result.status == "failed" and result.passed == 0
    assert "your function changed its input `W` in place" in out and "W.copy()" in out
    assert "changed 3 of 3 values (first at index (0,): 1.0 became 0.25)" in out
    assert check(norm, lambda W: W / np.abs(W).max(), quiet=True)          # the copy passes


def test_a_config_filled_in_with_defaults_is_a_changed_input():
    """00.kv_bytes_per_token: writing the derived head_dim into the caller's config."""
    def fills_in(config, bytes_per_value=2.0):
        heads = config["num_attention_heads"]
        if config.get("head_dim") is None:
            config["head_dim"] = config["hidden_size"] // heads
        kv = config.get("num_key_value_heads") or heads
        return 2 * config["num_hidden_layers"] * kv * config["head_dim"] * bytes_per_value
    result = check("00.kv_bytes_per_token", fills_in, quiet=True)
    assert not result and "changed its input `config` in place" in result.report
    assert "copy.deepcopy(config)" in result.report


@pytest.mark.parametrize("kind", ["tensor", "list", "dict", "module", "keyword", "dtype"])
def test_every_kind_of_input_is_compared(monkeypatch, kind):
    import torch
    lin = torch.nn.Linear(3, 2)
    cases = {
        "tensor": (torch.tensor([1.0, float("nan"), 3.0]),),      # NaN == NaN: not a change
        "list": ([torch.ones(2), torch.zeros(2)],),
        "dict": ({"w": np.ones(3), "bits": 4},),
        "module": (lin,),
        "keyword": (),
        "dtype": (torch.ones(3),),
    }
    kwargs = {"x": torch.ones(2)} if kind == "keyword" else {}
    ex = Exercise(id="toy.any", title="anything", reference=lambda *a, **k: 0.0,
                  cases=lambda: [Case(cases[kind], kwargs)] * 3, hint="leave the input alone")
    monkeypatch.setitem(checks.EXERCISES, ex.id, ex)
    assert check(ex.id, lambda *a, **k: 0.0, quiet=True)           # reading is fine

    def spoil(*a, **k):
        if kind == "tensor":
            a[0][0] = 7.0
        elif kind == "list":
            a[0].append(torch.ones(1))
        elif kind == "dict":
            a[0]["w"][2] = 0.0
        elif kind == "module":
            with torch.no_grad():
                a[0].bias.zero_()
        elif kind == "keyword":
            k["x"].mul_(3)
        else:
            a[0].data = a[0].data.double()
        return 0.0

    result = check(ex.id, spoil, quiet=True)
    words = {"tensor": "changed 1 of 3 values", "list": "length went from 2 to 3",
             "dict": "['w'] changed 1 of 3", "module": "'bias' changed",
             "keyword": "`x` in place", "dtype": "dtype from torch.float32 to torch.float64"}
    assert not result and words[kind] in result.report, result.report


def test_an_exercise_that_asks_for_in_place_work_can_say_so(monkeypatch):
    def scale_(w, factor):
        w *= factor
        return w
    ex = Exercise(id="toy.scale_", title="scale in place", reference=scale_,
                  cases=lambda: [Case((np.ones(3), 2.0)), Case((np.arange(3.0), 0.5)),
                                 Case((np.zeros(2), 3.0))],
                  hint="multiply in place", mutates=("w",))
    monkeypatch.setitem(checks.EXERCISES, ex.id, ex)
    assert check(ex.id, scale_, quiet=True)
    def other_name(arr, f):                      # the learner's names do not matter
        arr *= f
        return arr
    assert check(ex.id, other_name, quiet=True)
    strict = Exercise(**{**ex.__dict__, "id": "toy.scale_strict", "mutates": ()})
    monkeypatch.setitem(checks.EXERCISES, strict.id, strict)
    assert "changed its input `w` in place" in check(strict.id, scale_, quiet=True).report


def test_a_refusal_that_spoils_the_input_first_is_caught(monkeypatch):
    ex = Exercise(id="toy.refuse", title="refuse negatives", reference=_double,
                  cases=lambda: [Case((np.ones(2),)), Case((np.arange(3.0),)),
                                 Case((np.array([-1.0, 2.0]),), raises=ValueError)],
                  hint="refuse negatives")
    monkeypatch.setitem(checks.EXERCISES, ex.id, ex)

    def clips_then_refuses(x):
        if (x < 0).any():
            x[x < 0] = 0.0                       # the caller's array is changed, then refused
            raise ValueError("negative values")
        return 2 * x
    result = check(ex.id, clips_then_refuses, quiet=True)
    assert not result and result.passed == 2 and "`x` in place" in result.report


def test_no_exercise_of_the_course_asks_for_in_place_work():
    """If one ever does, it says so with ``mutates`` and the lesson's text says so too."""
    assert {k: ex.mutates for k, ex in EXERCISES.items() if ex.mutates} == {}


# ---- kinds of wrong answers lessons 00-04's checkers let through before (issue 19) ----------

@pytest.mark.parametrize("ex_id, wrong, case_label", [
    ("01.float_values", "_wrong_values_standard_bias", "bias 0, not its usual 1"),
    ("00.kv_bytes_per_token", "_kv_head_dim_key_present", "head_dim present but null"),
    ("00.decode_floor_ms", "_floor_zero_bytes", "0 bytes of weights"),
    ("02.zero_point", "_wrong_zp_equal_is_empty", "x_min == x_max = 0.5"),
    ("03.asym_groupwise", "_wrong_asym_equal_is_empty", "constant groups"),
    ("02.error_metrics", "_wrong_metrics_int_dtype", "uint8 codes"),
])
def test_each_kind_that_slipped_through_is_now_caught_by_its_own_case(ex_id, wrong, case_label):
    """The wrong answer passes every case that existed before and fails on the case added for
    its kind; the reference passes that case."""
    ex = EXERCISES[ex_id]
    fn = next(w for w in ex.wrong if w.__name__ == wrong)
    result = check(ex_id, fn, quiet=True)
    assert result.status == "failed" and case_label in result.report, result.report
    failed_at = next(i for i, c in enumerate(ex.cases()) if case_label in c.label)
    assert result.passed == failed_at, f"{wrong} should fail first on the new case"
    assert check(ex_id, ex.reference, quiet=True)
