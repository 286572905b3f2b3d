"""Checks for Lab 04: decode attention through block tables (the gather-based reference).

A wrong answer is compared with what the usual slips would compute (every bed of the last room,
the last room skipped, the first guest's key card for every guest, a missing scale or one by the
block size, a softmax over the heads, the wrong KV head, fp16 arithmetic, ...): a match names the
mistake, and later checks broken by the same mistake say "the same problem". Lab 05 reuses the
diagnosis, with hints in kernel terms; both build their cases with ``kvlab.ops.testing.make_case``
(Lab 04's, here, can scale q and V up) and judge them with its tolerances.
"""

from __future__ import annotations

import functools
import math

import torch

from kvlab.grading.blame import explain_exception
from kvlab.grading.expect import (
    CheckFailed,
    call_without_mutation,
    expect_type,
    max_error,
    preview,
)
from kvlab.grading.own_code import refuse_reference
from kvlab.grading.registry import exercise
from kvlab.grading.slips import Slip
from kvlab.ops import testing
from kvlab.ops.attention import decode_attention, gather_kv, paged_decode_attention_ref
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


def attend_beds(
    args,
    beds_of=None,
    zero_tail=False,
    scale=None,
    kv_of_head=None,
    softmax_over_heads=False,
    row_of=None,
):
    """fp32 attention where guest s attends its first ``beds_of(seq_len, block_size)`` beds (the
    beds past seq_len zeroed with ``zero_tail``), listed in row ``row_of(s)`` of the key cards
    (its own row by default): what the usual slips compute. NaN where a guest attends no bed
    (code gets 0 or NaN there)."""
    q, k_cache, v_cache, tables, lens = args
    q, k_cache, v_cache = q.float().cpu(), k_cache.float().cpu(), v_cache.float().cpu()
    size = k_cache.shape[1]
    out = torch.full(q.shape, float("nan"))
    for s in range(q.shape[0]):
        n = int(lens[s])
        beds = n if beds_of is None else beds_of(n, size)
        if beds < 1:
            continue
        row = s if row_of is None else row_of(s)
        rooms = tables[row, : -(-beds // size)].long().cpu()
        k = k_cache[rooms].flatten(0, 1)[:beds].clone()
        v = v_cache[rooms].flatten(0, 1)[:beds].clone()
        if zero_tail:
            k[n:], v[n:] = 0.0, 0.0
        if kv_of_head is not None:
            k, v = k[:, kv_of_head], v[:, kv_of_head]
        if softmax_over_heads:
            out[s] = _softmax_over_heads(q[s], k, v, scale)
        else:
            out[s] = decode_attention(q[s], k, v, scale=scale)
    return out


def _softmax_over_heads(q, k, v, scale=None):
    """One guest's attention with each token's scores normalised across the query heads."""
    group = q.shape[0] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.einsum("hd,thd->ht", q, k) * scale
    return torch.einsum("ht,thd->hd", scores.softmax(dim=0), v)


def _slips(args, right_on=None, variant_on=None, tolerance=None):
    """The usual mistakes, in the order they are tried (see ``diagnose``): each slip's answer is
    what it computes on this case; its probe confirms it where the case cannot."""
    q, k_cache, lens = args[0], args[1], args[4]
    head_dim, q_heads, kv_heads = q.shape[2], q.shape[1], k_cache.shape[2]
    size = k_cache.shape[1]
    whole = lambda n, size: -(-n // size) * size  # noqa: E731

    def scaled_on_other_rooms(scale_of) -> bool:
        """With rooms of one bed a scale by sqrt(block_size) is no scale at all: the code's
        answer with rooms of another size (neither 1 nor head_dim) says which it is."""
        other = next(b for b in (4, 2, 8) if b != head_dim)
        found = variant_on(block_size=other) if variant_on is not None else None
        if found is None:
            return False
        got, variant = found
        expected = paged_decode_attention_ref(*variant).float().cpu()
        wrong = attend_beds(variant, scale=scale_of(other))
        return _looks_like(got.float().cpu(), wrong, expected, *tolerance) == "changed"

    def full_rooms_right() -> bool:
        """A guest left without a bed is all the case shows of the floor: the code must then be
        right when every guest fills whole rooms (nothing else is wrong)."""
        filled = [whole(int(n), size) for n in lens]
        return right_on is not None and right_on(seq_lens=filled)

    def slip(cause, **options) -> Slip:
        return Slip(None, lambda: attend_beds(args, **options), cause)

    yield slip("whole last room", beds_of=whole)
    yield slip("zeros scored", beds_of=whole, zero_tail=True)
    floor = lambda n, size: n // size * size  # noqa: E731
    yield Slip(None, lambda: attend_beds(args, floor), "last room skipped", probe=full_rooms_right)
    if q.shape[0] > 1:
        yield slip("one key card", row_of=lambda s: 0)
    by_size = lambda b: 1.0 / math.sqrt(b)  # noqa: E731
    if size == 1 and variant_on is not None:  # both slips answer alike: another size tells
        for cause, scale_of in (("no scale", lambda b: 1.0), ("block size scale", by_size)):
            probe = functools.partial(scaled_on_other_rooms, scale_of)
            unscaled = lambda: attend_beds(args, scale=1.0)  # noqa: E731
            yield Slip(None, unscaled, cause, probe=probe, lookalike=True)
    else:
        yield slip("no scale", scale=1.0)
        if size not in (1, head_dim):
            yield slip("block size scale", scale=by_size(size))
    yield slip("scale divided", scale=math.sqrt(head_dim))
    if q_heads > 1:
        yield slip("softmax over heads", softmax_over_heads=True)
    if kv_heads not in (1, q_heads):
        yield slip("kv head modulo", kv_of_head=[h % kv_heads for h in range(q_heads)])


ANY = math.inf  # in a slip's answer: a value the slip leaves to chance (two programs race for it)


def _looks_like(got, wrong, expected, atol, rtol) -> str | None:
    """How ``got`` compares with ``wrong``, what a slip computes (None: the slip does not apply
    to this case). NaN in ``wrong`` marks an answer the slip leaves undefined (a guest without a
    bed, a row nobody stores): code gets NaN or 0 there. ``ANY`` marks a value not compared.

    Returns "changed" when ``got`` matches and the slip changes a defined value, "undefined" when
    it matches and the slip's only trace is undefined answers, else None.
    """
    if wrong is None:
        return None
    undefined = wrong.isnan()
    known = ~undefined & ~wrong.isinf()
    if not torch.allclose(got[known], wrong[known], atol=atol, rtol=rtol):
        return None
    if not (got[undefined].isnan() | (got[undefined] == 0)).all():
        return None
    if (known & ~torch.isclose(wrong, expected, atol=atol, rtol=rtol)).any():
        return "changed"
    return "undefined" if undefined.any() else None


def diagnose(
    got,
    expected,
    args,
    atol,
    rtol,
    hints=HINTS,
    rerun_fp32=None,
    extra_slips=(),
    right_on=None,
    fallbacks=(),
    variant_on=None,
    fp32_expected=None,
):
    """(cause, hint) of the first usual mistake (a :class:`Slip`, hints by cause) whose answer
    ``got`` matches, else (None, None).

    ``slip.answer()`` is what the slip computes on this case. When its only trace in this case
    is answers it leaves undefined (or, for a ``lookalike``, whenever it matches: another slip
    answers alike in this case), the match needs ``slip.probe()`` (a slip without a probe is
    taken on that evidence alone). ``extra_slips`` are tried first.
    ``right_on(**changes)`` says whether the learner's code is right on the case with some
    arguments of ``make_case`` changed; ``variant_on(**changes)`` is its answer there and that
    case's arguments, ``(got, args)``, or None when it raised. ``rerun_fp32()`` computes the
    learner's answer again on fp32 inputs (None when they already are), to recognise arithmetic
    done in fp16/bf16: it is compared with ``fp32_expected()``, the reference on those inputs
    (by default ``expected``, rounded to the inputs' dtype). ``fallbacks`` are functions
    returning a (cause, hint) or None, tried after the slips, before a NaN is blamed on the
    softmax.
    """
    q, k_cache = args[0], args[1]
    fill = {
        "group": q.shape[1] // k_cache.shape[2],
        "kv_heads": k_cache.shape[2],
        "dtype": str(q.dtype).removeprefix("torch."),
        "entry_step": args[3].stride(1),
    }
    for slip in [*extra_slips, *_slips(args, right_on, variant_on, (atol, rtol))]:
        found = _looks_like(got, slip.answer(), expected, atol, rtol)
        if found and (found == "undefined" or slip.lookalike) and slip.probe is not None:
            found = slip.probe()
        if found:
            return slip.cause, hints[slip.cause].format(**fill)
    if rerun_fp32 is not None:
        again = rerun_fp32()
        want = expected if fp32_expected is None else fp32_expected().float().cpu()
        if again is not None and torch.allclose(again.float().cpu(), want, atol=1e-4, rtol=1e-4):
            return "low precision", hints["low precision"].format(**fill)
    for fallback in fallbacks:
        found = fallback()
        if found is not None:
            return found
    if got.isnan().any():
        return "nan", hints["nan"].format(**fill)
    return None, None


def expect_attention(
    got, expected, args, what: str, reference: str, padding=False, replay=None, **diagnosis
) -> None:
    """Raise a CheckFailed naming the guest and head that differ, with the first values and the
    diagnosed mistake when it is a usual one (``diagnose``, given ``diagnosis``). ``padding``:
    the case differs from one that passed only in what the key cards' padding entries name, so a
    wrong answer means they were read."""
    atol, rtol = TOLERANCE[expected.dtype]
    got, expected = got.float().cpu(), expected.float().cpu()
    if torch.allclose(got, expected, atol=atol, rtol=rtol):
        return
    diff = (got - expected).abs().nan_to_num(nan=math.inf)
    seq = int(diff.amax(dim=(1, 2)).argmax())
    head = int(diff[seq].amax(dim=1).argmax())
    if padding:
        cause = hint = PADDING_HINT
    else:
        cause, hint = diagnose(got, expected, args, atol, rtol, **diagnosis)
    read = ": a padding entry of its key card was read" if padding else ""
    raise CheckFailed(
        f"guest {seq}, query head {head} differs from {reference} ({max_error(got, diff)}){read}",
        input=what,
        expected=preview(expected[seq, head]),
        got=preview(got[seq, head]),
        hint=hint,
        cause=cause,
        replay=replay,
    )


PADDING_HINT = "read only the first ceil(seq_len / block_size) entries of each key card"
NAN_WHAT = "padding entries name a spare room whose K and V are NaN"


def read_far_padding(error: BaseException, what: str) -> None:
    """Fail with a diagnosis when ``error`` says a padding entry (``FAR``) was used as a room."""
    if str(FAR) in str(error):
        raise CheckFailed(
            f"a padding entry of a key card ({FAR}) was used as a room number",
            input=what,
            got=explain_exception(error)[0],
            hint=PADDING_HINT,
        ) from error


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


def _expect_case(fn, what: str, padding=False, **case):
    args = make_case(**case)
    expected = paged_decode_attention_ref(*args)

    variants: dict = {}

    def variant_on(**changes):
        """The learner's answer on the case with ``changes``, and that case's tensors (None: it
        raised, or answered with no tensor of the right shape)."""
        key = repr(sorted(changes.items()))
        if key not in variants:
            variant = make_case(**{**case, **changes})
            try:
                again = fn(*variant)
            except Exception:
                again = None
            fits = isinstance(again, torch.Tensor) and again.shape == variant[0].shape
            variants[key] = (again, variant) if fits else None
        return variants[key]

    def right_on(**changes) -> bool:
        found = variant_on(**changes)
        return found is not None and close(found[0], paged_decode_attention_ref(*found[1]))

    try:
        with refuse_reference(
            paged_decode_attention_ref, gather_kv, learner=fn, task="attending through key cards"
        ):
            got = call_without_mutation(fn, *args, names=NAMES)
    except NotImplementedError:
        raise
    except Exception as error:
        if str(FAR) in str(error):
            _far_read_elsewhere(error, what, case, variant_on)
        read_far_padding(error, what)
        raise
    expect_type(got, torch.Tensor, "the output", input=what)
    if got.shape != expected.shape:
        raise CheckFailed(
            "wrong output shape",
            input=what,
            expected=str(tuple(expected.shape)),
            got=str(tuple(got.shape)),
            hint="return one output per guest and query head: [num_seqs, num_q_heads, head_dim]",
        )
    if got.dtype != expected.dtype:
        raise CheckFailed(
            "the output must have q's dtype",
            input=what,
            expected=str(expected.dtype),
            got=str(got.dtype),
            hint="compute in float32, then cast the result with .to(q.dtype)",
        )

    def rerun_fp32():
        if args[0].dtype == torch.float32:
            return None
        return fn(*_fp32(args))

    reference = "attention on its contiguous K and V"
    expect_attention(
        got,
        expected,
        args,
        what,
        reference,
        rerun_fp32=rerun_fp32,
        padding=padding,
        replay=rebuild(case),
        right_on=right_on,
        variant_on=variant_on,
        fp32_expected=lambda: paged_decode_attention_ref(*_fp32(args)),
    )


def _far_read_elsewhere(error, what: str, case: dict, variant_on) -> None:
    """A padding entry of 10**9 was used as a room: when the code's answer on the same case with
    padding -1 (a room number that indexes) is a usual slip, that slip is the cause (the first
    guest's key card read for a longer guest reaches its padding), so say that one."""
    found = variant_on(garbage=-1)
    if found is None:
        return
    again, variant = found
    want = paged_decode_attention_ref(*variant)
    if close(again, want):
        return
    atol, rtol = TOLERANCE[want.dtype]
    cause, hint = diagnose(
        again.float().cpu(), want.float().cpu(), variant, atol, rtol, variant_on=variant_on
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


@paged.check("one guest in one room")
def _one(fn):
    _expect_case(fn, "1 guest of 3 tokens, block_size 4", seq_lens=[3], block_size=4)


@paged.check("lengths 1, k·block_size and k·block_size ± 1")
def _lengths(fn):
    _expect_case(
        fn,
        "seq_lens [1, 32, 31, 33], block_size 16, head_dim 32",
        seq_lens=[1, 32, 31, 33],
        block_size=16,
        head_dim=32,
    )


@paged.check("block_size 1 (every token in its own room)")
def _size_one(fn):
    _expect_case(fn, "seq_lens [1, 5, 9], block_size 1", seq_lens=[1, 5, 9], block_size=1)


@paged.check("grouped-query (8 query heads on 2 KV heads) and multi-query (1 KV head)")
def _gqa(fn):
    _expect_case(fn, "GQA 8/2", seq_lens=[7, 20], block_size=4, q_heads=8, kv_heads=2)
    _expect_case(fn, "MQA 6/1", seq_lens=[7, 20], block_size=4, q_heads=6, kv_heads=1)


@paged.check("unused key-card entries (-1, a room full of NaN, 10**9) are never read")
def _garbage(fn):
    case = dict(seq_lens=[5, 17], block_size=4)
    _expect_case(fn, "padding -1", garbage=-1, **case)
    _expect_case(fn, NAN_WHAT, padding=True, garbage=NAN_ROOM, **case)
    _expect_case(fn, "padding 10**9", garbage=FAR, **case)


@paged.check("two guests sharing their rooms (a shared prefix)")
def _shared(fn):
    _expect_case(
        fn, "both key cards list the same rooms", seq_lens=[9, 12], block_size=4, shared=True
    )


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


@paged.check("fp16: head_dim 40, and 4,096 tokens with large scores (compute in fp32, return fp16)")
def _fp16(fn):
    _expect_case(
        fn, "fp16, head_dim 40", seq_lens=[3, 50], block_size=8, head_dim=40, dtype=torch.float16
    )
    _expect_case(
        fn,
        "fp16, seq_lens [4096, 1000], block_size 16, head_dim 128, q × 16 and V × 8 (large "
        "scores and values)",
        **LONG_FP16,
    )
