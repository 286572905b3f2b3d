"""Recording from the outside: caches keep no trace; a recorder reads their state after events;
prefix hits and evictions are told."""

import inspect

import pytest

from kvlab.core.accounting import CacheState
from kvlab.core.block_manager import BlockManager, OutOfBlocks, PagedCache
from kvlab.core.contiguous import ArenaAllocator, ContiguousKVCache
from kvlab.core.errors import OutOfSpace
from kvlab.core.recorder import Recorder, recorded


def test_caches_keep_no_clock_and_no_trace():
    for cache in (ArenaAllocator(8), ContiguousKVCache(1, 8), BlockManager(2, 2)):
        assert not hasattr(cache, "trace") and not hasattr(cache, "clock")


def test_refused_calls_leave_a_frame_that_says_why():
    arena = recorded(ArenaAllocator(16))
    for name, beds in [("a", 6), ("b", 4), ("c", 6)]:
        arena.allocate(name, beds)
    arena.free("b")
    arena.free("c")  # free: 4 beds at 6..9 and 6 at 10..15 merge into 10 beds
    arena.allocate("d", 8)
    with pytest.raises(OutOfSpace):
        arena.allocate("e", 3)  # 2 free in total: plain out of memory
    events = [f.event for f in arena.trace.frames]
    assert events[-1] == "out of memory" and arena.trace.frames[-1].note == "e needs 3 beds"
    manager = recorded(BlockManager(1, 2))
    manager.allocate("a", 2)
    with pytest.raises(OutOfBlocks):
        manager.append_slot("a")
    assert manager.trace.frames[-1].note == "a needs 1 room"


def test_impossible_allocations_are_told_apart():
    arena = recorded(ArenaAllocator(10, placement="first_fit"))
    arena.allocate("a", 4)
    arena.allocate("b", 2)
    arena.free("a")
    with pytest.raises(OutOfSpace):
        arena.allocate(request_id="c", n=5)  # 8 free, in pieces of 4 and 4
    frame = arena.trace.frames[-1]
    assert (frame.event, frame.seq_id, frame.note) == (
        "impossible allocation",
        "c",
        "c needs 5 beds",
    )


def test_a_recorder_stamps_the_drivers_clock_and_reads_the_state_now():
    cache = ContiguousKVCache(2, 8, policy="oracle")
    cache.admit("a", 3, 2)
    recorder = Recorder(cache, clock=1.5)
    recorder.clock = 2.0
    cache.append("a")
    recorder.record("step")
    first, now = recorder.trace.frames
    assert (first.time, first.tokens) == (1.5, {"a": 3})
    assert (now.time, now.tokens, now.final) == (2.0, {"a": 4}, {"a": 5})


def test_the_recording_is_the_cache_for_everything_else():
    m = recorded(BlockManager(4, 2))
    m.allocate("a", 3)
    assert m.block_table("a") == [0, 1] and m.num_free_blocks == 2
    assert len(m.trace) == 2  # queries leave no frame


# --- prefix caching ----------------------------------------------------------------------------


class Stats:
    def __init__(self):
        self.queries = self.hits = self.evictions = self.cached_blocks = 0


class ScriptedCache:
    """A paged cache of 8 rooms of 4 beds that plays a script: each call that changes it moves to
    the next ``(key cards, cached rooms, evictions so far, cached tokens per guest)``. Counts its
    ``state()`` calls, to check that the recorder stays cheap."""

    prefix_caching = True  # declared, as kvlab.serving.interfaces.KVCache asks

    def __init__(self, script, stats: bool = True):
        self.script, self.at, self.states = script, 0, 0
        if stats:
            self.prefix_cache_stats = Stats()

    def state(self) -> CacheState:
        self.states += 1
        tables, cached = self.script[self.at][:2]
        tokens = {g: 4 * len(t) for g, t in tables.items()}
        return CacheState("paged", 8, 4, tables, tokens, tokens, {}, cached)

    def _next(self) -> None:
        self.at += 1
        if hasattr(self, "prefix_cache_stats"):
            self.prefix_cache_stats.evictions = self.script[self.at][2]

    def num_cached_tokens(self, seq_id) -> int:
        return self.script[self.at][3].get(seq_id, 0)

    def allocate(self, seq_id, prompt) -> None:
        self._next()

    def free(self, seq_id) -> None:
        self._next()

    def append_slot(self, seq_id) -> None:
        self._next()


