"""Checks for Lab 07: shared rooms, copy-on-write, prefix caching and eviction.

``07.copy_on_write``: the learner's block manager with reference counts (``allocate``, ``fork`` and
``free`` given, ``append_slot`` theirs) is driven beside kvlab's ``BlockManager`` and judged on
invariants, never on room numbers: every key card holds ceil(tokens / block_size) rooms, the guests
share the same entries of their key cards as kvlab's guests do, each room's ref_count is the number
of key cards holding it (0 for a free room), and free plus held rooms make num_blocks. After each
``append_slot`` what the learner's call did to the key card (a new room, the last room replaced by
a copy, nothing) is set against what kvlab's did, and the value returned (None or ``(src, dst)``):
that pair names the usual slips (copying a full or an unshared room, never copying, appending the
copy, (dst, src)), and the ref counts name the rest (a reference not dropped, a new room without
its reference). Probes on a fresh manager confirm the slips the judge cannot see on the call
itself: a shared room put back on the free list (a later check-in is handed it), a shared room
written in place only when no room is free for the copy.

``07.cached_prefix``: ``longest_cached_prefix(token_ids, block_size, cached)`` is compared with the
rule the lab states (chained hashes, stop at the first miss, a hit confirmed by tokens and parent,
full blocks only, the last token never covered); a wrong answer is named when a usual slip gives it
on the same input and the learner's code also gives that slip's answer on a case built so that only
that slip goes wrong there (the checks' own cases, ``CASES``). Two slips give the same answers
on every input and are told apart by the learner's bytecode: ``parent = hit.parent_hash`` from a
parent never advanced, and (in ``07.eviction``) a rebound ``free_queue`` from one never shortened.

``07.eviction``: ``take_block(free_queue, cached, block_hashes)`` is compared with vLLM's rule (the
front of the queue, strictly; a cached room there forgets its hash in both maps); what it returned
and what it left in the three structures name the slip.

A class or function that hands its work to kvlab's manager or pool is refused (``refuse_reference``).
"""

from __future__ import annotations

import copy
import dis
import functools
import inspect
import numbers
import random
from collections import Counter
from typing import NamedTuple

from kvlab.block_pool import ROOT_HASH, BlockPool, hash_block_tokens
from kvlab.grading.blame import exception_cause, explain_exception
from kvlab.grading.expect import CheckFailed, call_without_mutation, plural, short
from kvlab.grading.key_cards import (
    UNKNOWN_ID,
    KeyCardJudge,
    evening,
    print_failure,
    quietly,
    room_number,
    two_guests_grow,
)
from kvlab.grading.lab03 import append_slip
from kvlab.grading.own_code import refuse_reference
from kvlab.grading.registry import exercise
from kvlab.paged import BlockManager


def _functions(*classes) -> tuple:
    """Every method kvlab's classes define (not the dunders): calling one from the learner's code
    is handing the work over. Read from the classes, so methods kvlab adds are guarded too."""
    found = []
    for cls in classes:
        for name, value in vars(cls).items():
            if inspect.isfunction(value) and not name.startswith("__"):
                found.append(value)
    return tuple(found)


KVLAB_CODE = _functions(BlockManager, BlockPool)


def _raised(error: Exception, where: str, replay: str | None = None, hint=None) -> CheckFailed:
    """The failure for an error of the learner's code: the error, the line, the input."""
    return CheckFailed(
        "\n   ".join(explain_exception(error)),
        input=where,
        replay=replay,
        hint=hint,
        cause=hint or exception_cause(error),
    )


def _instructions(fn) -> list:
    """The bytecode of ``fn``'s own body (none for an object without code)."""
    code = getattr(fn, "__code__", None)
    return list(dis.get_instructions(code)) if code is not None else []


STORES = {"STORE_FAST", "STORE_NAME", "STORE_DEREF", "STORE_GLOBAL"}


def _stores_attribute(fn, attribute: str) -> bool:
    """Whether ``fn`` assigns ``something.attribute`` to a name (``parent = hit.parent_hash``)."""
    code = _instructions(fn)
    return any(
        a.opname == "LOAD_ATTR" and a.argval == attribute and b.opname in STORES
        for a, b in zip(code, code[1:], strict=False)
    )


def _rebinds_argument(fn, index: int) -> bool:
    """Whether ``fn`` assigns a new value to its argument number ``index`` (``queue = ...``)."""
    code = getattr(fn, "__code__", None)
    if code is None or index >= code.co_argcount:
        return False
    name = code.co_varnames[index]
    return any(i.opname in STORES and i.argval == name for i in _instructions(fn))


# === 07.copy_on_write ==========================================================================

cow = exercise("07.copy_on_write", "append_slot with shared rooms (copy-on-write)", expects="class")
COW_TASK = "sharing and copying the rooms"

NEW, COPY, IN_PLACE, OTHER = "new", "copy", "in place", "other"
# what append_slot should do to the key card, and what the learner's call did
WANT = {
    NEW: "the token goes to a new room added to the key card (no copy)",
    COPY: "a new room replaces it on this key card (a copy)",
    IN_PLACE: "the token goes into its empty bed (the key card stays as it is)",
}
EXPECTED = {NEW: "a new room added", COPY: "the last room replaced", IN_PLACE: "the same key card"}
DID = {
    NEW: "a new room was added",
    COPY: "the last room was replaced",
    IN_PLACE: "the key card did not change",
    OTHER: "the key card changed otherwise",
}

