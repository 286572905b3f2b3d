"""One layer group's block tables, as vLLM v1's ``SingleTypeKVCacheManager``s keep them.

A hybrid model's groups all draw blocks from one :class:`~kvlab.core.block_pool.BlockPool` (a
block is one page of one group). Each group keeps, per sequence, its own block table and knows
what its kind of layer needs of it:

- full attention (and latent attention, MLA, which differs only in its page bytes) keeps every
  block of the sequence;
- a sliding window hands back the blocks that fall wholly out of the window as the sequence
  grows; the pool's *null block* stands in the table at those positions (never handed out,
  never freed, never counted);
- a fixed state (Mamba, linear attention) holds one block per sequence, whatever its length.

The coordinator (:class:`~kvlab.core.hybrid_block_manager.HybridBlockManager`) asks every group
how many blocks a change takes before it makes the change in any, so that a change is all or
nothing; a group never raises for want of blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Protocol

from kvlab.core.block_pool import Block, BlockPool
from kvlab.core.kv_spec import KVCacheSpec, SlidingWindowSpec, cdiv

PAGED_KINDS = ("full_attention", "mla")  # kinds that keep every block of a sequence


class SingleTypeManager(Protocol):
    """What the coordinator asks of one layer group. ``num_tokens`` is always the sequence's
    length after the change; the coordinator checks the free blocks before any change."""

    spec: KVCacheSpec
    group_id: int
    tables: dict[Hashable, list[Block]]

    def find_longest_cache_hit(
        self, block_hashes: Sequence[bytes], token_ids: Sequence[int], max_length: int
    ) -> tuple[list[Block], int]:
        """This group's cached blocks for the longest prefix of at most ``max_length`` tokens it
        can serve alone (null blocks where it needs none), and that length. Nothing changes."""
        ...

    def blocks_to_allocate(self, num_tokens: int, hit_blocks: list[Block]) -> int:
        """Blocks a new sequence of ``num_tokens`` takes from the pool besides ``hit_blocks``."""
        ...

    def allocate(self, seq_id: Hashable, num_tokens: int, hit_blocks: list[Block]) -> None:
        """A new sequence's table: ``hit_blocks`` (the coordinator has shared them) and new ones."""
        ...

    def blocks_to_grow(self, seq_id: Hashable, num_tokens: int, new_tokens: int) -> int:
        """Blocks growing from ``num_tokens`` to ``num_tokens + new_tokens`` takes (copy-on-write
        of a shared, partly filled last block included)."""
        ...

    def grow(self, seq_id: Hashable, num_tokens: int, new_tokens: int) -> tuple[int, int] | None:
        """Grow the table; ``(src, dst)`` when the last block was copied on write."""
        ...

    def blocks_freed_by_skipping(self, seq_id: Hashable, num_computed: int) -> int:
        """Blocks :meth:`remove_skipped_blocks` would give back to the pool now."""
        ...

    def remove_skipped_blocks(self, seq_id: Hashable, num_computed: int) -> None:
        """Hand back the blocks no later token reads once ``num_computed`` tokens are computed."""
        ...

    def blocks_to_fork(self) -> int: ...

    def fork(self, parent_id: Hashable, child_id: Hashable) -> tuple[int, int] | None:
        """The child's table; ``(src, dst)`` when a block must be copied for it."""
        ...

    def cache_blocks(
        self, seq_id: Hashable, block_hashes: Sequence[bytes], token_ids: Sequence[int]
    ) -> None:
        """Make the sequence's full blocks named in ``block_hashes`` findable (new ones only)."""
        ...

    def free(self, seq_id: Hashable) -> None: ...

    def check_table(self, seq_id: Hashable, num_tokens: int) -> None:
        """AssertionError unless the table is what this kind of group holds for ``num_tokens``."""
        ...


