"""Triton paged-attention kernels: decode attention that reads K/V rooms in place through block
tables, and a kernel that writes new K/V through a slot mapping.

``room_by_room`` is the kernel learners write in Lab 05; ``tiled`` is the fast one kvlab uses
(tiles of several rooms, tensor cores, split-K). ``import kvlab`` chooses Triton's interpreter
when no CUDA GPU is visible, so the same code runs on CPU tensors (slowly: keep shapes small) and
compiled on a GPU.
"""

from kvlab.kernels.room_by_room import launch_paged_decode, paged_decode_kernel
from kvlab.kernels.tiled import (
    choose_splits,
    merge_splits_kernel,
    paged_decode_attention,
    paged_decode_tiled_kernel,
    tile_tokens,
)
from kvlab.kernels.write import write_kv, write_kv_kernel

__all__ = [
    "choose_splits",
    "launch_paged_decode",
    "merge_splits_kernel",
    "paged_decode_attention",
    "paged_decode_kernel",
    "paged_decode_tiled_kernel",
    "tile_tokens",
    "write_kv",
    "write_kv_kernel",
]
