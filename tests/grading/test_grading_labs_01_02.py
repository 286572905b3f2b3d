"""Labs 01–02 checks: a learner's right answer passes; each usual mistake fails the check that
targets it with its own diagnosis (an unknown one with the neutral line), knock-on failures are
folded, a half-written class gets the marks of its written methods, and kvlab's own code, however
it is reached, is never the learner's."""

import json
import pathlib

import kvlab.core.accounting
from kvlab.core.accounting import split_waste
from kvlab.core.contiguous import external_fragmentation, first_fit
from kvlab.core.errors import OutOfMemory
from kvlab.grading import Status, run_checks
from kvlab.grading.lab01 import random_day
from kvlab.grading.lab02 import random_floors
from kvlab.grading.report import NO_DIAGNOSIS, SAME_PROBLEM

ROOT = pathlib.Path(__file__).parents[2]


def failed(result) -> list[str]:
    return [o.name for o in result.outcomes if not o.passed]


def first_failure(result) -> str:
    return "\n".join(next(o for o in result.outcomes if not o.passed).details)


def folded(result) -> bool:
    """Every failure after the first says it is probably the same problem."""
    later = [o for o in result.outcomes if not o.passed][1:]
    return all(o.details[0].startswith(SAME_PROBLEM) for o in later)


# --- 01.waste_split --------------------------------------------------------------------------


def own_split(booked, tokens, final):
    """A learner's own split, written independently of kvlab's."""
    will_hold = booked if final is None else min(final, booked)
    future = max(0, will_hold - tokens)
    return tokens, future, booked - tokens - future


def test_handing_in_kvlab_itself_is_refused():
    result = run_checks("01.waste_split", split_waste)
    assert (
        result.status is Status.WRONG_KIND
        and "is kvlab's reference" in result.outcomes[0].details[0]
    )


def test_a_wrapper_around_kvlabs_split_is_not_the_learners():
    for wrapper in (
        lambda b, t, f: split_waste(b, t, f),  # the name imported at the top of this module
        lambda b, t, f: kvlab.core.accounting.split_waste(b, t, f),  # reached through the module
    ):
        result = run_checks("01.waste_split", wrapper)
        assert result.passed == 0
        assert (
            "hands the work to kvlab's `kvlab.core.accounting.split_waste`"
            in result.outcomes[0].details[0]
        )
        assert folded(result)
    assert split_waste(10, 2, 5) == (2, 3, 5)  # and the guard is gone again


def test_waste_split_checks():
    assert run_checks("01.waste_split", own_split).ok

    def no_cap(booked, tokens, final):  # forgets that future cannot exceed the booking
        future = (booked if final is None else final) - tokens
        return tokens, future, booked - tokens - future

    result = run_checks("01.waste_split", no_cap)
    assert failed(result) == [
        "a guest who would outgrow the booking only counts booked beds",
        "200 random bookings: the parts always add up to the booking",
    ]
    assert "hint:     future can never exceed the booking" in first_failure(result)
    assert folded(result)

    def no_unknown(booked, tokens, final):
        return own_split(booked, tokens, final or tokens)

    result = run_checks("01.waste_split", no_unknown)
    assert (
        failed(result)[0]
        == "unknown final length (None): every unused booked bed may still be used"
    )
    assert "count every unused booked bed as future" in first_failure(result)


def test_waste_split_type_problems_are_named_as_such():
    as_list = run_checks("01.waste_split", lambda b, t, f: list(own_split(b, t, f)))
    assert "return a tuple, not a list" in first_failure(as_list)
    floats = run_checks("01.waste_split", lambda b, t, f: tuple(map(float, own_split(b, t, f))))
    assert "used should be an int" in first_failure(floats)
    assert "use `//` or int(), not `/`" in first_failure(floats)
    pair = run_checks("01.waste_split", lambda b, t, f: own_split(b, t, f)[:2])
    assert "return exactly three numbers, not 2" in first_failure(pair)
    for result in (as_list, floats, pair):
        assert "final - tokens" not in first_failure(result)
        assert result.passed == 0 and folded(result)


