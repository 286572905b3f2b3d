"""Labs 03–05 checks, tried with learner code: the solution cell with one typical mistake put in.

Each mistake must fail the check that targets it, with the hint that names it; later checks broken
by the same mistake say "probably the same problem as above"; a mistake the checks do not know gets
the neutral line; a class with some methods written gets the marks for them.
"""

import json
import os
import pathlib
import re
import sys
import tempfile

import cpu_limit
import pytest
import torch

from kvlab.grading import Status, run_checks
from kvlab.grading.labgen import strip_solution
from kvlab.grading.report import NO_DIAGNOSIS, SAME_PROBLEM

ROOT = pathlib.Path(__file__).parents[2]


def failed(result) -> list[str]:
    return [o.name for o in result.outcomes if not o.passed]


def hints(outcome) -> list[str]:
    return [d for d in outcome.details if d.startswith("hint:")]


def folded_into(outcome, first: str) -> bool:
    return outcome.details[0] == f"{SAME_PROBLEM} (“{first}”)"


def solution_code(notebook: str, cell_id: str, name: str, edits=(), stub=None, header=""):
    """``name`` from a solution cell, as a learner would write it: the solution with edits
    ("old => new"), or labgen's learner stub with ``stub`` in place of its NotImplementedError.
    The code lives in a file outside kvlab, so the checks see it as the learner's."""
    cells = json.loads((ROOT / "solutions" / notebook).read_text())["cells"]
    source = next("".join(c["source"]) for c in cells if c.get("id") == cell_id)
    if stub is not None:
        source = strip_solution(source)[0].replace("raise NotImplementedError", stub)
    else:
        source = "".join(line for line in source.splitlines(True) if "### " not in line)
    for edit in edits:
        old, new = edit.split(" => ")
        assert old in source, old
        source = source.replace(old, new)
    folder = pathlib.Path(tempfile.mkdtemp(prefix="kvlab-learner-"))
    path = folder / "learner.py"  # @triton.jit reads the source from a file
    path.write_text(header + source)
    namespace = {}
    exec(compile(header + source, str(path), "exec"), namespace)
    return namespace[name]


# --- Lab 03: the block manager ---------------------------------------------------------------

ROOMS = "needed = -(-num_tokens // self.block_size)"
APPEND_BODY = """        if self.tokens[seq_id] % self.block_size == 0:  # last room full
            if not self.free_blocks:
                raise OutOfBlocks(f"{seq_id!r} needs a new room and none is free")
            card.append(self.free_blocks.pop())
        self.tokens[seq_id] += 1"""
FREE_BODY = "self.free_blocks.extend(reversed(self.block_tables.pop(seq_id)))"
ALLOCATE_CHECK = "allocate: n tokens get a key card of ceil(n / block_size) rooms"


def manager(*edits, stub=None):
    return solution_code(
        "03_paged_allocator.ipynb",
        "lab03-05",
        "BlockManager",
        edits,
        stub,
        header="from kvlab.core.block_manager import OutOfBlocks\n",
    )


def test_block_manager_solution_passes_and_the_stub_is_not_written_yet():
    assert run_checks("03.block_manager", manager()).ok
    assert (
        run_checks("03.block_manager", manager(stub="raise NotImplementedError")).status
        is Status.NOT_IMPLEMENTED
    )


@pytest.mark.parametrize(
    "rooms, named",
    [
        ("num_tokens // self.block_size + 1", "one room too many"),
        ("num_tokens // self.block_size", "one room too few"),
    ],
)
def test_rooms_off_by_one_is_named_where_it_happens_and_its_knock_ons_fold(rooms, named):
    result = run_checks("03.block_manager", manager(f"{ROOMS} => needed = {rooms}"))
    first, *rest = result.outcomes
    assert result.passed == 0 and first.name.startswith(ALLOCATE_CHECK)
    assert named in hints(first)[0] and "-(-num_tokens // block_size)" in hints(first)[0]
    assert all(folded_into(o, first.name) for o in rest), [o.details for o in rest]
    assert not any(hints(o) for o in rest)  # no knock-on hint about free or OutOfBlocks


