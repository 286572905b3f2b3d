"""Lab 06's slipped references: kvlab's :class:`~kvlab.serving.scheduler.Scheduler` with one
decision of a step changed (a subclass overriding one hook), and the tables of slips the checks
try. A slip's answer is a step function ``(scheduler, now)`` (:class:`kvlab.grading.lockstep.slipped`), as the learner's
is, so it serves a day in the same engine."""

from __future__ import annotations

from kvlab.grading.lab06 import hints
from kvlab.grading.lockstep import slipped
from kvlab.grading.slips import Slip
from kvlab.serving.scheduler import Scheduler, Sequence, SequenceStatus

WAITING, RUNNING, PREEMPTED, SWAPPED, FINISHED = SequenceStatus

# the wrong guests a preempt picks, tried in order: each answers which guest leaves
VICTIM_SLIPS = (
    Slip(hints.OLDEST, lambda running: running[0].seq_id),
    Slip(hints.LAST_ARRIVED, lambda running: max(running, key=lambda q: q.arrival).seq_id),
    Slip(hints.MOST_ROOMS, lambda running: max(running, key=lambda q: q.num_tokens).seq_id),
)


# --- where retiring goes, and the order of a step ---------------------------------------------


class RetireAfterDecode(Scheduler):
    PHASES = ("_serve_running", "_retire_done", "_admit_arrived")


class RetireLast(Scheduler):
    PHASES = ("_serve_running", "_admit_arrived", "_retire_done")


class NoRetire(Scheduler):
    PHASES = ("_serve_running", "_admit_arrived")


class RetireLive(Scheduler):
    def retire(self) -> list[Sequence]:  # walks the list finish() removes the guest from
        done = []
        for seq in self.running:
            if self.done(seq):
                self.finish(seq)
                done.append(seq)
        return done


class RetireEarly(Scheduler):
    def done(self, seq: Sequence) -> bool:
        return seq.num_generated == seq.output_len - 1


class AdmitFirst(Scheduler):
    PHASES = ("_retire_done", "_admit_arrived", "_serve_running")


class NoFirstToken(Scheduler):
    def start(self, seq, left, step) -> None:
        pass


class OldOrder(AdmitFirst, NoFirstToken):
    """Admit (no first token), then decode everyone: kvlab's order before vLLM's."""


# --- admitting ----------------------------------------------------------------------------------


class NoHold(Scheduler):
    def admits(self, step) -> bool:
        return self.batching == "continuous" or not self.running


class PastRefused(Scheduler):
    def stops_queue(self, seq) -> bool:
        return False


class AnyArrival(Scheduler):
    def arrived(self, seq, now) -> bool:
        return True


class StrictArrival(Scheduler):
    def arrived(self, seq, now) -> bool:
        return seq.arrival < now


class NoReadmit(Scheduler):
    def arrived(self, seq, now) -> bool:  # a guest back after a preemption stops the queue
        return super().arrived(seq, now) and seq.status is WAITING


class NoCap(Scheduler):
    def batch_full(self, seq, step) -> bool:
        return False


class CapPastFull(Scheduler):
    def batch_full(self, seq, step) -> bool:
        return self.max_batch is not None and len(self.running) > self.max_batch


class FullRefuses(Scheduler):
    def batch_full(self, seq, step) -> bool:
        full = super().batch_full(seq, step)
        if full:
            step.refused = seq
        return full


class AskPrompt(Scheduler):
    def refusal(self, seq, left):
        return self.cache.refusal(seq.prompt_len, seq.remaining)


class AskTokens(Scheduler):
    def refusal(self, seq, left):
        return self.cache.refusal(seq.num_tokens)


class AskNothing(Scheduler):
    def refusal(self, seq, left):
        return None


# --- decoding -------------------------------------------------------------------------------------


class NoCount(Scheduler):
    def _decode(self, seq, step) -> None:
        super()._decode(seq, step)
        seq.num_generated -= 1  # as if num_generated += 1 were left out


class AppendBlind(Scheduler):
    def _make_room(self, seq, step) -> None:  # appends without asking can_append
        self._decode(seq, step)


class SkipNobody(Scheduler):
    def serves(self, seq, step) -> bool:
        return True


class SkipPreemptedOnly(Scheduler):
    def serves(self, seq, step) -> bool:
        return seq.status is not PREEMPTED


class MakeRoomPastSelf(Scheduler):
    def note_preempted(self, victim, seq, step) -> bool:  # goes on for a guest that left
        step.preempted.append(victim)
        return False


class NotNoted(Scheduler):
    def note_preempted(self, victim, seq, step) -> bool:
        return victim is seq


class ByHand(Scheduler):
    def preempt(self) -> Sequence:  # as recompute does, whatever scheduler.preemption says
        victim = self.running.pop()
        self.cache.release(victim.seq_id)
        victim.num_computed = 0
        victim.status = PREEMPTED
        self.waiting.appendleft(victim)
        return victim


class ByHandCounted(ByHand):
    def preempt(self) -> Sequence:
        victim = super().preempt()
        self.num_preemptions += 1
        return victim


# kvlab's step as the slips' table serves it (no decision changed): what the checks compare with
slipped_step = slipped(Scheduler)

# the usual slips of a step: each is kvlab's step with that one mistake put in
STEP_SLIPS = (
    Slip(hints.RETIRE_AT_START, slipped(RetireAfterDecode)),
    Slip(hints.RETIRE_AT_START, slipped(RetireLast)),
    Slip(hints.NO_RETIRE, slipped(NoRetire)),
    Slip(hints.RETIRE_COPY, slipped(RetireLive)),
    Slip(hints.RETIRE_EARLY, slipped(RetireEarly)),
    Slip(hints.ADMIT_FIRST, slipped(OldOrder)),
    Slip(hints.TWICE, slipped(AdmitFirst)),
    Slip(hints.FIRST_TOKEN, slipped(NoFirstToken)),
    Slip(hints.HOLD, slipped(NoHold)),
    Slip(hints.FCFS, slipped(PastRefused, any_refused=True)),
    Slip(hints.ARRIVAL, slipped(AnyArrival)),
    Slip(hints.ARRIVAL_STRICT, slipped(StrictArrival)),
    Slip(hints.MAX_BATCH, slipped(NoCap)),
    Slip(hints.MAX_BATCH_OFF, slipped(CapPastFull)),
    Slip(hints.FULL_NOT_REFUSED, slipped(FullRefuses, any_refused=True)),
    Slip(hints.READMIT, slipped(NoReadmit)),
    Slip(hints.REFUSAL_TOKENS, slipped(AskPrompt)),
    Slip(hints.REFUSAL_REMAINING, slipped(AskTokens)),
    Slip(hints.ASK_ADMIT, slipped(AskNothing)),
    Slip(hints.COUNT, slipped(NoCount)),
    Slip(hints.ASK_APPEND, slipped(AppendBlind)),
    Slip(hints.SKIP, slipped(SkipNobody)),
    Slip(hints.SKIP_SWAPPED, slipped(SkipPreemptedOnly)),
    Slip(hints.SELF, slipped(MakeRoomPastSelf)),
    Slip(hints.USE_PREEMPT, slipped(ByHand)),
    Slip(hints.USE_PREEMPT, slipped(ByHandCounted)),
    Slip(hints.NOT_NOTED, slipped(NotNoted)),
)
