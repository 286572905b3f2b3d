import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvlab.core.block_manager import BlockManager, OutOfBlocks, PagedCache, PagedKVCache
from kvlab.core.recorder import recorded
from kvlab.models import ModelSpec


def snapshot(m: BlockManager):
    return (
        {s: m.block_table(s) for s in m.seq_ids},
        {s: m.num_tokens(s) for s in m.seq_ids},
        [m.ref_count(b) for b in range(m.num_blocks)],
        m.num_free_blocks,
    )


class ManagerMachine(RuleBasedStateMachine):
    """allocate / append_slot / fork / free / running out, with kvlab's invariants after each step."""

    @initialize(num_blocks=st.integers(1, 24), block_size=st.sampled_from([1, 2, 3, 4, 16]))
    def create(self, num_blocks, block_size):
        self.m = recorded(BlockManager(num_blocks, block_size))
        self.next_id = 0

    def _id(self):
        self.next_id += 1
        return self.next_id

    @rule(n=st.integers(1, 40))
    def allocate(self, n):
        before = snapshot(self.m)
        seq = self._id()
        asked = self.m.can_allocate(n)
        try:
            table = self.m.allocate(seq, n)
            assert asked
        except OutOfBlocks:
            assert not asked
            assert -(-n // self.m.block_size) > before[3]
            assert snapshot(self.m) == before
            return
        assert len(table) == -(-n // self.m.block_size)

    @precondition(lambda self: self.m.seq_ids)
    @rule(data=st.data())
    def append(self, data):
        seq = data.draw(st.sampled_from(sorted(self.m.seq_ids)))
        before = snapshot(self.m)
        tables, tokens = before[0], before[1]
        asked = self.m.can_append(seq)
        try:
            moved = self.m.append_slot(seq)
            assert asked
        except OutOfBlocks:
            assert not asked
            assert before[3] == 0
            assert snapshot(self.m) == before
            return
        assert self.m.num_tokens(seq) == tokens[seq] + 1
        for other, table in tables.items():  # other guests' key cards never change
            if other != seq:
                assert self.m.block_table(other) == table
        last = tables[seq][-1]
        was_shared_partial = tokens[seq] % self.m.block_size and before[2][last] > 1
        if was_shared_partial:
            assert moved == (last, self.m.block_table(seq)[-1])
            assert self.m.ref_count(last) == before[2][last] - 1
        else:
            assert moved is None

    @precondition(lambda self: self.m.seq_ids)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.m.seq_ids)))
        child = self._id()
        self.m.fork(parent, child)
        assert self.m.block_table(child) == self.m.block_table(parent)

    @precondition(lambda self: self.m.seq_ids)
    @rule(data=st.data())
    def free(self, data):
        self.m.free(data.draw(st.sampled_from(sorted(self.m.seq_ids))))

    @invariant()
    def invariants(self):
        m = self.m
        holders: dict[int, int] = {}
        for seq in m.seq_ids:
            table = m.block_table(seq)
            assert len(table) == -(-m.num_tokens(seq) // m.block_size)
            assert len(set(table)) == len(table)
            for block in table:
                holders[block] = holders.get(block, 0) + 1
        for block in range(m.num_blocks):
            assert m.ref_count(block) == holders.get(block, 0)
        assert m.num_free_blocks + len(holders) == m.num_blocks
        r = m.memory_report()
        assert r.used + r.future + r.internal + r.free == r.capacity
        assert r.free == m.num_free_blocks * m.block_size
        m.record("step")  # one accounting: the report and the recorded frame agree
        assert m.trace.usage(-1) == r

    def teardown(self):
        for seq in self.m.seq_ids:
            self.m.free(seq)
        assert self.m.num_free_blocks == self.m.num_blocks
        assert all(self.m.ref_count(b) == 0 for b in range(self.m.num_blocks))


TestManager = ManagerMachine.TestCase
TestManager.settings = settings(max_examples=80, stateful_step_count=50)


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("k", [1, 3])
def test_boundary_token_counts(block_size, k):
    cases = [(1, 1), (k * block_size, k), (k * block_size + 1, k + 1)]
    if block_size > 1:
        cases.append((k * block_size - 1, k))
    for n, rooms in cases:
        m = BlockManager(64, block_size)
        assert len(m.allocate("s", n)) == rooms
        before = m.block_table("s")
        m.append_slot("s")
        grew = n % block_size == 0
        assert len(m.block_table("s")) == rooms + grew
        assert m.block_table("s")[: len(before)] == before


def test_a_pool_of_one_block():
    m = BlockManager(1, 4)
    assert m.allocate("a", 4) == [0]
    with pytest.raises(OutOfBlocks, match="'a' needs 1 free block"):
        m.append_slot("a")
    with pytest.raises(OutOfBlocks):
        m.allocate("b", 1)
    m.free("a")
    assert m.can_allocate(4) and not m.can_allocate(5)


def test_copy_on_write_moves_only_the_writer():
    m = BlockManager(8, 4)
    m.allocate("p", 6)  # rooms [0, 1], room 1 half full
    m.fork("p", "c")
    assert m.ref_count(0) == m.ref_count(1) == 2
    moved = m.append_slot("c")
    assert moved == (1, 2)
    assert m.block_table("c") == [0, 2] and m.block_table("p") == [0, 1]
    assert m.ref_count(1) == 1 and m.ref_count(2) == 1
    assert m.append_slot("p") is None  # room 1 is p's alone now: no copy
    m.append_slot("c")
    m.append_slot("c")  # c's room 2 is full after 8 tokens: a fresh room, no copy
    assert m.append_slot("c") is None and len(m.block_table("c")) == 3


def test_full_shared_rooms_are_never_copied():
    m = BlockManager(8, 4)
    m.allocate("p", 8)
    m.fork("p", "c")
    assert m.append_slot("c") is None
    assert m.block_table("c")[:2] == m.block_table("p")


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda m: m.allocate("a", 1), ValueError, "'a' already exists"),
        (lambda m: m.allocate("z", 0), ValueError, r"prompt \(a token count\) must be >= 1"),
        (lambda m: m.append_slot("nobody"), KeyError, "'nobody' is not in the block manager"),
        (lambda m: m.free("nobody"), KeyError, "'nobody'"),
        (lambda m: m.fork("nobody", "x"), KeyError, "'nobody'"),
        (lambda m: m.fork("a", "a"), ValueError, "'a' already exists"),
        (lambda m: m.block_table("nobody"), KeyError, "'nobody'"),
        (lambda m: m.ref_count(99), ValueError, "block_id must be < num_blocks"),
        (lambda m: m.allocate("big", 100), OutOfBlocks, "'big' needs 25 free block"),
        (lambda m: m.allocate(["x"], 1), TypeError, "seq_id must be hashable"),
    ],
)
def test_bad_input_changes_nothing(call, error, match):
    m = BlockManager(8, 4)
    m.allocate("a", 5)
    before = snapshot(m)
    with pytest.raises(error, match=match):
        call(m)
    assert snapshot(m) == before


