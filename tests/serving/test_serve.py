"""kvlab.serving: the engine loop and simulate() over the four caches of Lab 06.

Property tests run random small days through every cache, block size, preemption mode and
batching mode, with an engine and a cache that check the invariants at every step; the unit tests
pin timings, costs and errors written down by hand.
"""

from __future__ import annotations

import contextlib
import importlib
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core.block_manager import PagedCache
from kvlab.core.contiguous import booking_size
from kvlab.grading.limits import cpu_limit
from kvlab.models import OPT_13B, ModelSpec
from kvlab.perf.roofline import A100_40GB, GPU, StepTime
from kvlab.serving import CACHES, Engine, SimResult, make_cache, new_positions, percentile, simulate
from kvlab.serving.scheduler import ScheduledStep, Scheduler, Sequence, SequenceStatus
from kvlab.serving.simulation import CostedSteps
from kvlab.serving.workload import Request, sharegpt_like

WAITING, RUNNING, PREEMPTED, SWAPPED, FINISHED = SequenceStatus
CACHE_NAMES = tuple(CACHES)
# the module (kvlab.serving.simulate, its old path, is the function)
simulate_module = importlib.import_module("kvlab.serving.simulation")
STEP_TIME = StepTime(OPT_13B, A100_40GB)
# OPT-13B with 12 GB of KV on an A100-40GB: the PagedAttention paper's 15.7K token slots
PAPER_SLOTS, PAPER_MAX_LEN = 15728, 2048


# fail (instead of hanging the suite) when a block uses more than its CPU-seconds: CPU time, so
# a busy machine cannot fail it (a wall-clock backstop of 10 x stops a block that waits)
within = cpu_limit


# --- an engine and a cache that check every step ---------------------------------------------


class AskedFirst:
    """A cache that fails the test when the scheduler acts without asking first, or when the
    memory handed out ever exceeds the capacity."""

    def __init__(self, cache):
        self.cache = cache

    def __getattr__(self, name):
        return getattr(self.cache, name)

    def _check(self):
        assert 0 <= self.cache.allocated_tokens <= self.cache.capacity
        assert self.cache.held_tokens <= self.cache.allocated_tokens

    def admit(self, seq_id, prompt_len, output_len=None):
        assert self.cache.refusal(prompt_len, output_len) is None, "admit without room"
        self.cache.admit(seq_id, prompt_len, output_len)
        self._check()

    def append(self, seq_id):
        assert self.cache.can_append(seq_id), "append without room"
        self.cache.append(seq_id)
        self._check()

    def release(self, seq_id):
        self.cache.release(seq_id)
        self._check()


class CheckedEngine(Engine):
    """The engine, checking after each step what must hold at every step."""

    made: list[CheckedEngine] = []

    def __init__(self, cache, *args, **kwargs):
        super().__init__(cache, *args, **kwargs)
        CheckedEngine.made.append(self)
        self.sequences: list[Sequence] = []
        self.finished: list[Sequence] = []
        self.tokens_per_seq: dict[int, int] = {}
        self.last_clock = 0.0

    def add(self, seq):
        self.sequences.append(seq)
        super().add(seq)

    def step(self):
        s = self.scheduler
        before = list(s.running)
        step = super().step()
        cache = self.cache
        # memory and batch
        assert cache.allocated_tokens <= cache.capacity
        if s.max_batch is not None:
            assert len(s.running) <= s.max_batch and len(step.scheduled) <= s.max_batch
        # every running sequence got exactly one slot for this step's token, and holds its tokens
        assert len({id(q) for q in step.scheduled}) == len(step.scheduled)
        assert {id(q) for q in step.scheduled} == {id(q) for q in s.running}
        assert cache.held_tokens == sum(q.num_tokens for q in s.running)
        for q in s.running:
            assert q.status is RUNNING and 1 <= q.num_generated <= q.output_len
            assert q.arrival <= self.step_start
            self.tokens_per_seq[id(q)] = self.tokens_per_seq.get(id(q), 0) + 1
        # every unfinished sequence is in exactly one place
        waiting = {id(q) for q in s.waiting}
        assert len(waiting) == len(s.waiting) and not waiting & {id(q) for q in s.running}
        for q in s.waiting:
            assert q.status in (WAITING, PREEMPTED, SWAPPED)
            if q.status is PREEMPTED:
                assert s.preemption == "recompute" and q.num_computed == 0
            if q.status is SWAPPED:
                assert s.preemption == "swap"
        # static batching admits only into an empty cache
        if s.batching == "static" and step.admitted:
            finished = {id(q) for q in step.finished}
            assert all(id(q) in finished or q.status is not RUNNING for q in before)
            assert not [q for q in before if q.status is RUNNING and q not in step.admitted]
        for q in step.finished:
            assert q.status is FINISHED and q.num_generated == q.output_len
        self.finished += step.finished
        assert self.clock >= self.last_clock
        self.last_clock = self.clock
        return step

    def decode_run(self, limit):
        """A stretch of decode steps run at once: every running sequence got one token in each."""
        s = self.scheduler
        before = list(s.running)
        run = super().decode_run(limit)
        if run is None:
            return None
        assert 1 <= run.steps <= limit and s.running == before == run.sequences
        assert self.cache.allocated_tokens <= self.cache.capacity
        assert self.cache.held_tokens == sum(q.num_tokens for q in s.running)
        for q in s.running:
            assert q.status is RUNNING and 1 <= q.num_generated <= q.output_len
            self.tokens_per_seq[id(q)] = self.tokens_per_seq.get(id(q), 0) + run.steps
        assert self.clock > self.last_clock
        self.last_clock = self.clock
        return run


