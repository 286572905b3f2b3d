"""07.eviction: ``take_block`` against vLLM's rule (the front of the queue, strictly, forgetting
its hash in both maps): the room returned names a wrong choice (``TAKE_SLIPS``), what it left the
state-diff table ``TAKEN``; a rebound ``free_queue`` and one never shortened, by the bytecode."""

from __future__ import annotations

import copy
import random

from kvlab.grading import slips
from kvlab.grading.blame import explain_exception, raised
from kvlab.grading.expect import CheckFailed, int_slip, listed, short
from kvlab.grading.key_cards import card_text, echoed, room_number
from kvlab.grading.lab07 import hints
from kvlab.grading.lab07.references import KVLAB_CODE, TAKE_SLIPS, chain_hashes, reference_take
from kvlab.grading.own_code import call_own
from kvlab.grading.registry import exercise
from kvlab.grading.slips import rebinds_argument
from kvlab.grading.state_diff import Field, each, first_difference, read

evict = exercise("07.eviction", "which room to hand out")
EVICT_TASK = "choosing and evicting the room"
REFUSED = "no room is free: take_block is refused", "OutOfBlocks (a MemoryError)"
REFUSE_FIRST = "check that free_queue is not empty before changing anything"


def _queue_text(queue, hashes) -> str:
    return f"[{listed(queue, 12, lambda b: f'{b}*' if b in hashes else str(b))}]"


def _maps_text(cached: dict, hashes: dict) -> str:
    return f"cached {short(cached, 90)}, block_hashes {short(hashes, 90)}"


def _queue_hint(d) -> str | None:
    """The room stayed in the queue: not taken, or taken off a list the caller never sees."""
    if d.got != d.before[0]:
        return None
    return hints.REBOUND if rebinds_argument(d.fn, 0) else hints.NOT_TAKEN


def _maps_hint(d) -> str | None:
    (cached, hashes), (want_cached, _) = d.got, d.expected
    front, hashes_before = d.before[0][0], d.before[2]
    if front in hashes_before:
        kept_cached, kept_own = hashes_before[front] in cached, front in hashes
        if kept_cached and kept_own:
            return hints.FORGET_BOTH
        if kept_cached or kept_own:
            return hints.STALE if kept_cached else hints.KEEPS_OWN
    return hints.OVER_EVICT if set(cached.items()) < set(want_cached.items()) else None


def _maps_says(d) -> str:
    if d.before[0][0] in d.before[2]:
        return f"room {d.room} held a cached block: its hash is forgotten, and nothing else"
    return f"room {d.room} held no cached block: the cache stays as it was"


# what a take leaves of the caller's three structures, in the order a difference is reported
TAKEN = (
    Field(
        "free_queue",
        lambda queue, cached, hashes: queue,
        show=lambda want, got: (str(want), short(got)),
        says="room {room} leaves the queue, the others keep their order",
        hint=_queue_hint,
    ),
    Field(
        "the cache",
        lambda queue, cached, hashes: (cached, hashes),
        show=each(lambda maps: _maps_text(*maps)),
        says=_maps_says,
        hint=_maps_hint,
    ),
)


def _refusal(got, error) -> tuple[str, str]:
    """What an empty queue's take_block did instead of raising OutOfBlocks, and its hint."""
    if error is None:
        hint = hints.EMPTY_NONE if got is None else hints.EMPTY_VALUE
        return f"no error, returned {short(got)}", hint
    hint = hints.EMPTY if isinstance(error, IndexError) else "raise OutOfBlocks here"
    return explain_exception(error)[0], hint


def _expect_take(fn, queue: list, cached: dict, hashes: dict, story: str, replay=None):
    """``fn``'s take (in place, as the caller's) against the rule's; an empty queue is refused
    (OutOfBlocks) and nothing changes. Returns the room (None when refused)."""
    where = (
        f"{story}: free_queue {_queue_text(queue, hashes)} (front first, * = holds a cached "
        f"block), cached rooms {card_text(sorted(hashes))}"
    )
    before = (list(queue), dict(cached), dict(hashes))
    want = copy.deepcopy(before)

    def fail(why, expected, got, hint=None):
        raise CheckFailed(why, input=where, replay=replay, expected=expected, got=got, hint=hint)

    got, error = call_own(fn, queue, cached, hashes, guard=KVLAB_CODE, task=EVICT_TASK)
    if not before[0] and not isinstance(error, MemoryError):
        fail(*REFUSED, *_refusal(got, error))
    if not before[0] and (queue, cached, hashes) != before:
        changed = _maps_text(cached, hashes)
        fail("a refused call must change nothing", _maps_text(*before[1:]), changed, REFUSE_FIRST)
    if not before[0]:
        return None
    if error is not None:
        front, slip = before[0][0], None
        if isinstance(error, KeyError) and error.args[:1] == (front,):  # a map read by room
            slip = hints.KEYED_BY_HASH if front in before[2] else hints.NOT_CACHED
        raise raised(error, slip, input=where, replay=replay)
    expected = reference_take(*want)
    if not room_number(got):
        hint = hints.RETURN_ROOM if got is None else int_slip(got, expected, hints.ROOM_TYPE)
        fail("take_block returns the room number it took", str(expected), short(got), hint)
    if got != expected:
        hint = slips.hint(slips.first(slips.matching(TAKE_SLIPS, got, before, expected)))
        fail("the wrong room was handed out", str(expected), str(got), hint)
    context = dict(room=expected, fn=fn, before=before)
    d = first_difference(TAKEN, read(TAKEN, *want), read(TAKEN, queue, cached, hashes), **context)
    if d is not None:
        fail(d.message, *d.shown, d.hint)
    return got


