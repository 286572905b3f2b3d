"""Prefix caches: how a prompt finds the blocks of its longest cached prefix (Labs 07 and 10).

Two structures behind one interface (:class:`PrefixCache`): vLLM's hash chain
(:class:`HashChainCache`, the default) and SGLang's radix tree (:class:`RadixTreeCache`). A
:class:`~kvlab.core.block_manager.BlockManager` picks one with ``prefix_cache="hash"`` or ``"radix"``,
and puts a CPU tier below it with ``cpu_cache_blocks`` (:class:`TieredPrefixCache`, either one).
"""

from __future__ import annotations

from kvlab.core.block_pool import BlockPool, hash_block_tokens
from kvlab.core.prefix_cache.hash_chain import HashChainCache
from kvlab.core.prefix_cache.protocol import PrefixCache, PrefixCacheStats, PrefixMatch
from kvlab.core.prefix_cache.radix_tree import RadixTreeCache
from kvlab.core.prefix_cache.tiered import PrefixKey, TieredPrefixCache, TierMover

PREFIX_CACHES = {"hash": HashChainCache, "radix": RadixTreeCache}


def check_prefix_cache(name) -> str:
    """``name`` if it names a prefix cache, else a ValueError naming the choices."""
    if not isinstance(name, str) or name not in PREFIX_CACHES:
        raise ValueError(f"prefix_cache must be one of {tuple(PREFIX_CACHES)}, got {name!r}")
    return name


def make_prefix_cache(
    name: str,
    pool: BlockPool,
    block_size: int,
    *,
    hash_fn=hash_block_tokens,
    cpu_blocks: int | None = None,
    mover: TierMover | None = None,
    block_tables=None,
) -> PrefixCache:
    """The prefix cache ``name`` ("hash" or "radix") over ``pool``. ``hash_fn`` is the hash
    chain's (the radix tree compares token ids and hashes nothing). ``cpu_blocks``: a CPU tier
    of that many blocks below it (:class:`TieredPrefixCache`, told to ``mover``); None: none.
    ``block_tables``: the block manager's tables, for the radix tree (see
    :class:`RadixTreeCache`; the hash chain never changes a table)."""
    if check_prefix_cache(name) == "hash":
        cache = HashChainCache(pool, block_size, hash_fn)
    elif hash_fn is not hash_block_tokens:
        raise ValueError("hash_fn is for prefix_cache='hash': the radix tree hashes nothing")
    else:
        cache = RadixTreeCache(pool, block_size, block_tables)
    if cpu_blocks is None:
        if mover is not None:
            raise ValueError("mover is for a CPU tier: give cpu_blocks too")
        return cache
    return TieredPrefixCache(cache, cpu_blocks, mover=mover)


__all__ = [
    "PREFIX_CACHES",
    "HashChainCache",
    "PrefixCache",
    "PrefixCacheStats",
    "PrefixKey",
    "PrefixMatch",
    "RadixTreeCache",
    "TierMover",
    "TieredPrefixCache",
    "check_prefix_cache",
    "make_prefix_cache",
]
