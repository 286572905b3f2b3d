"""What the checks of a scheduler (Lab 06's, Lab 09's) read of it and how a report shows it:
guests by seq_id, queues as lists of them, a cache by the guests whose rooms differ; the
state-diff tables of a guest and of a step."""

from __future__ import annotations

from collections import deque

from kvlab.core.block_manager import PagedCache
from kvlab.core.contiguous import ContiguousKVCache
from kvlab.grading.expect import listed, plural, short
from kvlab.grading.state_diff import Field, each
from kvlab.serving.scheduler import Scheduler, Sequence, SequenceStatus


class Odd:
    """Something that should have been a Sequence or a list of them: shown as it is, equal to
    nothing the reference gives."""

    def __init__(self, value, what: str):
        self.value, self.what = value, what

    def __repr__(self):
        return f"{short(self.value, 60)} ({self.what})"


def ids(items) -> list | Odd:
    """seq_ids of a list of sequences; anything else stays visible as odd."""
    if not isinstance(items, list | tuple | deque):
        return Odd(items, "not a list")
    return [s.seq_id if isinstance(s, Sequence) else Odd(s, "not a Sequence") for s in items]


def one(item):
    if item is None:
        return None
    return item.seq_id if isinstance(item, Sequence) else Odd(item, "not a Sequence")


def show(value) -> str:
    """A list of seq_ids as ``[ann, ben]``, a guest by name, nobody as ``nobody``."""
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    return "nobody" if value is None else str(value)


def free_text(cache) -> str:
    if isinstance(cache, PagedCache):
        manager = cache.manager
        return f"{manager.num_free_blocks} of {plural(manager.num_blocks, 'room')} free"
    return f"{cache.capacity - cache.allocated_tokens} of {plural(cache.capacity, 'bed')} free"


def cache_text(cache) -> str:
    if isinstance(cache, PagedCache):
        m = cache.manager
        return f"PagedCache({plural(m.num_blocks, 'room')} of {m.block_size} beds)"
    if isinstance(cache, ContiguousKVCache):
        booking = {"max": "max_seq_len", "pow2": "a power of two", "oracle": "the final length"}
        booking["exact"] = booking["oracle"]  # the oracle's policy by its old name
        return (
            f"ContiguousKVCache({plural(cache.capacity, 'bed')}, each guest booking "
            f"{booking[cache.policy]} up front)"
        )
    return type(cache).__name__


def guest_text(seq: Sequence) -> str:
    held = f"{seq.num_tokens} tokens"
    back = ", back after a preemption" if seq.num_preemptions else ""
    return f"{seq.seq_id} (arrived {seq.arrival:.3g}, {held}{back})"


def state_text(s: Scheduler, limit: int = 6) -> str:
    """Who is running (in check-in order) and waiting, and what is free."""

    running = listed(s.running, limit, guest_text) or "nobody"
    waiting = (
        listed(s.waiting, limit, lambda q: f"{q.seq_id} (arrives {q.arrival:.3g})") or "nobody"
    )
    return f"running, in check-in order: {running}; waiting: {waiting}; {free_text(s.cache)}"


def scheduler_text(s: Scheduler) -> str:
    return f"{cache_text(s.cache)}, preemption={s.preemption!r}; {state_text(s)}"


def cache_diff(expected, got) -> tuple[str, str]:
    """Two cache states, shown by the guests whose rooms (or beds) differ."""

    def guest(state, g):
        if g not in state.tokens:
            return f"{g}: checked out"
        table = list(state.block_tables[g])
        if state.kind == "paged":
            return f"{g}: {state.tokens[g]} tokens in rooms {table}"
        return f"{g}: {state.tokens[g]} tokens in beds {table[0]}…{table[-1]}"

    guests = dict.fromkeys([*expected.tokens, *got.tokens])
    differ = [
        g
        for g in guests
        if expected.tokens.get(g) != got.tokens.get(g)
        or list(expected.block_tables.get(g, ())) != list(got.block_tables.get(g, ()))
    ] or list(guests)
    return "; ".join(guest(expected, g) for g in differ), "; ".join(guest(got, g) for g in differ)


def field_text(value) -> str:
    return f"SequenceStatus.{value.name}" if isinstance(value, SequenceStatus) else short(value)


def guests_diff(expected: dict, got: dict) -> tuple[str, str]:
    """A field of every guest (seq_id -> value), shown for the guests where it differs."""
    differ = [g for g in expected if expected[g] != got.get(g)]

    def text(d):
        return ", ".join(
            f"{g}: {field_text(d.get(g)).replace('SequenceStatus.', '')}" for g in differ
        )

    return text(expected), text(got)


# --- the tables ------------------------------------------------------------------------------


def _guest(name: str, **options) -> Field:
    return Field(name, lambda seq: getattr(seq, name), show=each(field_text), **options)


# one guest, as a preempt must leave it (the guest who left, and everybody else)
GUEST = tuple(
    _guest(name)
    for name in ("status", "num_generated", "num_computed", "prompt_len", "output_len", "arrival")
)


def _every_guest(name: str) -> Field:
    return Field(
        name,
        lambda out, s, guests: {q.seq_id: getattr(q, name) for q in guests},
        show=guests_diff,
    )


def _refusal(out, s, guests):
    refusal = getattr(out, "refusal", None)
    return None if refusal is None else type(refusal).__name__


def _listed(name: str) -> Field:
    return Field(f"out.{name}", lambda out, s, guests: ids(getattr(out, name)), show=each(show))


# what a step did, in the order a difference is reported: its report, then the state
STEP = (
    _listed("finished"),
    _listed("admitted"),
    Field("out.refused", lambda out, s, guests: one(out.refused), show=each(show)),
    Field("out.refusal", _refusal, show=each(show)),
    _listed("preempted"),
    _listed("scheduled"),
    Field("scheduler.running", lambda out, s, guests: ids(s.running), show=each(show)),
    Field("scheduler.waiting", lambda out, s, guests: ids(s.waiting), show=each(show)),
    _every_guest("status"),
    _every_guest("num_generated"),
    _every_guest("num_computed"),
    Field("the cache", lambda out, s, guests: s.cache.state(), show=cache_diff),
    Field("scheduler.num_preemptions", lambda out, s, g: s.num_preemptions, show=each(show)),
)
REPORT_KEYS = tuple(f.name for f in STEP[:6])  # the report's fields, the first of STEP
