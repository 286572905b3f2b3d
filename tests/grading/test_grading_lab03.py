"""Lab 03 checks against what a learner writes in the notebook: kvlab's own manager, inherited or
wrapped, is refused; the beds report's usual slips and a manager attribute kvlab's lacks are named;
a refused append_slot that counted its token too early gets the hint for that, not another one.
Each learner edit fails the check that targets it, names the mistake, and later failures fold.
"""

import pathlib

import pytest
from grading_notebook import cell_sources, edited, failures, folded, hints, neutral, run_cell

from kvlab.core.block_manager import BlockManager as KvlabBlockManager
from kvlab.grading import Status, key_cards, lab03, run_checks

ROOT = pathlib.Path(__file__).parents[2]
CELLS = cell_sources(ROOT / "solutions" / "03_paged_allocator.ipynb")
HEADER = "from kvlab.core.block_manager import BlockManager as ReferenceBlockManager\n"
HEADER += "from kvlab.core.block_manager import OutOfBlocks\n"  # what the lab's first cell imports


def learner(source: str, name: str):
    """``name`` from ``source`` run as a notebook cell, with the lab's imports."""
    return run_cell(HEADER + source, name)


def solution_cell(cell_id: str, name: str, *edits: str):
    """The solution cell of Lab 03 with its solution markers removed and ``edits`` ("old => new")
    made: one learner's version of the exercise."""
    return learner(edited(CELLS[cell_id], *edits), name)


# --- the block manager is the learner's own --------------------------------------------------


def test_the_solution_cell_passes():
    assert run_checks("03.block_manager", solution_cell("lab03-05", "BlockManager")).ok


def test_a_subclass_of_kvlabs_manager_is_refused():
    inherits = learner("class BlockManager(ReferenceBlockManager):\n    pass\n", "BlockManager")
    result = run_checks("03.block_manager", inherits)
    assert result.passed == 0 and result.status is Status.FAILED
    first = failures(result)[0]
    assert (
        first.details[0]
        == "your code hands the work to kvlab's `kvlab.core.block_manager.BlockManager.allocate`"
    )
    assert any(
        d.startswith("input:    BlockManager(32, 4); → .allocate('one', 1)") for d in first.details
    )
    assert "handing out the rooms yourself is the exercise" in hints(first)[0]
    assert folded(result)
    assert KvlabBlockManager.allocate.__qualname__ == "BlockManager.allocate"  # guard removed
    assert KvlabBlockManager(4, 2).allocate("a", 3) == [0, 1]


def test_a_wrapper_around_kvlabs_manager_is_refused():
    wrapper = learner(
        """
class BlockManager:
    def __init__(self, num_blocks, block_size):
        self.inner = ReferenceBlockManager(num_blocks, block_size)
        self.block_size = block_size

    @property
    def num_free_blocks(self):
        return self.inner.num_free_blocks

    def block_table(self, seq_id):
        return self.inner.block_table(seq_id)

    def num_tokens(self, seq_id):
        return self.inner.num_tokens(seq_id)

    def allocate(self, seq_id, num_tokens):
        return self.inner.allocate(seq_id, num_tokens)

    def append_slot(self, seq_id):
        self.inner.append_slot(seq_id)

    def free(self, seq_id):
        self.inner.free(seq_id)
""",
        "BlockManager",
    )
    result = run_checks("03.block_manager", wrapper)
    assert result.passed == 0
    assert (
        "hands the work to kvlab's `kvlab.core.block_manager.BlockManager.allocate`"
        in failures(result)[0].details[0]
    )
    assert folded(result)


def test_refused_append_that_counted_the_token_first_is_named():
    counts_first = solution_cell(
        "lab03-05",
        "BlockManager",
        "        if self.tokens[seq_id] % self.block_size == 0:  # last room full => "
        "        t = self.tokens[seq_id]\n"
        "        self.tokens[seq_id] = t + 1\n"
        "        if t % self.block_size == 0:  # last room full",
        "            card.append(self.free_blocks.pop())\n        self.tokens[seq_id] += 1 => "
        "            card.append(self.free_blocks.pop())",
    )
    result = run_checks("03.block_manager", counts_first)
    only, *later = failures(result)  # the random evening refuses tokens too: the same problem
    assert folded(result) and [o.name for o in later] == [
        "a random evening: 300 check-ins, tokens and check-outs"
    ]
    assert only.name.startswith("append_slot refuses without changing anything")
    assert "got:      changed num_tokens('a')" in only.details
    assert "raise OutOfBlocks before counting the new token" in hints(only)[0]
    assert "validate the arguments" not in hints(only)[0]  # the arguments were fine


# --- the beds report -------------------------------------------------------------------------

HELD = "held = sum(len(manager.block_table(s)) for s in seq_ids) * manager.block_size"


def test_a_full_last_room_counted_as_future_is_named_and_folds():
    modulo = solution_cell(
        "lab03-08",
        "beds_report",
        f"{HELD} => size = manager.block_size\n"
        "    future = sum(size - manager.num_tokens(s) % size for s in seq_ids)",
        '"future": held - used => "future": future',
    )
    result = run_checks("03.beds_report", modulo)
    first = failures(result)[0]
    assert result.passed == 0 and first.name == "two guests with partly filled last rooms"
    assert "a full last room has no empty bed" in hints(first)[0]
    assert "`-tokens % block_size`" in hints(first)[0]
    assert folded(result) and not any(neutral(o) for o in failures(result))


