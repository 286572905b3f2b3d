"""`kvlab grade SUBMISSIONS --out DIR`: a class found in both layouts (and what is skipped, said),
deterministic shards that merge into the gradebook of one run, the CSV and the feedback files,
and a notebook that crashes or hangs costing its own row only."""

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import time

import cpu_limit
import nbformat
import psutil
import pytest
from conftest import LEARNER_ENV, ROOT, kvlab_cli

from kvlab.cli import main as kvlab_main
from kvlab.grading import classroom
from kvlab.grading.classroom import (
    ClassroomError,
    Discovery,
    Submission,
    class_document,
    discover,
    feedback_markdown,
    grade_submissions,
    gradebook_csv,
    merge_documents,
    parse_shard,
    select_shard,
)


def write_notebook(path, sources):
    path.parent.mkdir(parents=True, exist_ok=True)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, path)
    return path


# --- finding the class -------------------------------------------------------------------------


def test_discovers_both_layouts_and_says_what_it_skipped(tmp_path):
    sub = tmp_path / "SUB"
    for name in [
        "alice/00_why_kv_cache.ipynb",
        "alice/03_paged_allocator.ipynb",
        "alice/notes.ipynb",  # no lab number
        "alice/extra/05_x.ipynb",  # too deep
        "alice/.ipynb_checkpoints/00_why_kv_cache-checkpoint.ipynb",
        "bob_00.ipynb",
        "bob_03_paged_allocator.ipynb",
        "mary_jane_2024_07.ipynb",  # underscores and digits in the name: the last _NN is the lab
        "00_why_kv_cache.ipynb",  # a lab notebook, nobody's
        "dave/03_draft.ipynb",
        "dave/03_final.ipynb",  # a second one for the same lab
        "dave_03.ipynb",  # and a third, in the other layout
    ]:
        write_notebook(sub / name, ["x = 1"])
    # dave handed in lab 03 three times: the final one last (when he wrote it is what counts)
    for age, name in [
        (300, "dave_03.ipynb"),
        (200, "dave/03_draft.ipynb"),
        (100, "dave/03_final.ipynb"),
    ]:
        stamp = time.time() - age
        os.utime(sub / name, (stamp, stamp))
    (sub / "alice" / "readme.txt").write_text("hi")
    (sub / "erin").mkdir()  # handed in nothing
    (sub / ".DS_Store").write_text("")

    found = discover([sub])
    assert [(s.student, s.lab, s.path.relative_to(sub).as_posix()) for s in found.submissions] == [
        ("alice", "00", "alice/00_why_kv_cache.ipynb"),
        ("alice", "03", "alice/03_paged_allocator.ipynb"),
        ("bob", "00", "bob_00.ipynb"),
        ("bob", "03", "bob_03_paged_allocator.ipynb"),
        ("dave", "03", "dave/03_final.ipynb"),
        ("mary_jane_2024", "07", "mary_jane_2024_07.ipynb"),
    ]
    dave = next(s for s in found.submissions if s.student == "dave")
    assert dave.others == (str(sub / "dave" / "03_draft.ipynb"), str(sub / "dave_03.ipynb"))
    assert found.students == ["alice", "bob", "dave", "mary_jane_2024"]
    skipped = {s.path.replace(str(sub) + "/", ""): s.reason for s in found.skipped}
    assert skipped == {
        ".DS_Store": "hidden (the name starts with a dot)",
        "00_why_kv_cache.ipynb": "cannot tell whose notebook it is: name it STUDENT_NN.ipynb "
        "(e.g. alice_03.ipynb) or put it in STUDENT/NN_name.ipynb",
        "alice/.ipynb_checkpoints/": "Jupyter's checkpoints (hidden)",
        "alice/extra/": "a folder in a student's folder (only STUDENT/NN_name.ipynb is graded)",
        "alice/notes.ipynb": "no lab number: name it NN_anything.ipynb "
        "(e.g. 03_paged_allocator.ipynb)",
        "alice/readme.txt": "not a notebook",
        "dave/03_draft.ipynb": f"dave has a newer notebook for lab 03, {sub}/dave/03_final.ipynb, "
        "which is graded (one notebook per student and lab: the newest)",
        "dave_03.ipynb": f"dave has a newer notebook for lab 03, {sub}/dave/03_final.ipynb, "
        "which is graded (one notebook per student and lab: the newest)",
        "erin/": "a student's folder with no NN_name.ipynb in it: nothing graded",
    }
    # a notebook named directly; the same file twice; a path that is not there
    direct = discover([sub / "alice" / "03_paged_allocator.ipynb", sub / "bob_00.ipynb", sub])
    assert len(direct.submissions) == 6
    assert sum(s.reason.startswith("listed twice") for s in direct.skipped) == 2
    with pytest.raises(ClassroomError, match="no such file or folder"):
        discover([tmp_path / "nope"])


