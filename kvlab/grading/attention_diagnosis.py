"""Which usual slip a wrong decode-attention answer shows, for Labs 04 and 05: the learner's
answer is compared with what each slip computes (:mod:`kvlab.grading.attention_twins`) on the
check's case, in the order the slips are listed, and a slip whose only trace here is answers it
leaves undefined (or that answers as another) is named once its probe agrees. Each lab passes its
hints, by cause, in its own terms (Lab 04's gather, Lab 05's kernel)."""

from __future__ import annotations

import functools
import math

import torch

from kvlab.grading.attention_twins import attend_beds
from kvlab.grading.blame import explain_exception
from kvlab.grading.expect import CheckFailed, furthest, preview
from kvlab.grading.slips import Slip
from kvlab.ops.attention import paged_decode_attention_ref
from kvlab.ops.testing import FAR, TOLERANCE, close


class Variants:
    """The learner's answers on variants of a check's case (some arguments of its ``make_case``
    changed), each computed once: ``answer(**changes)`` (None when the code raised or gave no
    tensor of q's shape), ``case(**changes)`` (the tensors it was given), ``right(**changes)``.
    ``build(**case)`` makes a case's tensors, ``run(args)`` runs the learner's code on them."""

    def __init__(self, case: dict, build, run):
        self._case, self._build, self._run, self._seen = case, build, run, {}

    def _variant(self, changes: dict):
        key = repr(sorted(changes.items()))
        if key not in self._seen:
            variant = self._build(**{**self._case, **changes})
            try:
                got = self._run(variant)
            except Exception:
                got = None
            fits = isinstance(got, torch.Tensor) and got.shape == variant[0].shape
            self._seen[key] = (got if fits else None, variant)
        return self._seen[key]

    def answer(self, **changes):
        return self._variant(changes)[0]

    def case(self, **changes):
        return self._variant(changes)[1]

    def right(self, **changes) -> bool:
        got, variant = self._variant(changes)
        return got is not None and close(got, paged_decode_attention_ref(*variant))


def _slips(args, variants: Variants | None = None, tolerance=None):
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
        got = variants.answer(block_size=other) if variants is not None else None
        if got is None:
            return False
        variant = variants.case(block_size=other)
        expected = paged_decode_attention_ref(*variant).float().cpu()
        wrong = attend_beds(variant, scale=scale_of(other))
        return _looks_like(got.float().cpu(), wrong, expected, *tolerance) == "changed"

    def full_rooms_right() -> bool:
        """A guest left without a bed is all the case shows of the floor: the code must then be
        right when every guest fills whole rooms (nothing else is wrong)."""
        filled = [whole(int(n), size) for n in lens]
        return variants is not None and variants.right(seq_lens=filled)

    def slip(cause, **options) -> Slip:
        return Slip(None, lambda: attend_beds(args, **options), cause)

    yield slip("whole last room", beds_of=whole)
    yield slip("zeros scored", beds_of=whole, zero_tail=True)
    floor = lambda n, size: n // size * size  # noqa: E731
    yield Slip(None, lambda: attend_beds(args, floor), "last room skipped", probe=full_rooms_right)
    if q.shape[0] > 1:
        yield slip("one key card", row_of=lambda s: 0)
    by_size = lambda b: 1.0 / math.sqrt(b)  # noqa: E731
    if size == 1 and variants is not None:  # both slips answer alike: another size tells
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
    hints,
    rerun_fp32=None,
    extra_slips=(),
    variants: Variants | None = None,
    fallbacks=(),
    fp32_expected=None,
):
    """(cause, hint) of the first usual mistake (a :class:`Slip`, hints by cause) whose answer
    ``got`` matches, else (None, None).

    ``slip.answer()`` is what the slip computes on this case. When its only trace in this case
    is answers it leaves undefined (or, for a ``lookalike``, whenever it matches: another slip
    answers alike in this case), the match needs ``slip.probe()`` (a slip without a probe is
    taken on that evidence alone). ``extra_slips`` are tried first.
    ``variants`` (:class:`Variants`) are the learner's answers on variants of the case, which
    probes consult. ``rerun_fp32()`` computes the
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
    for slip in [*extra_slips, *_slips(args, variants, (atol, rtol))]:
        found = _looks_like(got, slip.answer(), expected, atol, rtol)
        if found and (found == "undefined" or slip.lookalike) and slip.probe is not None:
            found = slip.probe()
        if found:
            return slip.cause, hints[slip.cause].format(**fill)
    again = None if rerun_fp32 is None else rerun_fp32()
    if again is not None:  # the inputs were fp16/bf16: the reference on fp32 inputs is wanted
        want = expected if fp32_expected is None else fp32_expected().float().cpu()
        if torch.allclose(again.float().cpu(), want, atol=1e-4, rtol=1e-4):
            return "low precision", hints["low precision"].format(**fill)
    for fallback in fallbacks:
        found = fallback()
        if found is not None:
            return found
    if got.isnan().any():
        return "nan", hints["nan"].format(**fill)
    return None, None


def expect_attention(
    got, expected, args, what: str, reference: str, unread=None, replay=None, **diagnosis
) -> None:
    """Raise a CheckFailed naming the guest and head that differ, with the first values and the
    diagnosed mistake when it is a usual one (``diagnose``, given ``diagnosis``). ``unread``
    (what was read, hint, cause; :data:`PADDING` for the key cards' padding entries): the case
    differs from one that passed only in memory that must not be read, so a wrong answer means
    it was."""
    atol, rtol = TOLERANCE[expected.dtype]
    got, expected = got.float().cpu(), expected.float().cpu()
    if torch.allclose(got, expected, atol=atol, rtol=rtol):
        return
    if unread is not None:
        read, hint, cause = unread
        read = f": {read}"
    else:
        read, (cause, hint) = "", diagnose(got, expected, args, atol, rtol, **diagnosis)
    raise differs(got, expected, what, reference, hint, cause, replay, read)


def differs(got, expected, what: str, reference: str, hint, cause=None, replay=None, read=""):
    """The failure of an attention output: the guest and query head furthest off ``expected``
    (the ``reference``), their first values, and the diagnosis."""
    (seq, head), error = furthest(got, expected)
    return CheckFailed(
        f"guest {seq}, query head {head} differs from {reference} ({error}){read}",
        input=what,
        expected=preview(expected[seq, head]),
        got=preview(got[seq, head]),
        hint=hint,
        cause=cause,
        replay=replay,
    )


PADDING_HINT = "read only the first ceil(seq_len / block_size) entries of each key card"
NAN_WHAT = "padding entries name a spare room whose K and V are NaN"
PADDING = ("a padding entry of its key card was read", PADDING_HINT, PADDING_HINT)


def read_far_padding(error: BaseException, what: str) -> None:
    """Fail with a diagnosis when ``error`` says a padding entry (``FAR``) was used as a room."""
    if str(FAR) in str(error):
        raise CheckFailed(
            f"a padding entry of a key card ({FAR}) was used as a room number",
            input=what,
            got=explain_exception(error)[0],
            hint=PADDING_HINT,
        ) from error
