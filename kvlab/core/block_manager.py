"""The paged KV cache: fixed-size rooms handed out one at a time, found through key cards.

Memory is ``num_blocks`` blocks (rooms) of ``block_size`` token slots (beds). A sequence (guest)
holds a block table (key card): logical block i -> physical block id, in any order anywhere in the
hotel. Blocks come from the pool's free queue only when a token needs one, so a sequence wastes at
most the empty slots of its last block. Reference counts let sequences share blocks (fork); a
sequence about to write into a shared, partly filled block first moves to a fresh copy
(copy-on-write).
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from kvlab import _moved
from kvlab.core.accounting import CacheState, Usage, usage
from kvlab.core.block_pool import Block, BlockPool, hash_block_tokens
from kvlab.core.errors import OutOfMemory
from kvlab.core.prefix_cache import (
    PrefixCacheStats,
    PrefixMatch,
    check_prefix_cache,
    make_prefix_cache,
)
from kvlab.core.validate import num_computed_of, positive_int


class OutOfBlocks(OutOfMemory):
    """The free queue cannot supply the blocks needed; nothing was changed."""

    unit = "rooms"


def _token_id(value, name: str) -> int:
    """``value`` as a token id: an int (or anything that is one, like a NumPy integer), not a bool."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int token id, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int token id, got {value!r}") from None


def _prompt(prompt) -> tuple[int, list[int] | None]:
    """A prompt given as a token count or as token ids: (its length, its ids or None)."""
    if isinstance(prompt, numbers.Integral) and not isinstance(prompt, bool):
        if prompt < 1:
            raise ValueError(f"prompt (a token count) must be >= 1, got {prompt}")
        return int(prompt), None
    if isinstance(prompt, (str, bytes, Mapping)) or not isinstance(prompt, Iterable):
        raise TypeError(
            f"prompt must be a token count (int) or a sequence of token ids, got {prompt!r}"
        )
    if type(prompt) in (list, tuple) and set(map(type, prompt)) <= {int}:
        ids = list(prompt)  # already ints: the simulator's prompts (a fleet's day is long)
    else:
        ids = [_token_id(t, f"prompt[{i}]") for i, t in enumerate(prompt)]
    if not ids:
        raise ValueError("prompt must hold at least one token id, got none")
    return len(ids), ids


class SequenceBlocks:
    """One sequence as the block manager keeps it, so that free and fork act on it whole."""

    __slots__ = (
        "table",
        "num_tokens",
        "token_ids",
        "num_cached",
        "expected_len",
        "prefix",
        "full_blocks_noted",
    )

    def __init__(self, table: list[Block], num_tokens: int, num_cached: int = 0):
        self.table = table  # the block table: logical block i -> its Block
        self.num_tokens = num_tokens
        self.token_ids: list[int] | None = None  # with prefix caching: ids with K/V written
        self.num_cached = num_cached  # prompt tokens found cached at allocate
        self.expected_len: int | None = None  # the length it is expected to leave with
        self.prefix = None  # the prefix cache's state for it (None: it knows no ids)
        self.full_blocks_noted = 0  # full blocks of token_ids the prefix cache was told of

    def copy(self, prefix) -> SequenceBlocks:
        """A fork's: the same blocks and tokens, ``prefix`` its prefix-cache state."""
        child = SequenceBlocks(list(self.table), self.num_tokens, self.num_cached)
        if self.token_ids is not None:
            child.token_ids = list(self.token_ids)
        child.expected_len, child.prefix = self.expected_len, prefix
        child.full_blocks_noted = self.full_blocks_noted
        return child