@contextlib.contextmanager
def checked():
    """simulate() with a checking engine and cache; yields the engines it made."""
    real = simulate_module.make_cache
    CheckedEngine.made = []
    with (
        mock.patch.object(simulate_module, "Engine", CheckedEngine),
        mock.patch.object(simulate_module, "make_cache", lambda *a: AskedFirst(real(*a))),
    ):
        yield CheckedEngine.made


def assert_conserved(result: SimResult, requests: list[Request], engine: CheckedEngine) -> None:
    """Every request completes exactly once with exactly its output_len tokens; memory is empty."""
    seqs = result.sequences
    assert len(seqs) == len(requests) and engine.sequences and len(engine.sequences) == len(seqs)
    for r, q in zip(requests, seqs, strict=True):
        assert (q.prompt_len, q.output_len, q.arrival) == (r.prompt_len, r.output_len, r.arrival)
        assert q.status is FINISHED and q.num_generated == r.output_len
        assert engine.tokens_per_seq[id(q)] == r.output_len  # one token per step it ran
        assert q.arrival < q.first_token_time <= q.finish_time <= result.end_time
    assert sorted(id(q) for q in engine.finished) == sorted(id(q) for q in seqs)  # exactly once
    assert result.completed == len(requests)
    assert result.tokens_generated == sum(r.output_len for r in requests) == sum(result.batch)
    assert result.steps == engine.num_steps == len(result.batch)
    assert result.end_time == max(q.finish_time for q in seqs)
    assert engine.cache.allocated_tokens == 0 and engine.cache.held_tokens == 0
    assert not engine.scheduler.running and not engine.scheduler.waiting
    assert all(0 < u <= 1 for u in result.utilization)
    assert all(0 < o <= 1 for o in result.occupancy)
    assert all(w >= 0 for w in result.waiting)
    assert result.times == sorted(result.times)
    if result.preemptions == 0:
        assert result.swapped_tokens == result.recompute_tokens == 0
    if engine.scheduler.preemption == "swap":
        assert result.recompute_tokens == 0
        assert engine.scheduler.swapped_in_tokens == result.swapped_tokens
    else:
        assert result.swapped_tokens == 0


# --- random days ---------------------------------------------------------------------------------


