"""The serving seams: one EngineConfig for every part, one scheduling path, tokens counted in one
place, a run until a time, and a prefix lookup on the cache interface."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core.block_manager import PagedCache
from kvlab.serving import Engine, simulate, simulate_fleet
from kvlab.serving.config import EngineConfig, resolve
from kvlab.serving.interfaces import PrefixCachingKVCache
from kvlab.serving.scheduler import Scheduler, Sequence
from kvlab.serving.workload import Request, many_tenants, sharegpt_like

DAY = {"cache": "paged", "kv_capacity_tokens": 256, "max_seq_len": 64, "block_size": 4}


# --- the config -----------------------------------------------------------------------------------


def test_the_defaults_are_the_old_keywords_defaults():
    config = EngineConfig()
    assert (config.max_batch, config.preemption, config.batching) == (
        None,
        "recompute",
        "continuous",
    )
    assert config.max_num_batched_tokens is None and config.token_budget == math.inf
    assert (config.chunked_prefill, config.fast_forward, config.step_seconds) == (False, True, 1.0)
    assert (config.cache, config.block_size, config.prefix_cache) == ("paged", 16, None)
    assert EngineConfig(max_num_batched_tokens=8).token_budget == 8


def test_it_is_frozen_and_replace_checks_again():
    config = EngineConfig(max_batch=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_batch = 5
    assert config.replace(max_batch=5).max_batch == 5 and config.max_batch == 4
    with pytest.raises(ValueError, match="max_batch must be >= 1"):
        config.replace(max_batch=0)
    with pytest.raises(TypeError):
        EngineConfig(4)  # keywords only: a positional 4 names nothing


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"max_batch": 0}, ValueError, "max_batch must be >= 1"),
        ({"max_batch": True}, TypeError, "max_batch must be an int"),
        ({"preemption": "evict"}, ValueError, "preemption must be one of"),
        ({"batching": "dynamic"}, ValueError, "batching must be one of"),
        ({"max_num_batched_tokens": 0}, ValueError, "max_num_batched_tokens must be >= 1"),
        ({"chunked_prefill": 1}, TypeError, "chunked_prefill must be a bool"),
        ({"chunked_prefill": True}, ValueError, "chunked_prefill needs a token budget"),
        ({"schedule": 5}, TypeError, "schedule must be a function"),
        ({"schedule": Scheduler.step, "batching": "static"}, ValueError, "continuous"),
        ({"preempt": 5}, TypeError, "preempt must be a function"),
        ({"step_seconds": 0}, ValueError, "step_seconds must be a number > 0"),
        ({"step_seconds": True}, ValueError, "step_seconds"),
        ({"fast_forward": "yes"}, TypeError, "fast_forward must be a bool"),
        ({"cache": "vllm"}, ValueError, "cache must be one of"),
        ({"kv_capacity_tokens": 0}, ValueError, "kv_capacity_tokens must be >= 1"),
        ({"max_seq_len": 2.0}, TypeError, "max_seq_len must be an int"),
        ({"block_size": 0}, ValueError, "block_size must be >= 1"),
        ({"kv_capacity_tokens": 15, "block_size": 16}, ValueError, "holds no whole block"),
        ({"prefix_caching": "lru"}, ValueError, "prefix_caching must be False, True or one"),
        ({"prefix_caching": 1}, TypeError, "prefix_caching must be a bool"),
        ({"prefix_caching": True, "cache": "contiguous"}, ValueError, "needs the paged cache"),
        ({"cpu_cache_blocks": 4}, ValueError, "cpu_cache_blocks is a tier of the prefix cache"),
        ({"cpu_cache_blocks": 0, "prefix_caching": True}, ValueError, "cpu_cache_blocks must"),
        ({"step_time": 0.1}, TypeError, "step_time must be None or a cost model"),
        ({"record": 1}, TypeError, "record must be a bool"),
    ],
)
def test_each_bad_setting_is_named(change, error, match):
    with pytest.raises(error, match=match):
        EngineConfig(**change)


def test_resolve_builds_or_changes_a_config_and_names_an_unknown_setting():
    base = EngineConfig(max_batch=2)
    assert resolve(None, {}, caller="x") == EngineConfig()
    assert resolve(base, {}, caller="x") is base
    assert resolve(base, {"preemption": "swap"}, caller="x") == base.replace(preemption="swap")
    with pytest.raises(
        TypeError, match=r"simulate\(\) got an unexpected keyword argument 'budget'"
    ):
        resolve(None, {"budget": 8}, caller="simulate")
    with pytest.raises(TypeError, match="config must be a kvlab.serving.config.EngineConfig"):
        resolve({"max_batch": 2}, {}, caller="x")
    # each part takes only the settings it reads, as its keywords always were
    with pytest.raises(TypeError, match="Scheduler"):
        Scheduler(PagedCache(4, 4), step_seconds=2.0)
    with pytest.raises(TypeError, match="Engine"):
        Engine(PagedCache(4, 4), cache="paged")


def test_a_simulated_server_needs_its_sizes():
    with pytest.raises(TypeError, match="needs kv_capacity_tokens"):
        EngineConfig().make_cache()
    with pytest.raises(TypeError, match="needs max_seq_len"):
        simulate([Request(2, 2)], kv_capacity_tokens=64)


def test_one_config_serves_every_part():
    """The same config through simulate, simulate_fleet, Engine and Scheduler: the same day."""
    day = sharegpt_like(40, seed=3, max_total=64)
    config = EngineConfig(max_batch=6, max_num_batched_tokens=64, chunked_prefill=True, **DAY)
    by_config = simulate(day, config)
    by_keywords = simulate(day, max_batch=6, max_num_batched_tokens=64, chunked_prefill=True, **DAY)
    assert by_config.summary() == by_keywords.summary()
    assert by_config.times == by_keywords.times and by_config.token_gaps == by_keywords.token_gaps
    fleet = simulate_fleet(day, config, replicas=1)
    assert fleet.per_replica[0].summary() == by_config.summary()
    # keywords given with a config change it
    swap = simulate(day, config, preemption="swap")
    assert swap.summary() == simulate(day, config.replace(preemption="swap")).summary()
    engine = Engine(config.make_cache(), config=config)
    assert engine.config is config and engine.scheduler.config is config
    assert engine.scheduler.max_batch == 6 and engine.scheduler.max_num_batched_tokens == 64
    scheduler = Scheduler(PagedCache(8, 4), config=config)
    assert scheduler.chunked_prefill and scheduler.token_budget == 64


def test_a_fleet_given_a_config_takes_its_prefix_caching_as_it_is():
    day = many_tenants(30, tenants=2, system_prompt_len=32, rate=10.0, seed=0)
    sizes = {"kv_capacity_tokens": 4_096, "max_seq_len": 2_048}
    assert simulate_fleet(day, replicas=2, **sizes).prefix_hit_rate > 0  # on by default
    off = simulate_fleet(day, EngineConfig(**sizes), replicas=2)
    assert off.prefix_hit_rate == 0 and not off.per_replica[0].prefix_caching


# --- one scheduling path --------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 20), st.integers(1, 12), st.integers(0, 6)),
        min_size=1,
        max_size=12,
    ),
    st.sampled_from(["recompute", "swap"]),
    st.sampled_from([None, 3]),
)
def test_no_budget_is_an_unlimited_budget(guests, preemption, max_batch):
    """Without a budget the scheduler's one path sets what every sequence computes; a budget
    nothing can reach gives the same steps (and the same tokens per step)."""
    days = []
    for budget in (None, 10**9):
        scheduler = Scheduler(
            PagedCache(12, 4),
            preemption=preemption,
            max_batch=max_batch,
            max_num_batched_tokens=budget,
        )
        seqs = [Sequence(f"s{i}", p, o, float(a)) for i, (p, o, a) in enumerate(guests)]
        for seq in sorted(seqs, key=lambda q: q.arrival):
            scheduler.add(seq)
        steps, now = [], 0.0
        while scheduler.has_unfinished() and len(steps) < 2_000:
            try:
                step = scheduler.step(now)
            except ValueError:  # a guest that can never fit: both raise alike
                steps.append("raised")
                break
            for seq in step.scheduled:
                assert seq.samples and seq.num_scheduled == seq.num_tokens - 1 - seq.num_computed
            assert step.num_batched_tokens == sum(q.num_scheduled for q in step.scheduled)
            steps.append([(q.seq_id, q.num_scheduled) for q in step.scheduled])
            for seq in step.scheduled:
                seq.num_computed += seq.num_scheduled
            now += 1.0
        days.append(steps)
    assert days[0] == days[1]


def test_a_step_written_without_a_budget_is_completed_by_the_scheduler():
    """Lab 06's own step books slots and counts tokens: the scheduler says what it computes."""

    def own_step(scheduler, now):
        step = Scheduler.step(scheduler, now)
        for seq in step.scheduled:
            seq.num_scheduled, seq.samples = 0, False  # as if it never said
        step.num_batched_tokens = 0
        return step

    theirs = Engine(PagedCache(16, 4), schedule=own_step)
    ours = Engine(PagedCache(16, 4))
    for engine in (theirs, ours):
        for i in range(4):
            engine.add(Sequence(f"s{i}", 5 + i, 3))
    batched = []
    while ours.has_unfinished():
        a, b = theirs.step(), ours.step()
        assert [(q.num_scheduled, q.samples) for q in a.scheduled] == [
            (q.num_scheduled, q.samples) for q in b.scheduled
        ]
        assert a.num_batched_tokens == b.num_batched_tokens
        batched.append(b.num_batched_tokens)
    assert batched[0] == 5 + 6 + 7 + 8 and not theirs.has_unfinished()


