"""Checks for Lab 05: the learner's Triton paged-attention kernel, launched by kvlab's wrapper
(Triton's interpreter on CPU, compiled on a GPU) and compared with the torch reference.

Wrong answers are diagnosed as in Lab 04 (the same slips, hints in kernel terms), plus the ways a
kernel can walk a key card wrongly: a loop that runs for a stride instead of the guest's rooms,
and a table read as if its entries were always adjacent.
"""

from __future__ import annotations

import torch

from kvlab.attention import paged_decode_attention_ref
from kvlab.grading.core import exercise
from kvlab.grading.lab04 import (
    FAR,
    HINTS,
    NAN_ROOM,
    NAN_WHAT,
    SPARE_ROOM,
    attend_beds,
    expect_attention,
    make_case,
    read_far_padding,
    rebuild,
)
from kvlab.kernels import launch_paged_decode
from kvlab.runtime import kernel_mode

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
}


def _unwrap_unimplemented(error: BaseException) -> None:
    """Triton wraps errors raised in a kernel (InterpreterError, CompilationError); an unwritten
    kernel body still counts as "not implemented"."""
    seen = error
    while seen is not None:
        if isinstance(seen, NotImplementedError) or "NotImplementedError" in repr(seen):
            raise NotImplementedError from error
        seen = seen.__cause__ or seen.__context__


def _walk_slips(args):
    """(cause, what it computes) for a kernel that walks the key card wrongly."""
    tables = args[3]
    row_step, entry_step = tables.stride()
    rooms_read = lambda n, size: min(n, row_step * size)  # noqa: E731
    yield "row stride loop", lambda: attend_beds(args, rooms_read)
    if entry_step != 1:
        yield "unit entry step", lambda: _attend_with_unit_step(args)


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
                return torch.full(q.shape, float("nan"))  # past the table: nothing to compare
            misread[s, b] = memory[at]
    if int(misread.max()) >= k_cache.shape[0] or int(misread.min()) < 0:
        return torch.full(q.shape, float("nan"))  # a crash, not an answer
    return attend_beds((q, k_cache, v_cache, misread, lens))


def _launch(fn, args):
    try:
        return launch_paged_decode(fn, *args)
    except Exception as error:
        _unwrap_unimplemented(error)
        raise


def _expect_kernel(fn, what: str, padding=False, **case):
    """Launch the learner's kernel on ``make_case(**case)`` and compare. Padding entries name a
    real room unless the case says otherwise: only the garbage check tries what a read of them
    does (a wild read in the interpreter may crash, or return anything)."""
    case.setdefault("garbage", SPARE_ROOM)
    args = [t.to(DEVICE) for t in make_case(**case)]
    expected = paged_decode_attention_ref(*args)
    try:
        got = _launch(fn, args)
    except NotImplementedError:
        raise
    except Exception as error:
        read_far_padding(error, what)
        raise

    def rerun_fp32():
        if args[0].dtype == torch.float32:
            return None
        q, k_cache, v_cache, tables, lens = args
        return _launch(fn, [q.float(), k_cache.float(), v_cache.float(), tables, lens])

    expect_attention(
        got,
        expected.cpu(),
        args,
        what,
        "the reference",
        hints=KERNEL_HINTS,
        rerun_fp32=rerun_fp32,
        padding=padding,
        extra_slips=_walk_slips(args),
        replay=rebuild(case),
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


@kernel.check("rooms past the key card's end are never read (a room full of NaN, 10**9)")
def _garbage(fn):
    case = dict(seq_lens=[5, 11], block_size=4)
    _expect_kernel(fn, "padding entries name a spare room", **case)
    _expect_kernel(fn, NAN_WHAT, padding=True, garbage=NAN_ROOM, **case)
    _expect_kernel(fn, "padding entries 10**9", garbage=FAR, **case)


@kernel.check("key cards stored column by column: follow both strides, stop at the last room")
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
