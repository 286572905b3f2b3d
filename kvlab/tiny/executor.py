"""Run one engine step of the tiny model: the scheduled sequences' new tokens through the model in
one forward, their K/V into the cache, one greedy token out per sequence.

The engine (:mod:`kvlab.serve.engine`) decides which sequences run and gives each a slot for every
position ``[0, seq.num_tokens)``. For each scheduled sequence the executor computes positions
``[seq.num_computed, seq.num_tokens - 1)`` (many after admission or a recompute: a prefill; one
otherwise: a decode), stores their K/V through the cache's slots and appends the token for
position ``seq.num_tokens - 1``. Two stores hold the K/V:

* :class:`PagedStore`: tensors ``[num_blocks, block_size, kv_heads, head_dim]`` per layer (vLLM's
  layout) that the executor owns beside a :class:`~kvlab.paged.PagedCache`'s accounts; written by
  the Triton ``write_kv`` kernel, read in decode by ``paged_decode_attention`` through the block
  tables (Triton's interpreter on a CPU, compiled on a GPU).
* :class:`ContiguousStore`: the tensors of a :class:`~kvlab.contiguous.ContiguousKVCache` (built with
  the model's spec), read in decode by the torch reference ``decode_attention``.

Prefill attention is plain torch in both (``causal_attention`` on the fresh K/V), so the two
caches differ only in where K/V live and how decode reads them, and greedy decoding gives the same
tokens with either.
"""

from __future__ import annotations

import math
import time

import torch

from kvlab.attention import causal_attention, decode_attention
from kvlab.attention import write_kv as write_kv_torch
from kvlab.contiguous import ContiguousKVCache
from kvlab.paged import PagedCache
from kvlab.serve.engine import new_positions
from kvlab.tiny.model import TinyLlama


class PagedStore:
    """K/V rooms for a :class:`~kvlab.paged.PagedCache`; slots and block tables come from its
    block manager."""

    def __init__(self, model: TinyLlama, cache: PagedCache):
        c, m = model.config, cache.manager
        self.manager = m
        shape = (m.num_blocks, m.block_size, c.num_kv_heads, c.head_dim)
        device = model.embed.weight.device
        dtype = model.embed.weight.dtype  # the kernels read K/V in the queries' dtype
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(c.num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(c.num_layers)]

    def slots(self, seq_id, positions) -> list[int]:
        return [self.manager.slot(seq_id, p) for p in positions]

    def write(self, layer: int, slot_mapping: torch.Tensor, k, v) -> None:
        from kvlab.kernels import write_kv  # Triton, imported after kvlab chose the interpreter

        write_kv(self.k[layer], self.v[layer], slot_mapping, k.contiguous(), v.contiguous())

    def decode(self, layer: int, q, seq_ids: list, seq_lens: list[int]) -> torch.Tensor:
        """Each sequence's one new query against its cached tokens, read through its block table."""
        from kvlab.kernels import paged_decode_attention

        tables = [self.manager.block_table(s) for s in seq_ids]
        width = max(len(t) for t in tables)
        padded = [t + [-1] * (width - len(t)) for t in tables]
        device = q.device
        block_tables = torch.tensor(padded, dtype=torch.int32, device=device)
        lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
        return paged_decode_attention(
            q.contiguous(), self.k[layer], self.v[layer], block_tables, lens
        )

    def flat(self, layer: int):
        """K and V of every slot, ``[num_blocks * block_size, kv_heads, head_dim]`` (views)."""
        return self.k[layer].flatten(0, 1), self.v[layer].flatten(0, 1)