def test_transcript_marks_the_refused_calls_and_the_failing_one():
    refuses_the_last_room = manager("if needed > len( => if needed >= len(")
    result = run_checks("03.block_manager", refuses_the_last_room)
    refusals = next(o for o in result.outcomes if o.name.startswith("allocate refuses"))
    shown = next(d for d in refusals.details if d.startswith("input:"))
    assert ".allocate('b', 5) raised OutOfBlocks; " in shown  # refused, as it should be
    assert shown.endswith("→ .allocate('b', 4) raised OutOfBlocks")  # wrongly refused
    assert "exactly enough rooms are free" in hints(refusals)[0]
    assert failed(result)[0] == refusals.name
    assert all(
        folded_into(o, refusals.name) for o in result.outcomes if o.name in failed(result)[1:]
    )


def test_a_long_transcript_is_cut_and_says_how_to_replay_it(capsys):
    from kvlab.grading.lab03 import random_evening

    cls = manager("if needed > len( => if needed >= len(")
    evening = run_checks("03.block_manager", cls).outcomes[-1]
    shown = next(d for d in evening.details if d.startswith("input:"))
    replay = next(d for d in evening.details if d.startswith("replay:"))
    assert re.search(r"; … \d+ calls …; ", shown) and len(shown) < 400
    steps = int(re.search(r"random_evening\(BlockManager, steps=(\d+)\)", replay).group(1))
    random_evening(cls, steps=steps)  # what the learner runs: every call, then the report
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "BlockManager(24, 3)" and len(printed) > 20
    assert any("exactly enough rooms are free" in line for line in printed)


def test_free_that_keeps_the_key_card_fails_the_forget_check_only():
    keeps = manager(f"{FREE_BODY} => self.free_blocks.extend(reversed(self.block_tables[seq_id]))")
    result = run_checks("03.block_manager", keeps)
    (only,) = [o for o in result.outcomes if not o.passed]
    assert only.name.startswith("free forgets the guest")
    assert "block_table('a') still answers" in only.details[0]
    assert "free must forget the guest" in hints(only)[0]


def test_a_partly_written_class_gets_the_marks_for_its_methods():
    allocate_only = manager(
        "card = self.block_tables[seq_id] => raise NotImplementedError",
        f"{FREE_BODY} => raise NotImplementedError",
    )
    result = run_checks("03.block_manager", allocate_only)
    assert result.passed == 2 and result.unwritten == ["append_slot", "free"]
    header = " ".join(line.strip() for line in result.report().splitlines()[:2])  # wrapped
    assert "(still to write: `append_slot`, `free`)" in header
    assert "not implemented yet: `free` still raises NotImplementedError" in result.report()

    no_free = manager(f"{FREE_BODY} => raise NotImplementedError")
    result = run_checks("03.block_manager", no_free)
    assert result.passed == 4 and result.unwritten == ["free"]


@pytest.mark.parametrize(
    "edit, named",
    [
        (
            f"{APPEND_BODY} => "
            + APPEND_BODY.replace("        self.tokens[seq_id] += 1", "").replace(
                "        if self.tokens", "        self.tokens[seq_id] += 1\n        if self.tokens"
            ),
            "one token early",
        ),
        ("        self.tokens[seq_id] += 1\n => \n", "does not count the new token"),
        ("card.append(self.free_blocks.pop()) => card[-1] = self.free_blocks.pop()", "never adds"),
        ("card.append(self.free_blocks.pop()) => self.free_blocks.pop()", "never adds"),
        ("if self.tokens[seq_id] % self.block_size == 0: => if True:", "for every token"),
    ],
)
def test_append_slot_slips_are_named_and_their_knock_ons_fold(edit, named):
    result = run_checks("03.block_manager", manager(edit))
    first = next(o for o in result.outcomes if not o.passed)
    assert first.name == "append_slot takes a new room exactly when the last room is full"
    assert named in hints(first)[0]
    later = [o for o in result.outcomes if not o.passed and o is not first]
    assert later and all(folded_into(o, first.name) for o in later)


