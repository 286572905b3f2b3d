"""The block manager of a hybrid model: one block table per layer group for every sequence, all
groups drawing on one pool, as vLLM v1's ``KVCacheCoordinator`` over its
``SingleTypeKVCacheManager``s (:mod:`kvlab.core.single_type_manager`).

A model is its layer groups (:class:`~kvlab.core.kv_spec.LayerGroup`s, or their specs); a block
is one page of one group. Every change (allocate, append, fork) first asks each group what it
takes, and changes nothing unless the pool has it all: a refusal raises
:class:`~kvlab.core.block_manager.OutOfBlocks` with every group as it was.

A dense model, one full-attention (or MLA) group, is today's
:class:`~kvlab.core.block_manager.BlockManager` itself (``.dense``): the same tables, the same
free-queue order, the same prefix caches and figures, so the hotel floor plan, the recorder and
the key-card checks read its one table as before.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from kvlab.core.accounting import CacheState
from kvlab.core.block_hashes import chain_block_hashes
from kvlab.core.block_manager import (
    BlockManager,
    OutOfBlocks,
    _check_new,
    _lookup,
    _prompt,
    _token_id,
)
from kvlab.core.block_pool import Block, BlockPool
from kvlab.core.kv_spec import KVCacheSpec, LayerGroup
from kvlab.core.prefix_cache import PrefixCacheStats, check_prefix_cache
from kvlab.core.single_type_manager import (
    PAGED_KINDS,
    SingleTypeManager,
    SlidingWindowManager,
    WindowStep,
    manager_for,
)
from kvlab.core.validate import num_computed_of, positive_int


def group_specs(groups) -> tuple[KVCacheSpec, ...]:
    """The spec of each group of ``groups`` (LayerGroups or KVCacheSpecs), checked."""
    if isinstance(groups, (str, bytes, Mapping, KVCacheSpec, LayerGroup)) or not isinstance(
        groups, Iterable
    ):
        raise TypeError(f"groups must be a sequence of LayerGroups or KVCacheSpecs, got {groups!r}")
    specs = []
    for i, group in enumerate(groups):
        spec = group.spec if isinstance(group, LayerGroup) else group
        if not isinstance(spec, KVCacheSpec):
            raise TypeError(f"groups[{i}] must be a LayerGroup or a KVCacheSpec, got {group!r}")
        specs.append(spec)
    if not specs:
        raise ValueError("groups must hold at least one layer group, got none")
    return tuple(specs)


@dataclass(slots=True)
class HybridAllocationPlan:
    """What allocating a prompt takes now: the longest prefix every group serves
    (``num_cached_tokens``), each group's blocks for it (null blocks where a window needs
    none), the new blocks the prompt takes in all groups, and the blocks free for them."""

    num_tokens: int
    token_ids: list[int] | None
    num_cached_tokens: int
    hit_blocks: tuple[list[Block], ...]
    blocks_needed: int
    available: int
    block_hashes: list[bytes]


class _Sequence:
    """What every group shares of one sequence (each group keeps its own table)."""

    __slots__ = ("num_tokens", "token_ids", "block_hashes", "num_cached")

    def __init__(self, num_tokens: int, num_cached: int):
        self.num_tokens = num_tokens
        self.token_ids: list[int] | None = None  # with prefix caching: ids with K/V written
        self.block_hashes: list[bytes] = []  # digests of the full blocks of token_ids
        self.num_cached = num_cached

    def copy(self) -> _Sequence:
        child = _Sequence(self.num_tokens, self.num_cached)
        if self.token_ids is not None:
            child.token_ids = list(self.token_ids)
        child.block_hashes = list(self.block_hashes)
        return child


class HybridBlockManager:
    """Per-group block tables over one :class:`~kvlab.core.block_pool.BlockPool` of
    ``num_blocks`` blocks of ``block_size`` slots.

    The null block that stands for a window's skipped blocks is one more block, id
    ``num_blocks`` (vLLM takes block 0 of its pool; kvlab adds it after the others so that the
    blocks a group hands out are numbered and ordered as a dense model's are).

    ``window_step``: a window group's hand-back written elsewhere (a
    :class:`~kvlab.core.single_type_manager.WindowStep`: Lab 11's exercise) in place of kvlab's.

    ``append_slot`` means every token so far is computed: a sliding-window group hands back
    the blocks before the window of the next token first (so those blocks can serve the
    append), then every group grows.

    With ``enable_prefix_caching`` (``prefix_cache="hash"``: a hybrid model finds prefixes by
    block hashes, as vLLM's ``HybridKVCacheCoordinator``; ``"radix"`` only for a dense model), a
    prompt given as token ids starts from the longest prefix every group can serve: full
    attention needs every block of it cached, a window only the blocks of its last
    ``window - 1`` tokens, and a state group none it could serve, since the state at the end of
    a prefix is not kept: a model with a state group finds no prefix at all (vLLM with
    ``mamba_cache_mode="none"``). Groups look their blocks up by ``(group, block hash)``.
    """

    # a dense model is a BlockManager (False: the groups' own managers, for the tests that
    # check one against the other)
    delegate_dense: ClassVar[bool] = True
    # the manager of a window group (a subclass changes one of its decisions: Lab 11's slips)
    window_manager: ClassVar[type[SlidingWindowManager]] = SlidingWindowManager

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        groups: Sequence[LayerGroup | KVCacheSpec],
        *,
        enable_prefix_caching: bool = False,
        prefix_cache: str = "hash",
        window_step: WindowStep | None = None,
    ):
        self.num_blocks = positive_int("num_blocks", num_blocks)
        self.block_size = positive_int("block_size", block_size)
        self.specs = group_specs(groups)
        if not isinstance(enable_prefix_caching, bool):
            raise TypeError(f"enable_prefix_caching must be a bool, got {enable_prefix_caching!r}")
        check_prefix_cache(prefix_cache)
        self.enable_prefix_caching = enable_prefix_caching
        self.dense: BlockManager | None = None
        if self.delegate_dense and len(self.specs) == 1 and self.specs[0].kind in PAGED_KINDS:
            self.dense = BlockManager(
                num_blocks,
                block_size,
                enable_prefix_caching=enable_prefix_caching,
                prefix_cache=prefix_cache,
            )
            self.pool, self.null_block, self.managers = self.dense.pool, None, ()
            return
        if enable_prefix_caching and prefix_cache != "hash":
            raise ValueError(
                f"prefix_cache must be 'hash' for a model of several layer groups (or none but "
                f"full attention), got {prefix_cache!r}"
            )
        self.pool = BlockPool(self.num_blocks + 1)
        self.null_block = self.pool.blocks[self.num_blocks]
        self.pool.free_queue.remove(self.null_block)
        self.managers: tuple[SingleTypeManager, ...] = tuple(
            manager_for(
                spec,
                i,
                self.pool,
                self.block_size,
                self.null_block,
                window_step=window_step,
                window_manager=self.window_manager,
            )
            for i, spec in enumerate(self.specs)
        )
        # full attention first: its hit bounds the others' (vLLM sorts its groups so)
        self._full = [m for m in self.managers if m.spec.kind in PAGED_KINDS]
        self._others = [m for m in self.managers if m.spec.kind not in PAGED_KINDS]
        self._caching = enable_prefix_caching and all(m.spec.grows for m in self.managers)
        self._seqs: dict[Hashable, _Sequence] = {}
        self.queries = self.hits = 0  # prompt tokens looked up, and found cached

    # --- queries -------------------------------------------------------------------------------
    @property
    def num_groups(self) -> int:
        return len(self.specs)

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now, in any group (free and cached-evictable)."""
        return self.pool.num_free_blocks

    @property
    def seq_ids(self) -> list:
        return self.dense.seq_ids if self.dense is not None else list(self._seqs)

    def __contains__(self, seq_id) -> bool:
        return seq_id in self.dense if self.dense is not None else seq_id in self._seqs

    def num_tokens(self, seq_id) -> int:
        if self.dense is not None:
            return self.dense.num_tokens(seq_id)
        return self._seq(seq_id).num_tokens

    def num_cached_tokens(self, seq_id) -> int:
        """Prompt tokens found cached when ``seq_id`` was allocated (in every group)."""
        if self.dense is not None:
            return self.dense.num_cached_tokens(seq_id)
        return self._seq(seq_id).num_cached

    def token_ids(self, seq_id) -> list[int] | None:
        if self.dense is not None:
            return self.dense.token_ids(seq_id)
        ids = self._seq(seq_id).token_ids
        return None if ids is None else list(ids)

    def block_tables(self, seq_id) -> tuple[list[int], ...]:
        """The sequence's block table in each group (the null block's id where a window
        handed a block back)."""
        if self.dense is not None:
            return (self.dense.block_table(seq_id),)
        self._seq(seq_id)
        return tuple([b.block_id for b in m.tables[seq_id]] for m in self.managers)

    def block_table(self, seq_id, group: int = 0) -> list[int]:
        """The sequence's block table in group ``group``."""
        if isinstance(group, bool) or not isinstance(group, int):
            raise TypeError(f"group must be an int, got {group!r}")
        if not 0 <= group < self.num_groups:
            raise ValueError(f"group must be in 0..{self.num_groups - 1}, got {group}")
        return self.block_tables(seq_id)[group]

    def blocks_held(self, seq_id) -> int:
        """Blocks the sequence holds in all groups (null blocks left out)."""
        return sum(len(t) - t.count(self.num_blocks) for t in self.block_tables(seq_id))

    def ref_count(self, block_id: int) -> int:
        positive_int("block_id", block_id, minimum=0)
        if block_id >= self.num_blocks:
            raise ValueError(f"block_id must be < num_blocks = {self.num_blocks}, got {block_id}")
        return self.pool.blocks[block_id].ref_count

    def free_block_ids(self) -> list[int]:
        """The free queue, from the block handed out next to the one freed last."""
        return self.pool.free_queue.block_ids()

    def cached_block_ids(self) -> list[int]:
        """Cached blocks nobody holds, in the order they would be handed out."""
        if self.dense is not None:
            return self.dense.cached_block_ids()
        return [b.block_id for b in self.pool.free_queue.blocks() if b.block_hash is not None]

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        if self.dense is not None:
            return self.dense.prefix_cache_stats
        pool = self.pool
        return PrefixCacheStats(self.queries, self.hits, pool.num_evictions, len(pool.cached))

    def state(self) -> CacheState:
        """What the floor plan and the recorder draw: per sequence, the rooms it holds in every
        group, group by group in logical order (a window's handed-back places left out), the
        beds its tokens fill in them (a state's room counts as full) and the beds booked."""
        if self.dense is not None:
            return self.dense.state()
        size, null = self.block_size, self.null_block
        tables, tokens, booked = {}, {}, {}
        for seq_id, seq in self._seqs.items():
            rooms, beds = [], 0
            for m in self.managers:
                held = [b.block_id for b in m.tables[seq_id] if b is not null]
                rooms += held
                if held:
                    beds += (
                        size
                        if not m.spec.grows
                        else seq.num_tokens - (len(m.tables[seq_id]) - len(held)) * size
                    )
            tables[seq_id], tokens[seq_id], booked[seq_id] = rooms, beds, len(rooms) * size
        final = dict.fromkeys(tables)
        return CacheState("paged", self.num_blocks, size, tables, tokens, booked, final)

    def _seq(self, seq_id) -> _Sequence:
        return _lookup(self._seqs, seq_id)

    def _new(self, seq_id) -> None:
        _check_new(self._seqs, seq_id)

    def _out_of_blocks(self, seq_id, needed: int, available: int) -> OutOfBlocks:
        return OutOfBlocks(
            f"{seq_id!r} needs {needed} free block(s) across {self.num_groups} layer groups, "
            f"{available} free of {self.num_blocks}",
            needed=needed,
        )

    # --- prefix hits ---------------------------------------------------------------------------
    def find_longest_cache_hit(self, token_ids: Sequence[int], block_hashes: list[bytes]):
        """(each group's blocks for it, the longest prefix every group serves), never the
        prompt's last token. vLLM's fixed point: full attention gives a candidate length, each
        other group the longest it serves within it, until no group shortens it. Each group's
        answer is the longest it serves up to the candidate, so the fixed point is the longest
        prefix all of them serve."""
        size = self.block_size
        length = (len(token_ids) - 1) // size * size
        hits: list[list[Block]] = [[] for _ in self.managers]
        if not self._caching or length == 0:
            return hits, 0
        chain_block_hashes(token_ids[:length], size, block_hashes)
        for m in self._full:
            hits[m.group_id], found = m.find_longest_cache_hit(block_hashes, token_ids, length)
            length = min(length, found)
        shortened = True
        while shortened:
            shortened = False
            for m in self._others:
                hits[m.group_id], found = m.find_longest_cache_hit(block_hashes, token_ids, length)
                if found < length:
                    length, shortened = found, True
        for m in self._full:
            del hits[m.group_id][length // size :]
        return hits, length

    # --- changes -------------------------------------------------------------------------------
    def plan_allocation(self, prompt) -> HybridAllocationPlan:
        """What allocating ``prompt`` (a token count, or token ids) takes now; nothing changes."""
        if self.dense is not None:
            plan = self.dense.plan_allocation(prompt)
            cached = plan.cached
            return HybridAllocationPlan(
                plan.num_tokens,
                plan.token_ids,
                len(cached) * self.block_size,
                (cached,),
                plan.blocks_needed(self.block_size),
                plan.available,
                [],
            )
        num_tokens, ids = _prompt(prompt)
        hashes: list[bytes] = []
        hits, length = ([[] for _ in self.managers], 0)
        if ids is not None:
            hits, length = self.find_longest_cache_hit(ids, hashes)
        needed = sum(
            m.blocks_to_allocate(num_tokens, h) for m, h in zip(self.managers, hits, strict=True)
        )
        # a cached block nobody holds is free until the prompt takes it: it cannot also be new
        null = self.null_block
        taken = sum(b.ref_count == 0 and b is not null for h in hits for b in h)
        available = self.pool.num_free_blocks - taken
        return HybridAllocationPlan(num_tokens, ids, length, tuple(hits), needed, available, hashes)

    def can_allocate(self, prompt) -> bool:
        plan = self.plan_allocation(prompt)
        return plan.blocks_needed <= plan.available

    def allocate(self, seq_id, prompt, *, num_computed: int | None = None) -> tuple[list[int], ...]:
        """Check in a new sequence holding a prompt (a token count, or token ids): its blocks in
        every group, from its cached prefix on. Returns its block tables. ``num_computed``: as
        :meth:`BlockManager.allocate` (only that much of the prompt is findable yet)."""
        if self.dense is not None:
            return (self.dense.allocate(seq_id, prompt, num_computed=num_computed),)
        self._new(seq_id)
        plan = self.plan_allocation(prompt)
        num_computed_of(num_computed, plan.num_tokens)
        if plan.blocks_needed > plan.available:
            raise self._out_of_blocks(seq_id, plan.blocks_needed, plan.available)
        # every group's hit blocks are held before any group takes new ones: a new block taken
        # for one group must not evict a block another group found (vLLM's two phases)
        null = self.null_block
        self.pool.share(b for hit in plan.hit_blocks for b in hit if b is not null)
        for m, hit in zip(self.managers, plan.hit_blocks, strict=True):
            m.allocate(seq_id, plan.num_tokens, hit)
        seq = self._seqs[seq_id] = _Sequence(plan.num_tokens, plan.num_cached_tokens)
        ids = plan.token_ids
        if ids is not None and self.enable_prefix_caching:
            self.queries += plan.num_tokens
            self.hits += plan.num_cached_tokens
            if num_computed is not None:
                ids = ids[: max(plan.num_cached_tokens, num_computed)]
            seq.token_ids = list(ids)
            seq.block_hashes = plan.block_hashes[: len(ids) // self.block_size]
            self._cache_full_blocks(seq_id, seq)
        return self.block_tables(seq_id)

    def _cache_full_blocks(self, seq_id, seq: _Sequence) -> None:
        if not self._caching:
            return
        chain_block_hashes(seq.token_ids, self.block_size, seq.block_hashes)
        for m in self.managers:
            m.cache_blocks(seq_id, seq.block_hashes, seq.token_ids)

    def _growth(self, seq_id, seq: _Sequence) -> tuple[int, int]:
        """(blocks one more token takes in all groups, blocks free for it: the free ones and
        those a window hands back first)."""
        n = seq.num_tokens
        needed = sum(m.blocks_to_grow(seq_id, n, 1) for m in self.managers)
        freed = sum(m.blocks_freed_by_skipping(seq_id, n) for m in self.managers)
        return needed, self.pool.num_free_blocks + freed

    def can_append(self, seq_id) -> bool:
        if self.dense is not None:
            return self.dense.can_append(seq_id)
        needed, available = self._growth(seq_id, self._seq(seq_id))
        return needed <= available

    def append_slot(self, seq_id, token_id=None) -> list[tuple[int, int, int]]:
        """Make room for one more token of ``seq_id`` in every group (with prefix caching,
        pass its id: a block it fills is findable at once). Returns ``(group, src, dst)`` for
        each shared, partly filled block copied on write: the caller copies its K/V."""
        if self.dense is not None:
            moved = self.dense.append_slot(seq_id, token_id)
            return [] if moved is None else [(0, *moved)]
        seq = self._seq(seq_id)
        n = seq.num_tokens
        if token_id is not None:
            token_id = self._check_token_id(seq_id, seq, token_id)
        needed, available = self._growth(seq_id, seq)
        if needed > available:
            raise self._out_of_blocks(seq_id, needed, available)
        copies = []
        for m in self.managers:
            m.remove_skipped_blocks(seq_id, n)
        for m in self.managers:
            moved = m.grow(seq_id, n, 1)
            if moved is not None:
                copies.append((m.group_id, *moved))
        seq.num_tokens = n + 1
        if token_id is not None and seq.token_ids is not None:
            seq.token_ids.append(token_id)
            if (n + 1) % self.block_size == 0:
                self._cache_full_blocks(seq_id, seq)
        return copies

    def _check_token_id(self, seq_id, seq: _Sequence, token_id) -> int:
        token_id = _token_id(token_id, "token_id")
        ids = seq.token_ids
        if ids is None and self.enable_prefix_caching:
            raise ValueError(
                f"{seq_id!r} was allocated with a token count, so its token ids are unknown: "
                "call append_slot without token_id (or allocate it with token ids)"
            )
        if ids is not None and len(ids) != seq.num_tokens:
            raise ValueError(
                f"{seq_id!r} knows the ids of {len(ids)} of its {seq.num_tokens} tokens: give "
                "the missing ones to cache_computed before appending with a token_id"
            )
        return token_id

    def cache_computed(self, seq_id, token_ids, num_computed: int) -> None:
        """The K/V of the sequence's first ``num_computed`` tokens are written: as
        :meth:`BlockManager.cache_computed`, in every group (a block a window has handed back
        is not cached)."""
        if self.dense is not None:
            return self.dense.cache_computed(seq_id, token_ids, num_computed)
        seq = self._seq(seq_id)
        ids = seq.token_ids
        if ids is None:
            if self.enable_prefix_caching:
                raise ValueError(f"{seq_id!r} was allocated with a token count: no ids to cache")
            return None
        positive_int("num_computed", num_computed, minimum=0)
        known = len(ids)
        if num_computed < known:
            return None  # already known
        if num_computed > seq.num_tokens:
            raise ValueError(
                f"num_computed must be in 0..{seq.num_tokens} (the tokens {seq_id!r} holds), "
                f"got {num_computed}"
            )
        new = list(token_ids[known:num_computed])
        if len(new) != num_computed - known:
            raise ValueError(f"token_ids holds {len(token_ids)} ids, fewer than {num_computed}")
        # every id checked before any is kept: a bad one changes nothing
        ids.extend([_token_id(t, f"token_ids[{known + i}]") for i, t in enumerate(new)])
        self._cache_full_blocks(seq_id, seq)
        return None

    def fork(self, parent_id, child_id) -> list[tuple[int, int, int]]:
        """The child shares every block of the parent's full-attention and window tables (each
        block's ref_count goes up by one); a state group gives it a block of its own, which the
        caller fills by copying the parent's state: returned as ``(group, src, dst)``. vLLM
        forks nothing (a parallel sample is a request of its own, whose state is computed
        again); a copy gives the same state without the recompute."""
        if self.dense is not None:
            self.dense.fork(parent_id, child_id)
            return []
        parent = self._seq(parent_id)
        self._new(child_id)
        needed = sum(m.blocks_to_fork() for m in self.managers)
        if needed > self.pool.num_free_blocks:
            raise self._out_of_blocks(child_id, needed, self.pool.num_free_blocks)
        copies = []
        for m in self.managers:
            copied = m.fork(parent_id, child_id)
            if copied is not None:
                copies.append((m.group_id, *copied))
        self._seqs[child_id] = parent.copy()
        return copies

    def free(self, seq_id) -> None:
        """Check out: every group's blocks lose a reference, group by group, each table last
        block first (vLLM's order); blocks nobody holds join the free queue, cached ones still
        findable."""
        if self.dense is not None:
            return self.dense.free(seq_id)
        self._seq(seq_id)
        for m in self.managers:
            m.free(seq_id)
        del self._seqs[seq_id]
        return None

    # --- checks --------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise AssertionError unless every block is exactly one of held (by as many tables as
        its ref_count, all in one group at one position), cached-evictable or free; the null
        block is none of them; every table is what its group holds for the sequence's tokens;
        and the cached map agrees with the blocks."""
        if self.dense is not None:
            return self.dense.check_invariants()
        null, pool = self.null_block, self.pool
        holders: dict[int, int] = {}
        place: dict[int, tuple[int, int]] = {}
        for m in self.managers:
            assert m.tables.keys() == self._seqs.keys(), f"group {m.group_id}: sequences"
        for seq_id, seq in self._seqs.items():
            ids = seq.token_ids
            assert ids is None or len(ids) <= seq.num_tokens, f"{seq_id!r}: more ids than tokens"
            assert ids is not None or not seq.block_hashes, f"{seq_id!r}: hashes without ids"
            for m in self.managers:
                m.check_table(seq_id, seq.num_tokens)
                for i, block in enumerate(m.tables[seq_id]):
                    if block is null:
                        continue
                    b = block.block_id
                    holders[b] = holders.get(b, 0) + 1
                    where = place.setdefault(b, (m.group_id, i))
                    assert where == (m.group_id, i), f"block {b} in two places"
        assert null.ref_count == 0 and null.block_hash is None, "the null block was used"
        assert null not in pool.free_queue, "the null block is in the free queue"
        in_use = 0
        for block in pool.blocks[: self.num_blocks]:
            held = holders.get(block.block_id, 0)
            assert block.ref_count == held, f"block {block.block_id}: ref_count {block.ref_count}"
            assert (block in pool.free_queue) == (held == 0), f"block {block.block_id}: queue"
            in_use += held > 0
        assert in_use + self.num_free_blocks == self.num_blocks, "free blocks miscounted"
        assert pool.num_shared == sum(n > 1 for n in holders.values()), "num_shared"
        assert pool.evictor is None, "a hybrid pool has no evictor"
        hashed = 0
        for block in pool.blocks:
            if block.block_hash is not None:
                hashed += 1
                group, _ = block.block_hash
                assert pool.cached.get(block.block_hash) is block, "cached map out of step"
                assert len(block.token_ids) == self.block_size, "a cached block is not full"
                where = place.get(block.block_id)
                assert where is None or where[0] == group, f"block {block.block_id}: group"
        assert hashed == len(pool.cached), "the cached map holds blocks that are not cached"
        assert self._caching or not pool.cached, "cached without prefix caching"
        return None