class ContiguousStore:
    """The tensors of a :class:`~kvlab.contiguous.ContiguousKVCache`; a sequence's slot for
    position ``p`` is its booking's offset + ``p`` in the flat ``num_slots x max_seq_len`` layout
    (with the "max" policy: row ``offset // max_seq_len``, column ``p``)."""

    def __init__(self, model: TinyLlama, cache: ContiguousKVCache):
        spec = cache.spec
        if spec is None:
            raise ValueError("cache must be built with spec= (model.spec) so that it holds tensors")
        c = model.config
        if (spec.num_layers, spec.num_kv_heads, spec.head_dim) != (
            c.num_layers,
            c.num_kv_heads,
            c.head_dim,
        ):
            raise ValueError(
                f"cache spec {spec} does not match the model (layers {c.num_layers}, kv_heads "
                f"{c.num_kv_heads}, head_dim {c.head_dim})"
            )
        self.cache = cache
        device = model.embed.weight.device
        if cache.k[0].device != device:  # the cache builds its tensors on the CPU
            cache.k = [t.to(device) for t in cache.k]
            cache.v = [t.to(device) for t in cache.v]

    def slots(self, seq_id, positions) -> list[int]:
        offset = self.cache.booking(seq_id)[0]
        return [offset + p for p in positions]

    def write(self, layer: int, slot_mapping: torch.Tensor, k, v) -> None:
        # the [num_slots, max_seq_len, ...] tensors read as rooms of max_seq_len beds
        write_kv_torch(self.cache.k[layer], self.cache.v[layer], slot_mapping, k, v)

    def decode(self, layer: int, q, seq_ids: list, seq_lens: list[int]) -> torch.Tensor:
        """Each sequence's one new query against its row of the cache (masked past its length)."""
        device = q.device
        longest = max(seq_lens)
        offsets = torch.tensor([self.cache.booking(s)[0] for s in seq_ids], device=device)
        flat_k, flat_v = self.flat(layer)
        beds = torch.arange(longest, device=device)
        index = (offsets[:, None] + beds[None, :]).clamp(max=len(flat_k) - 1)
        lens = torch.tensor(seq_lens, dtype=torch.int64, device=device)
        return decode_attention(q, flat_k[index], flat_v[index], seq_lens=lens)

    def flat(self, layer: int):
        return self.cache.k[layer].flatten(0, 1), self.cache.v[layer].flatten(0, 1)


def make_store(model: TinyLlama, cache):
    if isinstance(cache, PagedCache):
        return PagedStore(model, cache)
    if isinstance(cache, ContiguousKVCache):
        return ContiguousStore(model, cache)
    raise TypeError(
        f"cache must be a PagedCache or a ContiguousKVCache, got {type(cache).__name__}"
    )


