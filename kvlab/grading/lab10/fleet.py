"""10.prefix_score: ``prefix_router(request, views, now, load_penalty=128.0) -> index``, the
prefix-aware router (llm-d's prefix-cache scorer minus a load scorer): the replica with the
highest ``cached_prefix_tokens(request) - load_penalty * load``.

The checks hand the router replicas of their own making (:class:`StubView`: what a
:class:`~kvlab.serving.ReplicaView` shows, with a cached prefix, guests running and waiting),
built so that no two replicas tie, then run it in :func:`~kvlab.serving.simulate_fleet` on a
small many-tenant day. A wrong pick is named when one usual slip (:data:`SLIPS`) picks it and,
where several do, picks as the learner's router does on the other cases.
"""

from __future__ import annotations

import functools
import random

from kvlab.grading import slips
from kvlab.grading.expect import CheckFailed, as_int, int_slip, short
from kvlab.grading.lab10 import hints
from kvlab.grading.registry import exercise, own_answers
from kvlab.grading.slips import Slip
from kvlab.serving.fleet import PrefixAwareRouter

score_ex = exercise("10.prefix_score", "the prefix-aware router's score")
# the fleet's routers come from make_router (the prefix-aware one is made inside it)
own_answers(
    "10.prefix_score",
    "kvlab.serving.fleet:make_router",
    "kvlab.serving.fleet:PrefixAwareRouter",
)

PENALTY = 128.0


class StubView:
    """One replica as a router sees it (the read-only part of ReplicaView the lab uses)."""

    __slots__ = ("index", "num_running", "num_waiting", "_cached", "capacity_tokens")

    def __init__(self, index: int, cached: int, running: int, waiting: int = 0):
        self.index, self._cached = index, cached
        self.num_running, self.num_waiting = running, waiting
        self.capacity_tokens = 40_000

    @property
    def load(self) -> int:
        return self.num_running + self.num_waiting

    @property
    def free_tokens(self) -> int:
        return self.capacity_tokens - 500 * self.load

    def cached_prefix_tokens(self, request) -> int:
        return self._cached

    def __repr__(self) -> str:
        return (
            f"replica {self.index}: {self._cached:,} tokens cached, {self.num_running} running, "
            f"{self.num_waiting} waiting"
        )


# --- the router and its slips: kvlab's router with one decision changed -----------------------


class RunningOnly(PrefixAwareRouter):
    def load(self, view):  # the batch only, not the queue
        return view.num_running


class Argmin(PrefixAwareRouter):
    def score(self, request, view):  # the lowest score wins
        return -super().score(request, view)

    def tie(self, best):  # the first found, as a loop keeping the lowest does
        return min(index for _, index in best)


class InBlocks(PrefixAwareRouter):
    def cached(self, request, view):  # rooms of 16, not tokens
        return view.cached_prefix_tokens(request) / 16


class Position(PrefixAwareRouter):
    def __call__(self, request, views, now):  # the place in views, not view.index
        index = super().__call__(request, views, now)
        return next(place for place, view in enumerate(views) if view.index == index)


def router(kind=PrefixAwareRouter, load_penalty=PENALTY):
    """The pick of a fresh ``kind`` (its own seeded draw) on a fleet of rows, as a function of
    (rows, rotated): a slip's answer, and with no arguments the right one."""
    return lambda rows, rotated=False: kind(load_penalty)(None, _views(rows, rotated), 0.0)


right_pick = router()
SLIPS = (
    Slip(hints.NO_LOAD, router(load_penalty=0)),
    Slip(hints.RUNNING_ONLY, router(RunningOnly)),
    Slip(hints.ARGMIN, router(Argmin)),
    Slip(hints.IN_BLOCKS, router(InBlocks)),
    Slip(hints.POSITION, router(Position)),
)

# (story, views as (cached, running, waiting)); no two replicas tie on the right score
CASES = {
    "worth": ("a cached prefix worth a few guests", [(1024, 2, 0), (0, 0, 0), (0, 1, 0)]),
    "hot": (
        "a hot replica: the tenant's prompt is there, so are 10 guests",
        [(1024, 2, 8), (0, 1, 0), (0, 3, 0)],
    ),
    "nearly": (
        "two replicas hold nearly the same prefix, one is busy",
        [(1024, 8, 0), (960, 0, 0), (0, 0, 0)],
    ),
    "queue": ("a short batch with a long queue behind it", [(1024, 1, 9), (512, 2, 0), (0, 2, 0)]),
}


# each case is also given with its rows moved round by these places (new indices): a router that
# always names one index cannot pass by where the answer happens to sit
ROTATIONS = (1, 2)


def _views(rows, rotated: bool = False):
    """The replicas, listed in index order or (``rotated``) from replica 1 on, replica 0 last:
    a replica's place in the list is then never its index."""
    views = [StubView(i, *row) for i, row in enumerate(rows)]
    return views[1:] + views[:1] if rotated else views


def _slip(fn, rows, got, rotated: bool = False):
    """Named only when one slip picks ``got`` here and picks as the learner's router does on
    every other fleet, in index order (a score of another shape can match one on one fleet; a
    place in views is the index there, so that slip stays in)."""
    found = slips.matching(SLIPS, got, (rows, rotated), right_pick(rows, rotated))
    others = [rows for _, rows in CASES.values()] + [random_rows(seed) for seed in range(40)]

    def mine(rows):
        return fn(None, _views(rows), 0.0)

    found = slips.told_apart(found, mine, [(o,) for o in others], right_pick, always=True)
    return slips.hint(slips.only(found))