# --- shards ------------------------------------------------------------------------------------


def fake_class(students=7, labs=("00", "03", "05")) -> list[Submission]:
    return [
        Submission(f"s{i:02d}", lab, f"s{i:02d}_{lab}.ipynb", f"{i}{lab}" * 8)
        for i in range(students)
        for lab in labs
    ]


def test_every_notebook_is_in_exactly_one_shard_the_same_one_every_time():
    subs = fake_class()
    for n in range(1, 6):
        shards = [select_shard(subs, k, n) for k in range(1, n + 1)]
        keys = [s.key for shard in shards for s in shard]
        assert sorted(keys) == sorted(s.key for s in subs) and len(set(keys)) == len(subs)
        sizes = [len(shard) for shard in shards]
        assert max(sizes) - min(sizes) <= 1  # balanced
        # the input's order does not matter: every machine computes the same slices
        assert [select_shard(subs[::-1], k, n) for k in range(1, n + 1)] == shards
    assert select_shard(subs, 1, 1) == sorted(subs, key=lambda s: s.key)
    assert [s.key for s in select_shard(subs, 2, 4)[:2]] == [("s00", "03"), ("s01", "05")]
    assert select_shard(subs[:2], 5, 5) == []  # more shards than notebooks: some are empty


@pytest.mark.parametrize(
    "text, message",
    [
        ("0/4", "K counts from 1 to N=4.*\\$\\(\\(INDEX \\+ 1\\)\\)/4"),
        ("5/4", "K counts from 1 to N=4"),
        ("1/0", "N, the number of shards, must be at least 1"),
        ("2", "--shard takes K/N"),
        ("a/b", "--shard takes K/N"),
    ],
)
def test_a_bad_shard_is_refused_with_the_fix(text, message):
    with pytest.raises(ClassroomError, match=message):
        parse_shard(text)
    assert parse_shard(" 3 / 4 ") == (3, 4)


# --- the gradebook and the feedback ------------------------------------------------------------


def fake_record(student, lab, exercises, error=None, error_cells=(), notes=(), **more):
    return {
        "student": student,
        "lab": lab,
        "path": f"SUB/{student}/{lab}_x.ipynb",
        "sha256": "ab" * 32,
        "duplicates": [],
        "cell_match": "id",
        "old_version": [],
        "cell_notes": [],
        **more,
        "passed": sum(e["passed"] for e in exercises),
        "total": sum(e["total"] for e in exercises),
        "score": 0.0,
        "exercises": exercises,
        "error_cells": list(error_cells),
        "error": error,
        "notes": list(notes),
        "seconds": 1.0,
    }


def exercise(id_, passed, total, status="failed", report=None, title="a title"):
    return {
        "id": id_,
        "title": title,
        "passed": passed,
        "total": total,
        "status": status,
        "report": report,
    }


REPORT = (
    "03.block_manager · the block manager: 1/2 checks passed\n"
    "✔ allocate\n"
    "✘ free\n"
    "   input:    free(seq 0) twice\n"
    "   hint:     a freed room goes back once: `free_list.append(b)` ```"
)


def test_gradebook_csv_has_one_row_per_exercise_and_a_total_per_lab():
    records = [
        fake_record("bob", "03", [exercise("03.block_manager", 1, 2), exercise("03.beds", 0, 4)]),
        fake_record("alice", "08", []),  # a lab with nothing to grade still has its total row
        fake_record("alice, jr.", "00", [exercise("00.kv_bytes", 5, 5, "passed")]),
    ]
    text = gradebook_csv(records)
    assert text.splitlines()[0] == (
        "student,lab,exercise,points,total,timeout,error,cells,old_version,duplicate,handover"
    )
    assert [row[:5] for row in csv.reader(io.StringIO(text))][1:] == [
        ["alice", "08", "total", "0", "0"],
        ["alice, jr.", "00", "00.kv_bytes", "5", "5"],
        ["alice, jr.", "00", "total", "5", "5"],
        ["bob", "03", "03.block_manager", "1", "2"],
        ["bob", "03", "03.beds", "0", "4"],
        ["bob", "03", "total", "1", "6"],
    ]
    assert '"alice, jr.",00,total,5,5,0,0,id,0,0,0\n' in text  # quoted where needed; labs: 00


