"""Multi-head latent attention (MLA, DeepSeek-V2/V3) at decode, over a latent cache, in torch.

Each token caches one vector per layer, shared by every head: ``kv_lora_rank`` latent elements
``c`` followed by ``rope_dim`` rotated key elements ``k_pe`` (vLLM's MLA cache layout, one "head"
of 512 + 64 = 576 for DeepSeek-V3). Head ``h`` up-projects ``c`` into the non-rotated part of its
key, ``W_UK[h] @ c``, and into its value, ``W_UV[h] @ c`` (the model's ``kv_b_proj``, split).

Two forms give the same answer:

- **expanded** (:func:`mla_decode_expanded`): build every head's K and V from the latent, then
  attend as multi-head attention does. This is what a cache without MLA would hold.
- **absorbed** (:func:`mla_decode_absorbed`): fold ``W_UK`` into the query,
  ``q_lat[h] = W_UK[h]^T q_nope[h]``, score against the latent itself, sum the latents with the
  softmax weights and apply ``W_UV`` once, after the sum. No per-head K or V is ever built: the
  decode form DeepSeek's engines and vLLM's MLA backends use.

Shapes: ``q_nope [heads, nope]``, ``q_pe [heads, rope]``, ``latent [tokens, rank + rope]``,
``w_uk [heads, nope, rank]``, ``w_uv [heads, v_dim, rank]``. The softmax scale is
``1/sqrt(nope + rope)``: the head dim of the expanded keys, whatever form computes it (DeepSeek-V3
multiplies it by YaRN's mscale squared; pass ``scale=`` for that). fp32 accumulation; results in
q's dtype.
"""

from __future__ import annotations

import math

import torch


def _tensors(**named) -> None:
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def check_mla_inputs(q_nope, q_pe, latent, w_uk, w_uv) -> None:
    """Raise a ValueError/TypeError naming the argument when one sequence's MLA inputs do not fit."""
    _tensors(q_nope=q_nope, q_pe=q_pe, latent=latent, w_uk=w_uk, w_uv=w_uv)
    if q_nope.dim() != 2 or q_pe.dim() != 2 or q_pe.shape[0] != q_nope.shape[0]:
        raise ValueError(
            f"q_nope must be [heads, nope] and q_pe [heads, rope]; got {tuple(q_nope.shape)}, "
            f"{tuple(q_pe.shape)}"
        )
    heads, nope = q_nope.shape
    if w_uk.dim() != 3 or w_uk.shape[:2] != (heads, nope):
        raise ValueError(
            f"w_uk must be [heads={heads}, nope={nope}, kv_lora_rank], got {tuple(w_uk.shape)}"
        )
    rank = w_uk.shape[2]
    if w_uv.dim() != 3 or w_uv.shape[0] != heads or w_uv.shape[2] != rank:
        raise ValueError(
            f"w_uv must be [heads={heads}, v_dim, kv_lora_rank={rank}], got {tuple(w_uv.shape)}"
        )
    width = rank + q_pe.shape[1]
    if latent.dim() != 2 or latent.shape[1] != width or latent.shape[0] < 1:
        raise ValueError(
            f"latent must be [tokens >= 1, kv_lora_rank + rope = {width}], got "
            f"{tuple(latent.shape)}"
        )


def default_scale(q_nope, q_pe) -> float:
    """1/sqrt(nope + rope): the expanded keys' head dim (192 for DeepSeek-V3), not the latent's."""
    return 1.0 / math.sqrt(q_nope.shape[-1] + q_pe.shape[-1])


