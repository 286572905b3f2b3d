"""Checks for Lab 05: the learner's Triton paged-attention kernel (interpreted on CPU, compiled
on a GPU) on guarded copies of its tensors (:mod:`kvlab.grading.guarded`), against the torch
reference. Wrong answers are diagnosed as in Lab 04 (hints in kernel terms), plus what only a kernel
gets wrong: the online softmax's rescaling, the rows a program serves, a key card walked wrongly,
rows never stored, Triton's errors; slips that answer alike are named once told apart on variants.
NaN in what no guest holds shows a load without the token mask, even under a -inf score (0 × NaN).
"""

from __future__ import annotations

import functools

import torch

from kvlab.grading import attention_diagnosis as diagnosis
from kvlab.grading import attention_twins as twins
from kvlab.grading import slips
from kvlab.grading.attention_twins import attend_beds, attend_read, swapped_reader
from kvlab.grading.expect import CheckFailed
from kvlab.grading.guarded import GuardedLaunch, unwritten
from kvlab.grading.lab04 import HINTS, rebuild
from kvlab.grading.launchers import launch_decode_isolated as launch_isolated  # noqa: F401 (cells)
from kvlab.grading.registry import exercise
from kvlab.grading.slips import Slip
from kvlab.grading.triton_errors import explain_triton_error, unwrap_unimplemented
from kvlab.ops.attention import paged_decode_attention_ref
from kvlab.ops.kernels import launch_paged_decode
from kvlab.ops.kernels.sizes import pow2
from kvlab.ops.runtime import kernel_mode
from kvlab.ops.testing import FAR, NAN_ROOM, SPARE_ROOM, make_case, tolerance

# In the interpreter an unmasked load or store can corrupt the process: each check runs in a child.
INTERPRETED = kernel_mode() == "interpreter"
kernel = exercise("05.kernel", "a Triton paged-attention kernel", isolate=INTERPRETED)
# the interpreter runs on the CPU; only compiled kernels need (and may touch) the GPU
DEVICE = "cuda" if kernel_mode() == "compiled" and torch.cuda.is_available() else "cpu"
INPUTS = ("q", "k_cache", "v_cache")
# why the arithmetic is done in fp32 ({dtype} is filled in when the hint is given)
WITHOUT_FP32 = (
    "the interpreter gets {dtype} math wrong otherwise"
    if INTERPRETED
    else "in {dtype} the scores and the softmax lose the precision the answer needs"
)

