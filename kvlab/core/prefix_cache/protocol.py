"""What the block manager asks of a prefix cache, whichever structure keeps the prefixes.

A prefix cache finds, for a prompt given as token ids, the blocks of its longest cached prefix,
and learns each block a sequence fills once the block's K/V are written. The block manager keeps
the block tables and reference counts; the cache keeps only what makes a block findable, plus a
small per-sequence state (where the sequence is in the chain or the tree) that the manager stores
for it and hands back on every call.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from kvlab.core.block_pool import Block


@dataclass(frozen=True)
class PrefixCacheStats:
    """What prefix caching found: prompt tokens looked up and found (hits), cached blocks handed
    out again (evictions), and blocks findable now (in use or evictable)."""

    queries: int
    hits: int
    evictions: int
    cached_blocks: int
    # with a lower tier (kvlab.core.prefix_cache.tiered): of the hits, the tokens copied up from
    # it; blocks it holds now; blocks sent down to it; blocks it dropped (their prefix lost)
    tier_hits: int = 0
    tier_blocks: int = 0
    demotions: int = 0
    tier_evictions: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """The longest cached prefix of a prompt: its blocks (whole blocks, never the prompt's last
    token) and where the match ended, in the cache's own terms (a hash chain's hashes, a tree
    node). A cache with a lower tier (CPU memory) may continue the prefix there: ``fetched``
    more blocks, which the block manager takes fresh from the pool and the cache fills by a
    copy up instead of a recompute. Valid until the cache changes."""

    blocks: list[Block]
    end: Any = None
    fetched: int = 0  # blocks after ``blocks`` a lower tier copies up (into new blocks)


@runtime_checkable
class PrefixCache(Protocol):
    """A prefix cache over one :class:`~kvlab.core.block_pool.BlockPool` (hash chain or radix tree).

    ``state`` is the per-sequence value :meth:`start` returns: the manager stores it with the
    sequence and passes it back. A cache whose cached blocks wait outside the pool's free queue
    while nobody holds them (``keeps_free_blocks``) is also the pool's
    :class:`~kvlab.core.block_pool.Evictor`: the pool takes blocks back through it.
    """

    block_size: int
    keeps_free_blocks: bool

    def match(self, token_ids: Sequence[int]) -> PrefixMatch:
        """The longest cached prefix of ``token_ids``; nothing changes."""
        ...

    def start(self, match: PrefixMatch, num_tokens: int) -> Any:
        """A sequence of ``num_tokens`` prompt tokens took ``match`` (its blocks are already
        shared, no new block is handed out yet): count the query, and return the sequence's
        state."""
        ...

    def cache_full_blocks(self, state: Any, table: list[Block], token_ids: list[int]) -> Any:
        """The sequence's full blocks whose tokens are known (``token_ids``) and computed
        become findable, in order; returns its state. A cache may put a cached block in place
        of the sequence's copy of it in ``table`` (the radix tree does, in every table holding
        the copy)."""
        ...

    def fork(self, state: Any) -> Any:
        """The state of a sequence forked from one in ``state`` (same block table)."""
        ...

    def release(self, state: Any) -> None:
        """The sequence leaves (before its blocks are freed)."""
        ...

    @property
    def stats(self) -> PrefixCacheStats: ...

    @property
    def evictable_blocks(self) -> int:
        """Cached blocks nobody holds: they count as free, their prefix is lost when reused."""
        ...

    @property
    def protected_blocks(self) -> int:
        """Cached blocks some block table holds: never evicted."""
        ...

    def cached_block_ids(self) -> list[int]:
        """The evictable blocks, in the order they would be handed out."""
        ...

    def check_invariants(self, sequences: Iterable[tuple[Any, list[Block]]] = ()) -> None:
        """Raise AssertionError unless the cache agrees with the pool and with each (state,
        block table) of ``sequences`` (for tests and graders)."""
        ...
