"""Model shapes that decide how many bytes of KV cache one token costs.

Each layer stores one key and one value vector per KV head for every token it has seen, so a token
costs ``2 (K and V) x layers x kv_heads x head_dim x bytes per element``. Grouped-query attention
(GQA) shares one KV head between several query heads, which is why Llama-3 is cheaper per token
than OPT-13B despite similar depth.

A model is its *layer groups* (:attr:`ModelSpec.layer_groups`, :mod:`kvlab.core.kv_spec`): a dense
model is one full-attention group built from the fields above, so its figures are the formula's;
a model with sliding-window, latent (MLA) or Mamba / linear-attention layers gives ``layers``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvlab.core.kv_spec import (
    KV_FORMAT_ALIASES,
    KV_FORMATS,
    FullAttentionSpec,
    KVFormat,
    LayerGroup,
    MLASpec,
    SlidingWindowSpec,
    format_of_bytes,
    kv_format,
)
from kvlab.core.validate import positive_int

# vLLM's --kv-cache-dtype choices (vllm/config/cache.py, CacheDType; "auto" keeps the model's
# dtype) with their bytes per element, rounded up (nvfp4: half a byte, plus its scales). The
# formats themselves, scales included, are kvlab.core.kv_spec.KV_FORMATS; this is the old view.
KV_CACHE_DTYPES = {
    name: max(1, fmt.bits // 8) for name, fmt in KV_FORMATS.items() if name != "float32"
}
KV_CACHE_DTYPE_ALIASES = dict(KV_FORMAT_ALIASES)


@dataclass(frozen=True)
class ModelSpec:
    """The attention shape of a decoder-only transformer."""

    name: str
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int = 2
    num_params: float | None = None  # published parameter count, for the roofline in Lab 00
    max_context: int | None = None  # longest sequence the model was trained for
    # config.json facts the overhead model needs (activations grow with the MLP width and vocab)
    hidden_size: int | None = None
    intermediate_size: int | None = None
    vocab_size: int | None = None
    sliding_window: int | None = None  # tokens each layer attends to, when limited
    kv_dtype_bytes: int | None = None  # None: the KV cache keeps the model's dtype_bytes
    version: str | None = None  # which release of the model, where releases differ in shape
    # the model's layer groups, when not every layer is full attention of the shape above (None:
    # derived from it); their specs keep the model's own dtype, kv_cache_dtype re-formats them
    layers: tuple[LayerGroup, ...] | None = None
    kv_cache_dtype: str | None = None  # vLLM's --kv-cache-dtype name; None: "auto"

    def __post_init__(self):
        for field in ("num_layers", "num_q_heads", "num_kv_heads", "head_dim", "dtype_bytes"):
            positive_int(field, getattr(self, field))
        for field in (
            "hidden_size",
            "intermediate_size",
            "vocab_size",
            "sliding_window",
            "kv_dtype_bytes",
        ):
            if getattr(self, field) is not None:
                positive_int(field, getattr(self, field))
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(
                f"num_q_heads ({self.num_q_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.max_context is not None:
            positive_int("max_context", self.max_context)
        if self.layers is not None:
            if not isinstance(self.layers, tuple) or not self.layers:
                raise TypeError(
                    f"layers must be a non-empty tuple of LayerGroups, got {self.layers!r}"
                )
            for group in self.layers:
                if not isinstance(group, LayerGroup):
                    raise TypeError(f"layers must hold LayerGroups, got {group!r}")
        if self.kv_cache_dtype is not None:
            fmt = kv_format(self.kv_cache_dtype)  # raises on a name vLLM does not have
            if fmt.mla_only and not any(isinstance(g.spec, MLASpec) for g in self._groups()):
                raise ValueError(
                    f"kv_cache_dtype {fmt.name!r} is for latent (MLA) caches only, and "
                    f"{self.name} has no MLA layers"
                )

    @property
    def group_size(self) -> int:
        """Query heads per KV head (1 for classic multi-head attention)."""
        return self.num_q_heads // self.num_kv_heads

    @property
    def kv_format(self) -> KVFormat:
        """How one cached element is stored: the named ``kv_cache_dtype``, else
        ``kv_dtype_bytes``' plain format, else the model's dtype."""
        if self.kv_cache_dtype is not None:
            return kv_format(self.kv_cache_dtype, model_dtype_bytes=self.dtype_bytes)
        return format_of_bytes(self.kv_element_bytes)

    @property
    def kv_element_bytes(self) -> int | float:
        """Bytes of one cached K or V element: the KV dtype's, else the model's (0.5 for
        nvfp4, scales left out)."""
        if self.kv_cache_dtype is not None:
            bits = kv_format(self.kv_cache_dtype, model_dtype_bytes=self.dtype_bytes).bits
            return bits // 8 if bits >= 8 else bits / 8
        return self.dtype_bytes if self.kv_dtype_bytes is None else self.kv_dtype_bytes

    def _groups(self) -> tuple[LayerGroup, ...]:
        if self.layers is not None:
            return self.layers
        fmt = format_of_bytes(self.dtype_bytes)
        if self.sliding_window is not None and (
            self.max_context is None or self.sliding_window < self.max_context
        ):
            spec = SlidingWindowSpec(
                self.num_kv_heads, self.head_dim, fmt, window=self.sliding_window
            )
        else:
            spec = FullAttentionSpec(self.num_kv_heads, self.head_dim, fmt)
        return (LayerGroup(spec, self.num_layers),)

    @property
    def layer_groups(self) -> tuple[LayerGroup, ...]:
        """The model as vLLM v1 sees it: groups of layers of one :mod:`kvlab.core.kv_spec` spec,
        their K/V in :attr:`kv_format`. Without ``layers``: every layer full attention, or a
        sliding window of ``sliding_window`` tokens when the model attends to fewer tokens than
        its context (Mistral-7B v0.1: 4,096 of 32,768), as vLLM builds its ``SlidingWindowSpec``.
        A fixed state keeps its own dtype (vLLM's ``mamba_cache_dtype``), whatever the KV's."""
        fmt = self.kv_format
        out = []
        for group in self._groups():
            spec = group.spec
            if isinstance(spec, (FullAttentionSpec, MLASpec)) and spec.kv_format != fmt:
                if fmt.mla_only and not isinstance(spec, MLASpec):
                    fmt_here = format_of_bytes(1)  # vLLM: fp8_ds_mla is fp8 elsewhere
                else:
                    fmt_here = fmt
                spec = dataclasses.replace(spec, kv_format=fmt_here)
            out.append(LayerGroup(spec, group.num_layers))
        return tuple(out)

    @property
    def is_dense(self) -> bool:
        """Whether every layer is full attention of one shape (one full-attention group)."""
        groups = self._groups()
        return len(groups) == 1 and type(groups[0].spec) is FullAttentionSpec

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes one more token costs over every layer that grows with the sequence (a fixed
        state costs none; a window's token costs the same while it is in the window)."""
        if self.layers is None and self.kv_cache_dtype is None:
            return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_element_bytes
        return sum(group.token_bytes() for group in self.layer_groups)

    @property
    def weights_bytes(self) -> float | None:
        """Bytes of the weights in the model's dtype (a KV dtype leaves them unchanged)."""
        return None if self.num_params is None else self.num_params * self.dtype_bytes

    def with_kv_dtype(self, kv_cache_dtype: str) -> ModelSpec:
        """The same model with its KV cache stored as vLLM's ``--kv-cache-dtype`` does.

        ``"fp8"`` (1 byte) halves the bytes per token of a 16-bit model; ``"auto"`` keeps the
        model's dtype; the per-token-head formats add their fp32 scales and ``"nvfp4"`` its fp8
        block scales (:data:`kvlab.core.kv_spec.KV_FORMATS`). Weights are unchanged: only the
        cache is quantised. A plain 1/2/4-byte format keeps the old ``kv_dtype_bytes`` view.
        """
        if not isinstance(kv_cache_dtype, str):
            raise TypeError(
                f"kv_cache_dtype must be a str, got {type(kv_cache_dtype).__name__} "
                f"{kv_cache_dtype!r}"
            )
        key = kv_cache_dtype.strip().lower()
        key = KV_CACHE_DTYPE_ALIASES.get(key, key)
        if key == "auto":
            return dataclasses.replace(self, kv_dtype_bytes=None, kv_cache_dtype=None)
        fmt = kv_format(key)
        if fmt.scale in ("none", "per_tensor") and not fmt.mla_only and fmt.bits >= 8:
            if self.layers is None:  # the plain view: a byte count, as before
                return dataclasses.replace(self, kv_dtype_bytes=fmt.bits // 8, kv_cache_dtype=None)
            return dataclasses.replace(self, kv_dtype_bytes=fmt.bits // 8, kv_cache_dtype=key)
        return dataclasses.replace(self, kv_dtype_bytes=None, kv_cache_dtype=key)

    def kv_bytes(self, num_tokens: int) -> int:
        """Bytes of KV cache that ``num_tokens`` tokens of one sequence occupy, every token
        counted (what Lab 00 teaches: a window's or a state's savings are
        :meth:`kv_bytes_held`'s)."""
        return positive_int("num_tokens", num_tokens, minimum=0) * self.kv_bytes_per_token

    def kv_bytes_held(self, num_tokens: int, block_size: int = 16) -> int:
        """Bytes a sequence of ``num_tokens`` computed tokens holds in whole blocks, each group
        as vLLM's manager for it does (a window only its last blocks, a state one slot)."""
        return sum(g.bytes_held(num_tokens, block_size) for g in self.layer_groups)


# Published configurations (Hugging Face config.json of each model; fp16/bf16 = 2 bytes).
# num_params is the published count; kvlab.models.hf_config recomputes each within 1% (tests).
OPT_13B = ModelSpec(
    "OPT-13B", 40, 40, 40, 128, num_params=12.9e9, max_context=2048,
    hidden_size=5120, intermediate_size=20480, vocab_size=50272,
)  # fmt: skip
LLAMA_3_8B = ModelSpec(
    "Llama-3-8B", 32, 32, 8, 128, num_params=8.03e9, max_context=8192,
    hidden_size=4096, intermediate_size=14336, vocab_size=128256,
)  # fmt: skip
LLAMA_3_70B = ModelSpec(
    "Llama-3-70B", 80, 64, 8, 128, num_params=70.6e9, max_context=8192,
    hidden_size=8192, intermediate_size=28672, vocab_size=128256,
)  # fmt: skip
# v0.1 (the 7.24e9 release): 32K positions but each layer attends to the last 4,096 tokens only
MISTRAL_7B = ModelSpec(
    "Mistral-7B", 32, 32, 8, 128, num_params=7.24e9, max_context=32768,
    hidden_size=4096, intermediate_size=14336, vocab_size=32000, sliding_window=4096,
    version="v0.1",
)  # fmt: skip
# v0.3: vocabulary of 32,768, no sliding window, full 32K attention
MISTRAL_7B_V03 = ModelSpec(
    "Mistral-7B-v0.3", 32, 32, 8, 128, num_params=7.25e9, max_context=32768,
    hidden_size=4096, intermediate_size=14336, vocab_size=32768, version="v0.3",
)  # fmt: skip
# Llama 3.1: Llama 3's shapes with 128K context (rope scaling)
LLAMA_31_8B = ModelSpec(
    "Llama-3.1-8B", 32, 32, 8, 128, num_params=8.03e9, max_context=131072,
    hidden_size=4096, intermediate_size=14336, vocab_size=128256,
)  # fmt: skip
LLAMA_31_70B = ModelSpec(
    "Llama-3.1-70B", 80, 64, 8, 128, num_params=70.6e9, max_context=131072,
    hidden_size=8192, intermediate_size=28672, vocab_size=128256,
)  # fmt: skip
# Qwen2.5-7B-Instruct: 4 KV heads for 28 query heads, untied embeddings, 32K positions
QWEN_25_7B = ModelSpec(
    "Qwen2.5-7B-Instruct", 28, 28, 4, 128, num_params=7.61e9, max_context=32768,
    hidden_size=3584, intermediate_size=18944, vocab_size=152064,
)  # fmt: skip

PRESETS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        OPT_13B,
        LLAMA_3_8B,
        LLAMA_3_70B,
        MISTRAL_7B,
        MISTRAL_7B_V03,
        LLAMA_31_8B,
        LLAMA_31_70B,
        QWEN_25_7B,
    )
}


def preset(name: str) -> ModelSpec:
    """Look a preset up by name, case-insensitively."""
    for key, spec in PRESETS.items():
        if key.lower() == str(name).lower():
            return spec
    raise KeyError(f"unknown model {name!r}; presets are {', '.join(PRESETS)}")
