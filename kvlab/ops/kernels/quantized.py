"""Paged decode attention over a quantised cache: half-size beds, each with a label for its scale.

The cache holds K and V in 8 bits (``torch.float8_e4m3fn`` or ``torch.int8``, see
:mod:`kvlab.ops.quant`) with one fp32 scale per token and KV head (``[num_blocks, block_size,
kv_heads]``, beside the rooms). The kernel is kvlab's tiled decode kernel
(:mod:`kvlab.ops.kernels.tiled`: tiles of tokens from as many rooms as it takes, ``tl.dot``,
split-K merged by the same ``merge_splits_kernel``) with the dequantisation moved where it costs
nothing: a token's K scale multiplies its score after the product (``q . (s k) = s (q . k)``), and
its V scale multiplies its softmax weight before the second product. The 8-bit elements are
widened to q's 16-bit type (exactly: both formats fit fp16 and bf16) or to fp32.

The bytes read per token halve (plus 8 bytes of scales per KV head), and decode is memory-bound,
so a GPU should approach twice the 16-bit kernel's tokens/s at long contexts
(``kvlab bench attention`` measures it). Triton loads fp8 e4m3 on sm_89 and newer, and in its
interpreter on a CPU; older GPUs take int8.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from kvlab.ops.attention import check_paged_inputs
from kvlab.ops.kernels.dtypes import gpu_arch, store_dtype, tensor_core_dtypes
from kvlab.ops.kernels.sizes import pow2, strides
from kvlab.ops.kernels.slots import slot_offsets, token_slots
from kvlab.ops.kernels.tiled import (
    LOG2E,
    MAX_SPLITS,
    _check_option,
    _multiprocessors,
    _too_large,
    launch_config,
    merge_splits_kernel,
    plan_splits,
)

QUANT_DTYPES = (torch.float8_e4m3fn, torch.int8)
FP8_MIN_ARCH = 89  # Triton converts fp8 e4m3 on Ada (sm_89) and Hopper (sm_90) on


@triton.jit(do_not_specialize=["tokens_per_split", "num_splits"])
def paged_decode_quant_kernel(
    q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, lens_ptr, out_ptr, part_acc_ptr, part_ml_ptr,
    stride_qs, stride_qh, stride_qd,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    stride_ksb, stride_kst, stride_ksh,
    stride_vsb, stride_vst, stride_vsh,
    stride_bts, stride_btb,
    stride_os, stride_oh, stride_od,
    scale, tokens_per_split, num_splits, num_q_heads,
    GROUP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_P2: tl.constexpr,
    LOW_PRECISION: tl.constexpr, SPLIT: tl.constexpr, PREFETCH_TABLE: tl.constexpr,
):  # fmt: skip
    """Program (sequence, KV head, split), as the tiled kernel's, reading 8-bit K/V and scales."""
    seq = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, D_P2)
    heads = kvh * GROUP + h
    hmask = h < GROUP
    dmask = d < HEAD_DIM
    q_offsets = seq * stride_qs + heads[:, None] * stride_qh + d[None, :] * stride_qd
    q = tl.load(q_ptr + q_offsets, mask=hmask[:, None] & dmask[None, :], other=0.0)
    if not LOW_PRECISION:
        q = q.to(tl.float32)
    table = bt_ptr + seq * stride_bts
    first = split * tokens_per_split
    t_end = tl.minimum(first + tokens_per_split, tl.load(lens_ptr + seq))
    tok = tl.arange(0, TILE)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, D_P2], tl.float32)
    if PREFETCH_TABLE:
        slot = token_slots(table, stride_btb, first + tok, first + tok < t_end, BLOCK_SIZE)
    for t0 in range(first, t_end, TILE):
        t = t0 + tok
        tmask = t < t_end
        if PREFETCH_TABLE:
            t_next = t + TILE
            slot_next = token_slots(table, stride_btb, t_next, t_next < t_end, BLOCK_SIZE)
        else:
            slot = token_slots(table, stride_btb, t, tmask, BLOCK_SIZE)
        kv_mask = tmask[:, None] & dmask[None, :]
        k_offsets = slot_offsets(
            slot[:, None], kvh, d[None, :], stride_kb, stride_kt, stride_kh, stride_kd, BLOCK_SIZE
        )
        v_offsets = slot_offsets(
            slot[:, None], kvh, d[None, :], stride_vb, stride_vt, stride_vh, stride_vd, BLOCK_SIZE
        )
        k = tl.load(k_ptr + k_offsets, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + v_offsets, mask=kv_mask, other=0.0)
        # each bed's scale label: the same address as its K/V, without the lane
        ks_offsets = slot_offsets(slot, kvh, 0, stride_ksb, stride_kst, stride_ksh, 0, BLOCK_SIZE)
        vs_offsets = slot_offsets(slot, kvh, 0, stride_vsb, stride_vst, stride_vsh, 0, BLOCK_SIZE)
        k_scale = tl.load(ks_ptr + ks_offsets, mask=tmask, other=0.0)
        v_scale = tl.load(vs_ptr + vs_offsets, mask=tmask, other=0.0)
        if LOW_PRECISION:
            scores = tl.dot(q, tl.trans(k.to(q_ptr.dtype.element_ty)))
        else:
            scores = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        # dequantise K after the product: q . (s k) = s (q . k); scores in log2 units
        scores = scores * (k_scale * scale)[None, :]
        scores = tl.where(tmask[None, :], scores, float("-inf"))  # [BLOCK_H, TILE]
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        denom = denom * alpha + tl.sum(p, axis=1)
        weighted = p * v_scale[None, :]  # dequantise V through the softmax weights
        if LOW_PRECISION:
            pv = tl.dot(weighted.to(q_ptr.dtype.element_ty), v.to(q_ptr.dtype.element_ty))
        else:
            pv = tl.dot(weighted, v.to(tl.float32), input_precision="ieee")
        acc = acc * alpha[:, None] + pv
        m = m_new
        if PREFETCH_TABLE:
            slot = slot_next
    if SPLIT:
        row = (seq * num_q_heads + heads) * num_splits + split
        tl.store(part_acc_ptr + row[:, None] * D_P2 + d[None, :], acc, mask=hmask[:, None])
        tl.store(part_ml_ptr + row * 2, m, mask=hmask)
        tl.store(part_ml_ptr + row * 2 + 1, denom, mask=hmask)
    else:
        out = acc / denom[:, None]
        out_offsets = seq * stride_os + heads[:, None] * stride_oh + d[None, :] * stride_od
        tl.store(
            out_ptr + out_offsets,
            out.to(out_ptr.dtype.element_ty),
            mask=hmask[:, None] & dmask[None, :],
        )