KERNEL_HINTS = {
    **HINTS,
    "whole last room": "the beds past seq_len in the last room were scored: token t of room b is "
    "valid where b * BLOCK_SIZE + t < seq_len; mask the loads with it and give the other scores "
    "-inf (tl.where)",
    "zeros scored": "the beds past seq_len were loaded as 0.0 but still scored: a zero key "
    "scores 0, not -inf, and takes a share of the softmax. Give masked scores -inf (tl.where)",
    "last room skipped": "the last, partly filled room was skipped: loop over b < "
    "tl.cdiv(seq_len, BLOCK_SIZE), not seq_len // BLOCK_SIZE",
    "kv head modulo": "program kvh serves query heads kvh * GROUP + g for g < GROUP: query head "
    "h reads KV head h // {group}, not h % {kv_heads}",
    "low precision": "right in float32, wrong in {dtype}: convert every loaded tensor with "
    f".to(tl.float32) before any arithmetic ({WITHOUT_FP32})",
    "nan": "NaN: a softmax over nothing but -inf, or 0 / 0. Does m start at -inf and l at 0, "
    "does every program read tl.cdiv(seq_len, BLOCK_SIZE) rooms, and are only beds past seq_len "
    "masked?",
    "row stride loop": "the loop ran stride_bts times, not once per room of the guest: loop over "
    "b < tl.cdiv(seq_len, BLOCK_SIZE) (a stride is a step in memory, not a key card's length)",
    "unit entry step": "key card entry b of guest seq is at bt_ptr + seq * stride_bts + b * "
    "stride_btb: entries are not always adjacent (here stride_btb = {entry_step})",
    "acc not rescaled": "acc was not rescaled: when a room raises the running max from m to "
    "m_new, what acc holds must shrink by alpha = exp(m - m_new) before the room is added: acc = "
    "acc * alpha[:, None] + …",
    "l not rescaled": "l (the running sum) was not rescaled: when a room raises the running max "
    "from m to m_new, l = l * alpha + tl.sum(p, axis=1) with alpha = exp(m - m_new)",
    "nothing rescaled": "neither acc nor l was rescaled: when a room raises the running max from "
    "m to m_new, multiply both by alpha = exp(m - m_new) before adding the room (section 2)",
    "max not kept": "m never moves on: set m = m_new at the end of each room, or alpha = exp(m - "
    "m_new) is 0 and every room wipes out the ones before it",
    "heads kvh + g": "program kvh serves the query heads kvh * GROUP + g (g < GROUP), not kvh + "
    "g: the programs' groups of query heads must not overlap",
    "one bed too many": "one bed past seq_len was scored: token t of room b is valid where b * "
    "BLOCK_SIZE + t < seq_len (strictly less: bed seq_len is the first one past the end), not <=",
    "kv head 0": "every query head read KV head 0: program kvh loads its own KV head's keys and "
    "values, k_ptr + room * stride_kb + t * stride_kt + kvh * stride_kh + d * stride_kd (and the "
    "same with the stride_v* strides for v)",
    "kv head kvh // GROUP": "the programs read KV head kvh // GROUP: kvh = tl.program_id(1) "
    "already is the KV head (it serves the query heads kvh * GROUP + g), so load its keys and "
    "values at kvh * stride_kh and kvh * stride_vh",
    "not normalised": "the output was not divided by the running sum: after the loop acc holds "
    "sum(exp(score - m) * v); store acc / l[:, None] (l the running sum)",
    "k strides swapped": "stride_kt and stride_kh were swapped: bed t of KV head kvh is at k_ptr "
    "+ room * stride_kb + t * stride_kt + kvh * stride_kh + d * stride_kd",
    "v strides swapped": "stride_vt and stride_vh were swapped: bed t of KV head kvh is at v_ptr "
    "+ room * stride_vb + t * stride_vt + kvh * stride_vh + d * stride_vd",
    "k and v strides swapped": "the token and head strides were swapped: bed t of KV head kvh is "
    "at room * stride_kb + t * stride_kt + kvh * stride_kh + d * stride_kd in k (and the same "
    "with the stride_v* strides in v)",
    "v is k": "the output summed keys, not values: acc adds tl.sum(p[:, :, None] * v[None, :, "
    ":], axis=1) with v loaded from v_ptr",
    "unwritten": "no value stored for guest {seq}, query head {head}: does the kernel reach "
    "tl.store for every (guest, query head)? Program (seq, kvh) stores the rows kvh * GROUP + g "
    "for g < GROUP",
    "store outside": "a store outside the output: mask tl.store with the head mask (g < GROUP) "
    "and the lane mask (d < HEAD_DIM): mask=(g < GROUP)[:, None] & (d < HEAD_DIM)[None, :]",
    "room past the end at multiples": "a padding entry was read only where seq_len is a multiple "
    "of BLOCK_SIZE (seq_lens [5, 11] read none): the loop ran one room past the key card's end, "
    "seq_len // BLOCK_SIZE + 1 rooms instead of tl.cdiv(seq_len, BLOCK_SIZE), and that room's "
    "K/V loads were not masked by the token mask (b * BLOCK_SIZE + t < seq_len), so its NaN "
    "reached the answer",
    "beds past seq_len loaded": "the beds past seq_len in the last room were loaded, and here "
    "they hold NaN: a score of -inf gives p = 0, but 0 × NaN is NaN. Mask the K and V loads with "
    "the token mask (b * BLOCK_SIZE + t < seq_len) as well as the lane mask, other=0.0",
    "load outside": "a tl.load read memory outside {name}: mask it with {masks}",
    "exp2 without log2(e)": "tl.exp2(x) is 2**x, not e**x: use tl.exp, or multiply everything "
    "that goes into tl.exp2 (the scores minus m, and m - m_new) by log2(e) = 1.4426950408889634",
}

LOAD_MASKS = {
    "q": "the head mask (g < GROUP) and the lane mask (d < HEAD_DIM)",
    "k_cache": "the token mask (b * BLOCK_SIZE + t < seq_len) and the lane mask (d < HEAD_DIM)",
}
LOAD_MASKS["v_cache"] = LOAD_MASKS["k_cache"]


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
    yield Slip(None, lambda a: attend_read(a, values=twins.own_kv), "v is k")
    yield Slip(None, lambda a: attend_read(a, exp2=True), "exp2 without log2(e)")
    yield Slip(None, lambda a: attend_beds(a, whole))  # lab04's "whole last room"
    if kv_heads not in (1, q_heads):  # lab04's "kv head modulo", on each case's own heads
        modulo = lambda a: [h % a[1].shape[2] for h in range(a[0].shape[1])]  # noqa: E731
        yield Slip(None, lambda a: attend_beds(a, kv_of_head=modulo(a)))


