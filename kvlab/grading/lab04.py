"""Checks for Lab 04: decode attention through block tables (the gather-based reference).

A wrong answer is compared with what the usual slips would compute (every bed of the last room,
the last room skipped, the first guest's key card for every guest, a missing scale or one by the
block size, a softmax over the heads, the wrong KV head, fp16 arithmetic, ...): a match names the
mistake, and later checks broken by the same mistake say "the same problem". Lab 05 reuses the
diagnosis, with hints in kernel terms; both build their cases with ``kvlab.ops.testing.make_case``
(Lab 04's, here, can scale q and V up) and judge them with its tolerances.
"""

from __future__ import annotations

import torch

from kvlab.grading.attention_diagnosis import (
    NAN_WHAT,
    PADDING,
    Variants,
    diagnose,
    expect_attention,
    read_far_padding,
)
from kvlab.grading.blame import explain_exception
from kvlab.grading.expect import CheckFailed, call_without_mutation, expect_tensor_like
from kvlab.grading.own_code import refuse_reference
from kvlab.grading.registry import exercise
from kvlab.ops import testing
from kvlab.ops.attention import gather_kv, paged_decode_attention_ref
from kvlab.ops.testing import FAR, NAN_ROOM, TOLERANCE, close

paged = exercise("04.paged_attention", "decode attention through key cards")

# --- diagnosing a wrong answer ---------------------------------------------------------------

# cause -> hint, in Lab 04's terms (Lab 05 passes its own, in kernel terms)
HINTS = {
    "whole last room": "attention ran over every bed of the last room, and the beds past seq_len "
    "hold garbage: keep only the first seq_len gathered tokens",
    "zeros scored": "the beds past seq_len were zeroed but still take part in the softmax: drop "
    "them (keep the first seq_len tokens)",
    "last room skipped": "the last, partly filled room was left out: a guest holds "
    "ceil(seq_len / block_size) rooms, not seq_len // block_size",
    "one key card": "every guest read the first guest's key card (block_tables[0]): guest s's "
    "rooms are in its own row, block_tables[s]",
    "no scale": "no scale: multiply the scores q·k by scale = 1/sqrt(head_dim)",
    "block size scale": "scale by 1/sqrt(head_dim) (q.shape[-1]), not the block size: "
    "k_cache.shape[1] is block_size, the beds of a room",
    "scale divided": "the scores were divided by scale: multiply by it",
    "softmax over heads": "softmax over the wrong axis: normalise each query head's scores across "
    "the tokens (the last axis), not across the heads",
    "kv head modulo": "query head h reads KV head h // {group} (the group size), not h % {kv_heads}",
    "low precision": "right in float32, wrong in {dtype}: compute the scores and the softmax in "
    "float32, then cast the result back to q.dtype",
    "nan": "NaN: a softmax over nothing but -inf (or a sum of 0). Does every guest read "
    "ceil(seq_len / block_size) rooms, and are only the beds past seq_len left out?",
}


# --- checks ----------------------------------------------------------------------------------

NAMES = ("q", "k_cache", "v_cache", "block_tables", "seq_lens")


def make_case(seq_lens, block_size, *, q_scale=1.0, v_scale=1.0, **options):
    """``kvlab.ops.testing.make_case`` with q and V multiplied by ``q_scale`` and ``v_scale`` (in
    fp32, then stored in the case's dtype): scores and values large enough to show arithmetic
    done in fp16. Without them, kvlab.ops.testing's case itself."""
    q, k_cache, v_cache, tables, lens = testing.make_case(seq_lens, block_size, **options)
    if q_scale != 1:
        q = (q.float() * q_scale).to(q.dtype)
    if v_scale != 1:
        v_cache = (v_cache.float() * v_scale).to(v_cache.dtype)
    return q, k_cache, v_cache, tables, lens


def rebuild(case: dict) -> str:
    """The call that rebuilds a case's tensors, for a learner to try their code on."""
    given = ", ".join(f"{k}={v!r}" for k, v in case.items())
    return f"kvlab.grading.lab04.make_case({given}) builds these inputs"


def _fp32(args) -> list:
    """The case's tensors with q, K and V in fp32."""
    q, k_cache, v_cache, tables, lens = args
    return [q.float(), k_cache.float(), v_cache.float(), tables, lens]