def split_latent(latent: torch.Tensor, kv_lora_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A cached vector's two parts: the latent ``c`` (its first ``kv_lora_rank`` elements) and the
    rotated key part ``k_pe`` (the rest), as vLLM lays them out."""
    return latent[..., :kv_lora_rank], latent[..., kv_lora_rank:]


def absorb_query(q_nope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """``q_lat[h] = W_UK[h]^T q_nope[h]``: ``[heads, rank]``, so that ``q_lat[h] . c`` is
    ``q_nope[h] . (W_UK[h] c)``, the non-rotated part of head h's score, with no key built."""
    return torch.einsum("hn,hnr->hr", q_nope.float(), w_uk.float())


def up_project(o_lat: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """``W_UV[h] o_lat[h]``: the softmax-weighted latent of each head turned into its value."""
    return torch.einsum("hr,hvr->hv", o_lat.float(), w_uv.float())


def expand_kv(latent, w_uk, w_uv, rope_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head K ``[tokens, heads, nope + rope]`` (``W_UK[h] c`` then the shared ``k_pe``) and V
    ``[tokens, heads, v_dim]``: what the cache would hold without MLA."""
    c, k_pe = split_latent(latent.float(), w_uk.shape[2])
    k_nope = torch.einsum("hnr,tr->thn", w_uk.float(), c)
    v = torch.einsum("hvr,tr->thv", w_uv.float(), c)
    k_pe = k_pe[:, None, :].expand(-1, w_uk.shape[0], rope_dim)
    return torch.cat([k_nope, k_pe], dim=-1), v


def mla_decode_expanded(q_nope, q_pe, latent, w_uk, w_uv, *, scale=None) -> torch.Tensor:
    """One sequence's decode attention with every head's K and V built from the latent:
    ``[heads, v_dim]`` in q_nope's dtype."""
    check_mla_inputs(q_nope, q_pe, latent, w_uk, w_uv)
    scale = default_scale(q_nope, q_pe) if scale is None else float(scale)
    k, v = expand_kv(latent, w_uk, w_uv, q_pe.shape[1])
    q = torch.cat([q_nope.float(), q_pe.float()], dim=-1)
    probs = (torch.einsum("hd,thd->ht", q, k) * scale).softmax(dim=-1)
    return torch.einsum("ht,thv->hv", probs, v).to(q_nope.dtype)


def mla_decode_absorbed(q_nope, q_pe, latent, w_uk, w_uv, *, scale=None) -> torch.Tensor:
    """One sequence's decode attention with ``W_UK`` absorbed into the query and ``W_UV`` applied
    after the weighted sum: ``[heads, v_dim]`` in q_nope's dtype, equal to
    :func:`mla_decode_expanded` up to rounding."""
    check_mla_inputs(q_nope, q_pe, latent, w_uk, w_uv)
    scale = default_scale(q_nope, q_pe) if scale is None else float(scale)
    c, k_pe = split_latent(latent.float(), w_uk.shape[2])
    scores = absorb_query(q_nope, w_uk) @ c.T + q_pe.float() @ k_pe.T  # [heads, tokens]
    o_lat = (scores * scale).softmax(dim=-1) @ c  # [heads, rank]
    return up_project(o_lat, w_uv).to(q_nope.dtype)


# --- paged: a batch of sequences through block tables ----------------------------------------------


def gather_latent(kv_cache, block_table, seq_len: int) -> torch.Tensor:
    """One sequence's cached vectors ``[seq_len, rank + rope]`` copied out of the rooms its block
    table lists (``kv_cache [num_blocks, block_size, rank + rope]``); only the first
    ceil(seq_len / block_size) entries are read."""
    rooms = block_table[: -(-seq_len // kv_cache.shape[1])].long()
    return kv_cache[rooms].reshape(-1, kv_cache.shape[2])[:seq_len]


def paged_mla_decode(
    q_nope, q_pe, kv_cache, block_tables, seq_lens, w_uk, w_uv, *, scale=None, absorbed=True
) -> torch.Tensor:
    """Decode attention for a batch of sequences whose latent vectors live in rooms listed by
    block tables: ``q_nope [num_seqs, heads, nope]``, ``q_pe [num_seqs, heads, rope]``,
    ``kv_cache [num_blocks, block_size, rank + rope]``, int32 ``block_tables [num_seqs,
    max_blocks]`` and ``seq_lens [num_seqs]``. ``absorbed=False`` computes the expanded form.
    Returns ``[num_seqs, heads, v_dim]`` in q_nope's dtype."""
    _tensors(q_nope=q_nope, q_pe=q_pe, kv_cache=kv_cache, block_tables=block_tables)
    _tensors(seq_lens=seq_lens)
    if q_nope.dim() != 3 or q_pe.dim() != 3 or q_pe.shape[:2] != q_nope.shape[:2]:
        raise ValueError(
            f"q_nope must be [num_seqs, heads, nope] and q_pe [num_seqs, heads, rope]; got "
            f"{tuple(q_nope.shape)}, {tuple(q_pe.shape)}"
        )
    if kv_cache.dim() != 3:
        raise ValueError(
            f"kv_cache must be [num_blocks, block_size, rank + rope], got {tuple(kv_cache.shape)}"
        )
    num_seqs = q_nope.shape[0]
    for name, t in (("block_tables", block_tables), ("seq_lens", seq_lens)):
        if t.dtype != torch.int32:
            raise TypeError(f"{name} must be an int32 tensor, got {t.dtype}")
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(
            f"block_tables must be [num_seqs={num_seqs}, max_blocks], got "
            f"{tuple(block_tables.shape)}"
        )
    if seq_lens.shape != (num_seqs,):
        raise ValueError(f"seq_lens must be [num_seqs={num_seqs}], got {tuple(seq_lens.shape)}")
    capacity = kv_cache.shape[1] * block_tables.shape[1]
    if num_seqs and (int(seq_lens.min()) < 1 or int(seq_lens.max()) > capacity):
        raise ValueError(f"seq_lens must be in 1..block_size * max_blocks = {capacity}")
    attend = mla_decode_absorbed if absorbed else mla_decode_expanded
    out = torch.empty(
        num_seqs, q_nope.shape[1], w_uv.shape[1], dtype=q_nope.dtype, device=q_nope.device
    )
    for s in range(num_seqs):
        latent = gather_latent(kv_cache, block_tables[s], int(seq_lens[s]))
        out[s] = attend(q_nope[s], q_pe[s], latent, w_uk, w_uv, scale=scale)
    return out


# --- cases and sizes ---------------------------------------------------------------------------------


def make_mla_case(
    num_tokens=5,
    heads=4,
    nope=16,
    rope=8,
    rank=32,
    v_dim=16,
    dtype=torch.float32,
    seed=0,
    sharpness=1.0,
):
    """Random inputs of one sequence, seeded: ``q_nope, q_pe, latent, w_uk, w_uv`` on the CPU.
    The weights are scaled so that keys and values have unit size, as a trained model's are;
    ``sharpness`` multiplies the queries (larger scores, a peakier softmax)."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape, std=1.0):
        return (torch.randn(*shape, generator=g) * std).to(dtype)

    q_nope = randn(heads, nope, std=sharpness)
    q_pe = randn(heads, rope, std=sharpness)
    latent = randn(num_tokens, rank + rope)
    w_uk = randn(heads, nope, rank, std=1 / math.sqrt(rank))
    w_uv = randn(heads, v_dim, rank, std=1 / math.sqrt(rank))
    return q_nope, q_pe, latent, w_uk, w_uv


def latent_elements_per_token(kv_lora_rank: int, rope_dim: int) -> int:
    """Elements one layer caches per token under MLA (576 for DeepSeek-V3): the same on every
    tensor-parallel GPU, since every head reads the whole latent."""
    return kv_lora_rank + rope_dim


def expanded_elements_per_token(num_heads: int, qk_head_dim: int, v_head_dim: int) -> int:
    """Elements one layer would cache per token with per-head K and V of these sizes."""
    return num_heads * (qk_head_dim + v_head_dim)
