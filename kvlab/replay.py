"""Replay a workload through a cache one decode step at a time, and measure it.

This is the simplest possible server: guests queue in arrival order; at each step the hotel checks
in as many waiting guests as it can (first come, first served: a guest who does not fit blocks the
queue), every guest in the hotel writes one new token, and guests who are done check out.
The cache is any object with ``admit(id, prompt_len, output_len)``, ``append(id)``, ``release(id)``
and ``memory_report()``; refusals are :class:`~kvlab.errors.OutOfMemory`.

A cache that allocates on demand (paged) can run out of rooms in the middle of a step. Then the
guest checked in last is asked to leave and come back later (preemption by recomputation, as in
vLLM): it returns to the front of the queue, and when readmitted its tokens so far count as prompt.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from kvlab.errors import OutOfMemory, ReservationFull
from kvlab.trace import Usage
from kvlab.workload import Request


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
    # per step: the guest at the head of the queue refused although enough beds were free in
    # total (their beds were scattered: an impossible allocation), else None
    blocked: list = field(default_factory=list)
    refusals: int = 0  # admissions tried and refused (a blocked guest is retried every step)
    preemptions: int = 0  # guests asked to leave and come back later (their tokens recomputed)
    step_seconds: float = 0.05

    @property
    def steps(self) -> int:
        return len(self.times)

    @property
    def blocked_guests(self) -> list:
        """The distinct guests that external fragmentation kept at the door, in order."""
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
            raise ValueError("no step had guests waiting: the hotel never filled up")
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


def replay(
    cache,
    requests: list[Request],
    step_seconds: float = 0.05,
    probe=None,
    until: float | None = None,
    max_steps: int = 10**7,
) -> ReplayResult:
    """Run every request to completion; return a :class:`ReplayResult`.

    Arrivals are in seconds; one decode step lasts ``step_seconds``. Request i is called ``r{i}``.
    ``probe(cache)``, if given, is called at the end of every step and its values are kept.
    ``until`` stops the replay at that time (seconds), leaving guests in the hotel.
    """
    if not requests:
        raise ValueError("requests must not be empty")
    if not step_seconds > 0:
        raise ValueError(f"step_seconds must be > 0, got {step_seconds}")
    queue = deque(
        (f"r{i}", r) for i, r in sorted(enumerate(requests), key=lambda pair: pair[1].arrival)
    )
    left: dict[str, int] = {}  # tokens still to generate, in order of check-in
    result = ReplayResult(step_seconds=step_seconds)
    requests_by_id = dict(queue)
    step = 0
    while queue or left:
        if step >= max_steps:
            raise RuntimeError(f"replay did not finish within max_steps={max_steps}")
        now = step * step_seconds
        if not left and queue[0][1].arrival > now:  # empty hotel: skip ahead to the next arrival
            step = math.ceil(queue[0][1].arrival / step_seconds - 1e-9)
            now = step * step_seconds
        if until is not None and now > until:
            break
        cache.clock = now
        blocked = None
        while queue and queue[0][1].arrival <= now:
            guest, request = queue[0]
            try:
                cache.admit(guest, request.prompt_len, request.output_len)
            except OutOfMemory as refusal:
                result.refusals += 1
                if getattr(refusal, "impossible", False):
                    blocked = guest
                if not left:
                    raise ValueError(
                        f"{guest} needs {request.total_len} beds and cannot be admitted even into "
                        "an empty hotel"
                    ) from None
                break
            queue.popleft()
            left[guest] = request.output_len
        for guest in list(left):
            if guest not in left:  # preempted earlier in this step
                continue
            while True:
                try:
                    cache.append(guest)
                    break
                except ReservationFull:
                    raise
                except OutOfMemory:
                    alone = len(left) == 1
                    victim = _preempt(cache, queue, left, requests_by_id, now)
                    result.preemptions += 1
                    if victim == guest and alone:
                        raise ValueError(
                            f"{guest} needs {requests_by_id[guest].total_len} beds and cannot fit "
                            "even alone in the hotel"
                        ) from None
                    if victim == guest:
                        break
            if guest in left:
                left[guest] -= 1
        report = cache.memory_report()
        if hasattr(cache, "snapshot"):
            cache.snapshot("step")
        waiting = sum(1 for _, r in queue if r.arrival <= now)
        result.running.append(len(left))
        for guest in [g for g, n in left.items() if n == 0]:
            del left[guest]
            cache.release(guest)
        if probe is not None:
            result.probes.append(probe(cache))
        result.times.append(now)
        result.usage.append(report)
        result.waiting.append(waiting)
        result.busy.append(waiting > 0)
        result.blocked.append(blocked)
        step += 1
    return result


def _preempt(cache, queue, left: dict, requests_by_id: dict, now: float) -> str:
    """Ask the guest checked in last to leave; it rejoins the front of the queue."""
    victim = next(reversed(left))
    original = requests_by_id[victim]
    generated = original.output_len - left.pop(victim)
    cache.release(victim)
    if hasattr(cache, "snapshot"):
        cache.snapshot("preemption", victim)
    rest = Request(
        original.prompt_len + generated, original.output_len - generated, original.arrival
    )
    requests_by_id[victim] = rest
    queue.appendleft((victim, rest))
    return victim
