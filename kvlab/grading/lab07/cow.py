"""07.copy_on_write: the learner's block manager with reference counts (``allocate``, ``fork``
and ``free`` given, ``append_slot`` theirs) driven beside kvlab's ``BlockManager`` and judged on
invariants, never on room numbers: every key card holds ceil(tokens / block_size) rooms, the
guests share the same entries of their key cards as kvlab's guests do, each room's ref_count is
the number of key cards holding it (0 for a free room), and free plus held rooms make num_blocks.

After each ``append_slot`` what the learner's call did to the key card (a new room, the last room
replaced by a copy, nothing) is set against what kvlab's did, and the value returned (None or
``(src, dst)``): that pair names the usual slips (copying a full or an unshared room, never
copying, appending the copy, (dst, src)), and the ref counts name the rest (a reference not
dropped, a new room without its reference). Probes on a fresh manager confirm the slips the judge
cannot see on the call itself: a shared room put back on the free list (a later check-in is
handed it), a shared room written in place only when no room is free for the copy.
"""

from __future__ import annotations

import numbers
from collections import Counter

from kvlab.grading.expect import plural, short
from kvlab.grading.key_cards import (
    MANAGER,
    KeyCardJudge,
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
COW_TASK = "sharing and copying the rooms"

NEW, COPY, IN_PLACE, OTHER = "new", "copy", "in place", "other"
# what append_slot should do to the key card (said, then as expected), and what the call did
WANT = {
    NEW: ("the token goes to a new room added to the key card (no copy)", "a new room added"),
    COPY: ("a new room replaces it on this key card (a copy)", "the last room replaced"),
    IN_PLACE: (
        "the token goes into its empty bed (the key card stays as it is)",
        "the same key card",
    ),
}
PAIR = "(src, dst): the shared room, the new room"
DID = {
    NEW: "a new room was added",
    COPY: "the last room was replaced",
    IN_PLACE: "the key card did not change",
    OTHER: "the key card changed otherwise",
}


# (what append_slot should do, what it did): the copy-on-write slip that shows
ACTION_SLIPS = {
    (NEW, COPY): hints.FULL_SHARED,  # a full room copied because it is shared
    (IN_PLACE, COPY): hints.HELD_ONCE,
    (COPY, IN_PLACE): hints.NO_COW,
    (COPY, NEW): hints.APPENDED_COPY,
}


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
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        return None
    if not all(room_number(v) for v in value):
        return None
    return int(value[0]), int(value[1])


@probing
def _copies_held_once(cls) -> bool:
    """Whether the learner's append_slot replaces a partly filled room only this guest holds."""
    m = cls(8, 4)
    m.allocate("probe", 1)
    before = list(m.block_table("probe"))
    value = m.append_slot("probe")
    return value is not None or list(m.block_table("probe")) != before


def _shared_copy(cls):
    """A probe manager of 4 rooms of 4 beds: 'a' checks in with 2 tokens, 'b' forks it and
    appends, which moves 'b' to a copy of the shared room. ``(manager, b's key card before)``."""
    m = cls(4, 4)
    m.allocate("a", 2)
    m.fork("a", "b")
    before = list(m.block_table("b"))
    m.append_slot("b")
    return m, before


@probing
def _frees_shared_room(cls) -> bool:
    """Whether the learner's append_slot, moving to a copy, puts the shared room on the free
    list although another guest holds it: later check-ins are handed that room."""
    m, _ = _shared_copy(cls)
    held = set(m.block_table("a"))
    for i in range(4):  # more check-ins than free rooms: the last is refused
        try:
            m.allocate(f"late{i}", 1)
        except MemoryError:
            break
        if held & set(m.block_table(f"late{i}")):
            return True
    return False


@probing
def _copies_with_room_free(cls) -> bool:
    """Whether the learner's append_slot moves to a copy of a shared, partly filled room when a
    room is free (so writing in place with none free is the missing refusal)."""
    m, before = _shared_copy(cls)
    return _action(before, list(m.block_table("b"))) == COPY


def _copy_given_to_all(before: dict, after: dict, src, dst) -> bool:
    """Whether the other guests' key cards changed only by the shared room ``src`` replaced with
    the writer's new room ``dst``."""
    return before.keys() == after.keys() and all(
        after[s] == [dst if b == src else b for b in t] for s, t in before.items()
    )


@probing
def _pairs_full_alone(cls) -> bool:
    """Whether the learner's append_slot returns a pair when a full room only this guest holds
    gets a new room after it (so a pair for a full shared room is the same slip)."""
    m = cls(8, 4)
    m.allocate("probe", 4)
    return _pair(m.append_slot("probe")) is not None


class _Judge(KeyCardJudge):
    """Calls on the learner's manager and the same calls on kvlab's, with kvlab's invariants
    checked after each one (see the module's docstring). Room numbers are never compared with
    kvlab's: only which guests share which entries of their key cards."""

    guarded = KVLAB_CODE
    task = COW_TASK
    shared = True

    def __init__(self, cls, num_blocks: int, block_size: int, echo: bool = False):
        self.last: dict | None = None  # what the last append_slot did: for the ref-count hints
        super().__init__(cls, num_blocks, block_size, echo=echo)

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

    # --- the invariants besides the key cards' own (KeyCardJudge.check) ----------------------
    def check_sharing(self, tables: dict) -> None:
        self._same_sharing(tables)
        self._ref_counts(tables)

    def _same_sharing(self, tables: dict) -> None:
        """The guests share the same entries of their key cards as kvlab's guests do."""
        mine: dict = {}  # kvlab's room -> (the learner's room, seq, entry)
        theirs: dict = {}  # the learner's room -> (kvlab's room, seq, entry)
        for seq, table in tables.items():
            for entry, (ref, got) in enumerate(
                zip(self.reference.block_table(seq), table, strict=True)
            ):
                if ref in mine and mine[ref][0] != got:
                    room, other, at = mine[ref]
                    self.fail(
                        f"{other!r} (entry {at}) and {seq!r} (entry {entry}) should still share "
                        "a room: nobody has written into it since it was shared",
                        expected="one room on both key cards",
                        got=f"rooms {room} and {got}",
                    )
                if got in theirs and theirs[got][0] != ref:
                    _, other, at = theirs[got]
                    self.fail(
                        f"room {got} is entry {at} of {other!r}'s key card and entry {entry} of "
                        f"{seq!r}'s, yet they should hold different rooms there: one of them "
                        "has written into it",
                        expected="two rooms",
                        got=f"room {got} on both key cards",
                    )
                mine[ref], theirs[got] = (got, seq, entry), (ref, seq, entry)

    def _ref_counts(self, tables: dict) -> None:
        holders = Counter(b for t in tables.values() for b in t)
        for block in range(self.num_blocks):
            want, got = holders.get(block, 0), self.obj.ref_count(block)
            if got == want:
                continue
            cards = [s for s, t in tables.items() if block in t]
            where = (
                f"room {block} is on {plural(want, 'key card')} ({', '.join(map(repr, cards))})"
                if want
                else f"room {block} is on no key card"
            )
            self.fail(
                f"{where}, so its ref_count is {want}",
                expected=str(want),
                got=short(got),
                hint=self._ref_slip(block, want, got),
            )

    def _ref_slip(self, block: int, want: int, got) -> str | None:
        """What a wrong ref_count says about the append_slot that just ran."""
        last = self.last
        if not last or not isinstance(got, numbers.Integral):
            return None
        if block == last["dst"] and last["did"] in (NEW, COPY) and got == 0 and want == 1:
            return hints.NEW_REF
        if block == last["src"] and last["did"] == COPY:
            if got == want + 1:
                return hints.DROP_REF
            if got < want:
                return hints.DROP_ONE
        if block == last["src"] and last["did"] == NEW and got < want:
            return hints.KEPT_FULL  # a reference dropped to the full room, still on the key card
        return None

    def count_slip(self, method, before, after, rooms) -> str | None:
        if method != "append_slot" or before is None:
            return None
        if before - after < rooms:
            copied = self.last is not None and self.last["did"] == COPY
            if copied and _frees_shared_room(self.cls):
                return hints.FREED_SHARED
            return hints.NOT_POPPED
        return "append_slot took more rooms off the free list than it put on the key card"

    # --- calls -------------------------------------------------------------------------------
    def explain_error(self, error, method, args, want=None, **context):
        if not isinstance(error, MemoryError) or method != "append_slot":
            return "this call should work", None
        free = self.obj.num_free_blocks
        if want == IN_PLACE:
            hint = self.rooms_slip() or (hints.HELD_ONCE if _copies_held_once(self.cls) else None)
            return (
                "this call should work: the guest's last room is its own, with an empty bed",
                hint,
            )
        return f"this call should work: {plural(free, 'room')} free", None

    def allocate(self, seq, n: int) -> None:
        self.last = None
        super().allocate(seq, n)

    def fork(self, parent, child) -> None:
        self.last = None
        table = self.twin("fork", parent, child)
        self.check("fork")
        if table is not None:  # the given fork returns nothing; a key card returned is a copy
            self.unaliased("fork", child, table)

    def free(self, seq) -> None:
        self.last = None
        self.twin("free", seq)
        self.check("free")

    def want(self, seq) -> tuple[str, int]:
        """What append_slot should do for ``seq`` (from kvlab's manager), and how many key cards
        hold its last room."""
        ref = self.reference
        holders = ref.ref_count(ref.block_table(seq)[-1])
        if ref.num_tokens(seq) % self.block_size == 0:
            return NEW, holders
        return (COPY if holders > 1 else IN_PLACE), holders

    def can_append(self, seq) -> bool:
        return self.want(seq)[0] == IN_PLACE or self.reference.num_free_blocks > 0

    def append(self, seq) -> None:
        self.appended = True
        want, holders = self.want(seq)
        tokens = self.reference.num_tokens(seq)
        before = list(self.obj.block_table(seq))
        others = self.others(seq)
        free_before = self.obj.num_free_blocks
        moved = self.twin("append_slot", seq, want=want)
        after = list(self.obj.block_table(seq))
        did = _action(before, after)
        self.last = {
            "did": did,
            "src": before[-1] if before else None,
            "dst": after[-1] if after else None,
        }
        if did != want:
            beds = tokens % self.block_size
            room = "full" if beds == 0 else f"{beds} of {self.block_size} beds taken"
            who = "held by this guest alone" if holders == 1 else f"on {holders} key cards"
            self.fail(
                f"{seq!r} holds {plural(tokens, 'token')}; its last room is {room} and {who}, "
                f"so {WANT[want][0]}",
                expected=WANT[want][1],
                got=f"{DID[did]}: {card_text(before)} → {card_text(after)}",
                hint=self._action_slip(want, did, holders),
            )
        self._returned(moved, want, before, after, holders)
        now = self.others(seq)
        if now != others:
            given = did == COPY and _copy_given_to_all(others, now, before[-1], after[-1])
            changed = [s for s in others if now.get(s) != others[s]]
            self.fail(
                "append_slot changed another guest's key card",
                expected=", ".join(f"{s!r}: {card_text(others[s])}" for s in changed),
                got=", ".join(f"{s!r}: {card_text(now.get(s))}" for s in changed),
                hint=hints.ALL_SHARERS if given else None,
            )
        self.check("append_slot", free_before, int(want != IN_PLACE))

    def _action_slip(self, want: str, did: str, holders: int) -> str | None:
        """The hint for doing ``did`` where ``want`` was right: a miscount of full rooms (seen on
        a guest alone, as in Lab 03) first, then the copy-on-write slips."""
        if (want, did) == (NEW, COPY) and holders == 1:
            return self.rooms_slip()
        return self.rooms_slip() or ACTION_SLIPS.get((want, did))

    def _returned(self, moved, want: str, before: list, after: list, holders: int) -> None:
        """What append_slot returns: ``(src, dst)``, a tuple, after a move to a copy, else None."""
        pair = _pair(moved)
        if want != COPY and moved is not None:
            hint = hints.RETURN_NONE
            if want == NEW and pair is not None:  # a pair for a full room
                alone = holders == 1 or _pairs_full_alone(self.cls)
                hint = hints.FULL_PAIR if alone else hints.FULL_SHARED
            self.fail(
                "nothing was copied: append_slot returns None",
                hint,
                expected="None",
                got=short(moved),
            )
        src, dst = (before[-1], after[-1]) if want == COPY else (None, None)
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
        want, _ = self.want(seq)
        before = list(self.obj.block_table(seq))
        self.refused(MemoryError, "append_slot", seq, why=why, want=want, before=before, seq=seq)

    # --- refusals ----------------------------------------------------------------------------
    pop_empty, taken_early = hints.POP_EMPTY, hints.TAKE_FIRST
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
        "allocate prompt 6",
        "fork prompt sample",
        "append sample",  # moves to a copy of the half-full room
        "append prompt",  # now alone in the old room: in place
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
        "append s1",  # the shared room goes from 3 key cards to 2
        "append s2",  # … and to 1
        "append prompt",  # alone now: in place
        "fork s1 s1b",  # a beam of a beam
        "append s1b",
        *("free s1", "free s2", "free prompt", "free s1b"),
    ),
    "append_slot refuses without changing anything when it needs a room and none is free (a "
    "full last room, a shared last room), and for an unknown id": (
        3,
        "allocate a 4",  # one full room
        "allocate b 6",  # two rooms, the last with empty beds: the hotel is full
        "fork b c",
        ("refused_append", "a", "the last room of 'a' is full and no room is free"),
        ("refused_append", "c", "the last room of 'c' is shared and no room is free for the copy"),
        ("refused_unknown", "append_slot"),
        "free a",
        "append c",  # the copy gets the room 'a' gave back
        "append b",  # alone again in the old room: in place, with no room free
    ),
}
for _name, (_rooms, *_steps) in SCENES.items():
    cow.check(_name)(lambda cls, rooms=_rooms, steps=_steps: play(_Judge(cls, rooms, 4), *steps))