def flagged_class():
    timed = {**exercise("06.step", 6, 7, "stopped at limit"), "timed_out": 1}
    handed = {**exercise("03.beds", 0, 4), "handover": True}
    return [
        fake_record("alice", "06", [exercise("06.preempt", 4, 4, "passed"), timed]),
        fake_record("alice", "03", [exercise("03.block_manager", 2, 2, "passed"), handed],
                    cell_match="order", duplicates=["SUB/alice_03.ipynb"]),
        fake_record("bob", "03", [exercise("03.block_manager", 0, 2, "not run"),
                                  exercise("03.beds", 0, 4, "not run")],
                    error="cannot read notebook: JSONDecodeError", cell_match=None),
        fake_record("carol", "06", [exercise("06.preempt", 4, 4, "passed"),
                                    exercise("06.step", 7, 7, "passed")],
                    cell_match="grade_id", old_version=["cells of another version of the lab"]),
    ]  # fmt: skip


def test_the_gradebook_flags_what_an_instructor_looks_at():
    rows = {
        (r[0], r[1], r[2]): r[5:] for r in csv.reader(io.StringIO(gradebook_csv(flagged_class())))
    }
    #                      timeout error cells old_version duplicate handover
    assert rows["alice", "06", "06.step"] == ["1", "0", "id", "0", "0", "0"]
    assert rows["alice", "06", "06.preempt"] == ["0", "0", "id", "0", "0", "0"]
    assert rows["alice", "06", "total"] == ["1", "0", "id", "0", "0", "0"]
    assert rows["alice", "03", "03.beds"] == ["0", "0", "order", "0", "1", "1"]
    assert rows["alice", "03", "total"] == ["0", "0", "order", "0", "1", "1"]
    assert rows["bob", "03", "total"] == ["0", "1", "", "0", "0", "0"]
    assert rows["carol", "06", "total"] == ["0", "0", "grade_id", "1", "0", "0"]


def test_the_wide_gradebook_has_a_row_per_student_and_a_column_per_exercise(tmp_path):
    roster = tmp_path / "roster.csv"
    roster.write_text(
        "Name,Email,Student ID\nalice,a@x.org,1001\ncarol,c@x.org,1003\ndan,d@x.org,1004\n"
    )
    ids = classroom.read_roster(roster)
    assert ids == {"alice": "1001", "carol": "1003", "dan": "1004"}  # "student id" over email
    rows = list(csv.reader(io.StringIO(classroom.gradebook_wide_csv(flagged_class(), ids))))
    assert rows[0] == [
        "student", "id", "03.block_manager", "03.beds", "lab 03",
        "06.preempt", "06.step", "lab 06", "total", "max", "flags",
    ]  # fmt: skip
    assert rows[1:] == [
        ["alice", "1001", "2", "0", "2", "4", "6", "10", "12", "17",
         "03:duplicate 03:handover 03:cells=order 06:timeout"],
        ["bob", "", "0", "0", "0", "", "", "", "0", "17", "not in the roster 03:error"],
        ["carol", "1003", "", "", "", "4", "7", "11", "11", "17", "06:old_version 06:cells=grade_id"],
        ["dan", "1004", "", "", "", "", "", "", "0", "17", ""],  # in the roster, nothing handed in
    ]  # fmt: skip
    no_roster = list(csv.reader(io.StringIO(classroom.gradebook_wide_csv(flagged_class()))))
    assert no_roster[0][:2] == ["student", "03.block_manager"] and len(no_roster) == 4
    (tmp_path / "bad.csv").write_text("just one column\nalice\n")
    with pytest.raises(ClassroomError, match="two columns at least"):
        classroom.read_roster(tmp_path / "bad.csv")


def test_regrading_one_student_replaces_their_rows_only():
    subs = fake_class(students=3, labs=("03", "06"))
    earlier = shard_docs(subs, 1)[0][1]
    newer = [classroom.record(Submission("s01", "03", "s01_03.ipynb", "ff" * 32),
                              {**fake_record("s01", "03", [exercise("03.beds", 4, 4, "passed")])})]  # fmt: skip
    now = class_document(Discovery(subs, []), newer, (1, 1), SETTINGS)
    said = []
    merged = classroom.updated_document(
        earlier, now, ["s01"], {("s02", "06"): "00" * 32}, said.append
    )
    keys = [(r["student"], r["lab"]) for r in merged["notebooks"]]
    assert keys == [("s00", "03"), ("s00", "06"), ("s01", "03"), ("s02", "03"), ("s02", "06")]
    assert next(r for r in merged["notebooks"] if r["student"] == "s01")["passed"] == 4
    assert [r for r in merged["notebooks"] if r["student"] != "s01"] == [
        r for r in earlier["notebooks"] if r["student"] != "s01"
    ]
    assert merged["class"] == {
        "notebooks": 5,
        "students": 3,
        "digest": classroom.class_digest(merged["notebooks"]),
    }
    assert said == ["note: s02's lab 06 changed since it was graded: regrade it with --student s02"]


