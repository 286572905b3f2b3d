"""``kvlab grade``: execute a notebook headlessly and score its exercises.

The notebook runs in a fresh kernel of this Python (whatever kernel its metadata names), with
``KVLAB_GRADE_LOG`` pointing at a file where every ``check(...)`` appends its result. Exercises of
the lab whose check never ran (deleted cell, a crash before it) score zero.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from kvlab.grading.core import GRADE_LOG_VAR, get_exercise, load_lab

_CHECK_CALL = re.compile(r"""\bcheck\(\s*["'](\d\d\.[\w.]+)["']""")
_LAB_NAME = re.compile(r"^(\d\d)_")


@dataclass
class ExerciseScore:
    id: str
    title: str
    passed: int
    total: int
    status: str


@dataclass
class NotebookGrade:
    path: str
    exercises: list[ExerciseScore] = field(default_factory=list)
    error_cells: list[int] = field(default_factory=list)
    error: str | None = None  # the notebook could not be run at all

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
            "exercises": [e.__dict__ for e in self.exercises],
            "error_cells": self.error_cells,
            "error": self.error,
        }


def expected_exercises(nb, path: Path) -> list[str]:
    """The lab's registered exercises, plus any other exercise the notebook checks."""
    ids: list[str] = []
    match = _LAB_NAME.match(path.name)
    if match:
        ids += [ex.id for ex in load_lab(match.group(1))]
    for cell in nb.cells:
        if cell.cell_type == "code":
            ids += [i for i in _CHECK_CALL.findall(cell.source) if i not in ids]
    return ids


def grade_notebook(path: str | Path, cell_timeout: int = 300, kernel_name: str = "python3"):
    """Run one notebook and return its :class:`NotebookGrade` (never raises for learner errors)."""
    from nbclient import NotebookClient

    path = Path(path)
    grade = NotebookGrade(str(path))
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as e:
        grade.error = f"cannot read notebook: {type(e).__name__}: {e}"
        return grade
    ids = expected_exercises(nb, path)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "results.jsonl"
        log.touch()
        saved = os.environ.get(GRADE_LOG_VAR)
        os.environ[GRADE_LOG_VAR] = str(log)
        try:
            client = NotebookClient(
                nb,
                timeout=cell_timeout,
                kernel_name=kernel_name,
                allow_errors=True,
                extra_arguments=["--IPKernelApp.log_level=ERROR"],  # no transport warnings
                resources={"metadata": {"path": str(path.parent.resolve())}},
            )
            client.execute()
        except Exception as e:  # kernel died, a cell timed out, ...
            grade.error = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
        finally:
            if saved is None:
                os.environ.pop(GRADE_LOG_VAR, None)
            else:
                os.environ[GRADE_LOG_VAR] = saved
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
                ExerciseScore(exercise_id, r["title"], r["passed"], r["total"], r["status"])
            )
        else:
            ex = get_exercise(exercise_id)
            grade.exercises.append(ExerciseScore(ex.id, ex.title, 0, len(ex.checks), "not run"))
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
    lines.append(f"  {'total':<{width}}  {grade.passed:>3}/{grade.total:<3} ({pct:.0f}%)")
    if grade.error_cells:
        lines.append(f"  cells that raised: {', '.join(map(str, grade.error_cells))}")
    return "\n".join(lines)


def main(paths: list[str], as_json: bool, cell_timeout: int, kernel_name: str) -> int:
    notebooks = notebooks_in(paths)
    missing = [str(p) for p in notebooks if not p.exists()]
    if missing or not notebooks:
        print(f"kvlab grade: no such notebook: {', '.join(missing) or ' '.join(paths)}")
        return 2
    grades = [grade_notebook(p, cell_timeout, kernel_name) for p in notebooks]
    if as_json:
        print(json.dumps({"notebooks": [g.to_dict() for g in grades]}, indent=2))
    else:
        print("\n\n".join(format_grade(g) for g in grades))
    return 0
