"""Contiguous KV caches: every guest books one unbroken stretch of beds up front.

``ArenaAllocator`` places variable-size bookings in one linear arena (first-fit or best-fit) and
measures the external fragmentation that follows. ``ContiguousKVCache`` books each request by a
reservation policy from the PagedAttention paper's baselines (Orca-Max, Orca-Pow2, Orca-Oracle) and
accounts for every bed: used, reserved-for-future, internal fragmentation, free.
"""

from __future__ import annotations

from collections.abc import Hashable

from kvlab.core.accounting import CacheState, Usage, usage
from kvlab.core.cache_kinds import POLICIES, booking_policy
from kvlab.core.cache_kinds import POLICY_PAPER_NAMES as PAPER_NAMES  # by booking policy
from kvlab.core.errors import OutOfMemory, OutOfSpace, ReservationFull
from kvlab.core.kv_memory import kv_layers
from kvlab.core.validate import positive_int

PLACEMENTS = ("first_fit", "best_fit")


def first_fit(free_extents: list[tuple[int, int]], n: int) -> int | None:
    """Offset of the lowest free extent holding ``n`` beds, or None."""
    for offset, length in free_extents:
        if length >= n:
            return offset
    return None


def best_fit(free_extents: list[tuple[int, int]], n: int) -> int | None:
    """Offset of the smallest free extent holding ``n`` beds (lowest offset on ties), or None."""
    fits = [(length, offset) for offset, length in free_extents if length >= n]
    return min(fits)[1] if fits else None


def external_fragmentation(free_extents: list[tuple[int, int]]) -> float:
    """1 - largest free extent / total free: 0 when all free space is one piece (or none is free)."""
    total = sum(length for _, length in free_extents)
    if total == 0:
        return 0.0
    return 1.0 - max(length for _, length in free_extents) / total


def _check_id(request_id) -> None:
    if not isinstance(request_id, Hashable):
        raise TypeError(f"request_id must be hashable, got {type(request_id).__name__}")


class ArenaAllocator:
    """Variable-size contiguous bookings in one linear arena of ``capacity_tokens`` beds."""

    prefix_caching = False  # every booking is its own: nothing is shared or found cached

    def __init__(self, capacity_tokens: int, placement: str = "first_fit"):
        self.capacity = positive_int("capacity_tokens", capacity_tokens)
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        self.placement = placement
        self._free: list[tuple[int, int]] = [(0, self.capacity)]  # sorted by offset, never adjacent
        self._bookings: dict[Hashable, tuple[int, int]] = {}
        self.impossible_allocations = 0
        self.failed_allocations = 0

    # --- queries ---------------------------------------------------------------------------
    def free_extents(self) -> list[tuple[int, int]]:
        return list(self._free)

    @property
    def total_free(self) -> int:
        return sum(length for _, length in self._free)

    @property
    def largest_free_extent(self) -> int:
        return max((length for _, length in self._free), default=0)

    @property
    def external_fragmentation(self) -> float:
        return external_fragmentation(self._free)

    @property
    def bookings(self) -> dict[Hashable, tuple[int, int]]:
        """request_id -> (offset, length)."""
        return dict(self._bookings)

    def booking(self, request_id) -> tuple[int, int]:
        """(offset, length) of one booking (KeyError if there is none)."""
        return self._bookings[request_id]

    def __contains__(self, request_id) -> bool:
        return request_id in self._bookings

    def can_allocate(self, n: int) -> bool:
        return self._choose(positive_int("n", n)) is not None

    def refusal(self, n: int) -> OutOfSpace | None:
        """What :meth:`allocate` would raise for ``n`` beds now, or None (nothing changes)."""
        if self._choose(positive_int("n", n)) is not None:
            return None
        return self._out_of_space(n)

    def _out_of_space(self, n: int) -> OutOfSpace:
        total, largest = self.total_free, self.largest_free_extent
        return OutOfSpace(
            f"no free extent holds {n} slots (largest free extent {largest}, {total} free in total)",
            needed=n,
            total_free=total,
            largest_free=largest,
        )

    def state(self) -> CacheState:
        """Bookings as block tables of one-bed blocks (what a recorder keeps)."""
        tables = {g: range(o, o + n) for g, (o, n) in self._bookings.items()}
        sizes = {g: n for g, (_, n) in self._bookings.items()}
        return CacheState("arena", self.capacity, 1, tables, sizes, sizes, sizes)

    # --- changes ---------------------------------------------------------------------------
    def _choose(self, n: int) -> int | None:
        return (first_fit if self.placement == "first_fit" else best_fit)(self._free, n)

    def allocate(self, request_id, n: int) -> int:
        """Book ``n`` adjacent beds for ``request_id``; return the offset of the first."""
        _check_id(request_id)
        positive_int("n", n)
        if request_id in self._bookings:
            raise ValueError(f"request_id {request_id!r} already holds a booking")
        offset = self._choose(n)
        if offset is None:
            refusal = self._out_of_space(n)
            self.failed_allocations += 1
            self.impossible_allocations += refusal.impossible
            raise refusal
        i = next(i for i, (start, _) in enumerate(self._free) if start == offset)
        start, length = self._free[i]
        if length == n:
            del self._free[i]
        else:
            self._free[i] = (start + n, length - n)
        self._bookings[request_id] = (offset, n)
        return offset

    def free(self, request_id) -> None:
        """Release a booking, merging it with free neighbours."""
        if request_id not in self._bookings:
            raise KeyError(f"request_id {request_id!r} holds no booking")
        offset, n = self._bookings.pop(request_id)
        free = self._free
        i = next((i for i, (start, _) in enumerate(free) if start > offset), len(free))
        start, length = offset, n
        if i < len(free) and free[i][0] == offset + n:  # merge with the extent after
            length += free.pop(i)[1]
        if i > 0 and free[i - 1][0] + free[i - 1][1] == offset:  # and the one before
            start, prev_length = free.pop(i - 1)
            length += prev_length
            i -= 1
        free.insert(i, (start, length))


