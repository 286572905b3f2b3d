"""07.copy_on_write: the learner's manager with reference counts beside kvlab's ``BlockManager``,
judged on invariants, never room numbers (key cards shared where kvlab's are, each ref_count the
key cards holding the room). What an ``append_slot`` did to the key card, returned and left in the
ref counts names the usual slips; probes on a fresh manager confirm what one call cannot show."""

from __future__ import annotations

import numbers
from collections import Counter

from kvlab.grading.expect import plural, short
from kvlab.grading.key_cards import (
    MANAGER,
    KeyCardJudge,
    Odds,
    card_text,
    evening_of,
    play,
    room_number,
    two_guests_grow,
)
from kvlab.grading.lab03 import append_slip
from kvlab.grading.lab07 import hints
from kvlab.grading.lab07.references import KVLAB_CODE
from kvlab.grading.registry import exercise
from kvlab.grading.slips import probing
from kvlab.grading.state_diff import Field

cow = exercise("07.copy_on_write", "append_slot with shared rooms (copy-on-write)", expects="class")

# what append_slot does to the key card (as the report expects it and shows it), and should do
NEW, COPY, IN_PLACE = "a new room added", "the last room replaced", "the same key card"
OTHER = "the key card changed otherwise"
SHOULD = {
    NEW: "the token goes to a new room added to the key card (no copy)",
    COPY: "a new room replaces it on this key card (a copy)",
    IN_PLACE: "the token goes into its empty bed (the key card stays as it is)",
}
PAIR = "(src, dst): the shared room, the new room"
# (what append_slot should do, what it did): the copy-on-write slip that shows
ACTION_SLIPS = {
    (NEW, COPY): hints.FULL_SHARED,  # a full room copied because it is shared
    (IN_PLACE, COPY): hints.HELD_ONCE,
    (COPY, IN_PLACE): hints.NO_COW,
    (COPY, NEW): hints.APPENDED_COPY,
}
# a wrong ref_count after append_slot: the room (0: the last room before, 1: after), what the
# call did, how the count is wrong, and the slip that shows
REF_SLIPS = (
    (1, (NEW, COPY), lambda want, got: (want, got) == (1, 0), hints.NEW_REF),
    (0, (COPY,), lambda want, got: got == want + 1, hints.DROP_REF),
    (0, (COPY,), lambda want, got: got < want, hints.DROP_ONE),
    (0, (NEW,), lambda want, got: got < want, hints.KEPT_FULL),  # dropped, still on the card
)


def _action(before: list, after: list) -> str:
    """What one append_slot did to a key card."""
    if after == before:
        return IN_PLACE
    if before and len(after) == len(before) + 1 and after[:-1] == before:
        return NEW
    if before and len(after) == len(before) and after[:-1] == before[:-1]:
        return COPY
    return OTHER


def _pair(value):
    """``value`` as a pair of room numbers, or None when it is not one."""
    ok = isinstance(value, (tuple, list)) and len(value) == 2 and all(map(room_number, value))
    return (int(value[0]), int(value[1])) if ok else None


@probing
def _copies_held_once(cls) -> bool:
    """Whether append_slot replaces a partly filled room only this guest holds."""
    play(m := cls(8, 4), "allocate probe 1")
    before = list(m.block_table("probe"))
    return m.append_slot("probe") is not None or list(m.block_table("probe")) != before


def _shared_copy(cls):
    """'a' with 2 tokens, forked by 'b', which appends: ``(manager, b's key card before)``."""
    play(m := cls(4, 4), "allocate a 2", "fork a b")
    before = list(m.block_table("b"))
    m.append_slot("b")
    return m, before


@probing
def _frees_shared_room(cls) -> bool:
    """Whether append_slot, moving to a copy, frees the shared room (later check-ins get it)."""
    m, _ = _shared_copy(cls)
    held = set(m.block_table("a"))
    for i in range(4):  # more check-ins than free rooms: the last is refused, the probe says no
        m.allocate(f"late{i}", 1)
        if held & set(m.block_table(f"late{i}")):
            return True
    return False


