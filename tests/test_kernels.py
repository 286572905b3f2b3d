"""The Triton kernels against the torch reference (Triton's interpreter on CPU; compiled on a GPU)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.attention import paged_decode_attention_ref
from kvlab.attention import write_kv as write_kv_ref
from kvlab.grading.lab04 import make_case
from kvlab.kernels import (
    choose_splits,
    launch_paged_decode,
    paged_decode_attention,
    paged_decode_kernel,
    tile_tokens,
    write_kv,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def on_device(args):
    return [a.to(DEVICE) for a in args]


CASES = [
    # seq_lens, block_size, (q_heads, kv_heads), head_dim, dtype
    ([1], 1, (4, 4), 32, torch.float32),
    ([16, 15, 17], 16, (8, 2), 40, torch.float32),
    ([1, 33], 2, (6, 1), 72, torch.float16),
    ([129, 5], 128, (4, 1), 32, torch.bfloat16),
    ([24, 9], 8, (4, 2), 256, torch.float32),
    ([40], 4, (2, 2), 96, torch.bfloat16),
    # tiles of many rooms: 64 rooms of one bed per step, a tile boundary at 64 and 65
    ([65, 64, 3], 1, (2, 1), 32, torch.float32),
    ([70], 32, (4, 4), 48, torch.float16),
    ([64, 63], 64, (12, 4), 32, torch.float32),
    # several tiles per program (and per split)
    ([300, 129, 1], 16, (8, 2), 64, torch.float32),
    ([200], 1, (4, 1), 32, torch.float16),
    ([300, 1], 256, (2, 1), 32, torch.float32),  # a room of 256 beds takes several tiles
]


def grid_case(seq_lens, block_size, heads, head_dim, dtype, garbage, seed=0):
    """One CASES row as kernel inputs on the test device."""
    q_heads, kv_heads = heads
    case = make_case(
        seq_lens,
        block_size,
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        garbage=garbage,
        seed=seed,
    )
    return on_device(case)


@pytest.mark.parametrize("seq_lens, block_size, heads, head_dim, dtype", CASES)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_kernel_matches_reference(seq_lens, block_size, heads, head_dim, dtype, num_splits):
    seed = len(seq_lens) + block_size
    args = grid_case(seq_lens, block_size, heads, head_dim, dtype, garbage=10**9, seed=seed)
    expected = paged_decode_attention_ref(*args)
    got = paged_decode_attention(*args, num_splits=num_splits)
    assert got.dtype == dtype and got.shape == expected.shape
    torch.testing.assert_close(got.float(), expected.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("seq_lens, block_size, heads, head_dim, dtype", CASES[:6])
def test_room_by_room_kernel_matches_reference(seq_lens, block_size, heads, head_dim, dtype):
    """The Lab 05 teaching kernel, launched the way the lab launches the learner's."""
    args = grid_case(seq_lens, block_size, heads, head_dim, dtype, garbage=-(2**31))
    got = launch_paged_decode(paged_decode_kernel, *args)
    expected = paged_decode_attention_ref(*args)
    torch.testing.assert_close(got.float(), expected.float(), atol=TOL[dtype], rtol=TOL[dtype])


