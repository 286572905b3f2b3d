"""``kvlab grade``: execute a notebook headlessly and score its exercises.

The notebook runs in a fresh ``kvlab`` kernel of this Python (whatever kernel its metadata names),
started exactly as JupyterLab starts a learner's: through :mod:`kvlab.course.jupyter_kernel`, in this
process's environment as the user set it (not the ``TRITON_INTERPRET`` that importing kvlab here
may have added), with ``KVLAB_GRADE_LOG`` pointing at a file where every ``check(...)`` appends
its result. Exercises of the lab whose check never ran (deleted cell, a crash before it) score
zero.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvlab.course.nbformat_quick import nbformat
from kvlab.grading.registry import get_exercise, load_lab
from kvlab.grading.report import Status
from kvlab.grading.runner import GRADE_LOG_VAR
from kvlab.ops.runtime import child_environ

_CHECK_CALL = re.compile(r"""\bcheck\(\s*["'](\d\d\.[\w.]+)["']""")
_LAB_NAME = re.compile(r"^(\d\d)_")


@dataclass
class ExerciseScore:
    id: str
    title: str
    passed: int
    total: int
    status: str
    report: str | None = None  # the text the check cell printed (class feedback files)
    timed_out: int = 0  # checks stopped at their time limit (after their second try)
    handover: bool = False  # a check refused a hand-over to kvlab's own code


@dataclass
class NotebookGrade:
    path: str
    exercises: list[ExerciseScore] = field(default_factory=list)
    error_cells: list[int] = field(default_factory=list)
    error: str | None = None  # the notebook could not be run at all
    seconds: float = 0.0  # wall time of the run, kernel start included
    notes: list[str] = field(default_factory=list)  # what the judge or its sandbox did
    # how its cells were found in the lab (id, grade_id, order; "own": not a lab; None: not
    # read), whether it looks like another version of the lab, and what the learner is told
    cell_match: str | None = None
    old_version: list[str] = field(default_factory=list)
    cell_notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return sum(e.passed for e in self.exercises)

    @property
    def total(self) -> int:
        return sum(e.total for e in self.exercises)

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "passed": self.passed,
            "total": self.total,
            "score": round(self.passed / self.total, 4) if self.total else 0.0,
            "exercises": [
                {k: v for k, v in e.__dict__.items() if k != "report"} for e in self.exercises
            ],
            "error_cells": self.error_cells,
            "error": self.error,
            "notes": self.notes,
            "seconds": round(self.seconds, 1),
            "cell_match": self.cell_match,
            "old_version": self.old_version,
            "cell_notes": self.cell_notes,
        }


def expected_exercises(nb, path: Path) -> list[str]:
    """Every exercise the notebook checks, in the notebook's order, then the lab's registered
    exercises whose check cell is missing (they score zero)."""
    ids: list[str] = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            ids += [i for i in _CHECK_CALL.findall(cell.source) if i not in ids]
    match = _LAB_NAME.match(path.name)
    if match:
        ids += [ex.id for ex in load_lab(match.group(1)) if ex.id not in ids]
    return ids


def _kernel_manager(kernel_name: str | None, spec_dir: Path):
    """A kernel manager for a registered kernelspec, or (``None``) for kvlab's own kernel on this
    Python, written into ``spec_dir``: grading never depends on what is registered."""
    # The async manager, as nbclient expects: with a blocking one its cell timeout and dead-kernel
    # checks never run, and a looping cell hangs the grading.
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    if kernel_name is not None:
        return AsyncKernelManager(kernel_name=kernel_name)
    from kvlab.course.jupyter_kernel import write_kernelspec

    write_kernelspec(spec_dir / "kernels" / "kvlab-grade", python=sys.executable)
    specs = KernelSpecManager(kernel_dirs=[str(spec_dir / "kernels")])
    return AsyncKernelManager(kernel_name="kvlab-grade", kernel_spec_manager=specs)


def grade_notebook(
    path: str | Path,
    cell_timeout: int = 300,
    kernel_name: str | None = None,
    judged: bool | None = None,
):
    """Run one notebook and return its :class:`NotebookGrade` (never raises for learner errors).

    By default the judge scores it (:mod:`kvlab.grading.judge`: the checks run in this process,
    the submission's code in a sandboxed one). ``judged=False``, or a ``kernel_name`` (a
    registered Jupyter kernel), runs it the old way instead: the whole notebook in a kernel,
    scores as its check cells reported them (a submission can forge those: for self-study).
    """
    if judged is None:
        judged = kernel_name is None
    if judged:
        return grade_by_judge(path, cell_timeout)
    return grade_self_reported(path, cell_timeout, kernel_name)


def grade_by_judge(path: str | Path, cell_timeout: int = 300) -> NotebookGrade:
    """The judge's grade of one notebook: a lab of the course runs on the instructor's copy
    (its exercise cells from the submission); any other notebook as it is, its check cells
    judged all the same."""
    from kvlab.grading.judge import judge, lab_for

    path = Path(path)
    grade = NotebookGrade(str(path))
    started = time.monotonic()
    nb = read_or_zero(path, grade)
    if nb is None:
        return grade
    lab_path = lab_for(path)
    lab = nbformat.read(lab_path, as_version=4) if lab_path else nb
    try:
        found = judge(path, cell_timeout, lab_path=lab_path)
    except Exception as e:  # the judge's own failure: say so, score nothing
        grade.error = f"the judge failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
        grade.seconds = time.monotonic() - started
        return grade
    index = {c.get("id"): i for i, c in enumerate(nb.cells)}
    grade.error_cells = sorted(
        set(found.error_origins)
        if found.error_origins or not found.error_cells
        else {index[c] for c in found.error_cells if c in index}
    )
    grade.notes = found.notes
    grade.cell_match = found.cell_match
    grade.old_version = list(found.old_version)
    grade.cell_notes = list(found.cell_notes)
    if found.tampered:  # the sandbox put kvlab's files back: this submission scores nothing
        grade.error = "the submission changed files it must not change (put back): not graded"
        found.results = {}
    for exercise_id in expected_exercises(lab, path):
        result = found.results.get(exercise_id)
        if result is None:
            ex = get_exercise(exercise_id)
            grade.exercises.append(
                ExerciseScore(ex.id, ex.title, 0, len(ex.checks), Status.NOT_RUN.value)
            )
            continue
        grade.exercises.append(
            ExerciseScore(
                result.exercise,
                result.title,
                result.passed,
                result.total,
                result.status.value,
                result.report(),
                result.timed_out,
                result.handover,
            )
        )
    grade.seconds = time.monotonic() - started
    return grade


def read_or_zero(path: Path, grade: NotebookGrade):
    """The notebook, or None when it cannot be read (corrupt JSON, an empty file, not a
    notebook): then ``grade`` has the error and every registered exercise of the file's lab at
    0 of its checks, so the row's total is the lab's (never 0/0) and totals compare."""
    try:
        nb = nbformat.read(path, as_version=4)
        if not isinstance(nb.get("cells"), list):
            raise ValueError("no cells")
        return nb
    except Exception as e:
        text = " ".join(str(e).split())[:200] or "empty or not a notebook"
        grade.error = f"cannot read notebook: {type(e).__name__}: {text}"
    match = _LAB_NAME.match(path.name)
    for ex in load_lab(match.group(1)) if match else []:
        grade.exercises.append(
            ExerciseScore(ex.id, ex.title, 0, len(ex.checks), Status.NOT_RUN.value)
        )
    return None


# Kernels started side by side (a class graded with --jobs) may choose the same port and one never
# answers (jupyter/jupyter_client#487): a kernel that never answered, before any cell ran, is
# started once more, with new ports, rather than cost the notebook its marks
KERNEL_STARTS = 2
_NO_ANSWER = ("didn't respond", "died before replying")


def _never_answered(error: Exception, nb) -> bool:
    ran = any(c.get("execution_count") for c in nb.cells if c.cell_type == "code")
    return isinstance(error, RuntimeError) and not ran and any(m in str(error) for m in _NO_ANSWER)


def grade_self_reported(path: str | Path, cell_timeout: int = 300, kernel_name=None):
    """The whole notebook in a Jupyter kernel, scored by what its check cells logged."""
    from nbclient import NotebookClient

    path = Path(path)
    started = time.monotonic()
    grade = NotebookGrade(str(path))
    nb = read_or_zero(path, grade)
    if nb is None:
        return grade
    ids = expected_exercises(nb, path)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "results.jsonl"
        log.touch()
        env = {**child_environ(), GRADE_LOG_VAR: str(log)}
        for attempt in range(1, KERNEL_STARTS + 1):
            try:
                client = NotebookClient(
                    nb,
                    km=_kernel_manager(kernel_name, Path(tmp)),
                    timeout=cell_timeout,
                    allow_errors=True,
                    # no transport warnings; no history file shared between concurrent gradings
                    extra_arguments=[
                        "--IPKernelApp.log_level=ERROR",
                        "--HistoryManager.hist_file=:memory:",
                    ],
                    resources={"metadata": {"path": str(path.parent.resolve())}},
                )
                client.execute(env=env)
                break
            except Exception as e:  # kernel died, a cell timed out, no such kernel, ...
                if attempt < KERNEL_STARTS and _never_answered(e, nb):
                    continue
                grade.error = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
                break
        results = {}
        for line in log.read_text().splitlines():
            record = json.loads(line)
            results[record["exercise"]] = record  # the last run of a check counts
    grade.error_cells = [
        i
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and any(o.get("output_type") == "error" for o in cell.outputs)
    ]
    for exercise_id in ids:
        if exercise_id in results:
            r = results[exercise_id]
            grade.exercises.append(
                ExerciseScore(
                    exercise_id,
                    r["title"],
                    r["passed"],
                    r["total"],
                    r["status"],
                    r.get("report"),
                    int(r.get("timed_out", 0)),
                    bool(r.get("handover", False)),
                )
            )
        else:
            ex = get_exercise(exercise_id)
            grade.exercises.append(
                ExerciseScore(ex.id, ex.title, 0, len(ex.checks), Status.NOT_RUN.value)
            )
    grade.seconds = time.monotonic() - started
    return grade


def notebooks_in(paths: list[str]) -> list[Path]:
    """Expand folders into the notebooks they hold (checkpoints skipped)."""
    found = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(q for q in p.rglob("*.ipynb") if ".ipynb_checkpoints" not in q.parts)
        else:
            found.append(p)
    return found


def format_grade(grade: NotebookGrade) -> str:
    lines = [grade.path]
    if grade.error:
        lines.append(f"  ! {grade.error}")
    width = max((len(e.id) for e in grade.exercises), default=10)
    for e in grade.exercises:
        lines.append(f"  {e.id:<{width}}  {e.passed:>3}/{e.total:<3} {e.status:<16} {e.title}")
    pct = 100 * grade.passed / grade.total if grade.total else 0
    if not grade.exercises:  # a notebook with no exercise (Lab 08): it ran, nothing to score
        lines.append(f"  no exercises to grade; ran in {grade.seconds:.0f} s")
    else:
        lines.append(
            f"  {'total':<{width}}  {grade.passed:>3}/{grade.total:<3} ({pct:.0f}%)"
            f"  in {grade.seconds:.0f} s"
        )
    if grade.error_cells:
        lines.append(f"  cells that raised: {', '.join(map(str, grade.error_cells))}")
    return "\n".join(lines)


def grade_all(notebooks: list[Path], cell_timeout: int, kernel_name: str | None, jobs: int = 1):
    """Grade notebooks, ``jobs`` at a time (each in its own process and kernel); results keep
    the notebooks' order."""
    if jobs <= 1 or len(notebooks) <= 1:
        return [grade_notebook(p, cell_timeout, kernel_name) for p in notebooks]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")  # no inherited event loops or threads
    with ProcessPoolExecutor(min(jobs, len(notebooks)), mp_context=context) as pool:
        runs = [pool.submit(grade_notebook, p, cell_timeout, kernel_name) for p in notebooks]
        return [run.result() for run in runs]


def main(
    paths: list[str], as_json: bool, cell_timeout: int, kernel_name: str | None, jobs: int = 1
) -> int:
    notebooks = notebooks_in(paths)
    missing = [str(p) for p in notebooks if not p.exists()]
    if missing or not notebooks:
        print(f"kvlab grade: no such notebook: {', '.join(missing) or ' '.join(paths)}")
        return 2
    if jobs < 1:
        print(f"kvlab grade: --jobs must be at least 1, got {jobs}")
        return 2
    grades = grade_all(notebooks, cell_timeout, kernel_name, jobs)
    if as_json:
        print(json.dumps({"notebooks": [g.to_dict() for g in grades]}, indent=2))
    else:
        print("\n\n".join(format_grade(g) for g in grades))
    return 0
