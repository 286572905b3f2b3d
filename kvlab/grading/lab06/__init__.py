"""Checks for Lab 06: preemption and one scheduler step, judged against kvlab's Scheduler.

:mod:`.preempt` and :mod:`.step` are the two exercises' checks, :mod:`.days` the days they serve,
:mod:`.references` the usual slips (kvlab's Scheduler with one hook changed), :mod:`.hints` the
hints. What Lab 09's step shares is :mod:`kvlab.grading.lockstep`, :mod:`~kvlab.grading.step_rules`,
:mod:`~kvlab.grading.step_hints`, :mod:`~kvlab.grading.scheduler_views` and
:mod:`~kvlab.grading.scheduler_days`.
"""

from kvlab.grading.expect import CheckFailed
from kvlab.grading.lab06 import preempt, references, step
from kvlab.grading.lab06.days import DAY, DAY_SETUP, DAY_TEXT, DAYS
from kvlab.grading.lab06.hints import *  # noqa: F403 (the hints, by name, for the tests)
from kvlab.grading.lab06.preempt import judge_preempt, preempt_ex
from kvlab.grading.lab06.references import STEP_SLIPS, VICTIM_SLIPS, slipped, slipped_step
from kvlab.grading.lab06.step import show_day, step_ex

# the checks' inner pieces, by the names the tests use
_Captured, _departure, _lockstep, _direct = (
    step.captured,
    step.departure,
    step._lockstep,
    step.direct,
)
_serve_day = preempt.serve_day

__all__ = [
    "DAY",
    "DAYS",
    "DAY_SETUP",
    "DAY_TEXT",
    "STEP_SLIPS",
    "VICTIM_SLIPS",
    "CheckFailed",
    "judge_preempt",
    "preempt_ex",
    "references",
    "show_day",
    "slipped",
    "slipped_step",
    "step_ex",
]
