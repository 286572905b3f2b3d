"""Single-source labs: learner notebooks are generated from the solution notebooks.

Solution code sits between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` (nbgrader's markers,
so instructors can also use nbgrader). A lab keeps everything else, replaces each region with a
``# YOUR CODE HERE`` stub, drops outputs and widget state, and tags exercise cells
``raises-exception`` so "Run All" goes on past unsolved exercises.

Every lab cell also carries nbgrader's cell metadata (schema version 3), derived here and never
written by hand: an exercise cell is a solution cell, a check cell an autograded test cell worth
one point per check of the exercise (from kvlab's registry), every other cell is read-only. The
``grade_id`` is the cell's id, which labgen never changes. ``export_nbgrader`` writes the same
notebooks with their solutions kept, as nbgrader's source notebooks, for ``nbgrader
generate_assignment``; solutions/ itself stays free of derived metadata.
"""

from __future__ import annotations

import ast
import copy
import re
from collections.abc import Callable
from pathlib import Path

from kvlab.core import files
from kvlab.course.nbformat_quick import nbformat

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
CODE_STUB = ("# YOUR CODE HERE", "raise NotImplementedError")
MARKDOWN_STUB = ("YOUR ANSWER HERE",)
RAISES_TAG = "raises-exception"
# where labgen reads and writes: a checkout's folders (readers of the labs use kvlab.core.files)
ROOT = files.PACKAGE_DIR.parent
SOLUTIONS_DIR, LABS_DIR = ROOT / "solutions", ROOT / "labs"
# Cell metadata that says something about a run, not about the content.
_RUN_METADATA = ("collapsed", "scrolled", "execution", "widgets", "jupyter")
_NOTEBOOK_METADATA = ("kernelspec", "language_info", "kvlab")

NBGRADER_SCHEMA_VERSION = 3  # nbgrader 0.6 to 0.9's cell metadata schema (nbgraderformat/v3.json)
# nbformat 4.5's cell id; nbgrader's grade_id allows the same characters (^[a-zA-Z0-9_\-]*$)
CELL_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
# a check cell: ``check("03.block_manager", BlockManager)`` on a line that is not a comment
_CHECK_CALL = re.compile(r"^[^#]*?(?<![\w.])check\(\s*[\"'](\d\d\.\w+)[\"']", re.MULTILINE)
# a written (markdown) answer has no checks in the registry: nbgrader grades it by hand
MANUAL_POINTS = 1


def strip_solution(source: str, cell_type: str = "code", where: str = "cell") -> tuple[str, bool]:
    """Replace every solution region of one cell's source. Returns (new source, had a region)."""
    out: list[str] = []
    inside = False
    found = False
    stub = CODE_STUB if cell_type == "code" else MARKDOWN_STUB
    for number, line in enumerate(source.split("\n"), start=1):
        marker = line.strip()
        if marker == BEGIN:
            if inside:
                raise ValueError(f"{where}, line {number}: {BEGIN} inside another solution region")
            inside = found = True
            indent = line[: len(line) - len(line.lstrip())]
            out.extend(indent + s for s in stub)
        elif marker == END:
            if not inside:
                raise ValueError(f"{where}, line {number}: {END} without a {BEGIN}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{where}: {BEGIN} is never closed by {END}")
    return "\n".join(out), found


def clean_cell(cell) -> None:
    """Drop outputs, execution counts and run-time metadata in place."""
    if cell.cell_type == "code":
        cell.outputs = []
        cell.execution_count = None
    for key in _RUN_METADATA:
        cell.metadata.pop(key, None)


def checked_exercises(cell) -> list[str]:
    """The exercise ids a code cell passes to ``check(...)`` (none for other cells)."""
    if cell.cell_type != "code":
        return []
    return _CHECK_CALL.findall(cell.source)


def registry_points(exercise_id: str) -> int:
    """An exercise's points: its number of checks in kvlab's registry."""
    from kvlab.grading.registry import get_exercise

    return len(get_exercise(exercise_id).checks)


def cell_ids(nb: nbformat.NotebookNode, name: str = "notebook") -> list[str]:
    """The notebook's cell ids; an error unless every cell has a valid one, used once."""
    ids, seen = [], set()
    for index, cell in enumerate(nb.cells):
        cell_id = cell.get("id")
        if not isinstance(cell_id, str) or not CELL_ID.match(cell_id):
            raise ValueError(f"{name}, cell {index}: cell id {cell_id!r} is missing or invalid")
        if cell_id in seen:
            raise ValueError(f"{name}, cell {index}: cell id {cell_id!r} is used twice")
        seen.add(cell_id)
        ids.append(cell_id)
    return ids


