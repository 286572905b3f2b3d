"""Lab 07 checks against what a learner writes in the notebook: the solution cells earn full marks,
the learner's version of the notebook (``make_lab``) reports "not implemented"; each usual mistake
put into a solution cell ("old => new") fails the check that targets it with the hint that names
it, and later failures fold into "the same problem"; a mistake the checks do not know gets the
neutral note; kvlab's own manager, a legitimate other room order, code that raises, loops or
returns the wrong type are handled as the framework does.
"""

import pathlib
import random

import nbformat
import pytest
from grading_notebook import cell_sources, edited, failures, folded, hints, neutral, run_cell

from kvlab.core.block_manager import BlockManager
from kvlab.core.block_pool import BlockPool
from kvlab.grading import Status, key_cards, lab03, run_checks
from kvlab.grading import lab07 as checks
from kvlab.grading.labgen import RAISES_TAG, make_lab

ROOT = pathlib.Path(__file__).parents[2]
NOTEBOOK = ROOT / "solutions" / "07_sharing.ipynb"
CELLS = cell_sources(NOTEBOOK)
HEADER = CELLS["lab07-imports"] + "\n"  # what the lab's imports cell brings into scope
COW = ("07.copy_on_write", "cow-exercise", "SharingBlockManager")
PREFIX = ("07.cached_prefix", "prefix-exercise", "longest_cached_prefix")
EVICT = ("07.eviction", "evict-exercise", "take_block")


def learner(source: str, name: str):
    """``name`` from ``source`` run as a notebook cell, after the lab's imports."""
    return run_cell(HEADER + source, name)


def solution(which, *edits: str):
    """The solution cell of an exercise, its markers removed and ``edits`` ("old => new") made."""
    _, cell_id, name = which
    return learner(edited(CELLS[cell_id], *edits), name)


def grade(which, *edits: str, **kwargs):
    return run_checks(which[0], solution(which, *edits), **kwargs)


def named(which, edits, hint: str, first: str | None = None):
    """The edits fail (the first failing check's name starting with ``first``) with ``hint``,
    and every later failure folds into it."""
    result = grade(which, *edits)
    assert result.status is Status.FAILED, result.report()
    fails = failures(result)
    assert hints(fails[0]) == [f"hint:     {hint}"], result.report()
    if first is not None:
        assert fails[0].name.startswith(first), result.report()
    assert folded(result), result.report()
    assert "Traceback" not in result.report()
    return result


def slips(cases, ids=lambda v: v[0][:40] if isinstance(v, list) else None):
    """A test's cases, each (edits, hint, first) for ``named``: one learner's mistake; by default
    each is shown by the start of its first edit."""
    return pytest.mark.parametrize("edits, hint, first", cases, ids=ids)


# --- the notebook ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "which, count", [(COW, 8), (PREFIX, 7), (EVICT, 6)], ids=["cow", "prefix", "evict"]
)
def test_the_solution_cells_earn_full_marks(which, count):
    result = grade(which)
    assert result.ok and result.passed == result.total == count, result.report()
    assert "note:" not in result.report()


def test_the_learner_notebook_says_not_implemented():
    lab = make_lab(nbformat.read(NOTEBOOK, as_version=4), name=NOTEBOOK.name)
    cells = {c.id: c for c in lab.cells}
    for exercise_id, cell_id, name in (COW, PREFIX, EVICT):
        cell = cells[cell_id]
        assert "raise NotImplementedError" in cell.source and "SOLUTION" not in cell.source
        assert RAISES_TAG in cell.metadata["tags"]
        result = run_checks(exercise_id, learner(cell.source, name))
        assert result.status is Status.NOT_IMPLEMENTED, result.report()
        assert result.report().startswith(f"{exercise_id} · ") and "not implemented yet" in (
            result.report()
        )
    stubbed = run_checks(COW[0], learner(cells["cow-exercise"].source, COW[2]))
    assert stubbed.unwritten == ["append_slot"]


