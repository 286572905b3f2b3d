"""The paged KV cache: fixed-size rooms handed out one at a time, found through key cards.

Memory is ``num_blocks`` blocks (rooms) of ``block_size`` token slots (beds). A sequence (guest)
holds a block table (key card): logical block i -> physical block id, in any order anywhere in the
hotel. Blocks come from the pool's free queue only when a token needs one, so a sequence wastes at
most the empty slots of its last block. Reference counts let sequences share blocks (fork); a
sequence about to write into a shared, partly filled block first moves to a fresh copy
(copy-on-write).
"""

from __future__ import annotations

from collections.abc import Hashable

from kvlab.accounting import CacheState, Usage, usage
from kvlab.block_pool import Block, BlockPool
from kvlab.contiguous import torch_dtype
from kvlab.errors import OutOfMemory
from kvlab.validate import positive_int


class OutOfBlocks(OutOfMemory):
    """The free queue cannot supply the blocks needed; nothing was changed."""

    unit = "rooms"


class BlockManager:
    """Keeps every sequence's block table on top of a :class:`~kvlab.block_pool.BlockPool`."""

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = positive_int("block_size", block_size)
        self.pool = BlockPool(num_blocks)
        self.num_blocks = self.pool.num_blocks
        self._tables: dict[Hashable, list[Block]] = {}
        self._tokens: dict[Hashable, int] = {}
        self.final: dict[Hashable, int] = {}  # expected final length per sequence, when known

    # --- queries -----------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
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

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-positive_int("num_tokens", num_tokens) // self.block_size)

    def can_allocate(self, num_tokens: int) -> bool:
        return self.blocks_needed(num_tokens) <= self.num_free_blocks

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

    def _out_of_blocks(self, seq_id, needed: int) -> OutOfBlocks:
        free = self.num_free_blocks
        return OutOfBlocks(
            f"{seq_id!r} needs {needed} free block(s), {free} free of {self.num_blocks}",
            needed=needed,
        )

    # --- changes -----------------------------------------------------------------------------
    def allocate(self, seq_id, num_tokens: int) -> list[int]:
        """Check in a new sequence holding ``num_tokens`` prompt tokens; return its block table."""
        self._new(seq_id)
        needed = self.blocks_needed(num_tokens)
        if needed > self.num_free_blocks:
            raise self._out_of_blocks(seq_id, needed)
        table = self._tables[seq_id] = self.pool.get_new_blocks(needed)
        self._tokens[seq_id] = num_tokens
        return [block.block_id for block in table]

    def append_slot(self, seq_id) -> tuple[int, int] | None:
        """Make room for one more token of ``seq_id``.

        Returns None when the token fits in place (last block has a free slot and is not shared)
        or got a fresh block; returns ``(src_block, dst_block)`` after a copy-on-write, so the
        caller copies the shared block's K and V into the new one.
        """
        table = self._table(seq_id)
        tokens = self._tokens[seq_id]
        if tokens % self.block_size == 0:  # the last block is full: take a fresh one
            if not self.pool.free_queue:
                raise self._out_of_blocks(seq_id, 1)
            table.append(self.pool.get_new_block())
            self._tokens[seq_id] = tokens + 1
            return None
        last = table[-1]
        if last.ref_count == 1:
            self._tokens[seq_id] = tokens + 1
            return None
        if not self.pool.free_queue:  # shared and partly filled: copy-on-write
            raise self._out_of_blocks(seq_id, 1)
        table[-1] = self.pool.get_new_block()
        self.pool.free_blocks([last])
        self._tokens[seq_id] = tokens + 1
        return last.block_id, table[-1].block_id

    def fork(self, parent_id, child_id) -> None:
        """The child shares every block of the parent (each block's ref_count goes up by one)."""
        table = self._table(parent_id)
        self._new(child_id)
        self.pool.share(table)
        self._tables[child_id] = list(table)
        self._tokens[child_id] = self._tokens[parent_id]
        if parent_id in self.final:
            self.final[child_id] = self.final[parent_id]

    def free(self, seq_id) -> None:
        """Check out: drop one reference to each block; blocks nobody holds join the free queue
        (the last block first, so a sequence's first blocks stay unused longest)."""
        table = self._table(seq_id)
        self.pool.free_blocks(reversed(table))
        del self._tables[seq_id], self._tokens[seq_id]
        self.final.pop(seq_id, None)

    # --- accounting ----------------------------------------------------------------------------
    def memory_report(self) -> Usage:
        """Slots split into used / reserved-for-future / internal / free (a block on several
        block tables counts once: see :func:`kvlab.accounting.usage`)."""
        size = self.block_size
        tables = self._block_ids() if self.pool.num_shared else None
        return usage(self.num_blocks * size, size, self._booked(), self._tokens, self.final, tables)

    def _block_ids(self) -> dict[Hashable, tuple[int, ...]]:
        return {s: tuple(b.block_id for b in t) for s, t in self._tables.items()}

    def _booked(self) -> dict[Hashable, int]:
        return {s: len(t) * self.block_size for s, t in self._tables.items()}

    def state(self) -> CacheState:
        """Block tables, tokens, bookings and final lengths now (what a recorder keeps)."""
        tables, tokens, final = self._block_ids(), dict(self._tokens), dict(self.final)
        return CacheState(
            "paged", self.num_blocks, self.block_size, tables, tokens, self._booked(), final
        )


class PagedCache:
    """A :class:`BlockManager` as a cache the scheduler drives (the same calls as
    :class:`~kvlab.contiguous.ContiguousKVCache`): admit books the prompt's blocks, append takes a
    block only when the last one is full, release checks out. Accounts only: the tensors live in
    :class:`PagedKVCache`."""

    def __init__(self, num_blocks: int, block_size: int):
        self.manager = BlockManager(num_blocks, block_size)

    @property
    def capacity(self) -> int:
        return self.manager.num_blocks * self.manager.block_size

    def __contains__(self, seq_id) -> bool:
        return seq_id in self.manager

    @property
    def allocated_tokens(self) -> int:
        """Slots in blocks handed out now, filled or not."""
        manager = self.manager
        return (manager.num_blocks - manager.num_free_blocks) * manager.block_size

    @property
    def held_tokens(self) -> int:
        """Tokens held by every sequence (a shared block's tokens once per sequence)."""
        return self.manager.held_tokens

    def refusal(self, prompt_len: int, output_len: int | None = None) -> OutOfBlocks | None:
        """Why admitting now would fail, or None (nothing changes). Admitting means computing the
        first new token in the same step, so a sequence with tokens to generate needs room for
        its prompt and one more token."""
        more = 0 if output_len == 0 else 1
        needed = self.manager.blocks_needed(prompt_len + more)
        if needed > self.manager.num_free_blocks:
            return OutOfBlocks(
                f"{needed} free block(s) needed, {self.manager.num_free_blocks} free", needed=needed
            )
        return None

    def admit(self, seq_id, prompt_len: int, output_len: int | None = None) -> None:
        self.manager.allocate(seq_id, prompt_len)
        if output_len is not None:
            self.manager.final[seq_id] = prompt_len + output_len

    def can_append(self, seq_id) -> bool:
        return self.manager.can_append(seq_id)

    def append(self, seq_id) -> None:
        self.manager.append_slot(seq_id)

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
