"""A fleet of replicas behind a router (Lab 10): many hotels, one front desk.

:func:`simulate_fleet` serves one day on ``replicas`` copies of :func:`~kvlab.serving.simulate`'s
server, each with its own paged cache, scheduler and engine, all on one clock. It is an event
loop over the arrivals: at each arrival every replica first runs the steps that begin before it,
then the router picks a replica from what the replicas show at that moment
(:class:`ReplicaView`), and the request joins that replica's queue; after the last arrival every
replica runs until it is done. One replica is :func:`simulate` itself (the same figures, step for
step).

Routers, by name or as a function ``router(request, views, now) -> replica index``:

- ``"round_robin"``: replica 0, 1, ..., N-1, 0, ... whatever they hold;
- ``"least_loaded"``: the fewest requests running + waiting (:attr:`ReplicaView.load`);
- ``"prefix_aware"``: the highest ``cached_prefix_tokens(request) - load_penalty * load``, the way
  llm-d's precise prefix-cache scorer and its load-aware scorer add up (ties go to the least
  loaded, then to a seeded draw).

The load is counted in requests, not tokens: it is what a router outside the engines can see
(vLLM exports ``num_requests_running`` and ``num_requests_waiting``, which llm-d's and
Dynamo's routers scrape; SGLang's router balances on requests in flight), and a request queued
ahead costs the newcomer a turn whatever its length. ``load_penalty`` is therefore in cached
prompt tokens per request: how many tokens of cached prefix are worth one more request ahead.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from kvlab.serving.config import EngineConfig, resolve
from kvlab.serving.engine import Engine
from kvlab.serving.scheduler import Sequence
from kvlab.serving.simulation import (
    Replica,
    SimResult,
    _Measure,
    _token_ids,
    check_seed,
    percentile,
    weighted_percentile,
)
from kvlab.serving.workload import Request

ROUTERS = ("round_robin", "least_loaded", "prefix_aware")
# Cached prompt tokens worth one more request ahead in a replica's queue (see simulate_fleet):
# a few blocks of 16, well under a system prompt of a many-tenant day (1,024 tokens), so that a
# replica holding a tenant's prompt keeps it until a handful of requests more than elsewhere pile
# up there.
DEFAULT_LOAD_PENALTY = 128.0


class ReplicaView:
    """What a router may read of one replica, now: read-only, and asking changes nothing."""

    __slots__ = ("_replica",)

    def __init__(self, replica: _Replica):
        self._replica = replica

    @property
    def index(self) -> int:
        """The replica's number, 0 to N-1: what the router returns to pick it."""
        return self._replica.index

    @property
    def num_running(self) -> int:
        """Requests in the replica's batch (holding KV-cache memory)."""
        return len(self._replica.engine.scheduler.running)

    @property
    def num_waiting(self) -> int:
        """Requests in its queue (arrived, not running; preempted ones too)."""
        return len(self._replica.engine.scheduler.waiting)

    @property
    def load(self) -> int:
        """``num_running + num_waiting``: the requests it has in hand."""
        scheduler = self._replica.engine.scheduler
        return len(scheduler.running) + len(scheduler.waiting)

    @property
    def capacity_tokens(self) -> int:
        return self._replica.engine.cache.capacity

    @property
    def free_tokens(self) -> int:
        """Token slots in blocks nobody holds (cached blocks nobody holds count as free)."""
        cache = self._replica.engine.cache
        return cache.capacity - cache.allocated_tokens

    def cached_prefix_tokens(self, request: Request) -> int:
        """Tokens of ``request``'s prompt whose K/V the replica holds now, as the longest cached
        prefix in whole blocks (never the prompt's last token: it is always computed). 0 without
        ``prompt_ids`` or without prefix caching. Looks up, changes nothing."""
        return self._replica.cached_prefix_tokens(request)

    def __repr__(self) -> str:
        return (
            f"ReplicaView(index={self.index}, num_running={self.num_running}, "
            f"num_waiting={self.num_waiting})"
        )


