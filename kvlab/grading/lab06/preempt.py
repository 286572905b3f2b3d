"""06.preempt: the learner's ``preempt(scheduler)`` beside kvlab's ``Scheduler.preempt`` on a copy
of the same scheduler, on hand-built hotels, then at every preemption of a simulated day. Who
left is judged first; then the state-diff tables (what the scheduler holds, the guest who left,
every other guest, the counts kvlab keeps itself) name the first difference and its slip."""

from __future__ import annotations

import copy
import functools
import itertools
from collections import deque

from kvlab.core.block_manager import PagedCache
from kvlab.grading import slips
from kvlab.grading.blame import explain_exception, learner_frames, raised
from kvlab.grading.expect import CheckFailed, short
from kvlab.grading.lab06 import hints
from kvlab.grading.lab06.references import VICTIM_SLIPS
from kvlab.grading.own_code import call_own
from kvlab.grading.registry import exercise
from kvlab.grading.scheduler_days import figures, same_figures
from kvlab.grading.scheduler_views import GUEST, cache_diff, ids, scheduler_text, show, state_text
from kvlab.grading.state_diff import Field, each, first_difference, read
from kvlab.grading.step_rules import error_slip
from kvlab.serving import simulate
from kvlab.serving.scheduler import Scheduler, Sequence, SequenceStatus
from kvlab.serving.workload import Request, sharegpt_like

WAITING, RUNNING, PREEMPTED, SWAPPED, FINISHED = SequenceStatus

preempt_ex = exercise("06.preempt", "ask the guest checked in last to leave")

PREEMPT_REFERENCE = (Scheduler.preempt, Scheduler._counted)
PREEMPT_TASK = "choosing the guest and sending them away"
WRONG_GUEST = "06.preempt: the wrong guest"
WRONG, NOTHING = "the wrong guest was asked to leave", "nothing changed: a guest should have left"
# what kvlab keeps count of itself around a custom preempt (Scheduler._counted)
COUNTERS = ("num_preemptions", "recompute_tokens", "swapped_out_tokens", "swapped_in_tokens")


def _queue_hint(d) -> str | None:
    if d.victim not in d.got:
        return hints.NOT_QUEUED
    return hints.BACK_OF_QUEUE if d.got == [*d.expected[1:], d.victim] else None


def _booked(d) -> bool:
    return d.victim in d.got.tokens


def _queue(name: str, says: str, hint=None) -> Field:
    return Field(f"scheduler.{name}", lambda s: ids(getattr(s, name)), each(show), says, hint)


# what the scheduler holds once the right guest left, in the order a difference is reported
SCHEDULER = (
    _queue(
        "running", "the guests who stay keep their places in scheduler.running (check-in order)"
    ),
    Field(
        "the cache",
        lambda s: s.cache.state(),
        show=cache_diff,
        says=lambda d: (
            f"{d.victim}'s rooms are still booked"
            if _booked(d)
            else "only the leaving guest's rooms are freed"
        ),
        hint=lambda d: hints.LEAK if _booked(d) else None,
    ),
    _queue("waiting", "{victim} waits first in line in scheduler.waiting", _queue_hint),
)


def _status_hint(d) -> str | None:
    if d.got is RUNNING or d.got is WAITING:
        return hints.STATUS_UNSET if d.got is RUNNING else hints.STATUS_WAITING
    return hints.STATUS_FOR_MODE[d.mode] if d.got in (PREEMPTED, SWAPPED) else None


def _computed_hint(d) -> str | None:
    if d.mode == "recompute" and d.got == d.before.num_computed:
        return hints.KEEPS_COMPUTED
    return hints.ZEROES_COMPUTED if d.mode == "swap" and d.got == 0 else None


_HINTS = {
    "status": _status_hint,
    "num_computed": _computed_hint,
    "num_generated": lambda d: hints.ZEROES_GENERATED if d.got == 0 else None,
}
# the guest who left, num_computed judged before num_generated, each with its slip's hint
LEFT = tuple(
    Field(f.name, f.read, f.show, "{victim}.{name} after leaving ({mode})", _HINTS.get(f.name))
    for f in (GUEST[0], GUEST[2], GUEST[1], *GUEST[3:])
)
OTHERS = tuple(
    Field(f.name, f.read, f.show, "only the leaving guest changes, yet {g}.{name} changed")
    for f in GUEST
)


def _guests(scheduler: Scheduler) -> dict:
    return {q.seq_id: q for q in [*scheduler.running, *scheduler.waiting]}


def _counts(scheduler: Scheduler, guests: dict) -> dict:
    """The counts kvlab keeps itself: the scheduler's, and every guest's num_preemptions."""
    counts = {f"scheduler.{name}": getattr(scheduler, name, None) for name in COUNTERS}
    return counts | {f"{g}.num_preemptions": q.num_preemptions for g, q in guests.items()}


COUNTED = (Field("counts", _counts, says="{name} changed inside preempt", entries=True),)