# --- running until a time -------------------------------------------------------------------------


@pytest.mark.parametrize("timed", [False, True])
def test_run_until_stops_before_the_first_step_at_or_after_the_time(timed):
    from kvlab.models import preset
    from kvlab.perf.gpus import lookup
    from kvlab.perf.roofline import StepTime

    step_time = StepTime(preset("Llama-3-8B"), lookup("H100-80GB")) if timed else None
    day = sharegpt_like(30, seed=1, max_total=64)
    whole = simulate(day, **DAY, step_time=step_time)
    config = EngineConfig(**DAY, step_time=step_time)
    from kvlab.serving.simulation import Replica

    seqs = [Sequence(f"r{i}", r.prompt_len, r.output_len, r.arrival) for i, r in enumerate(day)]
    replica = Replica(config, seqs)
    engine = replica.engine
    for seq in sorted(seqs, key=lambda q: q.arrival):  # as simulate queues them
        engine.add(seq)
    marks = [whole.end_time * f for f in (0.1, 0.25, 0.5, 0.9)]
    for until in marks:
        engine.run_until(until)
        assert engine.next_start() >= until or not engine.has_unfinished()
        assert engine.step_start < until
        assert all(seq.seq_id != "next arrival" for seq in engine.scheduler.waiting)
    assert engine.fast_forward_runs > 0  # runs were cut at each mark, not given up
    result = replica.finish()
    assert result.summary() == whole.summary()
    assert result.times == whole.times and result.token_gaps == whole.token_gaps
    assert result.utilization == whole.utilization and result.waiting == whole.waiting


