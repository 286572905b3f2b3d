"""Checks for Lab 04: decode attention through block tables (the gather-based reference)."""

from __future__ import annotations

import math

import torch

from kvlab.attention import paged_decode_attention_ref
from kvlab.grading.core import CheckFailed, call_without_mutation, exercise, expect_type

paged = exercise("04.paged_attention", "decode attention through key cards")

TOLERANCE = {torch.float32: (1e-5, 1e-4), torch.float16: (2e-3, 2e-3), torch.bfloat16: (2e-2, 2e-2)}


def make_case(
    seq_lens,
    block_size,
    q_heads=4,
    kv_heads=2,
    head_dim=16,
    dtype=torch.float32,
    seed=0,
    garbage=-1,
    shared=False,
):
    """Random q and a paged cache whose rooms are scattered; unused table entries hold ``garbage``."""
    g = torch.Generator().manual_seed(seed)
    rooms_each = [-(-n // block_size) for n in seq_lens]
    width = max(rooms_each) + 2
    num_blocks = sum(rooms_each) + 5
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).to(dtype)
    order = torch.randperm(num_blocks, generator=g).tolist()
    tables = torch.full((len(seq_lens), width), garbage, dtype=torch.int32)
    for s, n in enumerate(rooms_each):
        rooms = order[:n] if shared else order[sum(rooms_each[:s]) : sum(rooms_each[:s]) + n]
        tables[s, :n] = torch.tensor(rooms, dtype=torch.int32)
    q = torch.randn(len(seq_lens), q_heads, head_dim, generator=g).to(dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    return q, k_cache, v_cache, tables, lens


def _expect_case(fn, what: str, **case):
    args = make_case(**case)
    expected = paged_decode_attention_ref(*args)
    names = ("q", "k_cache", "v_cache", "block_tables", "seq_lens")
    got = call_without_mutation(fn, *args, names=names)
    expect_type(got, torch.Tensor, "the output", input=what)
    if got.shape != expected.shape:
        raise CheckFailed(
            "wrong output shape",
            input=what,
            expected=str(tuple(expected.shape)),
            got=str(tuple(got.shape)),
            hint="return [num_seqs, num_q_heads, head_dim]",
        )
    if got.dtype != expected.dtype:
        raise CheckFailed(
            "the output must have q's dtype",
            input=what,
            expected=str(expected.dtype),
            got=str(got.dtype),
            hint="compute in float32, then .to(q.dtype)",
        )
    expect_attention(got, expected, args, what, "attention on its contiguous K and V")


def expect_attention(got, expected, args, what: str, reference: str) -> None:
    """Raise a CheckFailed naming the guest and head that differ, with the first values and a
    diagnosis of the usual slips (NaN, a missing or inverted scale, the wrong KV head)."""
    atol, rtol = TOLERANCE[expected.dtype]
    got, expected = got.float().cpu(), expected.float()
    if torch.allclose(got, expected, atol=atol, rtol=rtol):
        return
    diff = (got - expected).abs().nan_to_num(nan=math.inf)
    seq = int(diff.amax(dim=(1, 2)).argmax())
    head = int(diff[seq].amax(dim=1).argmax())
    raise CheckFailed(
        f"guest {seq}, query head {head} differs from {reference} "
        f"(max error {diff.max().item():.3g})",
        input=what,
        expected=preview(expected[seq, head]),
        got=preview(got[seq, head]),
        hint=diagnose(got, [a.cpu() for a in args], atol, rtol),
    )


def preview(vector, n: int = 4) -> str:
    """The first values of a vector: enough to compare by eye."""
    values = ", ".join(f"{x:.4g}" for x in vector[:n].tolist())
    return f"[{values}{', …' if len(vector) > n else ''}] ({len(vector)} values)"


def diagnose(got, args, atol, rtol) -> str | None:
    """Name a common mistake when the output matches what that mistake would produce."""
    if got.isnan().any():
        return (
            "NaN: a softmax over nothing but -inf (or a sum of 0). Does every guest read "
            "ceil(seq_len / block_size) rooms, and are only the beds past seq_len masked?"
        )
    q, k_cache, v_cache, tables, lens = args
    head_dim, q_heads, kv_heads = q.shape[2], q.shape[1], k_cache.shape[2]
    slips = [
        ("no scale: multiply the scores q·k by scale = 1/sqrt(head_dim)", 1.0, None),
        ("the scores were divided by scale: multiply by it", math.sqrt(head_dim), None),
    ]
    if kv_heads not in (1, q_heads):
        group = q_heads // kv_heads
        slips.append(
            (
                f"query head h reads KV head h // {group} (the group size), not h % {kv_heads}",
                None,
                [h % kv_heads for h in range(q_heads)],
            )
        )
    for message, scale, kv_of_head in slips:
        wrong = _attention_with(args, scale=scale, kv_of_head=kv_of_head)
        if torch.allclose(got, wrong, atol=atol, rtol=rtol):
            return message
    return None


def _attention_with(args, *, scale=None, kv_of_head=None):
    """The reference answer in fp32, with a given scale or query-to-KV-head mapping (each query
    head given its own copy of the KV head it reads)."""
    q, k_cache, v_cache, tables, lens = args
    if kv_of_head is not None:
        k_cache, v_cache = k_cache[:, :, kv_of_head], v_cache[:, :, kv_of_head]
    return paged_decode_attention_ref(
        q.float(), k_cache.float(), v_cache.float(), tables, lens, scale=scale
    )


@paged.check(
    "one guest in one room",
    hint="gather rows block_tables[s, :ceil(len / block_size)] of the cache, keep the first len tokens",
)
def _one(fn):
    _expect_case(fn, "1 guest of 3 tokens, block_size 4", seq_lens=[3], block_size=4)


@paged.check(
    "lengths 1, k·block_size and k·block_size ± 1",
    hint="the last room is only partly filled: cut the gathered keys to seq_len tokens",
)
def _lengths(fn):
    _expect_case(
        fn, "seq_lens [1, 32, 31, 33], block_size 16", seq_lens=[1, 32, 31, 33], block_size=16
    )


@paged.check("block_size 1 (every token in its own room)")
def _size_one(fn):
    _expect_case(fn, "seq_lens [1, 5, 9], block_size 1", seq_lens=[1, 5, 9], block_size=1)


@paged.check(
    "grouped-query (8 query heads on 2 KV heads) and multi-query (1 KV head)",
    hint="query head h reads KV head h // (num_q_heads // num_kv_heads)",
)
def _gqa(fn):
    _expect_case(fn, "GQA 8/2", seq_lens=[7, 20], block_size=4, q_heads=8, kv_heads=2)
    _expect_case(fn, "MQA 6/1", seq_lens=[7, 20], block_size=4, q_heads=6, kv_heads=1)


@paged.check(
    "unused key-card entries hold garbage (-1, 10**9) and must never be read",
    hint="read only the first ceil(seq_len / block_size) entries of each row",
)
def _garbage(fn):
    _expect_case(fn, "padding -1", seq_lens=[5, 17], block_size=4, garbage=-1)
    _expect_case(fn, "padding 10**9", seq_lens=[5, 17], block_size=4, garbage=10**9)


@paged.check("two guests sharing their rooms (a shared prefix)")
def _shared(fn):
    _expect_case(
        fn, "both key cards list the same rooms", seq_lens=[9, 12], block_size=4, shared=True
    )


@paged.check(
    "head_dim 40 in fp16 (compute in fp32, return fp16)",
    hint="upcast to float32 for the scores and the softmax, cast the result back to q.dtype",
)
def _fp16(fn):
    _expect_case(
        fn, "fp16, head_dim 40", seq_lens=[3, 50], block_size=8, head_dim=40, dtype=torch.float16
    )
