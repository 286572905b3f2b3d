"""A :class:`~kvlab.models.ModelSpec` from a Hugging Face ``config.json``, for any model.

The presets cover a few models; a team plans the one it serves. ``config.json`` holds what the KV
cache needs (layers, KV heads, head size, dtype, which layers are sliding-window, latent or
Mamba / linear attention) and enough to count the parameters (the weights the GPU must hold).

It is read as transformers reads it: the decoder of a multimodal config under ``text_config``;
each family's defaults for what a config leaves out (``head_dim``: 128 for Qwen3, 256 for Gemma
and Qwen3.5, 64 for gpt-oss; Gemma-3's vocabulary, context and 5:1 window pattern), and a key
that is missing means the same as one that is ``null``. Layer kinds come from ``layer_types``,
else from the family's rule (Gemma-2/3's window pattern, Qwen2's ``use_sliding_window`` and
``max_window_layers``, Qwen3-Next / Qwen3.5's ``full_attention_interval``, Nemotron-H's
``hybrid_override_pattern`` or ``layers_block_type``). What kvlab does not model (cross-attention
layers, chunked attention, a layer kind it does not know) is refused by name, never guessed.

The parameters: embeddings (tied or not), attention (q, k, v, o; MLA's low-rank projections),
the MLP (gated "silu" / "gelu" three matrices, OPT's two, Nemotron-H's squared-ReLU two), every
expert of a mixture-of-experts layer (routed and shared, their router), Mamba2 and Gated-DeltaNet
mixers, and the norms. A quantised checkpoint's bytes are not parameters x 2: give them
(``kvlab plan --weights-gib``).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping

from kvlab.core.kv_spec import (
    FullAttentionSpec,
    LayerGroup,
    MLASpec,
    SlidingWindowSpec,
    StateSpec,
    format_of_bytes,
)
from kvlab.models.specs import ModelSpec

# torch_dtype -> bytes as vLLM's dtype "auto" serves it (fp32 checkpoints run in 16-bit)
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "half": 2, "float32": 2, "float": 2}
MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")

# transformers' defaults where a family's config class has its own (a key left out of, or null
# in, config.json): head_dim first. Families not named here take hidden_size / heads.
FAMILY_HEAD_DIM = {
    "qwen3": 128, "qwen3_moe": 128, "gemma": 256, "gemma2": 256, "gemma3": 256,
    "gemma3_text": 256, "gpt_oss": 64, "qwen3_next": 256, "qwen3_5": 256, "qwen3_5_text": 256,
    "qwen3_5_moe": 256, "qwen3_5_moe_text": 256, "nemotron_h": 128,
}  # fmt: skip
# other keys a family's config class fills in (Gemma-3's text config on the Hub leaves these out)
FAMILY_DEFAULTS = {
    "gemma3_text": {"vocab_size": 262208, "max_position_embeddings": 131072,
                    "sliding_window_pattern": 6, "sliding_window": 4096,
                    "tie_word_embeddings": True, "hidden_activation": "gelu_pytorch_tanh"},
    "gemma2": {"vocab_size": 256000, "max_position_embeddings": 8192, "sliding_window": 4096},
    "gpt_oss": {"sliding_window": 128},
    "qwen3_next": {"full_attention_interval": 4, "linear_conv_kernel_dim": 4},
    "qwen3_5_text": {"full_attention_interval": 4, "linear_conv_kernel_dim": 4},
    "qwen3_5_moe_text": {"full_attention_interval": 4, "linear_conv_kernel_dim": 4},
    "nemotron_h": {"conv_kernel": 4, "n_groups": 8, "mamba_head_dim": 64},
}  # fmt: skip
# families whose config class reads a missing / null num_key_value_heads as multi-head
# attention (transformers: "if num_key_value_heads is None: num_key_value_heads = heads");
# OPT-like families have no KV-head setting at all (always multi-head)
MHA_FAMILIES = ("opt", "gpt2", "gptj", "gpt_neox", "bloom", "falcon", "phi")
GQA_FAMILIES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
    "gemma3", "gemma3_text", "deepseek_v2", "deepseek_v3", "mllama", "phi3", "granite",
    "olmo2", "cohere", "starcoder2",
)  # fmt: skip
ATTENTION_KINDS = ("full_attention", "sliding_attention", "linear_attention")
# Nemotron-H's hybrid_override_pattern: M Mamba2, * attention, - MLP, E mixture of experts
PATTERN_KINDS = {"M": "mamba", "*": "full_attention", "-": "mlp", "E": "moe"}
BLOCK_TYPES = {"mamba": "mamba", "mamba2": "mamba", "attention": "full_attention", "mlp": "mlp",
               "moe": "moe"}  # fmt: skip


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
    value = config.get(key)
    if value is None:  # missing and null mean the same
        value = default
    if value is None:
        if required:
            raise ValueError(f"config.json has no {key!r}, which the KV cache's size needs")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"config.json's {key!r} must be a positive int, got {value!r}")
    return value


def _text_config(config: dict) -> dict:
    """The decoder's config: multimodal configs (Mllama, Gemma-3, Qwen-VL, Qwen3.5, Llava) keep
    it under ``text_config``, whose keys win; the family's defaults fill what both leave out."""
    text = config.get("text_config")
    if isinstance(text, Mapping):
        merged = {**config, **{k: v for k, v in text.items() if v is not None}}
        merged["model_type"] = text.get("model_type") or config.get("model_type")
    else:
        merged = dict(config)
    family = _family(merged)
    if family == "gemma3":  # a text-only Gemma-3 config spells its type gemma3_text
        family = "gemma3_text"
    for key, value in FAMILY_DEFAULTS.get(family, {}).items():
        if merged.get(key) is None:
            merged[key] = value
    return merged


