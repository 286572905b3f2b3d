"""The hotel widget without a browser: frame encoding, colours, sampling, steps, the SVG fallback,
the mimebundle, bad input, prefix-cached rooms."""

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.core.accounting import CacheState
from kvlab.core.block_manager import BlockManager, PagedCache
from kvlab.core.contiguous import ArenaAllocator, ContiguousKVCache
from kvlab.core.errors import OutOfMemory
from kvlab.core.recorder import recorded
from kvlab.core.trace import EVENTS, Trace
from kvlab.serving.replay import replay
from kvlab.serving.workload import Request
from kvlab.ui.widgets import HotelFloorPlan, HotelPlayer, animate, compare
from kvlab.ui.widgets.frames import (
    KEY_EVENTS,
    align,
    block_table_text,
    cached_rooms,
    default_room_size,
    encode,
    frame_at,
    key_step,
    room_states,
    sample_frames,
)
from kvlab.ui.widgets.palette import COLORS, GUEST_PALETTE, LEGEND, extra_color, guest_colors

GOLDEN = Path(__file__).parent / "golden" / "hotel_frame.svg"


def small_paged_trace() -> Trace:
    m = recorded(BlockManager(12, 4))
    m.allocate("alice", 6)
    m.allocate("bob", 9)
    m.fork("alice", "carol")
    m.append_slot("carol")  # copy-on-write of alice's half-full room 1
    m.free("bob")
    return m.trace


def last(data: dict) -> list:
    return room_states(data, len(data["frames"]) - 1)


def test_paged_frames_follow_the_key_cards():
    data = encode(small_paged_trace())
    assert (data["num_rooms"], data["beds_per_room"], data["capacity"]) == (12, 4, 48)
    assert data["guests"] == ["alice", "bob", "carol"] and len(set(data["colors"])) == 3
    events = [f["event"] for f in data["frames"]]
    assert events == ["start", "check-in", "check-in", "fork", "copy-on-write", "check-out"]
    assert data["schedule"] == list(range(6)) and data["paged"] and data["has_shared"]
    fork = room_states(data, 3)
    assert fork[0] == (0, 4, 0, 0, 2) and fork[1] == (0, 2, 2, 0, 2)  # two key cards share them
    cow = room_states(data, 4)
    assert cow[1] == (0, 2, 2, 0, 1) and cow[5] == (2, 3, 1, 0, 1)  # carol moved to room 5
    assert data["frames"][-1]["metrics"] == {
        "guests": 2,
        "rooms_used": 3,
        "rooms_shared": 1,  # room 0: alice's and carol's
        "beds_used": 4 + 2 + 3,  # room 0 counted once, room 1 (alice: 2), room 5 (carol: 3)
        "percent_used": round(100 * 9 / 48, 1),
        "largest_free_run": None,  # means nothing under paging
    }


def test_beds_split_into_used_future_and_never_used():
    cache = recorded(ContiguousKVCache(2, 32, policy="max"))
    cache.admit("a", 5, 7)  # 32 beds booked: 5 used, 7 to come, 20 never used
    data = encode(cache.trace, room_size=8)
    states = last(data)[:4]
    assert [s.used for s in states] == [5, 0, 0, 0]
    assert [s.future for s in states] == [3, 4, 0, 0]
    assert [s.internal for s in states] == [0, 4, 8, 8]
    assert data["frames"][-1]["metrics"]["largest_free_run"] == 32


def test_contiguous_traces_are_grouped_into_rooms():
    cache = recorded(ContiguousKVCache(4, 2048, policy="exact"))
    cache.admit("a", 100, 60)
    cache.admit("b", 30, 10)
    assert default_room_size(cache.trace) == 4  # 8,192 beds -> 2,048 rooms
    data = encode(cache.trace)
    states = last(data)
    assert data["num_rooms"] == 2048 and data["beds_per_room"] == 4 and not data["paged"]
    assert [r for r, s in enumerate(states) if s.guest == 0] == list(range(40))
    assert [r for r, s in enumerate(states) if s.guest == 1] == list(range(40, 50))
    assert sum(s.used for s in states) == 130  # beds holding tokens, as the trace says
    assert sum(s.future for s in states) == 70 and not any(s.internal for s in states)
    assert all(s.refs <= 1 for s in states)  # a boundary room is drawn for one booking only


