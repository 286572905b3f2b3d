"""Lab 06's slipped references: kvlab's rules written the way the lab asks for them, with the
usual slips as options (:func:`slipped_step`), and the tables of slips the checks try."""

from __future__ import annotations

import functools

from kvlab.grading.lab06 import hints
from kvlab.grading.slips import Slip
from kvlab.serving.scheduler import ScheduledStep, Scheduler, SequenceStatus

WAITING, RUNNING, PREEMPTED, SWAPPED, FINISHED = SequenceStatus

# the wrong guests a preempt picks, tried in order: each answers which guest leaves
VICTIM_SLIPS = (
    Slip(hints.OLDEST, lambda running: running[0].seq_id),
    Slip(hints.LAST_ARRIVED, lambda running: max(running, key=lambda q: q.arrival).seq_id),
    Slip(hints.MOST_ROOMS, lambda running: max(running, key=lambda q: q.num_tokens).seq_id),
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
    newcomers included, are decoded after), ``hold=False`` admits in a step that preempted,
    ``first_token=False`` gives a newcomer no token in its first step, ``fcfs=False`` admits past
    a guest who does not fit, ``arrival`` "<=" / "<" / "any", ``cap`` ">=" / ">" / "none",
    ``ask`` "num_tokens, remaining" / "prompt_len, remaining" / "num_tokens" / "nothing",
    ``count=False`` never counts the token, ``append="blind"`` appends without asking,
    ``skip=False`` does not skip guests preempted earlier in the step (``skip="preempted"`` skips
    only the PREEMPTED ones, not the SWAPPED), ``stop=False`` keeps going for a guest who was
    itself preempted, ``full_refuses=True`` reports the guest stopped by max_batch in
    out.refused, ``readmit=False`` stops at a guest back after a preemption, ``preempt="by
    hand"`` sends the guest checked in last away itself, as recompute does whatever
    ``scheduler.preemption`` says (``"by hand, counted"`` also counts it in
    ``scheduler.num_preemptions``), ``note=False`` leaves the guests sent away out of
    out.preempted (so the admitting does not stop)."""
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


def _step(hint: str, **options) -> Slip:
    return Slip(hint, functools.partial(slipped_step, **options))


# the usual slips of a step: each is kvlab's step with that one mistake put in
STEP_SLIPS = (
    _step(hints.RETIRE_AT_START, retire="after decode"),
    _step(hints.RETIRE_AT_START, retire="last"),
    _step(hints.NO_RETIRE, retire="never"),
    _step(hints.RETIRE_COPY, retire="live"),
    _step(hints.RETIRE_EARLY, retire="early"),
    _step(hints.ADMIT_FIRST, order="admit first", first_token=False),
    _step(hints.TWICE, order="admit first"),
    _step(hints.FIRST_TOKEN, first_token=False),
    _step(hints.HOLD, hold=False),
    _step(hints.FCFS, fcfs=False),
    _step(hints.ARRIVAL, arrival="any"),
    _step(hints.ARRIVAL_STRICT, arrival="<"),
    _step(hints.MAX_BATCH, cap="none"),
    _step(hints.MAX_BATCH_OFF, cap=">"),
    _step(hints.FULL_NOT_REFUSED, full_refuses=True),
    _step(hints.READMIT, readmit=False),
    _step(hints.REFUSAL_TOKENS, ask="prompt_len, remaining"),
    _step(hints.REFUSAL_REMAINING, ask="num_tokens"),
    _step(hints.ASK_ADMIT, ask="nothing"),
    _step(hints.COUNT, count=False),
    _step(hints.ASK_APPEND, append="blind"),
    _step(hints.SKIP, skip=False),
    _step(hints.SKIP_SWAPPED, skip="preempted"),
    _step(hints.SELF, stop=False),
    _step(hints.USE_PREEMPT, preempt="by hand"),
    _step(hints.USE_PREEMPT, preempt="by hand, counted"),
    _step(hints.NOT_NOTED, note=False),
)
# slips whose refused guest may be any of several (past a refused guest, the first refused or
# the last; at max_batch, the guest stopped or the one admitted last)
ANY_REFUSED = {"fcfs", "full_refuses"}
