"""The matplotlib floor plan: small plans labelled, legends that match the picture, no "largest
free extent" under paging."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from kvlab.core.block_manager import BlockManager  # noqa: E402
from kvlab.core.contiguous import ArenaAllocator, ContiguousKVCache  # noqa: E402
from kvlab.core.errors import OutOfSpace  # noqa: E402
from kvlab.core.recorder import recorded
from kvlab.ui import viz  # noqa: E402
from kvlab.ui.widgets.palette import COLORS, guest_colors  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def lab03_hotel() -> BlockManager:
    """Lab 03's first picture: 12 rooms of 4 beds, alice and carol."""
    hotel = recorded(BlockManager(num_blocks=12, block_size=4))
    hotel.allocate("alice", 6)
    hotel.allocate("bob", 9)
    for _ in range(3):
        hotel.append_slot("alice")
    hotel.free("bob")
    hotel.allocate("carol", 5)
    return hotel


def legend_of(ax):
    (legend,) = ax.figure.legends
    return legend, [t.get_text() for t in legend.get_texts()]


def fills(ax) -> set[str]:
    return {to_hex(p.get_facecolor()) for p in ax.patches if p.get_facecolor()[3] > 0}


def test_a_small_paged_plan_names_its_rooms_and_guests():
    hotel = lab03_hotel()
    ax = viz.plot_floor_plan(hotel.trace, -1, beds_per_floor=16, title="12 rooms")
    texts = [t.get_text() for t in ax.texts]
    assert [f"room {r}" for r in range(12)] == [t for t in texts if t.startswith("room")]
    assert texts.count("alice") == len(hotel.block_table("alice")) == 3
    assert texts.count("carol") == 2
    borders = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_facecolor()[3] == 0]
    assert len(borders) >= 12  # every room outlined
    legend, labels = legend_of(ax)
    # a manager driven by hand is not told answer lengths: amber is every empty booked bed
    assert labels == ["alice", "carol", "empty, for future tokens (answer lengths unknown)", "free"]
    colors = guest_colors(hotel.trace)
    swatches = [to_hex(h.get_facecolor()) for h in legend.legend_handles[:2]]
    assert swatches == [colors["alice"], colors["carol"]] and set(swatches) <= fills(ax)
    assert "largest free extent" not in " ".join(labels) + ax.get_title()


def test_a_paged_plan_has_no_largest_free_run():
    m = recorded(BlockManager(64, 4))
    for i in range(8):
        m.allocate(f"g{i}", 5 + 3 * i)
    m.free("g3")
    ax = viz.plot_floor_plan(m.trace)
    _, labels = legend_of(ax)
    assert "largest free extent" not in labels and "largest free extent" not in ax.get_title()
    assert "rooms free" in ax.get_title()


def test_legend_swatches_are_the_guests_colours_drawn():
    cache = recorded(ContiguousKVCache(16, 64, policy="exact"))
    for i in range(12):
        cache.admit(f"r{i}", 10 + i, 20)
    ax = viz.plot_floor_plan(cache.trace)
    legend, labels = legend_of(ax)
    assert labels[0] == "tokens (one colour per guest)"
    swatches = {to_hex(p.get_facecolor()) for p in legend.findobj(Rectangle)}
    categories = {to_hex(COLORS[k]) for k in ("future", "internal", "vacant")} | {"#000000"}
    drawn = {guest_colors(cache.trace)[g] for g in cache.request_ids}
    assert len(swatches - categories) == 4 and swatches - categories <= drawn <= fills(ax)
    assert "largest free extent" in labels and to_hex(COLORS["future"]) in fills(ax)


def test_a_small_arena_names_its_bookings_and_outlines_the_largest_gap():
    arena = recorded(ArenaAllocator(64))
    for guest, beds in [("A", 20), ("B", 10), ("C", 20), ("D", 10)]:
        arena.allocate(guest, beds)
    arena.free("B")
    arena.free("D")
    with pytest.raises(OutOfSpace):
        arena.allocate("E", 16)
    ax = viz.plot_floor_plan(arena.trace, -1, beds_per_floor=16)
    assert {"A", "C"} <= {t.get_text() for t in ax.texts}
    _, labels = legend_of(ax)
    assert labels == ["A", "C", "free", "largest free extent"]
    assert "impossible allocation (E needs 16 beds)" in ax.get_title()


def test_bad_arguments_name_themselves():
    hotel = lab03_hotel()
    with pytest.raises(ValueError, match="index must be a frame in"):
        viz.plot_floor_plan(hotel.trace, 99)
    with pytest.raises(ValueError, match="beds_per_floor must be >= 1"):
        viz.plot_floor_plan(hotel.trace, beds_per_floor=-4)


def test_drawing_nothing_says_how_to_record():
    from kvlab.serving.replay import replay
    from kvlab.serving.workload import Request

    unrecorded = replay(ContiguousKVCache(1, 8), [Request(2, 2)])
    with pytest.raises(
        TypeError, match=r"trace is None: record one with replay\(..., record=True\)"
    ):
        viz.plot_floor_plan(unrecorded.trace)


def cached_hotel():
    """Alice left rooms 1 and 0 cached (last room first); bob holds rooms 2 and 3."""
    from kvlab.core.accounting import CacheState
    from kvlab.core.trace import Trace

    trace = Trace("paged", 8, 4)
    for tables, cached in [({"alice": (0, 1)}, ()), ({"bob": (2, 3)}, (1, 0))]:
        tokens = dict.fromkeys(tables, 7)
        state = CacheState("paged", 8, 4, tables, tokens, dict.fromkeys(tables, 8), {}, cached)
        trace.record("check-in", next(iter(tables)), 0.0, state)
    return trace


def test_cached_rooms_are_drawn_in_the_cached_colour_with_a_legend_entry():
    from kvlab.ui.widgets.palette import LEGEND

    ax = viz.plot_floor_plan(cached_hotel(), -1, beds_per_floor=16)
    cached = [
        p for p in ax.patches if p.get_hatch() and to_hex(p.get_edgecolor()) == COLORS["cached"]
    ]
    assert sorted((p.get_x(), p.get_y(), p.get_width()) for p in cached) == [(0, 0, 4), (4, 0, 4)]
    legend, labels = legend_of(ax)
    assert labels[-1] == LEGEND["cached"] and labels[:-1] == [
        "bob",
        "empty, for future tokens (answer lengths unknown)",
        "free",
    ]
    handle = legend.legend_handles[-1]
    assert handle.get_hatch() == "////" and to_hex(handle.get_edgecolor()) == COLORS["cached"]
    assert "6 rooms free (24 beds), 2 of them cached" in ax.get_title()
    plt.close("all")
    first = viz.plot_floor_plan(cached_hotel(), 0, beds_per_floor=16)  # nothing cached yet
    assert not any(p.get_hatch() for p in first.patches)
    assert "cached" not in " ".join(legend_of(first)[1])
    assert "cached" not in first.get_title()