def test_feedback_shows_the_reports_the_learner_saw(monkeypatch):
    records = [
        fake_record(
            "bob",
            "03",
            [
                exercise("03.block_manager", 1, 2, report=REPORT, title="the | block manager"),
                exercise("03.beds", 0, 4, "not run"),
            ],
            error="CellTimeoutError: a cell timed out",
            error_cells=[4, 9],
            notes=["your notebook's process was started again 1 times"],
        ),
        fake_record("bob", "00", [exercise("00.kv_bytes", 5, 5, "passed")]),
        fake_record("alice", "00", [exercise("00.kv_bytes", 0, 5)]),
    ]
    text = feedback_markdown("bob", records)
    assert text.startswith("# Feedback for bob\n")
    assert "alice" not in text
    assert "| 00 | 00_x.ipynb | 5 | 5 |\n| 03 | 03_x.ipynb | 1 | 6 |" in text  # labs in order
    assert "## Lab 03: 1/6" in text and "Graded `03_x.ipynb` (SHA-256 `abababababab`)." in text
    assert "**The notebook did not run to the end:** CellTimeoutError: a cell timed out" in text
    assert "counting every cell from the top): 5, 10." in text
    assert "| 03.block_manager | the \\| block manager | 1 | 2 | failed |" in text
    assert f"````text\n{REPORT}\n````" in text  # fenced longer than the report's own backticks
    assert "Its check cell did not run (deleted, or the notebook stopped before it)" in text
    assert "00.kv_bytes · a title\n\n5/5 checks passed (no report recorded)." in text
    assert "seconds" not in text and "1.0" not in text  # nothing that varies from run to run
    assert "started again" not in text  # the grader's notes stay in grades.json

    # the hook for hidden inputs sees every report's lines
    def hide_inputs(exercise_id, lines):
        return [line for line in lines if not line.lstrip().startswith("input:")]

    monkeypatch.setattr(classroom, "visible_lines", hide_inputs)
    hidden = feedback_markdown("bob", records)
    assert "free(seq 0) twice" not in hidden and "hint:     a freed room" in hidden


# --- merging -----------------------------------------------------------------------------------


SETTINGS = {"cell_timeout": 300, "notebook_timeout": 1800, "kernel": None}


def shard_docs(subs, n):
    discovery = Discovery(subs, [])
    docs = []
    for k in range(1, n + 1):
        records = [
            classroom.record(s, {**fake_record(s.student, s.lab, []), "path": str(s.path)})
            for s in select_shard(subs, k, n)
        ]
        docs.append(
            (f"shard-{k}/grades.json", class_document(discovery, records, (k, n), SETTINGS))
        )
    return docs


def test_merge_refuses_shards_that_are_not_one_class_graded_alike():
    subs = fake_class(students=4)
    whole = shard_docs(subs, 1)[0][1]
    docs = shard_docs(subs, 3)
    merged = merge_documents(docs)
    assert merged == whole
    assert merge_documents(docs[::-1]) == whole  # in any order

    def refused(docs, message):
        with pytest.raises(ClassroomError, match=message):
            merge_documents(docs)

    refused(docs[:2], r"missing shard 3/3: grade it with --shard 3/3")
    refused([*docs, docs[1]], r"shard 2/3 is given twice: shard-2/grades.json and shard-2/grades")
    refused([*docs, ("whole.json", whole)], r"the shards slice the class differently: N = 1, 3")
    other = shard_docs(fake_class(students=5), 3)
    refused([docs[0], other[1], docs[2]], r"different classes")
    slow = (docs[1][0], {**docs[1][1], "settings": {**SETTINGS, "cell_timeout": 10}})
    refused([docs[0], slow, docs[2]], r"different settings")
    stolen = docs[0][1]["notebooks"][0]
    overlap = (docs[1][0], {**docs[1][1], "notebooks": [*docs[1][1]["notebooks"], stolen]})
    refused([docs[0], overlap, docs[2]], r"s00's lab 00 is in two shards")
    moved = (docs[1][0], {**docs[1][1], "notebooks": docs[1][1]["notebooks"][1:]})
    gained = (
        docs[2][0],
        {**docs[2][1], "notebooks": [*docs[2][1]["notebooks"], docs[1][1]["notebooks"][0]]},
    )
    refused([docs[0], moved, gained], r"belongs to shard 2/3, not to shard-3/grades.json")
    lost = (docs[2][0], {**docs[2][1], "notebooks": docs[2][1]["notebooks"][1:]})
    refused(
        [docs[0], docs[1], lost],
        r"not the class they were sliced from \(11 notebooks, the class has 12\)",
    )


