"""Checks for Lab 02: first-fit placement and the external fragmentation metric."""

from __future__ import annotations

import math
import numbers
import random

from kvlab.contiguous import external_fragmentation, first_fit
from kvlab.grading.core import CheckFailed, call_without_mutation, exercise, expect_equal, short

fit = exercise("02.first_fit", "first-fit placement")


def _expect_fit(fn, extents, n, hint=None):
    args = f"free_extents={extents}, n={n}"
    got = call_without_mutation(fn, extents, n, names=("free_extents", "n"))
    expected = first_fit(extents, n)
    if got is not None and (isinstance(got, bool) or not isinstance(got, numbers.Integral)):
        raise CheckFailed("return an int offset, or None", input=args, got=short(got))
    expect_equal(got, expected, "wrong offset", input=args, hint=hint)


@fit.check(
    "takes the FIRST extent that fits, not the biggest or the tightest",
    hint="walk the extents in offset order; return the offset of the first with length >= n",
)
def _first(fn):
    _expect_fit(fn, [(0, 5), (10, 30), (50, 100), (200, 20)], 20)


@fit.check("an extent of exactly n beds fits")
def _exact(fn):
    _expect_fit(fn, [(0, 3), (8, 7)], 7)


@fit.check(
    "None when no single extent fits, even if the total free space would",
    hint="30 free beds in three pieces of 10 cannot hold 12 adjacent beds",
)
def _none(fn):
    _expect_fit(fn, [(0, 10), (20, 10), (40, 10)], 12)


@fit.check("an empty hotel floor (one extent) and a full hotel (no extents)")
def _edges(fn):
    _expect_fit(fn, [(0, 4096)], 4096)
    _expect_fit(fn, [(0, 4096)], 1)
    _expect_fit(fn, [], 1)


@fit.check("300 random floors")
def _random_fit(fn):
    rng = random.Random(2)
    for _ in range(300):
        extents, cursor = [], 0
        for _ in range(rng.randint(0, 8)):
            cursor += rng.randint(1, 50)
            length = rng.randint(1, 60)
            extents.append((cursor, length))
            cursor += length
        _expect_fit(fn, extents, rng.randint(1, 70))


frag = exercise("02.external_fragmentation", "the external fragmentation metric")


def _expect_frag(fn, extents, hint=None):
    args = f"free_extents={extents}"
    got = call_without_mutation(fn, extents, names=("free_extents",))
    expected = external_fragmentation(extents)
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        raise CheckFailed("return a number between 0 and 1", input=args, got=short(got))
    if not math.isclose(got, expected, abs_tol=1e-9):
        raise CheckFailed(
            "wrong value", input=args, expected=f"{expected:.6g}", got=short(got), hint=hint
        )


@frag.check("all free space in one piece: 0", hint="1 - largest / total = 1 - 1 = 0")
def _one(fn):
    _expect_frag(fn, [(100, 50)])


@frag.check(
    "two equal pieces: 0.5",
    hint="external fragmentation = 1 - largest free extent / total free",
)
def _two(fn):
    _expect_frag(fn, [(0, 10), (30, 10)])


@frag.check(
    "no free space at all: 0 (nothing is scattered)",
    hint="guard against dividing by zero: return 0.0 when nothing is free",
)
def _none_free(fn):
    _expect_frag(fn, [])


@frag.check("many single beds: close to 1")
def _dust(fn):
    _expect_frag(fn, [(2 * i, 1) for i in range(100)])


@frag.check("300 random floors")
def _random_frag(fn):
    rng = random.Random(3)
    for _ in range(300):
        extents = [(i * 100, rng.randint(1, 90)) for i in range(rng.randint(1, 9))]
        _expect_frag(fn, extents)
