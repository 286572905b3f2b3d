"""11.window: ``hand_back(block_table, num_computed, *, window, block_size, free, null_block)``,
the step that hands back (``free(rooms)``) the rooms of a sliding-window key card, as room
numbers, that no later token reads, the null room's number standing in their places (vLLM's
``remove_skipped_blocks``).

The checks plug the learner's step into kvlab's
:class:`~kvlab.core.hybrid_block_manager.HybridBlockManager` (``window_step=``) and play days
of guests checking in, growing a token at a time and checking out. After every event a shadow
of every room (which place of which card it sits in, null or not, held or free) is compared
with the same day played by kvlab's own step, and the hotel's books are checked. A wrong day is
named when one usual slip (:data:`SLIPS`: kvlab's own manager with one hook changed) plays it
exactly as the learner's step did, and the probe days too (:func:`slipped_hotel`).
"""

from __future__ import annotations

import functools
import itertools
import random
from dataclasses import dataclass

from kvlab.core.hybrid_block_manager import HybridBlockManager
from kvlab.core.kv_spec import FullAttentionSpec, KVCacheSpec, SlidingWindowSpec, cdiv
from kvlab.core.single_type_manager import SlidingWindowManager
from kvlab.grading import slips
from kvlab.grading.expect import CheckFailed
from kvlab.grading.lab11 import hints
from kvlab.grading.own_code import refuse_reference
from kvlab.grading.registry import exercise, own_answers
from kvlab.grading.slips import Slip

window_ex = exercise("11.window", "a sliding-window key card: rooms handed back")
own_answers(
    "11.window",
    "kvlab.core.single_type_manager:SlidingWindowManager.remove_skipped_blocks",
    "kvlab.core.single_type_manager:SlidingWindowManager.blocks_freed_by_skipping",
    "kvlab.core.kv_spec:SlidingWindowSpec.first_needed",
)
REFERENCES = (
    SlidingWindowManager.remove_skipped_blocks,
    SlidingWindowManager._skipped,
    SlidingWindowManager._skip_end,
    SlidingWindowManager.blocks_freed_by_skipping,
    SlidingWindowSpec.first_needed,
    KVCacheSpec.blocks_held,
)
TASK = "handing back the rooms the window has left"
FREE_TAKES = "free takes a list"  # SteppedWindowManager's TypeError for free(room)


# --- kvlab's step and its slips: the window manager with one hook changed ---------------------


class _TooMany(SlidingWindowManager):
    def _skip_end(self, num_computed):
        return super()._skip_end(num_computed) + 1


class _RoundedUp(SlidingWindowManager):
    def _skip_end(self, num_computed):
        return cdiv(self.spec.first_needed(num_computed), self.block_size)


class _TooFew(SlidingWindowManager):
    def _skip_end(self, num_computed):
        return super()._skip_end(num_computed) - 1


class _EdgeLate(SlidingWindowManager):
    def _skip_end(self, num_computed):  # the window read as starting one token before
        return self.spec.first_needed(max(0, num_computed - 1)) // self.block_size


class _EdgeEarly(SlidingWindowManager):
    def _skip_end(self, num_computed):  # the window read as starting one token after
        return self.spec.first_needed(num_computed + 1) // self.block_size


class _Deleted(SlidingWindowManager):
    def _stand_in(self, table, end, count):
        del table[end - count : end]


class _KeptOnCard(SlidingWindowManager):
    def _stand_in(self, table, end, count):
        pass


class _NotFreed(SlidingWindowManager):
    def _give_back(self, skipped):
        pass


class _NullAgain(SlidingWindowManager):
    def _handed_back(self, block):
        return False


class _UpFromZero(SlidingWindowManager):
    def _skipped(self, seq_id, num_computed):  # walked up from place 0 to the first null
        table = self.tables[seq_id][: self._skip_end(num_computed)]
        return list(itertools.takewhile(lambda b: not self._handed_back(b), table))[::-1]


class _OneAStep(SlidingWindowManager):
    def _skipped(self, seq_id, num_computed):
        return super()._skipped(seq_id, num_computed)[:1]


SLIPPED = (
    (hints.TOO_MANY, _TooMany),
    (hints.ROUNDED_UP, _RoundedUp),
    (hints.TOO_FEW, _TooFew),
    (hints.EDGE_LATE, _EdgeLate),
    (hints.EDGE_EARLY, _EdgeEarly),
    (hints.DELETED, _Deleted),
    (hints.KEPT_ON_CARD, _KeptOnCard),
    (hints.NOT_FREED, _NotFreed),
    (hints.NULL_AGAIN, _NullAgain),
    (hints.UP_FROM_ZERO, _UpFromZero),
    (hints.ONE_A_STEP, _OneAStep),
)


