"""A fleet of replicas behind a router (Lab 10): simulate_fleet, its routers and its result."""

from __future__ import annotations

import pytest

from kvlab.models import preset
from kvlab.perf.gpus import lookup
from kvlab.perf.roofline import StepTime
from kvlab.serving import FleetResult, ReplicaView, simulate, simulate_fleet
from kvlab.serving.fleet import DEFAULT_LOAD_PENALTY, make_router
from kvlab.serving.workload import Request, many_tenants, multi_round_qa, sharegpt_like

STEP_TIME = StepTime(preset("Llama-3-8B"), lookup("H100-80GB"))
# each replica holds 8,192 token slots: a handful of the 1,024-token system prompts of 32 tenants
FLEET = {"kv_capacity_tokens": 8_192, "max_seq_len": 2_048, "step_time": STEP_TIME}


@pytest.fixture(scope="module")
def tenants_day():
    """Lab 10's day, small: 32 tenants of about equal weight, 60 requests a second on 4 replicas."""
    return many_tenants(400, tenants=32, rate=60.0, seed=0, zipf=0.5)


@pytest.fixture(scope="module")
def hot_day():
    """One tenant sends most requests (zipf=3: about 83%), 150 requests a second."""
    return many_tenants(400, tenants=32, rate=150.0, seed=0, zipf=3.0)


def _same_figures(single, fleet: FleetResult) -> None:
    replica = fleet.per_replica[0]
    assert replica.summary() == single.summary()
    for name in ("times", "batch", "utilization", "occupancy", "waiting", "token_gaps"):
        assert getattr(replica, name) == getattr(single, name), name
    assert fleet.ttfts() == single.ttfts()
    assert fleet.latencies() == single.latencies()
    assert fleet.itls() == single.itls()
    assert fleet.prefix_hit_rate == single.prefix_hit_rate
    assert fleet.completed == single.completed == len(single.sequences)
    assert fleet.tokens_generated == single.tokens_generated
    assert fleet.routed == [0] * len(single.sequences)


def test_one_replica_is_simulate_on_a_many_tenant_day():
    day = many_tenants(150, tenants=8, system_prompt_len=256, rate=40.0, seed=1)
    options = {**FLEET, "kv_capacity_tokens": 4_096, "max_num_batched_tokens": 512}
    single = simulate(day, cache="paged", prefix_caching=True, chunked_prefill=True, **options)
    fleet = simulate_fleet(day, replicas=1, router="prefix_aware", chunked_prefill=True, **options)
    _same_figures(single, fleet)
    assert 0.5 < fleet.prefix_hit_rate < 1


def test_one_replica_is_simulate_without_prefix_caching_in_steps():
    # no prefix caching: stretches of decode steps run at once, never past an arrival
    day = sharegpt_like(120, seed=2, rate=0.3, max_total=1_024)
    options = {"kv_capacity_tokens": 4_096, "max_seq_len": 1_024}
    single = simulate(day, cache="paged", **options)
    fleet = simulate_fleet(day, replicas=1, prefix_caching=False, **options)
    _same_figures(single, fleet)
    assert fleet.per_replica[0].fast_forward_steps > 0
    assert fleet.prefix_hit_rate == 0.0


def test_round_robin_spreads_evenly(tenants_day):
    r = simulate_fleet(tenants_day, replicas=3, router="round_robin", **FLEET)
    order = sorted(range(len(tenants_day)), key=lambda i: tenants_day[i].arrival)
    assert [r.routed[i] for i in order] == [k % 3 for k in range(len(order))]
    assert r.requests_per_replica == [134, 133, 133]
    assert [len(x.sequences) for x in r.per_replica] == r.requests_per_replica
    assert r.completed == len(tenants_day) and r.replicas == 3


def test_prefix_aware_beats_round_robin_at_equal_gpus(tenants_day):
    rr = simulate_fleet(tenants_day, replicas=4, router="round_robin", **FLEET)
    least = simulate_fleet(tenants_day, replicas=4, router="least_loaded", **FLEET)
    aware = simulate_fleet(tenants_day, replicas=4, router="prefix_aware", **FLEET)
    # measured: hit rate 0.31 (round robin), 0.30 (least loaded), 0.71 (prefix aware); median
    # TTFT 38.5 ms, 21.5 ms, 8.7 ms: over twice the hits and under half the median TTFT
    assert aware.prefix_hit_rate > 2 * rr.prefix_hit_rate
    assert aware.prefix_hit_rate > 2 * least.prefix_hit_rate
    assert aware.ttft(50) < rr.ttft(50) / 2
    assert aware.ttft(99) < rr.ttft(99) / 2
    assert aware.preemptions < rr.preemptions
    assert aware.completed == rr.completed == len(tenants_day)
    assert aware.tokens_generated == rr.tokens_generated
    row = aware.summary()
    assert row["router"] == "prefix_aware" and row["load_penalty"] == DEFAULT_LOAD_PENALTY
    assert row["prefix_hit_rate"] == aware.prefix_hit_rate and row["ttft_p50"] == aware.ttft(50)


