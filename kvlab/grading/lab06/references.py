"""Lab 06's slips: kvlab's :class:`~kvlab.serving.scheduler.Scheduler` with one decision of a step
changed (a hook overridden, :func:`~kvlab.grading.step_rules.step_slip`), served as a step function
``(scheduler, now)``, as the learner's is, in the same engine (those of the queue and of making room
Lab 09's step tries too); and the wrong guests a preempt picks."""

from __future__ import annotations

from kvlab.grading import step_rules
from kvlab.grading.lab06 import hints
from kvlab.grading.lockstep import slipped  # noqa: F401 (for the tests)
from kvlab.grading.slips import Slip
from kvlab.grading.step_rules import QUEUE_SLIPS, ROOM_SLIPS, AdmitFirst, step_slip, variant
from kvlab.grading.step_rules import UNSLIPPED as slipped_step  # noqa: F401 (for the tests)
from kvlab.serving.scheduler import Scheduler

SkipNobody, SkipPreemptedOnly = step_rules.SkipNobody, step_rules.SkipPreemptedOnly  # for tests

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


def _no_count(self, seq, step) -> None:
    Scheduler._decode(self, seq, step)
    seq.num_generated -= 1  # as if num_generated += 1 were left out


def _ask_prompt(self, seq, left):  # a guest back after a preemption holds more than its prompt
    return self.cache.refusal(seq.prompt_len, seq.remaining)


NoFirstToken = variant("NoFirstToken", start=lambda s, seq, left, step: None)
OldOrder = type("OldOrder", (AdmitFirst, NoFirstToken), {})  # kvlab's order before vLLM's

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
    step_slip(hints.REFUSAL_TOKENS, "AskPrompt", refusal=_ask_prompt),
    step_slip(
        hints.REFUSAL_REMAINING, "AskTokens", refusal=lambda s, q, _: s.cache.refusal(q.num_tokens)
    ),
    step_slip(hints.ASK_ADMIT, "AskNothing", refusal=lambda s, q, left: None),
    step_slip(hints.COUNT, "NoCount", _decode=_no_count),
    *QUEUE_SLIPS,
    *ROOM_SLIPS,
)
