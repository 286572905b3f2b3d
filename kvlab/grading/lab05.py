"""Checks for Lab 05: the learner's Triton paged-attention kernel, launched by kvlab's wrapper
(Triton's interpreter on CPU, compiled on a GPU) and compared with the torch reference.

Wrong answers are diagnosed as in Lab 04 (the same slips, hints in kernel terms), plus what a
kernel can get wrong on its own: the online softmax's rescaling, the query rows a program serves,
a loop that runs for a stride instead of the guest's rooms, a table read as if its entries were
always adjacent, rows never stored, and Triton's own error messages. Slips that give the same
answer on a check's case (KV head 0 and KV head kvh // GROUP with 2 KV heads; one bed too many and
the whole last room in a room of 4 holding 3) are named only once the kernel matches one of them
on a variant of the case where they differ.

The kernel runs on copies with guard regions around them, in the same memory. The inputs' guards
(and the gaps between their head-dim vectors, which sit D_P2 apart) hold NaN, so a load outside
an input that reaches the answer spoils it every time. The output's guards hold a sentinel, so a
store outside the output is seen every time, whatever order the programs run in (in the
interpreter they run one after another, and a later program hides an earlier one's stray row; on
a GPU they race). The output itself starts as a marked NaN, so rows nobody stored show. The
garbage check puts NaN in what no guest holds: the beds past each guest's end, and the room a
padding entry names for lengths that fill whole rooms (where one room too many reaches it). A
load of them without the token mask spoils the answer even where its scores are -inf (0 × NaN).
"""

from __future__ import annotations

import math
import re

import torch

from kvlab.grading.blame import exception_chain, explain_exception
from kvlab.grading.expect import CheckFailed, max_error, plural, preview
from kvlab.grading.lab04 import (
    ANY,
    HINTS,
    NAN_WHAT,
    attend_beds,
    expect_attention,
    read_far_padding,
    rebuild,
)
from kvlab.grading.launchers import launch_decode_isolated
from kvlab.grading.registry import exercise
from kvlab.grading.slips import Slip
from kvlab.ops.attention import decode_attention, gather_kv, paged_decode_attention_ref
from kvlab.ops.kernels import launch_paged_decode
from kvlab.ops.kernels.sizes import pow2
from kvlab.ops.runtime import kernel_mode
from kvlab.ops.testing import FAR, NAN_ROOM, SPARE_ROOM, TOLERANCE, close, make_case

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

# Triton's errors that name a usual mistake: (pattern in the message, cause, hint). The pattern
# is searched in every exception of the chain (the interpreter wraps the original error; the
# compiler puts it after the source excerpt), so the same mistake reads the same on CPU and GPU.
TRITON_ERRORS = [
    (
        # a Triton block handed to a torch function; a torch tensor made inside the kernel
        r"must be Tensor, not tensor|invalid combination of arguments - got \([^)]*\btensor\b|"
        r"'torch\.dtype' object has no attribute",
        "triton: torch call",
        "inside @triton.jit use tl.* functions (tl.exp, tl.maximum, tl.sum, tl.where, …), not "
        "torch.*: the kernel's values are Triton blocks, not torch tensors",
    ),
    (
        r"only 0-dimensional arrays can be converted to Python scalars|"
        r"only length-1 arrays can be converted",
        "triton: python math",
        "a Triton block went into a Python function (math.exp, float(), int(), …): inside "
        "@triton.jit use tl.exp, tl.maximum and the other tl.* functions",
    ),
    (
        r"arange's range must be a power of 2",
        "triton: arange",
        "tl.arange(0, N) needs N a power of two: use D_P2 (the next power of two) with the mask "
        "d < HEAD_DIM, and GROUP_P2 with g < GROUP",
    ),
    (
        r"Shape element \d+ must be a power of 2",
        "triton: shape",
        "a block's shape must be powers of two: tl.zeros([GROUP_P2, D_P2], …), not "
        "[GROUP, HEAD_DIM]; the masks keep the extra rows and lanes out",
    ),
    (
        r"has no attribute '(float|half|double|bfloat16)'",
        "triton: method",
        "inside @triton.jit convert with .to(tl.float32), not .float()",
    ),
    (
        r"does not support item assignment|__setitem__ is not supported",
        "triton: assignment",
        "a Triton block cannot be changed in place: compute a new block (tl.where(mask, new, "
        "old)) and give it the name",
    ),
    (
        r"incompatible dimensions at index (\d+): (\d+) and (\d+)",
        "triton: shapes",
        "two blocks of different shapes met (sizes {1} and {2} on axis {0}): a room's scores are "
        "[GROUP_P2, BLOCK_SIZE]; m and l are [GROUP_P2] (reduce the scores with axis=1), acc is "
        "[GROUP_P2, D_P2]; add an axis with [:, None] to broadcast a [GROUP_P2] over a row",
    ),
    (
        r"unsupported operand type\(s\) for @",
        "triton: matmul",
        "Triton blocks have no @: the group's scores are tl.sum(q[:, None, :] * k[None, :, :], "
        "axis=2)",
    ),
    (
        r"Input shapes should have M >= (\d+)",
        "triton: dot size",
        "tl.dot wants at least {0} rows on this GPU: compute the scores with "
        "tl.sum(q[:, None, :] * k[None, :, :], axis=2)",
    ),
]


