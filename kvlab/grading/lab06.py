"""Checks for Lab 06: preemption and one scheduler step, judged against kvlab's Scheduler.

``preempt(scheduler)`` is called on hand-built hotels, then at every preemption of a simulated day,
each time beside kvlab's ``Scheduler.preempt`` on a copy of the same scheduler. What differs (who
left, the queue, the rooms, the status, ``num_computed``, the counts kvlab keeps itself, the value
returned) names the mistake.

``step(scheduler, now)`` runs short scripted days in an :class:`~kvlab.serve.Engine` beside an
engine that runs kvlab's own step (both with kvlab's preempt), compared after every step: the
report (finished, admitted, refused, preempted, scheduled) and the state (batch, queue, every
guest, the cache). kvlab's step is vLLM's order: retire, decode every running guest (preempting
when a bed is missing), then admit, and only in a step that preempted nobody, each newcomer with
its first token. At the first step that differs, the usual slips (kvlab's step with one mistake
put in: retiring late, admitting before decoding, admitting after a preemption, no first token or
two, jumping the queue, ignoring arrivals or max_batch, not counting the token, appending without
asking, not skipping a guest who left, or skipping only the PREEMPTED, ...) run the same day: the
one slip that agrees with kvlab's step until then and does exactly what the learner's step did in
that step gives the hint (a step that asks ``cache.refusal`` without the tokens still to generate
is seen directly). Where a day cannot tell two slips apart (by swap nobody is PREEMPTED), its
``second`` day does: the slip kept is the one that does there what the learner's step does.
The last check serves a small day with ``simulate(..., schedule=step)``, as the lab does, and
compares its figures. A step or preempt that hands the work to kvlab's scheduler fails
(``refuse_reference``). ``show_day(step, day)`` prints a day step by step, kvlab's beside the
learner's.
"""

from __future__ import annotations

import copy
import functools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kvlab.contiguous import ContiguousKVCache
from kvlab.grading.blame import exception_cause, explain_exception, learner_frames
from kvlab.grading.expect import CheckFailed, plural, short
from kvlab.grading.own_code import HANDOVER, refuse_reference
from kvlab.grading.registry import exercise
from kvlab.paged import PagedCache
from kvlab.scheduler import ScheduledStep, Scheduler, Sequence, SequenceStatus
from kvlab.serve import Engine, make_cache, simulate
from kvlab.workload import Request, sharegpt_like

WAITING, RUNNING, PREEMPTED, SWAPPED, FINISHED = SequenceStatus

PREEMPT_REFERENCE = (Scheduler.preempt, Scheduler._counted)
PREEMPT_TASK = "choosing the guest and sending them away"
STEP_REFERENCE = (
    Scheduler.step,
    Scheduler.schedule,
    Scheduler.retire,
    Scheduler._admit_arrived,
    Scheduler._make_room,
)
STEP_TASK = "scheduling the step"


# --- calling the learner's code --------------------------------------------------------------


def _call(fn, args: tuple, references: tuple, task: str, where: str | None = None):
    """``(value, None)``, or ``(None, error)`` when the learner's code raised. A hand-over to
    kvlab's scheduler fails the check (with ``where`` as its input); a function not written yet
    (NotImplementedError) passes through."""
    try:
        with refuse_reference(*references, learner=fn, task=task):
            return fn(*args), None
    except CheckFailed as failure:
        if failure.input is None:
            failure.input = where
        raise
    except NotImplementedError:
        raise
    except Exception as error:
        return None, error


def _raised(error: Exception, hint: str | None, **details) -> CheckFailed:
    """The failure for an error of the learner's code: the error and the line that raised it."""
    return CheckFailed(
        "\n   ".join(explain_exception(error)),
        hint=hint,
        cause=hint or exception_cause(error),
        **details,
    )


PASS_ID = (
    "the cache knows guests by their seq_id: pass seq.seq_id to its calls (release, "
    "can_append, append), not the Sequence"
)


FREE = (
    "the cache's check-out is release(seq_id) (free was the block manager's word in Lab 03): "
    "scheduler.cache.release(victim.seq_id)"
)
FREE_STEP = (
    "the cache's check-out is release(seq_id) (free was the block manager's word in Lab 03); "
    "to retire a guest, scheduler.finish(seq) checks it out of the cache and the batch"
)
POPLEFT = "scheduler.admit(seq) takes the guest off the queue itself: do not popleft() first"
WALK_QUEUE = (
    "scheduler.admit(seq) takes the guest off scheduler.waiting, the queue your for loop walks "
    "through: look at the head each time (while scheduler.waiting: seq = scheduler.waiting[0]) "
    "or walk a copy (for seq in list(scheduler.waiting))"
)
MAX_BATCH_NONE = (
    "max_batch None means no cap: test scheduler.max_batch is not None first (if "
    "scheduler.max_batch is not None and len(scheduler.running) >= scheduler.max_batch)"
)


def _error_slip(error: Exception, step: bool = False) -> str | None:
    """The hint for an error whose message names its mistake (``step``: raised in 06.step)."""
    text = str(error)
    if isinstance(error, KeyError) and "Sequence(seq_id=" in text:
        return PASS_ID
    if isinstance(error, TypeError) and "must be a kvlab.scheduler.Sequence" in text:
        return SEQ_TO_SCHEDULER
    if isinstance(error, AttributeError) and error.name == "free":
        if isinstance(error.obj, PagedCache | ContiguousKVCache):
            return FREE_STEP if step else FREE
    if isinstance(error, ValueError) and "is not in the queue (status" in text:
        return POPLEFT  # Scheduler.admit of a guest the learner took off the queue
    frames = learner_frames(error)
    line = (frames[-1].line or "") if frames else ""
    if isinstance(error, TypeError) and "NoneType" in text and "not supported between" in text:
        if "max_batch" in line:
            return MAX_BATCH_NONE
    if isinstance(error, RuntimeError) and text == "deque mutated during iteration":
        if step and "waiting" in line and line.lstrip().startswith("for "):
            return WALK_QUEUE
    return None


# --- describing guests, queues and caches ----------------------------------------------------


class _Odd:
    """Something that should have been a Sequence or a list of them: shown as it is, equal to
    nothing the reference gives."""

    def __init__(self, value, what: str):
        self.value, self.what = value, what

    def __repr__(self):
        return f"{short(self.value, 60)} ({self.what})"


def _ids(items) -> list | _Odd:
    """seq_ids of a list of sequences; anything else stays visible as odd."""
    if not isinstance(items, list | tuple | deque):
        return _Odd(items, "not a list")
    return [s.seq_id if isinstance(s, Sequence) else _Odd(s, "not a Sequence") for s in items]


def _one(item):
    if item is None:
        return None
    return item.seq_id if isinstance(item, Sequence) else _Odd(item, "not a Sequence")


def _show(value) -> str:
    """A list of seq_ids as ``[ann, ben]``, a guest by name, nobody as ``nobody``."""
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    return "nobody" if value is None else str(value)


def _free_text(cache) -> str:
    if isinstance(cache, PagedCache):
        manager = cache.manager
        return f"{manager.num_free_blocks} of {plural(manager.num_blocks, 'room')} free"
    return f"{cache.capacity - cache.allocated_tokens} of {plural(cache.capacity, 'bed')} free"


