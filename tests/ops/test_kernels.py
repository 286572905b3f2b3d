"""The Triton kernels against the torch reference (Triton's interpreter on CPU; compiled on a GPU)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.ops.attention import paged_decode_attention_ref
from kvlab.ops.attention import write_kv_reference as write_kv_ref
from kvlab.ops.kernels import (
    LAUNCH_DEFAULTS,
    choose_splits,
    launch_config,
    launch_paged_decode,
    paged_decode_attention,
    paged_decode_kernel,
    plan_splits,
    prepare_paged_decode,
    tile_tokens,
    write_kv,
)
from kvlab.ops.runtime import kernel_mode
from kvlab.ops.testing import flash_layout, make_case, repaged, tolerance

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INTERPRETER = kernel_mode() == "interpreter"


def on_device(args):
    return [a.to(DEVICE) for a in args]


def assert_matches_reference(got, args):
    expected = paged_decode_attention_ref(*args)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got.float(), expected.float(), **tolerance(expected.dtype))


CASES = [
    # seq_lens, block_size, (q_heads, kv_heads), head_dim, dtype
    ([1], 1, (4, 4), 32, torch.float32),
    ([16, 15, 17], 16, (8, 2), 40, torch.float32),  # k * block_size and ± 1
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
    # rooms that are not a power of two: tiles and rooms cut each other anywhere
    ([49, 50, 51], 5, (6, 2), 24, torch.float32),
]


def grid_case(seq_lens, block_size, heads, head_dim, dtype, garbage, seed=0):
    """One CASES row as kernel inputs on the test device."""
    q_heads, kv_heads = heads
    case = make_case(
        seq_lens, block_size, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim,
        dtype=dtype, garbage=garbage, seed=seed,
    )  # fmt: skip
    return on_device(case)


@pytest.mark.parametrize("seq_lens, block_size, heads, head_dim, dtype", CASES)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_kernel_matches_reference(seq_lens, block_size, heads, head_dim, dtype, num_splits):
    seed = len(seq_lens) + block_size
    args = grid_case(seq_lens, block_size, heads, head_dim, dtype, garbage=10**9, seed=seed)
    assert_matches_reference(paged_decode_attention(*args, num_splits=num_splits), args)


# (tile 128 of fp32 head_dim 256 would need 256 KB of shared memory on a GPU: not among these)
@pytest.mark.parametrize(
    "seq_lens, block_size, heads, head_dim, dtype", [CASES[i] for i in (1, 6, 7, 12)]
)
@pytest.mark.parametrize("tile, num_splits", [(16, 1), (32, 2), (128, 3)])
def test_prefetched_key_cards_and_other_tiles(
    seq_lens, block_size, heads, head_dim, dtype, tile, num_splits
):
    """The launch options the GPU sweep tries give the same answers as the defaults."""
    args = grid_case(seq_lens, block_size, heads, head_dim, dtype, garbage=10**9)
    for prefetch_table in (False, True):
        got = paged_decode_attention(
            *args, num_splits=num_splits, tile=tile, prefetch_table=prefetch_table
        )
        assert_matches_reference(got, args)


@pytest.mark.parametrize("seq_lens, block_size, heads, head_dim, dtype", CASES[:6])
def test_room_by_room_kernel_matches_reference(seq_lens, block_size, heads, head_dim, dtype):
    """The Lab 05 teaching kernel, launched the way the lab launches the learner's."""
    args = grid_case(seq_lens, block_size, heads, head_dim, dtype, garbage=-(2**31))
    assert_matches_reference(launch_paged_decode(paged_decode_kernel, *args), args)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    lens=st.lists(st.integers(1, 150), min_size=1, max_size=3),  # up to three 64-token tiles
    block_size=st.integers(1, 20),
    kv_heads=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 3, 4]),
    head_dim=st.sampled_from([32, 40, 64]),
    num_splits=st.sampled_from([None, 1, 2, 5]),
    tile=st.sampled_from([None, 16, 32]),
    prefetch_table=st.booleans(),
)
def test_tiled_kernel_any_shape(
    lens, block_size, kv_heads, group, head_dim, num_splits, tile, prefetch_table
):
    args = on_device(
        make_case(lens, block_size, q_heads=kv_heads * group, kv_heads=kv_heads, head_dim=head_dim)
    )
    got = paged_decode_attention(
        *args, num_splits=num_splits, tile=tile, prefetch_table=prefetch_table
    )
    assert_matches_reference(got, args)


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
    assert_matches_reference(paged_decode_attention(*args, num_splits=num_splits), args)


