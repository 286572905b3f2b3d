"""The hotel widget without a browser: frame encoding, the SVG fallback, the mimebundle, bad input."""

from pathlib import Path

import pytest

from kvlab.contiguous import ArenaAllocator, ContiguousKVCache
from kvlab.paged import BlockManager, PagedHotel
from kvlab.replay import replay
from kvlab.trace import Trace
from kvlab.widgets import HotelFloorPlan, animate, compare
from kvlab.widgets.frames import default_room_size, encode, room_states
from kvlab.workload import Request

GOLDEN = Path(__file__).parent / "golden" / "hotel_frame.svg"


def small_paged_trace() -> Trace:
    m = BlockManager(12, 4, record=True)
    m.allocate("alice", 6)
    m.allocate("bob", 9)
    m.fork("alice", "carol")
    m.append_slot("carol")  # copy-on-write of alice's half-full room 1
    m.free("bob")
    return m.trace


def test_paged_frames_follow_the_key_cards():
    data = encode(small_paged_trace())
    assert (data["num_rooms"], data["beds_per_room"], data["capacity"]) == (12, 4, 48)
    assert data["guests"] == ["alice", "bob", "carol"] and len(data["colors"]) == 3
    events = [f["event"] for f in data["frames"]]
    assert events == ["start", "check-in", "check-in", "fork", "copy-on-write", "check-out"]
    fork = room_states(data, 3)
    assert fork[0] == (0, 4, 2) and fork[1] == (0, 2, 2)  # two key cards share alice's rooms
    cow = room_states(data, 4)
    assert cow[1] == (0, 2, 1) and cow[5] == (2, 3, 1)  # carol moved to room 5 and wrote a bed
    last = data["frames"][-1]
    assert last["metrics"] == {
        "rooms_used": 3,
        "beds_used": 6 + 3,  # room 0 counted once, room 1 (alice: 2), room 5 (carol: 3)
        "utilization": round(9 / 48, 4),
        "largest_free_run": 24,
    }


def test_contiguous_traces_are_grouped_into_rooms():
    cache = ContiguousKVCache(4, 2048, policy="exact", record=True)
    cache.admit("a", 100, 60)
    cache.admit("b", 30, 10)
    assert default_room_size(cache.trace) == 4  # 8,192 beds -> 2,048 rooms
    data = encode(cache.trace)
    assert data["num_rooms"] == 2048 and data["beds_per_room"] == 4
    states = room_states(data, -1 + len(data["frames"]))
    a = [r for r, s in enumerate(states) if s[0] == 0]
    b = [r for r, s in enumerate(states) if s[0] == 1]
    assert a == list(range(40)) and b == list(range(40, 50))
    assert sum(s[1] for s in states) == 130  # beds holding tokens, as the trace says
    assert all(s[2] <= 1 for s in states)  # a boundary room is drawn for one booking only


def test_arena_boundary_room_goes_to_the_larger_share():
    arena = ArenaAllocator(64, record=True)
    arena.allocate("x", 6)
    arena.allocate("y", 10)  # beds 6..15: room 1 (beds 4..7) holds 2 of x and 2 of y
    data = encode(arena.trace, room_size=4)
    states = room_states(data, len(data["frames"]) - 1)
    assert [s[0] for s in states[:4]] == [0, 0, 1, 1]


def test_steps_only_and_every_align_two_replays():
    guests = [Request(3, 5), Request(2, 8)]
    a = ContiguousKVCache(2, 16, record=True)
    b = PagedHotel(8, 4, record=True)
    replay(a, guests)
    replay(b, guests)
    da, db = encode(a.trace, steps_only=True), encode(b.trace, steps_only=True)
    assert {f["event"] for f in da["frames"]} == {"step"} and len(da["frames"]) == len(
        db["frames"]
    ) == 8
    assert len(encode(a.trace, steps_only=True, every=3)["frames"]) == 3
    player = compare({"suites": a.trace, "rooms": b.trace})
    assert [h.num_frames for h in player.hotels] == [8, 8] and player.slider.max == 7


