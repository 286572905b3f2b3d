import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.ops.attention import TinyAttention, causal_attention, decode_attention


def naive_attention(q, k, v):
    """Loop-by-loop attention, written independently of kvlab's einsum version."""
    t, hq, d = q.shape
    group = hq // k.shape[1]
    out = torch.zeros_like(q)
    for h in range(hq):
        kh, vh = k[:, h // group], v[:, h // group]
        for i in range(t):
            scores = torch.stack([q[i, h] @ kh[j] for j in range(i + 1)]) / math.sqrt(d)
            out[i, h] = scores.softmax(0) @ vh[: i + 1]
    return out


@settings(max_examples=25, deadline=None)
@given(
    tokens=st.integers(1, 9),
    kv_heads=st.integers(1, 3),
    group=st.integers(1, 3),
    head_dim=st.sampled_from([1, 3, 8, 12]),
    seed=st.integers(0, 1000),
)
def test_causal_attention_matches_a_naive_loop(tokens, kv_heads, group, head_dim, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, kv_heads * group, head_dim, generator=g)
    k = torch.randn(tokens, kv_heads, head_dim, generator=g)
    v = torch.randn(tokens, kv_heads, head_dim, generator=g)
    torch.testing.assert_close(causal_attention(q, k, v), naive_attention(q, k, v))
    # the last row of causal attention is a decode step over the whole cache
    torch.testing.assert_close(decode_attention(q[-1], k, v), causal_attention(q, k, v)[-1])


@settings(max_examples=20, deadline=None)
@given(
    heads=st.integers(1, 4),
    head_dim=st.sampled_from([1, 5, 8, 12]),
    kv_div=st.sampled_from([1, 2, 4]),
    steps=st.integers(1, 12),
    seed=st.integers(0, 100),
)
def test_cached_decode_equals_full_recompute(heads, head_dim, kv_div, steps, seed):
    kv_heads = max(1, heads // kv_div) if heads % max(1, heads // kv_div) == 0 else heads
    layer = TinyAttention(heads * head_dim, heads, kv_heads, seed=seed)
    x = torch.randn(steps, layer.d_model, generator=torch.Generator().manual_seed(seed))
    full = layer.forward(x)
    k_cache, v_cache = layer.empty_cache()
    for t in range(steps):
        y, k_cache, v_cache = layer.decode_step(x[t], k_cache, v_cache)
        torch.testing.assert_close(y, full[t], atol=1e-5, rtol=1e-4)
    assert k_cache.shape == (steps, kv_heads, head_dim)


def test_layer_is_seeded():
    a, b, c = (
        TinyAttention(16, 2, seed=1),
        TinyAttention(16, 2, seed=1),
        TinyAttention(16, 2, seed=2),
    )
    assert torch.equal(a.wq, b.wq) and not torch.equal(a.wq, c.wq)


@pytest.mark.parametrize(
    "args, match",
    [
        ((10, 3), "d_model \\(10\\) must be a multiple of num_heads \\(3\\)"),
        ((12, 4, 3), "num_heads \\(4\\) must be a multiple of num_kv_heads \\(3\\)"),
        ((0, 1), "d_model must be >= 1"),
    ],
)
def test_bad_layer_shapes(args, match):
    with pytest.raises(ValueError, match=match):
        TinyAttention(*args)


def test_bad_attention_shapes():
    with pytest.raises(ValueError, match="expected q"):
        causal_attention(torch.zeros(2, 2), torch.zeros(2, 1, 2), torch.zeros(2, 1, 2))
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        decode_attention(torch.zeros(3, 4), torch.zeros(5, 2, 4), torch.zeros(5, 2, 4))


def test_batched_decode_attention_on_a_max_length_cache():
    """A batch of guests in Lab 01's layout: each row has max_tokens beds, the first seq_len filled;
    whatever sits in the reserved beds must not matter."""
    g = torch.Generator().manual_seed(5)
    lens = [1, 7, 12]
    q = torch.randn(3, 6, 24, generator=g)
    k = torch.randn(3, 12, 2, 24, generator=g)
    v = torch.randn(3, 12, 2, 24, generator=g)
    out = decode_attention(q, k, v, seq_lens=torch.tensor(lens))
    for s, n in enumerate(lens):
        torch.testing.assert_close(out[s], decode_attention(q[s], k[s, :n], v[s, :n]))
    k[0, 1:], v[0, 1:], k[1, 7:] = 1e4, -1e4, 1e4  # junk in reserved beds
    torch.testing.assert_close(decode_attention(q, k, v, seq_lens=torch.tensor(lens)), out)
    full = decode_attention(q, k, v, scale=0.2)  # no seq_lens: every bed counts
    torch.testing.assert_close(full[2], decode_attention(q[2], k[2], v[2], scale=0.2))
    half = decode_attention(q.half(), k.half(), v.half(), seq_lens=torch.tensor(lens))
    assert half.dtype == torch.float16 and half.shape == (3, 6, 24)


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        (
            (torch.zeros(2, 4, 8), torch.zeros(3, 5, 2, 8), torch.zeros(3, 5, 2, 8)),
            {},
            ValueError,
            "num_seqs=2",
        ),
        (
            (torch.zeros(2, 4, 8), torch.zeros(2, 5, 2, 6), torch.zeros(2, 5, 2, 6)),
            {},
            ValueError,
            "head_dim mismatch",
        ),
        (
            (torch.zeros(4, 8), torch.zeros(5, 2, 8), torch.zeros(5, 2, 8)),
            {"seq_lens": torch.tensor([5])},
            ValueError,
            "needs a batch",
        ),
        (
            (torch.zeros(2, 4, 8), torch.zeros(2, 5, 2, 8), torch.zeros(2, 5, 2, 8)),
            {"seq_lens": torch.tensor([5, 6])},
            ValueError,
            r"1\.\.5",
        ),
        (
            (torch.zeros(2, 4, 8), torch.zeros(2, 5, 2, 8), torch.zeros(2, 5, 2, 8)),
            {"seq_lens": torch.tensor([5.0, 1.0])},
            TypeError,
            "integers",
        ),
        (
            (torch.zeros(2, 4, 8), torch.zeros(2, 5, 2, 8), torch.zeros(2, 5, 2, 8)),
            {"seq_lens": [5, 1]},
            TypeError,
            "torch.Tensor",
        ),
        (
            (torch.zeros(2, 4, 8), torch.zeros(2, 5, 2, 8), torch.zeros(2, 5, 2, 8)),
            {"seq_lens": torch.tensor([5])},
            ValueError,
            r"num_seqs=2",
        ),
        (
            (torch.zeros(1, 2, 4, 8), torch.zeros(2, 5, 2, 8), torch.zeros(2, 5, 2, 8)),
            {},
            ValueError,
            r"q must be",
        ),
    ],
)
def test_decode_attention_bad_input(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        decode_attention(*args, **kwargs)
