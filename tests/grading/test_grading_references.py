"""The graders' own references, with no slip put in, are kvlab's: a hint is only given where a
slipped reference reproduces the learner's answer and the unslipped one does not, so a reference
that drifts from kvlab's (a scheduler that admits in another order, a prefix cache that shares
one block more) would silently stop hints, or give them to right answers. Each test drives the
grader's reference and kvlab's public API on random inputs and compares what they leave.
"""

import dataclasses
import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core.block_manager import BlockManager
from kvlab.core.block_pool import ROOT_HASH, BlockPool, hash_block_tokens
from kvlab.core.prefix_cache.hash_chain import HashChainCache
from kvlab.grading.attention_twins import attend_beds, attend_read, attend_room_by_room
from kvlab.grading.expect import CheckFailed
from kvlab.grading.lab00 import step_with
from kvlab.grading.lab03 import _reference_beds
from kvlab.grading.lab06 import judge_preempt, slipped_step
from kvlab.grading.lab07 import CachedBlock, cached_prefix, reference_take
from kvlab.grading.lab07 import prefix as lab07_prefix
from kvlab.grading.scheduler_views import STEP
from kvlab.grading.state_diff import read
from kvlab.ops.attention import TinyAttention, paged_decode_attention_ref
from kvlab.ops.testing import close, make_case
from kvlab.serving import Engine, make_cache
from kvlab.serving.scheduler import Scheduler, Sequence, SequenceStatus

# --- Lab 06: the step and the preempt --------------------------------------------------------

# fields of a Sequence that a step of the lab does not set (kvlab's token budget sets them)
BUDGET_FIELDS = {"num_scheduled", "samples"}


