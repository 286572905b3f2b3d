"""Checks for Lab 06: preemption and one scheduler step, judged against kvlab's Scheduler.

:mod:`.preempt` and :mod:`.step` are the two exercises' checks, with the days they serve,
:mod:`.references` the usual slips (kvlab's Scheduler with one hook changed), :mod:`.hints` the
hints. What Lab 09's step shares is :mod:`kvlab.grading.lockstep`, :mod:`~kvlab.grading.step_rules`,
:mod:`~kvlab.grading.step_hints`, :mod:`~kvlab.grading.scheduler_views` and
:mod:`~kvlab.grading.scheduler_days`.
"""
# ruff: noqa: F401 (the names the lab and the tests use, re-exported)

from kvlab.grading.expect import CheckFailed
from kvlab.grading.lab06.hints import *  # noqa: F403 (the hints, by name, for the tests)
from kvlab.grading.lab06.preempt import DAY, DAY_SETUP, DAY_TEXT, judge_preempt, preempt_ex
from kvlab.grading.lab06.preempt import serve_day as _serve_day
from kvlab.grading.lab06.references import STEP_SLIPS, VICTIM_SLIPS, slipped, slipped_step
from kvlab.grading.lab06.step import DAYS, _lockstep, show_day, step_ex
from kvlab.grading.lab06.step import captured as _Captured
from kvlab.grading.lab06.step import departure as _departure
from kvlab.grading.step_rules import direct as _direct
