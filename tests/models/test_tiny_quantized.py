"""The tiny model with its cache stored in another format: unchanged in fp32, a few flips in 8 bits."""

import pytest
import torch

from kvlab.models.tiny import generate
from kvlab.models.tiny import quantized as q


def test_an_fp32_cache_gives_the_engines_tokens():
    prompts = ["The cache ", "A block table "]
    assert q.greedy_texts(prompts, 12) == generate(prompts, 12).texts


def test_stored_round_trips_and_checks_the_format():
    x = torch.randn(3, 2, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(q.stored(x, None), x)
    assert (q.stored(x, "int8") - x).abs().max() < x.abs().max() / 127
    with pytest.raises(ValueError, match="kv_format"):
        q.stored(x, "fp4")
    with pytest.raises(ValueError, match="kv_format"):
        q.greedy_ids("The", 4, "fp16")


def test_next_token_flips_none_in_fp32_few_in_int8():
    text = "The cache is the same slot comes and the cache is the same"
    assert q.next_token_flips(text, None) == (0, len(text))
    flips, n = q.next_token_flips(text, "int8")
    assert n == len(text) and flips <= n // 5


def test_words_changed_counts_from_the_first_difference():
    assert q.words_changed("a b c d", "a b c d") == (0, 4)
    assert q.words_changed("a b c d", "a x c d") == (3, 4)
    assert q.words_changed("a b", "a b c") == (1, 3)