def test_constructor_validation():
    with pytest.raises(ValueError, match="num_blocks must be >= 1"):
        BlockManager(0, 16)
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        BlockManager(4, 0)


def test_memory_report_counts_shared_rooms_once():
    m = BlockManager(10, 4)
    m.allocate("p", 6)
    m.set_expected_len("p", 7)
    m.fork("p", "c")
    r = m.memory_report()
    assert (r.used, r.future, r.internal, r.free) == (6, 1, 1, 32)
    m.append_slot("c")  # copy-on-write: c gets its own copy of room 1
    r = m.memory_report()
    assert (r.used, r.future, r.internal, r.free) == (6 + 3, 1, 1 + 1, 28)


def test_freed_blocks_are_reused_least_recently_freed_first():
    m = BlockManager(6, 2)
    m.allocate("a", 4)  # blocks 0, 1
    m.allocate("b", 4)  # blocks 2, 3
    m.free("a")  # the queue: 4, 5, then a's last block first: 1, 0
    m.free("b")  # ... 3, 2
    assert m.pool.free_queue.block_ids() == [4, 5, 1, 0, 3, 2]
    assert m.allocate("c", 8) == [4, 5, 1, 0]


def test_refusals_leave_the_manager_unchanged_and_ask_first():
    m = BlockManager(2, 4)
    m.allocate("a", 8)
    before = snapshot(m)
    assert not m.can_allocate(1) and not m.can_append("a")
    with pytest.raises(OutOfBlocks, match="'a' needs 1 free block") as refusal:
        m.append_slot("a")
    assert refusal.value.needed == 1 and snapshot(m) == before
    m.fork("a", "b")
    m.free("a")
    assert m.can_append("b") is False  # b's last block is full and nothing is free


def test_recorded_frames_follow_the_manager():
    m = recorded(BlockManager(6, 2))
    m.allocate("a", 3)
    m.fork("a", "b")
    m.append_slot("b")
    m.free("a")
    trace = m.trace
    assert [f.event for f in trace.frames] == [
        "start",
        "check-in",
        "fork",
        "copy-on-write",
        "check-out",
    ]
    assert trace.frames[2].tables == {"a": (0, 1), "b": (0, 1)}
    assert trace.ref_counts(2) == {0: 2, 1: 2}
    assert trace.frames[3].tables["b"] == (0, 2) and "room 1 -> room 2" in trace.frames[3].note
    assert trace.free_runs(4) == [(1, 1), (3, 3)]