def _cache_text(cache) -> str:
    if isinstance(cache, PagedCache):
        m = cache.manager
        return f"PagedCache({plural(m.num_blocks, 'room')} of {m.block_size} beds)"
    if isinstance(cache, ContiguousKVCache):
        booking = {"max": "max_seq_len", "pow2": "a power of two", "exact": "the final length"}
        return (
            f"ContiguousKVCache({plural(cache.capacity, 'bed')}, each guest booking "
            f"{booking[cache.policy]} up front)"
        )
    return type(cache).__name__


def _guest_text(seq: Sequence) -> str:
    held = f"{seq.num_tokens} tokens"
    back = ", back after a preemption" if seq.num_preemptions else ""
    return f"{seq.seq_id} (arrived {seq.arrival:.3g}, {held}{back})"


def _state_text(s: Scheduler, limit: int = 6) -> str:
    """Who is running (in check-in order) and waiting, and what is free."""

    def listed(seqs, text):
        seqs = list(seqs)
        shown = ", ".join(text(q) for q in seqs[:limit])
        more = f", … ({len(seqs)} in all)" if len(seqs) > limit else ""
        return (shown + more) or "nobody"

    running = listed(s.running, _guest_text)
    waiting = listed(s.waiting, lambda q: f"{q.seq_id} (arrives {q.arrival:.3g})")
    return f"running, in check-in order: {running}; waiting: {waiting}; {_free_text(s.cache)}"


def _scheduler_text(s: Scheduler) -> str:
    return f"{_cache_text(s.cache)}, preemption={s.preemption!r}; {_state_text(s)}"


def _cache_diff(expected, got) -> tuple[str, str]:
    """Two cache states, shown by the guests whose rooms (or beds) differ."""

    def guest(state, g):
        if g not in state.tokens:
            return f"{g}: checked out"
        table = list(state.block_tables[g])
        if state.kind == "paged":
            return f"{g}: {state.tokens[g]} tokens in rooms {table}"
        return f"{g}: {state.tokens[g]} tokens in beds {table[0]}…{table[-1]}"

    guests = dict.fromkeys([*expected.tokens, *got.tokens])
    differ = [
        g
        for g in guests
        if expected.tokens.get(g) != got.tokens.get(g)
        or list(expected.block_tables.get(g, ())) != list(got.block_tables.get(g, ()))
    ] or list(guests)
    return "; ".join(guest(expected, g) for g in differ), "; ".join(guest(got, g) for g in differ)


# --- preempt ---------------------------------------------------------------------------------

preempt_ex = exercise("06.preempt", "ask the guest checked in last to leave")

OLDEST = (
    "that is the guest who checked in first (running[0]): ask the one who checked in last "
    "(running[-1], what running.pop() takes). It has done the least work, so the least is lost, "
    "and the guests who came first keep being served first"
)
LAST_ARRIVED = (
    "that is the guest who arrived last, not the one who checked in last: a guest back after a "
    "preemption checks in late although it arrived early. scheduler.running is in check-in "
    "order: take running[-1]"
)
MOST_ROOMS = (
    "that is the guest holding the most rooms: ask the guest checked in last (running[-1]). It "
    "has done the least work, and the guests who came first keep being served first"
)
NOT_REMOVED = (
    "take the guest out of scheduler.running: a guest who left is not running "
    "(running.pop() picks the last guest and removes it)"
)
LEAK = (
    "free the guest's rooms with scheduler.cache.release(victim.seq_id): otherwise they stay "
    "booked with nobody using them (the rooms leak)"
)
NOT_QUEUED = (
    "put the guest back in scheduler.waiting, at the front (waiting.appendleft(victim)), so "
    "they come back when rooms are free"
)
BACK_OF_QUEUE = (
    "the guest goes to the front of the queue (waiting.appendleft), not the back: they came "
    "before everyone waiting now and keep their place (first come, first served)"
)
NOT_A_DEQUE = (
    "change the queue in place with scheduler.waiting.appendleft(victim): the scheduler keeps "
    "using its own deque"
)
NOT_A_LIST = (
    "change scheduler.running in place (running.pop()): the scheduler keeps using its own list"
)
STATUS_UNSET = (
    "set the guest's status: SequenceStatus.PREEMPTED by recompute, SequenceStatus.SWAPPED by "
    "swap (a running status would say they are still in the hotel)"
)
STATUS_WAITING = (
    "WAITING is for a guest who never ran: set SequenceStatus.PREEMPTED by recompute, "
    "SequenceStatus.SWAPPED by swap (check-in brings a swapped guest's K and V back)"
)
STATUS_FOR_MODE = {
    "recompute": (
        "scheduler.preemption is 'recompute': the guest's status is SequenceStatus.PREEMPTED "
        "(its K and V will be computed again); SWAPPED is for swap"
    ),
    "swap": (
        "scheduler.preemption is 'swap': the guest's status is SequenceStatus.SWAPPED (its K and "
        "V wait in CPU memory); PREEMPTED is for recompute"
    ),
}
KEEPS_COMPUTED = (
    "by recompute the guest's K and V are dropped: set victim.num_computed = 0, or the engine "
    "would skip recomputing its prompt and answer so far when it comes back"
)
ZEROES_COMPUTED = (
    "by swap the K and V are copied to CPU memory and kept: leave num_computed as it is (only "
    "recompute sets it to 0)"
)
ZEROES_GENERATED = (
    "leave num_generated alone: the answer so far is kept (by recompute it is read again with "
    "the prompt, not generated again)"
)
RETURN_NONE = (
    "return the guest you asked to leave (the Sequence): the scheduler's step lists it in "
    "ScheduledStep.preempted"
)
RETURN_ID = "return the Sequence itself, not its seq_id"
COUNTS = (
    "kvlab counts preemptions for you: do not change num_preemptions (the scheduler's or the "
    "guest's), nor recompute_tokens or swapped_out_tokens; the scheduler adds this preemption "
    "up once your preempt returns"
)
SENT_AWAY = (
    "send the guest away completely: out of scheduler.running (running.pop()), its rooms "
    "released (cache.release(victim.seq_id)), status PREEMPTED by recompute or SWAPPED by swap"
)
SERVED = (
    "the guest checked in last leaves (running[-1]): a guest earlier in scheduler.running may "
    "already have its token for this step"
)
WRONG_GUEST = "06.preempt: the wrong guest"
# what kvlab keeps count of itself around a custom preempt (Scheduler._counted)
COUNTERS = ("num_preemptions", "recompute_tokens", "swapped_out_tokens", "swapped_in_tokens")


def _victim_slip(chosen, running: list[Sequence]) -> str | None:
    """Why the learner may have picked ``chosen``: the usual wrong guests, checked in order."""
    if chosen == running[0].seq_id:
        return OLDEST
    if chosen == max(running, key=lambda q: q.arrival).seq_id:
        return LAST_ARRIVED
    if chosen == max(running, key=lambda q: q.num_tokens).seq_id:
        return MOST_ROOMS
    return None


def _fields(seq: Sequence) -> dict:
    return {
        "status": seq.status,
        "num_generated": seq.num_generated,
        "num_computed": seq.num_computed,
        "prompt_len": seq.prompt_len,
        "output_len": seq.output_len,
        "arrival": seq.arrival,
    }


