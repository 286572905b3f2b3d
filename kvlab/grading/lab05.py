"""Checks for Lab 05: the learner's Triton paged-attention kernel, launched by kvlab's wrapper
(Triton's interpreter on CPU, compiled on a GPU) and compared with the torch reference.

Wrong answers are diagnosed as in Lab 04 (the same slips, hints in kernel terms), plus what a
kernel can get wrong on its own: the online softmax's rescaling, the query rows a program serves,
a key card walked by its strides wrongly, rows never stored, and Triton's own error messages.
Slips that answer alike on a check's case are named only once the kernel matches one of them on
a variant where they differ. The kernel runs on guarded copies of its tensors
(:mod:`kvlab.grading.guarded`); the garbage check puts NaN in what no guest holds (the beds past
each guest's end, the room a padding entry names), which a load without the token mask spreads
even where its scores are -inf (0 × NaN).
"""

from __future__ import annotations

import functools

import torch

from kvlab.grading import slips
from kvlab.grading.attention_diagnosis import (
    NAN_WHAT,
    PADDING,
    Variants,
    expect_attention,
    read_far_padding,
)
from kvlab.grading.attention_twins import (
    attend_beds,
    attend_overlapping_heads,
    attend_read,
    attend_room_by_room,
    attend_with_unit_step,
    own_kv,
    swapped_reader,
)
from kvlab.grading.expect import CheckFailed
from kvlab.grading.guarded import GuardedLaunch, unwritten
from kvlab.grading.lab04 import HINTS, rebuild
from kvlab.grading.launchers import launch_decode_isolated
from kvlab.grading.registry import exercise
from kvlab.grading.slips import Slip
from kvlab.grading.triton_errors import explain_triton_error, unwrap_unimplemented
from kvlab.ops.attention import paged_decode_attention_ref
from kvlab.ops.kernels import launch_paged_decode
from kvlab.ops.kernels.sizes import pow2
from kvlab.ops.runtime import kernel_mode
from kvlab.ops.testing import FAR, NAN_ROOM, SPARE_ROOM, make_case, tolerance

# In the interpreter an unmasked load or store can corrupt the process: each check runs in a child.
kernel = exercise(
    "05.kernel", "a Triton paged-attention kernel", isolate=kernel_mode() == "interpreter"
)
# the interpreter runs on the CPU; only compiled kernels need (and may touch) the GPU
DEVICE = "cuda" if kernel_mode() == "compiled" and torch.cuda.is_available() else "cpu"

