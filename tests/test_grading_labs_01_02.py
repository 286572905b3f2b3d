"""Labs 01–02 checks: the reference passes; plausible mistakes fail the check that targets them."""

from kvlab.contiguous import external_fragmentation, first_fit
from kvlab.errors import OutOfMemory
from kvlab.grading import run_checks
from kvlab.trace import split_waste


def failed(result) -> list[str]:
    return [o.name for o in result.outcomes if not o.passed]


def mine(reference):
    """kvlab's reference behind a learner's own function (kvlab's objects are refused as such)."""
    return lambda *args: reference(*args)


def test_handing_in_kvlab_itself_is_refused():
    result = run_checks("01.waste_split", split_waste)
    assert result.status == "wrong kind" and "is kvlab's reference" in result.outcomes[0].details[0]


def test_waste_split_checks():
    assert run_checks("01.waste_split", mine(split_waste)).ok

    def no_cap(booked, tokens, final):  # forgets that future cannot exceed the booking
        future = (booked if final is None else final) - tokens
        return tokens, future, booked - tokens - future

    assert failed(run_checks("01.waste_split", no_cap)) == [
        "a guest who would outgrow the booking only counts booked beds",
        "200 random bookings: the parts always add up to the booking",
    ]

    def no_unknown(booked, tokens, final):
        return split_waste(booked, tokens, final or tokens)

    assert "unknown final length (None): every unused booked bed may still be used" in failed(
        run_checks("01.waste_split", no_unknown)
    )


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

    assert "a full hotel refuses with a MemoryError and changes nothing" in failed(
        run_checks("01.max_length_cache", NoLimit)
    )

    class HalfAdmit(GoodCache):
        def admit(self, request_id, prompt_len, output_len):
            self.free -= 1  # takes the suite before validating: a refused call leaks a suite
            if prompt_len + output_len > self.size:
                raise ValueError("too long")
            self.free += 1
            super().admit(request_id, prompt_len, output_len)

    assert "bad input is refused with a clear error and changes nothing" in failed(
        run_checks("01.max_length_cache", HalfAdmit)
    )

    class Tuple(GoodCache):
        def memory_report(self):
            return tuple(super().memory_report().values())

    result = run_checks("01.max_length_cache", Tuple)
    assert result.passed == 0 and "must return a dict" in result.outcomes[0].details[0]


def test_first_fit_checks():
    assert run_checks("02.first_fit", mine(first_fit)).ok

    def largest(extents, n):
        fits = [(length, o) for o, length in extents if length >= n]
        return max(fits)[1] if fits else None

    assert failed(run_checks("02.first_fit", largest))[0] == (
        "takes the FIRST extent that fits, not the biggest or the tightest"
    )

    def strict(extents, n):
        return next((o for o, length in extents if length > n), None)

    assert "an extent of exactly n beds fits" in failed(run_checks("02.first_fit", strict))

    def pops(extents, n):
        offset = first_fit(extents, n)
        extents.clear()
        return offset

    result = run_checks("02.first_fit", pops)
    assert (
        result.passed == 0 and "changed its input `free_extents`" in result.outcomes[0].details[0]
    )


def test_external_fragmentation_checks():
    assert run_checks("02.external_fragmentation", mine(external_fragmentation)).ok

    def divides_by_zero(extents):
        return 1 - max(n for _, n in extents) / sum(n for _, n in extents)

    assert failed(run_checks("02.external_fragmentation", divides_by_zero)) == [
        "no free space at all: 0 (nothing is scattered)"
    ]

    def smallest_over_total(extents):
        total = sum(n for _, n in extents)
        return 1 - min(n for _, n in extents) / total if total else 0.0

    assert "300 random floors" in failed(
        run_checks("02.external_fragmentation", smallest_over_total)
    )
