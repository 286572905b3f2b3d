"""The paged KV cache: fixed-size rooms handed out one at a time, found through key cards.

Memory is ``num_blocks`` blocks (rooms) of ``block_size`` token slots (beds). A sequence (guest)
holds a block table (key card): logical block i -> physical block id, in any order anywhere in the
hotel. Rooms are taken from a free list only when a token needs one, so a guest wastes at most the
empty beds of its last room. Reference counts let guests share rooms (fork); a guest about to
write into a shared, partly filled room first moves to a fresh copy (copy-on-write).
"""

from __future__ import annotations

from collections.abc import Hashable

from kvlab.contiguous import torch_dtype
from kvlab.errors import OutOfMemory
from kvlab.trace import Trace, Usage, split_waste
from kvlab.validate import positive_int


class OutOfBlocks(OutOfMemory):
    """The free list cannot supply the rooms needed; nothing was changed."""


class BlockManager:
    """Hands out blocks from a free list and keeps every sequence's block table."""

    def __init__(self, num_blocks: int, block_size: int, record: bool = False):
        self.num_blocks = positive_int("num_blocks", num_blocks)
        self.block_size = positive_int("block_size", block_size)
        self._free: list[int] = list(
            range(self.num_blocks - 1, -1, -1)
        )  # pop() gives low ids first
        self._refs: list[int] = [0] * self.num_blocks
        self._tables: dict[Hashable, list[int]] = {}
        self._tokens: dict[Hashable, int] = {}
        self._shared = 0  # rooms with ref_count > 1 (0 lets memory_report skip the per-room pass)
        self.final: dict[Hashable, int] = {}  # expected final length per sequence, when known
        self.clock = 0.0
        self.trace = None
        if record:
            self.start_recording()

    def start_recording(self) -> Trace:
        """Record frames from now on (the first one shows the current state)."""
        self.trace = Trace(
            "paged", self.num_blocks, self.block_size, meta={"block_size": self.block_size}
        )
        self.snapshot("start")
        return self.trace

    # --- queries -----------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def seq_ids(self) -> list:
        return list(self._tables)

    def __contains__(self, seq_id) -> bool:
        return seq_id in self._tables

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-positive_int("num_tokens", num_tokens) // self.block_size)

    def can_allocate(self, num_tokens: int) -> bool:
        return self.blocks_needed(num_tokens) <= len(self._free)

    def block_table(self, seq_id) -> list[int]:
        return list(self._table(seq_id))

    def num_tokens(self, seq_id) -> int:
        self._table(seq_id)
        return self._tokens[seq_id]

    def ref_count(self, block_id: int) -> int:
        positive_int("block_id", block_id, minimum=0)
        if block_id >= self.num_blocks:
            raise ValueError(f"block_id must be < num_blocks = {self.num_blocks}, got {block_id}")
        return self._refs[block_id]

    def slot(self, seq_id, position: int) -> int:
        """Physical slot of a token: ``block_id * block_size + offset`` (vLLM's slot mapping)."""
        table = self._table(seq_id)
        if not 0 <= position < self._tokens[seq_id]:
            raise IndexError(
                f"position {position} is outside 0..{self._tokens[seq_id] - 1} of {seq_id!r}"
            )
        block, offset = divmod(position, self.block_size)
        return table[block] * self.block_size + offset

    def _table(self, seq_id) -> list[int]:
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
        self.snapshot("out of memory", seq_id, note=f"{seq_id} needs {needed} rooms")
        return OutOfBlocks(
            f"{seq_id!r} needs {needed} free block(s), {len(self._free)} free of {self.num_blocks}"
        )

    # --- changes -----------------------------------------------------------------------------
    def allocate(self, seq_id, num_tokens: int) -> list[int]:
        """Check in a new sequence holding ``num_tokens`` prompt tokens; return its block table."""
        self._new(seq_id)
        needed = self.blocks_needed(num_tokens)
        if needed > len(self._free):
            raise self._out_of_blocks(seq_id, needed)
        table = [self._free.pop() for _ in range(needed)]
        for block in table:
            self._refs[block] = 1
        self._tables[seq_id] = table
        self._tokens[seq_id] = num_tokens
        self.snapshot("check-in", seq_id)
        return list(table)

    def append_slot(self, seq_id) -> tuple[int, int] | None:
        """Make room for one more token of ``seq_id``.

        Returns None when the token fits in place (last room has a bed and is not shared) or got a
        fresh room; returns ``(src_block, dst_block)`` after a copy-on-write, so the caller copies
        the shared room's K and V into the new one.
        """
        table = self._table(seq_id)
        tokens = self._tokens[seq_id]
        if tokens % self.block_size == 0:  # the last room is full: take a fresh one
            if not self._free:
                raise self._out_of_blocks(seq_id, 1)
            block = self._free.pop()
            self._refs[block] = 1
            table.append(block)
            self._tokens[seq_id] = tokens + 1
            return None
        last = table[-1]
        if self._refs[last] == 1:
            self._tokens[seq_id] = tokens + 1
            return None
        if not self._free:  # shared and partly filled: copy-on-write
            raise self._out_of_blocks(seq_id, 1)
        block = self._free.pop()
        self._refs[block] = 1
        self._refs[last] -= 1
        self._shared -= self._refs[last] == 1
        table[-1] = block
        self._tokens[seq_id] = tokens + 1
        self.snapshot("copy-on-write", seq_id, note=f"room {last} -> room {block}")
        return last, block

    def fork(self, parent_id, child_id) -> None:
        """The child shares every room of the parent (each room's ref_count goes up by one)."""
        table = self._table(parent_id)
        self._new(child_id)
        for block in table:
            self._refs[block] += 1
            self._shared += self._refs[block] == 2
        self._tables[child_id] = list(table)
        self._tokens[child_id] = self._tokens[parent_id]
        if parent_id in self.final:
            self.final[child_id] = self.final[parent_id]
        self.snapshot("fork", child_id, note=f"{child_id} shares {parent_id}'s {len(table)} rooms")

    def free(self, seq_id) -> None:
        """Check out: drop one reference to each room; rooms nobody holds return to the free list."""
        table = self._table(seq_id)
        for block in reversed(table):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free.append(block)
            elif self._refs[block] == 1:
                self._shared -= 1
        del self._tables[seq_id], self._tokens[seq_id]
        self.final.pop(seq_id, None)
        self.snapshot("check-out", seq_id)

    # --- accounting ----------------------------------------------------------------------------
    def memory_report(self) -> Usage:
        """Beds split into used / reserved-for-future / internal / free.

        Each room in use counts once, however many key cards hold it: its beds are used up to the
        fullest holder, and reserved for the future up to what any holder will still write.
        """
        size = self.block_size
        capacity, free = self.num_blocks * size, len(self._free) * size
        if not self._shared:  # nobody shares: each guest's rooms are its own
            used = future = internal = 0
            for seq_id, table in self._tables.items():
                u, f, i = split_waste(
                    len(table) * size, self._tokens[seq_id], self.final.get(seq_id)
                )
                used, future, internal = used + u, future + f, internal + i
            return Usage(capacity, used, future, internal, free)
        filled: dict[int, int] = {}
        will_fill: dict[int, int] = {}
        for seq_id, table in self._tables.items():
            tokens = self._tokens[seq_id]
            final = self.final.get(seq_id)
            for i, block in enumerate(table):
                now = min(size, tokens - i * size)
                later = size if final is None else max(now, min(size, final - i * size))
                filled[block] = max(filled.get(block, 0), now)
                will_fill[block] = max(will_fill.get(block, 0), later)
        used = sum(filled.values())
        future = sum(will_fill.values()) - used
        internal = len(filled) * size - used - future
        return Usage(capacity, used, future, internal, free)

    def snapshot(self, event: str = "step", guest=None, note: str = "") -> None:
        """Record the current state into the trace (no-op when not recording)."""
        if self.trace is None:
            return
        booked = {s: len(t) * self.block_size for s, t in self._tables.items()}
        self.trace.record(
            event, guest, self.clock, self._tables, self._tokens, booked, self.final, note
        )