def test_the_notebook_is_the_courses_format():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata == {
        "kernelspec": {"display_name": "kvlab (Python 3)", "language": "python", "name": "kvlab"},
        "language_info": {"name": "python"},
    }
    assert (nb.nbformat, nb.nbformat_minor) == (4, 5)
    assert all(c.cell_type == "markdown" or not c.outputs for c in nb.cells)
    checks_in_cells = [c.source for c in nb.cells if c.source.startswith("check(")]
    assert checks_in_cells == [
        'check("07.copy_on_write", SharingBlockManager)',
        'check("07.cached_prefix", longest_cached_prefix)',
        'check("07.eviction", take_block)',
    ]


# --- 07.copy_on_write ------------------------------------------------------------------------

COPY_PATH = "        self.ref_counts[last] -= 1  # shared and partly filled: move to a copy\n"
COUNTED = "        self.tokens[seq_id] = tokens + 1\n"
CHECK_FREE = "        if not self.free_blocks:\n"
FULL_PATH_NEW = "            table.append(new)\n"
FULL_PATH = f"{FULL_PATH_NEW}            return None"
FORKED = "        self.tokens[child_id] = self.tokens[parent_id]\n"


@slips(
    [
        ([f"{COPY_PATH} => "], checks.DROP_REF, "after a fork"),
        (["self.ref_counts[last] -= 1 => self.ref_counts[last] = 1"], checks.DROP_ONE, "three"),
        (["        self.ref_counts[new] = 1\n => "], checks.NEW_REF, "a guest alone"),
        (["return last, new => return new, last"], checks.SWAPPED, "after a fork"),
        (["return last, new => return None"], checks.RETURN_PAIR, "after a fork"),
        (["if full:  # => if full and self.ref_counts[last] == 1:  #"], checks.FULL_SHARED, None),
        (
            [
                "            table.append(new)\n            return None => "
                "            table.append(new)\n"
                "            return (last, new) if self.ref_counts[last] > 1 else None"
            ],
            checks.FULL_SHARED,
            "a full shared room",
        ),
        (
            [f"{FULL_PATH} => {FULL_PATH_NEW}            return last, new"],
            checks.FULL_PAIR,  # a pair for every full room: one hint, alone or shared
            "a guest alone",
        ),
        (
            [
                f"{FULL_PATH} => {FULL_PATH_NEW}            if self.ref_counts[last] > 1:\n"
                "                self.ref_counts[last] -= 1\n            return None"
            ],
            checks.KEPT_FULL,
            "a full shared room",
        ),
        (
            [
                f"{FULL_PATH} => {FULL_PATH_NEW}            self.ref_counts[last] -= 1\n"
                "            return None"
            ],
            checks.KEPT_FULL,
            "a guest alone",
        ),
        (["return last, new => return [last, new]"], checks.RETURN_TUPLE, "after a fork"),
        (
            ["self.ref_counts[last] == 1:  # => self.ref_counts[last] < 1:  #"],
            checks.HELD_ONCE,
            "a guest alone",
        ),
        (["if not full and self.ref_counts[last] == 1: => if not full:"], checks.NO_COW, None),
        (["table[-1] = new => table.append(new)"], checks.APPENDED_COPY, "after a fork"),
        (
            [
                f"{CHECK_FREE} => {COUNTED}{CHECK_FREE}",
                f"        self.ref_counts[new] = 1\n{COUNTED} => "
                "        self.ref_counts[new] = 1\n",
            ],
            key_cards.COUNTED_EARLY,
            "append_slot refuses",
        ),
        (
            [
                f"{CHECK_FREE} => "
                f"        if not full:\n            self.ref_counts[last] -= 1\n{CHECK_FREE}",
                f"{COPY_PATH} => ",
            ],
            checks.REF_FIRST,
            "append_slot refuses",
        ),
        (
            [
                f"{CHECK_FREE}            raise OutOfBlocks("
                'f"{seq_id!r} needs a new room and none is free")\n => '
            ],
            key_cards.POPPED_EMPTY,
            "append_slot refuses",
        ),
        (
            [f"    {COUNTED}            return None\n => " + "            return None\n"],
            key_cards.NOT_COUNTED,
            "a guest alone",
        ),
        (
            ["full = tokens % self.block_size == 0 => full = (tokens + 1) % self.block_size == 0"],
            lab03.APPEND_SLIPS[0].hint,  # Lab 03's hint for the same miscount
            "a guest alone",
        ),
        (
            ["            table.append(new)\n =>             table[-1] = new\n"],
            lab03.APPEND_SLIPS[1].hint,  # a full room replaced: the key card never grows
            "a guest alone",
        ),
        (
            [f"{COPY_PATH} => {COPY_PATH}        self.free_blocks.append(last)\n"],
            checks.FREED_SHARED,  # it popped the new room: the shared one went back
            "after a fork",
        ),
        (["new = self.free_blocks.pop() => new = self.free_blocks[-1]"], checks.NOT_POPPED, None),
        (
            [
                f"{CHECK_FREE} => {CHECK_FREE}            if not full:\n"
                f"        {COUNTED}                return None\n"
            ],
            checks.NO_ROOM_FOR_COPY,  # copies when a room is free: only the refusal is missing
            "append_slot refuses",
        ),
        (
            [
                "        table[-1] = new\n => "
                "        for other in self.block_tables.values():\n"
                "            if other[-1] == last:\n"
                "                other[-1] = new\n"
            ],
            checks.ALL_SHARERS,
            "after a fork",
        ),
        (["        return list(table)\n =>         return table\n"], key_cards.ALIASED, None),
        (
            [f"{FORKED} => {FORKED}        return self.block_tables[child_id]\n"],
            key_cards.ALIASED,  # fork returns nothing; a key card it returns is a copy
            "after a fork",
        ),
    ],
    ids=lambda v: v.split(":")[0][:40] if isinstance(v, str) else None,  # hint, check
)
def test_a_copy_on_write_slip_is_named_and_folds(edits, hint, first):
    named(COW, edits, hint, first)


