"""Random days of a scheduler, served step by step: the parity tests of kvlab's scheduler against
its own hooks (tests/serving/test_scheduler_hooks.py) and of the graders' references against
kvlab's (tests/grading/test_grading_slipped_steps.py)."""

import dataclasses
import random

from kvlab.core.block_manager import PagedCache
from kvlab.serving import Engine, make_cache
from kvlab.serving.config import most_computed_at_once
from kvlab.serving.scheduler import Scheduler, Sequence


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


def serve(day: dict, scheduler_class=Scheduler, schedule=None, limit: int = 200) -> list:
    """Every step of ``day`` with a scheduler of ``scheduler_class`` (and the engine's
    ``schedule``, a step function): what the step did, the scheduler's counts, every guest's
    fields and the cache; or the error that stopped it."""
    engine = Engine(build_cache(day["cache"]), schedule=schedule, **day["options"])
    engine = on(engine, scheduler_class)
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


def random_days(n: int) -> list[dict]:
    return [random_day(random.Random(seed)) for seed in range(n)]