def check_quantized_inputs(q, k_values, v_values, k_scales, v_scales, block_tables, seq_lens):
    """:func:`check_paged_inputs`, then 8-bit K/V of one format and fp32 scales
    ``[num_blocks, block_size, kv_heads]`` beside them, on their device."""
    check_paged_inputs(q, k_values, v_values, block_tables, seq_lens)
    if k_values.dtype not in QUANT_DTYPES or v_values.dtype != k_values.dtype:
        raise TypeError(
            "k_values and v_values must both be torch.float8_e4m3fn or both torch.int8, got "
            f"{k_values.dtype} and {v_values.dtype}"
        )
    for name, s in (("k_scales", k_scales), ("v_scales", v_scales)):
        if not isinstance(s, torch.Tensor) or s.dtype != torch.float32:
            got = s.dtype if isinstance(s, torch.Tensor) else type(s).__name__
            raise TypeError(f"{name} must be a float32 tensor, got {got}")
        if s.shape != k_values.shape[:3]:
            raise ValueError(
                f"{name} must be [num_blocks, block_size, kv_heads] = "
                f"{tuple(k_values.shape[:3])}, got {tuple(s.shape)}"
            )
        if s.device != q.device:
            raise ValueError(f"{name} must be on {q.device}, got {s.device}")
    arch = gpu_arch()
    if k_values.dtype == torch.float8_e4m3fn and arch is not None and arch < FP8_MIN_ARCH:
        raise ValueError(
            f"this GPU (sm_{arch}) has no fp8 e4m3 in Triton (sm_{FP8_MIN_ARCH} or newer): "
            "quantise the cache to int8"
        )


