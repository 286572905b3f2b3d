"""07.cached_prefix: ``longest_cached_prefix`` against kvlab's lookup. A wrong answer is named
when a usual slip (``PREFIX_SLIPS``) gives it here and on the case where only that slip goes wrong
(``CASES``); ``parent = hit.parent_hash``, alike everywhere to no chain, is read in the bytecode."""

from __future__ import annotations

import functools
import random

from kvlab.core.block_pool import ROOT_HASH, hash_block_tokens
from kvlab.grading import slips
from kvlab.grading.blame import raised
from kvlab.grading.expect import CheckFailed, call_without_mutation, plural, short
from kvlab.grading.key_cards import card_text, room_number
from kvlab.grading.lab07 import hints
from kvlab.grading.lab07 import references as ref
from kvlab.grading.lab07.references import CachedBlock, cache_prompt, cached_prefix, chain_hashes
from kvlab.grading.own_code import call_own
from kvlab.grading.registry import exercise
from kvlab.grading.slips import Slip, quietly, stores_attribute

prefix = exercise("07.cached_prefix", "the longest cached prefix")
UNCHANGED = functools.partial(call_without_mutation, names=("token_ids", "block_size", "cached"))
_call = functools.partial(
    call_own, guard=ref.KVLAB_CODE, task="finding the cached rooms", run=UNCHANGED
)


def _expect_prefix(fn, story: str, token_ids, block_size: int, cached: dict, replay=None):
    prompt = f"{card_text(token_ids, 70)} ({plural(len(token_ids), 'token')})"
    where = f"{story}; longest_cached_prefix({prompt}, {block_size}, cached)"
    expected, cause = cached_prefix(token_ids, block_size, cached), None
    got, error = _call(fn, list(token_ids), block_size, cached, where=where, replay=replay)
    if error is not None:
        raise raised(error, input=where, replay=replay) from None
    if not isinstance(got, list):
        hint = hints.RETURN_LIST if got is None or isinstance(got, (tuple, int)) else None
        message, shown = "longest_cached_prefix returns a list", short(got)
    elif not all(map(room_number, got)):
        entries = bool(got) and all(hasattr(room, "block_id") for room in got)
        text = [str(room) for room in expected] == [str(room).strip() for room in got]
        hint = hints.RETURN_IDS if entries else hints.RETURN_ID_TEXT if text else None
        message, shown = "longest_cached_prefix returns room numbers (ints)", short(got, 90)
    elif got != expected:
        hint, cause = _prefix_slip(fn, got, token_ids, block_size, cached)
        message, shown = "wrong rooms", card_text(got)
    else:
        return
    at = {"input": where, "replay": replay, "expected": card_text(expected)}
    raise CheckFailed(message, got=shown, hint=hint, cause=cause, **at)


# --- the cases the checks try, by name (the slips' probes are among them) --------------------


def _case(story: str, query, *earlier, size: int = 4, planted=None, evicted=()):
    """(story, query, size, cached): ``earlier`` (prompt, rooms) cached, less ``evicted``."""
    cached: dict = {}
    for tokens, rooms in earlier:
        cache_prompt(cached, list(tokens), size, iter(rooms))
    for key in evicted:
        del cached[key]
    return story, list(query), size, {**cached, **(planted or {})}


EARLIER = list(range(100, 116))  # an earlier prompt: 4 rooms of 4 beds, cached in rooms 7, 3, 12, 0
EARLIER_STORY = "cached: the 4 rooms (7, 3, 12, 0) of an earlier prompt 100…115, 4 beds a room"
H0 = hash_block_tokens(ROOT_HASH, EARLIER[:4])
OTHER = (60, 61, 62, 63)
COLLIDING = hash_block_tokens(H0, OTHER)  # where block 60…63 after 100…103 is looked up
HALF = chain_hashes(EARLIER, 4, 2)[1]  # the parent of the half block 108 109
# a parent hash that is not H0 yet hashes as H0 does (Python's hash of an int wraps at 2**61 - 1),
# so 60…63 after it hash to COLLIDING, as they do after 100…103: a true collision
H0_TWIN = H0 + (2**61 - 1) if H0 > 0 else H0 - (2**61 - 1)
HOLE = list(range(40, 60))  # 5 rooms of 4 beds, the third evicted
SHARED = "cached: the rooms of two earlier prompts, "


