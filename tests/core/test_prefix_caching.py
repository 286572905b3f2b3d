"""Prefix caching in kvlab's block manager (Labs 07 and 10): the contract, the invariant after every
call, and the real bugs other small engines shipped, replayed as scenarios, for both prefix
caches (the hash chain and the radix tree) unless a test is about the hash itself.

The stateful test keeps a shadow of what every slot holds: the whole prefix of ids up to and
including the token written there (K/V depend on every earlier token). A sequence must read, at
each of its positions, exactly its own prefix: a wrong share, a stale hash or a missing
copy-on-write shows up as another prefix in some slot.
"""

import operator

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvlab.core.block_manager import BlockManager, OutOfBlocks, PagedCache
from kvlab.core.block_pool import ROOT_HASH, BlockPool, hash_block_tokens
from kvlab.core.prefix_cache import RadixTreeCache
from kvlab.serving import simulate
from kvlab.serving.scheduler import Scheduler, Sequence
from kvlab.serving.workload import Request, shared_prefix_like

KINDS = ("hash", "radix")
both = pytest.mark.parametrize("kind", KINDS)  # a test of the contract, for either prefix cache


def colliding_hash(parent_hash, token_ids):
    """Every block hashes to one of two values: lookups find wrong candidates all the time."""
    return len(token_ids) % 2


def parent_blind_hash(parent_hash, token_ids):
    """A hash that forgets the chain: the same tokens after another prefix get the same hash."""
    return hash(tuple(token_ids))


def cached_structure(m: BlockManager):
    """What makes blocks findable: the hash map, or every node of the tree (its path of blocks
    and its recency)."""
    cache = m.prefix_cache
    if isinstance(cache, RadixTreeCache):
        nodes = sorted(
            (tuple(b.block_id for b in n.path_blocks()), n.last_access) for n in cache.nodes()
        )
        return nodes, cache.evictable_blocks, cache.protected_blocks
    return {h: b.block_id for h, b in m.pool.cached.items()}


def snapshot(m: BlockManager):
    """Everything a refused call must leave as it was."""
    return (
        {s: m.block_table(s) for s in m.seq_ids},
        {s: m.num_tokens(s) for s in m.seq_ids},
        {s: m.token_ids(s) for s in m.seq_ids},
        [m.ref_count(b) for b in range(m.num_blocks)],
        m.pool.free_queue.block_ids(),
        cached_structure(m),
        m.prefix_cache_stats,
        dict(m.expected_lens),
    )


def holders(m: BlockManager) -> dict[int, int]:
    """Block -> how many block tables hold it, from the public API only."""
    counts: dict[int, int] = {}
    for seq in m.seq_ids:
        for block in m.block_table(seq):
            counts[block] = counts.get(block, 0) + 1
    return counts


class SharedMemory:
    """The shadow: what each slot holds (the prefix of ids written there), kept by the test."""

    def __init__(self, m: BlockManager):
        self.m = m
        self.slots: dict[int, tuple] = {}

    def write(self, seq, ids, positions) -> None:
        for pos in positions:
            self.slots[self.m.slot(seq, pos)] = tuple(ids[: pos + 1])

    def copy_block(self, src: int, dst: int) -> None:
        size = self.m.block_size
        for offset in range(size):
            value = self.slots.get(src * size + offset)
            if value is not None:
                self.slots[dst * size + offset] = value

    def assert_reads_own(self, seq, ids) -> None:
        """``ids``: the sequence's tokens whose K/V are written (a prefix of what it holds)."""
        for pos in range(len(ids)):
            got = self.slots.get(self.m.slot(seq, pos))
            assert got == tuple(ids[: pos + 1]), f"{seq!r} reads another prefix at {pos}"


# --- the stateful test --------------------------------------------------------------------------

# a small vocabulary and shared stems make hits, partial hits and near-misses common
STEMS = [(1, 2, 3, 4, 5, 6, 7, 8), (1, 2, 3, 4, 9, 9, 9, 9), (5, 6, 7, 8, 1, 2, 3, 4)]
prompts = st.builds(
    lambda stem, cut, tail: list(stem[:cut]) + tail,
    st.sampled_from(STEMS),
    st.integers(0, 8),
    st.lists(st.integers(0, 3), max_size=9),
).filter(bool)


