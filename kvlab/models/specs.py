"""Model shapes that decide how many bytes of KV cache one token costs.

Each layer stores one key and one value vector per KV head for every token it has seen, so a token
costs ``2 (K and V) x layers x kv_heads x head_dim x bytes per element``. Grouped-query attention
(GQA) shares one KV head between several query heads, which is why Llama-3 is cheaper per token
than OPT-13B despite similar depth.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvlab.core.validate import positive_int

# bytes per element of vLLM's --kv-cache-dtype choices ("auto" keeps the model's dtype); vLLM has
# no fp32 cache, and spells the 16-bit ones out
KV_CACHE_DTYPES = {
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "bfloat16": 2,
    "float16": 2,
}
KV_CACHE_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16"}


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

    @property
    def group_size(self) -> int:
        """Query heads per KV head (1 for classic multi-head attention)."""
        return self.num_q_heads // self.num_kv_heads

    @property
    def kv_element_bytes(self) -> int:
        """Bytes of one cached K or V element: the KV dtype's, else the model's."""
        return self.dtype_bytes if self.kv_dtype_bytes is None else self.kv_dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_element_bytes

    @property
    def weights_bytes(self) -> float | None:
        """Bytes of the weights in the model's dtype (a KV dtype leaves them unchanged)."""
        return None if self.num_params is None else self.num_params * self.dtype_bytes

    def with_kv_dtype(self, kv_cache_dtype: str) -> ModelSpec:
        """The same model with its KV cache stored as vLLM's ``--kv-cache-dtype`` does.

        ``"fp8"`` (1 byte) halves the bytes per token of a 16-bit model; ``"auto"`` keeps the
        model's dtype. Weights are unchanged: only the cache is quantised.
        """
        if not isinstance(kv_cache_dtype, str):
            raise TypeError(
                f"kv_cache_dtype must be a str, got {type(kv_cache_dtype).__name__} "
                f"{kv_cache_dtype!r}"
            )
        key = kv_cache_dtype.strip().lower()
        key = KV_CACHE_DTYPE_ALIASES.get(key, key)
        if key == "auto":
            return dataclasses.replace(self, kv_dtype_bytes=None)
        if key not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype must be 'auto' or one of {', '.join(KV_CACHE_DTYPES)}, "
                f"got {kv_cache_dtype!r}"
            )
        return dataclasses.replace(self, kv_dtype_bytes=KV_CACHE_DTYPES[key])

    def kv_bytes(self, num_tokens: int) -> int:
        """Bytes of KV cache that ``num_tokens`` tokens of one sequence occupy."""
        return positive_int("num_tokens", num_tokens, minimum=0) * self.kv_bytes_per_token


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
