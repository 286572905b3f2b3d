"""kvlab's fast paged prefill attention: a step's chunks (and decodes) in one launch, read in
place through the key cards (the kernel Lab 09 builds towards; vLLM v1's unified attention does
the same job).

The queries are packed varlen, as vLLM packs a step: chunk b is rows ``query_start_loc[b] ..
query_start_loc[b + 1] - 1`` of q, the positions ``num_computed[b] ..`` of sequence b, and the
cache already holds the chunk's own K/V. Each query attends to everything cached before its
chunk and causally to the chunk.

- **Grid: (tile of one chunk's queries, KV head).** A program takes ``tile_q`` consecutive
  positions of one chunk and *all* the query heads that share its KV head (GQA), as rows of one
  matrix: row ``r`` is position ``r // GROUP``, head ``r % GROUP``. Every K/V tile it reads is
  then used by the whole group: with 4 query heads per KV head the cache is read 4 times less
  than with a program per query head, and the products are ``tile_q * GROUP`` rows tall, so a
  decode (a chunk of 1) still fills GROUP rows of the tensor cores. The work list (which chunk,
  which first position) is built by the launcher, longest tiles first, so the programs that walk
  the longest prefixes start in the first wave.
- **Key tiles through the key card.** Each loop step reads ``tile_k`` tokens from as many rooms
  as that takes (any block size, any strides), so no room boundary shapes the loop.
- **The causal mask only on the diagonal.** Keys before ``num_computed + first position + 1``
  are seen by every row of the tile: those tiles run without a mask. The tiles that overlap the
  chunk's diagonal run a second loop with the mask ``key <= num_computed + position``. Keys past
  the tile's last query are never loaded, nor the key-card entries past the sequence's tokens.
- **Online softmax in fp32** (scores in log2 units, ``exp2``), ``tl.dot`` for QK^T and PV:
  fp16/bf16 on tensor cores with fp32 accumulation (softmax weights rounded to the V type for
  the second product, as FlashAttention does); fp32 with exact products
  (``input_precision="ieee"``), never TF32. Where Triton has no bf16 (its interpreter, GPUs
  before sm_80), bf16 takes the fp32 path and the launcher rounds the result (``dtypes``).
- **Head dims that are not a power of two** are padded to the next one (16 at least) with masks.

Launch defaults per (head_dim, bytes multiplied) and per GPU generation live in
``PREFILL_DEFAULTS`` / ``PREFILL_PRE_AMPERE_DEFAULTS``; the compile test checks that each fits the
shared memory of sm_90, sm_80 and sm_75.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from kvlab.ops.attention import check_prefill_inputs
from kvlab.ops.kernels.dtypes import BF16_MIN_ARCH, gpu_arch, store_dtype, tensor_core_dtypes
from kvlab.ops.kernels.online_softmax import fold_tile, tile_scores
from kvlab.ops.kernels.sizes import pow2, strides
from kvlab.ops.kernels.slots import load_kv_tile, token_slots

LOG2E = 1.4426950408889634
TILES_K = (16, 32, 64, 128)  # tl.dot needs 16 or more along each axis
ROWS = (16, 32, 64, 128, 256)


@dataclass(frozen=True)
class PrefillConfig:
    """How ``paged_prefill_attention`` launches when the call does not say otherwise."""

    rows: int = 128  # query rows per program: tile_q positions x the group's query heads
    tile_k: int = 64  # keys per loop step, from as many rooms as that takes
    num_warps: int = 4
    num_stages: int = 2

    def tile_q(self, group: int) -> int:
        """Positions of one chunk per program for ``group`` query heads per KV head."""
        return max(1, self.rows // group)


# By (largest head_dim, bytes per multiplied element): the first row that fits is used, a head
# above every row takes the last row of its size. fp16/bf16 multiply in 2 bytes from sm_80 on
# (fp16 on sm_75 too); fp32, and bf16 where Triton has no bf16, in 4. Not yet swept on a GPU:
# sized so that Q, and K and V twice over (num_stages=2), fit each chip's shared memory with
# room to spare (tests/ops/test_kernels_compile.py measures it).
PREFILL_DEFAULTS = {
    (128, 2): PrefillConfig(rows=128, tile_k=64, num_warps=8, num_stages=2),
    (128, 4): PrefillConfig(rows=64, tile_k=32, num_warps=4, num_stages=2),
    (256, 2): PrefillConfig(rows=64, tile_k=32, num_warps=4, num_stages=2),
    (256, 4): PrefillConfig(rows=32, tile_k=16, num_warps=4, num_stages=2),
}
# Before sm_80 (a T4: 64 KB of shared memory per program, no tensor cores for Triton).
PREFILL_PRE_AMPERE_DEFAULTS = {
    (128, 2): PrefillConfig(rows=64, tile_k=32, num_warps=4, num_stages=1),
    (128, 4): PrefillConfig(rows=32, tile_k=16, num_warps=4, num_stages=1),
    (256, 2): PrefillConfig(rows=32, tile_k=16, num_warps=4, num_stages=1),
    (256, 4): PrefillConfig(rows=16, tile_k=16, num_warps=4, num_stages=1),
}


@triton.jit
def _attend_key_tile(
    acc, m, denom, q, t0, kv_end, limit, table, k_ptr, v_ptr, kvh, d, dmask,
    stride_btb, stride_kb, stride_kt, stride_kh, stride_kd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    scale,
    BLOCK_SIZE: tl.constexpr, TILE_K: tl.constexpr, LOW_PRECISION: tl.constexpr,
    CAUSAL: tl.constexpr,
):  # fmt: skip
    """Fold keys ``t0 .. t0 + TILE_K - 1`` (none at or past ``kv_end`` is read) into the running
    softmax of every row; with CAUSAL, row r sees only keys ``<= limit[r]``."""
    t = t0 + tl.arange(0, TILE_K)
    tmask = t < kv_end
    slot = token_slots(table, stride_btb, t, tmask, BLOCK_SIZE)
    k, v = load_kv_tile(
        k_ptr, v_ptr, slot, kvh, d, tmask[:, None] & dmask[None, :],
        stride_kb, stride_kt, stride_kh, stride_kd, stride_vb, stride_vt, stride_vh, stride_vd,
        BLOCK_SIZE,
    )  # fmt: skip
    scores = tile_scores(q, k, LOW_PRECISION) * scale  # [rows, TILE_K], log2 units
    if CAUSAL:  # keys past kv_end are past every row's limit too
        scores = tl.where(t[None, :] <= limit[:, None], scores, float("-inf"))
    return fold_tile(acc, m, denom, scores, v, LOW_PRECISION)  # every row saw key 0 by now


@triton.jit
def paged_prefill_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, starts_ptr, computed_ptr, tiles_ptr, out_ptr,
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_kt, stride_kh, stride_kd,
    stride_vb, stride_vt, stride_vh, stride_vd,
    stride_bts, stride_btb,
    stride_ot, stride_oh, stride_od,
    scale,
    GROUP: tl.constexpr, TILE_Q: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_K: tl.constexpr, HEAD_DIM: tl.constexpr, D_P2: tl.constexpr,
    LOW_PRECISION: tl.constexpr,
):  # fmt: skip
    """Program (work item, KV head): positions ``q0 .. q0 + TILE_Q - 1`` of one chunk, for every
    query head of the KV head's group, against the sequence's keys up to the tile's last query."""
    item = tl.program_id(0)
    kvh = tl.program_id(1)
    seq = tl.load(tiles_ptr + 2 * item).to(tl.int64)
    q0 = tl.load(tiles_ptr + 2 * item + 1)  # the tile's first position within its chunk
    begin = tl.load(starts_ptr + seq)  # the chunk's first row of q
    chunk_len = tl.load(starts_ptr + seq + 1) - begin
    cached = tl.load(computed_ptr + seq)
    last = tl.minimum(q0 + TILE_Q, chunk_len) - 1  # the tile's last position
    r = tl.arange(0, BLOCK_M)
    position = q0 + r // GROUP
    rmask = (r < TILE_Q * GROUP) & (position <= last)
    position = tl.minimum(position, last)  # padding rows repeat the last one (never stored)
    heads = kvh * GROUP + r % GROUP
    d = tl.arange(0, D_P2)
    dmask = d < HEAD_DIM
    rows = (begin + position).to(tl.int64)
    q = tl.load(
        q_ptr + rows[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :] * stride_qd,
        mask=dmask[None, :],
        other=0.0,
    )
    if LOW_PRECISION:
        q = q.to(k_ptr.dtype.element_ty)
    else:
        q = q.to(tl.float32)
    table = bt_ptr + seq * stride_bts
    limit = cached + position  # row r sees keys 0 .. limit[r]
    kv_end = cached + last + 1  # past the tile's last query: never read
    seen_by_all = (cached + q0 + 1) // TILE_K * TILE_K  # whole key tiles every row sees
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_P2], tl.float32)
    for t0 in range(0, seen_by_all, TILE_K):  # the cached prefix: no mask
        acc, m, denom = _attend_key_tile(
            acc, m, denom, q, t0, kv_end, limit, table, k_ptr, v_ptr, kvh, d, dmask,
            stride_btb, stride_kb, stride_kt, stride_kh, stride_kd,
            stride_vb, stride_vt, stride_vh, stride_vd, scale,
            BLOCK_SIZE, TILE_K, LOW_PRECISION, False,
        )  # fmt: skip
    for t0 in range(seen_by_all, kv_end, TILE_K):  # tiles on the chunk's diagonal
        acc, m, denom = _attend_key_tile(
            acc, m, denom, q, t0, kv_end, limit, table, k_ptr, v_ptr, kvh, d, dmask,
            stride_btb, stride_kb, stride_kt, stride_kh, stride_kd,
            stride_vb, stride_vt, stride_vh, stride_vd, scale,
            BLOCK_SIZE, TILE_K, LOW_PRECISION, True,
        )  # fmt: skip
    out = acc / denom[:, None]
    out_offsets = rows[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :] * stride_od
    tl.store(
        out_ptr + out_offsets,
        out.to(out_ptr.dtype.element_ty),
        mask=rmask[:, None] & dmask[None, :],
    )


