"""10.match_prefix: ``match_prefix(tree, token_ids) -> Node``, the walk of kvlab's radix tree
(:class:`~kvlab.core.prefix_cache.RadixTreeCache`) page by page to the node where a prompt's
longest cached prefix ends, splitting an edge the prompt leaves part way.

Every case builds a tree with kvlab's block manager (prompts checked in, some checked out) and
keeps a shadow of the token ids each room holds, taken before the learner's code runs. The
learner's node is judged by its path (the rooms from the root, which the shadow says must hold
the prompt's pages), by its end (no edge below it half matched) and by the tree after the call
(kvlab's invariants, and the same rooms findable in the same eviction order). A wrong path is
named when one usual slip (a slipped walk, :data:`SLIPS`) gives it on the same case and, where
several do, answers the other cases as the learner's code does.
"""

from __future__ import annotations

import functools
import random

from kvlab.core.block_manager import BlockManager
from kvlab.core.prefix_cache.radix_tree import Node, RadixTreeCache
from kvlab.grading import slips
from kvlab.grading.expect import CheckFailed, short
from kvlab.grading.lab10 import hints
from kvlab.grading.registry import exercise, own_answers
from kvlab.grading.slips import Slip

match_ex = exercise("10.match_prefix", "the radix tree's walk, with a split")
# the tree's own walk (a hit found with it, then the split, is the exercise handed over)
own_answers(
    "10.match_prefix",
    *(
        f"kvlab.core.prefix_cache.radix_tree:RadixTreeCache.{name}"
        for name in ("match", "_page_limit", "_pages_along")  # the walk and its two hooks
    ),
)


# --- the walk and its slips: kvlab's tree with one decision changed ----------------------------


def walk(tree, token_ids, leave=RadixTreeCache.split):
    """The exercise: kvlab's match, then ``leave`` (a split) where the prompt leaves an edge part
    way."""
    node, k = tree.match(token_ids).end
    return leave(tree, node, k) if k < len(node.blocks) else node


class PastLimit(RadixTreeCache):
    def _page_limit(self, token_ids):  # the page of the prompt's last token too
        return len(token_ids) // self.block_size


class WholeEdge(RadixTreeCache):
    def _pages_along(self, child, token_ids, j, limit):  # the first page decides the edge
        return len(child.blocks)


def slipped(tree_class=RadixTreeCache, leave=RadixTreeCache.split):
    """The path the walk finds on a case's fresh tree, its class ``tree_class`` (a subclass of
    kvlab's overriding one hook): the slip's answer, as :func:`answer` gives the learner's."""

    def walk_as(tree, token_ids):
        tree.__class__ = tree_class  # a fresh tree per answer: nothing else sees it
        return walk(tree, token_ids, leave)

    return lambda case: answer(walk_as, case)


right_path = slipped()
SLIPS = (
    Slip(hints.PAST_LIMIT, slipped(PastLimit)),
    Slip(hints.WHOLE_EDGE, slipped(WholeEdge)),
    Slip(hints.NO_SPLIT_CHILD, slipped(leave=lambda tree, child, k: child)),
    Slip(hints.NO_SPLIT_PARENT, slipped(leave=lambda tree, child, k: child.parent)),
)


# --- the cases --------------------------------------------------------------------------------


P = [[10 * i + t for t in range(4)] for i in range(1, 8)]  # pages P0..P6 of 4 tokens
Q3, Z, TAIL = [71, 72, 73, 74], [9, 9, 9, 9], [5]


def _flat(*pages):
    return [t for p in pages for t in p]