SCRIPT = [  # key cards, cached rooms (free-queue order), evictions so far, cached tokens
    ({}, (), 0, {}),
    ({"alice": (0, 1, 2)}, (), 0, {}),
    ({}, (2, 1, 0), 0, {}),
    ({"bob": (0, 1, 3)}, (2,), 0, {"bob": 8}),  # found rooms 0 and 1
    ({"bob": (0, 1, 3), "carol": (4, 2)}, (), 1, {"bob": 8}),  # room 2 overwritten
    ({"bob": (0, 1, 3, 5), "carol": (4, 2)}, (), 1, {"bob": 8}),
]


@pytest.mark.parametrize("stats", [True, False])
def test_prefix_hits_and_evictions_are_recorded(stats):
    cache = recorded(ScriptedCache(SCRIPT, stats))
    cache.allocate("alice", 12)
    cache.free("alice")
    cache.allocate("bob", 12)
    cache.allocate("carol", 8)
    cache.append_slot("bob")  # no frame: a plain append
    frames = cache.trace.frames
    assert [f.cached for f in frames] == [s[1] for s in SCRIPT[:5]] + [()]
    assert [(f.event, f.seq_id) for f in frames[3:]] == [
        ("check-in", "bob"),
        ("check-in", "carol"),
        ("eviction", "carol"),
    ]
    assert frames[3].note == "bob found 2 rooms cached: 8 tokens"
    assert frames[4].note == "" and frames[1].note == ""
    assert frames[5].note == "carol took cached room 2: its old tokens are overwritten"


def test_the_recorder_reads_the_state_once_a_call_while_nothing_is_evicted():
    script = [({}, (1,), 0, {})] + [({"a": tuple(range(k))}, (7,), 0, {}) for k in range(1, 5)]
    cache = ScriptedCache(script)
    recording = recorded(cache)
    start = cache.states
    recording.allocate("a", 4)
    for _ in range(3):
        recording.append_slot("a")  # cached rooms, evictions unchanged: no state read
    assert cache.states - start == 1 and len(recording.trace) == 2


def test_a_plain_append_that_overwrites_a_cached_room_leaves_a_frame():
    script = [({"a": (0,)}, (1, 2), 0, {}), ({"a": (0, 2)}, (1,), 1, {})]
    cache = recorded(ScriptedCache(script))
    cache.append_slot("a")
    frame = cache.trace.frames[-1]
    assert (frame.event, frame.seq_id, frame.cached) == ("eviction", "a", (1,))
    assert frame.note == "a took cached room 2: its old tokens are overwritten"


def test_caches_without_prefix_caching_record_as_before():
    for cache in (BlockManager(8, 4), PagedCache(8, 4)):
        m = recorded(cache)
        m.allocate("a", 9) if isinstance(cache, BlockManager) else m.admit("a", 9, 3)
        m.free("a") if isinstance(cache, BlockManager) else m.release("a")
        assert [(f.event, f.note, f.cached) for f in m.trace.frames] == [
            ("start", "", ()),
            ("check-in", "", ()),
            ("check-out", "", ()),
        ]


needs_prefix_caching = pytest.mark.skipif(
    "enable_prefix_caching" not in inspect.signature(BlockManager).parameters,
    reason="BlockManager has no enable_prefix_caching yet",
)


