"""Run one engine step of the tiny model: the scheduled sequences' new tokens through the model in
one forward, their K/V into the cache, a greedy token out for each sequence that samples.

The engine (:mod:`kvlab.serving.engine`) decides which sequences run and gives each a slot for every
position ``[0, seq.num_tokens)``. For each scheduled sequence the executor computes positions
``[seq.num_computed, seq.num_computed + seq.num_scheduled)`` (a whole prompt, or one chunk of it
under a token budget, or the prompt plus the tokens generated before a preemption by recompute;
else one token: a decode), stores their K/V through the cache's slots and, when ``seq.samples``,
appends the token the last of them predicts (position ``seq.num_tokens - 1``).

The K/V live in one of the stores of :mod:`kvlab.kv.tensors`:

* paged (:class:`~kvlab.kv.tensors.PagedKVCache` over a :class:`~kvlab.core.block_manager.PagedCache`'s block
  manager): written by the Triton ``write_kv`` kernel, read in decode by ``paged_decode_attention``
  through the block tables (Triton's interpreter on a CPU, compiled on a GPU);
* contiguous (:class:`~kvlab.kv.tensors.ContiguousStore`, the tensors of a
  :class:`~kvlab.core.contiguous.ContiguousKVCache` built with the model's spec): written and read in
  decode by the torch references.

A chunk of several tokens attends with :func:`kvlab.ops.attention.chunk_attention_reference` in both
stores, over the K/V already cached plus its own, causally; so the two caches differ only in where
K/V live and how decode reads them, and greedy decoding gives the same tokens with either, chunked
or not.
"""

from __future__ import annotations

import time
from itertools import accumulate

import torch

from kvlab.core.block_manager import PagedCache
from kvlab.core.contiguous import ContiguousKVCache
from kvlab.kv.tensors import ContiguousStore, KVStore, PagedKVCache
from kvlab.models.tiny.model import TinyLlama


def make_store(model: TinyLlama, cache) -> KVStore:
    """The K/V store of ``cache`` for ``model``: on the model's device, in its dtype (the kernels
    read K/V in the queries' dtype)."""
    weight = model.embed.weight
    if isinstance(cache, PagedCache):
        return PagedKVCache.over(cache, model.spec, weight.dtype, weight.device)
    if isinstance(cache, ContiguousKVCache):
        spec, c = cache.spec, model.config
        if spec is None:
            raise ValueError("cache must be built with spec= (model.spec) so that it holds tensors")
        if (spec.num_layers, spec.num_kv_heads, spec.head_dim) != (
            c.num_layers,
            c.num_kv_heads,
            c.head_dim,
        ):
            raise ValueError(
                f"cache spec {spec} does not match the model (layers {c.num_layers}, kv_heads "
                f"{c.num_kv_heads}, head_dim {c.head_dim})"
            )
        return ContiguousStore(cache, weight.device)
    raise TypeError(
        f"cache must be a PagedCache or a ContiguousKVCache, got {type(cache).__name__}"
    )


def _span(seq) -> tuple[int, int]:
    """Positions ``[first, stop)`` the sequence computes in this step, checked against the token
    ids it knows: a step that samples reads every known token (the next is the one produced)."""
    first, n = seq.num_computed, seq.num_scheduled
    stop, name = first + n, f"sequence {seq.seq_id!r}"
    if seq.token_ids is None:
        raise ValueError(f"{name} has no token_ids: the tiny model computes real tokens")
    known = len(seq.token_ids)
    if n < 1 or first < 0:
        raise ValueError(
            f"{name}: num_scheduled must be >= 1 and num_computed >= 0, got {n}, {first}"
        )
    if stop > known:
        raise ValueError(
            f"{name} computes positions {first}..{stop - 1} but knows {known} token ids"
        )
    if seq.samples and stop != known:
        raise ValueError(
            f"{name} samples, so it computes up to its last known token ({known - 1}), got "
            f"positions {first}..{stop - 1}"
        )
    return first, stop


class TinyExecutor:
    """The engine's executor for the tiny model on one cache (paged or contiguous). Also keeps the
    K/V of sequences preempted by swapping, in CPU memory, until they are readmitted."""

    timed = True  # execute returns wall seconds: the engine's clock runs in seconds
    can_swap = True  # swap_out / swap_in: the scheduler's Swapper

    def __init__(self, model: TinyLlama, cache):
        self.model = model
        self.device = model.embed.weight.device
        self.store = make_store(model, cache)
        self.swapped: dict = {}  # seq_id -> (k, v), each [layers, tokens, kv_heads, head_dim]
        self.seconds = 0.0  # total of every execute

    @torch.no_grad()
    def execute(self, step) -> float:
        """Run ``step.scheduled`` (a :class:`~kvlab.serving.scheduler.ScheduledStep`) through the model;
        return the wall seconds it took."""
        start = time.perf_counter()
        seqs = list(step.scheduled)
        if seqs:
            self._run(seqs)
        seconds = time.perf_counter() - start
        self.seconds += seconds
        return seconds

    def _run(self, seqs: list) -> None:
        spans = [_span(seq) for seq in seqs]
        ids, positions, slots = [], [], []
        for seq, (first, stop) in zip(seqs, spans, strict=True):
            ids += seq.token_ids[first:stop]
            positions += range(first, stop)
            slots += self.store.slots(seq.seq_id, range(first, stop))
        attend = self._attend(seqs, spans, self._tensor(slots))
        hidden = self.model.forward_tokens(self._tensor(ids), self._tensor(positions), attend)
        ends = list(accumulate(stop - first for first, stop in spans))  # after each sequence
        sampling = [i for i, seq in enumerate(seqs) if seq.samples]
        if not sampling:
            return
        rows = self._tensor([ends[i] - 1 for i in sampling])  # each one's last position
        next_ids = self.model.logits(hidden[rows]).argmax(-1).tolist()
        for i, token in zip(sampling, next_ids, strict=True):
            seqs[i].token_ids.append(token)

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.device)

    def _attend(self, seqs, spans, slot_mapping):
        """The model's attention callback for this step: store the new K/V, then attend (one
        query: a decode through the cache; several: a chunk over the cache, causally)."""
        sizes = [stop - first for first, stop in spans]
        starts = list(accumulate(sizes, initial=0))
        singles = [i for i, n in enumerate(sizes) if n == 1]
        chunks = [i for i, n in enumerate(sizes) if n > 1]
        single_rows = [starts[i] for i in singles]
        single_ids = [seqs[i].seq_id for i in singles]
        single_lens = [spans[i][1] for i in singles]  # keys 0..first, the new one included
        store = self.store

        def attend(layer: int, q, k, v) -> torch.Tensor:
            store.write_slots(layer, slot_mapping, k, v)
            out = torch.empty_like(q)
            if singles:
                out[single_rows] = store.decode(layer, q[single_rows], single_ids, single_lens)
            for i in chunks:
                rows = slice(starts[i], starts[i + 1])
                out[rows] = store.attend_chunk(layer, q[rows], seqs[i].seq_id, spans[i][0])
            return out

        return attend

    def swap_out(self, seq) -> None:
        """Copy the K/V of positions ``[0, seq.num_computed)`` to CPU memory before the cache
        releases the sequence's slots."""
        n, layers = seq.num_computed, range(self.model.config.num_layers)
        pairs = [self.store.gather(seq.seq_id, layer, n) for layer in layers]
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
            self.store.write_slots(
                layer,
                slot_mapping,
                k[layer, first:].to(self.device),
                v[layer, first:].to(self.device),
            )