@dataclass(slots=True)
class AllocationPlan:
    """What allocating a prompt takes now: its cached prefix and the blocks free to add to it.
    Computed once for :meth:`BlockManager.can_allocate` (or a cache's refusal) and reused by the
    :meth:`BlockManager.allocate` that follows, unless something changed in between."""

    num_tokens: int
    token_ids: list[int] | None
    match: PrefixMatch | None  # None: no lookup (no ids, or no prefix caching)
    available: int  # free blocks, less the cached prefix's own free blocks

    @property
    def cached(self) -> list[Block]:
        return [] if self.match is None else self.match.blocks

    def blocks_needed(self, block_size: int, extra: int = 0) -> int:
        """New blocks for the prompt plus ``extra`` tokens, beyond its cached prefix."""
        return -(-(self.num_tokens + extra) // block_size) - len(self.cached)


class BlockManager:
    """Keeps every sequence's block table on top of a :class:`~kvlab.core.block_pool.BlockPool`.

    With ``enable_prefix_caching`` a prompt given as token ids starts from the blocks of the
    longest cached prefix (shared, not recomputed), and every full block of a sequence whose
    tokens are known becomes findable. ``prefix_cache`` chooses how: ``"hash"`` (the default,
    vLLM's chain of block hashes; blocks nobody holds stay cached in the free queue until they
    are handed out again, least recently freed first) or ``"radix"`` (SGLang's radix tree; blocks
    nobody holds stay in the tree, and leaves are evicted least recently used first). Either way
    they count as free. ``prefix_cache`` is checked always and used only with prefix caching.
    ``hash_fn(parent_hash, token_ids)`` is for tests that force collisions (hash chain only).
    ``cpu_cache_blocks`` (with prefix caching) puts a CPU tier of that many blocks below either
    prefix cache (:class:`~kvlab.core.prefix_cache.TieredPrefixCache`): evicted blocks go down
    to it, and a prompt whose prefix continues there gets those blocks copied up into new
    blocks instead of computed (they count as cached); ``tier_mover`` is told of each copy.

    A block is findable once the K/V of all its tokens are written. Called by hand,
    ``append_slot(seq_id, token_id)`` means the token's K/V are written now. An engine that
    reserves a slot before it knows the token (a decode step) calls ``append_slot(seq_id)`` and
    later :meth:`cache_computed` with the ids whose K/V it has computed.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = False,
        prefix_cache: str = "hash",
        hash_fn=hash_block_tokens,
        cpu_cache_blocks: int | None = None,
        tier_mover=None,
    ):
        self.block_size = positive_int("block_size", block_size)
        if not isinstance(enable_prefix_caching, bool):
            raise TypeError(f"enable_prefix_caching must be a bool, got {enable_prefix_caching!r}")
        check_prefix_cache(prefix_cache)
        if not callable(hash_fn):
            raise TypeError(f"hash_fn must be a function (parent_hash, token_ids), got {hash_fn!r}")
        self.pool = BlockPool(num_blocks)
        self.num_blocks = self.pool.num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_fn = hash_fn
        self.prefix_cache = None  # with prefix caching: a kvlab.core.prefix_cache.PrefixCache
        if enable_prefix_caching:
            self.prefix_cache = make_prefix_cache(
                prefix_cache,
                self.pool,
                self.block_size,
                hash_fn=hash_fn,
                cpu_blocks=cpu_cache_blocks,
                mover=tier_mover,
                block_tables=self._tables,
            )
        elif cpu_cache_blocks is not None:
            raise ValueError(
                "cpu_cache_blocks is a tier of the prefix cache: enable_prefix_caching"
            )
        self.cpu_cache_blocks = cpu_cache_blocks
        self._seqs: dict[Hashable, SequenceBlocks] = {}
        self._plan: AllocationPlan | None = None  # the last prompt asked about, until a change

    # --- queries -----------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now: free and cached-evictable, each counted once."""
        return self.pool.num_free_blocks

    @property
    def seq_ids(self) -> list:
        return list(self._seqs)

    def __contains__(self, seq_id) -> bool:
        return seq_id in self._seqs

    @property
    def held_tokens(self) -> int:
        """Tokens held by every sequence (a shared block's tokens once per sequence)."""
        return sum(map(_num_tokens, self._seqs.values()))

    @property
    def expected_lens(self) -> Mapping[Hashable, int]:
        """The length each sequence is expected to leave with, where known (read-only: see
        :meth:`set_expected_len`)."""
        seqs = self._seqs.items()
        return MappingProxyType({s: q.expected_len for s, q in seqs if q.expected_len is not None})

    def set_expected_len(self, seq_id, expected_len: int | None) -> None:
        """``seq_id`` will leave holding ``expected_len`` tokens (prompt and output; None: not
        known): the empty slots of its blocks up to there are reserved for the future, not
        waste. Forks inherit it."""
        seq = self._seq(seq_id)
        if expected_len is not None:
            expected_len = positive_int("expected_len", expected_len)
        seq.expected_len = expected_len

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        if self.prefix_cache is None:
            return PrefixCacheStats(0, 0, 0, 0)
        return self.prefix_cache.stats

    def cached_block_ids(self) -> list[int]:
        """Cached-evictable blocks (nobody holds them; a prompt with their prefix can), in the
        order they would be handed out."""
        return [] if self.prefix_cache is None else self.prefix_cache.cached_block_ids()

    def num_cached_tokens(self, seq_id) -> int:
        """Prompt tokens found cached when ``seq_id`` was allocated: a multiple of block_size,
        always less than the prompt (its last token is always computed)."""
        return self._seq(seq_id).num_cached

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-positive_int("num_tokens", num_tokens) // self.block_size)

    def plan_allocation(self, prompt) -> AllocationPlan:
        """What allocating ``prompt`` (a count, or token ids) takes now; nothing changes. The
        plan is remembered: the :meth:`allocate` of the same prompt that follows, with no other
        change in between, looks nothing up again."""
        plan = self._plan
        if plan is not None and _same_ids(prompt, plan.token_ids):
            return plan
        num_tokens, ids = _prompt(prompt)
        match = None
        if ids is not None and self.prefix_cache is not None:
            match = self.prefix_cache.match(ids)
        # a cached block nobody holds is free until the prompt takes it: it cannot also be new
        available = self.pool.num_free_blocks
        if match is not None:
            available -= sum(block.ref_count == 0 for block in match.blocks)
        plan = AllocationPlan(num_tokens, ids, match, available)
        if ids is not None:
            self._plan = plan
        return plan

    def can_allocate(self, prompt) -> bool:
        """Whether :meth:`allocate` of this prompt (a count, or token ids) would succeed now."""
        plan = self.plan_allocation(prompt)
        return plan.blocks_needed(self.block_size) <= plan.available

    def can_append(self, seq_id) -> bool:
        """Whether :meth:`append_slot` would succeed: the token fits in the last block, or a free
        block is there for it (a new block, or the copy of a shared one)."""
        try:
            seq = self._seqs[seq_id]
        except (KeyError, TypeError):
            raise _unknown(seq_id) from None
        if seq.num_tokens % self.block_size and seq.table[-1].ref_count == 1:
            return True  # room in place (the hot path of every decode step)
        return bool(self.pool.free_queue) or self.pool.num_free_blocks > 0

    def block_table(self, seq_id) -> list[int]:
        return [block.block_id for block in self._seq(seq_id).table]

    def num_tokens(self, seq_id) -> int:
        return self._seq(seq_id).num_tokens

    def token_ids(self, seq_id) -> list[int] | None:
        """The sequence's token ids, when prefix caching knows them (None otherwise)."""
        ids = self._seq(seq_id).token_ids
        return None if ids is None else list(ids)

    def ref_count(self, block_id: int) -> int:
        positive_int("block_id", block_id, minimum=0)
        if block_id >= self.num_blocks:
            raise ValueError(f"block_id must be < num_blocks = {self.num_blocks}, got {block_id}")
        return self.pool.blocks[block_id].ref_count

    def slot(self, seq_id, position: int) -> int:
        """Physical slot of a token: ``block_id * block_size + offset`` (vLLM's slot mapping)."""
        seq = self._seq(seq_id)
        if not 0 <= position < seq.num_tokens:
            raise IndexError(
                f"position {position} is outside 0..{seq.num_tokens - 1} of {seq_id!r}"
            )
        block, offset = divmod(position, self.block_size)
        return seq.table[block].block_id * self.block_size + offset

    def _tables(self) -> list[list[Block]]:
        """Every sequence's block table (a radix tree swaps a copy that forks share in all)."""
        return [seq.table for seq in self._seqs.values()]

    def _seq(self, seq_id) -> SequenceBlocks:
        return _lookup(self._seqs, seq_id)

    def _new(self, seq_id) -> None:
        _check_new(self._seqs, seq_id)

    def _out_of_blocks(self, seq_id, needed: int, available: int | None = None) -> OutOfBlocks:
        free = self.num_free_blocks if available is None else available
        return OutOfBlocks(
            f"{seq_id!r} needs {needed} free block(s), {free} free of {self.num_blocks}",
            needed=needed,
        )

    # --- prefix caching ------------------------------------------------------------------------
    def _note_full_blocks(self, seq: SequenceBlocks) -> None:
        """Tell the prefix cache of the sequence's full blocks with known ids (new ones only)."""
        full = len(seq.token_ids) // self.block_size
        if full > seq.full_blocks_noted:
            seq.prefix = self.prefix_cache.cache_full_blocks(seq.prefix, seq.table, seq.token_ids)
            seq.full_blocks_noted = full

    def cache_computed(self, seq_id, token_ids, num_computed: int) -> None:
        """The K/V of the sequence's first ``num_computed`` tokens, ``token_ids[:num_computed]``,
        are written: the full blocks they complete become findable. For engines that reserve a
        slot before its token is known (``append_slot(seq_id)`` without an id), or compute a
        prompt in chunks (``allocate(..., num_computed=...)``); ``token_ids`` is the sequence's
        whole list so far, of which only the new part is read."""
        seq = self._seq(seq_id)
        ids = seq.token_ids
        if ids is None:
            if self.prefix_cache is not None:
                raise ValueError(f"{seq_id!r} was allocated with a token count: no ids to cache")
            return
        known = len(ids)
        if not known <= num_computed <= seq.num_tokens:
            if 0 <= num_computed < known:
                return  # already known
            raise ValueError(
                f"num_computed must be in 0..{seq.num_tokens} (the tokens {seq_id!r} "
                f"holds), got {num_computed}"
            )
        new = token_ids[known:num_computed]
        if len(new) != num_computed - known:
            raise ValueError(f"token_ids holds {len(token_ids)} ids, fewer than {num_computed}")
        if any(t.__class__ is not int for t in new):
            new = [_token_id(t, f"token_ids[{known + i}]") for i, t in enumerate(new)]
        ids.extend(new)
        if len(ids) // self.block_size > seq.full_blocks_noted:
            self._plan = None
            self._note_full_blocks(seq)

    # --- changes -----------------------------------------------------------------------------
    def allocate(self, seq_id, prompt, *, num_computed: int | None = None) -> list[int]:
        """Check in a new sequence holding a prompt: ``prompt`` is a token count, or the token
        ids (with prefix caching, the full blocks of its longest cached prefix are shared instead
        of taken fresh). Returns its block table.

        ``num_computed`` (chunked prefill): only the K/V of the prompt's first ``num_computed``
        tokens (besides its cached prefix) are written, so only their full blocks become
        findable now; :meth:`cache_computed` reports the rest. None: all of them are."""
        self._new(seq_id)
        plan = self.plan_allocation(prompt)
        num_computed_of(num_computed, plan.num_tokens)
        needed, cached = plan.blocks_needed(self.block_size), plan.cached
        if needed > plan.available:
            raise self._out_of_blocks(seq_id, needed, plan.available)
        self._plan = None
        self.pool.share(cached)
        ids, prefix = plan.token_ids, None
        if ids is not None and self.prefix_cache is not None:
            # before new blocks are taken: a tree evicts nothing the prefix now holds
            prefix = self.prefix_cache.start(plan.match, plan.num_tokens)
        # the first of the new blocks are filled by a copy up from a lower tier, if it found any
        fetched = 0 if plan.match is None else plan.match.fetched
        table = cached + self.pool.get_new_blocks(needed)
        seq = self._seqs[seq_id] = SequenceBlocks(
            table, plan.num_tokens, (len(cached) + fetched) * self.block_size
        )
        if prefix is not None:
            if num_computed is not None and max(seq.num_cached, num_computed) < len(ids):
                ids = ids[: max(seq.num_cached, num_computed)]
            seq.token_ids, seq.prefix = ids, prefix
            self._note_full_blocks(seq)
        return [block.block_id for block in table]

    def append_slot(self, seq_id, token_id=None) -> tuple[int, int] | None:
        """Make room for one more token of ``seq_id`` (with prefix caching, pass its id: a block
        that becomes full is findable at once).

        Returns None when the token fits in place (last block has a free slot and is not shared)
        or got a fresh block; returns ``(src_block, dst_block)`` after a copy-on-write, so the
        caller copies the shared block's K and V into the new one.
        """
        try:
            seq = self._seqs[seq_id]
        except (KeyError, TypeError):
            raise _unknown(seq_id) from None
        tokens = seq.num_tokens
        ids = None  # without an id (an engine's decode slot) the id comes with cache_computed
        if token_id is not None:
            ids = seq.token_ids
            if ids is None or token_id.__class__ is not int or len(ids) != tokens:
                token_id = self._check_token_id(seq_id, ids, token_id, tokens)
        table, pool = seq.table, self.pool
        moved = None
        if tokens % self.block_size == 0:  # the last block is full: take a fresh one
            if not pool.free_queue and not pool.num_free_blocks:
                raise self._out_of_blocks(seq_id, 1)
            table.append(pool.get_new_block())
            self._plan = None
        elif table[-1].ref_count > 1:  # shared and partly filled: copy-on-write
            if not pool.free_queue and not pool.num_free_blocks:
                raise self._out_of_blocks(seq_id, 1)
            last = table[-1]
            table[-1] = pool.get_new_block()
            pool.free_blocks([last])
            moved = last.block_id, table[-1].block_id
            self._plan = None
        seq.num_tokens = tokens + 1
        if ids is not None and token_id is not None:
            ids.append(token_id)
            if (tokens + 1) % self.block_size == 0:
                self._plan = None
                self._note_full_blocks(seq)
        return moved

    def _check_token_id(self, seq_id, ids, token_id, tokens: int) -> int:
        token_id = _token_id(token_id, "token_id")
        if ids is None and self.prefix_cache is not None:
            raise ValueError(
                f"{seq_id!r} was allocated with a token count, so its token ids are unknown: "
                "call append_slot without token_id (or allocate it with token ids)"
            )
        if ids is not None and len(ids) != tokens:
            raise ValueError(
                f"{seq_id!r} knows the ids of {len(ids)} of its {tokens} tokens: give the missing "
                "ones to cache_computed before appending with a token_id"
            )
        return token_id

    def decode_room(self, seq_ids: list, max_rounds: int) -> int:
        """How many rounds fit now (at most ``max_rounds``), a round being one more slot for
        every sequence of ``seq_ids`` in turn, as :meth:`append_slot` would take them. Without
        shared blocks (no copy-on-write to foresee; 0 otherwise). Changes nothing."""
        pool, size = self.pool, self.block_size
        if pool.num_shared or not seq_ids:
            return 0
        starting = [0] * size  # sequences that take a new block in rounds r, r + size, ...
        for seq_id in seq_ids:
            starting[-self._seq(seq_id).num_tokens % size] += 1
        free = self.num_free_blocks
        cycles = min(max_rounds // size, free // len(seq_ids))  # whole cycles that surely fit
        free -= cycles * len(seq_ids)
        for r in range(cycles * size, max_rounds):
            free -= starting[r % size]
            if free < 0:
                return r
        return max_rounds

    def append_rounds(self, seq_ids: list, rounds: int) -> list[int]:
        """``rounds`` rounds of :meth:`append_slot` (without token ids) for every sequence of
        ``seq_ids`` in turn, in O(sequences + new blocks + rounds): new blocks come off the free
        queue in exactly the order stepping would take them. Only what :meth:`decode_room` said
        fits. Returns the blocks held after each round."""
        positive_int("rounds", rounds, minimum=0)
        if not rounds or not seq_ids:
            return [self.num_blocks - self.num_free_blocks] * rounds
        size, pool = self.block_size, self.pool
        starting: list[list[SequenceBlocks]] = [[] for _ in range(size)]
        needed = 0  # blocks the rounds take in all: if they fit, every round before fits too
        for seq_id in seq_ids:
            seq = self._seq(seq_id)
            first = -seq.num_tokens % size  # the first round in which it takes a block
            starting[first].append(seq)
            needed += 0 if first >= rounds else (rounds - 1 - first) // size + 1
        if pool.num_shared or needed > self.num_free_blocks:
            raise self._out_of_blocks(seq_ids[0], needed)
        held, out = self.num_blocks - self.num_free_blocks, []
        get = pool.get_new_block
        for r in range(rounds):
            takers = starting[r % size]
            for seq in takers:
                seq.table.append(get())
            held += len(takers)
            out.append(held)
        for seq_id in seq_ids:
            self._seqs[seq_id].num_tokens += rounds
        self._plan = None
        return out

    def fork(self, parent_id, child_id) -> None:
        """The child shares every block of the parent (each block's ref_count goes up by one)."""
        parent = self._seq(parent_id)
        self._new(child_id)
        self.pool.share(parent.table)
        prefix = parent.prefix
        if prefix is not None:
            prefix = self.prefix_cache.fork(prefix)
        self._seqs[child_id] = parent.copy(prefix)
        self._plan = None

    def free(self, seq_id) -> None:
        """Check out: drop one reference to each block; blocks nobody holds join the free queue
        (the last block first, so a sequence's first blocks stay unused longest, and a cached
        prefix loses its tail before its head), or stay in the radix tree."""
        seq = self._seq(seq_id)
        if seq.prefix is not None:
            self.prefix_cache.release(seq.prefix)
        self.pool.free_blocks(reversed(seq.table))
        del self._seqs[seq_id]
        self._plan = None

    # --- checks --------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise AssertionError unless every block is exactly one of in use (held by as many block
        tables as its ref_count), cached-evictable (nobody holds it, findable) or free, every
        table fits its tokens, and the prefix cache agrees. For tests and graders: O(blocks +
        table entries)."""
        holders: dict[int, int] = {}
        for seq_id, seq in self._seqs.items():
            tokens = seq.num_tokens
            assert len(seq.table) == -(-tokens // self.block_size), f"{seq_id!r}: table length"
            ids = seq.token_ids
            assert ids is None or len(ids) <= tokens, f"{seq_id!r}: more ids than tokens"
            assert (ids is None) == (seq.prefix is None), f"{seq_id!r}: ids without a prefix"
            for block in seq.table:
                holders[block.block_id] = holders.get(block.block_id, 0) + 1
        queue = self.pool.free_queue
        in_use = 0
        for block in self.pool.blocks:
            held = holders.get(block.block_id, 0)
            assert block.ref_count == held, f"block {block.block_id}: ref_count {block.ref_count}"
            queued = held == 0 and block.node is None  # else held, or kept by the radix tree
            assert (block in queue) == queued, f"block {block.block_id}: queue membership"
            in_use += held > 0
        assert in_use + self.num_free_blocks == self.num_blocks, "free blocks miscounted"
        assert self.pool.num_shared == sum(n > 1 for n in holders.values()), "num_shared"
        if self.prefix_cache is None:
            assert not self.pool.cached and self.pool.evictor is None, "cached without caching"
        else:
            known = [(q.prefix, q.table) for q in self._seqs.values() if q.prefix is not None]
            self.prefix_cache.check_invariants(known)

    # --- accounting ----------------------------------------------------------------------------
    def memory_report(self) -> Usage:
        """Slots split into used / reserved-for-future / internal / free (a block on several
        block tables counts once: see :func:`kvlab.core.accounting.usage`; cached-evictable blocks
        are free: they can be handed out now)."""
        size = self.block_size
        tables = self._block_ids() if self.pool.num_shared else None
        capacity = self.num_blocks * size
        return usage(capacity, size, self._booked(), self._tokens(), self.expected_lens, tables)

    def _block_ids(self) -> dict[Hashable, tuple[int, ...]]:
        return {s: tuple(b.block_id for b in q.table) for s, q in self._seqs.items()}

    def _booked(self) -> dict[Hashable, int]:
        return {s: len(q.table) * self.block_size for s, q in self._seqs.items()}

    def _tokens(self) -> dict[Hashable, int]:
        return {s: q.num_tokens for s, q in self._seqs.items()}

    def state(self) -> CacheState:
        """Block tables, tokens, bookings, expected final lengths and cached-evictable blocks
        now (what a recorder keeps)."""
        tables, tokens, final = self._block_ids(), self._tokens(), dict(self.expected_lens)
        state = CacheState(
            "paged", self.num_blocks, self.block_size, tables, tokens, self._booked(), final
        )
        cached = self.cached_block_ids()
        if cached:
            state = replace(state, cached=tuple(cached))
        return state


_num_tokens = operator.attrgetter("num_tokens")


def _unknown(seq_id) -> KeyError:
    return KeyError(f"seq_id {seq_id!r} is not in the block manager")


def _lookup(seqs: Mapping, seq_id):
    """The sequence ``seq_id`` names, or a KeyError that says so (an unhashable id too)."""
    try:
        return seqs[seq_id]
    except (KeyError, TypeError):
        raise _unknown(seq_id) from None


def _check_new(seqs: Mapping, seq_id) -> None:
    """Raise unless ``seq_id`` is hashable and not taken yet."""
    try:
        exists = seq_id in seqs
    except TypeError:
        raise TypeError(f"seq_id must be hashable, got {type(seq_id).__name__}") from None
    if exists:
        raise ValueError(f"seq_id {seq_id!r} already exists")


def _same_ids(prompt, ids: list[int] | None) -> bool:
    """Whether ``prompt`` is a list of exactly the int token ids ``ids`` (checked without a
    Python loop: it is what lets a remembered plan skip the lookup)."""
    return (
        ids is not None
        and prompt.__class__ is list
        and len(prompt) == len(ids)
        and prompt == ids
        and set(map(type, prompt)) == {int}
    )


def _given_prompt(prompt_len: int, token_ids):
    """What the scheduler gives the cache, as :meth:`BlockManager.allocate` takes a prompt: its
    token ids when known (as many as ``prompt_len``), else its length."""
    if token_ids is None:
        return prompt_len
    if len(token_ids) != prompt_len:
        raise ValueError(
            f"token_ids holds {len(token_ids)} ids for a prompt of prompt_len={prompt_len}"
        )
    return token_ids


class PagedCache:
    """A :class:`BlockManager` as a cache the scheduler drives (the same calls as
    :class:`~kvlab.core.contiguous.ContiguousKVCache`): admit books the prompt's blocks, append takes a
    block only when the last one is full, release checks out. Accounts only: the tensors live in
    :class:`kvlab.kv.tensors.PagedKVCache`. With ``enable_prefix_caching`` the scheduler passes
    token ids, and a prompt's cached prefix is shared and not computed again
    (:meth:`num_cached_tokens`); ``prefix_cache`` ("hash" or "radix") and ``cpu_cache_blocks``
    (a CPU tier below it) are as for :class:`BlockManager`. A :class:`kvlab.serving.interfaces.PrefixCachingKVCache`."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = False,
        prefix_cache: str = "hash",
        cpu_cache_blocks: int | None = None,
    ):
        self.manager = BlockManager(
            num_blocks,
            block_size,
            enable_prefix_caching=enable_prefix_caching,
            prefix_cache=prefix_cache,
            cpu_cache_blocks=cpu_cache_blocks,
        )

    @property
    def prefix_caching(self) -> bool:
        return self.manager.enable_prefix_caching

    @property
    def capacity(self) -> int:
        return self.manager.num_blocks * self.manager.block_size

    @property
    def num_blocks(self) -> int:
        return self.manager.num_blocks

    @property
    def block_size(self) -> int:
        return self.manager.block_size

    def __contains__(self, seq_id) -> bool:
        return seq_id in self.manager

    @property
    def allocated_tokens(self) -> int:
        """Slots in blocks held by some sequence now, filled or not (cached-evictable blocks are
        free)."""
        manager = self.manager
        return (manager.num_blocks - manager.num_free_blocks) * manager.block_size

    @property
    def held_tokens(self) -> int:
        """Tokens held by every sequence (a shared block's tokens once per sequence)."""
        return self.manager.held_tokens

    def refusal(
        self, prompt_len: int, output_len: int | None = None, token_ids=None
    ) -> OutOfBlocks | None:
        """Why admitting now would fail, or None (nothing changes). Admitting means computing the
        first new token in the same step, so a sequence with tokens to generate needs room for
        its prompt and one more token (less its cached prefix, with prefix caching)."""
        more = 0 if output_len == 0 else 1
        manager = self.manager
        plan = manager.plan_allocation(_given_prompt(prompt_len, token_ids))
        needed, available = plan.blocks_needed(manager.block_size, more), plan.available
        if needed > available:
            return OutOfBlocks(f"{needed} free block(s) needed, {available} free", needed=needed)
        return None

    def admit(
        self,
        seq_id,
        prompt_len: int,
        output_len: int | None = None,
        token_ids=None,
        *,
        num_computed: int | None = None,
    ) -> None:
        """Book the prompt's blocks (the plan :meth:`refusal` made is reused). ``num_computed``
        (chunked prefill, with ``token_ids``): the prompt tokens whose K/V are written by now;
        the rest come through :meth:`cache_computed`."""
        if output_len is not None:
            positive_int("output_len", output_len, minimum=0)
        prompt = _given_prompt(prompt_len, token_ids)
        self.manager.allocate(seq_id, prompt, num_computed=num_computed)
        if output_len is not None:
            self.manager.set_expected_len(seq_id, prompt_len + output_len)

    def num_cached_tokens(self, seq_id) -> int:
        return self.manager.num_cached_tokens(seq_id)

    def cached_prefix_tokens(self, token_ids) -> int:
        """Tokens of a prompt (its ids) whose K/V the cache holds now: the longest cached prefix
        in whole blocks of this memory (not a CPU tier's, which must be copied up; never the
        prompt's last token: it is always computed); 0 without prefix caching. A lookup: nothing changes, nothing is counted
        (a router asks it of every replica, as llm-d's precise prefix-cache scorer does)."""
        prefix_cache = self.manager.prefix_cache
        if prefix_cache is None:
            return 0
        return len(prefix_cache.match(token_ids).blocks) * self.manager.block_size

    @property
    def tier_hit_tokens(self) -> int:
        """Prompt tokens copied up from the CPU tier so far instead of computed (0 without a
        tier): read after every step by a cost model that pays for the copies."""
        return getattr(self.manager.prefix_cache, "tier_hits", 0)

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        return self.manager.prefix_cache_stats

    def can_append(self, seq_id) -> bool:
        return self.manager.can_append(seq_id)

    def append(self, seq_id, token_id=None) -> None:
        self.manager.append_slot(seq_id, token_id)

    def cache_computed(self, seq_id, token_ids, num_computed: int) -> None:
        self.manager.cache_computed(seq_id, token_ids, num_computed)

    def decode_room(self, seq_ids: list, max_rounds: int) -> int:
        """Rounds of one more token for every sequence that fit now (``DecodeRunCache``)."""
        if self.prefix_caching:  # full blocks would become findable: step them
            return 0
        return self.manager.decode_room(seq_ids, max_rounds)

    def append_rounds(self, seq_ids: list, rounds: int) -> list[int]:
        """What ``rounds`` rounds of :meth:`append` for each of ``seq_ids`` do; returns
        :attr:`allocated_tokens` after each round."""
        size = self.manager.block_size
        return [held * size for held in self.manager.append_rounds(seq_ids, rounds)]

    def release(self, seq_id) -> None:
        self.manager.free(seq_id)

    def memory_report(self) -> Usage:
        return self.manager.memory_report()

    def state(self) -> CacheState:
        return self.manager.state()


# The K/V tensors live in kvlab.kv.tensors, a layer above; their old names here (Labs 03-04 import
# them from this module) are looked up by kvlab._moved on first use, never imported from here.
def __getattr__(name: str):
    return _moved.moved_attribute(__name__, name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_moved.MOVED_NAMES[__name__]])