def test_waste_split_slips_that_coincide_are_told_apart_by_a_probe():
    def swapped(booked, tokens, final):  # (used, internal, future)
        used, future, internal = own_split(booked, tokens, final)
        return used, internal, future

    result = run_checks("01.waste_split", swapped)
    assert "return the parts in the order (used, future, internal)" in first_failure(result)
    assert folded(result)  # "done" and "unknown" match other slips too: the probe settles it


def test_none_final_that_crashes_gets_a_hint():
    def crashes(booked, tokens, final):
        future = min(final, booked) - tokens
        return tokens, future, booked - tokens - future

    result = run_checks("01.waste_split", crashes)
    first = first_failure(result)
    assert "TypeError" in first and "future = min(final, booked) - tokens" in first
    assert "test `final is None` first" in first


def test_an_off_by_one_in_future_is_named_either_way_and_folds():
    for delta, named in ((-1, "future is one bed short"), (1, "future is one bed too many")):

        def off(booked, tokens, final, delta=delta):  # `will_hold - tokens - 1` (or + 1)
            will_hold = booked if final is None else min(final, booked)
            future = will_hold - tokens + delta
            return tokens, future, booked - tokens - future

        result = run_checks("01.waste_split", off)
        assert result.passed == 0
        first = first_failure(result)
        assert named in first and "min(final, booked) − tokens" in first, first
        assert folded(result)  # the -1 future of "done" too: no neutral note
        assert not any(NO_DIAGNOSIS in d for o in result.outcomes for d in o.details)


def test_a_negative_part_is_named():
    def internal_from_final(booked, tokens, final):  # forgets that final may exceed booked
        will_hold = booked if final is None else min(final, booked)
        return tokens, will_hold - tokens, booked - (final or booked)

    result = run_checks("01.waste_split", internal_from_final)
    assert failed(result) == [
        "a guest who would outgrow the booking only counts booked beds",
        "200 random bookings: the parts always add up to the booking",
    ]
    first = first_failure(result)
    assert "got:      tuple (200, 56, -44)" in first
    assert "a part is negative (internal)" in first and folded(result)


def test_unknown_split_mistake_gets_the_neutral_line():
    result = run_checks("01.waste_split", lambda b, t, f: (t, 1, b - t - 1))
    assert NO_DIAGNOSIS in first_failure(result)


# --- 01.max_length_cache ---------------------------------------------------------------------


class GoodCache:
    """A learner-style max-length cache, written independently of kvlab's."""

    def __init__(self, num_slots, max_seq_len):
        self.size, self.free, self.guests = max_seq_len, num_slots, {}

    def admit(self, request_id, prompt_len, output_len):
        if request_id in self.guests or prompt_len + output_len > self.size:
            raise ValueError(f"bad request {request_id!r}")
        if self.free == 0:
            raise OutOfMemory("full")
        self.free -= 1
        self.guests[request_id] = [prompt_len, prompt_len + output_len]

    def append(self, request_id):
        self.guests[request_id][0] += 1

    def release(self, request_id):
        del self.guests[request_id]
        self.free += 1

    def memory_report(self):
        used = sum(t for t, _ in self.guests.values())
        future = sum(f - t for t, f in self.guests.values())
        booked = self.size * len(self.guests)
        return {
            "used": used,
            "future": future,
            "internal": booked - used - future,
            "free": self.free * self.size,
        }


