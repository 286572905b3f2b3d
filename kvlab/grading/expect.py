"""Helpers for writing checks: the failure a check raises, expectations, and short descriptions of
values for the report.

A check is a plain function that receives the learner's object and raises :class:`CheckFailed`
(input, expected, got, hint) when the answer is wrong.
"""

from __future__ import annotations

import copy
import numbers
import sys


class CheckFailed(AssertionError):
    """A wrong answer: what went in, what should have come out, what came out.

    ``hint`` is advice for a *diagnosed* mistake only (the check recognised what went wrong); a
    check that does not know the cause leaves it out and the report says so neutrally. ``cause``
    names the diagnosed mistake (by default the hint itself): a later check that fails for the
    same cause is reported as "probably the same problem as above". ``replay`` says how to
    reproduce an input too long to show (a seed, a call).
    """

    def __init__(
        self,
        message="",
        *,
        input=None,
        expected=None,
        got=None,
        hint=None,
        cause=None,
        replay=None,
    ):
        super().__init__(message)
        self.message = message
        self.input = input
        self.expected = expected
        self.got = got
        self.hint = hint
        self.cause = cause if cause is not None else hint
        self.replay = replay


# --- describing values -----------------------------------------------------------------------


def plural(n: int, word: str, many: str | None = None) -> str:
    """``plural(1, "room")`` is "1 room", ``plural(3, "room")`` "3 rooms"."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def listed(items, limit: int, text=str, what: str | None = None) -> str:
    """``items`` as ``text`` gives each, comma-separated, cut after ``limit`` with the count (of
    ``what``, when it is named)."""
    items = list(items)
    shown = ", ".join(map(text, items[:limit]))
    count = plural(len(items), what) if what else len(items)
    return shown + (f", … ({count} in all)" if len(items) > limit else "")


def short(value, limit: int = 160, typed: bool = False) -> str:
    """A one-line, length-limited description of a value (tensors by shape and dtype);
    ``typed`` names the type of plain values too (``str '3'``), never twice (``list [1]``)."""
    torch = sys.modules.get("torch")  # a value is a tensor only once torch is imported
    if torch is not None:
        if isinstance(value, torch.Tensor):
            if value.numel() <= 8:
                text = f"tensor({value.tolist()}, dtype={value.dtype})"
            else:
                text = f"tensor of shape {tuple(value.shape)}, dtype {value.dtype}"
            return text if len(text) <= limit else text[: limit - 1] + "…"
    try:
        text = repr(value)
    except Exception as e:  # a learner's __repr__ may itself be broken
        text = f"<{type(value).__name__} whose repr raised {type(e).__name__}>"
    text = " ".join(text.split())
    plain = isinstance(value, (str, bytes, int, float, bool, type(None)))
    if (typed or not plain) and not text.startswith(type(value).__name__):
        text = f"{type(value).__name__} {text}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def max_error(got, diff) -> str:
    """How far an answer is off, in a report: NaN named as such (not as an infinite error)."""
    if bool(got.isnan().any()):
        return "NaN in the answer"
    return f"max error {diff.max().item():.3g}"


def furthest(got, expected) -> tuple[tuple[int, ...], str]:
    """Where a tensor answer is furthest from ``expected`` (NaN counting as furthest off): the
    index of its worst vector, found axis by axis (the worst guest, then its worst head), and
    how far off the answer is (:func:`max_error`)."""
    diff = (got.float() - expected.float()).abs().nan_to_num(nan=float("inf"))
    at, part = (), diff
    while part.dim() > 1:
        at += (int(part.flatten(1).amax(dim=1).argmax()),)
        part = part[at[-1]]
    return at, max_error(got, diff)


def preview(vector, n: int = 4) -> str:
    """The first values of a tensor: enough to compare by eye."""
    values = ", ".join(f"{x:.4g}" for x in vector.reshape(-1)[:n].tolist())
    return f"[{values}{', …' if vector.numel() > n else ''}] ({plural(vector.numel(), 'value')})"


# --- expectations ----------------------------------------------------------------------------


def as_int(value):
    """A whole float (``3.0``) as the int it is, where a check takes a whole number that may have
    been computed with ``/`` (Lab 09's token count, Lab 10's replica index); any other value as
    it came."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def int_hints(noun: str, fix: str) -> tuple[str, str, str]:
    """The hints for ``noun``, an int that ``fix`` returns, come back held in a tuple or list, as
    its text, or as another kind of number: each formats ``{kind}``, the type that came back."""
    return (
        f"return {noun} alone, an int ({fix}), not a {{kind}} holding it",
        f"return {noun}, an int ({fix}), not its text (a {{kind}})",
        f"return {noun}, an int ({fix}), not a {{kind}}",
    )


