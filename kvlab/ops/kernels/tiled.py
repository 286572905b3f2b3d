"""kvlab's fast paged decode attention: the Lab 05 kernel with the two steps towards production
speed that the lab names, plus split-K.

- **Tiles of several rooms.** Each loop step gathers ``tile`` tokens (64 by default) from as many
  rooms as that takes, so small rooms (block_size 1–8) do not mean tiny loads, and each program
  keeps more bytes in flight.
- **Tensor cores.** The group's query heads are padded to 16 rows so that scores and outputs are
  ``tl.dot`` products. fp16/bf16 inputs multiply in their own type with fp32 accumulation (softmax
  weights are rounded to that type for the second product, as FlashAttention does); fp32 inputs
  use exact fp32 products (``input_precision="ieee"``), never TF32.
- **Split-K (flash-decoding).** Program ``(sequence, KV head, split)`` folds one slice of the
  sequence's tokens and stores its partial output with the slice's max and sum;
  ``merge_splits_kernel`` combines them with log-sum-exp weights. Slices and tiles start at token
  counts, never at room boundaries, so the same tokens give the same bits whatever the block size.

The launcher follows Triton's tutorials: check the inputs, plan the launch (``launch_config``,
``plan_splits``), allocate, launch. Its defaults live in ``LAUNCH_DEFAULTS`` below, set from the
GPU sweep (``python -m kvlab.perf.bench attention-sweep``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from kvlab.ops.attention import check_paged_inputs
from kvlab.ops.kernels.dtypes import BF16_MIN_ARCH, gpu_arch, store_dtype, tensor_core_dtypes
from kvlab.ops.kernels.online_softmax import fold_tile, tile_scores
from kvlab.ops.kernels.sizes import pow2, strides
from kvlab.ops.kernels.slots import load_kv_tile, token_slots
from kvlab.ops.runtime import kernel_mode


@dataclass(frozen=True)
class LaunchConfig:
    """How ``paged_decode_attention`` launches when the call does not say otherwise."""

    tile: int = 64  # tokens per loop step, from as many rooms as that takes
    num_warps: int = 4
    num_stages: int = 3
    # read the next tile's key-card entries one step early: the K/V loads then depend on no load
    # of their own step, and Triton's pipeliner gives them num_stages - 1 buffers (else one)
    prefetch_table: bool = False


# The defaults, by (largest head_dim, bytes per element): the first row that fits is used, and a
# head_dim above every row takes the last row of its element size. Change them here, from the
# ranked table of the GPU sweep. Larger heads take smaller tiles, so K and V fit shared memory.
LAUNCH_DEFAULTS = {
    (128, 2): LaunchConfig(tile=64, num_warps=4, num_stages=2, prefetch_table=True),
    (128, 4): LaunchConfig(tile=64, num_warps=4, num_stages=3),
    (256, 2): LaunchConfig(tile=32, num_warps=4, num_stages=3),
    (256, 4): LaunchConfig(tile=32, num_warps=4, num_stages=3),
}
# Rows that differ on GPUs before sm_80 (a T4 gives a program 64 KB of shared memory, an A100
# 163 KB, an H100 227 KB): fp32 tiles half as long.
PRE_AMPERE_DEFAULTS = {
    (128, 4): LaunchConfig(tile=32, num_warps=4, num_stages=2),
    (256, 4): LaunchConfig(tile=16, num_warps=4, num_stages=2),
}
# Split-K when num_splits is None: about this many programs per multiprocessor, no slice shorter
# than MIN_TOKENS_PER_SPLIT; at most MAX_SPLITS (the merge kernel holds every split of a head).
PROGRAMS_PER_MULTIPROCESSOR = 4
MIN_TOKENS_PER_SPLIT = 256
MAX_SPLITS = 128
TILES = (16, 32, 64, 128, 256)  # tl.dot needs 16 or more along each axis
LOG2E = 1.4426950408889634


# the split plan changes with the batch: no recompile for each new slice length or count
@triton.jit(do_not_specialize=["tokens_per_split", "num_splits"])
def paged_decode_tiled_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, out_ptr, part_acc_ptr, part_ml_ptr,
    stride_qs, stride_qh, stride_qd,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    stride_bts, stride_btb,
    stride_os, stride_oh, stride_od,
    scale, tokens_per_split, num_splits, num_q_heads,
    GROUP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_P2: tl.constexpr,
    LOW_PRECISION: tl.constexpr, SPLIT: tl.constexpr, PREFETCH_TABLE: tl.constexpr,
):  # fmt: skip
    """Program (sequence, KV head, split): the group's query heads against one slice of tokens."""
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
    if LOW_PRECISION:
        q = q.to(k_ptr.dtype.element_ty)
    else:
        q = q.to(tl.float32)
    table = bt_ptr + seq * stride_bts
    first = split * tokens_per_split
    t_end = tl.minimum(first + tokens_per_split, tl.load(lens_ptr + seq))  # the slice's end
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
        # scores in log2 units (scale includes log2(e)), so exp2 does the exponentials
        scores = tl.where(tmask[None, :], tile_scores(q, k, LOW_PRECISION) * scale, float("-inf"))
        acc, m, denom = fold_tile(acc, m, denom, scores, v, LOW_PRECISION)
        if PREFETCH_TABLE:
            slot = slot_next
    store_heads(
        acc, m, denom, out_ptr, part_acc_ptr, part_ml_ptr, seq, heads, hmask, d, dmask, split,
        num_splits, num_q_heads, stride_os, stride_oh, stride_od, D_P2, SPLIT,
    )  # fmt: skip


