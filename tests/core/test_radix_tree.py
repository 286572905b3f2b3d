"""The radix-tree prefix cache (Lab 10): page-aligned edges, lock references, evictable and
protected blocks, leaf-first LRU eviction, and how it meets the block pool. The contract it
shares with the hash chain is tested in test_prefix_caching.py, for both."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core.block_manager import BlockManager, OutOfBlocks
from kvlab.core.block_pool import BlockPool
from kvlab.core.prefix_cache import RadixTreeCache


def radix(num_blocks=8, block_size=2) -> BlockManager:
    return BlockManager(num_blocks, block_size, enable_prefix_caching=True, prefix_cache="radix")


def edges(m: BlockManager) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every node as (the blocks above it, its own blocks), sorted."""
    found = []
    for node in m.prefix_cache.nodes():
        path = [b.block_id for b in node.path_blocks()]
        own = len(node.blocks)
        found.append((tuple(path[:-own]), tuple(path[-own:])))
    return sorted(found)


def test_an_edge_holds_whole_blocks_and_splits_where_a_prompt_leaves_it():
    m = radix()
    m.allocate("a", [1, 1, 2, 2, 3, 3, 4])  # three full blocks: one edge of three
    assert edges(m) == [((), (0, 1, 2))]
    m.allocate("b", [1, 1, 2, 2, 9])  # shares two of them: the edge is cut after them
    assert m.num_cached_tokens("b") == 4
    assert edges(m) == [((), (0, 1)), ((0, 1), (2,))]
    tree = m.prefix_cache
    upper = tree.root.children[(1, 1)]
    assert upper.lock_ref == 2 and upper.children[(3, 3)].lock_ref == 1
    m.check_invariants()


def test_a_prefix_after_a_different_prefix_never_matches():
    m = radix(num_blocks=12)
    m.allocate("a", [1, 1, 7, 7, 0])
    m.allocate("b", [2, 2, 7, 7, 0])  # the same second block, after another first block
    assert m.num_cached_tokens("b") == 0
    assert edges(m) == [((), (0, 1)), ((), (3, 4))]
    m.allocate("c", [7, 7, 0])  # the second block alone does not start any cached path
    assert m.num_cached_tokens("c") == 0
    m.check_invariants()


def test_leaves_are_evicted_least_recently_used_first():
    m = radix()
    m.allocate("a", [1, 1, 2, 2, 3, 3, 9])  # blocks 0 1 2 (cached) and 3
    m.allocate("b", [1, 1, 2, 2, 5, 5, 9])  # shares 0 1, own 4 (cached) and 5
    m.free("a")
    m.free("b")  # leaves: a's (3,3) used before b's (5,5); their parent (1,1)(2,2) last
    tree = m.prefix_cache
    assert m.cached_block_ids() == [2, 4, 1, 0]
    assert m.pool.free_queue.block_ids() == [6, 7, 3, 5]  # cached blocks wait in the tree
    assert (tree.evictable_blocks, tree.protected_blocks) == (4, 0)
    m.allocate("d", [1, 1, 2, 2, 3, 3, 7])  # uses a's leaf again: now b's is the older one
    m.free("d")
    assert m.cached_block_ids() == [4, 2, 1, 0]
    m.allocate("x", [8] * 11)  # six blocks: the four plain free ones, then b's leaf, a's
    assert m.prefix_cache_stats.evictions == 2
    assert sorted(m.block_table("x")) == [2, 3, 4, 5, 6, 7]
    m.free("x")
    m.allocate("again", [1, 1, 2, 2, 5, 5, 9])
    assert m.num_cached_tokens("again") == 4  # the parent is still there, its leaves are gone
    m.check_invariants()


def test_a_parent_goes_only_after_its_children_and_takes_nothing_with_it():
    m = radix(num_blocks=4)
    m.allocate("a", [1, 1, 2, 2])
    m.append_slot("a", 3)
    m.append_slot("a", 3)  # blocks (1,1)(2,2) from the prompt, then (3,3): a child edge
    m.free("a")
    tree = m.prefix_cache
    assert edges(m) == [((), (0, 1)), ((0, 1), (2,))]
    tree.evict(1)  # the leaf first
    assert edges(m) == [((), (0, 1))] and 2 in m.pool.free_queue.block_ids()
    assert m.plan_allocation([1, 1, 2, 2, 3, 3, 4]).cached == [m.pool.blocks[0], m.pool.blocks[1]]
    tree.evict(2)  # now the parent, its last block first
    assert edges(m) == [] and m.pool.free_queue.block_ids()[-2:] == [1, 0]
    m.allocate("b", [1, 1, 5])  # (1,1) computed again, in another block: a new node
    m.free("b")
    m.allocate("c", [1, 1, 2, 2, 3, 3, 4])  # finds (1,1) only: the old children went first
    assert m.num_cached_tokens("c") == 2
    assert m.prefix_cache_stats.evictions == 3
    m.check_invariants()


