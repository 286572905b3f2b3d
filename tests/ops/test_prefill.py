"""The paged prefill kernel (a step's chunks and decodes, packed varlen) against the torch
reference: Triton's interpreter on CPU (kvlab chooses it when there is no GPU), compiled on a GPU.
The interpreter is slow per program: shapes stay small."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.ops.attention import paged_decode_attention_ref, paged_prefill_attention_ref
from kvlab.ops.kernels import (
    PREFILL_DEFAULTS,
    paged_prefill_attention,
    prefill_launch_config,
    prepare_paged_prefill,
)
from kvlab.ops.kernels.prefill import (
    PREFILL_PRE_AMPERE_DEFAULTS,
    prefill_launch_defaults,
    prefill_work,
)
from kvlab.ops.runtime import kernel_mode
from kvlab.ops.testing import (
    FAR,
    PREFILL_CASES,
    flash_layout,
    make_case,
    make_prefill_case,
    tolerance,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INTERPRETER = kernel_mode() == "interpreter"


def on_device(args):
    return [a.to(DEVICE) for a in args]


def case_args(chunks, block_size, heads, head_dim, dtype, seed=0, **options):
    q_heads, kv_heads = heads
    return on_device(
        make_prefill_case(chunks, block_size, q_heads, kv_heads, head_dim, dtype, seed, **options)
    )


def assert_matches_reference(got, args, scale=None):
    expected = paged_prefill_attention_ref(*args, scale=scale)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert not got.isnan().any(), "the kernel read a poisoned bed, room or key-card entry"
    torch.testing.assert_close(got.float(), expected.float(), **tolerance(expected.dtype))


@pytest.mark.parametrize(
    "chunks, block_size, heads, head_dim, dtype",
    [case[1:] for case in PREFILL_CASES],
    ids=[case[0] for case in PREFILL_CASES],
)
def test_kernel_matches_reference(chunks, block_size, heads, head_dim, dtype):
    args = case_args(chunks, block_size, heads, head_dim, dtype, seed=len(chunks) + block_size)
    assert_matches_reference(paged_prefill_attention(*args), args)


@pytest.mark.parametrize(
    "index, tile_q, tile_k",
    [(2, 3, 16), (3, 2, 16), (6, 16, 16)],
    ids=["mid-room, 3 positions", "decodes, 2 positions", "long prefix, 16 x 16"],
)
def test_small_tiles_cut_chunks_and_keys_anywhere(index, tile_q, tile_k):
    """Several programs per chunk, several key tiles per program: tiles with no mask, tiles on
    the diagonal, and tiles whose positions run past the chunk's end."""
    _, chunks, block_size, heads, head_dim, dtype = PREFILL_CASES[index]
    args = case_args(chunks, block_size, heads, head_dim, dtype, seed=index)
    got = paged_prefill_attention(*args, tile_q=tile_q, tile_k=tile_k)
    assert_matches_reference(got, args)


def test_the_diagonal_at_every_offset_of_a_key_tile():
    """Chunks whose first query's last key falls just before, on and just after the end of a key
    tile: the unmasked loop must stop at the last key tile that every row of a program sees."""
    chunks = [(cached, 5) for cached in (12, 13, 14, 15, 16)]
    args = case_args(chunks, 3, (2, 1), 16, torch.float32)
    assert_matches_reference(paged_prefill_attention(*args, tile_q=2, tile_k=16), args)


@settings(max_examples=8, deadline=None, derandomize=True)
@given(
    chunks=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 9)), min_size=1, max_size=3),
    block_size=st.integers(1, 8),
    kv_heads=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 3, 4]),
    head_dim=st.sampled_from([16, 24, 40]),
    tile_q=st.sampled_from([None, 2, 5]),
    tile_k=st.sampled_from([None, 16]),
)
def test_kernel_any_shape(chunks, block_size, kv_heads, group, head_dim, tile_q, tile_k):
    args = case_args(chunks, block_size, (kv_heads * group, kv_heads), head_dim, torch.float32)
    got = paged_prefill_attention(*args, tile_q=tile_q, tile_k=tile_k)
    assert_matches_reference(got, args)


