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

from kvlab.accounting import CacheState, Usage, usage
from kvlab.block_pool import ROOT_HASH, Block, BlockPool, hash_block_tokens
from kvlab.contiguous import torch_dtype
from kvlab.errors import OutOfMemory
from kvlab.validate import positive_int


class OutOfBlocks(OutOfMemory):
    """The free queue cannot supply the blocks needed; nothing was changed."""

    unit = "rooms"


@dataclass(frozen=True)
class PrefixCacheStats:
    """What prefix caching found: prompt tokens looked up and found (hits), cached blocks handed
    out again (evictions), and blocks findable now (in use or evictable)."""

    queries: int
    hits: int
    evictions: int
    cached_blocks: int

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


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
    ids = [_token_id(t, f"prompt[{i}]") for i, t in enumerate(prompt)]
    if not ids:
        raise ValueError("prompt must hold at least one token id, got none")
    return len(ids), ids


_BROKEN = object()  # a chain cut by a hash collision: later blocks of it are never found


class BlockManager:
    """Keeps every sequence's block table on top of a :class:`~kvlab.block_pool.BlockPool`.

    With ``enable_prefix_caching`` a prompt given as token ids starts from the blocks of the
    longest cached prefix (shared, not recomputed), and every full block of a sequence whose
    tokens are known becomes findable by a hash chained to its parent's. Blocks nobody holds stay
    cached in the free queue until they are handed out again (least recently freed first).
    ``hash_fn(parent_hash, token_ids)`` is for tests that force collisions.

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
        hash_fn=hash_block_tokens,
    ):
        self.block_size = positive_int("block_size", block_size)
        if not isinstance(enable_prefix_caching, bool):
            raise TypeError(f"enable_prefix_caching must be a bool, got {enable_prefix_caching!r}")
        if not callable(hash_fn):
            raise TypeError(f"hash_fn must be a function (parent_hash, token_ids), got {hash_fn!r}")
        self.pool = BlockPool(num_blocks)
        self.num_blocks = self.pool.num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_fn = hash_fn
        self._tables: dict[Hashable, list[Block]] = {}
        self._tokens: dict[Hashable, int] = {}
        self._token_ids: dict[Hashable, list[int]] = {}  # with prefix caching, when known
        self._hashes: dict[Hashable, list] = {}  # chained hashes of each known full block
        # the findable block a sequence's next full block follows (None: the first block); a
        # block that fills with the same tokens as a findable one follows that one
        self._parents: dict[Hashable, object] = {}
        self._num_cached: dict[Hashable, int] = {}  # prompt tokens found cached at allocate
        self._queries = self._hits = 0
        self.final: dict[Hashable, int] = {}  # expected final length per sequence, when known

    # --- queries -----------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now: free and cached-evictable, each counted once."""
        return len(self.pool.free_queue)

    @property
    def seq_ids(self) -> list:
        return list(self._tables)

    def __contains__(self, seq_id) -> bool:
        return seq_id in self._tables

    @property
    def held_tokens(self) -> int:
        """Tokens held by every sequence (a shared block's tokens once per sequence)."""
        return sum(self._tokens.values())

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        pool = self.pool
        return PrefixCacheStats(self._queries, self._hits, pool.num_evictions, len(pool.cached))

    def cached_block_ids(self) -> list[int]:
        """Cached-evictable blocks (nobody holds them; a prompt with their prefix can), in the
        order they would be handed out."""
        return [b.block_id for b in self.pool.free_queue.blocks() if b.block_hash is not None]

    def num_cached_tokens(self, seq_id) -> int:
        """Prompt tokens found cached when ``seq_id`` was allocated: a multiple of block_size,
        always less than the prompt (its last token is always computed)."""
        self._table(seq_id)
        return self._num_cached[seq_id]

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-positive_int("num_tokens", num_tokens) // self.block_size)

    def can_allocate(self, prompt) -> bool:
        """Whether :meth:`allocate` of this prompt (a count, or token ids) would succeed now."""
        needed, available, _, _ = self._plan(*_prompt(prompt))
        return needed <= available

    def can_append(self, seq_id) -> bool:
        """Whether :meth:`append_slot` would succeed: the token fits in the last block, or a free
        block is there for it (a new block, or the copy of a shared one)."""
        table = self._table(seq_id)
        if self._tokens[seq_id] % self.block_size and table[-1].ref_count == 1:
            return True  # room in place (the hot path of every decode step)
        return bool(self.pool.free_queue)

    def _needs_block(self, seq_id) -> int:
        table = self._table(seq_id)
        full = self._tokens[seq_id] % self.block_size == 0
        return int(full or table[-1].ref_count > 1)

    def block_table(self, seq_id) -> list[int]:
        return [block.block_id for block in self._table(seq_id)]

    def num_tokens(self, seq_id) -> int:
        self._table(seq_id)
        return self._tokens[seq_id]

    def token_ids(self, seq_id) -> list[int] | None:
        """The sequence's token ids, when prefix caching knows them (None otherwise)."""
        self._table(seq_id)
        ids = self._token_ids.get(seq_id)
        return None if ids is None else list(ids)

    def ref_count(self, block_id: int) -> int:
        positive_int("block_id", block_id, minimum=0)
        if block_id >= self.num_blocks:
            raise ValueError(f"block_id must be < num_blocks = {self.num_blocks}, got {block_id}")
        return self.pool.blocks[block_id].ref_count

    def slot(self, seq_id, position: int) -> int:
        """Physical slot of a token: ``block_id * block_size + offset`` (vLLM's slot mapping)."""
        table = self._table(seq_id)
        if not 0 <= position < self._tokens[seq_id]:
            raise IndexError(
                f"position {position} is outside 0..{self._tokens[seq_id] - 1} of {seq_id!r}"
            )
        block, offset = divmod(position, self.block_size)
        return table[block].block_id * self.block_size + offset

    def _table(self, seq_id) -> list[Block]:
        try:
            return self._tables[seq_id]
        except (KeyError, TypeError):
            raise KeyError(f"seq_id {seq_id!r} is not in the block manager") from None

    def _new(self, seq_id) -> None:
        if not isinstance(seq_id, Hashable):
            raise TypeError(f"seq_id must be hashable, got {type(seq_id).__name__}")
        if seq_id in self._tables:
            raise ValueError(f"seq_id {seq_id!r} already exists")

    def _out_of_blocks(self, seq_id, needed: int, available: int | None = None) -> OutOfBlocks:
        free = self.num_free_blocks if available is None else available
        return OutOfBlocks(
            f"{seq_id!r} needs {needed} free block(s), {free} free of {self.num_blocks}",
            needed=needed,
        )

    # --- prefix caching ------------------------------------------------------------------------
    def _cached_prefix(self, ids: list[int]) -> tuple[list[Block], list]:
        """The blocks of the longest cached prefix of ``ids`` and their hashes. The last token is
        never covered: a prompt of k full blocks reuses at most k - 1."""
        size, lookup, hash_fn = self.block_size, self.pool.lookup, self.hash_fn
        blocks, hashes = [], []
        parent_hash, parent = ROOT_HASH, None
        for start in range(0, len(ids) - 1 - (len(ids) - 1) % size, size):
            tokens = tuple(ids[start : start + size])
            block_hash = hash_fn(parent_hash, tokens)
            block = lookup(block_hash, tokens, parent)
            if block is None:
                break
            blocks.append(block)
            hashes.append(block_hash)
            parent_hash, parent = block_hash, block
        return blocks, hashes

    def _plan(self, num_tokens: int, ids: list[int] | None, extra: int = 0):
        """(new blocks needed, blocks that can supply them, cached prefix, its hashes) for a
        prompt plus ``extra`` tokens; nothing changes. A cached block nobody holds is free until
        the prompt takes it, so it cannot also supply a new block."""
        cached, hashes = ([], [])
        if ids is not None and self.enable_prefix_caching:
            cached, hashes = self._cached_prefix(ids)
        needed = self.blocks_needed(num_tokens + extra) - len(cached)
        available = self.num_free_blocks - sum(b.ref_count == 0 for b in cached)
        return needed, available, cached, hashes

    def _cache_full_blocks(self, seq_id) -> None:
        """Make the sequence's full blocks whose token ids are known findable, in order. A block
        whose tokens a findable block already holds (after the same prefix) stays unfindable,
        and the next block follows the findable one, so the rest of the prefix is found too."""
        ids, hashes, table = self._token_ids[seq_id], self._hashes[seq_id], self._tables[seq_id]
        size, pool = self.block_size, self.pool
        parent = self._parents[seq_id]
        for i in range(len(hashes), len(ids) // size):
            tokens = tuple(ids[i * size : (i + 1) * size])
            block_hash = self.hash_fn(hashes[-1] if hashes else ROOT_HASH, tokens)
            hashes.append(block_hash)
            if parent is _BROKEN:
                continue
            found = pool.lookup(block_hash, tokens, parent)
            if found is None and pool.cache(table[i], block_hash, tokens, parent):
                found = table[i]
            parent = _BROKEN if found is None else found
        self._parents[seq_id] = parent

    def cache_computed(self, seq_id, token_ids, num_computed: int) -> None:
        """The K/V of the sequence's first ``num_computed`` tokens, ``token_ids[:num_computed]``,
        are written: the full blocks they complete become findable. For engines that reserve a
        slot before its token is known (``append_slot(seq_id)`` without an id); ``token_ids`` is
        the sequence's whole list so far, of which only the new part is read."""
        ids = self._token_ids.get(seq_id)
        if ids is None:
            self._table(seq_id)
            if self.enable_prefix_caching:
                raise ValueError(f"{seq_id!r} was allocated with a token count: no ids to cache")
            return
        known = len(ids)
        if not known <= num_computed <= self._tokens[seq_id]:
            if 0 <= num_computed < known:
                return  # already known
            raise ValueError(
                f"num_computed must be in 0..{self._tokens[seq_id]} (the tokens {seq_id!r} "
                f"holds), got {num_computed}"
            )
        new = token_ids[known:num_computed]
        if len(new) != num_computed - known:
            raise ValueError(f"token_ids holds {len(token_ids)} ids, fewer than {num_computed}")
        if any(t.__class__ is not int for t in new):
            new = [_token_id(t, f"token_ids[{known + i}]") for i, t in enumerate(new)]
        ids.extend(new)
        if len(ids) // self.block_size > len(self._hashes[seq_id]):
            self._cache_full_blocks(seq_id)

    # --- changes -----------------------------------------------------------------------------
    def allocate(self, seq_id, prompt) -> list[int]:
        """Check in a new sequence holding a prompt: ``prompt`` is a token count, or the token
        ids (with prefix caching, the full blocks of its longest cached prefix are shared instead
        of taken fresh). Returns its block table."""
        self._new(seq_id)
        num_tokens, ids = _prompt(prompt)
        needed, available, cached, hashes = self._plan(num_tokens, ids)
        if needed > available:
            raise self._out_of_blocks(seq_id, needed, available)
        self.pool.share(cached)
        table = self._tables[seq_id] = cached + self.pool.get_new_blocks(needed)
        self._tokens[seq_id] = num_tokens
        self._num_cached[seq_id] = len(cached) * self.block_size
        if ids is not None and self.enable_prefix_caching:
            self._token_ids[seq_id], self._hashes[seq_id] = ids, hashes
            self._parents[seq_id] = cached[-1] if cached else None
            self._queries += num_tokens
            self._hits += len(cached) * self.block_size
            self._cache_full_blocks(seq_id)
        return [block.block_id for block in table]

    def append_slot(self, seq_id, token_id=None) -> tuple[int, int] | None:
        """Make room for one more token of ``seq_id`` (with prefix caching, pass its id: a block
        that becomes full is hashed and findable at once).

        Returns None when the token fits in place (last block has a free slot and is not shared)
        or got a fresh block; returns ``(src_block, dst_block)`` after a copy-on-write, so the
        caller copies the shared block's K and V into the new one.
        """
        table = self._table(seq_id)
        tokens = self._tokens[seq_id]
        ids = None  # without an id (an engine's decode slot) the id comes with cache_computed
        if token_id is not None:
            ids = self._token_ids.get(seq_id)
            if ids is None or token_id.__class__ is not int or len(ids) != tokens:
                token_id = self._check_token_id(seq_id, ids, token_id, tokens)
        moved = None
        if tokens % self.block_size == 0:  # the last block is full: take a fresh one
            if not self.pool.free_queue:
                raise self._out_of_blocks(seq_id, 1)
            table.append(self.pool.get_new_block())
        elif table[-1].ref_count > 1:  # shared and partly filled: copy-on-write
            if not self.pool.free_queue:
                raise self._out_of_blocks(seq_id, 1)
            last = table[-1]
            table[-1] = self.pool.get_new_block()
            self.pool.free_blocks([last])
            moved = last.block_id, table[-1].block_id
        self._tokens[seq_id] = tokens + 1
        if ids is not None and token_id is not None:
            ids.append(token_id)
            if (tokens + 1) % self.block_size == 0:
                self._cache_full_blocks(seq_id)
        return moved

    def _check_token_id(self, seq_id, ids, token_id, tokens: int) -> int:
        token_id = _token_id(token_id, "token_id")
        if ids is None and self.enable_prefix_caching:
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

    def fork(self, parent_id, child_id) -> None:
        """The child shares every block of the parent (each block's ref_count goes up by one)."""
        table = self._table(parent_id)
        self._new(child_id)
        self.pool.share(table)
        self._tables[child_id] = list(table)
        self._tokens[child_id] = self._tokens[parent_id]
        self._num_cached[child_id] = self._num_cached[parent_id]
        if parent_id in self._token_ids:
            self._token_ids[child_id] = list(self._token_ids[parent_id])
            self._hashes[child_id] = list(self._hashes[parent_id])
            self._parents[child_id] = self._parents[parent_id]
        if parent_id in self.final:
            self.final[child_id] = self.final[parent_id]

    def free(self, seq_id) -> None:
        """Check out: drop one reference to each block; blocks nobody holds join the free queue
        (the last block first, so a sequence's first blocks stay unused longest, and a cached
        prefix loses its tail before its head)."""
        table = self._table(seq_id)
        self.pool.free_blocks(reversed(table))
        del self._tables[seq_id], self._tokens[seq_id], self._num_cached[seq_id]
        self._token_ids.pop(seq_id, None)
        self._hashes.pop(seq_id, None)
        self._parents.pop(seq_id, None)
        self.final.pop(seq_id, None)

    # --- checks --------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise AssertionError unless every block is exactly one of in use (held by as many block
        tables as its ref_count), cached-evictable (nobody holds it, findable by its hash) or free,
        and every table fits its tokens. For tests and graders: O(blocks + table entries)."""
        holders: dict[int, int] = {}
        for seq_id, table in self._tables.items():
            tokens = self._tokens[seq_id]
            assert len(table) == -(-tokens // self.block_size), f"{seq_id!r}: wrong table length"
            ids = self._token_ids.get(seq_id)
            assert ids is None or len(ids) <= tokens, f"{seq_id!r}: more ids than tokens"
            for block in table:
                holders[block.block_id] = holders.get(block.block_id, 0) + 1
        queue = self.pool.free_queue
        in_use = evictable = free = 0
        for block in self.pool.blocks:
            held = holders.get(block.block_id, 0)
            assert block.ref_count == held, f"block {block.block_id}: ref_count {block.ref_count}"
            assert (block in queue) == (held == 0), f"block {block.block_id}: queue membership"
            if block.block_hash is not None:
                assert self.pool.cached.get(block.block_hash) is block, "cached map out of step"
                assert len(block.token_ids) == self.block_size, "a cached block is not full"
            in_use += held > 0
            evictable += held == 0 and block.block_hash is not None
            free += held == 0 and block.block_hash is None
        assert in_use + evictable + free == self.num_blocks
        assert len(self.pool.cached) == sum(b.block_hash is not None for b in self.pool.blocks)
        assert self.pool.num_shared == sum(n > 1 for n in holders.values()), "num_shared"

    # --- accounting ----------------------------------------------------------------------------
    def memory_report(self) -> Usage:
        """Slots split into used / reserved-for-future / internal / free (a block on several
        block tables counts once: see :func:`kvlab.accounting.usage`; cached-evictable blocks
        are free: they can be handed out now)."""
        size = self.block_size
        tables = self._block_ids() if self.pool.num_shared else None
        return usage(self.num_blocks * size, size, self._booked(), self._tokens, self.final, tables)

    def _block_ids(self) -> dict[Hashable, tuple[int, ...]]:
        return {s: tuple(b.block_id for b in t) for s, t in self._tables.items()}

    def _booked(self) -> dict[Hashable, int]:
        return {s: len(t) * self.block_size for s, t in self._tables.items()}

    def state(self) -> CacheState:
        """Block tables, tokens, bookings, final lengths and cached-evictable blocks now (what a
        recorder keeps)."""
        tables, tokens, final = self._block_ids(), dict(self._tokens), dict(self.final)
        state = CacheState(
            "paged", self.num_blocks, self.block_size, tables, tokens, self._booked(), final
        )
        if self.pool.cached:
            state = replace(state, cached=tuple(self.cached_block_ids()))
        return state


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
    :class:`~kvlab.contiguous.ContiguousKVCache`): admit books the prompt's blocks, append takes a
    block only when the last one is full, release checks out. Accounts only: the tensors live in
    :class:`PagedKVCache`. With ``enable_prefix_caching`` the scheduler passes token ids, and a
    prompt's cached prefix is shared and not computed again (:meth:`num_cached_tokens`)."""

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = False):
        self.manager = BlockManager(
            num_blocks, block_size, enable_prefix_caching=enable_prefix_caching
        )

    @property
    def prefix_caching(self) -> bool:
        return self.manager.enable_prefix_caching

    @property
    def capacity(self) -> int:
        return self.manager.num_blocks * self.manager.block_size

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
        num_tokens, ids = _prompt(_given_prompt(prompt_len, token_ids))
        needed, available, _, _ = self.manager._plan(num_tokens, ids, extra=more)
        if needed > available:
            return OutOfBlocks(f"{needed} free block(s) needed, {available} free", needed=needed)
        return None

    def admit(self, seq_id, prompt_len: int, output_len: int | None = None, token_ids=None) -> None:
        self.manager.allocate(seq_id, _given_prompt(prompt_len, token_ids))
        if output_len is not None:
            self.manager.final[seq_id] = prompt_len + output_len

    def num_cached_tokens(self, seq_id) -> int:
        return self.manager.num_cached_tokens(seq_id)

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        return self.manager.prefix_cache_stats

    def can_append(self, seq_id) -> bool:
        return self.manager.can_append(seq_id)

    def append(self, seq_id, token_id=None) -> None:
        self.manager.append_slot(seq_id, token_id)

    def cache_computed(self, seq_id, token_ids, num_computed: int) -> None:
        self.manager.cache_computed(seq_id, token_ids, num_computed)

    def release(self, seq_id) -> None:
        self.manager.free(seq_id)

    def memory_report(self) -> Usage:
        return self.manager.memory_report()

    def state(self) -> CacheState:
        return self.manager.state()