def test_arena_boundary_room_goes_to_the_larger_share():
    arena = recorded(ArenaAllocator(64))
    arena.allocate("x", 6)
    arena.allocate("y", 10)  # beds 6..15: room 1 (beds 4..7) holds 2 of x and 2 of y
    data = encode(arena.trace, room_size=4)
    assert [s.guest for s in last(data)[:4]] == [0, 0, 1, 1]


def test_grouped_booking_whose_first_room_goes_to_the_neighbour():
    arena = recorded(ArenaAllocator(64))
    arena.allocate("A", 10)  # beds 0..9: room 0 (beds 0..15) is mostly A's
    arena.allocate("B", 50)  # beds 10..59 hold B's tokens
    states = last(encode(arena.trace, room_size=16))
    # room 0 is drawn for A (10 beds); B's rooms 1..3 hold beds 16..59 of B
    assert states[0][:2] == (0, 10) and [s.used for s in states[1:4]] == [16, 16, 12]
    assert sum(s.used for s in states) == 10 + 50 - 6  # B's 6 beds in room 0 are drawn as A's


# --- colours ---------------------------------------------------------------------------------


def arena_trace(ops: list[tuple[bool, int]], capacity: int) -> Trace:
    """Random check-ins (``(True, beds)``) and check-outs (``(False, which)``) in an arena."""
    arena = recorded(ArenaAllocator(capacity))
    alive, count = [], 0
    for check_in, n in ops:
        if check_in:
            try:
                arena.allocate(f"g{count}", n)
                alive.append(f"g{count}")
            except OutOfMemory:
                pass
            count += 1
        elif alive:
            arena.free(alive.pop(n % len(alive)))
    return arena.trace


def paged_trace(ops: list[tuple[int, int]]) -> Trace:
    """Random paged traffic: allocate, append, free, fork, in 24 rooms of 2 beds."""
    m = recorded(BlockManager(24, 2))
    alive, count = [], 0
    for op, n in ops:
        try:
            if op == 0 or not alive:
                m.allocate(f"g{count}", 1 + n % 7)
                alive.append(f"g{count}")
            elif op == 1:
                m.append_slot(alive[n % len(alive)])
            elif op == 2:
                m.free(alive.pop(n % len(alive)))
            else:
                m.fork(alive[n % len(alive)], f"g{count}")
                alive.append(f"g{count}")
        except OutOfMemory:
            pass
        count += 1
    return m.trace


def neighbours_differ(data: dict) -> bool:
    """In every frame, two rooms next to each other held by different guests differ in colour."""
    for index in range(len(data["frames"])):
        owners = [s.guest for s in room_states(data, index)]
        for a, b in zip(owners, owners[1:], strict=False):
            if a >= 0 and b >= 0 and a != b and data["colors"][a] == data["colors"][b]:
                return False
    return True


arena_ops = st.lists(st.tuples(st.booleans(), st.integers(1, 40)), min_size=1, max_size=60)


@given(arena_ops, st.sampled_from([1, 2, 4, 16]))
def test_neighbouring_bookings_never_share_a_colour(ops, room_size):
    data = encode(arena_trace(ops, 256), room_size=room_size)
    assert neighbours_differ(data)
    assert all(c in GUEST_PALETTE or re.fullmatch("#[0-9a-f]{6}", c) for c in data["colors"])


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 50)), min_size=1, max_size=80))
def test_neighbouring_rooms_never_share_a_colour(ops):
    assert neighbours_differ(encode(paged_trace(ops)))


@given(arena_ops, arena_ops)
def test_compared_hotels_share_one_colouring(ops_a, ops_b):
    # the same guest names (g0, g1, ...) check in to both hotels
    a, b = arena_trace(ops_a, 256), arena_trace(ops_b, 128)
    player = compare({"a": a, "b": b}, steps_only=False, room_size=4)
    views = [h.data for h in player.hotels]
    assert all(neighbours_differ(data) for data in views)
    colors = [dict(zip(data["guests"], data["colors"], strict=True)) for data in views]
    assert all(colors[0][g] == colors[1][g] for g in colors[0].keys() & colors[1].keys())


