"""The pool of physical KV blocks: reference counts, a free queue in LRU order, and room for a
``block_hash -> block`` map (prefix caching, Lab 07).

Freed blocks join the back of the free queue and new blocks come from the front, so the block
freed longest ago is handed out first. A block that still holds a cached prefix can then stay
findable by its hash for as long as possible, and be taken back out of the middle of the queue
(in O(1)) when a new sequence reuses it. This is the shape of vLLM v1's ``BlockPool``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from kvlab.validate import positive_int


class Block:
    """One physical block: its id, how many block tables hold it, and (once full and cached) the
    hash of the tokens it holds. ``prev_free``/``next_free`` link it into the free queue."""

    __slots__ = ("block_id", "ref_count", "block_hash", "prev_free", "next_free")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: Hashable | None = None
        self.prev_free: Block | None = None
        self.next_free: Block | None = None

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref_count={self.ref_count})"


class FreeBlockQueue:
    """Free blocks in a doubly linked list: take from the front, return to the back, and remove a
    given block from anywhere, each in O(1)."""

    def __init__(self, blocks: Iterable[Block]):
        self._head = Block(-1)  # sentinels: the list is never empty at the ends
        self._tail = Block(-1)
        self._head.next_free, self._tail.prev_free = self._tail, self._head
        self._len = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self._len

    def popleft(self) -> Block:
        block = self._head.next_free
        if block is self._tail:
            raise IndexError("the free queue is empty")
        self._head.next_free = block.next_free
        block.next_free.prev_free = self._head
        block.prev_free = block.next_free = None
        self._len -= 1
        return block

    def append(self, block: Block) -> None:
        last = self._tail.prev_free
        block.prev_free, block.next_free = last, self._tail
        last.next_free = self._tail.prev_free = block
        self._len += 1

    def remove(self, block: Block) -> None:
        if block.prev_free is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        block.prev_free.next_free = block.next_free
        block.next_free.prev_free = block.prev_free
        block.prev_free = block.next_free = None
        self._len -= 1

    def block_ids(self) -> list[int]:
        """Ids from the front (handed out next) to the back (freed last)."""
        ids, block = [], self._head.next_free
        while block is not self._tail:
            ids.append(block.block_id)
            block = block.next_free
        return ids


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
        loses its hash (its old contents are about to be overwritten)."""
        block = self.free_queue.popleft()
        if block.block_hash is not None:
            del self.cached[block.block_hash]
            block.block_hash = None
        block.ref_count = 1
        return block

    def get_new_blocks(self, n: int) -> list[Block]:
        """``n`` blocks from the front of the free queue (all or none)."""
        if n > len(self.free_queue):
            raise ValueError(f"cannot take {n} blocks: only {len(self.free_queue)} are free")
        return [self.get_new_block() for _ in range(n)]

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
