"""Lab 11 checks (11.window, 11.hybrid), tried with learner code: the lab's solutions pass and
the stubs are "not implemented"; each usual slip put into a solution fails with the hint that
names it, and only that hint; a mistake no slip explains gets none; kvlab's own answer, even
behind a wrapper, passes nothing."""

import learner_code
import pytest
from learner_code import assert_only_hint, failures, hints_of

from kvlab.grading import Status, run_checks
from kvlab.grading import lab11 as checks
from kvlab.grading.lab11 import window

HAND_BACK = """
def hand_back(block_table, num_computed, *, window, block_size, free, null_block):
    first = max(0, num_computed - window + 1)  # the first position the next token reads
    for i in range(first // block_size - 1, -1, -1):  # rooms wholly before it, last first
        if block_table[i] == null_block:
            break  # the rooms before this one went back at earlier steps
        free([block_table[i]])
        block_table[i] = null_block
"""

HYBRID_LAYOUT = """
def hybrid_layout(layer_groups, max_model_len, max_num_batched_tokens, block_size=16):
    counts = {}
    for group in layer_groups:
        counts[group.spec] = counts.get(group.spec, 0) + group.num_layers
    attention = [spec for spec in counts if spec.grows]
    blocks = dict.fromkeys(counts, block_size)
    states = [spec for spec in counts if not spec.grows]
    if states:
        token = max(spec.token_bytes() for spec in attention)
        state = max(spec.state_bytes for spec in states)
        blocks = dict.fromkeys(counts, max(block_size, 16 * -(-state // (16 * token))))
    page = max(spec.page_bytes(blocks[spec]) for spec in attention)
    for spec in attention:
        blocks[spec] *= page // spec.page_bytes(blocks[spec])
    fewest, most = min(counts.values()), max(counts.values())
    group_size = most if most < 1.5 * fewest else fewest
    num_groups = reserved = 0
    for spec, n in counts.items():
        groups = -(-n // group_size)
        per = spec.blocks_reserved(max_model_len, blocks[spec], max_num_batched_tokens)
        num_groups += groups
        reserved += groups * per
    return {
        "group_size": group_size,
        "num_groups": num_groups,
        "block_size": min(blocks[spec] for spec in attention),
        "page_bytes": page,
        "blocks_reserved": reserved,
        "bytes_reserved": reserved * page * group_size,
    }
"""


def learner(source, name, *edits):
    return learner_code.learner(source, name, *edits, header="")


def hand_back(*edits):
    return learner(HAND_BACK, "hand_back", *edits)


def hybrid_layout(*edits):
    return learner(HYBRID_LAYOUT, "hybrid_layout", *edits)


STUB = "def {name}(*args, **kwargs):\n    raise NotImplementedError\n"


@pytest.mark.parametrize(
    "exercise, make, name, count",
    [("11.window", hand_back, "hand_back", 7), ("11.hybrid", hybrid_layout, "hybrid_layout", 11)],
)
def test_the_solutions_pass_and_the_stubs_are_not_written_yet(exercise, make, name, count):
    result = run_checks(exercise, make())
    assert result.ok and result.passed == result.total == count, result.report()
    stub = learner(STUB.format(name=name), name)
    assert run_checks(exercise, stub).status is Status.NOT_IMPLEMENTED


# --- 11.window -------------------------------------------------------------------------------

FIRST = "first // block_size - 1"
EDGE = "num_computed - window + 1"
FREE_AND_NULL = "free([block_table[i]])\n        block_table[i] = null_block"
BREAK = "        if block_table[i] == null_block:\n            break  # the rooms before this one went back at earlier steps\n"

WINDOW_SLIPS = [
    (checks.TOO_MANY, [f"{FIRST} => first // block_size"]),
    (checks.ROUNDED_UP, [f"{FIRST} => -(-first // block_size) - 1"]),
    (checks.TOO_FEW, [f"{FIRST} => first // block_size - 2"]),
    (checks.EDGE_LATE, [f"{EDGE} => num_computed - window"]),
    (checks.EDGE_EARLY, [f"{EDGE} => num_computed - window + 2"]),
    (checks.DELETED, [f"{FREE_AND_NULL} => free([block_table[i]])\n        del block_table[i]"]),
    (checks.KEPT_ON_CARD, [f"{FREE_AND_NULL} => free([block_table[i]])"]),
    (checks.NOT_FREED, [f"{FREE_AND_NULL} => block_table[i] = null_block"]),
    (checks.NULL_AGAIN, [f"{BREAK} => "]),
    (checks.UP_FROM_ZERO, [f"range({FIRST}, -1, -1) => range(first // block_size)"]),
    (checks.ONE_A_STEP, ["null_block\n => null_block\n        break\n"]),
]  # fmt: skip