@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    lens=st.lists(st.integers(1, 150), min_size=1, max_size=3),  # up to three 64-token tiles
    log_block=st.integers(0, 4),
    kv_heads=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 3, 4]),
    head_dim=st.sampled_from([32, 40, 64]),
    num_splits=st.sampled_from([None, 1, 2, 5]),
)
def test_tiled_kernel_any_shape(lens, log_block, kv_heads, group, head_dim, num_splits):
    args = on_device(
        make_case(
            lens, 2**log_block, q_heads=kv_heads * group, kv_heads=kv_heads, head_dim=head_dim
        )
    )
    got = paged_decode_attention(*args, num_splits=num_splits)
    torch.testing.assert_close(got, paged_decode_attention_ref(*args), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_rising_scores_rescale_earlier_tiles(num_splits):
    """Each later key scores higher, so every tile raises the running max and the sums kept so far
    must be rescaled: a kernel that forgets exp(m - m') fails here."""
    q, k, v, tables, lens = make_case([333, 250], 8, q_heads=4, kv_heads=2, head_dim=32)
    position = torch.zeros(k.shape[0], k.shape[1])  # guest 0's token index in each bed
    for i, room in enumerate(tables[0, :42].tolist()):
        position[room] = torch.arange(8) + 8 * i
    k = q[0, ::2].reshape(1, 1, 2, 32) * (position / 40).view(*position.shape, 1, 1)
    args = on_device((q, k, v, tables, lens))
    got = paged_decode_attention(*args, num_splits=num_splits)
    torch.testing.assert_close(got, paged_decode_attention_ref(*args), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("auto", [2, 3, 7, 50])
def test_automatic_splits_round_to_whole_tiles(monkeypatch, auto):
    """On a GPU the split count comes from its size; here it is forced, to check the slicing."""
    from kvlab.kernels import tiled

    monkeypatch.setattr(tiled, "_auto_splits", lambda *args: auto)
    args = on_device(make_case([300, 70, 1], 4, q_heads=4, kv_heads=2, head_dim=32))
    got = paged_decode_attention(*args)
    torch.testing.assert_close(got, paged_decode_attention_ref(*args), atol=1e-5, rtol=1e-5)


def test_split_choice_and_tile_size():
    # one 32k guest on an H100/H200-sized GPU: many slices; a big batch: one pass
    assert choose_splits(1, 8, 32768, multiprocessors=132) == 66
    assert choose_splits(32, 8, 8192, multiprocessors=132) == 2  # 512 programs: one wave
    assert choose_splits(1, 1, 131072, multiprocessors=132) == 128  # capped for the merge
    assert choose_splits(256, 8, 8192, multiprocessors=132) == 1
    assert choose_splits(1, 8, 100, multiprocessors=132) == 1  # too short to split
    assert tile_tokens(128) == 64 and tile_tokens(40) == 64 and tile_tokens(256) == 32


def test_shared_rooms_strided_q_and_scale():
    q, k, v, tables, lens = on_device(
        make_case([9, 12], 4, q_heads=4, kv_heads=2, head_dim=16, shared=True)
    )
    wide = torch.zeros(q.shape[0], q.shape[1], 2 * q.shape[2], device=q.device)
    wide[..., ::2] = q
    strided = wide[..., ::2]  # non-contiguous q
    assert not strided.is_contiguous()
    expected = paged_decode_attention_ref(q, k, v, tables, lens, scale=0.3)
    torch.testing.assert_close(
        paged_decode_attention(strided, k, v, tables, lens, scale=0.3), expected
    )


def test_bad_input_is_refused():
    q, k, v, tables, lens = make_case([5], 4)
    with pytest.raises(ValueError, match=r"num_splits must be 1\.\.128"):
        paged_decode_attention(q, k, v, tables, lens, num_splits=0)
    with pytest.raises(ValueError, match=r"num_splits must be 1\.\.128"):
        paged_decode_attention(q, k, v, tables, lens, num_splits=129)
    with pytest.raises(TypeError, match="num_splits must be an int or None, got float"):
        paged_decode_attention(q, k, v, tables, lens, num_splits=2.0)
    with pytest.raises(ValueError, match="num_warps must be 1, 2, 4"):
        paged_decode_attention(q, k, v, tables, lens, num_warps=3)
    with pytest.raises(ValueError, match="num_stages must be >= 1"):
        paged_decode_attention(q, k, v, tables, lens, num_stages=0)
    q3, k3, v3, t3, l3 = make_case([5], 3)
    with pytest.raises(ValueError, match="block_size must be a power of two"):
        paged_decode_attention(q3, k3, v3, t3, l3)
    with pytest.raises(TypeError, match="seq_lens must be an int32 tensor"):
        paged_decode_attention(q, k, v, tables, lens.long())


def test_write_kv_kernel_matches_reference():
    g = torch.Generator().manual_seed(0)
    shape = (6, 4, 3, 40)
    k_ref, v_ref = torch.zeros(shape), torch.zeros(shape)
    k_new, v_new = torch.randn(5, 3, 40, generator=g), torch.randn(5, 3, 40, generator=g)
    slots = torch.tensor([0, 7, 23, 12, 5])
    write_kv_ref(k_ref, v_ref, slots, k_new, v_new)
    k_cache, v_cache = torch.zeros(shape, device=DEVICE), torch.zeros(shape, device=DEVICE)
    write_kv(k_cache, v_cache, slots.to(DEVICE), k_new.to(DEVICE), v_new.to(DEVICE))
    assert torch.equal(k_cache.cpu(), k_ref) and torch.equal(v_cache.cpu(), v_ref)
    skip = torch.tensor([-1, 3, -1, -1, -1], device=DEVICE)  # -1 = padding, skipped
    write_kv(
        k_cache,
        v_cache,
        skip,
        torch.ones(5, 3, 40, device=DEVICE),
        torch.ones(5, 3, 40, device=DEVICE),
    )
    assert int((k_cache.cpu() != k_ref).any(dim=(2, 3)).sum()) == 1
    with pytest.raises(ValueError, match="slot_mapping must be < num_blocks"):
        write_kv(
            k_cache,
            v_cache,
            torch.tensor([99], device=DEVICE),
            k_new[:1].to(DEVICE),
            v_new[:1].to(DEVICE),
        )
