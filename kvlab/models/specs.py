"""Model shapes that decide how many bytes of KV cache one token costs.

Each layer stores one key and one value vector per KV head for every token it has seen, so a token
costs ``2 (K and V) x layers x kv_heads x head_dim x bytes per element``. Grouped-query attention
(GQA) shares one KV head between several query heads, which is why Llama-3 is cheaper per token
than OPT-13B despite similar depth.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.core.validate import positive_int


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

    def __post_init__(self):
        for field in ("num_layers", "num_q_heads", "num_kv_heads", "head_dim", "dtype_bytes"):
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
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def kv_bytes(self, num_tokens: int) -> int:
        """Bytes of KV cache that ``num_tokens`` tokens of one sequence occupy."""
        return positive_int("num_tokens", num_tokens, minimum=0) * self.kv_bytes_per_token


# Published configurations (Hugging Face config.json of each model; fp16/bf16 = 2 bytes).
OPT_13B = ModelSpec("OPT-13B", 40, 40, 40, 128, num_params=12.9e9, max_context=2048)
LLAMA_3_8B = ModelSpec("Llama-3-8B", 32, 32, 8, 128, num_params=8.03e9, max_context=8192)
LLAMA_3_70B = ModelSpec("Llama-3-70B", 80, 64, 8, 128, num_params=70.6e9, max_context=8192)
MISTRAL_7B = ModelSpec("Mistral-7B", 32, 32, 8, 128, num_params=7.24e9, max_context=32768)

PRESETS: dict[str, ModelSpec] = {
    spec.name: spec for spec in (OPT_13B, LLAMA_3_8B, LLAMA_3_70B, MISTRAL_7B)
}


def preset(name: str) -> ModelSpec:
    """Look a preset up by name, case-insensitively."""
    for key, spec in PRESETS.items():
        if key.lower() == str(name).lower():
            return spec
    raise KeyError(f"unknown model {name!r}; presets are {', '.join(PRESETS)}")