def _field_text(value) -> str:
    return f"SequenceStatus.{value.name}" if isinstance(value, SequenceStatus) else short(value)


def judge_preempt(fn, scheduler: Scheduler, where: str, replay: str | None = None):
    """Call the learner's ``fn(scheduler)`` and kvlab's ``Scheduler.preempt`` on a copy made
    before; fail the check at the first difference. Returns what ``fn`` returned. With nobody
    running, raising anything is fine, and so is changing nothing."""
    reference = copy.deepcopy(scheduler)
    reference.custom_preempt = None  # kvlab's own choice, even inside a day run with the learner's
    running = list(scheduler.running)
    guests = {q.seq_id: q for q in [*running, *scheduler.waiting]}
    before = {g: _fields(q) for g, q in guests.items()}
    waiting_before = _ids(scheduler.waiting)
    cache_before = scheduler.cache.state()
    counts_before = _counts(scheduler, guests)
    value, error = _call(fn, (scheduler,), PREEMPT_REFERENCE, PREEMPT_TASK, where)

    def fail(message, hint=None, cause=None, **details):
        raise CheckFailed(
            message,
            input=where,
            replay=replay,
            hint=hint,
            cause=cause or hint or f"06: {message}",
            **details,
        )

    if not running:
        changed = _ids(scheduler.waiting) != waiting_before or (
            scheduler.cache.state() != cache_before
        )
        if error is None and changed:
            fail("with nobody in the hotel there is nobody to ask to leave: nothing may change")
        return value
    if error is not None:
        raise _raised(error, _error_slip(error), input=where, replay=replay)
    expected = Scheduler.preempt(reference)
    victim = expected.seq_id
    if not isinstance(scheduler.running, list):
        fail("scheduler.running must stay a list", got=short(scheduler.running), hint=NOT_A_LIST)
    if not isinstance(scheduler.waiting, deque):
        fail("scheduler.waiting must stay a deque", got=short(scheduler.waiting), hint=NOT_A_DEQUE)

    # who left: taken out of running, else put in the queue, else released, else returned
    now_running = _ids(scheduler.running)
    now_waiting = _ids(scheduler.waiting)
    state = scheduler.cache.state()
    ids = [q.seq_id for q in running]
    removed = [g for g in ids if g not in now_running]
    queued = [g for g in now_waiting if g not in waiting_before]
    released = [g for g in ids if g not in state.tokens]
    returned = [value.seq_id] if isinstance(value, Sequence) else []
    chosen = removed or queued or released or returned
    if len(removed) > 1:
        fail("one call asks one guest to leave", expected=_show([victim]), got=_show(removed))
    if not chosen:
        fail(
            "nothing changed: a guest should have left",
            expected=f"{victim} leaves (checked in last)",
            got="everybody stays",
        )
    if chosen[0] != victim:
        # one cause whichever wrong guest: a rule that picked the guest who arrived last here
        # may pick the one checked in first in the next hotel (the same problem, not a new one)
        fail(
            "the wrong guest was asked to leave",
            expected=f"{victim} (checked in last)",
            got=str(chosen[0]),
            hint=_victim_slip(chosen[0], running),
            cause=WRONG_GUEST,
        )
    if not removed:
        fail(
            f"{victim} is still in scheduler.running",
            expected=_show(_ids(reference.running)),
            got=_show(now_running),
            hint=NOT_REMOVED,
        )
    if now_running != _ids(reference.running):
        fail(
            "the guests who stay keep their places in scheduler.running (check-in order)",
            expected=_show(_ids(reference.running)),
            got=_show(now_running),
        )
    if victim in state.tokens:
        want, got = _cache_diff(reference.cache.state(), state)
        fail(f"{victim}'s rooms are still booked", expected=want, got=got, hint=LEAK)
    if state != reference.cache.state():
        want, got = _cache_diff(reference.cache.state(), state)
        fail("only the leaving guest's rooms are freed", expected=want, got=got)
    expected_queue = _ids(reference.waiting)
    if now_waiting != expected_queue:
        hint = None
        if victim not in now_waiting:
            hint = NOT_QUEUED
        elif now_waiting == [*expected_queue[1:], victim]:
            hint = BACK_OF_QUEUE
        fail(
            f"{victim} waits first in line in scheduler.waiting",
            expected=_show(expected_queue),
            got=_show(now_waiting),
            hint=hint,
        )

    mode = scheduler.preemption
    got, want = _fields(guests[victim]), _fields(expected)
    for field, hint in _victim_hints(mode, before[victim], got).items():
        if got[field] != want[field]:
            fail(
                f"{victim}.{field} after leaving ({mode})",
                expected=_field_text(want[field]),
                got=_field_text(got[field]),
                hint=hint,
            )
    copies = {q.seq_id: q for q in [*reference.running, *reference.waiting]}
    for g, q in guests.items():
        if g != victim and _fields(q) != _fields(copies[g]):
            field = next(f for f, v in _fields(q).items() if v != _fields(copies[g])[f])
            fail(
                f"only the leaving guest changes, yet {g}.{field} changed",
                expected=_field_text(_fields(copies[g])[field]),
                got=_field_text(_fields(q)[field]),
            )
    # kvlab counts: Scheduler.preempt itself, _counted around a custom preempt in a day, and
    # nobody around a preempt called directly, so the learner's preempt changes no count
    counts, counted = _counts(scheduler, guests), _counts(reference, copies)
    for name, was in counts_before.items():
        if counts[name] != was:
            then = f" (kvlab then counts this preemption: {counted[name]})"
            fail(
                f"{name} changed inside preempt",
                expected=f"{was}, as before" + (then if counted[name] != was else ""),
                got=f"{counts[name]}",
                hint=COUNTS,
            )
    if value is not guests[victim]:
        hint = RETURN_NONE if value is None else RETURN_ID if value == victim else None
        fail(
            "preempt returns the guest who left",
            expected=f"the Sequence {victim}",
            got=short(value),
            hint=hint,
        )
    return value


def _counts(scheduler: Scheduler, guests: dict) -> dict:
    """The counts kvlab keeps itself: the scheduler's, and every guest's num_preemptions."""
    counts = {f"scheduler.{name}": getattr(scheduler, name, None) for name in COUNTERS}
    for g, q in guests.items():
        counts[f"{g}.num_preemptions"] = q.num_preemptions
    return counts


def _victim_hints(mode: str, before: dict, got: dict) -> dict:
    """The victim's fields, in the order they are judged, each with the hint its usual slip
    gets."""
    status = got["status"]
    if status is RUNNING:
        status_hint = STATUS_UNSET
    elif status is WAITING:
        status_hint = STATUS_WAITING
    elif status in (PREEMPTED, SWAPPED):
        status_hint = STATUS_FOR_MODE[mode]
    else:
        status_hint = None
    computed_hint = None
    if mode == "recompute" and got["num_computed"] == before["num_computed"]:
        computed_hint = KEEPS_COMPUTED
    elif mode == "swap" and got["num_computed"] == 0:
        computed_hint = ZEROES_COMPUTED
    return {
        "status": status_hint,
        "num_computed": computed_hint,
        "num_generated": ZEROES_GENERATED if got["num_generated"] == 0 else None,
        "prompt_len": None,
        "output_len": None,
        "arrival": None,
    }