def test_max_length_cache_checks():
    assert run_checks("01.max_length_cache", GoodCache).ok

    class NoLimit(GoodCache):
        def admit(self, request_id, prompt_len, output_len):
            self.free += 1  # never runs out: admits more guests than there are suites
            super().admit(request_id, prompt_len, output_len)
            self.free -= 1 if self.free > 0 else 0

    result = run_checks("01.max_length_cache", NoLimit)
    assert (
        failed(result)[0]
        == "check-in: num_slots guests fit, the next is refused with a MemoryError"
    )
    assert "hint:     raise kvlab.core.errors.OutOfMemory (a MemoryError)" in first_failure(result)
    assert folded(result)

    class HalfAdmit(GoodCache):
        def admit(self, request_id, prompt_len, output_len):
            self.free -= 1  # takes the suite before validating: a refused call leaks a suite
            if prompt_len + output_len > self.size:
                raise ValueError("too long")
            self.free += 1
            super().admit(request_id, prompt_len, output_len)

    result = run_checks("01.max_length_cache", HalfAdmit)
    assert failed(result) == [
        "a refused check-in takes no suite",
        "refused calls leave the accounts unchanged",
    ]
    assert "check every reason to refuse before taking a suite" in first_failure(result)
    assert folded(result)

    class Tuple(GoodCache):
        def memory_report(self):
            return tuple(super().memory_report().values())

    result = run_checks("01.max_length_cache", Tuple)
    assert result.passed == 5  # every check that needs no report
    assert "must return a dict" in first_failure(result) and "not a sequence" in first_failure(
        result
    )
    assert folded(result)


def test_a_half_written_class_gets_credit_for_its_written_methods():
    class InitAndAdmit(GoodCache):
        def append(self, request_id):
            raise NotImplementedError

        def release(self, request_id):
            raise NotImplementedError

        def memory_report(self):
            raise NotImplementedError

    result = run_checks("01.max_length_cache", InitAndAdmit)
    assert result.status is Status.FAILED and result.passed == 3
    assert result.unwritten == ["release", "append", "memory_report"]
    report = " ".join(result.report().split())  # the report wraps long lines on words
    assert "(still to write: `release`, `append`, `memory_report`)" in report
    assert "needs `memory_report`, which is not written yet" in report


def test_max_length_cache_diagnoses():
    class FreeInSuites(GoodCache):
        def memory_report(self):
            report = super().memory_report()
            return {**report, "free": self.free}

    class Swapped(GoodCache):
        def memory_report(self):
            report = super().memory_report()
            return {**report, "future": report["internal"], "internal": report["future"]}

    class NoAppend(GoodCache):
        def append(self, request_id):
            self.guests[request_id]  # a KeyError for strangers, and nothing else

    class WrongError(GoodCache):
        def admit(self, request_id, prompt_len, output_len):
            if self.free == 0:
                raise IndexError("pop from empty list")
            super().admit(request_id, prompt_len, output_len)

    for cls, hint in (
        (FreeInSuites, "free is counted in beds: free suites × max_seq_len"),
        (Swapped, "future and internal are swapped"),
        (NoAppend, "append must add one token to the guest"),
        (WrongError, "when no suite is free, not IndexError"),
    ):
        result = run_checks("01.max_length_cache", cls)
        assert hint in first_failure(result), (cls.__name__, first_failure(result))
        assert folded(result), cls.__name__


class TakesASuiteFirst(GoodCache):
    """Takes a suite, then checks the request: every refused check-in keeps a suite."""

    def admit(self, request_id, prompt_len, output_len):
        if self.free == 0:
            raise OutOfMemory("full")
        self.free -= 1
        if request_id in self.guests or prompt_len + output_len > self.size:
            raise ValueError(f"bad request {request_id!r}")
        self.guests[request_id] = [prompt_len, prompt_len + output_len]


def test_a_refusal_that_keeps_a_suite_is_named_by_the_first_check_it_fails():
    """The refused duplicate check-in keeps a suite, so the stay over max_seq_len after it finds
    the hotel full: OutOfMemory instead of ValueError. The cause is named there, not the
    symptom, and the check built for it folds into that report."""
    result = run_checks("01.max_length_cache", TakesASuiteFirst)
    assert failed(result) == [
        "check-in refuses a guest already in the hotel and a stay over max_seq_len",
        "a refused check-in takes no suite",
        "refused calls leave the accounts unchanged",
    ]
    first = first_failure(result)
    assert "got:      OutOfMemory: 'full'" in first
    assert "hint:     a refused check-in kept the suite it took" in first
    assert "Check every reason to refuse before taking a suite" in first
    assert "not OutOfMemory" not in first
    assert folded(result)