FULL_SHARED = (
    "a full room needs no copy: nobody writes into it again, so it stays shared. When the last "
    "room is full (num_tokens % block_size == 0), add a new room for the token and return None, "
    "whatever the full room's ref_count"
)
HELD_ONCE = (
    "only a shared room (ref_count > 1) is copied: a room this guest alone holds "
    "(ref_count == 1) takes the token in its empty bed, with no new room and nothing to copy"
)
NO_COW = (
    "the last room is shared (ref_count > 1): the token's bed is one the other guests read too. "
    "Move to a copy first: take a new room, put it in the shared room's place on this key card "
    "(table[-1] = new), drop one reference to the shared room, return (shared room, new room)"
)
APPENDED_COPY = (
    "the copy replaces the shared room on the key card (table[-1] = new) and the tokens so far "
    "are copied into it, so the key card keeps its length; appending the new room leaves the "
    "shared room on this key card as well"
)
RETURN_PAIR = (
    "return (src, dst) after moving to a copy, the shared room and the new one: the caller "
    "copies the K and V of the tokens already there into the new room, which otherwise holds "
    "whatever its last guest left"
)
SWAPPED = (
    "return (src, dst) = (shared room, new room): the copy goes from the old room to the new one, "
    "and (dst, src) would overwrite the shared room with the new room's stale contents"
)
RETURN_NONE = "return None when nothing is copied: the caller copies whatever append_slot returns"
FULL_PAIR = (
    "return None when the last room was full: the token went to a new room and nothing was "
    "copied, so there is no (src, dst); a pair is returned only after moving to a copy of a "
    "shared, partly filled room"
)
RETURN_TUPLE = (
    "return the pair as a tuple, `return src, dst` (append_slot is annotated "
    "tuple[int, int] | None), not as a list"
)
KEPT_FULL = (
    "the full room stays on this key card (the token went to a new room after it), so this guest "
    "still holds it: leave its ref_count as it is. A reference is dropped only when a shared room "
    "leaves the key card, replaced by its copy"
)
DROP_REF = (
    "drop one reference to the shared room when you move to a copy (ref_counts[src] -= 1): this "
    "key card no longer holds it, and with a ref_count one too high it never goes back to the "
    "free list when the other guests check out"
)
DROP_ONE = (
    "drop exactly one reference to the shared room (ref_counts[src] -= 1): the other guests still "
    "hold it, each with one reference"
)
NEW_REF = (
    "a new room is held by one key card: set its ref_count to 1 when you take it "
    "(self.ref_counts[new] = 1), or free() never gives it back"
)
TAKE_FIRST = (
    "count the free rooms first, then take one: raise OutOfBlocks before popping the free list"
)
COUNT_FIRST = (
    "the token count moved although no room was free: raise OutOfBlocks before counting the new "
    "token (count it last, once its bed is sure)"
)
REF_FIRST = (
    "a reference changed although no room was free: raise OutOfBlocks before dropping the shared "
    "room's reference"
)
NOT_POPPED = (
    "append_slot put a room on the key card without taking it off the free list: pop it "
    "(new = self.free_blocks.pop())"
)
FREED_SHARED = (
    "the shared room went back to the free list while other guests still hold it (its "
    "ref_count is above 0), so a later check-in gets a room someone is reading: after the copy "
    "only drop this guest's reference (ref_counts[src] -= 1); a room goes back to the free list "
    "in free(), when its ref_count reaches 0"
)
NO_ROOM_FOR_COPY = (
    "with no free room for the copy, raise OutOfBlocks and change nothing: writing the token "
    "into the shared room in place changes it for every guest holding it (your append_slot "
    "moves to a copy when a room is free: only the refusal is missing)"
)
ALL_SHARERS = (
    "only the writer moves to the copy: put the new room on this guest's key card alone "
    "(table[-1] = new). The other guests keep the shared room: it holds their tokens, and they "
    "have not written into it"
)
POP_EMPTY = (
    "the free list ran out (IndexError from pop): when a room is needed, check "
    "`if not self.free_blocks` and raise OutOfBlocks before taking anything"
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


def _rooms(table: list) -> str:
    """A key card as the list of its room numbers."""
    text = str(table)
    return text if len(text) <= 60 else short(table, 60)


def _pair(value):
    """``value`` as a pair of room numbers, or None when it is not one."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        return None
    if not all(room_number(v) for v in value):
        return None
    return int(value[0]), int(value[1])


def _copies_held_once(cls) -> bool:
    """Whether the learner's append_slot replaces a partly filled room only this guest holds."""

    def probe():
        m = cls(8, 4)
        m.allocate("probe", 1)
        before = list(m.block_table("probe"))
        value = m.append_slot("probe")
        return value is not None or list(m.block_table("probe")) != before

    return bool(quietly(probe))


def _shared_copy(cls):
    """A probe manager of 4 rooms of 4 beds: 'a' checks in with 2 tokens, 'b' forks it and
    appends, which moves 'b' to a copy of the shared room. ``(manager, b's key card before)``."""
    m = cls(4, 4)
    m.allocate("a", 2)
    m.fork("a", "b")
    before = list(m.block_table("b"))
    m.append_slot("b")
    return m, before


def _frees_shared_room(cls) -> bool:
    """Whether the learner's append_slot, moving to a copy, puts the shared room on the free
    list although another guest holds it: later check-ins are handed that room."""

    def probe():
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

    return bool(quietly(probe))


def _copies_with_room_free(cls) -> bool:
    """Whether the learner's append_slot moves to a copy of a shared, partly filled room when a
    room is free (so writing in place with none free is the missing refusal)."""

    def probe():
        m, before = _shared_copy(cls)
        return _action(before, list(m.block_table("b"))) == COPY

    return bool(quietly(probe))


def _copy_given_to_all(before: dict, after: dict, src, dst) -> bool:
    """Whether the other guests' key cards changed only by the shared room ``src`` replaced with
    the writer's new room ``dst``."""
    return before.keys() == after.keys() and all(
        after[s] == [dst if b == src else b for b in t] for s, t in before.items()
    )


def _pairs_full_alone(cls) -> bool:
    """Whether the learner's append_slot returns a pair when a full room only this guest holds
    gets a new room after it (so a pair for a full shared room is the same slip)."""

    def probe():
        m = cls(8, 4)
        m.allocate("probe", 4)
        return _pair(m.append_slot("probe")) is not None

    return bool(quietly(probe))


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

    # --- what the learner's manager holds ----------------------------------------------------
    def refs(self) -> list:
        return [self.obj.ref_count(b) for b in range(self.num_blocks)]

    def state(self) -> tuple:
        return (*super().state(), self.refs())

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
            return NEW_REF
        if block == last["src"] and last["did"] == COPY:
            if got == want + 1:
                return DROP_REF
            if got < want:
                return DROP_ONE
        if block == last["src"] and last["did"] == NEW and got < want:
            return KEPT_FULL  # a reference dropped to the full room, still on the key card
        return None

    def count_slip(self, method, before, after, rooms) -> str | None:
        if method != "append_slot" or before is None:
            return None
        if before - after < rooms:
            copied = self.last is not None and self.last["did"] == COPY
            if copied and _frees_shared_room(self.cls):
                return FREED_SHARED
            return NOT_POPPED
        return "append_slot took more rooms off the free list than it put on the key card"

    # --- calls -------------------------------------------------------------------------------
    def explain_error(self, error, method, args, want=None, **context):
        if not isinstance(error, MemoryError) or method != "append_slot":
            return "this call should work", None
        free = self.obj.num_free_blocks
        if want == IN_PLACE:
            hint = self.rooms_slip() or (HELD_ONCE if _copies_held_once(self.cls) else None)
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
            "shared": holders > 1,
        }
        if did != want:
            beds = tokens % self.block_size
            room = "full" if beds == 0 else f"{beds} of {self.block_size} beds taken"
            who = "held by this guest alone" if holders == 1 else f"on {holders} key cards"
            self.fail(
                f"{seq!r} holds {plural(tokens, 'token')}; its last room is {room} and {who}, "
                f"so {WANT[want]}",
                expected=EXPECTED[want],
                got=f"{DID[did]}: {_rooms(before)} → {_rooms(after)}",
                hint=self._action_slip(want, did, holders),
            )
        self._returned(moved, want, before, after, holders)
        now = self.others(seq)
        if now != others:
            given = did == COPY and _copy_given_to_all(others, now, before[-1], after[-1])
            changed = [s for s in others if now.get(s) != others[s]]
            self.fail(
                "append_slot changed another guest's key card",
                expected=", ".join(f"{s!r}: {_rooms(others[s])}" for s in changed),
                got=", ".join(f"{s!r}: {_rooms(now.get(s))}" for s in changed),
                hint=ALL_SHARERS if given else None,
            )
        self.check("append_slot", free_before, int(want != IN_PLACE))

    def _action_slip(self, want: str, did: str, holders: int) -> str | None:
        """The hint for doing ``did`` where ``want`` was right: a miscount of full rooms (seen on
        a guest alone, as in Lab 03) first, then the copy-on-write slips."""
        counted = self.rooms_slip()
        if counted:
            return counted
        if want == NEW and did == COPY:
            return FULL_SHARED if holders > 1 else None
        if want == IN_PLACE and did == COPY:
            return HELD_ONCE
        if want == COPY and did == IN_PLACE:
            return NO_COW
        if want == COPY and did == NEW:
            return APPENDED_COPY
        return None

    def _returned(self, moved, want: str, before: list, after: list, holders: int) -> None:
        if want != COPY:
            if moved is not None:
                hint = RETURN_NONE
                if want == NEW and _pair(moved) is not None:  # a pair for a full room
                    alone = holders == 1 or _pairs_full_alone(self.cls)
                    hint = FULL_PAIR if alone else FULL_SHARED
                self.fail(
                    "nothing was copied: append_slot returns None",
                    expected="None",
                    got=short(moved),
                    hint=hint,
                )
            return
        src, dst = before[-1], after[-1]
        pair = _pair(moved)
        if pair == (src, dst):
            if not isinstance(moved, tuple):
                self.fail(
                    "after a move to a copy append_slot returns the tuple (src, dst)",
                    expected=f"({src}, {dst})",
                    got=short(moved),
                    hint=RETURN_TUPLE,
                )
            return
        hint = None
        if moved is None:
            hint = RETURN_PAIR
        elif pair == (dst, src):
            hint = SWAPPED
        self.fail(
            "after a move to a copy append_slot returns (src, dst): the shared room, the new room",
            expected=f"({src}, {dst})",
            got=short(moved),
            hint=hint,
        )

    def refused_append(self, seq, why: str) -> None:
        """append_slot must raise OutOfBlocks (a MemoryError) and change nothing."""
        self.appended = True
        want, _ = self.want(seq)
        before = list(self.obj.block_table(seq))
        self.refused(MemoryError, "append_slot", seq, why=why, want=want, before=before, seq=seq)

    # --- refusals ----------------------------------------------------------------------------
    def not_refused(self, error, errors, why, want=None, before=None, seq=None, missing=None):
        name = "OutOfBlocks (a MemoryError)" if errors is MemoryError else errors.__name__
        if error is None:
            hint = missing
            if errors is MemoryError:
                did = _action(before, list(self.obj.block_table(seq)))
                if want == COPY and did == IN_PLACE:
                    hint = NO_ROOM_FOR_COPY if _copies_with_room_free(self.cls) else NO_COW
                elif want == NEW and did == IN_PLACE:
                    hint = self.rooms_slip()
            self.fail(why, expected=name, got="no error", hint=hint)
        hint = f"raise {name.split()[0]} here"
        if isinstance(error, IndexError) and errors is MemoryError:
            hint = POP_EMPTY
        self.fail(why, expected=name, got=explain_exception(error)[0], hint=hint)

    def changed(self, before: tuple, after: tuple, errors) -> None:
        tables, free, tokens, refs = before
        changes = []
        if after[1] != free:
            changes.append(f"free rooms {free} → {after[1]}")
        changes += [f"{s!r}'s key card" for s in tables if after[0].get(s) != tables[s]]
        changes += [f"num_tokens({s!r})" for s in tokens if after[2].get(s) != tokens[s]]
        changes += [f"room {b}'s ref_count" for b, r in enumerate(refs) if after[3][b] != r]
        hint = None
        if errors is not MemoryError:
            hint = "validate the arguments before changing anything"
        elif after[1] < free:
            hint = TAKE_FIRST
        elif after[0] == tables and after[1] == free and after[3] == refs:
            hint = COUNT_FIRST
        elif after[0] == tables and after[1] == free and after[2] == tokens:
            hint = REF_FIRST
        self.fail(
            "a refused call must change nothing",
            got="changed " + (", ".join(changes) or "the hotel"),
            hint=hint,
        )


