"""09.chunk_attention (torch) and 09.chunk_kernel (Triton): attention for a chunk of one guest's
prompt through its key card, checked against :func:`kvlab.ops.attention.chunk_attention_reference`.

A case (:func:`make_chunk_case`) is one guest whose K/V of positions ``0 .. num_computed + n - 1``
sit in rooms scattered over a small cache; every other bed (the rest of the last room, the rooms no
entry names, the padding entry's room) holds NaN, so a read of unread memory that reaches the
answer spoils it. A wrong answer is diagnosed by (1) the same case with zeros in that memory (right
there: the code read past the chunk), then (2) the usual slips' answers on the case (a causal mask
off by one, none, none on the diagonal tile, the prefix left out of it, the wrong KV head, an
online softmax without rescaling), a hint only when one slip explains it. The kernel is launched
by :func:`launch_chunk_kernel` on the grid (query tiles of ``BLOCK_Q`` rows, query heads).
"""

from __future__ import annotations

import math

import torch

from kvlab.grading import slips
from kvlab.grading.expect import CheckFailed, expect_tensor_like, furthest, preview
from kvlab.grading.lab09 import hints
from kvlab.grading.launchers import (
    BLOCK_Q,
    launch_chunk_isolated,
    launch_chunk_kernel,
    make_chunk_case,
)
from kvlab.grading.registry import exercise
from kvlab.grading.slips import Slip
from kvlab.grading.triton_errors import launched, unwrap_unimplemented
from kvlab.ops.attention import chunk_attention_reference
from kvlab.ops.runtime import kernel_mode

attention_ex = exercise("09.chunk_attention", "attention for a chunk through the key card (torch)")
kernel_ex = exercise(
    "09.chunk_kernel",
    "a Triton kernel for a chunk: query tiles × rooms, online softmax, causal mask",
    isolate=kernel_mode() == "interpreter",
)


def describe(args, sharpness: float = 1.0) -> str:
    """A case of :func:`make_chunk_case` (its tensors ``args``; q made ``sharpness`` times
    larger) as the report says it."""
    q, k_cache, _, _, num_computed = args
    (n, q_heads, _), (block_size, kv_heads) = q.shape, k_cache.shape[1:3]
    kind = "" if q.dtype == torch.float32 else f", q and the caches in {q.dtype}"
    if sharpness != 1.0:
        kind += f", q {sharpness:g}× larger (scores in the tens)"
    return (
        f"a chunk of {n} queries after {num_computed} cached tokens, rooms of {block_size}, "
        f"{q_heads} query heads on {kv_heads} KV head{'s' if kv_heads > 1 else ''}, NaN in every "
        f"bed that holds no token{kind}"
    )


# --- what the slips compute --------------------------------------------------------------------