class Case:
    """A tree built from ``held`` prompts (still checked in) and ``gone`` ones (checked out, their
    rooms cached and evictable), 4 beds a room, and a prompt to walk."""

    def __init__(self, story: str, prompt, gone=(), held=(), num_blocks=32, block_size=4):
        self.story, self.prompt = story, list(prompt)
        self.gone, self.held = [list(p) for p in gone], [list(p) for p in held]
        self.num_blocks, self.block_size = num_blocks, block_size

    def build(self) -> BlockManager:
        m = BlockManager(
            self.num_blocks, self.block_size, enable_prefix_caching=True, prefix_cache="radix"
        )
        for i, ids in enumerate(self.gone):
            m.allocate(f"gone{i}", ids)
            m.free(f"gone{i}")
        for i, ids in enumerate(self.held):
            m.allocate(f"held{i}", ids)
        return m

    def describe(self) -> str:
        size = self.block_size
        pages = [self.prompt[i : i + size] for i in range(0, len(self.prompt), size)]
        text = " ".join(",".join(map(str, p)) for p in pages)
        if len(text) > 90:
            text = text[:88] + "…"
        return f"{self.story}; match_prefix(tree, prompt of {len(self.prompt)} tokens: {text})"


def path_of(node) -> tuple[int, ...]:
    return tuple(b.block_id for b in node.path_blocks())


def answer(fn, case: Case):
    """The rooms along the path of the node ``fn`` returns on a fresh build of ``case``."""
    got = slips.answer_of(fn, case.build().prefix_cache, list(case.prompt))
    return path_of(got) if isinstance(got, Node) else slips.RAISED


CASES = {
    "empty": Case("an empty tree (nothing cached yet)", _flat(P[0], P[1], TAIL)),
    "edge": Case(
        "cached: an earlier prompt of three rooms and a token (one edge of three rooms)",
        _flat(P[0], P[1], P[2], Z, TAIL),
        gone=[_flat(P[0], P[1], P[2], TAIL)],
    ),
    "partial": Case(
        "cached: an earlier prompt of three rooms and a token; this prompt shares its first two",
        _flat(P[0], P[1], Z, TAIL),
        gone=[_flat(P[0], P[1], P[2], TAIL)],
    ),
    "fork": Case(
        "cached: two earlier prompts sharing three rooms, then one room each (P3 and Q3)",
        _flat(P[0], Z, Z, Q3, TAIL),
        gone=[_flat(P[0], P[1], P[2], P[3], P[4], TAIL), _flat(P[0], P[1], P[2], Q3, TAIL)],
    ),
    "deep": Case(
        "cached: two earlier prompts sharing three rooms, then P3 P4 and Q3; this prompt "
        "follows P3 and leaves before P4",
        _flat(P[0], P[1], P[2], P[3], Z, TAIL),
        gone=[_flat(P[0], P[1], P[2], P[3], P[4], TAIL), _flat(P[0], P[1], P[2], Q3, TAIL)],
    ),
    "boundary": Case(
        "cached: two earlier prompts sharing three rooms, then P3 and Q3; this prompt is "
        "P0 P1 P2 P3 exactly (it ends on a room's last bed)",
        _flat(P[0], P[1], P[2], P[3]),
        gone=[_flat(P[0], P[1], P[2], P[3], TAIL), _flat(P[0], P[1], P[2], Q3, TAIL)],
    ),
    "inner": Case(
        "cached: an earlier prompt of five rooms and a token (one edge of five rooms); this "
        "prompt is P0 P1 P2 P3 exactly (it ends on a room's last bed, inside the edge)",
        _flat(P[0], P[1], P[2], P[3]),
        gone=[_flat(P[0], P[1], P[2], P[3], P[4], TAIL)],
    ),
    "second edge": Case(
        "cached: two earlier prompts sharing P0, then P1 P2 and Z; this prompt is P0 P1 P2 "
        "exactly (it ends on a room's last bed, inside the second edge)",
        _flat(P[0], P[1], P[2]),
        gone=[_flat(P[0], P[1], P[2], TAIL), _flat(P[0], Z, TAIL)],
    ),
    "held": Case(
        "a guest holds P0 P1 P2 (checked in), an earlier prompt P0 P1 P5 P6 is cached",
        _flat(P[0], P[1], P[5], Z, TAIL),
        gone=[_flat(P[0], P[1], P[5], P[6], TAIL)],
        held=[_flat(P[0], P[1], P[2], TAIL)],
    ),
}


