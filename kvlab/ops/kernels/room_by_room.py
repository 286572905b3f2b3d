"""The teaching kernel of Lab 05: one program per (sequence, KV head) walks the key card one room
at a time, folding each room into an online softmax. Clear rather than fast: see ``tiled``.

It is the lab's solution as a learner writes it, so it spells out the room lookup and the K/V
addresses that ``tiled`` and ``write`` take from ``kvlab.ops.kernels.slots``."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kvlab.ops.attention import check_paged_inputs
from kvlab.ops.kernels.dtypes import store_dtype
from kvlab.ops.kernels.quantized import check_quantized_inputs
from kvlab.ops.kernels.sizes import check_block_size, pow2, strides


@triton.jit
def paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, out_ptr,
    stride_qs, stride_qh, stride_qd,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    stride_bts, stride_btb,
    stride_os, stride_oh, stride_od,
    scale,
    GROUP: tl.constexpr, GROUP_P2: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_P2: tl.constexpr,
):  # fmt: skip
    """One program per (sequence, KV head): all the query heads that share the KV head."""
    seq = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    g = tl.arange(0, GROUP_P2)
    d = tl.arange(0, D_P2)
    t = tl.arange(0, BLOCK_SIZE)
    heads = kvh * GROUP + g
    dmask = d < HEAD_DIM
    qmask = (g < GROUP)[:, None] & dmask[None, :]
    q = tl.load(
        q_ptr + seq * stride_qs + heads[:, None] * stride_qh + d[None, :] * stride_qd,
        mask=qmask,
        other=0.0,
    ).to(tl.float32)
    seq_len = tl.load(lens_ptr + seq)
    m = tl.full([GROUP_P2], float("-inf"), tl.float32)
    denom = tl.zeros([GROUP_P2], tl.float32)
    acc = tl.zeros([GROUP_P2, D_P2], tl.float32)
    for b in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):
        room = tl.load(bt_ptr + seq * stride_bts + b * stride_btb).to(tl.int64)
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
        v = tl.load(
            v_ptr
            + room * stride_vb
            + t[:, None] * stride_vt
            + kvh * stride_vh
            + d[None, :] * stride_vd,
            mask=kv_mask,
            other=0.0,
        ).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [GROUP_P2, BLOCK_SIZE]
        scores = tl.where(tmask[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new[:, None])
        denom = denom * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new
    out = acc / denom[:, None]
    tl.store(
        out_ptr + seq * stride_os + heads[:, None] * stride_oh + d[None, :] * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=qmask,
    )


def launch_paged_decode(
    kernel, q, k_cache, v_cache, block_tables, seq_lens, *, scale=None, out=None
):
    """Run a kernel with ``paged_decode_kernel``'s signature (yours in Lab 05, or kvlab's) on the
    grid ``(num_seqs, num_kv_heads)`` and return its output.

    ``out`` (q's shape, dtype and device) receives the result instead of a new tensor: Lab 05's
    checks hand over a view with guard regions around it, to see stores that miss it. Without
    it, a bf16 result goes through fp32 where Triton cannot round to nearest even itself (its
    interpreter), so CPU and GPU give the same bits.
    """
    check_paged_inputs(q, k_cache, v_cache, block_tables, seq_lens)
    return _launch(kernel, q, (k_cache, v_cache), block_tables, seq_lens, scale, out)


def launch_paged_decode_quantized(
    kernel, q, k_values, v_values, k_scales, v_scales, block_tables, seq_lens, *, scale=None,
    out=None,
):  # fmt: skip
    """Lab 11: as :func:`launch_paged_decode`, for a kernel that also takes the scales (its
    arguments ``ks_ptr, vs_ptr`` after ``v_ptr``, their strides ``stride_ksb, stride_kst,
    stride_ksh, stride_vsb, stride_vst, stride_vsh`` after V's): 8-bit K/V
    ``[num_blocks, block_size, kv_heads, head_dim]`` and fp32 scales ``[num_blocks, block_size,
    kv_heads]`` (:func:`kvlab.ops.quant.quantize_cache` makes them)."""
    check_quantized_inputs(q, k_values, v_values, k_scales, v_scales, block_tables, seq_lens)
    caches = (k_values, v_values, k_scales, v_scales)
    return _launch(kernel, q, caches, block_tables, seq_lens, scale, out)


def _launch(kernel, q, caches, block_tables, seq_lens, scale, out):
    """Launch ``kernel`` with q, the caches, the key cards, the lengths and out, then all their
    strides in that order, the scale and the sizes."""
    k_cache = caches[0]
    check_block_size(k_cache.shape[1])
    num_seqs, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    if out is None:
        out = torch.empty(q.shape, dtype=store_dtype(q.dtype), device=q.device)
    elif not isinstance(out, torch.Tensor) or _layout(out) != _layout(q):
        raise ValueError(
            f"out must be a tensor of q's shape {tuple(q.shape)}, dtype {q.dtype} and device "
            f"{q.device}"
        )
    if num_seqs > 0:
        kernel[(num_seqs, num_kv_heads)](
            q, *caches, block_tables, seq_lens, out,
            *strides(q, *caches, block_tables, out),
            scale,
            GROUP=group, GROUP_P2=pow2(group), BLOCK_SIZE=k_cache.shape[1],
            HEAD_DIM=head_dim, D_P2=pow2(head_dim),
        )  # fmt: skip
    return out.to(q.dtype)  # rounds to nearest even where the kernel stored fp32


def _layout(t: torch.Tensor) -> tuple:
    return t.shape, t.dtype, t.device
