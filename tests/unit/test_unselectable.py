"""tests/unselectable.py: what the unit tier may leave uncollected, and what it may not."""

from __future__ import annotations

import pytest

from tests.unselectable import module_marks, selects_none

UNIT = "not slow and not slurm and not docker"


@pytest.mark.parametrize(
    ("markexpr", "marks", "none"),
    [
        (UNIT, {"slow"}, True),
        (UNIT, {"slurm"}, True),
        (UNIT, {"docker", "slow"}, True),
        ("slow", {"slow"}, False),
        ("slurm and not docker", {"slurm"}, False),
        ("slurm and not docker", {"slow"}, False),  # a slow test may carry slurm too
        ("hypothesis and not slow", {"slow"}, True),
        ("not slow or hypothesis", {"slow"}, False),  # a slow hypothesis test matches
        ("release", {"slurm"}, False),  # slurm tests may carry release too
        ("", {"slow"}, False),  # no -m: everything is collected
        (UNIT, set(), False),  # no mark known: collected
        ("not (", {"slow"}, False),  # a bad expression: pytest says so itself
    ],
)
def test_a_file_is_left_out_only_when_no_test_in_it_can_match(
    markexpr: str, marks: set[str], none: bool
) -> None:
    assert selects_none(markexpr, marks) is none


def test_only_a_plain_module_level_pytestmark_counts() -> None:
    assert module_marks("import x\npytestmark = pytest.mark.slow\n") == {"slow"}
    assert module_marks("pytestmark = [pytest.mark.docker, pytest.mark.slow]\n") == {
        "docker",
        "slow",
    }
    assert module_marks("pytestmark = pytest.mark.slow  # why\n") == {"slow"}
    # a mark with arguments is no tier; an indented one is no module mark
    assert module_marks("pytestmark = pytest.mark.skipif(a, reason='b')\n") == set()
    assert module_marks("def f():\n    pytestmark = pytest.mark.slow\n") == set()
    assert module_marks("x = 1\n") == set()
    # a line of a string is no statement (tests/unit/test_tier_guard.py writes such files)
    assert module_marks('FILES = """\npytestmark = pytest.mark.slow\n"""\n') == set()
