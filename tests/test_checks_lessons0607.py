"""Checkers of lessons 06 (GPTQ) and 07 (AWQ) reject the held-out kinds of wrong answers issue 19
lists: an input changed in place, a result in the input's dtype where float32 is asked, NaN /
zero / negative inputs let through, half-up rounding where ties go to the even level, a clamp to
-8..7 where -7..7 is specified (GPTQ's corrections push a column past it), an all-zero row, and
the best alpha at the grid's end or tied."""
import pytest
import torch

from course_lib import checks
from course_lib.checks import Exercise, check, lesson06, lesson07

from checker_cases import rejected_on

checks.load_all()
HARNESS_SEES_MUTATION = "mutates" in getattr(Exercise, "__dataclass_fields__", {})


@pytest.fixture(autouse=True)
def learner_mode(monkeypatch):
    monkeypatch.setenv("COURSE_CHECKS", "learner")


@pytest.mark.parametrize("ex_id, wrong, label", [
    ("06.hessian", lesson06._wrong_h_input_dtype, "bfloat16 inputs"),
    ("06.hessian", lesson06._wrong_h_nan_ok, "a NaN in the inputs"),
    ("06.dampen", lesson06._wrong_damp_nan_ok, "damp NaN"),
    ("06.gptq_loop", lesson06._wrong_loop_half_up, "ties round half to even"),
    ("06.gptq_loop", lesson06._wrong_loop_zero_scale, "all-zero row"),
    ("06.gptq_loop", lesson06._wrong_loop_clamp8, "push a later column past 7 steps"),
    ("07.scales", lesson07._wrong_sc_no_refusal, "NaN magnitude"),
    ("07.fold", lesson07._wrong_fold_no_refusal, "zero scale"),
    ("07.best_alpha", lesson07._wrong_ba_ties_last, "every alpha ties"),
    ("07.best_alpha", lesson07._wrong_ba_inclusive, "gate and up"),
    ("07.best_alpha", lesson07._wrong_ba_per_layer, "scored on the MLP's output"),
])
def test_each_held_out_kind_is_rejected_by_its_case(ex_id, wrong, label):
    rejected_on(ex_id, wrong, label)


@pytest.mark.skipif(not HARNESS_SEES_MUTATION,
                    reason="the shared harness's in-place check (branch harness) is not merged")
@pytest.mark.parametrize("ex_id, wrong", [
    ("06.dampen", lesson06._wrong_damp_in_place),
    ("06.gptq_loop", lesson06._wrong_loop_in_place),
    ("07.fold", lesson07._wrong_fold_in_place),
])
def test_an_answer_that_changes_its_input_is_rejected(ex_id, wrong):
    result = check(ex_id, wrong, quiet=True)
    assert result.status == "failed" and "in place" in result.report


def test_the_clamp_case_really_pushes_a_column_past_the_range():
    case = [c for c in lesson06._loop_cases() if "past 7 steps" in c.label][0]
    W, U, bits, gs = case.args
    unclamped = lesson06._loop(W, U, bits, gs, lo=-1000)[0]
    assert int(unclamped.min()) < -7 or int(unclamped.max()) > 7


def test_the_end_and_tie_cases_hold_what_they_say():
    cases = {c.label: c for c in lesson07._ba_cases()}
    end = [c for label, c in cases.items() if "grid's last" in label][0]
    tie = [c for label, c in cases.items() if "every alpha ties" in label][0]
    assert lesson07.best_alpha(*end.args) == 0.9
    assert lesson07.best_alpha(*tie.args) == 0.0
    assert lesson07._wrong_ba_ties_last(*tie.args) > 0
    for c in cases.values():
        if c.raises is None:
            assert len(c.args[0]) >= 1 and all(isinstance(W, torch.Tensor) for W in c.args[0])


@pytest.mark.parametrize("ex_id", ["06.hessian", "06.dampen", "06.gptq_loop", "07.scales",
                                   "07.fold", "07.best_alpha"])
def test_three_or_more_wrong_answers_and_the_reference_passes(ex_id):
    ex = checks.EXERCISES[ex_id]
    assert len(ex.wrong) >= 3 and check(ex_id, ex.reference, quiet=True)
