"""The one recorded trace type: frames of allocator state over time.

Whoever drives an allocator (the replay, a notebook cell) records its state with a
:class:`~kvlab.core.recorder.Recorder`; the allocators themselves keep no clock and no trace. The hotel
widget animates the :class:`Trace`, the plots read it, and tests check invariants on it.

Memory is ``num_blocks`` blocks (rooms) of ``block_size`` slots (beds). A frame holds each
sequence's block table (key card: logical block i -> physical block; a ``range`` for contiguous
bookings), how many slots hold tokens, how many are booked, and how many the sequence will have
used when done (if known). With prefix caching it also lists the cached rooms: free, but still
holding a past guest's tokens for a guest with the same prefix (first in line = overwritten first).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from kvlab.core.accounting import CacheState, Usage, usage
from kvlab.core.validate import positive_int

EVENTS = (
    "start",
    "check-in",
    "check-out",
    "step",
    "fork",
    "copy-on-write",
    "preemption",
    "eviction",  # cached rooms handed out: their old tokens are overwritten
    "impossible allocation",
    "out of memory",
)


@dataclass(frozen=True)
class Frame:
    event: str
    seq_id: Hashable | None  # the sequence (guest) the event is about
    time: float
    tables: dict[Hashable, Sequence[int]]  # block tables (key cards)
    tokens: dict[Hashable, int]  # slots holding tokens (beds)
    booked: dict[Hashable, int]  # slots reserved
    final: dict[Hashable, int | None]  # slots held when the sequence leaves (None: not known)
    note: str = ""
    cached: tuple[int, ...] = ()  # free rooms keeping tokens for a prefix, in free-queue order


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
    kind: str  # "arena", "contiguous", "paged"
    num_blocks: int
    block_size: int
    frames: list[Frame] = field(default_factory=list)

    def __post_init__(self):
        positive_int("num_blocks", self.num_blocks)
        positive_int("block_size", self.block_size)

    @property
    def capacity(self) -> int:
        """Beds in the whole hotel."""
        return self.num_blocks * self.block_size

    def __len__(self) -> int:
        return len(self.frames)

    def record(self, event: str, seq_id, time: float, state: CacheState, note: str = "") -> None:
        """Keep a frame of ``state`` (a cache's :class:`~kvlab.core.accounting.CacheState`)."""
        if event not in EVENTS:
            raise ValueError(f"event must be one of {EVENTS}, got {event!r}")
        cards = {
            s: t if isinstance(t, (range, tuple)) else tuple(t)
            for s, t in state.block_tables.items()
        }
        held = (state.tokens, state.booked, state.final)
        frame = Frame(event, seq_id, time, cards, *held, note, tuple(state.cached))
        self.frames.append(frame)

    def usage(self, index: int) -> Usage:
        """The frame's beds split into used / future / internal / free; a room on several key
        cards counts once (used up to its fullest holder)."""
        f = self.frames[index]
        return usage(self.capacity, self.block_size, f.booked, f.tokens, f.final, f.tables)

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
        if cursor < self.num_blocks:
            runs.append((cursor, self.num_blocks - cursor))
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
