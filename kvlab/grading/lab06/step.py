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

from collections.abc import Callable
from dataclasses import dataclass

from kvlab.core.block_manager import PagedCache
from kvlab.grading import slips
from kvlab.grading.blame import explain_exception, raised
from kvlab.grading.expect import CheckFailed, short
from kvlab.grading.lab06 import hints
from kvlab.grading.lab06.days import DAY, DAY_SETUP, DAY_TEXT, DAYS, Day, figures, same_figures
from kvlab.grading.lab06.references import STEP_SLIPS
from kvlab.grading.lab06.views import REPORT_KEYS, STEP, error_slip, show, state_text
from kvlab.grading.own_code import call_own
from kvlab.grading.registry import exercise
from kvlab.grading.state_diff import first_difference, moved, read
from kvlab.serving import simulate
from kvlab.serving.scheduler import ScheduledStep, Scheduler, Sequence

step_ex = exercise("06.step", "one scheduler step: retire, decode, admit")

STEP_REFERENCE = (
    Scheduler.step,
    Scheduler.schedule,
    Scheduler.retire,
    Scheduler._admit_arrived,
    Scheduler._make_room,
)
STEP_TASK = "scheduling the step"


@dataclass(frozen=True)
class Rules:
    """What a lockstep exercise compares against: kvlab's step (``reference``), the guard and
    task of the learner's calls, the state-diff ``table``, the usual ``slips`` and the ``days``
    they serve, the mistakes seen in a step's outcome itself (``direct``), and how a report names
    the learner's function and the module whose ``show_day`` replays a day. 06.step's are
    :data:`LAB06`; Lab 09's budgeted step has its own (:mod:`kvlab.grading.lab09.budget`)."""

    reference: Callable
    guard: tuple
    task: str
    table: tuple
    slips: tuple
    days: dict
    direct: Callable | None = None
    module: str = "kvlab.grading.lab06"
    name: str = "step"


class Stopped(Exception):
    """The learner's step raised, or returned what a ScheduledStep should be: the day stops."""


class Captured:
    """A schedule function for an Engine that keeps what each step did (before the engine's own
    bookkeeping): the reference's, a slip's, or the learner's (guarded, checked for type)."""

    def __init__(self, step, guests: list[Sequence], learner: bool = False, rules=None):
        self.step, self.guests, self.learner = step, guests, learner
        self.rules = LAB06 if rules is None else rules
        self.now = 0.0
        self.view = self.value = self.error = None
        self.unsized = False  # the learner asked cache.refusal without the tokens to generate

    def __call__(self, scheduler, now):
        self.now = now
        self.unsized = False
        if self.learner:
            rules = self.rules
            where = f"{rules.name}(scheduler, now={now:g})"
            value, self.error = call_own(
                self.step, scheduler, now, guard=rules.guard, task=rules.task, where=where
            )
        else:
            try:
                value, self.error = self.step(scheduler, now), None
            except Exception as error:  # a slip run from the learner's state raises
                value, self.error = None, error
        self.value = value
        if self.error is not None or not well_formed(value):
            raise Stopped
        self.view = read(self.rules.table, value, scheduler, self.guests)
        return value


def well_formed(value) -> bool:
    if not isinstance(value, ScheduledStep):
        return False
    lists = (value.finished, value.admitted, value.preempted, value.scheduled)
    return all(
        isinstance(items, list) and all(isinstance(q, Sequence) for q in items) for items in lists
    ) and (value.refused is None or isinstance(value.refused, Sequence))


def watch_refusal(cache, capture: Captured) -> None:
    """Note in ``capture`` when the learner asks ``cache.refusal`` without the tokens still to
    generate (0, or left out where the cache needs them): the cache then counts no first token,
    or books no answer, and says yes to a guest it cannot take."""
    refusal = cache.refusal

    def watched(*args, **kwargs):
        output_len = args[1] if len(args) > 1 else kwargs.get("output_len")
        if output_len == 0 or output_len is None and not isinstance(cache, PagedCache):
            capture.unsized = True
        return refusal(*args, **kwargs)

    cache.refusal = watched


