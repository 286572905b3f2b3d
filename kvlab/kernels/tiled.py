"""kvlab's fast paged decode attention: the Lab 05 kernel with the two steps towards production
speed that the lab names, plus split-K.

- **Tiles of several rooms.** Each loop step gathers ``TILE`` tokens (64 by default) from as many
  rooms as that takes, so small rooms (block_size 1–8) do not mean tiny loads, and each program
  keeps more bytes in flight.
- **Tensor cores.** The group's query heads are padded to 16 rows so that scores and outputs are
  ``tl.dot`` products. fp16/bf16 inputs multiply in their own type with fp32 accumulation (softmax
  weights are rounded to that type for the second product, as FlashAttention does); fp32 inputs
  use exact fp32 products (``input_precision="ieee"``), never TF32.
- **Split-K (flash-decoding).** Program ``(sequence, KV head, split)`` folds one slice of the key
  card and stores its partial output with the slice's max and sum; ``merge_splits_kernel`` combines
  them with log-sum-exp weights.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kvlab.attention import check_paged_inputs
from kvlab.kernels.sizes import check_block_size, pow2
from kvlab.runtime import kernel_mode

TILE_TOKENS = 64
MIN_TOKENS_PER_SPLIT = 256
PROGRAMS_PER_MULTIPROCESSOR = 4
MAX_SPLITS = 128  # the merge kernel holds every split of a head at once
LOG2E = 1.4426950408889634


@triton.jit
def paged_decode_tiled_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    bt_ptr,
    lens_ptr,
    out_ptr,
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
    stride_os,
    stride_oh,
    stride_od,
    scale,
    rooms_per_split,
    num_splits,
    num_q_heads,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_P2: tl.constexpr,
    LOW_PRECISION: tl.constexpr,
    SPLIT: tl.constexpr,
):
    """Program (sequence, KV head, split): the group's query heads against one slice of rooms."""
    seq = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, D_P2)
    heads = kvh * GROUP + h
    hmask = h < GROUP
    dmask = d < HEAD_DIM
    q = tl.load(
        q_ptr + seq * stride_qs + heads[:, None] * stride_qh + d[None, :] * stride_qd,
        mask=hmask[:, None] & dmask[None, :],
        other=0.0,
    )
    if LOW_PRECISION:
        q = q.to(k_ptr.dtype.element_ty)
    else:
        q = q.to(tl.float32)
    seq_len = tl.load(lens_ptr + seq)
    first = split * rooms_per_split
    # one past the slice's last token: key-card entries beyond it are never read
    t_end = tl.minimum((first + rooms_per_split) * BLOCK_SIZE, seq_len)
    tok = tl.arange(0, TILE)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, D_P2], tl.float32)
    for t0 in range(first * BLOCK_SIZE, t_end, TILE):
        t = t0 + tok
        tmask = t < t_end
        r = t // BLOCK_SIZE  # the key-card entry of token t, and its bed in that room
        bed = t % BLOCK_SIZE
        room = tl.load(bt_ptr + seq * stride_bts + r * stride_btb, mask=tmask, other=0)
        room = room.to(tl.int64)
        kv_mask = tmask[:, None] & dmask[None, :]
        k = tl.load(
            k_ptr
            + room[:, None] * stride_kb
            + bed[:, None] * stride_kt
            + kvh * stride_kh
            + d[None, :] * stride_kd,
            mask=kv_mask,
            other=0.0,
        )
        v = tl.load(
            v_ptr
            + room[:, None] * stride_vb
            + bed[:, None] * stride_vt
            + kvh * stride_vh
            + d[None, :] * stride_vd,
            mask=kv_mask,
            other=0.0,
        )
        if LOW_PRECISION:
            scores = tl.dot(q, tl.trans(k))
        else:
            scores = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        # scores in log2 units (scale includes log2(e)), so exp2 does the exponentials
        scores = tl.where(tmask[None, :], scores * scale, float("-inf"))  # [BLOCK_H, TILE]
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        denom = denom * alpha + tl.sum(p, axis=1)
        if LOW_PRECISION:
            pv = tl.dot(p.to(v.dtype), v)
        else:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        acc = acc * alpha[:, None] + pv
        m = m_new
    if SPLIT:
        row = (seq * num_q_heads + heads) * num_splits + split  # [BLOCK_H]
        tl.store(part_acc_ptr + row[:, None] * D_P2 + d[None, :], acc, mask=hmask[:, None])
        tl.store(part_ml_ptr + row * 2, m, mask=hmask)
        tl.store(part_ml_ptr + row * 2 + 1, denom, mask=hmask)
    else:
        out = acc / denom[:, None]
        tl.store(
            out_ptr + seq * stride_os + heads[:, None] * stride_oh + d[None, :] * stride_od,
            out.to(out_ptr.dtype.element_ty),
            mask=hmask[:, None] & dmask[None, :],
        )


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
    """Combine the splits of one (sequence, query head) with log-sum-exp weights (maxima in log2
    units); a split that saw no room (max -inf) weighs nothing."""
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    s = tl.arange(0, SPLITS_P2)
    d = tl.arange(0, D_P2)
    smask = s < num_splits
    row = (seq * num_q_heads + head) * num_splits + s
    m = tl.load(part_ml_ptr + row * 2, mask=smask, other=float("-inf"))
    denom = tl.load(part_ml_ptr + row * 2 + 1, mask=smask, other=0.0)
    acc = tl.load(part_acc_ptr + row[:, None] * D_P2 + d[None, :], mask=smask[:, None], other=0.0)
    top = tl.max(m, axis=0)
    w = tl.where(smask & (m > float("-inf")), tl.exp2(m - top), 0.0)
    out = tl.sum(w[:, None] * acc, axis=0) / tl.sum(w * denom, axis=0)
    tl.store(
        out_ptr + seq * stride_os + head * stride_oh + d * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=d < HEAD_DIM,
    )