def _expect_case(fn, what: str, unread=None, **case):
    args = make_case(**case)
    expected = paged_decode_attention_ref(*args)
    variants = Variants(case, make_case, lambda variant: fn(*variant))

    try:
        with refuse_reference(
            paged_decode_attention_ref, gather_kv, learner=fn, task="attending through key cards"
        ):
            got = call_without_mutation(fn, *args, names=NAMES)
    except Exception as error:  # (NotImplementedError passes through: it names no padding)
        if str(FAR) in str(error):
            _far_read_elsewhere(error, what, case, variants)
        read_far_padding(error, what)
        raise
    expect_tensor_like(
        got,
        expected,
        "the output",
        input=what,
        shape_hint="return one output per guest and query head: [num_seqs, num_q_heads, head_dim]",
        dtype_hint="compute in float32, then cast the result with .to(q.dtype)",
    )
    expect_attention(
        got,
        expected,
        args,
        what,
        "attention on its contiguous K and V",
        hints=HINTS,
        rerun_fp32=lambda: None if args[0].dtype == torch.float32 else fn(*_fp32(args)),
        unread=unread,
        replay=rebuild(case),
        variants=variants,
        fp32_expected=lambda: paged_decode_attention_ref(*_fp32(args)),
    )


def _far_read_elsewhere(error, what: str, case: dict, variants: Variants) -> None:
    """A padding entry of 10**9 was used as a room: when the code's answer on the same case with
    padding -1 (a room number that indexes) is a usual slip, that slip is the cause (the first
    guest's key card read for a longer guest reaches its padding), so say that one."""
    again, variant = variants.answer(garbage=-1), variants.case(garbage=-1)
    if again is None:
        return
    want = paged_decode_attention_ref(*variant)
    if close(again, want):
        return
    atol, rtol = TOLERANCE[want.dtype]
    cause, hint = diagnose(
        again.float().cpu(), want.float().cpu(), variant, atol, rtol, HINTS, variants=variants
    )
    if cause is None or cause == "nan":
        return
    raise CheckFailed(
        f"a padding entry of a key card ({FAR}) was used as a room number",
        input=what,
        got=explain_exception(error)[0],
        hint=hint,
        cause=cause,
        replay=rebuild(case),
    ) from error


# a guest of 4,096 tokens whose scores spread widely (q × 16, so q·k / sqrt(head_dim) has a
# standard deviation of 16) and whose values are large (V × 8): scores rounded to fp16 lose about
# 2**-11 of their size, which moves the softmax weights by ~1% and the output by 10 to 60 times
# the fp16 tolerance, while fp32 arithmetic rounded once at the end stays within a quarter of it
LONG_FP16 = dict(
    seq_lens=[4096, 1000],
    block_size=16,
    head_dim=128,
    dtype=torch.float16,
    q_scale=16.0,
    v_scale=8.0,
)
GARBAGE = dict(seq_lens=[5, 17], block_size=4)


def _check(name: str, *cases):
    """Register the check ``name``: its cases, each (what the report says, the case), in turn."""

    def check(fn):
        for what, case in cases:
            _expect_case(fn, what, **case)

    return paged.check(name)(check)


_one = _check(
    "one guest in one room", ("1 guest of 3 tokens, block_size 4", dict(seq_lens=[3], block_size=4))
)
_lengths = _check(
    "lengths 1, k·block_size and k·block_size ± 1",
    (
        "seq_lens [1, 32, 31, 33], block_size 16, head_dim 32",
        dict(seq_lens=[1, 32, 31, 33], block_size=16, head_dim=32),
    ),
)
_size_one = _check(
    "block_size 1 (every token in its own room)",
    ("seq_lens [1, 5, 9], block_size 1", dict(seq_lens=[1, 5, 9], block_size=1)),
)
_gqa = _check(
    "grouped-query (8 query heads on 2 KV heads) and multi-query (1 KV head)",
    ("GQA 8/2", dict(seq_lens=[7, 20], block_size=4, q_heads=8, kv_heads=2)),
    ("MQA 6/1", dict(seq_lens=[7, 20], block_size=4, q_heads=6, kv_heads=1)),
)
_garbage = _check(
    "unused key-card entries (-1, a room full of NaN, 10**9) are never read",
    ("padding -1", dict(garbage=-1, **GARBAGE)),
    (NAN_WHAT, dict(unread=PADDING, garbage=NAN_ROOM, **GARBAGE)),
    ("padding 10**9", dict(garbage=FAR, **GARBAGE)),
)
_shared = _check(
    "two guests sharing their rooms (a shared prefix)",
    ("both key cards list the same rooms", dict(seq_lens=[9, 12], block_size=4, shared=True)),
)
_fp16 = _check(
    "fp16: head_dim 40, and 4,096 tokens with large scores (compute in fp32, return fp16)",
    ("fp16, head_dim 40", dict(seq_lens=[3, 50], block_size=8, head_dim=40, dtype=torch.float16)),
    (
        "fp16, seq_lens [4096, 1000], block_size 16, head_dim 128, q × 16 and V × 8 (large "
        "scores and values)",
        LONG_FP16,
    ),
)
