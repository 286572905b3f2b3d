"""The days the checks of a scheduler step serve (Lab 06's, Lab 09's): a scripted :class:`Day`
(guests, written as a report shows them, a cache, the engine's options) started in an Engine, a
simulated day's requests as a Day, and a day's figures compared."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

from kvlab.core.block_manager import PagedCache
from kvlab.grading.expect import CheckFailed
from kvlab.grading.scheduler_views import cache_text
from kvlab.serving import Engine, make_cache
from kvlab.serving.scheduler import Sequence

DAY_FIGURES = ("recompute_tokens", "swapped_tokens")


def party(text: str) -> tuple:
    """Guests as a report writes them (``"ann 6+3@0, ben 5+2@0"``: name prompt+answer@arrival),
    as (seq_id, prompt_len, output_len, arrival) rows in the order they join the queue."""
    rows = re.findall(r"(\w+) (\d+)\+(\d+)@([\d.]+)", text)
    if not rows or len(rows) != text.count("@"):
        raise ValueError(f"guests must read 'name prompt+answer@arrival, ...', got {text!r}")
    return tuple((g, int(p), int(o), float(a)) for g, p, o, a in rows)


def paged(num_blocks: int, block_size: int) -> Callable[[], PagedCache]:
    """A day's paged cache: a fresh one of ``num_blocks`` rooms of ``block_size`` beds each time."""
    return functools.partial(PagedCache, num_blocks, block_size)


# the full hotel's guests, on 6 rooms of 4 beds (Labs 06, 09)
FULL_HOTEL = party("ann 5+4@0, ben 2+6@0, cat 7+3@1, dan 3+3@1, eve 9+2@1")


def figures(result) -> dict:
    return {**result.summary(), **{f: getattr(result, f) for f in DAY_FIGURES}}


def same_figures(got: dict, want: dict, where: str, token_hint: str | None = None) -> None:
    """Fail when a figure of the day differs; ``token_hint`` is the hint when only the tokens
    kvlab counts at a preemption (recomputed, swapped) differ."""
    differ = [k for k in want if got.get(k) != want[k]]
    if differ:
        hint = token_hint if set(differ) <= set(DAY_FIGURES) else None

        def text(figures):
            return ", ".join(
                f"{k} {figures[k]:.6g}"
                if isinstance(figures.get(k), int | float)
                else f"{k} {figures.get(k)!r}"
                for k in differ
            )

        raise CheckFailed(
            "the day's figures differ from kvlab's",
            input=where,
            expected=text(want),
            got=text(got),
            hint=hint,
        )


@dataclass(frozen=True)
class Day:
    """A scripted day: guests (seq_id, prompt_len, output_len, arrival) in the order they join
    the queue (or their text, :func:`party`), a cache, and the engine's options."""

    name: str
    cache: Callable[[], object]
    guests: tuple
    max_batch: int | None = None
    preemption: str = "recompute"
    text: str | None = None  # how the day is described (default: its guests)
    # a day that tells apart the slips this one cannot (only a slip that does there what the
    # learner's step does there gives the hint)
    second: str | None = None
    # a token budget (Lab 09): max_num_batched_tokens, with chunked prefill
    budget: int | None = None

    def __post_init__(self):
        if isinstance(self.guests, str):
            object.__setattr__(self, "guests", party(self.guests))

    def start(self, schedule=None) -> tuple[Engine, list[Sequence]]:
        engine = Engine(
            self.cache(),
            max_batch=self.max_batch,
            preemption=self.preemption,
            schedule=schedule,
            max_num_batched_tokens=self.budget,
            chunked_prefill=self.budget is not None,
        )
        guests = [Sequence(*g) for g in self.guests]
        for seq in guests:
            engine.add(seq)
        return engine, guests

    def describe(self) -> str:
        if self.text is not None:
            return self.text
        cap = "" if self.max_batch is None else f", max_batch={self.max_batch}"
        if self.preemption != "recompute":
            cap += f", preemption={self.preemption!r}"
        if self.budget is not None:
            cap += f", max_num_batched_tokens={self.budget} (chunked prefill)"
        guests = ", ".join(f"{g} {p}+{o}@{a:g}" for g, p, o, a in self.guests)
        return f"{cache_text(self.cache())}{cap}; guests (prompt+answer@arrival): {guests}"


def simulated_day(name: str, requests, setup: dict, text: str, **options) -> Day:
    """``requests`` as ``simulate(requests, **setup)`` serves them: the same cache, names and
    queue order (``options``: the rest of the Day, e.g. a token budget)."""
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival)
    guests = tuple(
        (f"r{i}", requests[i].prompt_len, requests[i].output_len, requests[i].arrival)
        for i in order
    )
    cache = functools.partial(
        make_cache, "paged", setup["kv_capacity_tokens"], setup["max_seq_len"], setup["block_size"]
    )
    return Day(name, cache, guests, text=text, **options)
