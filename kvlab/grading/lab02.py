"""Checks for Lab 02: first-fit placement and the external fragmentation metric.

A wrong answer is compared with what the usual slips give (best fit, the largest extent, last fit,
an index instead of an offset, ``>`` instead of ``>=``, the smallest extent, a percentage,
1 - 1 / the number of extents, …); a hint is given only when exactly one of them explains it. Slips
that coincide on a check's input are told apart on probe floors where they differ.
"""

from __future__ import annotations

import math
import numbers
import random

from kvlab.core.contiguous import ArenaAllocator, best_fit, external_fragmentation, first_fit
from kvlab.grading import slips
from kvlab.grading.blame import raised
from kvlab.grading.expect import CheckFailed, call_without_mutation, listed, short
from kvlab.grading.own_code import refuse_reference
from kvlab.grading.registry import exercise
from kvlab.grading.slips import Slip

fit = exercise("02.first_fit", "first-fit placement")


def _largest(extents, n):
    fits = [(length, -offset) for offset, length in extents if length >= n]
    return -max(fits)[1] if fits else None


# the usual slips: what each returns for (free_extents, n)
FIT_SLIPS = (
    Slip(
        "that is best fit (the tightest extent): first fit takes the first extent, in offset "
        "order, that is long enough",
        best_fit,
    ),
    Slip(
        "that is the largest extent: first fit takes the first extent, in offset order, that is "
        "long enough",
        _largest,
    ),
    Slip(
        "an extent of exactly n beds fits: compare with length >= n, not length > n",
        lambda extents, n: next((o for o, length in extents if length > n), None),
    ),
    Slip(
        "return the extent's offset (the first number of the pair), not its index in the list",
        lambda extents, n: next((i for i, (_, length) in enumerate(extents) if length >= n), None),
    ),
    Slip(
        "return the extent's offset (the first number of the pair), not its length",
        lambda extents, n: next((length for _, length in extents if length >= n), None),
    ),
    Slip(
        "when nothing fits, return None (not -1)",
        lambda extents, n: -1 if first_fit(extents, n) is None else first_fit(extents, n),
    ),
    Slip(
        "that is last fit (the fitting extent with the highest offset): first fit takes the "
        "first extent, in offset order, that is long enough; search from the start of the list",
        lambda extents, n: first_fit(extents[::-1], n),
    ),
)
# floors on which the slips above choose differently, to tell apart slips that coincide: on the
# first, best fit (50), the largest extent (100), last fit (300), the index (0) and the length (30)
# all differ from first fit (10); on the second, `>` (16) differs from them
FIT_PROBES = (
    ([(10, 30), (50, 25), (100, 90), (300, 40)], 20),
    ([(4, 6), (16, 9), (40, 12), (60, 6)], 6),
)


def _diagnose(rule, table, got, args, same, fn, probes) -> str | None:
    """The one slip of ``table`` whose answer is ``got`` and differs from ``rule``'s; when
    several are, the one that also explains what ``fn`` returns on each of ``probes``."""
    found = slips.matching(table, got, args, rule(*args), same)
    return slips.hint(slips.only(slips.told_apart(found, fn, probes, rule, same)))


def diagnose_fit(got, extents, n, fn) -> str | None:
    return _diagnose(first_fit, FIT_SLIPS, got, (extents, n), _same_offset_exact, fn, FIT_PROBES)