@pytest.mark.parametrize(
    "edit, check",
    [
        (
            "full = tokens % self.block_size == 0 => full = (tokens + 1) % self.block_size == 1",
            "rooms of 1, 2 and 16 beds",
        ),
        (
            "full = tokens % self.block_size == 0 => full = tokens % min(self.block_size, 4) == 0",
            "rooms of 1, 2 and 16 beds",
        ),
        (
            'OutOfBlocks(f"{seq_id!r} needs a new room and none is free") => '
            'OutOfBlocks("%s needs a new room and none is free" % seq_id)',
            "guests named by ints and tuples",
        ),
    ],
    ids=["1-based full", "full at 4 beds", "message by %"],
)
def test_a_manager_right_only_at_4_beds_or_for_str_ids_fails_that_check(edit, check):
    # a red team's: every other check has rooms of 3 or 4 beds and guests named by strings
    result = grade(COW, edit)
    assert [f.name[: len(check)] for f in failures(result)] == [check], result.report()


def test_a_full_shared_room_copied_is_named_at_the_call():
    result = named(
        COW, ["if full:  # => if full and self.ref_counts[last] == 1:  #"], checks.FULL_SHARED
    )
    first = failures(result)[0]
    assert first.name.startswith("a full shared room is not copied")
    assert first.details[0].startswith(
        "'sample' holds 8 tokens; its last room is full and on 2 key cards, so the token goes"
    )
    assert "expected: a new room added" in first.details
    assert any(
        d.startswith(
            "input:    SharingBlockManager(16, 4); .allocate('prompt', 8); "
            ".fork('prompt', 'sample'); → .append_slot('sample')"
        )
        for d in first.details
    )


def test_a_pair_for_every_full_room_is_one_problem():
    """Returned for a full room alone (check 1) and for a full shared room (check 3): one hint,
    the later failure folded."""
    result = named(
        COW, [f"{FULL_PATH} => {FULL_PATH_NEW}            return last, new"], checks.FULL_PAIR
    )
    shared = [o for o in failures(result) if o.name.startswith("a full shared room")]
    assert shared and folded(result), result.report()
    assert checks.FULL_SHARED not in result.report()


def test_the_copy_given_to_every_sharer_shows_their_key_cards():
    result = grade(
        COW,
        "        table[-1] = new\n => "
        "        for other in self.block_tables.values():\n"
        "            if other[-1] == last:\n"
        "                other[-1] = new\n",
    )
    first = failures(result)[0]
    assert first.details[0] == "append_slot changed another guest's key card"
    assert "expected: 'prompt': [0, 1]" in first.details
    assert "got:      'prompt': [0, 2]" in first.details