class FullAttentionManager:
    """Every block of the sequence, as :class:`~kvlab.core.block_manager.BlockManager` keeps its
    one table: new blocks come from the front of the free queue, a shared, partly filled last
    block is copied on write, a fork shares every block, and a freed table goes back last block
    first. Serves MLA groups too (same blocks, other page bytes)."""

    def __init__(
        self, spec: KVCacheSpec, group_id: int, pool: BlockPool, block_size: int, null_block: Block
    ):
        self.spec = spec
        self.group_id = group_id
        self.pool = pool
        self.block_size = block_size
        self.null_block = null_block
        self.tables: dict[Hashable, list[Block]] = {}
        self._noted: dict[Hashable, int] = {}  # full blocks offered to the prefix cache

    # --- prefix caching ------------------------------------------------------------------------
    def _cached(self, i: int, block_hashes: Sequence[bytes], token_ids: Sequence[int]):
        """The cached block of this group holding block ``i`` of ``token_ids``, or None."""
        block = self.pool.cached.get((self.group_id, block_hashes[i]))
        size = self.block_size
        if block is None or block.token_ids != tuple(token_ids[i * size : (i + 1) * size]):
            return None
        return block

    def find_longest_cache_hit(self, block_hashes, token_ids, max_length):
        """Cached blocks from the first on, while they last (full attention reads them all)."""
        blocks = []
        for i in range(max_length // self.block_size):
            block = self._cached(i, block_hashes, token_ids)
            if block is None:
                break
            blocks.append(block)
        return blocks, len(blocks) * self.block_size

    def cache_blocks(self, seq_id, block_hashes, token_ids) -> None:
        table, size, null = self.tables[seq_id], self.block_size, self.null_block
        for i in range(self._noted[seq_id], len(block_hashes)):
            block = table[i]
            if block is not null:  # a window's skipped block: its K/V are gone
                tokens = tuple(token_ids[i * size : (i + 1) * size])
                self.pool.cache(block, (self.group_id, block_hashes[i]), tokens, None)
        self._noted[seq_id] = len(block_hashes)

    # --- changes -------------------------------------------------------------------------------
    def blocks_to_allocate(self, num_tokens: int, hit_blocks: list[Block]) -> int:
        return cdiv(num_tokens, self.block_size) - len(hit_blocks)

    def allocate(self, seq_id, num_tokens: int, hit_blocks: list[Block]) -> None:
        new = self.pool.get_new_blocks(self.blocks_to_allocate(num_tokens, hit_blocks))
        self.tables[seq_id] = list(hit_blocks) + new
        self._noted[seq_id] = 0

    def _copies_last(self, table: list[Block], num_tokens: int, new_tokens: int) -> bool:
        return bool(new_tokens and num_tokens % self.block_size and table[-1].ref_count > 1)

    def blocks_to_grow(self, seq_id, num_tokens: int, new_tokens: int) -> int:
        table = self.tables[seq_id]
        grown = cdiv(num_tokens + new_tokens, self.block_size) - len(table)
        return grown + self._copies_last(table, num_tokens, new_tokens)

    def grow(self, seq_id, num_tokens: int, new_tokens: int) -> tuple[int, int] | None:
        table, pool = self.tables[seq_id], self.pool
        moved = None
        if self._copies_last(table, num_tokens, new_tokens):
            last = table[-1]
            table[-1] = pool.get_new_block()
            pool.free_blocks([last])
            moved = last.block_id, table[-1].block_id
        grown = cdiv(num_tokens + new_tokens, self.block_size) - len(table)
        if grown == 1:
            table.append(pool.get_new_block())
        elif grown > 1:
            table.extend(pool.get_new_blocks(grown))
        return moved

    def blocks_freed_by_skipping(self, seq_id, num_computed: int) -> int:
        return 0

    def remove_skipped_blocks(self, seq_id, num_computed: int) -> None:
        """Nothing: every earlier token is read by every later one."""

    def blocks_to_fork(self) -> int:
        return 0

    def fork(self, parent_id, child_id) -> None:
        table = self.tables[parent_id]
        null = self.null_block
        self.pool.share(block for block in table if block is not null)
        self.tables[child_id] = list(table)
        self._noted[child_id] = self._noted[parent_id]

    def free(self, seq_id) -> None:
        table = self.tables.pop(seq_id)
        del self._noted[seq_id]
        null = self.null_block
        self.pool.free_blocks(block for block in reversed(table) if block is not null)

    def check_table(self, seq_id, num_tokens: int) -> None:
        table = self.tables[seq_id]
        assert len(table) == cdiv(num_tokens, self.block_size), f"{seq_id!r}: table length"
        assert self.null_block not in table, f"{seq_id!r}: a null block in a full table"


class SlidingWindowManager(FullAttentionManager):
    """The blocks of the last ``window`` tokens. Once ``num_computed`` tokens are computed, the
    next token reads positions ``first_needed(num_computed)`` on, so the blocks wholly before
    that go back to the pool and the null block takes their place (vLLM's
    ``remove_skipped_blocks``). A freed block keeps its prefix findable until it is handed out
    again."""

    def __init__(self, spec: SlidingWindowSpec, *args):
        super().__init__(spec, *args)
        # blocks a prefix hit needs cached just before its end: the window less the token itself
        self.contiguous_blocks = cdiv(spec.window - 1, self.block_size)

    def find_longest_cache_hit(self, block_hashes, token_ids, max_length):
        """The longest prefix whose last ``window - 1`` tokens' blocks are cached, searched from
        the right as vLLM's ``SlidingWindowManager`` does; a run of cached blocks from the first
        block serves a prefix shorter than the window. A window of 1 reads no earlier token, so
        it serves any length (vLLM still asks for one cached block: kvlab does not)."""
        size, null = self.block_size, self.null_block
        num_blocks, needed = max_length // size, self.contiguous_blocks
        if needed == 0:
            return [null] * num_blocks, num_blocks * size
        blocks, run = [null] * num_blocks, 0
        for i in range(num_blocks - 1, -1, -1):
            block = self._cached(i, block_hashes, token_ids)
            if block is None:
                run = 0
                continue
            blocks[i] = block
            run += 1
            if run >= needed:
                del blocks[i + run :]
                return blocks, (i + run) * size
        del blocks[run:]
        return blocks, run * size

    # The step is four small decisions, each a hook (Lab 11's slips change one of them).
    def _skip_end(self, num_computed: int) -> int:
        """How many of the table's first blocks lie wholly before the next token's window."""
        return self.spec.first_needed(num_computed) // self.block_size

    def _handed_back(self, block: Block) -> bool:
        """Whether a table entry went back at an earlier step (the null block stands there)."""
        return block is self.null_block

    def _stand_in(self, table: list[Block], end: int, count: int) -> None:
        """The null block in the ``count`` places before ``end``: block i stays at place i."""
        table[end - count : end] = [self.null_block] * count

    def _give_back(self, skipped: list[Block]) -> None:
        self.pool.free_blocks(skipped)

    def _skipped(self, seq_id, num_computed: int) -> list[Block]:
        """The blocks before the window of the next token not yet handed back, last first."""
        table = self.tables[seq_id]
        skipped = []
        for i in range(self._skip_end(num_computed) - 1, -1, -1):
            if self._handed_back(table[i]):
                break  # the blocks before it went back earlier
            skipped.append(table[i])
        return skipped

    def blocks_freed_by_skipping(self, seq_id, num_computed: int) -> int:
        return sum(block.ref_count == 1 for block in self._skipped(seq_id, num_computed))

    def remove_skipped_blocks(self, seq_id, num_computed: int) -> None:
        skipped = self._skipped(seq_id, num_computed)
        if skipped:
            self._stand_in(self.tables[seq_id], self._skip_end(num_computed), len(skipped))
            self._give_back(skipped)

    def check_table(self, seq_id, num_tokens: int) -> None:
        table, null = self.tables[seq_id], self.null_block
        assert len(table) == cdiv(num_tokens, self.block_size), f"{seq_id!r}: table length"
        skipped = sum(block is null for block in table)
        assert all(block is null for block in table[:skipped]), f"{seq_id!r}: nulls not first"
        # never a block a later token still reads: every token but the newest is computed
        limit = self.spec.first_needed(num_tokens - 1) // self.block_size
        assert skipped <= limit, f"{seq_id!r}: a block in the window was handed back"


class WindowStep(Protocol):
    """A window group's hand-back step written elsewhere (Lab 11's exercise), on the key card as
    room numbers: hand back, with ``free(rooms)``, the rooms of ``block_table`` wholly before the
    window of the token after ``num_computed`` computed ones, and write ``null_block`` (the null
    room's number) in their places, in place."""

    def __call__(
        self,
        block_table: list[int],
        num_computed: int,
        *,
        window: int,
        block_size: int,
        free: Callable[[list[int]], None],
        null_block: int,
    ) -> None: ...


class SteppedWindowManager(SlidingWindowManager):
    """A sliding window whose hand-back is ``step`` (a :class:`WindowStep`), kvlab's own
    counting of the blocks it frees kept (the coordinator asks it before any change). The step
    sees room numbers, so it runs as well where the key card travels by value (the judge)."""

    def __init__(self, spec: SlidingWindowSpec, *args, step: WindowStep):
        super().__init__(spec, *args)
        if not callable(step):
            raise TypeError(f"window_step must be callable, got {step!r}")
        self.step = step

    def _block(self, room) -> Block:
        if isinstance(room, bool) or not isinstance(room, int):
            raise TypeError(f"a key card holds room numbers (ints), got {room!r}")
        if not 0 <= room < len(self.pool.blocks):
            raise ValueError(
                f"room {room} is not in the hotel (rooms 0..{len(self.pool.blocks) - 1})"
            )
        return self.pool.blocks[room]

    def _free(self, rooms) -> None:
        if isinstance(rooms, (int, str, bytes)) or not isinstance(rooms, Iterable):
            raise TypeError(f"free takes a list of room numbers, got {rooms!r}")
        self.pool.free_blocks([self._block(room) for room in rooms])

    def remove_skipped_blocks(self, seq_id, num_computed: int) -> None:
        table = self.tables[seq_id]
        rooms = [block.block_id for block in table]
        self.step(
            rooms,
            num_computed,
            window=self.spec.window,
            block_size=self.block_size,
            free=self._free,
            null_block=self.null_block.block_id,
        )
        table[:] = [self._block(room) for room in rooms]


class StateManager:
    """One block per sequence for its state (vLLM's ``MambaManager`` with
    ``mamba_cache_mode="none"``): taken at allocate, overwritten in place as the sequence grows,
    freed with it. A fork gets a block of its own, into which the caller copies the parent's
    state (returned as ``(src, dst)``), since a state is not read-only as a full block is. It
    caches nothing and serves no prefix: the state at a prefix's end is not kept."""

    def __init__(
        self, spec: KVCacheSpec, group_id: int, pool: BlockPool, block_size: int, null_block: Block
    ):
        self.spec = spec
        self.group_id = group_id
        self.pool = pool
        self.block_size = block_size
        self.null_block = null_block
        self.tables: dict[Hashable, list[Block]] = {}

    def find_longest_cache_hit(self, block_hashes, token_ids, max_length):
        return [], 0

    def cache_blocks(self, seq_id, block_hashes, token_ids) -> None:
        """Nothing: a state block holds no tokens of its own."""

    def blocks_to_allocate(self, num_tokens: int, hit_blocks: list[Block]) -> int:
        return 1

    def allocate(self, seq_id, num_tokens: int, hit_blocks: list[Block]) -> None:
        self.tables[seq_id] = [self.pool.get_new_block()]

    def blocks_to_grow(self, seq_id, num_tokens: int, new_tokens: int) -> int:
        return 0

    def grow(self, seq_id, num_tokens: int, new_tokens: int) -> None:
        return None

    def blocks_freed_by_skipping(self, seq_id, num_computed: int) -> int:
        return 0

    def remove_skipped_blocks(self, seq_id, num_computed: int) -> None:
        """Nothing: the state block stays while the sequence does."""

    def blocks_to_fork(self) -> int:
        return 1

    def fork(self, parent_id, child_id) -> tuple[int, int]:
        block = self.pool.get_new_block()
        self.tables[child_id] = [block]
        return self.tables[parent_id][0].block_id, block.block_id

    def free(self, seq_id) -> None:
        self.pool.free_blocks(self.tables.pop(seq_id))

    def check_table(self, seq_id, num_tokens: int) -> None:
        table = self.tables[seq_id]
        assert len(table) == 1 and table[0] is not self.null_block, f"{seq_id!r}: state block"


def manager_for(
    spec: KVCacheSpec,
    group_id: int,
    pool: BlockPool,
    block_size: int,
    null_block: Block,
    *,
    window_step: WindowStep | None = None,
    window_manager: type[SlidingWindowManager] = SlidingWindowManager,
) -> SingleTypeManager:
    """The manager of a group of ``spec``'s kind (a window's hand-back ``window_step`` where
    given, else ``window_manager``'s own)."""
    if spec.kind == "sliding_window":
        if window_step is not None:
            return SteppedWindowManager(
                spec, group_id, pool, block_size, null_block, step=window_step
            )
        return window_manager(spec, group_id, pool, block_size, null_block)
    if spec.kind in PAGED_KINDS:
        return FullAttentionManager(spec, group_id, pool, block_size, null_block)
    if spec.kind == "state":
        return StateManager(spec, group_id, pool, block_size, null_block)
    raise ValueError(f"groups: no block manager for layers of kind {spec.kind!r}")