@cow.check(
    "a guest alone in their rooms: append_slot fills the empty beds in place, takes a new room "
    "when the last is full, and returns None"
)
def _alone(cls):
    two_guests_grow(_Judge, cls)  # Lab 03's scenario, now with reference counts


@cow.check(
    "after a fork two guests share every room; the first to write into the shared last room "
    "moves to a copy and gets (old room, new room)"
)
def _fork(cls):
    judge = _Judge(cls, 16, 4)
    judge.allocate("prompt", 6)
    judge.fork("prompt", "sample")
    judge.append("sample")  # moves to a copy of the half-full room
    judge.append("prompt")  # now alone in the old room: in place
    for _ in range(3):
        judge.append("sample")
        judge.append("prompt")


@cow.check(
    "a full shared room is not copied: the next token goes to a new room and the full room "
    "stays shared"
)
def _full_shared(cls):
    judge = _Judge(cls, 16, 4)
    judge.allocate("prompt", 8)
    judge.fork("prompt", "sample")
    judge.append("sample")
    judge.append("prompt")
    judge.append("sample")
    judge.free("sample")
    judge.free("prompt")


@cow.check(
    "three samples of one prompt: each writer drops one reference, and every room comes back "
    "when all three check out"
)
def _three(cls):
    judge = _Judge(cls, 16, 4)
    judge.allocate("prompt", 5)
    judge.fork("prompt", "s1")
    judge.fork("prompt", "s2")
    judge.append("s1")  # the shared room goes from 3 key cards to 2
    judge.append("s2")  # … and to 1
    judge.append("prompt")  # alone now: in place
    judge.fork("s1", "s1b")  # a beam of a beam
    judge.append("s1b")
    for seq in ("s1", "s2", "prompt", "s1b"):
        judge.free(seq)


@cow.check(
    "append_slot refuses without changing anything when it needs a room and none is free (a "
    "full last room, a shared last room), and for an unknown id"
)
def _refused(cls):
    judge = _Judge(cls, 3, 4)
    judge.allocate("a", 4)  # one full room
    judge.allocate("b", 6)  # two rooms, the last with empty beds: the hotel is full
    judge.fork("b", "c")
    judge.refused_append("a", "the last room of 'a' is full and no room is free")
    judge.refused_append("c", "the last room of 'c' is shared and no room is free for the copy")
    judge.refused(KeyError, "append_slot", "nobody", **UNKNOWN_ID)
    judge.free("a")
    judge.append("c")  # the copy gets the room 'a' gave back
    judge.append("b")  # alone again in the old room: in place, with no room free


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


