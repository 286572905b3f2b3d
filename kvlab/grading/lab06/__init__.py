"""Checks for Lab 06: preemption and one scheduler step, judged against kvlab's Scheduler.

:mod:`.preempt` and :mod:`.step` are the two exercises' checks, :mod:`.days` the days they serve,
:mod:`.references` the usual slips (kvlab's Scheduler with one hook changed), :mod:`.views` the
hints of errors whose message names the mistake, :mod:`.hints` the hints. The lockstep, the
views of a scheduler and the Day are shared with Lab 09 (:mod:`kvlab.grading.lockstep`,
:mod:`kvlab.grading.scheduler_views`, :mod:`kvlab.grading.scheduler_days`).
"""

from kvlab.grading.expect import CheckFailed
from kvlab.grading.lab06 import preempt, step
from kvlab.grading.lab06.days import DAY, DAY_SETUP, DAY_TEXT, DAYS, Day
from kvlab.grading.lab06.hints import *  # noqa: F403 (the hints, by name, for the tests)
from kvlab.grading.lab06.preempt import judge_preempt, preempt_ex
from kvlab.grading.lab06.references import STEP_SLIPS, VICTIM_SLIPS, slipped, slipped_step
from kvlab.grading.lab06.step import show_day, step_ex

# the checks' inner pieces, by the names the tests use
_Captured = step.captured
_departure = step.departure
_direct = step._direct
_lockstep = step._lockstep
_serve_day = preempt.serve_day

__all__ = [
    "DAY",
    "DAYS",
    "DAY_SETUP",
    "DAY_TEXT",
    "STEP_SLIPS",
    "VICTIM_SLIPS",
    "CheckFailed",
    "Day",
    "judge_preempt",
    "preempt_ex",
    "show_day",
    "slipped",
    "slipped_step",
    "step_ex",
]