def test_out_of_memory_for_a_stay_too_long_without_a_leak_keeps_its_hint():
    class TooLongIsFull(GoodCache):  # the wrong error for a stay over max_seq_len, no leak
        def admit(self, request_id, prompt_len, output_len):
            if prompt_len + output_len > self.size:
                raise OutOfMemory("does not fit")
            super().admit(request_id, prompt_len, output_len)

    first = first_failure(run_checks("01.max_length_cache", TooLongIsFull))
    assert (
        "hint:     raise ValueError when prompt_len + output_len > max_seq_len, not OutOfMemory"
        in first
    )
    assert "kept the suite" not in first


class FinalIsOutputLen(GoodCache):
    def admit(self, request_id, prompt_len, output_len):
        super().admit(request_id, prompt_len, output_len)
        self.guests[request_id][1] = output_len  # final = output_len: the prompt forgotten


def test_a_final_length_without_the_prompt_is_named_and_folds():
    result = run_checks("01.max_length_cache", FinalIsOutputLen)
    assert failed(result)[0] == "the accounts of one guest: a whole suite of max_seq_len beds"
    first = first_failure(result)
    assert "got:      dict {'used': 10, 'future': 10, 'internal': 44, 'free': 192}" in first
    assert "hint:     a guest will hold prompt_len + output_len tokens when done" in first
    assert result.passed == 5 and folded(result)


def test_a_report_that_only_looks_like_a_forgotten_prompt_gets_the_neutral_note():
    class TenFuture(GoodCache):  # future is always 10 a guest: 20 - 10 on the first check too
        def memory_report(self):
            report = super().memory_report()
            future = 10 * len(self.guests)
            return {
                **report,
                "future": future,
                "internal": self.size * len(self.guests) - report["used"] - future,
            }

    first = first_failure(run_checks("01.max_length_cache", TenFuture))
    assert "'future': 10" in first and NO_DIAGNOSIS in first
    assert "prompt_len + output_len tokens when done" not in first


def test_a_plain_memory_error_for_a_full_hotel_is_accepted():
    """The lab asks for kvlab.core.errors.OutOfMemory, "a MemoryError"; the check's title asks for a
    MemoryError, as Labs 03 and 07 accept any MemoryError for OutOfBlocks: a plain one passes."""

    class PlainMemoryError(GoodCache):
        def admit(self, request_id, prompt_len, output_len):
            if (
                self.free == 0
                and request_id not in self.guests
                and prompt_len + output_len <= self.size
            ):
                raise MemoryError("every suite is taken")
            super().admit(request_id, prompt_len, output_len)

    assert run_checks("01.max_length_cache", PlainMemoryError).ok
    prose = " ".join(cell("01_contiguous_cache.ipynb", "lab01-09").split())
    assert "`OutOfMemory` (from `kvlab.core.errors`, a `MemoryError`)" in prose


def test_an_error_in_a_call_that_should_work_shows_the_calls_with_it_marked():
    class StayOfMaxRefused(GoodCache):  # `>=` where `>` belongs: a full-length stay is refused
        def admit(self, request_id, prompt_len, output_len):
            if prompt_len + output_len >= self.size:
                raise ValueError("too long")
            super().admit(request_id, prompt_len, output_len)

    result = run_checks("01.max_length_cache", StayOfMaxRefused)
    first = first_failure(result)
    assert failed(result)[0].startswith("check-in: num_slots guests fit")
    assert (
        "input:    MaxLengthCache(2, 16); .admit('a', 3, 4); → .admit('b', 16, 0) raised ValueError"
        in first
    )
    assert "got:      ValueError: too long (at line" in first
    assert "a stay of exactly max_seq_len beds fits its suite" in first

    class AppendBreaks(GoodCache):
        def append(self, request_id):
            self.guests[request_id][2] += 1  # a slip of the index: a guest's record has 2 fields

    result = run_checks("01.max_length_cache", AppendBreaks)
    first = first_failure(result)
    assert "→ .append('a') raised IndexError" in first and NO_DIAGNOSIS in first
    assert failed(result) == [
        "append moves one bed from future to used",
        "a random day at the hotel: 126 calls in random order",
    ]
    assert folded(result)


