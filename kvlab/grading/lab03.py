"""Checks for Lab 03: a learner's block manager and the beds report.

The block manager is judged method by method, against the invariants kvlab's keeps (never against
kvlab's room numbers): the ``allocate`` checks need only ``allocate``, then come ``append_slot``
and ``free``. When a check fails, the judge probes the learner's class on fresh managers (how many
rooms ``allocate`` takes for 1 to 13 tokens, when ``append_slot`` takes a room) to name the usual
slips, so one off-by-one gets one hint and its knock-on failures say "the same problem". A class
that inherits from kvlab's manager or hands its calls to one fails (``refuse_reference``).
"""

from __future__ import annotations

import random
from functools import partial

from kvlab.core.block_manager import BlockManager
from kvlab.grading import slips
from kvlab.grading.blame import explain_exception
from kvlab.grading.expect import CheckFailed, call_without_mutation, plural, short
from kvlab.grading.key_cards import (
    NOT_COUNTED,
    KeyCardJudge,
    Odds,
    evening_of,
    play,
    rooms_for,
    two_guests_grow,
)
from kvlab.grading.own_code import refuse_reference
from kvlab.grading.registry import exercise, own_answers
from kvlab.grading.slips import Slip, quietly

manager = exercise("03.block_manager", "allocate, append_slot and free", expects="class")
own_answers("03.block_manager", "kvlab.core.block_manager:BlockManager")


# kvlab's own manager: a learner's class that inherits from it or hands calls over to it (the lab
# imports it as ReferenceBlockManager) is not the learner's work
KVLAB_MANAGER = (
    BlockManager.allocate,
    BlockManager.append_slot,
    BlockManager.free,
    BlockManager.fork,
    BlockManager.blocks_needed,
    BlockManager.can_allocate,
)
TASK = "handing out the rooms"


# --- the usual slips, recognised by probing the learner's class ------------------------------

PROBE_SIZE = 4  # block_size of the probe managers
PROBE_TOKENS = list(range(1, 3 * PROBE_SIZE + 2))  # 1 … 13: multiples of 4 and their neighbours

# wrong ways to count the rooms of a prompt: the rooms each takes for n tokens
ALLOCATE_SLIPS = [
    Slip(
        "allocate takes one room too many when num_tokens is a multiple of block_size: "
        "`num_tokens // block_size + 1` is not ceil. Round up with `-(-num_tokens // block_size)`",
        lambda n, size: n // size + 1,
    ),
    Slip(
        "allocate takes one room too few when num_tokens is not a multiple of block_size: "
        "floor division drops the partly filled last room. Round up with "
        "`-(-num_tokens // block_size)`",
        lambda n, size: n // size,
    ),
    Slip(
        "allocate takes a spare room: ceil(num_tokens / block_size) rooms hold the prompt, and "
        "append_slot takes the next room when it is needed",
        lambda n, size: rooms_for(n, size) + 1,
    ),
    Slip(
        "allocate takes one room per token: a room holds block_size tokens, so num_tokens "
        "tokens need ceil(num_tokens / block_size) rooms",
        lambda n, size: n,
    ),
]
# wrong moments to take a new room: the rooms each holds after growing to t tokens from 1
APPEND_SLIPS = [
    Slip(
        "append_slot takes a new room one token early, when the token fills the last bed: decide "
        "before counting the new token (the last room is full when num_tokens % block_size == 0)",
        lambda t, size: t // size + 1,
    ),
    Slip(
        "append_slot never adds a room to the key card: when the last room is full "
        "(num_tokens % block_size == 0), pop a fresh one from the free list and append it",
        lambda t, size: 1,
    ),
    Slip(
        "append_slot takes a new room for every token: take one only when the last room is full",
        lambda t, size: t,
    ),
]


def _rooms_after_allocate(cls) -> list[int]:
    counts = []
    for n in PROBE_TOKENS:
        m = cls(64, PROBE_SIZE)
        m.allocate("probe", n)
        counts.append(len(m.block_table("probe")))
    return counts


def _growth(cls) -> tuple[list[int], list[int]]:
    """Rooms and num_tokens after each append_slot, for a guest that checks in with 1 token."""
    m = cls(64, PROBE_SIZE)
    m.allocate("probe", 1)
    rooms, tokens = [], []
    for _ in PROBE_TOKENS:
        m.append_slot("probe")
        rooms.append(len(m.block_table("probe")))
        tokens.append(m.num_tokens("probe"))
    return rooms, tokens


def _matching(counts, table, xs) -> str | None:
    """The first slip whose rooms on the probe are the learner's."""
    found = (s for s in table if counts == [s.answer(x, PROBE_SIZE) for x in xs])
    return slips.hint(slips.first(found))


