"""MLA decode attention: the absorbed form equals the expanded per-head K/V form, paged or not."""

import math

import pytest
import torch

from kvlab.ops import mla
from kvlab.ops.testing import tolerance


@pytest.mark.parametrize(
    "shape",
    [
        dict(num_tokens=1),
        dict(num_tokens=7, heads=3, nope=12, rope=6, rank=20, v_dim=10),
        dict(num_tokens=17, heads=2, nope=32, rope=0, rank=32, v_dim=8),
        dict(num_tokens=9, heads=4, nope=16, rope=8, rank=64, v_dim=24, sharpness=8.0),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_absorbed_equals_expanded(shape, dtype):
    case = mla.make_mla_case(**shape, dtype=dtype, seed=3)
    got = mla.mla_decode_absorbed(*case)
    want = mla.mla_decode_expanded(*case)
    assert got.dtype == dtype and got.shape == (case[0].shape[0], case[4].shape[1])
    torch.testing.assert_close(got.float(), want.float(), **tolerance(dtype))


def test_expanded_is_multi_head_attention_over_the_built_keys():
    q_nope, q_pe, latent, w_uk, w_uv = mla.make_mla_case(num_tokens=6, seed=1)
    k, v = mla.expand_kv(latent, w_uk, w_uv, q_pe.shape[1])
    q = torch.cat([q_nope, q_pe], dim=-1)
    out = torch.stack(
        [
            torch.softmax(k[:, h] @ q[h] / math.sqrt(q.shape[1]), 0) @ v[:, h]
            for h in range(q.shape[0])
        ]
    )
    torch.testing.assert_close(mla.mla_decode_expanded(q_nope, q_pe, latent, w_uk, w_uv), out)


def test_scale_is_the_expanded_head_dim_and_can_be_given():
    case = mla.make_mla_case(seed=2)
    assert mla.default_scale(case[0], case[1]) == 1 / math.sqrt(16 + 8)
    a = mla.mla_decode_absorbed(*case, scale=0.1)
    torch.testing.assert_close(a, mla.mla_decode_expanded(*case, scale=0.1))
    assert not torch.allclose(a, mla.mla_decode_absorbed(*case))


def test_paged_decode_reads_only_the_rooms_and_beds_it_holds():
    heads, nope, rope, rank, v_dim, block_size = 2, 8, 4, 16, 8, 4
    g = torch.Generator().manual_seed(0)
    lens = [1, 4, 5, 11]
    rooms_each = [-(-n // block_size) for n in lens]
    cache = torch.full((sum(rooms_each) + 2, block_size, rank + rope), float("nan"))
    order = torch.randperm(cache.shape[0], generator=g).tolist()
    tables = torch.full((len(lens), max(rooms_each) + 1), 10**6, dtype=torch.int32)
    latents, first = [], 0
    for s, n in enumerate(lens):
        latent = torch.randn(n, rank + rope, generator=g)
        latents.append(latent)
        rooms = order[first : first + rooms_each[s]]
        first += rooms_each[s]
        tables[s, : len(rooms)] = torch.tensor(rooms, dtype=torch.int32)
        for t in range(n):
            cache[rooms[t // block_size], t % block_size] = latent[t]
    q_nope = torch.randn(len(lens), heads, nope, generator=g)
    q_pe = torch.randn(len(lens), heads, rope, generator=g)
    w_uk = torch.randn(heads, nope, rank, generator=g) / 4
    w_uv = torch.randn(heads, v_dim, rank, generator=g) / 4
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    got = mla.paged_mla_decode(q_nope, q_pe, cache, tables, seq_lens, w_uk, w_uv)
    expanded = mla.paged_mla_decode(
        q_nope, q_pe, cache, tables, seq_lens, w_uk, w_uv, absorbed=False
    )
    assert not got.isnan().any()
    for s in range(len(lens)):
        want = mla.mla_decode_expanded(q_nope[s], q_pe[s], latents[s], w_uk, w_uv)
        torch.testing.assert_close(got[s], want, **tolerance(torch.float32))
        torch.testing.assert_close(expanded[s], want)


def test_bad_inputs_name_the_argument():
    q_nope, q_pe, latent, w_uk, w_uv = mla.make_mla_case()
    with pytest.raises(ValueError, match="w_uk"):
        mla.mla_decode_absorbed(q_nope, q_pe, latent, w_uk.transpose(1, 2), w_uv)
    with pytest.raises(ValueError, match="latent"):
        mla.mla_decode_absorbed(q_nope, q_pe, latent[:, :-1], w_uk, w_uv)
    with pytest.raises(ValueError, match="w_uv"):
        mla.mla_decode_expanded(q_nope, q_pe, latent, w_uk, w_uv[:, :, :-1])
    with pytest.raises(TypeError, match="latent"):
        mla.mla_decode_absorbed(q_nope, q_pe, latent.tolist(), w_uk, w_uv)
    with pytest.raises(TypeError, match="block_tables"):
        mla.paged_mla_decode(
            q_nope[None], q_pe[None], latent[None], torch.zeros(1, 2), torch.ones(1), w_uk, w_uv
        )


def test_deepseek_v3_bytes_per_token():
    latent = mla.latent_elements_per_token(512, 64)
    expanded = mla.expanded_elements_per_token(128, 128, 128)
    assert (latent, expanded) == (576, 32_768)
    assert 61 * latent * 2 == 70_272  # bf16, all 61 layers
