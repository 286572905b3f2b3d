"""The pool of physical KV blocks: reference counts, a free queue in LRU order, and room for a
``block_hash -> block`` map (prefix caching, Lab 07).

Freed blocks join the back of the free queue and new blocks come from the front, so the block
freed longest ago is handed out first. A block that still holds a cached prefix can then stay
findable by its hash for as long as possible, and be taken back out of the middle of the queue
(in O(1)) when a new sequence reuses it. This is the shape of vLLM v1's ``BlockPool``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable

from kvlab.validate import positive_int


class Block:
    """One physical block: its id, how many block tables hold it, and (once full and cached) the
    hash of the tokens it holds."""

    __slots__ = ("block_id", "ref_count", "block_hash")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: Hashable | None = None

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref_count={self.ref_count})"


class FreeBlockQueue:
    """Free blocks in order: take from the front, return to the back, and remove a given block
    from anywhere, each in O(1) (an insertion-ordered map from block id to block)."""

    def __init__(self, blocks: Iterable[Block]):
        self._blocks: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in blocks)

    def __len__(self) -> int:
        return len(self._blocks)

    def popleft(self) -> Block:
        if not self._blocks:
            raise IndexError("the free queue is empty")
        return self._blocks.popitem(last=False)[1]

    def popleft_n(self, n: int) -> list[Block]:
        """The first ``n`` blocks (there must be that many)."""
        pop = self._blocks.popitem
        return [pop(last=False)[1] for _ in range(n)]

    def append(self, block: Block) -> None:
        self._blocks[block.block_id] = block

    def remove(self, block: Block) -> None:
        if self._blocks.pop(block.block_id, None) is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")

    def block_ids(self) -> list[int]:
        """Ids from the front (handed out next) to the back (freed last)."""
        return list(self._blocks)


class BlockPool:
    """``num_blocks`` blocks; hands them out, takes references back, and keeps the cached ones
    findable by hash until their block is reused."""

    def __init__(self, num_blocks: int):
        self.num_blocks = positive_int("num_blocks", num_blocks)
        self.blocks = [Block(i) for i in range(self.num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[Hashable, Block] = {}  # block_hash -> block (filled by prefix caching)
        self.num_shared = 0  # blocks held by more than one block table

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def get_new_block(self) -> Block:
        """The block at the front of the free queue, now held once. A cached block handed out
        loses its hash: its old contents are about to be overwritten."""
        block = self.free_queue.popleft()
        if block.block_hash is not None:
            self._forget(block)
        block.ref_count = 1
        return block

    def get_new_blocks(self, n: int) -> list[Block]:
        """``n`` blocks from the front of the free queue (all or none)."""
        if n > len(self.free_queue):
            raise ValueError(f"cannot take {n} blocks: only {len(self.free_queue)} are free")
        blocks = self.free_queue.popleft_n(n)
        for block in blocks:
            if block.block_hash is not None:
                self._forget(block)
            block.ref_count = 1
        return blocks

    def _forget(self, block: Block) -> None:
        del self.cached[block.block_hash]
        block.block_hash = None

    def share(self, blocks: Iterable[Block]) -> None:
        """One more block table holds each block (a fork, or a cache hit on a free block)."""
        for block in blocks:
            if block.ref_count == 0:
                self.free_queue.remove(block)
            block.ref_count += 1
            self.num_shared += block.ref_count == 2

    def free_blocks(self, blocks: Iterable[Block]) -> None:
        """Each block loses one holder; blocks nobody holds join the back of the free queue, in
        the order given."""
        append = self.free_queue.append
        for block in blocks:
            if block.ref_count < 1:
                raise ValueError(f"block {block.block_id} is already free")
            block.ref_count -= 1
            if block.ref_count == 0:
                append(block)
            elif block.ref_count == 1:
                self.num_shared -= 1