def _earlier(query, story: str = EARLIER_STORY, planted=None):
    return _case(story, query, (EARLIER, [7, 3, 12, 0]), planted=planted)


def _collision(story: str, entry: CachedBlock):
    """The earlier prompt cached, and ``entry`` (``story`` says what it holds) filed where 60…63
    after 100…103 is looked up; the prompt asks for that block after 100…103."""
    story = f"cached: the 4 rooms of the earlier prompt 100…115, and {story}"
    return _earlier([*EARLIER[:4], *OTHER, 64], story, {COLLIDING: entry})


def _openings(query):
    story = SHARED + "5555 8888 (rooms 21, 22) and 1111 2222 (23, 24)"
    return _case(story, query, ([5] * 4 + [8] * 4, [21, 22]), ([1] * 4 + [2] * 4, [23, 24]))


def _one_bed(query):
    story = "cached: rooms 8 and 9 of an earlier prompt 3 4, one bed a room"
    return _case(story, query, ([3, 4], [8, 9]), size=1)


CASES = {
    "past the end": lambda: _earlier([*EARLIER, 116]),
    "diverges": lambda: _earlier([*EARLIER[:8], 90, 91, 92, 93, *EARLIER[12:], 5]),
    "splits early": lambda: _earlier([*EARLIER[:6], 1, 2, 3]),
    "empty": lambda: _case("an empty cache", [5, 6, 7, 8, 9]),
    "next block": lambda: _case(
        SHARED + "1234 5678 (rooms 50, 51) and 1234 2345 (50, 52)",
        [1, 2, 3, 4, 5, 6, 7, 8, 9],
        ([1, 2, 3, 4, 5, 6, 7, 8], [50, 51]),
        ([1, 2, 3, 4, 2, 3, 4, 5], [52]),
    ),
    "other opening": lambda: _openings([1, 1, 1, 1, 5, 5, 5, 5, 9]),
    "chain": lambda: _openings([1, 1, 1, 1, 2, 2, 2, 2, 9, 9, 9, 9]),
    "hole": lambda: _case(
        "cached: rooms 30, 31, 33, 34 of an earlier prompt 40…59 (its third block, room 32, was "
        "evicted)",
        [*HOLE, 60],
        (HOLE, [30, 31, 32, 33, 34]),
        evicted=[chain_hashes(HOLE, 4, 3)[2]],
    ),
    "skip": lambda: _case(
        "cached: rooms 40, 41, 42 of an earlier prompt 70…81 (blocks 70…73, 74…77, 78…81)",
        [70, 71, 72, 73, 1, 1, 1, 1, 74, 75, 76, 77, 2],
        (range(70, 82), [40, 41, 42]),
    ),
    "tokens collide": lambda: _collision(
        "room 99 (tokens 104…107) filed under the hash of block 60…63 after 100…103, as if the "
        "two collided",
        CachedBlock(99, H0, tuple(EARLIER[4:8])),
    ),
    "parents collide": lambda: _collision(
        "room 98 (tokens 60…63 after 1 2 3 4) filed under the hash of 60…63 after 100…103, as "
        "if the two collided",
        CachedBlock(98, hash_block_tokens(ROOT_HASH, [1, 2, 3, 4]), OTHER),
    ),
    "root parent": lambda: _collision(
        "room 94 (tokens 60…63 opening a prompt, parent ROOT_HASH) filed under the hash of 60…63 "
        "after 100…103, as if the two collided",
        CachedBlock(94, ROOT_HASH, OTHER),
    ),
    "half block": lambda: _earlier(
        EARLIER[:10],
        "cached: the 4 rooms of the earlier prompt 100…115, and room 55 filed under the hash of "
        "the half block 108 109 (a cache keeps only full blocks; a lookup must not ask for one)",
        {hash_block_tokens(HALF, EARLIER[8:10]): CachedBlock(55, HALF, tuple(EARLIER[8:10]))},
    ),
    "tokens reordered": lambda: _case(
        "cached: room 95, holding 6 7 8 9, filed under the hash of 9 8 7 6, as if the two collided",
        [9, 8, 7, 6, 5],
        planted={
            hash_block_tokens(ROOT_HASH, [9, 8, 7, 6]): CachedBlock(95, ROOT_HASH, (6, 7, 8, 9))
        },
    ),
    "parent hash twin": lambda: _collision(
        "room 97, holding 60…63 after another block, whose hash is 100…103's plus 2**61 − 1 "
        "(another int, which Python hashes alike): filed under its own hash, which is that of "
        "60…63 after 100…103 too",
        CachedBlock(97, H0_TWIN, OTHER),
    ),
    "token hash twin": lambda: _case(
        "cached: room 96, holding 1 2 3 -2, filed under its own hash, which is that of 1 2 3 -1 "
        "too (in Python hash(-1) == hash(-2))",
        [1, 2, 3, -1, 5],
        planted={
            hash_block_tokens(ROOT_HASH, [1, 2, 3, -1]): CachedBlock(96, ROOT_HASH, (1, 2, 3, -2))
        },
    ),
    "exact": lambda: _earlier(EARLIER),
    "one past exact": lambda: _earlier(EARLIER[:13]),
    "three beds": lambda: _case(
        "cached: the 4 rooms (5, 6, 7, 8) of an earlier prompt 0…11, 3 beds a room",
        list(range(12)),
        (range(12), [5, 6, 7, 8]),
        size=3,
    ),
    "one bed": lambda: _one_bed([3]),
    "two beds": lambda: _one_bed([3, 4]),
}