def test_refusal_slips_are_named():
    no_count = manager("if needed > len(self.free_blocks): => if False:")
    (outcome,) = [o for o in run_checks("03.block_manager", no_count).outcomes if not o.passed]
    assert "got:      IndexError: pop from empty list" in outcome.details
    assert "raise OutOfBlocks before taking any" in hints(outcome)[0]

    leaky = manager(
        "if needed > len(self.free_blocks):\n            raise => "
        "if needed > len(self.free_blocks):\n            self.free_blocks.pop()\n            raise"
    )
    (outcome,) = [o for o in run_checks("03.block_manager", leaky).outcomes if not o.passed]
    assert "got:      changed free rooms 1 → 0" in outcome.details
    assert "raise OutOfBlocks before taking any" in hints(outcome)[0]


def test_an_unknown_block_manager_mistake_gets_the_neutral_line():
    one_room_many_times = manager(
        "[self.free_blocks.pop() for _ in range(needed)] => [self.free_blocks.pop()] * needed"
    )
    first = run_checks("03.block_manager", one_room_many_times).outcomes[0]
    assert "is twice on 'exact''s key card" in first.details[0]
    assert hints(first) == [] and any(
        d.startswith(f"note:     {NO_DIAGNOSIS}") for d in first.details
    )


def test_two_guests_in_one_room_are_named_by_their_entries():
    one_room = "[self.free_blocks.pop() for _ in range(needed)]"
    same_rooms = manager(f"{one_room} => [self.free_blocks.pop() * 0 + i for i in range(needed)]")
    first = next(o for o in run_checks("03.block_manager", same_rooms).outcomes if not o.passed)
    assert re.match(
        r"room 0 is entry 0 of '\w+''s key card and entry 0 of '\w+''s$", first.details[0]
    )
    assert "got:      one: 0" in first.details


# --- Lab 03: the beds report -----------------------------------------------------------------


def beds(m, ids):
    used = sum(m.num_tokens(s) for s in ids)
    held = sum(len(m.block_table(s)) for s in ids) * m.block_size
    return {"used": used, "future": held - used, "free": m.num_free_blocks * m.block_size}


def test_beds_report_slips_are_named_and_unknown_ones_are_not():
    assert run_checks("03.beds_report", beds).ok

    def rooms_not_beds(m, ids):
        return {**beds(m, ids), "free": m.num_free_blocks}

    result = run_checks("03.beds_report", rooms_not_beds)
    first = result.outcomes[0]
    assert failed(result)[0] == first.name == "two guests with partly filled last rooms"
    assert "free counts rooms" in hints(first)[0]

    def old_name(m, ids):
        report = beds(m, ids)
        return {"used": report["used"], "empty": report["future"], "free": report["free"]}

    first = run_checks("03.beds_report", old_name).outcomes[0]
    assert "the keys are used, future and free" in hints(first)[0]

    def off_by_one(m, ids):
        return {**beds(m, ids), "used": beds(m, ids)["used"] + 1}

    first = run_checks("03.beds_report", off_by_one).outcomes[0]
    assert hints(first) == [] and any(
        d.startswith(f"note:     {NO_DIAGNOSIS}") for d in first.details
    )


# --- Lab 04 ----------------------------------------------------------------------------------