def test_refused_calls_are_marked_in_the_transcript():
    class HalfAdmit(GoodCache):
        def admit(self, request_id, prompt_len, output_len):
            self.free -= 1  # takes the suite before validating
            if prompt_len + output_len > self.size:
                raise ValueError("too long")
            self.free += 1
            super().admit(request_id, prompt_len, output_len)

    first = first_failure(run_checks("01.max_length_cache", HalfAdmit))
    assert ".admit('b', 10, 7) raised ValueError; → .admit('b', 3, 4) raised OutOfMemory" in first
    assert "check every reason to refuse before taking a suite" in first


def test_memory_report_that_raises_shows_the_calls_before_it():
    class ReportBreaks(GoodCache):
        def memory_report(self):
            return {**super().memory_report(), "free": self.free * self.size / len(self.guests)}

    first = first_failure(run_checks("01.max_length_cache", ReportBreaks))
    assert "input:    MaxLengthCache(4, 64); → .memory_report() raised ZeroDivisionError" in first


def test_random_day_is_cut_and_says_how_to_replay_it():
    class Off(GoodCache):
        def memory_report(self):
            report = super().memory_report()
            return {**report, "used": report["used"] + (len(self.guests) > 2)}

    result = run_checks("01.max_length_cache", Off)
    assert failed(result) == ["a random day at the hotel: 126 calls in random order"]
    first = first_failure(result)
    assert "; …; " in first and NO_DIAGNOSIS in first
    assert "replay:   kvlab.grading.lab01.random_day(seed=5)[:7] lists all 7 calls" in first
    assert random_day(seed=5)[0] == ("admit", ("g6", 15, 24))


def test_a_cache_built_on_kvlabs_is_not_the_learners():
    from kvlab.core.contiguous import ContiguousKVCache

    class OnKvlab(ContiguousKVCache):
        def memory_report(self):
            usage = super().memory_report()
            return {p: getattr(usage, p) for p in ("used", "future", "internal", "free")}

    result = run_checks("01.max_length_cache", OnKvlab)
    assert result.passed == 0
    assert "hands the work to kvlab's `kvlab.core.contiguous.ContiguousKVCache" in first_failure(
        result
    )
    assert folded(result)


# --- 02.first_fit ----------------------------------------------------------------------------


def own_first_fit(extents, n):
    return next((offset for offset, length in extents if length >= n), None)


def test_first_fit_checks():
    assert run_checks("02.first_fit", own_first_fit).ok

    def largest(extents, n):
        fits = [(length, o) for o, length in extents if length >= n]
        return max(fits)[1] if fits else None

    result = run_checks("02.first_fit", largest)
    assert failed(result)[0] == "takes the FIRST extent that fits, not the biggest or the tightest"
    assert "that is the largest extent" in first_failure(result)

    def strict(extents, n):
        return next((o for o, length in extents if length > n), None)

    result = run_checks("02.first_fit", strict)
    assert failed(result)[0] == "an extent of exactly n beds fits"
    assert "compare with length >= n, not length > n" in first_failure(result)

    def pops(extents, n):
        offset = own_first_fit(extents, n)
        extents.clear()
        return offset

    result = run_checks("02.first_fit", pops)
    assert "changed its input `free_extents`" in result.outcomes[0].details[0]


