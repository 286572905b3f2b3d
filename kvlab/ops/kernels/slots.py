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