def _family(config: dict) -> str:
    return str(config.get("model_type") or "").lower()


def _experts(config: dict) -> int:
    for key in MOE_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def _head_dim(config: dict, heads: int, hidden: int | None) -> int:
    """``head_dim`` as the family's transformers config sets it when the key is missing or null:
    its own default, else hidden / heads."""
    head_dim = config.get("head_dim")
    if head_dim is None:
        head_dim = FAMILY_HEAD_DIM.get(_family(config))
    if head_dim is None:
        if hidden is None:
            raise ValueError("config.json has neither 'head_dim' nor 'hidden_size'")
        if hidden % heads:
            raise ValueError(f"hidden_size {hidden} is not a multiple of {heads} heads")
        head_dim = hidden // heads
    return _int({"head_dim": head_dim}, "head_dim")


def _kv_heads(config: dict, heads: int) -> int:
    """``num_key_value_heads``, missing or null alike: multi-head attention where the family
    says so (transformers' rule), with a warning for a family that usually shares KV heads;
    refused for a family kvlab does not know (4x the KV, or a quarter, is no guess to make)."""
    if config.get("num_key_value_heads") is not None:
        return _int(config, "num_key_value_heads")
    family = _family(config)
    if family in MHA_FAMILIES:
        return heads
    if family in GQA_FAMILIES:
        warnings.warn(
            f"config.json gives no num_key_value_heads: read as {heads} (multi-head attention, "
            f"one KV head per query head), as transformers' {family} config does",
            UserWarning,
            stacklevel=3,
        )
        return heads
    raise ValueError(
        f"config.json gives no num_key_value_heads and kvlab does not know how the "
        f"{family or 'unnamed'} family defaults it: add num_key_value_heads"
    )


def _refuse_unmodelled(config: dict) -> None:
    if config.get("cross_attention_layers"):
        layers = config["cross_attention_layers"]
        raise ValueError(
            f"config.json has cross_attention_layers ({len(layers)} layers attending to an "
            "image's encoder states, as Llama-3.2-Vision): kvlab models self-attention only and "
            "would count them as self-attention; plan the text model alone"
        )
    for key in ("attention_chunk_size", "no_rope_layers"):
        if config.get(key) and key == "attention_chunk_size":
            raise ValueError(
                "config.json has attention_chunk_size (chunked local attention, as Llama-4): "
                "kvlab does not model its KV spec"
            )