KERNEL_HINTS = {
    **HINTS,
    "whole last room": "the beds past seq_len in the last room were scored: token t of room b "
    "is valid where b * BLOCK_SIZE + t < seq_len; mask the loads with it and give the other "
    "scores -inf (tl.where)",
    "zeros scored": "the beds past seq_len were loaded as 0.0 but still scored: a zero key "
    "scores 0, not -inf, and takes a share of the softmax. Give masked scores -inf (tl.where)",
    "last room skipped": "the last, partly filled room was skipped: loop over "
    "b < tl.cdiv(seq_len, BLOCK_SIZE), not seq_len // BLOCK_SIZE",
    "kv head modulo": "program kvh serves query heads kvh * GROUP + g for g < GROUP: query head h "
    "reads KV head h // {group}, not h % {kv_heads}",
    "low precision": "right in float32, wrong in {dtype}: convert every loaded tensor with "
    ".to(tl.float32) before any arithmetic (the interpreter gets {dtype} math wrong otherwise)",
    "nan": "NaN: a softmax over nothing but -inf, or 0 / 0. Does m start at -inf and l at 0, "
    "does every program read tl.cdiv(seq_len, BLOCK_SIZE) rooms, and are only beds past seq_len "
    "masked?",
    "row stride loop": "the loop ran stride_bts times, not once per room of the guest: loop "
    "over b < tl.cdiv(seq_len, BLOCK_SIZE) (a stride is a step in memory, not a key card's "
    "length)",
    "unit entry step": "key card entry b of guest seq is at bt_ptr + seq * stride_bts + "
    "b * stride_btb: entries are not always adjacent (here stride_btb = {entry_step})",
    "acc not rescaled": "acc was not rescaled: when a room raises the running max from m to "
    "m_new, what acc holds must shrink by alpha = exp(m - m_new) before the room is added: "
    "acc = acc * alpha[:, None] + …",
    "l not rescaled": "l (the running sum) was not rescaled: when a room raises the running max "
    "from m to m_new, l = l * alpha + tl.sum(p, axis=1) with alpha = exp(m - m_new)",
    "nothing rescaled": "neither acc nor l was rescaled: when a room raises the running max from "
    "m to m_new, multiply both by alpha = exp(m - m_new) before adding the room (section 2)",
    "max not kept": "m never moves on: set m = m_new at the end of each room, or alpha = "
    "exp(m - m_new) is 0 and every room wipes out the ones before it",
    "heads kvh + g": "program kvh serves the query heads kvh * GROUP + g (g < GROUP), not kvh + g: "
    "the programs' groups of query heads must not overlap",
    "one bed too many": "one bed past seq_len was scored: token t of room b is valid where "
    "b * BLOCK_SIZE + t < seq_len (strictly less: bed seq_len is the first one past the end), "
    "not <=",
    "kv head 0": "every query head read KV head 0: program kvh loads its own KV head's keys and "
    "values, k_ptr + room * stride_kb + t * stride_kt + kvh * stride_kh + d * stride_kd (and the "
    "same with the stride_v* strides for v)",
    "kv head kvh // GROUP": "the programs read KV head kvh // GROUP: kvh = tl.program_id(1) already "
    "is the KV head (it serves the query heads kvh * GROUP + g), so load its keys and values "
    "at kvh * stride_kh and kvh * stride_vh",
    "not normalised": "the output was not divided by the running sum: after the loop acc holds "
    "sum(exp(score - m) * v); store acc / l[:, None] (l the running sum)",
    "k strides swapped": "stride_kt and stride_kh were swapped: bed t of KV head kvh is at "
    "k_ptr + room * stride_kb + t * stride_kt + kvh * stride_kh + d * stride_kd",
    "v strides swapped": "stride_vt and stride_vh were swapped: bed t of KV head kvh is at "
    "v_ptr + room * stride_vb + t * stride_vt + kvh * stride_vh + d * stride_vd",
    "k and v strides swapped": "the token and head strides were swapped: bed t of KV head kvh is "
    "at room * stride_kb + t * stride_kt + kvh * stride_kh + d * stride_kd in k (and the same "
    "with the stride_v* strides in v)",
    "v is k": "the output summed keys, not values: acc adds tl.sum(p[:, :, None] * v[None, :, :], "
    "axis=1) with v loaded from v_ptr",
    "exp2 without log2(e)": "tl.exp2(x) is 2**x, not e**x: use tl.exp, or multiply everything "
    "that goes into tl.exp2 (the scores minus m, and m - m_new) by log2(e) = 1.4426950408889634",
}

UNWRITTEN_HINT = (
    "no value stored for guest {seq}, query head {head}: does the kernel reach tl.store for every "
    "(guest, query head)? Program (seq, kvh) stores the rows kvh * GROUP + g for g < GROUP"
)
STORE_OUTSIDE_HINT = (
    "a store outside the output: mask tl.store with the head mask (g < GROUP) and the lane mask "
    "(d < HEAD_DIM): mask=(g < GROUP)[:, None] & (d < HEAD_DIM)[None, :]"
)
LOAD_MASKS = {
    "q": "the head mask (g < GROUP) and the lane mask (d < HEAD_DIM)",
    "k_cache": "the token mask (b * BLOCK_SIZE + t < seq_len) and the lane mask (d < HEAD_DIM)",
}
LOAD_MASKS["v_cache"] = LOAD_MASKS["k_cache"]
LOAD_OUTSIDE_HINT = "a tl.load read memory outside {name}: mask it with {masks}"


