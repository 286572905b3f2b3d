"""The engine loop that the simulator and the tiny model share.

Each :meth:`Engine.step` asks the scheduler what runs (retire, admit, make room for one token per
running sequence, preempt when memory runs out), hands that batch to an executor, and moves the
clock by the seconds the executor reports. The simulator's executor only costs the step; the tiny
model's computes it. Either way the cache holds slots for positions ``[0, seq.num_tokens)`` of
every scheduled sequence, and the executor computes positions ``[seq.num_computed,
seq.num_tokens - 1)`` (a prefill of the prompt, plus the tokens generated so far after a
preemption by recompute; else a decode of the last known token) and produces the token at
``seq.num_tokens - 1``.
"""

from __future__ import annotations

import math

from kvlab.scheduler import ScheduledStep, Scheduler, Sequence


def new_positions(seq: Sequence) -> tuple[int, int]:
    """The token positions ``[start, stop)`` a scheduled sequence computes in this step."""
    return seq.num_computed, seq.num_tokens - 1


class Engine:
    """Continuous batching over one cache.

    ``executor.execute(step)`` gets the :class:`~kvlab.scheduler.ScheduledStep` and returns the
    seconds it took (an executor with ``timed = True``), or None to count one step (the clock then
    runs in steps, and arrivals are read in steps). ``schedule`` replaces :meth:`Scheduler.step`, the learner's own step in Lab 06:
    a function ``(scheduler, now) -> ScheduledStep``. The remaining options go to the
    :class:`~kvlab.scheduler.Scheduler`.
    """

    def __init__(
        self,
        cache,
        executor=None,
        *,
        max_batch: int | None = None,
        preemption: str = "recompute",
        batching: str = "continuous",
        recorder=None,
        schedule=None,
        preempt=None,
    ):
        self.scheduler = Scheduler(
            cache,
            recorder,
            max_batch=max_batch,
            preemption=preemption,
            batching=batching,
            swapper=executor if hasattr(executor, "swap_out") else None,
            preempt=preempt,
        )
        if schedule is not None and not callable(schedule):
            raise TypeError(
                f"schedule must be a function (scheduler, now) or None, got {schedule!r}"
            )
        self.executor = executor
        self.recorder = recorder
        self.schedule = schedule if schedule is not None else Scheduler.step
        self.clock = 0.0
        self.step_start = 0.0  # when the last step began
        self.num_steps = 0  # steps that ran a batch
        self._stuck = 0  # steps in a row that left arrived guests outside an empty cache

    @property
    def cache(self):
        return self.scheduler.cache

    def add(self, seq: Sequence) -> None:
        self.scheduler.add(seq)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> ScheduledStep:
        """Schedule, execute and time one step. A step with nothing to run takes no time."""
        scheduler = self.scheduler
        waiting = scheduler.waiting
        if not scheduler.running and waiting and waiting[0].arrival > self.clock:
            self.clock = self._skip_to(waiting[0].arrival)  # an empty cache waits for a guest
        now = self.step_start = self.clock
        if self.recorder is not None:
            self.recorder.clock = now
        moved = scheduler.swapped_out_tokens + scheduler.swapped_in_tokens
        step = self.schedule(scheduler, now)
        if not isinstance(step, ScheduledStep):
            raise TypeError(
                f"schedule must return a ScheduledStep, got {type(step).__name__}: {step!r}"
            )
        step.swapped_tokens = scheduler.swapped_out_tokens + scheduler.swapped_in_tokens - moved
        if not step.scheduled:
            stuck = scheduler.running or (waiting and waiting[0].arrival <= now)
            self._stuck = self._stuck + 1 if stuck else 0
            if self._stuck >= 3:  # once can happen (a step that retires last): three cannot
                raise RuntimeError(
                    "three steps in a row ran nobody although guests were running or waiting at "
                    "the door: the engine would wait forever"
                )
            return step
        self._stuck = 0
        if self.recorder is not None:
            self.recorder.record("step")
        seconds = self.executor.execute(step) if self.executor is not None else None
        end = now + (1.0 if seconds is None else seconds)
        for seq in step.scheduled:
            seq.num_computed = seq.prompt_len + seq.num_generated - 1
            if seq.first_token_time is None:
                seq.first_token_time = end
            if seq.num_generated == seq.output_len:
                seq.finish_time = end
        self.clock = end
        self.num_steps += 1
        return step

    def _skip_to(self, arrival: float) -> float:
        """The first step boundary at or after an arrival (in steps, the next whole step)."""
        if getattr(self.executor, "timed", False):
            return arrival
        return float(math.ceil(arrival))

    def run(self, max_steps: int = 10**8) -> None:
        """Step until every sequence has finished and left the cache."""
        calls = 0
        while self.has_unfinished():
            if calls >= max_steps:
                raise RuntimeError(f"the engine did not finish within max_steps={max_steps}")
            self.step()
            calls += 1
