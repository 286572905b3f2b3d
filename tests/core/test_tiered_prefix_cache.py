"""A CPU tier below HBM for either prefix cache (Lab 10): evicted blocks go down to it, a later
hit on them is a copy up into a fresh HBM block instead of a recompute.

The stateful test is Lab 07's (every call of the block manager, with a shadow of what each HBM
slot holds: the whole prefix of ids up to the token written there) with a tier below: the
tier's mover copies the shadow down into CPU slots and back up, so a hit served from the tier
must put exactly the prompt's own prefix in every slot it fills, as a hit in HBM must.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule
from test_prefix_caching import CachingMachine, SharedMemory, TreeWatch, snapshot

from kvlab.core.block_manager import BlockManager, PagedCache
from kvlab.core.prefix_cache import PrefixKey, TieredPrefixCache

KINDS = ("hash", "radix")
both = pytest.mark.parametrize("kind", KINDS)


class ShadowMover:
    """Copies the shadow's slots between HBM blocks and CPU slots, as a real mover copies K/V."""

    def __init__(self):
        self.memory: SharedMemory | None = None
        self.cpu: dict[int, list] = {}
        self.downs = self.ups = 0

    def copy_down(self, block_id: int, cpu_slot: int) -> None:
        size, slots = self.memory.m.block_size, self.memory.slots
        self.cpu[cpu_slot] = [slots.get(block_id * size + o) for o in range(size)]
        self.downs += 1

    def copy_up(self, cpu_slot: int, block_id: int) -> None:
        size, slots = self.memory.m.block_size, self.memory.slots
        for offset, value in enumerate(self.cpu.pop(cpu_slot)):
            slots[block_id * size + offset] = value
        self.ups += 1


def prefix_of(key: PrefixKey) -> tuple:
    parts = []
    while key is not None:
        parts.append(key.tokens)
        key = key.parent
    return tuple(t for part in reversed(parts) for t in part)


class TierMachine(CachingMachine):
    """Lab 07's machine over a block manager with a CPU tier of 1-6 blocks."""

    @initialize(
        num_blocks=st.integers(1, 10),
        block_size=st.sampled_from([1, 2, 3]),
        cpu_blocks=st.integers(1, 8),
    )
    def create(self, num_blocks, block_size, cpu_blocks):
        self.mover = ShadowMover()
        self.m = BlockManager(
            num_blocks,
            block_size,
            enable_prefix_caching=True,
            prefix_cache=self.prefix_cache,
            cpu_cache_blocks=cpu_blocks,
            tier_mover=self.mover,
        )
        self.memory = self.mover.memory = SharedMemory(self.m)
        self.ids, self.computed, self.by_count = {}, {}, set()
        self.next_id, self.next_token = 0, 100
        self.tree = TreeWatch(self.m)
        self.asked: list[list[int]] = []  # every prompt given by ids: users come back

    def _allocate(self, seq, ids, by_count, num_computed=None):
        if not by_count:
            self.asked.append(list(ids))
        super()._allocate(seq, ids, by_count, num_computed)

    @precondition(lambda self: self.asked)
    @rule(data=st.data())
    def ask_again(self, data):
        """A prompt asked before comes back (the next round of a chat): in HBM, in the tier,
        or evicted from both by now."""
        self.tree.look()
        self._allocate(self._new_id(), data.draw(st.sampled_from(self.asked)), False)

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def free_and_ask_again(self, data):
        """A sequence leaves and its prompt comes back at once (HBM may have evicted some
        of it meanwhile to make room for the others)."""
        seq = data.draw(st.sampled_from(sorted(self.ids)))
        prompt = self.ids[seq][: data.draw(st.integers(1, len(self.ids[seq])))]
        self.free_seq(seq)
        self.tree.look()
        self._allocate(self._new_id(), prompt, False)

    def free_seq(self, seq):
        self.m.free(seq)
        del self.ids[seq], self.computed[seq]
        self.by_count.discard(seq)

    @invariant()
    def tier(self):
        tier: TieredPrefixCache = self.m.prefix_cache
        size = self.m.block_size
        assert len(tier.tier) <= tier.cpu_blocks
        for key, (kept, slot) in tier.tier.items():  # each CPU slot holds its key's prefix
            assert kept is key
            prefix = prefix_of(key)
            start = len(prefix) - size
            assert self.mover.cpu[slot] == [prefix[: start + o + 1] for o in range(size)]
        # nothing lost or doubled: every block sent down is in the tier, was copied up, was
        # dropped (the tier's LRU, or no slot to keep it in), or let go because HBM computed
        # its prefix again; every slot the tier holds was filled by a copy down
        stats = tier.stats
        assert stats.demotions == (
            len(tier.tier) + self.mover.ups + stats.tier_evictions + tier.superseded
        )
        assert self.mover.downs <= stats.demotions
        assert {slot for _, slot in tier.tier.values()} <= self.mover.cpu.keys()
        assert stats.tier_hits == self.mover.ups * size
        assert stats.tier_blocks == len(tier.tier)