def random_case(seed: int) -> Case:
    """Prompts over two token ids in rooms of 2 beds: many shared pages, many partial edges."""
    rng = random.Random(seed)

    def prompt():
        return [rng.randrange(2) for _ in range(rng.randint(1, 11))]

    gone = [prompt() for _ in range(rng.randint(1, 5))]
    held = [prompt() for _ in range(rng.randint(0, 2))]
    return Case(
        f"a random tree (kvlab.grading.lab10.radix.random_case({seed}), 2 beds a room)",
        prompt(),
        gone=gone,
        held=held,
        num_blocks=64,
        block_size=2,
    )


# --- judging one case -------------------------------------------------------------------------


def _slip(fn, case: Case, got) -> str | None:
    """Named only when one slip gives ``got`` here and answers every other case (random trees
    too) as the learner's code does: a walk that advances wrongly can match one on one case."""
    found = slips.matching(SLIPS, got, (case,), right_path(case))
    probes = [(other,) for other in (*CASES.values(), *(random_case(s) for s in range(30)))]
    found = slips.told_apart(found, lambda c: answer(fn, c), probes, right_path, always=True)
    return slips.hint(slips.only(found))


def expect_match(fn, case: Case) -> None:
    tree: RadixTreeCache = case.build().prefix_cache
    size = tree.block_size
    shadow = {b.block_id: t for n in tree.nodes() for b, t in zip(n.blocks, n.tokens, strict=True)}
    order = tree.cached_block_ids()
    want_blocks = [b.block_id for b in tree.match(case.prompt).blocks]
    got = fn(tree, list(case.prompt))
    want = f"the node ending at rooms {want_blocks}"
    fail = functools.partial(CheckFailed, input=case.describe(), expected=want)
    if not isinstance(got, Node):
        raise fail(
            "match_prefix returns a node of the tree (tree.root, or one of its nodes)",
            got=short(got, typed=True),
        )
    if got is not tree.root and not any(n is got for n in tree.nodes()):
        raise fail("that node is not in the tree (any more)", got=repr(got))
    path = list(path_of(got))
    if path != want_blocks:
        pages = [case.prompt[i * size : (i + 1) * size] for i in range(len(path))]
        wrong = next(
            (i for i, room in enumerate(path) if shadow.get(room) != tuple(pages[i])), None
        )
        detail = ""
        if wrong is not None:
            held = shadow.get(path[wrong])
            detail = (
                f" (room {path[wrong]} holds {list(held) if held else 'nothing cached'}, the "
                f"prompt's page {wrong} is {pages[wrong] or 'past its end'}"
                + (", its last token" if len(case.prompt) - 1 < (wrong + 1) * size else "")
                + ")"
            )
        raise fail(
            "a different prefix" + detail,
            got=f"the node ending at rooms {path}",
            hint=_slip(fn, case, tuple(path)),
        )
    try:
        tree.check_invariants()
    except AssertionError as e:
        raise fail("the tree is broken after the walk", got=str(e)) from e
    after = {b.block_id: t for n in tree.nodes() for b, t in zip(n.blocks, n.tokens, strict=True)}
    if after != shadow or tree.cached_block_ids() != order:
        raise fail(
            "the walk changed which rooms the tree holds, or their order of eviction",
            got="rooms or their order changed",
        )


# (check, its cases); the random trees come last
for _name, _cases in (
    ("an empty tree: the root", [CASES["empty"]]),
    ("a prompt that follows a whole edge", [CASES["edge"]]),
    ("a prompt that leaves an edge part way: a split", [CASES["partial"], CASES["fork"]]),
    ("down two edges, the second split", [CASES["deep"]]),
    (
        "a prompt that ends on a room's last bed",
        [CASES["boundary"], CASES["inner"], CASES["second edge"]],
    ),
    ("rooms a guest holds and rooms nobody holds, in one tree", [CASES["held"]]),
    (
        "30 random trees, 2 beds a room, checked against tree.match",
        [random_case(seed) for seed in range(30)],
    ),
):

    def _check(fn, cases=_cases):
        for case in cases:
            expect_match(fn, case)

    match_ex.check(_name)(_check)