def nbgrader_metadata(
    cell, had_region: bool, points: Callable[[str], int] = registry_points, where: str = "cell"
) -> dict:
    """nbgrader's cell metadata for one cell, shaped as nbgrader's own "Create Assignment" tool
    writes it: a solution, autograded tests, a manually graded answer, or read-only."""
    meta = {
        "grade": False,
        "grade_id": cell.id,
        "locked": True,
        "schema_version": NBGRADER_SCHEMA_VERSION,
        "solution": False,
        "task": False,
    }
    exercises = checked_exercises(cell)
    if had_region and exercises:
        raise ValueError(f"{where}: a check cell must not hold a solution region")
    if had_region:  # the learner writes here
        meta.update(locked=False, solution=True)
        if cell.cell_type == "markdown":  # nbgrader: a written answer is graded by hand
            meta.update(grade=True, points=MANUAL_POINTS)
    elif exercises:  # nbgrader runs it and scores its output
        total = 0
        for exercise_id in exercises:
            try:
                total += points(exercise_id)
            except KeyError as e:
                raise ValueError(f"{where}: {e.args[0]}") from None
        meta.update(grade=True, points=total)
    return meta


def _prepare(
    solution: nbformat.NotebookNode,
    name: str,
    points: Callable[[str], int] | None,
    keep_solutions: bool,
) -> nbformat.NotebookNode:
    nb = copy.deepcopy(solution)
    nb.metadata = {k: v for k, v in nb.metadata.items() if k in _NOTEBOOK_METADATA}
    cell_ids(nb, name)
    for index, cell in enumerate(nb.cells):
        where = f"{name}, cell {index} ({cell.id})"
        clean_cell(cell)
        if "attachments" in cell and not cell.attachments:
            del cell["attachments"]
        source, had_region = strip_solution(cell.source, cell.cell_type, where=where)
        if not keep_solutions:
            cell.source = source
        if had_region and cell.cell_type == "code":
            tags = cell.metadata.setdefault("tags", [])
            if RAISES_TAG not in tags:
                tags.append(RAISES_TAG)
        cell.metadata["nbgrader"] = nbgrader_metadata(
            cell, had_region, points or registry_points, where
        )
    return nb


def make_lab(
    solution: nbformat.NotebookNode,
    name: str = "notebook",
    points: Callable[[str], int] | None = None,
) -> nbformat.NotebookNode:
    """The learner's version of a solution notebook. ``points(exercise_id)`` gives a check
    cell's nbgrader points (default: the exercise's number of checks in kvlab's registry)."""
    return _prepare(solution, name, points, keep_solutions=False)


# nbgrader scores a test cell by its output: an error is 0, a number is partial credit, anything
# else full marks. check() prints its report and never raises, so the nbgrader source ends each
# check cell with the number of checks passed.
NBGRADER_SCORE = ".passed  # nbgrader's points: the checks passed"


def nbgrader_source(
    solution: nbformat.NotebookNode,
    name: str = "notebook",
    points: Callable[[str], int] | None = None,
) -> nbformat.NotebookNode:
    """nbgrader's source notebook: the lab's cells and metadata with the solutions kept, and
    each check cell's last value the number of its checks passed (nbgrader's partial credit)."""
    nb = _prepare(solution, name, points, keep_solutions=True)
    for index, cell in enumerate(nb.cells):
        for line in cell.source.split("\n"):
            if ("BEGIN SOLUTION" in line or "END SOLUTION" in line) and line.strip() not in (
                BEGIN,
                END,
            ):  # nbgrader takes any line containing the words for a marker
                raise ValueError(
                    f"{name}, cell {index} ({cell.id}): nbgrader reads {line!r} as a marker"
                )
        if checked_exercises(cell):
            cell.source = _score_last_check(cell.source, f"{name}, cell {index} ({cell.id})")
    return nb


