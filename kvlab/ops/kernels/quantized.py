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

import torch
import triton
import triton.language as tl

from kvlab.ops.attention import check_paged_inputs
from kvlab.ops.kernels.dtypes import gpu_arch, tensor_core_dtypes
from kvlab.ops.kernels.online_softmax import fold_scores, tile_scores, weighted_values
from kvlab.ops.kernels.slots import load_kv_tile, slot_offsets, token_slots
from kvlab.ops.kernels.tiled import prepare_decode_launch, store_heads

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
        k, v = load_kv_tile(
            k_ptr, v_ptr, slot, kvh, d, tmask[:, None] & dmask[None, :],
            stride_kb, stride_kt, stride_kh, stride_kd, stride_vb, stride_vt, stride_vh, stride_vd,
            BLOCK_SIZE,
        )  # fmt: skip
        # each bed's scale label: the same address as its K/V, without the lane
        ks_offsets = slot_offsets(slot, kvh, 0, stride_ksb, stride_kst, stride_ksh, 0, BLOCK_SIZE)
        vs_offsets = slot_offsets(slot, kvh, 0, stride_vsb, stride_vst, stride_vsh, 0, BLOCK_SIZE)
        k_scale = tl.load(ks_ptr + ks_offsets, mask=tmask, other=0.0)
        v_scale = tl.load(vs_ptr + vs_offsets, mask=tmask, other=0.0)
        if LOW_PRECISION:  # widened exactly to q's 16-bit type, for the tensor cores
            k = k.to(q_ptr.dtype.element_ty)
            v = v.to(q_ptr.dtype.element_ty)
        # dequantise K after the product: q . (s k) = s (q . k); scores in log2 units
        scores = tile_scores(q, k, LOW_PRECISION) * (k_scale * scale)[None, :]
        scores = tl.where(tmask[None, :], scores, float("-inf"))  # [BLOCK_H, TILE]
        m, alpha, p, denom = fold_scores(m, denom, scores)
        # dequantise V through the softmax weights
        acc = acc * alpha[:, None] + weighted_values(p * v_scale[None, :], v, LOW_PRECISION)
        if PREFETCH_TABLE:
            slot = slot_next
    store_heads(
        acc, m, denom, out_ptr, part_acc_ptr, part_ml_ptr, seq, heads, hmask, d, dmask, split,
        num_splits, num_q_heads, stride_os, stride_oh, stride_od, D_P2, SPLIT,
    )  # fmt: skip


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
    return prepare_decode_launch(
        paged_decode_quant_kernel, q, (k_values, v_values, k_scales, v_scales), block_tables,
        seq_lens, low_precision=q.dtype in tensor_core_dtypes(), scale=scale,
        num_splits=num_splits, tile=tile, num_warps=num_warps, num_stages=num_stages,
        prefetch_table=prefetch_table,
    )  # fmt: skip


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
