"""A learner's block manager judged by its key cards (Lab 03's, and Lab 07's with shared rooms).

:class:`KeyCardJudge` makes calls on the learner's manager and the same calls on kvlab's
``BlockManager``, and checks kvlab's invariants after each one, never kvlab's room numbers: every
key card holds ceil(tokens / block_size) rooms for the tokens kvlab's manager counts, room numbers
are ints in range(num_blocks), the token counts are kvlab's, and free rooms plus held rooms make
num_blocks, and two entries hold one room exactly where kvlab's do: in Lab 03 never, in Lab 07
(reference counts) where a fork shared it and nobody has written since; the lab checks the rest
of what sharing means (:meth:`KeyCardJudge.check_sharing`). A key card that ``allocate`` (or
``fork``) returns is the caller's: changing it must leave the manager as it was
(:meth:`KeyCardJudge.unaliased`). :func:`two_guests_grow` is a scenario both labs check, and
:func:`evening` drives a judge through a random evening that a learner can replay with every call
printed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import numbers
import random

from kvlab.core.block_manager import BlockManager
from kvlab.grading.blame import explain_exception
from kvlab.grading.class_driver import ClassDriver
from kvlab.grading.expect import CheckFailed, plural, short
from kvlab.grading.report import failure_details
from kvlab.grading.slips import quietly
from kvlab.grading.state_diff import Field, changes, moved, read

NOT_COUNTED = "append_slot does not count the new token: add one to the guest's num_tokens"

# a key card returned by allocate (or fork) that is the manager's own list
ALIASED = (
    "return a copy of the key card (`return list(table)`): the caller owns the list it gets and "
    "may change it, and the manager's own key card must not change with it"
)
SCRIBBLE = -1  # what a caller puts on a returned key card, to see whether the manager sees it

# a refused call that changed something did it too early: the hint by what alone changed
COUNTED_EARLY = (
    "the token count moved although no room was free: raise OutOfBlocks before counting the new "
    "token (count it last, once its bed is sure)"
)
VALIDATE_FIRST = "validate the arguments before changing anything"
# the free list ran out (IndexError from pop), or rooms were taken, before refusing
POPPED_EMPTY = (
    "the free list ran out while taking rooms (IndexError from pop): count the free rooms first "
    "and raise OutOfBlocks before taking any"
)
TAKEN_EARLY = "count the free rooms first, then take them: raise OutOfBlocks before taking any"

# a call with an id nobody checked in with: why it must be refused, and the fix when it is not
UNKNOWN_ID = {
    "why": "'nobody' never checked in",
    "missing": "an unknown id raises KeyError (reading block_tables[seq_id] does)",
}


def rooms_for(tokens: int, block_size: int) -> int:
    """ceil(tokens / block_size): the rooms a guest holding ``tokens`` tokens needs."""
    return -(-tokens // block_size)


def room_number(value) -> bool:
    """Whether ``value`` can be a room number: an int (numpy's too), never a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def card_text(table, limit: int = 60) -> str:
    """A key card (or a prompt's tokens) as the list of its numbers, cut after one when long."""
    text = str(table)
    if len(text) <= limit:
        return text
    head, comma, _ = text[: limit - 2].rpartition(",")
    return f"{head}, …]" if comma and isinstance(table, list) else short(table, limit)


def _scribble(card):
    """Change a returned key card as a caller might: a room added at its end (or, for a card
    without ``append``, its first entry replaced). ``(the change made, a function undoing it)``,
    or None when ``card`` cannot be changed (a tuple: it aliases nothing)."""
    try:
        card.append(SCRIBBLE)
        return f"card.append({SCRIBBLE})", card.pop
    except Exception:
        pass
    try:
        first = card[0]
        card[0] = SCRIBBLE
        return f"card[0] = {SCRIBBLE}", lambda: card.__setitem__(0, first)
    except Exception:
        return None


# what the learner's manager holds (read by a judge), as a refused call must leave it
MANAGER = (
    Field(
        "key cards", lambda judge: judge.tables(), entries=True, entry=lambda s: f"{s!r}'s key card"
    ),
    Field("free rooms", lambda judge: judge.obj.num_free_blocks),
    Field(
        "num_tokens",
        lambda judge: judge.counts(),
        entries=True,
        entry=lambda s: f"num_tokens({s!r})",
    ),
)


class KeyCardJudge(ClassDriver):
    """The learner's manager ``cls(num_blocks, block_size)`` beside kvlab's (see the module's
    docstring), checked once built and after every call. Each lab says which usual slip a wrong
    count of rooms (:meth:`rooms_slip`) or of free rooms (:meth:`count_slip`) shows."""

    fields = MANAGER  # what a refused call must leave as it was
    shown = 8  # calls shown in a transcript before it is cut
    runs = True
    # a refusal's hints: the free list ran out, rooms taken, one field changed alone before it
    pop_empty, taken_early = POPPED_EMPTY, TAKEN_EARLY
    changed_early = {("num_tokens",): COUNTED_EARLY}
    refused_message = "a refused call must change nothing"

    def __init__(self, cls, num_blocks: int, block_size: int, echo: bool = False):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.appended = False  # append_slot was called: its slips may explain a miscount
        reference = BlockManager(num_blocks, block_size)
        super().__init__(cls, num_blocks, block_size, reference=reference, echo=echo)
        self.check()

    def can_append(self, seq) -> bool:
        """Whether kvlab's manager has a bed for one more token of ``seq``."""
        ref = self.reference
        return ref.num_tokens(seq) % self.block_size != 0 or ref.num_free_blocks > 0

    def refused_append(self, seq, why: str) -> None:
        """``append_slot`` must raise OutOfBlocks (a MemoryError) and change nothing."""
        self.refused(MemoryError, "append_slot", seq, why=why)

    def refused_unknown(self, method: str) -> None:
        """``method`` for a guest who never checked in: KeyError, nothing changed."""
        self.refused(KeyError, method, "nobody", **UNKNOWN_ID)

    # --- what the learner's manager holds ----------------------------------------------------
    def tables(self) -> dict:
        return {s: list(self.obj.block_table(s)) for s in self.reference.seq_ids}

    def others(self, seq) -> dict:
        """Every key card but ``seq``'s (a call for ``seq`` leaves them as they are)."""
        return {s: t for s, t in self.tables().items() if s != seq}

    def others_kept(self, method: str, before: dict, now: dict, hint: str | None = None) -> None:
        """A call of ``method`` left the other guests' key cards (``before`` it) as they were."""
        if now != before:
            changed = [s for s in before if now.get(s) != before[s]]
            self.fail(
                f"{method} changed another guest's key card",
                hint,
                expected=", ".join(f"{s!r}: {card_text(before[s])}" for s in changed),
                got=", ".join(f"{s!r}: {card_text(now.get(s))}" for s in changed),
            )

    def counts(self) -> dict:
        return {s: self.obj.num_tokens(s) for s in self.reference.seq_ids}

    def state(self) -> dict:
        return read(self.fields, self)

    # --- the invariants ----------------------------------------------------------------------
    def check(self, method: str | None = None, free_before: int | None = None, rooms: int = 0):
        """kvlab's invariants after ``method``, which took ``rooms`` rooms off the free list (or
        gave them back, for free)."""
        seen: dict = {}  # (0, kvlab's room) or (1, the learner's) -> (the other's, seq, entry)
        tables = {}
        for seq in self.reference.seq_ids:
            tokens = self.reference.num_tokens(seq)
            table = list(self.obj.block_table(seq))
            need = rooms_for(tokens, self.block_size)
            if len(table) != need:
                self.fail(
                    f"{seq!r} holds {plural(tokens, 'token')}, so its key card needs "
                    f"ceil({tokens} / {self.block_size}) = {plural(need, 'room')}",
                    expected=plural(need, "room"),
                    got=f"{plural(len(table), 'room')}: {short(table)}",
                    hint=self.rooms_slip(),
                )
            for block in table:
                if not room_number(block) or not 0 <= block < self.num_blocks:
                    self.fail(
                        "room numbers must be ints in range(num_blocks)",
                        expected=f"ints in 0…{self.num_blocks - 1}",
                        got=short(table),
                    )
            self._rooms_as_kvlabs(seen, seq, table)
            got_tokens = self.obj.num_tokens(seq)
            if got_tokens != tokens:
                counted = method == "append_slot" and got_tokens == tokens - 1
                self.fail(
                    f"num_tokens({seq!r}) should be {tokens}",
                    expected=str(tokens),
                    got=short(got_tokens),
                    hint=NOT_COUNTED if counted else None,
                )
            tables[seq] = table
        self.check_sharing(tables)
        held = {b for t in tables.values() for b in t}
        free = self.obj.num_free_blocks
        if free != self.num_blocks - len(held):
            self.fail(
                "free rooms + rooms on key cards must make num_blocks",
                expected=str(self.num_blocks),
                got=f"{free} free + {len(held)} held = {free + len(held)}",
                hint=self.count_slip(method, free_before, free, rooms),
            )

    def _rooms_as_kvlabs(self, seen: dict, seq, table: list) -> None:
        """Two entries hold one room exactly where kvlab's two entries do (in Lab 03, never)."""
        for entry, rooms in enumerate(zip(self.reference.block_table(seq), table, strict=True)):
            for side, (room, other) in enumerate((rooms, rooms[::-1])):
                was, at_seq, at = seen.setdefault((side, room), (other, seq, entry))
                if was == other:
                    continue
                if side == 0:
                    self.fail(
                        f"{at_seq!r} (entry {at}) and {seq!r} (entry {entry}) should still "
                        "share a room: nobody has written into it since it was shared",
                        expected="one room on both key cards",
                        got=f"rooms {was} and {other}",
                    )
                where = f"entry {at} of {at_seq!r}'s key card and entry {entry} of {seq!r}'s"
                where = f"twice on {seq!r}'s key card" if at_seq == seq else where
                self.fail(f"room {room} is {where}", expected="two rooms", got=f"one: {room}")

    # --- refusals (ClassDriver.refused: raise the error, change nothing) ----------------------
    def not_refused(self, error, errors, why: str, missing: str | None = None, **context):
        """``why`` the call must be refused; ``missing`` is the hint when it raises nothing (a
        check the learner's code does not make), unless a refusal out of rooms shows a slip
        (:meth:`unrefused_slip`)."""
        name = "OutOfBlocks (a MemoryError)" if errors is MemoryError else errors.__name__
        if error is None:
            if errors is MemoryError:
                missing = self.unrefused_slip(missing, **context)
            self.fail(why, expected=name, got="no error", hint=missing)
        hint = f"raise {name.split()[0]} here"
        if isinstance(error, IndexError) and errors is MemoryError:
            hint = self.pop_empty
        self.fail(why, expected=name, got=explain_exception(error)[0], hint=hint)

    def changed(self, before: dict, after: dict, errors) -> None:
        hint = self.changed_early.get(tuple(moved(before, after)))
        if errors is not MemoryError:
            hint = VALIDATE_FIRST
        elif after["free rooms"] < before["free rooms"]:
            hint = self.taken_early
        self.fail(
            self.refused_message,
            got="changed " + (", ".join(changes(self.fields, before, after)) or "the hotel"),
            hint=hint,
        )

    # --- what each lab says ------------------------------------------------------------------
    def unrefused_slip(self, missing: str | None, **context) -> str | None:
        """The hint for a call out of rooms that was not refused."""
        return self.rooms_slip() or missing

    def rooms_slip(self) -> str | None:
        """The hint for a key card with the wrong number of rooms (None: not recognised)."""
        return None

    def count_slip(self, method, before, after, rooms) -> str | None:
        """The hint for free rooms that went from ``before`` to ``after`` in ``method``, which
        should have moved ``rooms`` rooms (None: not recognised)."""
        return None

    def check_sharing(self, tables: dict) -> None:
        """With shared rooms: the lab's own checks of them, as Lab 07's ref counts (``tables``:
        each guest's key card, already checked on its own and beside kvlab's)."""

    def unaliased(self, method: str, seq, value) -> None:
        """A key card that ``method`` returned for ``seq`` is the caller's own: changing it
        leaves the manager as it was (its key cards, free rooms, token counts). Only a value
        that shows the key card is tried (a wrong value is the lab's to judge)."""
        card = list(self.obj.block_table(seq))
        if isinstance(value, (str, bytes)) or not quietly(lambda: list(value) == card):
            return
        before = self.state()
        scribbled = _scribble(value)
        if scribbled is None:
            return
        change, undo = scribbled
        after = self.state()
        if after == before:
            quietly(undo)  # a copy: the value goes back to the lab's checks as it came
            return
        self.transcript.add(f"{change}, on the key card that .{method} returned")
        cards, after_cards = before["key cards"], after["key cards"]
        changed = [
            f"the key card of {s!r}: {card_text(cards[s])} → {card_text(after_cards.get(s))}"
            for s in cards
            if after_cards.get(s) != cards[s]
        ]
        if after["free rooms"] != before["free rooms"]:
            changed.append(f"free rooms {before['free rooms']} → {after['free rooms']}")
        self.fail(
            f"the key card {method} returned is the manager's own list: changing it changed "
            "the manager",
            expected="the manager unchanged",
            got=", ".join(changed) or "the manager changed",
            hint=ALIASED,
        )

    # --- calls -------------------------------------------------------------------------------
    def allocate(self, seq, n: int):
        """``allocate(seq, n)`` on both managers, then the invariants; what the learner's
        returned (a key card the caller may change without changing the manager)."""
        before = self.obj.num_free_blocks
        table = self.twin("allocate", seq, n)
        self.check("allocate", before, rooms_for(n, self.block_size))
        self.unaliased("allocate", seq, table)
        return table

    def free(self, seq) -> None:
        """``free(seq)`` on both managers, then the invariants (the rooms it held may go back)."""
        before = self.obj.num_free_blocks
        rooms = len(self.tables()[seq])
        self.twin("free", seq)
        self.check("free", before, rooms)


def play(judge, *steps) -> None:
    """Make ``steps`` on ``judge`` in order: a check written as data. Each step is
    "method arg ..." (digits read as ints) or, where an argument has spaces or is no string, a
    tuple ``(method, *args)``, its last item a dict of keywords if it has any."""
    for step in steps:
        method, *args = step.split() if isinstance(step, str) else step
        kwargs = args.pop() if args and isinstance(args[-1], dict) else {}
        args = [int(a) if isinstance(a, str) and a.isdigit() else a for a in args]
        getattr(judge, method)(*args, **kwargs)


def two_guests_grow(judge_type, cls) -> None:
    """``judge_type(cls, 16, 4)``: a guest with an empty bed ('a', 3 tokens) and one with a full
    room ('b', 4) each grow by six tokens, one ``append`` at a time."""
    judge = judge_type(cls, 16, 4)
    judge.allocate("a", 3)
    judge.allocate("b", 4)
    for seq in ("a", "b"):
        for _ in range(6):
            judge.append(seq)


def print_failure(failure: CheckFailed) -> None:
    """A failure's report as an echoed run prints it: without the input and replay lines, since
    the calls printed above are the input."""
    shown = [d for d in failure_details(failure) if not d.startswith(("input:", "replay:"))]
    print("\n".join(shown))


@contextlib.contextmanager
def echoed(echo: bool):
    """A run a learner replays in a cell: with ``echo`` a failure's report is printed, below the
    calls printed as they were made, instead of raised."""
    try:
        yield
    except CheckFailed as failure:
        if not echo:
            raise
        print_failure(failure)


def _evening_replay(run: str, cls, seed: int, steps: int, calls: int) -> str:
    module, name = run.rsplit(".", 1)
    return (
        f"random.Random({seed}), step {steps}: `from {module} import {name}; "
        f"{name}({cls.__name__}, steps={steps})` prints every call"
    )


@dataclasses.dataclass(frozen=True)
class Odds:
    """What a step of a random evening does, by a roll in [0, 1): below ``check_in`` a guest of
    1 to ``most`` tokens checks in (always, while nobody is in), below ``fork`` a guest is forked
    (while fewer than 10 are in), below ``token`` a guest gets a token (refused when no room is
    free), and above, a guest checks out."""

    check_in: float
    most: int
    token: float
    fork: float = 0.0  # no forks


def evening_step(judge, rng, step: int, odds: Odds) -> None:
    """One step of a random evening on ``judge``, drawn from ``rng`` by ``odds``."""
    guests, roll = judge.reference, rng.random()
    seqs, free_beds = sorted(guests.seq_ids), guests.num_free_blocks * judge.block_size
    if (roll < odds.check_in or not seqs) and free_beds:
        judge.allocate(f"g{step}", rng.randint(1, min(free_beds, odds.most)))
    elif roll < odds.fork and seqs and len(seqs) < 10:
        judge.fork(rng.choice(seqs), f"g{step}")
    elif roll < odds.token and seqs:
        seq = rng.choice(seqs)
        if judge.can_append(seq):
            judge.append(seq)
        else:
            judge.refused_append(seq, f"{seq!r} needs a room and none is free")
    elif seqs:
        judge.free(rng.choice(seqs))


def evening(judge_type, cls, odds: Odds, *, run: str, steps: int, seed: int, echo: bool):
    """A random evening on ``cls``: ``judge_type(cls, 24, 3)`` (24 rooms of 3 beds), then
    ``steps`` steps drawn by ``odds`` from ``random.Random(seed)`` (:func:`evening_step`). A
    failure's replay names ``run``, the lab's function that runs this evening (by the path a
    learner imports it from), to see every call. With ``echo`` every call is printed and a
    failure's report too, instead of raising. Returns the judge, or None when ``cls`` cannot be
    built."""
    rng = random.Random(seed)
    judge = None
    with echoed(echo):
        judge = judge_type(cls, 24, 3, echo=echo)
        for step in range(steps):
            judge.transcript.replay = functools.partial(_evening_replay, run, cls, seed, step + 1)
            evening_step(judge, rng, step, odds)
    return judge


def evening_of(judge_type, odds: Odds, *, run: str, steps: int, seed: int, what: str):
    """The lab's random evening as the function ``run`` names, ``(cls, steps=, seed=, echo=True)``
    (see :func:`evening`): ``what`` says what its steps are drawn from."""

    def run_evening(cls, steps: int = steps, seed: int = seed, echo: bool = True):
        return evening(judge_type, cls, odds, run=run, steps=steps, seed=seed, echo=echo)

    run_evening.__name__ = run_evening.__qualname__ = run.rsplit(".", 1)[1]
    run_evening.__doc__ = (
        f"The check's random evening on ``cls``: 24 rooms of 3 beds, {what} drawn from "
        "``random.Random(seed)``. With ``echo`` it prints every call and, if the manager breaks an "
        "invariant, the check's report: run it in a cell to see how a failure came about. Returns "
        "the judge (its ``obj`` is the manager), or None when ``cls`` cannot be built."
    )
    return run_evening