@st.composite
def days(draw):
    """A day: guests (prompt, answer, arrival) in arrival order, a cache that holds the longest
    guest alone (kvlab refuses a day with a guest who never fits), the engine's options."""
    guests = draw(
        st.lists(
            st.tuples(
                st.integers(1, 12), st.integers(1, 8), st.sampled_from([0.0, 0.0, 1.0, 2.5, 4.0])
            ),
            min_size=1,
            max_size=7,
        )
    )
    guests.sort(key=lambda g: g[2])
    longest = max(p + o for p, o, _ in guests)
    if draw(st.booleans()):
        block_size = draw(st.sampled_from([1, 2, 4]))
        rooms = draw(st.integers(-(-longest // block_size) + 1, -(-longest // block_size) + 12))
        cache = ("paged", rooms * block_size, longest, block_size)
    else:
        cache = ("contiguous-oracle", draw(st.integers(longest, 4 * longest)), longest, 1)
    options = dict(
        max_batch=draw(st.none() | st.integers(1, 4)),
        preemption=draw(st.sampled_from(["recompute", "swap"])),
    )
    return guests, cache, options


def _serve(day, schedule):
    """Every step of ``day`` with ``schedule``: the step's report and state as the 06.step checks
    read them, the scheduler's counts and every guest's fields; or the error that stopped it."""
    guests, cache, options = day
    engine = Engine(make_cache(*cache), schedule=schedule, **options)
    seqs = [Sequence(f"g{i}", p, o, a) for i, (p, o, a) in enumerate(guests)]
    for seq in seqs:
        engine.add(seq)
    steps = []
    try:
        while engine.has_unfinished() and len(steps) < 300:
            out = engine.step()
            s = engine.scheduler
            counts = (s.num_preemptions, s.recompute_tokens, s.swapped_out_tokens)
            fields = [{f.name: getattr(q, f.name) for f in dataclasses.fields(q)} for q in seqs]
            for f in fields:
                for name in BUDGET_FIELDS & f.keys():
                    del f[name]
            steps.append((read(STEP, out, s, seqs), counts, s.swapped_in_tokens, fields))
    except Exception as error:  # noqa: BLE001 (both must stop alike)
        steps.append((type(error).__name__, str(error)))
    return steps


@settings(max_examples=150)
@given(days())
def test_slipped_step_without_a_slip_is_kvlabs_step(day):
    assert _serve(day, slipped_step) == _serve(day, Scheduler.step)


def right_preempt(scheduler):
    """The lab's solution: the guest checked in last leaves and comes back first."""
    victim = scheduler.running.pop()
    scheduler.cache.release(victim.seq_id)
    if scheduler.preemption == "recompute":
        victim.num_computed = 0
        victim.status = SequenceStatus.PREEMPTED
    else:
        victim.status = SequenceStatus.SWAPPED
    scheduler.waiting.appendleft(victim)
    return victim


@settings(max_examples=80)
@given(days(), st.integers(0, 6))
def test_the_right_preempt_is_judged_right_anywhere_in_a_day(day, steps):
    """judge_preempt's state-diff tables read kvlab's Scheduler.preempt as the lab's rule."""
    guests, cache, options = day
    engine = Engine(make_cache(*cache), **options)
    for i, (p, o, a) in enumerate(guests):
        engine.add(Sequence(f"g{i}", p, o, a))
    for _ in range(steps):
        if engine.has_unfinished():
            engine.step()
    try:
        judge_preempt(right_preempt, engine.scheduler, "a random day")
    except CheckFailed as failure:
        raise AssertionError(f"{failure.message}: {failure.expected} / {failure.got}") from None


# --- Lab 07: the cached prefix and the room handed out --------------------------------------


@st.composite
def prompts(draw):
    """Earlier prompts (some sharing an opening) and a query, over a small vocabulary, in a
    hotel small enough that later prompts evict the cached blocks of earlier ones."""
    size = draw(st.sampled_from([1, 2, 4]))
    tokens = st.integers(0, 2)
    opening = draw(st.lists(tokens, max_size=3 * size))
    later = st.lists(tokens, min_size=1, max_size=3 * size)
    earlier = draw(st.lists(later.map(lambda t: opening + t), min_size=0, max_size=5))
    query = opening + draw(later) if draw(st.booleans()) else draw(later)
    return draw(st.integers(7, 24)), size, earlier, query


@settings(max_examples=300)
@given(prompts())
def test_cached_prefix_without_a_slip_is_kvlabs_prefix_cache(case):
    """The rooms cached_prefix finds are the rooms kvlab's BlockManager shares at check-in: the
    earlier prompts checked in and out there, their full blocks filed in ``cached`` under the
    rooms kvlab gave them, a room handed out again forgotten, and what kvlab no longer holds
    cached left out (the holes an eviction leaves)."""
    rooms, size, earlier, query = case
    manager = BlockManager(rooms, size, enable_prefix_caching=True)
    cached: dict = {}
    for i, prompt in enumerate(earlier):
        manager.allocate(i, prompt)
        table = manager.block_table(i)
        fresh = set(table[manager.num_cached_tokens(i) // size :])
        cached = {k: e for k, e in cached.items() if e.block_id not in fresh}
        parent = ROOT_HASH
        for j in range(len(prompt) // size):
            block = tuple(prompt[j * size : (j + 1) * size])
            key = hash_block_tokens(parent, block)
            cached.setdefault(key, CachedBlock(table[j], parent, block))
            parent = key
        manager.free(i)
    alive = set(manager.cached_block_ids())
    cached = {k: e for k, e in cached.items() if e.block_id in alive}
    manager.allocate("query", query)
    shared = manager.num_cached_tokens("query") // size
    assert cached_prefix(query, size, cached) == manager.block_table("query")[:shared]


def _hooks(variant, base) -> set[str]:
    """The hooks of kvlab's ``base`` that ``variant`` (a subclass, or a partial of it) changes."""
    if isinstance(variant, functools.partial):
        return set(variant.keywords)  # a parameter of kvlab's class
    mro = [c for c in variant.__mro__ if c is not base and issubclass(c, base)]
    return {n for c in mro for n in vars(c) if not n.startswith("__") and hasattr(base, n)}


@pytest.mark.parametrize("slip", lab07_prefix.PREFIX_SLIPS, ids=lambda s: s.hint[:30])
def test_every_cached_prefix_slip_is_kvlabs_lookup_with_one_decision_changed(slip):
    """Each slip is kvlab's HashChainCache and BlockPool with one hook (or parameter) changed,
    or two such slips put together, and nothing of its own besides."""
    cache, kind = slip.answer.keywords["cache"], slip.answer.keywords["kind"]
    changed = [_hooks(cache, HashChainCache), _hooks(kind, BlockPool)]
    assert [len(c) for c in changed] in ([1, 0], [0, 1], [1, 1]), changed
    slipped = [
        c for c in (cache, kind) if isinstance(c, type) and c not in (HashChainCache, BlockPool)
    ]
    own = [n for c in slipped for n in vars(c)]
    assert not {n for n in own if not n.startswith("__")} - set().union(*changed)


@settings(max_examples=200)
@given(
    st.integers(1, 10).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.permutations(range(n)),
            st.lists(st.booleans(), min_size=n, max_size=n),
            st.integers(0, n),
        )
    )
)
def test_reference_take_is_kvlabs_pool(case):
    """reference_take hands out the room kvlab's BlockPool hands out, and leaves the queue and
    the cache as the pool leaves its own, take after take: rooms freed in any order, some
    holding a cached block, one taken before the others are freed."""
    n, order, cached_flags, early = case
    pool = BlockPool(n)
    blocks = pool.get_new_blocks(n)
    for block, flag in zip(blocks, cached_flags, strict=True):
        if flag:
            assert pool.cache(block, 1000 + block.block_id, (block.block_id,), None)

    def take():
        queue = pool.free_queue.block_ids()
        hashes = {b.block_id: b.block_hash for b in blocks if b.block_hash is not None}
        cached = {h: b for b, h in hashes.items()}
        expected = reference_take(queue, cached, hashes)
        assert pool.get_new_block().block_id == expected
        assert {h: b.block_id for h, b in pool.cached.items()} == cached
        assert pool.free_queue.block_ids() == queue

    pool.free_blocks([blocks[i] for i in order[:early]])
    if early:
        take()
    pool.free_blocks([blocks[i] for i in order[early:]])
    while pool.free_queue.block_ids():
        take()


# --- Labs 00, 03, 04, 05: the answers the slips are set against ------------------------------


@settings(max_examples=40)
@given(
    st.integers(1, 3).flatmap(
        lambda kv: st.tuples(
            st.just(kv),
            st.sampled_from([1, 2, 3]),
            st.integers(1, 6),
            st.integers(1, 5),
            st.integers(0, 99),
        )
    )
)
def test_step_with_without_a_slip_is_kvlabs_decode_step(case):
    kv_heads, group, head_dim, steps, seed = case
    layer = TinyAttention(
        kv_heads * group * head_dim, kv_heads * group, kv_heads, seed=seed, head_dim=head_dim
    )
    x = torch.randn(steps, layer.d_model, generator=torch.Generator().manual_seed(seed))
    k_cache, v_cache = layer.empty_cache()
    for t in range(steps):
        y, k_next, v_next = layer.decode_step(x[t], k_cache, v_cache)
        mine = step_with(layer, x[t], k_cache, v_cache) @ layer.wo
        assert torch.allclose(mine, y, atol=1e-5, rtol=1e-4)
        k_cache, v_cache = k_next, v_next


@settings(max_examples=60)
@given(
    st.sampled_from([1, 2, 4]),
    st.lists(st.integers(1, 9), min_size=1, max_size=4),
    st.integers(0, 9),
)
def test_the_beds_report_is_kvlabs_memory_report(block_size, prompts, grows):
    manager = BlockManager(64, block_size)
    for i, n in enumerate(prompts):
        manager.allocate(i, n)
    for step in range(grows):
        manager.append_slot(step % len(prompts))
    if len(prompts) > 1:
        manager.free(0)
    beds, report = _reference_beds(manager), manager.memory_report()
    assert beds == {
        "used": report.used,
        "future": report.future + report.internal,
        "free": report.free,
    }


@settings(max_examples=40)
@given(
    st.lists(st.integers(1, 13), min_size=1, max_size=3),
    st.sampled_from([1, 2, 4]),
    st.sampled_from([(4, 2), (4, 4), (6, 1), (2, 1)]),
    st.sampled_from([4, 16]),
    st.booleans(),
)
def test_the_attention_the_slips_are_set_against_is_kvlabs_reference(
    seq_lens, block_size, heads, head_dim, shared
):
    """Lab 04's gather (attend_beds) and Lab 05's online softmax (room by room) and read keys
    and values (attend_read), each without a slip, answer as kvlab's reference."""
    q_heads, kv_heads = heads
    args = make_case(
        seq_lens, block_size, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, shared=shared
    )
    expected = paged_decode_attention_ref(*args)
    for answer in (attend_beds(args), attend_room_by_room(args), attend_read(args)):
        assert close(answer, expected)
