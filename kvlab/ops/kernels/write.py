"""Storing new tokens' K and V into their blocks through a slot mapping (vLLM's reshape-and-cache)."""

from __future__ import annotations

import triton
import triton.language as tl

from kvlab.ops.kernels.sizes import pow2, strides
from kvlab.ops.kernels.slots import slot_offsets


@triton.jit
def write_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slots_ptr,
    stride_kn, stride_kh, stride_kd,
    stride_vn, stride_vh, stride_vd,
    stride_kcb, stride_kct, stride_kch, stride_kcd,
    stride_vcb, stride_vct, stride_vch, stride_vcd,
    BLOCK_SIZE: tl.constexpr, HEADS: tl.constexpr, H_P2: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_P2: tl.constexpr,
):  # fmt: skip
    """Store one new token's K and V (all KV heads) at its slot; slot -1 means skip."""
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    if slot >= 0:
        h = tl.arange(0, H_P2)
        d = tl.arange(0, D_P2)
        mask = (h < HEADS)[:, None] & (d < HEAD_DIM)[None, :]
        k = tl.load(
            k_ptr + token * stride_kn + h[:, None] * stride_kh + d[None, :] * stride_kd, mask=mask
        )
        v = tl.load(
            v_ptr + token * stride_vn + h[:, None] * stride_vh + d[None, :] * stride_vd, mask=mask
        )
        k_at = slot_offsets(
            slot, h[:, None], d[None, :], stride_kcb, stride_kct, stride_kch, stride_kcd, BLOCK_SIZE
        )
        v_at = slot_offsets(
            slot, h[:, None], d[None, :], stride_vcb, stride_vct, stride_vch, stride_vcd, BLOCK_SIZE
        )
        tl.store(k_cache_ptr + k_at, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(v_cache_ptr + v_at, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(k_cache, v_cache, slot_mapping, k, v) -> None:
    """Triton version of :func:`kvlab.ops.attention.write_kv_reference` (slots of -1 are skipped).
    The caches may have any strides. New K/V of another dtype are converted by torch first (to
    nearest even, as a GPU converts; Triton's interpreter would truncate to bf16)."""
    if k.shape != v.shape or k.dim() != 3 or k.shape[1:] != k_cache.shape[2:]:
        raise ValueError(
            f"k and v must be [n, {k_cache.shape[2]}, {k_cache.shape[3]}], got {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if slot_mapping.shape != (k.shape[0],):
        raise ValueError(f"slot_mapping must be [n={k.shape[0]}], got {tuple(slot_mapping.shape)}")
    capacity = k_cache.shape[0] * k_cache.shape[1]
    if len(slot_mapping) and int(slot_mapping.max()) >= capacity:
        raise ValueError(f"slot_mapping must be < num_blocks * block_size = {capacity}")
    if k.shape[0] == 0:
        return
    k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
    heads, head_dim = k.shape[1], k.shape[2]
    write_kv_kernel[(k.shape[0],)](
        k, v, k_cache, v_cache, slot_mapping,
        *strides(k, v, k_cache, v_cache),
        BLOCK_SIZE=k_cache.shape[1], HEADS=heads, H_P2=pow2(heads),
        HEAD_DIM=head_dim, D_P2=pow2(head_dim),
    )  # fmt: skip