@pytest.mark.parametrize("hint, edits", WINDOW_SLIPS, ids=[e[0][:30] for e in WINDOW_SLIPS])
def test_each_window_slip_gets_its_hint_only(hint, edits):
    assert_only_hint(run_checks("11.window", hand_back(*edits)), hint)


def test_every_window_slip_is_in_the_table_and_told_apart_on_the_probes():
    assert {h for h, _ in window.SLIPPED} == {h for h, _ in WINDOW_SLIPS}
    days = [window.DAYS[name] for name in window.PROBES]
    answers = [tuple(window.slip_day(d, i) for d in days) for i in range(len(window.SLIPPED))]
    assert len(set(answers)) == len(answers)  # no two slips play the probe days alike
    assert all(a != tuple(window.reference_day(d) for d in days) for a in answers)


BY_PLACE = """
def hand_back(block_table, num_computed, *, window, block_size, free, null_block):
    first = max(0, num_computed - window + 1)
    for i, room in enumerate(block_table):
        if (i + 1) * block_size <= first and room != null_block:
            free([room])
            block_table[i] = null_block
"""
REBOUND = """
def hand_back(block_table, num_computed, *, window, block_size, free, null_block):
    end = max(0, num_computed - window + 1) // block_size
    free([room for room in block_table[:end] if room != null_block])
    block_table = [null_block] * end + block_table[end:]
"""
OTHER_WAYS = [
    ("walking up, skipping the nulls", BY_PLACE, [], None),
    ("a room's end compared with <", BY_PLACE, ["<= first => < first"], checks.EDGE_LATE),
    ("a room's last bed compared with <=", BY_PLACE, ["(i + 1) * block_size <= => (i + 1) * block_size - 1 <="], checks.EDGE_EARLY),
    ("the card rebound to a new list", REBOUND, [], checks.REBOUND),
    ("free(room) for free([room])", HAND_BACK, ["free([block_table[i]]) => free(block_table[i])"], checks.FREE_A_LIST),
]  # fmt: skip


@pytest.mark.parametrize("what, source, edits, hint", OTHER_WAYS, ids=[w[0] for w in OTHER_WAYS])
def test_a_step_written_another_way_gets_the_hint_of_its_mistake(what, source, edits, hint):
    result = run_checks("11.window", learner(source, "hand_back", *edits))
    if hint is None:
        assert result.ok, result.report()
    else:
        assert_only_hint(result, hint)


def test_a_new_key_card_returned_is_named():
    new_card = learner(
        HAND_BACK.replace("    first = max", "    block_table = list(block_table)\n    first = max")
        + "    return block_table\n",
        "hand_back",
    )
    result = run_checks("11.window", new_card)
    assert_only_hint(result, checks.IN_PLACE)
    assert "(after A's token 11)" in result.report(), result.report()  # its step, then


def test_a_window_mistake_no_slip_explains_gets_no_hint():
    # frees the newest room too when the window is past a room: a mistake of no table row
    odd = hand_back(
        "        free([block_table[i]])\n        block_table[i] = null_block\n => "
        "        free([block_table[i]])\n        block_table[i] = null_block\n"
        "        if num_computed % 7 == 3 and block_table[-1] != null_block:\n"
        "            free([block_table[-1]])\n            block_table[-1] = null_block\n"
    )
    result = run_checks("11.window", odd)
    assert result.status is Status.FAILED and hints_of(result) == [], result.report()


def test_a_failure_on_a_random_day_names_its_replay():
    # right on every plain day (rooms of 4 beds), wrong on a window of 12 with rooms of 3
    odd = hand_back(
        "first = max(0, num_computed - window + 1) => first = max(0, num_computed - window + 1) - (window == 12 and block_size == 3)"
    )
    result = run_checks("11.window", odd)
    (failed,) = failures(result)
    assert failed.name.startswith("40 random days"), result.report()
    assert any("kvlab.grading.lab11.window.random_day(" in d for d in failed.details)