def need(cache: str, r: Request, max_seq_len: int, block_size: int) -> int:
    """Token slots one request needs alone in an empty cache."""
    policy = CACHES[cache]
    if policy is None:
        return -(-r.total_len // block_size) * block_size
    return booking_size(policy, r.prompt_len, r.output_len, max_seq_len)


@st.composite
def days(draw, caches=CACHE_NAMES):
    """A small random day that the chosen cache can serve, and how to serve it."""
    cache = draw(st.sampled_from(caches))
    block_size = draw(st.sampled_from([1, 2, 3, 16]))
    k = draw(st.integers(1, 3))
    edges = sorted({max(1, k * block_size + d) for d in (-1, 0, 1)} | {1})
    length = st.one_of(st.sampled_from(edges), st.integers(1, 24))
    # arrivals in (quarter) steps: many ties at 0, gaps the engine must skip
    arrival = st.one_of(st.just(0.0), st.integers(0, 60).map(lambda q: q / 4))
    n = draw(st.integers(1, 30))
    requests = [Request(draw(length), draw(length), draw(arrival)) for _ in range(n)]
    max_seq_len = max(r.total_len for r in requests) + draw(st.sampled_from([0, 0, 1, 7]))
    floor = max(need(cache, r, max_seq_len, block_size) for r in requests)
    capacity = floor + draw(st.one_of(st.just(0), st.integers(0, 2 * floor)))
    timed = draw(st.booleans())
    if timed:  # arrivals in seconds: about one OPT-13B decode step per unit
        requests = [Request(r.prompt_len, r.output_len, r.arrival * 0.03) for r in requests]
    options = {
        "cache": cache,
        "kv_capacity_tokens": capacity,
        "max_seq_len": max_seq_len,
        "block_size": block_size,
        "max_batch": draw(st.sampled_from([None, None, 1, 2, 3])),
        "preemption": draw(st.sampled_from(["recompute", "swap"])),
        "batching": draw(st.sampled_from(["continuous", "static"])),
        "step_time": STEP_TIME if timed else None,
    }
    return requests, options


@settings(max_examples=150)
@given(days())
def test_every_request_completes_exactly_once_with_all_its_tokens(day):
    requests, options = day
    with checked() as engines, within(20):
        result = simulate(requests, **options)
    assert_conserved(result, requests, engines[0])
    assert result.timed is (options["step_time"] is not None)
    if options["max_batch"] is not None:
        assert result.peak_batch <= options["max_batch"]


@settings(max_examples=60)
@given(days(caches=("paged",)))
def test_paged_conservation_under_heavy_preemption(day):
    """The paged cache at just enough memory for its largest request: preemption is the rule."""
    requests, options = day
    bs = options["block_size"]
    options["kv_capacity_tokens"] = max(need("paged", r, 0, bs) for r in requests)
    with checked() as engines, within(20):
        result = simulate(requests, **options)
    assert_conserved(result, requests, engines[0])


def test_contiguous_caches_never_preempt_and_paged_does_at_tight_memory():
    day = sharegpt_like(40, seed=5, max_total=256)
    for cache in CACHE_NAMES:
        with checked() as engines:
            result = simulate(day, cache=cache, kv_capacity_tokens=1024, max_seq_len=256)
        assert_conserved(result, day, engines[0])
        assert (result.preemptions > 0) is (cache == "paged")


@settings(max_examples=40)
@given(days())
def test_the_same_day_gives_the_same_result(day):
    requests, options = day
    first, second = (simulate(requests, **options) for _ in range(2))
    assert first.summary() == second.summary()
    for name in ("times", "batch", "utilization", "occupancy", "waiting"):
        assert getattr(first, name) == getattr(second, name), name
    for a, b in zip(first.sequences, second.sequences, strict=True):
        assert (a.first_token_time, a.finish_time, a.num_preemptions) == (
            b.first_token_time,
            b.finish_time,
            b.num_preemptions,
        )
    assert (first.preemptions, first.recompute_tokens, first.swapped_tokens) == (
        second.preemptions,
        second.recompute_tokens,
        second.swapped_tokens,
    )


@settings(max_examples=40)
@given(days(), st.integers(1, 2**31))
def test_a_seed_only_reorders_ties(day, seed):
    requests, options = day
    base = simulate(requests, **options)
    shuffled = simulate(requests, **options, seed=seed)
    assert shuffled.completed == base.completed == len(requests)
    assert shuffled.tokens_generated == base.tokens_generated
    assert [q.seq_id for q in shuffled.sequences] == [f"r{i}" for i in range(len(requests))]
    assert simulate(requests, **options, seed=seed).summary() == shuffled.summary()
    # with no two arrivals at once there is nothing to reorder
    distinct = [Request(r.prompt_len, r.output_len, i) for i, r in enumerate(requests)]
    assert (
        simulate(distinct, **options).summary()
        == simulate(distinct, **options, seed=seed).summary()
    )


def test_a_seed_changes_the_order_of_a_tie():
    day = [Request(4, 1 + i) for i in range(6)]  # all at t=0, room for one guest at a time
    options = {"cache": "contiguous", "kv_capacity_tokens": 16, "max_seq_len": 16}
    order = [q.seq_id for q in sorted(simulate(day, **options).sequences, key=_finished)]
    assert order == [f"r{i}" for i in range(6)]  # seed 0: in the given order
    orders = {
        tuple(q.seq_id for q in sorted(simulate(day, **options, seed=s).sequences, key=_finished))
        for s in range(1, 6)
    }
    assert len(orders) > 1 and all(sorted(o) == sorted(order) for o in orders)


def _finished(seq):
    return seq.finish_time


def test_a_recorded_day_never_books_more_than_the_hotel():
    """The per-step invariant read from record=True traces: bookings within capacity, no room on
    two key cards, every key card's beds enough for its tokens."""
    day = sharegpt_like(12, seed=4, max_total=96)
    for cache in CACHE_NAMES:
        result = simulate(
            day, cache=cache, kv_capacity_tokens=256, max_seq_len=96, block_size=8, record=True
        )
        trace = result.trace
        steps = trace.events("step")
        assert len(steps) == result.steps
        for index in range(len(trace)):
            frame = trace.frames[index]
            assert sum(frame.booked.values()) <= trace.capacity
            assert all(frame.tokens[s] <= frame.booked[s] for s in frame.tokens)
            assert all(n == 1 for n in trace.ref_counts(index).values())
        final = trace.frames[-1]
        assert not final.tokens  # everyone checked out


# --- recompute vs swap, static vs continuous, the paper's comparison ----------------------------


@pytest.fixture(scope="module")
def paper_day():
    """A ShareGPT-like day, every request arriving at once, on the paper's 15.7K slots."""
    day = sharegpt_like(300, seed=0)
    options = {"kv_capacity_tokens": PAPER_SLOTS, "max_seq_len": PAPER_MAX_LEN}
    return day, options, {c: simulate(day, cache=c, **options) for c in CACHE_NAMES}


def test_paged_serves_at_least_twice_the_contiguous_throughput_at_equal_memory(paper_day):
    day, _, results = paper_day
    paged, orca_max = results["paged"], results["contiguous"]
    assert paged.completed == orca_max.completed == len(day)
    assert paged.throughput >= 2 * orca_max.throughput
    assert paged.mean_batch >= 2 * orca_max.mean_batch
    assert paged.mean_utilization > 0.9 > 0.4 > orca_max.mean_utilization
    # the paper's order: Max < Pow2 < Oracle < paged
    means = [results[c].mean_batch for c in CACHE_NAMES]
    assert means == sorted(means)
    assert orca_max.peak_batch == PAPER_SLOTS // PAPER_MAX_LEN  # 7 max-length slots


def test_recompute_and_swap_complete_the_same_day_and_move_different_things(paper_day):
    day, options, results = paper_day
    recompute = results["paged"]
    swap = simulate(day, cache="paged", preemption="swap", **options)
    assert recompute.preemptions > 0 and swap.preemptions == recompute.preemptions
    assert recompute.recompute_tokens > 0 and recompute.swapped_tokens == 0
    assert swap.swapped_tokens > 0 and swap.recompute_tokens == 0
    # in steps the two are the same day; only what a preemption costs differs
    assert swap.completed == recompute.completed == len(day)
    assert swap.batch == recompute.batch and swap.times == recompute.times
    assert swap.swapped_bytes(OPT_13B) == 2 * swap.swapped_tokens * 819200


def test_swap_and_recompute_cost_different_seconds():
    day = sharegpt_like(60, seed=1, max_total=512)
    options = {"cache": "paged", "kv_capacity_tokens": 1024, "max_seq_len": 512}
    recompute = simulate(day, **options, step_time=STEP_TIME)
    swap = simulate(day, **options, step_time=STEP_TIME, preemption="swap")
    assert recompute.preemptions > 0 and swap.preemptions > 0
    assert recompute.completed == swap.completed == len(day)
    assert recompute.tokens_generated == swap.tokens_generated
    assert recompute.seconds != swap.seconds


@pytest.mark.parametrize("cache", CACHE_NAMES)
def test_continuous_batching_beats_static(cache, paper_day):
    day, options, results = paper_day
    continuous = results[cache]
    static = simulate(day, cache=cache, batching="static", **options)
    assert static.completed == continuous.completed == len(day)
    assert static.tokens_generated == continuous.tokens_generated
    assert continuous.steps <= static.steps
    assert continuous.mean_batch >= static.mean_batch
    assert continuous.latency(50) <= static.latency(50)


def test_static_batching_runs_each_batch_until_its_longest_member_is_done():
    """Two max-length rooms of 8 beds. Static: r0 and r1 run; r2 and r3 wait until r1 (4 tokens)
    is done. Continuous: r2 takes r0's room as soon as r0 leaves, r3 takes r2's."""
    day = [Request(4, 1), Request(4, 4), Request(4, 2), Request(4, 1)]
    options = {"cache": "contiguous", "kv_capacity_tokens": 16, "max_seq_len": 8}
    static = simulate(day, **options, batching="static")
    assert static.batch == [2, 1, 1, 1, 2, 1]
    assert [q.finish_time for q in static.sequences] == [1, 4, 6, 5]
    continuous = simulate(day, **options)
    assert continuous.batch == [2, 2, 2, 2]
    assert [q.finish_time for q in continuous.sequences] == [1, 4, 3, 4]


@pytest.mark.parametrize("max_batch", [1, 2, 5])
def test_max_batch_caps_the_running_batch(max_batch):
    day = sharegpt_like(30, seed=2, max_total=128)
    result = simulate(day, cache="paged", kv_capacity_tokens=4096, max_seq_len=128, max_batch=2)
    assert result.peak_batch == 2 and result.completed == 30
    result = simulate(
        day, cache="paged", kv_capacity_tokens=4096, max_seq_len=128, max_batch=max_batch
    )
    assert result.peak_batch == max_batch


# --- rejection and bad arguments ------------------------------------------------------------------


def test_a_request_longer_than_max_seq_len_is_rejected_by_index():
    day = [Request(10, 10), Request(60, 5), Request(1, 1)]
    for cache in CACHE_NAMES:
        with pytest.raises(ValueError, match=r"requests\[1\] needs 65 tokens .*max_seq_len=64"):
            simulate(day, cache=cache, kv_capacity_tokens=4096, max_seq_len=64)


def test_a_request_that_cannot_fit_in_an_empty_cache_is_rejected_up_front():
    # paged: 33 tokens need 3 blocks of 16; 40 slots are 2 whole blocks
    with within(5), pytest.raises(ValueError, match=r"requests\[2\] needs 48 token slots"):
        day = [Request(1, 1), Request(16, 16), Request(20, 13)]
        simulate(day, cache="paged", kv_capacity_tokens=40, max_seq_len=64)
    # Orca-Max books max_seq_len per request, more than the whole memory
    with within(5), pytest.raises(ValueError, match=r"requests\[0\] needs 128 token slots"):
        simulate([Request(1, 1)], cache="contiguous", kv_capacity_tokens=100, max_seq_len=128)
    # Pow2 books 64 for 34 tokens, Oracle 34: only Pow2 cannot fit in 50
    with pytest.raises(ValueError, match=r"requests\[0\] needs 64 token slots"):
        simulate([Request(33, 1)], cache="contiguous-pow2", kv_capacity_tokens=50, max_seq_len=64)
    ok = simulate(
        [Request(33, 1)], cache="contiguous-oracle", kv_capacity_tokens=50, max_seq_len=64
    )
    assert ok.completed == 1
    # exactly enough is enough
    ok = simulate([Request(16, 16)], cache="paged", kv_capacity_tokens=40, max_seq_len=64)
    assert ok.completed == 1


def test_rejection_holds_even_for_a_long_day():
    """The impossible request is found before any step runs (never a hang)."""
    day = [*sharegpt_like(2000, seed=0), Request(2000, 1000)]
    with within(5), pytest.raises(ValueError, match=r"requests\[2000\] needs 3008 token slots"):
        simulate(day, cache="paged", kv_capacity_tokens=2048, max_seq_len=4096)


GOOD = {"cache": "paged", "kv_capacity_tokens": 64, "max_seq_len": 32}


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"cache": "vllm"}, ValueError, "cache must be one of"),
        ({"preemption": "evict"}, ValueError, "preemption must be one of"),
        ({"batching": "dynamic"}, ValueError, "batching must be one of"),
        ({"kv_capacity_tokens": 0}, ValueError, "kv_capacity_tokens must be >= 1"),
        ({"kv_capacity_tokens": 64.0}, TypeError, "kv_capacity_tokens must be an int"),
        ({"max_seq_len": 0}, ValueError, "max_seq_len must be >= 1"),
        ({"block_size": 0}, ValueError, "block_size must be >= 1"),
        ({"block_size": 128}, ValueError, "holds no whole block of block_size=128"),
        ({"max_batch": 0}, ValueError, "max_batch must be >= 1"),
        ({"max_batch": 2.5}, TypeError, "max_batch must be an int"),
        ({"step_time": 0.1}, TypeError, "step_time must be None or a cost model"),
        ({"seed": 1.5}, TypeError, "seed must be an int"),
        ({"schedule": Scheduler.step, "batching": "static"}, ValueError, "batching='continuous'"),
    ],
)
def test_bad_arguments_are_named(change, error, match):
    with pytest.raises(error, match=match):
        simulate([Request(4, 4)], **{**GOOD, **change})


