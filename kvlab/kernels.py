"""Triton paged-attention kernels: decode attention that reads K/V rooms in place through block
tables, with an optional split-K (flash-decoding) pass, and a kernel that writes new K/V.

``import kvlab`` chooses Triton's interpreter when no CUDA GPU is visible, so the same code runs on
CPU tensors (slowly: keep shapes small) and compiled on a GPU.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kvlab.attention import check_paged_inputs
from kvlab.runtime import kernel_mode


@triton.jit
def attend_blocks(
    q,
    seq,
    kvh,
    seq_len,
    first_block,
    last_block,
    k_ptr,
    v_ptr,
    bt_ptr,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_bts,
    stride_btb,
    scale,
    GROUP_P2: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_P2: tl.constexpr,
):
    """Fold rooms [first_block, last_block) of one sequence into an online softmax for the query
    heads of one KV head. Returns (running max, running sum, unnormalised output)."""
    t = tl.arange(0, BLOCK_SIZE)
    d = tl.arange(0, D_P2)
    dmask = d < HEAD_DIM
    m = tl.full([GROUP_P2], float("-inf"), tl.float32)
    denom = tl.zeros([GROUP_P2], tl.float32)
    acc = tl.zeros([GROUP_P2, D_P2], tl.float32)
    for b in range(first_block, last_block):
        room = tl.load(bt_ptr + seq.to(tl.int64) * stride_bts + b * stride_btb).to(tl.int64)
        tmask = b * BLOCK_SIZE + t < seq_len
        kv_mask = tmask[:, None] & dmask[None, :]
        k = tl.load(
            k_ptr
            + room * stride_kb
            + t[:, None] * stride_kt
            + kvh * stride_kh
            + d[None, :] * stride_kd,
            mask=kv_mask,
            other=0.0,
        ).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [GROUP_P2, BLOCK_SIZE]
        scores = tl.where(tmask[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new[:, None])
        v = tl.load(
            v_ptr
            + room * stride_vb
            + t[:, None] * stride_vt
            + kvh * stride_vh
            + d[None, :] * stride_vd,
            mask=kv_mask,
            other=0.0,
        ).to(tl.float32)
        denom = denom * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new
    return m, denom, acc


@triton.jit
def load_group_queries(
    q_ptr,
    seq,
    kvh,
    stride_qs,
    stride_qh,
    stride_qd,
    GROUP: tl.constexpr,
    GROUP_P2: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_P2: tl.constexpr,
):
    """The fp32 queries ``[GROUP_P2, D_P2]`` of the heads sharing KV head ``kvh`` (padding masked)."""
    g = tl.arange(0, GROUP_P2)
    d = tl.arange(0, D_P2)
    heads = kvh * GROUP + g
    qmask = (g < GROUP)[:, None] & (d < HEAD_DIM)[None, :]
    q = tl.load(
        q_ptr + seq.to(tl.int64) * stride_qs + heads[:, None] * stride_qh + d[None, :] * stride_qd,
        mask=qmask,
        other=0.0,
    ).to(tl.float32)
    return q, heads, qmask


@triton.jit
def paged_decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    bt_ptr,
    lens_ptr,
    out_ptr,
    stride_qs,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_bts,
    stride_btb,
    stride_os,
    stride_oh,
    stride_od,
    scale,
    GROUP: tl.constexpr,
    GROUP_P2: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_P2: tl.constexpr,
):
    """One program per (sequence, KV head): all the query heads that share the KV head."""
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    q, heads, qmask = load_group_queries(
        q_ptr, seq, kvh, stride_qs, stride_qh, stride_qd, GROUP, GROUP_P2, HEAD_DIM, D_P2
    )
    d = tl.arange(0, D_P2)
    seq_len = tl.load(lens_ptr + seq)
    m, denom, acc = attend_blocks(
        q,
        seq,
        kvh,
        seq_len,
        0,
        tl.cdiv(seq_len, BLOCK_SIZE),
        k_ptr,
        v_ptr,
        bt_ptr,
        stride_kb,
        stride_kt,
        stride_kh,
        stride_kd,
        stride_vb,
        stride_vt,
        stride_vh,
        stride_vd,
        stride_bts,
        stride_btb,
        scale,
        GROUP_P2,
        BLOCK_SIZE,
        HEAD_DIM,
        D_P2,
    )
    out = acc / denom[:, None]
    tl.store(
        out_ptr
        + seq.to(tl.int64) * stride_os
        + heads[:, None] * stride_oh
        + d[None, :] * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=qmask,
    )


@triton.jit
def paged_decode_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    bt_ptr,
    lens_ptr,
    part_acc_ptr,
    part_ml_ptr,
    stride_qs,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_bts,
    stride_btb,
    scale,
    blocks_per_split,
    num_splits,
    num_q_heads,
    GROUP: tl.constexpr,
    GROUP_P2: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_P2: tl.constexpr,
):
    """Split-K: program (sequence, KV head, split) folds one slice of the rooms and stores its
    partial output with the slice's max and sum, to be merged by merge_splits_kernel."""
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    q, heads, qmask = load_group_queries(
        q_ptr, seq, kvh, stride_qs, stride_qh, stride_qd, GROUP, GROUP_P2, HEAD_DIM, D_P2
    )
    hmask = tl.arange(0, GROUP_P2) < GROUP
    d = tl.arange(0, D_P2)
    seq_len = tl.load(lens_ptr + seq)
    first = split * blocks_per_split
    last = tl.minimum(first + blocks_per_split, tl.cdiv(seq_len, BLOCK_SIZE))
    m, denom, acc = attend_blocks(
        q,
        seq,
        kvh,
        seq_len,
        first,
        last,
        k_ptr,
        v_ptr,
        bt_ptr,
        stride_kb,
        stride_kt,
        stride_kh,
        stride_kd,
        stride_vb,
        stride_vt,
        stride_vh,
        stride_vd,
        stride_bts,
        stride_btb,
        scale,
        GROUP_P2,
        BLOCK_SIZE,
        HEAD_DIM,
        D_P2,
    )
    row = (seq.to(tl.int64) * num_q_heads + heads) * num_splits + split  # [GROUP_P2]
    tl.store(part_acc_ptr + row[:, None] * D_P2 + d[None, :], acc, mask=hmask[:, None])
    tl.store(part_ml_ptr + row * 2, m, mask=hmask)
    tl.store(part_ml_ptr + row * 2 + 1, denom, mask=hmask)


