"""The hash-chain prefix cache (vLLM v1's): a full block is found by a hash of its tokens chained
to the hash of the block before it, so the same tokens after another prefix never match.

The ``block_hash -> block`` map lives in the :class:`~kvlab.core.block_pool.BlockPool`, as in vLLM:
a cached block nobody holds waits in the pool's free queue, still findable, and the pool forgets
its hash when it hands the block out again (least recently freed first).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvlab.core.block_pool import ROOT_HASH, Block, BlockPool, hash_block_tokens
from kvlab.core.prefix_cache.protocol import PrefixCacheStats, PrefixMatch
from kvlab.core.validate import positive_int

_BROKEN = object()  # a chain cut by a hash collision: later blocks of it are never found


class ChainState:
    """Where a sequence is in the chain: the hashes of its known full blocks, and the findable
    block its next full block follows (None: the first block). A block that fills with the same
    tokens as a findable one stays unfindable itself, and the next block follows the findable
    one."""

    __slots__ = ("hashes", "parent")

    def __init__(self, hashes: list, parent):
        self.hashes = hashes
        self.parent = parent


class HashChainCache:
    """Prefix caching by chained block hashes. ``hash_fn(parent_hash, token_ids)`` is for tests
    that force collisions: a hash only finds a candidate, its tokens and parent confirm it."""

    keeps_free_blocks = False  # its cached blocks wait in the pool's free queue

    def __init__(self, pool: BlockPool, block_size: int, hash_fn=hash_block_tokens):
        if not callable(hash_fn):
            raise TypeError(f"hash_fn must be a function (parent_hash, token_ids), got {hash_fn!r}")
        self.pool = pool
        self.block_size = positive_int("block_size", block_size)
        self.hash_fn = hash_fn
        self.queries = self.hits = 0  # prompt tokens looked up, and found cached

    def match(self, token_ids: Sequence[int]) -> PrefixMatch:
        """The blocks of the longest cached prefix, and their hashes (``end``). The last token is
        never covered: a prompt of k full blocks reuses at most k - 1."""
        size, lookup, hash_fn = self.block_size, self.pool.lookup, self.hash_fn
        follows = self._follows  # the hooks, looked up once
        blocks, hashes = [], []
        parent_hash, parent = ROOT_HASH, None
        for start in self._block_starts(token_ids):
            tokens = tuple(token_ids[start : start + size])
            block_hash = hash_fn(parent_hash, tokens)
            block = lookup(block_hash, tokens, parent)
            if block is not None:
                blocks.append(block)
                hashes.append(block_hash)
            after = follows(block_hash, block, parent_hash, parent)
            if after is None:
                break
            parent_hash, parent = after
        return PrefixMatch(blocks, hashes)

    # the lookup's decisions, one hook each (Lab 07's usual slips override one)
    def _block_starts(self, token_ids: Sequence[int]) -> range:
        """Where the blocks a match looks up start: block i at i * block_size."""
        return range(0, self._block_limit(token_ids) * self.block_size, self.block_size)

    def _block_limit(self, token_ids: Sequence[int]) -> int:
        """Blocks a match may cover: never the one holding the prompt's last token, which the
        engine computes in any case to get the first answer token."""
        return (len(token_ids) - 1) // self.block_size

    def _follows(self, block_hash, block: Block | None, parent_hash, parent):
        """What the next block is looked up after, ``(hash, block)``, once this one was (``block``:
        None for a miss); None stops at the first miss: the blocks after it follow K/V that are not
        in the cache."""
        return None if block is None else (block_hash, block)

    def start(self, match: PrefixMatch, num_tokens: int) -> ChainState:
        self.queries += num_tokens
        self.hits += len(match.blocks) * self.block_size
        return ChainState(list(match.end), match.blocks[-1] if match.blocks else None)

    def cache_full_blocks(
        self, state: ChainState, table: list[Block], token_ids: list[int]
    ) -> ChainState:
        """Hash the sequence's full blocks not hashed yet and make them findable, in order (a
        hash another block already has keeps its block)."""
        hashes, size, pool = state.hashes, self.block_size, self.pool
        parent = state.parent
        for i in range(len(hashes), len(token_ids) // size):
            tokens = tuple(token_ids[i * size : (i + 1) * size])
            block_hash = self.hash_fn(hashes[-1] if hashes else ROOT_HASH, tokens)
            hashes.append(block_hash)
            if parent is _BROKEN:
                continue
            found = pool.lookup(block_hash, tokens, parent)
            if found is None and pool.cache(table[i], block_hash, tokens, parent):
                found = table[i]
            parent = _BROKEN if found is None else found
        state.parent = parent
        return state

    def fork(self, state: ChainState) -> ChainState:
        return ChainState(list(state.hashes), state.parent)

    def release(self, state: ChainState) -> None:
        """Nothing to do: the pool queues the sequence's blocks as they are freed."""

    @property
    def stats(self) -> PrefixCacheStats:
        pool = self.pool
        return PrefixCacheStats(self.queries, self.hits, pool.num_evictions, len(pool.cached))

    @property
    def evictable_blocks(self) -> int:
        return sum(block.ref_count == 0 for block in self.pool.cached.values())

    @property
    def protected_blocks(self) -> int:
        return len(self.pool.cached) - self.evictable_blocks

    def cached_block_ids(self) -> list[int]:
        """Cached blocks nobody holds, in free-queue order (handed out, and evicted, first)."""
        return [b.block_id for b in self.pool.free_queue.blocks() if b.block_hash is not None]

    def check_invariants(self, sequences: Iterable[tuple[ChainState, list[Block]]] = ()) -> None:
        """The hash map and the blocks agree (``sequences`` is for the interface's sake)."""
        pool, hashed = self.pool, 0
        for block in pool.blocks:
            if block.block_hash is not None:
                hashed += 1
                assert pool.cached.get(block.block_hash) is block, "cached map out of step"
                assert len(block.token_ids) == self.block_size, "a cached block is not full"
            assert block.node is None, f"block {block.block_id} is in a radix tree"
        assert len(pool.cached) == hashed, "the cached map holds blocks that are not cached"
