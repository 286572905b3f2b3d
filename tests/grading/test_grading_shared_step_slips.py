"""What Lab 06's and Lab 09's step checks share: the slips of the queue and of making room, named
in Lab 09's budgeted step as in Lab 06's, and the scripted days written as a report shows them."""

import learner_code
import pytest
from learner_code import assert_only_hint, hints_of
from test_grading_lab09 import BUDGET_STEP, HEADER

from kvlab.grading import run_checks, step_hints
from kvlab.grading.scheduler_days import Day, paged, party


@pytest.mark.parametrize(
    "edit, hint",
    [
        (
            "scheduler.waiting[0].arrival <= now => scheduler.waiting[0].arrival < now",
            step_hints.ARRIVAL_STRICT,
        ),
        ("            out.preempted.append(victim)\n => ", step_hints.NOT_NOTED),
        ("len(scheduler.running) >= => len(scheduler.running) >", step_hints.MAX_BATCH_OFF),
        ("scheduler.max_batch is not None and => False and", step_hints.MAX_BATCH),
    ],
    ids=["strict arrival", "preempted not noted", "max_batch off by one", "no max_batch"],
)
def test_the_shared_slips_are_named_in_the_budgeted_step_too(edit, hint):
    fn = learner_code.learner(BUDGET_STEP, "budget_step", edit, header=HEADER)
    assert_only_hint(run_checks("09.budget_step", fn), hint)


def test_a_days_guests_read_as_the_report_writes_them():
    assert party("ann 6+3@0, dan 3+4@3.5") == (("ann", 6, 3, 0.0), ("dan", 3, 4, 3.5))
    day = Day("d", paged(16, 4), "ann 6+3@0, dan 3+4@3.5")
    assert day.describe().endswith("guests (prompt+answer@arrival): ann 6+3@0, dan 3+4@3.5")
    with pytest.raises(ValueError, match="guests must read"):
        party("ann 6+3@0, ben 5@1")


def test_the_max_batch_off_by_one_hint_stays_quiet_for_the_right_comparison():
    fn = learner_code.learner(BUDGET_STEP, "budget_step", header=HEADER)
    result = run_checks("09.budget_step", fn)
    assert result.ok and result.passed == result.total, result.report()
    assert not hints_of(result)