def allocate_slip(cls) -> str | None:
    """The hint for the way the learner's ``allocate`` miscounts rooms, if it is a usual one."""
    counts = quietly(lambda: _rooms_after_allocate(cls))
    return _matching(counts, ALLOCATE_SLIPS, PROBE_TOKENS) if counts else None


def append_slip(cls) -> str | None:
    """The hint for the way the learner's ``append_slot`` miscounts, if it is a usual one."""
    growth = quietly(lambda: _growth(cls))
    if not growth:
        return None
    rooms, tokens = growth
    if tokens == [1] * len(tokens):
        return NOT_COUNTED
    return _matching(rooms, APPEND_SLIPS, [n + 1 for n in PROBE_TOKENS])


# --- the judge -------------------------------------------------------------------------------


class _Judge(KeyCardJudge):
    """Makes calls on the learner's manager, and the same calls on kvlab's, and checks kvlab's
    invariants after each one: every key card holds ceil(tokens / block_size) rooms for the tokens
    kvlab's manager counts, no room is on two key cards, and free rooms plus held rooms make
    num_blocks. Room numbers are never compared with kvlab's."""

    guarded = KVLAB_MANAGER
    task = TASK

    def __init__(self, cls, num_blocks: int, block_size: int, echo=False, returns=False):
        self.returns = returns  # judge allocate's return value (one check does)
        super().__init__(cls, num_blocks, block_size, echo=echo)

    def rooms_slip(self) -> str | None:
        """A known miscount of rooms: allocate's first (every guest checks in), then append's."""
        return allocate_slip(self.cls) or (append_slip(self.cls) if self.appended else None)

    @staticmethod
    def count_slip(method, before, after, rooms) -> str | None:
        """What the free list's change says about the call that just ran."""
        if method is None or before is None:
            return None
        if method == "free":
            if after - before < rooms:
                return (
                    "free did not give every room back: put each room of the key card on the "
                    "free list"
                )
            return "free gave back more rooms than the guest held: is a room returned twice?"
        if before - after < rooms:
            return (
                f"{method} put rooms on the key card without taking them off the free list: "
                "pop each one"
            )
        return f"{method} took more rooms off the free list than it put on the key card"

    # calls
    def explain_error(self, error, method, args):
        """The diagnosis of an error in a call that should work."""
        if not isinstance(error, MemoryError) or method is None:
            return "this call should work", None
        hint = self.rooms_slip()
        free = self.reference.num_free_blocks  # the reference is called after the learner
        if method == "allocate":
            need = rooms_for(args[1], self.block_size)
            message = f"this call should work: it needs {plural(need, 'room')}, {free} free"
            if hint is None and need == free:
                hint = (
                    "allocate refuses when exactly enough rooms are free: refuse only when "
                    "the rooms needed > the free rooms"
                )
        else:
            message = "this call should work: the guest's last room has an empty bed"
            if self.reference.num_tokens(args[0]) % self.block_size == 0:
                message = f"this call should work: {plural(free, 'room')} free"
        return message, hint

    def allocate(self, seq, n: int) -> None:
        table = super().allocate(seq, n)
        card = list(self.obj.block_table(seq))
        if self.returns and not (isinstance(table, (list, tuple)) and list(table) == card):
            self.fail(
                "allocate must return the new key card",
                expected=short(card),
                got=short(table),
                hint="return the key card: a list of the guest's room numbers"
                if table is None
                else None,
            )

    def append(self, seq) -> None:
        self.appended = True
        others = self.others(seq)
        before = self.obj.num_free_blocks
        grows = self.reference.num_tokens(seq) % self.block_size == 0
        moved = self.twin("append_slot", seq)
        self.check("append_slot", before, int(grows))
        if moved is not None:
            self.fail(
                "append_slot returns None (Lab 07's shared rooms give it something to return)",
                expected="None",
                got=short(moved),
                hint="end append_slot without a return value",
            )
        self.others_kept("append_slot", others, self.others(seq))

    def forgotten(self, seq) -> None:
        """After free, the guest is unknown: its key card and token count are gone."""
        for reader in ("block_table", "num_tokens"):
            value, error = self.attempt(reader, seq)
            if isinstance(error, KeyError):
                continue
            if error is not None:
                self.fail(
                    f"a guest who checked out is unknown: {reader} raises KeyError",
                    expected="KeyError",
                    got=explain_exception(error)[0],
                )
            self.fail(
                f"{seq!r} checked out, yet {reader}({seq!r}) still answers",
                expected="KeyError",
                got=short(value),
                hint="free must forget the guest: remove it from block_tables and tokens, so the "
                "id is unknown again (and may check in later)",
            )

    # refusals (KeyCardJudge.not_refused and .changed)
    refused_message = "a refused call must change nothing (no half-checked-in guest, no lost room)"