def test_a_key_card_changed_otherwise_is_shown_as_it_changed():
    """The copy put in the first room's place: neither a copy nor a new room (the report names
    what happened; it once raised the checks' own KeyError)."""
    result = grade(COW, "table[-1] = new => table[0] = new")
    first = failures(result)[0]
    assert first.name.startswith("after a fork")
    assert "got:      the key card changed otherwise: [0, 1] → [2, 1]" in first.details
    assert "calling your code failed:" not in result.report()


def test_rooms_shared_where_kvlabs_are_not_and_not_where_they_are_are_named():
    """KeyCardJudge's sharing rule, both ways: a fork giving the child rooms of its own, and
    check-ins handed the same rooms (one room for two entries where kvlab's hold two)."""
    unshared = grade(
        COW,
        "self.block_tables[child_id] = list(table) => "
        "self.block_tables[child_id] = [self.free_blocks.pop() for _ in table]",
    )
    first = failures(unshared)[0]
    assert first.details[0] == (
        "'prompt' (entry 0) and 'sample' (entry 0) should still share a room: nobody has "
        "written into it since it was shared"
    ), unshared.report()
    assert "got:      rooms 0 and 2" in first.details
    one_room = "[self.free_blocks.pop() for _ in range(needed)]"
    crowded = grade(COW, f"{one_room} => [self.free_blocks.pop() * 0 + i for i in range(needed)]")
    first = failures(crowded)[0]
    assert first.details[0] == "room 0 is entry 0 of 'a''s key card and entry 0 of 'b''s"
    assert "got:      one: 0" in first.details, crowded.report()


def test_a_fork_that_returns_a_copy_of_the_key_card_passes():
    assert grade(COW, f"{FORKED} => {FORKED}        return list(self.block_tables[child_id])\n").ok


def test_an_undiagnosed_copy_on_write_mistake_gets_the_neutral_note():
    result = grade(COW, "return last, new => return last, new + 1")
    first = failures(result)[0]
    assert not hints(first) and neutral(first), result.report()
    assert "expected: (" in " ".join(first.details)


def test_any_free_room_will_do():
    """Room numbers are never compared with kvlab's: another free-list order passes."""
    assert grade(COW, "new = self.free_blocks.pop() => new = self.free_blocks.pop(0)").ok


def test_kvlabs_manager_is_not_the_learners():
    inherits = learner(
        "from kvlab.core.block_manager import BlockManager\n\n"
        "class SharingBlockManager(BlockManager):\n    pass\n",
        "SharingBlockManager",
    )
    result = run_checks(COW[0], inherits)
    assert result.passed == 0 and result.status is Status.FAILED
    first = failures(result)[0]
    assert first.details[0].startswith(
        "your code hands the work to kvlab's `kvlab.core.block_manager.BlockManager."
    )
    assert "sharing and copying the rooms yourself is the exercise" in hints(first)[0]
    assert folded(result)
    assert BlockManager.allocate.__qualname__ == "BlockManager.allocate"  # the guards are gone
    handed = run_checks(COW[0], BlockManager)
    assert handed.status is Status.WRONG_KIND and "kvlab's reference" in handed.report()


def test_the_random_evening_prints_every_call(capsys):
    dropped = solution(COW, f"{COPY_PATH} => ")
    capsys.readouterr()  # what the lab's set-up cell printed
    judge = checks.beam_evening(dropped, steps=60)
    out = capsys.readouterr().out
    assert judge is not None and out.startswith("SharingBlockManager(24, 3)\n.allocate('g0', ")
    assert f"hint:     {checks.DROP_REF}" in out


# --- 07.cached_prefix ------------------------------------------------------------------------

LOOKUP = "if hit is None or tuple(hit.token_ids) != block or hit.parent_hash != parent:"
RANGE = "range((len(token_ids) - 1) // block_size)"
SLICE = "block = tuple(token_ids[i * block_size : (i + 1) * block_size])"