def layer_kinds(config) -> list[str]:
    """The kind of every decoder layer: ``full_attention``, ``sliding_attention``,
    ``linear_attention`` (Gated DeltaNet), ``mamba`` (Mamba2), or ``mlp`` / ``moe`` (no cache),
    as transformers derives them. An unknown kind raises, naming it."""
    config = _text_config(_load(config))
    family = _family(config)
    n = _int(config, "num_hidden_layers")
    pattern = config.get("hybrid_override_pattern")
    blocks = config.get("layers_block_type")
    types = config.get("layer_types")
    if pattern is not None:
        if not isinstance(pattern, str) or len(pattern) != n:
            raise ValueError(
                f"config.json's hybrid_override_pattern must be a str of num_hidden_layers={n} "
                f"characters, got {pattern!r}"
            )
        unknown = sorted(set(pattern) - set(PATTERN_KINDS))
        if unknown:
            raise ValueError(
                f"config.json's hybrid_override_pattern has layer kinds kvlab does not know: "
                f"{', '.join(map(repr, unknown))} (it knows M Mamba2, * attention, - MLP, E MoE)"
            )
        return [PATTERN_KINDS[c] for c in pattern]
    if blocks is not None:
        if not isinstance(blocks, list) or len(blocks) != n:
            raise ValueError(
                f"config.json's layers_block_type must list num_hidden_layers={n} kinds"
            )
        unknown = sorted({str(b) for b in blocks} - set(BLOCK_TYPES))
        if unknown:
            raise ValueError(
                f"config.json's layers_block_type has layer kinds kvlab does not model: "
                f"{', '.join(unknown)}"
            )
        return [BLOCK_TYPES[str(b)] for b in blocks]
    if types is not None:
        if not isinstance(types, list) or len(types) != n:
            raise ValueError(f"config.json's layer_types must list num_hidden_layers={n} kinds")
        unknown = sorted({str(t) for t in types} - set(ATTENTION_KINDS))
        if unknown:
            raise ValueError(
                f"config.json's layer_types has layer kinds kvlab does not model: "
                f"{', '.join(unknown)} (it models {', '.join(ATTENTION_KINDS)})"
            )
        return [str(t) for t in types]
    if family in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"):
        interval = _int(config, "full_attention_interval")
        return [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)
        ]
    window = config.get("sliding_window")
    if family in ("gemma3_text", "gemma3") and window:
        every = _int(config, "sliding_window_pattern")
        return ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(n)]
    if family == "gemma2" and window:
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    if family == "gpt_oss":
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    if family.startswith("qwen2") or family.startswith("qwen3"):
        # Qwen2/3: a window only with use_sliding_window, on the layers from max_window_layers
        if config.get("use_sliding_window") and window:
            first = config.get("max_window_layers")
            first = n if first is None else first
            return ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
        return ["full_attention"] * n
    if window and config.get("use_sliding_window") is not False:
        return ["sliding_attention"] * n  # Mistral, Mixtral: every layer
    return ["full_attention"] * n


def _mamba_state_bytes(config: dict, dtype_bytes: int) -> int:
    """One Mamba2 layer's state on one GPU, vLLM's ``mamba2_state_shape``: a conv state of
    (conv_kernel - 1) x (intermediate + 2 x n_groups x state) and an SSM state of heads x
    head_dim x state, both in the model's dtype (vLLM's ``mamba_cache_dtype="auto"``)."""
    heads = _int(config, "mamba_num_heads")
    head_dim = _int(config, "mamba_head_dim")
    state = _int(config, "ssm_state_size", config.get("mamba_d_state"))
    groups = _int(config, "n_groups")
    kernel = _int(config, "conv_kernel")
    conv = (kernel - 1) * (heads * head_dim + 2 * groups * state)
    return (conv + heads * head_dim * state) * dtype_bytes


def _gdn_state_bytes(config: dict, dtype_bytes: int) -> int:
    """One Gated-DeltaNet layer's state on one GPU, vLLM's ``gated_delta_net_state_shape``: a
    conv state of (kernel - 1) x (2 x key heads x key dim + value heads x value dim) and a
    recurrent state of value heads x value dim x key dim, in the model's dtype."""
    nk = _int(config, "linear_num_key_heads")
    nv = _int(config, "linear_num_value_heads")
    dk = _int(config, "linear_key_head_dim")
    dv = _int(config, "linear_value_head_dim")
    kernel = _int(config, "linear_conv_kernel_dim")
    conv = (kernel - 1) * (2 * nk * dk + nv * dv)
    return (conv + nv * dv * dk) * dtype_bytes


