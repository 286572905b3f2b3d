"""vLLM v1's grouping of a model's layers (kvlab.perf.kv_groups): equal groups with padding,
one page size, what a request reserves (vllm/v1/core/kv_cache_utils.py)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.core.kv_spec import (
    FullAttentionSpec,
    LayerGroup,
    MLASpec,
    SlidingWindowSpec,
    StateSpec,
)
from kvlab.perf.kv_groups import exact_bytes, kv_cache_layout, shard, windows_kept_whole

FULL = FullAttentionSpec(16, 128)
WINDOW = SlidingWindowSpec(16, 128, window=1024)


def test_a_dense_model_is_one_group_of_all_its_layers():
    layout = kv_cache_layout([LayerGroup(FullAttentionSpec(8, 128), 32)])
    assert len(layout.groups) == 1 and layout.group_size == 32 and layout.padding_layers == 0
    assert layout.block_bytes == 32 * 16 * 8 * 128 * 2 * 2
    assert layout.num_blocks(10 * layout.block_bytes - 1) == 9
    assert layout.blocks_reserved(2048, 8192) == 128
    assert layout.blocks_reserved(2049, 8192) == 129  # a partial block is a whole block


def test_gemma_3_pads_52_window_layers_to_six_groups_of_ten():
    layout = kv_cache_layout([LayerGroup(FULL, 10), LayerGroup(WINDOW, 52)])
    assert layout.group_size == 10 and len(layout.groups) == 7 and layout.padding_layers == 8
    assert sorted(g.num_layers for g in layout.groups) == [8, 8, 9, 9, 9, 9, 10]
    # full: every block of 131,072 tokens; each window group: cdiv(1023 + 8192, 16) + 1
    assert layout.blocks_reserved(131072, 8192) == 8192 + 6 * 577


def test_near_equal_counts_take_the_larger_group():
    # vLLM's 1.5 rule: 12 window + 13 full layers pad to 13 + 13, not 12 + 24
    layout = kv_cache_layout([LayerGroup(FULL, 13), LayerGroup(WINDOW, 12)])
    assert layout.group_size == 13 and len(layout.groups) == 2 and layout.padding_layers == 1


def test_a_window_reserves_its_window_and_a_step():
    # cdiv(min(window - 1 + max_num_batched_tokens, max_model_len), block) + 1
    spec = SlidingWindowSpec(8, 128, window=4096)
    layout = kv_cache_layout([LayerGroup(spec, 32)])
    assert layout.blocks_reserved(32768, 8192) == 768 + 1
    assert layout.blocks_reserved(4096, 2048) == 256 + 1  # capped at max_model_len


def test_a_mamba_hybrid_grows_the_attention_block_to_hold_the_state():
    state = StateSpec(2_158_592, layer_type="mamba2")  # Nemotron-H-8B's Mamba2 layer, bf16
    layout = kv_cache_layout([LayerGroup(FullAttentionSpec(8, 128), 4), LayerGroup(state, 24)])
    # 16 x cdiv(state, 16 x 4,096 bytes a token) = 528 tokens, the state padded to its page
    assert layout.block_size == 528 and layout.page_bytes == 528 * 4096
    assert len(layout.groups) == 7 and layout.group_size == 4
    assert layout.blocks_reserved(8192, 8192) == 16 + 6  # cdiv(8192, 528) + one per state group


def test_tensor_parallel_splits_heads_but_copies_a_latent():
    assert shard(FullAttentionSpec(8, 128), 16).num_kv_heads == 1  # a head is copied
    assert shard(FullAttentionSpec(8, 128), 2).num_kv_heads == 4
    mla = MLASpec(512, 64)
    assert shard(mla, 8) == mla and mla.token_bytes() == 576 * 2
    assert shard(StateSpec(1000), 4).state_bytes == 250


def test_pages_that_do_not_divide_are_refused():
    with pytest.raises(ValueError, match="do not divide"):
        kv_cache_layout(
            [
                LayerGroup(FullAttentionSpec(3, 128), 4),
                LayerGroup(SlidingWindowSpec(2, 128, window=64), 8),
            ]
        )


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="layer_groups"):
        kv_cache_layout([])
    with pytest.raises(TypeError, match="layer_groups must hold LayerGroups"):
        kv_cache_layout([FULL])
    with pytest.raises(ValueError, match="block_size"):
        kv_cache_layout([LayerGroup(FULL, 1)], block_size=0)


@given(
    full=st.integers(1, 80),
    window=st.integers(1, 80),
    max_len=st.integers(1, 300_000),
)
def test_every_layer_has_a_slot_and_padding_stays_under_a_group(full, window, max_len):
    layout = kv_cache_layout([LayerGroup(FULL, full), LayerGroup(WINDOW, window)])
    assert sum(g.num_layers for g in layout.groups) == full + window
    assert len(layout.groups) * layout.group_size == full + window + layout.padding_layers
    assert layout.padding_layers < 2 * layout.group_size
    reserved = layout.blocks_reserved(max_len, 8192)
    assert reserved >= -(-max_len // 16)  # the full group's every block at least


def test_one_rule_changed_at_a_time():
    """Lab 11's slips: the 1.5 rule off (always the fewest, always the most) and the state's
    block grown to no multiple of 16."""
    gemma = [LayerGroup(FULL, 10), LayerGroup(WINDOW, 52)]
    assert kv_cache_layout(gemma, group_size_ratio=float("inf")).group_size == 52
    near = [LayerGroup(FULL, 13), LayerGroup(WINDOW, 12)]
    assert kv_cache_layout(near, group_size_ratio=1).group_size == 12
    state = StateSpec(2_158_592, layer_type="mamba2")
    mamba = [LayerGroup(FullAttentionSpec(8, 128), 4), LayerGroup(state, 24)]
    assert kv_cache_layout(mamba, block_alignment=1).block_size == 527
    with pytest.raises(ValueError, match="group_size_ratio"):
        kv_cache_layout(gemma, group_size_ratio=0.5)
    with pytest.raises(TypeError, match="group_size_ratio"):
        kv_cache_layout(gemma, group_size_ratio="1.5")
    with pytest.raises(ValueError, match="block_alignment"):
        kv_cache_layout(mamba, block_alignment=0)


def test_windows_kept_whole_and_exact_bytes():
    gemma = [LayerGroup(FULL, 10), LayerGroup(WINDOW, 52)]
    kept = windows_kept_whole(gemma)
    assert [type(g.spec) for g in kept] == [FullAttentionSpec, FullAttentionSpec]
    assert kv_cache_layout(kept).groups[0].num_layers == 62  # one group, every layer
    token = FULL.token_bytes()
    assert exact_bytes(gemma, 4096) == 10 * token * 4096 + 52 * token * 1024
    assert exact_bytes([LayerGroup(StateSpec(1000), 3)], 10) == 3000
    with pytest.raises(TypeError, match="LayerGroups"):
        windows_kept_whole([FULL])
    with pytest.raises(ValueError, match="num_tokens"):
        exact_bytes(gemma, 0)
