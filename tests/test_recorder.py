"""Recording from the outside: caches keep no trace; a recorder reads their state after events."""

import pytest

from kvlab.contiguous import ArenaAllocator, ContiguousKVCache
from kvlab.errors import OutOfSpace
from kvlab.paged import BlockManager, OutOfBlocks
from kvlab.recorder import Recorder, recorded


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
    cache = ContiguousKVCache(2, 8, policy="exact")
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
