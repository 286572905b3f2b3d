"""How vLLM v1 lays a model's layers out in its KV cache pool, and what a request reserves there.

vLLM gives every layer a spec (``vllm/v1/kv_cache_interface.py``) and then, in
``vllm/v1/core/kv_cache_utils.py`` (``get_kv_cache_groups``, ``get_kv_cache_config_from_groups``,
``get_max_concurrency_for_kv_cache_config``):

1. a model whose layers share one spec is one group of all its layers; one whose layers are all
   full attention of different shapes is one group too, a block being every layer's page;
2. otherwise (a hybrid) every layer's page must be the same size: a Mamba / linear-attention
   model first grows the attention block until its page holds the state
   (``HybridAttentionMambaModelConfig``: ``16 x cdiv(state page, 16 x attention bytes per
   token)`` tokens, without prefix caching) and pads the state to that page; pages that still
   differ grow by whole multiples of the block;
3. layers of one spec are split into groups of ``group_size`` layers, the fewest layers any spec
   has (the most, when that is under 1.5 times the fewest), the last group of a spec padded
   with empty layers; each group has its own block table, and all share one pool of
   ``memory // (page x group_size)`` blocks;
4. a request at full length reserves, in every group, the blocks its spec's
   ``max_memory_usage_bytes`` asks (every block of ``max_model_len`` for full attention and MLA;
   ``cdiv(min(window - 1 + max_num_batched_tokens, max_model_len), block) + 1`` for a window;
   one for a state), and the maximum concurrency is the pool's blocks over their sum.

All of it per GPU: tensor parallel splits attention's KV heads (at least one each, a head copied
beyond that) and a state's heads, and copies a latent (MLA) cache on every GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.core.kv_spec import (
    FullAttentionSpec,
    KVCacheSpec,
    LayerGroup,
    MLASpec,
    SlidingWindowSpec,
    StateSpec,
    cdiv,
)
from kvlab.core.validate import positive_int

# vLLM's attention kernels take blocks in multiples of 16 tokens (64 for MLA backends); the
# hybrid block size is rounded up to it (HybridAttentionMambaModelConfig)
KERNEL_BLOCK_ALIGNMENT = 16
MLA_KERNEL_BLOCK_ALIGNMENT = 64
# vLLM's heuristic: one group per layer of the rarest spec, unless the commonest has fewer than
# 1.5 times as many layers (then one group per layer of the commonest: less padding)
GROUP_SIZE_RATIO = 1.5


def shard(spec: KVCacheSpec, tensor_parallel: int) -> KVCacheSpec:
    """What one of ``tensor_parallel`` GPUs keeps of a layer: a share of attention's KV heads
    (at least one), a latent cache whole, a state split with its heads (vLLM divides a Mamba
    state's heads and conv channels by the tensor parallel size)."""
    tp = positive_int("tensor_parallel", tensor_parallel)
    if isinstance(spec, StateSpec):
        return dataclasses.replace(spec, state_bytes=cdiv(spec.state_bytes, tp))
    return spec.sharded(tp)


@dataclass(frozen=True)
class KVGroup:
    """One of vLLM's KV cache groups on one GPU: ``num_layers`` real layers of ``spec`` (the
    rest of the group's ``group_size`` slots padding), blocks of ``block_size`` tokens of
    ``page_bytes`` per layer."""

    spec: KVCacheSpec
    num_layers: int
    block_size: int
    page_bytes: int

    @property
    def kind(self) -> str:
        return self.spec.kind

    def blocks_reserved(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """Blocks a request at full length reserves in this group (vLLM's
        ``max_memory_usage_bytes`` over the page)."""
        return self.spec.blocks_reserved(max_model_len, self.block_size, max_num_batched_tokens)

    def blocks_for(self, num_tokens: float) -> float:
        """Blocks a request of ``num_tokens`` tokens holds here, as a smooth mean (the
        planner's workload averages): a state one, a window at most its last ``window`` tokens."""
        if isinstance(self.spec, StateSpec):
            return 1.0
        if isinstance(self.spec, SlidingWindowSpec):
            return min(num_tokens, self.spec.window) / self.block_size
        return num_tokens / self.block_size


@dataclass(frozen=True)
class KVCacheLayout:
    """The groups vLLM builds for a model on one GPU, and the pool they share."""

    groups: tuple[KVGroup, ...]
    group_size: int  # layer slots per group (real layers plus padding)
    page_bytes: int  # one block of one layer (the same in every group)
    block_bytes: int  # one block of the pool: page_bytes x group_size, or every layer's page
    padding_layers: int  # empty layer slots added to make groups equal

    @property
    def block_size(self) -> int:
        """Tokens per block of the attention groups (the smallest block, as vLLM reports it)."""
        return min(g.block_size for g in self.groups if not isinstance(g.spec, StateSpec))

    def num_blocks(self, kv_cache_bytes_per_gpu: float) -> int:
        """Blocks of the pool in ``kv_cache_bytes_per_gpu`` (vLLM's ``get_num_blocks``)."""
        return max(0, int(kv_cache_bytes_per_gpu // self.block_bytes))

    def blocks_reserved(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """Blocks one request at full length reserves over every group."""
        return sum(g.blocks_reserved(max_model_len, max_num_batched_tokens) for g in self.groups)

    def max_concurrency(
        self, num_blocks: int, max_model_len: int, max_num_batched_tokens: int
    ) -> float:
        """vLLM's "Maximum concurrency for N tokens per request"
        (``get_max_concurrency_for_kv_cache_config``)."""
        return num_blocks / self.blocks_reserved(max_model_len, max_num_batched_tokens)

    def blocks_for(self, num_tokens: float) -> float:
        """Blocks a request of ``num_tokens`` tokens holds over every group (smooth)."""
        return sum(g.blocks_for(num_tokens) for g in self.groups)

    def token_slots(self, num_blocks: int) -> int:
        """vLLM's "GPU KV cache size: N tokens": the pool's blocks per group, in tokens."""
        return num_blocks // len(self.groups) * self.block_size


def _attention_token_bytes(groups: Sequence[LayerGroup]) -> int:
    attention = [g.spec for g in groups if not isinstance(g.spec, StateSpec)]
    if not attention:
        raise ValueError("a model of states only has no attention block to size (not modelled)")
    return max(spec.token_bytes() for spec in attention)


def kv_cache_layout(
    layer_groups: Sequence[LayerGroup],
    *,
    block_size: int = 16,
    tensor_parallel: int = 1,
    group_size_ratio: float = GROUP_SIZE_RATIO,
    block_alignment: int | None = None,
) -> KVCacheLayout:
    """The groups, page and pool block vLLM v1 builds for ``layer_groups`` (a model's
    :attr:`~kvlab.models.ModelSpec.layer_groups`) on one of ``tensor_parallel`` GPUs, with the
    user's ``block_size`` (grown where a state needs it, as vLLM does). ``group_size_ratio``
    and ``block_alignment`` (tokens a grown block is a multiple of; None: the kernels' 16, 64
    with MLA) are vLLM's; other values show what changing that one rule does (Lab 11)."""
    block_size = positive_int("block_size", block_size)
    if isinstance(group_size_ratio, bool) or not isinstance(group_size_ratio, (int, float)):
        raise TypeError(f"group_size_ratio must be a number, got {group_size_ratio!r}")
    if not group_size_ratio >= 1:
        raise ValueError(f"group_size_ratio must be >= 1, got {group_size_ratio!r}")
    if block_alignment is not None:
        block_alignment = positive_int("block_alignment", block_alignment)
    if not layer_groups:
        raise ValueError("layer_groups must hold at least one LayerGroup")
    specs: dict[KVCacheSpec, int] = {}
    for group in layer_groups:
        if not isinstance(group, LayerGroup):
            raise TypeError(f"layer_groups must hold LayerGroups, got {group!r}")
        spec = shard(group.spec, tensor_parallel)
        specs[spec] = specs.get(spec, 0) + group.num_layers

    if len(specs) == 1:  # every layer the same spec: one group of all of them
        ((spec, n),) = specs.items()
        if isinstance(spec, StateSpec):
            raise ValueError("a model of states only has no attention block to size (not modelled)")
        page = spec.page_bytes(block_size)
        return KVCacheLayout((KVGroup(spec, n, block_size, page),), n, page, page * n, 0)
    if all(type(spec) is FullAttentionSpec for spec in specs):
        # one type, several shapes (UniformTypeKVCacheSpecs): one group, a block is every page
        total = sum(spec.page_bytes(block_size) * n for spec, n in specs.items())
        spec, n = max(specs.items(), key=lambda item: item[1])
        layers = sum(specs.values())
        group = KVGroup(spec, layers, block_size, total // layers)
        return KVCacheLayout((group,), layers, total // layers, total, 0)

    # a hybrid: one page size for every layer
    blocks = {spec: block_size for spec in specs}
    states = [spec for spec in specs if isinstance(spec, StateSpec)]
    if states:
        token = _attention_token_bytes([LayerGroup(s, 1) for s in specs])
        align = block_alignment or (
            MLA_KERNEL_BLOCK_ALIGNMENT
            if any(isinstance(s, MLASpec) for s in specs)
            else KERNEL_BLOCK_ALIGNMENT
        )
        state_page = max(s.state_bytes for s in states)
        needed = align * cdiv(state_page, align * token)
        attention_block = max(block_size, needed)
        blocks = {spec: attention_block for spec in specs}
    pages = {
        spec: (None if isinstance(spec, StateSpec) else spec.page_bytes(blocks[spec]))
        for spec in specs
    }
    page = max(p for p in pages.values() if p is not None)
    if states and page < max(s.state_bytes for s in states):
        raise ValueError("a state larger than the attention page (not modelled)")
    for spec, p in pages.items():
        if p is not None and p != page:
            if page % p:
                raise ValueError(
                    f"page sizes {p:,} and {page:,} bytes do not divide: vLLM cannot unify them "
                    "(NotImplementedError there)"
                )
            blocks[spec] *= page // p
    counts = list(specs.values())
    group_size = min(counts)
    if max(counts) < min(counts) * group_size_ratio:
        group_size = max(counts)
    groups = []
    padding = 0
    for spec, n in specs.items():
        num_groups = cdiv(n, group_size)
        padding += num_groups * group_size - n
        for i in range(num_groups):
            layers = len(range(i, n, num_groups))  # vLLM deals layers i::num_groups
            groups.append(KVGroup(spec, layers, blocks[spec], page))
    return KVCacheLayout(tuple(groups), group_size, page, page * group_size, padding)


def describe_group(spec: KVCacheSpec) -> str:
    """A layer kind in words, with its window, latent or state."""
    if isinstance(spec, SlidingWindowSpec):
        return f"sliding window of {spec.window:,} tokens"
    if isinstance(spec, FullAttentionSpec):
        return f"full attention, {spec.num_kv_heads} KV heads x {spec.head_dim}"
    if isinstance(spec, MLASpec):
        return f"latent attention (MLA), {spec.kv_lora_rank} + {spec.rope_dim} elements"
    if isinstance(spec, StateSpec):
        return f"{spec.layer_type} state of {spec.state_bytes:,} bytes"
    return spec.kind


def windows_kept_whole(layer_groups: Sequence[LayerGroup]) -> tuple[LayerGroup, ...]:
    """The same layers with every sliding window kept whole, as full attention of its shape:
    what vLLM serves with ``--disable-hybrid-kv-cache-manager`` (one key card for all layers)."""
    kept = []
    for group in layer_groups:
        if not isinstance(group, LayerGroup):
            raise TypeError(f"layer_groups must hold LayerGroups, got {group!r}")
        spec = group.spec
        if isinstance(spec, SlidingWindowSpec):
            spec = FullAttentionSpec(
                spec.num_kv_heads, spec.head_dim, spec.kv_format, spec.head_dim_v
            )
        kept.append(LayerGroup(spec, group.num_layers))
    return tuple(kept)


def exact_bytes(layer_groups: Sequence[LayerGroup], num_tokens: int) -> int:
    """What a request of ``num_tokens`` holds layer by layer with no padding and no partly
    filled block: full attention every token, a window its last ``window``, a state its state
    (the bound a layer-aware allocator such as Jenga's approaches)."""
    num_tokens = positive_int("num_tokens", num_tokens)
    total = 0
    for group in layer_groups:
        if not isinstance(group, LayerGroup):
            raise TypeError(f"layer_groups must hold LayerGroups, got {group!r}")
        spec = group.spec
        if isinstance(spec, StateSpec):
            total += group.num_layers * spec.state_bytes
        else:
            tokens = (
                min(num_tokens, spec.window) if isinstance(spec, SlidingWindowSpec) else num_tokens
            )
            total += group.num_layers * spec.token_bytes() * tokens
    return total
