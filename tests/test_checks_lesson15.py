"""Checkers of lesson 15 (quantization-aware training): each wrong answer is rejected by the
case built to catch it, and the probes see what a plain return value would hide (the
gradient of an autograd Function, the weights after a training step)."""
import pytest
import torch

from course_lib import checks, qat
from course_lib.checks import check, lesson15

from checker_cases import rejected_on

checks.load_all()


@pytest.fixture(autouse=True)
def learner_mode(monkeypatch):
    monkeypatch.setenv("COURSE_CHECKS", "learner")


W = lesson15.with_gradient
S = lesson15.after_one_step


@pytest.mark.parametrize("ex_id, wrong, label", [
    ("15.ste", W(lesson15._wrong_ste_no_clip_mask), "fall outside the range"),
    ("15.ste", W(lesson15._wrong_ste_detached), "nothing clipped"),
    ("15.ste", W(lesson15._wrong_ste_strict_edges), "exactly on the range's edge"),
    ("15.ste", W(lesson15._wrong_ste_no_clamp), "fall outside the range"),
    ("15.lsq_step_grad", lesson15._wrong_lsq_no_scale, "LSQ's scale"),
    ("15.lsq_step_grad", lesson15._wrong_lsq_zero_outside, "many weights clipped"),
    ("15.qat_step", S(lesson15._wrong_step_no_clip), "must be clipped to 1"),
    ("15.qat_step", S(lesson15._wrong_step_ignores_teacher), "distilling the float model"),
    ("15.qat_step", S(lesson15._wrong_step_kl_reversed), "distilling the float model"),
])
def test_each_wrong_answer_is_rejected_by_its_case(ex_id, wrong, label):
    rejected_on(ex_id, wrong, label)


@pytest.mark.parametrize("ex_id", ["15.ste", "15.lsq_step_grad", "15.qat_step"])
def test_three_or_more_wrong_answers_and_the_reference_passes(ex_id):
    ex = checks.EXERCISES[ex_id]
    assert len(ex.wrong) >= 3 and check(ex_id, ex.reference, quiet=True)


def test_the_probe_reads_the_gradient_a_plain_value_would_hide():
    w = torch.tensor([0.4, 2.0, -9.0])
    out, grad = W(qat.RoundSTE.apply)(w, torch.tensor(1.0), 3, torch.ones(3))
    assert torch.equal(out, torch.tensor([0.0, 2.0, -3.0]))
    assert torch.equal(grad, torch.tensor([1.0, 1.0, 0.0]))
    out2, grad2 = W(lesson15._wrong_ste_detached)(w, torch.tensor(1.0), 3, torch.ones(3))
    assert torch.equal(out2, out) and torch.equal(grad2, torch.zeros(3))   # same value, no gradient


def test_the_clip_case_really_has_a_gradient_norm_above_one():
    model = lesson15._tiny(4)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(10.0)
    q = qat.prepare_qat(model, 4, 32)
    x, y = qat.random_windows(torch.randint(0, 16, (600,), generator=torch.Generator().manual_seed(4)),
                              2, 16, torch.Generator().manual_seed(5))
    lesson15._loss(q(x), y, None).backward()
    norm = torch.nn.utils.clip_grad_norm_([p for p in q.parameters() if p.requires_grad], 1e9)
    assert float(norm) > 2.0


def test_the_lsq_reference_is_the_hand_computed_value():
    # w/s = 0.5, -0.5, 1.5, 2.0 at qmax 1: round -> 0, -0, 2 -> clipped 1, 2 -> clipped
    g = lesson15.lsq_step_grad(torch.tensor([0.25, -0.25, 0.75, 1.0]), torch.tensor(0.5), 1,
                               torch.ones(4), 1.0)
    assert float(g) == pytest.approx((0 - 0.5) + (0 + 0.5) + 1 + 1)
