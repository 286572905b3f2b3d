"""A synthetic class made from the course's own notebooks, each submission with the score it
should get: the solution, the unsolved lab, a half-done one (its first exercise), one with a wrong
answer (its last exercise), and one
per cheat of issue 22 (forged results, a check of one's own, kvlab's references swapped, a
file planted in kvlab's package, a poisoned message on the judge's channel, a forked writer, an
answer equal to everything, an early exit, check cells turned into prints). Every cheat is
built on the unsolved lab, so it earns nothing: a score above 0 is a cheat that worked.

``kvlab bench grade`` grades it (kvlab/perf/bench.py); its test grades a small part of it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

from kvlab.core import files
from kvlab.course.nbformat_quick import nbformat
from kvlab.grading.judge import CHECK_CELL
from kvlab.grading.labgen import RAISES_TAG
from kvlab.grading.registry import get_exercise

LABS = ("00", "01", "02", "03", "04", "05", "06", "07")
HONEST = ("solution", "unsolved", "half", "wrong")
WRONG = -1  # the points of a wrong answer: fewer than all

_FORGE = """import json as _json, os as _os
for _path in {_os.environ.get("KVLAB_GRADE_LOG", ""), "results.jsonl", "../results.jsonl"} - {""}:
    try:
        with open(_path, "a") as _f:
            for _id, _n in @FORGED@:
                _f.write(_json.dumps({"exercise": _id, "title": "", "status": "passed",
                                      "passed": _n, "total": _n}) + "\\n")
    except OSError:
        pass
_os._exit(0)
"""

_FAKE_CHECK = """def check(exercise, obj, timeout=None):
    print(f"{exercise}: all checks passed. Well done!")
"""

_PATCH = """import sys as _sys
for _module in list(_sys.modules.values()):
    if getattr(_module, "__name__", "").startswith("kvlab"):
        for _name, _value in list(vars(_module).items()):
            if callable(_value) and not _name.startswith("_") and not isinstance(_value, type):
                try:
                    setattr(_module, _name, lambda *a, **k: None)
                except Exception:
                    pass
"""

_PLANT = """import os as _os, kvlab.grading as _grading
_folder = _os.path.dirname(_grading.__file__)
for _name in ("lab@LAB@.py", "zz_planted.py", "__init__.py"):
    try:
        with open(_os.path.join(_folder, _name), "a") as _f:
            _f.write("\\nEXERCISES_FORGED = True\\n")
    except OSError:
        pass
"""

_POISON = """import os as _os, pickle as _pickle, struct as _struct, sys as _sys
class _Boom:
    def __reduce__(self):
        return (_os.system, ("echo poisoned > /tmp/kvlab-synthetic-poisoned",))
try:
    _payload = _pickle.dumps((_pickle.dumps(("ok", _Boom(), None, None)), {}))
    _os.write(int(_sys.argv[2]), _struct.pack("!Q", len(_payload)) + _payload)
except Exception:
    pass
"""

_FORK = """import os as _os, time as _time
if _os.fork() == 0:
    _os.setsid()
    _time.sleep(3)
    with open("/tmp/kvlab-synthetic-outlived", "w") as _f:
        _f.write("a writer outlived its grading")
    _os._exit(0)
"""

_ALWAYS_EQUAL = """class _Yes:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = object.__hash__
@NAME@ = lambda *args, **kwargs: _Yes()
"""

_EXIT = "import os as _os\n_os._exit(0)\n"

# cheat -> (code put in the first exercise cell: before its stub, or after it)
CHEATS = {
    "forge": ("before", _FORGE),
    "fake_check": ("after", _FAKE_CHECK),
    "patch_reference": ("after", _PATCH),
    "plant_file": ("after", _PLANT),
    "poison": ("after", _POISON),
    "fork_writer": ("after", _FORK),
    "always_equal": ("after", _ALWAYS_EQUAL),
    "exit_early": ("before", _EXIT),
    "tamper_checks": ("cells", None),
}
VARIANTS = HONEST + tuple(CHEATS)
# files the poison and fork cheats would write if they worked
TRACES = (Path("/tmp/kvlab-synthetic-poisoned"), Path("/tmp/kvlab-synthetic-outlived"))


@dataclass(frozen=True)
class Expected:
    """What one synthetic submission should score, exercise by exercise."""

    student: str
    lab: str
    path: Path
    points: dict[str, tuple[int, int]]  # exercise id -> (points, total); WRONG: < total


def _notebook(folder: Path, lab: str):
    (path,) = sorted(folder.glob(f"{lab}_*.ipynb"))
    return path, nbformat.read(path, as_version=4)


def _exercises(lab_nb) -> list[tuple[str, str, str]]:
    """(exercise cell id, exercise id, the name it is checked under), in the lab's order."""
    checks = [CHECK_CELL.match(c.source) for c in lab_nb.cells if c.cell_type == "code"]
    checks = [(m.group(1), m.group(2)) for m in checks if m]
    cells = [c.id for c in lab_nb.cells if RAISES_TAG in c.metadata.get("tags", [])]
    return [(cell, ex, name) for cell, (ex, name) in zip(cells, checks, strict=False)]