@probing
def _copies_with_room_free(cls) -> bool:
    """Whether append_slot moves to a copy of a shared, partly filled room when one is free."""
    m, before = _shared_copy(cls)
    return _action(before, list(m.block_table("b"))) == COPY


@probing
def _pairs_full_alone(cls) -> bool:
    """Whether append_slot returns a pair for a full room held alone (a full shared room too)."""
    play(m := cls(8, 4), "allocate probe 4")
    return _pair(m.append_slot("probe")) is not None


class _Judge(KeyCardJudge):
    """The learner's manager beside kvlab's, checked after each call (see the module's)."""

    guarded = KVLAB_CODE
    task = "sharing and copying the rooms"
    last: tuple | None = None  # in append's checks: what it did, its last room before and after
    # what a refused call must leave as it was: the key cards, free rooms, tokens, ref counts
    fields = (
        *MANAGER,
        Field(
            "ref counts",
            lambda judge: {b: judge.obj.ref_count(b) for b in range(judge.num_blocks)},
            entries=True,
            entry=lambda b: f"room {b}'s ref_count",
        ),
    )

    def rooms_slip(self) -> str | None:
        return append_slip(self.cls) if self.appended else None

    # --- the invariant besides the key cards' own (KeyCardJudge.check) -----------------------
    def check_sharing(self, tables: dict) -> None:
        """Each ref_count is the number of key cards holding the room."""
        holders = Counter(b for t in tables.values() for b in t)
        for block in range(self.num_blocks):
            want, got = holders.get(block, 0), self.obj.ref_count(block)
            if got != want:
                cards = ", ".join(repr(s) for s, t in tables.items() if block in t)
                where = f"on {plural(want, 'key card')} ({cards})" if want else "on no key card"
                message = f"room {block} is {where}, so its ref_count is {want}"
                hint = self._ref_slip(block, want, got)
                self.fail(message, hint, expected=str(want), got=short(got))

    def _ref_slip(self, block: int, want: int, got) -> str | None:
        """What a wrong ref_count says about the append_slot that just ran."""
        if self.last is None or not isinstance(got, numbers.Integral):
            return None
        did, *rooms = self.last
        for at, dids, wrong, hint in REF_SLIPS:
            if rooms[at] == block and did in dids and wrong(want, got):
                return hint
        return None

    def count_slip(self, method, before, after, rooms) -> str | None:
        if method != "append_slot" or before is None:
            return None
        if before - after >= rooms:
            return "append_slot took more rooms off the free list than it put on the key card"
        copied = self.last is not None and self.last[0] == COPY
        return hints.FREED_SHARED if copied and _frees_shared_room(self.cls) else hints.NOT_POPPED

    # --- calls -------------------------------------------------------------------------------
    def explain_error(self, error, method, args, want=None, **context):
        if not isinstance(error, MemoryError) or method != "append_slot":
            return "this call should work", None
        if want != IN_PLACE:
            return f"this call should work: {plural(self.obj.num_free_blocks, 'room')} free", None
        hint = self.rooms_slip() or (hints.HELD_ONCE if _copies_held_once(self.cls) else None)
        return "this call should work: the guest's last room is its own, with an empty bed", hint

    def fork(self, parent, child) -> None:
        table = self.twin("fork", parent, child)
        self.check("fork")
        self.unaliased("fork", child, table)  # the given fork returns nothing; a card is a copy

    def want(self, seq) -> tuple[str, int]:
        """What append_slot should do for ``seq`` (as kvlab's), and the holders of its last room."""
        ref = self.reference
        holders = ref.ref_count(ref.block_table(seq)[-1])
        full = ref.num_tokens(seq) % self.block_size == 0
        return (NEW if full else COPY if holders > 1 else IN_PLACE), holders

    def can_append(self, seq) -> bool:
        return self.want(seq)[0] == IN_PLACE or self.reference.num_free_blocks > 0

    def append(self, seq) -> None:
        self.appended = True
        want, holders = self.want(seq)
        tokens = self.reference.num_tokens(seq)
        before, others = list(self.obj.block_table(seq)), self.others(seq)
        free_before = self.obj.num_free_blocks
        moved = self.twin("append_slot", seq, want=want)
        after = list(self.obj.block_table(seq))
        did = _action(before, after)
        self.last = (did, before[-1] if before else None, after[-1] if after else None)
        if did != want:
            beds = tokens % self.block_size
            room = "full" if beds == 0 else f"{beds} of {self.block_size} beds taken"
            who = "held by this guest alone" if holders == 1 else f"on {holders} key cards"
            # a full room copied though held alone is a miscount of rooms (Lab 03's)
            slip = ACTION_SLIPS.get((want, did)) if holders > 1 or want != NEW else None
            self.fail(
                f"{seq!r} holds {plural(tokens, 'token')}; its last room is {room} and {who}, "
                f"so {SHOULD[want]}",
                self.rooms_slip() or slip,
                expected=want,
                got=f"{did}: {card_text(before)} → {card_text(after)}",
            )
        self._returned(moved, want, *self.last[1:], holders)
        now, (src, dst) = self.others(seq), self.last[1:]
        copied = {s: [dst if b == src else b for b in t] for s, t in others.items()}
        given = did == COPY and now == copied  # the copy on every sharer's card
        self.others_kept("append_slot", others, now, hints.ALL_SHARERS if given else None)
        self.check("append_slot", free_before, int(want != IN_PLACE))
        self.last = None  # the checks of later calls know nothing of this one

    def _returned(self, moved, want: str, src, dst, holders: int) -> None:
        """What append_slot returns: ``(src, dst)``, a tuple, after a move to a copy, else None."""
        pair = _pair(moved)
        if want != COPY and moved is not None:
            hint = hints.RETURN_NONE
            if want == NEW and pair is not None:  # a pair for a full room
                alone = holders == 1 or _pairs_full_alone(self.cls)
                hint = hints.FULL_PAIR if alone else hints.FULL_SHARED
            message = "nothing was copied: append_slot returns None"
            self.fail(message, hint, expected="None", got=short(moved))
        if want != COPY or (pair == (src, dst) and isinstance(moved, tuple)):
            return
        what = "the tuple (src, dst)" if pair == (src, dst) else PAIR
        hint = {(src, dst): hints.RETURN_TUPLE, (dst, src): hints.SWAPPED}.get(pair)
        hint = hints.RETURN_PAIR if moved is None else hint
        message = f"after a move to a copy append_slot returns {what}"
        self.fail(message, hint, expected=f"({src}, {dst})", got=short(moved))

    def refused_append(self, seq, why: str) -> None:
        """append_slot must raise OutOfBlocks (a MemoryError) and change nothing."""
        self.appended = True
        want, before = self.want(seq)[0], list(self.obj.block_table(seq))
        self.refused(MemoryError, "append_slot", seq, why=why, want=want, before=before, seq=seq)

    # --- refusals ----------------------------------------------------------------------------
    changed_early = {**KeyCardJudge.changed_early, ("ref counts",): hints.REF_FIRST}

    def unrefused_slip(self, missing, want=None, before=None, seq=None):
        did = _action(before, list(self.obj.block_table(seq)))
        if want == COPY and did == IN_PLACE:
            return hints.NO_ROOM_FOR_COPY if _copies_with_room_free(self.cls) else hints.NO_COW
        return self.rooms_slip() if want == NEW and did == IN_PLACE else missing