def test_a_locked_node_is_never_evicted():
    m = radix(num_blocks=6)
    m.allocate("prefix", [1, 1, 2, 2, 3])  # (1,1)(2,2) cached and locked
    m.allocate("other", [5, 5, 5, 5, 5, 5])  # the three other blocks
    tree = m.prefix_cache
    assert (tree.evictable_blocks, tree.protected_blocks) == (0, 5)
    assert tree.root.children[(1, 1)].lock_ref == 1
    assert m.num_free_blocks == 0 and not m.can_allocate([6, 6, 6])
    with pytest.raises(OutOfBlocks):
        m.allocate("more", [6, 6, 6])
    with pytest.raises(ValueError, match="cannot evict 1 blocks: 0 evictable"):
        tree.evict(1)
    m.free("prefix")  # unlocked: its two cached blocks are evictable, its third block free
    assert (tree.evictable_blocks, tree.protected_blocks) == (2, 3)
    assert m.num_free_blocks == 3 and m.cached_block_ids() == [1, 0]
    m.allocate("more", [6, 6, 6])  # the free block, then (2,2): the tail goes first
    assert m.prefix_cache_stats.evictions == 1 and m.cached_block_ids() == [0]
    m.check_invariants()


def test_evictable_and_protected_blocks_add_up_to_the_cached_ones():
    m = radix(num_blocks=12)
    tree = m.prefix_cache
    counts = lambda: (tree.evictable_blocks, tree.protected_blocks)  # noqa: E731
    m.allocate("a", [1, 1, 2, 2, 3])
    assert counts() == (0, 2)
    m.fork("a", "a2")  # one more holder, the same nodes: still protected, counted once
    assert counts() == (0, 2) and tree.root.children[(1, 1)].lock_ref == 2
    m.free("a")
    assert counts() == (0, 2)
    m.free("a2")
    assert counts() == (2, 0)
    m.allocate("b", [1, 1, 4, 4, 5])  # takes (1,1) back: protected again, (2,2) evictable
    assert counts() == (1, 2)
    stats = m.prefix_cache_stats
    assert sum(counts()) == stats.cached_blocks == 3
    assert m.num_free_blocks == len(m.pool.free_queue) + tree.evictable_blocks
    m.check_invariants()


def test_a_block_filled_twice_is_swapped_for_the_cached_one():
    """A sequence whose block fills with the tokens of a cached block drops its copy for the
    cached block once a later block of it is known (its copy is surely written by then)."""
    m = radix(num_blocks=16, block_size=4)
    m.allocate("A", [1, 2, 3, 4, 5])
    m.allocate("B", [1, 2, 3, 4, 5, 6, 7, 8])  # B's (5,6,7,8) is cached
    for token in (6, 7, 8):
        m.append_slot("A", token)  # A's own (5,6,7,8): its last known block, kept for now
    own = m.block_table("A")[1]
    assert own != m.block_table("B")[1] and m.pool.blocks[own].node is None
    for token in (9, 10, 11, 12):
        m.append_slot("A", token)
    assert m.block_table("A")[1] == m.block_table("B")[1]
    assert m.ref_count(m.block_table("B")[1]) == 2
    assert m.ref_count(own) == 0 and own in m.pool.free_queue.block_ids()
    m.allocate("C", list(range(1, 14)))
    assert m.num_cached_tokens("C") == 12  # A's (9..12) follows the cached (5..8)
    m.check_invariants()


