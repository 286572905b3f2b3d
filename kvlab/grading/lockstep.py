"""Lockstep: a learner's scheduler step ``fn(scheduler, now)`` serves scripted days in an Engine
beside an engine running kvlab's own step, compared after every step on a state-diff table (the
step's report, then the state), as 06.step and 09.budget_step judge theirs (:class:`Rules`).

At the first step that differs, the usual slips (kvlab's scheduler with one hook changed, each
served by :class:`slipped`) serve the same day: the one slip that agrees with kvlab's step until
then and does exactly what the learner's step did in that step gives the hint. Where a day cannot
tell two slips apart, its ``second`` day does. :func:`show_day` prints a day step by step, kvlab's
beside the learner's; :func:`departure` says where a step first departs from kvlab's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvlab.core.block_manager import PagedCache
from kvlab.grading import slips
from kvlab.grading.blame import explain_exception, raised
from kvlab.grading.expect import CheckFailed, short
from kvlab.grading.own_code import call_own
from kvlab.grading.scheduler_days import Day
from kvlab.grading.scheduler_views import show, state_text
from kvlab.grading.state_diff import first_difference, read
from kvlab.serving.scheduler import ScheduledStep, Scheduler, Sequence


class slipped:  # noqa: N801 (a function of the scheduler, named like one)
    """``variant``'s step as a step function ``(scheduler, now)``: it runs on the scheduler's own
    state (its queues, cache and counts: one ``__dict__``) with ``variant``'s decisions, so a day
    served by it in an Engine is that variant's day. ``any_refused``: which refused guest the
    step reports may be any of several (past a refused guest, at max_batch)."""

    def __init__(self, variant: type[Scheduler], any_refused: bool = False):
        if not (isinstance(variant, type) and issubclass(variant, Scheduler)):
            raise TypeError(f"variant must be a subclass of Scheduler, got {variant!r}")
        self.variant, self.any_refused = variant, any_refused

    def __call__(self, scheduler: Scheduler, now: float) -> ScheduledStep:
        view = self.variant.__new__(self.variant)
        view.__dict__ = scheduler.__dict__  # the same state, the variant's decisions
        return view.step(now)

    def __repr__(self):
        return f"slipped({self.variant.__name__})"


@dataclass(frozen=True)
class StepHints:
    """The hints for a step function's own mistakes, seen without a slip: asking
    ``cache.refusal`` without the tokens to generate (``unsized``), running out of memory,
    returning None or another type, listing seq_ids; ``error(exception)``: the hint of an error
    whose message names its mistake, or None."""

    unsized: str
    memory: str
    returned_none: str
    step_type: str
    ids: str
    error: Callable[[Exception], str | None]


@dataclass(frozen=True)
class Rules:
    """What a lockstep exercise compares against: kvlab's step (``reference``), the guard and
    task of the learner's calls, the state-diff ``table``, the usual ``slips`` and the ``days``
    they serve, the hints of the step function's own mistakes (``hints``), the mistakes seen in a
    step's outcome itself (``direct``), and how a report names the learner's function and the
    module whose ``show_day`` replays a day. 06.step's are ``kvlab.grading.lab06.step`` 's;
    Lab 09's budgeted step has its own (:mod:`kvlab.grading.lab09.budget`)."""

    reference: Callable
    guard: tuple
    task: str
    table: tuple
    slips: tuple
    days: dict
    hints: StepHints
    direct: Callable | None = None
    module: str = "kvlab.grading.lab06"
    name: str = "step"


class Stopped(Exception):
    """The learner's step raised, or returned what a ScheduledStep should be: the day stops."""


class Captured:
    """A schedule function for an Engine that keeps what each step did (before the engine's own
    bookkeeping): the reference's, a slip's, or the learner's (guarded, checked for type)."""

    def __init__(self, step, guests: list[Sequence], learner: bool = False, *, rules: Rules):
        self.step, self.guests, self.learner = step, guests, learner
        self.rules = rules
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


def lockstep(fn, day: Day, rules: Rules, replay: bool = True) -> None:
    """Run ``day`` with the learner's step beside kvlab's; fail at the first step that differs."""
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
    day: Day, k: int, mine: Captured, expected: dict | None, before, replay, history, rules
):
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
        said = rules.hints
        hint = _unsized(mine, said) or _slip(day, mine, None, history, rules)
        hint = hint or said.error(mine.error)
        if hint is None and isinstance(mine.error, MemoryError):
            hint = said.memory
        raise raised(mine.error, hint, **details)
    value = mine.value
    if not isinstance(value, ScheduledStep):
        raise CheckFailed(
            "step must return a ScheduledStep",
            expected="a ScheduledStep",
            got=short(value),
            hint=rules.hints.returned_none if value is None else rules.hints.step_type,
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
            hint=rules.hints.ids if ids else None,
            **details,
        )
    d = first_difference(rules.table, expected, mine.view)
    want, got = d.shown
    queue = history[-1]["scheduler.waiting"] if history else [g[0] for g in day.guests]
    hint = _unsized(mine, rules.hints) or _slip(day, mine, expected, history, rules)
    if hint is None and rules.direct is not None:
        hint = rules.direct(day, mine, expected, queue)
    raise CheckFailed(
        f"step {k}: {d.name} differs from kvlab's",
        expected=want,
        got=got,
        hint=hint,
        cause=hint or f"{rules.name}: {d.name}",
        **details,
    )


def _unsized(mine: Captured, said: StepHints) -> str | None:
    """Asked without the tokens to generate in the step that failed: that is the mistake (seen
    directly, where slips could not tell it from asking with the prompt only)."""
    return said.unsized if mine.unsized else None


def _well_formed_field(items, field: str) -> bool:
    if field == "refused":
        return items is None or isinstance(items, Sequence)
    return isinstance(items, list) and all(isinstance(q, Sequence) for q in items)


def _slip(
    day: Day, mine: Captured, expected: dict | None, history: list[dict], rules
) -> str | None:
    """The hint of the one usual slip that does what the learner's step did (see ``_agrees``);
    where several do and the day has a ``second``, the one that departs from kvlab's step there
    as the learner's step does."""
    found = [s for s in rules.slips if _agrees(s, day, mine, expected, history, rules)]
    if len({slip.mistake for slip in found}) > 1 and day.second is not None:
        second = rules.days[day.second]
        there = departure(mine.step, second, rules, learner=True)
        found = [s for s in found if departure(s.answer, second, rules) == there]
    return slips.hint(slips.only(found))


def _agrees(
    slip, day: Day, mine: Captured, expected: dict | None, history: list[dict], rules
) -> bool:
    """Whether ``slip`` does as the learner's step did: the same as kvlab's step in every earlier
    step of the day (``history``), then, in this one, the learner's error, or the learner's
    report and state where kvlab's differ. In this step the refusal reported with a guest is not
    compared, nor, for a slip whose answer says ``any_refused``, which guest is reported."""
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


def departure(fn, day: Day, rules: Rules, learner: bool = False):
    """Where ``fn`` first departs from kvlab's step in ``day``: None when it never does, else
    the step and what it did there (its report and state, its error, or what it returned)."""
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


def show_day(step, day: str, rules: Rules, steps: int | None = None) -> None:
    """Print a day of a lockstep exercise step by step, kvlab's step beside ``step``, up to the
    first step that differs (or ``steps`` steps)."""
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
