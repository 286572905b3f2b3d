"""The decisions of a scheduler step are methods of Scheduler (its hooks), and the fast path of
``_serve_running`` and ``retire`` is what they decide by default: on random days (admissions,
preemption by recompute and by swap, max_batch, token budgets, chunked prefill, prefix caching)
kvlab's scheduler and one that takes every decision through its hooks leave the same state after
every step. A subclass that overrides a hook the fast path inlines gets it called."""

import pytest
from scheduler_days import on, random_days, serve

from kvlab.core.block_manager import PagedCache
from kvlab.serving import Engine
from kvlab.serving.scheduler import Scheduler, Sequence


class Unhurried(Scheduler):
    """kvlab's scheduler with no fast path: every decision through its hook."""

    _inline = False


DAYS = random_days(300)


@pytest.mark.parametrize("chunk", range(6))
def test_the_fast_path_is_what_the_hooks_decide(chunk):
    for k, day in enumerate(DAYS[chunk::6]):
        fast, hooked = serve(day), serve(day, Unhurried)
        assert fast == hooked, (chunk + 6 * k, day)
        assert len(fast) > 1 or isinstance(fast[0][0], tuple)


def test_the_random_days_reach_every_branch():
    """The days preempt (by recompute and by swap), read prompts in chunks, cap the batch and
    find cached prefixes, so the parity above covers each."""
    seen = set()
    for day in DAYS:
        steps = serve(day)
        options = day["options"]
        if any(isinstance(s[0], tuple) and s[0][2] for s in steps):
            seen.add(f"preempt by {options['preemption']}")
        if options.get("chunked_prefill"):
            seen.add("chunked prefill")
        if options["max_batch"] is not None:
            seen.add("max_batch")
        if day["cache"].get("prefix"):
            seen.add("prefix caching")
        if isinstance(steps[-1][0], str):
            seen.add("an error")
    assert {
        "preempt by recompute",
        "preempt by swap",
        "chunked prefill",
        "max_batch",
        "prefix caching",
    } <= seen, seen


def test_a_subclass_overriding_an_inlined_hook_is_served_through_it():
    class Early(Scheduler):
        def done(self, seq):
            return seq.num_generated == seq.output_len - 1

    class Preempts(Scheduler):
        def preempt(self):
            return super().preempt()

    assert Scheduler._inline and Unhurried._inline is False
    assert Early._inline is False and Preempts._inline  # preempt is off the fast path
    engine = on(Engine(PagedCache(8, 4)), Early)
    seq = Sequence("ann", 3, 3)
    engine.add(seq)
    while engine.has_unfinished():
        engine.step()
    assert seq.num_generated == 2  # retired one token short: Early.done was asked


def test_every_hook_the_fast_path_inlines_is_a_method_of_scheduler():
    for hook in Scheduler.FAST_PATH_HOOKS:
        assert callable(getattr(Scheduler, hook)), hook
    for phase in Scheduler.PHASES:
        assert callable(getattr(Scheduler, phase)), phase
