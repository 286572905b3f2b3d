"""A second tier below HBM for a prefix cache (Lab 10): CPU memory of its own capacity.

Without a tier, a cached block that the pool hands out again (evicted) loses its prefix: a later
prompt with that prefix computes it again. :class:`TieredPrefixCache` wraps either prefix cache
(hash chain or radix tree) and catches each evicted block on its way out (the pool's
``on_evict``): its K/V are copied down into one of ``cpu_blocks`` CPU slots, kept in least
recently used order, and the oldest is dropped when the tier is full. A later prompt whose
prefix continues past what HBM holds into the tier gets those blocks back by a copy up over
PCIe into fresh HBM blocks (:attr:`PrefixMatch.fetched`) instead of computing them: the block
manager takes them from the pool like any new block (a free one, or an eviction), and the
tier fills them once their block ids are known. A block lives in HBM or in the tier, never
both: a copy up moves it, and a block that becomes findable in HBM again takes its prefix out
of the tier.

What makes a block's K/V right is its whole prefix: the tier keys a block by a
:class:`PrefixKey`, its tokens chained to its parent's key (compared exactly, not just hashed),
so the same tokens after another prefix never match. The tier moves no bytes itself: a
``mover`` (a real engine's copy kernels, a test's shadow) is told of each copy, with the GPU
block and the CPU slot; the simulator only counts them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from kvlab.core.block_pool import Block
from kvlab.core.prefix_cache.protocol import PrefixCache, PrefixCacheStats, PrefixMatch
from kvlab.core.validate import positive_int


class PrefixKey:
    """The whole prefix up to the end of one block: its token ids chained to the key of the
    block before it. The hash is computed once; equality compares tokens along both chains (a
    shared parent object ends the walk at once, so keys built on a found key compare in O(1))."""

    __slots__ = ("parent", "tokens", "_hash")

    def __init__(self, parent: PrefixKey | None, tokens: tuple[int, ...]):
        self.parent = parent
        self.tokens = tokens
        self._hash = hash((0 if parent is None else parent._hash, tokens))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        if not isinstance(other, PrefixKey):
            return NotImplemented
        a, b = self, other
        while a is not b:
            if a is None or b is None or a._hash != b._hash or a.tokens != b.tokens:
                return False
            a, b = a.parent, b.parent
        return True

    def __len__(self) -> int:
        """Blocks in the prefix."""
        n, key = 0, self
        while key is not None:
            n, key = n + 1, key.parent
        return n

    def __repr__(self) -> str:
        return f"PrefixKey(blocks={len(self)}, last={self.tokens})"


class TierMover(Protocol):
    """Moves K/V between HBM and the CPU tier (a real engine's copies; a test's shadow)."""

    def copy_down(self, block_id: int, cpu_slot: int) -> None:
        """HBM block ``block_id`` is about to be handed out: keep its K/V in ``cpu_slot``."""
        ...

    def copy_up(self, cpu_slot: int, block_id: int) -> None:
        """Fill the fresh HBM block ``block_id`` with the K/V kept in ``cpu_slot``."""
        ...


class TierState:
    """A sequence's state: the inner cache's, the keys of its known full blocks, how many of its
    table entries the tier knows the contents of, how many of them are known findable in HBM
    (a leading run), and the CPU slots still to copy up."""

    __slots__ = ("inner", "keys", "noted", "findable", "pending")

    def __init__(self, inner: Any, keys: list[PrefixKey], noted: int, pending: list[int]):
        self.inner = inner
        self.keys = keys
        self.noted = noted
        self.findable = noted  # table[:findable] are findable in HBM
        self.pending = pending  # CPU slots of blocks keys[noted:noted + len(pending)]


class TieredPrefixCache:
    """``inner`` (a :class:`PrefixCache` over HBM) with a CPU tier of ``cpu_blocks`` blocks
    below it. Itself a :class:`PrefixCache`: the block manager drives it as it drives
    ``inner``."""

    def __init__(self, inner: PrefixCache, cpu_blocks: int, *, mover: TierMover | None = None):
        if not isinstance(inner, PrefixCache):
            raise TypeError(f"inner must be a kvlab.core.prefix_cache.PrefixCache, got {inner!r}")
        if isinstance(inner, TieredPrefixCache):
            raise TypeError("inner already has a tier below it")
        self.inner = inner
        self.pool = inner.pool
        if self.pool.on_evict is not None:
            raise ValueError("the pool already sends its evicted blocks somewhere")
        self.cpu_blocks = positive_int("cpu_blocks", cpu_blocks)
        self.mover = mover
        self.block_size = inner.block_size
        self.keeps_free_blocks = inner.keeps_free_blocks
        # key -> (the key object kept, its CPU slot), least recently used first
        self.tier: OrderedDict[PrefixKey, tuple[PrefixKey, int]] = OrderedDict()
        self.free_slots = list(range(self.cpu_blocks - 1, -1, -1))  # popped from the end
        self.key_of: dict[int, PrefixKey] = {}  # HBM block id -> the prefix its K/V hold
        self.tier_hits = 0  # prompt tokens copied up instead of computed
        self.demotions = 0  # blocks copied down
        self.tier_evictions = 0  # blocks dropped from the tier (or never kept: it was full)
        self.superseded = 0  # blocks the tier let go because HBM holds their prefix again
        self.pool.on_evict = self._demote

    # --- finding a prefix ----------------------------------------------------------------------
    def match(self, token_ids: Sequence[int]) -> PrefixMatch:
        """HBM's match, continued block by block in the tier (never the prompt's last token);
        ``end`` is (the inner match's end, the tier's keys found). Nothing changes."""
        found = self.inner.match(token_ids)
        size, tier = self.block_size, self.tier
        n = len(found.blocks)
        parent = self.key_of[found.blocks[-1].block_id] if n else None
        keys = []
        for start in range(n * size, len(token_ids) - 1 - (len(token_ids) - 1) % size, size):
            entry = tier.get(PrefixKey(parent, tuple(token_ids[start : start + size])))
            if entry is None:
                break
            parent = entry[0]  # the kept object: the next key's parent compares by identity
            keys.append(parent)
        return PrefixMatch(found.blocks, (found.end, keys), len(keys))

    def start(self, match: PrefixMatch, num_tokens: int) -> TierState:
        """The sequence took ``match``: its tier blocks leave the tier (their CPU slots stay
        taken until :meth:`cache_full_blocks` copies them up into the new blocks)."""
        end, fetched = match.end
        inner = self.inner.start(PrefixMatch(match.blocks, end), num_tokens)
        keys = [self.key_of[block.block_id] for block in match.blocks]
        pending = [self.tier.pop(key)[1] for key in fetched]
        keys.extend(fetched)
        self.tier_hits += len(fetched) * self.block_size
        return TierState(inner, keys, len(match.blocks), pending)

    # --- growing, and copying up -----------------------------------------------------------------
    def cache_full_blocks(
        self, state: TierState, table: list[Block], token_ids: list[int]
    ) -> TierState:
        """The inner cache learns the full blocks; the tier notes what each new one holds,
        copies up the blocks the match fetched, and forgets a prefix that HBM holds again."""
        state.inner = self.inner.cache_full_blocks(state.inner, table, token_ids)
        size, keys, key_of = self.block_size, state.keys, self.key_of
        full = len(token_ids) // size
        for i in range(state.noted, full):
            if i < len(keys):
                key = keys[i]
            else:
                key = PrefixKey(
                    keys[-1] if keys else None, tuple(token_ids[i * size : (i + 1) * size])
                )
                keys.append(key)
            block = table[i]
            if state.pending:
                slot = state.pending.pop(0)
                if self.mover is not None:
                    self.mover.copy_up(slot, block.block_id)
                self.free_slots.append(slot)
            key_of[block.block_id] = key
            if _findable(block):
                self._supersede(key)
        state.noted = max(state.noted, full)
        # a block noted before may have become findable only now (a radix tree that waited
        # for a copy it then lost to eviction adds the sequence's own): HBM's too, from now on
        i = state.findable
        while i < full and _findable(table[i]):
            self._supersede(keys[i])
            i += 1
        state.findable = i
        return state

    def _supersede(self, key: PrefixKey) -> None:
        """HBM holds ``key``'s prefix findable again (computed anew): the tier lets it go."""
        entry = self.tier.pop(key, None)
        if entry is not None:
            self.free_slots.append(entry[1])
            self.superseded += 1

    def _demote(self, block: Block) -> None:
        """The pool is about to hand out cached ``block``: copy its prefix down to the tier,
        dropping the least recently used one when the tier is full."""
        key = self.key_of.pop(block.block_id)
        self.demotions += 1
        if not self.free_slots:
            if not self.tier:  # every slot waits for a copy up: nothing to make room with
                self.tier_evictions += 1
                return
            self.tier_evictions += 1
            self.free_slots.append(self.tier.popitem(last=False)[1][1])
        slot = self.free_slots.pop()
        if self.mover is not None:
            self.mover.copy_down(block.block_id, slot)
        self.tier[key] = (key, slot)

    # --- the rest of the seam: the inner cache's --------------------------------------------------
    def fork(self, state: TierState) -> TierState:
        if state.pending:
            raise ValueError("a sequence still waiting for its copy up cannot be forked")
        child = TierState(self.inner.fork(state.inner), list(state.keys), state.noted, [])
        child.findable = state.findable
        return child

    def release(self, state: TierState) -> None:
        if state.pending:  # never copied up (the manager always notes them at allocate)
            self.free_slots.extend(state.pending)
            state.pending = []
        self.inner.release(state.inner)

    @property
    def stats(self) -> PrefixCacheStats:
        inner = self.inner.stats
        return PrefixCacheStats(
            inner.queries,
            inner.hits + self.tier_hits,
            inner.evictions,
            inner.cached_blocks,
            tier_hits=self.tier_hits,
            tier_blocks=len(self.tier),
            demotions=self.demotions,
            tier_evictions=self.tier_evictions,
        )

    @property
    def evictable_blocks(self) -> int:
        return self.inner.evictable_blocks

    @property
    def protected_blocks(self) -> int:
        return self.inner.protected_blocks

    def cached_block_ids(self) -> list[int]:
        return self.inner.cached_block_ids()

    def tier_keys(self) -> list[PrefixKey]:
        """The prefixes the tier holds, least recently used (dropped next) first."""
        return list(self.tier)

    def check_invariants(self, sequences: Iterable[tuple[TierState, list[Block]]] = ()) -> None:
        """The inner cache's invariants, and: the tier within its capacity, every CPU slot
        either free, holding one prefix or waiting for one copy up; every block findable in HBM
        with its prefix noted, and no prefix both there and in the tier."""
        sequences = list(sequences)
        self.inner.check_invariants([(s.inner, table) for s, table in sequences])
        pending = [slot for s, _ in sequences for slot in s.pending]
        slots = [slot for _, slot in self.tier.values()] + self.free_slots + pending
        assert sorted(slots) == list(range(self.cpu_blocks)), "a CPU slot lost or doubled"
        assert len(self.tier) <= self.cpu_blocks, "the tier holds more than its capacity"
        in_hbm = set()
        for block in self.pool.blocks:
            if _findable(block):
                key = self.key_of.get(block.block_id)
                assert key is not None, f"block {block.block_id}: cached, its prefix unknown"
                assert key not in self.tier, f"block {block.block_id}: also in the tier"
                in_hbm.add(key)
        assert len(in_hbm) == sum(map(_findable, self.pool.blocks)), "one prefix twice in HBM"
        for state, table in sequences:
            assert state.noted <= len(table) and len(state.keys) >= state.noted
            for i in range(state.noted):
                key = self.key_of.get(table[i].block_id)
                if key is not None and _findable(table[i]):
                    assert key == state.keys[i], f"block {table[i].block_id}: another prefix"


def _findable(block: Block) -> bool:
    """Whether a prompt can find ``block`` in HBM: in the hash map, or in the tree."""
    return block.block_hash is not None or block.node is not None
