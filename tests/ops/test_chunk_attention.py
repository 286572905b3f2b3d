"""Attention for a chunk of queries over paged K/V (chunked prefill): the same rows as plain causal
attention over the whole sequence, whatever the chunk and block sizes, and no slot outside the
sequence's tokens is ever read."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.ops.attention import causal_attention, chunk_attention_reference


def paged_sequence(total, block_size, kv_heads, head_dim, seed, spare_blocks=3, dtype=None):
    """One sequence's K/V scattered over shuffled blocks of a cache whose every other slot is NaN
    (the last block's unused slots, blocks nobody holds), with its block table padded by -1 and by
    a NaN block it never reaches. Returns (k, v, k_cache, v_cache, block_table)."""
    g = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.float32
    k = torch.randn(total, kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(total, kv_heads, head_dim, generator=g).to(dtype)
    blocks = -(-total // block_size)
    num_blocks = blocks + spare_blocks
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    order = torch.randperm(num_blocks, generator=g)
    table = order[:blocks]
    for t in range(total):
        b, offset = divmod(t, block_size)
        k_cache[table[b], offset] = k[t]
        v_cache[table[b], offset] = v[t]
    padded = torch.cat([table, order[blocks : blocks + 1], torch.tensor([-1, -1])])
    return k, v, k_cache, v_cache, padded


def expected(q_all, k, v, first):
    return causal_attention(q_all, k, v)[first:]


@settings(max_examples=60)
@given(
    block_size=st.sampled_from([1, 2, 3, 8, 16]),
    blocks=st.integers(1, 5),
    edge=st.sampled_from([-1, 0, 1]),  # the chunk ends one before, on, one after a boundary
    size=st.sampled_from(["one", "within", "across", "whole"]),
    heads=st.sampled_from([(4, 4), (8, 2), (6, 1)]),
    head_dim=st.sampled_from([8, 24, 40, 72]),
    seed=st.integers(0, 1000),
)
def test_a_chunk_over_paged_kv_equals_causal_attention(
    block_size, blocks, edge, size, heads, head_dim, seed
):
    total = max(1, blocks * block_size + edge)
    n = {"one": 1, "within": max(1, block_size // 2), "across": block_size + 1, "whole": total}
    n = min(n[size], total)
    first = total - n
    q_heads, kv_heads = heads
    k, v, k_cache, v_cache, table = paged_sequence(total, block_size, kv_heads, head_dim, seed)
    q_all = torch.randn(total, q_heads, head_dim, generator=torch.Generator().manual_seed(seed))
    out = chunk_attention_reference(q_all[first:], k_cache, v_cache, table, first)
    assert out.shape == (n, q_heads, head_dim) and not out.isnan().any()
    torch.testing.assert_close(out, expected(q_all, k, v, first))


def test_chunks_in_turn_give_a_whole_prefill():
    """A prompt of 3 blocks + 1 read in chunks of 1, 4, 5 and 3 (blocks of 4): the rows of one
    causal attention over all 13 tokens."""
    k, v, k_cache, v_cache, table = paged_sequence(13, 4, 2, 24, seed=7)
    q_all = torch.randn(13, 4, 24, generator=torch.Generator().manual_seed(1))
    rows, first = [], 0
    for n in (1, 4, 5, 3):
        rows.append(
            chunk_attention_reference(q_all[first : first + n], k_cache, v_cache, table, first)
        )
        first += n
    torch.testing.assert_close(torch.cat(rows), causal_attention(q_all, k, v))


def test_keys_after_the_chunk_are_never_read():
    """Slots of positions after the chunk's last hold NaN (written later): nothing reads them."""
    k, v, k_cache, v_cache, table = paged_sequence(10, 4, 1, 8, seed=3)
    q_all = torch.randn(10, 2, 8, generator=torch.Generator().manual_seed(2))
    k_cache[table[1], 3] = v_cache[table[1], 3] = float("nan")  # position 7
    out = chunk_attention_reference(q_all[4:7], k_cache, v_cache, table, 4)  # positions 4..6
    torch.testing.assert_close(out, causal_attention(q_all[:7], k[:7], v[:7])[4:])


def test_scale_and_dtype():
    k, v, k_cache, v_cache, table = paged_sequence(9, 4, 2, 8, seed=5, dtype=torch.float16)
    q_all = torch.randn(9, 4, 8, generator=torch.Generator().manual_seed(4)).half()
    out = chunk_attention_reference(q_all[5:], k_cache, v_cache, table, 5, scale=0.5)
    assert out.dtype == torch.float16
    scaled = chunk_attention_reference(q_all[5:] * 0.5 * 8**0.5, k_cache, v_cache, table, 5)
    torch.testing.assert_close(out, scaled, rtol=2e-3, atol=2e-3)


def test_an_empty_chunk_is_empty():
    _, _, k_cache, v_cache, table = paged_sequence(4, 4, 1, 8, seed=0)
    out = chunk_attention_reference(torch.zeros(0, 1, 8), k_cache, v_cache, table, 4)
    assert out.shape == (0, 1, 8)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (dict(q=torch.zeros(2, 8)), ValueError, r"q must be \[n, num_q_heads, head_dim\]"),
        (dict(q="q"), TypeError, "q must be a torch.Tensor"),
        (dict(q=torch.zeros(2, 2, 4)), ValueError, "head_dim mismatch: q has 4"),
        (dict(q=torch.zeros(2, 3, 8)), ValueError, r"q_heads \(3\) must be a multiple"),
        (dict(block_table=[0, 1]), TypeError, "block_table must be a 1-D integer tensor"),
        (dict(block_table=torch.zeros(2)), TypeError, "block_table must be a 1-D integer tensor"),
        (dict(block_table=torch.tensor([0])), ValueError, "block_table lists 1 blocks; 6 tokens"),
        (dict(block_table=torch.tensor([0, 9])), ValueError, r"entries must be in 0..4"),
        (dict(block_table=torch.tensor([0, -1])), ValueError, r"entries must be in 0..4"),
        (dict(num_computed=-1), ValueError, "num_computed must be >= 0"),
        (dict(num_computed=1.0), TypeError, "num_computed must be an int"),
    ],
)
def test_bad_inputs_name_the_argument(change, error, match):
    k_cache = v_cache = torch.zeros(5, 4, 2, 8)
    args = dict(q=torch.zeros(2, 2, 8), block_table=torch.tensor([0, 1]), num_computed=4)
    args.update(change)
    with pytest.raises(error, match=match):
        chunk_attention_reference(
            args["q"], k_cache, v_cache, args["block_table"], args["num_computed"]
        )
