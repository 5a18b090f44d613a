"""course_lib.compare: agree (a computed figure beside its source's), sqnr_db, cmp refusals."""
import math

import numpy as np
import pytest

from course_lib.compare import agree, cmp, sqnr_db


def test_agree_prints_both_numbers_and_returns_the_computed_one(capsys):
    assert agree(141.2, 141, "70B in BF16", unit="GB") == 141.2
    assert capsys.readouterr().out.strip() == "70B in BF16: 141.2 GB, source 141"
    agree(0.0020, 0.002, "MAE", abs_tol=5e-5)


def test_agree_raises_with_both_numbers_when_they_differ():
    with pytest.raises(AssertionError, match=r"70B: 150 GB, source 141: they differ by 9"):
        agree(150.0, 141, "70B", unit="GB")
    with pytest.raises(AssertionError, match="differ"):
        agree(1.03, 1.0, "x", rel=0.01)          # 3% off with a 1% tolerance


@pytest.mark.parametrize("args, kwargs, words", [
    ((math.nan, 1.0, "x"), {}, "computed must be finite"),
    ((1.0, math.inf, "x"), {}, "source must be finite"),
    (("141", 141, "x"), {}, "computed must be a number"),
    ((1.0, 1.0, "x"), {"rel": -0.1}, "tolerances must be >= 0"),
    ((True, 1, "x"), {}, "computed must be a number"),
])
def test_agree_refuses_bad_input(args, kwargs, words):
    with pytest.raises(ValueError, match=words):
        agree(*args, **kwargs)


def test_sqnr_db_against_hand_values():
    x = np.array([3.0, 4.0])                        # signal power 25
    assert sqnr_db(x, x + np.array([0.5, 0.0])) == pytest.approx(10 * math.log10(25 / 0.25))
    assert sqnr_db(x, x) == math.inf
    with pytest.raises(ValueError, match="shape"):
        sqnr_db(np.zeros(8), np.zeros((8, 1)))


def test_cmp_names_an_expected_nan_and_signed_zero():
    r = cmp("x", np.array([np.nan, 1.0]), np.array([480.0, 1.0]))
    assert not r and "expected NaN" in r.problem and "480" in r.problem
    assert cmp("z", np.array([-0.0]), np.array([0.0]))
    r = cmp("z", np.array([-0.0]), np.array([0.0]), signed_zero=True)
    assert not r and "sign of zero" in r.problem
