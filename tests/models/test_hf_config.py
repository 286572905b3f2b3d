"""spec_from_hf_config: shapes and parameter counts from config.json facts (written here from
the models' published config.json), counts within 1% of the published figures."""

import dataclasses
import json

import pytest

from kvlab.models import LLAMA_3_8B, MISTRAL_7B, MISTRAL_7B_V03, PRESETS, ModelSpec
from kvlab.models.hf_config import count_params, spec_from_hf_config

LLAMA_3_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16", "tie_word_embeddings": False, "hidden_act": "silu",
}  # fmt: skip
LLAMA_3_70B_CONFIG = dict(LLAMA_3_8B_CONFIG, hidden_size=8192, intermediate_size=28672,
                          num_hidden_layers=80, num_attention_heads=64)  # fmt: skip
MISTRAL_V01_CONFIG = dict(LLAMA_3_8B_CONFIG, model_type="mistral", vocab_size=32000,
                          max_position_embeddings=32768, sliding_window=4096)  # fmt: skip
MISTRAL_V03_CONFIG = dict(MISTRAL_V01_CONFIG, vocab_size=32768, sliding_window=None)
OPT_13B_CONFIG = {
    "model_type": "opt", "hidden_size": 5120, "ffn_dim": 20480, "num_hidden_layers": 40,
    "num_attention_heads": 40, "vocab_size": 50272, "max_position_embeddings": 2048,
    "torch_dtype": "float16", "enable_bias": True, "word_embed_proj_dim": 5120,
}  # fmt: skip
QWEN25_7B_CONFIG = {
    "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
    "vocab_size": 152064, "max_position_embeddings": 32768, "torch_dtype": "bfloat16",
    "tie_word_embeddings": False, "sliding_window": 131072, "use_sliding_window": False,
}  # fmt: skip
QWEN25_05B_CONFIG = dict(QWEN25_7B_CONFIG, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         vocab_size=151936, tie_word_embeddings=True)  # fmt: skip


@pytest.mark.parametrize(
    "config, published",
    [
        (LLAMA_3_8B_CONFIG, 8.03e9),
        (LLAMA_3_70B_CONFIG, 70.6e9),
        (MISTRAL_V01_CONFIG, 7.24e9),
        (MISTRAL_V03_CONFIG, 7.25e9),
        (OPT_13B_CONFIG, 12.9e9),
        (QWEN25_7B_CONFIG, 7.61e9),
        (QWEN25_05B_CONFIG, 0.494e9),
    ],
)
def test_parameter_counts_match_the_published_ones(config, published):
    assert count_params(config) == pytest.approx(published, rel=0.01)


def test_tied_embeddings_and_mlp_style_change_the_count():
    untied = count_params(dict(QWEN25_05B_CONFIG, tie_word_embeddings=False))
    assert untied - count_params(QWEN25_05B_CONFIG) == 151936 * 896
    # a two-matrix MLP (OPT's ffn_dim) is not counted as a gated three-matrix one
    gated = dict(OPT_13B_CONFIG, intermediate_size=20480)
    del gated["ffn_dim"]
    assert count_params(gated) > count_params(OPT_13B_CONFIG) + 40 * 5120 * 20480 * 0.9


def test_spec_matches_the_presets_shape():
    spec = spec_from_hf_config(LLAMA_3_8B_CONFIG, name="Llama-3-8B")
    same = ("num_layers", "num_q_heads", "num_kv_heads", "head_dim", "dtype_bytes", "max_context",
            "hidden_size", "intermediate_size", "vocab_size")  # fmt: skip
    for field in same:
        assert getattr(spec, field) == getattr(LLAMA_3_8B, field), field
    assert spec.kv_bytes_per_token == 131_072
    assert spec_from_hf_config(OPT_13B_CONFIG).kv_bytes_per_token == 819_200
    assert spec_from_hf_config(OPT_13B_CONFIG).num_kv_heads == 40  # default: the heads


