import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.models import LLAMA_3_8B, LLAMA_3_70B, MISTRAL_7B, OPT_13B, PRESETS, ModelSpec, preset


def test_opt13b_is_800kb_per_token_as_in_the_paper():
    assert OPT_13B.kv_bytes_per_token == 819_200
    assert OPT_13B.kv_bytes(2048) == 819_200 * 2048  # "1.6 GB" in the paper


def test_gqa_presets_cache_only_kv_heads():
    assert LLAMA_3_8B.kv_bytes_per_token == 131_072  # 128 KiB
    assert MISTRAL_7B.kv_bytes_per_token == 131_072
    assert LLAMA_3_70B.kv_bytes_per_token == 327_680  # 320 KiB
    assert LLAMA_3_8B.group_size == 4 and LLAMA_3_70B.group_size == 8


def test_presets_have_what_the_roofline_needs():
    assert set(PRESETS) == {
        "OPT-13B",
        "Llama-3-8B",
        "Llama-3-70B",
        "Mistral-7B",
        "Mistral-7B-v0.3",
        "Llama-3.1-8B",
        "Llama-3.1-70B",
        "Qwen2.5-7B-Instruct",
    }
    for spec in PRESETS.values():
        assert spec.num_params > 1e9 and spec.max_context >= 2048
    assert preset("llama-3-8b") is LLAMA_3_8B
    with pytest.raises(KeyError, match="unknown model 'gpt-9'"):
        preset("gpt-9")


@given(
    layers=st.integers(1, 128),
    kv=st.integers(1, 16),
    group=st.integers(1, 8),
    head_dim=st.integers(1, 512),
    dtype=st.sampled_from([1, 2, 4]),
    tokens=st.integers(0, 10_000),
)
def test_kv_bytes_formula(layers, kv, group, head_dim, dtype, tokens):
    spec = ModelSpec("m", layers, kv * group, kv, head_dim, dtype)
    assert spec.kv_bytes_per_token == 2 * layers * kv * head_dim * dtype
    assert spec.kv_bytes(tokens) == tokens * spec.kv_bytes_per_token


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"num_layers": 0}, ValueError, "num_layers must be >= 1"),
        ({"head_dim": -3}, ValueError, "head_dim must be >= 1"),
        ({"num_kv_heads": 3}, ValueError, "num_q_heads .* multiple of num_kv_heads"),
        ({"dtype_bytes": 2.0}, TypeError, "dtype_bytes must be an int"),
        ({"num_layers": True}, TypeError, "num_layers must be an int"),
        ({"max_context": 0}, ValueError, "max_context must be >= 1"),
    ],
)
def test_bad_specs_name_the_argument(kwargs, error, match):
    fields = {"name": "m", "num_layers": 2, "num_q_heads": 4, "num_kv_heads": 2, "head_dim": 8}
    with pytest.raises(error, match=match):
        ModelSpec(**{**fields, **kwargs})


def test_kv_bytes_rejects_negative_tokens():
    with pytest.raises(ValueError, match="num_tokens must be >= 0"):
        OPT_13B.kv_bytes(-1)