def test_a_copy_forks_share_is_swapped_in_every_table_at_once():
    """A block two forks hold, filled with the tokens of a cached block: once one fork's later
    block is known, both take the tree's block (a fork that kept the copy would hold the later
    blocks below the tree's node without holding the node)."""
    m = radix(num_blocks=16, block_size=4)
    m.allocate("B", [1, 2, 3, 4, 5, 6, 7, 8])  # (1..4) and (5..8) cached
    m.allocate("A", [1, 2, 3, 4, 5], num_computed=4)  # an engine's sequence: shares (1..4)
    for _ in range(3):
        m.append_slot("A")  # slots reserved, ids not known yet
    m.fork("A", "A2")  # both hold A's full, not yet computed (5..8) block
    for _ in range(4):
        m.append_slot("A")
    m.fork("A", "A3")  # A and A3 share (9..12) as well
    copy, tree_block = m.block_table("A")[1], m.block_table("B")[1]
    ids = list(range(1, 13))
    m.cache_computed("A", ids, 8)  # (5..8) is cached already: A's copy is its last known block
    assert m.block_table("A")[1] == copy and m.ref_count(copy) == 3
    m.cache_computed("A", ids, 12)  # surely written now: every holder takes B's block
    assert [m.block_table(s)[1] for s in ("A", "A2", "A3")] == [tree_block] * 3
    assert (m.ref_count(copy), m.ref_count(tree_block)) == (0, 4)
    assert copy in m.pool.free_queue.block_ids()
    assert len(m.plan_allocation(ids + [0]).cached) == 3  # A's (9..12) follows B's (5..8)
    assert m.prefix_cache.root.children[(1, 2, 3, 4)].children[(5, 6, 7, 8)].lock_ref == 4
    m.check_invariants()
    for _ in range(4):
        m.append_slot("A2")
    m.cache_computed("A2", [*range(1, 9), 0, 0, 0, 0], 12)  # A2's own (0,0,0,0) under it too
    assert len(m.plan_allocation([*range(1, 9), 0, 0, 0, 0, 1]).cached) == 3
    m.check_invariants()


def test_a_copy_is_swapped_for_a_tree_block_nobody_held_at_no_cost():
    """Parallel sampling of a prompt whose last full block is a copy of a cached block nobody
    holds: the samples' first new block makes them all take the cached block, and the copy is
    free again (the same free blocks as before the swap)."""
    m = radix(num_blocks=16)
    m.allocate("A", [1, 1, 3, 3, 2])
    m.allocate("B", [1, 1, 3, 3])  # its (3,3) is a copy of A's, its last known block
    m.fork("B", "C")
    m.free("A")  # A's (3,3) is evictable now
    tree, free = m.prefix_cache, m.num_free_blocks
    m.append_slot("C", 0)  # a new block for C
    m.append_slot("C", 0)  # C's (0,0) fills: B and C take A's (3,3), (0,0) goes under it
    assert m.num_free_blocks == free - 1  # only C's new block: the copy was freed
    assert m.block_table("B") == [0, 1] and m.block_table("C") == [0, 1, 4]
    assert m.ref_count(3) == 0 and 3 in m.pool.free_queue.block_ids()
    assert edges(m) == [((), (0,)), ((0,), (1,)), ((0, 1), (4,))]
    assert tree.root.children[(1, 1)].children[(3, 3)].lock_ref == 2
    assert len(m.plan_allocation([1, 1, 3, 3, 0, 0, 9]).cached) == 3
    m.check_invariants()


def test_without_the_manager_s_tables_a_shared_copy_waits():
    """A tree that cannot see every block table (no ``block_tables``) leaves a copy that
    forks share where it is, and the blocks after it out of the tree, as before."""
    pool = BlockPool(8)
    tree = RadixTreeCache(pool, 1)
    a = pool.get_new_blocks(1)
    tree.cache_full_blocks(tree.start(tree.match([5]), 1), a, [5])
    copy, later = pool.get_new_blocks(2)
    pool.share([copy])  # two tables hold the copy
    state = tree.start(tree.match([5]), 1)
    assert tree.cache_full_blocks(state, [copy, later], [5, 6]) is state
    assert later.node is None and copy.ref_count == 2
    with pytest.raises(TypeError, match="block_tables must be a function"):
        RadixTreeCache(BlockPool(2), 1, block_tables=[])


