"""Sizes and strides the launchers hand to kernels: Triton vectors have power-of-two lengths, and
kernels take every tensor's strides in elements, one after another."""

from __future__ import annotations


def pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, (n - 1).bit_length())


def check_block_size(block_size: int) -> None:
    """For kernels that walk a room with ``tl.arange(0, BLOCK_SIZE)`` (the tiled kernel and the
    writer take any block size: they address tokens, not rooms)."""
    if block_size & (block_size - 1) or not 1 <= block_size <= 256:
        raise ValueError(f"block_size must be a power of two from 1 to 256, got {block_size}")


def strides(*tensors) -> tuple[int, ...]:
    """The strides of each tensor in turn, as a kernel's ``stride_*`` arguments list them."""
    return tuple(step for t in tensors for step in t.stride())