def _hotel(mode: str, running, waiting, num_blocks: int = 16, block_size: int = 4) -> Scheduler:
    """A scheduler with guests checked in in the order given: ``running`` rows are (seq_id,
    prompt_len, output_len, arrival, generated, computed, times preempted before), ``waiting``
    rows (seq_id, prompt_len, output_len, arrival, status, generated)."""
    s = Scheduler(PagedCache(num_blocks, block_size), preemption=mode)
    for seq_id, prompt, output, arrival, generated, computed, preempted in running:
        seq = Sequence(seq_id, prompt, output, arrival)
        seq.num_generated, seq.num_preemptions = generated, preempted
        s.add(seq)
        s.admit(seq)
        seq.num_computed = computed
    for seq_id, prompt, output, arrival, status, generated in waiting:
        seq = Sequence(seq_id, prompt, output, arrival)
        seq.num_generated = generated
        s.add(seq)
        seq.status = status
    return s


# running in check-in order: cy came first, bo last (back after a preemption: it arrived early);
# di arrived last, ana holds the most rooms: each wrong choice is told apart
BUSY_RUNNING = (
    ("cy", 6, 8, 1.0, 3, 8, 0),
    ("ana", 13, 4, 2.0, 1, 13, 0),
    ("di", 5, 6, 3.0, 2, 6, 0),
    ("bo", 3, 9, 0.5, 5, 7, 1),
)
BUSY_WAITING = (("eve", 4, 2, 4.0, WAITING, 0), ("fay", 7, 3, 5.0, WAITING, 0))


def _busy(fn, mode: str) -> None:
    s = _hotel(mode, BUSY_RUNNING, BUSY_WAITING)
    judge_preempt(fn, s, _scheduler_text(s))


@preempt_ex.check(
    "recompute: the guest checked in last leaves, their rooms are freed, they wait first in line"
)
def _recompute(fn):
    _busy(fn, "recompute")


@preempt_ex.check("swap: the same guest leaves, with their K and V kept (num_computed stays)")
def _swap(fn):
    _busy(fn, "swap")


@preempt_ex.check("every guest asked to leave in turn, then once more with nobody in the hotel")
def _in_turn(fn):
    s = _hotel(
        "recompute",
        (("ana", 5, 4, 0.0, 2, 6, 0), ("bo", 8, 3, 0.0, 1, 8, 0), ("cy", 2, 6, 1.0, 0, 0, 0)),
        (("zed", 3, 5, 0.0, PREEMPTED, 2), ("eve", 4, 1, 2.0, WAITING, 0)),
        num_blocks=8,
    )
    for call in range(1, 5):
        where = f"call {call} of 4 on the same scheduler: {_scheduler_text(s)}"
        judge_preempt(fn, s, where)


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
DAY_FIGURES = ("recompute_tokens", "swapped_tokens")


class _JudgedPreempt:
    """The learner's preempt as a simulated day calls it: each call judged beside kvlab's."""

    def __init__(self, fn, mode: str):
        self.fn, self.mode, self.calls, self.inside = fn, mode, 0, False

    def __call__(self, scheduler):
        if self.inside:  # scheduler.preempt is the learner's own preempt in this day
            raise CheckFailed(
                "your preempt calls scheduler.preempt(), which here is your preempt itself",
                hint=f"{PREEMPT_TASK} yourself is the exercise: do not call scheduler.preempt()",
                cause=HANDOVER,
            )
        self.calls += 1
        where = (
            f"preemption {self.calls} of {DAY_TEXT}, with preemption={self.mode!r} and "
            f"preempt=preempt; before it: {_state_text(scheduler)}"
        )
        self.inside = True
        try:
            return judge_preempt(self.fn, scheduler, where)
        finally:
            self.inside = False


def _figures(result) -> dict:
    return {**result.summary(), **{f: getattr(result, f) for f in DAY_FIGURES}}


def _same_figures(got: dict, want: dict, where: str, token_hint: str | None = None) -> None:
    """Fail when a figure of the day differs; ``token_hint`` is the hint when only the tokens
    kvlab counts at a preemption (recomputed, swapped) differ."""
    differ = [k for k in want if got.get(k) != want[k]]
    if differ:
        tokens = {"recompute_tokens", "swapped_tokens"}
        hint = token_hint if set(differ) <= tokens else None

        def text(figures):
            return ", ".join(
                f"{k} {figures[k]:.6g}"
                if isinstance(figures.get(k), int | float)
                else f"{k} {figures.get(k)!r}"
                for k in differ
            )

        raise CheckFailed(
            "the day's figures differ from kvlab's",
            input=where,
            expected=text(want),
            got=text(got),
            hint=hint,
        )


def _serve_day(preempt, mode: str):
    """``DAY`` simulated with ``preempt``; kvlab's objections to a preempt (a guest returned but
    not sent away, a guest who already had its token) become a report, not a traceback."""
    try:
        return simulate(DAY, preemption=mode, preempt=preempt, **DAY_SETUP)
    except (TypeError, ValueError) as error:
        objections = {
            "without sending it away": SENT_AWAY,
            "already has its token": SERVED,
            "must return the Sequence": RETURN_NONE,
        }
        hint = next((h for mark, h in objections.items() if mark in str(error)), None)
        if hint is None or learner_frames(error):
            raise
        raise CheckFailed(
            "\n   ".join(explain_exception(error)),
            input=f"{DAY_TEXT}, with preemption={mode!r} and preempt=preempt",
            hint=hint,
        ) from None


@preempt_ex.check("a day with your preempt: every preemption, and the day's figures, as kvlab's")
def _preempt_day(fn):
    for mode in ("recompute", "swap"):
        got = _serve_day(_JudgedPreempt(fn, mode), mode)
        want = simulate(DAY, preemption=mode, **DAY_SETUP)
        _same_figures(_figures(got), _figures(want), f"{DAY_TEXT}, preemption={mode!r}")


# --- step ------------------------------------------------------------------------------------

step_ex = exercise("06.step", "one scheduler step: retire, decode, admit")

