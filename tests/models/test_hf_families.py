"""spec_from_hf_config as transformers reads each family (issue 34): layer kinds, windows, MLA,
Mamba2 / Gated-DeltaNet states, MoE weights, family defaults, missing == null, refusals by name."""

import json
import warnings
from pathlib import Path

import pytest

from kvlab.core.kv_spec import FullAttentionSpec, MLASpec, SlidingWindowSpec, StateSpec
from kvlab.models import LLAMA_3_8B, MISTRAL_7B
from kvlab.models.hf_config import count_params, layer_kinds, spec_from_hf_config

CONFIGS = Path(__file__).resolve().parents[2] / "kvlab" / "models" / "hf_configs"


def config(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def test_twelve_configs_are_vendored_with_their_sources():
    names = sorted(p.stem for p in CONFIGS.glob("*.json"))
    assert len(names) == 12
    readme = (CONFIGS / "README.md").read_text()
    assert all(name in readme for name in names)


@pytest.mark.parametrize(
    "name, published",
    [("gpt-oss-20b", 20.9e9), ("gpt-oss-120b", 116.8e9), ("Qwen3-30B-A3B", 30.5e9),
     ("DeepSeek-V3", 671e9), ("Nemotron-H-8B", 8.1e9), ("Llama-3.1-70B", 70.6e9)],
)  # fmt: skip
def test_every_expert_is_counted(name, published):
    assert count_params(config(name)) == pytest.approx(published, rel=0.01)


def test_layer_kinds_follow_each_family():
    assert layer_kinds(config("Gemma-3-27B")).count("sliding_attention") == 52  # 5:1 pattern
    assert layer_kinds(config("gpt-oss-20b"))[:2] == ["sliding_attention", "full_attention"]
    assert layer_kinds(config("Qwen3.5-9B")).count("linear_attention") == 24
    nemotron = layer_kinds(config("Nemotron-H-8B"))
    assert (nemotron.count("full_attention"), nemotron.count("mamba")) == (4, 24)
    qwen2 = dict(config("Qwen2.5-7B"), use_sliding_window=True, sliding_window=4096,
                 max_window_layers=20)  # fmt: skip
    assert layer_kinds(qwen2).count("sliding_attention") == 8  # the layers from 20 on
    assert set(layer_kinds(config("Qwen2.5-7B"))) == {"full_attention"}  # use_sliding_window off
    interval = dict(config("Qwen3.5-9B")["text_config"], layer_types=None)
    assert layer_kinds(interval) == layer_kinds(config("Qwen3.5-9B"))  # full_attention_interval


def test_groups_hold_windows_latents_and_states():
    gemma = spec_from_hf_config(config("Gemma-3-27B")).layer_groups
    assert [type(g.spec) for g in gemma] == [FullAttentionSpec, SlidingWindowSpec]
    assert gemma[1].spec.window == 1024 and gemma[0].spec.head_dim == 128
    ds = spec_from_hf_config(config("DeepSeek-V3"))
    assert ds.layer_groups == (ds.layer_groups[0],) and isinstance(ds.layer_groups[0].spec, MLASpec)
    assert ds.kv_bytes_per_token == 61 * 576 * 2  # 512 + 64 latent elements, no factor of two
    nemotron = spec_from_hf_config(config("Nemotron-H-8B")).layer_groups
    assert nemotron[1].spec == StateSpec(2_158_592, layer_type="mamba2")
    qwen35 = spec_from_hf_config(config("Qwen3.5-9B")).layer_groups
    # conv (4 - 1) x (2 x 16 x 128 + 32 x 128) + recurrent 32 x 128 x 128, bf16
    assert qwen35[1].spec.state_bytes == (3 * 8192 + 32 * 128 * 128) * 2


def test_a_dense_config_keeps_the_dense_formula_and_mistral_its_window():
    llama = spec_from_hf_config(config("Llama-3.1-8B"))
    assert llama.layers is None and llama.is_dense and llama.kv_bytes_per_token == 131_072
    mistral = spec_from_hf_config(config("Mistral-7B-v0.1"))
    assert mistral.layer_groups == MISTRAL_7B.layer_groups
    assert MISTRAL_7B.kv_bytes_per_token == 131_072 and MISTRAL_7B.kv_bytes(2048) == 2048 * 131_072


def test_missing_and_null_mean_the_same():
    base = {k: v for k, v in config("Qwen3-8B").items() if k != "head_dim"}
    assert spec_from_hf_config(base).head_dim == 128  # Qwen3's default, not 4096 / 32
    assert spec_from_hf_config(dict(base, head_dim=None)).head_dim == 128
    gemma2 = {
        "model_type": "gemma2",
        "hidden_size": 3584,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "num_hidden_layers": 42,
        "intermediate_size": 14336,
    }
    assert spec_from_hf_config(gemma2).head_dim == 256  # not 3584 / 16 = 224
    no_kv = {k: v for k, v in LLAMA_CONFIG.items() if k != "num_key_value_heads"}
    with pytest.warns(UserWarning, match="num_key_value_heads"):
        missing = spec_from_hf_config(no_kv)
    with pytest.warns(UserWarning, match="num_key_value_heads"):
        null = spec_from_hf_config(dict(no_kv, num_key_value_heads=None))
    assert missing == null and missing.num_kv_heads == 32
    with pytest.raises(ValueError, match="num_key_value_heads"):
        spec_from_hf_config(dict(no_kv, model_type="somenewmodel"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert spec_from_hf_config(config("Llama-3.1-8B")).num_kv_heads == 8


LLAMA_CONFIG = {k: v for k, v in json.loads((CONFIGS / "Llama-3.1-8B.json").read_text()).items()}


@pytest.mark.parametrize(
    "change, match",
    [
        ({"cross_attention_layers": [3, 8, 13]}, "cross_attention_layers"),
        ({"layer_types": ["chunked_attention"] * 32}, "chunked_attention"),
        ({"layer_types": ["full_attention"] * 31}, "layer_types must list"),
        ({"attention_chunk_size": 8192}, "attention_chunk_size"),
        ({"hybrid_override_pattern": "M*X" + "-" * 29}, "'X'"),
        ({"layers_block_type": ["attention"] * 31 + ["hyena"]}, "hyena"),
    ],
)
def test_what_kvlab_does_not_model_is_refused_by_name(change, match):
    with pytest.raises(ValueError, match=match):
        spec_from_hf_config(dict(LLAMA_CONFIG, **change))


def test_kv_formats_are_vllms_choices():
    assert LLAMA_3_8B.with_kv_dtype("fp8").kv_format.name == "fp8"
    # int8 with an fp32 scale per token and head, K and V
    assert LLAMA_3_8B.with_kv_dtype("int8_per_token_head").kv_bytes_per_token == 32 * 8 * 2 * 132
    assert LLAMA_3_8B.with_kv_dtype("nvfp4").kv_bytes_per_token == 32 * 8 * 2 * (64 + 8)
    with pytest.raises(ValueError, match="latent"):
        LLAMA_3_8B.with_kv_dtype("fp8_ds_mla")
    ds = spec_from_hf_config(config("DeepSeek-V3")).with_kv_dtype("fp8_ds_mla")
    assert ds.kv_bytes_per_token == 61 * 656
    fp8 = spec_from_hf_config(config("Gemma-3-27B")).with_kv_dtype("fp8")
    assert (
        fp8.kv_bytes_per_token * 2 == spec_from_hf_config(config("Gemma-3-27B")).kv_bytes_per_token
    )


def test_a_vendored_config_is_read_by_name():
    from kvlab.models.hf_config import vendored_names, vendored_spec

    assert len(vendored_names()) == 12 and "Gemma-3-27B" in vendored_names()
    gemma = vendored_spec("Gemma-3-27B")
    assert gemma.name == "Gemma-3-27B"
    assert gemma.layer_groups == spec_from_hf_config(config("Gemma-3-27B")).layer_groups
    with pytest.raises(ValueError, match="name must be one of"):
        vendored_spec("Gemma-9")
    with pytest.raises(TypeError, match="name must be a str"):
        vendored_spec(None)