# --- planning the launch -------------------------------------------------------------------------


def _multiplies_in_16_bits(dtype: torch.dtype) -> bool:
    return dtype in tensor_core_dtypes()


def prefill_launch_defaults(
    head_dim: int, dtype: torch.dtype, arch: int | None = None
) -> PrefillConfig:
    """The row of ``PREFILL_DEFAULTS`` (before sm_80: ``PREFILL_PRE_AMPERE_DEFAULTS``) for this
    head size and the element size the kernel multiplies in; ``arch`` None means the GPU kernels
    are compiled for, if any (the interpreter takes the sm_80+ rows)."""
    arch = gpu_arch() if arch is None else arch
    if arch is None or arch >= BF16_MIN_ARCH:
        size = 2 if dtype in (torch.float16, torch.bfloat16) else 4
    else:
        size = 2 if dtype == torch.float16 else 4  # bf16 takes the fp32 path before sm_80
    table = PREFILL_DEFAULTS
    if arch is not None and arch < BF16_MIN_ARCH:
        table = PREFILL_PRE_AMPERE_DEFAULTS
    dims = sorted(dim for dim, nbytes in table if nbytes == size)
    dim = next((dim for dim in dims if head_dim <= dim), dims[-1])
    return table[(dim, size)]


def prefill_launch_config(
    head_dim, dtype, group=1, *, tile_q=None, tile_k=None, num_warps=None, num_stages=None,
    arch=None,
) -> PrefillConfig:  # fmt: skip
    """The defaults for this shape with the caller's choices on top (None keeps a default);
    ``tile_q`` (positions per program) sets ``rows`` to ``tile_q * group``."""
    _check_option("tile_q", tile_q, lambda n: 1 <= n <= 256, "1..256")
    _check_option("tile_k", tile_k, lambda n: n in TILES_K, ", ".join(map(str, TILES_K)))
    _check_option("num_warps", num_warps, lambda n: n in (1, 2, 4, 8, 16, 32), "1, 2, 4 … 32")
    _check_option("num_stages", num_stages, lambda n: n >= 1, ">= 1")
    chosen = {"tile_k": tile_k, "num_warps": num_warps, "num_stages": num_stages}
    if tile_q is not None:
        chosen["rows"] = tile_q * group
    return replace(
        prefill_launch_defaults(head_dim, dtype, arch),
        **{k: v for k, v in chosen.items() if v is not None},
    )


