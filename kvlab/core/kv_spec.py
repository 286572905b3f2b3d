"""What one layer keeps per token (or per request), as vLLM v1's ``KVCacheSpec``s describe it.

A model is a few *layer groups*, each a number of layers of one kind: full attention keeps K and V
of every token; a sliding window keeps only the last ``window`` tokens (blocks that fall out of it
go back to the pool); latent attention (MLA) keeps one compressed vector per token, no K/V pair; a
Mamba or linear-attention layer keeps a fixed state per request, whatever its length. Each spec
knows its page bytes for a block size, what a request of ``n`` tokens holds, and what vLLM
reserves for a request at full length (``max_memory_usage_bytes`` in
``vllm/v1/kv_cache_interface.py``, per layer, in blocks here).

The element format is a :class:`KVFormat` named as vLLM's ``--kv-cache-dtype`` names it, with its
scales: per tensor (free), per token and head (two fp32 scales, K and V, per token per head), or
per block of elements (NVFP4: one fp8 scale per 16 fp4 elements).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

from kvlab.core.validate import positive_int

# --- element formats ---------------------------------------------------------------------------

SCALES = ("none", "per_tensor", "per_token_head", "per_16_elements")


@dataclass(frozen=True)
class KVFormat:
    """How one cached element is stored: ``bits`` per element and where its scales live."""

    name: str
    bits: int
    scale: str = "none"  # one of SCALES
    scale_bytes: int = 0  # bytes of one scale (fp32 per token-head: 4; NVFP4's fp8 scale: 1)
    mla_only: bool = False  # a format vLLM offers for latent (MLA) caches only

    def __post_init__(self):
        if self.bits not in (4, 8, 16, 32):
            raise ValueError(f"bits must be 4, 8, 16 or 32, got {self.bits!r}")
        if self.scale not in SCALES:
            raise ValueError(f"scale must be one of {', '.join(SCALES)}, got {self.scale!r}")

    def vector_bytes(self, dim: int) -> int:
        """Bytes of one cached vector of ``dim`` elements (one head's K, say) with its scales."""
        dim = positive_int("dim", dim)
        data = -(-dim * self.bits // 8)
        if self.scale == "per_token_head":
            return data + self.scale_bytes
        if self.scale == "per_16_elements":
            return data + -(-dim // 16) * self.scale_bytes
        return data

    @property
    def element_bytes(self) -> float:
        """Bytes of one element, scales left out (what a roofline reads per element)."""
        return self.bits / 8


def _formats(*formats: KVFormat) -> Mapping[str, KVFormat]:
    return MappingProxyType({f.name: f for f in formats})


# vLLM's --kv-cache-dtype choices (vllm/config/cache.py, CacheDType) that change the bytes of a
# page; "auto" is the model's own dtype (resolved by kv_format). fp8 per tensor keeps one scale
# per layer, outside the pages. fp8_ds_mla is DeepSeek's packed MLA page (656 bytes a token).
KV_FORMATS: Mapping[str, KVFormat] = _formats(
    KVFormat("float32", 32),
    KVFormat("bfloat16", 16),
    KVFormat("float16", 16),
    KVFormat("fp8", 8, "per_tensor"),
    KVFormat("fp8_e4m3", 8, "per_tensor"),
    KVFormat("fp8_e5m2", 8, "per_tensor"),
    KVFormat("fp8_inc", 8, "per_tensor"),
    KVFormat("fp8_ds_mla", 8, "per_tensor", mla_only=True),
    KVFormat("int8_per_token_head", 8, "per_token_head", 4),
    KVFormat("fp8_per_token_head", 8, "per_token_head", 4),
    KVFormat("nvfp4", 4, "per_16_elements", 1),
)
KV_FORMAT_ALIASES = MappingProxyType({"bf16": "bfloat16", "fp16": "float16", "half": "float16"})
_BY_BYTES = {4: "float32", 2: "bfloat16", 1: "fp8"}


def kv_format(name, *, model_dtype_bytes: int = 2) -> KVFormat:
    """The format vLLM's ``--kv-cache-dtype name`` stores; ``"auto"`` is the model's dtype
    (``model_dtype_bytes``: 2 for bf16/fp16 weights)."""
    if isinstance(name, KVFormat):
        return name
    if not isinstance(name, str):
        raise TypeError(f"kv_cache_dtype must be a str, got {type(name).__name__} {name!r}")
    key = name.strip().lower()
    key = KV_FORMAT_ALIASES.get(key, key)
    if key == "auto":
        if model_dtype_bytes not in _BY_BYTES:
            raise ValueError(f"model_dtype_bytes must be 1, 2 or 4, got {model_dtype_bytes!r}")
        return KV_FORMATS[_BY_BYTES[model_dtype_bytes]]
    if key not in KV_FORMATS:
        raise ValueError(
            f"kv_cache_dtype must be 'auto' or one of {', '.join(KV_FORMATS)}, got {name!r}"
        )
    return KV_FORMATS[key]


def format_of_bytes(element_bytes: int) -> KVFormat:
    """The plain format of a byte count (ModelSpec's ``dtype_bytes``): 4, 2 or 1 byte(s)."""
    if element_bytes not in _BY_BYTES:
        raise ValueError(f"element_bytes must be 1, 2 or 4, got {element_bytes!r}")
    return KV_FORMATS[_BY_BYTES[element_bytes]]


BF16 = KV_FORMATS["bfloat16"]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --- layer specs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVCacheSpec:
    """One layer's cache format. Subclasses answer per layer; :class:`LayerGroup` multiplies."""

    kind: ClassVar[str] = "abstract"
    grows: ClassVar[bool] = True  # False: a fixed state per request, whatever its length

    def page_bytes(self, block_size: int) -> int:
        """Bytes of one block (``block_size`` token slots) of one layer."""
        raise NotImplementedError

    def token_bytes(self) -> int:
        """Bytes one token costs in one layer (0 for a fixed state)."""
        raise NotImplementedError

    def first_needed(self, num_computed: int) -> int:
        """The first token position still needed once ``num_computed`` tokens are computed
        (0 but for a window: the blocks wholly before it can go back to the pool)."""
        return 0

    def blocks_held(self, num_tokens: int, block_size: int) -> int:
        """Blocks a sequence of ``num_tokens`` tokens (all computed) holds in one layer."""
        num_tokens = positive_int("num_tokens", num_tokens, minimum=0)
        block_size = positive_int("block_size", block_size)
        return cdiv(num_tokens, block_size) - self.first_needed(num_tokens) // block_size

    def blocks_reserved(
        self, max_model_len: int, block_size: int, max_num_batched_tokens: int
    ) -> int:
        """Blocks vLLM counts for one request at full length (``max_memory_usage_bytes`` /
        page bytes): every block of ``max_model_len`` for full attention."""
        return cdiv(positive_int("max_model_len", max_model_len), block_size)

    def sharded(self, tensor_parallel: int) -> KVCacheSpec:
        """What one of ``tensor_parallel`` GPUs keeps of this layer."""
        positive_int("tensor_parallel", tensor_parallel)
        return self


@dataclass(frozen=True)
class FullAttentionSpec(KVCacheSpec):
    """K and V of every token, ``num_kv_heads`` heads of ``head_dim`` each (``head_dim_v`` for V
    where it differs)."""

    num_kv_heads: int
    head_dim: int
    kv_format: KVFormat = BF16
    head_dim_v: int | None = None
    kind: ClassVar[str] = "full_attention"

    def __post_init__(self):
        positive_int("num_kv_heads", self.num_kv_heads)
        positive_int("head_dim", self.head_dim)
        if self.head_dim_v is not None:
            positive_int("head_dim_v", self.head_dim_v)
        if not isinstance(self.kv_format, KVFormat):
            raise TypeError(f"kv_format must be a KVFormat, got {self.kv_format!r}")
        if self.kv_format.mla_only:
            raise ValueError(f"kv_format {self.kv_format.name!r} is for latent (MLA) caches only")

    def token_bytes(self) -> int:
        v_dim = self.head_dim if self.head_dim_v is None else self.head_dim_v
        vectors = self.kv_format.vector_bytes(self.head_dim) + self.kv_format.vector_bytes(v_dim)
        return self.num_kv_heads * vectors

    def page_bytes(self, block_size: int) -> int:
        return positive_int("block_size", block_size) * self.token_bytes()

    def sharded(self, tensor_parallel: int) -> FullAttentionSpec:
        """Each GPU keeps its share of the KV heads, at least one: with more GPUs than KV heads
        a head is copied (vLLM replicates it)."""
        tp = positive_int("tensor_parallel", tensor_parallel)
        return dataclasses.replace(self, num_kv_heads=max(1, self.num_kv_heads // tp))


@dataclass(frozen=True)
class SlidingWindowSpec(FullAttentionSpec):
    """Attention to the last ``window`` tokens only (the token itself included)."""

    window: int = 0
    kind: ClassVar[str] = "sliding_window"

    def __post_init__(self):
        super().__post_init__()
        positive_int("window", self.window)

    def first_needed(self, num_computed: int) -> int:
        # the next token attends to itself and the window - 1 before it (vLLM's
        # SlidingWindowManager.remove_skipped_blocks)
        return max(0, positive_int("num_computed", num_computed, minimum=0) - self.window + 1)

    def blocks_reserved(
        self, max_model_len: int, block_size: int, max_num_batched_tokens: int
    ) -> int:
        """The window's last ``window - 1`` tokens plus a step's new tokens, one block more for a
        window that starts inside a block (vLLM's ``SlidingWindowSpec.max_memory_usage_bytes``)."""
        tokens = min(
            self.window - 1 + positive_int("max_num_batched_tokens", max_num_batched_tokens),
            positive_int("max_model_len", max_model_len),
        )
        return cdiv(tokens, block_size) + 1


@dataclass(frozen=True)
class MLASpec(KVCacheSpec):
    """Latent attention (DeepSeek-V2/V3): one compressed vector of ``kv_lora_rank`` elements plus
    ``rope_dim`` positional ones per token, shared by every head (no K/V pair, no heads), and
    the same on every tensor-parallel GPU."""

    kv_lora_rank: int
    rope_dim: int
    kv_format: KVFormat = BF16
    kind: ClassVar[str] = "mla"

    def __post_init__(self):
        positive_int("kv_lora_rank", self.kv_lora_rank)
        positive_int("rope_dim", self.rope_dim, minimum=0)
        if not isinstance(self.kv_format, KVFormat):
            raise TypeError(f"kv_format must be a KVFormat, got {self.kv_format!r}")

    def token_bytes(self) -> int:
        if self.kv_format.name == "fp8_ds_mla":
            return 656  # vLLM's packed page: fp8 latent, its scales, the rope part in 16 bits
        return self.kv_format.vector_bytes(self.kv_lora_rank + self.rope_dim)

    def page_bytes(self, block_size: int) -> int:
        return positive_int("block_size", block_size) * self.token_bytes()


@dataclass(frozen=True)
class StateSpec(KVCacheSpec):
    """A fixed state per request (Mamba's conv and SSM states, a linear-attention layer's
    matrix): ``state_bytes`` per layer on one GPU, whatever the length. vLLM keeps it in one
    block per request (``mamba_cache_mode="none"``), the block padded to the group's page."""

    state_bytes: int
    layer_type: str = "mamba"  # what the config calls the layer, for reports
    kind: ClassVar[str] = "state"
    grows: ClassVar[bool] = False

    def __post_init__(self):
        positive_int("state_bytes", self.state_bytes)

    def token_bytes(self) -> int:
        return 0

    def page_bytes(self, block_size: int) -> int:
        positive_int("block_size", block_size)
        return self.state_bytes

    def first_needed(self, num_computed: int) -> int:
        return positive_int("num_computed", num_computed, minimum=0)

    def blocks_held(self, num_tokens: int, block_size: int) -> int:
        positive_int("num_tokens", num_tokens, minimum=0)
        positive_int("block_size", block_size)
        return 1 if num_tokens else 0

    def blocks_reserved(
        self, max_model_len: int, block_size: int, max_num_batched_tokens: int
    ) -> int:
        return 1


@dataclass(frozen=True)
class LayerGroup:
    """``num_layers`` layers of one spec: what the model holds is the sum over its groups."""

    spec: KVCacheSpec
    num_layers: int

    def __post_init__(self):
        if not isinstance(self.spec, KVCacheSpec):
            raise TypeError(f"spec must be a KVCacheSpec, got {self.spec!r}")
        positive_int("num_layers", self.num_layers)

    def token_bytes(self) -> int:
        return self.num_layers * self.spec.token_bytes()

    def bytes_held(self, num_tokens: int, block_size: int) -> int:
        """Bytes a request of ``num_tokens`` holds in these layers, in whole blocks."""
        return (
            self.num_layers
            * self.spec.blocks_held(num_tokens, block_size)
            * (self.spec.page_bytes(block_size))
        )

    def sharded(self, tensor_parallel: int) -> LayerGroup:
        return LayerGroup(self.spec.sharded(tensor_parallel), self.num_layers)
