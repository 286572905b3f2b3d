"""Turn a recorded :class:`~kvlab.core.trace.Trace` into the compact, JSON-ready frames the hotel widget
and its SVG fallback draw.

Everything is expressed in display rooms. A paged trace keeps its own rooms. A contiguous trace
(one bed per trace room) is grouped into rooms of ``room_size`` beds; a room that two bookings
share at their boundary is drawn for the booking holding more of its beds.

A player shows steps 1..n; ``schedule[step - 1]`` is the frame a hotel shows at that step, so
hotels played side by side stay in step, and one that finishes first holds its last frame.

Cached rooms (prefix caching: free, still holding a past guest's tokens) travel only in traces
that have some, so the data of every other trace stays as it was.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from kvlab.core.accounting import split_waste
from kvlab.core.trace import Trace, intervals
from kvlab.core.validate import positive_int
from kvlab.ui.widgets.palette import COLORS, LEGEND, guest_colors

MAX_DISPLAY_ROOMS = 4096
# Frames a lesson is about, most telling first: sampling keeps them, the static picture shows one.
KEY_EVENTS = (
    "impossible allocation",
    "out of memory",
    "preemption",
    "eviction",
    "copy-on-write",
    "fork",
)


class RoomState(NamedTuple):
    """One drawn room: its guest (index, -1 when free), its beds by kind, and its key cards."""

    guest: int
    used: int
    future: int
    internal: int
    refs: int


def default_room_size(trace: Trace) -> int:
    """The trace's own rooms, or for a bed-granular trace the smallest power of two that keeps the
    hotel within 2,048 display rooms."""
    if trace.block_size > 1 or trace.num_blocks <= 2048:
        return 1
    size = 1
    while -(-trace.num_blocks // size) > 2048:
        size *= 2
    return size


def display_group(trace: Trace, room_size: int | None = None) -> int:
    """How many trace rooms make one drawn room: a paged trace keeps its own rooms; a contiguous
    one is drawn in rooms of ``room_size`` beds (by default :func:`default_room_size`)."""
    if room_size is not None:
        positive_int("room_size", room_size)
    if trace.block_size > 1:
        if room_size not in (None, trace.block_size):
            raise ValueError(
                f"room_size must be {trace.block_size} (the trace's block size) for this trace, got {room_size}"
            )
        return 1
    return default_room_size(trace) if room_size is None else room_size


def is_paged(trace: Trace) -> bool:
    """Paged traces have key cards of rooms; contiguous ones have one booking per guest."""
    return trace.kind not in ("arena", "contiguous")


def _runs(rooms: list[int]) -> list[int]:
    """Rooms as flat run-length pairs ``[start, length, start, length, ...]`` (order kept)."""
    flat: list[int] = []
    for room in rooms:
        if flat and flat[-2] + flat[-1] == room:
            flat[-1] += 1
        else:
            flat += [room, 1]
    return flat


def _cached_runs(rooms: list[tuple[int, int]]) -> list[int]:
    """Cached ``(room, guest who left it)`` pairs, in free-queue order, as flat triples
    ``[start, length, guest, ...]``: a run is adjacent rooms left by one guest, ascending, or
    descending with a negative length (a guest checks out last room first)."""
    flat: list[int] = []
    for room, guest in rooms:
        if flat and flat[-1] == guest:
            start, length = flat[-3], flat[-2]
            if room == start + length:  # the next room of the run, either way
                flat[-2] += 1 if length > 0 else -1
                continue
            if length == 1 and room == start - 1:
                flat[-2] = -2
                continue
        flat += [room, 1, guest]
    return flat


def cached_rooms(data: dict, frame: int) -> dict[int, int]:
    """Cached display rooms of one frame -> the guest (index) who left each (-1: cached before
    the recording began), in free-queue order: the first is overwritten first. The same
    decoding as the widget's JavaScript."""
    flat = data["frames"][frame].get("cached", [])
    rooms: dict[int, int] = {}
    for start, length, guest in zip(flat[::3], flat[1::3], flat[2::3], strict=True):
        step = 1 if length > 0 else -1
        for k in range(abs(length)):
            rooms.setdefault(start + step * k, guest)
    return rooms