def triton_mistake(error: BaseException):
    """(cause, hint, the exception that says it) when Triton's error names a usual mistake."""
    for exc in exception_chain(error):
        text = str(getattr(exc, "error_message", None) or exc)
        for pattern, cause, hint in TRITON_ERRORS:
            found = re.search(pattern, text)
            if found:
                return cause, hint.format(*found.groups()), exc
    return None


def explain_triton_error(error: BaseException, what: str) -> None:
    """Fail with the hint when Triton's error (compiling or interpreting) names a usual mistake,
    pointing at the line of the kernel where it happened."""
    found = triton_mistake(error)
    if found is None:
        return
    cause, hint, said = found
    where = ""
    for exc in exception_chain(error):
        lines = explain_exception(exc)
        if len(lines) > 1:  # a frame of the learner's code
            where = " " + lines[1]
    innermost = list(exception_chain(said))[-1]
    got = explain_exception(innermost)[0]
    if hasattr(innermost, "src"):  # a CompilationError: its message, not the source excerpt
        message = " ".join(str(innermost.error_message).split())
        got = f"{type(innermost).__name__}: {message}"
    raise CheckFailed(
        f"Triton stopped your kernel{where}", input=what, got=got, hint=hint, cause=cause
    ) from error


def _unwrap_unimplemented(error: BaseException) -> None:
    """Triton wraps errors raised in a kernel (InterpreterError, CompilationError); an unwritten
    kernel body still counts as "not implemented" (Triton's own NotImplementedError, for
    assigning into a block, does not)."""
    if triton_mistake(error) is not None:
        return
    for seen in exception_chain(error):
        if isinstance(seen, NotImplementedError) or "NotImplementedError" in repr(seen):
            raise NotImplementedError from error


def _walk_slips(args):
    """The slips of a kernel that walks the key card wrongly."""
    tables = args[3]
    row_step, entry_step = tables.stride()
    rooms_read = lambda n, size: min(n, row_step * size)  # noqa: E731
    yield Slip(None, lambda: attend_beds(args, rooms_read), "row stride loop")
    if entry_step != 1:
        yield Slip(None, lambda: _attend_with_unit_step(args), "unit entry step")


