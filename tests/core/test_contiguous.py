import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvlab.core.contiguous import (
    PAPER_NAMES,
    POLICIES,
    ArenaAllocator,
    ContiguousKVCache,
    best_fit,
    booking_size,
    external_fragmentation,
    first_fit,
    next_power_of_two,
)
from kvlab.core.errors import OutOfMemory, OutOfSpace, ReservationFull
from kvlab.core.recorder import recorded
from kvlab.models import ModelSpec


class ArenaMachine(RuleBasedStateMachine):
    """Random check-ins and check-outs; the arena's books must always balance."""

    def __init__(self):
        super().__init__()
        self.arena = None
        self.next_id = 0

    @precondition(lambda self: self.arena is None)
    @rule(capacity=st.integers(1, 200), placement=st.sampled_from(["first_fit", "best_fit"]))
    def create(self, capacity, placement):
        self.arena = ArenaAllocator(capacity, placement)

    @precondition(lambda self: self.arena is not None)
    @rule(n=st.integers(1, 80))
    def allocate(self, n):
        before = (self.arena.free_extents(), self.arena.bookings, self.arena.impossible_allocations)
        free = self.arena.free_extents()
        choose = first_fit if self.arena.placement == "first_fit" else best_fit
        expected = choose(free, n)
        guest = self.next_id
        self.next_id += 1
        try:
            offset = self.arena.allocate(guest, n)
        except OutOfSpace as e:
            assert expected is None
            assert e.impossible == (sum(length for _, length in free) >= n)
            assert self.arena.free_extents() == before[0] and self.arena.bookings == before[1]
            assert self.arena.impossible_allocations == before[2] + e.impossible
            return
        assert offset == expected
        assert self.arena.bookings[guest] == (offset, n)

    @precondition(lambda self: self.arena is not None and self.arena.bookings)
    @rule(data=st.data())
    def free(self, data):
        guest = data.draw(st.sampled_from(sorted(self.arena.bookings)))
        self.arena.free(guest)
        assert guest not in self.arena

    @invariant()
    def books_balance(self):
        if self.arena is None:
            return
        pieces = [(o, n, "free") for o, n in self.arena.free_extents()]
        pieces += [(o, n, g) for g, (o, n) in self.arena.bookings.items()]
        pieces.sort()
        cursor = 0
        for offset, length, _ in pieces:  # no overlap, no hole: together they tile the arena
            assert offset == cursor and length >= 1
            cursor += length
        assert cursor == self.arena.capacity
        free = self.arena.free_extents()
        for (o1, n1), (o2, _) in zip(free, free[1:], strict=False):
            assert o1 + n1 < o2, "adjacent free extents must be merged"
        assert self.arena.external_fragmentation == external_fragmentation(free)


TestArena = ArenaMachine.TestCase
TestArena.settings = settings(max_examples=60, stateful_step_count=40)


def test_freeing_everything_in_any_order_restores_one_extent():
    arena = ArenaAllocator(100)
    for guest, n in enumerate([10, 1, 30, 7, 52]):
        arena.allocate(guest, n)
    assert arena.total_free == 0
    with pytest.raises(OutOfSpace) as refusal:
        arena.allocate("x", 1)
    assert not refusal.value.impossible and arena.impossible_allocations == 0
    for guest in [3, 0, 4, 1, 2]:
        arena.free(guest)
    assert arena.free_extents() == [(0, 100)] and arena.external_fragmentation == 0.0


def test_a_booking_that_fills_the_whole_arena():
    arena = ArenaAllocator(64)
    assert arena.allocate("all", 64) == 0 and arena.free_extents() == []
    arena.free("all")
    assert arena.can_allocate(64) and not arena.can_allocate(65)


def test_impossible_allocation_is_exact():
    arena = ArenaAllocator(30)
    for guest in "abc":
        arena.allocate(guest, 10)
    arena.free("a")
    arena.free("c")
    with pytest.raises(OutOfSpace) as refusal:
        arena.allocate("d", 11)
    assert refusal.value.impossible and (refusal.value.total_free, refusal.value.largest_free) == (
        20,
        10,
    )
    with pytest.raises(OutOfSpace) as refusal:
        arena.allocate("e", 21)
    assert not refusal.value.impossible
    assert (arena.impossible_allocations, arena.failed_allocations) == (1, 2)


