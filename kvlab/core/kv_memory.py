"""The one place the course allocates K/V memory: zeroed K and V tensors, one per layer of a spec.

It sits in the core, below the contiguous cache that holds tensors when built with a spec (Lab 01)
and below :mod:`kvlab.kv.tensors`, which lays its stores out with it. torch is imported on the
first call, never at import, so the core's bookkeeping still runs without torch.
"""

from __future__ import annotations


def torch_dtype(spec):
    """The tensor dtype for a spec's element size (1, 2 or 4 bytes)."""
    import torch

    dtypes = {1: torch.uint8, 2: torch.float16, 4: torch.float32}
    if spec.dtype_bytes not in dtypes:
        raise ValueError(
            f"spec.dtype_bytes must be 1, 2 or 4 for real tensors, got {spec.dtype_bytes}"
        )
    return dtypes[spec.dtype_bytes]


def kv_layers(spec, leading: tuple[int, ...], dtype=None, device="cpu"):
    """Zeroed K and V, one ``[*leading, kv_heads, head_dim]`` tensor per layer of ``spec``.
    ``dtype`` defaults to :func:`torch_dtype`."""
    import torch

    dtype = torch_dtype(spec) if dtype is None else dtype
    shape = (*leading, spec.num_kv_heads, spec.head_dim)
    k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(spec.num_layers)]
    v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(spec.num_layers)]
    return k, v
