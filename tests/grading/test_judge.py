"""`kvlab grade`'s judge: the checks run in the grader's process, the submission's code in its
own. Every cheat of issue 22 (and a few more) scores no more than the honest code in it; the
solutions get full marks; a report through the judge reads as the learner's own check cell."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT

from kvlab.grading import run_checks
from kvlab.grading.judge import judge, program

pytestmark = pytest.mark.slow


def _lab(number: str, folder: str = "labs"):
    (path,) = sorted((ROOT / folder).glob(f"{number}_*.ipynb"))
    return path, nbformat.read(path, as_version=4)


def exercise_cells(number: str) -> list[str]:
    _, lab = _lab(number)
    return [c.id for c in lab.cells if "raises-exception" in c.metadata.get("tags", [])]


def solution_of(number: str, cell_id: str) -> str:
    _, solution = _lab(number, "solutions")
    return next(c.source for c in solution.cells if c.get("id") == cell_id)


def submission(tmp_path: Path, number: str, cells: dict[str, str] | None = None, solved=()):
    """Lab ``number`` as a learner hands it in: ``solved`` exercise cells take the solution's
    code, ``cells`` (id -> source) replace whatever else they name."""
    path, lab = _lab(number)
    nb = copy.deepcopy(lab)
    for cell in nb.cells:
        if cell.id in solved:
            cell.source = solution_of(number, cell.id)
        if cells and cell.id in cells:
            cell.source = cells[cell.id]
    out = tmp_path / f"{number}_submission.ipynb"
    nbformat.write(nb, out)
    return out


def cut_lab(folder: Path, number: str) -> Path:
    """The judge's copy of Lab ``number`` cut to what its scores need: the set-up cell, the
    exercise cells and their check cells. (Whole labs and solutions are judged where the course
    is graded: tests/course/test_notebooks.py.)"""
    _, lab = _lab(number)
    code = [c for c in lab.cells if c.cell_type == "code"]
    nb = copy.deepcopy(lab)
    nb.cells = [
        c
        for c in nb.cells
        if c.cell_type == "code"
        and (
            c.id == code[0].id
            or "raises-exception" in c.metadata.get("tags", [])
            or c.source.startswith("check(")
        )
    ]
    out = folder / f"{number}_judged_lab.ipynb"
    nbformat.write(nb, out)
    return out


def judged(path: Path, **options):
    """``judge`` of a submission against its lab cut to set-up, exercise and check cells."""
    return judge(path, lab_path=cut_lab(path.parent, path.name[:2]), **options)


def scores(found) -> dict[str, tuple[int, int]]:
    return {k: (r.passed, r.total) for k, r in found.results.items()}


# --- honest work ---------------------------------------------------------------------------


# A solved and an unsolved Lab 01 (full marks, none), and what the report says of the sandbox, are
# read from the course's own grading: tests/course/test_notebooks.py grades every lab and solution once.


WRONG_KV_BYTES = """def kv_bytes_per_token(spec):
    return 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 2
"""


def test_a_report_through_the_judge_reads_as_the_check_cell_prints_it(tmp_path):
    """The same slip, checked in the learner's kernel and by the judge: the same report."""
    found = judged(submission(tmp_path, "00", {"lab00-14": WRONG_KV_BYTES}))
    namespace: dict = {}
    exec("from kvlab.models import ModelSpec\n" + WRONG_KV_BYTES, namespace)
    local = run_checks("00.kv_bytes", namespace["kv_bytes_per_token"])
    assert found.results["00.kv_bytes"].report() == local.report()
    assert "spec.dtype_bytes" in local.report()


# --- cheats ----------------------------------------------------------------------------------

FORGE = """import json, os
line = json.dumps({"exercise": "01.waste_split", "title": "x", "status": "passed", "passed": 6, "total": 6})
for path in {os.environ.get("KVLAB_GRADE_LOG", ""), "results.jsonl"} - {""}:
    with open(path, "a") as f:
        f.write(line + "\\n")
os._exit(0)
"""

FAKE_CHECK = """def check(exercise, obj, timeout=None):
    print(f"{exercise}: 6/6 checks passed\\nAll checks passed. Well done!")

def waste_split(booked, tokens, final):
    return (0, 0, 0)
"""

PATCH_REFERENCE = """import sys

def waste_split(booked, tokens, final):
    return (booked, 0, 0)  # wrong

import kvlab.core.accounting
for module in list(sys.modules.values()):
    if getattr(module, "__name__", "").startswith("kvlab") and hasattr(module, "split_waste"):
        module.split_waste = waste_split
"""

ALWAYS_EQUAL = """class Yes(tuple):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = tuple.__hash__

def waste_split(booked, tokens, final):
    return Yes((0, 0, 0))
"""