def test_best_fit_prefers_the_tightest_gap():
    extents = [(0, 50), (60, 12), (80, 10)]
    assert (
        first_fit(extents, 10) == 0 and best_fit(extents, 10) == 80 and best_fit(extents, 11) == 60
    )
    assert best_fit([(0, 5), (10, 5)], 5) == 0  # ties go to the lowest offset


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda a: a.allocate("x", 0), ValueError, "n must be >= 1"),
        (lambda a: a.allocate("x", 2.5), TypeError, "n must be an int"),
        (lambda a: a.allocate("held", 1), ValueError, "'held' already holds a booking"),
        (lambda a: a.free("nobody"), KeyError, "'nobody' holds no booking"),
        (lambda a: a.allocate(["unhashable"], 1), TypeError, "request_id must be hashable"),
    ],
)
def test_arena_bad_input_changes_nothing(call, error, match):
    arena = ArenaAllocator(10)
    arena.allocate("held", 3)
    before = (arena.free_extents(), arena.bookings)
    with pytest.raises(error, match=match):
        call(arena)
    assert (arena.free_extents(), arena.bookings) == before


def test_arena_constructor_validation():
    with pytest.raises(ValueError, match="placement must be one of"):
        ArenaAllocator(10, "worst_fit")
    with pytest.raises(ValueError, match="capacity_tokens must be >= 1"):
        ArenaAllocator(0)


# --- the contiguous cache -------------------------------------------------------------------


def test_booking_sizes_of_the_three_policies():
    assert booking_size("max", 5, 7, 2048) == 2048
    assert booking_size("pow2", 300, 1, 2048) == 512
    assert booking_size("pow2", 1500, 1000, 4096) == 4096
    assert booking_size("pow2", 2000, 40, 2048) == 2048  # capped at max_seq_len
    # the paper's rule: the answer rounded up (25 -> 32), the prompt on top, a buddy block for both
    assert booking_size("pow2", 100, 25, 2048) == 256  # 100 + 32 = 132 -> 256
    assert booking_size("pow2", 161, 338, 2048) == 1024  # 161 + 512 = 673 -> 1,024 (not 512)
    assert booking_size("pow2", 7, 0, 2048) == 8  # no answer yet: the prompt alone
    assert booking_size("oracle", 300, 1, 2048) == 301
    assert [next_power_of_two(n) for n in (1, 2, 3, 4, 5, 1024, 1025)] == [
        1,
        2,
        4,
        4,
        8,
        1024,
        2048,
    ]
    with pytest.raises(ValueError, match="needs output_len"):
        booking_size("oracle", 3, None, 16)


@settings(max_examples=50)
@given(
    policy=st.sampled_from(["max", "pow2", "oracle"]),
    ops=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 40), st.integers(0, 40)), max_size=60),
)
def test_accounts_always_sum_to_the_hotel(policy, ops):
    cache = ContiguousKVCache(3, 40, policy=policy)
    left = {}
    for i, (kind, prompt, output) in enumerate(ops):
        if kind == 0 and prompt + output <= 40:
            try:
                cache.admit(i, prompt, output)
                left[i] = output
            except OutOfMemory:
                pass
        elif kind == 1 and left:
            guest = sorted(left)[prompt % len(left)]
            if left[guest]:
                cache.append(guest)
                left[guest] -= 1
        elif kind == 2 and left:
            guest = sorted(left)[prompt % len(left)]
            cache.release(guest)
            del left[guest]
        r = cache.memory_report()
        assert min(r.used, r.future, r.internal, r.free) >= 0
        assert r.used + r.future + r.internal + r.free == cache.capacity
        assert r.booked == sum(n for _, n in cache.arena.bookings.values())
        assert r.used == sum(cache.num_tokens(g) for g in cache.request_ids)
        if policy == "oracle":
            assert r.internal == 0
        if policy == "max":
            assert all(o % 40 == 0 for o, _ in cache.arena.bookings.values())


def test_max_length_accounting_by_hand():
    cache = ContiguousKVCache(2, 16)
    cache.admit("a", prompt_len=1, output_len=5)
    r = cache.memory_report()
    assert (r.used, r.future, r.internal, r.free) == (1, 5, 10, 16)
    for _ in range(5):
        cache.append("a")
    r = cache.memory_report()
    assert (r.used, r.future, r.internal, r.free) == (6, 0, 10, 16)
    cache.admit("b", prompt_len=16, output_len=0)  # exactly max_seq_len
    assert cache.memory_report().free == 0
    with pytest.raises(ReservationFull, match="'b' already fills its 16 booked slots"):
        cache.append("b")
    with pytest.raises(OutOfMemory):
        cache.admit("c", 1, 1)
    cache.release("a")
    assert cache.admit("c", 1, 1) == 0  # the freed suite is reused