@pytest.mark.parametrize(
    ("requests", "error", "match"),
    [
        ([], ValueError, "requests must not be empty"),
        (None, TypeError, "requests must be a list"),
        (iter([Request(1, 1)]), TypeError, "requests must be a list"),
        (
            [Request(1, 1), (4, 4)],
            TypeError,
            r"requests\[1\] must be a kvlab.serving.workload.Request",
        ),
    ],
)
def test_bad_requests_are_named(requests, error, match):
    with pytest.raises(error, match=match):
        simulate(requests, **GOOD)


def test_max_batch_must_be_a_count_not_a_bool():
    """max_batch=True once ran as max_batch=1: bools are not counts (kvlab.core.validate)."""
    with pytest.raises((TypeError, ValueError), match="max_batch"):
        simulate([Request(4, 4)], **GOOD, max_batch=True)


def test_make_cache_builds_the_four_caches_over_equal_memory():
    for name in CACHE_NAMES:
        cache = make_cache(name, 1000, 256, 16)
        assert cache.allocated_tokens == 0
        assert cache.capacity == (992 if name == "paged" else 1000)
    assert isinstance(make_cache("paged", 1000, 256, 16), PagedCache)
    assert make_cache("contiguous", 1000, 256).policy == "max"
    with pytest.raises(ValueError, match="cache must be one of"):
        make_cache("Paged", 1000, 256)


