"""06.step: the learner's ``step(scheduler, now)`` serves short scripted days (``days.DAYS``) in an
Engine beside kvlab's own step, compared after every step on the state-diff table
``scheduler_views.STEP`` (:mod:`kvlab.grading.lockstep`, with :data:`LAB06`). kvlab's step is
vLLM's order: retire, decode every running guest (preempting when a bed is missing), then admit,
and only in a step that preempted nobody, each newcomer with its first token. At the first step
that differs, the one usual slip (``references.STEP_SLIPS``) that does what the learner's step did
gives the hint. The last check serves a day with ``simulate(..., schedule=step)``, as the lab does.
"""

from __future__ import annotations

import functools

from kvlab.grading import lockstep
from kvlab.grading.lab06 import hints
from kvlab.grading.lab06.days import DAY, DAY_SETUP, DAY_TEXT, DAYS
from kvlab.grading.lab06.references import STEP_SLIPS
from kvlab.grading.lockstep import Captured, Rules
from kvlab.grading.registry import exercise
from kvlab.grading.scheduler_days import figures, same_figures
from kvlab.grading.step_rules import step_rules
from kvlab.serving import simulate

step_ex = exercise("06.step", "one scheduler step: retire, decode, admit")

LAB06 = step_rules(STEP_SLIPS, DAYS)  # kvlab's step, its guard, the table, hints and slips
_lockstep = functools.partial(lockstep.lockstep, rules=LAB06)
departure = functools.partial(lockstep.departure, rules=LAB06)
captured = functools.partial(Captured, rules=LAB06)


def show_day(step, day: str = "arrivals", steps: int | None = None, rules: Rules = LAB06) -> None:
    """Print a day of the 06.step checks step by step, kvlab's step beside ``step``, up to the
    first step that differs (or ``steps`` steps)."""
    lockstep.show_day(step, day, rules, steps)


# each check serves one day (days.DAYS), in the order of the lab
CHECKS = {
    "arrivals": "guests check in when they arrive and check out when their answer is done",
    "full batch": "max_batch=3: a guest who is done frees its place in the batch in the same step",
    "queue": "first come, first served: a guest who does not fit stops the queue",
    "preemption": "a full hotel: the guest checked in last leaves, and comes back first",
    "swap": "the full hotel by swap: a guest asked to leave earlier in the step gets no token",
    "contiguous": "the same step on a contiguous hotel that books each answer up front",
}
for day, name in CHECKS.items():
    step_ex.check(name)(functools.partial(_lockstep, day=DAYS[day]))


@step_ex.check("the lab's way: simulate(..., schedule=step) serves a 40-guest day as kvlab does")
def _simulate(fn):
    _lockstep(fn, DAYS["simulate"])
    got, want = simulate(DAY, schedule=fn, **DAY_SETUP), simulate(DAY, **DAY_SETUP)
    # the same at every step, yet other token counts: preempted without scheduler.preempt()
    same_figures(figures(got), figures(want), DAY_TEXT + ", schedule=step", hints.USE_PREEMPT)