def attend(args, visible, kv_of=None, rescale=True, softmax_dtype=None):
    """fp32 attention of each query row i over the key positions j where ``visible(i, j, nc,
    total)`` (True: seen; ``nc`` the tokens computed before the chunk, ``total`` the chunk's
    end), reading keys through the key card (NaN where a slip reads unread memory); ``kv_of[h]``
    the KV head of query head h; ``rescale=False``: an online softmax room by room without alpha;
    ``softmax_dtype``: the scores rounded to it for the softmax."""
    q, k_cache, v_cache, table, nc = args
    q, k_cache, v_cache = q.float(), k_cache.float(), v_cache.float()
    n, q_heads, head_dim = q.shape
    size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q_heads // kv_heads
    kv_of = [h // group for h in range(q_heads)] if kv_of is None else kv_of
    keys, values = (cache[table.long()].flatten(0, 1) for cache in (k_cache, v_cache))
    reach = len(keys)  # every bed of every room the key card lists
    scale = 1.0 / math.sqrt(head_dim)
    out = torch.empty(n, q_heads, head_dim)
    for i in range(n):
        seen = [j for j in range(reach) if visible(i, j, nc, nc + n)]
        for h in range(q_heads):
            if not seen:
                out[i, h] = math.nan
                continue
            k, v = keys[seen, kv_of[h]], values[seen, kv_of[h]]
            scores = (k @ q[i, h]) * scale
            if rescale:
                low = scores if softmax_dtype is None else scores.to(softmax_dtype)
                out[i, h] = torch.softmax(low, dim=0).float() @ v
                continue
            m, denom, acc = -math.inf, 0.0, torch.zeros(head_dim)
            for start in range(0, len(seen), size):  # rooms of the seen keys, in order
                s, vv = scores[start : start + size], v[start : start + size]
                m_new = max(m, float(s.max()))
                p = torch.exp(s - m_new)
                denom, acc, m = denom + float(p.sum()), acc + p @ vv, m_new
            out[i, h] = acc / denom
    return out


def _causal(i, j, nc, total) -> bool:
    return j <= nc + i


def _tile_end(i, nc, total) -> int:
    """Where the keys the kernel's query tile of row i reads stop: its last row's position + 1."""
    return min(nc + (i // BLOCK_Q + 1) * BLOCK_Q, total)


def _slips(args, kernel: bool) -> list[Slip]:
    """The usual slips for a case of these heads and dtype, each a function of a case's args."""
    q_heads, kv_heads, dtype = args[0].shape[1], args[1].shape[2], args[0].dtype

    def slip(hint, visible, **options) -> Slip:
        return Slip(hint, lambda a: attend(a, visible, **options))

    table = [
        slip(hints.CAUSAL_EXCLUDES_SELF, lambda i, j, nc, total: j < nc + i),
        slip(hints.CAUSAL_ONE_AHEAD, lambda i, j, nc, total: j <= nc + i + 1 and j < total),
        # in a kernel, no causal mask at all reads as the diagonal tile's mask missing
        slip(hints.DIAGONAL_TILE if kernel else hints.NO_CAUSAL, lambda i, j, nc, total: j < total),
        slip(hints.PREFIX_FORGOTTEN, lambda i, j, nc, total: j <= i),
    ]
    if kernel:
        end = _tile_end
        table += [
            slip(hints.DIAGONAL_TILE, lambda i, j, nc, total: j < end(i, nc, total)),
            # `end` is the tile's last row's position + 1: that row cannot see one further
            slip(hints.CAUSAL_ONE_AHEAD, lambda i, j, nc, t: j <= nc + i + 1 and j < end(i, nc, t)),
            # `end` one short (on a chunk of one query, as a mask of j < num_computed + i answers)
            slip(hints.KEYS_ONE_SHORT, lambda i, j, nc, t: j <= nc + i and j < end(i, nc, t) - 1),
            slip(hints.NO_RESCALE, _causal, rescale=False),
        ]
    if dtype != torch.float32:
        low = Slip(hints.SOFTMAX_LOW, lambda a: attend(a, _causal, softmax_dtype=dtype).to(dtype))
        table.append(low)
    if 1 < kv_heads < q_heads:
        table.append(
            slip(hints.KV_HEAD_MODULO, _causal, kv_of=[h % kv_heads for h in range(q_heads)])
        )
    if kv_heads > 1:
        table.append(slip(hints.KV_HEAD_ZERO, _causal, kv_of=[0] * q_heads))
    return table


def _close(a, b) -> bool:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.shape != b.shape:
        return False
    tol = 1e-4 if b.dtype == torch.float32 else 2e-2  # a rounding of bf16 / fp16 either way
    return torch.allclose(a.float().cpu(), b.float().cpu(), atol=tol, rtol=tol, equal_nan=True)


def _expect_chunk(fn, run, kernel: bool, **case) -> None:
    args = make_chunk_case(**case)
    what = describe(args, case.get("sharpness", 1.0))
    want = chunk_attention_reference(*args)
    got = run(fn, args)
    expect_tensor_like(
        got,
        want,
        "the output",
        input=what,
        axes="the chunk's queries, q_heads, head_dim",
        dtype_hint="compute in fp32 as asked, then return the output in q's dtype: .to(q.dtype)",
    )
    if _close(got, want):
        return
    (row, head), error = furthest(got, want)
    zeroed = make_chunk_case(**case, garbage=0.0)
    if _close(slips.quietly(lambda: run(fn, zeroed)), chunk_attention_reference(*zeroed)):
        hint = hints.READ_PAST
    else:
        hint = _named(fn, run, kernel, case, args, got, want)
    raise CheckFailed(
        f"query {row} of the chunk, head {head} differs from the reference ({error})",
        input=what,
        expected=preview(want[row, head]),
        got=preview(got[row, head].float()),
        hint=hint,
        replay=f"from kvlab.grading.lab09.chunk import make_chunk_case; make_chunk_case(**{case})",
    )


# a chunk of two tiles after a prefix: where slips that answer alike on a short chunk part
PROBE = dict(num_computed=6, n=7, seed=11)


def _named(fn, run, kernel: bool, case: dict, args, got, want) -> str | None:
    """The hint of the one slip that answers as ``fn`` on the case, told apart where several
    do on a probe of the same heads (a longer chunk): on a chunk of one query, a tile's keys
    stopping one short answers as a causal mask that leaves each query out of its own keys."""
    found = slips.matching(_slips(args, kernel), got, (args,), want, _close)
    if slips.only(found) is None:
        probe = (make_chunk_case(**{**case, **PROBE}),)
        tensor = lambda answer: isinstance(answer, torch.Tensor)  # noqa: E731
        mine = lambda probe: run(fn, probe)  # noqa: E731
        found = slips.told_apart(
            found, mine, [probe], lambda a: chunk_attention_reference(*a), _close, readable=tensor
        )
    return slips.hint(slips.only(found))


def _call_torch(fn, args):
    return fn(*(a.clone() if isinstance(a, torch.Tensor) else a for a in args))


def _register(ex, run, kernel: bool):
    def check(name, *cases):
        @ex.check(name)
        def _(fn):
            for case in cases:
                _expect_chunk(fn, run, kernel, **case)

    check("a chunk of 1 (a decode) after 5 cached tokens", dict(num_computed=5, n=1))
    check(
        "a first chunk of block_size - 1, block_size and block_size + 1 tokens",
        dict(num_computed=0, n=3, seed=1),
        dict(num_computed=0, n=4, seed=2),
        dict(num_computed=0, n=5, seed=3),
    )
    check("a chunk that starts mid-room", dict(num_computed=6, n=5, seed=4))
    check("a prompt that ends mid-room (NaN in the rest of the room)", dict(num_computed=8, n=3))
    check(
        "grouped-query attention: 4 query heads on 2 KV heads",
        dict(num_computed=3, n=6, q_heads=4, kv_heads=2, seed=5),
    )
    if not kernel:  # (Triton's interpreter can get bf16 arithmetic wrong: the kernel is fp32)
        check(
            "q and the caches in bfloat16: the answer in q's dtype",
            dict(num_computed=5, n=3, seed=6, dtype=torch.bfloat16),
        )
        check(
            "bfloat16 with sharp queries (scores in the tens): the softmax in fp32",
            dict(num_computed=12, n=4, seed=6, dtype=torch.bfloat16, sharpness=32.0),
            dict(num_computed=12, n=4, seed=7, dtype=torch.bfloat16, sharpness=32.0),
        )


_register(attention_ex, _call_torch, kernel=False)


# --- the kernel ------------------------------------------------------------------------------


def _call_kernel(fn, args):
    return launched("launching your kernel", launch_chunk_kernel, fn, *args)


_register(kernel_ex, _call_kernel, kernel=True)


# --- rooms numbered past 2**31 values: room * stride_kb needs 64 bits ---------------------------

FAR = 2**31  # values: a room starting past this many needs its offset in 64 bits
FAR_CASE = dict(num_computed=6, n=5, seed=4, dtype=torch.float16)


def far_rooms_case(device: str = "cpu", **case):
    """:func:`make_chunk_case`'s guest (float16) with its rooms renumbered from ``2**31 // room
    size`` on, so that room * stride_kb passes 2**31: K and V share one storage, 4 GiB. On the
    CPU it is an anonymous mapping with no reserve (addresses, a few pages of memory: within the
    judge's 8 GiB of address space), and a room number multiplied in 32 bits points 4 GiB before
    it (a crash, or memory that is not the guest's). On a GPU ``FAR`` more values come first, zeros
    where such a room number lands (a wrong answer, never a fault that spoils the device)."""
    q, k, v, table, nc = make_chunk_case(**{**FAR_CASE, **case})
    m, size, heads, dim = k.shape
    room = size * heads * dim
    first = -(-FAR // room)
    num_blocks = first + m
    before = 0 if device == "cpu" else FAR
    total = before + (num_blocks + m) * room
    if device == "cpu":
        import mmap

        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
        buffer = mmap.mmap(-1, total * k.element_size(), flags=flags)
        storage = torch.frombuffer(buffer, dtype=k.dtype)
    else:
        storage = torch.zeros(total, dtype=k.dtype, device=device)
    shape = (num_blocks, size, heads, dim)
    k_cache = storage[before : before + num_blocks * room].view(shape)
    v_cache = storage[before + m * room : before + (num_blocks + m) * room].view(shape)
    k_cache[first:] = k.to(device)
    v_cache[first:] = v.to(device)
    far = (table.long() + first).to(torch.int32).to(device)
    return q.to(device), k_cache, v_cache, far, nc


def _launch_far(fn, args):
    """The kernel's output on ``args``, or what went wrong in words (run in a child process
    of its own on the CPU, where a room number wrapped in 32 bits can crash it)."""
    from kvlab.grading.limits import CheckTimeout, ChildCrashed, can_fork, in_child_process

    def launch():
        try:
            return _call_kernel(fn, args).cpu()
        except NotImplementedError:
            raise
        except Exception as error:
            return f"it raised {type(error).__name__}: {str(error)[:200]}"

    if kernel_mode() != "interpreter" or not can_fork():
        return launch()
    try:
        return in_child_process(launch, 60.0)
    except ChildCrashed as crash:
        return f"it crashed its process ({crash.how})"
    except CheckTimeout:
        return "it did not finish within 60 s"


@kernel_ex.check("rooms numbered past 2**31 values into the cache: room * stride_kb in 64 bits")
def _far_rooms(fn):
    """In Triton's interpreter, or on a GPU with 12 GiB free; left out elsewhere, and under the
    judge, whose learner's process gets a tensor as its storage's bytes (4 GiB here, past what
    one message may carry): the lab's own check cell runs it."""
    from kvlab.grading.remote import is_remote

    if is_remote(fn):
        return
    device = "cpu"
    if kernel_mode() != "interpreter":
        device = "cuda"
        if torch.cuda.mem_get_info()[0] < 12 * 2**30:
            return
    args = far_rooms_case(device)
    want = chunk_attention_reference(*args).cpu()
    got = _launch_far(fn, args)
    if isinstance(got, torch.Tensor) and _close(got, want):
        return
    near = make_chunk_case(**FAR_CASE)
    on_device = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in near)
    right_near = _close(_launch_far(fn, on_device), chunk_attention_reference(*near))
    raise CheckFailed(
        "the answer differs when the rooms are numbered far into the cache",
        input=f"{describe(near)}; rooms numbered from {int(args[3].min()):,} on "
        f"(stride_kb {args[1].stride(0)}: room * stride_kb past 2**31)",
        expected=preview(want[0, 0].float()),
        got=preview(got[0, 0].float()) if isinstance(got, torch.Tensor) else got,
        hint=hints.ROOM_INT64 if right_near else None,
    )


def launch_isolated(fn, *case, timeout: float = 60.0):
    """``launch_chunk_kernel(fn, *case)`` for a notebook cell, isolated as the checks are (in
    Triton's interpreter, in a forked child): ``(output, None)`` or ``(None, what went wrong)``."""
    return launch_chunk_isolated(fn, *case, timeout=timeout, unimplemented=unwrap_unimplemented)