EVENING_SEED, EVENING_STEPS = 7, 300


def _evening_call(judge, rng, step: int) -> None:
    """One step of the beam evening: a check-in, a fork, a token (refused when no room is free)
    or a check-out."""
    guests = judge.reference
    roll = rng.random()
    seqs = sorted(guests.seq_ids)
    free_beds = guests.num_free_blocks * 3
    if (roll < 0.12 or not seqs) and free_beds:
        judge.allocate(f"g{step}", rng.randint(1, min(free_beds, 8)))
    elif roll < 0.35 and seqs and len(seqs) < 10:
        judge.fork(rng.choice(seqs), f"g{step}")
    elif roll < 0.80 and seqs:
        seq = rng.choice(seqs)
        if judge.can_append(seq):
            judge.append(seq)
        else:
            judge.refused_append(seq, f"{seq!r} needs a room and none is free")
    elif seqs:
        judge.free(rng.choice(seqs))


beam_evening = evening_of(
    _Judge,
    _evening_call,
    run="kvlab.grading.lab07.beam_evening",
    steps=EVENING_STEPS,
    seed=EVENING_SEED,
    what="check-ins, forks, tokens (refused when no room is free) and check-outs",
)


@cow.check("beam search at random: 300 check-ins, forks, tokens and check-outs")
def _random_cow(cls):
    beam_evening(cls, echo=False)