class CachingMachine(RuleBasedStateMachine):
    """allocate (token ids or a count, whole or in chunks) / append / fork / free /
    preempt-and-readmit, and an engine's way of appending (a slot reserved first, its K/V
    computed later), with prefix caching on or off, with either prefix cache, and with honest,
    colliding or parent-blind hashes."""

    caching = True
    prefix_cache = "hash"
    hash_fn = staticmethod(hash_block_tokens)

    @initialize(num_blocks=st.integers(1, 20), block_size=st.sampled_from([1, 2, 3, 4]))
    def create(self, num_blocks, block_size):
        self.m = BlockManager(
            num_blocks,
            block_size,
            enable_prefix_caching=self.caching,
            prefix_cache=self.prefix_cache,
            hash_fn=self.hash_fn,
        )
        self.memory = SharedMemory(self.m)
        self.ids: dict[int, list[int]] = {}  # what each sequence holds, as the test knows it
        self.computed: dict[int, int] = {}  # of those, how many have their K/V written
        self.by_count: set[int] = set()  # allocated with a count: the manager knows no ids
        self.next_id = 0
        self.next_token = 100  # ids of tokens no prompt has
        self.tree = TreeWatch(self.m)

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _allocate(self, seq, ids, by_count: bool, num_computed=None) -> None:
        before = snapshot(self.m)
        asked = self.m.can_allocate(len(ids) if by_count else ids)
        try:
            self.m.allocate(seq, len(ids) if by_count else ids, num_computed=num_computed)
        except OutOfBlocks:
            assert not asked
            assert snapshot(self.m) == before
            return
        assert asked
        cached = self.m.num_cached_tokens(seq)
        size = self.m.block_size
        assert cached % size == 0 and 0 <= cached < len(ids)
        if by_count or not self.caching:
            assert cached == 0
        for pos in range(cached):  # a hit must hold exactly this prompt's prefix, computed
            assert self.memory.slots.get(self.m.slot(seq, pos)) == tuple(ids[: pos + 1])
        done = len(ids) if num_computed is None or by_count else max(cached, num_computed)
        self.memory.write(seq, ids, range(cached, done))
        self.ids[seq], self.computed[seq] = list(ids), done
        if by_count:
            self.by_count.add(seq)
        stats = self.m.prefix_cache_stats
        assert stats.queries - before[6].queries == (
            0 if by_count or not self.caching else len(ids)
        )
        assert stats.hits - before[6].hits == cached

    def _lagging(self) -> list[int]:
        return sorted(s for s in self.ids if self.computed[s] < len(self.ids[s]))

    def _in_step(self) -> list[int]:
        return sorted(s for s in self.ids if self.computed[s] == len(self.ids[s]))

    @rule(prompt=prompts, by_count=st.booleans())
    def allocate(self, prompt, by_count):
        if by_count:  # ids nobody else has: the manager never sees them
            prompt = list(range(self.next_token, self.next_token + len(prompt)))
            self.next_token += len(prompt)
        self._allocate(self._new_id(), prompt, by_count)

    @rule(prompt=prompts, data=st.data())
    def allocate_chunked(self, prompt, data):
        """Chunked prefill: only the first num_computed prompt tokens have their K/V written;
        the engine reports the rest later (the compute rule)."""
        self._allocate(self._new_id(), prompt, False, data.draw(st.integers(0, len(prompt))))

    def _append(self, seq, token, with_id: bool) -> None:
        before = snapshot(self.m)
        asked = self.m.can_append(seq)
        try:
            moved = self.m.append_slot(seq, token if with_id else None)
        except OutOfBlocks:
            assert not asked
            assert snapshot(self.m) == before
            return
        assert asked
        if moved is not None:
            self.memory.copy_block(*moved)
        self.ids[seq].append(token)
        if with_id or seq in self.by_count:  # written now
            self.computed[seq] += 1
            self.memory.write(seq, self.ids[seq], [len(self.ids[seq]) - 1])

    @precondition(lambda self: self._in_step())
    @rule(data=st.data(), fresh=st.booleans())
    def append(self, data, fresh):
        """By hand: the new token's id given, its K/V written at once."""
        seq = data.draw(st.sampled_from(self._in_step()))
        token = self.next_token if fresh or seq in self.by_count else data.draw(st.integers(0, 3))
        self.next_token += 1
        self._append(seq, token, with_id=seq not in self.by_count)

    @precondition(lambda self: self.ids.keys() - self.by_count)
    @rule(data=st.data(), fresh=st.booleans())
    def reserve(self, data, fresh):
        """An engine's decode slot: reserved before its token's K/V are computed."""
        seq = data.draw(st.sampled_from(sorted(self.ids.keys() - self.by_count)))
        token = self.next_token if fresh else data.draw(st.integers(0, 3))
        self.next_token += 1
        self._append(seq, token, with_id=False)

    @precondition(lambda self: self._lagging())
    @rule(data=st.data())
    def compute(self, data):
        """The engine has computed the K/V of some reserved slots: it says so."""
        seq = data.draw(st.sampled_from(self._lagging()))
        ids, done = self.ids[seq], self.computed[seq]
        upto = data.draw(st.integers(done, len(ids)))
        self.m.cache_computed(seq, ids, upto)
        self.memory.write(seq, ids, range(done, upto))
        self.computed[seq] = upto
        if self.caching and upto < len(ids):
            with pytest.raises(ValueError, match="give the missing ones to cache_computed"):
                self.m.append_slot(seq, 0)

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.ids)))
        child = self._new_id()
        self.m.fork(parent, child)
        self.ids[child], self.computed[child] = list(self.ids[parent]), self.computed[parent]
        if parent in self.by_count:
            self.by_count.add(child)

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(sorted(self.ids)))
        self.m.free(seq)
        del self.ids[seq], self.computed[seq]
        self.by_count.discard(seq)
        with pytest.raises(KeyError):
            self.m.free(seq)

    @precondition(lambda self: self.ids.keys() - self.by_count)
    @rule(data=st.data())
    def preempt_and_readmit(self, data):
        """Recompute preemption: the sequence leaves, then comes back with every token it had
        as its prompt (its own blocks may still be cached: nano-vllm #233)."""
        seq = data.draw(st.sampled_from(sorted(self.ids.keys() - self.by_count)))
        ids = self.ids.pop(seq)
        del self.computed[seq]
        self.m.free(seq)
        self.tree.look()  # what it held may now be evicted
        self._allocate(seq, ids, by_count=False)

    @invariant()
    def consistent(self):
        m = self.m
        m.check_invariants()
        counts = holders(m)
        assert [m.ref_count(b) for b in range(m.num_blocks)] == [
            counts.get(b, 0) for b in range(m.num_blocks)
        ]
        cached = m.cached_block_ids()
        in_use = len(counts)
        assert in_use + m.num_free_blocks == m.num_blocks  # cached rooms counted once, as free
        assert not set(cached) & set(counts)  # a block in use is never evictable
        assert len(set(cached)) == len(cached) <= m.num_free_blocks
        if not self.caching:
            assert not cached and m.prefix_cache_stats.queries == 0
        else:
            cache, stats = m.prefix_cache, m.prefix_cache_stats
            assert cache.evictable_blocks == len(cached)
            assert cache.evictable_blocks + cache.protected_blocks == stats.cached_blocks
        for seq, ids in self.ids.items():
            assert m.num_tokens(seq) == len(ids)
            known = m.token_ids(seq)
            if self.caching and seq not in self.by_count:
                assert known == ids[: self.computed[seq]]
            self.memory.assert_reads_own(seq, ids[: self.computed[seq]])

    @invariant()
    def radix_tree(self):
        self.tree.check()

    def teardown(self):
        if not hasattr(self, "m"):
            return
        for seq in list(self.ids):
            self.m.free(seq)
        assert self.m.num_free_blocks == self.m.num_blocks  # every block free or evictable
        self.m.check_invariants()


class TreeWatch:
    """What the radix tree promises between two calls: a locked node is never evicted, the
    evicted blocks are the first of the eviction order it announced (leaf first, least recently
    used first), and that order is leaf-first LRU."""

    def __init__(self, m: BlockManager):
        self.m = m
        self.tree = m.prefix_cache if isinstance(m.prefix_cache, RadixTreeCache) else None
        self.look()

    def look(self) -> None:
        """Note the tree now: its blocks (with the epoch they were handed out in), the locked
        ones, the announced eviction order, the eviction count."""
        if self.tree is None:
            return
        blocks = [b for node in self.tree.nodes() for b in node.blocks]
        self.epochs = {b.block_id: b.epoch for b in blocks}
        self.locked = {b.block_id for b in blocks if b.ref_count > 0}
        self.order = self.tree.cached_block_ids()
        self.evictions = self.tree.stats.evictions
        assert_leaf_first_lru(self.tree)

    def check(self) -> None:
        if self.tree is None:
            return
        pool = self.m.pool
        # a block handed out again since (a new epoch) was evicted, even if it is cached again
        evicted = {b for b, epoch in self.epochs.items() if pool.blocks[b].epoch != epoch}
        assert not evicted & self.locked, "a locked node was evicted"
        assert len(evicted) == self.tree.stats.evictions - self.evictions
        still = [b for b in self.order if pool.blocks[b].ref_count == 0 or b in evicted]
        assert evicted == set(still[: len(evicted)]), "not the announced eviction order"
        self.look()


def last_use(node) -> int:
    """When the node or any node below it was last used (a use below is a use of it)."""
    return max([node.last_access, *(last_use(child) for child in node.children.values())])


def assert_leaf_first_lru(tree: RadixTreeCache) -> None:
    """The announced eviction order takes whole unlocked leaves (their last block first), a node
    only after its children, least recently used first."""
    order, gone, last = tree.cached_block_ids(), set(), -1
    node_of = {b.block_id: node for node in tree.nodes() for b in node.blocks}
    i = 0
    while i < len(order):
        node = node_of[order[i]]
        ids = [b.block_id for b in reversed(node.blocks)]
        assert order[i : i + len(ids)] == ids, "a node's blocks go together, its last first"
        assert node.lock_ref == 0, "a locked node is in the eviction order"
        assert all(child in gone for child in node.children.values()), "a parent before a leaf"
        assert last_use(node) >= last, "not the least recently used first"
        gone.add(node)
        last = last_use(node)
        i += len(ids)
    assert len(order) == tree.evictable_blocks


class PlainMachine(CachingMachine):
    caching = False


class RadixMachine(CachingMachine):
    prefix_cache = "radix"


class CollidingMachine(CachingMachine):
    hash_fn = staticmethod(colliding_hash)


class ParentBlindMachine(CachingMachine):
    hash_fn = staticmethod(parent_blind_hash)