def _takes(fn, rooms: dict, queue: list, stories) -> None:
    """One take per story from ``queue``, the cached ``rooms`` given as room -> hash."""
    cached, hashes = {h: b for b, h in rooms.items()}, dict(rooms)
    for story in stories:
        _expect_take(fn, queue, cached, hashes, story)


CARD = [5, 2, 7, 0]  # a guest's key card: 16 tokens in 4 full rooms, all cached
TAIL = (
    "take {} of 6 after a guest with key card [5, 2, 7, 0] (all 4 rooms cached) checked out "
    "behind free rooms 1 and 3"
)
# the checks as data: the name the learner reads -> (the cached rooms, free_queue, the takes)
TAKES = {
    "a plain free room at the front is handed out and leaves the queue; the cache stays as it is": (
        {6: 0x6A, 2: 0x2B},
        [4, 1, 6, 2],
        ["room 4, at the front, holds no cached block"],
    ),
    "a cached room at the front is evicted: its hash is forgotten in both maps": (
        {6: 0x6A, 2: 0x2B, 5: 0x5C},
        [6, 4, 2],
        ["room 6, at the front, holds a cached block; room 5 is in use and cached"],
    ),
    "the room freed longest ago goes first (vLLM's rule, strictly), even with a room holding no "
    "cached block behind it": (
        {3: 0x3A, 5: 0x5B, 8: 0x8C},
        [3, 5, 0, 8],
        ["rooms 3 and 5, at the front, hold cached blocks, room 0 holds none"]
        + ["then, with what is left"],
    ),
    "an empty queue: OutOfBlocks, and nothing changes": (
        {1: 0x1A, 4: 0x4B},
        [],
        ["every room is in use (rooms 1 and 4 cached)"],
    ),
    "a guest checks out (last room first in the queue) and rooms are taken one by one: the "
    "cached prefix loses its tail first": (
        dict(zip(CARD, chain_hashes(list(range(200, 216)), 4, len(CARD)), strict=True)),
        [1, 3, *reversed(CARD)],  # free rooms 1 and 3, then the guest's, last room first
        [TAIL.format(i) for i in range(1, 7)] + ["then once more, with the queue empty"],
    ),
}
for _name, _take_case in TAKES.items():
    evict.check(_name)(lambda fn, case=_take_case: _takes(fn, *copy.deepcopy(case)))


DAY_SEED, DAY_STEPS = 9, 300
DAY_REPLAY = (
    "random.Random({seed}), step {step}: `from kvlab.grading.lab07 import random_day; "
    "random_day({fn}, steps={step})` prints every step"
)


def random_day(fn, steps: int = DAY_STEPS, seed: int = DAY_SEED, echo: bool = True):
    """The check's random day on ``fn`` (12 rooms, ``random.Random(seed)``): rooms taken, guests
    checking out (last room first, full blocks cached), cached rooms reused from the middle of
    the queue. With ``echo`` it prints every step and the first failure's report."""
    rng = random.Random(seed)
    queue, cached, hashes = list(range(12)), {}, {}
    guests: list[list[int]] = []  # each guest's rooms
    say = print if echo else lambda text: None
    name = getattr(fn, "__name__", "take_block")
    with echoed(echo):
        for step in range(1, steps + 1):
            roll = rng.random()
            if roll < 0.55:
                took = f"from {_queue_text(queue, hashes)}" if queue else "with the queue empty"
                say(f"{step}: take_block {took}")
                replay = DAY_REPLAY.format(seed=seed, step=step, fn=name)
                story = f"step {step} of a random day, taking a room"
                room = _expect_take(fn, queue, cached, hashes, story, replay)
                if room is not None and guests and rng.random() < 0.6:
                    rng.choice(guests).append(room)
                elif room is not None:
                    guests.append([room])
            elif roll < 0.85 and guests:
                card = guests.pop(rng.randrange(len(guests)))
                tokens = [rng.randrange(4) for _ in range(2 * len(card))]
                full = rng.randint(0, len(card))  # the last rooms may be partly filled
                for room, h in zip(card[:full], chain_hashes(tokens, 2, full), strict=True):
                    if h not in cached and room not in hashes:  # a reused room keeps its hash
                        cached[h], hashes[room] = room, h
                queue.extend(reversed(card))
                say(f"{step}: a guest with key card {card} checks out ({full} rooms full)")
            elif hit := [b for b in queue if b in hashes]:
                room = rng.choice(hit)
                queue.remove(room)
                guests.append([room])
                say(f"{step}: a new prompt reuses cached room {room}")


@evict.check("a random day: 300 rooms taken, guests checking out, cached rooms reused")
def _random_day(fn):
    random_day(fn, echo=False)
