"""Single-source labs: learner notebooks are generated from the solution notebooks.

Solution code sits between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` (nbgrader's markers,
so instructors can also use nbgrader). A lab keeps everything else, replaces each region with a
``# YOUR CODE HERE`` stub, drops outputs and widget state, and tags exercise cells
``raises-exception`` so "Run All" goes on past unsolved exercises.
"""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
CODE_STUB = ("# YOUR CODE HERE", "raise NotImplementedError")
MARKDOWN_STUB = ("YOUR ANSWER HERE",)
RAISES_TAG = "raises-exception"
ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS_DIR, LABS_DIR = ROOT / "solutions", ROOT / "labs"
# Cell metadata that says something about a run, not about the content.
_RUN_METADATA = ("collapsed", "scrolled", "execution", "widgets", "jupyter")
_NOTEBOOK_METADATA = ("kernelspec", "language_info", "kvlab")


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


def make_lab(solution: nbformat.NotebookNode, name: str = "notebook") -> nbformat.NotebookNode:
    """The learner's version of a solution notebook."""
    lab = copy.deepcopy(solution)
    lab.metadata = {k: v for k, v in lab.metadata.items() if k in _NOTEBOOK_METADATA}
    for index, cell in enumerate(lab.cells):
        clean_cell(cell)
        if "attachments" in cell and not cell.attachments:
            del cell["attachments"]
        source, had_region = strip_solution(
            cell.source, cell.cell_type, where=f"{name}, cell {index} ({cell.get('id', '?')})"
        )
        cell.source = source
        if had_region and cell.cell_type == "code":
            tags = cell.metadata.setdefault("tags", [])
            if RAISES_TAG not in tags:
                tags.append(RAISES_TAG)
    return lab


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
