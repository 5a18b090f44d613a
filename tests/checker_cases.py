"""Shared by the checker tests (tests/test_checks_*.py): a wrong answer must fail its exercise,
and the first failing case must be the one built to catch it."""
from course_lib.checks import check


def rejected_on(ex_id: str, wrong, label_part: str) -> None:
    """``wrong`` fails ``ex_id``, and the report names the case whose label holds ``label_part``."""
    result = check(ex_id, wrong, quiet=True)
    assert result.status == "failed", f"{wrong.__name__} passed {ex_id}"
    assert label_part in result.report, result.report[:600]