def _lookalike_slips(args):
    """The slips that can look alike on a case (named only where told apart, see
    ``_lookalikes``), each answering on any case; the causes None are rivals that lab04 names."""
    q_heads, kv_heads = args[0].shape[1], args[1].shape[2]
    whole = lambda n, size: -(-n // size) * size  # noqa: E731
    one_more = lambda n, size: min(n + 1, whole(n, size))  # noqa: E731
    yield Slip(None, lambda a: attend_beds(a, one_more), "one bed too many")
    if q_heads > kv_heads:
        yield Slip(None, lambda a: attend_beds(a, kv_of_head=[0] * a[0].shape[1]), "kv head 0")
        divided = lambda a: attend_beds(a, kv_of_head=_kv_head_divided(a))  # noqa: E731
        yield Slip(None, divided, "kv head kvh // GROUP")
    yield Slip(None, lambda a: attend_read(a, normalise=False), "not normalised")
    yield Slip(None, lambda a: attend_read(a, keys=swapped_reader(1)), "k strides swapped")
    yield Slip(None, lambda a: attend_read(a, values=swapped_reader(2)), "v strides swapped")
    both = lambda a: attend_read(a, keys=swapped_reader(1), values=swapped_reader(2))  # noqa: E731
    yield Slip(None, both, "k and v strides swapped")
    yield Slip(None, lambda a: attend_read(a, values=own_kv), "v is k")
    yield Slip(None, lambda a: attend_read(a, exp2=True), "exp2 without log2(e)")
    yield Slip(None, lambda a: attend_beds(a, whole))  # lab04's "whole last room"
    if kv_heads not in (1, q_heads):
        yield Slip(
            None, lambda a: attend_beds(a, kv_of_head=[h % kv_heads for h in range(q_heads)])
        )


def _kv_head_divided(args) -> list[int]:
    """The KV head each query head reads when program kvh loads KV head kvh // GROUP."""
    group = args[0].shape[1] // args[1].shape[2]
    return [(h // group) // group for h in range(args[0].shape[1])]


# Cases on which slips that look alike elsewhere differ: tried in turn to tell them apart.
LOOKALIKE_VARIANTS = (
    dict(q_heads=8, kv_heads=4),  # KV head 0, kvh // GROUP and h % kv_heads all differ
    dict(seq_lens=[5, 2]),  # with rooms of 4: one bed too many is not the whole last room
)


def _lookalikes(got, case: dict, variants: Variants):
    """The look-alike slips, each offered only when it is the one mistake left of those whose
    answer on this case is the learner's ``got``, once narrowed on the variants of the case where
    they differ (:data:`LOOKALIKE_VARIANTS`; the learner's answers there from ``variants``)."""
    tol = tolerance(case.get("dtype", torch.float32))

    def on(changes):
        return make_case(**{**case, **changes})

    def mine(changes):
        seen = variants.answer(**changes)
        return None if seen is None else seen.float().cpu()

    def right(changes):
        return paged_decode_attention_ref(*on(changes)).float()

    table = [
        Slip(None, lambda changes, s=s: s.answer(on(changes)), s.cause)
        for s in _lookalike_slips(on({}))
    ]

    @functools.cache
    def left():
        def same(a, b) -> bool:
            return a is not None and b is not None and torch.allclose(a, b, **tol, equal_nan=True)

        found = slips.matching(table, got.float().cpu(), ({},), right({}), same)
        probes = [(changes,) for changes in LOOKALIKE_VARIANTS]
        found = slips.told_apart(
            found, mine, probes, right, same, readable=lambda answer: answer is not None
        )
        return slips.only(found)

    for slip in table:
        if slip.cause is not None:
            yield Slip(
                None, lambda slip=slip: slip.answer({}) if left() is slip else None, slip.cause
            )


def _kernel_slips(args, got=None, case=None, variants=None):
    """The mistakes only a kernel can make (the look-alike ones given the learner's answer
    ``got``, its case and ``variants``, see ``_lookalikes``)."""
    q, k_cache = args[0], args[1]
    if 1 < k_cache.shape[2] < q.shape[1]:
        ordered = kernel_mode() == "interpreter"
        yield Slip(None, lambda: attend_overlapping_heads(args, ordered), "heads kvh + g")

    def online(cause, **options) -> Slip:
        return Slip(None, lambda: attend_room_by_room(args, **options), cause)

    yield online("nothing rescaled", rescale_acc=False, rescale_l=False)
    yield online("acc not rescaled", rescale_acc=False)
    yield online("l not rescaled", rescale_l=False)
    yield online("max not kept", keep_max=False)
    row_step, entry_step = args[3].stride()  # a key card walked wrongly
    yield Slip(
        None, lambda: attend_beds(args, lambda n, size: min(n, row_step * size)), "row stride loop"
    )
    if entry_step != 1:
        yield Slip(None, lambda: attend_with_unit_step(args), "unit entry step")
    if variants is not None:
        yield from _lookalikes(got, case, variants)


launch_isolated = launch_decode_isolated  # the name Lab 05's cells import


INPUTS = ("q", "k_cache", "v_cache")


def _launch(fn, *args, out=None):
    try:
        return launch_paged_decode(fn, *args, out=out)
    except Exception as error:
        unwrap_unimplemented(error)
        raise


def guarded_launch(fn, args, zero_guards=()) -> GuardedLaunch:
    """The learner's kernel on guarded copies of a case (see :mod:`kvlab.grading.guarded`)."""
    q, k_cache = args[0], args[1]
    # wider than any stray reaches: a lane past HEAD_DIM, a padded group row, a room's step
    pad = (
        q[0].numel() + pow2(q.shape[1] // k_cache.shape[2]) * pow2(q.shape[2]) + k_cache[0].numel()
    )
    return GuardedLaunch(fn, args, _launch, INPUTS, pad, zero_guards)


def _on_device(**case) -> list:
    return [t.to(DEVICE) for t in make_case(**case)]


def _expect_kernel(fn, what: str, unread=None, **case):
    """Launch the learner's kernel on ``make_case(**case)`` and compare. Padding entries name a
    real room unless the case says otherwise: only the garbage check tries what a read of them
    does (a wild read in the interpreter may crash, or return anything). ``unread``: see
    ``expect_attention``."""
    case.setdefault("garbage", SPARE_ROOM)
    args = _on_device(**case)
    expected = paged_decode_attention_ref(*args)
    try:
        run = guarded_launch(fn, args)
    except NotImplementedError:
        raise
    except Exception as error:
        read_far_padding(error, what)
        explain_triton_error(error, what)
        raise
    got = run.got
    if unwritten(got).all():
        raise CheckFailed(
            "your kernel stored no value at all",
            input=what,
            replay=rebuild(case),
            hint=UNWRITTEN_HINT.format(seq=0, head=0),
            cause="unwritten",
        )

    def rerun_fp32():
        if args[0].dtype == torch.float32:
            return None
        return guarded_launch(fn, [*(t.float() for t in args[:3]), *args[3:]]).got

    variants = Variants(case, _on_device, lambda variant: guarded_launch(fn, variant).got)

    def rows_not_stored():
        row = run.first_unwritten()
        return row and ("unwritten", UNWRITTEN_HINT.format(seq=row[0], head=row[1]))

    def stored_outside():
        return ("store outside", STORE_OUTSIDE_HINT) if len(run.strays) else None

    def loaded_outside():
        name = run.input_read_outside()
        return name and (
            "load outside",
            LOAD_OUTSIDE_HINT.format(name=name, masks=LOAD_MASKS[name]),
        )

    expect_attention(
        got,
        expected.cpu(),
        args,
        what,
        "the reference",
        hints=KERNEL_HINTS,
        rerun_fp32=rerun_fp32,
        unread=unread,
        extra_slips=list(_kernel_slips(args, got, case, variants)),
        replay=rebuild(case),
        variants=variants,
        fallbacks=(rows_not_stored, stored_outside, loaded_outside),
    )
    if len(run.strays):  # a right answer, and values stored where they do not belong
        raise CheckFailed(
            run.stray_report(),
            input=what,
            replay=rebuild(case),
            hint=STORE_OUTSIDE_HINT,
            cause="store outside",
        )


@kernel.check("one guest in one room")
def _one(fn):
    _expect_kernel(fn, "seq_lens [3], block_size 4", seq_lens=[3], block_size=4)


@kernel.check("lengths 1, k·block_size and k·block_size ± 1 (mask the last room)")
def _lengths(fn):
    _expect_kernel(fn, "seq_lens [1, 8, 7, 9], block_size 4", seq_lens=[1, 8, 7, 9], block_size=4)


@kernel.check("grouped-query attention with head_dim 40 (padded to 64 lanes)")
def _gqa(fn):
    _expect_kernel(
        fn,
        "8 query heads on 2 KV heads, head_dim 40",
        seq_lens=[6, 13],
        block_size=4,
        q_heads=8,
        kv_heads=2,
        head_dim=40,
    )


@kernel.check("groups of 3 query heads (padded to 4 rows)")
def _group_of_three(fn):
    _expect_kernel(
        fn, "6 query heads on 2 KV heads", seq_lens=[5, 9], block_size=4, q_heads=6, kv_heads=2
    )


ROOM_TOO_MANY = (
    "a padding entry of its key card was read",
    "a padding entry was read only where seq_len is a multiple of BLOCK_SIZE (seq_lens [5, 11] "
    "read none): the loop ran one room past the key card's end, seq_len // BLOCK_SIZE + 1 rooms "
    "instead of tl.cdiv(seq_len, BLOCK_SIZE), and that room's K/V loads were not masked by the "
    "token mask (b * BLOCK_SIZE + t < seq_len), so its NaN reached the answer",
    "room past the end at multiples",
)
BEDS_READ = (
    "a bed past seq_len was read",
    "the beds past seq_len in the last room were loaded, and here they hold NaN: a score of -inf "
    "gives p = 0, but 0 × NaN is NaN. Mask the K and V loads with the token mask "
    "(b * BLOCK_SIZE + t < seq_len) as well as the lane mask, other=0.0",
    "beds past seq_len loaded",
)


@kernel.check(
    "rooms past the key card's end are never read, nor beds past seq_len (NaN there, 10**9)"
)
def _garbage(fn):
    case = dict(seq_lens=[5, 11], block_size=4)
    _expect_kernel(fn, "padding entries name a spare room", **case)
    _expect_kernel(fn, NAN_WHAT, unread=PADDING, garbage=NAN_ROOM, **case)
    _expect_kernel(fn, "padding entries 10**9", garbage=FAR, **case)
    # whole rooms only: a loop of seq_len // BLOCK_SIZE + 1 rooms reaches the first padding entry
    multiples = dict(seq_lens=[8, 4], block_size=4)
    _expect_kernel(fn, "seq_lens [8, 4] (whole rooms), padding a spare room", **multiples)
    _expect_kernel(
        fn,
        f"seq_lens [8, 4] (whole rooms), {NAN_WHAT}",
        unread=ROOM_TOO_MANY,
        **multiples,
        garbage=NAN_ROOM,
    )
    _expect_kernel(
        fn,
        "seq_lens [5, 11], the beds past seq_len in each last room hold NaN",
        unread=BEDS_READ,
        **case,
        nan_beds=True,
    )


@kernel.check("key cards stored column by column: follow both strides, one step per room")
def _transposed(fn):
    _expect_kernel(
        fn,
        "block_tables is a transposed view (stride_bts = 1, stride_btb = 3), seq_lens [5, 11, 9]",
        seq_lens=[5, 11, 9],
        block_size=4,
        transposed=True,
    )


@kernel.check("bf16 inputs: load, upcast to fp32, accumulate in fp32")
def _bf16(fn):
    _expect_kernel(fn, "bf16, seq_lens [9, 4]", seq_lens=[9, 4], block_size=4, dtype=torch.bfloat16)