def layer_groups_from_config(config, *, dtype_bytes: int = 2) -> tuple[LayerGroup, ...]:
    """The model's layers as :mod:`kvlab.core.kv_spec` groups, one per kind, in the model's
    dtype (what vLLM v1 builds before grouping and padding them, :mod:`kvlab.perf.kv_groups`)."""
    config = _text_config(_load(config))
    _refuse_unmodelled(config)
    kinds = layer_kinds(config)
    heads = _int(config, "num_attention_heads")
    fmt = format_of_bytes(dtype_bytes)
    counts: dict[str, int] = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
    groups = []
    attention = [k for k in ("full_attention", "sliding_attention") if k in counts]
    if config.get("kv_lora_rank") is not None and attention:
        rope = _int(config, "qk_rope_head_dim")
        spec = MLASpec(_int(config, "kv_lora_rank"), rope, fmt)
        groups.append(LayerGroup(spec, sum(counts[k] for k in attention)))
    else:
        hidden = _int(config, "hidden_size", required=False)
        head_dim = _head_dim(config, heads, hidden) if attention else None
        kv_heads = _kv_heads(config, heads) if attention else None
        if "full_attention" in counts:
            groups.append(
                LayerGroup(FullAttentionSpec(kv_heads, head_dim, fmt), counts["full_attention"])
            )
        if "sliding_attention" in counts:
            window = _int(config, "sliding_window")
            spec = SlidingWindowSpec(kv_heads, head_dim, fmt, window=window)
            groups.append(LayerGroup(spec, counts["sliding_attention"]))
    if "mamba" in counts:
        spec = StateSpec(_mamba_state_bytes(config, dtype_bytes), layer_type="mamba2")
        groups.append(LayerGroup(spec, counts["mamba"]))
    if "linear_attention" in counts:
        spec = StateSpec(_gdn_state_bytes(config, dtype_bytes), layer_type="gated_deltanet")
        groups.append(LayerGroup(spec, counts["linear_attention"]))
    if not groups:
        raise ValueError("config.json describes no layer that keeps a KV cache or a state")
    return tuple(groups)


# --- parameters ---------------------------------------------------------------------------------


def _mlp(hidden: int, width: int, config: dict) -> int:
    """A dense MLP: gated (gate, up, down) for silu / gelu models, two matrices for
    Nemotron-H's squared ReLU."""
    act = str(config.get("mlp_hidden_act") or config.get("hidden_act") or "silu")
    if act == "relu2":
        return 2 * hidden * width
    return 3 * hidden * width


def _attention_params(config: dict, hidden: int, heads: int) -> int:
    if config.get("kv_lora_rank") is not None:  # MLA (DeepSeek-V2/V3)
        rank = _int(config, "kv_lora_rank")
        rope = _int(config, "qk_rope_head_dim")
        nope = _int(config, "qk_nope_head_dim")
        v_dim = _int(config, "v_head_dim")
        q_rank = config.get("q_lora_rank")
        q_out = heads * (nope + rope)
        q = hidden * q_out if q_rank is None else hidden * q_rank + q_rank + q_rank * q_out
        kv = hidden * (rank + rope) + rank + rank * heads * (nope + v_dim)
        return q + kv + heads * v_dim * hidden
    head_dim = _head_dim(config, heads, hidden)
    kv_heads = config.get("num_key_value_heads") or heads
    q_width, kv_width = heads * head_dim, kv_heads * head_dim
    gate = 2 if config.get("attn_output_gate") else 1  # Qwen3.5 / Qwen3-Next gate the output
    params = hidden * q_width * gate + 2 * hidden * kv_width + q_width * hidden
    family = _family(config)
    if config.get("attention_bias") or family.startswith("qwen2"):
        params += q_width + 2 * kv_width + (hidden if family == "gpt_oss" else 0)
    if family.startswith("qwen3") or family.startswith("gemma3"):
        params += 2 * head_dim  # q_norm and k_norm
    if family == "gpt_oss":
        params += heads  # attention sinks
    return params