def prefill_work(lengths, computed, tile_q: int) -> list[tuple[int, int]]:
    """The programs' work list: ``(sequence, first position in its chunk)`` for every tile of
    ``tile_q`` positions, the tiles with the most keys first (they run longest, so they start in
    the first wave, and the short ones fill in behind them)."""
    work = [
        (c + min(q0 + tile_q, n), b, q0)
        for b, (n, c) in enumerate(zip(lengths, computed, strict=True))
        for q0 in range(0, n, tile_q)
    ]
    work.sort(key=lambda w: -w[0])
    return [(b, q0) for _, b, q0 in work]


def _check_option(name: str, value, ok, allowed: str) -> None:
    """None means "choose for me"; anything else must be an int in the allowed range."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
    if not ok(value):
        raise ValueError(f"{name} must be {allowed} (or None), got {value}")


# --- the launcher ----------------------------------------------------------------------------------


def paged_prefill_attention(
    q, k_cache, v_cache, block_tables, query_start_loc, num_computed, *, scale=None,
    tile_q=None, tile_k=None, num_warps=None, num_stages=None,
) -> torch.Tensor:  # fmt: skip
    """Attention for a step of prefill chunks and decodes, reading K/V rooms in place.

    q ``[num_tokens, num_q_heads, head_dim]``, packed varlen: chunk b is rows
    ``query_start_loc[b] .. query_start_loc[b + 1] - 1`` (int32 ``[num_seqs + 1]``), positions
    ``num_computed[b] ..`` (int32 ``[num_seqs]``) of sequence b; k/v_cache ``[num_blocks,
    block_size, num_kv_heads, head_dim]`` (any block size, any strides) hold every sequence's
    first ``num_computed + chunk`` tokens in the rooms its row of ``block_tables`` (int32
    ``[num_seqs, max_blocks]``) lists. Each query attends to its sequence's cached tokens and
    causally to its chunk, as :func:`kvlab.ops.attention.paged_prefill_attention_ref`. fp32
    accumulation; returns ``[num_tokens, num_q_heads, head_dim]`` in q's dtype. ``tile_q``
    (positions per program), ``tile_k`` (keys per loop step), ``num_warps`` and ``num_stages``
    override ``PREFILL_DEFAULTS``, for tuning on a GPU.
    """
    return prepare_paged_prefill(
        q, k_cache, v_cache, block_tables, query_start_loc, num_computed, scale=scale,
        tile_q=tile_q, tile_k=tile_k, num_warps=num_warps, num_stages=num_stages,
    )()  # fmt: skip


def prepare_paged_prefill(
    q, k_cache, v_cache, block_tables, query_start_loc, num_computed, *, scale=None,
    tile_q=None, tile_k=None, num_warps=None, num_stages=None,
):  # fmt: skip
    """Check the inputs, build the work list and allocate once; return ``run()``, which only
    launches (as :func:`kvlab.ops.kernels.prepare_paged_decode`). The checks and the work list
    read ``query_start_loc`` and ``num_computed`` back from the GPU, a wait a benchmark must not
    time. Each ``run()`` writes the same output tensor and returns it; it reads new queries and
    K/V, but a new step (other chunks) needs a new ``prepare``."""
    lengths, computed = check_prefill_inputs(
        q, k_cache, v_cache, block_tables, query_start_loc, num_computed
    )
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    config = prefill_launch_config(
        head_dim, q.dtype, group, tile_q=tile_q, tile_k=tile_k, num_warps=num_warps,
        num_stages=num_stages,
    )  # fmt: skip
    tq = config.tile_q(group)
    out = torch.empty(q.shape, dtype=store_dtype(q.dtype), device=q.device)
    work = prefill_work(lengths, computed, tq)
    if not work:
        return lambda: out.to(q.dtype)
    tiles = torch.tensor(work, dtype=torch.int32, device=q.device)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    low_precision = q.dtype == k_cache.dtype == v_cache.dtype and _multiplies_in_16_bits(q.dtype)

    def run() -> torch.Tensor:
        try:
            paged_prefill_kernel[(len(work), num_kv_heads)](
                q, k_cache, v_cache, block_tables, query_start_loc, num_computed, tiles, out,
                *strides(q, k_cache, v_cache, block_tables, out),
                LOG2E * scale,
                GROUP=group, TILE_Q=tq, BLOCK_M=max(16, pow2(tq * group)),
                BLOCK_SIZE=k_cache.shape[1], TILE_K=config.tile_k, HEAD_DIM=head_dim,
                D_P2=max(16, pow2(head_dim)), LOW_PRECISION=low_precision,
                num_warps=config.num_warps, num_stages=config.num_stages,
            )  # fmt: skip
        except OutOfResources as error:
            raise _too_large(error, config, tq) from None
        return out.to(q.dtype)  # rounds to nearest even where the kernel stored fp32

    return run


def _too_large(error: OutOfResources, config: PrefillConfig, tile_q: int) -> ValueError:
    """Triton's launch refusal, said in the launcher's terms."""
    return ValueError(
        f"tile_q={tile_q} ({config.rows} rows), tile_k={config.tile_k}, "
        f"num_stages={config.num_stages} need {error.required:,} bytes of {error.name} per "
        f"program and this GPU (sm_{gpu_arch()}) has {error.limit:,}: choose smaller tiles or "
        "fewer stages (PREFILL_DEFAULTS fits every GPU from sm_75 on)"
    )
