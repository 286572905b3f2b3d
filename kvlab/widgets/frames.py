"""Turn a recorded :class:`~kvlab.trace.Trace` into the compact, JSON-ready frames the hotel widget
and its SVG fallback draw.

Everything is expressed in display rooms. A paged trace keeps its own rooms. A contiguous trace
(one bed per trace room) is grouped into rooms of ``room_size`` beds; a room that two bookings
share at their boundary is drawn for the booking holding more of its beds.
"""

from __future__ import annotations

from kvlab.trace import Trace, intervals, split_waste
from kvlab.validate import positive_int
from kvlab.viz import guest_color

MAX_DISPLAY_ROOMS = 4096


def default_room_size(trace: Trace) -> int:
    """The trace's own rooms, or for a bed-granular trace the smallest power of two that keeps the
    hotel within 2,048 display rooms."""
    if trace.room_size > 1 or trace.num_rooms <= 2048:
        return 1
    size = 1
    while -(-trace.num_rooms // size) > 2048:
        size *= 2
    return size


def _runs(rooms: list[int]) -> list[int]:
    """Rooms as flat run-length pairs ``[start, length, start, length, ...]`` (order kept)."""
    flat: list[int] = []
    for room in rooms:
        if flat and flat[-2] + flat[-1] == room:
            flat[-1] += 1
        else:
            flat += [room, 1]
    return flat


def _validate(trace: Trace) -> None:
    if not isinstance(trace, Trace):
        raise TypeError(f"trace must be a kvlab.trace.Trace, got {type(trace).__name__}")
    if not trace.frames:
        raise ValueError("trace has no frames: record an allocator (record=True) before drawing it")
    for index, frame in enumerate(trace.frames):
        for guest, table in frame.tables.items():
            for start, length in intervals(table):
                if start < 0 or start + length > trace.num_rooms:
                    raise ValueError(
                        f"frame {index}: guest {guest!r} holds room {start + length - 1}, but the "
                        f"hotel has rooms 0..{trace.num_rooms - 1}"
                    )


def _cards(trace: Trace, frame, group: int) -> list[tuple]:
    """Per guest: (guest, display rooms in logical order, first bed offset, tokens)."""
    if group == 1:
        return [(g, list(t), 0, frame.tokens[g]) for g, t in frame.tables.items()]
    bookings = []
    for guest, table in frame.tables.items():
        ((start, length),) = intervals(table) or [(0, 0)]
        bookings.append((guest, start, length))
    owner: dict[int, tuple[int, object]] = {}
    for guest, start, length in bookings:
        for room in range(start // group, (start + length - 1) // group + 1):
            share = min(start + length, (room + 1) * group) - max(start, room * group)
            if room not in owner or share > owner[room][0]:
                owner[room] = (share, guest)
    cards = []
    for guest, start, length in bookings:
        rooms = [
            r
            for r in range(start // group, (start + length - 1) // group + 1)
            if owner[r][1] == guest
        ]
        # where the guest's first bed lies relative to its first drawn room (negative when the
        # booking's first room is drawn for the neighbour)
        offset = start - rooms[0] * group if rooms else 0
        cards.append((guest, rooms, offset, frame.tokens[guest]))
    return cards


def encode(
    trace: Trace, room_size: int | None = None, steps_only: bool = False, every: int = 1
) -> dict:
    """The widget's data: rooms, guests with colours, and per-frame key cards and metrics.

    ``steps_only`` keeps one frame per replay step (dropping check-in/check-out frames), so two
    replays line up frame by frame; ``every`` keeps every n-th of the remaining frames.
    """
    _validate(trace)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"every must be an int >= 1, got {every!r}")
    if room_size is not None:
        positive_int("room_size", room_size)
    chosen = [i for i, f in enumerate(trace.frames) if not steps_only or f.event == "step"]
    chosen = chosen[::every]
    if not chosen:
        raise ValueError("no frames left to draw: the trace has no 'step' frames")
    if trace.room_size > 1:  # a paged trace is drawn in its own rooms
        if room_size not in (None, trace.room_size):
            raise ValueError(
                f"room_size must be {trace.room_size} (the trace's block size) for this trace, got {room_size}"
            )
        group = 1
    else:
        group = default_room_size(trace) if room_size is None else room_size
    rooms = -(-trace.num_rooms // group)
    if rooms > MAX_DISPLAY_ROOMS:
        raise ValueError(f"{rooms} display rooms is too many to draw; pass a larger room_size")
    beds_per_room = trace.room_size * group
    guests: list = []
    index: dict = {}
    frames = []
    for i in chosen:
        frame = trace.frames[i]
        cards = []
        held: set[int] = set()
        for guest, card_rooms, offset, tokens in _cards(trace, frame, group):
            if guest not in index:
                index[guest] = len(guests)
                guests.append(guest)
            cards.append([index[guest], _runs(card_rooms), offset, tokens])
            held.update(card_rooms)
        usage = trace.usage(i)
        free_runs = trace.free_runs(i)
        largest = max((length for _, length in free_runs), default=0)
        frames.append(
            {
                "event": frame.event,
                "guest": None if frame.guest is None else str(frame.guest),
                "time": round(frame.time, 3),
                "note": frame.note,
                "cards": cards,
                "metrics": {
                    "rooms_used": len(held),
                    "beds_used": usage.used,
                    "utilization": round(usage.used / usage.capacity, 4),
                    "largest_free_run": largest * trace.room_size,
                },
            }
        )
    return {
        "kind": trace.kind,
        "num_rooms": rooms,
        "beds_per_room": beds_per_room,
        "capacity": trace.capacity,
        "guests": [str(g) for g in guests],
        "colors": [guest_color(g) for g in guests],
        "frames": frames,
    }


def room_states(data: dict, step: int) -> list[tuple[int, int, int]]:
    """Per display room: (guest index or -1, beds holding tokens, key cards holding it).

    The same arithmetic as the widget's JavaScript, used for the SVG fallback and the tests.
    """
    size = data["beds_per_room"]
    state = [[-1, 0, 0] for _ in range(data["num_rooms"])]
    for guest, runs, offset, tokens in data["frames"][step]["cards"]:
        logical = 0
        for start, length in zip(runs[::2], runs[1::2], strict=True):
            for room in range(start, start + length):
                # beds [offset, offset + tokens) of the guest's drawn rooms hold tokens
                lo, hi = logical * size, (logical + 1) * size
                used = max(0, min(hi, offset + tokens) - max(lo, offset))
                cell = state[room]
                if cell[0] == -1:
                    cell[0] = guest
                cell[1] = max(cell[1], used)
                cell[2] += 1
                logical += 1
    return [tuple(cell) for cell in state]


__all__ = ["default_room_size", "encode", "room_states", "split_waste"]
