"""Fast-forward: run the engine's clock over a stretch of pure decode steps in one go.

A simulated day spends most of its steps on nothing but decoding: the same batch, one token per
sequence, nobody arriving, finishing or preempted. :func:`plan_decode_run` finds how many such
steps come next and schedules them at once (the engine then counts their tokens in the same
place it counts a step's: :meth:`kvlab.serving.engine.Engine.decode_run`), with results identical to stepping one at a time (the same
clock, to the bit; the same token gaps, finish times and per-step measures; blocks handed out in
the same order). A run stops before the first step that could differ:

- the arrival of the queue's head (a head that has arrived and cannot be admitted stays refused:
  in a decode run free memory only shrinks, the batch stays as full and the budget as spent), or
  the time the caller runs the engine until (:meth:`kvlab.serving.engine.Engine.run_until`);
- the step after some sequence generates its last token (it is retired there);
- a step in which some sequence would find no room for its token (a preemption).

Only a caller that cannot see the difference gets runs (:func:`eligible`): no recorder (it keeps
every frame), the scheduler's own ``schedule`` and ``preempt``, no prefix caching (each step
tells the cache which tokens are computed), a cache that takes rounds of tokens at once
(:class:`kvlab.serving.interfaces.DecodeRunCache`: ``decode_room``, ``append_rounds``), an executor that
costs decode steps without seeing them (:class:`kvlab.serving.interfaces.DecodeRunExecutor`, or none)
and an observer that can take a run (:class:`kvlab.serving.interfaces.DecodeRunObserver`, or none).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from kvlab.serving.interfaces import DecodeRunCache, DecodeRunExecutor, DecodeRunObserver
from kvlab.serving.scheduler import Scheduler, Sequence


@dataclass
class DecodeRun:
    """``steps`` decode steps of the same batch run at once: what an observer needs to measure
    each of them as if it had been told after each."""

    sequences: list[Sequence]  # the batch, in running order (each got one token per step)
    starts: list[float]  # each step's start, on the engine's clock
    allocated: list[int]  # cache.allocated_tokens after each step
    held: int  # cache.held_tokens after the first step (each later step: len(sequences) more)
    ends: list[float] = field(default_factory=list)  # each step's end (the next one's start)

    @property
    def steps(self) -> int:
        return len(self.starts)


def eligible(engine) -> bool:
    """Whether fast-forwarding ``engine`` can change nothing anyone sees (the module says why
    each condition is needed)."""
    scheduler = engine.scheduler
    return (
        engine.fast_forward
        and engine.recorder is None
        and scheduler.recorder is None
        and engine.schedule is Scheduler.step
        and scheduler.custom_preempt is None
        and not scheduler.cache.prefix_caching
        and isinstance(scheduler.cache, DecodeRunCache)
        and (engine.executor is None or isinstance(engine.executor, DecodeRunExecutor))
        and (engine.observer is None or isinstance(engine.observer, DecodeRunObserver))
    )


def plan_decode_run(engine, limit: int, until: float = math.inf) -> DecodeRun | None:
    """The next steps of ``engine`` (at most ``limit``, none beginning at or after ``until``) if
    they only decode, scheduled as the scheduler would schedule them one by one: the cache's
    slots taken (``append_rounds``), each sequence's tokens generated and what it computes in
    a step (``num_scheduled`` 1, ``samples``). None when the next step must be stepped
    (something else may happen in it). The engine counts the tokens and moves its clock
    (:meth:`kvlab.serving.engine.Engine.decode_run`); the caller checks :func:`eligible`
    first."""
    scheduler = engine.scheduler
    running = scheduler.running
    batch = len(running)
    budget = scheduler.max_num_batched_tokens
    if not batch or (budget is not None and batch > budget):
        return None
    # every one decodes (one token to compute) and has tokens left to generate
    uncomputed = [seq.prompt_len + seq.num_generated - seq.num_computed for seq in running]
    if min(uncomputed) != 1 or max(uncomputed) != 1:
        return None
    steps = min(limit, min([seq.output_len - seq.num_generated for seq in running]))
    if steps < 1:
        return None
    arrival = until  # when the queue's head arrives, if it is still to come (or until)
    if scheduler.waiting:
        head = scheduler.waiting[0]
        if head.arrival > engine.clock:
            arrival = min(arrival, head.arrival)
        elif not _head_stays_out(scheduler, head, batch):
            return None
    cache = scheduler.cache
    seq_ids = [seq.seq_id for seq in running]
    steps = cache.decode_room(seq_ids, steps)
    if not steps:
        return None
    bounds = _clock(engine, running, steps, arrival)
    # a step starting at or after the arrival may admit the head: the run ends before it
    steps = bisect.bisect_left(bounds, arrival, 0, len(bounds) - 1)
    if not steps:
        return None
    held = cache.held_tokens + batch
    run = DecodeRun(running, bounds[:steps], cache.append_rounds(seq_ids, steps), held)
    run.ends = bounds[1 : steps + 1]
    for seq in running:
        seq.num_generated += steps
        seq.num_scheduled, seq.samples = 1, True
    return run


def _head_stays_out(scheduler, head: Sequence, batch: int) -> bool:
    """Whether the queue's head, arrived, is admitted in none of the coming decode steps: what
    stops it now (the scheduler's checks, in its order) cannot change while the batch only
    decodes. False also when stepping would raise (a prompt over the budget), so that it does."""
    if scheduler.batching != "continuous":  # static: admits only into an empty cache
        return True
    if scheduler.max_batch is not None and batch >= scheduler.max_batch:
        return True
    budget = scheduler.max_num_batched_tokens
    if budget is not None:
        left = budget - batch  # what the decodes leave of each step's budget
        if scheduler.chunked_prefill:
            if left <= 0:
                return True
        elif head.num_uncomputed > budget:
            return False
        elif head.num_uncomputed > left:
            return True
    return scheduler.cache.refusal(head.num_tokens, head.remaining) is not None


def _clock(engine, running: list[Sequence], steps: int, until: float) -> list[float]:
    """The clock at the step boundaries of the run, computed as :meth:`Engine.step` computes it
    (start + each step's seconds in turn when timed, else ticks x step_seconds): ``steps + 1``
    of them, or fewer once one is at or after ``until`` (in growing chunks, so that a run cut
    short by an arrival costs few steps that do not run)."""
    bounds = [engine.clock]
    batch, chunk = len(running), 8
    if engine.timed:
        kv_tokens = sum([seq.num_computed + 1 for seq in running])  # what the first step reads
    while len(bounds) <= steps and bounds[-1] < until:
        n = min(chunk, steps + 1 - len(bounds))
        if engine.timed:
            now = bounds[-1]
            for seconds in engine.executor.decode_run_seconds(batch, kv_tokens, n):
                now = now + seconds
                bounds.append(now)
            kv_tokens += n * batch
        else:
            ticks, size = engine._ticks + len(bounds), engine.step_seconds
            bounds += [(ticks + j) * size for j in range(n)]
        chunk *= 4
    return bounds


# --- the caches' part: room for, and the slots of, a run of decode steps --------------------------
# Written with the caches' public calls for now; to become the caches' own bulk calls.