@slips(
    [
        (["        parent = key\n => "], checks.UNCHAINED, "the rooms of an earlier prompt"),
        (
            ["key = hash_block_tokens(parent, block) => key = hash_block_tokens(ROOT_HASH, block)"],
            checks.UNCHAINED,
            "the rooms of an earlier prompt",
        ),
        (
            [f"{SLICE} => block = tuple(token_ids[i : i + block_size])"],
            checks.OVERLAP,
            "the rooms of an earlier prompt",
        ),
        (
            ["        parent = key\n => " + "        parent = hit.parent_hash\n"],
            checks.PARENT_HASH,
            "the rooms of an earlier prompt",
        ),
        (["            break => " + "            continue"], checks.NO_STOP, "a hole in the cache"),
        (
            [
                f"        {LOOKUP}\n            break\n        rooms.append(hit.block_id) => "
                "        if hit is not None and tuple(hit.token_ids) == block and "
                "hit.parent_hash == parent:\n            rooms.append(hit.block_id)"
            ],
            checks.NO_STOP,
            "a hole in the cache",
        ),
        ([f"{LOOKUP} => if hit is None:"], checks.NO_CONFIRM, "a hash collision"),
        ([" or hit.parent_hash != parent => "], checks.NO_PARENT_CONFIRM, "a hash collision"),
        (
            ["hit.parent_hash != parent => (hit.parent_hash and hit.parent_hash != parent)"],
            checks.ROOT_PARENT,
            "a hash collision",
        ),
        (
            ["tuple(hit.token_ids) != block => sorted(hit.token_ids) != sorted(block)"],
            checks.UNORDERED,
            "a hash collision",
        ),
        (
            [
                f"{LOOKUP} => if hit is None or hash_block_tokens(hit.parent_hash, hit.token_ids) != key:"
            ],
            checks.REHASHED,
            "a true collision",
        ),
        (
            [
                "hit.parent_hash != parent => hash_block_tokens(hit.parent_hash, hit.token_ids) != key"
            ],
            checks.REHASHED,
            "a true collision",
        ),
        (
            [
                "tuple(hit.token_ids) != block => hash_block_tokens(hit.parent_hash, hit.token_ids) != key"
            ],
            checks.REHASHED,
            "a true collision",
        ),
        (
            [f"{RANGE} => range(len(token_ids) // block_size)"],
            checks.COVERS_LAST,
            "only full rooms count",
        ),
        (
            [f"{RANGE} => range(-(-len(token_ids) // block_size))"],
            checks.PARTIAL,
            "only full rooms count",
        ),
        (
            [f"{RANGE} => range(len(token_ids) // block_size - 1)"],
            checks.DROPS_ONE,
            "the rooms of an earlier prompt",
        ),
        (
            ["tuple(hit.token_ids) != block => hit.token_ids != list(block)"],
            checks.TUPLE_LIST,
            "the rooms of an earlier prompt",
        ),
        (["rooms.append(hit.block_id) => rooms.append(key)"], checks.RETURN_HASHES, None),
        (
            ["rooms.append(hit.block_id) => rooms.append(hit)"],
            checks.RETURN_IDS,
            "the rooms of an earlier prompt",
        ),
        (
            ["rooms.append(hit.block_id) => rooms.append(str(hit.block_id))"],
            checks.RETURN_ID_TEXT,
            "the rooms of an earlier prompt",
        ),
        (["    return rooms => " + "    return tuple(rooms)"], checks.RETURN_LIST, None),
    ]
)
def test_a_cached_prefix_slip_is_named_and_folds(edits, hint, first):
    named(PREFIX, edits, hint, first)


def test_a_confirmation_slip_folds_across_its_variants():
    """Not confirming at all, seen again on a collision of parents, is the same problem."""
    result = named(PREFIX, [f"{LOOKUP} => if hit is None:"], checks.NO_CONFIRM)
    assert failures(result)[0].name.startswith("a hash collision")


def test_a_changed_cache_is_named():
    result = grade(PREFIX, "hit = cached.get(key) => hit = cached.pop(key, None)")
    first = failures(result)[0]
    assert first.details[0] == "your code changed its input `cached` in place"
    assert any(d.startswith("input:    cached: the 4 rooms") for d in first.details)
    assert folded(result)