class _Replica(Replica):
    """One server of the fleet: simulate's server, which takes its requests as they are routed
    and runs to each arrival (:meth:`kvlab.serving.engine.Engine.run_until`)."""

    def __init__(self, index: int, config: EngineConfig):
        super().__init__(config, [], measure=_FleetMeasure)
        self.index = index
        cache = self.engine.cache
        self._prefix_caching = cache.prefix_caching
        self._memo: tuple | None = None  # (request, tokens): a router may ask twice

    def cached_prefix_tokens(self, request: Request) -> int:
        if not isinstance(request, Request):
            raise TypeError(f"request must be a kvlab.serving.workload.Request, got {request!r}")
        memo = self._memo
        if memo is not None and memo[0] is request:
            return memo[1]
        tokens = 0
        if self._prefix_caching and request.prompt_ids is not None:
            tokens = self.engine.cache.cached_prefix_tokens(request.prompt_ids)
        self._memo = (request, tokens)
        return tokens

    def add(self, seq: Sequence) -> None:
        self.result.sequences.append(seq)
        self.measure.arrivals.append(seq.arrival)  # routed in arrival order: stays sorted
        self.engine.add(seq)

    def advance(self, until: float) -> None:
        """Run every step that begins before ``until`` (the next arrival): a router then sees
        every replica as it is at the arrival. A stretch of decode steps runs at once where
        :func:`simulate` would run it, but never past ``until``."""
        self.engine.run_until(until, max_steps=_NO_LIMIT)


_NO_LIMIT = 10**12  # steps: a decode run stops for its own reasons first


class _FleetMeasure(_Measure):
    """simulate's observer, plus: a finished sequence's token ids are dropped (a day of 100,000
    requests would keep them all; no result reads them)."""

    def after_step(self, engine: Engine, step) -> None:
        super().after_step(engine, step)
        for seq in step.finished:
            seq.token_ids = None


# --- routers ---------------------------------------------------------------------------------------


def _least_loaded(views, draw) -> int:
    """The index of a view with the fewest requests in hand (ties: a seeded draw)."""
    best, low = [], math.inf
    for view in views:
        load = view.load
        if load < low:
            best, low = [view.index], load
        elif load == low:
            best.append(view.index)
    return best[0] if len(best) == 1 else best[int(draw() * len(best))]


def make_router(
    name: str, *, load_penalty: float = DEFAULT_LOAD_PENALTY, seed: int = 0
) -> Callable:
    """The router ``name`` (one of :data:`ROUTERS`) as a function ``(request, views, now) ->
    index``, with its own state (round robin's turn) and its own seeded draw for ties: what
    :func:`simulate_fleet` calls; a learner's router may wrap one."""
    penalty = _penalty(load_penalty)
    draw = random.Random(seed).random
    if name == "round_robin":
        turn = [0]

        def round_robin(request, views, now):
            index = turn[0] % len(views)
            turn[0] += 1
            return index

        return round_robin
    if name == "least_loaded":

        def least_loaded(request, views, now):
            return _least_loaded(views, draw)

        return least_loaded
    if name == "prefix_aware":
        return PrefixAwareRouter(penalty, seed=seed)
    raise ValueError(
        f"router must be one of {ROUTERS} or a function (request, views, now) -> replica index, "
        f"got {name!r}"
    )


class PrefixAwareRouter:
    """``"prefix_aware"``: the highest :meth:`score` (ties: :meth:`tie`). One method per
    decision, so a variant overrides one (Lab 10's usual slips)."""

    def __init__(self, load_penalty: float = DEFAULT_LOAD_PENALTY, *, seed: int = 0):
        self.load_penalty = _penalty(load_penalty)
        self.draw = random.Random(seed).random

    def cached(self, request: Request, view: ReplicaView) -> float:
        """The prompt's tokens the replica holds (tokens, as ``load_penalty`` counts them)."""
        return view.cached_prefix_tokens(request)

    def load(self, view: ReplicaView) -> int:
        """Requests in hand: running and waiting."""
        return view.load

    def score(self, request: Request, view: ReplicaView) -> float:
        return self.cached(request, view) - self.load_penalty * self.load(view)

    def __call__(self, request: Request, views, now: float) -> int:
        best, top = [], -math.inf
        for view in views:
            score = self.score(request, view)
            if score > top:
                best, top = [(self.load(view), view.index)], score
            elif score == top:
                best.append((self.load(view), view.index))
        return best[0][1] if len(best) == 1 else self.tie(best)

    def tie(self, best: list[tuple[int, int]]) -> int:
        """Of the (load, index) of the views sharing the top score: the least loaded, then a
        seeded draw."""
        low = min(best)[0]
        tied = [index for load, index in best if load == low]
        return tied[0] if len(tied) == 1 else tied[int(self.draw() * len(tied))]


