"""Which cells of a submission are which cells of the lab, as students hand notebooks in.

A notebook saved by JupyterLab keeps the lab's cell ids; one that went through nbgrader keeps
``metadata.nbgrader.grade_id``; one saved by Colab or an old Jupyter (nbformat 4.4) has neither.
So a lab's cell is found in the submission by its **id**, else by its **grade_id**, else by the
lab's **order and content**: the given and check cells, which students leave as they are, are
found by their text (in order), and each exercise cell is the submission's cell between the same
neighbours that defines the names the exercise's stub defines. Which way was needed is said
(:attr:`Matched.how`), and goes on the gradebook's row.

Cells the student added (helpers, experiments) are kept, in their place after the lab cell
before them, so a helper defined there is there when the exercise calls it, as in the student's
own kernel. Added cells that call ``check(...)`` (the lab's check cells are the judge's), that
only hold shell commands and magics (``!pip install``: no network in the sandbox), or that carry
a lab cell id this version of the lab does not have (another version's given cells) are left
out, and :attr:`Matched.notes` says so.

A submission whose given cells mostly differ from the lab's, or that holds cells with the lab's
kind of ids that this version of the lab does not have, was started from another version of the
lab: it is graded all the same, on this version's given and check cells, and flagged
(:attr:`Matched.old_version`).
"""

from __future__ import annotations

import ast
import difflib
import re
from dataclasses import dataclass, field

from kvlab.grading.labgen import RAISES_TAG

CHECK_CALL = re.compile(r"""^\s*check\(\s*["']\d\d\.[\w.]+["']\s*,\s*[A-Za-z_]\w*\s*\)\s*;?\s*$""")
LAB_CELL_ID = re.compile(r"^lab\d\d-")  # the ids kvlab's labs give their cells (lab03-07)
SIMILAR = 0.8  # a given cell edited this little is still that given cell
OLD_VERSION_SHARE = 0.25  # this share of the given cells differing: another version of the lab
HOW_ORDER = ("id", "grade_id", "order")  # the gradebook says the last one any cell needed


@dataclass
class Added:
    """A cell the student added: its source, its index in the submission, and whether it runs."""

    source: str
    index: int
    after: (
        int | None
    )  # index (in the lab's code cells) of the lab cell it follows; None: before all
    runs: bool = True


@dataclass
class Matched:
    """The submission's cells as the lab's. ``exercise``: lab code-cell index -> the student's
    source; ``where``: lab code-cell index -> the submission's cell index (for the cells that
    raised); ``added``: the student's own cells; ``how``: id, grade_id or order (the least
    exact way any lab cell was found), or ``none`` when not one was."""

    how: str = "id"
    exercise: dict[int, str] = field(default_factory=dict)
    where: dict[int, int] = field(default_factory=dict)
    added: list[Added] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)  # lab exercise cells not found
    old_version: list[str] = field(default_factory=list)  # why it looks like another version
    notes: list[str] = field(default_factory=list)


def kind_of(cell) -> str:
    """A lab code cell's kind: exercise (tagged raises-exception), check, or given."""
    if CHECK_CALL.match(cell.source):
        return "check"
    if RAISES_TAG in cell.metadata.get("tags", []):
        return "exercise"
    return "given"


def _text(source: str) -> str:
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