def test_an_error_in_the_learners_lookup_shows_its_line_and_the_input():
    result = grade(PREFIX, "hit = cached.get(key) => hit = cached[key]")
    first = failures(result)[0]
    assert first.details[0].startswith("KeyError: ")
    assert "at line" in first.details[0] and "hit = cached[key]" in first.details[0]
    assert any(d.startswith("input:    ") for d in first.details)
    assert folded(result)


def test_an_undiagnosed_prefix_mistake_gets_the_neutral_note():
    result = grade(PREFIX, "rooms.append(hit.block_id) => rooms.append(hit.block_id + 1)")
    assert all(neutral(o) for o in failures(result)[:1]) and not hints(failures(result)[0])


def test_the_rule_is_kvlabs_prefix_cache():
    """cached_prefix finds as many rooms as kvlab's BlockManager shares at check-in, on the
    check's random prompts (earlier prompts checked in and out, nothing evicted)."""
    for case in range(60):
        rng = random.Random(case)
        size = rng.choice([1, 2, 4])
        opening = [rng.randrange(3) for _ in range(rng.randint(0, 3 * size))]
        prompts = [
            opening + [rng.randrange(3) for _ in range(rng.randint(1, 3 * size))] for _ in range(4)
        ]
        manager = BlockManager(256, size, enable_prefix_caching=True)
        cached: dict = {}
        rooms = iter(range(1000))
        for i, prompt in enumerate(prompts[:-1]):
            manager.allocate(i, prompt)
            manager.free(i)
            checks.cache_prompt(cached, prompt, size, rooms)
        query = prompts[-1]
        manager.allocate("query", query)
        shared = manager.num_cached_tokens("query") // size
        assert len(checks.cached_prefix(query, size, cached)) == shared, (case, query)


def test_the_random_prompts_replay():
    token_ids, size, cached = checks.random_prompt(17)
    assert checks.random_prompt(17) == (token_ids, size, cached)
    assert checks.cached_prefix(token_ids, size, cached) == solution(PREFIX)(
        token_ids, size, cached
    )


# --- 07.eviction -----------------------------------------------------------------------------

EVICT_LINE = "del cached[block_hashes.pop(block)]"
TAKE_LINE = "block = free_queue.pop(0)  # the room freed longest ago"
CHECK_EMPTY = '    if not free_queue:\n        raise OutOfBlocks("no free room to hand out")\n'


@slips(
    [
        (["free_queue.pop(0) => free_queue.pop()"], checks.BACK, "a plain free room"),
        ([f"{EVICT_LINE} => pass"], checks.FORGET_BOTH, "a cached room at the front"),
        ([f"{EVICT_LINE} => block_hashes.pop(block)"], checks.STALE, "a cached room"),
        ([f"{EVICT_LINE} => del cached[block_hashes[block]]"], checks.KEEPS_OWN, "a cached room"),
        (
            [
                f"{TAKE_LINE} => block = next((b for b in free_queue if b not in block_hashes), "
                "free_queue[0])\n    free_queue.remove(block)"
            ],
            checks.PLAIN_FIRST,
            "a cached room at the front",
        ),
        (
            [f"{CHECK_EMPTY} => "],
            checks.EMPTY,
            "an empty queue",
        ),
        (
            [f"{EVICT_LINE} => del cached[block]; del block_hashes[block]"],
            checks.KEYED_BY_HASH,
            "a cached room at the front",
        ),
        (
            [
                "    if block in block_hashes:  # it still holds a cached block: evict it\n"
                f"        {EVICT_LINE} => "
                f"    {EVICT_LINE}"
            ],
            checks.NOT_CACHED,
            "a plain free room",
        ),
        ([f"{TAKE_LINE} => block = free_queue[0]"], checks.NOT_TAKEN, "a plain free room"),
        (
            [f"{TAKE_LINE} => block, free_queue = free_queue[0], free_queue[1:]"],
            checks.REBOUND,
            "a plain free room",
        ),
        (["    return block => " + "    return None"], checks.RETURN_ROOM, "a plain free room"),
        (
            ["    return block => " + "    return block, None"],
            checks.RETURN_ALONE.format(kind="tuple"),
            "a plain free room",
        ),
        (
            ["    return block => " + "    return str(block)"],
            checks.RETURN_TEXT.format(kind="str"),
            "a plain free room",
        ),
        (
            [
                f"{EVICT_LINE} => h = block_hashes.pop(block)\n        del cached[h]\n        return h"
            ],
            checks.RETURN_HASH,
            "a cached room at the front",
        ),
        (
            [
                f"{CHECK_EMPTY} => ",
                f"{TAKE_LINE} => block = free_queue.pop(0) if free_queue else None",
            ],
            checks.EMPTY_NONE,
            "an empty queue",
        ),
        (
            ['raise OutOfBlocks("no free room to hand out") => return -1'],
            checks.EMPTY_VALUE,
            "an empty queue",
        ),
        (
            [f"{EVICT_LINE} => cached.clear(); block_hashes.clear()"],
            checks.OVER_EVICT,
            "a cached room at the front",
        ),
    ]
)
def test_an_eviction_slip_is_named_and_folds(edits, hint, first):
    named(EVICT, edits, hint, first)