def _attend_with_unit_step(args):
    """The answer of a kernel that reads entry b of row seq at ``seq * stride_bts + b``."""
    q, k_cache, v_cache, tables, lens = args
    memory = torch.as_strided(tables, (tables.numel(),), (1,)).cpu()  # the entries as stored
    misread = torch.zeros_like(tables, device="cpu")
    size = k_cache.shape[1]
    for s in range(tables.shape[0]):
        for b in range(-(-int(lens[s]) // size)):
            at = s * tables.stride(0) + b
            if at >= memory.numel():
                return None  # past the table: nothing to compare
            misread[s, b] = memory[at]
    if int(misread.max()) >= k_cache.shape[0] or int(misread.min()) < 0:
        return None  # a crash, not an answer
    return attend_beds((q, k_cache, v_cache, misread, lens))


# --- what a kernel's own slips compute ---------------------------------------------------------


def _guest_kv(args, s: int):
    """Guest s's keys and values, fp32 on the CPU: [seq_len, kv_heads, head_dim] each."""
    _, k_cache, v_cache, tables, lens = args
    k, v = gather_kv(k_cache, v_cache, tables[s], int(lens[s]))
    return k.float().cpu(), v.float().cpu()


def attend_room_by_room(args, rescale_acc=True, rescale_l=True, keep_max=True):
    """The kernel's loop in torch: an online softmax over one room at a time, optionally
    without rescaling acc or l by alpha = exp(m - m_new), or without m = m_new."""
    q, k_cache = args[0].float().cpu(), args[1]
    size, group = k_cache.shape[1], q.shape[1] // k_cache.shape[2]
    kv_of = torch.arange(q.shape[1]) // group
    scale = 1.0 / math.sqrt(q.shape[2])
    out = torch.full(q.shape, float("nan"))
    for s in range(q.shape[0]):
        k_all, v_all = _guest_kv(args, s)
        m = torch.full((q.shape[1],), -math.inf)
        denom, acc = torch.zeros(q.shape[1]), torch.zeros(q.shape[1:])
        for start in range(0, k_all.shape[0], size):
            k, v = k_all[start : start + size, kv_of], v_all[start : start + size, kv_of]
            scores = torch.einsum("hd,thd->ht", q[s], k) * scale
            m_new = torch.maximum(m, scores.amax(dim=1))
            alpha = torch.exp(m - m_new)
            p = torch.exp(scores - m_new[:, None])
            denom = (alpha * denom if rescale_l else denom) + p.sum(dim=1)
            acc = (alpha[:, None] * acc if rescale_acc else acc) + torch.einsum("ht,thd->hd", p, v)
            if keep_max:
                m = m_new
        out[s] = acc / denom[:, None]
    return out


def attend_overlapping_heads(args, ordered: bool):
    """What programs serving the query rows kvh + g (not kvh * GROUP + g) store. ``ordered``:
    the programs run one after another (the interpreter), so the last one to store a row wins;
    else rows stored by two programs are left to chance (``ANY``). Rows nobody stores are NaN."""
    q, k_cache = args[0].float().cpu(), args[1]
    kv_heads = k_cache.shape[2]
    group = q.shape[1] // kv_heads
    out = torch.full(q.shape, float("nan"))
    stores = torch.zeros(q.shape[:2], dtype=torch.int64)
    for s in range(q.shape[0]):
        k, v = _guest_kv(args, s)
        for kvh in range(kv_heads):
            rows = list(range(kvh, kvh + group))
            out[s, rows] = decode_attention(q[s, rows], k[:, kvh : kvh + 1], v[:, kvh : kvh + 1])
            stores[s, rows] += 1
    if not ordered:
        out[stores > 1] = ANY
    return out


def attend_read(args, keys=None, values=None, normalise=True, exp2=False):
    """fp32 attention of each guest over its seq_len tokens, with the keys and values a kernel
    reads: ``keys(args, s)`` / ``values(args, s)`` give guest s's ``[seq_len, q_heads, head_dim]``
    (one row per query head; None: the right ones, or None when the slip would read past the
    cache). ``normalise=False`` leaves acc undivided; ``exp2`` takes 2**x for e**x."""
    q = args[0].float().cpu()
    scale = 1.0 / math.sqrt(q.shape[2])
    out = torch.empty(q.shape)
    for s in range(q.shape[0]):
        k = (keys or _own_kv)(args, s)
        v = (values or _own_values)(args, s)
        if k is None or v is None:
            return None
        scores = torch.einsum("hd,thd->ht", q[s], k) * scale
        p = torch.exp2 if exp2 else torch.exp
        w = p(scores - scores.amax(dim=1, keepdim=True))
        acc = torch.einsum("ht,thd->hd", w, v)
        out[s] = acc / w.sum(dim=1, keepdim=True) if normalise else acc
    return out


def _per_query_head(args, kv):
    """A guest's ``[seq_len, kv_heads, head_dim]`` spread over the query heads (h reads h // GROUP)."""
    group = args[0].shape[1] // args[1].shape[2]
    return kv.repeat_interleave(group, dim=1)


def _own_kv(args, s):
    return _per_query_head(args, _guest_kv(args, s)[0])


def _own_values(args, s):
    return _per_query_head(args, _guest_kv(args, s)[1])


def _swapped(cache_at):
    """A reader of guest s's keys (``cache_at`` 1) or values (2) at bed t of KV head h found where
    t * stride_h + h * stride_t points: vector ``t + h * kv_heads`` of the room (None when that
    is past the cache)."""

    def read(args, s):
        cache, tables, lens = args[cache_at], args[3], args[4]
        blocks, size, kv_heads = cache.shape[:3]
        group = args[0].shape[1] // kv_heads
        vectors = cache.float().cpu().reshape(blocks * size * kv_heads, -1)
        n = int(lens[s])
        rooms = tables[s, : -(-n // size)].long().cpu()
        token = torch.arange(n)
        kv_of = torch.arange(args[0].shape[1]) // group
        at = (rooms[token // size] * size * kv_heads + token % size)[:, None] + kv_of * kv_heads
        return None if int(at.max()) >= len(vectors) else vectors[at]

    return read


def _lookalike_slips(args):
    """The slips that can look alike on a case (named only where confirmed, see
    ``_confirmed``), each answering on any case; the causes None are rivals that lab04 names."""
    q_heads, kv_heads = args[0].shape[1], args[1].shape[2]
    whole = lambda n, size: -(-n // size) * size  # noqa: E731
    one_more = lambda n, size: min(n + 1, whole(n, size))  # noqa: E731
    yield Slip(None, lambda a: attend_beds(a, one_more), "one bed too many")
    if q_heads > kv_heads:
        yield Slip(None, lambda a: attend_beds(a, kv_of_head=[0] * a[0].shape[1]), "kv head 0")
        divided = lambda a: attend_beds(a, kv_of_head=_kv_head_divided(a))  # noqa: E731
        yield Slip(None, divided, "kv head kvh // GROUP")
    yield Slip(None, lambda a: attend_read(a, normalise=False), "not normalised")
    yield Slip(None, lambda a: attend_read(a, keys=_swapped(1)), "k strides swapped")
    yield Slip(None, lambda a: attend_read(a, values=_swapped(2)), "v strides swapped")
    both = lambda a: attend_read(a, keys=_swapped(1), values=_swapped(2))  # noqa: E731
    yield Slip(None, both, "k and v strides swapped")
    yield Slip(None, lambda a: attend_read(a, values=_own_kv), "v is k")
    yield Slip(None, lambda a: attend_read(a, exp2=True), "exp2 without log2(e)")
    yield Slip(None, lambda a: attend_beds(a, whole))  # lab04's "whole last room"
    if kv_heads not in (1, q_heads):
        yield Slip(None, lambda a: attend_beds(a, kv_of_head=_kv_head_modulo(a)))


def _kv_head_divided(args) -> list[int]:
    """The KV head each query head reads when program kvh loads KV head kvh // GROUP."""
    group = args[0].shape[1] // args[1].shape[2]
    return [(h // group) // group for h in range(args[0].shape[1])]


def _kv_head_modulo(args) -> list[int]:
    """The KV head each query head reads with lab04's slip h % kv_heads."""
    return [h % args[1].shape[2] for h in range(args[0].shape[1])]


# Cases on which slips that look alike elsewhere differ: tried in turn to tell them apart.
LOOKALIKE_VARIANTS = (
    dict(q_heads=8, kv_heads=4),  # KV head 0, kvh // GROUP and h % kv_heads all differ
    dict(seq_lens=[5, 2]),  # with rooms of 4: one bed too many is not the whole last room
)


def _same(a, b, dtype) -> bool:
    if a is None or b is None:
        return False
    atol, rtol = TOLERANCE[dtype]
    return torch.allclose(a, b, atol=atol, rtol=rtol, equal_nan=True)


def _confirmed(got, args, case, answer_on):
    """The look-alike slips, as lab04 tries them. A slip whose answer ``got`` matches is offered
    when no other slip gives that answer on this case, or when the learner's kernel also gives
    the slip's answer on a variant of the case where they differ (``answer_on(**changes)``: the
    learner's answer there, or None)."""
    dtype = args[0].dtype
    slips = list(_lookalike_slips(args))
    answers = {}

    def here(j):
        if j not in answers:
            answers[j] = slips[j].answer(args)
        return answers[j]

    def offered(i):
        mine = here(i)
        if not _same(got.float().cpu(), mine, dtype):
            return None  # not this slip: nothing to confirm
        rivals = [j for j in range(len(slips)) if j != i and _same(here(j), mine, dtype)]
        if rivals and not _told_apart(slips, i, rivals, case, answer_on):
            return None
        return mine

    for i, slip in enumerate(slips):
        if slip.cause is not None:
            yield Slip(None, lambda i=i: offered(i), slip.cause)


def _told_apart(slips, i, rivals, case, answer_on) -> bool:
    """Whether the learner gives slip i's answer on the first variant of the case where that
    answer differs from its rivals' and from the right one (False: no such variant)."""
    for changes in LOOKALIKE_VARIANTS:
        variant = make_case(**{**case, **changes})
        dtype = variant[0].dtype
        mine = slips[i].answer(variant)
        if mine is None or _same(mine, paged_decode_attention_ref(*variant).float(), dtype):
            continue
        if any(_same(slips[j].answer(variant), mine, dtype) for j in rivals):
            continue
        seen = answer_on(**changes)
        return seen is not None and _same(seen.float().cpu(), mine, dtype)
    return False


def _kernel_slips(args, got=None, case=None, answer_on=None):
    """The mistakes only a kernel can make (the look-alike ones given the learner's answer
    ``got``, its case and ``answer_on``, see ``_confirmed``)."""
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
    if answer_on is not None:
        yield from _confirmed(got, args, case, answer_on)


# --- launching the learner's kernel outside the checks --------------------------------------------


launch_isolated = launch_decode_isolated  # the name Lab 05's cells import


# --- launching on guarded tensors ----------------------------------------------------------------

OUT_GUARD = -7777.0  # what the output's guard regions hold: no attention output is that
# the output's first value: NaN with a payload that arithmetic does not produce (a row never stored)
UNWRITTEN_BITS = {torch.float32: 0x7FC0DEAD, torch.float16: 0x7E5A, torch.bfloat16: 0x7FDA}
_SAME_SIZE_INT = {
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(_SAME_SIZE_INT[t.dtype])


def unwritten(got: torch.Tensor) -> torch.Tensor:
    """True where the kernel stored nothing: the output still holds its marked NaN."""
    return _bits(got) == UNWRITTEN_BITS[got.dtype]


def _guarded(t: torch.Tensor, pad: int, fill: float, row: int = 0):
    """(a copy of ``t`` with ``pad`` values of ``fill`` on each side, the whole buffer): the copy
    is a view, so a kernel that misses it lands in the same memory. With ``row`` each vector of
    the last axis starts ``row`` values after the one before, the values between hold ``fill``
    too (a lane past HEAD_DIM reads it)."""
    row = max(row, t.shape[-1])
    size = t.numel() // max(t.shape[-1], 1) * row
    buffer = torch.full((pad + size + pad,), fill, dtype=t.dtype, device=t.device)
    inside = buffer[pad : pad + size].view(*t.shape[:-1], row)[..., : t.shape[-1]]
    if t.numel():
        inside.copy_(t)
    return inside, buffer


class Launch:
    """One launch of the learner's kernel on guarded copies of ``args``: ``got`` (a view of the
    guarded output) and the output's guard values the kernel changed. The inputs' head-dim
    vectors are D_P2 apart, with NaN between them and around them."""

    INPUTS = ("q", "k_cache", "v_cache")

    def __init__(self, fn, args, zero_guards=()):
        q, k_cache, v_cache, tables, lens = args
        group, head_dim = q.shape[1] // k_cache.shape[2], q.shape[2]
        # wider than any stray reaches: a lane past HEAD_DIM, a padded group row, a room's step
        pad = q[0].numel() + pow2(group) * pow2(head_dim) + k_cache[0].numel()
        inputs = []
        for name, t in zip(self.INPUTS, (q, k_cache, v_cache), strict=True):
            fill = 0.0 if name in zero_guards else math.nan
            inputs.append(_guarded(t, pad, fill, row=pow2(head_dim))[0])
        out, self.buffer = _guarded(torch.empty_like(q), pad, OUT_GUARD)
        _bits(out).fill_(UNWRITTEN_BITS[q.dtype])
        before = _bits(self.buffer).clone()
        self.pad, self.size = pad, q.numel()
        self.got = _launch(fn, [*inputs, tables, lens], out=out)
        changed = _bits(self.buffer) != before
        changed[pad : pad + q.numel()] = False
        self.strays = changed.nonzero().flatten().cpu()

    def stray_report(self) -> str:
        """Where the kernel stored outside the output."""
        before = int((self.strays < self.pad).sum())
        after = len(self.strays) - before
        parts = []
        if before:
            parts.append(f"{plural(before, 'value')} before its start")
        if after:
            furthest = int(self.strays.max()) - (self.pad + self.size) + 1
            reach = "right after its end" if furthest == after else f"up to {furthest} past its end"
            parts.append(f"{plural(after, 'value')} {reach}")
        return f"your kernel stored outside the output: {' and '.join(parts)}"


def _launch(fn, args, out=None):
    try:
        return launch_paged_decode(fn, *args, out=out)
    except Exception as error:
        _unwrap_unimplemented(error)
        raise


def _fail_unread(got, expected, what: str, case: dict, unread) -> None:
    """A wrong answer on a case that differs from one that passed only in memory the kernel must
    not read: ``unread`` is (what was read, hint, cause)."""
    read, hint, cause = unread
    got, expected = got.float().cpu(), expected.float().cpu()
    diff = (got - expected).abs().nan_to_num(nan=math.inf)
    seq = int(diff.amax(dim=(1, 2)).argmax())
    head = int(diff[seq].amax(dim=1).argmax())
    raise CheckFailed(
        f"guest {seq}, query head {head} differs from the reference "
        f"({max_error(got, diff)}): {read}",
        input=what,
        expected=preview(expected[seq, head]),
        got=preview(got[seq, head]),
        hint=hint,
        cause=cause,
        replay=rebuild(case),
    )


def _expect_kernel(fn, what: str, padding=False, unread=None, **case):
    """Launch the learner's kernel on ``make_case(**case)`` and compare. Padding entries name a
    real room unless the case says otherwise: only the garbage check tries what a read of them
    does (a wild read in the interpreter may crash, or return anything). ``unread`` (what was
    read, hint, cause): the case differs from one that passed only in memory that must not be
    read, so a wrong answer means it was (see ``_fail_unread``)."""
    case.setdefault("garbage", SPARE_ROOM)
    args = [t.to(DEVICE) for t in make_case(**case)]
    expected = paged_decode_attention_ref(*args)
    try:
        run = Launch(fn, args)
    except NotImplementedError:
        raise
    except Exception as error:
        read_far_padding(error, what)
        explain_triton_error(error, what)
        raise
    got = run.got
    nothing = unwritten(got).cpu()
    if nothing.all():
        raise CheckFailed(
            "your kernel stored no value at all",
            input=what,
            replay=rebuild(case),
            hint=UNWRITTEN_HINT.format(seq=0, head=0),
            cause="unwritten",
        )

    if unread is not None and not close(got, expected):
        _fail_unread(got, expected, what, case, unread)

    def rerun_fp32():
        if args[0].dtype == torch.float32:
            return None
        q, k_cache, v_cache, tables, lens = args
        return Launch(fn, [q.float(), k_cache.float(), v_cache.float(), tables, lens]).got

    answers = {}

    def answer_on(**changes):
        """The learner's answer on the case with these changes (None: it raised)."""
        key = repr(sorted(changes.items()))
        if key not in answers:
            variant = [t.to(DEVICE) for t in make_case(**{**case, **changes})]
            try:
                answers[key] = Launch(fn, variant).got
            except Exception:
                answers[key] = None
        return answers[key]

    def right_on(**changes) -> bool:
        again = answer_on(**changes)
        variant = make_case(**{**case, **changes})
        return again is not None and close(again, paged_decode_attention_ref(*variant))

    def rows_not_stored():
        if nothing.any():
            seq, head = (int(i) for i in nothing.any(dim=2).nonzero()[0])
            return "unwritten", UNWRITTEN_HINT.format(seq=seq, head=head)
        return None

    def stored_outside():
        return ("store outside", STORE_OUTSIDE_HINT) if len(run.strays) else None

    def loaded_outside():
        """A read of the inputs' NaN guards: with guards of 0 the answer has fewer NaN."""
        nans = int(got.isnan().sum())
        if not nans:
            return None
        for name in Launch.INPUTS:
            try:
                again = Launch(fn, args, zero_guards=(name,)).got
            except Exception:
                return None
            if int(again.isnan().sum()) < nans:
                hint = LOAD_OUTSIDE_HINT.format(name=name, masks=LOAD_MASKS[name])
                return "load outside", hint
        return None

    expect_attention(
        got,
        expected.cpu(),
        args,
        what,
        "the reference",
        hints=KERNEL_HINTS,
        rerun_fp32=rerun_fp32,
        padding=padding,
        extra_slips=[*_kernel_slips(args, got, case, answer_on), *_walk_slips(args)],
        replay=rebuild(case),
        right_on=right_on,
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
    _expect_kernel(fn, NAN_WHAT, padding=True, garbage=NAN_ROOM, **case)
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