def test_first_fit_diagnoses():
    def tightest(extents, n):
        fits = [(length, o) for o, length in extents if length >= n]
        return min(fits)[1] if fits else None

    for mistake, hint in (
        (tightest, "that is best fit"),
        (lambda e, n: next((i for i, (_, ln) in enumerate(e) if ln >= n), None), "not its index"),
        (
            lambda e, n: next(((o, ln) for o, ln in e if ln >= n), None),
            "not the whole (offset, length)",
        ),
        (lambda e, n: next((o for o, ln in e if ln >= n), -1), "return None (not -1)"),
        (lambda e, n: next((o for o, ln in e if ln >= n), False), "return None (not False)"),
    ):
        result = run_checks("02.first_fit", mistake)
        assert hint in first_failure(result), first_failure(result)
        assert folded(result)


def test_last_fit_is_named_and_not_taken_for_best_fit():
    """On the first check's floor best fit and last fit both take (200, 20); a probe floor where
    best fit, the largest extent (worst fit) and last fit all choose differently tells them apart."""

    def last_fit(free_extents, n):
        return next((o for o, length in reversed(free_extents) if length >= n), None)

    result = run_checks("02.first_fit", last_fit)
    assert failed(result) == [
        "takes the FIRST extent that fits, not the biggest or the tightest",
        "300 random floors",
    ]
    first = first_failure(result)
    assert "got:      200" in first and "hint:     that is last fit" in first
    text = "\n".join(d for o in result.outcomes for d in o.details)
    assert "best fit" not in text and folded(result)


def test_the_fit_probes_tell_the_placements_apart():
    from kvlab.core.contiguous import best_fit
    from kvlab.grading.lab02 import FIT_PROBES, FIT_SLIPS

    (floor, n), (small, m) = FIT_PROBES
    chosen = [first_fit(floor, n)] + [slip.answer(floor, n) for slip in FIT_SLIPS[:2]]
    chosen.append(next(s.answer for s in FIT_SLIPS if "last fit" in s.hint)(floor, n))
    assert chosen == [10, best_fit(floor, n), 100, 300] and len(set(chosen)) == 4
    strict = next(s.answer for s in FIT_SLIPS if "length > n" in s.hint)
    others = [first_fit(small, m)] + [
        s.answer(small, m) for s in FIT_SLIPS if "length > n" not in s.hint
    ]
    assert strict(small, m) not in others


def test_first_fit_random_floor_is_cut_and_replayable():
    def wrong_on_long_lists(extents, n):
        return own_first_fit(extents, n) if len(extents) < 7 else own_first_fit(extents[1:], n)

    result = run_checks("02.first_fit", wrong_on_long_lists)
    first = first_failure(result)
    assert "extents in all)]" in first
    index = int(first.split("random_floors(seed=2)[")[1].split("]")[0])
    assert len(random_floors(seed=2)[index][0]) >= 7


def test_kvlab_first_fit_behind_a_wrapper_is_not_the_learners():
    result = run_checks("02.first_fit", lambda extents, n: first_fit(extents, n))
    assert (
        result.passed == 0
        and "hands the work to kvlab's `kvlab.core.contiguous.first_fit`" in first_failure(result)
    )


# --- 02.external_fragmentation ---------------------------------------------------------------


def own_fragmentation(extents):
    total = sum(length for _, length in extents)
    return 1 - max(length for _, length in extents) / total if total else 0.0


def test_external_fragmentation_checks():
    assert run_checks("02.external_fragmentation", own_fragmentation).ok

    def divides_by_zero(extents):
        return 1 - max(n for _, n in extents) / sum(n for _, n in extents)

    result = run_checks("02.external_fragmentation", divides_by_zero)
    assert failed(result) == ["no free space at all: 0 (nothing is scattered)"]
    assert "return 0.0 before dividing" in first_failure(result)

    def smallest_over_total(extents):
        total = sum(n for _, n in extents)
        return 1 - min(n for _, n in extents) / total if total else 0.0

    result = run_checks("02.external_fragmentation", smallest_over_total)
    assert "300 random floors" in failed(result)
    assert "use the largest free extent, not the smallest" in first_failure(result)


