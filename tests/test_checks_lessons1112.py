"""Checkers of lessons 11 and 12 (issue 19): at least three checked exercises each, and the
held-out kinds of wrong answer rejected: in-place mutation, a result in the wrong dtype,
NaN / zero / negative / percent inputs that must be refused, exact ties, the memory boundary
of the decision rule, and answers that ignore the batch or the context."""
import kernels  # noqa: F401  (sets TRITON_INTERPRET before triton is imported)
import pytest
import torch

from course_lib import checks, guide, kv
from course_lib.checks import check
from course_lib.checks import lesson11 as c11
from course_lib.checks import lesson12 as c12

EXERCISES = checks.load_all()


@pytest.fixture(autouse=True)
def learner_mode(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_CHECKS", "learner")
    monkeypatch.setenv("COURSE_PROGRESS_FILE", str(tmp_path / "progress.json"))


def _rejected(ex_id, fn):
    return check(ex_id, fn, quiet=True).status == "failed"


@pytest.mark.parametrize("lesson", ["11", "12"])
def test_three_or_more_checked_exercises(lesson):
    ids = [k for k in EXERCISES if k.startswith(f"{lesson}.")]
    assert len(ids) >= 3, ids
    for ex_id in ids:
        assert check(ex_id, EXERCISES[ex_id].reference, quiet=True)
        assert len(EXERCISES[ex_id].wrong) >= 4, ex_id


@pytest.mark.parametrize("ex_id, wrong, kind", [
    ("11.keys_per_channel", c11._wrong_keys_half_up, "ties rounded half up"),
    ("11.keys_per_channel", c11._wrong_keys_input_dtype, "result in the input's dtype"),
    ("11.keys_per_channel", c11._wrong_keys_nan_through, "NaN not refused"),
    ("11.kivi_bytes", c11._wrong_bytes_no_checks, "negative / fractional tokens accepted"),
    ("11.conversations", c11._wrong_conv_percent_ok, "a percent taken for a fraction"),
    ("11.conversations", c11._wrong_conv_half_up, "2.5 conversations rounded up"),
    ("11.online_softmax_step", c11._wrong_step_nan_on_empty, "NaN from an all -inf block"),
    ("11.online_softmax_step", c11._wrong_step_input_dtype, "result in the input's dtype"),
    ("11.online_softmax_step", c11._wrong_step_no_max, "overflow without the maximum"),
    ("11.online_softmax_step", c11._wrong_step_no_acc_rescale, "accumulator not rescaled"),
    ("11.combine_splits", c11._wrong_combine_nan_when_empty, "no slice saw a token: NaN"),
    ("11.combine_splits", c11._wrong_combine_dtype, "result in the input's dtype"),
    ("11.combine_splits", c11._wrong_combine_mean, "slices averaged, not weighted"),
    ("12.first_divergence", c12._wrong_div_floats, "float scores accepted as ids"),
    ("12.choose_scheme", c12._wrong_scheme_no_kv_room, "the batch's cache left out of the room"),
    ("12.choose_scheme", c12._wrong_scheme_no_workspace, "the workspace left out"),
    ("12.choose_scheme", c12._wrong_scheme_kv_strict, "> where >= is asked (a tie)"),
    ("12.choose_scheme", c12._wrong_scheme_kv_per_user, "one user's cache, not the batch's"),
    ("12.choose_scheme", c12._wrong_scheme_decode_bytes, "decode by bytes, against the measurement"),
    ("12.choose_scheme", c12._wrong_scheme_no_input_checks, "batch 0 / fractional context accepted"),
    ("12.mistakes_quiz", c12._wrong_quiz_all_b, "the same letter everywhere"),
    ("12.mistakes_quiz", c12._wrong_quiz_upper, "'C' for 'c'"),
])
def test_held_out_kinds_are_rejected(ex_id, wrong, kind):
    assert _rejected(ex_id, wrong), f"{ex_id}: {kind} passed"


def test_the_rule_has_cases_on_both_sides_of_the_memory_boundary():
    cases = c12._scheme_cases()
    inside = c12._edge_params("H100", 1, 4096, -1)
    outside = c12._edge_params("H100", 1, 4096, +1)
    assert 0.995 < inside / outside < 1
    assert guide.choose_scheme("memory", "H100", inside)[0] == "fp8_w8a8"
    assert guide.choose_scheme("memory", "H100", outside)[0] == "w4a16"
    labels = " ".join(c.label for c in cases)
    assert "just inside" in labels and "just outside" in labels and "a tie" in labels
    # the tie: the batch's BF16 cache is exactly KV_FP8_SHARE of the BF16 weights
    tie = next(c for c in cases if c.label.startswith("a tie"))
    _, _, params, batch, context = tie.args
    assert batch * context * guide.kv_bytes_per_token_for(params) == guide.KV_FP8_SHARE * 2 * params


def test_quiz_answers_are_not_all_one_letter():
    letters = [guide.quiz_answer(q) for q in guide.QUIZ]
    assert len(set(letters)) == 3 and max(map(letters.count, set(letters))) <= 2


@pytest.mark.parametrize("ex_id", sorted(k for k in EXERCISES if k.startswith("11.")))
def test_lesson11_first_hint_step_is_a_question_not_code(ex_id):
    first = EXERCISES[ex_id].hints[0]
    assert len(EXERCISES[ex_id].hints) >= 2 and "?" in first
    for token in (" = ", "**", "return ", "torch.", "round("):
        assert token not in first, f"{ex_id}: hint step 1 gives code away ({token!r})"


def _harness_catches_mutation() -> bool:
    def mutating_but_right(m, l, acc, s, v):
        out = kv.online_softmax_step(m, l, acc, s, v)
        acc.zero_()                                        # the caller's state, changed
        return out
    return _rejected("11.online_softmax_step", mutating_but_right)


@pytest.mark.xfail(not _harness_catches_mutation(), strict=True,
                   reason="needs the harness's in-place mutation check (branch 'harness')")
def test_in_place_mutation_is_rejected():
    assert _rejected("11.online_softmax_step", c11._wrong_step_in_place)

    def keys_in_place(k, bits, group):                     # right values, input overwritten
        out = c11.keys_per_channel_reference(k, bits, group)
        k.copy_(out)
        return out
    assert _rejected("11.keys_per_channel", keys_in_place)

    def split_in_place(ms, ls, accs):
        ms[ms == float("-inf")] = 0.0                      # "fixes" empty slices in place
        return kv.combine_splits(ms, ls, accs)
    assert _rejected("11.combine_splits", split_in_place)