def _total(exercise_id: str) -> int:
    return len(get_exercise(exercise_id).checks)


def _wrong(name: str, exercise_id: str) -> str:
    """Code that makes the exercise's object hand back wrong answers."""
    if get_exercise(exercise_id).expects == "class":
        return (
            f"\n\nclass {name}({name}):\n"
            "    def __init__(self, *args, **kwargs):\n"
            "        raise ValueError('a wrong answer on purpose')\n"
        )
    return f"\n\n{name} = lambda *args, **kwargs: None  # a wrong answer on purpose\n"


def variant(lab: str, kind: str):
    """Lab ``lab`` as the submission ``kind``, and the points it should get."""
    _, lab_nb = _notebook(files.labs_dir(), lab)
    solutions = files.checkout_path("solutions", purpose="a synthetic class (kvlab bench grade)")
    _, solution = _notebook(solutions, lab)
    solved = {c.id: c.source for c in solution.cells}
    exercises = _exercises(lab_nb)
    nb = copy.deepcopy(lab_nb)
    cells = {c.id: c for c in nb.cells}
    points = {ex: (0, _total(ex)) for _, ex, _ in exercises}
    first_cell, first_ex, first_name = exercises[0]
    if kind in ("solution", "half", "wrong"):
        chosen = exercises if kind != "half" else exercises[:1]
        for cell, ex, _ in chosen:
            cells[cell].source = solved[cell]
            points[ex] = (_total(ex), _total(ex))
        if kind == "wrong":  # the last exercise (others may use the earlier ones): wrong
            last_cell, last_ex, last_name = exercises[-1]
            cells[last_cell].source += _wrong(last_name, last_ex)
            points[last_ex] = (WRONG, _total(last_ex))  # a check or two may still pass
    elif kind in CHEATS:
        where, code = CHEATS[kind]
        if kind == "tamper_checks":
            for cell in nb.cells:
                if CHECK_CELL.match(cell.source):
                    cell.source = "print('All checks passed. Well done!')"
        else:
            forged = [(ex, _total(ex)) for _, ex, _ in exercises]
            code = (
                code.replace("@FORGED@", repr(forged))
                .replace("@LAB@", lab)
                .replace("@NAME@", first_name)
            )
            stub = cells[first_cell].source
            cells[first_cell].source = (
                code + "\n" + stub if where == "before" else stub + "\n" + code
            )
    elif kind != "unsolved":
        raise ValueError(f"kind must be one of {VARIANTS}, got {kind!r}")
    return nb, points


def build_class(folder: str | Path, labs=LABS, kinds=VARIANTS) -> list[Expected]:
    """Write the class into ``folder`` (one student folder per kind, one notebook per lab) and
    return what each submission should score."""
    folder = Path(folder)
    expected = []
    for kind in kinds:
        for lab in labs:
            nb, points = variant(lab, kind)
            path = folder / kind / f"{lab}_submission.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, path)
            expected.append(Expected(kind, lab, path, points))
    return expected


def compare(expected: list[Expected], records: list[dict]) -> list[str]:
    """Every submission whose graded points differ from what it should get (cheats that
    worked among them), in words; empty when the gradebook is right."""
    graded = {(r["student"], r["lab"]): r for r in records}
    wrong = []
    for e in expected:
        record = graded.get((e.student, e.lab))
        if record is None:
            wrong.append(f"{e.student}/{e.lab}: not graded")
            continue
        got = {x["id"]: (x["passed"], x["total"]) for x in record.get("exercises", [])}
        for exercise, want in e.points.items():
            have = got.get(exercise, (0, want[1]))
            right = have[1] == want[1] and (
                have[0] < want[1] if want[0] == WRONG else have[0] == want[0]
            )
            if not right:
                shown = "fewer than all" if want[0] == WRONG else f"{want[0]}"
                wrong.append(f"{e.student}/{e.lab} {exercise}: {have} for {shown} of {want[1]}")
    return wrong
