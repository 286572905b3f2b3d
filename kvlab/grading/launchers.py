"""Launching a learner's Triton kernel from a notebook cell, isolated as the checks isolate it.

Lab 05's and Lab 09's given cells run the learner's kernel on a case before its check cell; in
Triton's interpreter a bad load or store can corrupt memory, so the launch runs in a forked child
and a crash ends the child, not the notebook's kernel. This module is one of the few of
``kvlab.grading`` the learner's process keeps under ``kvlab grade`` (the graders, which import it
too, are hidden there): one copy serves the checks and the given cells.
"""

from __future__ import annotations

import math

import torch

from kvlab.grading.blame import exception_chain, explain_exception
from kvlab.grading.limits import CheckTimeout, ChildCrashed, can_fork, in_child_process
from kvlab.ops.kernels import launch_paged_decode
from kvlab.ops.kernels.sizes import pow2
from kvlab.ops.runtime import kernel_mode

BLOCK_Q = 4  # Lab 09: query rows per program of the chunk kernel, as the checks launch it


def raise_if_unimplemented(error: BaseException) -> None:
    """Raise NotImplementedError when ``error`` wraps one (Triton wraps what a kernel raised)."""
    for seen in exception_chain(error):
        if isinstance(seen, NotImplementedError) or "NotImplementedError" in repr(seen):
            raise NotImplementedError from error


def run_isolated(launch, timeout: float):
    """``launch()`` -> ``(output, None)`` or ``(None, what went wrong)``, in a forked child under
    Triton's interpreter (compiled, a bad address is an error, not a dead process)."""
    if kernel_mode() != "interpreter" or not can_fork():
        return launch()
    try:
        return in_child_process(launch, timeout)
    except CheckTimeout:
        return None, f"it did not finish within {timeout:g} s"
    except ChildCrashed as crash:
        return None, f"it crashed its process ({crash.how})"


def launch_decode_isolated(fn, *args, timeout: float = 60.0, launcher=launch_paged_decode):
    """Lab 05: ``launch_paged_decode(fn, *args)`` for a notebook cell: ``(output, None)``, or
    ``(None, what went wrong)`` when it raised, crashed or ran past ``timeout`` seconds. Lab 11
    passes ``launcher=launch_paged_decode_quantized``."""

    def launch():
        try:
            return launcher(fn, *args), None
        except Exception as error:
            return None, f"it raised {explain_exception(error)[0]}"

    return run_isolated(launch, timeout)


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
    sharpness: float = 1.0,
):
    """Lab 09: (q, k_cache, v_cache, block_table, num_computed) for one guest: ``n`` queries at
    positions ``num_computed ..``, K/V of the positions before ``num_computed + n`` in scattered
    rooms, one padding entry, and ``garbage`` in every bed that holds no token of the guest; q
    and the caches in ``dtype``, q scaled by ``sharpness`` (scores in the tens, where a softmax
    in bf16 rounds them: trained models have such heads)."""
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
    q = torch.randn(n, q_heads, head_dim, generator=g) * sharpness
    return q.to(dtype), k_cache.to(dtype), v_cache.to(dtype), table, num_computed


def launch_chunk_kernel(kernel, q, k_cache, v_cache, block_table, num_computed, out=None):
    """Lab 09: run a kernel with the chunk-kernel signature on the grid (ceil(n / BLOCK_Q),
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


def launch_chunk_isolated(fn, *case, timeout: float = 60.0, unimplemented=raise_if_unimplemented):
    """Lab 09: ``launch_chunk_kernel(fn, *case)`` for a notebook cell: ``(output, None)`` or
    ``(None, what went wrong)``; ``unimplemented(error)`` raises NotImplementedError for an
    unwritten kernel (the checks pass their own, which also tells Triton's own such errors)."""

    def launch():
        try:
            return launch_chunk_kernel(fn, *case), None
        except Exception as error:
            try:
                unimplemented(error)
            except NotImplementedError:
                return None, "it is not written yet (it still raises NotImplementedError)"
            return None, f"it raised {explain_exception(error)[0]}"

    return run_isolated(launch, timeout)
