"""Fetch or recompute (Lab 10): the rule against hand computations on two model/GPU cards."""

import math

import pytest

from kvlab.models import ModelSpec
from kvlab.models.specs import LLAMA_3_8B, OPT_13B
from kvlab.perf.roofline import A100_80GB, H100_SXM
from kvlab.perf.tiers import (
    PCIE_GEN4_X16,
    PCIE_GEN5_X16,
    break_even_tokens,
    describe_break_even,
    fetch_beats_recompute,
    fetch_seconds,
    recompute_seconds,
)

# a small GQA model (Llama-3.2-1B's shape): little compute per token, yet K/V to move
SMALL = ModelSpec("small-1B", 16, 32, 8, 64, num_params=1.24e9)


def test_llama_3_8b_on_an_h100_fetches_at_every_length():
    # by hand: 2 x 32 layers x 8 KV heads x 128 x 2 bytes = 131,072 B per token
    assert fetch_seconds(LLAMA_3_8B, 1000) == pytest.approx(1000 * 131_072 / 25e9)  # 5.24 ms
    flops = 2 * 8.03e9 * 1000 + 4 * 32 * 32 * 128 * (1000 * 1001 / 2)
    assert recompute_seconds(LLAMA_3_8B, H100_SXM, 1000) == pytest.approx(flops / 989e12)
    assert recompute_seconds(LLAMA_3_8B, H100_SXM, 1000) == pytest.approx(16.50e-3, rel=1e-3)
    for link in (PCIE_GEN4_X16, PCIE_GEN5_X16):
        assert break_even_tokens(LLAMA_3_8B, H100_SXM, pcie_bytes_per_s=link) == 1
        assert all(
            fetch_beats_recompute(LLAMA_3_8B, H100_SXM, n, pcie_bytes_per_s=link)
            for n in (1, 16, 1000, 8000)
        )
    assert "every length" in describe_break_even(LLAMA_3_8B, H100_SXM)


def test_opt_13b_on_an_h100_over_gen4_recomputes():
    """Full multi-head attention: 800 KB of K/V per token, a copy costs more than a recompute
    per token over PCIe 4.0 on an H100; attention decides only at very long prefixes."""
    f = 819_200 / 25e9
    a = 2 * 12.9e9 / 989e12
    b = 4 * 40 * 40 * 128 / 989e12
    by_hand = math.floor(2 * (f - a) / b - 1) + 1  # the first n with (n + 1) / 2 > (f - a) / b
    n = break_even_tokens(OPT_13B, H100_SXM)
    assert abs(n - by_hand) <= 1 and 16_000 < n < 16_300
    assert not fetch_beats_recompute(OPT_13B, H100_SXM, 2048)  # all of OPT's context
    assert fetch_beats_recompute(OPT_13B, H100_SXM, n)
    assert not fetch_beats_recompute(OPT_13B, H100_SXM, n - 1)
    # PCIe 5.0 halves the copy: fetching wins again; so does the slower A100 over Gen4
    assert break_even_tokens(OPT_13B, H100_SXM, pcie_bytes_per_s=PCIE_GEN5_X16) == 1
    assert break_even_tokens(OPT_13B, A100_80GB) == 1


def test_a_small_model_on_a_slow_link_recomputes():
    slow = 5e9  # a narrow or shared link
    f, a = 32_768 / slow, 2 * 1.24e9 / 989e12
    b = 4 * 16 * 32 * 64 / 989e12
    n = break_even_tokens(SMALL, H100_SXM, pcie_bytes_per_s=slow)
    assert abs(n - (math.floor(2 * (f - a) / b - 1) + 1)) <= 1 and n > 60_000
    assert not fetch_beats_recompute(SMALL, H100_SXM, 4096, pcie_bytes_per_s=slow)
    assert break_even_tokens(SMALL, H100_SXM) == 1  # over a full Gen4 link it fetches
    assert "recomputing wins below" in describe_break_even(SMALL, H100_SXM, pcie_bytes_per_s=slow)


def test_small_blocks_pay_per_copy():
    """A fixed start-up cost per copied block: small blocks, many copies (the paper's
    "recompute beat swapping for small blocks")."""
    kw = {"transfer_overhead_s": 20e-6}
    assert fetch_seconds(LLAMA_3_8B, 256, block_size=1, **kw) == pytest.approx(
        256 * 131_072 / 25e9 + 256 * 20e-6
    )
    assert not fetch_beats_recompute(LLAMA_3_8B, H100_SXM, 256, block_size=1, **kw)
    assert fetch_beats_recompute(LLAMA_3_8B, H100_SXM, 256, block_size=16, **kw)


def test_recompute_after_a_context_costs_its_attention():
    base = recompute_seconds(LLAMA_3_8B, H100_SXM, 100)
    later = recompute_seconds(LLAMA_3_8B, H100_SXM, 100, context=4000)
    assert later - base == pytest.approx(4 * 32 * 32 * 128 * 100 * 4000 / 989e12)
    with pytest.raises(ValueError, match="pcie_bytes_per_s"):
        fetch_seconds(LLAMA_3_8B, 10, pcie_bytes_per_s=0)
