"""Lab 07's rules on its plain structures: ``cached_prefix`` is kvlab's ``HashChainCache`` on the
lab's ``cached`` dict, each usual slip a subclass (of it or the pool) with one hook changed."""

from __future__ import annotations

import functools

from kvlab.core.block_manager import BlockManager
from kvlab.core.block_pool import ROOT_HASH, Block, BlockPool, hash_block_tokens
from kvlab.core.prefix_cache.hash_chain import HashChainCache
from kvlab.grading.given import CachedBlock
from kvlab.grading.lab07 import hints
from kvlab.grading.own_code import methods_of
from kvlab.grading.slips import Slip

KVLAB_CODE = methods_of(BlockManager, BlockPool, HashChainCache)  # calling one hands the work over


def plain_pool(cached: dict, kind: type[BlockPool] = BlockPool) -> BlockPool:
    """The lab's ``cached`` as kvlab's pool: a block per hash, its parent the block of its
    parent_hash (one not cached is a block no lookup finds)."""
    pool, by_hash = kind(1), {}

    def block_of(key):
        if key != ROOT_HASH and key not in by_hash:
            by_hash[key] = Block(-1)
            by_hash[key].block_hash = key  # a parent not cached keeps its key (the Rehashed slips')
        return by_hash.get(key)

    for key, entry in cached.items():
        block = block_of(key)
        block.block_id, block.block_hash = entry.block_id, key
        block.token_ids, block.parent = tuple(entry.token_ids), block_of(entry.parent_hash)
        pool.cached[key] = block
    pool.block_of = block_of
    return pool


def cached_prefix(token_ids, block_size: int, cached: dict, cache=HashChainCache, **pool):
    """The rooms of the longest cached prefix, as ``cache`` finds them on a ``plain_pool``."""
    found = cache(plain_pool(cached, **pool), block_size).match(token_ids).blocks
    return [block.block_id for block in found]


def variant(name: str, base: type = HashChainCache, **hook) -> type:
    """kvlab's ``base`` with one hook changed: a usual slip."""
    return type(name, (base,), hook)


# the lookup's usual slips, each kvlab's with one decision changed (see prefix.PREFIX_SLIPS):
# _follows(self, hash, block, parent_hash, parent), _block_limit(self, token_ids), ...
Overlap = variant("Overlap", _block_starts=lambda self, t: range(self._block_limit(t)))
Unchained = variant("Unchained", _follows=lambda self, h, b, ph, p: None if b is None else (ph, p))
# hashed alone, looked up after its key
Keyed = functools.partial(HashChainCache, hash_fn=lambda p, t: hash_block_tokens(ROOT_HASH, t))
NoStop = variant("NoStop", _follows=lambda self, h, b, ph, p: (ph, p) if b is None else (h, b))
NoStopFollowed = variant(
    "NoStopFollowed",
    _follows=lambda self, h, b, ph, p: (h, self.pool.block_of(h) if b is None else b),
)
CoversLast = variant("CoversLast", _block_limit=lambda self, t: len(t) // self.block_size)
Partial = variant("Partial", _block_limit=lambda self, t: -(-len(t) // self.block_size))
DropsOne = variant("DropsOne", _block_limit=lambda self, t: len(t) // self.block_size - 1)
TokensOnly = variant("TokensOnly", BlockPool, confirms=lambda s, b, t, p: b.token_ids == t)
ParentOnly = variant(
    "ParentOnly", BlockPool, confirms=lambda s, b, t, p: BlockPool.confirms(s, b, b.token_ids, p)
)
Trusted = variant("Trusted", BlockPool, confirms=lambda s, b, t, p: True)
# the parent compared only when it is truthy: an entry after ROOT_HASH (0) confirms anywhere
RootTrusted = variant(
    "RootTrusted",
    BlockPool,
    confirms=lambda s, b, t, p: (
        b.token_ids == t and (b.parent is None or BlockPool.confirms(s, b, t, p))
    ),
)
Unordered = variant(
    "Unordered",
    BlockPool,
    confirms=lambda s, b, t, p: (
        BlockPool.confirms(s, b, b.token_ids, p) and sorted(b.token_ids) == sorted(t)
    ),
)


def _rehashed(block) -> bool:
    """Whether a cached block's own parent and tokens hash to its key: always, for an entry filed
    under its own hash, so it confirms nothing."""
    parent = ROOT_HASH if block.parent is None else block.parent.block_hash
    return hash_block_tokens(parent, block.token_ids) == block.block_hash


# one of the two comparisons replaced by hashing the entry again
RehashedParent = variant(
    "RehashedParent", BlockPool, confirms=lambda s, b, t, p: b.token_ids == t and _rehashed(b)
)
RehashedTokens = variant(
    "RehashedTokens",
    BlockPool,
    confirms=lambda s, b, t, p: BlockPool.confirms(s, b, b.token_ids, p) and _rehashed(b),
)


def slipped(cache=HashChainCache, kind=BlockPool):
    """``cached_prefix`` with a slipped cache and pool (``token_ids, block_size, cached``)."""
    return functools.partial(cached_prefix, cache=cache, kind=kind)


def chain_hashes(token_ids, block_size: int, count: int) -> list[int]:
    hashes, parent = [], ROOT_HASH
    for i in range(count):
        parent = hash_block_tokens(parent, token_ids[i * block_size : (i + 1) * block_size])
        hashes.append(parent)
    return hashes


def cache_prompt(cached: dict, token_ids, block_size: int, room_ids) -> list[int]:
    """Cache a finished guest's full blocks, new ones in rooms from ``room_ids``: its rooms."""
    keys = chain_hashes(token_ids, block_size, len(token_ids) // block_size)
    for i, key in enumerate(keys):
        block = tuple(token_ids[i * block_size : (i + 1) * block_size])
        if key not in cached:
            cached[key] = CachedBlock(next(room_ids), keys[i - 1] if i else ROOT_HASH, block)
    return [cached[key].block_id for key in keys]


def reference_take(free_queue: list, cached: dict, block_hashes: dict) -> int:
    """The rule the exercise asks for (kvlab's BlockPool.get_new_block on plain structures)."""
    block = free_queue.pop(0)
    if block in block_hashes:
        del cached[block_hashes.pop(block)]
    return block


def _plain_first(queue: list, cached: dict, hashes: dict):
    """With a cached room at the front, the first room that holds no cached block."""
    return next((b for b in queue if b not in hashes), None) if queue[0] in hashes else None


# the wrong rooms a take_block hands out, tried in order: each answers which room
TAKE_SLIPS = (
    Slip(hints.RETURN_HASH, lambda queue, cached, hashes: hashes.get(queue[0])),
    Slip(hints.BACK, lambda queue, cached, hashes: queue[-1]),
    Slip(hints.PLAIN_FIRST, _plain_first),
)
