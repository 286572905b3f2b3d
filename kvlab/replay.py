"""Replay a workload through a cache one decode step at a time, and measure it.

This is the simplest possible server: guests queue in arrival order; at each step the hotel checks
in as many waiting guests as it can (first come, first served: a guest who does not fit blocks the
queue), every guest in the hotel writes one new token, and guests who are done check out.
The cache is any object with ``admit(id, prompt_len, output_len)``, ``append(id)``, ``release(id)``
and ``memory_report()``; refusals are :class:`~kvlab.errors.OutOfMemory`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kvlab.errors import OutOfMemory
from kvlab.trace import Usage
from kvlab.workload import Request


@dataclass
class ReplayResult:
    """Per-step measurements. ``busy`` marks steps where guests were waiting at the door."""

    times: list[float] = field(default_factory=list)
    usage: list[Usage] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    busy: list[bool] = field(default_factory=list)
    probes: list = field(default_factory=list)  # what ``probe(cache)`` returned after each step
    refusals: int = 0  # admissions tried and refused (a blocked guest is retried every step)

    @property
    def steps(self) -> int:
        return len(self.times)

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
    max_steps: int = 10**7,
) -> ReplayResult:
    """Run every request to completion; return a :class:`ReplayResult`.

    Arrivals are in seconds; one decode step lasts ``step_seconds``. Request i is called ``r{i}``.
    ``probe(cache)``, if given, is called at the end of every step and its values are kept.
    """
    if not requests:
        raise ValueError("requests must not be empty")
    queue = deque(sorted(enumerate(requests), key=lambda pair: pair[1].arrival))
    left: dict[str, int] = {}  # tokens still to generate
    result = ReplayResult()
    step = 0
    while queue or left:
        if step >= max_steps:
            raise RuntimeError(f"replay did not finish within max_steps={max_steps}")
        now = step * step_seconds
        cache.clock = now
        while queue and queue[0][1].arrival <= now:
            index, request = queue[0]
            guest = f"r{index}"
            try:
                cache.admit(guest, request.prompt_len, request.output_len)
            except OutOfMemory:
                result.refusals += 1
                if not left:
                    raise ValueError(
                        f"{guest} needs {request.total_len} beds and cannot be admitted even into "
                        "an empty hotel"
                    ) from None
                break
            queue.popleft()
            left[guest] = request.output_len
        for guest in list(left):
            cache.append(guest)
            left[guest] -= 1
        report = cache.memory_report()
        waiting = sum(1 for _, r in queue if r.arrival <= now)
        result.running.append(len(left))
        for guest in [g for g, n in left.items() if n == 0]:
            del left[guest]
            cache.release(guest)
        if hasattr(cache, "snapshot"):
            cache.snapshot("step")
        if probe is not None:
            result.probes.append(probe(cache))
        result.times.append(now)
        result.usage.append(report)
        result.waiting.append(waiting)
        result.busy.append(waiting > 0)
        step += 1
    return result
