"""The engine loop that every driver shares: the simulator, the tiny model and the replay of Labs
01-03.

Each :meth:`Engine.step` asks the scheduler what runs (retire, make room for the next token of
every running sequence, admit, preempt when memory runs out; under a token budget, prompts may be
read in chunks), hands that batch to an :class:`~kvlab.serving.interfaces.Executor`, moves the clock by
the seconds the executor reports, and tells an :class:`~kvlab.serving.interfaces.EngineObserver`. The
simulator's executor only costs the step; the tiny model's computes it. Either way each scheduled
sequence computes positions ``[seq.num_computed, seq.num_computed + seq.num_scheduled)`` and,
when ``seq.samples``, produces the token at ``seq.num_tokens - 1`` (the cache already holds its
slot). Without a token budget that is a prefill of the whole prompt (plus the tokens generated
before a preemption by recompute) or a decode of the last known token. :meth:`Engine.run` moves
the clock over stretches of pure decode steps in one go when nobody can tell the difference
(:mod:`kvlab.serving.fast_forward`).
"""

from __future__ import annotations

import math

from kvlab.serving.config import ENGINE_FIELDS, EngineConfig, resolve
from kvlab.serving.fast_forward import DecodeRun, eligible, plan_decode_run
from kvlab.serving.interfaces import EngineObserver, Executor
from kvlab.serving.scheduler import ScheduledStep, Scheduler, Sequence


def new_positions(seq: Sequence) -> tuple[int, int]:
    """The token positions ``[start, stop)`` a scheduled sequence computes in this step."""
    return seq.num_computed, seq.num_computed + seq.num_scheduled