# the usual slips, tried in order: each the rule with one mistake (how it differs), its hint, its
# cause, and the case it is confirmed on. A slip is named only when the learner's answer is the
# slip's both on the failing input and on its own case, built so that only that slip goes wrong
# there; one cause for each family, so a variant seen later folds into the first.
CHAIN, STOP, CONFIRM, WHICH, SLICE = (
    f"07.cached_prefix: {c}" for c in ("chain", "stop", "confirm", "blocks", "slice")
)


def _slip(answer, hint: str, cause: str, case: str) -> Slip:
    return Slip(hint, answer, cause, case=lambda: CASES[case]()[1:])


PREFIX_SLIPS = [
    _slip(ref.slipped(ref.Overlap), hints.OVERLAP, SLICE, "next block"),
    _slip(ref.slipped(ref.Unchained), hints.UNCHAINED, CHAIN, "chain"),
    _slip(ref.slipped(ref.Unchained, ref.TokensOnly), hints.UNCHAINED, CHAIN, "chain"),
    _slip(ref.slipped(ref.Keyed), hints.UNCHAINED, CHAIN, "chain"),
    _slip(ref.slipped(ref.NoStopFollowed), hints.NO_STOP, STOP, "hole"),
    _slip(ref.slipped(ref.NoStop), hints.NO_STOP, STOP, "skip"),
    _slip(ref.slipped(kind=ref.TokensOnly), hints.NO_PARENT_CONFIRM, CONFIRM, "parents collide"),
    _slip(ref.slipped(kind=ref.Trusted), hints.NO_CONFIRM, CONFIRM, "tokens collide"),
    _slip(ref.slipped(kind=ref.ParentOnly), hints.NO_CONFIRM, CONFIRM, "tokens collide"),
    _slip(ref.slipped(kind=ref.Unordered), hints.UNORDERED, CONFIRM, "tokens reordered"),
    _slip(ref.slipped(kind=ref.RootTrusted), hints.ROOT_PARENT, CONFIRM, "root parent"),
    _slip(ref.slipped(kind=ref.RehashedParent), hints.REHASHED, CONFIRM, "parent hash twin"),
    _slip(ref.slipped(kind=ref.RehashedTokens), hints.REHASHED, CONFIRM, "token hash twin"),
    _slip(ref.slipped(ref.CoversLast), hints.COVERS_LAST, WHICH, "exact"),
    _slip(ref.slipped(ref.Partial), hints.PARTIAL, WHICH, "half block"),
    _slip(ref.slipped(ref.DropsOne), hints.DROPS_ONE, WHICH, "past the end"),
]