def test_external_fragmentation_diagnoses():
    for mistake, hint in (
        (lambda e: 1 - own_fragmentation(e) if e else 0.0, "that is largest / total"),
        (lambda e: 100 * own_fragmentation(e), "not a percentage"),
        (lambda e: None, "returned None"),
        (lambda e: own_fragmentation(e) * 0.9, NO_DIAGNOSIS),
    ):
        result = run_checks("02.external_fragmentation", mistake)
        assert hint in first_failure(result), first_failure(result)
    result = run_checks("02.external_fragmentation", lambda e: external_fragmentation(e))
    assert (
        result.passed == 0
        and "kvlab's `kvlab.core.contiguous.external_fragmentation`" in first_failure(result)
    )


def test_one_minus_one_over_the_count_is_named_and_not_taken_for_largest_over_total():
    """Both are 2/3 on the check's [(0, 10), (20, 5), (40, 30)]; the probe floor tells them
    apart (0.75 against 0.4)."""

    def by_count(free_extents):
        return 1 - 1 / len(free_extents) if free_extents else 0.0

    result = run_checks("02.external_fragmentation", by_count)
    assert failed(result) == ["the largest piece last: 1 - 30 / 45", "300 random floors"]
    first = first_failure(result)
    assert "hint:     that is 1 - 1 / (number of extents)" in first
    assert "the share in one piece" not in first and folded(result)


def test_a_value_that_two_slips_explain_but_the_probe_neither_gets_the_neutral_note():
    def two_thirds_on_three(free_extents):  # 2/3 for three extents, else right
        return 2 / 3 if len(free_extents) == 3 else own_fragmentation(free_extents)

    first = first_failure(run_checks("02.external_fragmentation", two_thirds_on_three))
    assert "got:      0.666666" in first and NO_DIAGNOSIS in first


def test_the_fragmentation_probe_gives_every_slip_its_own_value():
    from kvlab.grading.lab02 import FRAG_PROBES, FRAG_SLIPS

    ((floor,),) = FRAG_PROBES
    values = [round(a(floor), 9) for a in (external_fragmentation, *(s.answer for s in FRAG_SLIPS))]
    assert len(set(values)) == len(values), values


def test_nothing_free_is_nothing_scattered_zero_either_way():
    """The empty free list: 0 (the check's title), 0.0 (the prose's advice) or int 0 both pass;
    any other number is told what the lab defines, as the prose says."""
    assert run_checks("02.external_fragmentation", lambda e: own_fragmentation(e) if e else 0).ok
    for empty in (1.0, float("nan")):
        result = run_checks(
            "02.external_fragmentation", lambda e, v=empty: own_fragmentation(e) if e else v
        )
        assert failed(result) == ["no free space at all: 0 (nothing is scattered)"]
        assert "nothing is free here, so nothing is scattered: return 0.0" in first_failure(result)
    prose = cell("02_external_fragmentation.ipynb", "lab02-07")
    assert "When nothing is free, nothing is scattered either: it is 0" in " ".join(prose.split())
    assert "return `0.0` when nothing is free" in prose


# --- the notebooks' words agree with what they print and show ---------------------------------


def cell(notebook: str, cell_id: str) -> str:
    cells = json.loads((ROOT / "solutions" / notebook).read_text())["cells"]
    return next("".join(c["source"]) for c in cells if c["id"] == cell_id)


def test_lab01_promises_a_comparison_with_the_paper_not_its_figures():
    objective = cell("01_contiguous_cache.ipynb", "lab01-00")
    assert "reproduce" not in objective
    assert all(f in objective for f in ("**20.4%**", "**26.8%**", "**38.2%**", "explain"))