def test_no_load_penalty_piles_onto_one_hot_replica(hot_day):
    greedy = simulate_fleet(hot_day, replicas=4, router="prefix_aware", load_penalty=0, **FLEET)
    default = simulate_fleet(hot_day, replicas=4, router="prefix_aware", **FLEET)
    # measured: 85% of the requests on one replica (the hot tenant's), median TTFT 340 ms;
    # with the default penalty 29% at most, 8.4 ms
    assert max(greedy.requests_per_replica) > 0.8 * len(hot_day)
    assert max(default.requests_per_replica) < 0.35 * len(hot_day)
    assert greedy.ttft(50) > 10 * default.ttft(50)
    assert greedy.preemptions > default.preemptions
    assert greedy.summary()["busiest_replica_share"] > 0.8


def test_a_huge_load_penalty_routes_like_least_loaded(hot_day):
    aware = make_router("prefix_aware", load_penalty=1e12)
    chosen_vs_least = []

    def spy(request, views, now):
        index = aware(request, views, now)
        chosen_vs_least.append((views[index].load, min(v.load for v in views)))
        return index

    huge = simulate_fleet(hot_day, replicas=4, router=spy, **FLEET)
    least = simulate_fleet(hot_day, replicas=4, router="least_loaded", **FLEET)
    assert all(chosen == low for chosen, low in chosen_vs_least)
    assert len(chosen_vs_least) == len(hot_day)
    assert max(huge.requests_per_replica) - min(huge.requests_per_replica) < 0.05 * len(hot_day)
    assert huge.ttft(99) == pytest.approx(least.ttft(99), rel=0.3)


def test_a_learners_router_is_called_with_views_and_obeyed(tenants_day):
    calls = []

    def mine(request, views, now):
        assert isinstance(request, Request) and now == request.arrival
        assert [v.index for v in views] == [0, 1, 2]
        assert all(isinstance(v, ReplicaView) for v in views)
        for v in views:
            assert v.load == v.num_running + v.num_waiting
            assert 0 <= v.free_tokens <= v.capacity_tokens == 8_192
            assert v.cached_prefix_tokens(request) == v.cached_prefix_tokens(request)
            assert v.cached_prefix_tokens(request) % 16 == 0
        calls.append(max(views, key=lambda v: v.cached_prefix_tokens(request)).index)
        return (len(calls) * 7) % 3  # ignores the scores: asking changes nothing

    day = tenants_day[:120]
    r = simulate_fleet(day, replicas=3, router=mine, **FLEET)
    assert len(calls) == len(day) and r.router == "mine"
    order = sorted(range(len(day)), key=lambda i: day[i].arrival)
    assert [r.routed[i] for i in order] == [(k * 7) % 3 for k in range(1, len(day) + 1)]
    assert set(calls) == {0, 1, 2}
    # the same routes without asking anything: the same figures (a lookup changes no state)
    routes = iter([(k * 7) % 3 for k in range(1, len(day) + 1)])
    quiet = simulate_fleet(day, replicas=3, router=lambda q, v, t: next(routes), **FLEET)
    assert quiet.summary() | {"router": "mine"} == r.summary()
    assert quiet.ttfts() == r.ttfts()


def test_views_are_read_only(tenants_day):
    def poke(request, views, now):
        with pytest.raises(AttributeError):
            views[0].load = 0
        with pytest.raises(AttributeError):
            views[0].num_running = 0
        with pytest.raises(TypeError, match="Request"):
            views[0].cached_prefix_tokens([1, 2, 3])
        return 0

    simulate_fleet(tenants_day[:3], replicas=2, router=poke, **FLEET)