RETIRE_AT_START = (
    "retire at the start of the step, before decoding: a guest whose last token is decoded in "
    "this step checks out at the start of the next one (and is listed in out.finished then)"
)
RETIRE_EARLY = (
    "a guest retires when num_generated == output_len, after its last token: retired at "
    "output_len - 1, its answer is one token short"
)
NO_RETIRE = (
    "retire first: every running guest with num_generated == output_len checks out "
    "(scheduler.finish(seq)) and goes in out.finished; a guest never retired keeps decoding "
    "past its answer"
)
RETIRE_COPY = (
    "iterate over a copy (for seq in list(scheduler.running)): scheduler.finish removes the "
    "guest from the list you are walking through, so the guest after it is skipped"
)
ADMIT_FIRST = (
    "the guests in the hotel go first: decode every running guest (making room with "
    "scheduler.preempt()), then admit into what is left. A guest admitted before the decoding "
    "takes beds a running guest needs, and may be asked to leave in its own step"
)
TWICE = (
    "admit after the decode loop: a guest admitted before it gets its first token from "
    "decode(seq) and a second one from the loop (the guests in the hotel go first)"
)
FIRST_TOKEN = (
    "a guest checked in computes its first token in the same step: call decode(seq) right after "
    "scheduler.admit(seq) (cache.refusal counted a bed for that token)"
)
HOLD = (
    "admit nobody in a step that had to preempt (while not out.preempted and ...): memory ran "
    "short, and the guest just asked to leave waits first in line"
)
FCFS = (
    "first come, first served: stop at the first waiting guest who does not fit (break), even "
    "if a guest behind would fit; otherwise a long prompt could wait forever"
)
ARRIVAL = "a guest checks in only once arrived: stop at the first waiting guest with arrival > now"
ARRIVAL_STRICT = "a guest arriving exactly at now may check in: admit while arrival <= now"
MAX_BATCH = (
    "stop admitting when the batch is full: len(scheduler.running) >= scheduler.max_batch "
    "(None means no cap)"
)
FULL_NOT_REFUSED = (
    "out.refused is for a guest the cache refused; stopping at max_batch refuses nobody: just "
    "stop, and leave out.refused as it is"
)
READMIT = (
    "a guest back after a preemption (status PREEMPTED or SWAPPED) waits first in line and checks "
    "in like any other: ask scheduler.cache.refusal(seq.num_tokens, seq.remaining), then "
    "scheduler.admit(seq)"
)
MAX_BATCH_OFF = "the batch is full when len(scheduler.running) == max_batch: stop at >=, not >"
REFUSAL_TOKENS = (
    "a guest back after a preemption holds its prompt and the tokens generated so far: ask "
    "scheduler.cache.refusal(seq.num_tokens, seq.remaining), not seq.prompt_len"
)
REFUSAL_REMAINING = (
    "tell the cache the tokens still to generate too: scheduler.cache.refusal(seq.num_tokens, "
    "seq.remaining) (a paged cache counts a bed for the first of them, a contiguous one books "
    "them all up front)"
)
ASK_ADMIT = (
    "ask before checking in: scheduler.cache.refusal(seq.num_tokens, seq.remaining) is None when "
    "the guest fits; when it is not, the guest waits (out.refused, out.refusal) and so does "
    "everyone behind"
)
COUNT = "count the new token: seq.num_generated += 1 after cache.append, or no guest ever finishes"
ASK_APPEND = (
    "ask before taking a bed: while not scheduler.cache.can_append(seq.seq_id), call "
    "scheduler.preempt(); append only once there is room"
)
SKIP = (
    "skip the guests asked to leave earlier in this step (seq.status is not "
    "SequenceStatus.RUNNING): their rooms are released, so the cache no longer knows them"
)
SKIP_SWAPPED = (
    "skip every guest that is not running (if seq.status is not SequenceStatus.RUNNING: "
    "continue), not only the PREEMPTED ones: by swap a guest asked to leave is SWAPPED, its rooms "
    "released, so the cache no longer knows it"
)
NOT_NOTED = (
    "note every guest scheduler.preempt() sends away in out.preempted (out.preempted.append("
    "victim)): the step reports them, and the admitting reads it (in a step that preempted, "
    "nobody checks in, so nobody is refused either)"
)
SELF = (
    "when scheduler.preempt() returns the guest you are making room for, that guest has left: "
    "stop (break) without appending for it; it gets no token this step"
)
MEMORY = (
    "a cache call ran out of memory: ask first (cache.refusal before scheduler.admit, "
    "cache.can_append before cache.append) and act only when the answer allows it"
)
USE_PREEMPT = (
    "preempt with scheduler.preempt(): it sends the guest away and keeps the scheduler's counts "
    "(num_preemptions, tokens to recompute or swap) that the day's figures report"
)
COUNTED_TWICE = (
    "scheduler.preempt() counts the preemption itself: do not change "
    "scheduler.num_preemptions in step"
)
SEQ_TO_SCHEDULER = (
    "scheduler.admit takes the Sequence itself, not its seq_id (the cache's calls take the seq_id)"
)
RETURN_STEP = "return the ScheduledStep you filled (out)"
STEP_TYPE = "step returns a ScheduledStep (from kvlab.scheduler), filled with what it did"
SEQ_NOT_ID = "list the Sequence objects in the ScheduledStep, not their seq_ids"
REPORTED = {
    "out.finished": "list every guest retired in this step in out.finished",
    "out.admitted": "list every guest checked in in this step in out.admitted",
    "out.refused": (
        "when the guest at the head of the queue does not fit, report it: out.refused = seq, "
        "out.refusal = the cache's answer"
    ),
    "out.refusal": "out.refusal is what scheduler.cache.refusal(...) returned for out.refused",
    "out.preempted": "list every guest scheduler.preempt() sent away in out.preempted",
    "out.scheduled": "list every guest that got a bed for its next token in out.scheduled",
}

REPORT_KEYS = tuple(REPORTED)
STATE_KEYS = (
    "scheduler.running",
    "scheduler.waiting",
    "status",
    "num_generated",
    "num_computed",
    "the cache",
    "scheduler.num_preemptions",
)