def test_merge_and_usage_mistakes_exit_2_with_a_message(tmp_path, capsys):
    (tmp_path / "junk.json").write_text('{"notebooks": []}')
    write_notebook(tmp_path / "SUB" / "alice_00.ipynb", ["x = 1"])
    cases = [
        (
            ["--merge", str(tmp_path / "junk.json"), "--out", "o"],
            "is not the grades.json of a class",
        ),
        (["--merge", str(tmp_path / "none"), "--out", "o"], "no such grades file"),
        (["--merge", str(tmp_path / "junk.json")], "--merge writes its results into a folder"),
        ([str(tmp_path / "SUB"), "--shard", "2/2"], "--shard writes its results into a folder"),
        ([str(tmp_path / "SUB"), "--shard", "0/2", "--out", "o"], "K counts from 1"),
        ([str(tmp_path / "SUB"), "--jobs", "0", "--out", "o"], "--jobs must be at least 1"),
        ([str(tmp_path / "empty"), "--out", "o"], "no such file or folder"),
    ]
    (tmp_path / "nothing").mkdir()
    cases.append(([str(tmp_path / "nothing"), "--out", "o"], "no submissions to grade in"))
    for argv, message in cases:
        assert kvlab_main(["grade", *argv]) == 2, argv
        assert message in capsys.readouterr().err, argv
    assert not (tmp_path / "o").exists()


# --- one process per notebook ------------------------------------------------------------------


def test_a_grader_that_raises_dies_or_hangs_costs_one_row(tmp_path):
    """No kernel here: a stand-in grader does what each notebook's first cell says."""
    pidfile = tmp_path / "grandchild.pid"
    commands = {
        "alice": "ok 5/5",
        "bob": "raise",
        "carol": "kill",
        "dave": "exit",
        "erin": "hang",
        "frank": f"hang-with-child {pidfile}",
        "gina": "ok 2/5",
        "hana": "mention",
    }
    subs = discover(
        [write_notebook(tmp_path / f"{who}_00.ipynb", [cmd]) for who, cmd in commands.items()]
    ).submissions
    records = grade_submissions(
        subs, jobs=3, notebook_timeout=30, grader=classroom_fakes_grader(), progress=False
    )
    got = {r["student"]: (r["passed"], r["total"], r["error"]) for r in records}
    assert got == {
        "alice": (5, 5, None),
        "bob": (0, 11, "the grader raised RuntimeError: a bug in the grader"),
        "carol": (0, 11, "the grading process ended without a result (killed by SIGKILL)"),
        "dave": (0, 11, "the grading process ended without a result (exit status 3)"),
        "erin": (0, 11, "grading stopped after 30 s (--notebook-timeout)"),
        "frank": (0, 11, "grading stopped after 30 s (--notebook-timeout)"),
        "gina": (2, 5, None),
        "hana": (0, 0, "cannot read hana_00.ipynb"),  # not the private copy's temporary path
    }
    assert [r["student"] for r in records] == list(commands)  # the submissions' order
    failed = next(r for r in records if r["student"] == "bob")
    assert [(e["id"], e["status"]) for e in failed["exercises"]] == [
        ("00.kv_bytes", "not run"),
        ("00.decode_step", "not run"),
    ]
    assert records[0]["exercises"][0]["report"].startswith("00.kv_bytes · KV bytes per token")
    # what a stopped grading started (a kernel, in a session of its own) is gone too
    grandchild = int(pidfile.read_text())
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == "zombie"


def classroom_fakes_grader():
    import classroom_fakes  # in tests/support (conftest puts it on sys.path): the spawned process imports it by name

    return classroom_fakes.by_first_cell


# --- real grading ------------------------------------------------------------------------------
# Synthetic notebooks are numbered 90 and up: no lab of the course has those numbers, so the
# grader runs them as they are (a real lab's number would run the instructor's copy of the lab,
# tens of seconds each) and scores the check cells they have.

IMPORTS = "from kvlab.grading import check"
GOOD = "def kv_bytes_per_token(s):\n    return 2 * s.num_layers * s.num_kv_heads * s.head_dim * s.dtype_bytes"
HALF = "def kv_bytes_per_token(s):\n    return s.num_layers * s.num_kv_heads * s.head_dim * s.dtype_bytes"
CHECK = 'check("00.kv_bytes", kv_bytes_per_token)'


def tiny_class(sub):
    """Three students, both layouts, two labs, different scores; nothing slow."""
    write_notebook(sub / "alice" / "90_kv_bytes.ipynb", [IMPORTS, GOOD, CHECK])
    write_notebook(sub / "alice" / "91_notes.ipynb", ["x = 1"])
    write_notebook(sub / "bob_90.ipynb", [IMPORTS, HALF, CHECK])
    write_notebook(sub / "bob_91_scratch.ipynb", ["1 / 0", "y = 2"])
    write_notebook(sub / "carol" / "90_mine.ipynb", [IMPORTS, GOOD, CHECK])
    (sub / "carol" / "notes.txt").write_text("not graded")


