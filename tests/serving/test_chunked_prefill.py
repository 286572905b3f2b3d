"""The token budget and chunked prefill: what each step computes, and what the day measures."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core.block_manager import PagedCache
from kvlab.core.contiguous import ContiguousKVCache
from kvlab.models import preset
from kvlab.perf.gpus import lookup
from kvlab.perf.roofline import StepTime
from kvlab.serving import Engine, simulate
from kvlab.serving.scheduler import Scheduler, Sequence, SequenceStatus
from kvlab.serving.simulation import weighted_percentile
from kvlab.serving.workload import Request, sharegpt_like


class Checking:
    """Computes nothing; checks that every step reads each sequence's positions in order, never
    twice and never past what it holds, within the budget, and samples only at the end."""

    timed = False
    can_swap = False

    def __init__(self, budget: int | None):
        self.budget = budget
        self.chunks: dict = {}  # seq_id -> the sizes of its steps since its last admission
        self.steps = 0

    def execute(self, step):
        self.steps += 1
        total = 0
        for seq in step.scheduled:
            assert seq.status is SequenceStatus.RUNNING
            assert seq.num_scheduled >= 1, seq
            stop = seq.num_computed + seq.num_scheduled
            # a sampling step reads every token but the one it produces (its slot is taken);
            # an earlier chunk of a prompt stops short of the tokens the sequence holds
            if seq.samples:
                assert stop == seq.num_tokens - 1, seq
            else:
                assert stop < seq.num_tokens, seq
            total += seq.num_scheduled
            self.chunks.setdefault(seq.seq_id, []).append(seq.num_scheduled)
        assert total == step.num_batched_tokens
        if self.budget is not None:
            assert total <= self.budget
        return None


days = st.lists(
    st.tuples(st.integers(1, 40), st.integers(1, 12), st.integers(0, 6)),
    min_size=1,
    max_size=10,
)


@settings(max_examples=120, deadline=None)
@given(
    day=days,
    budget=st.integers(1, 48),
    kind=st.sampled_from(["paged", "contiguous"]),
    preemption=st.sampled_from(["recompute", "swap"]),
)
def test_every_step_stays_in_budget_and_every_prompt_is_read_once_in_order(
    day, budget, kind, preemption
):
    cache = PagedCache(16, 4) if kind == "paged" else ContiguousKVCache(2, 64, policy="pow2")
    executor = Checking(budget)
    engine = Engine(
        cache,
        executor,
        preemption=preemption,
        max_num_batched_tokens=budget,
        chunked_prefill=True,
    )
    seqs = [Sequence(f"r{i}", p, o, a) for i, (p, o, a) in enumerate(day)]
    for seq in sorted(seqs, key=lambda s: s.arrival):
        engine.add(seq)
    engine.run(max_steps=10_000)
    for seq in seqs:
        assert seq.status is SequenceStatus.FINISHED
        assert seq.num_generated == seq.output_len
        assert seq.num_computed == seq.total_len - 1  # every token but the last was read
        assert seq.first_token_time <= seq.finish_time
    if not engine.scheduler.num_preemptions:
        for seq in seqs:  # the prompt in chunks, then one token per step
            chunks = executor.chunks[seq.seq_id]
            assert sum(chunks) == seq.total_len - 1
            assert chunks[-(seq.output_len - 1) or len(chunks) :] == [1] * (seq.output_len - 1)


@settings(max_examples=60, deadline=None)
@given(
    day=days,
    preemption=st.sampled_from(["recompute", "swap"]),
    chunked=st.booleans(),
    timed=st.booleans(),
)
def test_a_budget_nobody_reaches_changes_nothing(day, preemption, chunked, timed):
    requests = [Request(p, o, arrival=a) for p, o, a in day]
    options = dict(cache="paged", kv_capacity_tokens=64, max_seq_len=64, block_size=4)
    options["preemption"] = preemption
    if timed:
        options["step_time"] = StepTime(preset("Llama-3-8B"), lookup("H100-80GB"))
    plain = simulate(requests, **options)
    budgeted = simulate(requests, max_num_batched_tokens=10**6, chunked_prefill=chunked, **options)
    timings = [
        [(q.first_token_time, q.finish_time, q.num_preemptions) for q in r.sequences]
        for r in (plain, budgeted)
    ]
    assert timings[0] == timings[1]
    for name in ("times", "batch", "utilization", "occupancy", "waiting", "token_gaps"):
        assert getattr(plain, name) == getattr(budgeted, name), name
    assert plain.scheduled_tokens == budgeted.scheduled_tokens
    assert (plain.preemptions, plain.recompute_tokens, plain.swapped_tokens) == (
        budgeted.preemptions,
        budgeted.recompute_tokens,
        budgeted.swapped_tokens,
    )


def test_a_long_prompt_is_read_in_chunks_while_the_others_decode():
    # a: 2-token prompt decoding; b: a 10-token prompt arriving next, budget 4 tokens a step
    executor = Checking(4)
    engine = Engine(PagedCache(16, 4), executor, max_num_batched_tokens=4, chunked_prefill=True)
    a, b = Sequence("a", 2, 8), Sequence("b", 10, 2, arrival=1)
    engine.add(a)
    engine.add(b)
    engine.run()
    # a decodes every step (1 token), b gets the rest of the budget: 3 + 3 + 3 + 1
    assert executor.chunks["a"] == [2, 1, 1, 1, 1, 1, 1, 1]
    assert executor.chunks["b"] == [3, 3, 3, 1, 1]
    assert b.first_token_time == 5.0  # read over steps 1-4, its first token at the end of 4
    assert a.finish_time == 8.0


def test_without_chunking_a_prompt_waits_for_a_step_with_room_for_all_of_it():
    executor = Checking(10)
    engine = Engine(PagedCache(16, 4), executor, max_num_batched_tokens=10)
    a, b = Sequence("a", 4, 6), Sequence("b", 8, 2)
    engine.add(a)
    engine.add(b)
    engine.run()
    assert executor.chunks["b"][0] == 8  # read whole, once a's decodes leave it the budget
    assert b.first_token_time > a.first_token_time


@pytest.mark.parametrize("preemption, need", [("recompute", 11), ("swap", 10)])
def test_without_chunking_a_request_that_could_outgrow_the_budget_is_refused_at_once(
    preemption, need
):
    """Checked when added, not mid-step: by recompute a readmitted request reads all it had."""
    scheduler = Scheduler(PagedCache(16, 4), preemption=preemption, max_num_batched_tokens=9)
    with pytest.raises(ValueError, match=f"may need {need} tokens .* max_num_batched_tokens=9"):
        scheduler.add(Sequence("c", 10, 2))
    assert not scheduler.has_unfinished()
    scheduler.add(Sequence("d", 8, 2))  # 9 tokens at most: fits


def test_token_gaps_count_every_token_after_the_first():
    requests = [Request(p, o, arrival=a) for p, o, a in [(30, 5, 0), (3, 9, 0), (50, 4, 2)]]
    r = simulate(
        requests,
        cache="paged",
        kv_capacity_tokens=128,
        max_seq_len=64,
        block_size=4,
        max_num_batched_tokens=16,
        chunked_prefill=True,
        step_time=StepTime(preset("Llama-3-8B"), lookup("H100-80GB")),
    )
    gaps = r.itls()
    assert len(gaps) == sum(q.output_len - 1 for q in r.sequences)
    assert len(set(gaps)) > 1  # each step's length depends on what it computes
    for p in (0, 10, 50, 90, 99, 100):
        assert r.itl(p) == pytest.approx(float(np.percentile(gaps, p)), rel=1e-12)
    row = r.summary()
    assert row["itl_p99"] == r.itl(99) and row["max_num_batched_tokens"] == 16
    assert max(r.scheduled_tokens) <= 16


@given(st.lists(st.tuples(st.floats(0, 100), st.integers(0, 5)), min_size=1, max_size=30))
def test_weighted_percentile_is_the_percentile_of_the_expanded_list(pairs):
    values = [v for v, c in pairs for _ in range(c)]
    if not values:
        with pytest.raises(ValueError, match="no values"):
            weighted_percentile(pairs, 50)
        return
    for p in (0, 1, 25, 50, 99, 99.9, 100):
        assert weighted_percentile(pairs, p) == pytest.approx(
            float(np.percentile(values, p)), rel=1e-9, abs=1e-12
        )


class Shadow:
    """Keeps which token each slot holds and checks every read (positions before the chunk);
    swapping copies what a sequence's slots hold out and back into its new slots."""

    timed = False
    can_swap = True

    def __init__(self, cache):
        self.manager, self.slots, self.swapped = cache.manager, {}, {}

    def swap_out(self, seq):
        slot = self.manager.slot
        self.swapped[seq.seq_id] = [
            self.slots.get(slot(seq.seq_id, pos)) for pos in range(seq.num_computed)
        ]

    def swap_in(self, seq):
        held = self.swapped.pop(seq.seq_id)
        for pos in range(seq.num_cached_tokens, len(held)):
            self.slots[self.manager.slot(seq.seq_id, pos)] = held[pos]

    def execute(self, step):
        for seq in step.scheduled:
            start, stop = seq.num_computed, seq.num_computed + seq.num_scheduled
            for pos in range(start):
                got = self.slots.get(self.manager.slot(seq.seq_id, pos))
                assert got == tuple(seq.token_ids[: pos + 1]), (seq.seq_id, pos)
            for pos in range(start, stop):
                self.slots[self.manager.slot(seq.seq_id, pos)] = tuple(seq.token_ids[: pos + 1])
        return None