class RadixTierMachine(TierMachine):
    prefix_cache = "radix"


TestHashChainWithTier = TierMachine.TestCase
TestHashChainWithTier.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
TestRadixTreeWithTier = RadixTierMachine.TestCase
TestRadixTreeWithTier.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)


# --- rounds of a chat: ask, answer, leave, come back ---------------------------------------------

conversation = st.lists(st.integers(0, 3), min_size=1, max_size=4)


def run_rounds(kind, num_blocks, block_size, cpu_blocks, picks, users, keep):
    """Users (each a conversation of small-vocabulary tokens) ask in the order ``picks``; each
    round's prompt is the user's conversation so far plus a new token, its answer two tokens
    more; at most ``keep`` sequences stay in HBM (the oldest leaves). After every call: the
    manager's and the tier's invariants, and every sequence reads exactly its own prefix."""
    mover = ShadowMover()
    m = BlockManager(
        num_blocks,
        block_size,
        enable_prefix_caching=True,
        prefix_cache=kind,
        cpu_cache_blocks=cpu_blocks,
        tier_mover=mover,
    )
    memory = mover.memory = SharedMemory(m)
    history = [list(u) for u in users]
    held: list[tuple[int, list[int]]] = []
    fetched = 0
    for n, user in enumerate(picks):
        ids = history[user % len(history)] + [user % 4]
        while held and not m.can_allocate(ids):
            seq, _ = held.pop(0)
            m.free(seq)
        if not m.can_allocate(ids):
            continue
        before = m.prefix_cache_stats
        m.allocate(n, ids)
        cached = m.num_cached_tokens(n)
        for pos in range(cached):  # HBM's hits and the tier's copies up alike
            assert memory.slots.get(m.slot(n, pos)) == tuple(ids[: pos + 1])
        memory.write(n, ids, range(cached, len(ids)))
        stats = m.prefix_cache_stats
        assert stats.hits - before.hits == cached
        fetched += stats.tier_hits - before.tier_hits
        for token in (user % 4, 7):  # the answer, written as it is decoded
            if not m.can_append(n):
                break
            m.append_slot(n, token)
            ids.append(token)
            memory.write(n, ids, [len(ids) - 1])
        history[user % len(history)] = list(ids)
        held.append((n, ids))
        if len(held) > keep:
            seq, _ = held.pop(0)
            m.free(seq)
        m.check_invariants()
        for seq, seq_ids in held:
            memory.assert_reads_own(seq, seq_ids)
    return m, fetched


@both
@settings(max_examples=150, deadline=None)
@given(
    num_blocks=st.integers(4, 14),
    block_size=st.sampled_from([1, 2, 3]),
    cpu_blocks=st.integers(1, 12),
    users=st.lists(conversation, min_size=2, max_size=4),
    picks=st.lists(st.integers(0, 3), min_size=6, max_size=16),
    keep=st.integers(0, 2),
)
def test_rounds_of_a_chat_read_their_own_prefix(
    kind, num_blocks, block_size, cpu_blocks, users, picks, keep
):
    run_rounds(kind, num_blocks, block_size, cpu_blocks, picks, users, keep)


@both
def test_rounds_of_a_chat_hit_the_tier(kind):
    """The property test's day is one on which the tier serves hits (not a vacuous pass)."""
    users = [[1, 2, 3, 0], [2, 3, 1, 0], [3, 1, 2, 0]]
    m, fetched = run_rounds(kind, 6, 2, 12, [0, 1, 2] * 4, users, keep=0)
    assert fetched > 0 and m.prefix_cache_stats.demotions > 0


# --- the contract, by hand ------------------------------------------------------------------------


def tiered(kind, num_blocks=4, block_size=2, cpu_blocks=4, **kw) -> BlockManager:
    return BlockManager(
        num_blocks,
        block_size,
        enable_prefix_caching=True,
        prefix_cache=kind,
        cpu_cache_blocks=cpu_blocks,
        **kw,
    )