def test_every_preset_recounts_within_one_percent():
    configs = {
        "OPT-13B": OPT_13B_CONFIG, "Llama-3-8B": LLAMA_3_8B_CONFIG,
        "Llama-3-70B": LLAMA_3_70B_CONFIG, "Mistral-7B": MISTRAL_V01_CONFIG,
        "Mistral-7B-v0.3": MISTRAL_V03_CONFIG, "Llama-3.1-8B": LLAMA_3_8B_CONFIG,
        "Llama-3.1-70B": LLAMA_3_70B_CONFIG, "Qwen2.5-7B-Instruct": QWEN25_7B_CONFIG,
    }  # fmt: skip
    assert set(configs) == set(PRESETS)
    for name, config in configs.items():
        spec = PRESETS[name]
        assert count_params(config) == pytest.approx(spec.num_params, rel=0.01), name
        assert spec.hidden_size == config["hidden_size"]
        assert spec.vocab_size == config["vocab_size"]


def test_sliding_window_and_versions():
    assert spec_from_hf_config(MISTRAL_V01_CONFIG).sliding_window == 4096
    assert spec_from_hf_config(MISTRAL_V03_CONFIG).sliding_window is None
    assert spec_from_hf_config(QWEN25_7B_CONFIG).sliding_window is None  # use_sliding_window off
    assert (MISTRAL_7B.version, MISTRAL_7B.sliding_window) == ("v0.1", 4096)
    assert (MISTRAL_7B_V03.version, MISTRAL_7B_V03.sliding_window) == ("v0.3", None)
    assert PRESETS["Llama-3.1-8B"].max_context == PRESETS["Llama-3.1-70B"].max_context == 131072


def test_head_dim_and_text_config():
    assert spec_from_hf_config(dict(LLAMA_3_8B_CONFIG, head_dim=64)).head_dim == 64
    nested = {"model_type": "mllama", "text_config": dict(LLAMA_3_8B_CONFIG, num_hidden_layers=40)}
    assert spec_from_hf_config(nested).num_layers == 40


def test_reads_a_path(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN25_7B_CONFIG))
    spec = spec_from_hf_config(path)
    assert (spec.num_layers, spec.num_kv_heads, spec.kv_bytes_per_token) == (28, 4, 57_344)
    assert spec_from_hf_config(str(path)) == spec


@pytest.mark.parametrize(
    "config, error, match",
    [
        (42, TypeError, "dict"),
        ({"num_attention_heads": 8}, ValueError, "num_hidden_layers"),
        (dict(LLAMA_3_8B_CONFIG, num_key_value_heads=0), ValueError, "num_key_value_heads"),
        (dict(LLAMA_3_8B_CONFIG, cross_attention_layers=[3, 8]), ValueError, "cross_attention"),
        (dict(LLAMA_3_8B_CONFIG, torch_dtype="int3"), ValueError, "torch_dtype"),
        ({"num_hidden_layers": 2, "num_attention_heads": 2}, ValueError, "head_dim"),
    ],
)
def test_bad_configs_say_what_is_wrong(config, error, match):
    with pytest.raises(error, match=match):
        spec_from_hf_config(config)


def test_fp8_kv_halves_bytes_per_token_not_weights():
    fp8 = LLAMA_3_8B.with_kv_dtype("fp8")
    assert fp8.kv_bytes_per_token * 2 == LLAMA_3_8B.kv_bytes_per_token == 131_072
    assert fp8.weights_bytes == LLAMA_3_8B.weights_bytes == 8.03e9 * 2
    assert fp8.with_kv_dtype("auto") == LLAMA_3_8B
    assert LLAMA_3_8B.with_kv_dtype("FP8_E5M2").kv_dtype_bytes == 1
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLAMA_3_8B.with_kv_dtype("int4")
    with pytest.raises(TypeError, match="kv_cache_dtype"):
        LLAMA_3_8B.with_kv_dtype(8)


def test_old_constructor_calls_keep_working():
    spec = ModelSpec("x", 2, 4, 2, 8, 2, 1e6, 1024)  # the eight positional fields of before
    assert spec.hidden_size is None and spec.kv_bytes_per_token == 2 * 2 * 2 * 8 * 2
    with pytest.raises(ValueError, match="hidden_size"):
        dataclasses.replace(spec, hidden_size=0)
