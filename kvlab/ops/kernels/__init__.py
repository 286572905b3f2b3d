"""Triton paged-attention kernels: decode attention that reads K/V rooms in place through block
tables, and a kernel that writes new K/V through a slot mapping.

``room_by_room`` is the kernel learners write in Lab 05; ``tiled`` is the fast one kvlab uses
(tiles of several rooms, tensor cores, split-K), launched with the defaults in its
``LAUNCH_DEFAULTS``; ``prefill`` is its prefill sibling (a step's chunks and decodes, packed
varlen, causal on the diagonal, Lab 09); ``quantized`` is ``tiled`` over a cache of 8-bit K/V
with a scale per token and KV head, dequantised in the kernel (Lab 11); ``slots`` holds the address code (token -> key-card entry -> slot -> K/V
offsets) that ``tiled`` and ``write`` share. ``import kvlab`` chooses Triton's interpreter when no
CUDA GPU is visible, so the same code runs on CPU tensors (slowly: keep shapes small) and
compiled on a GPU.
"""

from kvlab.ops.kernels.prefill import (
    PREFILL_DEFAULTS,
    PrefillConfig,
    paged_prefill_attention,
    paged_prefill_kernel,
    prefill_launch_config,
    prepare_paged_prefill,
)
from kvlab.ops.kernels.quantized import (
    paged_decode_attention_quantized,
    paged_decode_quant_kernel,
    prepare_paged_decode_quantized,
)
from kvlab.ops.kernels.room_by_room import (
    launch_paged_decode,
    launch_paged_decode_quantized,
    paged_decode_kernel,
)
from kvlab.ops.kernels.tiled import (
    LAUNCH_DEFAULTS,
    LaunchConfig,
    SplitPlan,
    choose_splits,
    launch_config,
    merge_splits_kernel,
    paged_decode_attention,
    paged_decode_tiled_kernel,
    plan_splits,
    prepare_paged_decode,
    tile_tokens,
)
from kvlab.ops.kernels.write import write_kv, write_kv_kernel

__all__ = [
    "LAUNCH_DEFAULTS",
    "LaunchConfig",
    "PREFILL_DEFAULTS",
    "PrefillConfig",
    "SplitPlan",
    "choose_splits",
    "launch_config",
    "launch_paged_decode",
    "launch_paged_decode_quantized",
    "merge_splits_kernel",
    "paged_decode_attention",
    "paged_decode_attention_quantized",
    "paged_decode_quant_kernel",
    "paged_decode_kernel",
    "paged_decode_tiled_kernel",
    "paged_prefill_attention",
    "paged_prefill_kernel",
    "plan_splits",
    "prefill_launch_config",
    "prepare_paged_decode",
    "prepare_paged_decode_quantized",
    "prepare_paged_prefill",
    "tile_tokens",
    "write_kv",
    "write_kv_kernel",
]