@cow.check(
    "a guest alone in their rooms: append_slot fills the empty beds in place, takes a new room "
    "when the last is full, and returns None"
)
def _alone(cls):
    two_guests_grow(_Judge, cls)  # Lab 03's scenario, now with reference counts


# the checks as data: the name the learner reads -> the rooms (of 4 beds), then the calls
SCENES = {
    "after a fork two guests share every room; the first to write into the shared last room "
    "moves to a copy and gets (old room, new room)": (
        16,
        *("allocate prompt 6", "fork prompt sample"),
        *("append sample", "append prompt"),  # a copy of the half-full room; then alone: in place
        *["append sample", "append prompt"] * 3,
    ),
    "a full shared room is not copied: the next token goes to a new room and the full room "
    "stays shared": (
        16,
        *("allocate prompt 8", "fork prompt sample", "append sample", "append prompt"),
        *("append sample", "free sample", "free prompt"),
    ),
    "three samples of one prompt: each writer drops one reference, and every room comes back "
    "when all three check out": (
        16,
        *("allocate prompt 5", "fork prompt s1", "fork prompt s2"),
        *("append s1", "append s2", "append prompt"),  # on 3 key cards, 2, then alone: in place
        *("fork s1 s1b", "append s1b"),  # a beam of a beam
        *("free s1", "free s2", "free prompt", "free s1b"),
    ),
    "append_slot refuses without changing anything when it needs a room and none is free (a "
    "full last room, a shared last room), and for an unknown id": (
        3,
        *("allocate a 4", "allocate b 6", "fork b c"),  # a full room; two, one with empty beds
        ("refused_append", "a", "the last room of 'a' is full and no room is free"),
        ("refused_append", "c", "the last room of 'c' is shared and no room is free for the copy"),
        ("refused_unknown", "append_slot"),
        *("free a", "append c", "append b"),  # the copy in the room 'a' gave back; b in place
    ),
}


