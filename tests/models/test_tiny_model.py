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
from kvlab.core import files
from kvlab.core.block_manager import PagedCache
from kvlab.core.contiguous import ContiguousKVCache
from kvlab.models import ModelSpec
from kvlab.models.tiny import (
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
from kvlab.models.tiny.model import WEIGHTS_FILE, RMSNorm, rope
from kvlab.ops.attention import causal_attention
from kvlab.serving.scheduler import Sequence

BLOCK_SIZE = 8  # small blocks: fewer tokens to write through the interpreted kernel
# awkward prompt lengths in tokens (bytes): 1, one block, one block + 1, and a longer one
PROMPTS = ["T", "Paged KV", "The cache", "A block table "]
NEW_TOKENS = [4, 4, 3, 4]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matrices: on busy cores a second torch thread only waits (generate() does the same)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


def _scheduled(seq: Sequence, first: int, n: int, samples: bool) -> Sequence:
    """``seq`` as the scheduler leaves it for a step computing positions first..first + n - 1."""
    seq.num_computed, seq.num_scheduled, seq.samples = first, n, samples
    return seq


def test_prefill_that_continues_cached_tokens():
    """A recompute after preemption: positions [num_computed, num_computed + num_scheduled), the
    second part attending to the first through the cache, predicts what one forward does."""
    model = tiny_model("cpu")
    ids = encode("Rooms are handed out least recently freed first")
    cache = ContiguousKVCache(1, 64, spec=model.spec)
    executor = TinyExecutor(model, cache)
    cache.admit("s", len(ids) + 1)
    seq = Sequence("s", 20, 1, token_ids=ids[:20], num_generated=1)
    executor.execute(SimpleNamespace(scheduled=[_scheduled(seq, 0, 20, True)]))  # positions 0..19
    seq = Sequence("s", len(ids), 1, token_ids=list(ids), num_generated=1)
    executor.execute(SimpleNamespace(scheduled=[_scheduled(seq, 20, len(ids) - 20, True)]))
    assert seq.token_ids[-1] == int(model(torch.tensor([ids]))[0, -1].argmax())


@pytest.mark.parametrize("cache", ["contiguous", "paged"])
def test_a_prompt_read_in_chunks_predicts_what_one_forward_does(cache):
    """Chunked prefill on both stores: chunks of 1, chunks that cross a block boundary and end on
    one; only the step that reads the last chunk samples, the earlier ones append nothing."""
    model = tiny_model("cpu")
    ids = encode("A block table maps logical blocks")
    assert len(ids) == 33
    if cache == "paged":
        kv_cache = PagedCache(8, BLOCK_SIZE)
    else:
        kv_cache = ContiguousKVCache(1, 64, spec=model.spec)
    executor = TinyExecutor(model, kv_cache)
    kv_cache.admit("s", len(ids) + 1)
    seq = Sequence("s", len(ids), 1, token_ids=list(ids), num_generated=1)
    first = 0
    # chunks of 1, chunks ending on a block boundary (8, 16) and one past it (17, 25), chunks
    # that cross one (23..24, 25..32)
    for n in (1, 1, 5, 1, 8, 1, 6, 2, 8):
        samples = first + n == len(ids)
        executor.execute(SimpleNamespace(scheduled=[_scheduled(seq, first, n, samples)]))
        first += n
        assert len(seq.token_ids) == len(ids) + samples
    full = model(torch.tensor([ids]))[0]
    assert seq.token_ids[-1] == int(full[-1].argmax())
    # the chunks wrote every position's K/V where one prefill would have
    whole = ContiguousKVCache(1, 64, spec=model.spec)
    whole.admit("s", len(ids) + 1)
    executor_whole = TinyExecutor(model, whole)
    seq = Sequence("s", len(ids), 1, token_ids=list(ids), num_generated=1)
    executor_whole.execute(SimpleNamespace(scheduled=[_scheduled(seq, 0, len(ids), True)]))
    for layer in range(model.config.num_layers):
        k, v = executor.store.gather("s", layer, len(ids))
        k_whole, v_whole = executor_whole.store.gather("s", layer, len(ids))
        torch.testing.assert_close(k, k_whole, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v, v_whole, rtol=1e-5, atol=1e-5)


def test_a_prompt_swapped_out_between_chunks_continues_in_other_blocks():
    """Swapped out after its first chunk, back in other blocks: the K/V of the chunk read so far
    return, and the rest of the prompt attends to them."""
    model = tiny_model("cpu")
    ids = encode("Swap the first chunk out")
    cache = PagedCache(8, BLOCK_SIZE)
    executor = TinyExecutor(model, cache)
    cache.admit("s", len(ids) + 1)
    seq = Sequence("s", len(ids), 1, token_ids=list(ids), num_generated=1)
    executor.execute(SimpleNamespace(scheduled=[_scheduled(seq, 0, 10, False)]))
    seq.num_computed = 10
    executor.swap_out(seq)
    before = cache.manager.block_table("s")
    cache.release("s")
    cache.admit("filler", 2 * BLOCK_SIZE)  # takes the blocks the sequence had first
    cache.admit("s", len(ids) + 1)
    assert not set(cache.manager.block_table("s")[:2]) & set(before[:2])
    executor.swap_in(seq)
    executor.execute(SimpleNamespace(scheduled=[_scheduled(seq, 10, len(ids) - 10, True)]))
    assert seq.token_ids[-1] == int(model(torch.tensor([ids]))[0, -1].argmax())


def test_a_step_mixes_decodes_and_chunks():
    """One forward for a decode of one sequence, a middle chunk (no token) and a last chunk of
    others: each row goes to its own sequence."""
    model = tiny_model("cpu")
    texts = ["Paged KV", "The cache holds", "Slots"]
    prompts = [encode(t) for t in texts]
    cache = ContiguousKVCache(3, 64, spec=model.spec, policy="max")
    executor = TinyExecutor(model, cache)
    seqs = []
    for i, ids in enumerate(prompts):
        cache.admit(i, len(ids) + 2)
        seqs.append(Sequence(i, len(ids), 2, token_ids=list(ids), num_generated=1))
    a, b, c = seqs
    executor.execute(SimpleNamespace(scheduled=[_scheduled(a, 0, len(prompts[0]), True)]))
    a.num_generated = 2
    executor.execute(
        SimpleNamespace(
            scheduled=[
                _scheduled(a, len(prompts[0]), 1, True),  # a decode
                _scheduled(b, 0, 6, False),  # a first chunk
                _scheduled(c, 0, len(prompts[2]), True),  # a whole prompt
            ]
        )
    )
    assert len(b.token_ids) == len(prompts[1])
    executor.execute(SimpleNamespace(scheduled=[_scheduled(b, 6, len(prompts[1]) - 6, True)]))
    for seq, ids in zip(seqs, prompts, strict=True):
        new = seq.token_ids[len(ids) :]
        want = []
        for _ in new:
            want.append(int(model(torch.tensor([ids + want]))[0, -1].argmax()))
        assert new == want


@pytest.mark.parametrize(
    ("first", "n", "samples", "match"),
    [
        (0, 0, False, "num_scheduled must be >= 1"),
        (0, 21, False, "computes positions 0..20 but knows 20 token ids"),
        (0, 19, True, "samples, so it computes up to its last known token \\(19\\)"),
    ],
)
def test_a_step_the_executor_cannot_compute_names_the_sequence(first, n, samples, match):
    model = tiny_model("cpu")
    cache = ContiguousKVCache(1, 64, spec=model.spec)
    cache.admit("s", 21)
    seq = Sequence("s", 20, 1, token_ids=list(range(20)), num_generated=1)
    with pytest.raises(ValueError, match=f"sequence 's'.*{match}"):
        TinyExecutor(model, cache).execute(
            SimpleNamespace(scheduled=[_scheduled(seq, first, n, samples)])
        )


# --- the shipped weights ---------------------------------------------------------------------------


def test_weights_are_small_and_load():
    path = files.tiny_model_dir() / WEIGHTS_FILE
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
    # the prompts take 1 + 1 + 2 + 2 blocks and the second's 9th token a 7th; the last sequence's
    # 17th token finds none free: it leaves, and its 15 computed tokens are recomputed later
    result = paged(num_blocks=7)
    assert result.preemptions > 0 and result.stats["recompute_tokens"] > 0
    assert result.token_ids == reference()


@pytest.mark.parametrize("cache", ["contiguous", "paged"])
def test_chunked_prefill_generates_the_same_tokens(cache):
    """A token budget of 5 reads the longer prompts in chunks (crossing blocks of 8) beside the
    other sequences' decodes: the same greedy tokens as one prefill per prompt."""
    result = generate(
        PROMPTS,
        NEW_TOKENS,
        cache,
        block_size=BLOCK_SIZE,
        max_num_batched_tokens=5,
        chunked_prefill=True,
    )
    assert result.token_ids == reference()
    assert result.steps > max(NEW_TOKENS)  # prompts took several steps


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
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
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
