"""The block pool: reference counts, the LRU free queue, and cached blocks found by hash."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core.block_pool import Block, BlockPool, FreeBlockQueue


def test_new_blocks_come_from_the_front_and_freed_ones_join_the_back():
    pool = BlockPool(4)
    a, b = pool.get_new_blocks(2)
    assert (a.block_id, b.block_id, a.ref_count) == (0, 1, 1)
    pool.free_blocks([b, a])
    assert pool.free_queue.block_ids() == [2, 3, 1, 0]
    assert pool.get_new_block().block_id == 2  # freed longest ago (never used) first


def test_shared_blocks_are_counted_once_and_freed_when_nobody_holds_them():
    pool = BlockPool(3)
    blocks = pool.get_new_blocks(2)
    pool.share(blocks)
    assert [b.ref_count for b in blocks] == [2, 2] and pool.num_shared == 2
    pool.free_blocks(blocks)
    assert pool.num_shared == 0 and pool.num_free_blocks == 1
    pool.free_blocks(blocks)
    assert pool.num_free_blocks == 3
    with pytest.raises(ValueError, match="block 0 is already free"):
        pool.free_blocks(blocks[:1])


def test_a_cached_free_block_can_be_taken_back_or_is_evicted_when_reused():
    pool = BlockPool(2)
    block = pool.get_new_block()
    block.block_hash = "prefix"
    pool.cached["prefix"] = block
    pool.free_blocks([block])  # free, but its tokens are still there
    pool.share([pool.cached["prefix"]])  # a cache hit: out of the middle of the queue
    assert block.ref_count == 1 and pool.free_queue.block_ids() == [1]
    pool.free_blocks([block])
    pool.get_new_blocks(2)  # block 1, then block 0: evicted, its hash forgotten
    assert pool.cached == {} and block.block_hash is None


def test_taking_more_blocks_than_are_free_takes_none():
    pool = BlockPool(2)
    with pytest.raises(ValueError, match="cannot take 3 blocks: only 2 are free"):
        pool.get_new_blocks(3)
    assert pool.num_free_blocks == 2
    with pytest.raises(ValueError, match="num_blocks must be >= 1"):
        BlockPool(0)


@settings(max_examples=60)
@given(st.lists(st.tuples(st.sampled_from(["pop", "push", "remove"]), st.integers(0, 9))))
def test_free_queue_behaves_like_a_list(ops):
    blocks = [Block(i) for i in range(10)]
    queue = FreeBlockQueue([])
    model: list[int] = []
    for op, i in ops:
        block = blocks[i]
        if op == "pop" and model:
            assert queue.popleft().block_id == model.pop(0)
        elif op == "push" and i not in model:
            queue.append(block)
            model.append(i)
        elif op == "remove" and i in model:
            queue.remove(block)
            model.remove(i)
        assert queue.block_ids() == model and len(queue) == len(model)
    outside = queue.popleft() if model else blocks[0]
    with pytest.raises(ValueError, match="not in the free queue"):
        queue.remove(outside)


class KeepAll:
    """An evictor that keeps every block given to it (``block.node`` set) until evicted."""

    def __init__(self, pool: BlockPool):
        self.pool, self.evictable_blocks, self.calls = pool, 0, []
        pool.evictor = self

    def block_held(self, block):
        self.calls.append(("held", block.block_id))
        self.evictable_blocks -= 1

    def block_released(self, block):
        self.calls.append(("released", block.block_id))
        self.evictable_blocks += 1

    def evict(self, num_blocks):
        self.calls.append(("evict", num_blocks))
        kept = [b for b in self.pool.blocks if b.node is not None and b.ref_count == 0]
        for block in kept[:num_blocks]:
            block.node = None
            self.pool.free_queue.append(block)
        self.evictable_blocks -= num_blocks


def test_blocks_an_evictor_keeps_count_as_free_and_come_back_through_it():
    pool = BlockPool(4)
    evictor = KeepAll(pool)
    a, b = pool.get_new_blocks(2)
    a.node = b.node = "kept"
    pool.free_blocks([a, b])  # they wait with the evictor, not in the free queue
    assert evictor.calls == [("released", 0), ("released", 1)]
    assert pool.free_queue.block_ids() == [2, 3] and pool.num_free_blocks == 4
    pool.share([a])  # a cache hit on a kept block: nothing leaves the free queue
    assert evictor.calls[-1] == ("held", 0) and pool.num_free_blocks == 3
    with pytest.raises(ValueError, match="cannot take 4 blocks: only 3 are free"):
        pool.get_new_blocks(4)
    taken = pool.get_new_blocks(3)  # two from the queue, one given back by the evictor
    assert evictor.calls[-1] == ("evict", 1) and [t.block_id for t in taken] == [2, 3, 1]
    assert pool.num_free_blocks == 0 and b.node is None