class Engine:
    """Continuous batching over one cache.

    Its settings are an :class:`~kvlab.serving.config.EngineConfig` (``config=``), or keywords
    that build one (the scheduler's, and ``schedule``, ``step_seconds``, ``fast_forward``; given
    with ``config``, they change it). ``executor.execute(step)`` gets the
    :class:`~kvlab.serving.scheduler.ScheduledStep` and returns the seconds it took (an executor
    declaring ``timed = True``), or None to count one step of ``step_seconds`` (the clock then
    runs in steps, and arrivals are read on it). An executor declaring ``can_swap = True`` keeps
    the K/V of sequences preempted by swapping. ``schedule`` replaces :meth:`Scheduler.step`, the
    learner's own step in Lab 06: a function ``(scheduler, now) -> ScheduledStep``. With a token
    budget (Lab 09's own budgeted step) it sets ``num_scheduled`` and ``samples`` of every
    sequence it schedules, and the step's ``num_batched_tokens``, as :meth:`Scheduler.step` does;
    without one the scheduler says what its sequences compute
    (:meth:`Scheduler.complete_unbudgeted`). ``observer.after_step(engine, step)`` is called after
    every step that ran a batch. ``fast_forward=False`` makes :meth:`run` step one at a time even
    where it could run a stretch of decode steps at once (:meth:`decode_run`; the results are the
    same).
    """

    def __init__(
        self,
        cache,
        executor=None,
        *,
        config: EngineConfig | None = None,
        recorder=None,
        observer=None,
        **settings,
    ):
        config = resolve(config, settings, caller="Engine", fields=ENGINE_FIELDS)
        if executor is not None and not isinstance(executor, Executor):
            raise TypeError(
                "executor must be a kvlab.serving.interfaces.Executor: declare timed and can_swap (bools) "
                f"and give it execute(step), got {executor!r}"
            )
        if observer is not None and not isinstance(observer, EngineObserver):
            raise TypeError(
                f"observer must have after_step(engine, step) (kvlab.serving.interfaces.EngineObserver), "
                f"got {observer!r}"
            )
        self.config = config
        self.scheduler = Scheduler(
            cache,
            recorder,
            config=config,
            swapper=executor if executor is not None and executor.can_swap else None,
        )
        self.executor = executor
        self.timed = executor is not None and executor.timed
        self.recorder = recorder
        self.observer = observer
        self.schedule = config.schedule if config.schedule is not None else Scheduler.step
        self.budgeted = config.max_num_batched_tokens is not None
        # a schedule of the learner's without a budget leaves num_scheduled to the scheduler
        self._complete = config.schedule is not None and not self.budgeted
        self.step_seconds = float(config.step_seconds)
        self.clock = 0.0
        self._ticks = 0  # the clock in steps, without a timed executor
        self.step_start = 0.0  # when the last step began
        self.num_steps = 0  # steps that ran a batch
        # gaps between two tokens of a sequence: (seconds, how many sequences had that gap) per
        # step for those that produced a token in the step before, one entry for each other
        self.token_gaps: list[tuple[float, int]] = []
        self._stuck = 0  # steps in a row that left arrived sequences outside an empty cache
        self.fast_forward = config.fast_forward
        self.fast_forward_steps = 0  # of num_steps, those run in one go by decode_run
        self.fast_forward_runs = 0  # how many such runs
        self._eligible: bool | None = None  # fast_forward.eligible, found at the first run

    @property
    def cache(self):
        return self.scheduler.cache

    def add(self, seq: Sequence) -> None:
        self.scheduler.add(seq)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def next_start(self) -> float:
        """When the next step will begin: now, or the next arrival when the cache is empty."""
        scheduler = self.scheduler
        waiting = scheduler.waiting
        if not scheduler.running and waiting and waiting[0].arrival > self.clock:
            return self._skip_to(waiting[0].arrival)[0]
        return self.clock

    def step(self) -> ScheduledStep:
        """Schedule, execute and time one step. A step with nothing to run takes no time."""
        scheduler = self.scheduler
        waiting = scheduler.waiting
        if not scheduler.running and waiting and waiting[0].arrival > self.clock:
            self.clock, self._ticks = self._skip_to(waiting[0].arrival)  # wait for a sequence
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
                    "three steps in a row ran nobody although sequences were running or waiting: "
                    "the engine would wait forever"
                )
            return step
        self._stuck = 0
        if self._complete:
            scheduler.complete_unbudgeted(step)
        if self.recorder is not None:
            self.recorder.record("step")
        seconds = self.executor.execute(step) if self.executor is not None else None
        if self.timed:
            end = now + seconds
        else:
            self._ticks += 1
            end = self._ticks * self.step_seconds
        self._account(step.scheduled, now, end)
        self.clock = end
        self.num_steps += 1
        if self.observer is not None:
            self.observer.after_step(self, step)
        return step

    def _account(self, scheduled: list[Sequence], now: float, end: float, later=()) -> None:
        """What a step from ``now`` to ``end`` computed, and when each sequence got its token:
        the one place tokens are counted. ``later``: the ends of the steps that followed it in a
        decode run (:meth:`decode_run`), each one more token for every sequence."""
        gaps = self.token_gaps
        consecutive = 0
        more = len(later)
        last_end = later[-1] if more else end
        for seq in scheduled:
            seq.num_computed += seq.num_scheduled + more
            if not seq.samples:
                continue
            last = seq.last_token_time
            if last is None:
                seq.first_token_time = end
            elif last == now:
                consecutive += 1
            else:
                gaps.append((end - last, 1))
            seq.last_token_time = last_end
            if seq.num_generated == seq.output_len:
                seq.finish_time = last_end
        if consecutive:
            gaps.append((end - now, consecutive))
        if more:
            batch, ends = len(scheduled), [end, *later]
            gaps.extend([(ends[j] - ends[j - 1], batch) for j in range(1, len(ends))])

    def _skip_to(self, arrival: float) -> tuple[float, int]:
        """The first step boundary at or after an arrival (clock, ticks): the arrival itself
        with a timed executor, else the first whole step."""
        if self.timed:
            return arrival, self._ticks
        ticks = max(self._ticks, math.ceil(arrival / self.step_seconds))
        if ticks > self._ticks and (ticks - 1) * self.step_seconds >= arrival:
            ticks -= 1  # the division rounded up
        return ticks * self.step_seconds, ticks

    def decode_run(self, limit: int, until: float = math.inf) -> DecodeRun | None:
        """Run the coming steps (at most ``limit``, none beginning at or after ``until``) at
        once if they only decode: :func:`kvlab.serving.fast_forward.plan_decode_run` finds them
        and gives them their slots, the engine counts their tokens and moves its clock as
        stepping would. Return that :class:`~kvlab.serving.fast_forward.DecodeRun`, or None when
        the next step must be stepped. :meth:`run_until` calls it after each step when
        :func:`~kvlab.serving.fast_forward.eligible`."""
        run = plan_decode_run(self, limit, until)
        if run is None:
            return None
        steps, starts, ends = run.steps, run.starts, run.ends
        self._account(run.sequences, starts[0], ends[0], ends[1:])
        if not self.timed:
            self._ticks += steps
        self.clock = ends[-1]
        self.step_start = starts[-1]
        self.num_steps += steps
        self.fast_forward_steps += steps
        self.fast_forward_runs += 1
        self._stuck = 0
        if self.observer is not None:
            self.observer.after_decode_run(self, run)
        return run

    def run(self, max_steps: int = 10**8) -> None:
        """Step until every sequence has finished and left the cache (between two steps, a
        stretch of pure decode steps may run at once: :meth:`decode_run`)."""
        self.run_until(math.inf, max_steps=max_steps)

    def run_until(self, until: float, *, max_steps: int = 10**8) -> None:
        """Run every step that begins before ``until`` (on the engine's clock), so that the
        engine stands as it is at ``until``: a caller may then add what arrives there (the
        fleet's router does). ``math.inf``: until every sequence has finished (:meth:`run`).
        Stretches of decode steps run at once where they may (:meth:`decode_run`), never past
        ``until``: the last one stops before the first step at or after it, as before an
        arrival."""
        if self._eligible is None:
            self._eligible = eligible(self)
        fast, calls = self._eligible, 0
        endless = until == math.inf
        while self.has_unfinished() and (endless or self.next_start() < until):
            if calls >= max_steps:
                raise RuntimeError(f"the engine did not finish within max_steps={max_steps}")
            self.step()
            calls += 1
            if fast and calls < max_steps and self.clock < until:
                left = max_steps - calls
                run = self.decode_run(left) if endless else self.decode_run(left, until)
                if run is not None:
                    calls += run.steps