def expect_pick(fn, story: str, rows, rotated: bool = False, penalty: float = PENALTY) -> None:
    """The learner's pick on a fleet of ``rows``; a ``penalty`` other than the default is
    passed in as load_penalty (the usual slips are named only at the default)."""
    views = _views(rows, rotated)
    where = f"{story}; load_penalty {penalty:g}: " + "; ".join(map(repr, views))
    given = {} if penalty == PENALTY else {"load_penalty": penalty}
    want = router(load_penalty=penalty)(rows, rotated)
    got = as_int(fn(None, views, 0.0, **given))
    if not isinstance(got, int) or isinstance(got, bool) or not 0 <= got < len(views):
        raise CheckFailed(
            f"the router returns a replica's index (an int from 0 to {len(views) - 1})",
            input=where,
            expected=str(want),
            got=short(got, typed=True),
            hint=int_slip(got, want, hints.INDEX_TYPE),
        )
    if got != want:
        raise CheckFailed(
            "a different replica",
            input=where,
            expected=f"replica {want}",
            got=f"replica {got}",
            hint=None if given else _slip(fn, rows, got, rotated),
        )


def random_rows(seed: int):
    """Replicas whose right scores are all different (cached prefixes in whole rooms of 16)."""
    rng = random.Random(seed)
    while True:
        rows = [
            (16 * rng.randrange(0, 80), rng.randrange(0, 8), rng.randrange(0, 6))
            for _ in range(rng.randint(2, 6))
        ]
        scores = [c - PENALTY * (r + w) for c, r, w in rows]
        if len(set(scores)) == len(scores):
            return rows


for _name, (_story, _rows) in CASES.items():

    def _check(fn, story=_story, rows=_rows):
        expect_pick(fn, story, rows)
        for turn in ROTATIONS:
            expect_pick(fn, f"{story} (listed from replica {turn})", rows[turn:] + rows[:turn])

    score_ex.check(_story)(_check)


# (load_penalty, rows) where the given penalty picks another replica than the default's would
PENALTIES = ((0.0, [(100, 1, 0), (0, 0, 0)]), (0.5, [(0, 0, 0), (1, 1, 0)]),
             (512.0, [(1024, 1, 0), (600, 0, 0)]))  # fmt: skip


@score_ex.check("load_penalty passed in (0, 0.5, 512): each guest weighs that many tokens")
def _penalty(fn):
    for penalty, rows in PENALTIES:
        expect_pick(fn, "the penalty given", rows, penalty=penalty)


# 31 guests weigh 3,968 tokens at the default: a prefix of 3,984 outweighs them, one of 3,952 does
# not, so a default half a token off picks another replica (in whole rooms, 124 to 132 passed)
DEFAULTS = ([(3984, 20, 11), (0, 0, 0)], [(3952, 20, 11), (0, 0, 0)])


@score_ex.check("the default load_penalty, 128: 31 guests outweigh 3,952 cached tokens, not 3,984")
def _default(fn):
    for rows in DEFAULTS:
        expect_pick(fn, "a long prefix on a replica with a long queue", rows)


@score_ex.check("40 random fleets of 2 to 6 replicas")
def _random(fn):
    for seed in range(40):
        story = f"random fleet {seed} (kvlab.grading.lab10.fleet.random_rows({seed}))"
        expect_pick(fn, story, random_rows(seed))


@score_ex.check("the views listed from replica 1 on: the answer is view.index, not a place")
def _rotated(fn):
    for name in ("nearly", "queue"):
        story, rows = CASES[name]
        expect_pick(fn, story + ", listed from replica 1 on (replica 0 last)", rows, rotated=True)
    for seed in range(10):
        story = f"random fleet {seed} listed from replica 1 on (replica 0 last)"
        expect_pick(fn, story, random_rows(seed), rotated=True)


@functools.cache
def small_day():
    from kvlab.serving.workload import many_tenants

    return many_tenants(240, tenants=12, system_prompt_len=512, rate=0.5, seed=3)


FLEET = dict(replicas=4, kv_capacity_tokens=4_096, max_seq_len=1_024)
FLEET_CALL = (
    "simulate_fleet(many_tenants(240, tenants=12, system_prompt_len=512, rate=0.5, seed=3), "
    "replicas=4, router=prefix_router, kv_capacity_tokens=4_096, max_seq_len=1_024)"
)


@functools.cache
def round_robin_hit_rate() -> float:
    from kvlab.serving import simulate_fleet

    return simulate_fleet(list(small_day()), router="round_robin", **FLEET).prefix_hit_rate


@score_ex.check("in simulate_fleet: 4 replicas, 12 tenants, more hits than round robin")
def _fleet(fn):
    from kvlab.serving import simulate_fleet

    result = simulate_fleet(list(small_day()), router=fn, **FLEET)
    rr = round_robin_hit_rate()
    idle = [i for i, n in enumerate(result.requests_per_replica) if n == 0]
    if idle:  # every guest on one replica hits its prefixes, and leaves the others idle
        raise CheckFailed(
            "the router leaves replicas idle: it must weigh each replica's load",
            input=FLEET_CALL,
            expected="guests on every replica",
            got=f"no guest on replica {', '.join(map(str, idle))}",
        )
    if not result.prefix_hit_rate > rr + 0.05:
        raise CheckFailed(
            "the router found no more cached prefixes than round robin",
            input=FLEET_CALL,
            expected=f"a prefix hit rate well above round robin's {rr:.0%}",
            got=f"{result.prefix_hit_rate:.0%}",
        )
