"""The one recorded trace type: frames of allocator state over time.

Every allocator in kvlab (the contiguous arena, the max-length cache, the paged block manager, the
serving engine) can record a :class:`Trace`. The hotel widget animates it, the plots read it, and
tests check invariants on it.

Memory is ``num_rooms`` rooms of ``room_size`` beds (token slots). A frame holds each guest's key
card (logical room i -> physical room; a ``range`` for contiguous bookings), how many beds hold
tokens, how many are booked, and how many the guest will have used when done (if known).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from kvlab.validate import positive_int

EVENTS = (
    "start",
    "check-in",
    "check-out",
    "append",
    "step",
    "fork",
    "copy-on-write",
    "preemption",
    "impossible allocation",
    "out of memory",
)


@dataclass(frozen=True)
class Frame:
    event: str
    guest: Hashable | None
    time: float
    tables: dict[Hashable, Sequence[int]]  # key cards
    tokens: dict[Hashable, int]  # beds holding tokens
    booked: dict[Hashable, int]  # beds reserved
    final: dict[Hashable, int | None]  # beds held when the guest leaves (None: not known)
    note: str = ""


@dataclass(frozen=True)
class Usage:
    """A frame's memory split, in beds. ``used + future + internal + free == capacity``."""

    capacity: int
    used: int
    future: int
    internal: int
    free: int
    bytes_per_token: int | None = None

    @property
    def booked(self) -> int:
        return self.used + self.future + self.internal

    PARTS = ("used", "future", "internal", "free")

    def share(self, part: str) -> float:
        """A part's share of the whole hotel (``"used"``, ``"future"``, ``"internal"``, ``"free"``)."""
        if part not in self.PARTS:
            raise ValueError(f"part must be one of {self.PARTS}, got {part!r}")
        return getattr(self, part) / self.capacity

    def in_bytes(self, part: str) -> int:
        if self.bytes_per_token is None:
            raise ValueError("this cache has no ModelSpec, so beds have no byte size")
        return getattr(self, part) * self.bytes_per_token


def split_waste(booked: int, tokens: int, final: int | None) -> tuple[int, int, int]:
    """One guest's booking split into (used, reserved-for-future, internal fragmentation).

    Beds that will be written before the guest leaves are reserved-for-future; the rest of the
    booking is never used. An unknown final length counts the whole unused booking as future.
    """
    will_hold = booked if final is None else min(final, booked)
    future = max(0, will_hold - tokens)
    return tokens, future, booked - tokens - future


def intervals(table: Sequence[int]) -> list[tuple[int, int]]:
    """A key card's rooms as sorted ``(start, length)`` runs of adjacent rooms."""
    if isinstance(table, range) and table.step == 1:
        return [(table.start, len(table))] if len(table) else []
    runs: list[tuple[int, int]] = []
    for room in sorted(set(table)):
        if runs and runs[-1][0] + runs[-1][1] == room:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((room, 1))
    return runs


@dataclass
class Trace:
    kind: str  # "arena", "contiguous", "paged", "serve"
    num_rooms: int
    room_size: int
    frames: list[Frame] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        positive_int("num_rooms", self.num_rooms)
        positive_int("room_size", self.room_size)

    @property
    def capacity(self) -> int:
        """Beds in the whole hotel."""
        return self.num_rooms * self.room_size

    def __len__(self) -> int:
        return len(self.frames)

    def record(self, event: str, guest, time: float, tables, tokens, booked, final, note=""):
        if event not in EVENTS:
            raise ValueError(f"event must be one of {EVENTS}, got {event!r}")
        cards = {g: t if isinstance(t, (range, tuple)) else tuple(t) for g, t in tables.items()}
        self.frames.append(
            Frame(event, guest, time, cards, dict(tokens), dict(booked), dict(final), note)
        )

    def usage(self, index: int) -> Usage:
        """The frame's beds split into used / future / internal / free; a room on several key
        cards counts once (used up to its fullest holder)."""
        frame = self.frames[index]
        lists = [t for t in frame.tables.values() if not isinstance(t, range)]
        held = sum(len(t) for t in lists)
        if held == len({room for t in lists for room in t}):  # no room is shared
            used = future = internal = 0
            for guest, booked in frame.booked.items():
                u, f, i = split_waste(booked, frame.tokens[guest], frame.final.get(guest))
                used, future, internal = used + u, future + f, internal + i
            return Usage(
                self.capacity, used, future, internal, self.capacity - used - future - internal
            )
        size = self.room_size
        filled: dict[int, int] = {}
        will_fill: dict[int, int] = {}
        for guest, table in frame.tables.items():
            tokens, final = frame.tokens[guest], frame.final.get(guest)
            for i, room in enumerate(table):
                now = max(0, min(size, tokens - i * size))
                later = size if final is None else max(now, min(size, final - i * size))
                filled[room] = max(filled.get(room, 0), now)
                will_fill[room] = max(will_fill.get(room, 0), later)
        used, booked = sum(filled.values()), len(filled) * size
        future = sum(will_fill.values()) - used
        return Usage(self.capacity, used, future, booked - used - future, self.capacity - booked)

    def free_runs(self, index: int) -> list[tuple[int, int]]:
        """Runs of adjacent free rooms ``(start, length)`` in a frame."""
        taken = sorted(
            run for table in self.frames[index].tables.values() for run in intervals(table)
        )
        runs, cursor = [], 0
        for start, length in taken:
            if start > cursor:
                runs.append((cursor, start - cursor))
            cursor = max(cursor, start + length)
        if cursor < self.num_rooms:
            runs.append((cursor, self.num_rooms - cursor))
        return runs

    def ref_counts(self, index: int) -> dict[int, int]:
        """Room -> number of key cards holding it (rooms held by nobody are absent)."""
        counts: dict[int, int] = {}
        for table in self.frames[index].tables.values():
            for room in table:
                counts[room] = counts.get(room, 0) + 1
        return counts

    def times(self) -> list[float]:
        return [f.time for f in self.frames]

    def events(self, event: str) -> list[int]:
        """Indices of the frames recording ``event``."""
        return [i for i, f in enumerate(self.frames) if f.event == event]