# --- days -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Day:
    """Guests on a model of ``specs`` (one window group, or a full group beside it), rooms of
    ``block_size`` beds, and events: ``("in", guest, prompt)``, ``("grow", guest, tokens)``
    (one token at a time) and ``("out", guest, 0)``."""

    story: str
    specs: tuple
    block_size: int
    num_blocks: int
    events: tuple
    replay: str | None = None

    @property
    def window(self) -> int:
        return next(s.window for s in self.specs if isinstance(s, SlidingWindowSpec))

    def describe(self, upto: int | None = None, moment: str = "") -> str:
        kinds = " + ".join(
            f"a window of {s.window}" if isinstance(s, SlidingWindowSpec) else "full attention"
            for s in self.specs
        )
        shown = []
        for kind, guest, n in self.events[: None if upto is None else upto + 1]:
            word = {"in": f"{guest} checks in with {n}", "grow": f"{guest} +{n}"}
            shown.append(word.get(kind, f"{guest} checks out"))
        text = ", ".join(shown)
        if len(text) > 150:
            text = "…" + text[-148:]
        text += f" ({moment})" if moment else ""
        return f"{self.story} ({kinds}; {self.num_blocks} rooms of {self.block_size} beds): {text}"


def _window(w: int) -> tuple:
    return (SlidingWindowSpec(1, 8, window=w),)


def day(story, events, *, window=8, block_size=4, num_blocks=40, full=False, replay=None):
    specs = ((FullAttentionSpec(1, 8),) if full else ()) + _window(window)
    return Day(story, specs, block_size, num_blocks, tuple(events), replay)


DAYS = {
    "inside": day(
        "a guest still inside its window", [("in", "A", 5), ("grow", "A", 10)], window=16
    ),
    "first": day("the window leaves the first room", [("in", "A", 6), ("grow", "A", 14)], window=8),
    "long": day(
        "a prompt longer than the window: several rooms go back at the first step",
        [("in", "A", 30), ("grow", "A", 6)],
        window=8,
    ),
    "edge6": day(
        "a window of 6, not a whole number of rooms",
        [("in", "A", 3), ("grow", "A", 22)],
        window=6,
    ),
    "edge1": day(
        "a window of 1 (each token reads only itself)",
        [("in", "A", 2), ("grow", "A", 12)],
        window=1,
    ),
    "edge4": day("a window of exactly one room", [("in", "A", 1), ("grow", "A", 14)], window=4),
    "guests": day(
        "three guests check in, grow and check out around each other",
        [
            ("in", "A", 9),
            ("grow", "A", 3),
            ("in", "B", 2),
            ("grow", "B", 9),
            ("grow", "A", 5),
            ("out", "A", 0),
            ("in", "C", 12),
            ("grow", "C", 4),
            ("grow", "B", 6),
            ("out", "B", 0),
            ("grow", "C", 5),
        ],
        window=7,
        num_blocks=16,
    ),  # fmt: skip
    "hybrid": day(
        "a full-attention group and a window group draw on one pool (gpt-oss's 1 : 1)",
        [
            ("in", "A", 10),
            ("grow", "A", 12),
            ("in", "B", 4),
            ("grow", "B", 10),
            ("out", "A", 0),
            ("grow", "B", 6),
        ],
        window=8,
        full=True,
    ),  # fmt: skip
}