# --- checks, method by method ----------------------------------------------------------------


def scene(hotel: tuple, *steps, **options):
    """A part of a check: ``_Judge(cls, *hotel, **options)`` (``hotel`` is num_blocks and
    block_size) plays ``steps`` (:func:`kvlab.grading.key_cards.play`), each a string of calls
    ("allocate a 5, free a") or a refusal (:func:`refused`)."""
    calls = [c for step in steps for c in (step.split(", ") if isinstance(step, str) else [step])]
    return lambda cls: play(_Judge(cls, *hotel, **options), *calls)


def refused(errors, method: str, *args, why: str, missing: str | None = None) -> tuple:
    """A step of a scene: ``method(*args)`` must raise one of ``errors`` and change nothing;
    ``why`` it must, ``missing`` the hint when it raises nothing."""
    return ("refused", errors, method, *args, {"why": why, "missing": missing})


def in_turn(*scenes):
    """A check of several scenes, played one after another."""

    def check(cls):
        for part in scenes:
            part(cls)

    return check


FULL = "{}'s last room is full and no room is free"
TWICE = "an id checks in only once: raise ValueError when seq_id already has a key card"
NO_TOKENS = "a guest brings at least one token: raise ValueError when num_tokens < 1"
# the checks as data: the name the learner reads -> the check, a function of the class
SCENES = {
    "allocate: n tokens get a key card of ceil(n / block_size) rooms (n = 1, 8, 7, 9 with 4 beds "
    "a room)": scene(
        (32, 4),
        "allocate one 1, allocate exact 8, allocate minus 7, allocate plus 9",
        returns=True,  # allocate's return value is judged here only
    ),
    "allocate refuses without changing anything: too few free rooms, a duplicate id, "
    "num_tokens < 1": scene(
        (4, 4),
        "allocate a 9",  # 3 rooms, 1 left
        refused(MemoryError, "allocate", "b", 5, why="'b' needs 2 rooms and 1 is free"),
        refused(ValueError, "allocate", "a", 2, why="'a' is already checked in", missing=TWICE),
        refused(ValueError, "allocate", "z", 0, why="a guest with 0 tokens", missing=NO_TOKENS),
        "allocate b 4",  # exactly the one free room
    ),
    "append_slot takes a new room exactly when the last room is full": partial(
        two_guests_grow, _Judge
    ),
    "append_slot refuses without changing anything: last room full and none free, an unknown id": (
        scene(
            (2, 4),
            "allocate a 4, allocate b 3, append b",  # a full room; a room with an empty bed, filled
            refused(MemoryError, "append_slot", "a", why=FULL.format("a")),
            refused(MemoryError, "append_slot", "b", why=FULL.format("b")),
            "refused_unknown append_slot",
        )
    ),
    "free gives every room back, and the rooms are reused": scene(
        (6, 2), "allocate a 5, allocate b 6, free a, allocate c 6, free b, free c"
    ),
    "free forgets the guest: afterwards their id is unknown (KeyError) and may check in again": (
        # a, forgotten, checks in again, as a preempted guest does
        scene((4, 2), "allocate a 3, free a, forgotten a, allocate a 4, refused_unknown free")
    ),
    "block_size 1 and a hotel of one room": in_turn(
        scene((5, 1), "allocate a 2, append a, free a"),
        scene((1, 8), "allocate only 8, free only, allocate again 1"),
    ),
}
for _name, _check in SCENES.items():
    manager.check(_name)(_check)


EVENING_SEED, EVENING_STEPS = 11, 300
random_evening = evening_of(
    _Judge,
    Odds(check_in=0.3, most=10, token=0.85),
    run="kvlab.grading.lab03.random_evening",
    steps=EVENING_STEPS,
    seed=EVENING_SEED,
    what="check-ins, tokens (refused when no room is free) and check-outs",
)


@manager.check("a random evening: 300 check-ins, tokens and check-outs")
def _random(cls):
    random_evening(cls, echo=False)


# --- the beds report -------------------------------------------------------------------------

beds = exercise("03.beds_report", "measure the paged hotel")
own_answers("03.beds_report", "kvlab.core.block_manager:BlockManager.memory_report")
BEDS_KEYS = ("used", "future", "free")


def _reference_beds(m: BlockManager) -> dict:
    """kvlab's own report (``BlockManager.memory_report``), in the exercise's three keys."""
    report = m.memory_report()
    return {key: getattr(report, key) for key in BEDS_KEYS}