def _same_offset_exact(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return not isinstance(a, bool) and isinstance(a, numbers.Integral) and a == b


def _describe_extents(extents, limit: int = 6) -> str:
    """The free extents, cut after ``limit`` with the count."""
    return f"[{listed(extents, limit, what='extent')}]"


def _expect_fit(fn, extents, n, replay=None):
    args = f"free_extents={_describe_extents(extents)}, n={n}"
    expected = first_fit(extents, n)
    try:
        with refuse_reference(
            first_fit, best_fit, ArenaAllocator.allocate, learner=fn, task="placing the booking"
        ):
            got = call_without_mutation(fn, extents, n, names=("free_extents", "n"))
    except CheckFailed:
        raise
    except Exception as e:
        if expected is not None:
            raise
        hint = "when no extent fits, return None: the arena turns that into OutOfSpace itself"
        raise raised(e, hint, input=args, replay=replay, expected="None") from None
    at = {"input": args, "replay": replay, "expected": short(expected), "got": short(got)}
    if got is not None and (isinstance(got, bool) or not isinstance(got, numbers.Integral)):
        hint = None
        if isinstance(got, tuple) and len(got) == 2 and got[0] == expected:
            hint = "return only the offset (an int), not the whole (offset, length) pair"
        elif got is False and expected is None:
            hint = "when nothing fits, return None (not False)"
        raise CheckFailed("return an int offset, or None", hint=hint, **at)
    if not _same_offset_exact(got, expected):
        raise CheckFailed("wrong offset", hint=diagnose_fit(got, extents, n, fn), **at)


# each check: its name and the (free_extents, n) it books
FITS = (
    (
        "takes the FIRST extent that fits, not the biggest or the tightest",
        [([(0, 5), (10, 30), (50, 100), (200, 20)], 20)],
    ),
    ("an extent of exactly n beds fits", [([(0, 3), (8, 7)], 7)]),
    (
        "None when no single extent fits, even if the total free space would",
        [([(0, 10), (20, 10), (40, 10)], 12)],
    ),
    (
        "an empty hotel floor (one extent) and a full hotel (no extents)",
        [([(0, 4096)], 4096), ([(0, 4096)], 1), ([], 1)],
    ),
)


def _books(cases):
    def check(fn):
        for extents, n in cases:
            _expect_fit(fn, list(extents), n)  # a copy: a learner's code may change the table's

    return check


for _name, _cases in FITS:
    fit.check(_name)(_books(_cases))


def random_floors(seed: int = 2, count: int = 300):
    """``(free_extents, n)`` for ``count`` random floors: up to 8 extents, gaps between them."""
    rng = random.Random(seed)
    floors = []
    for _ in range(count):
        extents, cursor = [], 0
        for _ in range(rng.randint(0, 8)):
            cursor += rng.randint(1, 50)
            length = rng.randint(1, 60)
            extents.append((cursor, length))
            cursor += length
        floors.append((extents, rng.randint(1, 70)))
    return floors


@fit.check("300 random floors")
def _random_fit(fn):
    for i, (extents, n) in enumerate(random_floors(seed=2)):
        _expect_fit(fn, extents, n, replay=f"kvlab.grading.lab02.random_floors(seed=2)[{i}]")


frag = exercise("02.external_fragmentation", "the external fragmentation metric")


def _total(extents):
    return sum(length for _, length in extents)


# the usual slips: what each returns for free_extents (only with something free)
FRAG_SLIPS = (
    Slip(
        "use the largest free extent, not the smallest: 1 - largest / total",
        lambda e: 1 - min(length for _, length in e) / _total(e),
    ),
    Slip(
        "use the largest free extent, not the first one: 1 - largest / total",
        lambda e: 1 - e[0][1] / _total(e),
    ),
    Slip(
        "that is largest / total, the share in one piece: fragmentation is 1 - largest / total",
        lambda e: max(length for _, length in e) / _total(e),
    ),
    Slip(
        "return a fraction between 0 and 1, not a percentage",
        lambda e: 100 * external_fragmentation(e),
    ),
    Slip(
        "`//` rounds down to a whole number: divide with `/`",
        lambda e: 1 - max(length for _, length in e) // _total(e),
    ),
    Slip(
        "divide by the total free beds (the sum of the lengths), not by the number of extents",
        lambda e: 1 - max(length for _, length in e) / len(e),
    ),
    Slip(
        "that is 1 - 1 / (number of extents): it counts the pieces and not their sizes; "
        "fragmentation is 1 - largest / total",
        lambda e: 1 - 1 / len(e),
    ),
)
# a floor on which the slips above all give different values (the right one is 0.6): smallest
# 0.9, first 0.8, largest / total 0.4, percentage 60, `//` 1, by count -9, 1 - 1 / count 0.75
FRAG_PROBES = (([(0, 20), (100, 40), (200, 10), (300, 30)],),)
EMPTY_FRAG = (
    "nothing is free here, so nothing is scattered: return 0.0 (there is no largest free "
    "extent to compare with the total)"
)


def _same_fraction(a, b) -> bool:
    if not (isinstance(a, numbers.Real) and isinstance(b, numbers.Real)):
        return False
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def _expect_frag(fn, extents, replay=None):
    args = f"free_extents={_describe_extents(extents)}"
    expected = external_fragmentation(extents)
    try:
        with refuse_reference(
            external_fragmentation,
            ArenaAllocator.external_fragmentation,
            learner=fn,
            task="measuring the scatter",
        ):
            got = call_without_mutation(fn, extents, names=("free_extents",))
    except (ZeroDivisionError, ValueError) as e:
        if extents:
            raise
        hint = "nothing is free here: return 0.0 before dividing by the total (or taking max)"
        raise raised(e, hint, input=args, expected=f"{expected:.6g}") from None
    at = {"input": args, "replay": replay, "got": short(got)}
    if got is None or isinstance(got, bool) or not isinstance(got, numbers.Real):
        hint = "your function returned None: end it with `return ...`" if got is None else None
        raise CheckFailed("return a number between 0 and 1", hint=hint, **at)
    if not _same_fraction(got, expected):
        if extents:
            rule, table = external_fragmentation, FRAG_SLIPS
            hint = _diagnose(rule, table, got, (extents,), _same_fraction, fn, FRAG_PROBES)
        else:
            hint = EMPTY_FRAG
        raise CheckFailed("wrong value", expected=f"{expected:.6g}", hint=hint, **at)


# each check: its name, the free extents, and how to rebuild them where they are long
FRAGS = (
    ("all free space in one piece: 0", [(100, 50)], None),
    ("two equal pieces: 0.5", [(0, 10), (30, 10)], None),
    ("the largest piece last: 1 - 30 / 45", [(0, 10), (20, 5), (40, 30)], None),
    ("no free space at all: 0 (nothing is scattered)", [], None),
    (
        "many single beds: close to 1",
        [(2 * i, 1) for i in range(100)],
        "[(2 * i, 1) for i in range(100)]",
    ),
)
for _name, _extents, _replay in FRAGS:
    frag.check(_name)(lambda fn, e=_extents, r=_replay: _expect_frag(fn, list(e), replay=r))


def random_free_lists(seed: int = 3, count: int = 300):
    """``count`` random lists of 1 to 9 free extents, one per 100 beds."""
    rng = random.Random(seed)
    return [[(i * 100, rng.randint(1, 90)) for i in range(rng.randint(1, 9))] for _ in range(count)]


@frag.check("300 random floors")
def _random_frag(fn):
    for i, extents in enumerate(random_free_lists(seed=3)):
        _expect_frag(fn, extents, replay=f"kvlab.grading.lab02.random_free_lists(seed=3)[{i}]")
