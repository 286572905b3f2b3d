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


@dataclass
class _Pairing:
    """The lab's code cells and the submission's, paired as :func:`match_cells` goes."""

    lab_cells: list
    kinds: list[str]
    sub: list[tuple[int, object]]  # (index in the submission, cell) of its code cells
    texts: list[str]  # the submission's code cells' text, as compared
    pair: dict[int, int] = field(default_factory=dict)  # lab code-cell index -> position in sub
    how: dict[int, str] = field(default_factory=dict)
    taken: set[int] = field(default_factory=set)

    def join(self, k: int, pos: int, way: str) -> None:
        self.pair[k], self.how[k] = pos, way
        self.taken.add(pos)

    def window(self, k: int) -> range:
        """Positions in `sub` between the paired lab cells before and after lab cell k."""
        before = max((self.pair[j] for j in self.pair if j < k), default=-1)
        after = min((self.pair[j] for j in self.pair if j > k), default=len(self.sub))
        return range(before + 1, after)


def match_cells(submission, lab) -> Matched:
    """The submission's code cells as the lab's (see the module's docstring)."""
    lab_cells = [c for c in lab.cells if c.cell_type == "code"]
    sub = [(i, c) for i, c in enumerate(submission.cells) if c.cell_type == "code"]
    p = _Pairing(lab_cells, [kind_of(c) for c in lab_cells], sub, [_text(c.source) for _, c in sub])
    _pair_by_ids(p)
    _pair_by_text(p)
    _pair_exercises_by_names(p)
    found = _matched(p)
    found.added = [_added(p, pos, found.notes) for pos in _unpaired(p)]
    _old_version(found, submission, lab, lab_cells, p.kinds, p.pair, p.texts)
    return found


def _pair_by_ids(p: _Pairing) -> None:
    """Cells whose cell id is the lab cell's, then those whose nbgrader grade_id is."""
    by_id = {c.get("id"): k for k, c in enumerate(p.lab_cells) if c.get("id")}
    by_grade = {(_grade_id(c) or c.get("id")): k for k, c in enumerate(p.lab_cells)}
    for way, key, table in [
        ("id", lambda c: c.get("id"), by_id),
        ("grade_id", _grade_id, by_grade),
    ]:
        for pos, (_, cell) in enumerate(p.sub):
            k = table.get(key(cell)) if key(cell) else None
            if pos not in p.taken and k is not None and k not in p.pair:
                p.join(k, pos, way)


def _pair_by_text(p: _Pairing) -> None:
    """Given and check cells by their text, in order; then given cells a little edited."""
    for exact in (True, False):
        for k, cell in enumerate(p.lab_cells):
            if k in p.pair or p.kinds[k] == "exercise":
                continue
            mine = _text(cell.source)
            for pos in p.window(k):
                if pos not in p.taken and _alike(
                    p.texts[pos], mine, exact or p.kinds[k] != "given"
                ):
                    p.join(k, pos, "order")
                    break


def _alike(text: str, lab_text: str, exact: bool) -> bool:
    if text == lab_text:
        return True
    return not exact and difflib.SequenceMatcher(None, text, lab_text).ratio() >= SIMILAR


def _pair_exercises_by_names(p: _Pairing) -> None:
    """Each exercise: the cell between its neighbours that defines what the stub defines (or
    the only cell there, for a stub that defines nothing)."""
    for k, cell in enumerate(p.lab_cells):
        if k in p.pair or p.kinds[k] != "exercise":
            continue
        wanted = defined_names(cell.source)
        free = [pos for pos in p.window(k) if pos not in p.taken]
        scored = [(len(wanted & defined_names(p.sub[pos][1].source)), -pos) for pos in free]
        best = max(scored, default=None)
        if best and best[0] > 0:
            p.join(k, -best[1], "order")
        elif len(free) == 1 and not wanted:
            p.join(k, free[0], "order")


def _matched(p: _Pairing) -> Matched:
    found = Matched()
    ways = [w for w in HOW_ORDER if w in p.how.values()]
    found.how = ways[-1] if ways else "none"
    for k, pos in p.pair.items():
        found.where[k] = p.sub[pos][0]
        if p.kinds[k] == "exercise":
            found.exercise[k] = p.sub[pos][1].source
    found.missing = [k for k, kind in enumerate(p.kinds) if kind == "exercise" and k not in p.pair]
    return found


def _unpaired(p: _Pairing) -> list[int]:
    """Positions of the submission's code cells paired with none of the lab's, not empty."""
    return [
        pos for pos, (_, cell) in enumerate(p.sub) if pos not in p.taken and cell.source.strip()
    ]


def _added(p: _Pairing, pos: int, notes: list[str]) -> Added:
    """A cell the learner added, placed after the lab cell before it; left out (with a note)
    where it calls check(), is another version's cell or holds only shell commands."""
    index, cell = p.sub[pos]
    after = max((k for k in p.pair if p.pair[k] < pos), default=None)
    added = Added(cell.source, index, after)
    if CHECK_CALL.match(cell.source) or cell.source.lstrip().startswith("check("):
        added.runs = False
        notes.append(
            f"cell {index + 1} (yours) calls check(): left out, the lab's check cells are "
            "the grader's"
        )
    elif LAB_CELL_ID.match(cell.get("id") or ""):
        added.runs = False  # not the learner's: a cell of another version of the lab
        notes.append(
            f"cell {index + 1} is a cell of another version of the lab ({cell.get('id')}): "
            "left out, this version's given cells run instead"
        )
    elif _only_shell(cell.source):
        added.runs = False
        notes.append(
            f"cell {index + 1} (yours) holds only shell commands or magics: left out "
            "(the grader has no network and installs nothing)"
        )
    return added


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