def attention(q, kc, vc, bt, sl, rooms_of=None, cut=True):
    """A learner's gather-then-attend; ``rooms_of(n, block_size)`` and ``cut`` put mistakes in."""
    from kvlab.ops.attention import decode_attention

    out = torch.empty_like(q)
    for s in range(q.shape[0]):
        n = int(sl[s])
        rooms = bt[s, : (rooms_of or (lambda n, b: -(-n // b)))(n, kc.shape[1])].long()
        k, v = kc[rooms].flatten(0, 1), vc[rooms].flatten(0, 1)
        out[s] = decode_attention(q[s], k[:n] if cut else k, v[:n] if cut else v)
    return out


def test_paged_attention_solution_passes():
    assert run_checks("04.paged_attention", attention).ok


def test_a_missing_cut_of_the_last_room_is_named_once_and_folds_later_failures():
    result = run_checks("04.paged_attention", lambda *a: attention(*a, cut=False))
    first, *rest = [o for o in result.outcomes if not o.passed]
    assert first.name == "one guest in one room"
    assert "every bed of the last room" in hints(first)[0]
    names = [o.name for o in rest]
    assert any(n.startswith("grouped-query") for n in names) and any("fp16" in n for n in names)
    assert all(folded_into(o, first.name) for o in rest)  # no GQA or fp16 hint


def test_attention_skipping_the_last_room_is_named_by_the_first_check():
    """n // block_size rooms leave the first check's guest of 3 tokens (rooms of 4) without a bed:
    all it shows is zeros (or NaN), which code right on whole rooms only gets from the floor."""
    result = run_checks(
        "04.paged_attention", lambda *a: attention(*a, rooms_of=lambda n, b: n // b)
    )
    first, *rest = [o for o in result.outcomes if not o.passed]
    assert first.name == "one guest in one room"
    assert "the last, partly filled room was left out" in hints(first)[0]
    assert rest and all(folded_into(o, first.name) for o in rest)

    zeros = run_checks("04.paged_attention", lambda q, *a: torch.zeros_like(q)).outcomes[0]
    assert hints(zeros) == []  # zeros everywhere, whole rooms too: not the floor


def test_attention_softmax_over_the_heads_is_named():
    import math

    def over_heads(q, kc, vc, bt, sl):
        out = torch.empty_like(q)
        group = q.shape[1] // kc.shape[2]
        for s in range(q.shape[0]):
            k, v = own_gather(kc, vc, bt[s], int(sl[s]))
            k, v = k.repeat_interleave(group, 1).float(), v.repeat_interleave(group, 1).float()
            scores = torch.einsum("hd,thd->ht", q[s].float(), k) / math.sqrt(q.shape[2])
            out[s] = torch.einsum("ht,thd->hd", scores.softmax(dim=0), v).to(q.dtype)
        return out

    result = run_checks("04.paged_attention", over_heads)
    first, *rest = [o for o in result.outcomes if not o.passed]
    assert first.name == "one guest in one room"
    assert "softmax over the wrong axis" in hints(first)[0]
    assert rest and all(folded_into(o, first.name) for o in rest)


def test_attention_gather_chart_says_1_guest_not_1_guests():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = json.loads((ROOT / "solutions" / "04_paged_attention.ipynb").read_text())["cells"]
    source = {c.get("id"): "".join(c["source"]) for c in cells}
    namespace: dict = {}
    exec(source["lab04-01"] + "\n" + source["lab04-11"], namespace)
    plt.close("all")
    assert namespace["labels"][:2] == ["1 guest x 2,048", "32 guests x 2,048"]


def test_reading_padding_entries_is_named():
    from kvlab.ops.attention import decode_attention

    def whole_rows(q, kc, vc, bt, sl):  # indexes with every entry, then cuts: 10**9 fails
        out = torch.empty_like(q)
        for s in range(q.shape[0]):
            n = int(sl[s])
            out[s] = decode_attention(
                q[s], kc[bt[s].long()].flatten(0, 1)[:n], vc[bt[s].long()].flatten(0, 1)[:n]
            )
        return out

    def masked_rows(q, kc, vc, bt, sl):  # attends every entry's room, masks beds past seq_len
        out = torch.empty_like(q)
        for s in range(q.shape[0]):
            rooms = bt[s].long().clamp(0, kc.shape[0] - 1)
            k, v = kc[rooms].flatten(0, 1), vc[rooms].flatten(0, 1)
            lens = sl[s : s + 1].clamp(max=k.shape[0])
            out[s] = decode_attention(q[s : s + 1], k[None], v[None], seq_lens=lens)[0]
        return out

    for learner in (whole_rows, masked_rows):
        result = run_checks("04.paged_attention", learner)
        (outcome,) = [o for o in result.outcomes if not o.passed]
        assert outcome.name.startswith("unused key-card entries")
        assert hints(outcome) == [
            "hint:     read only the first ceil(seq_len / block_size) entries of each key card"
        ]


def own_gather(kc, vc, table, n):
    """The learner's own gather (kvlab's gather_kv would be a hand-over)."""
    rooms = table[: -(-n // kc.shape[1])].long()
    return kc[rooms].flatten(0, 1)[:n], vc[rooms].flatten(0, 1)[:n]


HANDOVERS = """
import torch
from kvlab.ops.attention import decode_attention, gather_kv, paged_decode_attention_ref

wrapper = lambda *a: paged_decode_attention_ref(*a)

def gathers_with_kvlab(q, kc, vc, bt, sl):
    out = torch.empty_like(q)
    for s in range(q.shape[0]):
        k, v = gather_kv(kc, vc, bt[s], int(sl[s]))
        out[s] = decode_attention(q[s], k, v)
    return out
"""


def test_handing_attention_to_kvlab_is_refused():
    from kvlab.ops.attention import decode_attention

    cell: dict = {"__name__": "__main__"}  # a notebook cell's globals, as the learner has them
    exec(compile(HANDOVERS, "<learner cell>", "exec"), cell)
    for learner in (cell["wrapper"], cell["gathers_with_kvlab"]):
        result = run_checks("04.paged_attention", learner)
        first = result.outcomes[0]
        assert result.passed == 0 and "hands the work to kvlab's" in first.details[0]
        assert all(folded_into(o, first.name) for o in result.outcomes[1:])

    def own(q, kc, vc, bt, sl):  # decode_attention on its own gather is the exercise
        out = torch.empty_like(q)
        for s in range(q.shape[0]):
            out[s] = decode_attention(q[s], *own_gather(kc, vc, bt[s], int(sl[s])))
        return out

    assert run_checks("04.paged_attention", own).ok


def test_paged_attention_diagnoses_the_wrong_kv_head():
    from kvlab.ops.attention import decode_attention

    def modulo_heads(q, kc, vc, bt, sl):
        out = torch.empty_like(q)
        heads = [h % kc.shape[2] for h in range(q.shape[1])]
        for s in range(q.shape[0]):
            k, v = own_gather(kc, vc, bt[s], int(sl[s]))
            out[s] = decode_attention(q[s], k[:, heads], v[:, heads])
        return out

    result = run_checks("04.paged_attention", modulo_heads)
    first = result.outcomes[0]
    assert "h // 2 (the group size), not h % 2" in hints(first)[0]
    gqa = next(o for o in result.outcomes if o.name.startswith("grouped-query"))
    assert folded_into(gqa, first.name)


def test_an_unknown_attention_mistake_gets_the_neutral_line():
    import kvlab.grading.lab04

    result = run_checks("04.paged_attention", lambda *a: attention(*a) + 0.1)
    first = result.outcomes[0]
    assert any(d.startswith("expected: [") and "values)" in d for d in first.details)
    assert hints(first) == [] and any(
        d.startswith(f"note:     {NO_DIAGNOSIS}") for d in first.details
    )
    replay = next(d for d in first.details if d.startswith("replay:"))  # tensors are not shown
    call = replay.removeprefix("replay:").removesuffix(" builds these inputs").strip()
    q, *_ = eval(call, {"kvlab": kvlab, "torch": torch})
    assert q.shape == (1, 4, 16)


# --- Lab 05 ----------------------------------------------------------------------------------


def kernel(*edits, stub=None, imports=""):
    return solution_code(
        "05_triton_kernel.ipynb",
        "lab05-07",
        "my_paged_decode_kernel",
        edits,
        stub,
        header=f"{imports}import triton\nimport triton.language as tl\n\n",
    )


def test_kernel_checks():
    from kvlab.ops.kernels import paged_decode_kernel

    refused = run_checks("05.kernel", paged_decode_kernel)
    assert (
        refused.status is Status.WRONG_KIND
        and "kvlab's reference" in refused.outcomes[0].details[0]
    )
    assert (
        run_checks("05.kernel", kernel(stub="raise NotImplementedError")).status
        is Status.NOT_IMPLEMENTED
    )
    zeros = kernel(
        stub="seq = tl.program_id(0)\n"
        "    d = tl.arange(0, D_P2)\n"
        "    tl.store(out_ptr + seq * stride_os + d * stride_od, tl.zeros([D_P2], tl.float32), "
        "mask=d < HEAD_DIM)"
    )
    result = run_checks("05.kernel", zeros)
    assert result.passed == 0 and "differs from the reference" in result.outcomes[0].details[0]
    # only query head 0 is stored: the others still hold the checks' marked NaN
    assert "got:      [nan, nan, nan, nan, …] (16 values)" in result.outcomes[0].details
    assert "no value stored for guest 0, query head 1" in hints(result.outcomes[0])[0]


WHOLE_ROW = "range(0, tl.cdiv(seq_len, BLOCK_SIZE)) => range(0, stride_bts)"
UNMASKED_LOADS = (
    "kv_mask = tmask[:, None] & dmask[None, :] => kv_mask = dmask[None, :] & (t[:, None] >= 0)"
)


def test_a_loop_over_the_whole_key_card_row_fails_the_strides_check():
    """With the token mask every load past seq_len is masked, so padding rooms are never read:
    only the number of steps gives the loop away, seen when the row stride is not the row's
    length. Without it, the room full of NaN gives the reads away too."""
    result = run_checks("05.kernel", kernel(WHOLE_ROW))
    (outcome,) = [o for o in result.outcomes if not o.passed]
    assert outcome.name.startswith("key cards stored column by column")
    assert "the loop ran stride_bts times" in hints(outcome)[0]

    result = run_checks("05.kernel", kernel(WHOLE_ROW, UNMASKED_LOADS))
    padding, strides = [o for o in result.outcomes if not o.passed]
    assert padding.name.startswith("rooms past the key card's end are never read")
    assert padding.details[0].endswith("a padding entry of its key card was read")
    assert "the loop ran stride_bts times" in hints(strides)[0]


def test_a_missing_mask_on_the_last_room_is_named_once_and_folds_the_gqa_and_bf16_checks():
    unmasked = kernel(
        'scores = tl.where(tmask[None, :], scores, float("-inf")) => pass', UNMASKED_LOADS
    )
    result = run_checks("05.kernel", unmasked)
    first, *rest = result.outcomes
    assert result.passed == 0
    assert "the beds past seq_len in the last room were scored" in hints(first)[0]
    assert any(o.name.startswith("grouped-query") for o in rest)
    assert any(o.name.startswith("bf16") for o in rest)
    assert all(folded_into(o, first.name) for o in rest)


def test_kernel_that_corrupts_memory_fails_one_check_per_crash():
    """A store outside every tensor kills the interpreter's process: the checks run in children,
    so the report still comes back, one line per check."""
    crashing = kernel("out_ptr + seq => out_ptr + 2**40 + seq")  # far outside
    result = run_checks("05.kernel", crashing)
    assert result.status is Status.FAILED and result.passed == 0
    first, *rest = result.outcomes
    assert first.details[0].startswith("your code crashed the process (SIG"), first.details
    assert "mask every tl.load / tl.store" in first.details[1]
    assert all(folded_into(o, first.name) for o in rest)


def test_kernel_without_scale_is_named():
    details = run_checks("05.kernel", kernel("axis=2) * scale => axis=2)")).outcomes[0].details
    assert any("multiply the scores q·k by scale" in d for d in details), details


TRITON_FIRST = """
import json, pathlib, sys, tempfile
import triton  # before kvlab: too late for kvlab to choose the interpreter
import kvlab
from kvlab.grading import run_checks
cells = json.loads(pathlib.Path("solutions/05_triton_kernel.ipynb").read_text())["cells"]
source = next("".join(c["source"]) for c in cells if c.get("id") == "lab05-07")
source = "import triton\\nimport triton.language as tl\\n" + "".join(
    line for line in source.splitlines(True) if "### " not in line)
path = pathlib.Path(tempfile.mkdtemp(prefix="kvlab-learner-")) / "learner.py"
path.write_text(source)
namespace = {}
exec(compile(source, str(path), "exec"), namespace)
result = run_checks("05.kernel", namespace["my_paged_decode_kernel"])
print(json.dumps([o.details for o in result.outcomes]))
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU Triton compiles: no interpreter")
def test_triton_imported_before_kvlab_is_named_in_every_check_not_blamed_on_the_kernel():
    from kvlab.ops.runtime import TRITON_TOO_EARLY_DETAILS

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = cpu_limit.run(
        [sys.executable, "-c", TRITON_FIRST],
        cpu=300,
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    first, *rest = json.loads(run.stdout.splitlines()[-1])
    assert first == list(TRITON_TOO_EARLY_DETAILS)
    assert rest and all(d == [f"{SAME_PROBLEM} (“one guest in one room”)"] for d in rest)


def test_case_builder_padding_and_transposed_key_cards_leave_the_answer_alone():
    from kvlab.grading.lab04 import NAN_ROOM, make_case
    from kvlab.ops.attention import paged_decode_attention_ref

    plain = make_case([5, 11, 9], 4)
    odd = make_case([5, 11, 9], 4, garbage=NAN_ROOM, transposed=True)
    tables = odd[3]
    assert tables.stride() == (1, 3)
    for s, rooms in enumerate([2, 3, 3]):  # the same key cards; only the padding differs
        assert tables[s, :rooms].tolist() == plain[3][s, :rooms].tolist()
    assert odd[1][int(tables[0, -1])].isnan().all()  # padding names the room full of NaN
    assert torch.equal(paged_decode_attention_ref(*odd), paged_decode_attention_ref(*plain))


STORE = "out.to(out_ptr.dtype.element_ty), mask=qmask,"
GQA_CHECK = "grouped-query attention with head_dim 40"
GROUP_OF_3_CHECK = "groups of 3 query heads"


@pytest.mark.parametrize(
    "mask, first_failing, failing",
    [
        ("", GQA_CHECK, 2),  # no mask: lanes past HEAD_DIM and the padded group row
        ("mask=dmask[None, :],", GROUP_OF_3_CHECK, 1),  # lanes only: the padded group row
    ],
)
def test_kernel_store_outside_the_output_fails_the_same_checks_every_time(
    mask, first_failing, failing
):
    """In the interpreter the programs run one after another, so a stray row or lane is
    overwritten by the next program, except the last program's, which lands past the output
    (and sometimes crashed the process). The guard regions see it every time."""
    learner = kernel(f"{STORE} => out.to(out_ptr.dtype.element_ty), {mask}")
    runs = [run_checks("05.kernel", learner) for _ in range(3)]
    reports = [[(o.name, o.passed, o.details) for o in r.outcomes] for r in runs]
    assert reports[0] == reports[1] == reports[2]
    first, *rest = [o for o in runs[0].outcomes if not o.passed]
    assert first.name.startswith(first_failing) and len(rest) == failing - 1
    assert first.details[0].startswith("your kernel stored outside the output: ")
    assert "mask tl.store with the head mask (g < GROUP)" in hints(first)[0]
    assert "(d < HEAD_DIM)" in hints(first)[0]
    assert all(folded_into(o, first.name) for o in rest)


@pytest.mark.parametrize(
    "edits, named",
    [
        (["acc = acc * alpha[:, None] + => acc = acc +"], "acc was not rescaled"),
        (["denom = denom * alpha + => denom = denom +"], "l (the running sum) was not rescaled"),
        (
            ["acc = acc * alpha[:, None] + => acc = acc +", "denom * alpha + => denom +"],
            "neither acc nor l was rescaled",
        ),
        (["        m = m_new\n => \n"], "set m = m_new at the end of each room"),
    ],
)
def test_kernel_forgetting_the_online_softmax_rescale_is_named_and_folds(edits, named):
    """One room needs no rescaling: the first check passes, the first guest of several rooms
    names the slip, and every later check is the same problem."""
    result = run_checks("05.kernel", kernel(*edits))
    first, *rest = [o for o in result.outcomes if not o.passed]
    assert result.outcomes[0].passed and first.name.startswith("lengths 1, k·block_size")
    assert named in hints(first)[0]
    assert len(rest) == 5 and all(folded_into(o, first.name) for o in rest)


@pytest.mark.parametrize(
    "edits, named",
    [
        (["heads = kvh * GROUP + g => heads = kvh + g"], "not kvh + g"),
        (
            ["range(0, tl.cdiv(seq_len, BLOCK_SIZE)) => range(0, seq_len // BLOCK_SIZE)"],
            "loop over b < tl.cdiv(seq_len, BLOCK_SIZE), not seq_len // BLOCK_SIZE",
        ),
    ],
)
def test_kernel_slips_are_named_by_the_first_check_and_fold_the_rest(edits, named):
    """Overlapping query rows and a floor loop show on the first check already (one guest of 3
    tokens in a room of 4, 4 query heads on 2 KV heads)."""
    result = run_checks("05.kernel", kernel(*edits))
    first, *rest = result.outcomes
    assert result.passed == 0 and named in hints(first)[0]
    assert all(folded_into(o, first.name) for o in rest)


def test_a_kernel_that_never_stores_is_told_so():
    store = (
        "    tl.store(\n        out_ptr + seq.to(tl.int64) * stride_os + heads[:, None] * stride_oh"
        " + d[None, :] * stride_od,\n        out.to(out_ptr.dtype.element_ty), mask=qmask,\n    )\n"
    )
    result = run_checks("05.kernel", kernel(f"{store} => "))
    first, *rest = result.outcomes
    assert result.passed == 0 and first.details[0] == "your kernel stored no value at all"
    assert not any(d.startswith("got:") for d in first.details)  # no uninitialised memory shown
    assert "does the kernel reach tl.store for every (guest, query head)?" in hints(first)[0]
    assert all(folded_into(o, first.name) for o in rest)


@pytest.mark.parametrize(
    "edit, name",
    [
        (
            "mask=qmask, other=0.0,\n    ).to(tl.float32)\n    seq_len => ).to(tl.float32)\n    seq_len",
            "q",
        ),
        ("kv_mask = tmask[:, None] & dmask[None, :] => kv_mask = tmask[:, None]", "k_cache"),
    ],
)
def test_kernel_load_outside_an_input_is_named_every_time(edit, name):
    """Lanes 40..63 of a head_dim-40 vector used to read the next head's values (harmless) or,
    at the end of the tensor, whatever lay there. The checks put NaN between and around the
    vectors, so an unmasked lane spoils the answer every time and is named."""
    learner = kernel(edit)
    for _ in range(2):
        result = run_checks("05.kernel", learner)
        (outcome,) = [o for o in result.outcomes if not o.passed]
        assert outcome.name.startswith(GQA_CHECK)
        assert f"a tl.load read memory outside {name}: mask it" in hints(outcome)[0]
        assert "(d < HEAD_DIM)" in hints(outcome)[0]


@pytest.mark.parametrize(
    "edit, imports, failing, said, named",
    [
        (
            "alpha = tl.exp( => alpha = torch.exp(",
            "import torch\n",
            7,
            "must be Tensor, not tensor",
            "inside @triton.jit use tl.* functions",
        ),
        (
            "d = tl.arange(0, D_P2) => d = tl.arange(0, HEAD_DIM)",
            "",
            1,  # only head_dim 40 is not a power of two
            "arange's range must be a power of 2",
            "use D_P2 (the next power of two) with the mask d < HEAD_DIM",
        ),
        (
            "        m = m_new\n => \n        m[0] = 0.0\n        m = m_new\n",
            "",
            7,
            "does not support item assignment",
            "a Triton block cannot be changed in place",
        ),
    ],
)
def test_kernel_triton_errors_that_name_a_mistake_get_its_hint(edit, imports, failing, said, named):
    result = run_checks("05.kernel", kernel(edit, imports=imports))
    first, *rest = [o for o in result.outcomes if not o.passed]
    assert len(rest) == failing - 1 and first.details[0].startswith(
        "Triton stopped your kernel at line "
    )
    assert said in next(d for d in first.details if d.startswith("got:"))
    assert named in hints(first)[0]
    assert all(folded_into(o, first.name) for o in rest)


def test_kernel_checks_promise_nothing_about_one_room_too_many():
    """A loop to tl.cdiv(seq_len, BLOCK_SIZE) + 1 reads one more key-card entry and then only
    loads masked by the token mask, which is all false there: the answer and every tensor are
    unchanged, so no check can see it, and no check's title may say it does."""
    from kvlab.grading import get_exercise

    names = [c.name for c in get_exercise("05.kernel").checks]
    assert not any("stop at the last room" in n for n in names)
