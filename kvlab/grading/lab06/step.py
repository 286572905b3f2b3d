"""06.step: the learner's ``step(scheduler, now)`` serves short scripted days (:data:`DAYS`: each
named, with its guests as a report writes them, a cache and the engine's options) in an Engine
beside kvlab's own step, compared after every step on the state-diff table
``scheduler_views.STEP`` (:mod:`kvlab.grading.lockstep`, with :data:`LAB06`). kvlab's step is
vLLM's order: retire, decode every running guest (preempting when a bed is missing), then admit,
and only in a step that preempted nobody, each newcomer with its first token. At the first step
that differs, the one usual slip (``references.STEP_SLIPS``) that does what the learner's step did
gives the hint. The last check serves the lab's simulated day, shrunk (06.preempt's ``DAY``),
with ``simulate(..., schedule=step)``, as the lab does.
"""

from __future__ import annotations

import functools

from kvlab.grading import lockstep, scheduler_days
from kvlab.grading.lab06 import hints
from kvlab.grading.lab06.preempt import DAY, DAY_SETUP, DAY_TEXT
from kvlab.grading.lab06.references import STEP_SLIPS
from kvlab.grading.lockstep import Captured, Rules
from kvlab.grading.registry import exercise
from kvlab.grading.scheduler_days import FULL_HOTEL, Day, figures, paged, same_figures
from kvlab.grading.step_rules import step_rules
from kvlab.serving import make_cache, simulate

step_ex = exercise("06.step", "one scheduler step: retire, decode, admit")

DAYS = {
    day.name: day
    for day in (
        Day("arrivals", paged(16, 4), "ann 6+3@0, ben 5+2@0, cat 9+2@2, dan 3+4@3.5, eve 4+2@10"),
        Day("full batch", paged(32, 4), "ann 4+2@0, ben 4+2@0, cat 4+5@0, dan 4+1@0, eve 4+2@0", 3),
        Day("queue", paged(8, 4), "ann 9+6@0, ben 5+3@0, cat 14+2@1, dan 2+2@1"),
        # step 2: eve, new, is refused (a step that forgets out.refused fails here, not at step
        # 4, where it would look like a step that never readmits). Step 3: ben needs a room and
        # dan (checked in last) leaves; cat needs one and, last now, leaves itself; nobody
        # checks in. Step 4: cat, first in line, holds 8 tokens and does not fit yet. Step 5:
        # cat is back and dan waits (admitted before the decoding, dan would take a room a
        # guest in the hotel needs, and leave again at once)
        Day("preemption", paged(6, 4), FULL_HOTEL),
        # the full hotel's day by swap: in step 3 dan, asked to leave while ben is decoded, is
        # SWAPPED, not PREEMPTED, when the walk reaches him (a step that skips only PREEMPTED
        # guests asks the cache about a guest it no longer knows). By swap, skipping nobody and
        # skipping only the PREEMPTED guests are the same step; the recompute day tells them apart
        Day("swap", paged(6, 4), FULL_HOTEL, preemption="swap", second="preemption"),
        # fay's prompt fits in the 6 beds left, her booking does not
        Day(
            "contiguous",
            functools.partial(make_cache, "contiguous-oracle", 64, 32),
            "ann 10+6@0, ben 20+10@0, cat 8+4@0, fay 5+4@1, dan 30+2@1, eve 2+2@1",
        ),
        # 58 of 64 beds booked at 1: gus's prompt fits, his answer's last bed does not (a step
        # that books one token fewer checks him in, and the cache refuses the allocation)
        Day(
            "booking",
            functools.partial(make_cache, "contiguous-oracle", 64, 32),
            "ann 10+6@0, ben 20+10@0, cat 8+4@0, gus 4+3@1",
        ),
        # DAY as simulate() serves it
        scheduler_days.simulated_day("simulate", DAY, DAY_SETUP, DAY_TEXT),
    )
}

LAB06 = step_rules(STEP_SLIPS, DAYS)  # kvlab's step, its guard, the table, hints and slips
_lockstep = functools.partial(lockstep.lockstep, rules=LAB06)
departure = functools.partial(lockstep.departure, rules=LAB06)
captured = functools.partial(Captured, rules=LAB06)


def show_day(step, day: str = "arrivals", steps: int | None = None, rules: Rules = LAB06) -> None:
    """Print a day of the 06.step checks step by step, kvlab's step beside ``step``, up to the
    first step that differs (or ``steps`` steps)."""
    lockstep.show_day(step, day, rules, steps)


# each check serves one day (DAYS), in the order of the lab
CHECKS = {
    "arrivals": "guests check in when they arrive and check out when their answer is done",
    "full batch": "max_batch=3: a guest who is done frees its place in the batch in the same step",
    "queue": "first come, first served: a guest who does not fit stops the queue",
    "preemption": "a full hotel: the guest checked in last leaves, and comes back first",
    "swap": "the full hotel by swap: a guest asked to leave earlier in the step gets no token",
    "contiguous": "the same step on a contiguous hotel that books each answer up front",
    "booking": "6 beds free: a guest of 4 + 3 tokens waits (a booking holds every token of the "
    "answer, the last one too)",
}
for day, name in CHECKS.items():
    step_ex.check(name)(functools.partial(_lockstep, day=DAYS[day]))


@step_ex.check("the lab's way: simulate(..., schedule=step) serves a 40-guest day as kvlab does")
def _simulate(fn):
    _lockstep(fn, DAYS["simulate"])
    got, want = simulate(DAY, schedule=fn, **DAY_SETUP), simulate(DAY, **DAY_SETUP)
    # the same at every step, yet other token counts: preempted without scheduler.preempt()
    same_figures(figures(got), figures(want), DAY_TEXT + ", schedule=step", hints.USE_PREEMPT)