def _moe_params(config: dict, hidden: int) -> int:
    experts = _experts(config)
    family = _family(config)
    width = config.get("moe_intermediate_size") or config.get("intermediate_size")
    if family == "gpt_oss":  # fused gate_up with biases, down with bias, router with bias
        per_expert = 2 * hidden * width + 2 * width + width * hidden + hidden
        return experts * per_expert + hidden * experts + experts
    params = experts * 3 * hidden * width + hidden * experts  # routed experts and their router
    shared = config.get("n_shared_experts") or 0
    params += shared * 3 * hidden * width
    shared_width = config.get("shared_expert_intermediate_size") or config.get(
        "moe_shared_expert_intermediate_size"
    )
    if shared_width:
        params += _mlp(hidden, shared_width, config) + (hidden if family.startswith("qwen") else 0)
    if config.get("topk_method") == "noaux_tc":
        params += experts  # e_score_correction_bias
    return params


def _mamba_params(config: dict, hidden: int) -> int:
    heads = _int(config, "mamba_num_heads")
    inner = heads * _int(config, "mamba_head_dim")
    state = _int(config, "ssm_state_size", config.get("mamba_d_state"))
    groups = _int(config, "n_groups")
    conv_dim = inner + 2 * groups * state
    in_proj = hidden * (2 * inner + 2 * groups * state + heads)
    conv = conv_dim * _int(config, "conv_kernel") + (
        conv_dim if config.get("use_conv_bias", True) else 0
    )
    return in_proj + conv + 3 * heads + inner + inner * hidden  # dt_bias, A_log, D; norm; out


def _gdn_params(config: dict, hidden: int) -> int:
    nk, nv = _int(config, "linear_num_key_heads"), _int(config, "linear_num_value_heads")
    dk, dv = _int(config, "linear_key_head_dim"), _int(config, "linear_value_head_dim")
    key, value = nk * dk, nv * dv
    in_proj = hidden * (2 * key + 2 * value) + hidden * 2 * nv  # qkvz, then b and a
    conv = (2 * key + value) * _int(config, "linear_conv_kernel_dim")
    return in_proj + conv + 2 * nv + dv + value * hidden  # dt_bias, A_log; norm; out


def _is_moe_layer(config: dict, i: int) -> bool:
    if not _experts(config):
        return False
    dense_first = config.get("first_k_dense_replace") or 0
    if i < dense_first or i in (config.get("mlp_only_layers") or []):
        return False
    step = config.get("decoder_sparse_step") or config.get("moe_layer_freq") or 1
    return (i + 1) % step == 0 if "decoder_sparse_step" in config else i % step == 0


def count_params(config: dict) -> float | None:
    """Parameters of a decoder from its config (every expert counted), or None when the config
    lacks a size. The decoder only: a multimodal model's vision tower is left out."""
    config = _text_config(_load(config))
    hidden = config.get("hidden_size")
    vocab = config.get("vocab_size")
    layers = config.get("num_hidden_layers")
    heads = config.get("num_attention_heads")
    if not all(isinstance(v, int) and v > 0 for v in (hidden, vocab, layers, heads)):
        return None
    opt_style = "ffn_dim" in config
    width = config.get("ffn_dim") if opt_style else config.get("intermediate_size")
    if not isinstance(width, int) or width <= 0:
        width = None
    if opt_style:  # OPT: biases everywhere, LayerNorm with bias, two-matrix MLP
        head_dim = config.get("head_dim") or hidden // heads
        kv_width = (config.get("num_key_value_heads") or heads) * head_dim
        q_width = heads * head_dim
        bias = config.get("enable_bias", True)
        attention = hidden * q_width + 2 * hidden * kv_width + q_width * hidden
        attention += (q_width + 2 * kv_width + hidden) if bias else 0
        mlp = 2 * hidden * width + ((width + hidden) if bias else 0)
        positions = (config.get("max_position_embeddings", 0) + 2) * hidden  # learned, offset 2
        embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings", True) else 2)
        return float(
            embeddings + positions + layers * (attention + mlp + 2 * 2 * hidden) + 2 * hidden
        )
    try:
        kinds = layer_kinds(config)
    except ValueError:
        return None
    family = _family(config)
    norms_per_layer = 4 if family.startswith("gemma") else (1 if family == "nemotron_h" else 2)
    total = 0
    for i, kind in enumerate(kinds):
        total += norms_per_layer * hidden
        if kind in ("full_attention", "sliding_attention"):
            total += _attention_params(config, hidden, heads)
        elif kind == "mamba":
            total += _mamba_params(config, hidden)
        elif kind == "linear_attention":
            total += _gdn_params(config, hidden)
        if family == "nemotron_h":  # its pattern names each layer's one block
            if kind == "mlp" and width:
                total += _mlp(hidden, width, config)
            elif kind == "moe":
                total += _moe_params(config, hidden)
            continue
        if _is_moe_layer(config, i):
            total += _moe_params(config, hidden)
        elif width:
            total += _mlp(hidden, width, config)
        else:
            return None
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings", True) else 2)
    return float(embeddings + total + hidden)


