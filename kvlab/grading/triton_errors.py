"""Triton's own error messages, read as the usual mistakes they name (a torch call inside
``@triton.jit``, a block shape that is not a power of two, ...), for every lab whose learner
writes a kernel (Lab 05's decode, Lab 09's chunk). The pattern is searched in every exception of
the chain: the interpreter wraps the original error and the compiler puts it after the source
excerpt, so the same mistake reads the same on CPU and GPU."""

from __future__ import annotations

import re

from kvlab.grading.blame import exception_chain, explain_exception
from kvlab.grading.expect import CheckFailed

# (pattern in the message, cause, hint)
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


def unwrap_unimplemented(error: BaseException) -> None:
    """Triton wraps errors raised in a kernel (InterpreterError, CompilationError); an unwritten
    kernel body still counts as "not implemented" (Triton's own NotImplementedError, for
    assigning into a block, does not)."""
    if triton_mistake(error) is not None:
        return
    for seen in exception_chain(error):
        if isinstance(seen, NotImplementedError) or "NotImplementedError" in repr(seen):
            raise NotImplementedError from error


def launched(what: str, launch, *args):
    """``launch(*args)``, the learner's kernel run (Lab 09's chunk kernel, Lab 11's quantised
    decode): an unwritten kernel Triton wrapped is reported as not implemented, and an error
    that names a usual mistake fails at ``what`` with its hint; any other error is raised."""
    try:
        return launch(*args)
    except NotImplementedError:
        raise
    except Exception as error:
        unwrap_unimplemented(error)  # Triton wraps what a kernel raised
        explain_triton_error(error, what)
        raise