@settings(max_examples=60, deadline=None)
@given(
    turns=st.lists(st.tuples(st.integers(1, 8), st.integers(1, 4)), min_size=2, max_size=8),
    budget=st.integers(1, 12),
    mode=st.sampled_from(["recompute", "swap"]),
    prefix_cache=st.sampled_from(["hash", "radix"]),
)
def test_chunked_prefill_with_prefix_caching_never_reads_k_v_not_yet_computed(
    turns, budget, mode, prefix_cache
):
    """A prompt's blocks become findable only as its chunks are computed: a sequence that
    shares them must never read a block another sequence has not written yet."""
    cache = PagedCache(12, 2, enable_prefix_caching=True, prefix_cache=prefix_cache)
    engine = Engine(
        cache, Shadow(cache), preemption=mode, max_num_batched_tokens=budget, chunked_prefill=True
    )
    shared = list(range(100, 110))
    for i, (extra, out) in enumerate(turns):
        prompt = shared[: 2 + extra % 9] + [1000 * (i + 1) + j for j in range(extra)]
        seq = Sequence(f"s{i}", len(prompt), out, arrival=i // 2)
        seq.token_ids = prompt + [5000 * (i + 1) + j for j in range(out)]
        engine.add(seq)
    engine.run(max_steps=5_000)
    cache.manager.check_invariants()


def test_bad_budgets_are_refused_by_name():
    with pytest.raises(ValueError, match="chunked_prefill needs a token budget"):
        Scheduler(PagedCache(4, 4), chunked_prefill=True)
    with pytest.raises(ValueError, match="max_num_batched_tokens must be"):
        Scheduler(PagedCache(4, 4), max_num_batched_tokens=0)
    with pytest.raises(TypeError, match="chunked_prefill must be a bool"):
        Scheduler(PagedCache(4, 4), max_num_batched_tokens=4, chunked_prefill="yes")
    day = [Request(20, 4)]
    with pytest.raises(ValueError, match=r"requests\[0\] may need 23 tokens"):
        simulate(
            day, cache="paged", kv_capacity_tokens=64, max_seq_len=64, max_num_batched_tokens=16
        )
    with pytest.raises(ValueError, match="prefix_caching must be False, True or one of"):
        simulate(day, cache="paged", kv_capacity_tokens=64, max_seq_len=64, prefix_caching="lru")


def test_a_custom_schedule_under_a_budget_serves_as_the_scheduler_does():
    """Lab 09: a schedule of one's own may keep the token budget (it sets num_scheduled and
    samples itself); Scheduler.step handed in as that schedule serves the day as the engine's own."""
    day = sharegpt_like(30, seed=5, rate=3.0)
    setup = dict(cache="paged", kv_capacity_tokens=4096, max_seq_len=4096, block_size=16)
    setup.update(max_num_batched_tokens=64, chunked_prefill=True)
    own = simulate(day, **setup)
    custom = simulate(day, schedule=Scheduler.step, **setup)
    assert custom.summary() == own.summary()
    assert custom.scheduled_tokens == own.scheduled_tokens
