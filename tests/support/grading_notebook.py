"""A lab's solution cells graded as a learner's: the code of a cell run as a notebook runs it (from
a file outside kvlab, so the checks see it as the learner's), the edits ("old => new") that make
one learner's version of it, and what the report says (failures, hints, folding, the neutral note).
"""

import json
import pathlib
import tempfile

from kvlab.grading.report import NO_DIAGNOSIS, SAME_PROBLEM


def cell_sources(notebook: pathlib.Path) -> dict[str, str]:
    """A notebook's cells' sources by cell id."""
    cells = json.loads(notebook.read_text())["cells"]
    return {c["id"]: "".join(c["source"]) for c in cells}


def edited(source: str, *edits: str) -> str:
    """``source`` with its solution markers removed and ``edits`` ("old => new") made, each at the
    one place where ``old`` stands."""
    source = "".join(line for line in source.splitlines(True) if "### " not in line)
    for edit in edits:
        old, new = edit.split(" => ")
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return source


def run_cell(source: str, name: str):
    """``name`` from ``source`` run as a notebook cell would run it: from a file outside kvlab, so
    the checks see it as the learner's code."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="kvlab-learner-")) / "cell.py"
    path.write_text(source)
    namespace = {}
    exec(compile(source, str(path), "exec"), namespace)
    return namespace[name]


def failures(result):
    return [o for o in result.outcomes if not o.passed]


def hints(outcome) -> list[str]:
    return [d for d in outcome.details if d.startswith("hint:")]


def folded(result) -> bool:
    """Every failure after the first says it is probably the same problem as the first."""
    first, *later = failures(result)
    return all(o.details[0] == f"{SAME_PROBLEM} (“{first.name}”)" for o in later)


def neutral(outcome) -> bool:
    return any(d.startswith(f"note:     {NO_DIAGNOSIS}") for d in outcome.details)