@needs_prefix_caching
def test_the_block_manager_prefix_cache_recorded():
    from kvlab.ui.widgets.frames import cached_rooms, encode

    m = recorded(BlockManager(6, 4, enable_prefix_caching=True))
    prompt = list(range(10))  # two full rooms and half of a third
    m.allocate("alice", prompt)
    m.free("alice")
    assert m.trace.frames[-1].cached == tuple(m.cached_block_ids()) == (1, 0)
    m.allocate("bob", prompt)
    assert m.trace.frames[-1].note == "bob found 2 rooms cached: 8 tokens"
    assert m.block_table("bob")[:2] == [0, 1] and m.trace.frames[-1].cached == ()
    m.free("bob")
    before = m.trace.frames[-1].cached
    m.allocate("carol", [100 + i for i in range(24)])  # all six rooms: both cached ones too
    evicted = m.prefix_cache_stats.evictions
    frame = m.trace.frames[-1]
    assert (frame.event, frame.seq_id) == ("eviction", "carol")
    assert m.trace.frames[-2].event == "check-in"  # the check-in's own frame comes first
    rooms = [r for r in m.block_table("carol") if r in before]
    listed = ", ".join(map(str, rooms))
    assert len(rooms) == evicted == 2 and frame.note == (
        f"carol took cached rooms {listed}: their old tokens are overwritten"
    )
    data = encode(m.trace)
    assert data["has_cached"] and cached_rooms(data, 2) == {1: 0, 0: 0}  # left by alice


# --- the declared calls ------------------------------------------------------------------------


class LearnersManager:
    """A learner's block manager (Lab 03): its own argument names, no prefix caching declared,
    and a num_cached_tokens the recorder must not call (it is not declared to cache prefixes)."""

    def __init__(self):
        self.tables: dict = {}

    def state(self) -> CacheState:
        tokens = {g: 2 * len(t) for g, t in self.tables.items()}
        return CacheState("paged", 4, 2, dict(self.tables), tokens, tokens, {})

    def allocate(self, guest, tokens):
        self.tables[guest] = tuple(range(len(self.tables), len(self.tables) + -(-tokens // 2)))

    def free(self, guest):
        del self.tables[guest]

    def num_cached_tokens(self, guest):
        raise AssertionError("not a prefix cache: never asked")


def test_calls_pass_on_as_given_with_the_sequence_found_by_position_or_name():
    m = recorded(LearnersManager())
    m.allocate("a", tokens=3)
    m.free("a")
    assert [(f.event, f.seq_id) for f in m.trace.frames] == [
        ("start", None),
        ("check-in", "a"),
        ("check-out", "a"),
    ]
    cache = recorded(ContiguousKVCache(2, 8))
    cache.admit(request_id="r", prompt_len=2, output_len=1)
    cache.release(request_id="r")
    manager = recorded(BlockManager(4, 2))
    manager.allocate(seq_id="p", prompt=3)
    manager.fork(parent_id="p", child_id="c")
    assert [(f.event, f.seq_id) for f in cache.trace.frames[1:]] == [
        ("check-in", "r"),
        ("check-out", "r"),
    ]
    assert manager.trace.frames[-1].note == "c shares p's 2 rooms"
    with pytest.raises(TypeError, match="takes the sequence first"):
        manager.allocate(prompt=3)
    with pytest.raises(TypeError, match="takes parent_id and child_id"):
        manager.fork("p")


def test_the_recording_answers_like_the_cache():
    m = recorded(PagedCache(4, 2))
    m.admit("a", 3)
    assert "a" in m and "b" not in m
    assert m.prefix_caching is False and m.capacity == 8
    with pytest.raises(AttributeError):
        m.no_such_call  # noqa: B018
    arena = recorded(ArenaAllocator(8))
    with pytest.raises(AttributeError, match="admit"):
        arena.admit("a", 3)  # an arena has no admit: nothing recorded
    assert len(arena.trace) == 1


def test_prefix_caching_is_read_as_declared():
    assert recorded(BlockManager(4, 2, enable_prefix_caching=True)).prefix_caching is True
    assert recorded(PagedCache(4, 2, enable_prefix_caching=True)).prefix_caching is True
    for cache in (BlockManager(4, 2), ContiguousKVCache(1, 4), ArenaAllocator(4)):
        assert recorded(cache).prefix_caching is False
    assert recorded(LearnersManager()).prefix_caching is False