# --- the engine: clock, idle time, per-request timings ---------------------------------------


def test_two_requests_timed_by_hand():
    """A: prompt 2, output 3, arrives at 0. B: prompt 1, output 2, arrives at 1. Memory for both.

    step 0 [0, 1): A admitted, A's 1st token          -> A.first_token_time = 1
    step 1 [1, 2): B admitted; A 2nd, B 1st           -> B.first_token_time = 2
    step 2 [2, 3): A 3rd (done), B 2nd (done)         -> both finish at 3
    A: latency 3 - 0 = 3, ttft 1, tpot (3 - 1) / 2 = 1; B: latency 3 - 1 = 2, ttft 1, tpot 1.
    """
    day = [Request(2, 3, 0.0), Request(1, 2, 1.0)]
    result = simulate(day, cache="paged", kv_capacity_tokens=16, max_seq_len=8, block_size=4)
    a, b = result.sequences
    assert (a.first_token_time, a.finish_time) == (1.0, 3.0)
    assert (b.first_token_time, b.finish_time) == (2.0, 3.0)
    assert result.times == [0.0, 1.0, 2.0] and result.batch == [1, 2, 2]
    assert result.latencies() == [3.0, 2.0]
    assert result.ttfts() == [1.0, 1.0]
    assert result.tpots() == [1.0, 1.0]
    assert result.end_time == 3.0 and result.seconds == 3.0
    assert result.throughput == 5 / 3 and result.mean_batch == 5 / 3 and result.peak_batch == 2
    assert result.waiting == [0, 0, 0]
    assert result.latency(50) == 2.5 and result.ttft(100) == 1.0
    # blocks of 4: A holds 3 tokens in 1 block, then 4/1, then 5+2 tokens in 2+1 blocks
    assert result.utilization == [3 / 4, (4 + 2) / 8, (5 + 3) / 12]
    assert result.occupancy == [4 / 16, 8 / 16, 12 / 16]
    with pytest.raises(ValueError, match="needs a step_time model"):
        result.tokens_per_second  # noqa: B018
    assert "seconds" not in result.summary()


def test_one_guest_at_a_time_by_hand():
    """max_batch=1: A (2 + 3, at 0) runs steps 0-2; B (1 + 2, at 1) waits, then runs steps 3-4.
    B: first token at 4, done at 5: latency 5 - 1 = 4, ttft 4 - 1 = 3, tpot (5 - 4) / 1 = 1."""
    day = [Request(2, 3, 0.0), Request(1, 2, 1.0)]
    result = simulate(day, cache="paged", kv_capacity_tokens=16, max_seq_len=8, max_batch=1)
    a, b = result.sequences
    assert (a.first_token_time, a.finish_time) == (1.0, 3.0)
    assert (b.first_token_time, b.finish_time) == (4.0, 5.0)
    assert result.latencies() == [3.0, 4.0] and result.ttfts() == [1.0, 3.0]
    assert result.tpots() == [1.0, 1.0]
    assert result.times == [0.0, 1.0, 2.0, 3.0, 4.0] and result.batch == [1] * 5
    assert result.waiting == [0, 1, 1, 0, 0]