def _kv_head_divided(args) -> list[int]:
    """The KV head each query head reads when program kvh loads KV head kvh // GROUP."""
    group = args[0].shape[1] // args[1].shape[2]
    return [(h // group) // group for h in range(args[0].shape[1])]


# Cases on which slips that look alike elsewhere differ: tried in turn to tell them apart.
LOOKALIKE_VARIANTS = (
    dict(q_heads=8, kv_heads=4),  # KV head 0, kvh // GROUP and h % kv_heads all differ
    dict(seq_lens=[5, 2]),  # with rooms of 4: one bed too many is not the whole last room
)


def _lookalikes(fn, got, case: dict):
    """The look-alike slips, each offered only when it is the one mistake left of those whose
    answer on this case is the learner's ``got``, once narrowed on the variants of the case where
    they differ (:data:`LOOKALIKE_VARIANTS`, where the learner's kernel is launched too)."""
    tol, base = tolerance(case.get("dtype", torch.float32)), make_case(**case)
    table = list(_lookalike_slips(base))

    def same(a, b) -> bool:
        return a is not None and b is not None and torch.allclose(a, b, **tol, equal_nan=True)

    @functools.cache
    def left():
        right = lambda a: paged_decode_attention_ref(*a).float()  # noqa: E731
        mine = lambda a: guarded_launch(fn, [t.to(DEVICE) for t in a]).got.float().cpu()  # noqa: E731
        found = slips.matching(table, got.float().cpu(), (base,), right(base), same)
        probes = [(make_case(**{**case, **changes}),) for changes in LOOKALIKE_VARIANTS]
        return slips.only(slips.told_apart(found, mine, probes, right, same))

    for slip in table:
        if slip.cause is not None:
            yield Slip(None, lambda s=slip: s.answer(base) if left() is s else None, slip.cause)


def _kernel_slips(fn, args, got, case):
    """The mistakes only a kernel can make (the look-alike ones last, see ``_lookalikes``)."""
    if 1 < args[1].shape[2] < args[0].shape[1]:
        yield Slip(None, lambda: twins.attend_overlapping_heads(args, INTERPRETED), "heads kvh + g")
    online = functools.partial(twins.attend_room_by_room, args)
    yield Slip(None, lambda: online(rescale_acc=False, rescale_l=False), "nothing rescaled")
    yield Slip(None, lambda: online(rescale_acc=False), "acc not rescaled")
    yield Slip(None, lambda: online(rescale_l=False), "l not rescaled")
    yield Slip(None, lambda: online(keep_max=False), "max not kept")
    row_step, entry_step = args[3].stride()  # a key card walked wrongly
    loop = lambda n, size: min(n, row_step * size)  # noqa: E731
    yield Slip(None, lambda: attend_beds(args, loop), "row stride loop")
    if entry_step != 1:
        yield Slip(None, lambda: twins.attend_with_unit_step(args), "unit entry step")
    yield from _lookalikes(fn, got, case)


def guarded_launch(fn, args) -> GuardedLaunch:
    """The learner's kernel on guarded copies of a case (see :mod:`kvlab.grading.guarded`)."""
    q, k = args[0], args[1]  # wider than any stray reaches: a lane, a group row, a room's step
    pad = q[0].numel() + pow2(q.shape[1] // k.shape[2]) * pow2(q.shape[2]) + k[0].numel()
    return GuardedLaunch(fn, args, launch_paged_decode, INPUTS, pad)


def _launch_faults(run: GuardedLaunch):
    """(cause, hint) of what the launch shows beside the answer, or None: rows never stored,
    stores outside the output, loads outside an input."""
    if row := run.first_unwritten():
        return "unwritten", KERNEL_HINTS["unwritten"].format(seq=row[0], head=row[1])
    if len(run.strays):
        return "store outside", KERNEL_HINTS["store outside"]
    name = run.input_read_outside()
    return name and (
        "load outside",
        KERNEL_HINTS["load outside"].format(name=name, masks=LOAD_MASKS[name]),
    )


def _expect_kernel(fn, what: str, seq_lens: list, unread=None, read=None, **options):
    """The learner's kernel on ``make_case(seq_lens, 4, **options)``, compared. Padding entries
    name a real room unless the case says otherwise (a wild read in the interpreter may crash, or
    return anything): the garbage check tries what a read does. ``unread``: see expect_attention
    (``read``: what was read and its cause, which names its hint)."""
    unread = unread if read is None else (read[0], KERNEL_HINTS[read[1]], read[1])
    case = {"seq_lens": seq_lens, "block_size": 4, "garbage": SPARE_ROOM, **options}
    on_device = lambda **case: [t.to(DEVICE) for t in make_case(**case)]  # noqa: E731
    args = on_device(**case)
    try:
        run = guarded_launch(fn, args)
    except NotImplementedError:
        raise
    except Exception as error:
        unwrap_unimplemented(error)  # Triton wraps what a kernel raised
        diagnosis.read_far_padding(error, what)
        explain_triton_error(error, what)
        raise
    fail = functools.partial(CheckFailed, input=what, replay=rebuild(case))
    if unwritten(run.got).all():
        hint = KERNEL_HINTS["unwritten"].format(seq=0, head=0)
        raise fail("your kernel stored no value at all", hint=hint, cause="unwritten")
    fp32 = None if args[0].dtype == torch.float32 else [*(t.float() for t in args[:3]), *args[3:]]
    variants = diagnosis.Variants(case, on_device, lambda variant: guarded_launch(fn, variant).got)
    diagnosis.expect_attention(
        run.got,
        paged_decode_attention_ref(*args).cpu(),
        args,
        what,
        "the reference",
        hints=KERNEL_HINTS,
        rerun_fp32=lambda: None if fp32 is None else guarded_launch(fn, fp32).got,
        fp32_expected=lambda: paged_decode_attention_ref(*fp32),
        unread=unread,
        extra_slips=list(_kernel_slips(fn, args, run.got, case)),
        replay=rebuild(case),
        variants=variants,
        fallbacks=(functools.partial(_launch_faults, run),),
    )
    if len(run.strays):  # a right answer, and values stored where they do not belong
        raise fail(run.stray_report(), hint=KERNEL_HINTS["store outside"], cause="store outside")


def _check(name: str, *cases) -> None:
    """A check of the kernel on ``cases``: (what the learner reads, seq_lens, other options)."""

    @kernel.check(name)
    def _(fn):
        for what, seq_lens, *options in cases:
            _expect_kernel(fn, what, seq_lens, **(options[0] if options else {}))


_check("one guest in one room", ("seq_lens [3], block_size 4", [3]))
_check(
    "lengths 1, k·block_size and k·block_size ± 1 (mask the last room)",
    ("seq_lens [1, 8, 7, 9], block_size 4", [1, 8, 7, 9]),
)
_check(
    "grouped-query attention with head_dim 40 (padded to 64 lanes)",
    ("8 query heads on 2 KV heads, head_dim 40", [6, 13], dict(q_heads=8, kv_heads=2, head_dim=40)),
)
_check(
    "groups of 3 query heads (padded to 4 rows)",
    ("6 query heads on 2 KV heads", [5, 9], dict(q_heads=6, kv_heads=2)),
)
_check(
    "rooms past the key card's end are never read, nor beds past seq_len (NaN there, 10**9)",
    ("padding entries name a spare room", [5, 11]),
    (diagnosis.NAN_WHAT, [5, 11], dict(unread=diagnosis.PADDING, garbage=NAN_ROOM)),
    ("padding entries 10**9", [5, 11], dict(garbage=FAR)),
    # whole rooms only: a loop of seq_len // BLOCK_SIZE + 1 rooms reaches the first padding entry
    ("seq_lens [8, 4] (whole rooms), padding a spare room", [8, 4]),
    (
        f"seq_lens [8, 4] (whole rooms), {diagnosis.NAN_WHAT}",
        [8, 4],
        dict(
            read=("a padding entry of its key card was read", "room past the end at multiples"),
            garbage=NAN_ROOM,
        ),
    ),
    (
        "seq_lens [5, 11], the beds past seq_len in each last room hold NaN",
        [5, 11],
        dict(read=("a bed past seq_len was read", "beds past seq_len loaded"), nan_beds=True),
    ),
)
_check(
    "key cards stored column by column: follow both strides, one step per room",
    (
        "block_tables is a transposed view (stride_bts = 1, stride_btb = 3), seq_lens [5, 11, 9]",
        [5, 11, 9],
        dict(transposed=True),
    ),
)
_check(
    "bf16 inputs: load, upcast to fp32, accumulate in fp32",
    ("bf16, seq_lens [9, 4]", [9, 4], dict(dtype=torch.bfloat16)),
)