FULL_ROOM_FUTURE = (
    "a full last room has no empty bed, yet `block_size - tokens % block_size` counts "
    "block_size future beds for it (tokens % block_size is 0): count held rooms × block_size "
    "− tokens, or use `-tokens % block_size`"
)
WHOLE_ROOMS_USED = (
    "used counts every bed of the held rooms (rooms × block_size), yet a last room may have "
    "empty beds: used is the guests' tokens, sum(manager.num_tokens(s) for s in seq_ids), and "
    "future the held beds minus those"
)
KVLAB_MANAGER_ONLY = "beds: only the listed methods"


def _beds_slips(m: BlockManager) -> list[Slip]:
    """The reports the usual slips give for ``m``."""
    right = _reference_beds(m)
    size = m.block_size
    held_rooms = sum(len(m.block_table(s)) for s in m.seq_ids)

    def report(**slipped):
        return lambda: {**right, **slipped}

    full_room_future = sum(size - m.num_tokens(s) % size for s in m.seq_ids)
    return [
        Slip(
            "free counts rooms: multiply by block_size to count beds",
            report(free=m.num_free_blocks),
        ),
        Slip(FULL_ROOM_FUTURE, report(future=full_room_future)),
        Slip(
            "future counts every bed of the held rooms: subtract the beds holding tokens",
            report(future=held_rooms * size),
        ),
        Slip(
            "future mixes rooms and tokens: held rooms × block_size − tokens",
            report(future=held_rooms - right["used"]),
        ),
        Slip("used counts rooms: count the guests' tokens (num_tokens)", report(used=held_rooms)),
        Slip(WHOLE_ROOMS_USED, report(used=held_rooms * size)),
        Slip(WHOLE_ROOMS_USED, report(used=held_rooms * size, future=0)),
    ]


def _beds_slip(got, m: BlockManager) -> str | None:
    """The hint for a report that matches a usual slip."""
    if not isinstance(got, dict):
        return "return a dict with the keys used, future and free"
    if set(got) != set(BEDS_KEYS):
        return f"the keys are used, future and free (got {', '.join(map(repr, got))})"
    found = slips.matching(_beds_slips(m), got, (), _reference_beds(m))
    return slips.hint(slips.first(found))


def _expect_beds(fn, m: BlockManager, what: str):
    try:
        with refuse_reference(BlockManager.memory_report, learner=fn, task="counting the beds"):
            got = call_without_mutation(fn, m, list(m.seq_ids), names=("manager", "seq_ids"))
    except AttributeError as error:
        if getattr(error, "obj", None) is not m:
            raise
        raise CheckFailed(
            "\n   ".join(explain_exception(error)),
            input=what,
            hint=f"the check hands in kvlab's BlockManager, which has no `{error.name}`: use "
            "only block_table, num_tokens, num_free_blocks and block_size, which every manager "
            "has (yours and kvlab's)",
            cause=KVLAB_MANAGER_ONLY,
        ) from None
    expected = _reference_beds(m)
    if got != expected:
        raise CheckFailed(
            "wrong beds report",
            input=what,
            expected=short(expected),
            got=short(got),
            hint=_beds_slip(got, m),
        )


@beds.check("two guests with partly filled last rooms")
def _two(fn):
    m = BlockManager(10, 4)
    m.allocate("a", 5)
    m.allocate("b", 8)
    _expect_beds(fn, m, "BlockManager(10, 4) with a: 5 tokens, b: 8 tokens")


@beds.check("an empty hotel, and a full one")
def _edges(fn):
    _expect_beds(fn, BlockManager(3, 16), "BlockManager(3, 16), nobody checked in")
    m = BlockManager(2, 16)
    m.allocate("a", 32)
    _expect_beds(fn, m, "BlockManager(2, 16) with a: 32 tokens")


@beds.check("block_size 1 never holds a bed ahead")
def _one(fn):
    m = BlockManager(50, 1)
    for i, n in enumerate([1, 7, 20]):
        m.allocate(i, n)
    _expect_beds(fn, m, "BlockManager(50, 1) with guests of 1, 7 and 20 tokens")


@beds.check("50 random hotels")
def _random_beds(fn):
    rng = random.Random(4)
    for i in range(50):
        size = rng.choice([1, 2, 16, 64])
        m = BlockManager(rng.randint(5, 40), size)
        for g in range(rng.randint(0, 6)):
            n = rng.randint(1, 3 * size)
            if m.can_allocate(n):
                m.allocate(g, n)
        lens = [m.num_tokens(s) for s in m.seq_ids]
        guests = f"{plural(len(lens), 'guest')}" + (f" of {lens} tokens" if lens else "")
        _expect_beds(
            fn, m, f"hotel {i + 1} of 50: BlockManager({m.num_blocks}, {size}) with {guests}"
        )