def test_idle_time_is_skipped_to_the_next_arrival():
    """In steps the clock jumps to the first whole step at or after the arrival; with a step-time
    model, to the arrival itself."""
    day = [Request(1, 1, 0.0), Request(1, 1, 2.5), Request(1, 2, 7.0)]
    steps = simulate(day, cache="paged", kv_capacity_tokens=16, max_seq_len=8)
    assert steps.times == [0.0, 3.0, 7.0, 8.0]
    assert [q.finish_time for q in steps.sequences] == [1.0, 4.0, 9.0]
    assert steps.latencies() == [1.0, 1.5, 2.0] and steps.seconds == 9.0

    class HalfSecond:
        def seconds(self, new_tokens, attended, kv_tokens, swapped_tokens):
            return 0.5

    timed = simulate(
        day, cache="paged", kv_capacity_tokens=16, max_seq_len=8, step_time=HalfSecond()
    )
    assert timed.timed and timed.times == [0.0, 2.5, 7.0, 7.5]
    assert [q.finish_time for q in timed.sequences] == [0.5, 3.0, 8.0]
    assert timed.seconds == 8.0 and timed.tokens_per_second == 4 / 8.0
    assert timed.ttfts() == [0.5, 0.5, 0.5] and timed.tpots() == [0.5]


def test_a_day_that_starts_late_measures_from_the_first_arrival():
    day = [Request(2, 2, 10.0), Request(2, 2, 10.0)]
    result = simulate(day, cache="contiguous", kv_capacity_tokens=8, max_seq_len=4)
    assert result.times == [10.0, 11.0] and result.end_time == 12.0 and result.seconds == 2.0


def test_an_arrival_just_after_a_whole_step_is_served():
    """An idle engine counting steps once rounded an arrival a hair after a whole step down to
    that step, admitted nothing (arrival > now) and looped forever."""
    with within(3):
        result = simulate(
            [Request(1, 1, 1e-10)], cache="paged", kv_capacity_tokens=16, max_seq_len=8
        )
    assert result.completed == 1 and result.times in ([0.0], [1.0])  # either rounding is fine


def test_a_timed_day_of_one_token_answers_has_a_summary():
    """A timed day of one-token answers has no time per output token: the summary says None
    instead of raising."""
    result = simulate(
        [Request(1, 1), Request(5, 1)],
        cache="paged",
        kv_capacity_tokens=16,
        max_seq_len=8,
        step_time=STEP_TIME,
    )
    assert result.completed == 2 and result.tpots() == []
    row = result.summary()
    assert row["completed"] == 2 and row["ttft_p50"] > 0 and row["tpot_p50"] is None


def test_a_schedule_that_never_admits_is_an_error_not_a_hang():
    def idle(scheduler, now):
        return ScheduledStep()

    with within(3), pytest.raises(RuntimeError, match="three steps in a row ran nobody"):
        simulate(
            [Request(2, 2)], cache="paged", kv_capacity_tokens=16, max_seq_len=8, schedule=idle
        )


def test_engine_runs_a_scheduler_with_its_own_executor():
    class Counting:
        timed = False
        can_swap = False

        def __init__(self):
            self.positions = []

        def execute(self, step):
            self.positions.append([new_positions(q) for q in step.scheduled])
            return None

    executor = Counting()
    engine = Engine(PagedCache(8, 4), executor)
    engine.add(Sequence("a", 3, 3))
    engine.run()
    # a prefill of the prompt, then one decode per step
    assert executor.positions == [[(0, 3)], [(3, 4)], [(4, 5)]]
    assert engine.num_steps == 3 and engine.clock == 3.0 and not engine.has_unfinished()
    with pytest.raises(RuntimeError, match="max_steps=1"):
        other = Engine(PagedCache(8, 4))
        other.add(Sequence("b", 3, 3))
        other.run(max_steps=1)
    with pytest.raises(TypeError, match="schedule must return a ScheduledStep"):
        bad = Engine(PagedCache(8, 4), schedule=lambda scheduler, now: None)
        bad.add(Sequence("c", 3, 3))
        bad.step()


# --- percentiles ---------------------------------------------------------------------------


@settings(max_examples=100)
@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=40),
    st.floats(0, 100),
)
def test_percentile_matches_numpy(values, p):
    assert percentile(values, p) == pytest.approx(np.percentile(values, p), rel=1e-9, abs=1e-6)


def test_percentile_edges():
    assert percentile([3.0], 99) == 3.0
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([4, 1, 3, 2], 100) == 4
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match=r"p must be in \[0, 100\]"):
        percentile([1.0], 101)


# --- the step-time model ---------------------------------------------------------------------


TOY = ModelSpec("toy", 1, 1, 1, 2, dtype_bytes=2, num_params=100)  # 8 bytes of K/V per token
TOY_GPU = GPU("toy", hbm_bytes_per_s=1000.0, peak_flops=10_000.0, memory_bytes=1e6)