POISON = """import os, pickle, sys, struct

class Boom:
    def __reduce__(self):
        return (os.system, ("touch {marker}",))

def waste_split(booked, tokens, final):
    payload = pickle.dumps((pickle.dumps(("ok", Boom(), None, None)), {{}}))
    os.write(int(sys.argv[2]), struct.pack("!Q", len(payload)) + payload)
    return (0, 0, 0)
"""


@pytest.mark.parametrize(
    "name, cell",
    [
        ("forged results, then exit", FORGE),
        ("a check of its own", FAKE_CHECK),
        ("kvlab's reference swapped for the learner's", PATCH_REFERENCE),
        ("an answer that equals everything", ALWAYS_EQUAL),
    ],
)
def test_a_cheat_scores_no_more_than_its_honest_code(tmp_path, name, cell):
    found = judged(submission(tmp_path, "01", {"lab01-07": cell}))
    passed, total = scores(found)["01.waste_split"]
    assert (passed, total) == (0, 6), (name, found.results["01.waste_split"].report())
    assert scores(found)["01.max_length_cache"] == (0, 10)


def test_a_message_forged_on_the_judges_channel_runs_no_code_in_the_judge(tmp_path):
    marker = tmp_path / "judge-was-made-to-run-this"
    found = judged(submission(tmp_path, "01", {"lab01-07": POISON.format(marker=marker)}))
    assert not marker.exists()
    assert scores(found)["01.waste_split"][0] == 0


def test_a_given_cell_is_the_instructors_whatever_the_submission_says(tmp_path):
    """Only exercise cells come from the submission: a check cell turned into a print, or a
    given cell that redefines kvlab's names, has no effect; cells the learner added neither."""
    path, lab = _lab("01")
    nb = copy.deepcopy(lab)
    checks = [c for c in nb.cells if c.source.startswith("check(")]
    for c in checks:
        c.source = "print('All checks passed. Well done!')"
    for c in nb.cells:
        if c.id in exercise_cells("01"):
            c.source = solution_of("01", c.id)
    nb.cells.insert(3, nbformat.v4.new_code_cell("raise SystemExit('added by the learner')"))
    out = tmp_path / "01_tampered.ipynb"
    nbformat.write(nb, out)
    cells = program(nb, lab)
    assert [c.source for c in cells if c.kind == "check"] == [
        c.source for c in lab.cells if c.source.startswith("check(")
    ]
    # a cell the learner added runs where they put it (as in their kernel), as their own
    assert [c.kind for c in cells if "added by the learner" in c.source] == ["added"]
    found = judge(out)
    assert scores(found) == {"01.waste_split": (6, 6), "01.max_length_cache": (10, 10)}
    assert found.cell_match == "id" and not found.old_version


def test_an_exit_or_a_crash_costs_only_what_it_stops(tmp_path):
    """The learner's process dies (os._exit in one exercise, SIGSEGV inside a check): it is
    started again, the cells before replayed, and the other exercise is graded as usual."""
    crash = """import os, signal
def kv_bytes_per_token(spec):
    if spec.num_layers == 40:
        os.kill(os.getpid(), signal.SIGSEGV)
    return 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * spec.dtype_bytes
"""
    found = judged(submission(tmp_path, "00", {"lab00-14": crash}, solved=["lab00-07"]))
    kv = found.results["00.kv_bytes"]
    statuses = [o.status.value for o in kv.outcomes]
    assert statuses[0] == "crashed" and "SIGSEGV" in " ".join(kv.outcomes[0].details)
    assert kv.passed >= 2  # the checks without a 40-layer model still pass
    assert scores(found)["00.decode_step"] == (6, 6)
    exits = judged(
        submission(tmp_path, "00", {"lab00-07": "import os\nos._exit(3)"}, solved=["lab00-14"])
    )
    assert scores(exits)["00.kv_bytes"] == (5, 5)
    assert scores(exits)["00.decode_step"][0] == 0


def test_a_hang_costs_its_exercise_only(tmp_path):
    hang = "def kv_bytes_per_token(spec):\n    while True:\n        pass\n"
    path = submission(tmp_path, "00", {"lab00-14": hang}, solved=["lab00-07"])
    found = judged(path, check_timeout=3)
    kv = found.results["00.kv_bytes"]
    assert kv.passed == 0 and kv.outcomes[0].status.value == "stopped at limit"
    assert kv.status.value == "stopped at limit" and kv.timed_out == 1
    assert "stopped at its limit of 3 CPU-s" in kv.report() and "endless loop" not in kv.report()
    assert scores(found)["00.decode_step"] == (6, 6)


def test_judged_results_are_the_same_every_time(tmp_path):
    path = submission(
        tmp_path, "01", {"lab01-07": "def waste_split(b, t, f):\n    return (t, b - t, 0)"}
    )
    first, second = judged(path), judged(path)
    assert [r.report() for r in first.results.values()] == [
        r.report() for r in second.results.values()
    ]
    assert json.dumps(scores(first)) == json.dumps(scores(second))


