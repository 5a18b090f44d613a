"""The two learner tests' findings that live in checker code (issue 39): each is a case (or a
reading) the checker now holds, shown with the answer that exposed it."""
import numpy as np
import pytest
import torch

from course_lib import checks, guide, kquants
from course_lib.checks import check, lesson05, lesson11, lesson12, lesson14, lesson15

from checker_cases import rejected_on

EXERCISES = checks.load_all()


@pytest.fixture(autouse=True)
def learner_mode(monkeypatch):
    monkeypatch.setenv("COURSE_CHECKS", "learner")


# ---- 14.pack_scales: "whole numbers" means whole values, 9.0 included -------------------------

def test_pack_scales_takes_a_float_array_of_whole_values():
    sc, m = np.linspace(0, 63, 8), np.zeros(8, np.float32)
    ref = EXERCISES["14.pack_scales"].reference
    assert np.array_equal(ref(sc, m), kquants.pack_scales_k4(sc.astype(int), m.astype(int)))
    rejected_on("14.pack_scales", lesson14._pack_integers_only, "float arrays of whole numbers")
    with pytest.raises(ValueError, match="whole numbers"):
        ref(np.array([0.0, 9.0, 18.0, 27.5, 36.0, 45.0, 54.0, 63.0]), m)


# ---- 05.mixed_int8_matmul: the "16-bit product" may be computed in 16 bits -------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_mixed_matmul_accepts_a_16_bit_outlier_product(dtype):
    assert check("05.mixed_int8_matmul", lesson05._mixed_16bit(dtype), quiet=True)


def test_the_16_bit_slack_does_not_hide_a_wrong_int8_side():
    """x's scale taken over every column: caught on the case whose outlier is huge and whose
    weights are small (the 16-bit part is tiny there, so its slack is too)."""
    ex = EXERCISES["05.mixed_int8_matmul"]
    case = next(c for c in ex.cases() if "400" in c.label)
    expected = ex.reference(*case.args)
    err = (lesson05._wrong_mixed_scale_all(*case.args) - expected).abs().max()
    assert float(err) > 20 * float(lesson05._slack_16bit(*case.args).max())
    result = check(ex.id, lesson05._wrong_mixed_scale_all, quiet=True)
    assert not result


# ---- 12.choose_scheme: np.int64 is a whole number ------------------------------------------

def test_choose_scheme_takes_numpy_integers():
    ref = EXERCISES["12.choose_scheme"].reference
    assert ref("decode", "H100", 8.03e9, np.int64(64), np.int64(4096)) == \
        ref("decode", "H100", 8.03e9, 64, 4096)
    rejected_on("12.choose_scheme", lesson12._wrong_scheme_python_int_only, "NumPy integers")
    with pytest.raises(ValueError):
        ref("decode", "H100", 8.03e9, True, 4096)            # a bool is still refused
    assert guide.choose_scheme("decode", "H100", 8.03e9, 64, 4096)


# ---- 11: "computed in float32" is what the task and the checker say --------------------------

@pytest.mark.parametrize("ex_id, wrong", [
    ("11.online_softmax_step", lesson11._wrong_step_cast_after),
    ("11.combine_splits", lesson11._wrong_combine_cast_after),
])
def test_a_bfloat16_computation_cast_at_the_end_fails_with_a_float32_hint(ex_id, wrong):
    result = check(ex_id, wrong, quiet=True)
    assert not result and "bfloat16" in result.report
    assert "computes in float32" in result.report and "too late" in result.report


# ---- 10.floor_speedup: the refusals say ValueError -------------------------------------------

def test_floor_speedup_says_a_value_error_is_expected():
    from course_lib import bench

    def no_checks(M, N, K, weight_bits, group_size=None, bandwidth_gbps=3350.0,
                  base_tflops=989.0, fmt_tflops=None):
        return bench.floor_speedup(M, N, K, weight_bits, group_size, abs(bandwidth_gbps),
                                   base_tflops, fmt_tflops)
    rep = check("10.floor_speedup", no_checks, quiet=True).report
    assert "a negative bandwidth: raise ValueError" in rep
    assert "expected your function to raise ValueError for this input, but it returned" in rep
    labels = [checks.case_label(c) for c in EXERCISES["10.floor_speedup"].cases() if c.raises]
    assert labels and all("raise ValueError" in label for label in labels)


def test_every_refusal_case_of_the_course_names_its_exception():
    for ex in EXERCISES.values():
        for c in ex.cases():
            if c.raises is not None:
                assert c.raises.__name__ in checks.case_label(c), (ex.id, c.label)


# ---- a tensor where a Python float is asked --------------------------------------------------

@pytest.mark.parametrize("ex_id", ["01.decode_e4m3", "01.round_e4m3", "02.error_metrics",
                                   "07.best_alpha"])
def test_a_tensor_where_the_task_asks_a_python_float_is_refused(ex_id):
    ex = EXERCISES[ex_id]

    def as_tensor(v):
        if isinstance(v, dict):
            return {k: as_tensor(x) for k, x in v.items()}
        return torch.tensor(v, dtype=torch.float64) if isinstance(v, float) else v

    def tensor_answer(*a, **k):
        return as_tensor(ex.reference(*a, **k))
    result = check(ex_id, tensor_answer, quiet=True)
    assert not result and "expected a Python float, got Tensor" in result.report


def test_qat_step_refuses_the_loss_as_a_tensor():
    rejected_on("15.qat_step", lesson15.after_one_step(lesson15._wrong_step_tensor_loss),
                "cross-entropy on the next tokens")
    rep = check("15.qat_step", lesson15.after_one_step(lesson15._wrong_step_tensor_loss),
                quiet=True).report
    assert "expected a Python float, got Tensor" in rep


def test_qat_step_without_check_loss_trains_on_a_nan_and_is_refused():
    rejected_on("15.qat_step", lesson15.after_one_step(lesson15._wrong_step_no_check_loss),
                "qat.check_loss(loss, step) must stop the step")