def test_run_until_with_max_steps_still_stops():
    engine = Engine(PagedCache(8, 4))
    engine.add(Sequence("a", 3, 20))
    with pytest.raises(RuntimeError, match="max_steps=2"):
        engine.run_until(math.inf, max_steps=2)


# --- the prefix lookup on the interface ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["hash", "radix"])
@pytest.mark.parametrize("block_size", [1, 4])
def test_cached_prefix_tokens_looks_up_and_changes_nothing(kind, block_size):
    cache = PagedCache(32, block_size, enable_prefix_caching=True, prefix_cache=kind)
    assert isinstance(cache, PrefixCachingKVCache)
    prompt = list(range(3 * block_size + 1))  # 3 full blocks and one token
    cache.admit("a", len(prompt), 2, token_ids=prompt)
    cache.cache_computed("a", prompt, len(prompt))
    before = (cache.prefix_cache_stats, cache.state(), cache.allocated_tokens)
    assert cache.cached_prefix_tokens(prompt) == 3 * block_size
    # never the prompt's last token: a prompt of exactly k blocks finds at most k - 1
    assert cache.cached_prefix_tokens(prompt[: 3 * block_size]) == 2 * block_size
    assert cache.cached_prefix_tokens(prompt[:1]) == 0
    assert cache.cached_prefix_tokens([99, *prompt]) == 0
    assert (cache.prefix_cache_stats, cache.state(), cache.allocated_tokens) == before
    assert PagedCache(8, block_size).cached_prefix_tokens(prompt) == 0  # no prefix caching
    assert cache.tier_hit_tokens == 0 and (cache.block_size, cache.num_blocks) == (block_size, 32)