def _score_last_check(source: str, where: str) -> str:
    try:
        last = ast.parse(source).body[-1]
    except (SyntaxError, IndexError):
        last = None
    call = last.value if isinstance(last, ast.Expr) else None
    if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "check"):
        raise ValueError(f"{where}: for nbgrader, a check cell must end with its check(...) call")
    if len(_CHECK_CALL.findall(source)) != 1:
        raise ValueError(f"{where}: for nbgrader, a check cell checks one exercise")
    lines = source.split("\n")
    row = last.end_lineno - 1
    head, rest = lines[row][: last.end_col_offset], lines[row][last.end_col_offset :]
    if rest.strip() and not rest.strip().startswith("#"):  # e.g. a `;` that hides the value
        raise ValueError(f"{where}: for nbgrader, nothing may follow the check(...) call")
    lines[row] = head + (".passed" + rest if rest.strip() else NBGRADER_SCORE)
    return "\n".join(lines)


def render(nb: nbformat.NotebookNode) -> str:
    """The exact text a notebook is written as (stable, so staleness checks compare bytes)."""
    return nbformat.writes(nb) + "\n"


def expected_labs(solutions_dir: Path = SOLUTIONS_DIR) -> dict[str, str]:
    """Lab file name -> the text ``make labs`` writes for it."""
    labs = {}
    for path in sorted(Path(solutions_dir).glob("[0-9][0-9]_*.ipynb")):
        solution = nbformat.read(path, as_version=4)
        labs[path.name] = render(make_lab(solution, name=path.name))
    return labs


def write_labs(solutions_dir: Path = SOLUTIONS_DIR, labs_dir: Path = LABS_DIR) -> list[Path]:
    """Write every lab; remove labs whose solution is gone. Returns the files written."""
    labs_dir = Path(labs_dir)
    labs_dir.mkdir(parents=True, exist_ok=True)
    wanted = expected_labs(solutions_dir)
    for stale in labs_dir.glob("[0-9][0-9]_*.ipynb"):
        if stale.name not in wanted:
            stale.unlink()
    written = []
    for name, text in wanted.items():
        path = labs_dir / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


# nbgrader's settings for kvlab's notebooks: its stubs become labs/'s, and cells get kvlab grade's
# time limit (nbgrader's own is 30 s)
_CODE_STUB_TEXT, _MARKDOWN_STUB_TEXT = "\n".join(CODE_STUB), "\n".join(MARKDOWN_STUB)
NBGRADER_CONFIG = f"""\
# Written by `kvlab labs --nbgrader`; kvlab never overwrites this file.
c = get_config()  # noqa: F821
c.ClearSolutions.code_stub = {{"python": {_CODE_STUB_TEXT!r}}}
c.ClearSolutions.text_stub = {_MARKDOWN_STUB_TEXT!r}
c.Execute.timeout = 300
"""


def export_nbgrader(course_dir: Path, solutions_dir: Path = SOLUTIONS_DIR) -> list[Path]:
    """Write an nbgrader course: ``source/<lab>/<lab>.ipynb`` for every lab, and an
    ``nbgrader_config.py`` unless there is one. Returns the files written."""
    course_dir = Path(course_dir)
    written = []
    config = course_dir / "nbgrader_config.py"
    if not config.exists():
        course_dir.mkdir(parents=True, exist_ok=True)
        config.write_text(NBGRADER_CONFIG, encoding="utf-8")
        written.append(config)
    for path in sorted(Path(solutions_dir).glob("[0-9][0-9]_*.ipynb")):
        solution = nbformat.read(path, as_version=4)
        target = course_dir / "source" / path.stem / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(render(nbgrader_source(solution, name=path.name)), encoding="utf-8")
        written.append(target)
    return written


def stale_labs(solutions_dir: Path = SOLUTIONS_DIR, labs_dir: Path = LABS_DIR) -> list[str]:
    """Problems that `make labs` would fix: missing, outdated or orphaned lab files."""
    labs_dir = Path(labs_dir)
    wanted = expected_labs(solutions_dir)
    problems = []
    for name, text in wanted.items():
        path = labs_dir / name
        if not path.exists():
            problems.append(f"labs/{name} is missing")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"labs/{name} differs from its solution")
    for path in sorted(labs_dir.glob("[0-9][0-9]_*.ipynb")):
        if path.name not in wanted:
            problems.append(f"labs/{path.name} has no solution notebook")
    return problems


def dirty_notebooks(paths) -> list[str]:
    """Notebooks committed with outputs, execution counts or widget state."""
    problems = []
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        if "widgets" in nb.metadata:
            problems.append(f"{path}: widget state in the notebook metadata")
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None):
                problems.append(f"{path}: cell {index} carries outputs or an execution count")
    return problems