def slipped_step(
    scheduler: Scheduler,
    now: float,
    *,
    retire: str = "first",
    order: str = "decode first",
    hold: bool = True,
    first_token: bool = True,
    fcfs: bool = True,
    arrival: str = "<=",
    cap: str = ">=",
    ask: str = "num_tokens, remaining",
    count: bool = True,
    append: str = "ask",
    skip: bool | str = True,
    stop: bool = True,
    full_refuses: bool = False,
    readmit: bool = True,
    preempt: str = "scheduler",
    note: bool = True,
) -> ScheduledStep:
    """kvlab's step written the way the lab asks for it (retire, decode the running guests,
    admit), with the usual slips as options (the defaults are right): ``retire`` "first" /
    "after decode" / "last" / "never" / "live" (over the list finish changes) / "early" (at
    output_len - 1), ``order="admit first"`` admits before decoding (the running guests,
    newcomers included, are decoded after), ``hold=False`` admits in a step that preempted, ``first_token=False`` gives a
    newcomer no token in its first step, ``fcfs=False`` admits past a guest who does not fit,
    ``arrival`` "<=" / "<" / "any", ``cap`` ">=" / ">" / "none", ``ask`` "num_tokens,
    remaining" / "prompt_len, remaining" / "num_tokens" / "nothing", ``count=False`` never counts
    the token, ``append="blind"`` appends without asking, ``skip=False`` does not skip guests
    preempted earlier in the step (``skip="preempted"`` skips only the PREEMPTED ones, not the
    SWAPPED), ``stop=False`` keeps going for a guest who was itself
    preempted, ``full_refuses=True`` reports the guest stopped by max_batch in out.refused,
    ``readmit=False`` stops at a guest back after a preemption, ``preempt="by hand"`` sends the
    guest checked in last away itself, as recompute does whatever ``scheduler.preemption`` says
    (``"by hand, counted"`` also counts it in ``scheduler.num_preemptions``), ``note=False``
    leaves the guests sent away out of out.preempted (so the admitting does not stop)."""
    out = ScheduledStep()

    def send_away():
        if preempt == "scheduler":
            return scheduler.preempt()
        victim = scheduler.running.pop()
        scheduler.cache.release(victim.seq_id)
        victim.num_computed = 0
        victim.status = PREEMPTED
        scheduler.waiting.appendleft(victim)
        if preempt == "by hand, counted":
            scheduler.num_preemptions += 1
        return victim

    def decode(seq):  # given in the lab
        scheduler.cache.append(seq.seq_id)
        if count:
            seq.num_generated += 1
        out.scheduled.append(seq)

    def retire_done():
        last = 1 if retire == "early" else 0
        for seq in scheduler.running if retire == "live" else list(scheduler.running):
            if seq.num_generated == seq.output_len - last:
                scheduler.finish(seq)
                out.finished.append(seq)

    def decode_running():
        for seq in list(scheduler.running):
            if skip == "preempted" and seq.status is PREEMPTED:
                continue
            if skip is True and seq.status is not RUNNING:
                continue
            if append == "ask":
                while not scheduler.cache.can_append(seq.seq_id):
                    victim = send_away()
                    if note:
                        out.preempted.append(victim)
                    if stop and victim is seq:
                        break
                else:
                    decode(seq)
            else:
                decode(seq)

    def admit_arrived():
        waiting, i = scheduler.waiting, 0
        while i < len(waiting) and not (hold and out.preempted):
            seq = waiting[i]
            if arrival == "<=" and seq.arrival > now or arrival == "<" and seq.arrival >= now:
                break
            full = scheduler.max_batch is not None and (
                cap == ">="
                and len(scheduler.running) >= scheduler.max_batch
                or cap == ">"
                and len(scheduler.running) > scheduler.max_batch
            )
            if full:
                if full_refuses:
                    out.refused = seq
                break
            if not readmit and seq.status is not WAITING:
                break
            tokens = seq.prompt_len if ask.startswith("prompt_len") else seq.num_tokens
            refusal = None
            if ask.endswith("remaining"):
                refusal = scheduler.cache.refusal(tokens, seq.remaining)
            elif ask == "num_tokens":
                refusal = scheduler.cache.refusal(tokens)
            if refusal is not None:
                if out.refused is None:
                    out.refused, out.refusal = seq, refusal
                if fcfs:
                    break
                i += 1
                continue
            scheduler.admit(seq)
            out.admitted.append(seq)
            if first_token:
                decode(seq)

    if retire in ("first", "live", "early"):
        retire_done()
    if order == "admit first":
        admit_arrived()
        decode_running()
    else:
        decode_running()
        if retire == "after decode":
            retire_done()
        admit_arrived()
    if retire == "last":
        retire_done()
    return out


STEP_SLIPS = (
    (dict(retire="after decode"), RETIRE_AT_START),
    (dict(retire="last"), RETIRE_AT_START),
    (dict(retire="never"), NO_RETIRE),
    (dict(retire="live"), RETIRE_COPY),
    (dict(retire="early"), RETIRE_EARLY),
    (dict(order="admit first", first_token=False), ADMIT_FIRST),
    (dict(order="admit first"), TWICE),
    (dict(first_token=False), FIRST_TOKEN),
    (dict(hold=False), HOLD),
    (dict(fcfs=False), FCFS),
    (dict(arrival="any"), ARRIVAL),
    (dict(arrival="<"), ARRIVAL_STRICT),
    (dict(cap="none"), MAX_BATCH),
    (dict(cap=">"), MAX_BATCH_OFF),
    (dict(full_refuses=True), FULL_NOT_REFUSED),
    (dict(readmit=False), READMIT),
    (dict(ask="prompt_len, remaining"), REFUSAL_TOKENS),
    (dict(ask="num_tokens"), REFUSAL_REMAINING),
    (dict(ask="nothing"), ASK_ADMIT),
    (dict(count=False), COUNT),
    (dict(append="blind"), ASK_APPEND),
    (dict(skip=False), SKIP),
    (dict(skip="preempted"), SKIP_SWAPPED),
    (dict(stop=False), SELF),
    (dict(preempt="by hand"), USE_PREEMPT),
    (dict(preempt="by hand, counted"), USE_PREEMPT),
    (dict(note=False), NOT_NOTED),
)


def _view(out, scheduler: Scheduler, guests: list[Sequence]) -> dict:
    """What a step did, in the order a difference is reported: its report, then the state."""
    refusal = getattr(out, "refusal", None)
    return {
        "out.finished": _ids(out.finished),
        "out.admitted": _ids(out.admitted),
        "out.refused": _one(out.refused),
        "out.refusal": None if refusal is None else type(refusal).__name__,
        "out.preempted": _ids(out.preempted),
        "out.scheduled": _ids(out.scheduled),
        "scheduler.running": _ids(scheduler.running),
        "scheduler.waiting": _ids(scheduler.waiting),
        "status": {q.seq_id: q.status for q in guests},
        "num_generated": {q.seq_id: q.num_generated for q in guests},
        "num_computed": {q.seq_id: q.num_computed for q in guests},
        "the cache": scheduler.cache.state(),
        "scheduler.num_preemptions": scheduler.num_preemptions,
    }


def _shown_pair(key: str, expected, got) -> tuple[str, str]:
    if key == "the cache":
        return _cache_diff(expected, got)
    if isinstance(expected, dict) and isinstance(got, dict):
        differ = [g for g in expected if expected[g] != got.get(g)]

        def text(d):
            return ", ".join(
                f"{g}: {_field_text(d.get(g)).replace('SequenceStatus.', '')}" for g in differ
            )

        return text(expected), text(got)
    return _show(expected), _show(got)


class _Stopped(Exception):
    """The learner's step raised, or returned what a ScheduledStep should be: the day stops."""


class _Captured:
    """A schedule function for an Engine that keeps what each step did (before the engine's own
    bookkeeping): the reference's, a slip's, or the learner's (guarded, checked for type)."""

    def __init__(self, step, guests: list[Sequence], learner: bool = False):
        self.step, self.guests, self.learner = step, guests, learner
        self.now = 0.0
        self.view = self.value = self.error = None
        self.unsized = False  # the learner asked cache.refusal without the tokens to generate

    def __call__(self, scheduler, now):
        self.now = now
        self.unsized = False
        if self.learner:
            where = f"step(scheduler, now={now:g})"
            value, self.error = _call(self.step, (scheduler, now), STEP_REFERENCE, STEP_TASK, where)
        else:
            try:
                value, self.error = self.step(scheduler, now), None
            except Exception as error:  # a slip run from the learner's state raises
                value, self.error = None, error
        self.value = value
        if self.error is not None or not _well_formed(value):
            raise _Stopped
        self.view = _view(value, scheduler, self.guests)
        return value


def _well_formed(value) -> bool:
    if not isinstance(value, ScheduledStep):
        return False
    lists = (value.finished, value.admitted, value.preempted, value.scheduled)
    return all(
        isinstance(items, list) and all(isinstance(q, Sequence) for q in items) for items in lists
    ) and (value.refused is None or isinstance(value.refused, Sequence))