def _penalty(load_penalty) -> float:
    if isinstance(load_penalty, bool) or not isinstance(load_penalty, int | float):
        raise TypeError(f"load_penalty must be a number >= 0, got {load_penalty!r}")
    if not load_penalty >= 0:  # NaN too
        raise ValueError(f"load_penalty must be >= 0 (tokens per request), got {load_penalty!r}")
    return float(load_penalty)


# --- the result ------------------------------------------------------------------------------------


@dataclass
class FleetResult:
    """What a fleet's day measured: the whole fleet, and ``per_replica`` (one
    :class:`~kvlab.serving.simulation.SimResult` each, over the requests routed to it). Times are in
    steps, or seconds with a step-time model; per-request lists are in request order."""

    router: str
    load_penalty: float | None  # prefix_aware's (None for the other routers)
    per_replica: list[SimResult]
    routed: list[int]  # the replica each request went to, in request order
    sequences: list[Sequence]  # one per request, in request order, with its timings
    timed: bool

    @property
    def replicas(self) -> int:
        return len(self.per_replica)

    @property
    def completed(self) -> int:
        return sum(r.completed for r in self.per_replica)

    @property
    def tokens_generated(self) -> int:
        return sum(r.tokens_generated for r in self.per_replica)

    @property
    def prefix_query_tokens(self) -> int:
        return sum(r.prefix_query_tokens for r in self.per_replica)

    @property
    def prefix_hit_tokens(self) -> int:
        return sum(r.prefix_hit_tokens for r in self.per_replica)

    @property
    def prefix_hit_rate(self) -> float:
        """Prompt tokens found cached / prompt tokens looked up, over the fleet (a prompt
        recomputed after a preemption is looked up again)."""
        queries = self.prefix_query_tokens
        return self.prefix_hit_tokens / queries if queries else 0.0

    @property
    def preemptions(self) -> int:
        return sum(r.preemptions for r in self.per_replica)

    @property
    def evictions(self) -> int:
        return sum(r.evictions for r in self.per_replica)

    @property
    def requests_per_replica(self) -> list[int]:
        counts = [0] * self.replicas
        for index in self.routed:
            counts[index] += 1
        return counts

    @property
    def end_time(self) -> float:
        return max(r.end_time for r in self.per_replica)

    @property
    def seconds(self) -> float:
        """From the first arrival to the last token anywhere (steps, without a step-time model)."""
        return self.end_time - min(seq.arrival for seq in self.sequences)

    @property
    def throughput(self) -> float:
        """Generated tokens per unit of the fleet's clock (per second with a step-time model,
        else per step: replicas step side by side)."""
        return self.tokens_generated / self.seconds if self.seconds else math.inf

    @property
    def tokens_per_second(self) -> float:
        if not self.timed:
            raise ValueError("tokens_per_second needs a step_time model; use throughput (per step)")
        return self.throughput

    def ttfts(self) -> list[float]:
        """Arrival to first token, per request."""
        return [seq.first_token_time - seq.arrival for seq in self.sequences]

    def latencies(self) -> list[float]:
        """Arrival to last token, per request."""
        return [seq.finish_time - seq.arrival for seq in self.sequences]

    def itls(self) -> list[float]:
        """Every gap between two consecutive tokens of a request, over the fleet."""
        return [gap for r in self.per_replica for gap in r.itls()]

    def ttft(self, p: float = 50) -> float:
        return percentile(self.ttfts(), p)

    def latency(self, p: float = 50) -> float:
        return percentile(self.latencies(), p)

    def itl(self, p: float = 50) -> float:
        return weighted_percentile([g for r in self.per_replica for g in r.token_gaps], p)

    def summary(self) -> dict:
        """The headline figures, for a table row."""
        counts = self.requests_per_replica
        row = {
            "router": self.router,
            "replicas": self.replicas,
            "completed": self.completed,
            "tokens_generated": self.tokens_generated,
            "prefix_hit_rate": self.prefix_hit_rate,
            "throughput": self.throughput,
            "ttft_p50": self.ttft(50),
            "ttft_p99": self.ttft(99),
            "latency_p50": self.latency(50),
            "latency_p99": self.latency(99),
            "preemptions": self.preemptions,
            "evictions": self.evictions,
            "busiest_replica_share": max(counts) / len(self.routed),
        }
        if self.load_penalty is not None:
            row["load_penalty"] = self.load_penalty
        if any(c for r in self.per_replica for _, c in r.token_gaps):
            row.update(itl_p50=self.itl(50), itl_p99=self.itl(99))
        return row