def test_svg_fallback_is_deterministic_and_matches_the_golden_file():
    hotel = HotelFloorPlan(small_paged_trace(), title="golden", rooms_per_floor=6)
    svg = hotel.to_svg(4)
    assert svg == HotelFloorPlan(small_paged_trace(), title="golden", rooms_per_floor=6).to_svg(4)
    assert svg.count("<rect") >= 12 and 'stroke="#000"' in svg  # shared rooms are outlined
    if not GOLDEN.exists():
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(svg)
        pytest.fail(f"wrote {GOLDEN}: look at it, then commit it")
    assert svg == GOLDEN.read_text(), f"the SVG changed; if on purpose, delete {GOLDEN} and rerun"


def test_mimebundle_has_svg_and_a_stable_text():
    hotel = HotelFloorPlan(small_paged_trace())
    data, _ = hotel._repr_mimebundle_()
    assert (
        data["text/plain"]
        == "HotelFloorPlan(kind='paged', rooms=12, beds_per_room=4, frames=6, step=0)"
    )
    assert (
        data["image/svg+xml"].startswith("<svg")
        and "application/vnd.jupyter.widget-view+json" in data
    )
    player = animate(small_paged_trace())
    bundle = player._repr_mimebundle_()
    assert "0x" not in bundle["text/plain"] and bundle["image/svg+xml"].startswith("<svg")


def test_widget_ships_its_own_esm_and_css():
    hotel = HotelFloorPlan(small_paged_trace())
    assert "export default" in hotel._esm and "import " not in hotel._esm.split("export default")[0]
    assert "http" not in hotel._esm and ".kvh-room" in hotel._css


def test_bad_input_is_refused_before_the_browser():
    with pytest.raises(ValueError, match="trace has no frames"):
        HotelFloorPlan(Trace("paged", 4, 4))
    bad = Trace("paged", 4, 4)
    bad.record("step", None, 0.0, {"g": [1, 9]}, {"g": 5}, {"g": 8}, {})
    with pytest.raises(ValueError, match="guest 'g' holds room 9, but the hotel has rooms 0..3"):
        HotelFloorPlan(bad)
    hotel = HotelFloorPlan(small_paged_trace())
    with pytest.raises(ValueError, match="step must be in 0..5, got 6"):
        hotel.step = 6
    with pytest.raises(ValueError, match="step must be in 0..5"):
        hotel.to_svg(-1)
    with pytest.raises(TypeError, match="trace must be a kvlab.trace.Trace"):
        HotelFloorPlan([1, 2])
    with pytest.raises(ValueError, match="every must be an int >= 1"):
        encode(small_paged_trace(), every=0)
    with pytest.raises(ValueError, match="no 'step' frames"):
        encode(small_paged_trace(), steps_only=True)
    with pytest.raises(ValueError, match="traces must name at least one trace"):
        compare({})


def test_grouped_booking_whose_first_room_goes_to_the_neighbour():
    arena = ArenaAllocator(64, record=True)
    arena.allocate("A", 10)  # beds 0..9: room 0 (beds 0..15) is mostly A's
    arena.allocate("B", 50)  # beds 10..59 hold B's tokens
    data = encode(arena.trace, room_size=16)
    states = room_states(data, len(data["frames"]) - 1)
    # room 0 is drawn for A (10 beds); B's rooms 1..3 hold beds 16..59 of B
    assert states[0] == (0, 10, 1) and [s[1] for s in states[1:4]] == [16, 16, 12]
    assert sum(s[1] for s in states) == 10 + 50 - 6  # B's 6 beds in room 0 are drawn as A's room


def test_room_size_must_match_a_paged_trace():
    assert encode(small_paged_trace(), room_size=4)["num_rooms"] == 12
    with pytest.raises(ValueError, match="room_size must be 4"):
        encode(small_paged_trace(), room_size=16)
    with pytest.raises(ValueError, match="room_size must be >= 1"):
        encode(ArenaAllocator(8, record=True).trace, room_size=0)