@triton.jit
def merge_splits_kernel(
    part_acc_ptr,
    part_ml_ptr,
    out_ptr,
    stride_os,
    stride_oh,
    stride_od,
    num_splits,
    num_q_heads,
    SPLITS_P2: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_P2: tl.constexpr,
):
    """Combine the splits of one (sequence, query head) with log-sum-exp weights."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    s = tl.arange(0, SPLITS_P2)
    d = tl.arange(0, D_P2)
    smask = s < num_splits
    row = (seq.to(tl.int64) * num_q_heads + head) * num_splits + s
    m = tl.load(part_ml_ptr + row * 2, mask=smask, other=float("-inf"))
    denom = tl.load(part_ml_ptr + row * 2 + 1, mask=smask, other=0.0)
    acc = tl.load(part_acc_ptr + row[:, None] * D_P2 + d[None, :], mask=smask[:, None], other=0.0)
    top = tl.max(m, axis=0)
    w = tl.where(smask & (m > float("-inf")), tl.exp(m - top), 0.0)
    out = tl.sum(w[:, None] * acc, axis=0) / tl.sum(w * denom, axis=0)
    tl.store(
        out_ptr + seq.to(tl.int64) * stride_os + head * stride_oh + d * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=d < HEAD_DIM,
    )


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _check_block_size(block_size: int) -> None:
    if block_size & (block_size - 1) or not 1 <= block_size <= 256:
        raise ValueError(f"block_size must be a power of two from 1 to 256, got {block_size}")


def choose_splits(num_seqs: int, num_kv_heads: int, max_blocks: int) -> int:
    """Enough split-K slices to give a GPU ~128 programs; 1 in the interpreter (CPU)."""
    if kernel_mode() == "interpreter":
        return 1
    return max(1, min(max_blocks, math.ceil(128 / max(1, num_seqs * num_kv_heads))))


def launch_paged_decode(kernel, q, k_cache, v_cache, block_tables, seq_lens, *, scale=None):
    """Run a kernel with ``paged_decode_kernel``'s signature (yours in Lab 05, or kvlab's)."""
    check_paged_inputs(q, k_cache, v_cache, block_tables, seq_lens)
    _check_block_size(k_cache.shape[1])
    num_seqs, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if num_seqs == 0:
        return out
    kernel[(num_seqs, num_kv_heads)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        *q.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        *block_tables.stride(),
        *out.stride(),
        scale,
        GROUP=group,
        GROUP_P2=_pow2(group),
        BLOCK_SIZE=k_cache.shape[1],
        HEAD_DIM=head_dim,
        D_P2=_pow2(head_dim),
    )
    return out


def paged_decode_attention(
    q, k_cache, v_cache, block_tables, seq_lens, *, scale=None, num_splits=None
) -> torch.Tensor:
    """Decode attention reading K/V rooms in place through block tables.

    q ``[num_seqs, num_q_heads, head_dim]`` (any strides); k/v_cache ``[num_blocks, block_size,
    num_kv_heads, head_dim]``; block_tables int32 ``[num_seqs, max_blocks]`` (entries past
    ceil(seq_len / block_size) are never read); seq_lens int32 ``[num_seqs]``. fp32 accumulation;
    returns ``[num_seqs, num_q_heads, head_dim]`` in q's dtype. ``num_splits`` > 1 splits each
    sequence's rooms across programs (flash-decoding) and merges them with log-sum-exp.
    """
    check_paged_inputs(q, k_cache, v_cache, block_tables, seq_lens)
    _check_block_size(k_cache.shape[1])
    max_blocks = block_tables.shape[1]
    if num_splits is None:
        num_splits = choose_splits(q.shape[0], k_cache.shape[2], max_blocks)
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits must be an int >= 1 (or None), got {num_splits!r}")
    num_splits = min(num_splits, max(1, max_blocks))
    if num_splits == 1:
        return launch_paged_decode(
            paged_decode_kernel, q, k_cache, v_cache, block_tables, seq_lens, scale=scale
        )
    num_seqs, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    d_p2 = _pow2(head_dim)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    blocks_per_split = math.ceil(max_blocks / num_splits)
    part_acc = torch.empty(
        num_seqs * num_q_heads * num_splits, d_p2, dtype=torch.float32, device=q.device
    )
    part_ml = torch.empty(
        num_seqs * num_q_heads * num_splits, 2, dtype=torch.float32, device=q.device
    )
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    paged_decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        part_acc,
        part_ml,
        *q.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        *block_tables.stride(),
        scale,
        blocks_per_split,
        num_splits,
        num_q_heads,
        GROUP=group,
        GROUP_P2=_pow2(group),
        BLOCK_SIZE=k_cache.shape[1],
        HEAD_DIM=head_dim,
        D_P2=d_p2,
    )
    merge_splits_kernel[(num_seqs, num_q_heads)](
        part_acc,
        part_ml,
        out,
        *out.stride(),
        num_splits,
        num_q_heads,
        SPLITS_P2=_pow2(num_splits),
        HEAD_DIM=head_dim,
        D_P2=d_p2,
    )
    return out


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
    _check_block_size(k_cache.shape[1])
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
        H_P2=_pow2(heads),
        HEAD_DIM=head_dim,
        D_P2=_pow2(head_dim),
    )
