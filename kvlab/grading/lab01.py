"""Checks for Lab 01: splitting a booking into the three wastes; a max-length cache's accounts."""

from __future__ import annotations

import random

from kvlab.contiguous import ContiguousKVCache
from kvlab.grading.core import (
    CheckFailed,
    call_without_mutation,
    exercise,
    expect_equal,
    expect_type,
    short,
)
from kvlab.trace import split_waste

waste = exercise("01.waste_split", "split a booking into used / future / internal")


def _expect_split(fn, booked, tokens, final, hint=None):
    args = f"booked={booked}, tokens={tokens}, final={final}"
    got = call_without_mutation(fn, booked, tokens, final)
    if not isinstance(got, tuple) or len(got) != 3:
        raise CheckFailed("return a tuple (used, future, internal)", input=args, got=short(got))
    for name, value in zip(("used", "future", "internal"), got, strict=True):
        expect_type(value, int, name, input=args)
    expect_equal(got, split_waste(booked, tokens, final), "wrong split", input=args, hint=hint)


@waste.check(
    "a guest halfway through their answer",
    hint="future = beds that tokens not yet generated will fill: final - tokens",
)
def _halfway(fn):
    _expect_split(fn, booked=2048, tokens=300, final=500)


@waste.check("a guest who has written every token they ever will: no future beds")
def _done(fn):
    _expect_split(fn, booked=2048, tokens=500, final=500)


@waste.check(
    "an exact booking has no internal fragmentation",
    hint="internal = booked beds that no token will ever use",
)
def _exact(fn):
    _expect_split(fn, booked=77, tokens=1, final=77)
    _expect_split(fn, booked=77, tokens=77, final=77)


@waste.check(
    "unknown final length (None): every unused booked bed may still be used",
    hint="with final=None, treat the whole unused booking as reserved-for-future",
)
def _unknown(fn):
    _expect_split(fn, booked=2048, tokens=10, final=None)


@waste.check(
    "a guest who would outgrow the booking only counts booked beds",
    hint="future can never exceed booked - tokens",
)
def _capped(fn):
    _expect_split(fn, booked=256, tokens=200, final=300)


@waste.check("200 random bookings: the parts always add up to the booking")
def _random(fn):
    rng = random.Random(1)
    for _ in range(200):
        booked = rng.randint(1, 4096)
        tokens = rng.randint(1, booked)
        final = rng.choice([None, rng.randint(tokens, booked), rng.randint(tokens, 2 * booked)])
        _expect_split(fn, booked, tokens, final)


cache = exercise(
    "01.max_length_cache", "a max-length cache that keeps its accounts", expects="class"
)

PARTS = ("used", "future", "internal", "free")


def _report(obj, where: str) -> dict:
    report = obj.memory_report()
    if not isinstance(report, dict) or set(report) != set(PARTS):
        raise CheckFailed(
            f"memory_report() must return a dict with keys {PARTS}",
            input=where,
            got=short(report),
        )
    return {k: report[k] for k in PARTS}


def _reference_report(ref: ContiguousKVCache) -> dict:
    usage = ref.memory_report()
    return {part: getattr(usage, part) for part in PARTS}


