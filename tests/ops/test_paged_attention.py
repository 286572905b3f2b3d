import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.core.block_manager import BlockManager, block_tables_tensor, flashinfer_page_table
from kvlab.ops.attention import (
    check_paged_inputs,
    decode_attention,
    gather_kv,
    paged_decode_attention_ref,
    write_kv_reference,
)
from kvlab.ops.testing import make_case


@settings(max_examples=30)
@given(
    lens=st.lists(st.integers(1, 40), min_size=1, max_size=4),
    block_size=st.sampled_from([1, 2, 4, 16]),
    heads=st.sampled_from([(4, 4), (8, 2), (6, 1)]),
    head_dim=st.sampled_from([8, 40, 72]),
    seed=st.integers(0, 100),
)
def test_paged_reference_equals_contiguous_attention(lens, block_size, heads, head_dim, seed):
    q, k_cache, v_cache, tables, seq_lens = make_case(
        lens,
        block_size,
        q_heads=heads[0],
        kv_heads=heads[1],
        head_dim=head_dim,
        seed=seed,
        garbage=10**9,
    )
    out = paged_decode_attention_ref(q, k_cache, v_cache, tables, seq_lens)
    for s, n in enumerate(lens):
        rooms = tables[s, : -(-n // block_size)].long().tolist()
        # build the contiguous K and V independently, token by token
        k = torch.stack([k_cache[rooms[t // block_size], t % block_size] for t in range(n)])
        v = torch.stack([v_cache[rooms[t // block_size], t % block_size] for t in range(n)])
        torch.testing.assert_close(out[s], decode_attention(q[s], k, v))


def test_scale_and_dtype():
    q, k_cache, v_cache, tables, lens = make_case([5, 9], 4, dtype=torch.float16)
    out = paged_decode_attention_ref(q, k_cache, v_cache, tables, lens, scale=0.5)
    assert out.dtype == torch.float16
    k, v = gather_kv(k_cache, v_cache, tables[1], 9)
    torch.testing.assert_close(out[1], decode_attention(q[1], k, v, scale=0.5))


def test_write_kv_through_the_slot_mapping():
    k_cache = torch.zeros(4, 2, 1, 3)
    v_cache = torch.zeros(4, 2, 1, 3)
    k = torch.arange(9.0).reshape(3, 1, 3)
    write_kv_reference(k_cache, v_cache, torch.tensor([5, 0, 2]), k, -k)
    assert torch.equal(k_cache[2, 1, 0], k[0, 0]) and torch.equal(k_cache[0, 0, 0], k[1, 0])
    assert torch.equal(v_cache[1, 0, 0], -k[2, 0])
    with pytest.raises(ValueError, match="slot_mapping must be in 0..7"):
        write_kv_reference(k_cache, v_cache, torch.tensor([8, 0, 1]), k, k)
    with pytest.raises(ValueError, match="k and v must be"):
        write_kv_reference(
            k_cache, v_cache, torch.tensor([0]), torch.zeros(1, 2, 3), torch.zeros(1, 2, 3)
        )


def test_write_kv_into_any_strided_cache():
    """vLLM's flash layout hands over kv_cache[:, 0] of a [num_blocks, 2, block_size, heads,
    head_dim] tensor: not contiguous, so no flat view of its slots exists."""
    kv = torch.zeros(4, 2, 2, 1, 3)
    k_cache, v_cache = kv[:, 0], kv[:, 1]
    k = torch.arange(9.0).reshape(3, 1, 3)
    write_kv_reference(k_cache, v_cache, torch.tensor([5, 0, 2]), k, -k)
    assert torch.equal(kv[2, 0, 1, 0], k[0, 0]) and torch.equal(kv[0, 0, 0, 0], k[1, 0])
    assert torch.equal(kv[1, 1, 0, 0], -k[2, 0])
    assert int((kv != 0).sum()) == 16  # nothing else written: 18 values, two of them 0
    with pytest.raises(ValueError, match="slot_mapping must be in 0..7"):
        write_kv_reference(k_cache, v_cache, torch.tensor([8, 0, 1]), k, k)


def _inputs():
    return list(make_case([5, 9], 4))


@pytest.mark.parametrize(
    "change, error, match",
    [
        (lambda a: a.__setitem__(0, a[0][0]), ValueError, "q must be \\[num_seqs"),
        (lambda a: a.__setitem__(1, a[1][..., :4]), ValueError, "k_cache and v_cache must both be"),
        (
            lambda a: a.__setitem__(0, a[0][:, :3]),
            ValueError,
            "num_q_heads \\(3\\) must be a multiple",
        ),
        (
            lambda a: a.__setitem__(3, a[3].long()),
            TypeError,
            "block_tables must be an int32 tensor",
        ),
        (lambda a: a.__setitem__(4, [5, 9]), TypeError, "seq_lens must be an int32 tensor"),
        (
            lambda a: a.__setitem__(4, torch.tensor([5, 99], dtype=torch.int32)),
            ValueError,
            "seq_lens must be in 1..",
        ),
        (
            lambda a: a.__setitem__(4, torch.tensor([0, 9], dtype=torch.int32)),
            ValueError,
            "seq_lens must be in 1..",
        ),
        (lambda a: a.__setitem__(3, a[3][:1]), ValueError, "block_tables must be \\[num_seqs=2"),
        (lambda a: a.__setitem__(0, "q"), TypeError, "q must be a torch.Tensor"),
    ],
)
def test_bad_inputs_name_the_argument(change, error, match):
    args = _inputs()
    change(args)
    with pytest.raises(error, match=match):
        check_paged_inputs(*args)
    with pytest.raises(error, match=match):
        paged_decode_attention_ref(*args)


def test_head_dim_mismatch():
    q, k, v, t, lens = _inputs()
    with pytest.raises(ValueError, match="head_dim mismatch: q has 8"):
        check_paged_inputs(q[..., :8], k, v, t, lens)


def test_block_tables_from_a_manager_and_flashinfer_form():
    m = BlockManager(10, 4)
    m.allocate("a", 6)
    m.allocate("b", 1)
    m.append_slot("a")
    tables, lens = block_tables_tensor(m, ["a", "b"])
    assert tables.tolist() == [[0, 1], [2, -1]] and lens.tolist() == [7, 1]
    assert tables.dtype == lens.dtype == torch.int32
    indptr, indices, last = flashinfer_page_table(tables, lens, 4)
    assert (
        indptr.tolist() == [0, 2, 3] and indices.tolist() == [0, 1, 2] and last.tolist() == [3, 1]
    )