def spec_from_hf_config(config, *, name: str | None = None) -> ModelSpec:
    """The KV layout (its layer groups) and, when countable, the parameters of the model a
    config.json describes.

    ``config``: the parsed JSON (a dict) or the file's path. Defaults are each family's, as in
    transformers (see the module docstring); a mixture-of-experts model's parameters count every
    expert (the weights a GPU must hold), ``num_params`` None when the config's layers cannot be
    counted. Cross-attention, chunked attention and unknown layer kinds raise a ValueError that
    names them.
    """
    raw = _load(config)
    config = _text_config(raw)
    _refuse_unmodelled(config)
    layers = _int(config, "num_hidden_layers")
    heads = _int(config, "num_attention_heads")
    hidden = _int(config, "hidden_size", required=False)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    dtype = dtype.removeprefix("torch.")
    if dtype not in DTYPE_BYTES:
        raise ValueError(
            f"config.json's torch_dtype {dtype!r} is not one of {', '.join(DTYPE_BYTES)}"
        )
    dtype_bytes = DTYPE_BYTES[dtype]
    groups = layer_groups_from_config(config, dtype_bytes=dtype_bytes)
    kinds = layer_kinds(config)
    attention = [g for g in groups if isinstance(g.spec, FullAttentionSpec)]
    if attention:
        kv_heads, head_dim = attention[0].spec.num_kv_heads, attention[0].spec.head_dim
    else:  # MLA or no attention: the query shape, for the roofline's attention FLOPs
        kv_heads = heads
        head_dim = config.get("qk_nope_head_dim", 0) + config.get("qk_rope_head_dim", 0) or (
            _head_dim(config, heads, hidden)
        )
    if heads % kv_heads:
        kv_heads = heads  # a layout ModelSpec's GQA check cannot hold; the groups are exact
    sliding = [g.spec.window for g in groups if isinstance(g.spec, SlidingWindowSpec)]
    dense = len(groups) == 1 and type(groups[0].spec) is FullAttentionSpec
    mistral_like = (
        len(groups) == 1 and isinstance(groups[0].spec, SlidingWindowSpec) and len(kinds) == layers
    )
    width = config.get("ffn_dim", config.get("intermediate_size"))
    return ModelSpec(
        name or str(config.get("_name_or_path") or config.get("model_type") or "hf-model"),
        len([k for k in kinds if k in ("full_attention", "sliding_attention")]) or layers,
        heads,
        kv_heads,
        head_dim,
        dtype_bytes=dtype_bytes,
        num_params=count_params(raw),
        max_context=_int(config, "max_position_embeddings", required=False),
        hidden_size=hidden,
        intermediate_size=width if isinstance(width, int) and width > 0 else None,
        vocab_size=_int(config, "vocab_size", required=False),
        sliding_window=sliding[0] if sliding else None,
        layers=None if dense or mistral_like else groups,
    )


VENDORED_CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_configs")


def vendored_names() -> list[str]:
    """The real config.json files kvlab ships (``hf_configs/``, sources in its README)."""
    return sorted(f[: -len(".json")] for f in os.listdir(VENDORED_CONFIGS) if f.endswith(".json"))


def vendored_spec(name: str) -> ModelSpec:
    """The spec of a config.json kvlab ships, by its name ("Gemma-3-27B"), named so."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__} {name!r}")
    if name not in vendored_names():
        raise ValueError(f"name must be one of {', '.join(vendored_names())}, got {name!r}")
    return spec_from_hf_config(os.path.join(VENDORED_CONFIGS, f"{name}.json"), name=name)
