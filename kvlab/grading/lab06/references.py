"""Lab 06's slips: kvlab's :class:`~kvlab.serving.scheduler.Scheduler` with one decision of a step
changed (a hook overridden, :func:`~kvlab.grading.step_rules.step_slip`), served as a step function
``(scheduler, now)``, as the learner's is, in the same engine; and the wrong guests a preempt picks."""

from __future__ import annotations

from kvlab.grading.lab06 import hints
from kvlab.grading.lockstep import slipped
from kvlab.grading.slips import Slip
from kvlab.grading.step_rules import QUEUE_SLIPS, UNSLIPPED, AdmitFirst, step_slip, variant
from kvlab.serving.scheduler import Scheduler, SequenceStatus

__all__ = ["STEP_SLIPS", "VICTIM_SLIPS", "slipped", "slipped_step"]
slipped_step = UNSLIPPED  # kvlab's step as the slips' table serves it: what the checks compare with

# the wrong guests a preempt picks, tried in order: each answers which guest leaves
VICTIM_SLIPS = (
    Slip(hints.OLDEST, lambda running: running[0].seq_id),
    Slip(hints.LAST_ARRIVED, lambda running: max(running, key=lambda q: q.arrival).seq_id),
    Slip(hints.MOST_ROOMS, lambda running: max(running, key=lambda q: q.num_tokens).seq_id),
)

RETIRE, SERVE, ADMIT = Scheduler.PHASES  # the order of kvlab's step


def _retire_live(self) -> list:  # walks the list finish() removes the guest from
    done = []
    for seq in self.running:
        if self.done(seq):
            self.finish(seq)
            done.append(seq)
    return done


def _full_refuses(self, seq, step) -> bool:
    if full := Scheduler.batch_full(self, seq, step):
        step.refused = seq
    return full


def _no_count(self, seq, step) -> None:
    Scheduler._decode(self, seq, step)
    seq.num_generated -= 1  # as if num_generated += 1 were left out


def _note_past_self(self, victim, seq, step) -> bool:  # goes on for a guest that left
    step.preempted.append(victim)
    return False


def _by_hand(self):  # as recompute does, whatever scheduler.preemption says
    victim = self.running.pop()
    self.cache.release(victim.seq_id)
    victim.num_computed, victim.status = 0, SequenceStatus.PREEMPTED
    self.waiting.appendleft(victim)
    return victim


def _by_hand_counted(self):
    victim = _by_hand(self)
    self.num_preemptions += 1
    return victim


NoFirstToken = variant("NoFirstToken", start=lambda s, seq, left, step: None)
ByHand = variant("ByHand", preempt=_by_hand)
ByHandCounted = type("ByHandCounted", (ByHand,), {"preempt": _by_hand_counted})
OldOrder = type("OldOrder", (AdmitFirst, NoFirstToken), {})  # kvlab's order before vLLM's
SkipNobody = variant("SkipNobody", serves=lambda s, seq, step: True)
SkipPreemptedOnly = variant(
    "SkipPreemptedOnly", serves=lambda s, q, step: q.status is not SequenceStatus.PREEMPTED
)


def _cap_past_full(s, q, step) -> bool:
    return s.max_batch is not None and len(s.running) > s.max_batch


def _only_new(s, q, now) -> bool:  # a guest back after a preemption stops the queue
    return Scheduler.arrived(s, q, now) and q.status is SequenceStatus.WAITING


# the usual slips of a step: each is kvlab's step with that one mistake put in
STEP_SLIPS = (
    step_slip(hints.RETIRE_AT_START, "RetireAfterDecode", PHASES=(SERVE, RETIRE, ADMIT)),
    step_slip(hints.RETIRE_AT_START, "RetireLast", PHASES=(SERVE, ADMIT, RETIRE)),
    step_slip(hints.NO_RETIRE, "NoRetire", PHASES=(SERVE, ADMIT)),
    step_slip(hints.RETIRE_COPY, "RetireLive", retire=_retire_live),
    step_slip(
        hints.RETIRE_EARLY, "RetireEarly", done=lambda s, q: q.num_generated == q.output_len - 1
    ),
    step_slip(hints.ADMIT_FIRST, OldOrder),
    step_slip(hints.TWICE, AdmitFirst),
    step_slip(hints.FIRST_TOKEN, NoFirstToken),
    *QUEUE_SLIPS,
    step_slip(hints.ARRIVAL_STRICT, "StrictArrival", arrived=lambda s, q, now: q.arrival < now),
    step_slip(hints.MAX_BATCH, "NoCap", batch_full=lambda s, q, step: False),
    step_slip(hints.MAX_BATCH_OFF, "CapPastFull", batch_full=_cap_past_full),
    step_slip(hints.FULL_NOT_REFUSED, "FullRefuses", any_refused=True, batch_full=_full_refuses),
    step_slip(hints.READMIT, "NoReadmit", arrived=_only_new),
    step_slip(
        hints.REFUSAL_TOKENS,
        "AskPrompt",
        refusal=lambda s, q, _: s.cache.refusal(q.prompt_len, q.remaining),
    ),
    step_slip(
        hints.REFUSAL_REMAINING, "AskTokens", refusal=lambda s, q, _: s.cache.refusal(q.num_tokens)
    ),
    step_slip(hints.ASK_ADMIT, "AskNothing", refusal=lambda s, q, left: None),
    step_slip(hints.COUNT, "NoCount", _decode=_no_count),
    step_slip(hints.ASK_APPEND, "AppendBlind", _make_room=lambda s, q, step: s._decode(q, step)),
    step_slip(hints.SKIP, SkipNobody),
    step_slip(hints.SKIP_SWAPPED, SkipPreemptedOnly),
    step_slip(hints.SELF, "MakeRoomPastSelf", note_preempted=_note_past_self),
    step_slip(hints.USE_PREEMPT, ByHand),
    step_slip(hints.USE_PREEMPT, ByHandCounted),
    step_slip(hints.NOT_NOTED, "NotNoted", note_preempted=lambda s, victim, q, step: victim is q),
)