# --- the fleet -------------------------------------------------------------------------------------


def simulate_fleet(
    requests: list[Request],
    config: EngineConfig | None = None,
    *,
    replicas: int,
    router: str | Callable = "round_robin",
    load_penalty: float = DEFAULT_LOAD_PENALTY,
    seed: int = 0,
    progress: bool = False,
    **settings,
) -> FleetResult:
    """Serve ``requests`` on ``replicas`` servers behind ``router``; return a :class:`FleetResult`.

    Every replica is the server :func:`~kvlab.serving.simulate` builds from the same ``config``
    or keywords (``kv_capacity_tokens`` is each replica's: equal GPUs means equal replicas),
    with prefix caching on by default when no ``config`` is given (a fleet's router has
    prefixes to find). Requests are routed in arrival order (ties in the given order, shuffled
    by a nonzero ``seed`` as simulate does), each at its arrival, after every replica has run
    the steps that begin before it; the router sees :class:`ReplicaView` s of that moment.
    ``router`` is ``"round_robin"``, ``"least_loaded"``, ``"prefix_aware"`` (``load_penalty``:
    cached prompt tokens per request in hand, the module says why) or a function
    ``router(request, views, now) -> index`` (``now``: the arrival, on the fleet's clock). Ties
    between replicas are drawn from ``seed``: the same day gives the same routes and figures.
    """
    positive = isinstance(replicas, int) and not isinstance(replicas, bool)
    if not positive:
        raise TypeError(f"replicas must be an int >= 1, got {replicas!r}")
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    check_seed(seed)
    if isinstance(router, str):
        if router not in ROUTERS:
            raise ValueError(
                f"router must be one of {ROUTERS} or a function (request, views, now) -> "
                f"replica index, got {router!r}"
            )
        route, router_name = make_router(router, load_penalty=load_penalty, seed=seed), router
    elif callable(router):
        _penalty(load_penalty)
        route, router_name = router, getattr(router, "__name__", type(router).__name__)
    else:
        raise TypeError(
            f"router must be one of {ROUTERS} or a function (request, views, now) -> replica "
            f"index, got {router!r}"
        )
    if config is None:
        settings.setdefault("prefix_caching", True)
    config = resolve(config, settings, caller="simulate_fleet")
    config.check_requests(requests)  # the checks simulate makes, once for the whole fleet

    fleet = [_Replica(index, config) for index in range(replicas)]
    views = tuple(ReplicaView(replica) for replica in fleet)
    prefix_caching = config.prefix_cache is not None

    sequences = [
        Sequence(f"r{i}", r.prompt_len, r.output_len, r.arrival) for i, r in enumerate(requests)
    ]
    tie = random.Random(seed).random if seed else (lambda: 0.0)
    order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival, tie()))
    routed = [-1] * len(requests)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(order), unit="request", desc=f"fleet ({router_name})", mininterval=0.5)
    try:
        for done, i in enumerate(order):
            request = requests[i]
            now = request.arrival
            for replica in fleet:
                replica.advance(now)
            index = route(request, views, now)
            if isinstance(index, bool) or not isinstance(index, int):
                raise TypeError(
                    f"router {router_name!r} must return a replica index (an int), got "
                    f"{index!r} for requests[{i}]"
                )
            if not 0 <= index < replicas:
                raise ValueError(
                    f"router {router_name!r} returned {index} for requests[{i}]: there are "
                    f"{replicas} replicas (indices 0 to {replicas - 1})"
                )
            seq = sequences[i]
            if prefix_caching:
                seq.token_ids = _token_ids(i, request)
            routed[i] = index
            fleet[index].add(seq)
            if bar is not None and done % 1024 == 0:
                bar.update(done - bar.n)
        per_replica = [replica.finish() for replica in fleet]
    finally:
        if bar is not None:
            bar.update(bar.total - bar.n)
            bar.close()
    penalty = _penalty(load_penalty) if router == "prefix_aware" else None
    return FleetResult(router_name, penalty, per_replica, routed, sequences, fleet[0].result.timed)


__all__ = [
    "DEFAULT_LOAD_PENALTY",
    "ROUTERS",
    "FleetResult",
    "ReplicaView",
    "PrefixAwareRouter",
    "make_router",
    "simulate_fleet",
]