def test_deterministic(hot_day):
    a = simulate_fleet(hot_day, replicas=4, router="least_loaded", seed=3, **FLEET)
    b = simulate_fleet(hot_day, replicas=4, router="least_loaded", seed=3, **FLEET)
    assert a.routed == b.routed and a.ttfts() == b.ttfts()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"replicas": 0}, ValueError, "replicas must be >= 1"),
        ({"replicas": 2.0}, TypeError, "replicas must be an int"),
        ({"replicas": True}, TypeError, "replicas must be an int"),
        ({"replicas": 2, "router": "random"}, ValueError, "round_robin"),
        ({"replicas": 2, "router": 3}, TypeError, "router must be one of"),
        ({"replicas": 2, "router": "prefix_aware", "load_penalty": -1}, ValueError, ">= 0"),
        ({"replicas": 2, "router": "prefix_aware", "load_penalty": "1"}, TypeError, "number"),
        ({"replicas": 2, "router": lambda r, v, t: 2}, ValueError, "there are 2 replicas"),
        ({"replicas": 2, "router": lambda r, v, t: -1}, ValueError, "indices 0 to 1"),
        ({"replicas": 2, "router": lambda r, v, t: "0"}, TypeError, "replica index"),
        ({"replicas": 2, "router": lambda r, v, t: True}, TypeError, "replica index"),
        ({"replicas": 2, "router": lambda r, v, t: None}, TypeError, "replica index"),
        ({"replicas": 2, "prefix_caching": "lru"}, ValueError, "prefix_caching"),
        ({"replicas": 2, "cache": "contiguous"}, ValueError, "needs the paged cache"),
    ],
)
def test_bad_inputs(kwargs, error, message):
    day = many_tenants(4, tenants=2, system_prompt_len=64, rate=10.0)
    with pytest.raises(error, match=message):
        simulate_fleet(day, **kwargs, **FLEET)


def test_bad_days():
    with pytest.raises(ValueError, match="must not be empty"):
        simulate_fleet([], replicas=2, **FLEET)
    with pytest.raises(TypeError, match="list of"):
        simulate_fleet(None, replicas=2, **FLEET)
    with pytest.raises(ValueError, match="more than max_seq_len"):
        simulate_fleet([Request(3_000, 10)], replicas=2, **FLEET)


def test_many_tenants_day():
    day = many_tenants(300, tenants=12, system_prompt_len=128, user_len=(4, 8), seed=5, zipf=0)
    prompts = {r.prompt_ids[:128] for r in day}
    assert len(prompts) == 12
    assert all(132 <= r.prompt_len <= 136 and 16 <= r.output_len <= 128 for r in day)
    assert all(r.arrival == 0 for r in day)
    again = many_tenants(300, tenants=12, system_prompt_len=128, user_len=(4, 8), seed=5, zipf=0)
    assert again == day and [r.prompt_ids for r in again] == [r.prompt_ids for r in day]
    skewed = many_tenants(2_000, tenants=32, rate=5.0, seed=0, zipf=3.0)
    top = max(
        sum(r.prompt_ids[:1_024] == p for r in skewed)
        for p in {r.prompt_ids[:1_024] for r in skewed}
    )
    assert 0.75 < top / len(skewed) < 0.9  # 1 / zeta(3) = 0.83
    assert all(b.arrival >= a.arrival for a, b in zip(skewed, skewed[1:], strict=False))
    for bad, error in (
        ({"tenants": 0}, ValueError),
        ({"user_len": (5, 2)}, ValueError),
        ({"output_len": (0, 2)}, ValueError),
        ({"user_len": 5}, TypeError),
        ({"zipf": -1}, ValueError),
        ({"rate": 0}, ValueError),
    ):
        with pytest.raises(error):
            many_tenants(10, **bad)


def test_the_bench_runs_small():
    from kvlab.perf.bench import fleet

    report = fleet(n=200, replicas=2)  # its speed is the bench's figure, not a test's
    rows = {row["router"]: row for row in report["routers"]}
    assert set(rows) == {"round_robin", "least_loaded", "prefix_aware"}
    assert all(row["completed"] == 200 for row in rows.values())
    assert report["workload"]["requests"] == 200 and report["workload"]["replicas"] == 2


def test_one_replica_with_a_cpu_tier_is_simulate_with_it():
    # a multi-round day whose conversations outgrow HBM: the tier serves the later rounds
    day = multi_round_qa(6, 3, context_len=600, question_len=20, answer_len=30, think_time=5.0)
    options = {**FLEET, "kv_capacity_tokens": 1_024, "max_seq_len": 2_048}
    single = simulate(day, cache="paged", prefix_caching=True, cpu_cache_blocks=256, **options)
    fleet = simulate_fleet(day, replicas=1, cpu_cache_blocks=256, **options)
    _same_figures(single, fleet)
    one = fleet.per_replica[0]
    assert one.prefix_tier_hit_tokens == single.prefix_tier_hit_tokens > 0
    assert one.copied_up_bytes == single.copied_up_bytes