def random_day(seed: int) -> Day:
    """Up to four guests on a random window and room size, 40 events."""
    rng = random.Random(seed)
    window, size = rng.choice((1, 2, 3, 5, 6, 8, 9, 12, 16)), rng.choice((1, 2, 3, 4, 8))
    events, inside, names = [], [], iter("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    for _ in range(40):
        roll = rng.random()
        if inside and roll < 0.1:
            guest = inside.pop(rng.randrange(len(inside)))
            events.append(("out", guest, 0))
        elif len(inside) < 4 and (not inside or roll < 0.25):
            guest = next(names)
            inside.append(guest)
            events.append(("in", guest, rng.randint(1, 3 * window + size)))
        else:
            events.append(("grow", rng.choice(inside), rng.randint(1, 6)))
    tokens = 4 * (3 * window + size + 240)
    return Day(
        f"random day {seed}",
        _window(window),
        size,
        cdiv(tokens, size),
        tuple(events),
        f"kvlab.grading.lab11.window.random_day({seed})",
    )


RANDOM_DAYS = 40
PROBES = ("first", "long", "edge6", "edge1", "guests")


# --- playing a day --------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """After one token or event: each guest's key card per group as places (``-`` the null
    room, ``r`` a room held, ``x`` a room on the card that the pool holds free) and the rooms
    free; or what was raised."""

    cards: tuple = ()
    free: int = 0
    raised: str | None = None


def _card(table, null) -> str:
    return "".join("-" if b is null else ("x" if b.ref_count == 0 else "r") for b in table)


def snapshot(hotel: HybridBlockManager) -> Snapshot:
    null = hotel.null_block
    cards = tuple(
        (seq, tuple(_card(m.tables[seq], null) for m in hotel.managers)) for seq in hotel.seq_ids
    )
    return Snapshot(cards, hotel.num_free_blocks)


def _moments(d: Day):
    """(event index, event, token) for every moment a snapshot is taken."""
    for i, (kind, guest, n) in enumerate(d.events):
        if kind == "grow":
            for t in range(n):
                yield i, (kind, guest), t
        else:
            yield i, (kind, guest, n), 0


def play(d: Day, step, on_moment=None, hotel_class=HybridBlockManager) -> list[Snapshot]:
    """The day with ``step`` as every window group's hand-back (None: ``hotel_class``'s own
    window manager); ``on_moment(i, hotel, snap, error)`` after each moment may stop the day by
    raising."""
    hotel = hotel_class(d.num_blocks, d.block_size, d.specs, window_step=step)
    snaps = []
    for i, event, _ in _moments(d):
        try:
            if event[0] == "in":
                hotel.allocate(event[1], event[2])
            elif event[0] == "grow":
                hotel.append_slot(event[1])
            else:
                hotel.free(event[1])
        except (CheckFailed, NotImplementedError):
            raise
        except Exception as error:  # OutOfBlocks too: the rooms a slip lost
            snaps.append(Snapshot(raised=type(error).__name__))
            if on_moment is not None:
                on_moment(i, hotel, snaps[-1], error)
            return snaps
        snaps.append(snapshot(hotel))
        if on_moment is not None:
            on_moment(i, hotel, snaps[-1], None)
    return snaps


@functools.lru_cache(maxsize=256)
def reference_day(d: Day) -> tuple[Snapshot, ...]:
    return tuple(play(d, None))


def slipped_hotel(manager_class: type[SlidingWindowManager]) -> type[HybridBlockManager]:
    """kvlab's hotel whose window groups are ``manager_class`` (one of its decisions changed)."""
    return type(
        f"Hotel{manager_class.__name__}", (HybridBlockManager,), {"window_manager": manager_class}
    )


SLIPPED_HOTELS = tuple(slipped_hotel(cls) for _, cls in SLIPPED)


@functools.lru_cache(maxsize=4096)
def slip_day(d: Day, index: int) -> tuple[Snapshot, ...]:
    return tuple(play(d, None, hotel_class=SLIPPED_HOTELS[index]))


def _slip_answer(index: int):
    return lambda d: slip_day(d, index)


SLIPS = tuple(Slip(hint, _slip_answer(i)) for i, (hint, _) in enumerate(SLIPPED))


def _learner_answer(fn):
    return lambda d: tuple(play(d, fn))


def diagnose(fn, d: Day) -> str | None:
    """The hint of the one slip that plays ``d`` and the probe days as ``fn`` does."""
    answer = _learner_answer(fn)
    got = answer(d)
    found = slips.matching(SLIPS, got, (d,), reference_day(d))
    probes = [(DAYS[name],) for name in PROBES if DAYS[name] != d]
    found = slips.told_apart(found, answer, probes, reference_day, always=True)
    hint = slips.hint(slips.only(found))
    if hint == hints.KEPT_ON_CARD and slips.rebinds_argument(fn, 0):
        return hints.REBOUND  # the nulls went into a new list the hotel never sees
    return hint


# --- judging one day -------------------------------------------------------------------------


def guarded(fn):
    """The learner's step, kvlab's references refused while it runs."""

    def step(block_table, num_computed, **kw):
        with refuse_reference(*REFERENCES, learner=fn, task=TASK):
            got = fn(block_table, num_computed, **kw)
        if isinstance(got, list) and got != block_table:
            raise CheckFailed(
                "hand_back returned a new key card and left block_table as it was",
                expected=f"None, block_table changed in place (now {block_table})",
                got=f"a new list {got}",
                hint=hints.IN_PLACE,
            )

    return step


def _show(table, null) -> str:
    rooms = ["null" if b is null else str(b.block_id) for b in table]
    return "[" + ", ".join(rooms if len(rooms) <= 14 else ["…", *rooms[-12:]]) + "]"


def _want(pattern: str) -> str:
    rooms = ["null" if p == "-" else "a room" for p in pattern]
    if len(rooms) > 14:
        rooms = ["…", *rooms[-12:]]
    return "[" + ", ".join(rooms) + "]"