def test_a_refused_take_that_changes_the_cache_is_named():
    result = grade(
        EVICT,
        "    if not free_queue:\n        raise => "
        + "    if not free_queue:\n        cached.clear()\n        raise",
    )
    (first, *later) = failures(result)
    assert (
        first.name.startswith("an empty queue")
        and first.details[0] == "a refused call must change nothing"
    )
    assert hints(first) == ["hint:     check that free_queue is not empty before changing anything"]
    assert folded(result)


def test_an_undiagnosed_eviction_mistake_gets_the_neutral_note():
    result = grade(EVICT, "free_queue.pop(0) => free_queue.pop(1)")
    first = failures(result)[0]
    assert neutral(first) and not hints(first), result.report()


@pytest.mark.parametrize(
    "which, edit",
    [
        (EVICT, "    return block => " + "    return block + 1, None"),
        (EVICT, "    return block => " + "    return str(block + 1)"),
        (PREFIX, "rooms.append(hit.block_id) => rooms.append(hit.token_ids)"),
    ],
    ids=["tuple without the room", "text of another room", "the blocks' tokens"],
)
def test_a_wrong_type_is_named_only_when_it_holds_the_answer(which, edit):
    """A type hint says what to return instead; where the value in it is wrong too, the cause
    is not recognised."""
    first = failures(grade(which, edit))[0]
    assert neutral(first) and not hints(first), first.details


def test_an_endless_take_block_is_stopped_and_the_rest_skipped():
    result = grade(EVICT, "    return block => " + "    while True:\n        pass", timeout=0.3)
    statuses = [o.status for o in result.outcomes]
    assert statuses[0] is Status.TIMED_OUT and set(statuses[1:]) == {Status.SKIPPED}


def test_the_rule_is_kvlabs_pool():
    """reference_take hands out the room kvlab's BlockPool hands out, and forgets the same hash."""
    pool = BlockPool(6)
    blocks = pool.get_new_blocks(6)
    for block, h in ((blocks[1], 111), (blocks[4], 444), (blocks[5], 555)):
        assert pool.cache(block, h, (h,), None)
    pool.free_blocks([blocks[i] for i in (4, 0, 1, 5, 2)])
    queue = pool.free_queue.block_ids()
    hashes = {b.block_id: b.block_hash for b in blocks if b.block_hash is not None}
    cached = {h: b for b, h in hashes.items()}
    assert queue == [4, 0, 1, 5, 2]
    while queue:
        expected = checks.reference_take(queue, cached, hashes)
        assert pool.get_new_block().block_id == expected
        assert {h: b.block_id for h, b in pool.cached.items()} == cached


def test_the_random_day_prints_every_step(capsys):
    stale = solution(EVICT, f"{EVICT_LINE} => block_hashes.pop(block)")
    capsys.readouterr()  # what the lab's set-up cell printed
    checks.random_day(stale, steps=80)
    out = capsys.readouterr().out
    assert out.startswith("1: ") and f"hint:     {checks.STALE}" in out
