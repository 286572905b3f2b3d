"""A learner's kernel launched on guarded copies of its tensors, so that what it reads or writes
outside them shows every time, whatever order its programs run in.

The inputs' guards (and the gaps between their head-dim vectors, which sit a power of two apart)
hold NaN, so a load outside an input that reaches the answer spoils it. The output's guards hold a
sentinel, so a store outside the output is seen (in the interpreter the programs run one after
another and a later one can hide an earlier one's stray row; on a GPU they race). The output
itself starts as a marked NaN, so rows nobody stored show (:func:`unwritten`). Lab 05's decode
kernel and Lab 11's quantised one are launched this way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from kvlab.grading.expect import plural
from kvlab.ops.kernels.sizes import pow2

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


def guarded(t: torch.Tensor, pad: int, fill: float, row: int = 0):
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


class GuardedLaunch:
    """One launch of the learner's kernel on guarded copies of ``args``: ``got`` (a view of the
    guarded output, shaped as ``args[0]``) and ``strays``, the output's guard values the kernel
    changed. ``launch(fn, *args, out=)`` runs the kernel; the tensors named in ``inputs`` (the
    first arguments) are guarded with NaN, or 0 for those in ``zero_guards`` and integer ones; ``pad`` is wider
    than any stray reaches. Each vector of an input's last axis starts a power of two of
    head_dim after the one before, or ``rows[name]`` values (an input laid out apart)."""

    def __init__(
        self,
        fn,
        args: Sequence,
        launch: Callable,
        inputs: Sequence[str],
        pad: int,
        zero_guards=(),
        rows=None,
    ):
        self._again = lambda zero: GuardedLaunch(fn, args, launch, inputs, pad, zero, rows)
        self.inputs = inputs
        head_dim = args[0].shape[-1]
        guarded_inputs = []
        for name, t in zip(inputs, args, strict=False):
            nan_free = name in zero_guards or not t.dtype.is_floating_point  # int8 has no NaN
            fill = 0.0 if nan_free else math.nan
            row = (rows or {}).get(name, pow2(head_dim))
            guarded_inputs.append(guarded(t, pad, fill, row=row)[0])
        out, self.buffer = guarded(torch.empty_like(args[0]), pad, OUT_GUARD)
        _bits(out).fill_(UNWRITTEN_BITS[args[0].dtype])
        before = _bits(self.buffer).clone()
        self.pad, self.size = pad, args[0].numel()
        self.got = launch(fn, *guarded_inputs, *args[len(inputs) :], out=out)
        changed = _bits(self.buffer) != before
        changed[pad : pad + self.size] = False
        self.strays = changed.nonzero().flatten().cpu()

    def first_unwritten(self) -> tuple[int, ...] | None:
        """The index of the first output row (all but the last axis) the kernel stored nothing
        in, or None."""
        nothing = unwritten(self.got).cpu().any(dim=-1)
        return tuple(int(i) for i in nothing.nonzero()[0]) if nothing.any() else None

    def input_read_outside(self) -> str | None:
        """The input whose NaN guards reached the answer (None: none did, or a launch raised)."""
        return next((name for name in self.inputs if self.read_outside(name)), None)

    def read_outside(self, *names: str) -> bool:
        """Whether the NaN guards of the inputs ``names`` reached the answer: launched again with
        their guards holding 0, the answer has fewer NaN (False where a launch raises)."""
        nans = int(self.got.isnan().sum())
        if not nans:
            return False
        try:
            again = self._again(names).got
        except Exception:
            return False
        return int(again.isnan().sum()) < nans

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