def attention_after(q, k, v, first: int) -> torch.Tensor:
    """Causal attention for queries at positions ``first..`` over keys ``0..`` (a prefill that
    continues cached tokens). ``q: [n, Hq, D]``, ``k, v: [first + n, Hkv, D]``."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(q.shape[-1])
    n, total = q.shape[0], k.shape[0]
    keys, queries = torch.arange(total, device=q.device), torch.arange(n, device=q.device)
    future = keys[None, :] > (first + queries)[:, None]
    return torch.einsum("hts,shd->thd", scores.masked_fill(future, float("-inf")).softmax(-1), v)


class TinyExecutor:
    """The engine's executor for the tiny model on one cache (paged or contiguous). Also keeps the
    K/V of sequences preempted by swapping, in CPU memory, until they are readmitted."""

    timed = True  # execute returns wall seconds: the engine's clock runs in seconds

    def __init__(self, model: TinyLlama, cache):
        self.model = model
        self.device = model.embed.weight.device
        self.store = make_store(model, cache)
        self.swapped: dict = {}  # seq_id -> (k, v), each [layers, tokens, kv_heads, head_dim]
        self.seconds = 0.0  # total of every execute

    @torch.no_grad()
    def execute(self, step) -> float:
        """Run ``step.scheduled`` (a :class:`~kvlab.scheduler.ScheduledStep`) through the model;
        return the wall seconds it took."""
        start = time.perf_counter()
        seqs = list(step.scheduled)
        if seqs:
            self._run(seqs)
        seconds = time.perf_counter() - start
        self.seconds += seconds
        return seconds

    def _run(self, seqs: list) -> None:
        ids, positions, spans = [], [], []  # spans: (first position, new tokens) per sequence
        for seq in seqs:
            first, end = new_positions(seq)
            if seq.token_ids is None or len(seq.token_ids) != end or not 0 <= first < end:
                known = None if seq.token_ids is None else len(seq.token_ids)
                raise ValueError(
                    f"sequence {seq.seq_id!r}: expected {end} known token ids and "
                    f"num_computed < {end}, got {known} and {seq.num_computed}"
                )
            ids += seq.token_ids[first:end]
            positions += range(first, end)
            spans.append((first, end - first))
        slots = []
        for seq, (first, n) in zip(seqs, spans, strict=True):
            slots += self.store.slots(seq.seq_id, range(first, first + n))
        slot_mapping = self._tensor(slots)
        attend = self._attend(seqs, spans, slot_mapping)
        hidden = self.model.forward_tokens(self._tensor(ids), self._tensor(positions), attend)
        last = self._tensor([0] + [n for _, n in spans]).cumsum(0)[1:] - 1
        next_ids = self.model.logits(hidden[last]).argmax(-1).tolist()
        for seq, token in zip(seqs, next_ids, strict=True):
            seq.token_ids.append(token)

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.device)

    def _attend(self, seqs, spans, slot_mapping):
        """The model's attention callback for this step: store the new K/V, then attend (decode
        through the cache for one new token, torch causal attention for a prefill)."""
        starts = torch.tensor([0] + [n for _, n in spans]).cumsum(0).tolist()
        decodes = [i for i, (_, n) in enumerate(spans) if n == 1]
        prefills = [i for i, (_, n) in enumerate(spans) if n > 1]
        decode_rows = [starts[i] for i in decodes]
        decode_ids = [seqs[i].seq_id for i in decodes]
        decode_lens = [spans[i][0] + 1 for i in decodes]

        def attend(layer: int, q, k, v) -> torch.Tensor:
            self.store.write(layer, slot_mapping, k, v)
            out = torch.empty_like(q)
            if decodes:
                out[decode_rows] = self.store.decode(layer, q[decode_rows], decode_ids, decode_lens)
            for i in prefills:
                first, n = spans[i]
                rows = slice(starts[i], starts[i] + n)
                if first == 0:
                    out[rows] = causal_attention(q[rows], k[rows], v[rows])
                else:  # continues cached tokens: read them back from the cache
                    past = self._read(layer, seqs[i].seq_id, first + n)
                    out[rows] = attention_after(q[rows], *past, first)
            return out

        return attend

    def _read(self, layer: int, seq_id, num_tokens: int):
        slots = self._tensor(self.store.slots(seq_id, range(num_tokens)))
        flat_k, flat_v = self.store.flat(layer)
        return flat_k[slots], flat_v[slots]

    def swap_out(self, seq) -> None:
        """Copy the K/V of positions ``[0, seq.num_computed)`` to CPU memory before the cache
        releases the sequence's slots."""
        n, layers = seq.num_computed, range(self.model.config.num_layers)
        pairs = [self._read(layer, seq.seq_id, n) for layer in layers]
        k = torch.stack([kk for kk, _ in pairs]).cpu()
        v = torch.stack([vv for _, vv in pairs]).cpu()
        self.swapped[seq.seq_id] = (k, v)

    def swap_in(self, seq) -> None:
        """Write a readmitted sequence's swapped K/V back into its new slots (past any prefix a
        prefix cache found: those blocks are shared and never written)."""
        k, v = self.swapped.pop(seq.seq_id)
        first = seq.num_cached_tokens
        slot_mapping = self._tensor(self.store.slots(seq.seq_id, range(first, k.shape[1])))
        for layer in range(self.model.config.num_layers):
            self.store.write(
                layer,
                slot_mapping,
                k[layer, first:].to(self.device),
                v[layer, first:].to(self.device),
            )
