"""Size rules shared by the launchers: Triton vectors have power-of-two lengths."""

from __future__ import annotations


def pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, (n - 1).bit_length())


def check_block_size(block_size: int) -> None:
    if block_size & (block_size - 1) or not 1 <= block_size <= 256:
        raise ValueError(f"block_size must be a power of two from 1 to 256, got {block_size}")