def beam_evening(cls, steps: int = EVENING_STEPS, seed: int = EVENING_SEED, echo: bool = True):
    """The check's random evening on ``cls``: 24 rooms of 3 beds, check-ins, forks, tokens
    (refused when no room is free) and check-outs drawn from ``random.Random(seed)``. With
    ``echo`` it prints every call and, if the manager breaks an invariant, the check's report.
    Returns the judge (its ``obj`` is the manager), or None when ``cls`` cannot be built."""
    return evening(_Judge, cls, _evening_call, run=beam_evening, steps=steps, seed=seed, echo=echo)


@cow.check("beam search at random: 300 check-ins, forks, tokens and check-outs")
def _random_cow(cls):
    beam_evening(cls, echo=False)


# === 07.cached_prefix ==========================================================================

prefix = exercise("07.cached_prefix", "the longest cached prefix")
PREFIX_TASK = "finding the cached rooms"


class CachedBlock(NamedTuple):
    """A cached room, as the lab's cell defines it: what the checks put in ``cached``."""

    block_id: int
    parent_hash: int
    token_ids: tuple


UNCHAINED = (
    "each block's hash is chained to the block before it: hash_block_tokens(parent, tokens) with "
    "parent = the previous block's hash (ROOT_HASH only for the first). Hashed on their own, the "
    "same tokens after another prefix look cached, but their K and V differ"
)
PARENT_HASH = (
    "the next block's parent is the hash of this block, the key you just looked up (parent = "
    "key), not this block's own parent_hash: that is the hash of the block before it, so your "
    "parent never moves past ROOT_HASH and every later block is looked up as if it opened the "
    "prompt"
)
OVERLAP = (
    "the blocks overlap: block i is token_ids[i * block_size : (i + 1) * block_size], the "
    "block_size tokens after the i blocks before it; token_ids[i : i + block_size] starts only "
    "one token after the block before it"
)
NO_STOP = (
    "stop at the first block that is not cached: the blocks after it follow a prefix whose K and "
    "V are not in the cache, so they must be computed anyway"
)
NO_CONFIRM = (
    "a hash is only a lookup key: confirm a hit by comparing the cached room's token_ids with the "
    "block's tokens (as tuples) and its parent_hash with your parent; a colliding entry is a miss"
)
NO_PARENT_CONFIRM = (
    "compare the cached room's parent_hash with the parent you hashed with too: the same tokens "
    "after another prefix are another block, and a collision can hide that"
)
COVERS_LAST = (
    "the prompt's last token is always computed (its logits give the first new token), so a "
    "prompt of exactly k × block_size tokens reuses at most k − 1 rooms: look up only "
    "(len(token_ids) - 1) // block_size blocks"
)
PARTIAL = (
    "only full blocks are cached: look up (len(token_ids) - 1) // block_size blocks, never the "
    "partly filled block at the end of the prompt"
)
DROPS_ONE = (
    "only a prompt of exactly k × block_size tokens must leave its last full block: when the "
    "prompt ends in a partly filled block, the last token is already outside the full blocks. "
    "Look up (len(token_ids) - 1) // block_size blocks"
)
TUPLE_LIST = (
    "a CachedBlock's token_ids is a tuple and a slice of the prompt is a list, and a tuple never "
    "equals a list: compare tuple(entry.token_ids) == tuple(block)"
)
RETURN_HASHES = "return the cached rooms' block ids (entry.block_id), not their hashes"
RETURN_ID_TEXT = "return the room numbers as ints (entry.block_id), not as their text"
RETURN_IDS = (
    "return each entry's block_id (entry.block_id, an int), not the CachedBlock entries: the "
    "caller puts room numbers on the key card"
)
RETURN_LIST = "return a list of room numbers (block ids), [] when nothing is cached"