SETTINGS = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestPrefixCaching = CachingMachine.TestCase
TestPrefixCaching.settings = SETTINGS
TestRadixTree = RadixMachine.TestCase
TestRadixTree.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
TestWithoutPrefixCaching = PlainMachine.TestCase
TestWithoutPrefixCaching.settings = settings(max_examples=25, stateful_step_count=30, deadline=None)
TestCollidingHashes = CollidingMachine.TestCase
TestCollidingHashes.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
TestParentBlindHashes = ParentBlindMachine.TestCase
TestParentBlindHashes.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)


# --- the contract -------------------------------------------------------------------------------


def manager(num_blocks=8, block_size=4, **kw) -> BlockManager:
    return BlockManager(num_blocks, block_size, enable_prefix_caching=True, **kw)


def paged(num_blocks, block_size, kind) -> PagedCache:
    return PagedCache(num_blocks, block_size, enable_prefix_caching=True, prefix_cache=kind)


@both
def test_a_second_prompt_shares_the_cached_full_blocks(kind):
    m = manager(prefix_cache=kind)
    first = m.allocate("a", list(range(10)))  # blocks of 4, 4 and 2 tokens
    second = m.allocate("b", list(range(10)))
    assert second[:2] == first[:2] and second[2] != first[2]
    assert m.num_cached_tokens("a") == 0 and m.num_cached_tokens("b") == 8
    assert [m.ref_count(b) for b in first[:2]] == [2, 2]
    assert m.prefix_cache_stats.queries == 20 and m.prefix_cache_stats.hits == 8
    assert m.prefix_cache_stats.hit_rate == 0.4


@both
def test_full_blocks_are_findable_as_soon_as_a_prompt_is_allocated(kind):
    m = manager(prefix_cache=kind)
    m.allocate("a", list(range(9)))
    assert m.prefix_cache_stats.cached_blocks == 2  # the partial third block is not hashed
    m.allocate("b", list(range(9)))
    assert m.num_cached_tokens("b") == 8


@both
def test_a_block_that_fills_while_decoding_becomes_findable(kind):
    m = manager(prefix_cache=kind)
    m.allocate("a", [1, 2, 3])
    m.append_slot("a", 4)  # the first block is now full
    m.allocate("b", [1, 2, 3, 4, 5])
    assert m.num_cached_tokens("b") == 4 and m.block_table("b")[0] == m.block_table("a")[0]