def kvlab(*args, cpu=1200, wrapper=()):
    """``kvlab grade ARGS``, its process tree held to ``cpu`` CPU-seconds (its jobs together)."""
    out = cpu_limit.run(
        [*wrapper, *kvlab_cli(), "grade", *map(str, args)],
        cpu=cpu,
        capture_output=True,
        text=True,
        env=LEARNER_ENV,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def without_timings(doc: dict) -> dict:
    """grades.json less what changes from run to run: seconds, and the grader's notes (its
    temporary folders, how long a process lived)."""
    return {**doc, "notebooks": [{**r, "seconds": None, "notes": None} for r in doc["notebooks"]]}


@pytest.mark.slow
def test_three_shards_in_three_processes_merge_into_the_gradebook_of_one_run(tmp_path):
    sub = tmp_path / "SUB"
    tiny_class(sub)
    started = time.monotonic()
    one = kvlab(sub, "--out", tmp_path / "one", "--jobs", "2")
    one_seconds = time.monotonic() - started
    assert "skipped 1 file:" in one.stdout and "notes.txt: not a notebook" in one.stdout
    assert "graded 5 notebooks of 3 students" in one.stdout

    started = time.monotonic()
    shards = [
        cpu_limit.popen(
            [
                *kvlab_cli(),
                "grade",
                str(sub),
                "--shard",
                f"{k}/3",
                "--out",
                str(tmp_path / f"s{k}"),
            ],
            cpu=600,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=LEARNER_ENV,
        )
        for k in (1, 2, 3)
    ]
    for k, shard in enumerate(shards, 1):
        output, _ = cpu_limit.communicate(shard)
        assert shard.returncode == 0, output
        assert f"shard {k}/3: graded" in output and "kvlab grade --merge" in output
        assert sorted(p.name for p in (tmp_path / f"s{k}").iterdir()) == ["grades.json"]
    shard_seconds = time.monotonic() - started
    merged = kvlab("--merge", *(tmp_path / f"s{k}" for k in (1, 2, 3)), "--out", tmp_path / "all")
    assert "merged 3 shards: 5 notebooks of 3 students" in merged.stdout
    print(f"\none run --jobs 2: {one_seconds:.0f} s; 3 shards side by side: {shard_seconds:.0f} s")

    a, b = tmp_path / "one", tmp_path / "all"
    assert (a / "gradebook.csv").read_bytes() == (b / "gradebook.csv").read_bytes()
    assert (a / "gradebook_wide.csv").read_bytes() == (b / "gradebook_wide.csv").read_bytes()
    feedback = sorted(p.name for p in (a / "feedback").iterdir())
    assert feedback == ["alice.md", "bob.md", "carol.md"]
    for name in feedback:
        assert (a / "feedback" / name).read_bytes() == (b / "feedback" / name).read_bytes()
    one_doc, all_doc = (json.loads((d / "grades.json").read_text()) for d in (a, b))
    assert without_timings(one_doc) == without_timings(all_doc)

    rows = list(csv.reader(io.StringIO((a / "gradebook.csv").read_text())))
    assert all(row[5:] == ["0", "0", "own", "0", "0", "0"] for row in rows[1:])  # no flag
    rows = [row[:5] for row in rows]
    assert rows == [
        ["student", "lab", "exercise", "points", "total"],
        ["alice", "90", "00.kv_bytes", "5", "5"],
        ["alice", "90", "total", "5", "5"],
        ["alice", "91", "total", "0", "0"],
        ["bob", "90", "00.kv_bytes", "0", "5"],
        ["bob", "90", "total", "0", "5"],
        ["bob", "91", "total", "0", "0"],
        ["carol", "90", "00.kv_bytes", "5", "5"],
        ["carol", "90", "total", "5", "5"],
    ]
    by_key = {(r["student"], r["lab"]): r for r in one_doc["notebooks"]}
    assert by_key["bob", "91"]["error_cells"] == [0] and by_key["bob", "91"]["error"] is None
    assert by_key["alice", "90"]["path"] == str(sub / "alice" / "90_kv_bytes.ipynb")
    assert one_doc["skipped"] == [
        {"path": str(sub / "carol" / "notes.txt"), "reason": "not a notebook"}
    ]
    bob = (a / "feedback" / "bob.md").read_text()
    assert "00.kv_bytes · KV bytes per token: 0/5 checks passed" in bob  # the cell's own report
    assert "✘" in bob and "hint:" in bob
    assert "Cells that raised an error (counting every cell from the top): 1." in bob
    # merged again into the first run's folder: the same files, and no stale student's feedback
    (a / "feedback" / "zed.md").write_text("left from an earlier class")
    kvlab("--merge", *(tmp_path / f"s{k}" for k in (1, 2, 3)), "--out", a)
    assert sorted(p.name for p in (a / "feedback").iterdir()) == feedback

    # bob hands in again: regraded alone, merged into the class; nobody else's rows change
    before = (a / "gradebook.csv").read_text().splitlines()
    write_notebook(sub / "bob_90.ipynb", [IMPORTS, GOOD, CHECK])
    roster = tmp_path / "roster.csv"
    roster.write_text("folder,id\nalice,s-1\nbob,s-2\ncarol,s-3\n")
    kvlab(sub, "--out", a, "--student", "bob", "--roster", roster)
    after = (a / "gradebook.csv").read_text().splitlines()
    assert [r for r in after if not r.startswith("bob,")] == [
        r for r in before if not r.startswith("bob,")
    ]
    assert "bob,90,00.kv_bytes,5,5,0,0,own,0,0,0" in after
    wide = list(csv.reader(io.StringIO((a / "gradebook_wide.csv").read_text())))
    assert wide[0] == ["student", "id", "00.kv_bytes", "lab 90", "lab 91", "total", "max", "flags"]
    assert wide[2] == ["bob", "s-2", "5", "5", "0", "5", "5", ""]


# Runs a command as a Linux "child subreaper": whatever the command leaves running is adopted by
# this process instead of init, so it can count what outlived the command.
OUTLIVED = """
import ctypes, subprocess, sys, time, psutil
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
code = subprocess.call(sys.argv[1:])
def left():  # what is still running (a process ending on its own is given 10 s: a busy machine)
    alive = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != "zombie":
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive
time.sleep(2)
for _ in range(80):
    if not left():
        break
    time.sleep(0.1)
left = left()
print("outlived:", [" ".join(p.cmdline())[:80] for p in left], file=sys.stderr)
for p in left:
    p.kill()
sys.exit(code if not left else 99)
"""


@pytest.mark.slow
def test_a_crash_a_hang_and_a_runaway_notebook_cost_their_own_rows(tmp_path):
    sub = tmp_path / "SUB"
    write_notebook(sub / "alice_90.ipynb", [IMPORTS, GOOD, CHECK])
    crash = ["import os, signal", "os.kill(os.getpid(), signal.SIGSEGV)"]
    write_notebook(sub / "bob_90.ipynb", crash + [IMPORTS, HALF, CHECK])
    write_notebook(sub / "carol_90.ipynb", [IMPORTS, GOOD, "while True:\n    pass", CHECK])
    # dave's cells each finish within the cell time-out; the notebook as a whole never ends
    write_notebook(sub / "dave_90.ipynb", [IMPORTS, GOOD] + ["import time; time.sleep(5)"] * 30)
    write_notebook(sub / "erin_90.ipynb", [IMPORTS, HALF, CHECK])
    wrapper = [sys.executable, "-c", OUTLIVED] if sys.platform == "linux" else []
    started = time.monotonic()
    out = kvlab(
        sub, "--out", tmp_path / "out", "--jobs", "2", "--cell-timeout", "10",
        "--notebook-timeout", "30", wrapper=wrapper,
    )  # fmt: skip
    seconds = time.monotonic() - started
    print(f"\n5 notebooks, --jobs 2, a crash, a hang and a runaway: {seconds:.0f} s")
    doc = json.loads((tmp_path / "out" / "grades.json").read_text())
    got = {r["student"]: r for r in doc["notebooks"]}
    assert sorted(got) == ["alice", "bob", "carol", "dave", "erin"]
    # the others are graded as if the bad ones were not there
    assert (got["alice"]["passed"], got["alice"]["total"], got["alice"]["error"]) == (5, 5, None)
    assert (got["erin"]["passed"], got["erin"]["total"], got["erin"]["error"]) == (0, 5, None)
    assert got["erin"]["exercises"][0]["status"] == "failed"
    # the crash and the hang cost at most their own notebook (how much is the grader's call)
    for bad in ("bob", "carol"):
        assert got[bad]["error"] or got[bad]["error_cells"], got[bad]
    assert got["dave"]["error"] == "grading stopped after 30 s (--notebook-timeout)"
    assert got["dave"]["passed"] == 0 and "dave lab 90" in out.stdout
    erin = (tmp_path / "out" / "feedback" / "erin.md").read_text()
    assert "00.kv_bytes · KV bytes per token: 0/5 checks passed" in erin
    assert "outlived: []" in out.stderr or not wrapper  # nothing it started is left running


@pytest.mark.slow
def test_a_class_of_the_real_lab_00_learner_and_solution(tmp_path):
    sub = tmp_path / "SUB"
    (sub / "learner").mkdir(parents=True)
    shutil.copy(ROOT / "labs" / "00_why_kv_cache.ipynb", sub / "learner")
    shutil.copy(ROOT / "solutions" / "00_why_kv_cache.ipynb", sub / "teacher_00.ipynb")
    kvlab(sub, "--out", tmp_path / "out", "--jobs", "2", cpu=1800)
    doc = json.loads((tmp_path / "out" / "grades.json").read_text())
    learner, teacher = doc["notebooks"]
    assert learner["student"] == "learner" and learner["passed"] == 0 < learner["total"]
    assert teacher["passed"] == teacher["total"] == learner["total"]
    assert {e["status"] for e in learner["exercises"]} == {"not implemented"}
    text = (tmp_path / "out" / "feedback" / "teacher.md").read_text()
    for e in teacher["exercises"]:
        assert f"{e['id']} · {e['title']}: {e['total']}/{e['total']} checks passed" in text
    assert "not implemented yet" in (tmp_path / "out" / "feedback" / "learner.md").read_text()


@pytest.mark.parametrize("content", [b"", b'{"cells": [', b"\x00\xff not json", b"[]"])
def test_an_unreadable_notebook_has_every_registered_exercise_at_zero_of_n(tmp_path, content):
    """Corrupt JSON, an empty file: an error, and the lab's exercises at 0/N (never 0/0)."""
    from kvlab.grading.notebook import grade_by_judge, grade_self_reported
    from kvlab.grading.registry import load_lab

    path = tmp_path / "03_broken.ipynb"
    path.write_bytes(content)
    checks = {ex.id: len(ex.checks) for ex in load_lab("03")}
    for grade in (grade_by_judge(path), grade_self_reported(path)):
        assert grade.error.startswith("cannot read notebook: ")
        assert {e.id: (e.passed, e.total) for e in grade.exercises} == {
            i: (0, n) for i, n in checks.items()
        }
        assert grade.total == sum(checks.values()) > 0 and grade.passed == 0


def test_feedback_says_what_was_not_graded_how_cells_were_found_and_what_was_stopped():
    records = flagged_class()
    records[1]["cell_notes"] = ["your notebook has no cell ids (Colab, or nbformat 4.4): …"]
    alice = feedback_markdown("alice", records)
    assert "Also handed in for this lab, not graded (the newest is): `alice_03.ipynb`." in alice
    assert "Note: your notebook has no cell ids (Colab, or nbformat 4.4): …." in alice
    assert "Stopped at their time limit (CPU time, each tried twice): 06.step." in alice
    assert "| 06.step | a title | 6 | 7 | stopped at limit |" in alice
    assert "endless loop" not in alice


@pytest.mark.parametrize("failures, error", [(1, None), (2, "RuntimeError: Kernel didn't respond")])
def test_a_kernel_that_never_answered_is_started_once_more(tmp_path, monkeypatch, failures, error):
    """Self-reported grading with several jobs starts kernels side by side, and one may lose the
    race for a port: a kernel that never answered, before any cell ran, is started once more."""
    import nbclient

    from kvlab.grading import notebook

    path = tmp_path / "ran.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")]), path)
    execute, starts = nbclient.NotebookClient.execute, []

    def lost_race(self, **kwargs):
        starts.append(1)
        if len(starts) <= failures:
            raise RuntimeError("Kernel didn't respond in 60 seconds")
        return execute(self, **kwargs)

    monkeypatch.setattr(nbclient.NotebookClient, "execute", lost_race)
    grade = notebook.grade_self_reported(path)
    assert len(starts) == notebook.KERNEL_STARTS == 2  # a second failure is the notebook's error
    assert grade.error is None if error is None else grade.error.startswith(error)


def test_a_kernel_that_died_in_a_cell_is_not_started_again(tmp_path, monkeypatch):
    """Only a kernel that never answered is retried: one that ran cells keeps its error."""
    import nbclient

    from kvlab.grading import notebook

    path = tmp_path / "died.ipynb"
    cell = nbformat.v4.new_code_cell("import os; os._exit(1)")
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1"), cell]), path)
    execute, starts = nbclient.NotebookClient.execute, []

    def counted(self, **kwargs):
        starts.append(1)
        return execute(self, **kwargs)

    monkeypatch.setattr(nbclient.NotebookClient, "execute", counted)
    grade = notebook.grade_self_reported(path)
    assert len(starts) == 1 and grade.error.startswith("DeadKernelError")