def test_lab01_quotes_sharegpts_means_as_the_papers_and_prints_the_traces_own():
    from kvlab.serving.workload import load_trace, mean_lengths

    prose = cell("01_contiguous_cache.ipynb", "lab01-12")
    assert "the paper reports means of about 161 prompt and 338 answer tokens" in prose
    assert "its own means are printed below" in prose
    prompt, output = mean_lengths(load_trace("sharegpt_like"))
    assert (round(prompt), round(output)) != (161, 338)  # why the prose must not claim them
    assert "mean_lengths(day)" in cell("01_contiguous_cache.ipynb", "lab01-13")


def test_usage_plots_keep_their_legend_off_the_bands(monkeypatch):
    """Lab 01's and Lab 03's usage-over-time plots: the legend sits below the axes, where it
    cannot cover the free region that opens at the end of the day."""
    import matplotlib.pyplot as plt

    from kvlab.serving import replay as replay_module

    class Quick:  # the plot needs only the result; a short day keeps the test fast
        def __init__(self, real):
            self.real = real

        def __call__(self, hotel, day, **kwargs):
            return self.real(hotel, day[:40], **kwargs)

    for notebook, cell_id, setup in (
        ("01_contiguous_cache.ipynb", "lab01-13", "lab01-01"),
        ("03_paged_allocator.ipynb", "lab03-11", "lab03-01"),
    ):
        namespace = {}
        exec(cell(notebook, setup), namespace)
        namespace["replay"] = Quick(replay_module.replay)
        source = cell(notebook, cell_id).split("\n\nfor part in")[0]  # the plot, not the table
        exec(source, namespace)
        ax = namespace["ax"]
        ax.figure.canvas.draw()
        legend = ax.get_legend().get_window_extent()
        assert legend.y1 <= ax.get_window_extent().y0, notebook
        plt.close("all")


def test_lab02_player_opens_on_the_first_impossible_allocation():
    from kvlab.ui.widgets.frames import frame_at

    namespace = {}
    for cell_id in ("lab02-01", "lab02-11"):
        exec(cell("02_external_fragmentation.ipynb", cell_id), namespace)
    exec("first = refused[0]", namespace)  # as lab02-13 picks it
    *body, last = cell("02_external_fragmentation.ipynb", "lab02-15").strip().splitlines()
    exec("\n".join(body), namespace)
    player = eval(last, namespace)
    hotel = player.hotels[0]
    assert hotel.step == player.slider.value > 1
    assert hotel.data["frames"][frame_at(hotel.data, hotel.step)]["event"] == (
        "impossible allocation"
    )
    earlier = [hotel.data["frames"][frame_at(hotel.data, s)]["event"] for s in range(1, hotel.step)]
    assert "impossible allocation" not in earlier


def test_lab02_prose_names_the_free_space_one_way():
    cells = json.loads((ROOT / "solutions" / "02_external_fragmentation.ipynb").read_text())
    prose = "\n".join("".join(c["source"]) for c in cells["cells"] if c["cell_type"] == "markdown")
    assert "largest gap" not in prose and "free extent" in prose
    assert "free run" not in prose  # the pictures say "largest free extent" too


def test_the_first_extent_is_not_mistaken_for_the_smallest():
    """Where the first extent is also the smallest, two slips give the same answer: no hint then;
    another floor tells them apart."""

    def frag(free_extents):
        total = sum(length for _, length in free_extents)
        return 0.0 if total == 0 else 1 - free_extents[0][1] / total

    result = run_checks("02.external_fragmentation", frag)
    text = "\n".join(d for o in result.outcomes for d in o.details)
    assert "not the smallest" not in text and "not the first one" in text


def test_raising_where_nothing_fits_is_told_to_return_none():
    def raises(free_extents, n):
        for offset, length in free_extents:
            if length >= n:
                return offset
        raise ValueError("no room")

    failure = first_failure(run_checks("02.first_fit", raises))
    assert "ValueError: no room" in failure and "expected: None" in failure
    assert "when no extent fits, return None" in failure and "input:" in failure
