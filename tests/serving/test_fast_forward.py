"""kvlab.serving.fast_forward: a stretch of pure decode steps run at once gives what stepping gives.

The property test serves random small days twice, fast-forwarded and stepped one at a time, and
compares every measure, every sequence, the engine's clock and counters, the scheduler's
counters and the cache's block tables wherever the fast engine stopped between two runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core.block_manager import PagedCache
from kvlab.models import preset
from kvlab.perf.gpus import lookup
from kvlab.perf.roofline import StepTime
from kvlab.serving import CACHES, Engine, simulate
from kvlab.serving.interfaces import DecodeRunExecutor, DecodeRunObserver
from kvlab.serving.scheduler import Sequence, SequenceStatus
from kvlab.serving.simulation import CostedSteps
from kvlab.serving.workload import Request, sharegpt_like

simulate_module = importlib.import_module("kvlab.serving.simulation")
STEP_TIME = StepTime(preset("Llama-3-8B"), lookup("H100-80GB"))
STEP_S = STEP_TIME.seconds(1, 16.0, 16)  # about one small decode step, to space arrivals


class Watched(Engine):
    """The engine, keeping the cache's state wherever it stands between steps or runs."""

    made: list[Watched] = []

    def __init__(self, cache, *args, **kwargs):
        super().__init__(cache, *args, **kwargs)
        Watched.made.append(self)
        self.states = {}  # num_steps -> cache.state()

    def step(self):
        step = super().step()
        self.states[self.num_steps] = self.cache.state()
        return step

    def decode_run(self, limit):
        run = super().decode_run(limit)
        if run is not None:
            assert 1 <= run.steps <= limit
            self.states[self.num_steps] = self.cache.state()
        return run


@contextlib.contextmanager
def watched():
    Watched.made = []
    with mock.patch.object(simulate_module, "Engine", Watched):
        yield Watched.made


def serve_both(requests, **options):
    """The day fast-forwarded and stepped one at a time: (result, engine) for each."""
    out = []
    for fast in (True, False):
        with watched() as engines:
            result = simulate(requests, fast_forward=fast, **options)
        out.append((result, engines[0]))
    return out


ENGINE_FIELDS = ("clock", "_ticks", "step_start", "num_steps", "token_gaps", "_stuck")
SCHEDULER_FIELDS = (
    "num_preemptions",
    "num_finished",
    "swapped_out_tokens",
    "swapped_in_tokens",
    "recompute_tokens",
)
NOT_COMPARED = {"sequences", "trace", "fast_forward_steps", "fast_forward_runs"}


def assert_identical(fast, stepped) -> None:
    (a, ea), (b, eb) = fast, stepped
    assert b.fast_forward_steps == b.fast_forward_runs == 0
    assert a.fast_forward_steps <= a.steps and a.fast_forward_runs <= a.fast_forward_steps
    for f in dataclasses.fields(a):
        if f.name not in NOT_COMPARED:
            assert getattr(a, f.name) == getattr(b, f.name), f.name
    for p, q in zip(a.sequences, b.sequences, strict=True):
        assert vars(p) == vars(q), p.seq_id
    for name in ENGINE_FIELDS:
        assert getattr(ea, name) == getattr(eb, name), name
    for name in SCHEDULER_FIELDS:
        assert getattr(ea.scheduler, name) == getattr(eb.scheduler, name), name
    # the same rooms handed out in the same order, wherever the fast engine stopped
    for steps, state in ea.states.items():
        assert state == eb.states[steps], f"cache after {steps} steps"
    assert_same_free_memory(ea.cache, eb.cache)


def assert_same_free_memory(a, b) -> None:
    """The free queue in the same order: one guest taking all of memory gets the same rooms."""
    if isinstance(a, PagedCache):
        size = a.manager.block_size
        a.admit("everything", a.capacity - size + 1)
        b.admit("everything", b.capacity - size + 1)
    assert a.state() == b.state()


@st.composite
def fleet_days(draw, caches=tuple(CACHES)):
    """A small random day and how to serve it: arrivals in bursts and gaps, memory tight enough
    for preemption, with or without a token budget and chunked prefill, timed or not."""
    cache = draw(st.sampled_from(caches))
    block_size = draw(st.sampled_from([1, 2, 3, 4, 16]))
    length = st.one_of(st.integers(1, 8), st.integers(1, 40))
    arrival = st.one_of(st.just(0.0), st.integers(0, 200).map(lambda q: q / 4))
    n = draw(st.integers(1, 25))
    requests = [Request(draw(length), draw(length), draw(arrival)) for _ in range(n)]
    max_seq_len = max(r.total_len for r in requests) + draw(st.sampled_from([0, 1, 9]))
    floor = max(_need(cache, r, max_seq_len, block_size) for r in requests)
    capacity = floor + draw(st.one_of(st.just(0), st.integers(0, 3 * floor)))
    timed = draw(st.booleans())
    if timed:  # arrivals in seconds, about one decode step per unit
        requests = [Request(r.prompt_len, r.output_len, r.arrival * STEP_S) for r in requests]
    preemption = draw(st.sampled_from(["recompute", "swap"]))
    budget, chunked = None, False
    if draw(st.booleans()):
        chunked = draw(st.booleans())
        most = max(r.total_len - 1 if preemption == "recompute" else r.prompt_len for r in requests)
        low = 1 if chunked else most
        budget = draw(st.integers(low, low + 40))
    options = {
        "cache": cache,
        "kv_capacity_tokens": capacity,
        "max_seq_len": max_seq_len,
        "block_size": block_size,
        "max_batch": draw(st.sampled_from([None, None, 1, 2, 5])),
        "preemption": preemption,
        "batching": draw(st.sampled_from(["continuous", "continuous", "static"])),
        "step_time": STEP_TIME if timed else None,
        "max_num_batched_tokens": budget,
        "chunked_prefill": chunked,
    }
    return requests, options