WRITE_INTO_KVLAB = """import os, kvlab.grading
folder = os.path.dirname(kvlab.grading.__file__)
def waste_split(booked, tokens, final):
    return (0, 0, 0)
for name in ("lab01.py", "zz_planted.py"):
    try:
        with open(os.path.join(folder, name), "a") as f:
            f.write("\\nimport os; os.system('touch {marker}')\\n")
    except OSError:
        pass
"""

OUTLIVE = """import os, time, json
def waste_split(booked, tokens, final):
    return (0, 0, 0)
if os.fork() == 0:  # a writer that waits for the grader to finish, then forges its files
    os.setsid()
    time.sleep(4)
    open("{marker}", "w").write("still alive")
    os._exit(0)
"""


def test_the_package_stays_as_it_was_and_no_process_outlives_the_submission(tmp_path):
    import time

    import kvlab.grading

    folder = Path(kvlab.grading.__file__).parent
    before = sorted(p.name for p in folder.iterdir())
    lab01 = (folder / "lab01.py").read_bytes()
    marker = tmp_path / "planted-code-ran"
    found = judged(submission(tmp_path, "01", {"lab01-07": WRITE_INTO_KVLAB.format(marker=marker)}))
    assert sorted(p.name for p in folder.iterdir()) == before
    assert (folder / "lab01.py").read_bytes() == lab01 and not marker.exists()
    assert scores(found)["01.waste_split"][0] == 0
    late = tmp_path / "written-after-grading"
    judged(submission(tmp_path, "01", {"lab01-07": OUTLIVE.format(marker=late)}))
    time.sleep(6)
    assert not late.exists()


def test_kvlabs_own_objects_asked_to_do_the_work_are_refused_across_the_channel(tmp_path):
    """The scheduler the judge hands the learner's preempt stays in the judge: asking it for
    its own preempt is a hand-over there, as it is in the learner's kernel."""
    handover = "def preempt(scheduler):\n    return scheduler.preempt()\n"
    found = judged(submission(tmp_path, "06", {"lab06-09": handover}, solved=["lab06-12"]))
    result = found.results["06.preempt"]
    assert result.passed == 0, result.report()
    assert "hands the work to kvlab's" in result.report()
    assert scores(found)["06.step"] == (8, 8), found.results["06.step"].report()


FORGED_EXIT = """import gc, pickle, struct
from kvlab.grading.remote import Connection
_conn = next(o for o in gc.get_objects() if isinstance(o, Connection))
_fake = "01_submission.ipynb\\n  total  16/16  (100%)\\n"
_err = {"mro": [("builtins", "SystemExit")], "args": [0], "attrs": {}, "code": 0}
_body = pickle.dumps(("err", _err, (_fake, len(_fake)), None), protocol=5)
_frame = pickle.dumps((_body, {}), protocol=5)
import os
os.write(_conn.write_fd, struct.pack("!Q", len(_frame)) + _frame)
"""


def test_a_forged_exit_with_forged_output_ends_nothing_and_prints_nothing(tmp_path, capsys):
    _, lab = _lab("01")
    stub = next(c.source for c in lab.cells if c.get("id") == "lab01-10")
    cells = {"lab01-10": FORGED_EXIT + stub}
    found = judged(submission(tmp_path, "01", cells, solved=["lab01-07"]))
    assert "16/16" not in capsys.readouterr().out
    assert scores(found) == {"01.waste_split": (6, 6), "01.max_length_cache": (0, 10)}


def test_honest_code_returning_a_namedtuple_or_a_defaultdict_scores_as_in_the_kernel(tmp_path):
    split = solution_of("01", "lab01-07").replace(
        "return tokens, future, booked - tokens - future",
        "return Split(tokens, future, booked - tokens - future)",
    )
    assert "Split(" in split
    split = (
        'from collections import namedtuple\nSplit = namedtuple("Split", "used future internal")\n'
        + split
    )
    found = judged(submission(tmp_path, "01", {"lab01-07": split}))
    assert scores(found)["01.waste_split"] == (6, 6)


# --- notebooks as students hand them in ----------------------------------------------------


def colab_style(nb, out: Path) -> Path:
    """``nb`` as Colab saves it: nbformat 4.4, no cell ids (Colab keeps its own in
    metadata.id), no nbgrader metadata."""
    raw = json.loads(nbformat.writes(nb))
    raw["nbformat_minor"] = 4
    raw["metadata"] = {"colab": {"provenance": []}, "kernelspec": {"name": "python3"}}
    for i, cell in enumerate(raw["cells"]):
        cell.pop("id", None)
        cell["metadata"] = {"id": f"Xq{i:04d}zz"}
    out.write_text(json.dumps(raw))
    return out