def test_kvlab_own_step_behind_a_wrapper_is_refused():
    from kvlab.core.block_pool import BlockPool
    from kvlab.core.kv_spec import SlidingWindowSpec
    from kvlab.core.single_type_manager import SlidingWindowManager

    def wrapped(block_table, num_computed, *, window, block_size, free, null_block):
        pool = BlockPool(null_block + 1)  # a copy of the card on rooms of kvlab's, stepped by kvlab
        copy = [pool.blocks[room] for room in block_table]
        for block in copy:
            block.ref_count = block.block_id != null_block
        m = SlidingWindowManager(
            SlidingWindowSpec(1, 1, window=window), 0, pool, block_size, pool.blocks[null_block]
        )
        m.tables["me"] = copy
        m.remove_skipped_blocks("me", num_computed)
        for i, block in enumerate(copy):
            if block.block_id != block_table[i]:
                free([block_table[i]])
                block_table[i] = null_block

    result = run_checks("11.window", wrapped)
    assert result.passed == 0 and "hands the work to kvlab" in result.report(), result.report()

    def first_needed(block_table, num_computed, *, window, block_size, free, null_block):
        end = SlidingWindowSpec(1, 1, window=window).first_needed(num_computed) // block_size
        for i in range(end - 1, -1, -1):
            if block_table[i] == null_block:
                break
            free([block_table[i]])
            block_table[i] = null_block

    assert run_checks("11.window", first_needed).passed == 0


# --- 11.hybrid -------------------------------------------------------------------------------

RULE = "group_size = most if most < 1.5 * fewest else fewest"
PER = "per = spec.blocks_reserved(max_model_len, blocks[spec], max_num_batched_tokens)"

HYBRID_SLIPS = [
    (checks.RATIO_MIN, [f"{RULE} => group_size = fewest"]),
    (checks.ONE_GROUP_PER_KIND, [f"{RULE} => group_size = most"]),
    (checks.WINDOW_AS_FULL, [f"{PER} => per = -(-max_model_len // blocks[spec]) if spec.grows else 1"]),
    (checks.WINDOW_ONE_TOKEN, [f"{PER} => per = spec.blocks_reserved(max_model_len, blocks[spec], 1)"]),
    (checks.NO_EXTRA_BLOCK, [f"{PER} => {PER} - (spec.kind == 'sliding_window')"]),
    (checks.NO_PADDING, ["num_groups = reserved = 0 => num_groups = reserved = real = 0",
                         "reserved += groups * per => reserved += groups * per\n        real += per * n * page",
                         "reserved * page * group_size => real"]),
    (checks.NOT_ALIGNED, ["16 * -(-state // (16 * token)) => -(-state // token)"]),
    (checks.RATIO_EDGE, [f"{RULE} => group_size = most if most <= 1.5 * fewest else fewest"]),
    (checks.ONE_PAGE_A_BLOCK, ["reserved * page * group_size => reserved * page"]),
    (checks.ONCE_PER_KIND, ["reserved += groups * per => reserved += per"]),
    (checks.LAST_ENTRY, ["counts.get(group.spec, 0) + group.num_layers => group.num_layers"]),
]  # fmt: skip


@pytest.mark.parametrize("hint, edits", HYBRID_SLIPS, ids=[e[0][:30] for e in HYBRID_SLIPS])
def test_each_hybrid_slip_gets_its_hint_only(hint, edits):
    assert_only_hint(run_checks("11.hybrid", hybrid_layout(*edits)), hint)


def test_a_hybrid_mistake_no_slip_explains_gets_no_hint():
    odd = hybrid_layout('"page_bytes": page, => "page_bytes": page + (len(counts) > 1),')
    result = run_checks("11.hybrid", odd)
    assert result.status is Status.FAILED and hints_of(result) == [], result.report()


def test_kvlab_layout_behind_a_wrapper_is_refused():
    from kvlab.perf.kv_groups import kv_cache_layout

    def wrapped(layer_groups, max_model_len, max_num_batched_tokens, block_size=16):
        layout = kv_cache_layout(layer_groups, block_size=block_size)
        blocks = layout.blocks_reserved(max_model_len, max_num_batched_tokens)
        return {"group_size": layout.group_size, "num_groups": len(layout.groups),
                "block_size": layout.block_size, "page_bytes": layout.page_bytes,
                "blocks_reserved": blocks, "bytes_reserved": blocks * layout.block_bytes}  # fmt: skip

    result = run_checks("11.hybrid", wrapped)
    assert result.passed == 0 and "hands the work to kvlab" in result.report(), result.report()


def test_a_wrong_type_is_said_plainly():
    result = run_checks("11.hybrid", hybrid_layout("return { => return 0 and {"))
    assert result.passed == 0 and "a dict of ints" in result.report(), result.report()