class PagedHotel:
    """A BlockManager seen as a hotel for :func:`kvlab.replay.replay`: admit books the prompt's
    rooms, append takes a room only when the last one is full, release checks out."""

    def __init__(self, num_blocks: int, block_size: int, record: bool = False):
        self.manager = BlockManager(num_blocks, block_size, record=record)

    @property
    def trace(self):
        return self.manager.trace

    def start_recording(self) -> Trace:
        return self.manager.start_recording()

    @property
    def clock(self) -> float:
        return self.manager.clock

    @clock.setter
    def clock(self, value: float) -> None:
        self.manager.clock = value

    @property
    def capacity(self) -> int:
        return self.manager.num_blocks * self.manager.block_size

    def admit(self, request_id, prompt_len: int, output_len: int | None = None) -> None:
        if output_len is not None and request_id not in self.manager:
            self.manager.final[request_id] = prompt_len + output_len  # known before check-in
        try:
            self.manager.allocate(request_id, prompt_len)
        except Exception:
            if request_id not in self.manager:
                self.manager.final.pop(request_id, None)
            raise

    def append(self, request_id) -> None:
        self.manager.append_slot(request_id)

    def release(self, request_id) -> None:
        self.manager.free(request_id)

    def memory_report(self) -> Usage:
        return self.manager.memory_report()

    def snapshot(self, event: str = "step", guest=None, note: str = "") -> None:
        self.manager.snapshot(event, guest, note)


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