@both
def test_an_evicted_prefix_comes_back_by_copy_up(kind):
    m = tiered(kind)
    a = [1, 2, 3, 4, 5, 6, 7]
    m.allocate("a", a)
    m.free("a")
    m.allocate("b", [9, 9, 8, 8, 7, 7, 6])  # takes every block: a's three go down
    stats = m.prefix_cache_stats
    assert (stats.demotions, stats.tier_blocks, stats.evictions) == (3, 3, 3)
    m.free("b")
    m.allocate("c", a)
    assert m.num_cached_tokens("c") == 6  # three blocks, none computed: copied up
    stats = m.prefix_cache_stats
    assert (stats.hits, stats.tier_hits) == (6, 6)
    m.check_invariants()


@both
def test_hbm_first_then_the_tier(kind):
    """A prefix partly in HBM, partly in the tier: HBM's blocks are shared, the rest copied."""
    m = tiered(kind, num_blocks=6, cpu_blocks=8)
    a = [1, 2, 3, 4, 5, 6, 7]
    m.allocate("a", a)
    m.free("a")
    m.allocate("b", [9, 9, 8, 8, 7, 7, 6])  # 4 blocks: 2 free, a's partial one, a's third
    m.free("b")
    m.allocate("c", a)
    stats = m.prefix_cache_stats
    assert m.num_cached_tokens("c") == 6
    assert stats.hits - stats.tier_hits == 4 and stats.tier_hits == 2
    m.check_invariants()


@both
def test_the_tier_drops_its_least_recently_used(kind):
    m = tiered(kind, num_blocks=2, block_size=2, cpu_blocks=2)
    for n, first in enumerate((10, 20, 30)):  # each prompt's one full block goes down in turn
        m.allocate(n, [first, first + 1, 0])
        m.free(n)
        m.allocate(f"push{n}", [99 + n, 99 + n, 99 + n])
        m.free(f"push{n}")
    tier = m.prefix_cache
    kept = [key.tokens for key in tier.tier_keys()]
    assert (10, 11) not in kept and len(kept) == 2 and tier.stats.tier_evictions > 0
    assert len(kept) <= tier.cpu_blocks
    m.check_invariants()


@both
def test_a_copy_up_needs_a_free_block(kind):
    """The blocks a copy up fills are new blocks: with none free (and none evictable), the
    prompt is refused and nothing changes."""
    m = tiered(kind, num_blocks=3, block_size=2, cpu_blocks=4)
    a = [1, 2, 3, 4, 5]
    m.allocate("a", a)
    m.free("a")
    m.allocate("b", [7, 7, 8, 8, 9])  # a's blocks go down
    assert m.plan_allocation(a).match.fetched == 2
    before = snapshot(m)
    assert not m.can_allocate(a)
    with pytest.raises(Exception, match="free block"):
        m.allocate("c", a)
    assert snapshot(m) == before
    m.free("b")
    assert m.can_allocate(a)
    m.allocate("c", a)
    assert m.num_cached_tokens("c") == 4
    m.check_invariants()


def test_prefix_keys_compare_whole_prefixes():
    a = PrefixKey(PrefixKey(None, (1, 2)), (3, 4))
    assert a == PrefixKey(PrefixKey(None, (1, 2)), (3, 4))
    assert hash(a) == hash(PrefixKey(PrefixKey(None, (1, 2)), (3, 4)))
    assert a != PrefixKey(PrefixKey(None, (9, 9)), (3, 4))  # same tokens, other prefix
    assert a != PrefixKey(None, (3, 4)) and len(a) == 2
    deep = deep2 = None
    for i in range(5_000):  # compared without recursion
        deep, deep2 = PrefixKey(deep, (i,)), PrefixKey(deep2, (i,))
    assert deep == deep2


def test_without_a_tier_nothing_changes():
    m = BlockManager(4, 2, enable_prefix_caching=True)
    assert m.pool.on_evict is None and not isinstance(m.prefix_cache, TieredPrefixCache)
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        BlockManager(4, 2, cpu_cache_blocks=4)
    with pytest.raises(ValueError, match="cpu_blocks"):
        BlockManager(4, 2, enable_prefix_caching=True, cpu_cache_blocks=0)
    cache = PagedCache(4, 2, enable_prefix_caching=True, prefix_cache="radix", cpu_cache_blocks=3)
    assert cache.manager.prefix_cache.cpu_blocks == 3
