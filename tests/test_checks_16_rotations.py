"""Checkers of lesson 16 (rotations): the reference passes, every wrong answer is rejected by the
case built to catch it, the other right readings pass, and the hints teach in steps."""
import pytest
import torch

from course_lib import checks, hadamard
from course_lib.checks import check, lesson16

from checker_cases import rejected_on

checks.load_all()
IDS = ["16.hadamard_12k", "16.fwht", "16.fold_rotate", "16.cayley"]


@pytest.fixture(autouse=True)
def learner_mode(monkeypatch):
    monkeypatch.setenv("COURSE_CHECKS", "learner")


@pytest.mark.parametrize("ex_id, wrong, label", [
    ("16.hadamard_12k", lesson16._wrong_h12_kron_reversed, "the 12 OUTSIDE"),
    ("16.hadamard_12k", lesson16._wrong_h12_normalised, "n = 8"),
    ("16.hadamard_12k", lesson16._wrong_h12_sign, "n = 8"),
    ("16.hadamard_12k", lesson16._wrong_h12_transposed_paley, "paley12() alone"),
    ("16.hadamard_12k", lesson16._wrong_h12_no_refusal, "n = 40"),
    ("16.fwht", lesson16._wrong_fwht_no_norm, "n = 2"),
    ("16.fwht", lesson16._wrong_fwht_by_n, "n = 2"),
    ("16.fwht", lesson16._wrong_fwht_h_fixed, "three rounds"),
    ("16.fwht", lesson16._wrong_fwht_float32, "float64 in"),
    ("16.fwht", lesson16._wrong_fwht_first_dim, "one spike per row"),
    ("16.fold_rotate", lesson16._wrong_fr_rows, "COLUMNS"),
    ("16.fold_rotate", lesson16._wrong_fr_qt, "Q itself"),
    ("16.fold_rotate", lesson16._wrong_fr_no_g, "diag(g)"),
    ("16.fold_rotate", lesson16._wrong_fr_rotate_then_scale, "q_proj-like"),
    ("16.fold_rotate", lesson16._wrong_fr_divide, "diag(g)"),
    ("16.cayley", lesson16._wrong_cayley_inverse_other, "2 x 2"),
    ("16.cayley", lesson16._wrong_cayley_exp, "2 x 2"),
    ("16.cayley", lesson16._wrong_cayley_no_inverse, "2 x 2"),
    ("16.cayley", lesson16._wrong_cayley_no_check, "not skew-symmetric"),
    ("16.cayley", lesson16._wrong_cayley_float32, "float64"),
])
def test_each_wrong_answer_is_rejected_by_its_case(ex_id, wrong, label):
    rejected_on(ex_id, wrong, label)


@pytest.mark.parametrize("ex_id", IDS)
def test_five_wrong_answers_and_the_reference_passes(ex_id):
    ex = checks.EXERCISES[ex_id]
    assert len(ex.wrong) >= 5 and check(ex_id, ex.reference, quiet=True)
    for right in ex.right:
        assert check(ex_id, right, quiet=True), right.__name__


@pytest.mark.parametrize("ex_id", IDS)
def test_hints_come_in_steps_and_the_first_asks_without_code(ex_id):
    steps = checks.EXERCISES[ex_id].hints
    assert len(steps) >= 3 and "?" in steps[0]
    for token in ("torch.", "return ", " = ", "@"):
        assert token not in steps[0], (ex_id, token)


def test_an_unsolved_exercise_is_not_yet_implemented():
    def stub(*args):
        raise NotImplementedError("exercise: write this part")
    for ex_id in IDS:
        assert check(ex_id, stub, quiet=True).status == "not implemented"


def test_the_references_are_what_the_lesson_uses():
    H = lesson16.hadamard_12k(576)
    assert torch.equal(H, hadamard.hadamard(576))                     # 12 x 12 x 4, same order
    assert torch.equal(lesson16.hadamard_12k(1536), hadamard.hadamard(1536))
    assert torch.equal(H @ H.T, 576 * torch.eye(576))
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(lesson16.fwht_pow2(x), x @ hadamard.sylvester(64) / 8, atol=1e-5)
    Q = lesson16.cayley_checked(torch.tensor([[0.0, -0.5], [0.5, 0.0]]))
    assert torch.allclose(Q, torch.tensor([[0.6, -0.8], [0.8, 0.6]]), atol=1e-6)