def paged_decode_attention_quantized(
    q, k_values, v_values, k_scales, v_scales, block_tables, seq_lens, *, scale=None,
    num_splits=None, tile=None, num_warps=None, num_stages=None, prefetch_table=None,
) -> torch.Tensor:  # fmt: skip
    """Decode attention reading quantised K/V rooms in place through block tables: as
    :func:`kvlab.ops.kernels.paged_decode_attention`, with ``k_values``/``v_values`` 8-bit
    ``[num_blocks, block_size, kv_heads, head_dim]`` and their scales ``[num_blocks,
    block_size, kv_heads]`` (fp32; ``kvlab.ops.quant.quantize`` makes both)."""
    return prepare_paged_decode_quantized(
        q, k_values, v_values, k_scales, v_scales, block_tables, seq_lens, scale=scale,
        num_splits=num_splits, tile=tile, num_warps=num_warps, num_stages=num_stages,
        prefetch_table=prefetch_table,
    )()  # fmt: skip


def prepare_paged_decode_quantized(
    q, k_values, v_values, k_scales, v_scales, block_tables, seq_lens, *, scale=None,
    num_splits=None, tile=None, num_warps=None, num_stages=None, prefetch_table=None,
):  # fmt: skip
    """Check, plan and allocate once; return ``run()``, which only launches (as
    :func:`kvlab.ops.kernels.prepare_paged_decode`, whose launch defaults it takes)."""
    check_quantized_inputs(q, k_values, v_values, k_scales, v_scales, block_tables, seq_lens)
    _check_option("num_splits", num_splits, lambda n: 1 <= n <= MAX_SPLITS, f"1..{MAX_SPLITS}")
    num_seqs, num_q_heads, head_dim = q.shape
    num_kv_heads = k_values.shape[2]
    config = launch_config(
        head_dim, q.dtype, tile=tile, num_warps=num_warps, num_stages=num_stages,
        prefetch_table=prefetch_table,
    )  # fmt: skip
    out = torch.empty(q.shape, dtype=store_dtype(q.dtype), device=q.device)
    if num_seqs == 0:
        return lambda: out.to(q.dtype)
    plan = plan_splits(
        num_seqs, num_kv_heads, int(seq_lens.max()), config.tile, num_splits,
        _multiprocessors(q.device),
    )  # fmt: skip
    split = plan.num_splits > 1
    d_p2 = max(16, pow2(head_dim))
    rows = num_seqs * num_q_heads * plan.num_splits if split else 1
    part_acc = torch.empty(rows, d_p2, dtype=torch.float32, device=q.device)
    part_ml = torch.empty(rows, 2, dtype=torch.float32, device=q.device)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    group = num_q_heads // num_kv_heads

    def run() -> torch.Tensor:
        try:
            paged_decode_quant_kernel[(num_seqs, num_kv_heads, plan.num_splits)](
                q, k_values, v_values, k_scales, v_scales, block_tables, seq_lens, out,
                part_acc, part_ml,
                *strides(q, k_values, v_values, k_scales, v_scales, block_tables, out),
                LOG2E * scale, plan.tokens_per_split, plan.num_splits, num_q_heads,
                GROUP=group, BLOCK_H=max(16, pow2(group)), BLOCK_SIZE=k_values.shape[1],
                TILE=config.tile, HEAD_DIM=head_dim, D_P2=d_p2,
                LOW_PRECISION=q.dtype in tensor_core_dtypes(), SPLIT=split,
                PREFETCH_TABLE=config.prefetch_table,
                num_warps=config.num_warps, num_stages=config.num_stages,
            )  # fmt: skip
        except OutOfResources as error:
            raise _too_large(error, config) from None
        if split:
            merge_splits_kernel[(num_seqs, num_q_heads)](
                part_acc, part_ml, out, *strides(out), plan.num_splits, num_q_heads,
                SPLITS_P2=pow2(plan.num_splits), HEAD_DIM=head_dim, D_P2=d_p2,
            )  # fmt: skip
        return out.to(q.dtype)

    return run


def paged_decode_quantized_ref(
    q, k_values, v_values, k_scales, v_scales, block_tables, seq_lens, *, scale=None
) -> torch.Tensor:
    """The torch reference: dequantise the cache, then
    :func:`kvlab.ops.attention.paged_decode_attention_ref` (fp32 accumulation, q's dtype)."""
    from kvlab.ops.attention import paged_decode_attention_ref
    from kvlab.ops.quant import dequantize

    check_quantized_inputs(q, k_values, v_values, k_scales, v_scales, block_tables, seq_lens)
    k = dequantize(k_values, k_scales)
    v = dequantize(v_values, v_scales)
    return paged_decode_attention_ref(q.float(), k, v, block_tables, seq_lens, scale=scale).to(
        q.dtype
    )
