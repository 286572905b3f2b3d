"""A :class:`~kvlab.models.ModelSpec` from a Hugging Face ``config.json``, for any model.

The presets cover a few models; a team plans the one it serves. ``config.json`` holds what the KV
cache needs (layers, KV heads, head size, dtype) and, for dense decoders, enough to count the
parameters (the weights the GPU must hold): embeddings (tied or not), attention (q, k, v, o), the
MLP (three matrices for the gated "silu" MLP of Llama, Mistral and Qwen; two for OPT's
``ffn_dim``) and the norms.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from kvlab.models.specs import ModelSpec

# torch_dtype -> bytes as vLLM's dtype "auto" serves it (fp32 checkpoints run in 16-bit)
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "half": 2, "float32": 2, "float": 2}
MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def _load(config) -> dict:
    if isinstance(config, Mapping):
        return dict(config)
    if isinstance(config, (str, os.PathLike)):
        with open(config, encoding="utf-8") as f:
            loaded = json.load(f)
        if not isinstance(loaded, dict):
            raise ValueError(
                f"{config}: a config.json holds a JSON object, got {type(loaded).__name__}"
            )
        return loaded
    raise TypeError(
        f"config must be a dict (a parsed config.json) or its path, got {type(config).__name__}"
    )


def _int(config: dict, key: str, default=None, *, required: bool = True):
    value = config.get(key, default)
    if value is None:
        if required:
            raise ValueError(f"config.json has no {key!r}, which the KV cache's size needs")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"config.json's {key!r} must be a positive int, got {value!r}")
    return value


def count_params(config: dict) -> float | None:
    """Parameters of a dense decoder from its config, or None when the config lacks a size."""
    config = _text_config(_load(config))
    hidden = config.get("hidden_size")
    vocab = config.get("vocab_size")
    layers = config.get("num_hidden_layers")
    heads = config.get("num_attention_heads")
    if not all(isinstance(v, int) and v > 0 for v in (hidden, vocab, layers, heads)):
        return None
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    model_type = str(config.get("model_type", "")).lower()
    opt_style = "ffn_dim" in config
    width = config.get("ffn_dim") if opt_style else config.get("intermediate_size")
    if not isinstance(width, int) or width <= 0:
        return None
    q_width, kv_width = heads * head_dim, kv_heads * head_dim
    attention = hidden * q_width + 2 * hidden * kv_width + q_width * hidden
    if opt_style:  # OPT: biases everywhere, LayerNorm with bias, two-matrix MLP
        bias = config.get("enable_bias", True)
        attention += (q_width + 2 * kv_width + hidden) if bias else 0
        mlp = 2 * hidden * width + ((width + hidden) if bias else 0)
        norms = 2 * 2 * hidden
        final_norm = 2 * hidden
        positions = (config.get("max_position_embeddings", 0) + 2) * hidden  # learned, offset 2
    else:  # Llama-style: RMSNorm weights only, gated MLP (gate, up, down)
        if config.get("attention_bias") or model_type.startswith("qwen2"):
            attention += q_width + 2 * kv_width  # q, k, v biases (Qwen2 always has them)
        mlp = 3 * hidden * width
        norms = 2 * hidden
        final_norm = hidden
        positions = 0
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings", True) else 2)
    return float(embeddings + positions + layers * (attention + mlp + norms) + final_norm)


def _text_config(config: dict) -> dict:
    """Multimodal configs (Mllama, Qwen-VL, Llava) keep the decoder under ``text_config``."""
    if "num_hidden_layers" not in config and isinstance(config.get("text_config"), Mapping):
        return {**config, **config["text_config"]}
    return config


def spec_from_hf_config(config, *, name: str | None = None) -> ModelSpec:
    """The attention shape (and, when countable, parameters) of the model a config.json describes.

    ``config``: the parsed JSON (a dict) or the file's path. ``num_key_value_heads`` defaults to
    the attention heads (classic multi-head attention) and ``head_dim`` to hidden / heads, as in
    transformers. A mixture-of-experts config raises: its weights are not the dense count (give
    the preset's fields by hand, with ``num_params`` from the model card).
    """
    config = _text_config(_load(config))
    if any(config.get(key) for key in MOE_KEYS):
        raise ValueError(
            "a mixture-of-experts config.json (it names experts): kvlab counts the weights of "
            "dense models only; build a ModelSpec by hand with the model card's num_params"
        )
    layers = _int(config, "num_hidden_layers")
    heads = _int(config, "num_attention_heads")
    kv_heads = _int(config, "num_key_value_heads", heads)
    hidden = _int(config, "hidden_size", required=False)
    head_dim = config.get("head_dim")
    if head_dim is None:
        if hidden is None:
            raise ValueError("config.json has neither 'head_dim' nor 'hidden_size'")
        if hidden % heads:
            raise ValueError(f"hidden_size {hidden} is not a multiple of {heads} heads")
        head_dim = hidden // heads
    head_dim = _int({"head_dim": head_dim}, "head_dim")
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    dtype = dtype.removeprefix("torch.")
    if dtype not in DTYPE_BYTES:
        raise ValueError(
            f"config.json's torch_dtype {dtype!r} is not one of {', '.join(DTYPE_BYTES)}"
        )
    sliding = config.get("sliding_window")
    if config.get("use_sliding_window") is False or not isinstance(sliding, int) or sliding <= 0:
        sliding = None
    width = config.get("ffn_dim", config.get("intermediate_size"))
    return ModelSpec(
        name or str(config.get("_name_or_path") or config.get("model_type") or "hf-model"),
        layers,
        heads,
        kv_heads,
        head_dim,
        dtype_bytes=DTYPE_BYTES[dtype],
        num_params=count_params(config),
        max_context=_int(config, "max_position_embeddings", required=False),
        hidden_size=hidden,
        intermediate_size=width if isinstance(width, int) and width > 0 else None,
        vocab_size=_int(config, "vocab_size", required=False),
        sliding_window=sliding,
    )