def _left_by(trace: Trace, chosen: list[int]) -> dict[int, list]:
    """Per chosen frame with cached rooms: the guest who last held each of them, in free-queue
    order (None when no frame shows one)."""
    wanted = {i for i in chosen if trace.frames[i].cached}
    holder: dict = {}
    previous = None
    left_by = {}
    for i, frame in enumerate(trace.frames[: max(wanted, default=-1) + 1]):
        if frame.tables != previous:  # a decode step that took no new room changes nobody
            previous = frame.tables
            for guest, table in frame.tables.items():
                for room in table:
                    holder[room] = guest
        if i in wanted:
            left_by[i] = [holder.get(room) for room in frame.cached]
    return left_by


def block_table_text(runs: list[int]) -> str:
    """A key card as ranges of consecutive rooms, in key-card order: ``"642–689, 700, 702–705"``.
    The widget's JavaScript writes the same text."""
    parts = []
    for start, length in zip(runs[::2], runs[1::2], strict=True):
        parts.append(str(start) if length == 1 else f"{start}–{start + length - 1}")
    return ", ".join(parts)


RECORD_HOW = (
    "record one with replay(..., record=True) (then result.trace), recorded(cache) from kvlab.core.recorder "
    "(then .trace), or Recorder(cache).trace for the cache as it is now"
)


def check_trace(trace: Trace, name: str = "trace") -> None:
    """Refuse what the browser could not draw, naming the argument."""
    if trace is None:
        raise TypeError(f"{name} is None: {RECORD_HOW}")
    if not isinstance(trace, Trace):
        raise TypeError(f"{name} must be a kvlab.core.trace.Trace, got {type(trace).__name__}")
    if not trace.frames:
        raise ValueError(
            f"{name} has no frames: record a cache (kvlab.core.recorder) before drawing it"
        )
    previous = None
    for index, frame in enumerate(trace.frames):
        if frame.cached and not 0 <= min(frame.cached) <= max(frame.cached) < trace.num_blocks:
            raise ValueError(
                f"frame {index}: cached rooms {frame.cached} must lie in the hotel's rooms "
                f"0..{trace.num_blocks - 1}"
            )
        if frame.tables == previous:
            continue
        previous = frame.tables
        for guest, table in frame.tables.items():
            for start, length in intervals(table):
                if start < 0 or start + length > trace.num_blocks:
                    raise ValueError(
                        f"frame {index}: guest {guest!r} holds room {start + length - 1}, but the "
                        f"hotel has rooms 0..{trace.num_blocks - 1}"
                    )