def next_power_of_two(n: int) -> int:
    return 1 << (positive_int("n", n) - 1).bit_length()


def booking_size(policy: str, prompt_len: int, output_len: int | None, max_seq_len: int) -> int:
    """Beds a reservation policy books for one request (at most ``max_seq_len``).

    ``"pow2"`` follows the paper's Orca (Pow2) (Kwon et al. 2023, §6.1): the answer's length is
    over-reserved to the next power of two (25 tokens book 32), the prompt goes on top, and the
    buddy allocator those baselines place bookings with hands out a power-of-two block for the
    sum. Placement here stays first fit: the rounding is modelled, the buddy's alignment is not.
    ``"oracle"`` (also accepted as ``"exact"``) books exactly the final length.
    """
    policy = booking_policy(policy)
    if policy == "max":
        return max_seq_len
    if output_len is None:
        raise ValueError(
            f"policy {policy!r} needs output_len (it assumes the true length is known)"
        )
    if policy == "oracle":
        return prompt_len + output_len
    reserved = prompt_len + (next_power_of_two(output_len) if output_len else 0)
    return min(max_seq_len, next_power_of_two(reserved))


class ContiguousKVCache:
    """Each admitted request books one contiguous stretch sized by ``policy``.

    Capacity is ``num_slots x max_seq_len`` beds. With the ``"max"`` policy every booking is a whole
    slot of ``max_seq_len`` beds (Orca-Max), so exactly ``num_slots`` requests fit. ``"pow2"`` and
    ``"oracle"`` (Orca-Oracle; ``"exact"`` is accepted as its old name) book less, placing the
    bookings in an :class:`ArenaAllocator` over the same memory. ``capacity_tokens`` (accounts
    only) sizes the memory in beds instead, for comparisons on equal memory that is not a whole
    number of slots. With a ``spec``, real K and V tensors
    ``[num_slots, max_seq_len, kv_heads, head_dim]`` per layer back the beds; without one the
    cache only keeps the accounts (the tensors come from :mod:`kvlab.core.kv_memory`;
    :class:`kvlab.kv.tensors.ContiguousStore` writes and reads them).
    """

    prefix_caching = False  # kvlab.serving.interfaces.KVCache: never shares a prompt's K/V

    def __init__(
        self,
        num_slots: int,
        max_seq_len: int,
        spec=None,
        policy: str = "max",
        placement: str = "first_fit",
        *,
        capacity_tokens: int | None = None,
    ):
        self.num_slots = positive_int("num_slots", num_slots)
        self.max_seq_len = positive_int("max_seq_len", max_seq_len)
        if capacity_tokens is None:
            capacity_tokens = num_slots * max_seq_len
        elif spec is not None:
            raise ValueError("capacity_tokens is for accounts only; with a spec give num_slots")
        positive_int("capacity_tokens", capacity_tokens)
        policy = booking_policy(policy)
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        self.policy = policy
        self.spec = spec
        self.arena = ArenaAllocator(capacity_tokens, placement)
        self._tokens: dict[Hashable, int] = {}
        self._final: dict[Hashable, int | None] = {}
        self.k = self.v = None
        if spec is not None:
            self.k, self.v = kv_layers(spec, (num_slots, max_seq_len))

    @property
    def capacity(self) -> int:
        return self.arena.capacity

    @property
    def allocated_tokens(self) -> int:
        """Beds booked now, filled or not."""
        return self.capacity - self.arena.total_free

    @property
    def held_tokens(self) -> int:
        """Tokens held by every request."""
        return sum(self._tokens.values())

    @property
    def request_ids(self) -> list:
        return list(self._tokens)

    def __contains__(self, request_id) -> bool:
        return request_id in self._tokens

    def booking(self, request_id) -> tuple[int, int]:
        """(offset, beds booked) of a request in the flat token layout."""
        self._known(request_id)
        return self.arena.booking(request_id)

    def num_tokens(self, request_id) -> int:
        self._known(request_id)
        return self._tokens[request_id]

    def _known(self, request_id) -> None:
        if request_id not in self._tokens:
            raise KeyError(f"request_id {request_id!r} is not admitted")

    def _size(self, prompt_len: int, output_len: int | None) -> int:
        positive_int("prompt_len", prompt_len)
        if output_len is not None:
            positive_int("output_len", output_len, minimum=0)
        total = prompt_len + (output_len or 0)
        if total > self.max_seq_len:
            what = "prompt_len + output_len" if output_len else "prompt_len"
            raise ValueError(f"{what} = {total} exceeds max_seq_len = {self.max_seq_len}")
        return booking_size(self.policy, prompt_len, output_len, self.max_seq_len)

    def can_admit(self, prompt_len: int, output_len: int | None = None) -> bool:
        return self.refusal(prompt_len, output_len) is None

    def refusal(self, prompt_len: int, output_len: int | None = None) -> OutOfSpace | None:
        """What :meth:`admit` would raise for lack of space now, or None (nothing changes).
        Requests that could never fit raise ValueError here, as in :meth:`admit`."""
        return self.arena.refusal(self._size(prompt_len, output_len))

    def admit(self, request_id, prompt_len: int, output_len: int | None = None) -> int:
        """Book beds for a new request holding ``prompt_len`` prompt tokens; return its offset.

        ``output_len`` is the number of tokens the request will generate: the pow2 and oracle
        policies need it (the paper's baselines assume it is known); the accounts use it to tell
        reserved-for-future beds from internal fragmentation.
        """
        _check_id(request_id)
        size = self._size(prompt_len, output_len)
        if request_id in self._tokens:
            raise ValueError(f"request_id {request_id!r} is already admitted")
        offset = self.arena.allocate(request_id, size)
        self._tokens[request_id] = prompt_len
        self._final[request_id] = None if output_len is None else prompt_len + output_len
        return offset

    def can_append(self, request_id) -> bool:
        """Whether the booking has a bed left for one more token."""
        self._known(request_id)
        return self._tokens[request_id] < self.arena.booking(request_id)[1]

    def append(self, request_id) -> int:
        """Make room for one more token; return its flat slot (offset + position)."""
        self._known(request_id)
        offset, size = self.arena.booking(request_id)
        tokens = self._tokens[request_id]
        if tokens >= size:
            raise ReservationFull(
                f"request_id {request_id!r} already fills its {size} booked slots"
            )
        self._tokens[request_id] = tokens + 1
        return offset + tokens

    def decode_room(self, request_ids: list, max_rounds: int) -> int:
        """Rounds of one more token for every request that fit in their bookings now."""
        if not request_ids:
            return 0
        room = min(self.arena.booking(r)[1] - self.num_tokens(r) for r in request_ids)
        return max(0, min(room, max_rounds))

    def append_rounds(self, request_ids: list, rounds: int) -> list[int]:
        """What ``rounds`` rounds of :meth:`append` for each request do (no booking changes);
        returns :attr:`allocated_tokens` after each round."""
        if rounds > self.decode_room(request_ids, rounds):
            raise ReservationFull(f"{rounds} more tokens do not fit in every booking")
        for request_id in request_ids:
            self._tokens[request_id] += rounds
        return [self.allocated_tokens] * rounds

    def release(self, request_id) -> None:
        self._known(request_id)
        self.arena.free(request_id)
        del self._tokens[request_id], self._final[request_id]

    def memory_report(self) -> Usage:
        booked = {r: n for r, (_, n) in self.arena.bookings.items()}
        per_token = self.spec.kv_bytes_per_token if self.spec is not None else None
        return usage(self.capacity, 1, booked, self._tokens, self._final, None, per_token)

    def state(self) -> CacheState:
        """Bookings, tokens and final lengths now (what a recorder keeps)."""
        arena = self.arena.state()
        tokens, final = dict(self._tokens), dict(self._final)
        return CacheState(
            "contiguous", self.capacity, 1, arena.block_tables, tokens, arena.booked, final
        )


__all__ = [
    "PAPER_NAMES",
    "PLACEMENTS",
    "POLICIES",
    "ArenaAllocator",
    "ContiguousKVCache",
    "OutOfMemory",
    "OutOfSpace",
    "ReservationFull",
    "best_fit",
    "booking_size",
    "external_fragmentation",
    "first_fit",
]