def _lockstep(fn, day: Day, replay: bool = True, rules: Rules | None = None) -> None:
    """Run ``day`` with the learner's step beside kvlab's; fail at the first step that differs."""
    rules = LAB06 if rules is None else rules
    mine_capture = Captured(fn, [], learner=True, rules=rules)
    mine, mine_guests = day.start(mine_capture)
    mine_capture.guests = mine_guests
    watch_refusal(mine.scheduler.cache, mine_capture)
    ref_capture = Captured(rules.reference, [], rules=rules)
    ref, ref_guests = day.start(ref_capture)
    ref_capture.guests = ref_guests
    before = state_text(ref.scheduler)
    history: list[dict] = []  # kvlab's view of every step so far
    k = 0
    while ref.has_unfinished():
        k += 1
        try:
            mine.step()
        except Stopped:
            _step_failed(day, k, mine_capture, None, before, replay, history, rules)
        except CheckFailed as handover:
            handover.input = _where(day, k, mine_capture.now, before)
            raise
        ref.step()
        if mine_capture.view != ref_capture.view:
            _step_failed(day, k, mine_capture, ref_capture.view, before, replay, history, rules)
        history.append(ref_capture.view)
        before = state_text(ref.scheduler)


def _where(day: Day, k: int, now: float, before: str) -> str:
    return f"{day.describe()}; step {k} (now={now:g}), before it: {before}"


def _step_failed(
    day: Day, k: int, mine: Captured, expected: dict | None, before, replay, history, rules=None
):
    rules = LAB06 if rules is None else rules
    where = _where(day, k, mine.now, before)
    again = (
        f"`from {rules.module} import show_day; show_day({rules.name}, "
        f'"{day.name}")` prints the day '
        "step by step, kvlab's beside yours"
        if replay
        else None
    )
    details = dict(input=where, replay=again)
    if mine.error is not None:
        hint = _unsized(mine) or _slip(day, mine, None, history, rules)
        hint = hint or error_slip(mine.error, step=True)
        if hint is None and isinstance(mine.error, MemoryError):
            hint = hints.MEMORY
        raise raised(mine.error, hint, **details)
    value = mine.value
    if not isinstance(value, ScheduledStep):
        raise CheckFailed(
            "step must return a ScheduledStep",
            expected="a ScheduledStep",
            got=short(value),
            hint=hints.RETURN_STEP if value is None else hints.STEP_TYPE,
            **details,
        )
    if not well_formed(value):
        fields = ("finished", "admitted", "preempted", "scheduled", "refused")
        odd = next(f for f in fields if not _well_formed_field(getattr(value, f), f))
        got = getattr(value, odd)
        names = {g[0] for g in day.guests}
        entries = (
            [q for q in got if not isinstance(q, Sequence)] if isinstance(got, list) else [got]
        )
        ids = all(isinstance(q, str | int) and q in names for q in entries)
        what = "a Sequence or None" if odd == "refused" else "a list of Sequence objects"
        raise CheckFailed(
            f"out.{odd} must be {what}",
            got=short(got),
            hint=hints.SEQ_NOT_ID if ids else None,
            **details,
        )
    d = first_difference(rules.table, expected, mine.view)
    want, got = d.shown
    queue = history[-1]["scheduler.waiting"] if history else [g[0] for g in day.guests]
    hint = _unsized(mine) or _slip(day, mine, expected, history, rules)
    direct = rules.direct or _direct
    hint = hint or direct(day, mine, expected, queue)
    raise CheckFailed(
        f"step {k}: {d.name} differs from kvlab's",
        expected=want,
        got=got,
        hint=hint,
        cause=hint or f"{rules.name}: {d.name}",
        **details,
    )


def _unsized(mine: Captured) -> str | None:
    """Asked without the tokens to generate in the step that failed: that is the mistake (seen
    directly, where slips could not tell it from asking with the prompt only)."""
    return hints.REFUSAL_REMAINING if mine.unsized else None


def _well_formed_field(items, field: str) -> bool:
    if field == "refused":
        return items is None or isinstance(items, Sequence)
    return isinstance(items, list) and all(isinstance(q, Sequence) for q in items)


def _slip(
    day: Day, mine: Captured, expected: dict | None, history: list[dict], rules=None
) -> str | None:
    """The hint of the one usual slip that does what the learner's step did (see ``_agrees``);
    where several do and the day has a ``second``, the one that departs from kvlab's step there
    as the learner's step does."""
    rules = LAB06 if rules is None else rules
    found = [s for s in rules.slips if _agrees(s, day, mine, expected, history, rules)]
    if len({slip.mistake for slip in found}) > 1 and day.second is not None:
        second = rules.days[day.second]
        there = departure(mine.step, second, learner=True, rules=rules)
        found = [s for s in found if departure(s.answer, second, rules=rules) == there]
    return slips.hint(slips.only(found))