def _need(cache: str, r: Request, max_seq_len: int, block_size: int) -> int:
    from kvlab.core.contiguous import booking_size

    policy = CACHES[cache]
    if policy is None:
        return -(-r.total_len // block_size) * block_size
    return booking_size(policy, r.prompt_len, r.output_len, max_seq_len)


@settings(max_examples=300, deadline=None)
@given(fleet_days())
def test_fast_forward_gives_what_stepping_gives(day):
    requests, options = day
    assert_identical(*serve_both(requests, **options))


@settings(max_examples=200, deadline=None)
@given(fleet_days(caches=("paged",)), st.sampled_from([0, 0, 1, 2]))
def test_fast_forward_gives_what_stepping_gives_under_heavy_preemption(day, spare_blocks):
    """The paged cache at just enough memory for its largest request: runs end at every room
    that is not free."""
    requests, options = day
    size = options["block_size"]
    options["kv_capacity_tokens"] = (
        max(_need("paged", r, 0, size) for r in requests) + spare_blocks * size
    )
    assert_identical(*serve_both(requests, **options))


@pytest.mark.parametrize("cache", tuple(CACHES))
@pytest.mark.parametrize("timed", [False, True])
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_a_busy_day_is_mostly_fast_forwarded_and_identical(cache, timed, preemption):
    day = sharegpt_like(60, seed=3, max_total=512)
    if timed:  # a burst, then the rest one by one
        day = [
            Request(r.prompt_len, r.output_len, 0.0 if i < 30 else i * 0.05)
            for i, r in enumerate(day)
        ]
    options = {
        "cache": cache,
        "kv_capacity_tokens": 4096,
        "max_seq_len": 512,
        "preemption": preemption,
        "step_time": STEP_TIME if timed else None,
    }
    fast, stepped = serve_both(day, **options)
    assert_identical(fast, stepped)
    result = fast[0]
    assert result.fast_forward_steps > result.steps / 2 and result.fast_forward_runs > 1
    if cache == "paged":
        assert result.preemptions > 0


@pytest.mark.parametrize("chunked", [False, True])
def test_a_token_budget_day_is_fast_forwarded_and_identical(chunked):
    day = sharegpt_like(40, seed=1, max_total=512)
    budget = 64 if chunked else 511
    options = {"cache": "paged", "kv_capacity_tokens": 4096, "max_seq_len": 512}
    fast, stepped = serve_both(
        day, **options, max_num_batched_tokens=budget, chunked_prefill=chunked
    )
    assert_identical(fast, stepped)
    assert fast[0].fast_forward_steps > 0


@settings(max_examples=300, deadline=None)
@given(
    fleet_days(caches=("paged", "contiguous-oracle")),
    st.integers(1, 8),
    st.sampled_from([0, 1]),
)
def test_fast_forward_gives_what_stepping_gives_under_a_small_chunked_budget(
    day, budget, spare_blocks
):
    """Prompts read in chunks, readmitted ones too: a run may start where a prompt's last chunk
    is one token (its first token, or its first since a preemption, comes inside the run)."""
    requests, options = day
    if options["cache"] == "paged":
        size = options["block_size"]
        need = max(_need("paged", r, 0, size) for r in requests)
        options["kv_capacity_tokens"] = need + spare_blocks * size
    options.update(max_num_batched_tokens=budget, chunked_prefill=True)
    assert_identical(*serve_both(requests, **options))


# the days on which a wrong guess of when the queue's head gets in, or of a token's gap, shows
EDGE_DAYS = {
    # a whole prompt that fits exactly what the decodes leave of the budget is admitted
    "budget-exactly-left": (
        [Request(2, 30), Request(8, 30), Request(8, 30)],
        {"max_num_batched_tokens": 10, "preemption": "swap"},
    ),
    # with chunked prefill, one token of budget left starts the head's prompt
    "one-token-of-budget-left": (
        [Request(1, 30), Request(2, 30), Request(5, 30)],
        {"max_num_batched_tokens": 3, "chunked_prefill": True},
    ),
    # a readmitted guest's last chunk is one token: its first token since the preemption comes
    # in the run's first step, a gap since its last token before it left
    "readmitted-last-chunk-of-one": (
        [Request(1, 6), Request(10, 1, 4.0), Request(12, 5), Request(10, 5), Request(7, 8)],
        {
            "kv_capacity_tokens": 20,
            "block_size": 4,
            "max_num_batched_tokens": 6,
            "chunked_prefill": True,
        },
    ),
}


@pytest.mark.parametrize("name", EDGE_DAYS)
def test_fast_forward_on_the_edge_days(name):
    requests, options = EDGE_DAYS[name]
    options = {"cache": "paged", "kv_capacity_tokens": 1024, "max_seq_len": 64, **options}
    assert_identical(*serve_both(requests, **options))


def test_a_recorded_day_steps_one_at_a_time_and_keeps_every_frame():
    day = sharegpt_like(12, seed=4, max_total=96)
    options = {"kv_capacity_tokens": 256, "max_seq_len": 96, "block_size": 8, "record": True}
    for cache in CACHES:
        fast = simulate(day, cache=cache, **options)
        stepped = simulate(day, cache=cache, fast_forward=False, **options)
        assert fast.fast_forward_steps == 0
        assert len(fast.trace.events("step")) == fast.steps
        assert fast.trace.frames == stepped.trace.frames
        assert fast.times == stepped.times and fast.utilization == stepped.utilization


def test_only_what_cannot_see_the_difference_is_fast_forwarded():
    day = sharegpt_like(20, seed=2, max_total=256)
    options = {"cache": "paged", "kv_capacity_tokens": 1024, "max_seq_len": 256}
    assert simulate(day, **options).fast_forward_steps > 0
    assert simulate(day, **options, fast_forward=False).fast_forward_steps == 0
    # the learner's own schedule or preempt, and prefix caching, see every step
    own = simulate(day, **options, schedule=lambda scheduler, now: scheduler.step(now))
    assert own.fast_forward_steps == 0
    last = simulate(day, **options, preempt=last_admitted_leaves)
    assert last.fast_forward_steps == 0 and last.preemptions > 0
    assert simulate(day, **options, prefix_caching=True).fast_forward_steps == 0


class Counting:
    """An executor that computes (as the tiny model's does): not a DecodeRunExecutor."""

    timed = False
    can_swap = False

    def __init__(self):
        self.steps = 0

    def execute(self, step):
        self.steps += 1


class Told:
    """An observer that can only be told step by step."""

    def __init__(self):
        self.steps = 0

    def after_step(self, engine, step):
        self.steps += 1


def last_admitted_leaves(scheduler):
    victim = scheduler.running.pop()
    scheduler.cache.release(victim.seq_id)
    victim.num_computed, victim.status = 0, SequenceStatus.PREEMPTED
    scheduler.waiting.appendleft(victim)
    return victim


def _engine(executor=None, observer=None, fast_forward=True):
    engine = Engine(PagedCache(64, 4), executor, observer=observer, fast_forward=fast_forward)
    for i in range(6):
        engine.add(Sequence(f"s{i}", 3 + i, 40 + 7 * i))
    return engine


def test_an_executor_or_observer_that_must_see_each_step_sees_each_step():
    assert isinstance(CostedSteps(), DecodeRunExecutor) and not isinstance(
        Counting(), DecodeRunExecutor
    )
    assert isinstance(simulate_module._Measure, type)
    assert not isinstance(Told(), DecodeRunObserver)
    counting = _engine(Counting())
    counting.run()
    assert counting.executor.steps == counting.num_steps and counting.fast_forward_steps == 0
    told = _engine(observer=Told())
    told.run()
    assert told.observer.steps == told.num_steps and told.fast_forward_steps == 0
    plain, stepped = _engine(), _engine(fast_forward=False)
    plain.run()
    stepped.run()
    assert plain.fast_forward_steps > 0 and stepped.fast_forward_steps == 0
    for name in ENGINE_FIELDS:
        assert getattr(plain, name) == getattr(stepped, name), name


def test_max_steps_counts_fast_forwarded_steps_as_steps():
    engine = _engine()
    engine.run()
    needed = engine.num_steps

    def finishes(fast_forward: bool, max_steps: int) -> bool:
        try:
            _engine(fast_forward=fast_forward).run(max_steps=max_steps)
        except RuntimeError:
            return False
        return True

    outcomes = [finishes(True, m) for m in range(needed - 2, needed + 3)]
    assert outcomes == [finishes(False, m) for m in range(needed - 2, needed + 3)]
    assert not outcomes[0] and outcomes[-1]


def test_a_request_that_could_outgrow_the_budget_is_refused_before_any_step():
    """Without chunking, a request preempted by recompute reads all it had in one step: one
    that could outgrow the budget is refused when added, fast-forward or not."""
    for fast_forward in (True, False):
        engine = Engine(PagedCache(4, 4), max_num_batched_tokens=7, fast_forward=fast_forward)
        engine.add(Sequence("a", 2, 6))  # 7 tokens at most: fits
        with pytest.raises(ValueError, match="max_num_batched_tokens=7"):
            engine.add(Sequence("b", 5, 12))
        engine.run()
        assert (engine.num_steps, engine.clock) == (6, 6.0)


def test_fast_forward_must_be_a_bool():
    with pytest.raises(TypeError, match="fast_forward must be a bool"):
        Engine(PagedCache(4, 4), fast_forward=1)
