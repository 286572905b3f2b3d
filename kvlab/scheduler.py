"""Sequences and the scheduler that admits, preempts and retires them (the seed of Lab 06).

Each step the scheduler first checks in waiting sequences in arrival order while the cache has
room (first come, first served: a sequence that does not fit blocks the queue), then makes room
for one new token of every running sequence. When a token finds no room, the sequence admitted
last is preempted: its blocks are freed and it returns to the front of the queue, to be
recomputed when readmitted (vLLM's preemption by recomputation). The scheduler asks the cache
(``refusal``, ``can_append``) before it changes anything, so the normal "not now" of scheduling
raises nothing.

The cache is any object with ``refusal(prompt_len, output_len)`` (the OutOfMemory that admitting
would raise, or None), ``admit(seq_id, prompt_len, output_len)``, ``can_append(seq_id)``,
``append(seq_id)`` and ``release(seq_id)``: :class:`~kvlab.contiguous.ContiguousKVCache` and
:class:`~kvlab.paged.PagedCache` are two.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

from kvlab.errors import OutOfMemory


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # waiting again, its tokens to be recomputed
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One request as the scheduler sees it: ``prompt_len`` tokens in, ``output_len`` to generate."""

    seq_id: Hashable
    prompt_len: int
    output_len: int
    arrival: float = 0.0
    token_ids: list[int] | None = None  # when the tokens themselves are known
    status: SequenceStatus = SequenceStatus.WAITING
    num_generated: int = 0

    @property
    def num_tokens(self) -> int:
        """Tokens whose K and V the cache holds while running (the prompt and the answer so far)."""
        return self.prompt_len + self.num_generated

    @property
    def remaining(self) -> int:
        return self.output_len - self.num_generated

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.output_len


@dataclass
class ScheduledStep:
    """What one call of :meth:`Scheduler.schedule` did."""

    admitted: list[Sequence] = field(default_factory=list)
    scheduled: list[Sequence] = field(default_factory=list)  # got a slot for this step's token
    preempted: list[Sequence] = field(default_factory=list)
    refused: Sequence | None = None  # the head of the queue, when it did not fit
    refusal: OutOfMemory | None = None  # why


class Scheduler:
    """Admits, preempts and retires sequences on one cache. ``recorder`` (optional, owned by the
    driver) gets a frame after every event."""

    def __init__(self, cache, recorder=None):
        self.cache = cache
        self.recorder = recorder
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in order of admission: the last is preempted first

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, now: float) -> ScheduledStep:
        """Admit what arrived and fits, then make room for one token of every running sequence."""
        step = ScheduledStep()
        self._admit(now, step)
        for seq in list(self.running):
            if seq.status is SequenceStatus.RUNNING:  # not preempted earlier in this step
                self._make_room(seq, step)
        return step

    def _admit(self, now: float, step: ScheduledStep) -> None:
        while self.waiting and self.waiting[0].arrival <= now:
            seq = self.waiting[0]
            refusal = self.cache.refusal(seq.num_tokens, seq.remaining)
            if refusal is not None:
                step.refused, step.refusal = seq, refusal
                self._record_refusal(seq, refusal)
                if not self.running:
                    raise ValueError(
                        f"{seq.seq_id} needs {seq.total_len} beds and cannot be admitted even into "
                        "an empty hotel"
                    )
                return
            self.waiting.popleft()
            self.cache.admit(seq.seq_id, seq.num_tokens, seq.remaining)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            step.admitted.append(seq)
            self._record("check-in", seq.seq_id)

    def _make_room(self, seq: Sequence, step: ScheduledStep) -> None:
        while not self.cache.can_append(seq.seq_id):
            self._record(
                "out of memory", seq.seq_id, f"{seq.seq_id} needs a room for its next token"
            )
            alone = len(self.running) == 1
            victim = self.preempt()
            step.preempted.append(victim)
            if victim is seq:
                if alone:
                    raise ValueError(
                        f"{seq.seq_id} needs {seq.total_len} beds and cannot fit even alone in "
                        "the hotel"
                    )
                return
        self.cache.append(seq.seq_id)
        seq.num_generated += 1
        step.scheduled.append(seq)

    def preempt(self) -> Sequence:
        """The sequence admitted last leaves (its blocks freed) and rejoins the front of the queue."""
        victim = self.running.pop()
        self.cache.release(victim.seq_id)
        self._record("check-out", victim.seq_id)
        victim.status = SequenceStatus.PREEMPTED
        self.waiting.appendleft(victim)
        self._record("preemption", victim.seq_id)
        return victim

    def finish(self, seq: Sequence) -> None:
        """A sequence with every token generated leaves the cache."""
        if seq.status is not SequenceStatus.RUNNING:
            raise ValueError(f"{seq.seq_id} is {seq.status.value}, not running")
        self.running.remove(seq)
        self.cache.release(seq.seq_id)
        seq.status = SequenceStatus.FINISHED
        self._record("check-out", seq.seq_id)

    def _record(self, event: str, seq_id, note: str = "") -> None:
        if self.recorder is not None:
            self.recorder.record(event, seq_id, note)

    def _record_refusal(self, seq: Sequence, refusal: OutOfMemory) -> None:
        if self.recorder is not None:
            self.recorder.refused(seq.seq_id, refusal)