def cached_prefix(
    token_ids,
    block_size: int,
    cached: dict,
    *,
    chained: str = "yes",
    stop: bool = True,
    parent_on_miss: bool = True,
    confirm_tokens: bool = True,
    confirm_parent: bool = True,
    blocks: str = "right",
    overlap: bool = False,
) -> list[int]:
    """The lab's rule (with the defaults), or one of its usual slips. ``chained``: "yes" (the
    rule), "root" (every block hashed with ROOT_HASH as its parent), "key" (hashed with
    ROOT_HASH, while the parent a hit is confirmed with follows those keys). ``overlap``: block
    i is ``token_ids[i : i + block_size]``."""
    n = len(token_ids)
    count = {
        "right": (n - 1) // block_size,
        "covers_last": n // block_size,
        "partial": -(-n // block_size),
        "drops_one": n // block_size - 1,
    }[blocks]
    hits, parent = [], ROOT_HASH
    for i in range(max(count, 0)):
        start = i if overlap else i * block_size
        block = tuple(token_ids[start : start + block_size])
        key_parent = parent if chained == "yes" else ROOT_HASH
        key = hash_block_tokens(key_parent, block)
        entry = cached.get(key)
        hit = (
            entry is not None
            and (not confirm_tokens or tuple(entry.token_ids) == block)
            and (
                not confirm_parent
                or entry.parent_hash == (parent if chained == "key" else key_parent)
            )
        )
        if hit:
            hits.append(entry.block_id)
        elif stop:
            break
        if (hit or parent_on_miss) and chained != "root":
            parent = key
    return hits


def _chain_hashes(token_ids, block_size: int, count: int) -> list[int]:
    hashes, parent = [], ROOT_HASH
    for i in range(count):
        parent = hash_block_tokens(parent, token_ids[i * block_size : (i + 1) * block_size])
        hashes.append(parent)
    return hashes


def cache_prompt(cached: dict, token_ids, block_size: int, room_ids) -> list[int]:
    """Put every full block of a finished guest's tokens in ``cached`` (rooms from ``room_ids``,
    an iterator; a block already cached keeps its room). Returns the rooms, in order."""
    rooms, parent = [], ROOT_HASH
    for i in range(len(token_ids) // block_size):
        block = tuple(token_ids[i * block_size : (i + 1) * block_size])
        key = hash_block_tokens(parent, block)
        if key not in cached:
            cached[key] = CachedBlock(next(room_ids), parent, block)
        rooms.append(cached[key].block_id)
        parent = key
    return rooms


def _prompt_text(token_ids) -> str:
    text = str(list(token_ids))
    if len(text) > 70:
        text = text[:68].rsplit(",", 1)[0] + ", …]"
    return f"{text} ({plural(len(token_ids), 'token')})"


def _expect_prefix(fn, token_ids, block_size: int, cached: dict, story: str, replay=None):
    where = f"{story}; longest_cached_prefix({_prompt_text(token_ids)}, {block_size}, cached)"
    expected = cached_prefix(token_ids, block_size, cached)
    try:
        with refuse_reference(*KVLAB_CODE, learner=fn, task=PREFIX_TASK):
            got = call_without_mutation(
                fn, list(token_ids), block_size, cached, names=("token_ids", "block_size", "cached")
            )
    except CheckFailed as failure:
        failure.input = failure.input or where
        failure.replay = failure.replay or replay
        raise
    except NotImplementedError:
        raise
    except Exception as error:
        raise _raised(error, where, replay) from None

    def fail(message, **details):
        raise CheckFailed(message, input=where, replay=replay, expected=_rooms(expected), **details)

    if not isinstance(got, list):
        hint = RETURN_LIST if got is None or isinstance(got, (tuple, int)) else None
        fail("longest_cached_prefix returns a list", got=short(got), hint=hint)
    if not all(room_number(room) for room in got):
        entries = bool(got) and all(hasattr(room, "block_id") for room in got)
        text = [str(room) for room in expected] == [str(room).strip() for room in got]
        fail(
            "longest_cached_prefix returns room numbers (ints)",
            got=short(got, 90),
            hint=RETURN_IDS if entries else RETURN_ID_TEXT if text else None,
        )
    if got != expected:
        hint, cause = _prefix_slip(fn, got, token_ids, block_size, cached)
        fail("wrong rooms", got=_rooms(got), hint=hint, cause=cause)


# --- the cases the checks try, by name (the slips' probes are among them) --------------------

EARLIER = list(range(100, 116))  # an earlier prompt: 4 rooms of 4 beds, cached in rooms 7, 3, 12, 0
EARLIER_STORY = "cached: the 4 rooms (7, 3, 12, 0) of an earlier prompt 100…115, 4 beds a room"


def _earlier(token_ids, story: str = EARLIER_STORY, planted: dict | None = None):
    cached: dict = {}
    cache_prompt(cached, EARLIER, 4, iter([7, 3, 12, 0]))
    return story, list(token_ids), 4, {**cached, **(planted or {})}


def _two_openings(token_ids):
    cached: dict = {}
    rooms = iter([21, 22, 23, 24])
    cache_prompt(cached, [5, 5, 5, 5, 8, 8, 8, 8], 4, rooms)
    cache_prompt(cached, [1, 1, 1, 1, 2, 2, 2, 2], 4, rooms)
    story = (
        "cached: the rooms of two earlier prompts, 5555 8888 (rooms 21, 22) and 1111 2222 (23, 24)"
    )
    return story, token_ids, 4, cached


def _hole():
    prompt = list(range(40, 60))  # 5 rooms of 4 beds
    cached: dict = {}
    cache_prompt(cached, prompt, 4, iter([30, 31, 32, 33, 34]))
    del cached[_chain_hashes(prompt, 4, 3)[2]]
    story = (
        "cached: rooms 30, 31, 33, 34 of an earlier prompt 40…59 (its third block, room 32, was "
        "evicted)"
    )
    return story, [*prompt, 60], 4, cached


def _skip():
    cached: dict = {}
    cache_prompt(cached, list(range(70, 82)), 4, iter([40, 41, 42]))
    story = "cached: rooms 40, 41, 42 of an earlier prompt 70…81 (blocks 70…73, 74…77, 78…81)"
    return story, [70, 71, 72, 73, 1, 1, 1, 1, 74, 75, 76, 77, 2], 4, cached


H0 = hash_block_tokens(ROOT_HASH, EARLIER[:4])
OTHER = (60, 61, 62, 63)
COLLIDING = hash_block_tokens(H0, OTHER)  # where block 60…63 after 100…103 is looked up


def _tokens_collide():
    story = (
        "cached: the 4 rooms of the earlier prompt 100…115, and room 99 (tokens 104…107) filed "
        "under the hash of block 60…63 after 100…103, as if the two collided"
    )
    planted = {COLLIDING: CachedBlock(99, H0, tuple(EARLIER[4:8]))}
    return _earlier([*EARLIER[:4], *OTHER, 64], story, planted)


def _parents_collide():
    story = (
        "cached: the 4 rooms of the earlier prompt 100…115, and room 98 (tokens 60…63 after "
        "1 2 3 4) filed under the hash of 60…63 after 100…103, as if the two collided"
    )
    planted = {COLLIDING: CachedBlock(98, hash_block_tokens(ROOT_HASH, [1, 2, 3, 4]), OTHER)}
    return _earlier([*EARLIER[:4], *OTHER, 64], story, planted)


def _half_block():
    parent = _chain_hashes(EARLIER, 4, 2)[1]
    story = (
        "cached: the 4 rooms of the earlier prompt 100…115, and room 55 filed under the hash of "
        "the half block 108 109 (a cache keeps only full blocks; a lookup must not ask for one)"
    )
    key = hash_block_tokens(parent, EARLIER[8:10])
    return _earlier(EARLIER[:10], story, {key: CachedBlock(55, parent, tuple(EARLIER[8:10]))})


def _overlapping():
    cached: dict = {}
    rooms = iter([50, 51, 52])
    cache_prompt(cached, [1, 2, 3, 4, 5, 6, 7, 8], 4, rooms)
    cache_prompt(cached, [1, 2, 3, 4, 2, 3, 4, 5], 4, rooms)
    story = (
        "cached: the rooms of two earlier prompts, 1234 5678 (rooms 50, 51) and 1234 2345 (50, 52)"
    )
    return story, [1, 2, 3, 4, 5, 6, 7, 8, 9], 4, cached


def _one_bed(token_ids):
    cached: dict = {}
    cache_prompt(cached, [3, 4], 1, iter([8, 9]))
    return "cached: rooms 8 and 9 of an earlier prompt 3 4, one bed a room", token_ids, 1, cached


CASES = {
    "past the end": lambda: _earlier([*EARLIER, 116]),
    "diverges": lambda: _earlier([*EARLIER[:8], 90, 91, 92, 93, *EARLIER[12:], 5]),
    "splits early": lambda: _earlier([*EARLIER[:6], 1, 2, 3]),
    "empty": lambda: ("an empty cache", [5, 6, 7, 8, 9], 4, {}),
    "next block": _overlapping,
    "other opening": lambda: _two_openings([1, 1, 1, 1, 5, 5, 5, 5, 9]),
    "chain": lambda: _two_openings([1, 1, 1, 1, 2, 2, 2, 2, 9, 9, 9, 9]),
    "hole": _hole,
    "skip": _skip,
    "tokens collide": _tokens_collide,
    "parents collide": _parents_collide,
    "half block": _half_block,
    "exact": lambda: _earlier(EARLIER),
    "one past exact": lambda: _earlier(EARLIER[:13]),
    "one bed": lambda: _one_bed([3]),
    "two beds": lambda: _one_bed([3, 4]),
}


# (how the slip differs from the rule, hint, cause, the case it is confirmed on), tried in order.
# A slip is named only when the learner's answer is the slip's both on the failing input and on
# its own case, built so that only that slip goes wrong there; one cause for each family, so a
# variant seen later folds into the first.
CHAIN, STOP, CONFIRM, WHICH, SLICE = (
    f"07.cached_prefix: {c}" for c in ("chain", "stop", "confirm", "blocks", "slice")
)
PREFIX_SLIPS = [
    (dict(overlap=True), OVERLAP, SLICE, "next block"),
    (dict(chained="root"), UNCHAINED, CHAIN, "chain"),
    (dict(chained="root", confirm_parent=False), UNCHAINED, CHAIN, "chain"),
    (dict(chained="key"), UNCHAINED, CHAIN, "chain"),
    (dict(stop=False), NO_STOP, STOP, "hole"),
    (dict(stop=False, parent_on_miss=False), NO_STOP, STOP, "skip"),
    (dict(confirm_parent=False), NO_PARENT_CONFIRM, CONFIRM, "parents collide"),
    (dict(confirm_tokens=False, confirm_parent=False), NO_CONFIRM, CONFIRM, "tokens collide"),
    (dict(confirm_tokens=False), NO_CONFIRM, CONFIRM, "tokens collide"),
    (dict(blocks="covers_last"), COVERS_LAST, WHICH, "exact"),
    (dict(blocks="partial"), PARTIAL, WHICH, "half block"),
    (dict(blocks="drops_one"), DROPS_ONE, WHICH, "past the end"),
]


def _prefix_slip(fn, got, token_ids, block_size, cached) -> tuple[str | None, str | None]:
    """(hint, cause) for a wrong answer that a usual slip gives on this input and on its own
    case, else (None, None)."""
    right = cached_prefix(token_ids, block_size, cached)
    for how, hint, cause, case in PREFIX_SLIPS:
        if got != cached_prefix(token_ids, block_size, cached, **how):
            continue
        _, *probe = CASES[case]()
        slip = cached_prefix(*probe, **how)
        if quietly(functools.partial(fn, list(probe[0]), *probe[1:])) == slip:
            if how.get("chained") == "root" and _stores_attribute(fn, "parent_hash"):
                hint = PARENT_HASH  # `parent = entry.parent_hash`: the parent stays ROOT_HASH
            return hint, cause
    if got and got == _chain_hashes(token_ids, block_size, len(got)):
        return RETURN_HASHES, RETURN_HASHES
    if got == [] and right:
        listed = {k: e._replace(token_ids=list(e.token_ids)) for k, e in cached.items()}
        if quietly(lambda: fn(list(token_ids), block_size, listed)) == right:
            return TUPLE_LIST, TUPLE_LIST
    return None, None


def _try(fn, *names: str) -> None:
    for name in names:
        story, token_ids, block_size, cached = CASES[name]()
        _expect_prefix(fn, token_ids, block_size, cached, story)


@prefix.check(
    "the rooms of an earlier prompt are found from the first block on, up to the first block "
    "not cached"
)
def _found(fn):
    _try(fn, "past the end", "diverges", "splits early", "empty", "next block")


@prefix.check(
    "the same tokens after another prefix are another block: each hash is chained to the block "
    "before it"
)
def _chained(fn):
    _try(fn, "other opening", "chain")


@prefix.check("a hole in the cache: no room after the first miss is reused")
def _holes(fn):
    _try(fn, "hole", "skip")


@prefix.check(
    "a hash collision never shares a room: a hit is confirmed by its tokens and its parent hash"
)
def _collision(fn):
    _try(fn, "tokens collide", "parents collide")


@prefix.check(
    "only full rooms count and the prompt's last token is always computed: k full rooms reuse "
    "at most k − 1"
)
def _last_token(fn):
    _try(fn, "half block", "exact", "one past exact", "one bed", "two beds")


PREFIX_SEED, PREFIX_CASES = 5, 200


def random_prompt(case: int, seed: int = PREFIX_SEED) -> tuple[list[int], int, dict]:
    """Case ``case`` of the check's random prompts: ``(token_ids, block_size, cached)``. Earlier
    prompts built on two shared openings (a system prompt) are cached, some entries evicted, and
    now and then an entry planted under a colliding hash."""
    rng = random.Random(seed * 10_000 + case)
    size = rng.choice([1, 2, 4, 16])
    vocab = rng.choice([3, 50])

    def tokens(n):
        return [rng.randrange(vocab) for _ in range(n)]

    openings = [tokens(rng.randint(0, 3) * size + rng.randint(0, size)) for _ in range(2)]

    def prompt():
        return (rng.choice(openings) + tokens(rng.randint(0, 3 * size))) or tokens(1)

    cached: dict = {}
    rooms = iter(rng.sample(range(1000), 1000))
    for _ in range(rng.randint(0, 4)):
        cache_prompt(cached, prompt(), size, rooms)
    for key in list(cached):
        if rng.random() < 0.1:
            del cached[key]
    query = prompt()
    if rng.random() < 0.3 and len(query) >= size:
        query = query[: len(query) // size * size]
    full = (len(query) - 1) // size
    if full and rng.random() < 0.2:
        i = rng.randrange(full)
        keys = _chain_hashes(query, size, i + 1)
        parent = keys[i - 1] if i else ROOT_HASH
        block = tuple(query[i * size : (i + 1) * size])
        if rng.random() < 0.5:
            cached[keys[i]] = CachedBlock(next(rooms), parent, tuple(tokens(size)))
        else:
            cached[keys[i]] = CachedBlock(next(rooms), parent + 1, block)
    return query, size, cached


@prefix.check("200 random prompts against caches of earlier prompts")
def _random_prefix(fn):
    for case in range(PREFIX_CASES):
        token_ids, size, cached = random_prompt(case)
        story = f"random prompt {case + 1} of {PREFIX_CASES}: {plural(len(cached), 'cached room')}"
        replay = (
            f"`from kvlab.grading.lab07 import random_prompt; token_ids, block_size, cached = "
            f"random_prompt({case})`"
        )
        _expect_prefix(fn, token_ids, size, cached, story, replay)


# === 07.eviction ===============================================================================

evict = exercise("07.eviction", "which room to hand out")
EVICT_TASK = "choosing and evicting the room"

BACK = (
    "that is the room freed last (the back of the queue): take the front, free_queue.pop(0), "
    "the room freed longest ago, so the rooms freed recently keep their cached blocks longest"
)
PLAIN_FIRST = (
    "taking a room that holds no cached block first is a fair policy (it keeps cached rooms "
    "longer), but this exercise asks for vLLM's rule, strictly: the front of the queue, cached "
    "or not"
)
NOT_TAKEN = (
    "the room you hand out must leave the queue: take it with free_queue.pop(0), which removes "
    "it, or the next call hands the same room to another guest"
)
REBOUND = (
    "take the room off the queue in place (free_queue.pop(0)): the caller keeps using its own "
    "list, and a new list bound to the name stays inside your function"
)
FORGET_BOTH = (
    "the room at the front still holds a cached block: forget its hash in both maps (del "
    "cached[h], del block_hashes[block]), or a later prompt 'hits' a room that is about to hold "
    "another guest's tokens"
)
STALE = (
    "forget the room's hash in cached too (del cached[block_hashes[block]] before you delete it "
    "there): cached still sends a later prompt with those tokens to this room, which is about to "
    "hold another guest's tokens"
)
KEEPS_OWN = (
    "forget the room's entry in block_hashes too (del block_hashes[block]): the room no longer "
    "holds that block, and the next time it is handed out your code would evict a hash that may "
    "by then belong to another room"
)
OVER_EVICT = (
    "evict only the room you hand out: the other cached rooms in the queue keep their hashes, "
    "ready for a prompt that reuses them"
)
KEYED_BY_HASH = (
    "cached is keyed by block hash, not by room number: look the room's hash up first "
    "(h = block_hashes[block]), then del cached[h]"
)
NOT_CACHED = "a room at the front may hold no cached block: evict only `if block in block_hashes`"
EMPTY = (
    "raise OutOfBlocks when free_queue is empty, before taking anything (pop(0) of an empty list "
    "raises IndexError)"
)
EMPTY_NONE = (
    "an empty queue must raise OutOfBlocks (kvlab.paged.OutOfBlocks), not return None: "
    "`if not free_queue: raise OutOfBlocks(...)` before taking anything"
)
EMPTY_VALUE = (
    "an empty queue must raise OutOfBlocks (kvlab.paged.OutOfBlocks), not return a value: "
    "`if not free_queue: raise OutOfBlocks(...)` before taking anything"
)
RETURN_ROOM = "return the room number you took"
RETURN_HASH = (
    "return the room number (the block you took), not its hash: block_hashes[block] is the key "
    "of its block in cached"
)

# a room number returned as another type: {kind} is the type's name
RETURN_ALONE = "return the room number alone, an int (return block), not a {kind} holding it"
RETURN_TEXT = "return the room number, an int (return block), not its text (a {kind})"
RETURN_NUMBER = "return the room number, an int (return block), not a {kind}"


def _room_type_slip(got, expected: int) -> str | None:
    """The hint for a room number returned as something other than an int."""
    if got is None:
        return RETURN_ROOM
    kind = type(got).__name__
    if isinstance(got, (tuple, list)) and expected in got:
        return RETURN_ALONE.format(kind=kind)
    if isinstance(got, str) and got.strip() == str(expected):
        return RETURN_TEXT.format(kind=kind)
    if isinstance(got, numbers.Real) and not isinstance(got, bool) and got == expected:
        return RETURN_NUMBER.format(kind=kind)
    return None


def reference_take(free_queue: list, cached: dict, block_hashes: dict) -> int:
    """The rule the exercise asks for (kvlab's BlockPool.get_new_block on plain structures)."""
    block = free_queue.pop(0)
    if block in block_hashes:
        del cached[block_hashes.pop(block)]
    return block


def _queue_text(queue, hashes) -> str:
    shown = ", ".join(f"{b}*" if b in hashes else str(b) for b in queue[:12])
    more = f", … ({len(queue)} in all)" if len(queue) > 12 else ""
    return f"[{shown}{more}]"


def _hotel_text(queue, cached, hashes) -> str:
    cached_rooms = sorted(hashes)
    return (
        f"free_queue {_queue_text(queue, hashes)} (front first, * = holds a cached block), "
        f"cached rooms {_rooms(cached_rooms)}"
    )


def _take_error_slip(error, queue, hashes) -> str | None:
    if isinstance(error, KeyError) and queue and error.args and error.args[0] == queue[0]:
        return KEYED_BY_HASH if queue[0] in hashes else NOT_CACHED
    return None


def _take(fn, queue: list, cached: dict, hashes: dict) -> tuple:
    """The learner's ``fn(queue, cached, hashes)`` under the hand-over guard: ``(room, None)``,
    or ``(None, error)`` when it raised (a method not written yet passes through)."""
    try:
        with refuse_reference(*KVLAB_CODE, learner=fn, task=EVICT_TASK):
            return fn(queue, cached, hashes), None
    except NotImplementedError:
        raise
    except Exception as error:
        return None, error


def _expect_take(fn, queue: list, cached: dict, hashes: dict, story: str, replay=None):
    """Call ``fn`` on the three structures (changed in place, as the caller's) and compare them
    and the room returned with the rule's. Returns the room."""
    where = f"{story}: {_hotel_text(queue, cached, hashes)}"
    before = (list(queue), dict(cached), dict(hashes))
    want_queue, want_cached, want_hashes = copy.deepcopy(before)
    expected = reference_take(want_queue, want_cached, want_hashes)

    def fail(message, **details):
        raise CheckFailed(message, input=where, replay=replay, **details)

    got, error = _take(fn, queue, cached, hashes)
    if error is not None:
        raise _raised(error, where, replay, _take_error_slip(error, before[0], before[2]))
    front = before[0][0]
    if not room_number(got):
        fail(
            "take_block returns the room number it took",
            expected=str(expected),
            got=short(got),
            hint=_room_type_slip(got, expected),
        )
    if got != expected:
        hint = None
        if front in before[2] and got == before[2][front]:
            hint = RETURN_HASH
        elif got == before[0][-1]:
            hint = BACK
        elif front in before[2] and got == next((b for b in before[0] if b not in before[2]), None):
            hint = PLAIN_FIRST
        fail("the wrong room was handed out", expected=str(expected), got=str(got), hint=hint)
    if queue != want_queue:
        fail(
            f"room {expected} leaves the queue, the others keep their order",
            expected=str(want_queue),
            got=short(queue),
            hint=(REBOUND if _rebinds_argument(fn, 0) else NOT_TAKEN)
            if queue == before[0]
            else None,
        )
    if cached != want_cached or hashes != want_hashes:
        hint = None
        if front in before[2]:
            h = before[2][front]
            kept_cached, kept_own = h in cached, front in hashes
            if kept_cached and kept_own:
                hint = FORGET_BOTH
            elif kept_cached:
                hint = STALE
            elif kept_own:
                hint = KEEPS_OWN
        if hint is None and set(cached.items()) < set(want_cached.items()):
            hint = OVER_EVICT
        fail(
            f"room {expected} "
            + (
                "held a cached block: its hash is forgotten, and nothing else"
                if front in before[2]
                else "held no cached block: the cache stays as it was"
            ),
            expected=f"cached {short(want_cached, 90)}, block_hashes {short(want_hashes, 90)}",
            got=f"cached {short(cached, 90)}, block_hashes {short(hashes, 90)}",
            hint=hint,
        )
    return got


def _expect_refused(fn, queue: list, cached: dict, hashes: dict, story: str, replay=None):
    """An empty queue: OutOfBlocks (a MemoryError), nothing changed."""
    where = f"{story}: {_hotel_text(queue, cached, hashes)}"
    before = (list(queue), dict(cached), dict(hashes))
    got, error = _take(fn, queue, cached, hashes)
    if not isinstance(error, MemoryError):
        if error is None:
            got_text = f"no error, returned {short(got)}"
            hint = EMPTY_NONE if got is None else EMPTY_VALUE
        else:
            got_text = explain_exception(error)[0]
            hint = EMPTY if isinstance(error, IndexError) else "raise OutOfBlocks here"
        raise CheckFailed(
            "no room is free: take_block is refused",
            input=where,
            replay=replay,
            expected="OutOfBlocks (a MemoryError)",
            got=got_text,
            hint=hint,
        )
    if (queue, cached, hashes) != before:
        raise CheckFailed(
            "a refused call must change nothing",
            input=where,
            replay=replay,
            expected=f"cached {short(before[1], 90)}, block_hashes {short(before[2], 90)}",
            got=f"cached {short(cached, 90)}, block_hashes {short(hashes, 90)}",
            hint="check that free_queue is not empty before changing anything",
        )


def _cached_rooms(rooms: dict) -> tuple[dict, dict]:
    """cached and block_hashes for rooms given as room -> hash."""
    return {h: b for b, h in rooms.items()}, dict(rooms)


@evict.check(
    "a plain free room at the front is handed out and leaves the queue; the cache stays as it is"
)
def _plain(fn):
    cached, hashes = _cached_rooms({6: 0x6A, 2: 0x2B})
    _expect_take(fn, [4, 1, 6, 2], cached, hashes, "room 4, at the front, holds no cached block")


@evict.check("a cached room at the front is evicted: its hash is forgotten in both maps")
def _cached_front(fn):
    cached, hashes = _cached_rooms({6: 0x6A, 2: 0x2B, 5: 0x5C})
    story = "room 6, at the front, holds a cached block; room 5 is in use and cached"
    _expect_take(fn, [6, 4, 2], cached, hashes, story)


@evict.check(
    "the room freed longest ago goes first (vLLM's rule, strictly), even with a room holding no "
    "cached block behind it"
)
def _strict(fn):
    cached, hashes = _cached_rooms({3: 0x3A, 5: 0x5B, 8: 0x8C})
    story = "rooms 3 and 5, at the front, hold cached blocks, room 0 holds none"
    queue = [3, 5, 0, 8]
    _expect_take(fn, queue, cached, hashes, story)
    _expect_take(fn, queue, cached, hashes, "then, with what is left")


@evict.check("an empty queue: OutOfBlocks, and nothing changes")
def _empty(fn):
    cached, hashes = _cached_rooms({1: 0x1A, 4: 0x4B})
    _expect_refused(fn, [], cached, hashes, "every room is in use (rooms 1 and 4 cached)")


def _prompt_rooms(rooms: list, tokens: list, block_size: int) -> dict:
    """room -> hash for the full blocks of ``tokens`` held in ``rooms``."""
    return dict(zip(rooms, _chain_hashes(tokens, block_size, len(rooms)), strict=True))


@evict.check(
    "a guest checks out (last room first in the queue) and rooms are taken one by one: the "
    "cached prefix loses its tail first"
)
def _tail_first(fn):
    card = [5, 2, 7, 0]  # a guest's key card: 16 tokens in 4 full rooms, all cached
    cached, hashes = _cached_rooms(_prompt_rooms(card, list(range(200, 216)), 4))
    queue = [1, 3, *reversed(card)]  # free rooms 1 and 3, then the guest's, last room first
    for i in range(len(queue)):
        story = (
            f"take {i + 1} of 6 after a guest with key card {card} (all 4 rooms cached) checked "
            "out behind free rooms 1 and 3"
        )
        _expect_take(fn, queue, cached, hashes, story)
    _expect_refused(fn, queue, cached, hashes, "then once more, with the queue empty")


DAY_SEED, DAY_STEPS = 9, 300


def _day_replay(fn, seed: int, steps: int) -> str:
    return (
        f"random.Random({seed}), step {steps}: `from kvlab.grading.lab07 import random_day; "
        f"random_day({getattr(fn, '__name__', 'take_block')}, steps={steps})` prints every step"
    )


def random_day(fn, steps: int = DAY_STEPS, seed: int = DAY_SEED, echo: bool = True):
    """The check's random day on ``fn``: 12 rooms; rooms are taken (``fn``), guests check out
    (their rooms join the queue last room first, their full blocks cached), and cache hits take
    cached rooms out of the middle of the queue, drawn from ``random.Random(seed)``. With
    ``echo`` it prints every step and, at the first wrong answer, the check's report."""
    rng = random.Random(seed)
    queue, cached, hashes = list(range(12)), {}, {}
    guests: list[list[int]] = []  # each guest's rooms
    step = 0

    def say(text):
        if echo:
            print(text)

    try:
        for step in range(1, steps + 1):
            roll = rng.random()
            replay = _day_replay(fn, seed, step)
            if roll < 0.55:
                story = f"step {step} of a random day, taking a room"
                if not queue:
                    say(f"{step}: take_block with the queue empty")
                    _expect_refused(fn, queue, cached, hashes, story, replay)
                    continue
                say(f"{step}: take_block from {_queue_text(queue, hashes)}")
                room = _expect_take(fn, queue, cached, hashes, story, replay)
                if guests and rng.random() < 0.6:
                    rng.choice(guests).append(room)
                else:
                    guests.append([room])
            elif roll < 0.85 and guests:
                card = guests.pop(rng.randrange(len(guests)))
                tokens = [rng.randrange(4) for _ in range(2 * len(card))]
                full = rng.randint(0, len(card))  # the last rooms may be partly filled
                for room, h in _prompt_rooms(card[:full], tokens, 2).items():
                    if h not in cached and room not in hashes:  # a reused room keeps its hash
                        cached[h], hashes[room] = room, h
                queue.extend(reversed(card))
                say(f"{step}: a guest with key card {card} checks out ({full} rooms full)")
            else:
                hit = [b for b in queue if b in hashes]
                if hit:
                    room = rng.choice(hit)
                    queue.remove(room)
                    guests.append([room])
                    say(f"{step}: a new prompt reuses cached room {room}")
    except CheckFailed as failure:
        if not echo:
            raise
        print_failure(failure)


@evict.check("a random day: 300 rooms taken, guests checking out, cached rooms reused")
def _random_day(fn):
    random_day(fn, echo=False)