def int_slip(got, expected: int, hints: tuple[str, str, str]) -> str | None:
    """Which of :func:`int_hints` ``got`` shows: ``expected`` held in a tuple or list, as text,
    or as a number of another type (None: none of them)."""
    alone, text, number = (hint.format(kind=type(got).__name__) for hint in hints)
    if isinstance(got, (tuple, list)) and expected in got:
        return alone
    if isinstance(got, str) and got.strip().replace(",", "") == str(expected):
        return text
    if isinstance(got, numbers.Real) and not isinstance(got, bool) and got == expected:
        return number
    return None


def expect_type(got, kind, what: str, input=None, hint=None):
    """Fail unless ``got`` is a ``kind`` (numpy integers count as int; bools never do)."""
    accepted = numbers.Integral if kind is int else kind
    if isinstance(got, bool) and kind in (int, float) or not isinstance(got, accepted):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise CheckFailed(
            f"{what} should be of type {names}",
            input=input,
            expected=names,
            got=short(got, typed=True),
            hint=hint,
        )


def expect_equal(got, expected, what: str, input=None, hint=None):
    if got != expected:
        raise CheckFailed(what, input=input, expected=short(expected), got=short(got), hint=hint)


def tensor_bits(t):
    """A tensor's bytes, so that equality is bit for bit: NaN equals the same NaN, and a room
    full of NaN left alone counts as unchanged."""
    import torch

    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def same(a, b) -> bool:
    """Deep equality that understands tensors, containers, dataclasses and plain objects (their
    attributes and slots), and objects that point back at each other (a linked free queue)."""
    pending, seen = [(a, b)], set()
    while pending:
        a, b = pending.pop()
        if (id(a), id(b)) in seen:  # compared already, or being compared (a cycle)
            continue
        seen.add((id(a), id(b)))
        parts = _parts(a, b)
        if parts is None:
            return False
        pending.extend(parts)
    return True


def _parts(a, b) -> list | None:
    """None when ``a`` and ``b`` differ on their own; else the pairs inside them still to compare
    (the values compared are live objects, so their ids stay theirs while ``same`` runs)."""
    torch = sys.modules.get("torch")
    if torch is not None and (isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor)):
        equal = (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and torch.equal(tensor_bits(a), tensor_bits(b))
        )
        return [] if equal else None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(zip(a, b, strict=True)) if type(a) is type(b) and len(a) == len(b) else None
    if isinstance(a, dict) and isinstance(b, dict):
        return [(a[k], b[k]) for k in a] if a.keys() == b.keys() else None
    if type(a) is type(b) and type(a).__eq__ is object.__eq__:
        names = _attribute_names(a)
        if names is not None:
            if set(names) != set(_attribute_names(b) or ()):
                return None
            return [(getattr(a, n, _UNSET), getattr(b, n, _UNSET)) for n in names]
    try:
        return [] if bool(a == b) else None
    except Exception:
        return [] if a is b else None


_UNSET = object()  # a slot that holds no value


def _attribute_names(obj) -> list[str] | None:
    """The names of an object's attributes (its __dict__ and its slots), or None when it has
    neither (then only ``==`` can compare it)."""
    names = list(vars(obj)) if hasattr(obj, "__dict__") else []
    slotted = False
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        slotted |= bool(slots)
        slots = (slots,) if isinstance(slots, str) else slots
        names += [s for s in slots if s not in ("__dict__", "__weakref__")]
    return names if hasattr(obj, "__dict__") or slotted else None


def call_without_mutation(fn, *args, names: tuple[str, ...] = ()):
    """Call ``fn(*args)``; fail the check if it changed any argument in place."""
    before = copy.deepcopy(args)
    result = fn(*args)
    for i, (old, new) in enumerate(zip(before, args, strict=True)):
        if not same(old, new):
            name = names[i] if i < len(names) else f"argument {i + 1}"
            raise CheckFailed(
                f"your code changed its input `{name}` in place",
                hint=f"leave `{name}` as it came in: build new values instead of modifying it",
            )
    return result


def expect_tensor_like(
    got,
    expected,
    what: str,
    input=None,
    axes="",
    shape_hint=None,
    dtype_hint=None,
    replay=None,
    dtype_of="q",
):
    """Fail unless ``got`` is a tensor of ``expected``'s shape and dtype: what a check whose answer
    is a tensor asks before it compares the values (Labs 04, 09 and 11). ``axes`` names the shape's
    axes in the report; ``shape_hint`` and ``dtype_hint`` are the advice for a wrong shape or
    dtype; the answer's dtype is that of the input ``dtype_of``."""
    import torch

    expect_type(got, torch.Tensor, what, input=input)
    if got.shape != expected.shape:
        raise CheckFailed(
            f"{what} has the wrong shape",
            input=input,
            expected=f"{tuple(expected.shape)}{axes and f' ({axes})'}",
            got=str(tuple(got.shape)),
            hint=shape_hint,
            replay=replay,
        )
    if got.dtype != expected.dtype:
        raise CheckFailed(
            f"{what} is {got.dtype}, not {dtype_of}'s dtype",
            input=input,
            expected=str(expected.dtype),
            got=str(got.dtype),
            hint=dtype_hint,
        )
