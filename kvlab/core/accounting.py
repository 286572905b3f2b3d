"""One accounting of the KV memory: every bed is used, reserved for the future, internal
fragmentation or free.

Every cache (contiguous, paged) and every recorded frame is split by :func:`usage`, so the plots,
the widget, the replay's measurements and the caches' own reports can never disagree.

Rooms a prefix cache keeps (no key card holds them, but their tokens may be reused) count as free:
any check-in can have them now, at the price of overwriting what they hold.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Usage:
    """A cache's memory split, in beds (token slots). ``used + future + internal + free == capacity``."""

    capacity: int
    used: int
    future: int
    internal: int
    free: int
    bytes_per_token: int | None = None

    PARTS = ("used", "future", "internal", "free")

    @property
    def booked(self) -> int:
        return self.used + self.future + self.internal

    def share(self, part: str) -> float:
        """A part's share of the whole cache (``"used"``, ``"future"``, ``"internal"``, ``"free"``)."""
        if part not in self.PARTS:
            raise ValueError(f"part must be one of {self.PARTS}, got {part!r}")
        return getattr(self, part) / self.capacity

    def in_bytes(self, part: str) -> int:
        if self.bytes_per_token is None:
            raise ValueError("this cache has no ModelSpec, so its token slots have no byte size")
        return getattr(self, part) * self.bytes_per_token


@dataclass(frozen=True)
class CacheState:
    """What a cache holds at one moment, in the terms every cache shares: per sequence, its block
    table (logical block i -> physical block; a ``range`` for a contiguous booking), the tokens
    it holds, the slots it has booked, and its final length when known (None: not known).

    ``num_blocks`` blocks of ``block_size`` slots; ``kind`` ("arena", "contiguous", "paged") tells
    whoever draws it whether bookings are contiguous.

    ``cached``: with prefix caching, the blocks no table holds that still keep a full block of
    tokens for a later sequence with the same prefix, in free-queue order (the first is
    overwritten first). They are free memory in :func:`usage`; the field only lets the pictures
    tell them apart.
    """

    kind: str
    num_blocks: int
    block_size: int
    block_tables: Mapping[Hashable, Sequence[int]]
    tokens: Mapping[Hashable, int]
    booked: Mapping[Hashable, int]
    final: Mapping[Hashable, int | None]
    cached: tuple[int, ...] = ()

    @property
    def capacity(self) -> int:
        return self.num_blocks * self.block_size


def split_waste(booked: int, tokens: int, final: int | None) -> tuple[int, int, int]:
    """One sequence's booking split into (used, reserved-for-future, internal fragmentation).

    Slots that will be written before the sequence leaves are reserved-for-future; the rest of the
    booking is never used. An unknown final length counts the whole unused booking as future.
    """
    will_hold = booked if final is None else min(final, booked)
    future = max(0, will_hold - tokens)
    return tokens, future, booked - tokens - future


def usage(
    capacity: int,
    block_size: int,
    booked: Mapping[Hashable, int],
    tokens: Mapping[Hashable, int],
    final: Mapping[Hashable, int | None],
    block_tables: Mapping[Hashable, Sequence[int]] | None = None,
    bytes_per_token: int | None = None,
) -> Usage:
    """The four-way split of a cache.

    Without ``block_tables`` (or when no block is on two tables) each sequence's booking is its
    own. A block shared by several tables counts once: its slots are used up to its fullest
    holder, and reserved for the future up to what any holder will still write.
    """
    if block_tables is None or not _shares_blocks(block_tables):
        used = future = internal = 0
        for seq_id, beds in booked.items():
            u, f, i = split_waste(beds, tokens[seq_id], final.get(seq_id))
            used, future, internal = used + u, future + f, internal + i
        free = capacity - used - future - internal
        return Usage(capacity, used, future, internal, free, bytes_per_token)
    filled: dict[int, int] = {}
    will_fill: dict[int, int] = {}
    for seq_id, table in block_tables.items():
        held, last = tokens[seq_id], final.get(seq_id)
        for i, block in enumerate(table):
            now = max(0, min(block_size, held - i * block_size))
            later = block_size if last is None else max(now, min(block_size, last - i * block_size))
            filled[block] = max(filled.get(block, 0), now)
            will_fill[block] = max(will_fill.get(block, 0), later)
    used, held_slots = sum(filled.values()), len(filled) * block_size
    future = sum(will_fill.values()) - used
    internal = held_slots - used - future
    return Usage(capacity, used, future, internal, capacity - held_slots, bytes_per_token)


def _shares_blocks(block_tables: Mapping[Hashable, Sequence[int]]) -> bool:
    tables = [t for t in block_tables.values() if not isinstance(t, range)]
    return sum(len(t) for t in tables) != len({block for t in tables for block in t})
