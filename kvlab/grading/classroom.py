"""Grading a whole class: ``kvlab grade SUBMISSIONS --out DIR [--jobs N] [--shard K/N]`` and
``kvlab grade --merge SHARD ... --out DIR``.

A class is a folder holding one folder per student (``SUBMISSIONS/alice/03_paged_allocator.ipynb``)
or notebooks named for the student and the lab (``SUBMISSIONS/alice_03.ipynb``,
``alice_03_paged_allocator.ipynb``), or both. Every file that is not graded is listed with the
reason, and one notebook per student and lab is graded.

Each notebook is graded by :func:`kvlab.grading.notebook.grade_notebook` in a process started for
it alone, from a private copy in a folder of its own (named ``NN_submission.ipynb``, so that the
grader knows its lab whatever the learner named the file). A notebook that crashes, hangs, runs
past ``--notebook-timeout`` or takes its grading process down with it costs its own row only:
that row says what happened and the rest of the class is graded as if it were not there.

Out come ``gradebook.csv`` (one row per exercise and one ``total`` row per lab), ``grades.json``
(what ``kvlab grade --json`` says of each notebook, with student, lab, the file's SHA-256 and each
check's report) and ``feedback/<student>.md`` (per lab: the score table and the reports the
learner's check cells print). Nothing that depends on timing or on the machine goes into the
gradebook or the feedback, so the same submissions give the same bytes on every run.

``--shard K/N`` grades one of N slices of the class: sorted by (student, lab), notebook i (from 0)
belongs to shard ``i % N + 1``. A shard writes only its ``grades.json``; ``--merge`` checks that the
shards are the N slices of one class graded alike, and writes the gradebook, JSON and feedback a
single run would have written.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from kvlab.grading.process_tree import how_it_ended, kill_tree

FORMAT = "kvlab-class-grades/1"
TOTAL_ROW = "total"  # the exercise column of a lab's total row in gradebook.csv
FLAG_COLUMNS = ["timeout", "error", "cells", "old_version", "duplicate", "handover"]
CSV_COLUMNS = ["student", "lab", "exercise", "points", "total", *FLAG_COLUMNS]
WIDE_CSV = "gradebook_wide.csv"
DEFAULT_NOTEBOOK_TIMEOUT = 1800  # seconds for one notebook's whole grading, kernel start included
_LAB_FILE = re.compile(r"^(\d\d)_")  # a lab's number as `kvlab grade` reads it: 03_anything.ipynb
_STUDENT_FILE = re.compile(r"^(?P<student>.+?)_(?P<lab>\d\d)(?:_.*)?\.ipynb$")  # alice_03[_x].ipynb
_SHARD = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


class ClassroomError(Exception):
    """A mistake in what ``kvlab grade`` was asked to do (exit status 2), said in words."""


# --- the class ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Submission:
    student: str
    lab: str  # two digits, as in the notebook's name
    path: Path
    sha256: str
    mtime: float = 0.0  # when the file was last written: of two for one lab, the newer is graded
    others: tuple[str, ...] = ()  # the student's other files for this lab, not graded

    @property
    def key(self) -> tuple[str, str]:
        return (self.student, self.lab)


@dataclass(frozen=True)
class Skipped:
    path: str
    reason: str


@dataclass
class Discovery:
    submissions: list[Submission] = field(default_factory=list)  # sorted by (student, lab)
    skipped: list[Skipped] = field(default_factory=list)  # sorted by path

    @property
    def students(self) -> list[str]:
        return sorted({s.student for s in self.submissions})


_NOTHING_IN_FOLDER = "a student's folder with no NN_name.ipynb in it: nothing graded"
_NAME_IT = "name it STUDENT_NN.ipynb (e.g. alice_03.ipynb) or put it in STUDENT/NN_name.ipynb"


def discover(paths: Iterable[str | Path], exclude: Iterable[str | Path] = ()) -> Discovery:
    """The submissions in class folders (and notebooks named directly), and every file skipped.

    A class folder holds student folders (``alice/03_paged_allocator.ipynb``: the lab is the
    name's leading two digits, as for ``kvlab grade NOTEBOOK``) and notebooks named
    ``alice_03.ipynb`` or ``alice_03_anything.ipynb``. Hidden files and folders, files that are not
    notebooks, folders inside a student's folder and notebooks whose name says no lab are skipped;
    so is every notebook but the newest (the last written; then the first by path) for the same
    student and lab (the graded one lists them in ``others``), and the folders in ``exclude``
    (``--out``, when it lies inside the class).
    """
    found: list[Submission] = []
    skipped: list[Skipped] = []
    excluded = {Path(p).resolve() for p in exclude}
    for p in map(Path, paths):
        if p.is_dir():
            _scan_class(p, found, skipped, excluded)
        elif p.is_file():
            if p.suffix != ".ipynb":
                skipped.append(Skipped(str(p), "not a notebook"))
            elif match := _LAB_FILE.match(p.name):  # a notebook of a student's folder
                _add(found, skipped, p.resolve().parent.name, match[1], p)
            elif match := _STUDENT_FILE.match(p.name):
                _add(found, skipped, match["student"], match["lab"], p)
            else:
                skipped.append(Skipped(str(p), f"cannot tell whose notebook it is: {_NAME_IT}"))
        else:
            raise ClassroomError(f"no such file or folder: {p}")
    students = {s.student for s in found}
    skipped = [  # a student's empty folder matters only when they handed in nothing else
        s for s in skipped if s.reason != _NOTHING_IN_FOLDER or Path(s.path).name not in students
    ]
    graded: dict[tuple[str, str], Submission] = {}
    # the newest first (by when the file was written, then by path), so it is the one graded
    for s in sorted(found, key=lambda s: (s.key, -s.mtime, str(s.path))):
        first = graded.get(s.key)
        if first is None:
            graded[s.key] = s
        elif first.path.resolve() == s.path.resolve():
            skipped.append(Skipped(str(s.path), f"listed twice (as {first.path})"))
        else:
            reason = (
                f"{s.student} has a newer notebook for lab {s.lab}, {first.path}, which is "
                "graded (one notebook per student and lab: the newest)"
            )
            skipped.append(Skipped(str(s.path), reason))
            graded[s.key] = replace(first, others=(*first.others, str(s.path)))
    return Discovery(
        sorted(graded.values(), key=lambda s: s.key), sorted(skipped, key=lambda s: s.path)
    )


def _scan_class(root: Path, found: list[Submission], skipped: list[Skipped], excluded) -> None:
    for entry in sorted(root.iterdir()):
        if entry.resolve() in excluded:
            skipped.append(Skipped(_shown(entry), "the folder the grades are written to (--out)"))
        elif entry.name.startswith("."):
            skipped.append(Skipped(_shown(entry), _hidden(entry)))
        elif entry.is_dir():
            _scan_student(entry, found, skipped)
        elif entry.suffix != ".ipynb":
            skipped.append(Skipped(str(entry), "not a notebook"))
        elif match := _STUDENT_FILE.match(entry.name):
            _add(found, skipped, match["student"], match["lab"], entry)
        else:
            skipped.append(Skipped(str(entry), f"cannot tell whose notebook it is: {_NAME_IT}"))


def _scan_student(folder: Path, found: list[Submission], skipped: list[Skipped]) -> None:
    before = len(found)
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            skipped.append(Skipped(_shown(entry), _hidden(entry)))
        elif entry.is_dir():
            reason = "a folder in a student's folder (only STUDENT/NN_name.ipynb is graded)"
            skipped.append(Skipped(_shown(entry), reason))
        elif entry.suffix != ".ipynb":
            skipped.append(Skipped(str(entry), "not a notebook"))
        elif match := _LAB_FILE.match(entry.name):
            _add(found, skipped, folder.name, match[1], entry)
        else:
            reason = "no lab number: name it NN_anything.ipynb (e.g. 03_paged_allocator.ipynb)"
            skipped.append(Skipped(str(entry), reason))
    if len(found) == before:
        skipped.append(Skipped(_shown(folder), _NOTHING_IN_FOLDER))


def _add(found, skipped, student: str, lab: str, path: Path) -> None:
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        mtime = path.stat().st_mtime
    except OSError as e:
        skipped.append(Skipped(str(path), f"cannot be read: {e.strerror or e}"))
        return
    found.append(Submission(student, lab, path, digest, mtime))


def _shown(path: Path) -> str:
    return f"{path}/" if path.is_dir() else str(path)


def _hidden(path: Path) -> str:
    if path.name == ".ipynb_checkpoints":
        return "Jupyter's checkpoints (hidden)"
    return "hidden (the name starts with a dot)"


def class_digest(submissions: Iterable[Submission | dict]) -> str:
    """SHA-256 of the class as (student, lab, the notebook's SHA-256) lines, sorted: the same for
    every shard of one class, whatever folder each machine mounts it at."""
    rows = sorted(
        (s["student"], s["lab"], s["sha256"])
        if isinstance(s, dict)
        else (s.student, s.lab, s.sha256)
        for s in submissions
    )
    h = hashlib.sha256()
    for row in rows:
        h.update(("\t".join(row) + "\n").encode())
    return h.hexdigest()


# --- shards ------------------------------------------------------------------------------------


def parse_shard(text: str | None) -> tuple[int, int]:
    """``"K/N"`` → ``(K, N)``, with 1 ≤ K ≤ N, or a :class:`ClassroomError` that says how."""
    match = _SHARD.fullmatch(text or "")
    if not match:
        raise ClassroomError(
            f"--shard takes K/N, the K-th of N slices counted from 1 (e.g. 2/4), got {text!r}"
        )
    k, n = int(match[1]), int(match[2])
    if n < 1:
        raise ClassroomError(f"--shard {text}: N, the number of shards, must be at least 1")
    if not 1 <= k <= n:
        raise ClassroomError(
            f"--shard {text}: K counts from 1 to N={n}. For an index that counts from 0 "
            "(a Kubernetes JOB_COMPLETION_INDEX, a Slurm --array=0-...), pass "
            f"$((INDEX + 1))/{n}"
        )
    return k, n


def shard_of(index: int, n: int) -> int:
    """The shard (1..N) of the class's ``index``-th notebook (from 0) in (student, lab) order."""
    return index % n + 1


def select_shard(submissions: list[Submission], k: int, n: int) -> list[Submission]:
    """The K-th of N slices: every notebook is in exactly one, the same one on every machine."""
    ordered = sorted(submissions, key=lambda s: s.key)
    return [s for i, s in enumerate(ordered) if shard_of(i, n) == k]


# --- grading, one process per notebook ----------------------------------------------------------


@dataclass
class _Run:
    index: int
    submission: Submission
    process: object
    conn: object
    stage: Path
    started: float
    deadline: float


def grade_submissions(
    submissions: list[Submission],
    *,
    cell_timeout: int = 300,
    kernel_name: str | None = None,
    jobs: int = 1,
    notebook_timeout: float = DEFAULT_NOTEBOOK_TIMEOUT,
    progress: bool | None = None,
    grader: Callable | None = None,
) -> list[dict]:
    """Grade every submission, ``jobs`` at a time, each in a fresh process of its own; the
    records (see :func:`record`) keep the submissions' order.

    Whatever happens to one (its kernel dies, a cell times out, the grading process is killed or
    raises, or the whole grading outlasts ``notebook_timeout``) becomes that submission's record
    with an ``error``; the others never notice. ``progress``: a bar with the ETA on stderr (None:
    only on a terminal). ``grader`` stands in for ``grade_notebook`` (tests); it must be
    importable by name, as the spawned process imports it.
    """
    from multiprocessing.connection import wait

    from tqdm import tqdm

    if jobs < 1:
        raise ClassroomError(f"--jobs must be at least 1, got {jobs}")
    context = _context(grader is None)
    queue = deque(enumerate(submissions))
    running: dict[int, _Run] = {}
    records: list[dict | None] = [None] * len(submissions)
    # no terminal (a batch job's log): a line per notebook instead of the bar
    lines = progress is None and not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty())
    bar = tqdm(
        total=len(submissions),
        unit="notebook",
        file=sys.stderr,
        disable=(None if progress is None else not progress),
        smoothing=0,  # ETA from the mean so far: labs take from seconds to a minute each
        dynamic_ncols=True,
    )

    def finished(index: int, record: dict) -> None:
        records[index] = record
        bar.set_postfix_str(f"{record['student']} {record['lab']}", False)
        bar.update(1)
        if lines:
            _log_line(sum(r is not None for r in records), len(submissions), record)

    try:
        while queue or running:
            while queue and len(running) < jobs:
                index, submission = queue.popleft()
                run = _start(context, index, submission, grader, cell_timeout, kernel_name)
                if isinstance(run, dict):  # could not even be staged
                    finished(index, run)
                    continue
                run.deadline = run.started + notebook_timeout
                running[index] = run
            if not running:
                continue
            waiting = min(r.deadline for r in running.values()) - time.monotonic()
            handles = [h for r in running.values() for h in (r.conn, r.process.sentinel)]
            wait(handles, timeout=max(0.0, waiting))
            for index, run in list(running.items()):
                done = _poll(run, notebook_timeout)
                if done is not None:
                    del running[index]
                    _clean(run)
                    finished(index, done)
    finally:
        for run in running.values():  # interrupted: no grading process or kernel outlives us
            kill_tree(run.process, timeout=5)
            _clean(run)
        bar.close()
    return records


def _log_line(n: int, total: int, r: dict) -> None:
    note = " (did not run to the end)" if r["error"] else ""
    print(
        f"kvlab grade: [{n}/{total}] {r['student']} lab {r['lab']}: "
        f"{r['passed']}/{r['total']} in {r['seconds']:.0f} s{note}",
        file=sys.stderr,
        flush=True,
    )


# What every grading process needs, imported once by the fork server (torch among them, about
# a second a process otherwise); the submission's own code never runs in these processes.
PRELOAD = ["kvlab.grading.notebook", "kvlab.grading.judge", "kvlab.grading.runner"]


def _context(preload: bool):
    """Fresh processes for the graders: forked from a server that has imported kvlab's grading
    (and torch) once where the platform has one, else spawned. Neither inherits this process's
    threads or event loops."""
    import multiprocessing

    if preload and "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        labs = [f"kvlab.grading.lab{n:02d}" for n in range(8)]
        context.set_forkserver_preload(PRELOAD + labs)
        return context
    return multiprocessing.get_context("spawn")


def _start(context, index, submission, grader, cell_timeout, kernel_name) -> _Run | dict:
    started = time.monotonic()
    stage = Path(tempfile.mkdtemp(prefix="kvlab-grade-"))
    try:
        (stage / "tmp").mkdir()
        (stage / "notebook").mkdir()
        staged = stage / "notebook" / f"{submission.lab}_submission.ipynb"
        data = submission.path.read_bytes()
        staged.write_bytes(data)
    except OSError as e:
        shutil.rmtree(stage, ignore_errors=True)
        return failed_record(submission, f"cannot copy the notebook: {e.strerror or e}", 0.0)
    if hashlib.sha256(data).hexdigest() != submission.sha256:
        shutil.rmtree(stage, ignore_errors=True)
        error = "the notebook changed while the class was being graded: grade it again"
        return failed_record(submission, error, 0.0)
    receive, send = context.Pipe(duplex=False)
    args = (send, grader, str(staged), cell_timeout, kernel_name, str(stage / "tmp"))
    process = context.Process(target=_worker, args=args)
    process.start()
    send.close()  # the child's end: EOF here once the child is gone
    return _Run(index, submission, process, receive, stage, started, 0.0)


def _worker(conn, grader, staged: str, cell_timeout, kernel_name, tmp: str) -> None:
    """In the spawned process: grade one staged notebook and send back its grade as a dict."""
    if hasattr(os, "setsid"):
        os.setsid()  # a group of its own: a time-out kills it with whatever it started
    tempfile.tempdir = tmp  # the grader's temporary files go where the parent cleans up
    try:
        if grader is None:
            from kvlab.grading.notebook import grade_notebook as grader
        grade = grader(staged, cell_timeout=cell_timeout, kernel_name=kernel_name)
        conn.send(("graded", grade_dict(grade)))
    except BaseException as e:  # a bug in the grader: this notebook's row, not the class
        conn.send(("raised", f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"))
    finally:
        conn.close()


def _poll(run: _Run, notebook_timeout: float) -> dict | None:
    """The record of a finished run, or None while it is still running."""
    elapsed = time.monotonic() - run.started
    if run.conn.poll():
        try:
            kind, payload = run.conn.recv()
        except (EOFError, OSError):
            return _died(run, elapsed)
        run.process.join(10)
        if run.process.is_alive():  # sent its grade, then did not exit: no matter
            kill_tree(run.process, timeout=5)
        payload = _unstaged(payload, run)
        if kind == "graded":
            return record(run.submission, payload)
        return failed_record(run.submission, f"the grader raised {payload}", elapsed)
    if not run.process.is_alive():
        return _died(run, elapsed)
    if time.monotonic() >= run.deadline:
        kill_tree(run.process, timeout=5)
        error = f"grading stopped after {notebook_timeout:g} s (--notebook-timeout)"
        return failed_record(run.submission, error, elapsed)
    return None


def _unstaged(payload, run: _Run):
    """``payload`` with the private copy's paths said as the submission's name: what a grade
    says must not change with the temporary folder it was graded in."""
    text = json.dumps(payload)
    staged = run.stage / "notebook" / f"{run.submission.lab}_submission.ipynb"
    for path, shown in [(staged, run.submission.path.name), (run.stage, "<grading folder>")]:
        text = text.replace(json.dumps(str(path))[1:-1], json.dumps(shown)[1:-1])
    return json.loads(text)


def _died(run: _Run, elapsed: float) -> dict:
    run.process.join(5)
    how = how_it_ended(run.process.exitcode)
    error = f"the grading process ended without a result ({how})"
    return failed_record(run.submission, error, elapsed)


def _clean(run: _Run) -> None:
    run.conn.close()
    shutil.rmtree(run.stage, ignore_errors=True)


def grade_dict(grade) -> dict:
    """A :class:`NotebookGrade` as ``kvlab grade --json`` writes it, with each exercise's
    ``report`` (None where the grade has none)."""
    d = grade.to_dict()
    d["exercises"] = [
        {**e, "report": e.get("report", getattr(score, "report", None))}
        for e, score in zip(d["exercises"], grade.exercises, strict=False)
    ]
    return d


def record(submission: Submission, grade: dict) -> dict:
    """A notebook's entry in grades.json: who, which lab and file, then its grade."""
    head = {
        "student": submission.student,
        "lab": submission.lab,
        "path": str(submission.path),
        "sha256": submission.sha256,
        "duplicates": list(submission.others),
    }
    return {**head, **{k: v for k, v in grade.items() if k not in head}}


def failed_record(submission: Submission, error: str, seconds: float) -> dict:
    """The record of a notebook whose grading gave no grade: its lab's exercises at zero."""
    exercises = [
        {
            "id": ex.id,
            "title": ex.title,
            "passed": 0,
            "total": len(ex.checks),
            "status": "not run",
            "report": None,
            "timed_out": 0,
            "handover": False,
        }
        for ex in _lab_exercises(submission.lab)
    ]
    grade = {
        "passed": 0,
        "total": sum(e["total"] for e in exercises),
        "score": 0.0,
        "exercises": exercises,
        "error_cells": [],
        "error": error,
        "notes": [],
        "seconds": round(seconds, 1),
        "cell_match": None,
        "old_version": [],
        "cell_notes": [],
    }
    return record(submission, grade)


def _lab_exercises(lab: str) -> list:
    from kvlab.grading.registry import load_lab

    try:
        return load_lab(lab)
    except Exception:
        return []


# --- what comes out ----------------------------------------------------------------------------


def class_document(
    discovery: Discovery,
    records: list[dict],
    shard: tuple[int, int],
    settings: dict,
) -> dict:
    """grades.json: the class it was sliced from, how it was graded, what was skipped, and one
    record per notebook of this shard in (student, lab) order."""
    from kvlab._version import __version__

    return {
        "format": FORMAT,
        "kvlab": __version__,
        "shard": f"{shard[0]}/{shard[1]}",
        "class": {
            "notebooks": len(discovery.submissions),
            "students": len(discovery.students),
            "digest": class_digest(discovery.submissions),
        },
        "settings": settings,
        "skipped": [{"path": s.path, "reason": s.reason} for s in discovery.skipped],
        "notebooks": sorted(records, key=lambda r: (r["student"], r["lab"])),
    }


def exercise_flags(r: dict, e: dict | None) -> list:
    """The flag columns of a gradebook row (``e`` None: the lab's total row, which carries its
    exercises' flags): checks stopped at their limit, the notebook did not run to the end (or
    could not be read), how its cells were found (id, grade_id, order; ``own`` for a notebook
    that is not a lab), another version of the lab, other files for this lab, a hand-over to
    kvlab's own code refused. 1 or 0, but ``cells``."""
    exercises = r["exercises"] if e is None else [e]
    return [
        sum(int(x.get("timed_out") or 0) for x in exercises),
        int(bool(r.get("error"))),
        r.get("cell_match") or "",
        int(bool(r.get("old_version"))),
        int(bool(r.get("duplicates"))),
        int(any(x.get("handover") for x in exercises)),
    ]


def gradebook_rows(records: list[dict]) -> list[list]:
    """One row per exercise (the notebook's order), then the lab's ``total`` row."""
    rows = []
    for r in sorted(records, key=lambda r: (r["student"], r["lab"])):
        for e in r["exercises"]:
            row = [r["student"], r["lab"], e["id"], e["passed"], e["total"]]
            rows.append(row + exercise_flags(r, e))
        total = [r["student"], r["lab"], TOTAL_ROW, r["passed"], r["total"]]
        rows.append(total + exercise_flags(r, None))
    return rows


def gradebook_csv(records: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    writer.writerows(gradebook_rows(records))
    return out.getvalue()


# --- the wide gradebook an LMS imports ---------------------------------------------------------

_ROSTER_FOLDER = ("folder", "student", "login", "username", "user", "name")
_ROSTER_ID = ("id", "student_id", "student id", "sis_id", "sis id", "sis user id", "email")


def read_roster(path: str | Path) -> dict[str, str]:
    """A roster CSV: folder name (the student as ``kvlab grade`` names them) -> the student's
    id in the LMS. The header names the columns (``folder`` or ``student``, and ``id``,
    ``student_id``, ``sis_id`` or ``email``); without those names, the first two columns."""
    path = Path(path)
    try:
        rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8-sig"))))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ClassroomError(f"cannot read the roster {path}: {e}") from None
    rows = [r for r in rows if any(c.strip() for c in r)]
    if len(rows) < 2 or len(rows[0]) < 2:
        raise ClassroomError(
            f"the roster {path} needs a header and a row per student, two columns at least: "
            "folder,id"
        )
    header = [c.strip().lower() for c in rows[0]]
    folder = next((header.index(n) for n in _ROSTER_FOLDER if n in header), 0)
    ident = next(
        (header.index(n) for n in _ROSTER_ID if n in header and header.index(n) != folder), None
    )
    ident = ident if ident is not None else (1 if folder == 0 else 0)
    roster: dict[str, str] = {}
    for line, row in enumerate(rows[1:], 2):
        if len(row) <= max(folder, ident):
            raise ClassroomError(
                f"the roster {path}, line {line}: fewer than {max(folder, ident) + 1} columns"
            )
        name, sid = row[folder].strip(), row[ident].strip()
        if name in roster and roster[name] != sid:
            raise ClassroomError(f"the roster {path} gives {name} two ids: {roster[name]}, {sid}")
        roster[name] = sid
    return roster


def wide_columns(records: list[dict]) -> list[tuple[str, list[str]]]:
    """(lab, its exercise ids) for every lab in the class, in order; an exercise in any record
    of the lab is a column, in the order the records have them."""
    labs: dict[str, list[str]] = {}
    for r in sorted(records, key=lambda r: (r["lab"], r["student"])):
        ids = labs.setdefault(r["lab"], [])
        ids += [e["id"] for e in r["exercises"] if e["id"] not in ids]
    return sorted(labs.items())


def gradebook_wide_csv(records: list[dict], roster: dict[str, str] | None = None) -> str:
    """One row per student, a column per exercise and per lab (``lab NN``: its points), then
    ``total``, ``max`` (every lab's checks, the same for everyone, so totals compare) and
    ``flags`` (lab:flag for each flag raised). A lab not handed in is blank and counts 0. With a
    ``roster``, an ``id`` column follows ``student``; a student of the roster who handed in
    nothing has a row of blanks, one who is not in the roster is kept, flagged."""
    columns = wide_columns(records)
    maxima: dict[str, int] = {}
    for r in records:
        maxima[r["lab"]] = max(maxima.get(r["lab"], 0), r["total"])
    by_student: dict[str, dict[str, dict]] = {}
    for r in records:
        by_student.setdefault(r["student"], {})[r["lab"]] = r
    students = sorted(set(by_student) | set(roster or {}))
    header = ["student", *(["id"] if roster is not None else [])]
    for lab, ids in columns:
        header += [*ids, f"lab {lab}"]
    header += ["total", "max", "flags"]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for student in students:
        labs = by_student.get(student, {})
        row: list = [student]
        flags = []
        if roster is not None:
            row.append(roster.get(student, ""))
            if student not in roster:
                flags.append("not in the roster")
        for lab, ids in columns:
            r = labs.get(lab)
            points = {e["id"]: e["passed"] for e in r["exercises"]} if r else {}
            row += [points.get(i, "" if r is None else 0) for i in ids]
            row.append("" if r is None else r["passed"])
            if r is not None:
                flags += [f"{lab}:{name}" for name in _raised(r)]
        row += [sum(r["passed"] for r in labs.values()), sum(maxima.values()), " ".join(flags)]
        writer.writerow(row)
    return out.getvalue()


def _raised(r: dict) -> list[str]:
    """The names of a record's flags that are raised (``cells`` when not found by id)."""
    values = dict(zip(FLAG_COLUMNS, exercise_flags(r, None), strict=True))
    names = [k for k, v in values.items() if k != "cells" and v]
    if values["cells"] not in ("", "id", "own"):
        names.append(f"cells={values['cells']}")
    return names


def visible_lines(exercise_id: str, lines: list[str]) -> list[str]:
    """The lines of a check's report that its learner may read in the feedback file.

    The hook for hidden inputs: no check keeps an input from the learner today (a report shows
    what the check cell in the notebook prints), so every line is kept. A lab that adds hidden
    test cases drops or rewrites their ``input:`` / ``expected:`` lines here.
    """
    return lines


_NOT_RUN = "its check cell did not run (deleted, or the notebook stopped before it): no points"


def feedback_markdown(student: str, records: list[dict]) -> str:
    """A student's feedback: a table of their labs, then per lab its exercises and the reports
    their check cells print (through :func:`visible_lines`). A record's ``notes`` (what the
    judge and its sandbox did, with temporary paths and timings that change from run to run)
    stay in grades.json: the feedback holds only what is the same on every run."""
    records = sorted((r for r in records if r["student"] == student), key=lambda r: r["lab"])
    lines = [f"# Feedback for {student}", ""]
    lines += ["| lab | notebook | points | total |", "|---|---|---:|---:|"]
    for r in records:
        lines.append(
            f"| {r['lab']} | {_cell(Path(r['path']).name)} | {r['passed']} | {r['total']} |"
        )
    for r in records:
        name = Path(r["path"]).name
        lines += ["", f"## Lab {r['lab']}: {r['passed']}/{r['total']}", ""]
        lines.append(f"Graded `{name}` (SHA-256 `{r['sha256'][:12]}`).")
        if r.get("duplicates"):
            others = ", ".join(f"`{Path(d).name}`" for d in r["duplicates"])
            lines += ["", f"Also handed in for this lab, not graded (the newest is): {others}."]
        for note in r.get("cell_notes") or []:
            lines += ["", f"Note: {_cell(note)}."]
        stopped = [e for e in r["exercises"] if e.get("timed_out")]
        if stopped:
            names = ", ".join(e["id"] for e in stopped)
            lines += [
                "",
                f"Stopped at their time limit (CPU time, each tried twice): {names}. "
                "See the reports below.",
            ]
        if r["error"]:
            lines += ["", f"**The notebook did not run to the end:** {_cell(r['error'])}"]
        if r["error_cells"]:
            cells = ", ".join(str(i + 1) for i in r["error_cells"])
            lines += [
                "",
                f"Cells that raised an error (counting every cell from the top): {cells}.",
            ]
        if not r["exercises"]:
            lines += ["", "No exercise to grade in this lab."]
            continue
        lines += ["", "| exercise | title | points | total | status |", "|---|---|---:|---:|---|"]
        for e in r["exercises"]:
            lines.append(
                f"| {e['id']} | {_cell(e['title'])} | {e['passed']} | {e['total']} | {e['status']} |"
            )
        for e in r["exercises"]:
            lines += ["", f"### {e['id']} · {e['title']}", ""]
            report = e.get("report")
            if report:
                text = "\n".join(visible_lines(e["id"], report.splitlines()))
                fence = "`" * max(3, _longest_backticks(text) + 1)
                lines += [f"{fence}text", text, fence]
            elif e["status"] == "not run":
                lines.append(_NOT_RUN.capitalize() + ".")
            else:
                lines.append(f"{e['passed']}/{e['total']} checks passed (no report recorded).")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """Text safe in a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _longest_backticks(text: str) -> int:
    return max((len(m) for m in re.findall(r"`+", text)), default=0)


def write_outputs(out: Path, doc: dict, *, full: bool, roster: dict | None = None) -> list[Path]:
    """grades.json, and for a whole class (``full``) gradebook.csv, gradebook_wide.csv (with
    the ``roster``'s ids, when given) and feedback/<student>.md (feedback files of students no
    longer in the class are removed)."""
    out.mkdir(parents=True, exist_ok=True)
    written = [_write(out / "grades.json", json.dumps(doc, indent=2, ensure_ascii=False) + "\n")]
    if not full:
        return written
    records = doc["notebooks"]
    written.append(_write(out / "gradebook.csv", gradebook_csv(records)))
    written.append(_write(out / WIDE_CSV, gradebook_wide_csv(records, roster)))
    feedback = out / "feedback"
    feedback.mkdir(exist_ok=True)
    students = sorted({r["student"] for r in records})
    for student in students:
        written.append(_write(feedback / f"{student}.md", feedback_markdown(student, records)))
    for stale in feedback.glob("*.md"):
        if stale.stem not in students:
            stale.unlink()
    return written


def _write(path: Path, text: str) -> Path:
    """Written whole or not at all: a pod killed mid-write leaves no half file to merge."""
    part = path.with_name(path.name + ".part")
    part.write_text(text, encoding="utf-8")
    os.replace(part, path)
    return path


# --- merging shards ----------------------------------------------------------------------------


def load_grades(path: str | Path) -> dict:
    """A shard's grades.json (or the folder holding it)."""
    path = Path(path)
    if path.is_dir():
        path = path / "grades.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ClassroomError(f"no such grades file: {path}") from None
    except (OSError, ValueError) as e:
        raise ClassroomError(f"cannot read {path}: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ClassroomError(
            f"{path} is not the grades.json of a class (written by `kvlab grade ... --out DIR`)"
        )
    return doc


def merge_documents(docs: list[tuple[str, dict]]) -> dict:
    """One class's grades.json from its shards' ``(name, doc)``; a :class:`ClassroomError` when
    they are not exactly the N slices of one class, graded by the same kvlab the same way."""
    if not docs:
        raise ClassroomError("--merge needs the grades.json of every shard")
    first_name, first = docs[0]
    for name, doc in docs[1:]:
        for key, what in [
            ("kvlab", "kvlab versions"),
            ("class", "classes (different notebooks)"),
            ("settings", "settings"),
        ]:
            if doc.get(key) != first.get(key):
                raise ClassroomError(
                    f"{name} and {first_name} were graded with different {what}: "
                    f"{doc.get(key)} vs {first.get(key)}"
                )
    slices = [(name, *parse_shard(doc.get("shard"))) for name, doc in docs]
    counts = sorted({n for _, _, n in slices})
    if len(counts) > 1:
        raise ClassroomError(
            f"the shards slice the class differently: N = {', '.join(map(str, counts))}"
        )
    (n,) = counts
    shards: dict[int, str] = {}
    for name, k, _ in slices:
        if k in shards:
            raise ClassroomError(f"shard {k}/{n} is given twice: {shards[k]} and {name}")
        shards[k] = name
    missing = [k for k in range(1, n + 1) if k not in shards]
    if missing:
        listed = ", ".join(f"{k}/{n}" for k in missing)
        raise ClassroomError(f"missing shard {listed}: grade it with --shard {missing[0]}/{n}")
    seen: dict[tuple[str, str], str] = {}
    merged: list[dict] = []
    for name, doc in docs:
        for r in doc["notebooks"]:
            key = (r["student"], r["lab"])
            if key in seen:
                raise ClassroomError(
                    f"{r['student']}'s lab {r['lab']} is in two shards: {seen[key]} and {name}"
                )
            seen[key] = name
            merged.append(r)
    if class_digest(merged) != first["class"]["digest"]:
        raise ClassroomError(
            "the shards' notebooks are not the class they were sliced from "
            f"({len(merged)} notebooks, the class has {first['class']['notebooks']})"
        )
    merged.sort(key=lambda r: (r["student"], r["lab"]))
    for i, r in enumerate(merged):
        k = shard_of(i, n)
        name = seen[(r["student"], r["lab"])]
        if shards[k] != name:
            raise ClassroomError(
                f"{r['student']}'s lab {r['lab']} belongs to shard {k}/{n}, not to {name}"
            )
    return {**first, "shard": "1/1", "notebooks": merged}


# --- the command -------------------------------------------------------------------------------


def main(
    paths: list[str],
    *,
    out: str | Path | None,
    jobs: int = 1,
    shard: str | None = None,
    merge: bool = False,
    cell_timeout: int = 300,
    notebook_timeout: float = DEFAULT_NOTEBOOK_TIMEOUT,
    kernel_name: str | None = None,
    as_json: bool = False,
    progress: bool | None = None,
    roster: str | Path | None = None,
    students: list[str] | None = None,
) -> int:
    """``kvlab grade`` for a class (``--out``, ``--shard``, ``--merge``, ``--student``): 0 when
    every notebook has its row (those that could not be graded included), 2 for a usage
    mistake. ``roster``: a CSV of folder name -> student id for gradebook_wide.csv;
    ``students``: grade only these and merge them into the class already in ``out``."""
    say = _printer(sys.stderr if as_json else sys.stdout)
    try:
        if out is None:
            flag = (
                "--merge" if merge else "--shard" if shard else "--student" if students else "--out"
            )
            raise ClassroomError(f"{flag} writes its results into a folder: add --out DIR")
        out = Path(out)
        ids = read_roster(roster) if roster else None
        if students and (merge or shard):
            raise ClassroomError(
                "--student regrades into a whole class's folder: drop --merge/--shard"
            )
        if merge:
            if shard:
                raise ClassroomError("--merge combines shards already graded: drop --shard")
            docs = [(str(p), load_grades(p)) for p in paths]
            doc = merge_documents(docs)
            written = write_outputs(out, doc, full=True, roster=ids)
            if as_json:
                print(json.dumps(doc, indent=2, ensure_ascii=False))
            say(f"merged {_plural(len(docs), 'shard')}: {_counts(doc)}")
            say(_wrote(written))
            return 0
        k, n = parse_shard(shard) if shard else (1, 1)
        if jobs < 1:
            raise ClassroomError(f"--jobs must be at least 1, got {jobs}")
        discovery = discover(paths, exclude=[out])
        if not discovery.submissions:
            for s in discovery.skipped:
                say(f"  skipped {s.path}: {s.reason}")
            raise ClassroomError(f"no submissions to grade in {' '.join(map(str, paths))}")
        if discovery.skipped:
            say(f"skipped {_plural(len(discovery.skipped), 'file')}:")
            for s in discovery.skipped:
                say(f"  {s.path}: {s.reason}")
        mine = select_shard(discovery.submissions, k, n)
        settings = {
            "cell_timeout": cell_timeout,
            "notebook_timeout": notebook_timeout,
            "kernel": kernel_name,
        }
        earlier = None
        if students:
            earlier = _class_to_update(out, settings)
            unknown = sorted(set(students) - set(discovery.students))
            if unknown:
                raise ClassroomError(
                    f"no submissions of {', '.join(unknown)} in {' '.join(map(str, paths))}"
                )
            mine = [s for s in mine if s.student in students]
        started = time.monotonic()
        with _stop_on_sigterm():
            records = grade_submissions(
                mine,
                cell_timeout=cell_timeout,
                kernel_name=kernel_name,
                jobs=jobs,
                notebook_timeout=notebook_timeout,
                progress=progress,
            )
        seconds = time.monotonic() - started
        doc = class_document(discovery, records, (k, n), settings)
        if earlier is not None:
            current = {s.key: s.sha256 for s in discovery.submissions}
            doc = updated_document(earlier, doc, students, current, say)
        written = write_outputs(out, doc, full=n == 1, roster=ids)
    except ClassroomError as e:
        print(f"kvlab grade: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        how = "stopped by SIGTERM" if isinstance(e, _Terminated) else "interrupted"
        print(f"kvlab grade: {how}; nothing written", file=sys.stderr)
        return 143 if isinstance(e, _Terminated) else 130
    if as_json:
        print(json.dumps(doc, indent=2, ensure_ascii=False))
    where = f"shard {k}/{n}: " if n > 1 else ""
    say(
        f"{where}graded {_plural(len(records), 'notebook')} of "
        f"{_plural(len({r['student'] for r in records}), 'student')} in {seconds:.0f} s "
        f"(--jobs {jobs}); class: {_counts(doc)}"
    )
    for r in doc["notebooks"]:
        if r["error"]:
            say(f"  {r['student']} lab {r['lab']} ({r['path']}): {r['error']}")
    say(_wrote(written))
    if n > 1:
        say(f"when all {n} shards are done: kvlab grade --merge SHARD_DIR ... --out DIR")
    return 0


def _class_to_update(out: Path, settings: dict) -> dict | None:
    """The class already graded in ``out`` that ``--student`` merges into (None: there is none
    yet, and the students graded now are the class)."""
    if not (out / "grades.json").exists():
        return None
    doc = load_grades(out)
    if doc.get("shard") != "1/1":
        raise ClassroomError(
            f"{out} holds shard {doc.get('shard')}: --student merges into a whole class "
            "(merge the shards first)"
        )
    from kvlab._version import __version__

    if doc.get("kvlab") != __version__ or doc.get("settings") != settings:
        raise ClassroomError(
            f"{out} was graded with kvlab {doc.get('kvlab')} and settings {doc.get('settings')}, "
            f"not {__version__} and {settings}: regrade the whole class"
        )
    return doc


def updated_document(
    earlier: dict, now: dict, students: list[str], current: dict | None = None, say=None
) -> dict:
    """The class of ``earlier`` with every record of ``students`` replaced by ``now``'s (the
    students regraded), and what was skipped for them updated; the class's digest and counts
    are of the records it then holds, so shards and merges still check out. ``current``:
    (student, lab) -> the SHA-256 found now, to say which other notebooks changed since."""
    keep = [r for r in earlier["notebooks"] if r["student"] not in students]
    mine = [r for r in now["notebooks"] if r["student"] in students]
    records = sorted(keep + mine, key=lambda r: (r["student"], r["lab"]))
    for r in keep:
        sha = (current or {}).get((r["student"], r["lab"]))
        if say is not None and sha is not None and sha != r["sha256"]:
            say(
                f"note: {r['student']}'s lab {r['lab']} changed since it was graded: "
                f"regrade it with --student {r['student']}"
            )

    def theirs(skipped: dict) -> bool:
        path = Path(skipped["path"].rstrip("/"))
        return any(
            path.name == s or s in path.parent.parts or path.name.startswith(f"{s}_")
            for s in students
        )

    skipped = [x for x in earlier.get("skipped", []) if not theirs(x)]
    skipped += [x for x in now.get("skipped", []) if theirs(x)]
    doc = {**earlier, "notebooks": records, "skipped": sorted(skipped, key=lambda x: x["path"])}
    doc["class"] = {
        "notebooks": len(records),
        "students": len({r["student"] for r in records}),
        "digest": class_digest(records),
    }
    return doc


class _Terminated(KeyboardInterrupt):
    """SIGTERM, unwinding as Ctrl-C does."""


@contextlib.contextmanager
def _stop_on_sigterm():
    """A batch system's stop (SIGTERM: scancel, a pod deleted) unwinds like Ctrl-C does, so that
    no grading process or kernel is left running."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _printer(stream):
    def say(text: str) -> None:
        print(text, file=stream, flush=True)

    return say


def _counts(doc: dict) -> str:
    stopped = sum(1 for r in doc["notebooks"] if r["error"])
    text = f"{_plural(doc['class']['notebooks'], 'notebook')} of "
    text += f"{_plural(doc['class']['students'], 'student')}"
    if stopped:
        text += f"; {stopped} did not run to the end (see grades.json)"
    return text


def _wrote(written: list[Path]) -> str:
    files = [p for p in written if p.parent.name != "feedback"]
    feedback = len(written) - len(files)
    text = "wrote " + ", ".join(map(str, files))
    if feedback:
        text += f", {files[0].parent / 'feedback'}/ ({_plural(feedback, 'student')})"
    return text


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"