@pytest.mark.parametrize("auto", [2, 3, 7, 50])
def test_automatic_splits_round_to_whole_tiles(monkeypatch, auto):
    """On a GPU the split count comes from its size; here it is forced, to check the slicing."""
    from kvlab.ops.kernels import tiled

    monkeypatch.setattr(tiled, "_multiprocessors", lambda device: 132)
    monkeypatch.setattr(tiled, "choose_splits", lambda *args: auto)
    args = on_device(make_case([300, 70, 1], 4, q_heads=4, kv_heads=2, head_dim=32))
    assert_matches_reference(paged_decode_attention(*args), args)


def test_split_choice_and_tile_size():
    # one 32k guest on an H100/H200-sized GPU: many slices; a big batch: one pass
    assert choose_splits(1, 8, 32768, multiprocessors=132) == 66
    assert choose_splits(32, 8, 8192, multiprocessors=132) == 2  # 512 programs: one wave
    assert choose_splits(1, 1, 131072, multiprocessors=132) == 128  # capped for the merge
    assert choose_splits(256, 8, 8192, multiprocessors=132) == 1
    assert choose_splits(1, 8, 100, multiprocessors=132) == 1  # too short to split
    assert tile_tokens(128) == 64 and tile_tokens(40) == 64 and tile_tokens(256) == 32


def test_split_plans_cut_tokens_not_rooms():
    # as asked: slices of ceil(max_seq_len / num_splits) tokens, whatever the block size
    assert plan_splits(2, 2, 100, tile=64, num_splits=3) == (3, 34)
    assert plan_splits(2, 2, 100, tile=64, num_splits=100) == (100, 1)
    assert plan_splits(2, 2, 5, tile=64, num_splits=8) == (5, 1)  # no slice without a token
    # chosen: whole tiles, one slice without a GPU
    assert plan_splits(1, 8, 32768, tile=64, multiprocessors=132) == (64, 512)  # 66 asked
    assert plan_splits(1, 8, 1000, tile=64, multiprocessors=132) == (3, 384)
    assert plan_splits(1, 8, 32768, tile=64) == (1, 32768)


def test_launch_defaults_are_one_table():
    from kvlab.ops.kernels.tiled import PRE_AMPERE_DEFAULTS, launch_defaults

    assert launch_defaults(128, torch.float32, arch=75) == PRE_AMPERE_DEFAULTS[(128, 4)]
    assert launch_defaults(100, torch.bfloat16, arch=75) == LAUNCH_DEFAULTS[(128, 2)]
    assert launch_defaults(256, torch.float32, arch=80) == LAUNCH_DEFAULTS[(256, 4)]

    assert launch_config(128, torch.bfloat16) == LAUNCH_DEFAULTS[(128, 2)]
    assert launch_config(40, torch.float32) == LAUNCH_DEFAULTS[(128, 4)]
    assert launch_config(256, torch.float16) == LAUNCH_DEFAULTS[(256, 2)]
    assert launch_config(512, torch.float32) == LAUNCH_DEFAULTS[(256, 4)]  # past every row
    chosen = launch_config(128, torch.bfloat16, tile=32, num_stages=4, prefetch_table=True)
    assert (chosen.tile, chosen.num_stages, chosen.prefetch_table) == (32, 4, True)
    assert chosen.num_warps == LAUNCH_DEFAULTS[(128, 2)].num_warps


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [None, 2, 7])
def test_page_size_does_not_change_the_bits(dtype, num_splits):
    """The same tokens in rooms of 1, 16 and 5 beds give bit-identical answers: slices and tiles
    are cut at token counts, not at room boundaries (vLLM's page-size invariance)."""
    case = make_case([61, 1], 1, q_heads=4, kv_heads=1, head_dim=40, dtype=dtype)
    outputs = {}
    for block_size in (1, 16, 5):
        args = on_device(case if block_size == 1 else repaged(case, block_size, seed=block_size))
        outputs[block_size] = paged_decode_attention(*args, num_splits=num_splits)
    assert_matches_reference(outputs[1], on_device(case))
    assert torch.equal(outputs[1], outputs[16]) and torch.equal(outputs[1], outputs[5])


@pytest.mark.skipif(
    not INTERPRETER, reason="on a GPU bf16 multiplies on tensor cores, so no fp32 run to round"
)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_interpreter_rounds_bf16_to_nearest_even(num_splits):
    """In the interpreter bf16 inputs take the fp32 path; the bf16 answer must be that fp32
    answer rounded to nearest even, as a GPU stores it (Triton's interpreter truncates)."""
    case = make_case([37, 13, 1], 8, q_heads=4, kv_heads=2, head_dim=40, dtype=torch.bfloat16)
    as_fp32 = [t.float() if t.is_floating_point() else t for t in case]
    got = paged_decode_attention(*case, num_splits=num_splits)
    exact = paged_decode_attention(*as_fp32, num_splits=num_splits)
    assert torch.equal(got, exact.to(torch.bfloat16))
    room_by_room = launch_paged_decode(paged_decode_kernel, *case)
    exact = launch_paged_decode(paged_decode_kernel, *as_fp32)
    assert torch.equal(room_by_room, exact.to(torch.bfloat16))


