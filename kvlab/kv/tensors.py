"""Where the K and V tensors live: the one home of every K/V layout the course builds.

The accounts (:class:`~kvlab.core.block_manager.BlockManager`, :class:`~kvlab.core.block_manager.PagedCache`,
:class:`~kvlab.core.contiguous.ContiguousKVCache`) say which slot holds which token and import no
torch; the tensors here hold the keys and values in those slots. Keeping them in one module means
one place decides the layouts, the dtype and how a slot is addressed:

* :class:`PagedKVCache`: ``[num_blocks, block_size, kv_heads, head_dim]`` per layer (vLLM's NHD
  layout), slots found through a block manager's block tables (Labs 03-05, and the tiny model's
  paged cache through :meth:`PagedKVCache.over`).
* :class:`ContiguousStore`: the ``[num_slots, max_seq_len, kv_heads, head_dim]`` tensors of a
  contiguous cache, each sequence's slots one stretch from its booking's offset (Lab 01, and the
  tiny model's contiguous cache).
* :func:`block_tables_tensor` and :func:`flashinfer_page_table`: block tables as kernels take them.

Both stores answer the calls of :class:`KVStore`, so the tiny model's executor runs either one the
same way: write the new tokens' K/V through their slots, then attend over everything stored.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Protocol

import torch

from kvlab.core.block_manager import BlockManager, PagedCache
from kvlab.core.kv_memory import kv_layers, torch_dtype  # noqa: F401  (importable from here)
from kvlab.core.validate import positive_int
from kvlab.ops.attention import chunk_attention_reference, decode_attention, write_kv_reference


class KVStore(Protocol):
    """What the tiny model's executor asks of the K/V tensors of one cache, whatever the layout.
    ``slot_mapping`` holds flat slots (:meth:`slots`) of the tokens whose ``k, v`` are given."""

    def slots(self, seq_id: Hashable, positions: Iterable[int]) -> list[int]: ...

    def write_slots(self, layer: int, slot_mapping, k, v) -> None: ...

    def gather(self, seq_id: Hashable, layer: int, num_tokens: int | None = None): ...

    def decode(self, layer: int, q, seq_ids: list, seq_lens: list[int]): ...

    def attend_chunk(self, layer: int, q, seq_id: Hashable, num_computed: int): ...


def _table_rows(manager, seq_ids: list, pad: int) -> list[list[int]]:
    tables = [manager.block_table(s) for s in seq_ids]
    width = max((len(t) for t in tables), default=0)
    return [t + [pad] * (width - len(t)) for t in tables]


def block_tables_tensor(manager: BlockManager, seq_ids: list, pad: int = -1, device=None):
    """Block tables as the padded int32 ``[num_seqs, max_blocks]`` tensor kernels take, plus int32
    ``seq_lens`` (the tokens each sequence holds). Entries past a sequence's last block hold
    ``pad`` and must never be read."""
    rows = _table_rows(manager, seq_ids, pad)
    lens = [manager.num_tokens(s) for s in seq_ids]
    width = len(rows[0]) if rows else 0
    tables = torch.tensor(rows, dtype=torch.int32, device=device).reshape(len(rows), width)
    return tables, torch.tensor(lens, dtype=torch.int32, device=device)


def flashinfer_page_table(block_tables, seq_lens, block_size: int):
    """The same block tables in FlashInfer's CSR form: ``kv_indptr`` (where each sequence's pages
    start in ``kv_indices``), ``kv_indices`` (the pages), ``kv_last_page_len`` (tokens in each
    sequence's last page)."""
    positive_int("block_size", block_size)
    pages = [(-(-int(n) // block_size)) for n in seq_lens]
    indices = [int(b) for row, n in zip(block_tables, pages, strict=True) for b in row[:n]]
    indptr = [0]
    for n in pages:
        indptr.append(indptr[-1] + n)
    last = [int(n) - (p - 1) * block_size for n, p in zip(seq_lens, pages, strict=True)]
    as_int32 = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    return as_int32(indptr), as_int32(indices), as_int32(last)


class PagedKVCache:
    """Real K and V tensors in vLLM's NHD layout, ``[num_blocks, block_size, kv_heads, head_dim]``
    per layer, addressed through a :class:`~kvlab.core.block_manager.BlockManager`: its own (built here), or
    the one of a :class:`~kvlab.core.block_manager.PagedCache` that a scheduler drives (:meth:`over`)."""

    def __init__(
        self,
        spec,
        num_blocks: int,
        block_size: int,
        dtype=None,
        device="cpu",
        *,
        manager: BlockManager | None = None,
    ):
        if manager is None:
            manager = BlockManager(num_blocks, block_size)
        elif (manager.num_blocks, manager.block_size) != (num_blocks, block_size):
            raise ValueError(
                f"manager holds {manager.num_blocks} blocks of {manager.block_size} slots, not "
                f"num_blocks={num_blocks} of block_size={block_size}"
            )
        self.spec = spec
        self.manager = manager
        self.k, self.v = kv_layers(spec, (num_blocks, block_size), dtype, device)

    @classmethod
    def over(
        cls, manager: BlockManager | PagedCache, spec, dtype=None, device="cpu"
    ) -> PagedKVCache:
        """Tensors for the blocks of an existing block manager, or of the one inside a
        :class:`~kvlab.core.block_manager.PagedCache` (whose accounts the cache keeps for the
        scheduler): what a model's executor writes and reads."""
        if isinstance(manager, PagedCache):
            manager = manager.manager
        return cls(spec, manager.num_blocks, manager.block_size, dtype, device, manager=manager)

    # --- addressing ------------------------------------------------------------------------
    def slots(self, seq_id, positions) -> list[int]:
        """Physical slots (``block_id * block_size + offset``) of token positions."""
        slot = self.manager.slot
        return [slot(seq_id, int(p)) for p in positions]

    def slot_mapping(self, seq_id, positions):
        """:meth:`slots` as an int64 tensor on the cache's device."""
        return torch.tensor(self.slots(seq_id, positions), dtype=torch.int64, device=self.device)

    @property
    def device(self):
        return self.k[0].device

    def _flat(self, layer: int):
        """K and V of every slot, ``[num_blocks * block_size, kv_heads, head_dim]`` (views)."""
        return self.k[layer].flatten(0, 1), self.v[layer].flatten(0, 1)

    # --- writes ----------------------------------------------------------------------------
    def write(self, seq_id, k, v, layer: int | None = None) -> None:
        """Store K and V of the sequence's newest ``n`` tokens.

        ``k, v``: ``[n, kv_heads, head_dim]`` for one ``layer``, or ``[layers, n, kv_heads,
        head_dim]`` for every layer. The manager must already hold slots for those tokens.
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
            flat_k, flat_v = self._flat(index)
            flat_k[slots] = kk.to(**target)
            flat_v[slots] = vv.to(**target)

    def write_slots(self, layer: int, slot_mapping, k, v) -> None:
        """Store ``k, v`` (``[n, kv_heads, head_dim]``) of one layer at ``slot_mapping``, with
        the Triton ``write_kv`` kernel (Triton's interpreter on a CPU)."""
        from kvlab.ops.kernels import write_kv  # imported late: kvlab chooses the interpreter first

        write_kv(self.k[layer], self.v[layer], slot_mapping, k.contiguous(), v.contiguous())

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
        """Copy whole blocks ``src -> dst`` in every layer (after a copy-on-write)."""
        for src, dst in pairs:
            for cache in (*self.k, *self.v):
                cache[dst].copy_(cache[src])

    def append_token(self, seq_id, k, v) -> None:
        """A slot for one more token (copying a shared block first if needed), then store its
        K, V (``[layers, 1, kv_heads, head_dim]``)."""
        self._check_kv(k, v, None)
        if k.shape[1] != 1:
            raise ValueError(
                f"append_token takes one token: k must be [layers, 1, ...], got {tuple(k.shape)}"
            )
        moved = self.manager.append_slot(seq_id)
        if moved is not None:
            self.copy_blocks([moved])
        self.write(seq_id, k, v)

    # --- reads -----------------------------------------------------------------------------
    def gather(self, seq_id, layer: int, num_tokens: int | None = None):
        """The sequence's K and V (its first ``num_tokens``, default all) as contiguous
        ``[tokens, kv_heads, head_dim]`` tensors."""
        n = self.manager.num_tokens(seq_id) if num_tokens is None else num_tokens
        slots = self.slot_mapping(seq_id, range(n))
        flat_k, flat_v = self._flat(layer)
        return flat_k[slots], flat_v[slots]

    def decode(self, layer: int, q, seq_ids: list, seq_lens: list[int]):
        """Each sequence's one new query (``q: [num_seqs, q_heads, head_dim]``) over its first
        ``seq_lens`` tokens, read in place through its block table by kvlab's Triton kernel."""
        from kvlab.ops.kernels import paged_decode_attention

        rows = _table_rows(self.manager, seq_ids, -1)
        tables = torch.tensor(rows, dtype=torch.int32, device=q.device)
        lens = torch.tensor(seq_lens, dtype=torch.int32, device=q.device)
        return paged_decode_attention(q.contiguous(), self.k[layer], self.v[layer], tables, lens)

    def attend_chunk(self, layer: int, q, seq_id, num_computed: int):
        """A chunk of queries (``q: [n, q_heads, head_dim]``) at positions ``num_computed..``,
        over the K/V stored for positions ``0 .. num_computed + n - 1`` (the chunk's own included,
        causally), read through the sequence's block table."""
        table = torch.tensor(self.manager.block_table(seq_id), dtype=torch.int64, device=q.device)
        return chunk_attention_reference(q, self.k[layer], self.v[layer], table, num_computed)


class ContiguousStore:
    """The K/V tensors of a :class:`~kvlab.core.contiguous.ContiguousKVCache` built with a spec: a
    sequence's slot for position ``p`` is its booking's offset + ``p`` in the flat ``num_slots x
    max_seq_len`` layout (with the "max" policy: row ``offset // max_seq_len``, column ``p``).
    ``device`` moves the cache's tensors there (it builds them on the CPU)."""

    def __init__(self, cache, device=None):
        if cache.k is None:
            raise ValueError("cache must be built with spec= (model.spec) so that it holds tensors")
        self.cache = cache
        if device is not None and cache.k[0].device != torch.device(device):
            cache.k = [t.to(device) for t in cache.k]
            cache.v = [t.to(device) for t in cache.v]

    @property
    def spec(self):
        return self.cache.spec

    def slots(self, seq_id, positions) -> list[int]:
        offset = self.cache.booking(seq_id)[0]
        return [offset + int(p) for p in positions]

    def _flat(self, layer: int):
        """K and V of every slot, ``[num_slots * max_seq_len, kv_heads, head_dim]`` (views)."""
        return self.cache.k[layer].flatten(0, 1), self.cache.v[layer].flatten(0, 1)

    def write_slots(self, layer: int, slot_mapping, k, v) -> None:
        # the [num_slots, max_seq_len, ...] tensors read as blocks of max_seq_len slots
        write_kv_reference(self.cache.k[layer], self.cache.v[layer], slot_mapping, k, v)

    def gather(self, seq_id, layer: int, num_tokens: int | None = None):
        n = self.cache.num_tokens(seq_id) if num_tokens is None else num_tokens
        flat_k, flat_v = self._flat(layer)
        offset = self.cache.booking(seq_id)[0]
        return flat_k[offset : offset + n], flat_v[offset : offset + n]

    def decode(self, layer: int, q, seq_ids: list, seq_lens: list[int]):
        """Each sequence's one new query against its stretch of the cache (masked past its
        length), with the torch reference."""
        device = q.device
        offsets = torch.tensor([self.cache.booking(s)[0] for s in seq_ids], device=device)
        flat_k, flat_v = self._flat(layer)
        columns = torch.arange(max(seq_lens), device=device)
        index = (offsets[:, None] + columns[None, :]).clamp(max=len(flat_k) - 1)
        lens = torch.tensor(seq_lens, dtype=torch.int64, device=device)
        return decode_attention(q, flat_k[index], flat_v[index], seq_lens=lens)

    def attend_chunk(self, layer: int, q, seq_id, num_computed: int):
        """As :meth:`PagedKVCache.attend_chunk`, with the same reads: the flat tensors as blocks
        of one slot, and the booking's slots as the block table."""
        flat_k, flat_v = self._flat(layer)
        total = num_computed + q.shape[0]
        offset = self.cache.booking(seq_id)[0]
        table = torch.arange(offset, offset + total, device=q.device)
        return chunk_attention_reference(q, flat_k[:, None], flat_v[:, None], table, num_computed)


__all__ = [
    "ContiguousStore",
    "KVStore",
    "PagedKVCache",
    "block_tables_tensor",
    "flashinfer_page_table",
    "kv_layers",
    "torch_dtype",
]