def test_an_attribute_kvlabs_manager_lacks_is_named_with_the_input():
    own_attribute = solution_cell(
        "lab03-08",
        "beds_report",
        "manager.num_free_blocks * manager.block_size => "
        "len(manager.free_blocks) * manager.block_size",
    )
    result = run_checks("03.beds_report", own_attribute)
    first = failures(result)[0]
    assert first.details[0].startswith("AttributeError: 'BlockManager' object has no attribute")
    assert "input:    BlockManager(10, 4) with a: 5 tokens, b: 8 tokens" in first.details
    assert "hands in kvlab's BlockManager, which has no `free_blocks`" in hints(first)[0]
    assert "block_table, num_tokens, num_free_blocks and block_size" in hints(first)[0]
    assert result.passed == 0 and folded(result)
    later = failures(result)[1:]
    assert all(any(d.startswith("input:") for d in o.details) for o in later)


def test_kvlabs_memory_report_is_not_the_learners_beds_report():
    def handover(manager, seq_ids):
        usage = manager.memory_report()
        return {"used": usage.used, "future": usage.future, "free": usage.free}

    result = run_checks("03.beds_report", handover)
    assert result.passed == 0
    assert (
        "hands the work to kvlab's `kvlab.core.block_manager.BlockManager.memory_report`"
        in failures(result)[0].details[0]
    )
    assert folded(result)


# --- the key card allocate returns is the caller's -------------------------------------------

RETURNS_COPY = (
    "        return list(self.block_tables[seq_id])\n        ### END SOLUTION\n\n    def append"
)
VIEW = '''
class CardView:
    """The manager's own key card behind a list's face: reads and writes go to it."""

    def __init__(self, card):
        self.card = card

    def __iter__(self):
        return iter(self.card)

    def __len__(self):
        return len(self.card)

    def __getitem__(self, i):
        return self.card[i]

    def __setitem__(self, i, value):
        self.card[i] = value
'''


@pytest.mark.parametrize(
    "returned",
    ["self.block_tables[seq_id]", "CardView(self.block_tables[seq_id])"],
    ids=["the list itself", "a view of it"],
)
def test_allocate_returning_the_managers_own_key_card_fails_with_the_copy_hint(returned):
    source = VIEW + CELLS["lab03-05"].replace(
        RETURNS_COPY, RETURNS_COPY.replace("list(self.block_tables[seq_id])", returned)
    )
    assert returned in source
    result = run_checks("03.block_manager", learner(edited(source), "BlockManager"))
    first = failures(result)[0]
    assert result.passed == 0 and first.name.startswith("allocate: n tokens get a key card")
    assert first.details[0] == (
        "the key card allocate returned is the manager's own list: changing it changed the manager"
    )
    assert any(
        d.startswith("input:    BlockManager(32, 4); .allocate('one', 1); → card")
        for d in first.details
    )
    assert any(d.startswith("got:      the key card of 'one': [0] → [") for d in first.details)
    assert hints(first) == [f"hint:     {key_cards.ALIASED}"]
    assert folded(result)


def test_a_copy_or_a_tuple_of_the_key_card_passes():
    """A tuple cannot be changed, so it aliases nothing: the manager is safe either way."""
    for returned in ("list(self.block_tables[seq_id])", "tuple(self.block_tables[seq_id])"):
        cell = CELLS["lab03-05"].replace(
            RETURNS_COPY, RETURNS_COPY.replace("list(self.block_tables[seq_id])", returned)
        )
        assert run_checks("03.block_manager", learner(edited(cell), "BlockManager")).ok, returned


# --- used beds counted in whole rooms --------------------------------------------------------


@pytest.mark.parametrize(
    "future",
    ["held - used", "held - sum(manager.num_tokens(s) for s in seq_ids)"],
    ids=["future from it", "future right"],
)
def test_used_counted_in_whole_rooms_is_named_and_folds(future):
    whole_rooms = solution_cell(
        "lab03-08",
        "beds_report",
        "used = sum(manager.num_tokens(s) for s in seq_ids) => used = "
        "sum(len(manager.block_table(s)) for s in seq_ids) * manager.block_size",
        f'"future": held - used => "future": {future}',
    )
    result = run_checks("03.beds_report", whole_rooms)
    first = failures(result)[0]
    assert first.name == "two guests with partly filled last rooms"
    assert hints(first) == [f"hint:     {lab03.WHOLE_ROOMS_USED}"]
    assert folded(result) and not any(neutral(o) for o in failures(result))


def test_a_long_key_card_is_cut_after_a_whole_room_number():
    assert key_cards.card_text([3, 1, 2]) == "[3, 1, 2]"
    cut = key_cards.card_text(list(range(100, 140)))
    assert cut == "[100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, …]"
    assert key_cards.card_text(list(range(100, 140)), 70).endswith(" 112, …]")
    assert key_cards.card_text(tuple(range(100, 140))).startswith("tuple (100, 101,")
    huge = key_cards.card_text([10**80])  # no whole number fits: cut as any value is
    assert huge.startswith("list [1000") and huge.endswith("…") and len(huge) <= 60
