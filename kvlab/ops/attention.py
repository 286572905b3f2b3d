"""Reference attention in plain PyTorch, the ground truth every faster version is checked against.

Shapes follow the token-major convention used throughout the course:
``q: [tokens, q_heads, head_dim]``, ``k, v: [tokens, kv_heads, head_dim]``. With grouped-query
attention each KV head serves ``q_heads // kv_heads`` consecutive query heads.
"""

from __future__ import annotations

import math

import torch

from kvlab.core.validate import positive_int


def _expand_kv(x: torch.Tensor, num_q_heads: int) -> torch.Tensor:
    """Repeat each KV head (axis -2) for the query heads that share it (GQA)."""
    num_kv_heads = x.shape[-2]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"q_heads ({num_q_heads}) must be a multiple of kv_heads ({num_kv_heads})")
    return x.repeat_interleave(num_q_heads // num_kv_heads, dim=-2)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Every token attends to itself and all earlier tokens. Returns ``[tokens, q_heads, head_dim]``."""
    if q.dim() != 3 or k.shape != v.shape or k.dim() != 3 or q.shape[0] != k.shape[0]:
        raise ValueError(
            f"expected q [T,Hq,D], k and v [T,Hkv,D]; got {q.shape}, {k.shape}, {v.shape}"
        )
    k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    scores = torch.einsum("thd,shd->hts", q.float(), k.float()) / math.sqrt(q.shape[-1])
    t = q.shape[0]
    future = torch.triu(torch.ones(t, t, dtype=torch.bool, device=q.device), diagonal=1)
    probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    return torch.einsum("hts,shd->thd", probs, v.float()).to(q.dtype)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    scale: float | None = None,
    seq_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention on a contiguous cache: each sequence's new query against its cached keys
    and values, accumulated in fp32, returned in q's dtype; ``scale`` defaults to 1/sqrt(head_dim).

    One sequence: q ``[q_heads, head_dim]``, caches ``[tokens, kv_heads, head_dim]``. A batch: q
    ``[num_seqs, q_heads, head_dim]``, caches ``[num_seqs, max_tokens, kv_heads, head_dim]`` (the
    max-length layout of Lab 01), where ``seq_lens`` (``[num_seqs]``, each 1..max_tokens) says how
    many slots of each sequence's row hold tokens; without it every slot counts.
    """
    single = q.dim() == 2
    if single:
        if k_cache.dim() != 3 or v_cache.shape != k_cache.shape:
            raise ValueError(
                f"for q [Hq,D], k_cache and v_cache must be [T,Hkv,D]; got {tuple(k_cache.shape)}, "
                f"{tuple(v_cache.shape)}"
            )
        if seq_lens is not None:
            raise ValueError("seq_lens needs a batch: q [num_seqs, Hq, D]")
        q, k_cache, v_cache = q[None], k_cache[None], v_cache[None]
    elif q.dim() != 3:
        raise ValueError(f"q must be [Hq,D] or [num_seqs,Hq,D], got shape {tuple(q.shape)}")
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape or k_cache.shape[0] != q.shape[0]:
        raise ValueError(
            f"k_cache and v_cache must be [num_seqs={q.shape[0]}, T, Hkv, D]; got "
            f"{tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
        )
    if k_cache.shape[-1] != q.shape[-1]:
        raise ValueError(f"head_dim mismatch: q has {q.shape[-1]}, k_cache has {k_cache.shape[-1]}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k, v = _expand_kv(k_cache, q.shape[1]), _expand_kv(v_cache, q.shape[1])
    scores = torch.einsum("bhd,bshd->bhs", q.float(), k.float()) * scale
    if seq_lens is not None:
        scores = scores.masked_fill(
            ~_filled_slots(seq_lens, k.shape[:2])[:, None, :], float("-inf")
        )
    out = torch.einsum("bhs,bshd->bhd", scores.softmax(dim=-1), v.float()).to(q.dtype)
    return out[0] if single else out


def _filled_slots(seq_lens, shape) -> torch.Tensor:
    """``[num_seqs, max_tokens]`` True where a slot holds one of the sequence's tokens."""
    if not isinstance(seq_lens, torch.Tensor):
        raise TypeError(f"seq_lens must be a torch.Tensor, got {type(seq_lens).__name__}")
    if seq_lens.shape != shape[:1]:
        raise ValueError(f"seq_lens must be [num_seqs={shape[0]}], got {tuple(seq_lens.shape)}")
    if seq_lens.dtype.is_floating_point or seq_lens.dtype == torch.bool:
        raise TypeError(f"seq_lens must hold integers, got {seq_lens.dtype}")
    if len(seq_lens) and (int(seq_lens.min()) < 1 or int(seq_lens.max()) > shape[1]):
        raise ValueError(f"seq_lens must be in 1..{shape[1]} (the cache's max_tokens)")
    return torch.arange(shape[1], device=seq_lens.device)[None, :] < seq_lens[:, None]


def _check_q_and_cache(q, k_cache, v_cache, rows: str) -> None:
    """Queries ``[rows, num_q_heads, head_dim]`` and a paged K/V cache that fit each other."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 3:
        raise ValueError(f"q must be [{rows}, num_q_heads, head_dim], got shape {tuple(q.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "k_cache and v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    if k_cache.shape[3] != q.shape[2]:
        raise ValueError(f"head_dim mismatch: q has {q.shape[2]}, k_cache has {k_cache.shape[3]}")
    if q.shape[1] % k_cache.shape[2]:
        raise ValueError(
            f"num_q_heads ({q.shape[1]}) must be a multiple of num_kv_heads ({k_cache.shape[2]})"
        )


def check_paged_inputs(q, k_cache, v_cache, block_tables, seq_lens) -> None:
    """Raise a ValueError/TypeError naming the argument when paged-attention inputs do not fit.

    q ``[num_seqs, q_heads, head_dim]``; k/v_cache ``[num_blocks, block_size, kv_heads, head_dim]``
    (vLLM's NHD layout); block_tables int32 ``[num_seqs, max_blocks]``; seq_lens int32 ``[num_seqs]``.
    """
    _check_q_and_cache(q, k_cache, v_cache, rows="num_seqs")
    for name, t in (("block_tables", block_tables), ("seq_lens", seq_lens)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
            got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"{name} must be an int32 tensor, got {got}")
    if block_tables.dim() != 2 or block_tables.shape[0] != q.shape[0]:
        raise ValueError(
            f"block_tables must be [num_seqs={q.shape[0]}, max_blocks], got {tuple(block_tables.shape)}"
        )
    if seq_lens.shape != (q.shape[0],):
        raise ValueError(f"seq_lens must be [num_seqs={q.shape[0]}], got {tuple(seq_lens.shape)}")
    devices = {t.device for t in (q, k_cache, v_cache, block_tables, seq_lens)}
    if len(devices) > 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    if q.shape[0]:
        capacity = k_cache.shape[1] * block_tables.shape[1]
        lo, hi = int(seq_lens.min()), int(seq_lens.max())
        if lo < 1 or hi > capacity:
            raise ValueError(
                f"seq_lens must be in 1..block_size * max_blocks = {capacity}, got {lo}..{hi}"
            )


def gather_kv(k_cache, v_cache, block_table, seq_len: int):
    """One sequence's K and V copied out of the blocks its block table lists: ``[seq_len, kv_heads,
    head_dim]``. Only the first ceil(seq_len / block_size) entries of the table are read."""
    block_size = k_cache.shape[1]
    blocks = block_table[: -(-seq_len // block_size)].long()
    k = k_cache[blocks].reshape(-1, *k_cache.shape[2:])[:seq_len]
    v = v_cache[blocks].reshape(-1, *v_cache.shape[2:])[:seq_len]
    return k, v


def paged_decode_attention_ref(
    q, k_cache, v_cache, block_tables, seq_lens, *, scale: float | None = None
) -> torch.Tensor:
    """Decode attention for a batch of sequences whose K/V live in blocks listed by block tables.

    The reference gathers each sequence's K and V into a contiguous tensor, then attends. Returns
    ``[num_seqs, num_q_heads, head_dim]`` in q's dtype.
    """
    check_paged_inputs(q, k_cache, v_cache, block_tables, seq_lens)
    out = torch.empty_like(q)
    for s in range(q.shape[0]):
        k, v = gather_kv(k_cache, v_cache, block_tables[s], int(seq_lens[s]))
        out[s] = decode_attention(q[s], k, v, scale=scale)
    return out


def chunk_attention_reference(
    q, k_cache, v_cache, block_table, num_computed: int, *, scale: float | None = None
) -> torch.Tensor:
    """Attention for a chunk of one sequence's queries over its paged K/V (chunked prefill).

    ``q: [n, q_heads, head_dim]`` are the queries of positions ``num_computed .. num_computed +
    n - 1``; the cache (``[num_blocks, block_size, kv_heads, head_dim]``) already holds the K/V of
    positions ``0 .. num_computed + n - 1`` (the chunk's own included) in the blocks that
    ``block_table`` (1-D, integers) lists. Query ``i`` attends to positions ``0 .. num_computed +
    i``: everything cached before the chunk, and the chunk causally. Only the first
    ceil((num_computed + n) / block_size) entries of the table are read, and of their slots only
    those of positions before ``num_computed + n``. fp32 accumulation; returns q's dtype.
    """
    _check_q_and_cache(q, k_cache, v_cache, rows="n")
    if (
        not isinstance(block_table, torch.Tensor)
        or block_table.dim() != 1
        or block_table.dtype.is_floating_point
        or block_table.dtype == torch.bool
    ):
        raise TypeError(f"block_table must be a 1-D integer tensor, got {block_table!r}")
    num_computed = positive_int("num_computed", num_computed, minimum=0)
    n, total = q.shape[0], num_computed + q.shape[0]
    if n == 0:
        return q.clone()
    block_size = k_cache.shape[1]
    needed = -(-total // block_size)
    if needed > len(block_table):
        raise ValueError(
            f"block_table lists {len(block_table)} blocks; {total} tokens of {block_size} per "
            f"block need {needed}"
        )
    used = block_table[:needed]
    if int(used.min()) < 0 or int(used.max()) >= k_cache.shape[0]:
        raise ValueError(f"block_table entries must be in 0..{k_cache.shape[0] - 1}")
    k, v = gather_kv(k_cache, v_cache, used, total)
    k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    scores = torch.einsum("thd,shd->hts", q.float(), k.float())
    scores = scores / math.sqrt(q.shape[-1]) if scale is None else scores * scale
    keys = torch.arange(total, device=q.device)
    future = keys[None, :] > num_computed + torch.arange(n, device=q.device)[:, None]
    probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    return torch.einsum("hts,shd->thd", probs, v.float()).to(q.dtype)


def check_prefill_inputs(q, k_cache, v_cache, block_tables, query_start_loc, num_computed):
    """Raise a ValueError/TypeError naming the argument when the inputs of a batch of chunks (packed
    varlen, as vLLM packs them) do not fit; return the chunk lengths and ``num_computed`` as lists.

    q ``[num_tokens, q_heads, head_dim]`` (chunk b's queries are rows ``query_start_loc[b] ..
    query_start_loc[b + 1] - 1``); k/v_cache ``[num_blocks, block_size, kv_heads, head_dim]``;
    block_tables int32 ``[num_seqs, max_blocks]``; query_start_loc int32 ``[num_seqs + 1]``, from 0
    up to num_tokens, never decreasing; num_computed int32 ``[num_seqs]`` (tokens of each sequence
    cached before its chunk). Each table must list the rooms of the sequence's first
    ``num_computed + chunk`` tokens, in range. Reads the small index tensors back to the CPU."""
    _check_q_and_cache(q, k_cache, v_cache, rows="num_tokens")
    named = (
        ("block_tables", block_tables),
        ("query_start_loc", query_start_loc),
        ("num_computed", num_computed),
    )
    for name, t in named:
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
            got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"{name} must be an int32 tensor, got {got}")
    if block_tables.dim() != 2:
        raise ValueError(
            f"block_tables must be [num_seqs, max_blocks], got {tuple(block_tables.shape)}"
        )
    num_seqs = block_tables.shape[0]
    if query_start_loc.shape != (num_seqs + 1,):
        raise ValueError(
            f"query_start_loc must be [num_seqs + 1 = {num_seqs + 1}] (block_tables has {num_seqs} "
            f"rows), got {tuple(query_start_loc.shape)}"
        )
    if num_computed.shape != (num_seqs,):
        raise ValueError(
            f"num_computed must be [num_seqs={num_seqs}], got {tuple(num_computed.shape)}"
        )
    devices = {t.device for t in (q, k_cache, v_cache, block_tables, query_start_loc, num_computed)}
    if len(devices) > 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    starts = query_start_loc.tolist()
    if starts[0] != 0 or starts[-1] != q.shape[0]:
        raise ValueError(
            f"query_start_loc must run from 0 to num_tokens = {q.shape[0]}, got {starts[0]} .. "
            f"{starts[-1]}"
        )
    lengths = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    if any(n < 0 for n in lengths):
        b = next(i for i, n in enumerate(lengths) if n < 0)
        raise ValueError(
            f"query_start_loc must never decrease, got {starts[b]} then {starts[b + 1]} (chunk {b})"
        )
    computed = num_computed.tolist()
    if any(c < 0 for c in computed):
        raise ValueError(f"num_computed must be >= 0, got {min(computed)}")
    block_size, max_blocks = k_cache.shape[1], block_tables.shape[1]
    needed = [-(-(c + n) // block_size) for c, n in zip(computed, lengths, strict=True)]
    for b, need in enumerate(needed):
        if need > max_blocks:
            raise ValueError(
                f"block_tables lists {max_blocks} blocks per sequence; sequence {b} "
                f"({computed[b]} cached + {lengths[b]} in its chunk, {block_size} per block) "
                f"needs {need}"
            )
    if num_seqs:
        used = (
            torch.arange(max_blocks, device=block_tables.device)[None, :]
            < torch.tensor(needed, device=block_tables.device)[:, None]
        )
        rooms = block_tables[used]
        if len(rooms) and (int(rooms.min()) < 0 or int(rooms.max()) >= k_cache.shape[0]):
            raise ValueError(
                f"block_tables entries a sequence needs must be in 0..{k_cache.shape[0] - 1}, "
                f"got {int(rooms.min())} .. {int(rooms.max())}"
            )
    return lengths, computed


def paged_prefill_attention_ref(
    q, k_cache, v_cache, block_tables, query_start_loc, num_computed, *, scale=None
) -> torch.Tensor:
    """Attention for a batch of chunks (chunked prefill), packed varlen as vLLM v1 packs a step.

    Chunk b's queries are rows ``query_start_loc[b] .. query_start_loc[b + 1] - 1`` of q
    (``[num_tokens, q_heads, head_dim]``): the positions ``num_computed[b] ..`` of sequence b,
    whose K/V (the chunk's own included) sit in the rooms its row of ``block_tables`` lists. Each
    chunk attends to its cached prefix and causally to itself
    (:func:`chunk_attention_reference`, one chunk at a time). A decode is a chunk of one, so a
    step that mixes decodes and prefill chunks is one call, as in vLLM v1's unified attention.
    fp32 accumulation; returns ``[num_tokens, q_heads, head_dim]`` in q's dtype. See
    :func:`check_prefill_inputs` for the shapes and dtypes.
    """
    lengths, computed = check_prefill_inputs(
        q, k_cache, v_cache, block_tables, query_start_loc, num_computed
    )
    out = torch.empty_like(q)
    start = 0
    for b, (n, c) in enumerate(zip(lengths, computed, strict=True)):
        if n:
            out[start : start + n] = chunk_attention_reference(
                q[start : start + n], k_cache, v_cache, block_tables[b], c, scale=scale
            )
        start += n
    return out


def write_kv_reference(k_cache, v_cache, slot_mapping, k, v) -> None:
    """Store new tokens' K and V (``[n, kv_heads, head_dim]``) at flat slots
    ``block_id * block_size + offset`` (vLLM's reshape-and-cache), in place: the reference for
    :func:`kvlab.ops.kernels.write_kv`. The caches may have any strides (vLLM's flash layout hands
    over ``kv_cache[:, 0]``), so slots are split into (block, offset) rather than flattened
    through a view."""
    if k.shape != v.shape or k.dim() != 3 or k.shape[1:] != k_cache.shape[2:]:
        raise ValueError(
            f"k and v must be [n, {k_cache.shape[2]}, {k_cache.shape[3]}], got {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if slot_mapping.shape != (k.shape[0],):
        raise ValueError(f"slot_mapping must be [n={k.shape[0]}], got {tuple(slot_mapping.shape)}")
    block_size = k_cache.shape[1]
    capacity = k_cache.shape[0] * block_size
    slots = slot_mapping.long()
    if len(slots) and (int(slots.min()) < 0 or int(slots.max()) >= capacity):
        raise ValueError(f"slot_mapping must be in 0..{capacity - 1}")
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = k.to(k_cache.dtype)
    v_cache[blocks, offsets] = v.to(v_cache.dtype)


class TinyAttention:
    """One seeded attention layer (no MLP, no norm): enough to show what the cache stores.

    Weights act on the right, ``x @ W`` (``wq: [d_model, heads x head_dim]``, ``wo: [heads x
    head_dim, d_model]``). ``head_dim`` defaults to ``d_model // num_heads``; another value makes
    ``wo`` non-square, as in models whose heads do not tile the model width.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        seed: int = 0,
        head_dim: int | None = None,
    ):
        positive_int("d_model", d_model)
        positive_int("num_heads", num_heads)
        num_kv_heads = (
            num_heads if num_kv_heads is None else positive_int("num_kv_heads", num_kv_heads)
        )
        if head_dim is None and d_model % num_heads:
            raise ValueError(f"d_model ({d_model}) must be a multiple of num_heads ({num_heads})")
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
            )
        self.d_model, self.num_heads, self.num_kv_heads = d_model, num_heads, num_kv_heads
        self.head_dim = (
            d_model // num_heads if head_dim is None else positive_int("head_dim", head_dim)
        )
        g = torch.Generator().manual_seed(seed)
        scale = 1.0 / math.sqrt(d_model)

        def weight(rows, cols):
            return torch.randn(rows, cols, generator=g) * scale

        self.wq = weight(d_model, num_heads * self.head_dim)
        self.wk = weight(d_model, num_kv_heads * self.head_dim)
        self.wv = weight(d_model, num_kv_heads * self.head_dim)
        self.wo = weight(num_heads * self.head_dim, d_model)

    def __repr__(self):
        return (
            f"TinyAttention(d_model={self.d_model}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim})"
        )

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project ``x: [tokens, d_model]`` to per-head q ``[T,Hq,D]`` and k, v ``[T,Hkv,D]``."""
        t = x.shape[0]
        q = (x @ self.wq).view(t, self.num_heads, self.head_dim)
        k = (x @ self.wk).view(t, self.num_kv_heads, self.head_dim)
        v = (x @ self.wv).view(t, self.num_kv_heads, self.head_dim)
        return q, k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Recompute everything: the output for every position of ``x: [tokens, d_model]``."""
        q, k, v = self.qkv(x)
        return causal_attention(q, k, v).reshape(x.shape[0], -1) @ self.wo

    def empty_cache(self) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (0, self.num_kv_heads, self.head_dim)
        return torch.zeros(shape), torch.zeros(shape)

    def decode_step(
        self, x_t: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Process one new token ``x_t: [d_model]`` using (and extending) the KV cache."""
        q, k, v = self.qkv(x_t.unsqueeze(0))
        k_cache = torch.cat([k_cache, k])
        v_cache = torch.cat([v_cache, v])
        out = decode_attention(q[0], k_cache, v_cache).reshape(-1) @ self.wo
        return out, k_cache, v_cache
