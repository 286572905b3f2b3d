"""Replay a workload through a cache one decode step at a time, and measure it.

This is the simplest possible server, the shared :class:`~kvlab.serving.engine.Engine` with an
observer that measures and no executor (steps of ``step_seconds``): it brings guests (sequences) to the door at their arrival times, runs the clock in fixed steps, and
measures after every step. At each step every guest in the hotel writes one new token, the
scheduler checks in as many waiting guests as fit (first come, first served), and guests who are
done check out at the end of the step, after the measurement, so the beds they held count in it.
A cache that allocates on demand (paged) can run out of rooms in the middle of a step: then the
guest checked in last is asked to leave and come back later (preemption by recomputation, as in
vLLM). Labs 01-03 measure with it; Lab 06's :func:`kvlab.serving.simulate` runs the same engine
with costed steps and latencies. The cache needs, besides what
the scheduler asks of it, ``memory_report()`` and ``state()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvlab.core.accounting import Usage
from kvlab.core.recorder import Recorder
from kvlab.core.trace import Trace
from kvlab.serving.engine import Engine
from kvlab.serving.scheduler import Sequence
from kvlab.serving.workload import Request


def seconds_shut(blocked: list, step_seconds: float) -> list[float]:
    """Seconds the door has stayed shut up to each step: a step whose ``blocked`` entry names a
    guest (refused although enough beds were free in total) adds ``step_seconds``."""
    total, out = 0.0, []
    for guest in blocked:
        total += (guest is not None) * step_seconds
        out.append(total)
    return out


@dataclass
class ReplayResult:
    """Per-step measurements. ``busy`` marks steps where guests were waiting at the door."""

    times: list[float] = field(default_factory=list)
    usage: list[Usage] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    busy: list[bool] = field(default_factory=list)
    probes: list = field(default_factory=list)  # what ``probe(cache)`` returned after each step
    # per step: the seq_id refused at the head of the queue although enough beds were free in
    # total (an impossible allocation), else None
    blocked: list = field(default_factory=list)
    refusals: int = 0  # admissions tried and refused (a blocked guest is retried every step)
    preemptions: int = 0  # guests asked to leave and come back later (their tokens recomputed)
    step_seconds: float = 0.05
    trace: Trace | None = None  # a frame after every event, with ``replay(..., record=True)``

    @property
    def steps(self) -> int:
        return len(self.times)

    @property
    def blocked_seq_ids(self) -> list:
        """The distinct sequences that external fragmentation kept at the door, in order."""
        return list(dict.fromkeys(g for g in self.blocked if g is not None))

    @property
    def blocked_seconds(self) -> float:
        """How long the door stayed shut although enough beds were free in total."""
        return sum(g is not None for g in self.blocked) * self.step_seconds

    def blocked_seconds_so_far(self) -> list[float]:
        """:attr:`blocked_seconds` up to each step, for plots."""
        return seconds_shut(self.blocked, self.step_seconds)

    def _busy_steps(self) -> list[int]:
        steps = [i for i, b in enumerate(self.busy) if b]
        if not steps:
            raise ValueError("no step had sequences waiting: the cache never filled up")
        return steps

    def utilization(self, part: str = "used") -> float:
        """Share of the hotel's beds in ``part`` ("used", "future", "internal", "free"), averaged
        over the steps when guests were waiting (the hotel was the bottleneck)."""
        steps = self._busy_steps()
        return sum(self.usage[i].share(part) for i in steps) / len(steps)

    def mean_running(self) -> float:
        """Guests in the hotel at once, averaged over the steps when guests were waiting."""
        steps = self._busy_steps()
        return sum(self.running[i] for i in steps) / len(steps)


class _Measure:
    """The replay's observer: measures after each step's scheduling, then lets the sequences
    that are done check out (after the measurement, so the beds they held count in it)."""

    def __init__(self, result: ReplayResult, probe):
        self.result, self.probe = result, probe

    def after_step(self, engine: Engine, step) -> None:
        result, scheduler = self.result, engine.scheduler
        now = engine.step_start
        result.refusals += step.refused is not None
        result.preemptions += len(step.preempted)
        result.usage.append(engine.cache.memory_report())
        result.running.append(len(scheduler.running))
        waiting = sum(1 for seq in scheduler.waiting if seq.arrival <= now)
        scheduler.retire()
        if self.probe is not None:
            result.probes.append(self.probe(engine.cache))
        result.times.append(now)
        result.waiting.append(waiting)
        result.busy.append(waiting > 0)
        impossible = step.refusal is not None and step.refusal.impossible
        result.blocked.append(step.refused.seq_id if impossible else None)


def replay(
    cache,
    requests: list[Request],
    step_seconds: float = 0.05,
    probe=None,
    until: float | None = None,
    max_steps: int = 10**7,
    record: bool = False,
) -> ReplayResult:
    """Run every request to completion; return a :class:`ReplayResult`.

    Arrivals are in seconds; one decode step lasts ``step_seconds``. Request i is called ``r{i}``.
    ``probe(cache)``, if given, is called at the end of every step and its values are kept.
    ``until`` stops the replay at that time (seconds), leaving sequences in the cache.
    ``record=True`` keeps a frame after every event in ``result.trace``.
    """
    if not requests:
        raise ValueError("requests must not be empty")
    if not step_seconds > 0:
        raise ValueError(f"step_seconds must be > 0, got {step_seconds}")
    recorder = Recorder(cache) if record else None
    result = ReplayResult(step_seconds=step_seconds, trace=recorder and recorder.trace)
    engine = Engine(
        cache, recorder=recorder, observer=_Measure(result, probe), step_seconds=step_seconds
    )
    for i, r in sorted(enumerate(requests), key=lambda pair: pair[1].arrival):
        engine.add(Sequence(f"r{i}", r.prompt_len, r.output_len, r.arrival))
    while engine.has_unfinished():
        if result.steps >= max_steps:
            raise RuntimeError(f"replay did not finish within max_steps={max_steps}")
        if until is not None and engine.next_start() > until:
            break
        engine.step()
    return result