def defined_names(source: str) -> set[str]:
    """Top-level functions, classes and names a cell defines (by its first lines when it does
    not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set(re.findall(r"^(?:def|class)\s+(\w+)", source, re.MULTILINE))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _grade_id(cell) -> str | None:
    meta = cell.metadata.get("nbgrader") if hasattr(cell, "metadata") else None
    return meta.get("grade_id") if isinstance(meta, dict) else None


def _only_shell(source: str) -> bool:
    lines = [line.strip() for line in source.splitlines() if line.strip()]
    return bool(lines) and all(line.startswith(("!", "%")) for line in lines)


def match_cells(submission, lab) -> Matched:
    """The submission's code cells as the lab's (see the module's docstring)."""
    lab_cells = [c for c in lab.cells if c.cell_type == "code"]
    kinds = [kind_of(c) for c in lab_cells]
    sub = [(i, c) for i, c in enumerate(submission.cells) if c.cell_type == "code"]
    pair: dict[int, int] = {}  # lab code-cell index -> position in `sub`
    how: dict[int, str] = {}
    taken: set[int] = set()

    by_id = {c.get("id"): k for k, c in enumerate(lab_cells) if c.get("id")}
    by_grade = {(_grade_id(c) or c.get("id")): k for k, c in enumerate(lab_cells)}
    for way, key, table in [
        ("id", lambda c: c.get("id"), by_id),
        ("grade_id", _grade_id, by_grade),
    ]:
        for pos, (_, cell) in enumerate(sub):
            k = table.get(key(cell)) if key(cell) else None
            if pos not in taken and k is not None and k not in pair:
                pair[k], how[k] = pos, way
                taken.add(pos)

    def window(k: int) -> range:
        """Positions in `sub` between the paired lab cells before and after lab cell k."""
        before = max((pair[j] for j in pair if j < k), default=-1)
        after = min((pair[j] for j in pair if j > k), default=len(sub))
        return range(before + 1, after)

    texts = [_text(c.source) for _, c in sub]
    for exact in (True, False):  # given and check cells by their text, in order; then edited ones
        for k, cell in enumerate(lab_cells):
            if k in pair or kinds[k] == "exercise":
                continue
            mine = _text(cell.source)
            for pos in window(k):
                if pos in taken:
                    continue
                same = texts[pos] == mine
                if same or (
                    not exact
                    and kinds[k] == "given"
                    and difflib.SequenceMatcher(None, texts[pos], mine).ratio() >= SIMILAR
                ):
                    pair[k], how[k] = pos, "order"
                    taken.add(pos)
                    break
    for k, cell in enumerate(lab_cells):  # each exercise: the cell between its neighbours ...
        if k in pair or kinds[k] != "exercise":
            continue
        wanted = defined_names(cell.source)
        free = [pos for pos in window(k) if pos not in taken]
        scored = [(len(wanted & defined_names(sub[pos][1].source)), -pos) for pos in free]
        best = max(scored, default=None)
        if best and best[0] > 0:  # ... that defines what the stub defines
            pos = -best[1]
        elif len(free) == 1 and not wanted:
            pos = free[0]
        else:
            continue
        pair[k], how[k] = pos, "order"
        taken.add(pos)

    found = Matched()
    ways = [w for w in HOW_ORDER if w in how.values()]
    found.how = ways[-1] if ways else "none"
    for k, pos in pair.items():
        found.where[k] = sub[pos][0]
        if kinds[k] == "exercise":
            found.exercise[k] = sub[pos][1].source
    found.missing = [k for k, kind in enumerate(kinds) if kind == "exercise" and k not in pair]
    order = sorted(pair, key=pair.get)  # lab cells by their place in the submission
    for pos, (index, cell) in enumerate(sub):
        if pos in taken or not cell.source.strip():
            continue
        after = max((k for k in order if pair[k] < pos), default=None)
        added = Added(cell.source, index, after)
        if CHECK_CALL.match(cell.source) or cell.source.lstrip().startswith("check("):
            added.runs = False
            found.notes.append(
                f"cell {index + 1} (yours) calls check(): left out, the lab's check cells are "
                "the grader's"
            )
        elif LAB_CELL_ID.match(cell.get("id") or ""):
            added.runs = False  # not the learner's: a cell of another version of the lab
            found.notes.append(
                f"cell {index + 1} is a cell of another version of the lab ({cell.get('id')}): "
                "left out, this version's given cells run instead"
            )
        elif _only_shell(cell.source):
            added.runs = False
            found.notes.append(
                f"cell {index + 1} (yours) holds only shell commands or magics: left out "
                "(the grader has no network and installs nothing)"
            )
        found.added.append(added)
    _old_version(found, submission, lab, lab_cells, kinds, pair, texts)
    return found


def _old_version(found: Matched, submission, lab, lab_cells, kinds, pair, texts) -> None:
    lab_ids = {c.get("id") for c in lab.cells if c.get("id")}
    prefixes = {i.split("-")[0] for i in lab_ids if LAB_CELL_ID.match(i)}
    foreign = sorted(
        {
            c.get("id")
            for c in submission.cells
            if LAB_CELL_ID.match(c.get("id") or "")
            and c.get("id") not in lab_ids
            and c.get("id").split("-")[0] in prefixes
        }
    )
    if foreign:
        more = " …" if len(foreign) > 5 else ""
        found.old_version.append(
            f"cells of another version of the lab: {', '.join(foreign[:5])}{more}"
        )
    given = sum(kind == "given" for kind in kinds)
    paired = [k for k, kind in enumerate(kinds) if kind == "given" and k in pair]
    changed = [k for k in paired if texts[pair[k]] != _text(lab_cells[k].source)]
    differ = len(changed) + given - len(paired)
    if given and differ / given >= OLD_VERSION_SHARE:
        found.old_version.append(f"{differ} of the lab's {given} given cells differ or are missing")


def describe(found: Matched, lab) -> list[str]:
    """What the learner is told of how their cells were read (the same on every run)."""
    lab_cells = [c for c in lab.cells if c.cell_type == "code"]
    lines = []
    if found.how == "grade_id":
        lines.append("your cells were found by their nbgrader grade_id (their cell ids differ)")
    elif found.how == "order":
        lines.append(
            "your notebook has no cell ids (Colab, or nbformat 4.4): its cells were found by "
            "their order and content"
        )
    elif found.how == "none":
        lines.append("none of your cells could be matched to the lab's: the lab's stubs ran")
    for k in found.missing:
        names = ", ".join(f"`{n}`" for n in sorted(defined_names(lab_cells[k].source)))
        what = f"the exercise cell that defines {names}" if names else "an exercise cell"
        lines.append(f"{what} was not found in your notebook: the lab's stub ran in its place")
    lines += found.notes
    for why in found.old_version:
        lines.append(
            f"your notebook looks like another version of the lab ({why}): graded on "
            "this version's given and check cells"
        )
    return lines