def test_a_decode_step_is_memory_bound_by_hand():
    # one new token at position 3 attends to 4 positions; K/V of 4 tokens read and written
    # FLOPs: 2*100*1 + 4*1*1*2*4 = 232 -> 0.0232 s; bytes: 100*2 + 4*8 = 232 -> 0.232 s
    assert StepTime(TOY, TOY_GPU).seconds(1, 4, 4) == pytest.approx(0.232)


def test_a_prefill_step_is_compute_bound_by_hand():
    # 100 new tokens attend to 1 + 2 + ... + 100 = 5050 positions
    # FLOPs: 2*100*100 + 4*1*1*2*5050 = 60400 -> 6.04 s; bytes: 200 + 100*8 = 1000 -> 1.0 s
    assert StepTime(TOY, TOY_GPU).seconds(100, 5050, 100) == pytest.approx(6.04)


def test_swapping_adds_the_pcie_time_by_hand():
    # 10 tokens x 8 bytes over 40 B/s = 2 s, on top of the 0.232 s decode
    model = StepTime(TOY, TOY_GPU, pcie_bytes_per_s=40.0)
    assert model.seconds(1, 4, 4, swapped_tokens=10) == pytest.approx(2.232)


def test_the_simulator_costs_prefill_then_decode_by_hand():
    # prompt 3, output 2: step 0 computes positions 0..2 (attending 1+2+3 = 6, K/V of 3 tokens):
    #   FLOPs 2*100*3 + 8*6 = 648 -> 0.0648 s; bytes 200 + 3*8 = 224 -> 0.224 s (memory-bound)
    # step 1 computes position 3 (attending 4, K/V of 4 tokens): 0.232 s, as above
    result = simulate(
        [Request(3, 2)],
        cache="paged",
        kv_capacity_tokens=16,
        max_seq_len=8,
        step_time=StepTime(TOY, TOY_GPU),
    )
    assert result.times == pytest.approx([0.0, 0.224])
    assert result.end_time == pytest.approx(0.224 + 0.232)
    q = result.sequences[0]
    assert result.ttft() == pytest.approx(0.224) and result.tpot() == pytest.approx(0.232)
    assert q.finish_time == pytest.approx(0.456)
    summary = result.summary()
    assert summary["tokens_per_second"] == pytest.approx(2 / 0.456)


def test_opt_13b_decode_costs_about_a_weight_read():
    seconds = STEP_TIME.seconds(1, 1000, 1000)
    weights = OPT_13B.num_params * 2 / A100_40GB.hbm_bytes_per_s  # ~16.6 ms
    assert weights < seconds < 1.1 * weights


def test_step_time_arguments():
    with pytest.raises(ValueError, match="no num_params"):
        StepTime(ModelSpec("x", 1, 1, 1, 1), TOY_GPU)
    with pytest.raises(ValueError, match="pcie_bytes_per_s must be > 0"):
        StepTime(TOY, TOY_GPU, pcie_bytes_per_s=0)
    assert CostedSteps(None).execute(None) is None


# --- the scheduler's hooks ------------------------------------------------------------------


def test_admit_needs_a_waiting_sequence():
    scheduler = Scheduler(PagedCache(4, 4))
    seq = Sequence("s", 2, 2)
    with pytest.raises(ValueError, match=r"s is not in the queue \(status waiting\)"):
        scheduler.admit(seq)  # never added
    scheduler.add(seq)
    scheduler.admit(seq)
    assert seq.status is RUNNING
    with pytest.raises(ValueError, match=r"s is not in the queue \(status running\)"):
        scheduler.admit(seq)
    assert scheduler.running == [seq] and not scheduler.waiting


def test_preempt_with_nothing_running_raises():
    for mode in ("recompute", "swap"):
        with pytest.raises(ValueError, match="no running sequence to preempt"):
            Scheduler(PagedCache(4, 4), preemption=mode).preempt()


def last_admitted_leaves(scheduler):
    """A correct custom preempt: what the built-in does, written against the scheduler's state."""
    victim = scheduler.running.pop()
    scheduler.cache.release(victim.seq_id)
    if scheduler.preemption == "recompute":
        victim.num_computed = 0
        victim.status = PREEMPTED
    else:
        victim.status = SWAPPED
    scheduler.waiting.appendleft(victim)
    return victim


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_a_custom_preempt_like_the_builtin_gives_the_same_day(preemption):
    day = sharegpt_like(60, seed=3, max_total=512)
    options = {
        "cache": "paged",
        "kv_capacity_tokens": 1024,
        "max_seq_len": 512,
        "preemption": preemption,
        "step_time": STEP_TIME,
    }
    builtin = simulate(day, **options)
    custom = simulate(day, **options, preempt=last_admitted_leaves)
    assert builtin.preemptions > 0
    assert custom.summary() == builtin.summary()
    assert (custom.times, custom.batch, custom.waiting) == (
        builtin.times,
        builtin.batch,
        builtin.waiting,
    )
    assert (custom.recompute_tokens, custom.swapped_tokens) == (
        builtin.recompute_tokens,
        builtin.swapped_tokens,
    )
    assert [q.num_preemptions for q in custom.sequences] == [
        q.num_preemptions for q in builtin.sequences
    ]