def test_a_chunk_that_leaves_an_edge_in_its_middle_cuts_it():
    m = radix(num_blocks=16)
    m.allocate("c", [5, 5, 6, 6, 7, 7, 0], num_computed=0)  # its K/V come later
    m.allocate("d", [5, 5, 8, 8, 1])  # (5,5)(8,8): one edge
    m.cache_computed("c", [5, 5, 6, 6, 7, 7, 0], 7)  # c follows (5,5), then leaves the edge
    assert m.block_table("c")[0] == m.block_table("d")[0]
    tree = m.prefix_cache
    top = tree.root.children[(5, 5)]
    assert len(top.blocks) == 1 and sorted(top.children) == [(6, 6), (8, 8)]
    m.allocate("e", [5, 5, 6, 6, 7, 7, 1])
    m.allocate("f", [5, 5, 8, 8, 0])
    assert (m.num_cached_tokens("e"), m.num_cached_tokens("f")) == (6, 4)
    m.check_invariants()


def test_the_tree_meets_the_pool():
    pool = BlockPool(4)
    tree = RadixTreeCache(pool, 2)
    assert pool.evictor is tree
    with pytest.raises(ValueError, match="pool already has an evictor"):
        RadixTreeCache(pool, 2)
    m = radix(num_blocks=4)
    m.allocate("a", [1, 1, 2, 2, 3])
    m.free("a")  # 2 evictable in the tree, 2 in the free queue
    assert len(m.pool.free_queue) == 2 and m.pool.num_free_blocks == m.num_free_blocks == 4
    blocks = m.pool.get_new_blocks(3)  # more than the free queue holds: the tree gives one back
    assert [b.block_id for b in blocks] == [3, 2, 1] and m.prefix_cache.evictable_blocks == 1
    with pytest.raises(ValueError, match="cannot take 2 blocks: only 1 are free"):
        m.pool.get_new_blocks(2)
    m.pool.free_blocks(blocks)
    assert m.num_free_blocks == 4


# --- the tree's promises after every call, on random days under memory pressure --------------------

STEMS = [(1, 1, 2, 2, 3, 3, 4, 4), (1, 1, 2, 2, 5, 5), (6, 6, 1, 1, 2, 2)]
ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("allocate"),
            st.builds(
                lambda s, cut, tail: list(s[:cut]) + tail,
                st.sampled_from(STEMS),
                st.integers(0, 8),
                st.lists(st.integers(0, 2), max_size=6),
            ).filter(bool),
        ),
        st.tuples(st.just("append"), st.integers(0, 9)),
        st.tuples(st.just("free"), st.integers(0, 9)),
        st.tuples(st.just("fork"), st.integers(0, 9)),
    ),
    max_size=50,
)


@settings(max_examples=200, deadline=None)
@given(ops=ops, num_blocks=st.integers(2, 12), block_size=st.sampled_from([1, 2, 3]))
def test_every_call_keeps_the_tree_s_promises(ops, num_blocks, block_size):
    """After each call: the invariants hold, evictable + protected = cached blocks, no block of
    a locked node was evicted, and the blocks evicted are the first of the order the tree
    announced (leaf first, least recently used first)."""
    m = BlockManager(num_blocks, block_size, enable_prefix_caching=True, prefix_cache="radix")
    tree = m.prefix_cache
    live: list[int] = []
    for n, (op, arg) in enumerate(ops):
        in_tree = [b for node in tree.nodes() for b in node.blocks]
        epochs = {b.block_id: b.epoch for b in in_tree}
        locked = {b.block_id for b in in_tree if b.ref_count}
        order, evictions = tree.cached_block_ids(), tree.stats.evictions
        if op == "allocate" and m.can_allocate(arg):
            m.allocate(n, arg)
            live.append(n)
        elif op == "append" and live and m.can_append(live[arg % len(live)]):
            m.append_slot(live[arg % len(live)], arg % 3)
        elif op == "free" and live:
            m.free(live.pop(arg % len(live)))
        elif op == "fork" and live:
            m.fork(live[arg % len(live)], n)
            live.append(n)
        m.check_invariants()
        assert tree.evictable_blocks + tree.protected_blocks == m.prefix_cache_stats.cached_blocks
        evicted = {b for b, epoch in epochs.items() if m.pool.blocks[b].epoch != epoch}
        assert not evicted & locked, "a block of a locked node was evicted"
        assert len(evicted) == tree.stats.evictions - evictions
        still = [b for b in order if m.pool.blocks[b].ref_count == 0 or b in evicted]
        assert evicted == set(still[: len(evicted)]), "not leaf-first LRU"