def test_far_entries_transposed_tables_flash_layout_strided_q_and_scale():
    """Key-card entries past a sequence's rooms that name no room at all, a key card stored
    column by column, vLLM's flash-layout caches, queries with a stride and a custom scale."""
    q, k, v, tables, starts, computed = make_prefill_case(
        [(9, 4), (0, 6)], 4, q_heads=4, kv_heads=2, head_dim=24, garbage=FAR, transposed=True
    )
    assert tables.stride(0) == 1
    q, k, v, tables, starts, computed = on_device((q, k, v, tables, starts, computed))
    k, v = flash_layout(k, v)  # built on the device: .to() would compact it
    wide = torch.zeros(q.shape[0], q.shape[1], 2 * q.shape[2], device=q.device)
    wide[..., ::2] = q
    strided = wide[..., ::2]
    assert not k.is_contiguous() and not strided.is_contiguous()
    got = paged_prefill_attention(strided, k, v, tables, starts, computed, scale=0.3)
    assert_matches_reference(got, (q, k, v, tables, starts, computed), scale=0.3)


def test_a_step_of_decodes_is_decode_attention():
    """A decode is a chunk of one: the reference, and the kernel, agree with decode attention."""
    q, k, v, tables, lens = on_device(make_case([5, 17, 1], 4, q_heads=4, kv_heads=2))
    starts = torch.arange(4, dtype=torch.int32, device=q.device)
    computed = lens - 1
    expected = paged_decode_attention_ref(q, k, v, tables, lens)
    ref = paged_prefill_attention_ref(q, k, v, tables, starts, computed)
    torch.testing.assert_close(ref, expected)
    got = paged_prefill_attention(q, k, v, tables, starts, computed)
    torch.testing.assert_close(got, expected, **tolerance(torch.float32))


def test_a_prepared_launch_reads_new_queries():
    args = case_args([(6, 5), (0, 3)], 4, (4, 2), 16, torch.float32)
    run = prepare_paged_prefill(*args)
    assert_matches_reference(run(), args)
    args[0].mul_(-0.5)  # the same step's tensors, new values
    assert_matches_reference(run(), args)


def test_no_queries_at_all():
    args = case_args([(3, 0), (0, 0)], 4, (2, 1), 16, torch.float32)
    got = paged_prefill_attention(*args)
    assert got.shape == (0, 2, 16)


@pytest.mark.skipif(
    not INTERPRETER, reason="on a GPU bf16 multiplies on tensor cores, so no fp32 run to round"
)
def test_interpreter_rounds_bf16_to_nearest_even():
    """In the interpreter bf16 takes the fp32 path; the answer is the fp32 one rounded to
    nearest even, as a GPU stores it."""
    args = make_prefill_case([(5, 4), (0, 2)], 4, 4, 2, 24, torch.bfloat16)
    as_fp32 = [t.float() if t.is_floating_point() else t for t in args]
    assert torch.equal(paged_prefill_attention(*args), paged_prefill_attention(*as_fp32).bfloat16())


def test_work_list_puts_the_longest_tiles_first():
    # sequence 0: 5 cached + a chunk of 5 in tiles of 2; sequence 1: a decode after 100 tokens
    work = prefill_work([5, 1], [5, 100], tile_q=2)
    assert work == [(1, 0), (0, 4), (0, 2), (0, 0)]
    assert prefill_work([0, 3], [7, 0], tile_q=4) == [(1, 0)]  # an empty chunk: no program


