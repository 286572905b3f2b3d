"""The tiny model: its parts, its cached forward, its shipped weights, and greedy generation that
gives the same tokens on a contiguous and a paged cache (with and without preemption).

Paged decoding runs Triton's interpreter on the CPU, which is slow: the paged cases keep to a few
prompts and a few new tokens, and each cache configuration runs once (cached).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch

import kvlab  # noqa: F401  (chooses Triton's interpreter before anything imports triton)
from kvlab.attention import causal_attention
from kvlab.contiguous import ContiguousKVCache
from kvlab.models import ModelSpec
from kvlab.scheduler import Sequence
from kvlab.tiny import (
    TINY_SPEC,
    TinyConfig,
    TinyExecutor,
    TinyLlama,
    decode,
    encode,
    generate,
    load_model,
    tiny_model,
)
from kvlab.tiny.model import ASSETS_DIR, WEIGHTS_FILE, RMSNorm, rope

BLOCK_SIZE = 8  # small rooms: fewer tokens to write through the interpreted kernel
# awkward prompt lengths in tokens (bytes): 1, one block, one block + 1, and a longer one
PROMPTS = ["T", "Paged KV", "The cache", "A block table "]
NEW_TOKENS = [4, 4, 3, 4]


@functools.cache
def reference() -> list[list[int]]:
    """Greedy tokens by full recomputation (no cache at all): the ground truth."""
    model = tiny_model()  # on the device generate() uses
    out = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: a second thread only waits on busy cores
    try:
        for prompt, n in zip(PROMPTS, NEW_TOKENS, strict=True):
            ids = encode(prompt)
            for _ in range(n):
                logits = model(torch.tensor([ids], device=model.embed.weight.device))
                ids.append(int(logits[0, -1].argmax()))
            out.append(ids[-n:])
    finally:
        torch.set_num_threads(threads)
    return out


@functools.cache
def paged(num_blocks=None, preemption="recompute"):
    return generate(
        PROMPTS,
        NEW_TOKENS,
        "paged",
        num_blocks=num_blocks,
        block_size=BLOCK_SIZE,
        preemption=preemption,
    )


# --- parts ----------------------------------------------------------------------------------------


def test_tokenizer_round_trips_bytes():
    text = "Block tables → slots; ✅ done."
    ids = encode(text)
    assert len(ids) == len(text.encode("utf-8")) and all(0 <= i < 256 for i in ids)
    assert decode(ids) == text
    assert decode(encode("→")[:2]) == "\ufffd"  # a character cut short does not raise
    with pytest.raises(ValueError, match="token ids"):
        decode([256])


def test_rmsnorm_gives_unit_rms():
    x = torch.randn(3, 5, 64) * 7
    y = RMSNorm(64)(x)
    assert y.shape == x.shape
    torch.testing.assert_close(y.pow(2).mean(-1), torch.ones(3, 5), rtol=1e-4, atol=1e-4)


def test_rope_rotates_by_relative_position():
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 32), torch.randn(1, 1, 32)
    assert rope(q, torch.tensor([5])).shape == q.shape
    torch.testing.assert_close(rope(q, torch.tensor([0])), q)  # position 0: no rotation
    torch.testing.assert_close(rope(q, torch.tensor([9])).norm(), q.norm())  # a rotation

    def score(m, n):
        return (rope(q, torch.tensor([m])) * rope(k, torch.tensor([n]))).sum()

    torch.testing.assert_close(score(7, 3), score(104, 100), rtol=1e-4, atol=1e-4)


def test_gqa_shapes_and_spec():
    model = TinyLlama(TinyConfig(num_layers=1))
    q, k, v = model.layers[0].attn.qkv(torch.randn(7, 128), torch.arange(7))
    assert q.shape == (7, 4, 32) and k.shape == v.shape == (7, 2, 32)
    assert isinstance(TINY_SPEC, ModelSpec) and TINY_SPEC.name == "kvlab-tiny"
    assert (TINY_SPEC.num_q_heads, TINY_SPEC.num_kv_heads, TINY_SPEC.head_dim) == (4, 2, 32)
    assert TINY_SPEC.dtype_bytes == 4 and TINY_SPEC.num_params == TinyLlama().num_params
    cache = ContiguousKVCache(2, 64, spec=TINY_SPEC)
    assert cache.k[0].shape == (2, 64, 2, 32) and cache.k[0].dtype == torch.float32
    with pytest.raises(ValueError, match="num_kv_heads"):
        TinyConfig(num_q_heads=4, num_kv_heads=3)


def test_cached_forward_equals_full_recompute():
    """Prefill n tokens into a cache, decode one more: the logits of a single forward over n + 1."""
    model = tiny_model("cpu")
    ids = torch.tensor(encode("The cache holds every key"))
    n = len(ids) - 1
    cache = {}  # layer -> (k, v) of every token so far

    def attend(layer, q, k, v):
        past_k, past_v = cache.get(layer, (k[:0], v[:0]))
        cache[layer] = torch.cat([past_k, k]), torch.cat([past_v, v])
        keys, values = cache[layer]
        first = len(past_k)
        if first == 0:
            return causal_attention(q, k, v)
        assert q.shape[0] == 1  # decode: the new token sees every cached one
        return causal_attention(torch.cat([q.new_zeros(first, *q.shape[1:]), q]), keys, values)[-1:]

    prefill = model.forward_tokens(ids[:n], torch.arange(n), attend)
    decoded = model.forward_tokens(ids[n:], torch.tensor([n]), attend)
    full = model(ids[None])[0]
    torch.testing.assert_close(model.logits(prefill), full[:n], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(model.logits(decoded)[0], full[n], rtol=1e-4, atol=1e-4)
    assert cache[0][0].shape == (n + 1, 2, 32)


def test_prefill_that_continues_cached_tokens():
    """The executor computes positions [num_computed, num_tokens - 1): a prefill in two chunks
    (the second attending to the first through the cache) predicts what one forward does."""
    model = tiny_model("cpu")
    ids = encode("Rooms are handed out least recently freed first")
    cache = ContiguousKVCache(1, 64, spec=model.spec)
    executor = TinyExecutor(model, cache)
    seq = Sequence("s", 20, 1, token_ids=ids[:20], num_generated=1)
    cache.admit("s", len(ids) + 1)
    executor.execute(SimpleNamespace(scheduled=[seq]))  # positions 0..19
    seq = Sequence("s", len(ids), 1, token_ids=list(ids), num_generated=1, num_computed=20)
    executor.execute(SimpleNamespace(scheduled=[seq]))  # positions 20.., over the cached 0..19
    assert seq.token_ids[-1] == int(model(torch.tensor([ids]))[0, -1].argmax())


# --- the shipped weights ---------------------------------------------------------------------------


def test_weights_are_small_and_load():
    path = ASSETS_DIR / WEIGHTS_FILE
    assert path.stat().st_size <= 2 * 1024 * 1024
    model = load_model()
    assert all(p.dtype == torch.float32 and not p.requires_grad for p in model.parameters())
    assert model.spec == TINY_SPEC
    # trained: far better than a uniform guess (ln 256 = 5.5 nats) on its own prose
    ids = torch.tensor([encode("The paged cache stores the keys and values of every sequence.")])
    loss = torch.nn.functional.cross_entropy(model(ids)[0, :-1], ids[0, 1:])
    assert loss < 3.0


# --- generation on the two caches ------------------------------------------------------------------


def test_prompt_lengths_are_awkward():
    assert [len(encode(p)) for p in PROMPTS][:3] == [1, BLOCK_SIZE, BLOCK_SIZE + 1]


def test_contiguous_matches_full_recompute():
    result = generate(PROMPTS, NEW_TOKENS, "contiguous")
    assert result.token_ids == reference()
    assert result.texts == [decode(ids) for ids in reference()]
    assert result.preemptions == 0 and result.steps == max(NEW_TOKENS)
    assert result.tokens_per_second > 0


def test_contiguous_with_few_slots_queues_and_matches():
    result = generate(PROMPTS, NEW_TOKENS, "contiguous", num_slots=2)
    assert result.token_ids == reference()
    assert result.steps > max(NEW_TOKENS)  # sequences waited for a slot


def test_paged_matches_contiguous():
    assert paged().token_ids == reference()
    assert paged().preemptions == 0


def test_paged_preemption_by_recompute_matches():
    # the prompts take 1 + 1 + 2 + 2 rooms and the second's 9th token a 7th; the last sequence's
    # 17th token finds none free: it leaves, and its 15 computed tokens are recomputed later
    result = paged(num_blocks=7)
    assert result.preemptions > 0 and result.stats["recompute_tokens"] > 0
    assert result.token_ids == reference()


def test_paged_preemption_by_swap_matches():
    result = paged(num_blocks=7, preemption="swap")
    assert result.preemptions > 0 and result.stats["swapped_in_tokens"] > 0
    assert result.token_ids == reference()


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"prompts": []}, "prompts"),
        ({"prompts": ["ok", ""]}, r"prompts\[1\]"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": [3]}, "max_new_tokens"),
        ({"cache": "hotel"}, "cache"),
        ({"preemption": "evict"}, "preemption"),
        ({"max_new_tokens": 300}, "context"),
    ],
)
def test_bad_input_names_the_argument(kwargs, name):
    args = {"prompts": ["a", "b"], "max_new_tokens": 3, "cache": "contiguous", **kwargs}
    with pytest.raises(ValueError, match=name):
        generate(args.pop("prompts"), args.pop("max_new_tokens"), args.pop("cache"), **args)


def test_a_prompt_that_can_never_fit_is_rejected_up_front():
    with pytest.raises(ValueError, match=r"prompts\[1\] with its new tokens needs 3 blocks of 8"):
        generate(["a", "abcdefghijklmnop"], 4, cache="paged", num_blocks=2, block_size=8)
    with pytest.raises(ValueError, match=r"prompts\[0\] with its new tokens needs 20 tokens"):
        generate(["abcdefghijklmnop"], 4, cache="contiguous", max_seq_len=16)