def _prefix_slip(fn, got, token_ids, block_size, cached) -> tuple[str | None, str | None]:
    """(hint, cause) of the first slip giving ``got`` here and on its own case, or (None, None)."""
    args = (token_ids, block_size, cached)
    right = cached_prefix(*args)
    found = (s for s in slips.matching(PREFIX_SLIPS, got, args, right) if slips.confirmed(s, fn))
    if (slip := slips.first(found)) is not None:
        hint = slip.hint
        if slip.answer.keywords["cache"] is ref.Unchained and stores_attribute(fn, "parent_hash"):
            hint = hints.PARENT_HASH  # `parent = hit.parent_hash`: the parent stays ROOT_HASH
        return hint, slip.cause
    if got and got == chain_hashes(token_ids, block_size, len(got)):
        return hints.RETURN_HASHES, hints.RETURN_HASHES
    if got == [] and right:
        listed = {k: e._replace(token_ids=list(e.token_ids)) for k, e in cached.items()}
        if quietly(lambda: fn(list(token_ids), block_size, listed)) == right:
            return hints.TUPLE_LIST, hints.TUPLE_LIST
    return None, None


def _try(fn, *names: str) -> None:
    for name in names:
        _expect_prefix(fn, *CASES[name]())


# the checks as data: the name the learner reads -> the cases it tries
CHECKS = {
    "the rooms of an earlier prompt are found from the first block on, up to the first block "
    "not cached": ("past the end", "diverges", "splits early", "empty", "next block"),
    "the same tokens after another prefix are another block: each hash is chained to the block "
    "before it": ("other opening", "chain"),
    "a hole in the cache: no room after the first miss is reused": ("hole", "skip"),
    "a hash collision never shares a room: a hit is confirmed by its tokens and its parent hash": (
        "tokens collide",
        "parents collide",
        "tokens reordered",
        "root parent",
    ),
    "a true collision: an entry filed under its own hash may hold other tokens or follow another "
    "block, so hashing it again confirms nothing; comparing does": (
        "parent hash twin",
        "token hash twin",
    ),
    "only full rooms count and the prompt's last token is always computed: k full rooms reuse "
    "at most k − 1": ("half block", "exact", "one past exact", "three beds", "one bed", "two beds"),
}
for _name, _cases in CHECKS.items():
    prefix.check(_name)(lambda fn, cases=_cases: _try(fn, *cases))


PREFIX_SEED, PREFIX_CASES = 5, 200


def random_prompt(case: int, seed: int = PREFIX_SEED) -> tuple[list[int], int, dict]:
    """The check's random prompt ``case``, ``(token_ids, block_size, cached)``: earlier prompts on
    two shared openings cached, some evicted, now and then an entry under a colliding hash."""
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
        keys = chain_hashes(query, size, i + 1)
        parent = keys[i - 1] if i else ROOT_HASH
        block = tuple(query[i * size : (i + 1) * size])
        block, parent = (tuple(tokens(size)), parent) if rng.random() < 0.5 else (block, parent + 1)
        cached[keys[i]] = CachedBlock(next(rooms), parent, block)  # other tokens, or parent
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
        _expect_prefix(fn, story, token_ids, size, cached, replay)