def test_launch_defaults():
    assert prefill_launch_defaults(128, torch.bfloat16, arch=90) == PREFILL_DEFAULTS[(128, 2)]
    assert prefill_launch_defaults(40, torch.float16, arch=80) == PREFILL_DEFAULTS[(128, 2)]
    assert prefill_launch_defaults(256, torch.float32, arch=90) == PREFILL_DEFAULTS[(256, 4)]
    assert prefill_launch_defaults(512, torch.float16, arch=90) == PREFILL_DEFAULTS[(256, 2)]
    # a T4: bf16 takes the fp32 path, so the fp32 tiles
    t4 = PREFILL_PRE_AMPERE_DEFAULTS
    assert prefill_launch_defaults(128, torch.bfloat16, arch=75) == t4[(128, 4)]
    assert prefill_launch_defaults(128, torch.float16, arch=75) == t4[(128, 2)]
    chosen = prefill_launch_config(128, torch.bfloat16, 4, tile_q=8, num_stages=3, arch=90)
    assert (chosen.rows, chosen.tile_q(4), chosen.num_stages) == (32, 8, 3)
    assert chosen.tile_k == PREFILL_DEFAULTS[(128, 2)].tile_k
    assert PREFILL_DEFAULTS[(128, 2)].tile_q(6) == 21  # 126 of 128 rows used


def test_bad_input_is_refused():
    q, k, v, tables, starts, computed = make_prefill_case([(4, 3), (0, 2)], 4)
    for fn in (paged_prefill_attention, paged_prefill_attention_ref):
        with pytest.raises(TypeError, match="query_start_loc must be an int32 tensor"):
            fn(q, k, v, tables, starts.long(), computed)
        with pytest.raises(TypeError, match="num_computed must be an int32 tensor, got list"):
            fn(q, k, v, tables, starts, [4, 0])
        with pytest.raises(ValueError, match=r"query_start_loc must be \[num_seqs \+ 1 = 3\]"):
            fn(q, k, v, tables, starts[:2], computed)
        with pytest.raises(ValueError, match=r"num_computed must be \[num_seqs=2\]"):
            fn(q, k, v, tables, starts, computed[:1])
        with pytest.raises(ValueError, match="query_start_loc must never decrease, got 6 then 5"):
            fn(q, k, v, tables, torch.tensor([0, 6, 5], dtype=torch.int32), computed)
        with pytest.raises(ValueError, match="must run from 0 to num_tokens = 5, got 0 .. 4"):
            fn(q, k, v, tables, torch.tensor([0, 3, 4], dtype=torch.int32), computed)
        with pytest.raises(ValueError, match="num_computed must be >= 0, got -1"):
            fn(q, k, v, tables, starts, torch.tensor([4, -1], dtype=torch.int32))
        with pytest.raises(ValueError, match=r"sequence 0 \(40 cached \+ 3 in its chunk"):
            fn(q, k, v, tables, starts, torch.tensor([40, 0], dtype=torch.int32))
        bad = tables.clone()
        bad[0, 0] = k.shape[0]
        with pytest.raises(ValueError, match="block_tables entries a sequence needs must be in"):
            fn(q, k, v, bad, starts, computed)
        with pytest.raises(ValueError, match="head_dim mismatch"):
            fn(q[..., :8], k, v, tables, starts, computed)
        with pytest.raises(ValueError, match="q must be"):
            fn(q[0], k, v, tables, starts, computed)
    with pytest.raises(ValueError, match="tile_k must be 16, 32, 64, 128"):
        paged_prefill_attention(q, k, v, tables, starts, computed, tile_k=48)
    with pytest.raises(ValueError, match=r"tile_q must be 1\.\.256"):
        paged_prefill_attention(q, k, v, tables, starts, computed, tile_q=0)
    with pytest.raises(TypeError, match="num_warps must be an int or None"):
        paged_prefill_attention(q, k, v, tables, starts, computed, num_warps=4.0)


def test_launch_too_large_for_the_gpu_says_why(monkeypatch):
    from triton.runtime.errors import OutOfResources

    from kvlab.ops.kernels import prefill

    class Refused:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise OutOfResources(270336, 232448, "shared memory")

            return launch

    monkeypatch.setattr(prefill, "paged_prefill_kernel", Refused())
    monkeypatch.setattr(prefill, "gpu_arch", lambda: 90)
    args = make_prefill_case([(0, 3)], 4)
    message = r"tile_q=64 \(128 rows\), tile_k=128, num_stages=4 need 270,336 bytes of shared "
    message += r"memory per program and this GPU \(sm_90\) has 232,448"
    with pytest.raises(ValueError, match=message):
        paged_prefill_attention(*args, tile_q=64, tile_k=128, num_stages=4)