@dataclass(frozen=True)
class Day:
    """A scripted day: guests (seq_id, prompt_len, output_len, arrival) in the order they join
    the queue, a cache, and the engine's options."""

    name: str
    cache: Callable[[], object]
    guests: tuple
    max_batch: int | None = None
    preemption: str = "recompute"
    text: str | None = None  # how the day is described (default: its guests)
    # a day that tells apart the slips this one cannot (only a slip that does there what the
    # learner's step does there gives the hint)
    second: str | None = None

    def start(self, schedule=None) -> tuple[Engine, list[Sequence]]:
        engine = Engine(
            self.cache(), max_batch=self.max_batch, preemption=self.preemption, schedule=schedule
        )
        guests = [Sequence(*g) for g in self.guests]
        for seq in guests:
            engine.add(seq)
        return engine, guests

    def describe(self) -> str:
        if self.text is not None:
            return self.text
        cap = "" if self.max_batch is None else f", max_batch={self.max_batch}"
        if self.preemption != "recompute":
            cap += f", preemption={self.preemption!r}"
        guests = ", ".join(f"{g} {p}+{o}@{a:g}" for g, p, o, a in self.guests)
        return f"{_cache_text(self.cache())}{cap}; guests (prompt+answer@arrival): {guests}"


def _simulated_day() -> Day:
    """``DAY`` as simulate() serves it: the same cache, names and queue order."""
    order = sorted(range(len(DAY)), key=lambda i: DAY[i].arrival)
    guests = tuple((f"r{i}", DAY[i].prompt_len, DAY[i].output_len, DAY[i].arrival) for i in order)
    setup = {k: v for k, v in DAY_SETUP.items() if k != "cache"}
    return Day(
        "simulate",
        functools.partial(
            make_cache,
            "paged",
            setup["kv_capacity_tokens"],
            setup["max_seq_len"],
            setup["block_size"],
        ),
        guests,
        text=DAY_TEXT,
    )


# the full hotel's guests: (name, prompt, answer, arrival), on 6 rooms of 4 beds
FULL_HOTEL = (
    ("ann", 5, 4, 0.0),
    ("ben", 2, 6, 0.0),
    ("cat", 7, 3, 1.0),
    ("dan", 3, 3, 1.0),
    ("eve", 9, 2, 1.0),
)

DAYS = {
    day.name: day
    for day in (
        Day(
            "arrivals",
            lambda: PagedCache(16, 4),
            (
                ("ann", 6, 3, 0.0),
                ("ben", 5, 2, 0.0),
                ("cat", 9, 2, 2.0),
                ("dan", 3, 4, 3.5),
                ("eve", 4, 2, 10.0),
            ),
        ),
        Day(
            "full batch",
            lambda: PagedCache(32, 4),
            (
                ("ann", 4, 2, 0.0),
                ("ben", 4, 2, 0.0),
                ("cat", 4, 5, 0.0),
                ("dan", 4, 1, 0.0),
                ("eve", 4, 2, 0.0),
            ),
            max_batch=3,
        ),
        Day(
            "queue",
            lambda: PagedCache(8, 4),
            (
                ("ann", 9, 6, 0.0),
                ("ben", 5, 3, 0.0),
                ("cat", 14, 2, 1.0),
                ("dan", 2, 2, 1.0),
            ),
        ),
        # step 2: eve, new, is refused (a step that forgets out.refused fails here, not at step
        # 4, where it would look like a step that never readmits). Step 3: ben needs a room and
        # dan (checked in last) leaves; cat needs one and, last now, leaves itself; nobody
        # checks in. Step 4: cat, first in line, holds 8 tokens and does not fit yet. Step 5:
        # cat is back and dan waits (admitted before the decoding, dan would take a room a
        # guest in the hotel needs, and leave again at once)
        Day(
            "preemption",
            lambda: PagedCache(6, 4),
            FULL_HOTEL,
        ),
        # the full hotel's day by swap: in step 3 dan, asked to leave while ben is decoded, is
        # SWAPPED, not PREEMPTED, when the walk reaches him (a step that skips only PREEMPTED
        # guests asks the cache about a guest it no longer knows). By swap, skipping nobody and
        # skipping only the PREEMPTED guests are the same step; the recompute day tells them apart
        Day(
            "swap",
            lambda: PagedCache(6, 4),
            FULL_HOTEL,
            preemption="swap",
            second="preemption",
        ),
        Day(
            "contiguous",
            functools.partial(make_cache, "contiguous-oracle", 64, 32),
            (
                ("ann", 10, 6, 0.0),
                ("ben", 20, 10, 0.0),
                ("cat", 8, 4, 0.0),
                ("fay", 5, 4, 1.0),  # her prompt fits in the 6 beds left, her booking does not
                ("dan", 30, 2, 1.0),
                ("eve", 2, 2, 1.0),
            ),
        ),
        _simulated_day(),
    )
}


def _watch_refusal(cache, capture: _Captured) -> None:
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


def _lockstep(fn, day: Day, replay: bool = True) -> None:
    """Run ``day`` with the learner's step beside kvlab's; fail at the first step that differs."""
    mine_capture = _Captured(fn, [], learner=True)
    mine, mine_guests = day.start(mine_capture)
    mine_capture.guests = mine_guests
    _watch_refusal(mine.scheduler.cache, mine_capture)
    ref_capture = _Captured(Scheduler.step, [])
    ref, ref_guests = day.start(ref_capture)
    ref_capture.guests = ref_guests
    before = _state_text(ref.scheduler)
    history: list[dict] = []  # kvlab's view of every step so far
    k = 0
    while ref.has_unfinished():
        k += 1
        try:
            mine.step()
        except _Stopped:
            _step_failed(day, k, mine_capture, None, before, replay, history)
        except CheckFailed as handover:
            handover.input = _where(day, k, mine_capture.now, before)
            raise
        ref.step()
        if mine_capture.view != ref_capture.view:
            _step_failed(day, k, mine_capture, ref_capture.view, before, replay, history)
        history.append(ref_capture.view)
        before = _state_text(ref.scheduler)


def _where(day: Day, k: int, now: float, before: str) -> str:
    return f"{day.describe()}; step {k} (now={now:g}), before it: {before}"


def _step_failed(day: Day, k: int, mine: _Captured, expected: dict | None, before, replay, history):
    where = _where(day, k, mine.now, before)
    again = (
        f'`from kvlab.grading.lab06 import show_day; show_day(step, "{day.name}")` prints the day '
        "step by step, kvlab's beside yours"
        if replay
        else None
    )
    details = dict(input=where, replay=again)
    if mine.error is not None:
        hint = _unsized(mine) or _slip(day, mine, None, history)
        hint = hint or _error_slip(mine.error, step=True)
        if hint is None and isinstance(mine.error, MemoryError):
            hint = MEMORY
        raise _raised(mine.error, hint, **details)
    value = mine.value
    if not isinstance(value, ScheduledStep):
        raise CheckFailed(
            "step must return a ScheduledStep",
            expected="a ScheduledStep",
            got=short(value),
            hint=RETURN_STEP if value is None else STEP_TYPE,
            **details,
        )
    if not _well_formed(value):
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
            hint=SEQ_NOT_ID if ids else None,
            **details,
        )
    got = mine.view
    key = next(x for x in REPORT_KEYS + STATE_KEYS if got[x] != expected[x])
    shown = _shown_pair(key, expected[key], got[key])
    queue = history[-1]["scheduler.waiting"] if history else [g[0] for g in day.guests]
    hint = _unsized(mine) or _slip(day, mine, expected, history)
    hint = hint or _direct(day, mine, expected, queue)
    raise CheckFailed(
        f"step {k}: {key} differs from kvlab's",
        expected=shown[0],
        got=shown[1],
        hint=hint,
        cause=hint or f"06.step: {key}",
        **details,
    )