def test_a_crowded_hotel_runs_past_the_palette_without_reusing_a_neighbours_colour():
    # 30 guests in one-bed rooms, all checked in at once, then every other one leaves and the
    # rest are joined by new neighbours: many neighbours per guest
    arena = recorded(ArenaAllocator(30))
    for i in range(30):
        arena.allocate(i, 1)
    for i in range(0, 30, 2):
        arena.free(i)
    for i in range(30, 45):
        arena.allocate(i, 1)
    assert neighbours_differ(encode(arena.trace))
    colors = {extra_color(k) for k in range(40)}
    assert len(colors) == 40 and not colors & {COLORS["future"], COLORS["internal"]}


def test_colours_are_the_same_for_the_widget_and_the_plots():
    trace = arena_trace([(True, 30)] * 8 + [(False, 1), (False, 3), (True, 20)], 256)
    data = encode(trace)
    colors = guest_colors(trace, default_room_size(trace))
    assert data["colors"] == [colors[g] for g in data["guests"]]
    assert data["palette"]["future"] == COLORS["future"] == "#f9a825"


# --- key cards -------------------------------------------------------------------------------


def test_key_cards_read_as_ranges():
    assert block_table_text([642, 48, 700, 1, 702, 4]) == "642–689, 700, 702–705"
    assert block_table_text([5, 1, 2, 2]) == "5, 2–3"  # key-card order kept
    assert block_table_text([]) == ""


@given(st.lists(st.integers(0, 300), unique=True, max_size=60))
def test_key_card_ranges_list_every_room_in_order(rooms):
    from kvlab.ui.widgets.frames import _runs

    text = block_table_text(_runs(rooms))
    back = []
    for part in text.split(", ") if text else []:
        lo, _, hi = part.partition("–")
        back += list(range(int(lo), int(hi or lo) + 1))
    assert back == rooms and "…" not in text


# --- sampling and steps ----------------------------------------------------------------------


EMPTY = CacheState("paged", 4, 4, {}, {}, {}, {})


def synthetic_trace(events: list[tuple[str, int]]) -> Trace:
    trace = Trace("arena", 4, 1)
    for k, (event, guest) in enumerate(events):
        trace.record(event, f"g{guest}", k * 0.05, EMPTY)
    return trace


events = st.lists(st.tuples(st.sampled_from(EVENTS), st.integers(0, 3)), min_size=1, max_size=80)


@given(events, st.integers(1, 30))
def test_sampling_keeps_the_frames_the_lesson_is_about(events, every):
    trace = synthetic_trace(events)
    kept = sample_frames(trace, every)
    assert kept == sorted(set(kept)) and set(range(0, len(events), every)) <= set(kept)
    assert kept[-1] == len(events) - 1  # the end of the story
    for event in KEY_EVENTS:
        for guest in {g for e, g in events if e == event}:
            first = next(i for i, (e, g) in enumerate(events) if (e, g) == (event, guest))
            assert first in kept, (event, guest)


def test_lab02_first_impossible_allocation_survives_every():
    arena = recorded(ContiguousKVCache(1, 64, policy="exact"))
    for guest, beds in [("A", 20), ("B", 10), ("C", 20), ("D", 10)]:
        arena.admit(guest, beds, 0)
    arena.release("B")
    arena.release("D")
    with pytest.raises(OutOfMemory):
        arena.admit("E", 16, 0)
    arena.admit("F", 4, 0)
    trace = arena.trace
    (refused,) = trace.events("impossible allocation")
    hotel = HotelFloorPlan(trace, every=4)
    assert refused not in range(0, len(trace.frames), 4) and refused in sample_frames(trace, 4)
    frames = [f["event"] for f in hotel.data["frames"]]
    assert "impossible allocation" in frames
    # the static picture shows that moment, not the empty hotel at step 1
    assert frames[frame_at(hotel.data, hotel.picture_step)] == "impossible allocation"
    assert "impossible allocation E" in hotel.to_svg()


