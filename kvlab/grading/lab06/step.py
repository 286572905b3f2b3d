"""06.step: the learner's ``step(scheduler, now)`` serves short scripted days (``days.DAYS``) in
an Engine beside an engine running kvlab's own step (both with kvlab's preempt), compared after
every step on the state-diff table ``views.STEP``: the report (finished, admitted, refused,
preempted, scheduled), then the state (batch, queue, every guest, the cache). kvlab's step is
vLLM's order: retire, decode every running guest (preempting when a bed is missing), then admit,
and only in a step that preempted nobody, each newcomer with its first token.

At the first step that differs, the usual slips (``references.STEP_SLIPS``: kvlab's step with one
mistake put in) serve the same day: the one slip that agrees with kvlab's step until then and
does exactly what the learner's step did in that step gives the hint (a step that asks
``cache.refusal`` without the tokens still to generate is seen directly). Where a day cannot tell
two slips apart (by swap nobody is PREEMPTED), its ``second`` day does. The last check serves a
small day with ``simulate(..., schedule=step)``, as the lab does, and compares its figures.
``show_day(step, day)`` prints a day step by step, kvlab's beside the learner's.
"""

from __future__ import annotations

from kvlab.grading import lockstep
from kvlab.grading.lab06 import hints
from kvlab.grading.lab06.days import DAY, DAY_SETUP, DAY_TEXT, DAYS, Day, figures, same_figures
from kvlab.grading.lab06.references import STEP_SLIPS
from kvlab.grading.lab06.views import error_slip
from kvlab.grading.lockstep import Captured, Rules, StepHints
from kvlab.grading.registry import exercise
from kvlab.grading.scheduler_views import REPORT_KEYS, STEP
from kvlab.grading.state_diff import moved
from kvlab.serving import simulate
from kvlab.serving.scheduler import Scheduler

step_ex = exercise("06.step", "one scheduler step: retire, decode, admit")

STEP_REFERENCE = (
    Scheduler.step,
    Scheduler.schedule,
    Scheduler._run,
    Scheduler.retire,
    Scheduler._serve_running,
    Scheduler._serve,
    Scheduler._admit_arrived,
    Scheduler._make_room,
)
STEP_TASK = "scheduling the step"


def _direct(day: Day, mine: Captured, expected: dict, queue: list) -> str | None:
    """Mistakes seen in the step's outcome itself, when no single slip explains it (``queue``:
    the waiting guests before the step)."""
    got = mine.view
    arrivals = {g[0]: g[3] for g in day.guests}
    if any(arrivals.get(g, 0) > mine.now for g in got["out.admitted"]):
        return hints.ARRIVAL
    head, refused = expected["out.refused"], got["out.refused"]
    if refused in queue and any(
        g in queue and queue.index(g) > queue.index(refused) for g in got["out.admitted"]
    ):
        return hints.FCFS  # checked in a guest standing behind one the cache refused in this step
    differ = moved(expected, got)
    if set(differ) <= {"out.refused", "out.refusal"} and head in queue and refused in queue:
        # all else as kvlab's, yet asked the cache for a guest behind the head
        if queue.index(refused) > queue.index(head):
            return hints.FCFS
    if day.max_batch is not None and len(got["scheduler.running"]) > day.max_batch:
        return hints.MAX_BATCH
    if differ == ["scheduler.num_preemptions"]:
        more = got["scheduler.num_preemptions"] > expected["scheduler.num_preemptions"]
        return hints.COUNTED_TWICE if more else hints.USE_PREEMPT
    if differ and all(k in REPORT_KEYS for k in differ) and got[differ[0]] in ([], None):
        return hints.REPORTED[differ[0]]  # done, not reported
    return None


# the hints of a step function's own mistakes (Lab 09's budgeted step has them too)
STEP_HINTS = StepHints(
    unsized=hints.REFUSAL_REMAINING,
    memory=hints.MEMORY,
    returned_none=hints.RETURN_STEP,
    step_type=hints.STEP_TYPE,
    ids=hints.SEQ_NOT_ID,
    error=lambda error: error_slip(error, step=True),
)
LAB06 = Rules(
    reference=Scheduler.step,
    guard=STEP_REFERENCE,
    task=STEP_TASK,
    table=STEP,
    slips=STEP_SLIPS,
    days=DAYS,
    hints=STEP_HINTS,
    direct=_direct,
)


def _lockstep(fn, day: Day, replay: bool = True, rules: Rules = LAB06) -> None:
    lockstep.lockstep(fn, day, rules, replay)


def departure(fn, day: Day, learner: bool = False, rules: Rules = LAB06):
    return lockstep.departure(fn, day, rules, learner)


def show_day(step, day: str = "arrivals", steps: int | None = None, rules: Rules = LAB06) -> None:
    """Print a day of the 06.step checks step by step, kvlab's step beside ``step``, up to the
    first step that differs (or ``steps`` steps)."""
    lockstep.show_day(step, day, rules, steps)


def captured(step, guests, learner: bool = False) -> Captured:
    return Captured(step, guests, learner, rules=LAB06)


@step_ex.check("guests check in when they arrive and check out when their answer is done")
def _arrivals(fn):
    _lockstep(fn, DAYS["arrivals"])


@step_ex.check("max_batch=3: a guest who is done frees its place in the batch in the same step")
def _full_batch(fn):
    _lockstep(fn, DAYS["full batch"])


@step_ex.check("first come, first served: a guest who does not fit stops the queue")
def _queue(fn):
    _lockstep(fn, DAYS["queue"])


@step_ex.check("a full hotel: the guest checked in last leaves, and comes back first")
def _preemption(fn):
    _lockstep(fn, DAYS["preemption"])


@step_ex.check("the full hotel by swap: a guest asked to leave earlier in the step gets no token")
def _swap_day(fn):
    _lockstep(fn, DAYS["swap"])


@step_ex.check("the same step on a contiguous hotel that books each answer up front")
def _contiguous(fn):
    _lockstep(fn, DAYS["contiguous"])


@step_ex.check("the lab's way: simulate(..., schedule=step) serves a 40-guest day as kvlab does")
def _simulate(fn):
    _lockstep(fn, DAYS["simulate"])
    got = simulate(DAY, schedule=fn, **DAY_SETUP)
    want = simulate(DAY, **DAY_SETUP)
    # the same at every step, yet other token counts: preempted without scheduler.preempt()
    same_figures(figures(got), figures(want), DAY_TEXT + ", schedule=step", hints.USE_PREEMPT)