def tile_tokens(head_dim: int) -> int:
    """Tokens per loop step, whatever the room size (a room of 128 beds takes two steps): 64, or 32
    for head dims above 128, so a tile of K and V stays small enough for shared memory."""
    return TILE_TOKENS if head_dim <= 128 else TILE_TOKENS // 2


def choose_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, multiprocessors: int) -> int:
    """Split-K slices so a GPU with ``multiprocessors`` SMs gets about four programs per SM, with
    at least ``MIN_TOKENS_PER_SPLIT`` tokens in each slice: many splits for one long guest, one for
    a large batch."""
    programs = max(1, num_seqs * num_kv_heads)
    wanted = PROGRAMS_PER_MULTIPROCESSOR * multiprocessors // programs  # down: no partial wave
    return max(1, min(wanted, max_seq_len // MIN_TOKENS_PER_SPLIT, MAX_SPLITS))


def _check_launch_option(name: str, value, ok, allowed: str) -> None:
    """None means "choose for me"; anything else must be an int in the allowed range."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
    if not ok(value):
        raise ValueError(f"{name} must be {allowed} (or None), got {value}")


def _tensor_core_dtypes() -> tuple:
    """Types tl.dot multiplies in directly. The interpreter gets bf16 products wrong (NumPy has no
    bf16), so there bf16 takes the fp32 path; fp16 still exercises the low-precision one."""
    if kernel_mode() == "interpreter":
        return (torch.float16,)
    return (torch.float16, torch.bfloat16)


def _auto_splits(q, num_kv_heads: int, max_seq_len: int) -> int:
    if kernel_mode() == "interpreter" or q.device.type != "cuda":
        return 1  # the interpreter runs programs one after another: splitting only adds work
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    return choose_splits(q.shape[0], num_kv_heads, max_seq_len, sms)


def paged_decode_attention(
    q,
    k_cache,
    v_cache,
    block_tables,
    seq_lens,
    *,
    scale=None,
    num_splits=None,
    num_warps=None,
    num_stages=None,
) -> torch.Tensor:
    """Decode attention reading K/V rooms in place through block tables.

    q ``[num_seqs, num_q_heads, head_dim]`` (any strides); k/v_cache ``[num_blocks, block_size,
    num_kv_heads, head_dim]``; block_tables int32 ``[num_seqs, max_blocks]`` (entries past
    ceil(seq_len / block_size) are never read); seq_lens int32 ``[num_seqs]``. fp32 accumulation;
    returns ``[num_seqs, num_q_heads, head_dim]`` in q's dtype. ``num_splits`` > 1 splits each
    sequence's rooms across programs (flash-decoding); None chooses from the GPU's size.
    ``num_warps`` and ``num_stages`` (Triton's launch options; None = Triton's defaults) are for
    tuning on a GPU.
    """
    check_paged_inputs(q, k_cache, v_cache, block_tables, seq_lens)
    block_size = k_cache.shape[1]
    check_block_size(block_size)
    _check_launch_option(
        "num_splits", num_splits, lambda n: 1 <= n <= MAX_SPLITS, f"1..{MAX_SPLITS}"
    )
    _check_launch_option(
        "num_warps", num_warps, lambda n: n in (1, 2, 4, 8, 16, 32), "1, 2, 4 … 32"
    )
    _check_launch_option("num_stages", num_stages, lambda n: n >= 1, ">= 1")
    num_seqs, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if num_seqs == 0:
        return out
    max_seq_len = int(seq_lens.max())
    tile = tile_tokens(head_dim)
    rooms_per_tile = max(1, tile // block_size)
    rooms = math.ceil(max_seq_len / block_size)
    if num_splits is None:
        num_splits = _auto_splits(q, num_kv_heads, max_seq_len)
        rooms_per_split = math.ceil(math.ceil(rooms / num_splits) / rooms_per_tile) * rooms_per_tile
    else:  # as asked, down to single rooms: slices need not be whole tiles
        rooms_per_split = math.ceil(rooms / num_splits)
    num_splits = math.ceil(rooms / rooms_per_split)  # no split without a room to read
    group = num_q_heads // num_kv_heads
    d_p2 = max(16, pow2(head_dim))
    low_precision = q.dtype == k_cache.dtype == v_cache.dtype and q.dtype in _tensor_core_dtypes()
    split = num_splits > 1
    rows = num_seqs * num_q_heads * num_splits if split else 1
    part_acc = torch.empty(rows, d_p2, dtype=torch.float32, device=q.device)
    part_ml = torch.empty(rows, 2, dtype=torch.float32, device=q.device)
    paged_decode_tiled_kernel[(num_seqs, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        part_acc,
        part_ml,
        *q.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        *block_tables.stride(),
        *out.stride(),
        LOG2E * (1.0 / math.sqrt(head_dim) if scale is None else float(scale)),
        rooms_per_split,
        num_splits,
        num_q_heads,
        GROUP=group,
        BLOCK_H=max(16, pow2(group)),
        BLOCK_SIZE=block_size,
        TILE=tile,
        HEAD_DIM=head_dim,
        D_P2=d_p2,
        LOW_PRECISION=low_precision,
        SPLIT=split,
        **{
            k: v for k, v in (("num_warps", num_warps), ("num_stages", num_stages)) if v is not None
        },
    )
    if split:
        merge_splits_kernel[(num_seqs, num_q_heads)](
            part_acc,
            part_ml,
            out,
            *out.stride(),
            num_splits,
            num_q_heads,
            SPLITS_P2=pow2(num_splits),
            HEAD_DIM=head_dim,
            D_P2=d_p2,
        )
    return out
