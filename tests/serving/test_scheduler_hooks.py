"""The decisions of a scheduler step are methods of Scheduler (its hooks), and the fast path of
``_serve_running`` and ``retire`` is what they decide by default: on random days (admissions,
preemption by recompute and by swap, max_batch, token budgets, chunked prefill, prefix caching)
kvlab's scheduler and one that takes every decision through its hooks leave the same state after
every step. A subclass that overrides a hook the fast path inlines gets it called."""

import dataclasses
import random

import pytest

from kvlab.core.block_manager import PagedCache
from kvlab.serving import Engine, make_cache
from kvlab.serving.config import most_computed_at_once
from kvlab.serving.scheduler import Scheduler, Sequence


class Unhurried(Scheduler):
    """kvlab's scheduler with no fast path: every decision through its hook."""

    _inline = False


def random_day(rng: random.Random) -> dict:
    """Guests (prompt, answer, arrival, token ids or None), a cache that holds the longest guest
    alone, and the scheduler's options."""
    n = rng.randint(1, 9)
    guests = []
    for _ in range(n):
        prompt, answer = rng.randint(1, 14), rng.randint(1, 9)
        guests.append((prompt, answer, rng.choice([0.0, 0.0, 1.0, 2.0, 3.5, 6.0])))
    guests.sort(key=lambda g: g[2])
    longest = max(p + o for p, o, _ in guests)
    prefix = rng.random() < 0.25
    if prefix or rng.random() < 0.6:
        block = rng.choice([1, 2, 4])
        rooms = -(-longest // block) + rng.randint(1, 10)
        cache = dict(kind="paged", tokens=rooms * block, block=block, prefix=prefix)
    else:
        tokens = rng.randint(longest, 3 * longest)
        cache = dict(kind=rng.choice(["contiguous-oracle", "contiguous"]), tokens=tokens)
    options = dict(
        max_batch=rng.choice([None, None, 1, 2, 3]),
        preemption=rng.choice(["recompute", "swap"]),
    )
    if rng.random() < 0.6:
        chunked = rng.random() < 0.7
        need = max(most_computed_at_once(p, o, options["preemption"]) for p, o, _ in guests)
        low = 1 if chunked else need
        options.update(max_num_batched_tokens=rng.randint(low, low + 12), chunked_prefill=chunked)
    ids = None
    if prefix:  # guests sharing an opening, over a small vocabulary
        opening = [rng.randint(0, 2) for _ in range(rng.randint(0, 6))]
        ids = [opening + [rng.randint(0, 2) for _ in range(30)] for _ in guests]
    return dict(guests=guests, cache=cache, options=options, ids=ids)


def build_cache(cache: dict):
    if cache["kind"] == "paged":
        return PagedCache(
            cache["tokens"] // cache["block"],
            cache["block"],
            enable_prefix_caching=cache["prefix"],
        )
    return make_cache(cache["kind"], cache["tokens"], cache["tokens"])


def on(engine: Engine, scheduler_class) -> Engine:
    """``engine`` with a scheduler of ``scheduler_class`` on its cache and settings."""
    engine.scheduler = scheduler_class(engine.cache, config=engine.config)
    return engine


def serve(day: dict, scheduler_class=Scheduler, limit: int = 200) -> list:
    """Every step of ``day`` with a scheduler of ``scheduler_class``: what the step did, the
    scheduler's counts, every guest's fields and the cache; or the error that stopped it."""
    engine = on(Engine(build_cache(day["cache"]), **day["options"]), scheduler_class)
    seqs = []
    for i, (prompt, answer, arrival) in enumerate(day["guests"]):
        seq = Sequence(f"g{i}", prompt, answer, arrival)
        if day["ids"] is not None:
            seq.token_ids = day["ids"][i][: prompt + answer]
        seqs.append(seq)
        engine.add(seq)
    steps = []
    try:
        while engine.has_unfinished() and len(steps) < limit:
            out = engine.step()
            s = engine.scheduler
            report = tuple(
                [q.seq_id for q in getattr(out, f)]
                for f in ("finished", "admitted", "preempted", "scheduled")
            )
            refused = None if out.refused is None else out.refused.seq_id
            counts = (
                s.num_preemptions,
                s.num_finished,
                s.recompute_tokens,
                s.swapped_out_tokens,
                s.swapped_in_tokens,
                out.num_batched_tokens,
            )
            queues = ([q.seq_id for q in s.running], [q.seq_id for q in s.waiting])
            fields = [dataclasses.astuple(q) for q in seqs]
            steps.append((report, refused, counts, queues, fields, s.cache.state(), engine.clock))
    except Exception as error:  # noqa: BLE001 (both must stop alike)
        steps.append((type(error).__name__, str(error)))
    return steps


DAYS = [random_day(random.Random(seed)) for seed in range(300)]


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