def _agrees(
    slip, day: Day, mine: Captured, expected: dict | None, history: list[dict], rules=None
) -> bool:
    """Whether ``slip`` does as the learner's step did: the same as kvlab's step in every earlier
    step of the day (``history``), then, in this one, the learner's error, or the learner's
    report and state where kvlab's differ. In this step the refusal reported with a guest is not
    compared, nor, for a slip whose answer says ``any_refused``, which guest is reported."""
    rules = LAB06 if rules is None else rules
    capture = Captured(slip.answer, [], rules=rules)
    engine, capture.guests = day.start(capture)
    for earlier in history:
        try:
            engine.step()
        except Exception:  # the slip raised (Stopped), or the engine refused its step
            return False
        if capture.view != earlier:
            return False
    capture.view = None
    try:
        engine.step()
    except Stopped:
        pass
    except Exception:
        return False
    if mine.error is not None:
        return capture.error is not None and (
            (type(capture.error), str(capture.error)) == (type(mine.error), str(mine.error))
        )
    any_refused = getattr(slip.answer, "any_refused", False)
    return (
        capture.error is None
        and capture.view is not None
        and alike(capture.view, mine.view, any_refused=any_refused)
        and capture.view != expected
    )


def departure(fn, day: Day, learner: bool = False, rules=None):
    """Where ``fn`` first departs from kvlab's step in ``day``: None when it never does, else
    the step and what it did there (its report and state, its error, or what it returned)."""
    rules = LAB06 if rules is None else rules
    mine = Captured(fn, [], learner=learner, rules=rules)
    engine, mine.guests = day.start(mine)
    ref = Captured(rules.reference, [], rules=rules)
    reference, ref.guests = day.start(ref)
    k = 0
    while reference.has_unfinished():
        k += 1
        try:
            engine.step()
        except Stopped:
            if mine.error is not None:
                return k, type(mine.error), str(mine.error)
            return k, short(mine.value)
        except Exception as error:  # a hand-over to kvlab, or the engine refused the step
            return k, type(error), str(error)
        reference.step()
        if mine.view != ref.view:
            return k, {key: v for key, v in mine.view.items() if key != "out.refusal"}
    return None


def alike(a: dict, b: dict, any_refused: bool = False) -> bool:
    """The same step, whatever refusal is reported (and, with ``any_refused``, whichever
    refused guest)."""
    skip = ("out.refusal", "out.refused") if any_refused else ("out.refusal",)
    return all(a[k] == b[k] for k in a if k not in skip)


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


def show_day(step, day: str = "arrivals", steps: int | None = None, rules=None) -> None:
    """Print a day of the 06.step checks step by step, kvlab's step beside ``step``, up to the
    first step that differs (or ``steps`` steps)."""
    rules = LAB06 if rules is None else rules
    plan = rules.days[day]
    print(plan.describe())
    mine_capture = Captured(step, [], learner=True, rules=rules)
    mine, mine_capture.guests = plan.start(mine_capture)
    ref_capture = Captured(rules.reference, [], rules=rules)
    ref, ref_capture.guests = plan.start(ref_capture)
    keys = ("out.finished", "out.admitted", "out.refused", "out.preempted", "out.scheduled")

    def line(view):
        return "  ".join(f"{key[4:]} {show(view[key])}" for key in keys)

    k = 0
    while ref.has_unfinished() and (steps is None or k < steps):
        k += 1
        try:
            mine.step()
        except Stopped:
            pass
        except CheckFailed as failure:
            print(f"step {k}: {failure.message}")
            return
        ref.step()
        print(f"step {k} (now={ref_capture.now:g})\n  kvlab: {line(ref_capture.view)}")
        if mine_capture.error is not None:
            print("  yours raised " + "; ".join(explain_exception(mine_capture.error)))
            return
        if not well_formed(mine_capture.value):
            print(f"  yours returned {short(mine_capture.value)}")
            return
        print(f"  yours: {line(mine_capture.view)}")
        d = first_difference(rules.table, ref_capture.view, mine_capture.view)
        if d is not None:
            want, got = d.shown
            print(f"  first difference: {d.name}: kvlab {want}; yours {got}")
            return
    print("the same at every step")


LAB06 = Rules(
    reference=Scheduler.step,
    guard=STEP_REFERENCE,
    task=STEP_TASK,
    table=STEP,
    slips=STEP_SLIPS,
    days=DAYS,
)


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
