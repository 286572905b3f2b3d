"""Lab 09's chunk launchers in the learner's process under ``kvlab grade`` (copies of
:mod:`kvlab.grading.lab09.chunk`'s, which is hidden there with the checks)."""

from __future__ import annotations

import math

import torch

from kvlab.ops.kernels.sizes import pow2
from kvlab.ops.runtime import kernel_mode

BLOCK_Q = 4  # query rows per program of the kernel, as the checks launch it


def _unwrap_unimplemented(error):
    from kvlab.grading.blame import exception_chain

    for seen in exception_chain(error):
        if isinstance(seen, NotImplementedError) or "NotImplementedError" in repr(seen):
            raise NotImplementedError from error


def make_chunk_case(
    num_computed: int,
    n: int,
    block_size: int = 4,
    q_heads: int = 2,
    kv_heads: int = 1,
    head_dim: int = 8,
    seed: int = 0,
    garbage: float = math.nan,
    dtype: torch.dtype = torch.float32,
):
    """(q, k_cache, v_cache, block_table, num_computed) for one guest: ``n`` queries at positions
    ``num_computed ..``, K/V of the positions before ``num_computed + n`` in scattered rooms, one
    padding entry, and ``garbage`` in every bed that holds no token of the guest; q and the
    caches in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    total = num_computed + n
    rooms = -(-total // block_size)
    num_blocks = rooms + 3
    k_cache = torch.full((num_blocks, block_size, kv_heads, head_dim), garbage)
    v_cache = torch.full_like(k_cache, garbage)
    table = torch.randperm(num_blocks, generator=g)[: rooms + 1].to(torch.int32)
    k = torch.randn(total, kv_heads, head_dim, generator=g)
    v = torch.randn(total, kv_heads, head_dim, generator=g)
    for pos in range(total):
        room = int(table[pos // block_size])
        k_cache[room, pos % block_size], v_cache[room, pos % block_size] = k[pos], v[pos]
    q = torch.randn(n, q_heads, head_dim, generator=g)
    return q.to(dtype), k_cache.to(dtype), v_cache.to(dtype), table, num_computed


def launch_chunk_kernel(kernel, q, k_cache, v_cache, block_table, num_computed, out=None):
    """Run a kernel with Lab 09's chunk-kernel signature on the grid (ceil(n / BLOCK_Q),
    q_heads) and return its output ``[n, q_heads, head_dim]``."""
    n, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    if out is None:
        out = torch.full_like(q, math.nan)
    if n:
        kernel[(-(-n // BLOCK_Q), q_heads)](
            q, k_cache, v_cache, block_table, out,
            q.stride(0), q.stride(1), q.stride(2),
            *k_cache.stride(), *v_cache.stride(),
            block_table.stride(0),
            out.stride(0), out.stride(1), out.stride(2),
            int(num_computed), n, 1.0 / math.sqrt(head_dim),
            GROUP=q_heads // kv_heads, BLOCK_Q=BLOCK_Q, BLOCK_SIZE=k_cache.shape[1],
            HEAD_DIM=head_dim, D_P2=pow2(head_dim),
        )  # fmt: skip
    return out


def launch_isolated(fn, *case, timeout: float = 60.0):
    """``launch_chunk_kernel(fn, *case)`` for a notebook cell, isolated as the checks are (in
    Triton's interpreter, in a forked child): ``(output, None)`` or ``(None, what went wrong)``."""
    from kvlab.grading.blame import explain_exception
    from kvlab.grading.limits import CheckTimeout, ChildCrashed, can_fork, in_child_process

    def launch():
        try:
            return launch_chunk_kernel(fn, *case), None
        except Exception as error:
            try:
                _unwrap_unimplemented(error)
            except NotImplementedError:
                return None, "it is not written yet (it still raises NotImplementedError)"
            return None, f"it raised {explain_exception(error)[0]}"

    if kernel_mode() != "interpreter" or not can_fork():
        return launch()
    try:
        return in_child_process(launch, timeout)
    except CheckTimeout:
        return None, f"it did not finish within {timeout:g} s"
    except ChildCrashed as crash:
        return None, f"it crashed its process ({crash.how})"
