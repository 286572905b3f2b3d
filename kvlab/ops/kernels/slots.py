"""Where a token's K and V live, written once for every kernel that reads or writes the cache:
token -> its key-card entry -> physical slot (room * BLOCK_SIZE + bed) -> element offsets.

The caches are ``[num_blocks, block_size, kv_heads, head_dim]`` with any strides (vLLM's NHD
layout, or a view into its ``[num_blocks, 2, ...]`` flash layout), so offsets always go through
the four strides, never through a flat slot index.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def token_slots(table_ptr, stride_btb, t, mask, BLOCK_SIZE: tl.constexpr):
    """Physical slots of tokens ``t`` of one sequence, read through its key card (``table_ptr``
    points at the sequence's row). Masked tokens read no entry and get slot 0."""
    room = tl.load(table_ptr + (t // BLOCK_SIZE) * stride_btb, mask=mask, other=0)
    return room.to(tl.int64) * BLOCK_SIZE + t % BLOCK_SIZE


@triton.jit
def slot_offsets(slot, head, d, stride_b, stride_t, stride_h, stride_d, BLOCK_SIZE: tl.constexpr):
    """Element offsets of (slot, KV head, lane) in a cache; the arguments broadcast, so the
    caller shapes them: ``slot[:, None]`` and ``d[None, :]`` give a [tokens, lanes] tile."""
    room = slot // BLOCK_SIZE
    bed = slot % BLOCK_SIZE
    return room * stride_b + bed * stride_t + head * stride_h + d * stride_d


@triton.jit
def load_kv_tile(
    k_ptr, v_ptr, slot, kvh, d, kv_mask,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    """K and V of a tile of tokens (their ``slot``) for KV head ``kvh``: [tokens, lanes] each, 0
    where ``kv_mask`` is False (a masked token or lane reads nothing)."""
    k_offsets = slot_offsets(
        slot[:, None], kvh, d[None, :], stride_kb, stride_kt, stride_kh, stride_kd, BLOCK_SIZE
    )
    v_offsets = slot_offsets(
        slot[:, None], kvh, d[None, :], stride_vb, stride_vt, stride_vh, stride_vd, BLOCK_SIZE
    )
    k = tl.load(k_ptr + k_offsets, mask=kv_mask, other=0.0)
    v = tl.load(v_ptr + v_offsets, mask=kv_mask, other=0.0)
    return k, v
