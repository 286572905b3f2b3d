"""Checks for Lab 05: the learner's Triton paged-attention kernel, launched by kvlab's wrapper
(Triton's interpreter on CPU, compiled on a GPU) and compared with the torch reference."""

from __future__ import annotations

import torch

from kvlab.attention import paged_decode_attention_ref
from kvlab.grading.core import exercise
from kvlab.grading.lab04 import expect_attention, make_case
from kvlab.kernels import launch_paged_decode
from kvlab.runtime import kernel_mode

# In the interpreter an unmasked load or store can corrupt the process: each check runs in a child.
kernel = exercise(
    "05.kernel", "a Triton paged-attention kernel", isolate=kernel_mode() == "interpreter"
)
# the interpreter runs on the CPU; only compiled kernels need (and may touch) the GPU
DEVICE = "cuda" if kernel_mode() == "compiled" and torch.cuda.is_available() else "cpu"


def _unwrap_unimplemented(error: BaseException) -> None:
    """Triton wraps errors raised in a kernel (InterpreterError, CompilationError); an unwritten
    kernel body still counts as "not implemented"."""
    seen = error
    while seen is not None:
        if isinstance(seen, NotImplementedError) or "NotImplementedError" in repr(seen):
            raise NotImplementedError from error
        seen = seen.__cause__ or seen.__context__


def _expect_kernel(fn, what: str, **case):
    args = [t.to(DEVICE) for t in make_case(**case)]
    expected = paged_decode_attention_ref(*args)
    try:
        got = launch_paged_decode(fn, *args)
    except Exception as error:
        _unwrap_unimplemented(error)
        raise
    expect_attention(got, expected.cpu(), args, what, "the reference")


@kernel.check(
    "one guest in one room",
    hint="scores = sum(q * k) * scale for the group's heads and the room's beds, -inf for beds past "
    "seq_len, then softmax and the weighted sum of v; the room's number is block_tables[seq, 0]",
)
def _one(fn):
    _expect_kernel(fn, "seq_lens [3], block_size 4", seq_lens=[3], block_size=4)


@kernel.check(
    "lengths 1, k·block_size and k·block_size ± 1 (mask the last room)",
    hint="mask token t of room b with b * BLOCK_SIZE + t < seq_len, and set masked scores to -inf",
)
def _lengths(fn):
    _expect_kernel(fn, "seq_lens [1, 8, 7, 9], block_size 4", seq_lens=[1, 8, 7, 9], block_size=4)


@kernel.check(
    "grouped-query attention with head_dim 40 (padded to 64 lanes)",
    hint="query heads kvh * GROUP + g for g < GROUP; mask d < HEAD_DIM on every load and store",
)
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


@kernel.check(
    "groups of 3 query heads (padded to 4 rows)",
    hint="mask the padding rows: heads kvh * GROUP + g exist only for g < GROUP",
)
def _group_of_three(fn):
    _expect_kernel(
        fn, "6 query heads on 2 KV heads", seq_lens=[5, 9], block_size=4, q_heads=6, kv_heads=2
    )


@kernel.check(
    "rooms past the key card's end (garbage numbers) are never read",
    hint="loop over b < cdiv(seq_len, BLOCK_SIZE) only",
)
def _garbage(fn):
    _expect_kernel(fn, "padding entries 10**9", seq_lens=[5, 11], block_size=4, garbage=10**9)


@kernel.check(
    "bf16 inputs: load, upcast to fp32, accumulate in fp32",
    hint="call .to(tl.float32) right after each tl.load, and cast the output to out_ptr's element type",
)
def _bf16(fn):
    _expect_kernel(fn, "bf16, seq_lens [9, 4]", seq_lens=[9, 4], block_size=4, dtype=torch.bfloat16)