def test_unknown_output_counts_as_future():
    cache = ContiguousKVCache(1, 8)
    cache.admit("a", 3)
    r = cache.memory_report()
    assert (r.used, r.future, r.internal) == (3, 5, 0)
    with pytest.raises(ValueError, match="'oracle' needs output_len"):
        ContiguousKVCache(1, 8, policy="oracle").admit("a", 3)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda c: c.admit("a", 1, 1), ValueError, "'a' is already admitted"),
        (lambda c: c.admit("z", 0, 1), ValueError, "prompt_len must be >= 1"),
        (
            lambda c: c.admit("z", 10, 7),
            ValueError,
            "prompt_len \\+ output_len = 17 exceeds max_seq_len = 16",
        ),
        (lambda c: c.admit("z", 17), ValueError, "prompt_len = 17 exceeds max_seq_len"),
        (lambda c: c.append("nobody"), KeyError, "'nobody' is not admitted"),
        (lambda c: c.release("nobody"), KeyError, "'nobody' is not admitted"),
        (lambda c: c.admit("z", 3, -1), ValueError, "output_len must be >= 0"),
    ],
)
def test_cache_bad_input_changes_nothing(call, error, match):
    cache = ContiguousKVCache(2, 16)
    cache.admit("a", 2, 3)
    before = (cache.memory_report(), cache.arena.bookings)
    with pytest.raises(error, match=match):
        call(cache)
    assert (cache.memory_report(), cache.arena.bookings) == before


def test_exact_is_the_old_name_of_the_oracle_policy():
    """One name per cache kind: Orca-Oracle's booking policy is "oracle"; "exact", its first
    name, is still accepted and becomes "oracle"."""
    assert POLICIES == ("max", "pow2", "oracle") and PAPER_NAMES["oracle"] == "Orca (Oracle)"
    assert ContiguousKVCache(1, 8, policy="exact").policy == "oracle"
    assert booking_size("exact", 300, 1, 2048) == booking_size("oracle", 300, 1, 2048) == 301
    assert set(PAPER_NAMES) == set(POLICIES)


def test_cache_constructor_validation():
    with pytest.raises(ValueError, match="policy must be one of"):
        ContiguousKVCache(1, 8, policy="guess")
    with pytest.raises(ValueError, match="max_seq_len must be >= 1"):
        ContiguousKVCache(1, 0)


def test_real_tensors_back_the_beds():
    spec = ModelSpec("toy", 2, 4, 2, 6)
    cache = ContiguousKVCache(3, 8, spec=spec)
    assert (
        len(cache.k) == 2 and cache.k[0].shape == (3, 8, 2, 6) and cache.k[0].dtype == torch.float16
    )
    offset = cache.admit("a", 2, 3)
    slot = cache.append("a")
    assert slot == offset + 2
    flat = cache.k[1].view(-1, 2, 6)
    flat[slot] = 1.0
    assert cache.k[1][offset // 8, 2].eq(1.0).all()
    assert cache.memory_report().in_bytes("used") == 3 * spec.kv_bytes_per_token
    with pytest.raises(ValueError, match="no ModelSpec"):
        ContiguousKVCache(1, 8).memory_report().in_bytes("used")


def test_recording_the_trace():
    cache = recorded(ContiguousKVCache(2, 8, policy="oracle"))
    cache.admit("a", 2, 2)
    cache.admit("b", 3, 3)
    cache.append("a")
    cache.record("step")
    cache.release("a")
    events = [f.event for f in cache.trace.frames]
    assert events == ["start", "check-in", "check-in", "step", "check-out"]
    frame = cache.trace.frames[3]
    assert frame.tables == {"a": range(0, 4), "b": range(4, 10)}
    assert frame.tokens == {"a": 3, "b": 3} and frame.final == {"a": 4, "b": 6}
    assert cache.trace.usage(3) == cache.trace.usage(3).__class__(16, 6, 4, 0, 6)
    assert cache.trace.free_runs(4) == [(0, 4), (10, 6)]