def _cards(trace: Trace, frame, group: int) -> list[list]:
    """Per guest: (guest, display rooms in key-card order, first bed offset, beds used, beds
    reserved for future tokens, beds never used)."""
    cards = []
    for guest, table in frame.tables.items():
        used, future, internal = split_waste(
            frame.booked[guest], frame.tokens[guest], frame.final.get(guest)
        )
        cards.append([guest, table, 0, used, future, internal])
    if group == 1:
        return [[g, list(t), *rest] for g, t, *rest in cards]
    owner: dict[int, tuple[int, object]] = {}
    spans = {}
    for card in cards:
        ((start, length),) = intervals(card[1]) or [(0, 0)]
        spans[card[0]] = (start, length)
        for room in range(start // group, (start + length - 1) // group + 1):
            share = min(start + length, (room + 1) * group) - max(start, room * group)
            if room not in owner or share > owner[room][0]:
                owner[room] = (share, card[0])
    for card in cards:
        start, length = spans[card[0]]
        rooms = [
            r
            for r in range(start // group, (start + length - 1) // group + 1)
            if owner[r][1] == card[0]
        ]
        # where the guest's first bed lies relative to its first drawn room (negative when the
        # booking's first room is drawn for the neighbour)
        card[1], card[2] = rooms, start - rooms[0] * group if rooms else 0
    return cards


def _check_every(every) -> None:
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"every must be an int >= 1, got {every!r}")


def sample_frames(trace: Trace, every: int = 1, steps_only: bool = False) -> list[int]:
    """Indices of the frames to draw: every ``every``-th, the last one, and the first frame of each
    key event per guest (Lab 02's first impossible allocation survives any ``every``)."""
    _check_every(every)
    chosen = [i for i, f in enumerate(trace.frames) if not steps_only or f.event == "step"]
    if not chosen:
        raise ValueError("no frames left to draw: the trace has no 'step' frames")
    keep = set(chosen[::every]) | {chosen[-1]}
    seen = set()
    for i in chosen:
        frame = trace.frames[i]
        if frame.event in KEY_EVENTS and (frame.event, frame.seq_id) not in seen:
            seen.add((frame.event, frame.seq_id))
            keep.add(i)
    return sorted(keep)


def align(traces: list[Trace], every: int = 1, steps_only: bool = True) -> list[list[int]]:
    """One schedule per trace (the frame each shows at every player step), all the same length.

    Per-step frames line up by time, so hotels that skip ahead at different moments stay in
    step; other frames line up by position. A trace that ends first holds its last frame, and the
    player runs until the last frame of the longest.
    """
    _check_every(every)
    if not steps_only:
        sampled = [sample_frames(t, every) for t in traces]
        length = max(map(len, sampled))
        return [[s[min(k, len(s) - 1)] for k in range(length)] for s in sampled]
    frames = [sample_frames(t, 1, steps_only=True) for t in traces]
    times = [[round(t.frames[i].time, 9) for i in f] for t, f in zip(traces, frames, strict=True)]
    timeline = sorted({time for ts in times for time in ts})
    kept = set(timeline[::every]) | {ts[-1] for ts in times}
    timeline = [time for time in timeline if time in kept]
    schedules = []
    for f, ts in zip(frames, times, strict=True):
        schedule, j = [], 0
        for time in timeline:
            while j + 1 < len(ts) and ts[j + 1] <= time:
                j += 1
            schedule.append(f[j])
        schedules.append(schedule)
    return schedules


def _metrics(trace: Trace, index: int, cards: list) -> dict:
    """What the header says about a frame; ``cards`` as :func:`_cards` returns them."""
    usage = trace.usage(index)
    runs = trace.free_runs(index)
    largest = max((length for _, length in runs), default=0) * trace.block_size
    held = [room for card in cards for room in card[1]]
    distinct = set(held)
    shared = 0 if len(held) == len(distinct) else sum(1 for n in Counter(held).values() if n > 1)
    return {
        "guests": len(cards),
        "rooms_used": len(distinct),
        "rooms_shared": shared,
        "beds_used": usage.used,
        "percent_used": round(100 * usage.used / usage.capacity, 1),  # shown as is everywhere
        # under paging any free room serves any guest: the largest run of them means nothing
        "largest_free_run": None if is_paged(trace) else largest,
    }


def encode(
    trace: Trace,
    room_size: int | None = None,
    steps_only: bool = False,
    every: int = 1,
    schedule: list[int] | None = None,
    colors: dict | None = None,
) -> dict:
    """The widget's data: rooms, guests with colours, per-frame key cards and metrics, and the
    schedule of frames per player step.

    ``steps_only`` keeps one frame per replay step (dropping check-in/check-out frames); ``every``
    keeps every n-th of those, plus the frames of :data:`KEY_EVENTS`. A ``schedule`` (trace frame
    indices, one per player step, from :func:`align`) replaces both. ``colors`` (guest ->
    colour) shares one colouring between hotels shown together.
    """
    check_trace(trace)
    if schedule is None:
        schedule = sample_frames(trace, every, steps_only)
    if not schedule or not all(0 <= i < len(trace.frames) for i in schedule):
        raise ValueError(f"schedule must list frames in 0..{len(trace.frames) - 1}")
    group = display_group(trace, room_size)
    rooms = -(-trace.num_blocks // group)
    if rooms > MAX_DISPLAY_ROOMS:
        raise ValueError(f"{rooms} display rooms is too many to draw; pass a larger room_size")
    colors = guest_colors(trace, group) if colors is None else colors
    chosen = sorted(set(schedule))
    position = {i: k for k, i in enumerate(chosen)}
    guests: list = []
    index: dict = {}

    def guest_index(guest) -> int:
        if guest not in index:
            index[guest] = len(guests)
            guests.append(guest)
        return index[guest]

    left_by = _left_by(trace, chosen)
    frames = []
    for i in chosen:
        frame = trace.frames[i]
        raw = _cards(trace, frame, group)
        cards = [[guest_index(g), _runs(r), *rest] for g, r, *rest in raw]
        encoded = {
            "event": frame.event,
            "guest": None if frame.seq_id is None else str(frame.seq_id),
            "time": round(frame.time, 3),
            "note": frame.note,
            "cards": cards,
            "metrics": _metrics(trace, i, raw),
        }
        if left_by:
            cached: dict[int, int] = {}
            for room, guest in zip(frame.cached, left_by.get(i, ()), strict=True):
                cached.setdefault(room // group, -1 if guest is None else guest_index(guest))
            encoded["cached"] = _cached_runs(list(cached.items()))
            encoded["metrics"]["rooms_cached"] = len(cached)
        frames.append(encoded)
    data = {
        "kind": trace.kind,
        "paged": is_paged(trace),
        "num_rooms": rooms,
        "beds_per_room": trace.block_size * group,
        "capacity": trace.capacity,
        "guests": [str(g) for g in guests],
        "colors": [colors[g] for g in guests],
        "palette": {k: COLORS[k] for k in ("future", "internal", "vacant", "edge", "shared")},
        "legend": {k: LEGEND[k] for k in ("used", "future", "internal", "free", "shared")},
        "has_shared": any(f["metrics"]["rooms_shared"] for f in frames),
        # legend entries only for what some frame shows; a clock only where the driver kept one
        "has_future": any(card[4] for f in frames for card in f["cards"]),
        "has_internal": any(card[5] for f in frames for card in f["cards"]),
        "timed": len({f["time"] for f in frames}) > 1,
        "frames": frames,
        "schedule": [position[i] for i in schedule],
    }
    if any(trace.frames[i].final.get(g) is None for i in chosen for g in trace.frames[i].tables):
        data["legend"]["future"] = LEGEND["future_unknown"]
    if left_by:
        data["has_cached"] = True
        data["palette"]["cached"] = COLORS["cached"]
        data["legend"]["cached"] = LEGEND["cached"]
    return data


def frame_at(data: dict, step: int) -> int:
    """The frame a hotel shows at player step ``step`` (1-based)."""
    return data["schedule"][step - 1]


def room_states(data: dict, frame: int) -> list[RoomState]:
    """Per display room of one frame: guest, beds used / reserved for future / never used, and the
    number of key cards holding it. The same arithmetic as the widget's JavaScript.

    A room on several key cards is drawn for its first holder and counts its beds once, filled up
    to its fullest holder (as :meth:`Trace.usage` counts them).
    """
    size = data["beds_per_room"]
    state = [[-1, 0, 0, 0, 0] for _ in range(data["num_rooms"])]  # guest, used, will, booked, refs
    for guest, runs, offset, used, future, internal in data["frames"][frame]["cards"]:
        logical = 0
        for start, length in zip(runs[::2], runs[1::2], strict=True):
            for room in range(start, start + length):
                lo = logical * size
                cell = state[room]
                if cell[0] == -1:
                    cell[0] = guest
                for k, end in ((1, used), (2, used + future), (3, used + future + internal)):
                    # beds [offset, offset + end) of the guest's drawn rooms
                    cell[k] = max(cell[k], max(0, min(lo + size, offset + end) - max(lo, offset)))
                cell[4] += 1
                logical += 1
    return [RoomState(g, u, w - u, b - w, refs) for g, u, w, b, refs in state]


def key_step(hotels: list[dict]) -> int:
    """The player step worth a static picture (1-based): the first key event (an impossible
    allocation first), else the step where the hotels together hold the most tokens."""
    length = len(hotels[0]["schedule"])
    shown = [[data["frames"][frame_at(data, s)] for data in hotels] for s in range(1, length + 1)]
    for event in KEY_EVENTS:
        for step, frames in enumerate(shown, 1):
            if any(f["event"] == event for f in frames):
                return step
    totals = [sum(f["metrics"]["percent_used"] for f in frames) for frames in shown]
    return totals.index(max(totals)) + 1


__all__ = [
    "KEY_EVENTS",
    "RoomState",
    "align",
    "block_table_text",
    "cached_rooms",
    "check_trace",
    "default_room_size",
    "display_group",
    "encode",
    "frame_at",
    "key_step",
    "room_states",
    "sample_frames",
]