def judge_preempt(fn, scheduler: Scheduler, where: str, replay: str | None = None):
    """Call the learner's ``fn(scheduler)`` and kvlab's ``Scheduler.preempt`` on a copy made
    before; fail the check at the first difference (:func:`_wrongs`). Returns what ``fn``
    returned. With nobody running, raising anything is fine, and so is changing nothing."""
    # in a day run with the learner's preempt, scheduler.preempt() is kvlab's own while it runs
    # (a hand-over, refused), and so is the copy's
    custom, scheduler.custom_preempt = scheduler.custom_preempt, None
    before, guests = copy.deepcopy(scheduler), _guests(scheduler)
    value, error = call_own(fn, scheduler, guard=PREEMPT_REFERENCE, task=PREEMPT_TASK, where=where)
    scheduler.custom_preempt = custom
    if error is not None and before.running:
        raise raised(error, error_slip(error), input=where, replay=replay)
    wrong = _wrongs(scheduler, before, guests, value, error)
    message, expected, got, hint, cause = (*next(wrong, ("",)), None, None, None, None)[:5]
    if message:
        cause = cause or hint or f"06: {message}"
        raise CheckFailed(
            message, input=where, replay=replay, expected=expected, got=got, hint=hint, cause=cause
        )
    return value


def _wrongs(scheduler, before: Scheduler, guests: dict, value, error):
    """What is wrong once the learner's preempt returned, first things first: (message,
    expected, got, hint, cause), the last ones left out where None. ``before``: a copy of the
    scheduler made before, ``guests`` the learner's, by seq_id."""
    running, waiting = before.running, ids(before.waiting)
    if not running:  # the cache and the queue as they were
        if error is None and read(SCHEDULER[1:], scheduler) != read(SCHEDULER[1:], before):
            yield ("with nobody in the hotel there is nobody to ask to leave: nothing may change",)
        return
    reference = copy.deepcopy(before)
    expected = Scheduler.preempt(reference)
    victim = expected.seq_id
    for name, kind in (("running", list), ("waiting", deque)):
        if not isinstance(held := getattr(scheduler, name), kind):
            hint = hints.NOT_A_LIST if kind is list else hints.NOT_A_DEQUE
            yield f"scheduler.{name} must stay a {kind.__name__}", None, short(held), hint
    now = read(SCHEDULER, scheduler)
    # who left, by every sign: taken out of running, else put in the queue, else released,
    # else returned
    removed = [q.seq_id for q in running if q.seq_id not in now["scheduler.running"]]
    queued = [g for g in now["scheduler.waiting"] if g not in waiting]
    released = [q.seq_id for q in running if q.seq_id not in now["the cache"].tokens]
    returned = [value.seq_id] if isinstance(value, Sequence) else []
    chosen, last = removed or queued or released or returned, f"{victim} (checked in last)"
    if len(removed) > 1:
        yield "one call asks one guest to leave", show([victim]), show(removed)
    if not chosen:
        yield NOTHING, f"{victim} leaves (checked in last)", "everybody stays"
    if chosen[0] != victim:
        # one cause whichever wrong guest: a rule that picked the guest who arrived last here
        # may pick the one checked in first in the next hotel (the same problem, not a new one)
        slip = slips.first(slips.matching(VICTIM_SLIPS, chosen[0], (running,), victim))
        yield WRONG, last, str(chosen[0]), slips.hint(slip), WRONG_GUEST
    if not removed:
        stays, kept = show(ids(reference.running)), show(now["scheduler.running"])
        yield f"{victim} is still in scheduler.running", stays, kept, hints.NOT_REMOVED
    # what the scheduler holds, the guest who left, every other guest, the counts
    copies, old = _guests(reference), _guests(before)
    left = dict(victim=victim, mode=scheduler.preemption, before=old[victim])
    tables = [
        (SCHEDULER, reference, scheduler, {"victim": victim}),
        (LEFT, expected, guests[victim], left),
    ]
    tables += [(OTHERS, copies[g], q, {"g": g}) for g, q in guests.items() if g != victim]
    for table, want, got, context in tables:
        if d := first_difference(table, read(table, want), read(table, got), **context):
            yield d.message, *d.shown, d.hint
    # kvlab counts: Scheduler.preempt itself, _counted around a custom preempt in a day, and
    # nobody around a preempt called directly, so the learner's preempt changes no count
    if d := first_difference(COUNTED, read(COUNTED, before, old), read(COUNTED, scheduler, guests)):
        counted = _counts(reference, copies)[d.key]
        then = f" (kvlab then counts this preemption: {counted})" if counted != d.expected else ""
        yield d.message, f"{d.expected}, as before{then}", f"{d.got}", hints.COUNTS
    if value is not guests[victim]:
        hint = hints.RETURN_NONE if value is None else hints.RETURN_ID if value == victim else None
        yield "preempt returns the guest who left", f"the Sequence {victim}", short(value), hint


# --- the hotels ------------------------------------------------------------------------------