def _difference(d: Day, hotel, seq, group: int, want: str, got: str, n: int) -> str:
    """What is wrong with one key card, in words."""
    size = d.block_size
    spec = hotel.specs[group]
    window = getattr(spec, "window", None)
    reads = (
        f"the next token (position {n}) reads positions {max(0, n - window + 1)}..{n}"
        if window
        else "full attention reads every position"
    )
    table = hotel.managers[group].tables[seq]
    if len(got) != len(want):
        return (
            f"{seq}'s key card has {len(got)} places for {n} tokens; it keeps one per logical "
            f"block, cdiv({n}, {size}) = {len(want)}"
        )
    i = next(i for i, (a, b) in enumerate(zip(want, got, strict=True)) if a != b)
    beds = f"place {i}, positions {i * size}..{(i + 1) * size - 1}"
    if got[i] == "x":
        return (
            f"room {table[i].block_id} ({beds}) is free in the pool but still on {seq}'s key card"
        )
    if want[i] == "-":
        return f"room {table[i].block_id} ({beds}) is still on {seq}'s key card, yet {reads}"
    return f"{seq}'s {beds} was handed back, yet {reads}: it is still in the window"


def expect_day(fn, d: Day) -> None:
    right = reference_day(d)
    where = {"replay": d.replay}
    rooms: dict = {}  # (guest, group, place) -> the room first seen there

    def fail(i, message, hotel=None, card=None, hint=None, **details):
        raise CheckFailed(
            message,
            input=d.describe(i, now),
            hint=hint or diagnose(fn, d),
            **where,
            **(details if card is None else _card_details(hotel, *card)),
        )

    def _card_details(hotel, seq, group, want):
        table = hotel.managers[group].tables[seq]
        return {"expected": _want(want), "got": _show(table, hotel.null_block)}

    k, now = 0, ""

    def on_moment(i, hotel, snap, error):
        nonlocal k, now
        kind, guest, _ = d.events[i]
        if kind == "grow" and guest in hotel:
            now = f"after {guest}'s token {hotel.num_tokens(guest)}"
        want = right[k] if k < len(right) else None
        k += 1
        if error is not None:
            one_room = isinstance(error, TypeError) and str(error).startswith(FREE_TAKES)
            hint = hints.FREE_A_LIST if one_room else None
            fail(i, f"the day stopped: {type(error).__name__}: {error}", got="an error", hint=hint)
        n_of = {seq: hotel.num_tokens(seq) for seq in hotel.seq_ids}
        for (seq, cards), (_, wanted) in zip(snap.cards, want.cards, strict=True):
            for group, (got, exp) in enumerate(zip(cards, wanted, strict=True)):
                if got != exp:
                    kind, guest, _ = d.events[i]
                    n = n_of[seq] - (kind == "grow" and guest == seq)
                    message = _difference(d, hotel, seq, group, exp, got, n)
                    fail(i, message, hotel, (seq, group, exp))
        if snap.free != want.free:
            fail(
                i,
                "the pool's free rooms do not add up",
                expected=f"{want.free} rooms free (kvlab's step, the same day)",
                got=f"{snap.free} rooms free",
            )
        for seq in hotel.seq_ids:
            for group, m in enumerate(hotel.managers):
                for place, block in enumerate(m.tables[seq]):
                    if block is hotel.null_block:
                        continue
                    first = rooms.setdefault((seq, group, place), block.block_id)
                    if first != block.block_id:
                        fail(
                            i,
                            f"{seq}'s place {place} moved from room {first} to room "
                            f"{block.block_id}: a room stays where it is until it is handed back",
                        )
        for seq in [s for s in list(rooms) if s[0] not in n_of]:
            del rooms[seq]
        try:
            hotel.check_invariants()
        except AssertionError as broken:
            fail(i, "the hotel's books do not add up after your step", got=str(broken))

    try:
        play(d, guarded(fn), on_moment)
    except CheckFailed as failure:  # raised by the step itself
        failure.input = failure.input or d.describe(None, now)
        failure.replay = failure.replay or d.replay
        raise


@window_ex.check("a guest still inside its window hands back nothing")
def _inside(fn):
    expect_day(fn, DAYS["inside"])


@window_ex.check("the first room goes back once the window has left all its beds")
def _first(fn):
    expect_day(fn, DAYS["first"])


@window_ex.check("a prompt longer than the window: several rooms at the first step")
def _long(fn):
    expect_day(fn, DAYS["long"])


@window_ex.check("windows of 6, 4 and 1 tokens: the edge, on rooms of 4 beds")
def _edges(fn):
    for name in ("edge6", "edge4", "edge1"):
        expect_day(fn, DAYS[name])


@window_ex.check("three guests check in, grow and check out: the pool's rooms add up")
def _guests(fn):
    expect_day(fn, DAYS["guests"])


@window_ex.check("a full-attention group beside the window, one pool (gpt-oss's 1 : 1)")
def _hybrid(fn):
    expect_day(fn, DAYS["hybrid"])


@window_ex.check(f"{RANDOM_DAYS} random days against a shadow of every room")
def _random(fn):
    for seed in range(RANDOM_DAYS):
        expect_day(fn, random_day(seed))