def _hotels(cls, hotels) -> None:
    """A check as data: each hotel ``(rooms, beds a room, *calls)`` played on a judge of its own."""
    for rooms, beds, *steps in hotels:
        play(_Judge(cls, rooms, beds), *steps)


for _name, (_rooms, *_steps) in SCENES.items():
    cow.check(_name)(lambda cls, hotel=(_rooms, 4, *_steps): _hotels(cls, [hotel]))

# the checks on other hotels: the name -> (rooms, beds a room, the calls) for each hotel
HOTELS = {
    "rooms of 1, 2 and 16 beds: a room is full when num_tokens % block_size == 0, whatever its "
    "size": (
        (6, 1, "allocate a 1", "fork a b", "append b", "append a", "append b", "free a", "free b"),
        (6, 2, "allocate a 1", "fork a b", "append b", "append a", "append a", "append b"),
        (
            *(6, 16),
            *("allocate a 3", "fork a b", "append b", "append a", "append a"),  # a copy; in place
            *("allocate c 11", "fork c e", "append e", "allocate f 16", "fork f g", "append g"),
        ),
    ),
    "guests named by ints and tuples, as kvlab's beam search names its beams: tokens, copies "
    "and refusals": (
        (
            *(3, 4),
            *(("allocate", ("beam", 0), 4), ("fork", ("beam", 0), ("beam", 1))),
            *("allocate 7 6", "fork 7 8"),  # every room taken: one full and shared, one half
            ("refused_append", ("beam", 1), "the last room of ('beam', 1) is full, none is free"),
            ("refused_append", 8, "the last room of 8 is shared and no room is free for the copy"),
            *(("free", ("beam", 0)), ("free", ("beam", 1)), "append 8", "append 7"),
        ),
    ),
}
for _name, _each in HOTELS.items():
    cow.check(_name)(lambda cls, hotels=_each: _hotels(cls, hotels))


EVENING = "check-ins, forks, tokens (refused when no room is free) and check-outs"
beam_evening = evening_of(
    _Judge,
    Odds(check_in=0.12, most=8, fork=0.35, token=0.8),
    run="kvlab.grading.lab07.beam_evening",
    steps=300,
    seed=7,
    what=EVENING,
)


@cow.check("beam search at random: 300 check-ins, forks, tokens and check-outs")
def _random_cow(cls):
    beam_evening(cls, echo=False)