@triton.jit
def store_heads(
    acc, m, denom, out_ptr, part_acc_ptr, part_ml_ptr, seq, heads, hmask, d, dmask, split,
    num_splits, num_q_heads, stride_os, stride_oh, stride_od,
    D_P2: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """A program's result for its group of query heads: the slice's partial output with its max
    and sum for ``merge_splits_kernel`` (``SPLIT``), else the output itself."""
    if SPLIT:
        row = (seq * num_q_heads + heads) * num_splits + split  # [BLOCK_H]
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


@triton.jit(do_not_specialize=["num_splits"])
def merge_splits_kernel(
    part_acc_ptr, part_ml_ptr, out_ptr,
    stride_os, stride_oh, stride_od,
    num_splits, num_q_heads,
    SPLITS_P2: tl.constexpr, HEAD_DIM: tl.constexpr, D_P2: tl.constexpr,
):  # fmt: skip
    """Combine the splits of one (sequence, query head) with log-sum-exp weights (maxima in log2
    units); a split that saw no token (max -inf) weighs nothing."""
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
    out_offsets = seq * stride_os + head * stride_oh + d * stride_od
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


# --- planning the launch -------------------------------------------------------------------------


def launch_defaults(head_dim: int, dtype: torch.dtype, arch: int | None = None) -> LaunchConfig:
    """The row of ``LAUNCH_DEFAULTS`` (or, before sm_80, ``PRE_AMPERE_DEFAULTS``) for this head
    size and element type; ``arch`` None means the GPU kernels are compiled for, if any."""
    arch = gpu_arch() if arch is None else arch
    size = torch.empty((), dtype=dtype).element_size()
    size = size if any(nbytes == size for _, nbytes in LAUNCH_DEFAULTS) else 2
    rows = sorted(
        (dim, config) for (dim, nbytes), config in LAUNCH_DEFAULTS.items() if nbytes == size
    )
    dim = next((dim for dim, _ in rows if head_dim <= dim), rows[-1][0])
    if arch is not None and arch < BF16_MIN_ARCH and (dim, size) in PRE_AMPERE_DEFAULTS:
        return PRE_AMPERE_DEFAULTS[(dim, size)]
    return LAUNCH_DEFAULTS[(dim, size)]


def tile_tokens(head_dim: int, dtype: torch.dtype = torch.bfloat16) -> int:
    """Tokens per loop step by default, whatever the room size (a room of 128 beds takes two
    steps of 64)."""
    return launch_defaults(head_dim, dtype).tile


def launch_config(
    head_dim, dtype, *, tile=None, num_warps=None, num_stages=None, prefetch_table=None
):
    """The defaults for this shape with the caller's choices on top (None keeps a default)."""
    _check_option("tile", tile, lambda n: n in TILES, ", ".join(map(str, TILES)))
    _check_option("num_warps", num_warps, lambda n: n in (1, 2, 4, 8, 16, 32), "1, 2, 4 … 32")
    _check_option("num_stages", num_stages, lambda n: n >= 1, ">= 1")
    if prefetch_table is not None and not isinstance(prefetch_table, bool):
        raise TypeError(f"prefetch_table must be True, False or None, got {prefetch_table!r}")
    chosen = {
        "tile": tile,
        "num_warps": num_warps,
        "num_stages": num_stages,
        "prefetch_table": prefetch_table,
    }
    return replace(
        launch_defaults(head_dim, dtype), **{k: v for k, v in chosen.items() if v is not None}
    )


class SplitPlan(NamedTuple):
    """How each sequence's tokens are cut across programs: slice i holds tokens
    ``[i * tokens_per_split, (i + 1) * tokens_per_split)``."""

    num_splits: int
    tokens_per_split: int


def choose_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, multiprocessors: int) -> int:
    """Split-K slices so a GPU with ``multiprocessors`` SMs gets about
    ``PROGRAMS_PER_MULTIPROCESSOR`` programs per SM, with at least ``MIN_TOKENS_PER_SPLIT``
    tokens in each slice: many splits for one long guest, one for a large batch."""
    programs = max(1, num_seqs * num_kv_heads)
    wanted = PROGRAMS_PER_MULTIPROCESSOR * multiprocessors // programs  # down: no partial wave
    return max(1, min(wanted, max_seq_len // MIN_TOKENS_PER_SPLIT, MAX_SPLITS))


def plan_splits(
    num_seqs, num_kv_heads, max_seq_len, tile, num_splits=None, multiprocessors=None
) -> SplitPlan:
    """Slices of the longest sequence's tokens: ``num_splits`` as asked (slices of
    ceil(max_seq_len / num_splits) tokens), or, for None, ``choose_splits`` on a GPU of
    ``multiprocessors`` SMs rounded to whole tiles (one slice without a GPU: the interpreter runs
    programs one after another). Cuts are token counts, so they do not depend on the block size."""
    if num_splits is None:
        wanted = 1
        if multiprocessors:
            wanted = choose_splits(num_seqs, num_kv_heads, max_seq_len, multiprocessors)
        tokens = math.ceil(math.ceil(max_seq_len / wanted) / tile) * tile
    else:
        tokens = math.ceil(max_seq_len / num_splits)
    return SplitPlan(math.ceil(max_seq_len / tokens), tokens)  # no split without a token


def _multiprocessors(device) -> int | None:
    if kernel_mode() == "interpreter" or device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).multi_processor_count


def _check_option(name: str, value, ok, allowed: str) -> None:
    """None means "choose for me"; anything else must be an int in the allowed range."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
    if not ok(value):
        raise ValueError(f"{name} must be {allowed} (or None), got {value}")


# --- the launcher ----------------------------------------------------------------------------------


def paged_decode_attention(
    q, k_cache, v_cache, block_tables, seq_lens, *, scale=None, num_splits=None, tile=None,
    num_warps=None, num_stages=None, prefetch_table=None,
) -> torch.Tensor:  # fmt: skip
    """Decode attention reading K/V rooms in place through block tables.

    q ``[num_seqs, num_q_heads, head_dim]``; k/v_cache ``[num_blocks, block_size, num_kv_heads,
    head_dim]`` (any block size, any strides); block_tables int32 ``[num_seqs, max_blocks]``
    (entries past ceil(seq_len / block_size) are never read); seq_lens int32 ``[num_seqs]``. fp32
    accumulation; returns ``[num_seqs, num_q_heads, head_dim]`` in q's dtype. ``num_splits`` > 1
    cuts each sequence's tokens across programs (flash-decoding); None chooses from the GPU.
    ``tile``, ``num_warps``, ``num_stages`` and ``prefetch_table`` override ``LAUNCH_DEFAULTS``
    (see ``LaunchConfig``), for tuning on a GPU.
    """
    return prepare_paged_decode(
        q, k_cache, v_cache, block_tables, seq_lens, scale=scale, num_splits=num_splits,
        tile=tile, num_warps=num_warps, num_stages=num_stages, prefetch_table=prefetch_table,
    )()  # fmt: skip


def prepare_paged_decode(
    q, k_cache, v_cache, block_tables, seq_lens, *, scale=None, num_splits=None, tile=None,
    num_warps=None, num_stages=None, prefetch_table=None,
):  # fmt: skip
    """Check the inputs, plan the launch and allocate once; return ``run()``, which only launches
    (FlashInfer's plan / run). The checks read ``seq_lens`` back from the GPU, a wait a server
    does not pay each step and a benchmark must not time. Each ``run()`` writes the same output
    tensor and returns it. Arguments as for :func:`paged_decode_attention`."""
    check_paged_inputs(q, k_cache, v_cache, block_tables, seq_lens)
    low_precision = q.dtype == k_cache.dtype == v_cache.dtype and q.dtype in tensor_core_dtypes()
    return prepare_decode_launch(
        paged_decode_tiled_kernel, q, (k_cache, v_cache), block_tables, seq_lens,
        low_precision=low_precision, scale=scale, num_splits=num_splits, tile=tile,
        num_warps=num_warps, num_stages=num_stages, prefetch_table=prefetch_table,
    )  # fmt: skip


def prepare_decode_launch(
    kernel, q, caches, block_tables, seq_lens, *, low_precision, scale=None, num_splits=None,
    tile=None, num_warps=None, num_stages=None, prefetch_table=None,
):  # fmt: skip
    """Plan and allocate once for a decode kernel of this module's shape (program (sequence, KV
    head, split), split-K merged by ``merge_splits_kernel``) and return ``run()``. ``caches``:
    the tensors the kernel reads beside q, K's first (``[num_blocks, block_size, kv_heads,
    ...]``); they and their strides are passed in that order. The inputs are checked already."""
    _check_option("num_splits", num_splits, lambda n: 1 <= n <= MAX_SPLITS, f"1..{MAX_SPLITS}")
    num_seqs, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads = caches[0].shape[:3]
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
            kernel[(num_seqs, num_kv_heads, plan.num_splits)](
                q, *caches, block_tables, seq_lens, out, part_acc, part_ml,
                *strides(q, *caches, block_tables, out),
                LOG2E * scale, plan.tokens_per_split, plan.num_splits, num_q_heads,
                GROUP=group, BLOCK_H=max(16, pow2(group)), BLOCK_SIZE=block_size,
                TILE=config.tile, HEAD_DIM=head_dim, D_P2=d_p2,
                LOW_PRECISION=low_precision, SPLIT=split, PREFETCH_TABLE=config.prefetch_table,
                num_warps=config.num_warps, num_stages=config.num_stages,
            )  # fmt: skip
        except OutOfResources as error:
            raise _too_large(error, config) from None
        if split:
            merge_splits_kernel[(num_seqs, num_q_heads)](
                part_acc, part_ml, out, *strides(out), plan.num_splits, num_q_heads,
                SPLITS_P2=pow2(plan.num_splits), HEAD_DIM=head_dim, D_P2=d_p2,
            )  # fmt: skip
        return out.to(q.dtype)  # rounds to nearest even where the kernel stored fp32

    return run


def _too_large(error: OutOfResources, config: LaunchConfig) -> ValueError:
    """Triton's launch refusal, said in the launcher's terms."""
    prefetch = ", prefetch_table=True" if config.prefetch_table else ""
    return ValueError(
        f"tile={config.tile}, num_stages={config.num_stages}{prefetch} need {error.required:,} "
        f"bytes of {error.name} per program and this GPU (sm_{gpu_arch()}) has {error.limit:,}: "
        "choose a smaller tile or fewer stages (LAUNCH_DEFAULTS fits every GPU from sm_75 on)"
    )
