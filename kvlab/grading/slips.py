"""Name the slip: which of an exercise's usual mistakes a wrong answer shows.

A lab lists its usual slips as :class:`Slip` rows: what the learner is told, and the slip's
answer, a slipped reference (the rule with that one mistake put in, called as the rule is) or a
function producing the slipped answer. :func:`matching` keeps the slips whose answer on the
failing input is the learner's and not the right one; :func:`told_apart` narrows them on probes,
inputs where the slips answer differently, which the learner's code answers too; a slip's own
``probe`` confirms it where it looks like another. A hint names only a slip left alone by these
(:func:`only`, or :func:`first` where the table's order decides): an answer that two slips explain
gets none, and the report says so neutrally.
"""

from __future__ import annotations

import copy
import functools
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kvlab.grading.remote import code_of

RAISED = object()  # what a probe of the learner's code that raised answers


@dataclass(frozen=True)
class Slip:
    """One usual mistake: what the learner is told (None: the lab's hints, by cause, say it), the
    slip's answer, and its ``cause``, which later failures of the same mistake fold into (by
    default the hint). ``case()`` builds its own probe, an input where only this slip goes
    wrong (see :func:`confirmed`); ``probe()``, where a lab confirms a slip its own way, says
    whether the learner's code answers a probe as this slip does; ``lookalike`` marks a slip
    that answers as another here, named only once its probe agrees."""

    hint: str | None
    answer: Callable[..., Any] | None = None
    cause: str | None = None
    case: Callable[[], tuple] | None = None  # builds the arguments of its own probe
    probe: Callable[[], bool] | None = None
    lookalike: bool = False

    @property
    def mistake(self) -> str:
        return self.hint if self.cause is None else self.cause


def changed(rule: Callable[..., Any], hint: str | None, **decision) -> Slip:
    """The slip whose answer is ``rule`` with one decision changed, ``rule(*args, **decision)``:
    a lab's reference that takes each decision it may get wrong as a keyword."""
    return Slip(hint, functools.partial(rule, **decision))


def quietly(probe: Callable[[], Any]):
    """A probe's result, or None when the learner's code raises (a probe never fails a check)."""
    try:
        return probe()
    except Exception:
        return None


def probing(probe: Callable[..., Any]) -> Callable[..., bool]:
    """A probe of the learner's code as a yes or no, no when their code raises."""
    return functools.wraps(probe)(lambda *args: bool(quietly(lambda: probe(*args))))


def answer_of(fn, *args):
    """``fn(*args)``, or :data:`RAISED`."""
    try:
        return fn(*args)
    except Exception:
        return RAISED


def confirmed(slip: Slip, fn, same=operator.eq) -> bool:
    """Whether ``fn`` answers the slip's own case (a copy of it) as the slip does."""
    args = slip.case()
    return same(answer_of(fn, *copy.deepcopy(args)), slip.answer(*args))


def matching(slips: Iterable[Slip], got, args: tuple, right, same=operator.eq) -> list[Slip]:
    """The slips whose answer on ``args`` is ``got`` and differs from ``right``."""
    found = []
    for slip in slips:
        wrong = slip.answer(*args)
        if not same(wrong, right) and same(got, wrong):
            found.append(slip)
    return found


def told_apart(
    found: list[Slip],
    fn,
    probes: Iterable[tuple],
    rule,
    same=operator.eq,
    *,
    always: bool = False,
    readable: Callable[[Any], bool] = lambda answer: True,
) -> list[Slip]:
    """``found`` narrowed on each probe (arguments for ``rule``, which gives the right answer)
    to the slips that answer it as ``fn`` does: the slip's answer where ``fn``'s is wrong, the
    right one where it is right. Only several slips are narrowed (one too, with ``always``); a
    probe that ``fn`` raises on, or answers with what is not ``readable``, tells nothing."""
    if not found or (len(found) == 1 and not always):
        return found
    for probe in probes:
        mine = answer_of(fn, *copy.deepcopy(probe))
        if mine is RAISED or not readable(mine):
            continue
        right = rule(*probe)
        kept = []
        for slip in found:
            wrong = slip.answer(*probe)
            differs = not same(wrong, right)
            if (differs and same(mine, wrong)) or (same(mine, right) and not differs):
                kept.append(slip)
        found = kept
    return found


def only(found: Iterable[Slip]) -> Slip | None:
    """The slip found when all that were found are one mistake, else None."""
    found = list(found)
    return found[0] if len({slip.mistake for slip in found}) == 1 else None


def first(found: Iterable[Slip]) -> Slip | None:
    """The first slip found (the table lists the likelier ones first), else None."""
    return next(iter(found), None)


def hint(slip: Slip | None) -> str | None:
    return None if slip is None else slip.hint


# --- slips that answer alike on every input, told apart by the learner's bytecode -----------

STORES = {"STORE_FAST", "STORE_NAME", "STORE_DEREF", "STORE_GLOBAL"}


def _instructions(fn) -> list[tuple[str, object]]:
    """(opname, argval) of ``fn``'s own body, here or in the learner's process (none for an
    object without code)."""
    shape = code_of(fn)
    return shape["instructions"] if shape is not None else []


def stores_attribute(fn, attribute: str) -> bool:
    """Whether ``fn`` assigns ``something.attribute`` to a name (``parent = hit.parent_hash``)."""
    code = _instructions(fn)
    return any(
        a == ("LOAD_ATTR", attribute) and b[0] in STORES
        for a, b in zip(code, code[1:], strict=False)
    )


def rebinds_argument(fn, index: int) -> bool:
    """Whether ``fn`` assigns a new value to its argument number ``index`` (``queue = ...``)."""
    shape = code_of(fn)
    if shape is None or index >= min(shape["co_argcount"], len(shape["co_varnames"])):
        return False
    name = shape["co_varnames"][index]
    return any(op in STORES and arg == name for op, arg in shape["instructions"])