class _Twin:
    """Drives the learner's cache and kvlab's reference with the same calls, comparing reports."""

    def __init__(self, cls, num_slots, max_seq_len):
        self.calls = [f"MaxLengthCache({num_slots}, {max_seq_len})"]
        self.mine = cls(num_slots, max_seq_len)
        self.ref = ContiguousKVCache(num_slots, max_seq_len, policy="max")
        self.compare()

    def where(self) -> str:
        shown = self.calls if len(self.calls) <= 6 else [*self.calls[:2], "…", *self.calls[-3:]]
        return "; ".join(shown)

    def do(self, method: str, *args):
        self.calls.append(f".{method}({', '.join(map(repr, args))})")
        ref_method = {"admit": "admit", "append": "append", "release": "release"}[method]
        getattr(self.ref, ref_method)(*args)
        getattr(self.mine, method)(*args)
        self.compare()

    def compare(self, hint=None):
        expect_equal(
            _report(self.mine, self.where()),
            _reference_report(self.ref),
            "memory_report() is off",
            input=self.where(),
            hint=hint,
        )

    def expect_error(self, errors, method: str, *args, hint: str):
        before = _report(self.mine, self.where())
        self.calls.append(f".{method}({', '.join(map(repr, args))})")
        try:
            getattr(self.mine, method)(*args)
        except errors:
            pass
        else:
            names = " or ".join(e.__name__ for e in errors)
            raise CheckFailed(f"expected {names}", input=self.where(), got="no error", hint=hint)
        expect_equal(
            _report(self.mine, self.where()),
            before,
            "a refused call must leave the accounts unchanged",
            input=self.where(),
        )


@cache.check(
    "check-in: one guest books a whole suite of max_seq_len beds",
    hint="booked = max_seq_len; used = prompt_len; future = output_len; the rest is internal",
)
def _admit(cls):
    twin = _Twin(cls, 4, 64)
    twin.do("admit", "a", 10, 20)


@cache.check(
    "append moves one bed from future to used, and release frees the suite",
    hint="append adds one token to the guest; release returns all max_seq_len beds",
)
def _append_release(cls):
    twin = _Twin(cls, 2, 32)
    twin.do("admit", "a", 1, 3)
    for _ in range(3):
        twin.do("append", "a")
    twin.do("release", "a")
    twin.do("admit", "b", 5, 1)


@cache.check("a prompt that fills the whole suite (prompt_len = max_seq_len)")
def _full_prompt(cls):
    twin = _Twin(cls, 1, 16)
    twin.do("admit", "a", 16, 0)


@cache.check(
    "a full hotel refuses with a MemoryError and changes nothing",
    hint="raise kvlab.errors.OutOfMemory (a MemoryError) when every suite is taken",
)
def _full(cls):
    twin = _Twin(cls, 2, 16)
    twin.do("admit", "a", 3, 4)
    twin.do("admit", "b", 3, 4)
    twin.expect_error((MemoryError,), "admit", "c", 3, 4, hint="check for a free suite first")
    twin.do("release", "a")
    twin.do("admit", "c", 3, 4)


@cache.check(
    "bad input is refused with a clear error and changes nothing",
    hint="ValueError for a duplicate id or a request longer than max_seq_len; KeyError for an unknown id",
)
def _bad_input(cls):
    twin = _Twin(cls, 2, 16)
    twin.do("admit", "a", 3, 4)
    twin.expect_error((ValueError,), "admit", "a", 2, 2, hint="an id can be admitted only once")
    twin.expect_error((ValueError,), "admit", "b", 10, 7, hint="10 + 7 > max_seq_len = 16")
    twin.expect_error((KeyError,), "append", "nobody", hint="unknown ids raise KeyError")
    twin.expect_error((KeyError,), "release", "nobody", hint="unknown ids raise KeyError")


@cache.check("a random day at the hotel: check-ins, tokens and check-outs in random order")
def _random_day(cls):
    rng = random.Random(5)
    twin = _Twin(cls, 3, 40)
    left: dict[str, int] = {}
    for step in range(120):
        if len(left) < 3 and rng.random() < 0.4:
            guest = f"g{step}"
            prompt = rng.randint(1, 20)
            output = rng.randint(0, 40 - prompt)
            twin.do("admit", guest, prompt, output)
            left[guest] = output
        ready = [g for g, n in left.items() if n > 0]
        if ready:
            guest = rng.choice(ready)
            twin.do("append", guest)
            left[guest] -= 1
        done = [g for g, n in left.items() if n == 0]
        if done and rng.random() < 0.5:
            guest = rng.choice(done)
            twin.do("release", guest)
            del left[guest]