def _ask(fn, mode: str, running, waiting, num_blocks: int = 16, calls: int = 1) -> None:
    """The learner's preempt asked ``calls`` times of a scheduler of ``num_blocks`` rooms of 4
    beds with guests checked in in the order given: ``running`` rows are (seq_id, prompt_len,
    output_len, arrival, generated, computed, times preempted before), ``waiting`` rows
    (seq_id, prompt_len, output_len, arrival, status, generated)."""
    s = Scheduler(PagedCache(num_blocks, 4), preemption=mode)
    for seq_id, prompt, output, arrival, generated, computed, preempted in running:
        s.add(seq := Sequence(seq_id, prompt, output, arrival))
        seq.num_generated, seq.num_preemptions = generated, preempted
        s.admit(seq)
        seq.num_computed = computed
    for seq_id, prompt, output, arrival, status, generated in waiting:
        s.add(seq := Sequence(seq_id, prompt, output, arrival))
        seq.num_generated, seq.status = generated, status
    for call in range(1, calls + 1):
        again = f"call {call} of {calls} on the same scheduler: " if calls > 1 else ""
        judge_preempt(fn, s, again + scheduler_text(s))


# running in check-in order: cy came first, bo last (back after a preemption: it arrived early);
# di arrived last, ana holds the most rooms: each wrong choice is told apart
BUSY = dict(
    running=(
        ("cy", 6, 8, 1.0, 3, 8, 0),
        ("ana", 13, 4, 2.0, 1, 13, 0),
        ("di", 5, 6, 3.0, 2, 6, 0),
        ("bo", 3, 9, 0.5, 5, 7, 1),
    ),
    waiting=(("eve", 4, 2, 4.0, WAITING, 0), ("fay", 7, 3, 5.0, WAITING, 0)),
)
IN_TURN = dict(
    running=(("ana", 5, 4, 0.0, 2, 6, 0), ("bo", 8, 3, 0.0, 1, 8, 0), ("cy", 2, 6, 1.0, 0, 0, 0)),
    waiting=(("zed", 3, 5, 0.0, PREEMPTED, 2), ("eve", 4, 1, 2.0, WAITING, 0)),
    num_blocks=8,
    calls=4,
)
BUSY_CHECKS = {  # each check's preemption mode on the busy hotel, and what it asks
    "recompute": "the guest checked in last leaves, their rooms are freed, they wait first in line",
    "swap": "the same guest leaves, with their K and V kept (num_computed stays)",
}
for mode, name in BUSY_CHECKS.items():
    preempt_ex.check(f"{mode}: {name}")(functools.partial(_ask, mode=mode, **BUSY))
preempt_ex.check("every guest asked to leave in turn, then once more with nobody in the hotel")(
    functools.partial(_ask, mode="recompute", **IN_TURN)
)


# --- a day with the learner's preempt --------------------------------------------------------

# the lab's day, shrunk: 40 ShareGPT-like guests at an eighth of their length, 2 a step, in a
# hotel of 32 rooms of 8 beds, which asks guests to leave often
DAY = [
    Request(max(1, r.prompt_len // 8), max(1, r.output_len // 8), r.arrival)
    for r in sharegpt_like(40, seed=3, rate=2.0)
]
DAY_SETUP = dict(cache="paged", kv_capacity_tokens=256, max_seq_len=256, block_size=8)
DAY_TEXT = (
    "a day of 40 ShareGPT-like guests at an eighth of their length, 2 arriving a step "
    "(kvlab.grading.lab06.DAY), served by simulate(DAY, cache='paged', kv_capacity_tokens=256, "
    "max_seq_len=256, block_size=8)"
)


def _judged(fn, mode: str, calls, scheduler):
    """The learner's preempt as a simulated day calls it (``calls`` counts them, from 1): each
    call judged beside kvlab's."""
    where = (
        f"preemption {next(calls)} of {DAY_TEXT}, with preemption={mode!r} and "
        f"preempt=preempt; before it: {state_text(scheduler)}"
    )
    return judge_preempt(fn, scheduler, where)


# kvlab's objections to a preempt (Scheduler._counted, _make_room), and their hints
OBJECTIONS = {
    "without sending it away": hints.SENT_AWAY,
    "already has its token": hints.SERVED,
    "must return the Sequence": hints.RETURN_NONE,
}


def serve_day(preempt, mode: str):
    """``DAY`` simulated with ``preempt``; kvlab's objections to a preempt (a guest returned but
    not sent away, a guest who already had its token) become a report, not a traceback."""
    try:
        return simulate(DAY, preemption=mode, preempt=preempt, **DAY_SETUP)
    except (TypeError, ValueError) as error:
        hint = next((h for mark, h in OBJECTIONS.items() if mark in str(error)), None)
        if hint is None or learner_frames(error):
            raise
        where = f"{DAY_TEXT}, with preemption={mode!r} and preempt=preempt"
        raise CheckFailed("\n   ".join(explain_exception(error)), input=where, hint=hint) from None


@preempt_ex.check("a day with your preempt: every preemption, and the day's figures, as kvlab's")
def _preempt_day(fn):
    for mode in ("recompute", "swap"):
        got = serve_day(functools.partial(_judged, fn, mode, itertools.count(1)), mode)
        want = simulate(DAY, preemption=mode, **DAY_SETUP)
        same_figures(figures(got), figures(want), f"{DAY_TEXT}, preemption={mode!r}")