def test_a_custom_preempt_cannot_swap_a_models_k_and_v():
    class Swapper:
        def swap_out(self, seq): ...

        def swap_in(self, seq): ...

    with pytest.raises(ValueError, match="custom preempt cannot swap"):
        Scheduler(PagedCache(4, 4), preemption="swap", swapper=Swapper(), preempt=lambda s: None)
    # recompute with a swapper, or swap without one, are fine
    Scheduler(PagedCache(4, 4), swapper=Swapper(), preempt=last_admitted_leaves)
    Scheduler(PagedCache(4, 4), preemption="swap", preempt=last_admitted_leaves)


def test_a_custom_preempt_must_return_the_sequence():
    day = [Request(4, 8), Request(4, 8)]
    with pytest.raises(TypeError, match="preempt must return the Sequence"):
        simulate(
            day,
            cache="paged",
            kv_capacity_tokens=16,
            max_seq_len=16,
            block_size=4,
            preempt=lambda s: last_admitted_leaves(s).seq_id,
        )


def test_swapping_tells_the_swapper_and_counts_both_ways():
    class Swapper:
        timed = False
        can_swap = True

        def __init__(self):
            self.moves = []

        def execute(self, step):
            return None

        def swap_out(self, seq):
            self.moves.append(("out", seq.seq_id, seq.num_computed))

        def swap_in(self, seq):
            self.moves.append(("in", seq.seq_id, seq.num_computed))

    swapper = Swapper()
    engine = Engine(PagedCache(4, 4), swapper, preemption="swap")
    for name in ("a", "b"):
        engine.add(Sequence(name, 4, 6))
    engine.run()
    s = engine.scheduler
    assert s.num_preemptions > 0 and s.swapped_out_tokens == s.swapped_in_tokens
    assert swapper.moves and {m[0] for m in swapper.moves} == {"out", "in"}
    outs = [m for m in swapper.moves if m[0] == "out"]
    assert sum(m[2] for m in outs) == s.swapped_out_tokens


# --- the benchmark ---------------------------------------------------------------------------


def test_bench_serve_reports_figures_and_writes_json(tmp_path, capsys):
    import json

    from kvlab.perf import bench

    out = tmp_path / "serve.json"
    assert bench.main("serve", str(out), requests=200) == 0
    report = json.loads(out.read_text())
    assert report["benchmark"] == "serve" and report["workload"]["requests"] == 200
    results = report["results"]
    assert results["steps"] > 0 and results["requests_per_s (simulated per CPU second)"] > 0
    assert [row["cache"] for row in report["caches"]] == list(CACHE_NAMES)
    assert report["caches"][0]["throughput_vs_contiguous"] == 1.0
    assert report["caches"][-1]["throughput_vs_contiguous"] > 1.0
    printed = capsys.readouterr().out
    assert "mean_batch" in printed and "contiguous-oracle" in printed and "target <=" in printed


def test_a_schedule_that_admits_but_never_decodes_is_an_error_not_a_hang():
    def admit_only(scheduler, now):
        out = ScheduledStep()
        while scheduler.waiting:
            seq = scheduler.waiting[0]
            scheduler.admit(seq)
            out.admitted.append(seq)
        return out

    with within(3), pytest.raises(RuntimeError, match="three steps in a row ran nobody"):
        simulate(
            [Request(4, 2)],
            cache="paged",
            kv_capacity_tokens=64,
            max_seq_len=64,
            schedule=admit_only,
        )


@pytest.mark.parametrize(
    "preempt, match",
    [
        (lambda s: s.running[-1], "without sending it away"),  # chosen, never sent away
        (lambda s: last_admitted_leaves(s) and s.running[0], "without sending it away"),
    ],
)
def test_a_custom_preempt_that_does_not_send_the_guest_away_is_an_error(preempt, match):
    day = [Request(4, 8), Request(4, 8)]
    with within(3), pytest.raises(ValueError, match=match):
        simulate(
            day, cache="paged", kv_capacity_tokens=16, max_seq_len=16, block_size=4, preempt=preempt
        )


def test_a_custom_preempt_may_not_choose_a_guest_already_served_this_step():
    def oldest_leaves(scheduler):
        victim = scheduler.running.pop(0)
        scheduler.cache.release(victim.seq_id)
        victim.num_computed, victim.status = 0, SequenceStatus.PREEMPTED
        scheduler.waiting.appendleft(victim)
        return victim

    day = [Request(4, 8), Request(6, 8)]  # b's last room fills first, after a was served
    with within(3), pytest.raises(ValueError, match="already has its token for this step"):
        simulate(
            day,
            cache="paged",
            kv_capacity_tokens=16,
            max_seq_len=16,
            block_size=4,
            preempt=oldest_leaves,
        )


def test_sequences_are_checked_when_added():
    scheduler = Scheduler(PagedCache(4, 4))
    with pytest.raises(ValueError, match="output_len must be >= 1"):
        scheduler.add(Sequence("x", 3, 0))
    with pytest.raises(TypeError, match="seq must be a kvlab.serving.scheduler.Sequence"):
        scheduler.add(Request(3, 1))
    with pytest.raises(TypeError, match="seq must be a kvlab.serving.scheduler.Sequence"):
        scheduler.admit("r0")
    with pytest.raises(TypeError, match="preempt must be a function"):
        Scheduler(PagedCache(4, 4), preempt=5)
    with pytest.raises(TypeError, match="schedule must be a function"):
        Engine(PagedCache(4, 4), schedule=5)