@both
def test_prompt_of_exactly_k_blocks_keeps_its_last_token_to_compute(kind):
    """nano-vllm #144: a fully cached prompt left nothing to compute, so no logits came out."""
    for k in (1, 2, 3):
        m = manager(num_blocks=12, prefix_cache=kind)
        prompt = list(range(4 * k))
        m.allocate("a", prompt)
        m.allocate("b", prompt)
        assert m.num_cached_tokens("b") == 4 * (k - 1)
        assert m.block_table("b")[: k - 1] == m.block_table("a")[: k - 1]
        assert m.block_table("b")[-1] != m.block_table("a")[-1]
    for n in (1, 3, 5):  # k*block_size +- 1 and shorter than one block
        m = manager(num_blocks=12, prefix_cache=kind)
        m.allocate("a", list(range(n)))
        m.allocate("b", list(range(n)))
        assert m.num_cached_tokens("b") == 4 * ((n - 1) // 4)


@pytest.mark.parametrize(
    "kind, hash_fn",
    [("hash", hash_block_tokens), ("hash", parent_blind_hash), ("radix", hash_block_tokens)],
)
def test_the_same_block_after_a_different_prefix_never_matches(kind, hash_fn):
    m = manager(num_blocks=12, prefix_cache=kind, hash_fn=hash_fn)
    m.allocate("a", [1, 1, 1, 1, 7, 7, 7, 7, 0])
    m.allocate("b", [2, 2, 2, 2, 7, 7, 7, 7, 0])
    assert m.num_cached_tokens("b") == 0
    assert not set(m.block_table("a")) & set(m.block_table("b"))
    m.allocate("c", [3, 3, 3, 3, 1, 1, 1, 1, 0])  # a's first block, second: no match either
    assert m.num_cached_tokens("c") == 0
    m.check_invariants()


@pytest.mark.parametrize("hash_fn", [colliding_hash, parent_blind_hash, lambda parent, tokens: 0])
def test_a_hash_collision_never_shares_wrong_tokens(hash_fn):
    m = manager(num_blocks=12, hash_fn=hash_fn)
    m.allocate("a", [1, 1, 1, 1, 7, 7, 7, 7, 0])
    m.allocate("b", [2, 2, 2, 2, 7, 7, 7, 7, 0])  # same second block, other first block
    assert m.num_cached_tokens("b") == 0
    m.allocate("c", [1, 1, 1, 1, 7, 7, 7, 7, 5])
    hits = m.num_cached_tokens("c") // 4  # a colliding second block may not be findable: a miss
    assert hits >= 1 and m.block_table("c")[:hits] == m.block_table("a")[:hits]
    m.check_invariants()


def test_a_parent_handed_out_again_invalidates_its_children():
    """A cached child whose parent block was handed out (and refilled) since must not match, even
    when the hash cannot tell: the parent's epoch confirms it. (LRU with tail-first frees evicts
    children first, so this guards the pool itself.)"""
    pool = BlockPool(2)
    parent, child = pool.get_new_blocks(2)
    assert pool.cache(parent, 11, (1, 1), None) and pool.cache(child, 22, (2, 2), parent)
    assert pool.lookup(22, (2, 2), parent) is child
    pool.free_blocks([parent])  # the parent goes first: only possible by hand
    assert pool.get_new_block() is parent and pool.num_evictions == 1
    assert pool.cache(parent, 11, (1, 1), None)  # the same tokens again, recomputed
    assert pool.lookup(22, (2, 2), parent) is None
    assert pool.lookup(11, (1, 1), None) is parent


@both
def test_freed_cached_blocks_stay_evictable_and_count_once(kind):
    """sglang #35270: blocks shared by two requests were counted twice as evictable."""
    m = manager(prefix_cache=kind)
    prompt = list(range(9))
    m.allocate("a", prompt)
    m.allocate("b", prompt)
    shared = m.block_table("a")[:2]
    m.free("a")
    assert m.num_free_blocks == 8 - 3  # a's own third block is free; the shared two are held
    assert not set(m.cached_block_ids()) & set(shared)
    m.free("b")
    assert m.num_free_blocks == m.num_blocks
    assert sorted(m.cached_block_ids()) == sorted(shared)
    assert m.prefix_cache_stats.cached_blocks == 2
    m.check_invariants()


@both
def test_eviction_takes_the_least_recently_freed_and_forgets_the_hash(kind):
    """mini-sglang #142: a block table kept pointing at pages that were freed and reused."""
    m = manager(num_blocks=4, block_size=2, prefix_cache=kind)
    m.allocate("old", [1, 1, 2, 2, 3])  # 3 blocks, 2 cached
    m.free("old")  # queue: 3 (never used), then old's blocks last first
    m.allocate("new", [8, 8, 8])  # takes block 3 and the old partial block
    assert m.prefix_cache_stats.evictions == 0
    m.allocate("newer", [7, 7])  # takes old's second block: its hash is forgotten
    assert m.prefix_cache_stats.evictions == 1
    m.free("new")
    m.free("newer")
    m.allocate("again", [1, 1, 2, 2, 3])  # only the first block is still cached
    assert m.num_cached_tokens("again") == 2
    m.check_invariants()


@both
def test_a_freed_prefix_loses_its_tail_before_its_head(kind):
    m = manager(num_blocks=6, block_size=2, prefix_cache=kind)
    m.allocate("a", [1, 1, 2, 2, 3, 3, 4])  # blocks for (1,1) (2,2) (3,3) (4)
    m.free("a")  # queue: the two never used, then (4), (3,3), (2,2), (1,1)
    m.allocate("x", [9] * 7)  # 4 blocks: the two never used, (4) and (3,3)
    assert m.prefix_cache_stats.evictions == 1
    m.free("x")
    m.allocate("b", [1, 1, 2, 2, 3, 3, 4])
    assert m.num_cached_tokens("b") == 4  # (1,1) and (2,2) survived


@both
def test_blocks_in_use_are_never_evicted(kind):
    m = manager(num_blocks=6, block_size=2, prefix_cache=kind)
    m.allocate("prefix", [1, 1, 2, 2, 3])
    table = m.block_table("prefix")
    m.allocate("other", [5, 5, 5, 5, 5, 5])  # the three free blocks
    before = snapshot(m)
    with pytest.raises(OutOfBlocks):
        m.allocate("more", [6, 6, 6])
    assert snapshot(m) == before
    assert m.block_table("prefix") == table and m.prefix_cache_stats.evictions == 0
    with pytest.raises(OutOfBlocks):  # shares two blocks in use, needs one more: none is free
        m.allocate("hit", [1, 1, 2, 2, 7])
    assert snapshot(m) == before


@both
def test_out_of_blocks_with_a_partial_hit_changes_nothing(kind):
    m = manager(num_blocks=4, block_size=2, prefix_cache=kind)
    m.allocate("a", [1, 1, 2, 2, 3])
    m.free("a")  # 2 cached blocks, all 4 free
    m.allocate("hog", [9, 9])  # the never-used block
    before = snapshot(m)
    assert not m.can_allocate([1, 1, 2, 2, 5, 5, 5, 5, 5])  # 2 hits + 3 new > 3 free - 2 hit
    with pytest.raises(OutOfBlocks, match="needs 3 free block"):
        m.allocate("b", [1, 1, 2, 2, 5, 5, 5, 5, 5])
    assert snapshot(m) == before
    assert m.can_allocate([1, 1, 2, 2, 5])  # 2 hits + 1 new block
    m.allocate("b", [1, 1, 2, 2, 5])
    assert m.num_cached_tokens("b") == 4


@both
def test_preempted_sequence_finds_its_own_blocks(kind):
    """nano-vllm #233: after a preemption by recompute, the readmitted sequence hits its own
    cached blocks, including those it filled while decoding, and computes only the rest."""
    m = manager(num_blocks=6, block_size=2, prefix_cache=kind)
    m.allocate("a", [1, 2, 3])
    for token in (4, 5, 6):
        m.append_slot("a", token)
    ids = m.token_ids("a")
    assert ids == [1, 2, 3, 4, 5, 6]
    table = m.block_table("a")
    m.free("a")
    m.allocate("a", ids)
    assert m.num_cached_tokens("a") == 4 and m.block_table("a")[:2] == table[:2]
    m.check_invariants()


@both
def test_fork_and_copy_on_write_with_prefix_caching(kind):
    m = manager(prefix_cache=kind)
    m.allocate("parent", [1, 2, 3, 4, 5, 6])
    m.fork("parent", "child")
    assert m.token_ids("child") == [1, 2, 3, 4, 5, 6]
    src = m.block_table("parent")[1]
    moved = m.append_slot("child", 7)  # writes into the shared, partly filled second block
    assert moved is not None and moved[0] == src
    assert m.append_slot("child", 8) is None  # now its own, and full: hashed
    m.allocate("reader", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert m.num_cached_tokens("reader") == 8
    assert m.block_table("reader")[:2] == m.block_table("child")[:2]
    m.check_invariants()


@both
@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda m: m.allocate("z", "abc"), TypeError, "prompt must be a token count"),
        (lambda m: m.allocate("z", []), ValueError, "at least one token id"),
        (lambda m: m.allocate("z", [1, "2"]), TypeError, r"prompt\[1\] must be an int"),
        (lambda m: m.allocate("z", [1, True]), TypeError, r"prompt\[1\] must be an int"),
        (lambda m: m.allocate("z", 0), ValueError, "must be >= 1"),
        (lambda m: m.append_slot("ids", 2.5), TypeError, "token_id must be an int"),
        (lambda m: m.append_slot("count", 3), ValueError, "token ids are unknown"),
        (lambda m: m.free("nobody"), KeyError, "'nobody'"),
        (lambda m: m.num_cached_tokens("nobody"), KeyError, "'nobody'"),
        (lambda m: m.cache_computed("nobody", [1], 1), KeyError, "'nobody'"),
        (lambda m: m.cache_computed("ids", [1, 2, 3, 4, 5, 6], 6), ValueError, r"in 0\.\.5"),
        (lambda m: m.cache_computed("ids", [1, 2, 3, 4, 5], -1), ValueError, "got -1"),
        (lambda m: m.cache_computed("count", [1, 2, 3], 2), ValueError, "token count"),
        (lambda m: m.allocate("ids", [1]), ValueError, "already exists"),
        (lambda m: m.allocate("z", [1, 2], num_computed=-1), ValueError, "num_computed must be >="),
        (lambda m: m.allocate("z", [1, 2], num_computed=3), ValueError, r"num_computed .* 0\.\.2"),
        (lambda m: m.allocate("z", [1, 2], num_computed=True), TypeError, "num_computed must be"),
        (lambda m: m.allocate("z", 2, num_computed=2.0), TypeError, "num_computed must be an int"),
        (lambda m: m.set_expected_len("nobody", 4), KeyError, "'nobody'"),
        (lambda m: m.set_expected_len("ids", 0), ValueError, "expected_len must be >= 1"),
        (lambda m: m.set_expected_len("ids", "9"), TypeError, "expected_len must be an int"),
        (lambda m: operator.setitem(m.expected_lens, "ids", 9), TypeError, "not support"),
    ],
)
def test_misuse_raises_and_changes_nothing(call, error, match, kind):
    m = manager(prefix_cache=kind)
    m.allocate("ids", [1, 2, 3, 4, 5])
    m.allocate("count", 3)
    m.set_expected_len("ids", 7)
    before = snapshot(m)
    with pytest.raises(error, match=match):
        call(m)
    assert snapshot(m) == before


@both
def test_without_prefix_caching_token_ids_only_count(kind):
    m = BlockManager(8, 4, prefix_cache=kind)
    m.allocate("a", [1, 2, 3, 4, 5])
    m.allocate("b", [1, 2, 3, 4, 5])
    assert m.num_cached_tokens("b") == 0 and m.token_ids("b") is None
    m.append_slot("b", 6)  # accepted and checked, not kept
    with pytest.raises(TypeError):
        m.append_slot("b", "6")
    assert m.prefix_cache_stats.queries == 0 and not m.cached_block_ids()


def test_hashes_chain_and_are_stable():
    first = hash_block_tokens(ROOT_HASH, (1, 2, 3, 4))
    assert hash_block_tokens(first, (5, 6)) != hash_block_tokens(ROOT_HASH, (5, 6))
    assert first == hash_block_tokens(ROOT_HASH, [1, 2, 3, 4])


