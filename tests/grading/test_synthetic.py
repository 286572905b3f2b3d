"""The synthetic class of `kvlab bench grade`: each kind of submission is built from the lab as
promised and carries the score it should get (the bench grades it; test_judge grades cheats)."""

import pytest

from kvlab.grading.judge import CHECK_CELL
from kvlab.grading.synthetic import CHEATS, LABS, VARIANTS, WRONG, Expected, compare, variant


@pytest.mark.parametrize("lab", LABS)
def test_every_kind_of_submission_is_built_with_its_score(lab):
    full = variant(lab, "solution")[1]
    assert all(points == total > 0 for points, total in full.values())
    for kind in VARIANTS:
        nb, points = variant(lab, kind)
        assert set(points) == set(full), kind
        if kind in CHEATS or kind == "unsolved":
            assert all(p == 0 for p, _ in points.values()), kind  # built on the unsolved lab
        if kind == "tamper_checks":
            assert not any(CHECK_CELL.match(c.source) for c in nb.cells)
    first, *_ = full
    assert variant(lab, "half")[1][first] == full[first]
    *_, last = full
    assert variant(lab, "wrong")[1][last][0] == WRONG


def test_compare_names_every_score_that_is_not_as_it_should_be(tmp_path):
    expected = [Expected("s", "00", tmp_path, {"00.a": (5, 5), "00.b": (WRONG, 4)})]
    right = [
        {
            "student": "s",
            "lab": "00",
            "exercises": [
                {"id": "00.a", "passed": 5, "total": 5},
                {"id": "00.b", "passed": 1, "total": 4},
            ],
        }
    ]
    assert compare(expected, right) == []
    cheated = [
        {
            "student": "s",
            "lab": "00",
            "exercises": [
                {"id": "00.a", "passed": 5, "total": 5},
                {"id": "00.b", "passed": 4, "total": 4},
            ],
        }
    ]
    assert compare(expected, cheated) == ["s/00 00.b: (4, 4) for fewer than all of 4"]
    assert compare(expected, []) == ["s/00: not graded"]
    with pytest.raises(ValueError, match="kind must be one of"):
        variant("00", "bribe")