def test_a_solved_notebook_without_cell_ids_colab_style_gets_full_marks(tmp_path):
    """Against the whole lab: every given cell is found by its text, each exercise by what it
    defines, and the grade says so."""
    from kvlab.grading.notebook import grade_by_judge

    _, solution = _lab("00", "solutions")
    path = colab_style(solution, tmp_path / "00_colab.ipynb")
    grade = grade_by_judge(path)
    assert grade.error is None and grade.passed == grade.total > 0, grade.to_dict()
    assert grade.cell_match == "order" and not grade.old_version
    assert "no cell ids (Colab, or nbformat 4.4)" in grade.cell_notes[0]


def test_a_helper_defined_in_a_cell_the_learner_added_is_there_when_the_exercise_calls_it(
    tmp_path,
):
    path, lab = _lab("00")
    nb = copy.deepcopy(lab)
    stub = next(i for i, c in enumerate(nb.cells) if c.get("id") == "lab00-14")
    nb.cells[stub].source = (
        "def kv_bytes_per_token(spec):\n    return kv_factor() * spec.num_layers * "
        "spec.num_kv_heads * spec.head_dim * spec.dtype_bytes\n"
    )
    helper = nbformat.v4.new_code_cell("def kv_factor():\n    return 2  # a K and a V\n")
    nb.cells.insert(stub, helper)  # a cell of the learner's own, just above the exercise
    nb.cells.insert(stub, nbformat.v4.new_code_cell("!pip install nothing"))
    out = tmp_path / "00_helper.ipynb"
    nbformat.write(nb, out)
    found = judged(out)
    assert scores(found)["00.kv_bytes"] == (5, 5), found.results["00.kv_bytes"].report()
    assert found.cell_match == "id"
    assert any("holds only shell commands or magics: left out" in n for n in found.cell_notes)


def test_an_old_version_of_the_lab_is_graded_and_flagged(tmp_path):
    path, lab = _lab("00")
    old = copy.deepcopy(lab)
    for cell in old.cells:
        if cell.get("id") in exercise_cells("00"):
            cell.source = solution_of("00", cell.id)
        elif cell.cell_type == "code" and not cell.source.startswith("check("):
            cell.source = "# v0.9 of the lab\n" + cell.source
    old.cells.insert(2, nbformat.v4.new_code_cell("x = 1", id="lab00-99"))
    out = tmp_path / "00_old.ipynb"
    nbformat.write(old, out)
    found = judge(out)  # against the whole lab: this version's given cells run
    assert scores(found) == {"00.kv_bytes": (5, 5), "00.decode_step": (6, 6)}
    assert found.old_version[0] == "cells of another version of the lab: lab00-99"
    assert "given cells differ or are missing" in found.old_version[1]
    assert any("another version of the lab" in n for n in found.cell_notes)


def test_cells_are_found_by_grade_id_when_their_ids_are_gone():
    """nbgrader's release keeps grade_id in the metadata; the ids may not survive."""
    from kvlab.grading.cell_match import match_cells

    _, lab = _lab("03")
    nb = copy.deepcopy(lab)
    for cell in nb.cells:
        cell.pop("id", None)
        if cell.get("metadata", {}).get("nbgrader"):
            cell.source = "# edited\n" + cell.source  # not found by its text: by grade_id
    matched = match_cells(nb, lab)
    assert matched.how == "grade_id" and not matched.missing


# Lab 07's slips that answer alike on every input and are told apart by the learner's bytecode
# (kvlab.grading.slips.stores_attribute, rebinds_argument): the judge reads it with the "code"
# request, so the hint is the one the learner's own check cell gives.
BYTECODE_SLIPS = {
    "prefix-exercise": ("        parent = key\n", "        parent = hit.parent_hash\n"),
    "evict-exercise": (
        "block = free_queue.pop(0)  # the room freed longest ago",
        "block, free_queue = free_queue[0], free_queue[1:]",
    ),
}


def test_lab07s_hints_read_from_the_learners_bytecode_are_given_through_the_judge(tmp_path):
    from kvlab.grading.lab07 import hints

    cells = {}
    for cell_id, (old, new) in BYTECODE_SLIPS.items():
        source = solution_of("07", cell_id)
        assert old in source
        cells[cell_id] = source.replace(old, new)
    found = judged(submission(tmp_path, "07", cells))
    for exercise, hint in (("07.cached_prefix", hints.PARENT_HASH), ("07.eviction", hints.REBOUND)):
        result = found.results[exercise]
        first = next(o for o in result.outcomes if not o.passed)
        said = [" ".join(d.split()) for d in first.details if d.startswith("hint:")]
        assert said == ["hint: " + " ".join(hint.split())], result.report()