@both
def test_state_lists_cached_rooms_in_eviction_order(kind):
    m = manager(num_blocks=4, block_size=2, prefix_cache=kind)
    m.allocate("a", [1, 1, 2, 2, 3])
    m.free("a")
    assert m.cached_block_ids() == [1, 0]  # the prefix's tail goes first
    if kind == "hash":
        assert m.cached_block_ids() == [b for b in m.pool.free_queue.block_ids() if b in (0, 1)]
    else:  # they wait in the tree, not in the free queue
        assert m.pool.free_queue.block_ids() == [3, 2]
    state = m.state()
    assert state.cached == tuple(m.cached_block_ids())
    assert BlockManager(4, 2, prefix_cache=kind).state().cached == ()


# --- the cache the scheduler drives, and the simulator ------------------------------------------


@both
def test_scheduler_counts_a_cached_prefix_as_computed(kind):
    cache = paged(16, 4, kind)
    scheduler = Scheduler(cache)
    prompt = list(range(10))
    for name in ("a", "b"):
        scheduler.add(Sequence(name, 10, 3, token_ids=prompt + [100, 101, 102]))
    step = scheduler.step(0.0)
    a, b = step.admitted
    assert a.num_computed == 0 and b.num_computed == 8
    assert cache.num_cached_tokens("b") == 8


@both
def test_refusal_counts_the_cached_prefix(kind):
    cache = paged(4, 4, kind)
    cache.admit("a", 9, 1, token_ids=list(range(9)))  # 3 blocks
    assert cache.refusal(9, 1) is not None  # 3 new blocks, 1 free
    assert cache.refusal(9, 1, token_ids=list(range(9))) is None  # 2 hits + 1 new block
    with pytest.raises(ValueError, match="token_ids holds 2 ids"):
        cache.admit("b", 3, 1, token_ids=[1, 2])


@both
def test_simulate_with_prefix_caching_serves_the_same_tokens_with_bigger_batches(kind):
    day = shared_prefix_like(60, 64, seed=1)
    kw = dict(cache="paged", kv_capacity_tokens=1024, max_seq_len=512)
    plain = simulate(day, **kw)
    asked = True if kind == "hash" else kind
    cached = simulate(day, **kw, prefix_caching=asked)
    assert cached.completed == plain.completed == len(day)
    assert cached.tokens_generated == plain.tokens_generated
    assert cached.prefix_hit_rate > 0.3 and plain.prefix_hit_rate == 0
    assert cached.mean_batch > plain.mean_batch
    assert cached.summary()["prefix_hit_rate"] == cached.prefix_hit_rate
    again = simulate(day, **kw, prefix_caching=asked)
    assert again.times == cached.times and again.prefix_hit_tokens == cached.prefix_hit_tokens


def test_simulate_prefix_caching_needs_the_paged_cache():
    day = [Request(4, 2)]
    with pytest.raises(ValueError, match="prefix_caching needs the paged cache"):
        simulate(
            day, cache="contiguous", kv_capacity_tokens=64, max_seq_len=16, prefix_caching=True
        )
    with pytest.raises(TypeError, match="prefix_caching must be a bool"):
        simulate(day, cache="paged", kv_capacity_tokens=64, max_seq_len=16, prefix_caching=1)


@both
def test_requests_without_ids_never_share(kind):
    day = [Request(20, 3), Request(20, 3)]
    result = simulate(
        day, cache="paged", kv_capacity_tokens=256, max_seq_len=64, prefix_caching=True
    )
    assert result.prefix_hit_tokens == 0 and result.prefix_query_tokens == 40


def test_request_prompt_ids_are_checked():
    with pytest.raises(ValueError, match="prompt_ids holds 2 ids for prompt_len=3"):
        Request(3, 1, prompt_ids=(1, 2))
    with pytest.raises(TypeError, match="prompt_ids must be a sequence of int token ids"):
        Request(2, 1, prompt_ids=[1, "2"])
    with pytest.raises(TypeError, match="prompt_ids must be a sequence of int token ids"):
        Request(2, 1, prompt_ids=[1, True])
    import numpy as np

    assert Request(2, 1, prompt_ids=np.array([3, 4])).prompt_ids == (3, 4)


@both
def test_a_block_filled_twice_does_not_hide_the_rest_of_the_prefix(kind):
    """Two sequences fill a block with the same tokens: the second copy is not findable, and the
    block after it follows the findable copy, so a later prompt finds the whole prefix."""
    m = manager(num_blocks=16, prefix_cache=kind)
    first = [1, 2, 3, 4]
    m.allocate("A", [*first, 5])
    m.allocate("B", [*first, 5, 6, 7, 8])  # shares A's first block, owns (5, 6, 7, 8)
    for token in (6, 7, 8, 9, 10, 11, 12):
        m.append_slot("A", token)  # A fills its own (5, 6, 7, 8): the same tokens as B's
    for token in (9, 10, 11, 12):
        m.append_slot("B", token)
    m.allocate("C", [*first, *range(5, 14)])
    assert m.num_cached_tokens("C") == 12
    for seq in ("A", "B", "C"):
        m.free(seq)
    m.allocate("D", [*first, *range(5, 14)])
    assert m.num_cached_tokens("D") == 12
    m.check_invariants()


@both
def test_a_fork_s_blocks_after_a_copy_of_a_cached_block_are_findable(kind):
    """Parallel sampling of a prompt whose last full block is a copy of a cached one: the
    samples' next blocks follow the cached block, while the copy is still shared (issue 34)."""
    m = manager(num_blocks=16, block_size=2, prefix_cache=kind)
    m.allocate("A", [1, 1, 3, 3, 2])
    m.allocate("B", [1, 1, 3, 3])  # its (3,3) is a copy of A's: its last known block
    m.fork("B", "C")  # B and C share the copy
    m.append_slot("C", 0)
    m.append_slot("C", 0)  # C's (0,0) follows the cached (3,3)
    prompt = [1, 1, 3, 3, 0, 0, 9]
    assert len(m.plan_allocation(prompt).cached) * 2 == 6
    m.check_invariants()
    m.free("B")
    m.free("C")
    assert len(m.plan_allocation(prompt).cached) * 2 == 6
    m.allocate("D", prompt)
    assert m.num_cached_tokens("D") == 6
    m.check_invariants()


class ShadowExecutor:
    """Computes nothing, but keeps what each slot holds and checks what each step reads: the
    engine computes positions [num_computed, num_computed + num_scheduled) and attends to every
    earlier one. Like a model's executor it keeps the K/V of a sequence preempted by swapping
    (``can_swap``): what its slots hold is copied out (and checked) before they are released,
    and written back into its new slots past the cached prefix, as
    :class:`kvlab.models.tiny.executor.TinyExecutor` does. An executor that holds K/V but
    declares ``can_swap = False`` loses them under ``preemption="swap"``: the scheduler keeps
    ``num_computed`` and nobody writes those positions back."""

    timed = False
    can_swap = True

    def __init__(self, cache):
        self.manager, self.slots, self.reads = cache.manager, {}, 0
        self.swapped, self.swap_ins = {}, []  # swap_ins: (seq_id, first, stop) written back

    def _check(self, seq, pos: int) -> None:
        got = self.slots.get(self.manager.slot(seq.seq_id, pos))
        assert got == tuple(seq.token_ids[: pos + 1]), (seq.seq_id, pos)
        self.reads += 1

    def execute(self, step):
        for seq in step.scheduled:
            start, stop = seq.num_computed, seq.num_computed + seq.num_scheduled
            for pos in range(start):
                self._check(seq, pos)
            for pos in range(start, stop):
                self.slots[self.manager.slot(seq.seq_id, pos)] = tuple(seq.token_ids[: pos + 1])
        return None

    def swap_out(self, seq):
        for pos in range(seq.num_computed):
            self._check(seq, pos)
        slot = self.manager.slot
        self.swapped[seq.seq_id] = [
            self.slots[slot(seq.seq_id, pos)] for pos in range(seq.num_computed)
        ]

    def swap_in(self, seq):
        held = self.swapped.pop(seq.seq_id)
        for pos in range(seq.num_cached_tokens, len(held)):
            self.slots[self.manager.slot(seq.seq_id, pos)] = held[pos]
        first = seq.num_cached_tokens
        self.swap_ins.append((seq.seq_id, first, max(first, len(held))))