def test_paged_kv_cache_write_gather_and_copy_on_write():
    spec = ModelSpec("toy", 2, 4, 2, 3, dtype_bytes=4)
    cache = PagedKVCache(spec, num_blocks=6, block_size=2)
    g = torch.Generator().manual_seed(0)
    k = torch.randn(2, 3, 2, 3, generator=g)
    v = torch.randn(2, 3, 2, 3, generator=g)
    cache.manager.allocate("p", 3)
    cache.write("p", k, v)
    cache.manager.fork("p", "c")
    k_new = torch.randn(2, 1, 2, 3, generator=g)
    cache.append_token("c", k_new, k_new)  # room 1 is shared and half full: copied first
    for layer in range(2):
        kc, vc = cache.gather("c", layer)
        assert torch.equal(kc, torch.cat([k[layer], k_new[layer]]))
        kp, _ = cache.gather("p", layer)
        assert torch.equal(kp, k[layer])  # the parent's tokens are untouched
    assert cache.slot_mapping("c", [0, 3]).tolist() == [
        0,
        cache.manager.block_table("c")[1] * 2 + 1,
    ]
    with pytest.raises(ValueError, match="holds only 3"):
        cache.write("p", torch.zeros(2, 4, 2, 3), torch.zeros(2, 4, 2, 3))
    with pytest.raises(ValueError, match="with layer="):
        cache.write("p", k, v, layer=0)
    with pytest.raises(IndexError, match="position 7 is outside"):
        cache.manager.slot("p", 7)


def test_paged_hotel_replay_beats_96_percent():
    from kvlab.serving.replay import replay
    from kvlab.serving.workload import Request, load_trace

    day = [Request(r.prompt_len, r.output_len) for r in load_trace("sharegpt_like")]
    result = replay(PagedCache(2048, 16), day)
    assert result.utilization("used") >= 0.96
    assert result.mean_running() > 4 * 16  # max-length booking keeps 16 guests


def test_preemption_recomputes_and_everyone_finishes():
    from kvlab.serving.replay import replay
    from kvlab.serving.workload import Request

    guests = [Request(4, 12), Request(4, 12), Request(4, 12)]
    hotel = PagedCache(num_blocks=6, block_size=4)  # 24 beds; the three stays need 48
    result = replay(hotel, guests)
    assert result.preemptions > 0
    assert hotel.manager.seq_ids == [] and hotel.manager.num_free_blocks == 6


def test_bench_reports_real_rates(tmp_path):
    from kvlab.perf.bench import allocator

    report = allocator(n=20_000)
    assert all(v > 0 for v in report["results"].values())


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=6),
    num_blocks=st.integers(8, 40),
    block_size=st.sampled_from([1, 2, 3, 4, 16]),
    rounds=st.integers(0, 40),
)
def test_append_rounds_is_append_slot_round_after_round(lengths, num_blocks, block_size, rounds):
    """The simulator's bulk decode: same block tables, same free queue, same refusal point."""
    bulk, stepped = BlockManager(num_blocks, block_size), BlockManager(num_blocks, block_size)
    ids = []
    for i, n in enumerate(lengths):
        if not bulk.can_allocate(n):
            break
        for m in (bulk, stepped):
            m.allocate(i, n)
        ids.append(i)
    if not ids:
        return
    room = bulk.decode_room(ids, rounds)
    fits = 0  # rounds that stepping completes: each takes a block for every full last block
    while fits < rounds:
        need = sum(stepped.num_tokens(i) % block_size == 0 for i in ids)
        if need > stepped.num_free_blocks:
            break
        for i in ids:
            stepped.append_slot(i)
        fits += 1
    assert room == fits
    held = bulk.append_rounds(ids, room)
    assert len(held) == room
    for i in ids:
        assert bulk.block_table(i) == stepped.block_table(i)
        assert bulk.num_tokens(i) == stepped.num_tokens(i)
    assert bulk.pool.free_queue.block_ids() == stepped.pool.free_queue.block_ids()
    if room:
        assert held[-1] == bulk.num_blocks - bulk.num_free_blocks
    bulk.check_invariants()
    if room < rounds:
        with pytest.raises(OutOfBlocks):
            bulk.append_rounds(ids, rounds - room + 1)
        assert bulk.pool.free_queue.block_ids() == stepped.pool.free_queue.block_ids()
