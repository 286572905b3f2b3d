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
exactly as the learner's step did, and the probe days too (:func:`diagnose`).
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


def _slip(hint: str, name: str, **hook) -> tuple[str, type[HybridBlockManager]]:
    """A row: the hint, and kvlab's hotel whose window groups are kvlab's window manager with
    one hook (one decision) changed."""
    manager = type(name, (SlidingWindowManager,), hook)
    return hint, type(f"Hotel{name}", (HybridBlockManager,), {"window_manager": manager})


Ref = SlidingWindowManager  # kvlab's step, whose hooks the slips change
SLIPPED = (
    _slip(hints.TOO_MANY, "TooMany", _skip_end=lambda m, n: Ref._skip_end(m, n) + 1),
    _slip(hints.ROUNDED_UP, "RoundedUp",
          _skip_end=lambda m, n: cdiv(m.spec.first_needed(n), m.block_size)),
    _slip(hints.TOO_FEW, "TooFew", _skip_end=lambda m, n: Ref._skip_end(m, n) - 1),
    _slip(hints.EDGE_LATE, "EdgeLate",  # the window read as starting one token before
          _skip_end=lambda m, n: m.spec.first_needed(max(0, n - 1)) // m.block_size),
    _slip(hints.EDGE_EARLY, "EdgeEarly",  # the window read as starting one token after
          _skip_end=lambda m, n: m.spec.first_needed(n + 1) // m.block_size),
    _slip(hints.DELETED, "Deleted",
          _stand_in=lambda m, table, end, count: table.__delitem__(slice(end - count, end))),
    _slip(hints.KEPT_ON_CARD, "KeptOnCard", _stand_in=lambda m, table, end, count: None),
    _slip(hints.NOT_FREED, "NotFreed", _give_back=lambda m, skipped: None),
    _slip(hints.NULL_AGAIN, "NullAgain", _handed_back=lambda m, block: False),
    _slip(hints.UP_FROM_ZERO, "UpFromZero",  # walked up from place 0 to the first null
          _skipped=lambda m, seq, n: list(itertools.takewhile(
              lambda b: not m._handed_back(b), m.tables[seq][: m._skip_end(n)]))[::-1]),
    _slip(hints.ONE_A_STEP, "OneAStep", _skipped=lambda m, seq, n: Ref._skipped(m, seq, n)[:1]),
)  # fmt: skip


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

    def describe(self, upto: int | None = None, moment: str = "") -> str:
        kinds = " + ".join(
            f"a window of {s.window}" if isinstance(s, SlidingWindowSpec) else "full attention"
            for s in self.specs
        )
        said = {"in": "{} checks in with {}", "grow": "{} +{}", "out": "{} checks out"}
        events = self.events[: None if upto is None else upto + 1]
        text = ", ".join(said[kind].format(guest, n) for kind, guest, n in events)
        text = ("…" + text[-148:] if len(text) > 150 else text) + (f" ({moment})" if moment else "")
        return f"{self.story} ({kinds}; {self.num_blocks} rooms of {self.block_size} beds): {text}"


def _window(w: int) -> tuple:
    return (SlidingWindowSpec(1, 8, window=w),)


def events(text: str) -> tuple:
    """``"A 9, A +3, A out"``: A checks in with 9 tokens, grows by 3 (a token at a time), leaves."""
    said = [item.split() for item in text.split(", ")]
    kind = {"o": "out", "+": "grow"}
    return tuple((kind.get(n[0], "in"), g, 0 if n == "out" else int(n)) for g, n in said)


def day(story, text, *, window=8, block_size=4, num_blocks=40, full=False):
    specs = ((FullAttentionSpec(1, 8),) if full else ()) + _window(window)
    return Day(story, specs, block_size, num_blocks, events(text))


DAYS = {
    "inside": day("a guest still inside its window", "A 5, A +10", window=16),
    "first": day("the window leaves the first room", "A 6, A +14"),
    "long": day("a prompt longer than the window: several rooms go back at the first step",
                "A 30, A +6"),
    "edge6": day("a window of 6, not a whole number of rooms", "A 3, A +22", window=6),
    "edge1": day("a window of 1 (each token reads only itself)", "A 2, A +12", window=1),
    "edge4": day("a window of exactly one room", "A 1, A +14", window=4),
    "guests": day("three guests check in, grow and check out around each other",
                  "A 9, A +3, B 2, B +9, A +5, A out, C 12, C +4, B +6, B out, C +5",
                  window=7, num_blocks=16),
    "hybrid": day("a full-attention group and a window group draw on one pool (gpt-oss's 1 : 1)",
                  "A 10, A +12, B 4, B +10, A out, B +6", full=True),
}  # fmt: skip


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
    rooms, replay = cdiv(4 * (3 * window + size + 240), size), f"{__name__}.random_day({seed})"
    return Day(f"random day {seed}", _window(window), size, rooms, tuple(events), replay)


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


def play(d: Day, step, hotel_class=HybridBlockManager):
    """The day with ``step`` as every window group's hand-back (None: ``hotel_class``'s own
    window manager), moment by moment: (event index, the hotel, its snapshot, the error that
    stopped the day or None)."""
    hotel = hotel_class(d.num_blocks, d.block_size, d.specs, window_step=step)
    for i, (kind, guest, n) in enumerate(d.events):
        for _ in range(n if kind == "grow" else 1):  # a growth is a moment a token
            try:
                if kind == "in":
                    hotel.allocate(guest, n)
                elif kind == "grow":
                    hotel.append_slot(guest)
                else:
                    hotel.free(guest)
            except (CheckFailed, NotImplementedError):
                raise
            except Exception as error:  # OutOfBlocks too: the rooms a slip lost
                yield i, hotel, Snapshot(raised=type(error).__name__), error
                return
            yield i, hotel, snapshot(hotel), None


def snapshots(d: Day, step=None, hotel_class=HybridBlockManager) -> tuple[Snapshot, ...]:
    return tuple(snap for _, _, snap, _ in play(d, step, hotel_class))


@functools.lru_cache(maxsize=256)
def reference_day(d: Day) -> tuple[Snapshot, ...]:
    return snapshots(d)


@functools.lru_cache(maxsize=4096)
def slip_day(d: Day, index: int) -> tuple[Snapshot, ...]:
    return snapshots(d, hotel_class=SLIPPED[index][1])


SLIPS = tuple(slips.changed(slip_day, h, index=i) for i, (h, _) in enumerate(SLIPPED))


def diagnose(fn, d: Day) -> str | None:
    """The hint of the one slip that plays ``d`` and the probe days as ``fn`` does."""
    answer = functools.partial(snapshots, step=fn)
    found = slips.matching(SLIPS, answer(d), (d,), reference_day(d))
    probes = [(DAYS[name],) for name in PROBES if DAYS[name] != d]
    found = slips.told_apart(found, answer, probes, reference_day, always=True)
    hint = slips.hint(slips.only(found))
    if hint == hints.KEPT_ON_CARD and slips.rebinds_argument(fn, 0):
        return hints.REBOUND  # the nulls went into a new list the hotel never sees
    return hint


# --- judging one day -------------------------------------------------------------------------


def guarded(fn, where, replay):
    """The learner's step, kvlab's references refused while it runs; a failure in the step is
    placed at ``where()``, the day so far."""

    def step(block_table, num_computed, **kw):
        try:
            with refuse_reference(*REFERENCES, learner=fn, task=TASK):
                got = fn(block_table, num_computed, **kw)
            if isinstance(got, list) and got != block_table:
                raise CheckFailed(
                    "hand_back returned a new key card and left block_table as it was",
                    expected=f"None, block_table changed in place (now {block_table})",
                    got=f"a new list {got}",
                    hint=hints.IN_PLACE,
                )
        except CheckFailed as failure:
            failure.input = failure.input or where()
            failure.replay = failure.replay or replay
            raise

    return step


def _places(rooms: list[str]) -> str:
    """A key card as the learner reads it, its last 12 places where it is long."""
    return "[" + ", ".join(rooms if len(rooms) <= 14 else ["…", *rooms[-12:]]) + "]"


def _difference(d: Day, hotel, seq, group: int, want: str, got: str, n: int) -> str:
    """What is wrong with one key card, in words."""
    size, window = d.block_size, getattr(hotel.specs[group], "window", None)
    reads = (
        f"the next token (position {n}) reads positions {max(0, n - window + 1)}..{n}"
        if window
        else "full attention reads every position"
    )
    if len(got) != len(want):
        return (
            f"{seq}'s key card has {len(got)} places for {n} tokens; it keeps one per logical "
            f"block, cdiv({n}, {size}) = {len(want)}"
        )
    i = next(i for i, (a, b) in enumerate(zip(want, got, strict=True)) if a != b)
    room = hotel.managers[group].tables[seq][i].block_id
    beds = f"place {i}, positions {i * size}..{(i + 1) * size - 1}"
    if got[i] == "x":
        return f"room {room} ({beds}) is free in the pool but still on {seq}'s key card"
    if want[i] == "-":
        return f"room {room} ({beds}) is still on {seq}'s key card, yet {reads}"
    return f"{seq}'s {beds} was handed back, yet {reads}: it is still in the window"


def expect_day(fn, d: Day) -> None:
    """Play ``d`` with the learner's step, failing at the first moment that differs from
    kvlab's step (a card, the rooms free, a room moved, the hotel's books)."""
    rooms: dict = {}  # (guest, group, place) -> the room first seen there
    now = ""

    def fail(message, hint=None, **details):  # at the moment being played, i (and now)
        hint = hint or diagnose(fn, d)
        raise CheckFailed(message, input=d.describe(i, now), hint=hint, replay=d.replay, **details)

    step = guarded(fn, lambda: d.describe(None, now), d.replay)
    for (i, hotel, snap, error), want in zip(play(d, step), reference_day(d), strict=False):
        kind, guest, _ = d.events[i]
        if kind == "grow" and guest in hotel:
            now = f"after {guest}'s token {hotel.num_tokens(guest)}"
        null = hotel.null_block
        if error is not None:
            one_room = isinstance(error, TypeError) and str(error).startswith(FREE_TAKES)
            hint = hints.FREE_A_LIST if one_room else None
            fail(f"the day stopped: {type(error).__name__}: {error}", hint, got="an error")
        for (seq, cards), (_, wanted) in zip(snap.cards, want.cards, strict=True):
            for group, (got, exp) in enumerate(zip(cards, wanted, strict=True)):
                if got != exp:
                    n = hotel.num_tokens(seq) - (kind == "grow" and guest == seq)
                    table = hotel.managers[group].tables[seq]
                    fail(
                        _difference(d, hotel, seq, group, exp, got, n),
                        expected=_places(["null" if p == "-" else "a room" for p in exp]),
                        got=_places(["null" if b is null else str(b.block_id) for b in table]),
                    )
        if snap.free != want.free:
            expected = f"{want.free} rooms free (kvlab's step, the same day)"
            fail("the pool's free rooms do not add up", expected=expected, got=f"{snap.free} free")
        for seq in hotel.seq_ids:
            for group, m in enumerate(hotel.managers):
                for place, block in enumerate(m.tables[seq]):
                    first = block if block is null else rooms.setdefault((seq, group, place), block)
                    if first is not block:
                        moved = f"{seq}'s place {place} moved from room {first.block_id} to room {block.block_id}"
                        fail(f"{moved}: a room stays where it is until it is handed back")
        for key in [key for key in rooms if key[0] not in hotel]:
            del rooms[key]  # a guest gone: its places are another's next time
        try:
            hotel.check_invariants()
        except AssertionError as broken:
            fail("the hotel's books do not add up after your step", got=str(broken))


# (what the learner reads, the days: DAYS' names, or seeds of random days), in the checks' order
CHECKS = {
    "a guest still inside its window hands back nothing": ("inside",),
    "the first room goes back once the window has left all its beds": ("first",),
    "a prompt longer than the window: several rooms at the first step": ("long",),
    "windows of 6, 4 and 1 tokens: the edge, on rooms of 4 beds": ("edge6", "edge4", "edge1"),
    "three guests check in, grow and check out: the pool's rooms add up": ("guests",),
    "a full-attention group beside the window, one pool (gpt-oss's 1 : 1)": ("hybrid",),
    f"{RANDOM_DAYS} random days against a shadow of every room": range(RANDOM_DAYS),
}

for _name, _days in CHECKS.items():

    def _check(fn, days=_days):
        for d in days:
            expect_day(fn, DAYS[d] if isinstance(d, str) else random_day(d))

    window_ex.check(_name)(_check)