def serve_a_chat(kind, turns, num_blocks, block_size, mode, executor_class=ShadowExecutor):
    """A chat through the engine: each request's prompt is the previous prompt, its answer and a
    new question (``turns``: (question, answer) lengths), one request per step. Returns the
    engine, its executor and the sequences."""
    from kvlab.serving.engine import Engine

    history, requests, token = [], [], 0
    for i, (question, answer) in enumerate(turns):
        history += list(range(token, token + question))
        token += question
        reply = list(range(token, token + answer))
        token += answer
        requests.append((list(history), reply, float(i)))
        history += reply
    total = max(len(p) + len(r) for p, r, _ in requests)
    num_blocks = max(num_blocks, -(-total // block_size) + 1)
    cache = paged(num_blocks, block_size, kind)
    executor = executor_class(cache)
    engine = Engine(cache, executor, preemption=mode)
    sequences = []
    for i, (prompt, reply, arrival) in enumerate(requests):
        seq = Sequence(f"r{i}", len(prompt), len(reply), arrival, token_ids=prompt + reply)
        sequences.append(seq)
        engine.add(seq)
    engine.run(max_steps=10_000)
    return engine, executor, sequences


# A swapped-out request comes back with its prefix cached but for one block evicted meanwhile:
# that block's K/V come back only by the swap-in (found by the property test below).
SWAP_PAST_THE_PREFIX = {"turns": [(1, 4), (1, 3), (1, 3)], "num_blocks": 4, "block_size": 2}


@both
@settings(max_examples=200, deadline=None)
@given(
    turns=st.lists(st.tuples(st.integers(1, 6), st.integers(1, 5)), min_size=2, max_size=8),
    num_blocks=st.integers(4, 14),
    block_size=st.sampled_from([1, 2, 3, 4]),
    mode=st.sampled_from(["recompute", "swap"]),
)
@example(**SWAP_PAST_THE_PREFIX, mode="swap")
def test_the_engine_never_reads_k_v_that_was_not_computed(
    turns, num_blocks, block_size, mode, kind
):
    """A chat whose answers (whose last token is never computed) come back in later prompts.
    Every hit must hold computed K/V, under memory pressure and both kinds of preemption."""
    engine, executor, sequences = serve_a_chat(kind, turns, num_blocks, block_size, mode)
    scheduler, cache = engine.scheduler, engine.cache
    assert all(seq.finish_time is not None for seq in sequences)
    cache.manager.check_invariants()
    stats = cache.prefix_cache_stats
    assert stats.hits <= stats.queries
    assert scheduler.recompute_tokens >= 0 and scheduler.swapped_in_tokens >= 0
    swapped_in = sum(stop - first for _, first, stop in executor.swap_ins)
    assert swapped_in == scheduler.swapped_in_tokens


@both
def test_a_swapped_in_sequence_reads_what_its_swap_in_wrote(kind):
    """r2 is swapped out holding 10 computed tokens; while it waits one of its blocks, (8, 9),
    is handed to another request. Readmitted, it finds 8 tokens cached, and positions 8 and 9
    come back only by the swap-in, into a fresh block: the engine must tell the executor, and
    read them after it. (With an executor that keeps no K/V for swapping, they are lost.)"""
    engine, executor, _ = serve_a_chat(kind, **SWAP_PAST_THE_PREFIX, mode="swap")
    assert engine.scheduler.num_preemptions == 1
    assert executor.swap_ins == [("r2", 8, 10)]
    assert engine.scheduler.swapped_in_tokens == 2
    engine.cache.manager.check_invariants()


@both
def test_the_shadow_executor_catches_a_swap_in_that_writes_nothing(kind):
    """The check above is not blind: an executor that forgets what it swapped out is caught
    reading the unwritten slot (position 8 of r2)."""

    class Forgetful(ShadowExecutor):
        def swap_in(self, seq):
            self.swapped.pop(seq.seq_id)

    with pytest.raises(AssertionError, match=r"\('r2', 8\)"):
        serve_a_chat(kind, **SWAP_PAST_THE_PREFIX, mode="swap", executor_class=Forgetful)


@both
def test_an_answer_last_token_is_never_cached(kind):
    """The engine never computes the K/V of a finished answer's last token, so a later prompt
    holding it must not find that block cached."""
    from kvlab.serving.engine import Engine

    cache = paged(8, 4, kind)
    engine = Engine(cache)
    engine.add(Sequence("a", 3, 1, token_ids=[1, 2, 3, 4]))
    engine.add(Sequence("b", 5, 1, arrival=5, token_ids=[1, 2, 3, 4, 5, 6]))
    engine.run()
    assert cache.prefix_cache_stats.hits == 0


@both
def test_a_prompt_only_sequence_caches_as_its_tokens_come(kind):
    """A real model knows its prompt only; the tokens it generates join seq.token_ids after each
    step, and their blocks become findable once computed."""
    cache = paged(16, 2, kind)
    scheduler = Scheduler(cache)
    seq = Sequence("a", 3, 4, token_ids=[1, 2, 3])
    scheduler.add(seq)
    for step in range(4):
        scheduler.step(float(step))
        seq.token_ids.append(10 + step)  # the model's token, known after the step
    assert cache.manager.token_ids("a") == [1, 2, 3, 10, 11, 12]
    cache.admit("b", 7, 1, token_ids=[1, 2, 3, 10, 11, 12, 99])
    assert cache.num_cached_tokens("b") == 6


@both
def test_swapping_back_in_skips_the_cached_prefix(kind):
    from kvlab.serving.engine import Engine

    class Swapper:
        timed, can_swap = False, True

        def __init__(self):
            self.swapped_in = []

        def execute(self, step):
            return None

        def swap_out(self, seq):
            pass

        def swap_in(self, seq):
            self.swapped_in.append((seq.num_cached_tokens, seq.num_computed))

    prompt = list(range(8))
    cache = paged(6, 4, kind)
    swapper = Swapper()
    engine = Engine(cache, swapper, preemption="swap")
    for name in ("a", "b"):
        engine.add(Sequence(name, 8, 8, token_ids=prompt + [100 + ord(name)] * 8))
    engine.run()
    scheduler = engine.scheduler
    assert scheduler.num_preemptions >= 1 and swapper.swapped_in
    assert scheduler.swapped_in_tokens == sum(done - cached for cached, done in swapper.swapped_in)
    assert any(cached > 0 for cached, _ in swapper.swapped_in)


@both
def test_cache_computed_checks_the_new_ids_and_changes_nothing_on_error(kind):
    m = manager(prefix_cache=kind)
    m.allocate("a", [1, 2, 3])
    m.append_slot("a")  # an engine's slot: its id comes later
    m.append_slot("a")
    before = snapshot(m)
    with pytest.raises(ValueError, match="fewer than 5"):
        m.cache_computed("a", [1, 2, 3, 4], 5)
    with pytest.raises(TypeError, match=r"token_ids\[3\] must be an int"):
        m.cache_computed("a", [1, 2, 3, "4", 5], 5)
    assert snapshot(m) == before
    m.cache_computed("a", [1, 2, 3, 4, 5], 4)  # the first block is complete and computed
    m.cache_computed("a", [1, 2, 3, 4, 5], 2)  # already known: nothing to do
    assert m.token_ids("a") == [1, 2, 3, 4] and m.prefix_cache_stats.cached_blocks == 1


# --- chunked prefill: a prompt's blocks become findable as their K/V are written ----------------


@both
def test_a_chunked_prompt_is_found_only_as_its_blocks_are_computed(kind):
    m = manager(num_blocks=16, prefix_cache=kind)
    prompt = list(range(13))  # blocks of 4: three full, one token left
    found = lambda: len(m.plan_allocation(prompt).cached)  # noqa: E731 (blocks a second prompt finds)
    m.allocate("a", prompt, num_computed=0)
    assert m.token_ids("a") == [] and m.prefix_cache_stats.cached_blocks == 0
    assert found() == 0  # a's K/V are not written yet: nothing to share
    m.cache_computed("a", prompt, 3)
    assert found() == 0 and m.token_ids("a") == prompt[:3]
    m.cache_computed("a", prompt, 6)  # the first block is written
    assert found() == 1
    m.cache_computed("a", prompt, 13)  # the rest
    assert found() == 3
    m.allocate("b", prompt)
    assert m.num_cached_tokens("b") == 12 and m.block_table("b")[:3] == m.block_table("a")[:3]
    m.check_invariants()


@both
def test_num_computed_counts_the_cached_prefix_as_written(kind):
    m = manager(num_blocks=16, prefix_cache=kind)
    prompt = list(range(13))
    m.allocate("a", prompt)  # num_computed=None: every prompt token counts as written
    assert m.token_ids("a") == prompt and m.prefix_cache_stats.cached_blocks == 3
    m.allocate("b", prompt, num_computed=0)  # finds 12 cached: those count as written
    assert m.num_cached_tokens("b") == 12 and m.token_ids("b") == prompt[:12]
    m.allocate("c", prompt, num_computed=13)  # all of it: as without num_computed
    assert m.token_ids("c") == prompt
    m.allocate("n", 5, num_computed=2)  # a count: no ids to find, num_computed only checked
    assert m.token_ids("n") is None
    m.check_invariants()


@both
def test_admit_with_num_computed_and_the_scheduler_with_chunked_prefill(kind):
    cache = paged(16, 4, kind)
    prompt = list(range(10))
    cache.admit("a", 10, 2, token_ids=prompt, num_computed=0)
    assert cache.refusal(10, 2, token_ids=prompt) is None
    cache.admit("b", 10, 2, token_ids=prompt)
    assert cache.num_cached_tokens("b") == 0
    cache.cache_computed("a", prompt, 10)
    cache.admit("c", 10, 2, token_ids=prompt, num_computed=4)
    assert cache.num_cached_tokens("c") == 8
    assert dict(cache.manager.expected_lens) == {"a": 12, "b": 12, "c": 12}
    cache.manager.check_invariants()

    from kvlab.serving.engine import Engine

    cache = paged(32, 4, kind)  # a token budget smaller than the prompt: it comes in chunks
    engine = Engine(cache, max_num_batched_tokens=4, chunked_prefill=True)
    first = Sequence("first", 12, 2, token_ids=list(range(12)) + [99, 98])
    second = Sequence("second", 12, 2, arrival=2.5, token_ids=list(range(12)) + [97, 96])
    engine.add(first)
    engine.add(second)
    engine.run()
    assert second.num_cached_tokens == 8  # first's written blocks, less the last-token block
    assert cache.prefix_cache_stats.hits == 8
    cache.manager.check_invariants()


# --- the admission plan: one lookup for the refusal and the admission that follows ---------------


def count_matches(m: BlockManager) -> list:
    """Calls of the prefix cache's match, recorded from now on."""
    calls, match = [], m.prefix_cache.match
    m.prefix_cache.match = lambda ids: calls.append(len(ids)) or match(ids)
    return calls


@both
def test_refusal_then_admit_looks_the_prompt_up_once(kind):
    cache = paged(16, 4, kind)
    cache.admit("warm", 9, 1, token_ids=list(range(9)))
    calls = count_matches(cache.manager)
    prompt = list(range(9))
    assert cache.refusal(9, 1, token_ids=list(prompt)) is None  # a slice, as the scheduler passes
    cache.admit("a", 9, 1, token_ids=list(prompt))
    assert calls == [9] and cache.num_cached_tokens("a") == 8
    m = cache.manager
    assert m.can_allocate(prompt) and m.can_allocate(prompt)
    m.allocate("b", prompt)
    assert calls == [9, 9] and m.num_cached_tokens("b") == 8


@both
def test_a_plan_is_made_again_after_any_change(kind):
    m = manager(num_blocks=4, block_size=2, prefix_cache=kind)
    m.allocate("a", [1, 1, 2, 2, 3])
    m.free("a")  # two cached blocks, all four free
    prompt = [1, 1, 2, 2, 5, 5, 5]
    assert m.can_allocate(prompt)  # two hits and two new blocks
    m.allocate("hog", [9, 9, 9])  # takes both plain free blocks
    assert not m.can_allocate(prompt)
    with pytest.raises(OutOfBlocks):
        m.allocate("b", prompt)
    m.free("hog")
    assert m.can_allocate(prompt)
    prompt[0] = 7  # changed in place after its plan: looked up again
    m.allocate("c", prompt)
    assert m.num_cached_tokens("c") == 0
    m.check_invariants()


# --- both caches: the same hits where nothing is evicted ------------------------------------------

sampled = st.lists(st.integers(0, 3), max_size=5)  # the tokens a fork samples
day_ops = st.lists(
    st.one_of(
        st.tuples(st.just("allocate"), prompts, st.one_of(st.none(), st.integers(0, 20))),
        st.tuples(st.just("append"), st.integers(0, 9), st.integers(0, 3)),
        st.tuples(st.just("reserve"), st.integers(0, 9), st.integers(0, 3)),
        st.tuples(st.just("compute"), st.integers(0, 9), st.integers(0, 20)),
        st.tuples(st.just("fork"), st.integers(0, 9), sampled),
        st.tuples(
            st.just("sample"),
            st.integers(0, 9),
            st.tuples(st.integers(1, 5), st.lists(sampled, max_size=3)),
        ),
        st.tuples(st.just("free"), st.integers(0, 9), st.just(0)),
    ),
    max_size=40,
)

# issue 34: B's last full block is a copy of A's, B forks C, C's next block follows A's
FORK_PAST_A_COPY = [
    ("allocate", [1, 1, 3, 3, 2], None),
    ("sample", 0, (2, [[0, 0]])),  # B = A's first two blocks; C, a fork of B, samples (0,0)
    ("free", 1, 0),
    ("free", 1, 0),
]


def found(m: BlockManager, prompt) -> int:
    return len(m.plan_allocation(prompt).cached)


@pytest.mark.parametrize("cpu_blocks", [None, 3], ids=["hbm", "with-tier"])
@settings(max_examples=150, deadline=None)
@given(ops=day_ops, block_size=st.sampled_from([1, 2, 3, 4]), data=st.data())
@example(ops=FORK_PAST_A_COPY, block_size=2, data=None).via("issue 34")
def test_both_caches_find_the_same_hits_on_days_without_evictions(
    ops, block_size, data, cpu_blocks
):
    """Enough blocks that nothing is evicted: the hash chain and the radix tree (with or without
    a CPU tier below) find the same cached prefix for every prompt, after every call: prompts
    chunked or not, decoded by hand or by an engine, forked (each fork samples tokens of its
    own, copying a shared last block on write), freed, and parallel sampling of the first
    blocks of a live sequence. Probed after each call: every live sequence's tokens and one
    more, and a random prompt."""
    caches = {
        kind: manager(
            num_blocks=1000, block_size=block_size, prefix_cache=kind, cpu_cache_blocks=cpu_blocks
        )
        for kind in KINDS
    }
    ids: dict[int, list[int]] = {}
    computed: dict[int, int] = {}

    def in_step(seq) -> bool:
        return computed[seq] == len(ids[seq])

    def allocate(seq, prompt, done=None):
        cached = set()
        for m in caches.values():
            m.allocate(seq, prompt, num_computed=done)
            cached.add(m.num_cached_tokens(seq))
        assert len(cached) == 1, f"allocate {prompt}: cached {cached}"
        ids[seq] = list(prompt)
        computed[seq] = len(prompt) if done is None else max(cached.pop(), done)

    def fork(parent, child, tokens):
        for m in caches.values():
            m.fork(parent, child)
        ids[child], computed[child] = list(ids[parent]), computed[parent]
        for token in tokens:  # the first may copy the shared last block on write
            step = in_step(child)
            for m in caches.values():
                m.append_slot(child, token if step else None)
            ids[child].append(token)
            computed[child] += step

    for n, (op, arg, value) in enumerate(ops):
        live = sorted(ids)
        seq = live[arg % len(live)] if live and op != "allocate" else None
        if op == "allocate":
            allocate(n, arg, None if value is None else min(value, len(arg)))
        elif seq is None:
            continue
        elif op == "append" and in_step(seq):
            for m in caches.values():
                m.append_slot(seq, value)
            ids[seq].append(value)
            computed[seq] += 1
        elif op == "reserve":
            for m in caches.values():
                m.append_slot(seq)
            ids[seq].append(value)
        elif op == "compute":
            upto = max(computed[seq], min(value, len(ids[seq])))
            for m in caches.values():
                m.cache_computed(seq, ids[seq], upto)
            computed[seq] = upto
        elif op == "fork":
            fork(seq, n, value)
        elif op == "sample":  # the first blocks of a live sequence's tokens, sampled n times
            blocks, children = value
            allocate(n, ids[seq][: blocks * block_size])
            for i, tokens in enumerate(children):
                fork(n, 1000 * (i + 1) + n, tokens)
        elif op == "free":
            for m in caches.values():
                m.free(seq)
            del ids[seq], computed[seq]
        probes = [[*ids[s], 0] for s in sorted(ids)]
        if data is not None:
            probes.append(data.draw(prompts, label="probe"))
        for probe in probes:
            hits = {kind: found(m, probe) for kind, m in caches.items()}
            assert hits["hash"] == hits["radix"], f"after {op} #{n}, {probe}: {hits}"
        stats = {kind: m.prefix_cache_stats for kind, m in caches.items()}
        assert stats["hash"].evictions == stats["radix"].evictions == 0
        assert stats["hash"].hits == stats["radix"].hits
        assert stats["hash"].queries == stats["radix"].queries
        assert stats["hash"].cached_blocks == stats["radix"].cached_blocks, f"after {op} #{n}"
        for m in caches.values():
            m.check_invariants()


# --- choosing a prefix cache, and the interfaces ----------------------------------------------------


def test_the_prefix_cache_is_chosen_by_name():
    from kvlab.core.prefix_cache import HashChainCache, PrefixCache

    assert isinstance(manager().prefix_cache, HashChainCache)  # the default
    radix = manager(prefix_cache="radix")
    assert (
        isinstance(radix.prefix_cache, RadixTreeCache) and radix.pool.evictor is radix.prefix_cache
    )
    assert manager().pool.evictor is None  # the hash chain's cached blocks wait in the free queue
    for m in (manager(), radix):
        assert isinstance(m.prefix_cache, PrefixCache)
    off = BlockManager(8, 4, prefix_cache="radix")  # checked, and unused without prefix caching
    assert off.prefix_cache is None and off.prefix_cache_stats.queries == 0
    cache = PagedCache(8, 4, enable_prefix_caching=True, prefix_cache="radix")
    assert isinstance(cache.manager.prefix_cache, RadixTreeCache) and cache.prefix_caching


@pytest.mark.parametrize(
    "make, error, match",
    [
        (
            lambda: manager(prefix_cache="trie"),
            ValueError,
            r"prefix_cache must be one of \('hash', 'radix'\), got 'trie'",
        ),
        (lambda: manager(prefix_cache=None), ValueError, "prefix_cache must be one of"),
        (
            lambda: BlockManager(8, 4, prefix_cache="Radix"),
            ValueError,
            "prefix_cache must be one of",
        ),
        (lambda: manager(prefix_cache=["radix"]), ValueError, "prefix_cache must be one of"),
        (
            lambda: manager(prefix_cache="radix", hash_fn=colliding_hash),
            ValueError,
            "hash_fn is for prefix_cache='hash'",
        ),
        (
            lambda: PagedCache(8, 4, enable_prefix_caching=True, prefix_cache="lru"),
            ValueError,
            "prefix_cache must be one of",
        ),
        (lambda: PagedCache(8, 4, prefix_cache=3), ValueError, "prefix_cache must be one of"),
    ],
)
def test_a_bad_prefix_cache_is_refused(make, error, match):
    with pytest.raises(error, match=match):
        make()


@both
def test_admit_checks_its_arguments_before_booking(kind):
    cache = paged(8, 4, kind)
    for call, error, match in [
        (
            lambda: cache.admit("a", 3, -1, token_ids=[1, 2, 3]),
            ValueError,
            "output_len must be >= 0",
        ),
        (
            lambda: cache.admit("a", 3, "2", token_ids=[1, 2, 3]),
            TypeError,
            "output_len must be an int",
        ),
        (
            lambda: cache.admit("a", 3, 1, token_ids=[1, 2, 3], num_computed=4),
            ValueError,
            "num_computed",
        ),
        (lambda: cache.admit("a", 3, 1, token_ids=[1, 2]), ValueError, "token_ids holds 2 ids"),
    ]:
        with pytest.raises(error, match=match):
            call()
        assert "a" not in cache and cache.manager.num_free_blocks == 8


def test_the_paged_cache_is_the_scheduler_s_kv_cache():
    from kvlab.core import block_manager as paged_module
    from kvlab.core.prefix_cache import PrefixCacheStats
    from kvlab.serving.interfaces import KVCache, PrefixCachingKVCache

    for cache in (PagedCache(8, 4), paged(8, 4, "hash"), paged(8, 4, "radix")):
        assert isinstance(cache, KVCache) and isinstance(cache, PrefixCachingKVCache)
    assert PagedCache(8, 4).prefix_caching is False and paged(8, 4, "radix").prefix_caching is True
    assert paged_module.PrefixCacheStats is PrefixCacheStats  # the old import path stays
    assert isinstance(paged(8, 4, "radix").prefix_cache_stats, PrefixCacheStats)