def test_launch_too_large_for_the_gpu_says_why(monkeypatch):
    """A GPU with less shared memory than the options need refuses the launch: the error names
    the options and the limit, not a Triton traceback."""
    from triton.runtime.errors import OutOfResources

    from kvlab.ops.kernels import tiled

    class Refused:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise OutOfResources(270336, 232448, "shared memory")

            return launch

    monkeypatch.setattr(tiled, "paged_decode_tiled_kernel", Refused())
    monkeypatch.setattr(tiled, "gpu_arch", lambda: 90)
    args = make_case([5], 4)
    message = r"tile=128, num_stages=5, prefetch_table=True need 270,336 bytes of shared memory "
    message += r"per program and this GPU \(sm_90\) has 232,448: choose a smaller tile"
    with pytest.raises(ValueError, match=message):
        paged_decode_attention(*args, tile=128, num_stages=5, prefetch_table=True)


def test_flash_layout_caches():
    """vLLM's flash layout: K and V are views into one [num_blocks, 2, block_size, ...] tensor."""
    q, k, v, tables, lens = make_case([20, 7], 4, q_heads=4, kv_heads=2, head_dim=24)
    q, k, v, tables, lens = on_device((q, k, v, tables, lens))
    args = (q, *flash_layout(k, v), tables, lens)  # built on the device: .to() would compact it
    assert not args[1].is_contiguous()
    assert_matches_reference(paged_decode_attention(*args, num_splits=2), args)
    assert_matches_reference(launch_paged_decode(paged_decode_kernel, *args), args)


def test_a_prepared_launch_reads_new_queries():
    """Checked and planned once, launched each step (as a server does, and the benchmark times)."""
    args = on_device(make_case([40, 9], 4, q_heads=4, kv_heads=2, head_dim=32))
    run = prepare_paged_decode(*args, num_splits=2)
    assert_matches_reference(run(), args)
    args[0].mul_(-0.5)  # the next step's queries, in the same tensor
    assert_matches_reference(run(), args)


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
    with pytest.raises(ValueError, match="tile must be 16, 32, 64, 128, 256"):
        paged_decode_attention(q, k, v, tables, lens, tile=48)
    with pytest.raises(TypeError, match="prefetch_table must be True, False or None"):
        paged_decode_attention(q, k, v, tables, lens, prefetch_table=1)
    q3, k3, v3, t3, l3 = make_case([5], 3)
    with pytest.raises(ValueError, match="block_size must be a power of two"):
        launch_paged_decode(paged_decode_kernel, q3, k3, v3, t3, l3)  # it walks whole rooms
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
    ones = torch.ones(5, 3, 40, device=DEVICE)
    write_kv(k_cache, v_cache, skip, ones, ones)
    assert int((k_cache.cpu() != k_ref).any(dim=(2, 3)).sum()) == 1
    with pytest.raises(ValueError, match="slot_mapping must be < num_blocks"):
        write_kv(k_cache, v_cache, torch.tensor([99], device=DEVICE), ones[:1], ones[:1])


@pytest.mark.parametrize("block_size", [16, 5])
def test_write_kv_into_flash_layout_rounds_as_the_reference(block_size):
    """Both writers take vLLM's flash-layout views, and fp32 K/V land in a bf16 cache with the
    same bits (rounded to nearest even, as torch and a GPU round)."""
    g = torch.Generator().manual_seed(1)
    k_new, v_new = torch.randn(7, 2, 24, generator=g), torch.randn(7, 2, 24, generator=g)
    bs = block_size  # seven distinct slots in four blocks (a repeated slot is a race on a GPU)
    slots = torch.tensor([0, 3, bs, 2 * bs + 1, 3 * bs, 3 * bs + 2, 4 * bs - 1])
    caches = {}
    for name, writer, device in (("torch", write_kv_ref, "cpu"), ("triton", write_kv, DEVICE)):
        kv = torch.zeros(4, 2, block_size, 2, 24, dtype=torch.bfloat16, device=device)
        k_cache, v_cache = kv[:, 0], kv[:, 1]
        writer(k_cache, v_cache, slots.to(device), k_new.to(device), v_new.to(device))
        caches[name] = kv.cpu()
    expected = torch.zeros(4 * block_size, 2, 2, 24, dtype=torch.bfloat16)
    expected[slots, 0], expected[slots, 1] = k_new.bfloat16(), v_new.bfloat16()
    as_flash = expected.view(4, block_size, 2, 2, 24).transpose(1, 2)
    assert torch.equal(caches["torch"], as_flash) and torch.equal(caches["triton"], as_flash)
