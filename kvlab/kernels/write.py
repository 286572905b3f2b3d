"""Storing new tokens' K and V into their rooms through a slot mapping (vLLM's reshape-and-cache)."""

from __future__ import annotations

import triton
import triton.language as tl

from kvlab.kernels.sizes import check_block_size, pow2


@triton.jit
def write_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slots_ptr,
    stride_kn,
    stride_kh,
    stride_kd,
    stride_vn,
    stride_vh,
    stride_vd,
    stride_cb,
    stride_ct,
    stride_ch,
    stride_cd,
    stride_vcb,
    stride_vct,
    stride_vch,
    stride_vcd,
    BLOCK_SIZE: tl.constexpr,
    HEADS: tl.constexpr,
    H_P2: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_P2: tl.constexpr,
):
    """Store one new token's K and V (all KV heads) at its slot; slot -1 means skip."""
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    if slot >= 0:
        room = slot // BLOCK_SIZE
        offset = slot % BLOCK_SIZE
        h = tl.arange(0, H_P2)
        d = tl.arange(0, D_P2)
        mask = (h < HEADS)[:, None] & (d < HEAD_DIM)[None, :]
        k = tl.load(
            k_ptr + token * stride_kn + h[:, None] * stride_kh + d[None, :] * stride_kd, mask=mask
        )
        v = tl.load(
            v_ptr + token * stride_vn + h[:, None] * stride_vh + d[None, :] * stride_vd, mask=mask
        )
        tl.store(
            k_cache_ptr
            + room * stride_cb
            + offset * stride_ct
            + h[:, None] * stride_ch
            + d[None, :] * stride_cd,
            k.to(k_cache_ptr.dtype.element_ty),
            mask=mask,
        )
        tl.store(
            v_cache_ptr
            + room * stride_vcb
            + offset * stride_vct
            + h[:, None] * stride_vch
            + d[None, :] * stride_vcd,
            v.to(v_cache_ptr.dtype.element_ty),
            mask=mask,
        )


def write_kv(k_cache, v_cache, slot_mapping, k, v) -> None:
    """Triton version of :func:`kvlab.attention.write_kv` (slots of -1 are skipped)."""
    if k.shape != v.shape or k.dim() != 3 or k.shape[1:] != k_cache.shape[2:]:
        raise ValueError(
            f"k and v must be [n, {k_cache.shape[2]}, {k_cache.shape[3]}], got {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if slot_mapping.shape != (k.shape[0],):
        raise ValueError(f"slot_mapping must be [n={k.shape[0]}], got {tuple(slot_mapping.shape)}")
    capacity = k_cache.shape[0] * k_cache.shape[1]
    if len(slot_mapping) and int(slot_mapping.max()) >= capacity:
        raise ValueError(f"slot_mapping must be < num_blocks * block_size = {capacity}")
    check_block_size(k_cache.shape[1])
    if k.shape[0] == 0:
        return
    heads, head_dim = k.shape[1], k.shape[2]
    write_kv_kernel[(k.shape[0],)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        *k.stride(),
        *v.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        BLOCK_SIZE=k_cache.shape[1],
        HEADS=heads,
        H_P2=pow2(heads),
        HEAD_DIM=head_dim,
        D_P2=pow2(head_dim),
    )
