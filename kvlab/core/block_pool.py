"""The pool of physical KV blocks: reference counts, a free queue in LRU order, and the
``block_hash -> block`` map of prefix caching (Lab 07).

Freed blocks join the back of the free queue and new blocks come from the front, so the block
freed longest ago is handed out first. A block that still holds a cached prefix can then stay
findable by its hash for as long as possible, and be taken back out of the middle of the queue
(in O(1)) when a new sequence reuses it. This is the shape of vLLM v1's ``BlockPool``.

A prefix cache that orders its own evictions (the radix tree evicts leaves, least recently used
first) keeps the cached blocks nobody holds out of the free queue instead: it is the pool's
:class:`Evictor`, its blocks count as free, and the pool takes them back through it when the free
queue runs short.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Protocol

from kvlab.core.validate import positive_int

ROOT_HASH = 0  # the "parent hash" of a sequence's first block


def hash_block_tokens(parent_hash: int, token_ids: Sequence[int]) -> int:
    """The hash of one full block: chained to its parent block's hash, so the same tokens after a
    different prefix hash differently. Python's tuple-of-ints hash is the same in every process
    (ints are never salted). A hash is only a lookup key: a hit is confirmed by comparing tokens."""
    return hash((parent_hash, tuple(token_ids)))


class Block:
    """One physical block: its id, how many block tables hold it, and (once full and cached) the
    hash and token ids it holds, with the block before it in the prefix.

    ``epoch`` counts how often the block was handed out: a cached block remembers its parent's
    epoch, so a parent overwritten since (same object, other tokens) never confirms a hit.
    ``node`` is the radix-tree node holding the block (None: not in a tree); such a block waits
    in the tree, not in the free queue, while nobody holds it.
    """

    __slots__ = (
        "block_id",
        "ref_count",
        "block_hash",
        "token_ids",
        "parent",
        "parent_epoch",
        "epoch",
        "node",
    )

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: Hashable | None = None
        self.token_ids: tuple[int, ...] | None = None
        self.parent: Block | None = None
        self.parent_epoch = 0
        self.epoch = 0
        self.node = None

    def __repr__(self) -> str:
        cached = "" if self.block_hash is None else ", cached"
        return f"Block({self.block_id}, ref_count={self.ref_count}{cached})"


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

    def blocks(self) -> list[Block]:
        """The blocks from the front (handed out next) to the back (freed last)."""
        return list(self._blocks.values())

    def __contains__(self, block: Block) -> bool:
        return block.block_id in self._blocks


class Evictor(Protocol):
    """A prefix cache that keeps its cached blocks out of the free queue while nobody holds them
    (they still count as free), and hands them over when the free queue runs short."""

    evictable_blocks: int  # blocks it keeps that nobody holds

    def evict(self, num_blocks: int) -> None:
        """Forget ``num_blocks`` of them and append them to the pool's free queue."""
        ...

    def block_held(self, block: Block) -> None:
        """A block it keeps went from nobody holding it to one block table."""
        ...

    def block_released(self, block: Block) -> None:
        """A block it keeps lost its last holder."""
        ...


class BlockPool:
    """``num_blocks`` blocks; hands them out, takes references back, and keeps the cached ones
    findable by hash until their block is handed out again (evicted)."""

    def __init__(self, num_blocks: int):
        self.num_blocks = positive_int("num_blocks", num_blocks)
        self.blocks = [Block(i) for i in range(self.num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[Hashable, Block] = {}  # block_hash -> block (filled by prefix caching)
        self.num_shared = 0  # blocks held by more than one block table
        self.num_evictions = 0  # cached blocks handed out again (their tokens forgotten)
        self.evictor: Evictor | None = None  # keeps unheld cached blocks out of the free queue
        # told of each cached block just before its prefix is forgotten (a lower tier keeps it)
        self.on_evict: Callable[[Block], None] | None = None

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now: plain free and cached-evictable, each once."""
        evictor = self.evictor
        return len(self.free_queue) + (0 if evictor is None else evictor.evictable_blocks)

    def get_new_block(self) -> Block:
        """The block at the front of the free queue, now held once. A cached block handed out
        is evicted: it loses its hash, since its old contents are about to be overwritten."""
        evictor = self.evictor
        if evictor is not None and not self.free_queue and evictor.evictable_blocks:
            evictor.evict(1)
        block = self.free_queue.popleft()
        if block.block_hash is not None:
            self._evict(block)
        block.epoch += 1
        block.ref_count = 1
        return block

    def get_new_blocks(self, n: int) -> list[Block]:
        """``n`` blocks from the front of the free queue (all or none)."""
        short = n - len(self.free_queue)
        if short > 0:
            if self.evictor is None or short > self.evictor.evictable_blocks:
                raise ValueError(f"cannot take {n} blocks: only {self.num_free_blocks} are free")
            self.evictor.evict(short)
        blocks = self.free_queue.popleft_n(n)
        for block in blocks:
            if block.block_hash is not None:
                self._evict(block)
            block.epoch += 1
            block.ref_count = 1
        return blocks

    def _evict(self, block: Block) -> None:
        if self.on_evict is not None:
            self.on_evict(block)
        del self.cached[block.block_hash]
        block.block_hash = block.token_ids = block.parent = None
        self.num_evictions += 1

    def cache(self, block: Block, block_hash: Hashable, token_ids: tuple, parent) -> bool:
        """Make a full block findable by ``block_hash``. A hash already taken keeps its block
        (this one stays unfindable, and is plain free once nobody holds it)."""
        if block_hash in self.cached or block.block_hash is not None:
            return False
        block.block_hash, block.token_ids, block.parent = block_hash, token_ids, parent
        block.parent_epoch = 0 if parent is None else parent.epoch
        self.cached[block_hash] = block
        return True

    def lookup(self, block_hash: Hashable, token_ids: tuple, parent) -> Block | None:
        """The cached block holding ``token_ids`` right after ``parent`` (None: the first block),
        or None. The hash only finds a candidate; its tokens and its parent confirm it, so a
        hash collision can never share another prefix's K/V."""
        block = self.cached.get(block_hash)
        return block if block is not None and self.confirms(block, token_ids, parent) else None

    def confirms(self, block: Block, token_ids: tuple, parent) -> bool:
        """Whether a candidate found by its hash holds ``token_ids`` right after ``parent``, as it
        held them when it was cached (a hook: Lab 07's usual slips skip a confirmation)."""
        if block.token_ids != token_ids or block.parent is not parent:
            return False
        return parent is None or block.parent_epoch == parent.epoch

    def share(self, blocks: Iterable[Block]) -> None:
        """One more block table holds each block (a fork, or a cache hit on a free block)."""
        for block in blocks:
            if block.ref_count == 0:
                if block.node is None:
                    self.free_queue.remove(block)
                else:
                    self.evictor.block_held(block)
            block.ref_count += 1
            self.num_shared += block.ref_count == 2

    def free_blocks(self, blocks: Iterable[Block]) -> None:
        """Each block loses one holder; blocks nobody holds join the back of the free queue, in
        the order given (cached ones stay findable there until they are handed out), or wait
        with the evictor that keeps them."""
        append = self.free_queue.append
        for block in blocks:
            if block.ref_count < 1:
                raise ValueError(f"block {block.block_id} is already free")
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.node is None:
                    append(block)
                else:
                    self.evictor.block_released(block)
            elif block.ref_count == 1:
                self.num_shared -= 1