def _unsized(mine: _Captured) -> str | None:
    """Asked without the tokens to generate in the step that failed: that is the mistake (seen
    directly, where slips could not tell it from asking with the prompt only)."""
    return REFUSAL_REMAINING if mine.unsized else None


def _well_formed_field(items, field: str) -> bool:
    if field == "refused":
        return items is None or isinstance(items, Sequence)
    return isinstance(items, list) and all(isinstance(q, Sequence) for q in items)


def _slip(day: Day, mine: _Captured, expected: dict | None, history: list[dict]) -> str | None:
    """The hint of the one usual slip that does what the learner's step did: the same as kvlab's
    step in every earlier step of the day (``history``), then, in this one, the learner's error,
    or the learner's report and state where kvlab's differ. In this step the refusal reported
    with a guest is not compared, nor, for the slips of ``ANY_REFUSED``, which guest is reported
    (past a refused guest, the first refused or the last; at max_batch, the guest stopped or
    the one admitted last)."""
    found = {}
    for options, hint in STEP_SLIPS:
        slip = _Captured(functools.partial(slipped_step, **options), [])
        engine, slip.guests = day.start(slip)
        agrees = True
        for earlier in history:
            try:
                engine.step()
            except Exception:  # the slip raised (_Stopped), or the engine refused its step
                agrees = False
            if not agrees or slip.view != earlier:
                agrees = False
                break
        if not agrees:
            continue
        slip.view = None
        try:
            engine.step()
        except _Stopped:
            pass
        except Exception:
            continue
        if mine.error is not None:
            same = slip.error is not None and (
                (type(slip.error), str(slip.error)) == (type(mine.error), str(mine.error))
            )
        else:
            same = (
                slip.error is None
                and slip.view is not None
                and _alike(slip.view, mine.view, any_refused=bool(options.keys() & ANY_REFUSED))
                and slip.view != expected
            )
        if same:
            found.setdefault(hint, []).append(options)
    if len(found) > 1 and day.second is not None:
        second = DAYS[day.second]
        there = _departure(mine.step, second, learner=True)
        found = {
            hint: options
            for hint, options in found.items()
            if any(
                _departure(functools.partial(slipped_step, **o), second) == there for o in options
            )
        }
    return next(iter(found)) if len(found) == 1 else None


def _departure(fn, day: Day, learner: bool = False):
    """Where ``fn`` first departs from kvlab's step in ``day``: None when it never does, else
    the step and what it did there (its report and state, its error, or what it returned)."""
    mine = _Captured(fn, [], learner=learner)
    engine, mine.guests = day.start(mine)
    ref = _Captured(Scheduler.step, [])
    reference, ref.guests = day.start(ref)
    k = 0
    while reference.has_unfinished():
        k += 1
        try:
            engine.step()
        except _Stopped:
            if mine.error is not None:
                return k, type(mine.error), str(mine.error)
            return k, short(mine.value)
        except Exception as error:  # a hand-over to kvlab, or the engine refused the step
            return k, type(error), str(error)
        reference.step()
        if mine.view != ref.view:
            return k, {key: v for key, v in mine.view.items() if key != "out.refusal"}
    return None


ANY_REFUSED = {"fcfs", "full_refuses"}  # slips whose refused guest may be any of several


def _alike(a: dict, b: dict, any_refused: bool = False) -> bool:
    """The same step, whatever refusal is reported (and, with ``any_refused``, whichever
    refused guest)."""
    skip = ("out.refusal", "out.refused") if any_refused else ("out.refusal",)
    return all(a[k] == b[k] for k in a if k not in skip)


def _direct(day: Day, mine: _Captured, expected: dict, queue: list) -> str | None:
    """Mistakes seen in the step's outcome itself, when no single slip explains it (``queue``:
    the waiting guests before the step)."""
    got = mine.view
    arrivals = {g[0]: g[3] for g in day.guests}
    if any(arrivals.get(g, 0) > mine.now for g in got["out.admitted"]):
        return ARRIVAL
    head, refused = expected["out.refused"], got["out.refused"]
    if refused in queue and any(
        g in queue and queue.index(g) > queue.index(refused) for g in got["out.admitted"]
    ):
        return FCFS  # checked in a guest standing behind one the cache refused in this step
    differ = [k for k in REPORT_KEYS + STATE_KEYS if got[k] != expected[k]]
    if set(differ) <= {"out.refused", "out.refusal"} and head in queue and refused in queue:
        if queue.index(refused) > queue.index(head):
            return FCFS  # all else as kvlab's, yet asked the cache for a guest behind the head
    if day.max_batch is not None and len(got["scheduler.running"]) > day.max_batch:
        return MAX_BATCH
    if differ == ["scheduler.num_preemptions"]:
        more = got["scheduler.num_preemptions"] > expected["scheduler.num_preemptions"]
        return COUNTED_TWICE if more else USE_PREEMPT
    if differ and all(k in REPORT_KEYS for k in differ) and got[differ[0]] in ([], None):
        return REPORTED[differ[0]]  # done, not reported
    return None


def show_day(step, day: str = "arrivals", steps: int | None = None) -> None:
    """Print a day of the 06.step checks step by step, kvlab's step beside ``step``, up to the
    first step that differs (or ``steps`` steps)."""
    plan = DAYS[day]
    print(plan.describe())
    mine_capture = _Captured(step, [], learner=True)
    mine, mine_capture.guests = plan.start(mine_capture)
    ref_capture = _Captured(Scheduler.step, [])
    ref, ref_capture.guests = plan.start(ref_capture)
    keys = ("out.finished", "out.admitted", "out.refused", "out.preempted", "out.scheduled")

    def line(view):
        return "  ".join(f"{key[4:]} {_show(view[key])}" for key in keys)

    k = 0
    while ref.has_unfinished() and (steps is None or k < steps):
        k += 1
        try:
            mine.step()
        except _Stopped:
            pass
        except CheckFailed as failure:
            print(f"step {k}: {failure.message}")
            return
        ref.step()
        print(f"step {k} (now={ref_capture.now:g})\n  kvlab: {line(ref_capture.view)}")
        if mine_capture.error is not None:
            print("  yours raised " + "; ".join(explain_exception(mine_capture.error)))
            return
        if not _well_formed(mine_capture.value):
            print(f"  yours returned {short(mine_capture.value)}")
            return
        print(f"  yours: {line(mine_capture.view)}")
        if mine_capture.view != ref_capture.view:
            key = next(
                x for x in REPORT_KEYS + STATE_KEYS if mine_capture.view[x] != ref_capture.view[x]
            )
            want, got = _shown_pair(key, ref_capture.view[key], mine_capture.view[key])
            print(f"  first difference: {key}: kvlab {want}; yours {got}")
            return
    print("the same at every step")


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
    _same_figures(_figures(got), _figures(want), DAY_TEXT + ", schedule=step", USE_PREEMPT)