def step_traces(lengths: list[int], skips: list[int]) -> list[Trace]:
    """Traces of per-step frames; trace k skips ahead ``skips[k]`` steps half-way through."""
    traces = []
    for length, skip in zip(lengths, skips, strict=True):
        trace = Trace("paged", 4, 4)
        trace.record("start", None, 0.0, EMPTY)
        for step in range(length):
            at = step + (skip if step >= length // 2 else 0)
            trace.record("step", None, round(at * 0.05, 9), EMPTY)
            trace.record("check-out", None, round(at * 0.05, 9), EMPTY)
        traces.append(trace)
    return traces


@given(
    st.lists(st.tuples(st.integers(1, 40), st.integers(0, 5)), min_size=1, max_size=3),
    st.integers(1, 7),
)
def test_hotels_played_together_stay_in_step(shapes, every):
    traces = step_traces([n for n, _ in shapes], [s for _, s in shapes])
    schedules = align(traces, every)
    assert len({len(s) for s in schedules}) == 1
    for trace, schedule in zip(traces, schedules, strict=True):
        step_frames = [i for i, f in enumerate(trace.frames) if f.event == "step"]
        assert schedule == sorted(schedule) and set(schedule) <= set(step_frames)
        assert schedule[-1] == step_frames[-1]  # each hotel reaches its last frame
        if every == 1:
            assert set(schedule) == set(step_frames)  # the slider reaches every frame
    if every > 1:
        return
    # one player step per moment any hotel took a step; each shows its latest step by then
    steps_of = [[f.time for f in t.frames if f.event == "step"] for t in traces]
    timeline = sorted({time for times in steps_of for time in times})
    assert len(timeline) == len(schedules[0])
    for trace, times, schedule in zip(traces, steps_of, schedules, strict=True):
        for now, frame in zip(timeline, schedule, strict=True):
            earlier = [time for time in times if time <= now]
            assert trace.frames[frame].time == (max(earlier) if earlier else times[0])


def test_compare_plays_until_the_longer_hotel_ends():
    guests = [Request(3, 5), Request(2, 8), Request(4, 6)]
    suites = replay(ContiguousKVCache(1, 16), guests, record=True)  # one guest at a time: 19 steps
    rooms = replay(PagedCache(8, 4), guests, record=True)  # all at once: 8 steps
    player = compare({"suites": suites.trace, "rooms": rooms.trace})
    a, b = (h.data for h in player.hotels)
    assert (player.slider.min, player.slider.max, player.play.min) == (1, 19, 1)
    assert len(a["frames"]) == 19 and len(b["frames"]) == 8  # every frame of both
    assert b["schedule"][7:] == [7] * 12  # the paged hotel holds its last frame
    assert [h.num_steps for h in player.hotels] == [19, 19]
    sampled = compare({"suites": suites.trace, "rooms": rooms.trace}, every=4)
    assert sampled.slider.max == 7  # steps 1, 5, 9, 13, 17, the paged hotel's last (8), 19
    for hotel in sampled.hotels:  # each hotel's last frame is still reachable
        assert hotel.data["schedule"][-1] == len(hotel.data["frames"]) - 1


def test_key_step_prefers_events_then_the_fullest_moment():
    data = encode(small_paged_trace())
    assert key_step([data]) == 5  # the copy-on-write frame (1-based step)
    result = replay(PagedCache(8, 4), [Request(3, 5), Request(2, 8)], record=True)
    plain = encode(result.trace, steps_only=True)
    util = [f["metrics"]["percent_used"] for f in plain["frames"]]
    assert key_step([plain]) == util.index(max(util)) + 1 != 1


# --- SVG, mimebundle, ESM ----------------------------------------------------------------------


def test_svg_fallback_is_deterministic_and_matches_the_golden_file():
    hotel = HotelFloorPlan(small_paged_trace(), title="golden", rooms_per_floor=6)
    svg = hotel.to_svg(5)
    assert svg == HotelFloorPlan(small_paged_trace(), title="golden", rooms_per_floor=6).to_svg(5)
    assert svg == hotel.to_svg()  # the picture picks the copy-on-write step by itself
    assert "step 5/6" in svg and "copy-on-write carol" in svg
    assert 'stroke="#000000" stroke-width="1.5"' in svg  # the shared room is outlined
    # a manager driven by hand keeps no clock and knows no answer lengths: the caption has no
    # "t = 0.00 s" that never moves, the legend no red "booked, never used" that never shows
    assert " s ·" not in svg and "booked, never used" not in svg
    for word in ("empty, for future tokens (answer lengths unknown)", "free", "shared room"):
        assert word in svg
    if not GOLDEN.exists():
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(svg)
        pytest.fail(f"wrote {GOLDEN}: look at it, then commit it")
    assert svg == GOLDEN.read_text(), f"the SVG changed; if on purpose, delete {GOLDEN} and rerun"


def test_compare_svg_shows_both_hotels_side_by_side_at_a_busy_step():
    guests = [Request(3, 5), Request(2, 8), Request(4, 6)]
    suites = replay(ContiguousKVCache(1, 16), guests, record=True)
    rooms = replay(PagedCache(8, 4), guests, record=True)
    player = compare({"suites": suites.trace, "rooms": rooms.trace})
    svg = player._repr_mimebundle_()["image/svg+xml"]
    assert svg.count('<g transform="translate(') == 2 and ">suites<" in svg and ">rooms<" in svg
    assert "step 1/" not in svg  # not the empty start
    player.slider.value = 3
    assert "step 3/19" in player.to_svg()  # once moved, the step shown


def test_mimebundle_has_svg_and_a_stable_text():
    hotel = HotelFloorPlan(small_paged_trace())
    data, _ = hotel._repr_mimebundle_()
    assert (
        data["text/plain"]
        == "HotelFloorPlan(kind='paged', rooms=12, beds_per_room=4, steps=6, step=1)"
    )
    assert (
        data["image/svg+xml"].startswith("<svg")
        and "application/vnd.jupyter.widget-view+json" in data
    )
    player = animate(small_paged_trace())
    bundle = player._repr_mimebundle_()
    assert "0x" not in bundle["text/plain"] and bundle["image/svg+xml"].startswith("<svg")
    assert (player.slider.min, player.slider.max, player.slider.value) == (1, 6, 1)


def test_widget_ships_its_own_esm_and_css():
    hotel = HotelFloorPlan(small_paged_trace())
    assert "export default" in hotel._esm and "import " not in hotel._esm.split("export default")[0]
    assert "http" not in hotel._esm and ".kvh-room" in hotel._css
    assert "@container" in hotel._css and ".kvh-legend" in hotel._css


def test_widget_words_follow_the_course():
    esm = HotelFloorPlan(small_paged_trace())._esm
    # contiguous hotels say "bookings" and never "logical block" (Lab 03 teaches it)
    assert 'data.paged ? "key cards" : "bookings"' in esm
    assert (
        esm.count("logical block") == 1
        and "data.paged ? `${data.guests[owner]}, logical block" in esm
    )


def test_bad_input_is_refused_before_the_browser():
    with pytest.raises(ValueError, match="trace has no frames"):
        HotelFloorPlan(Trace("paged", 4, 4))
    bad = Trace("paged", 4, 4)
    bad.record("step", None, 0.0, CacheState("paged", 4, 4, {"g": [1, 9]}, {"g": 5}, {"g": 8}, {}))
    with pytest.raises(ValueError, match="guest 'g' holds room 9, but the hotel has rooms 0..3"):
        HotelFloorPlan(bad)
    hotel = HotelFloorPlan(small_paged_trace())
    for step in (0, 7):
        with pytest.raises(ValueError, match=f"step must be in 1..6, got {step}"):
            hotel.step = step
    with pytest.raises(ValueError, match="step must be an int in 1..6, got 0"):
        HotelFloorPlan(small_paged_trace(), step=0)
    with pytest.raises(ValueError, match="step must be in 1..6"):
        hotel.to_svg(0)
    with pytest.raises(TypeError, match="trace must be a kvlab.core.trace.Trace"):
        HotelFloorPlan([1, 2])
    with pytest.raises(ValueError, match="every must be an int >= 1"):
        encode(small_paged_trace(), every=0)
    with pytest.raises(ValueError, match="no 'step' frames"):
        encode(small_paged_trace(), steps_only=True)
    with pytest.raises(ValueError, match="rooms_per_floor must be >= 1"):
        HotelFloorPlan(small_paged_trace(), rooms_per_floor=0)
    with pytest.raises(ValueError, match="every must be an int >= 1, got 0"):
        compare({"a": small_paged_trace()}, every=0)
    with pytest.raises(ValueError, match="traces must be a dict naming at least one trace"):
        compare({})
    with pytest.raises(TypeError, match=r"traces\['a'\] must be a kvlab.core.trace.Trace"):
        compare({"a": [1]})
    with pytest.raises(ValueError, match="hotels must play the same number of steps"):
        HotelPlayer([hotel, HotelFloorPlan(small_paged_trace(), every=2)])


def test_room_size_must_match_a_paged_trace():
    assert encode(small_paged_trace(), room_size=4)["num_rooms"] == 12
    with pytest.raises(ValueError, match="room_size must be 4"):
        encode(small_paged_trace(), room_size=16)
    with pytest.raises(ValueError, match="room_size must be >= 1"):
        encode(recorded(ArenaAllocator(8)).trace, room_size=0)


def test_the_readme_picture_is_lab03s_own_cell():
    from readme_picture import lab_cells

    imports, shown, step = lab_cells()
    assert "from kvlab" in imports and "import compare" in shown
    assert "player = compare(" in shown and shown.endswith("\nplayer")
    for cell in (imports, shown, step):
        compile(cell, "cell", "exec")


# --- prefix-cached rooms -----------------------------------------------------------------------

TOKENS = {"alice": 10, "dave": 8, "bob": 10, "carol": 9, "erin": 6}
CACHED_STORY = [  # event, guest, key cards, cached rooms in free-queue order
    ("start", None, {}, ()),
    ("check-in", "alice", {"alice": (0, 1, 2)}, ()),
    ("check-in", "dave", {"alice": (0, 1, 2), "dave": (3, 4)}, ()),
    ("check-out", "dave", {"alice": (0, 1, 2)}, (4, 3)),  # last room first
    ("check-out", "alice", {}, (4, 3, 1, 0)),  # room 2 was not full: plain free
    ("check-in", "bob", {"bob": (0, 1, 5)}, (4, 3)),  # found alice's rooms 0 and 1
    ("check-in", "carol", {"bob": (0, 1, 5), "carol": (0, 1, 6)}, (4, 3)),
    ("eviction", "erin", {"bob": (0, 1, 5), "carol": (0, 1, 6), "erin": (2, 4)}, (3,)),
]


def cached_trace() -> Trace:
    """Prefix caching by hand in 8 rooms of 4 beds: dave and alice leave full rooms cached, bob
    and carol find alice's two (then on two key cards), erin's check-in overwrites room 4."""
    trace = Trace("paged", 8, 4)
    for k, (event, guest, tables, cached) in enumerate(CACHED_STORY):
        tokens = {g: TOKENS[g] for g in tables}
        booked = {g: 4 * len(t) for g, t in tables.items()}
        state = CacheState("paged", 8, 4, tables, tokens, booked, {}, cached)
        trace.record(event, guest, k * 0.1, state)
    return trace


def test_cached_rooms_travel_in_the_frames_with_who_left_them():
    trace = cached_trace()
    assert trace.frames[4].cached == (4, 3, 1, 0) and trace.frames[0].cached == ()
    assert trace.usage(4).free == 32  # cached rooms are free memory
    data = encode(trace)
    assert data["guests"] == ["alice", "dave", "bob", "carol", "erin"]
    assert data["has_cached"] and data["palette"]["cached"] == COLORS["cached"]
    assert data["legend"]["cached"] == LEGEND["cached"]
    alice, dave = 0, 1
    # a guest's rooms, freed last one first, are one run: [start, -length, guest]
    assert data["frames"][4]["cached"] == [4, -2, dave, 1, -2, alice]
    assert list(cached_rooms(data, 4).items()) == [(4, dave), (3, dave), (1, alice), (0, alice)]
    assert [f["metrics"]["rooms_cached"] for f in data["frames"]] == [0, 0, 0, 2, 4, 2, 2, 1]
    assert cached_rooms(data, 7) == {3: dave} and room_states(data, 7)[4].guest == 4  # erin
    # rooms on two key cards after the prefix hit still count their key cards
    carol = room_states(data, 6)
    assert [carol[r].refs for r in (0, 1)] == [2, 2] and data["has_shared"]
    assert all(carol[r].guest == -1 for r in cached_rooms(data, 6))
    assert json.dumps(data) == json.dumps(encode(cached_trace()))  # deterministic
    plain = cached_trace()
    plain.frames = [replace(f, cached=()) for f in plain.frames]
    extra = len(json.dumps(data)) - len(json.dumps(encode(plain)))
    assert extra < 64 * len(plain.frames)  # two keys and a few numbers a frame


def test_an_eviction_is_a_key_event():
    trace = cached_trace()
    assert "eviction" in EVENTS and "eviction" in KEY_EVENTS
    (evicted,) = trace.events("eviction")
    assert evicted in sample_frames(trace, every=100)
    hotel = HotelFloorPlan(trace)
    assert hotel.picture_step == 8 and "eviction erin" in hotel.to_svg()


def test_cached_rooms_left_by_guests_no_sampled_frame_shows():
    trace = Trace("paged", 4, 4)
    states = [  # key cards, cached: room 3 was cached before the recording began
        ({"alice": (0, 1)}, (3,)),
        ({}, (3, 1, 0)),
        ({}, (3, 1, 0)),
    ]
    for event, (tables, cached) in zip(("check-in", "check-out", "step"), states, strict=True):
        state = CacheState("paged", 4, 4, tables, dict.fromkeys(tables, 8), {}, {}, cached)
        trace.record(event, "alice" if tables else None, 0.0, state)
    data = encode(trace, steps_only=True)
    assert [f["event"] for f in data["frames"]] == ["step"]
    assert data["guests"] == ["alice"] and data["colors"] == [guest_colors(trace)["alice"]]
    assert list(cached_rooms(data, 0).items()) == [(3, -1), (1, 0), (0, 0)]


@given(
    st.lists(
        st.tuples(st.integers(0, 30), st.integers(-1, 3)), unique_by=lambda p: p[0], max_size=30
    )
)
def test_cached_runs_keep_every_room_its_guest_and_its_place_in_the_queue(pairs):
    from kvlab.ui.widgets.frames import _cached_runs

    flat = _cached_runs(pairs)
    assert list(cached_rooms({"frames": [{"cached": flat}]}, 0).items()) == pairs
    assert len(flat) <= 3 * len(pairs)


def test_cached_rooms_in_the_svg():
    hotel = HotelFloorPlan(cached_trace(), rooms_per_floor=8)
    svg = hotel.to_svg(7)  # carol checked in: rooms 0, 1 shared, rooms 3, 4 cached
    cached = 'fill="url(#kvh-cached)"'
    assert svg.count(cached) == 3  # two rooms and the legend's swatch
    assert svg.count('<pattern id="kvh-cached"') == 1 and f'fill="{COLORS["cached"]}"' in svg
    assert re.search(
        r'<rect x="[\d.]+" y="[\d.]+" width="12" height="12" ' + re.escape(cached), svg
    )
    assert svg.count('paint-order="stroke">2</text>') == 2  # the key-card count of rooms 0, 1
    assert "2 rooms cached" in svg and LEGEND["cached"] in svg and "shared room" in svg
    assert "1 room cached" in hotel.to_svg(8)
    assert "kvh-cached" not in hotel.to_svg(1) and "0 rooms cached" in hotel.to_svg(1)


def test_cached_rooms_outside_the_hotel_are_refused():
    bad = Trace("paged", 4, 4)
    bad.record("start", None, 0.0, CacheState("paged", 4, 4, {}, {}, {}, {}, (2, 4)))
    with pytest.raises(ValueError, match=r"frame 0: cached rooms \(2, 4\) must lie in .* 0..3"):
        HotelFloorPlan(bad)


def test_traces_without_cached_rooms_encode_as_before():
    data = encode(small_paged_trace())
    assert "has_cached" not in data and "cached" not in data["palette"]
    assert list(data["legend"]) == ["used", "future", "internal", "free", "shared"]
    assert all("cached" not in f and "rooms_cached" not in f["metrics"] for f in data["frames"])
    svg = HotelFloorPlan(small_paged_trace()).to_svg()
    assert COLORS["cached"] not in svg and "cached" not in svg


def test_the_widget_draws_cached_rooms_in_the_palettes_colour():
    hotel = HotelFloorPlan(cached_trace())
    assert "data.palette.cached" in hotel._esm and "kvh-cached" in hotel._esm
    assert "same prefix" in hotel._esm and ".kvh-event-eviction" in hotel._css
    assert COLORS["cached"] not in (*GUEST_PALETTE, COLORS["future"], COLORS["internal"])
    assert COLORS["cached"] not in (COLORS["used"], COLORS["free"])


def test_every_animation_plays_in_ten_to_thirty_seconds():
    """Play's pace follows the number of steps: Lab 06's 8 steps are not a 2 s blur, Lab 03's
    1,210 not a 4-minute wait (the default was 200 ms a step for all)."""
    from kvlab.ui.widgets.floorplan import play_pace

    for n in (6, 9, 11, 50, 400, 1210, 20_000):
        interval, stride = play_pace(n)
        assert 50 <= interval <= 2000 and stride >= 1
        assert 10 <= (n - 1) / stride * interval / 1000 <= 30, (n, interval, stride)
    assert play_pace(8) == (2000, 1)  # a short story: a step every 2 s, 14 s in all
    assert play_pace(9) == (2000, 1) and play_pace(12) == (1818, 1)
    assert play_pace(1210) == (50, 4)  # a long day: every 4th step, 20 frames a second
    with pytest.raises(ValueError, match="num_steps"):
        play_pace(0)


def test_the_player_takes_its_pace_from_the_trace_unless_told():
    m = recorded(BlockManager(8, 4))
    for i in range(30):
        guest = f"g{i % 3}"
        m.free(guest) if i % 6 >= 3 else m.allocate(guest, 3)
    player = animate(m.trace)
    n = player.slider.max
    assert n > 11 and (player.play.interval, player.play.step) == play_pace_of(n)
    assert (
        compare({"a": m.trace, "b": m.trace}, steps_only=False).play.interval
        == player.play.interval
    )
    told = animate(m.trace, interval_ms=75, play_step=2)
    assert (told.play.interval, told.play.step) == (75, 2)
    with pytest.raises(ValueError, match="play_step"):
        animate(m.trace, play_step=0)


def play_pace_of(n):
    from kvlab.ui.widgets.floorplan import play_pace

    return play_pace(n)


def test_a_timed_day_with_known_lengths_keeps_its_clock_and_both_waste_colours():
    """Lab 06's replay knows each guest's answer length: amber beds will be written, red never."""
    result = replay(ContiguousKVCache(2, 16), [Request(3, 2), Request(5, 1)], record=True)
    data = encode(result.trace, steps_only=True)
    assert data["timed"] and data["has_future"] and data["has_internal"]
    assert data["legend"]["future"] == "reserved for future tokens"
    svg = HotelFloorPlan(result.trace, steps_only=True).to_svg()
    assert " s ·" in svg and "booked, never used" in svg and "reserved for future tokens" in svg
    hand = encode(small_paged_trace())
    assert not hand["timed"] and hand["has_future"] and not hand["has_internal"]


def test_every_plan_form_label_fits_its_width():
    """7 px a character (13 px sans-serif) for each label: at 110 px, "max at once (0: vLLM's)"
    and "min tokens/s each" were cut."""
    from kvlab.ui.widgets.plan_form import PlanForm

    form = PlanForm()
    boxes = [w for w in vars(form).values() if hasattr(w, "description") and w.description]
    assert len(boxes) >= 8
    for box in boxes:
        width = int(box.style.description_width.removesuffix("px"))
        assert 7 * len(box.description) <= width, (box.description, width)