class PagedKVCache:
    """Real K and V tensors in vLLM's NHD layout, ``[num_blocks, block_size, kv_heads, head_dim]``
    per layer, addressed through a :class:`BlockManager`."""

    def __init__(self, spec, num_blocks: int, block_size: int, dtype=None, device="cpu"):
        import torch

        self.spec = spec
        self.manager = BlockManager(num_blocks, block_size)
        if dtype is None:
            dtype = torch_dtype(spec)
        shape = (num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(spec.num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(spec.num_layers)]

    def slot_mapping(self, seq_id, positions):
        """Physical slots (``block_id * block_size + offset``) of token positions, as a tensor."""
        import torch

        slots = [self.manager.slot(seq_id, int(p)) for p in positions]
        return torch.tensor(slots, dtype=torch.int64, device=self.k[0].device)

    def write(self, seq_id, k, v, layer: int | None = None) -> None:
        """Store K and V of the sequence's newest ``n`` tokens.

        ``k, v``: ``[n, kv_heads, head_dim]`` for one ``layer``, or ``[layers, n, kv_heads,
        head_dim]`` for every layer. The manager must already hold rooms for those tokens.
        """
        layers = range(self.spec.num_layers) if layer is None else [layer]
        if layer is None and k.dim() != 4:
            raise ValueError(
                f"k must be [layers, n, kv_heads, head_dim] without layer=, got {tuple(k.shape)}"
            )
        if layer is not None and k.dim() != 3:
            raise ValueError(f"k must be [n, kv_heads, head_dim] with layer=, got {tuple(k.shape)}")
        if k.shape != v.shape:
            raise ValueError(
                f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        n = k.shape[-3]
        total = self.manager.num_tokens(seq_id)
        if n > total:
            raise ValueError(f"{n} tokens given but {seq_id!r} holds only {total}")
        slots = self.slot_mapping(seq_id, range(total - n, total))
        for i, index in enumerate(layers):
            kk = k if layer is not None else k[i]
            vv = v if layer is not None else v[i]
            target = {"dtype": self.k[index].dtype, "device": self.k[index].device}
            self.k[index].view(-1, *self.k[index].shape[2:])[slots] = kk.to(**target)
            self.v[index].view(-1, *self.v[index].shape[2:])[slots] = vv.to(**target)

    def _check_kv(self, k, v, layer) -> None:
        heads = (self.spec.num_kv_heads, self.spec.head_dim)
        if layer is None:
            want = f"[{self.spec.num_layers}, n, {heads[0]}, {heads[1]}] (all layers)"
            ok = k.dim() == 4 and k.shape[0] == self.spec.num_layers and tuple(k.shape[2:]) == heads
        else:
            positive_int("layer", layer, minimum=0)
            if layer >= self.spec.num_layers:
                raise ValueError(f"layer must be < {self.spec.num_layers}, got {layer}")
            want = f"[n, {heads[0]}, {heads[1]}] (one layer)"
            ok = k.dim() == 3 and tuple(k.shape[1:]) == heads
        if not ok or k.shape != v.shape:
            raise ValueError(f"k and v must be {want}, got {tuple(k.shape)} and {tuple(v.shape)}")

    def copy_blocks(self, pairs) -> None:
        """Copy whole rooms ``src -> dst`` in every layer (after a copy-on-write)."""
        for src, dst in pairs:
            for cache in (*self.k, *self.v):
                cache[dst].copy_(cache[src])

    def append_token(self, seq_id, k, v) -> None:
        """Room for one more token (copying a shared room first if needed), then store its K, V
        (``[layers, 1, kv_heads, head_dim]``)."""
        self._check_kv(k, v, None)
        if k.shape[1] != 1:
            raise ValueError(
                f"append_token takes one token: k must be [layers, 1, ...], got {tuple(k.shape)}"
            )
        moved = self.manager.append_slot(seq_id)
        if moved is not None:
            self.copy_blocks([moved])
        self.write(seq_id, k, v)

    def gather(self, seq_id, layer: int):
        """The sequence's K and V as contiguous ``[tokens, kv_heads, head_dim]`` tensors."""
        slots = self.slot_mapping(seq_id, range(self.manager.num_tokens(seq_id)))
        flat_k = self.k[layer].view(-1, *self.k[layer].shape[2:])
        flat_v = self.v[layer].view(-1, *self.v[layer].shape[2:])
        return flat_k[slots], flat_v[slots]


def block_tables_tensor(manager: BlockManager, seq_ids: list, pad: int = -1):
    """Key cards as the padded int32 ``[num_seqs, max_blocks]`` tensor kernels take, plus int32
    ``seq_lens``. Entries past a sequence's last room hold ``pad`` and must never be read."""
    import torch

    tables = [manager.block_table(s) for s in seq_ids]
    width = max((len(t) for t in tables), default=0)
    padded = [t + [pad] * (width - len(t)) for t in tables]
    lens = [manager.num_tokens(s) for s in seq_ids]
    return torch.tensor(padded, dtype=torch.int32).reshape(len(seq_ids), width), torch.tensor(
        lens, dtype=torch.int32
    )


def flashinfer_page_table(block_tables, seq_lens, block_size: int):
    """The same key cards in FlashInfer's CSR form: ``kv_indptr`` (where each sequence's pages
    start in ``kv_indices``), ``kv_indices`` (the pages), ``kv_last_page_len`` (tokens in each
    sequence's last page)."""
    import torch

    positive_int("block_size", block_size)
    pages = [(-(-int(n) // block_size)) for n in seq_lens]
    indices = [int(b) for row, n in zip(block_tables, pages, strict=True) for b in row[:n]]
    indptr = [0]
    for n in pages:
        indptr.append(indptr[-1] + n)
    last = [int(n) - (p - 1) * block_size for n, p in zip(seq_lens, pages, strict=True)]
    as_int32 = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    return as_int32(indptr), as_int32(indices), as_int32(last)
