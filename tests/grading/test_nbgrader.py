"""nbgrader compatibility: the labs' nbgrader cell metadata, the source notebooks that `kvlab labs
--nbgrader` exports, and (where nbgrader is installed) nbgrader itself accepting and grading them.

nbgrader is not a kvlab dependency. The last tests run it when it is found: ``KVLAB_NBGRADER`` (its
executable, e.g. from a separate venv), ``nbgrader`` on PATH, or importable here.
"""

import csv
import os
import re
import shutil
import sys
from pathlib import Path

import cpu_limit
import jsonschema
import nbformat
import pytest

from kvlab.course.jupyter_kernel import write_kernelspec
from kvlab.grading.labgen import (
    BEGIN,
    END,
    LABS_DIR,
    NBGRADER_SCORE,
    SOLUTIONS_DIR,
    cell_ids,
    checked_exercises,
    export_nbgrader,
    make_lab,
    nbgrader_source,
    strip_solution,
)
from kvlab.grading.registry import get_exercise

SOLUTIONS = sorted(SOLUTIONS_DIR.glob("[0-9][0-9]_*.ipynb"))
NAMES = [p.name for p in SOLUTIONS]

# nbgrader's cell metadata schema, version 3 (nbgrader/nbgraderformat/v3.json, nbgrader 0.6-0.9)
NBGRADER_V3 = {
    "type": "object",
    "properties": {
        "schema_version": {"type": "integer", "minimum": 3, "maximum": 3},
        "grade": {"type": "boolean"},
        "locked": {"type": "boolean"},
        "solution": {"type": "boolean"},
        "task": {"type": "boolean"},
        "grade_id": {"type": "string", "pattern": "^[a-zA-Z0-9_\\-]*$"},
        "points": {"type": "number", "minimum": 0},
        "checksum": {"type": "string", "minLength": 32, "maxLength": 32},
        "cell_type": {"type": "string", "enum": ["raw", "code", "markdown"]},
    },
    "required": ["schema_version", "grade", "locked", "solution"],
    "additionalProperties": False,
}


def _read(path: Path):
    return nbformat.read(path, as_version=4)


def _pairs():
    for path in SOLUTIONS:
        yield path.name, _read(path), _read(LABS_DIR / path.name)


def _assert_nbgrader_valid(nb, name):
    """What nbgrader's MetadataValidatorV3 checks, cell by cell and across the notebook."""
    seen = set()
    for cell in nb.cells:
        meta = cell.metadata["nbgrader"]
        jsonschema.validate(meta, NBGRADER_V3)
        grade, solution, locked, task = (
            meta.get(k, False) for k in ("grade", "solution", "locked", "task")
        )
        if grade or solution or locked:
            assert meta.get("grade_id"), f"{name} {cell.id}: no grade_id"
            assert meta["grade_id"] not in seen, f"{name}: duplicate grade id {meta['grade_id']}"
            seen.add(meta["grade_id"])
        if grade:
            assert "points" in meta, f"{name} {cell.id}: a grade cell without points"
        if task:
            assert cell.cell_type == "markdown", f"{name} {cell.id}: a task cell must be markdown"
        elif cell.cell_type == "markdown":
            assert grade == solution, f"{name} {cell.id}: a markdown answer is grade and solution"


# --- cell ids: the judge matches a submission's cells to the instructor's by id -----------------


@pytest.mark.parametrize("name", NAMES)
def test_cell_ids_are_unique_and_the_same_in_solution_and_lab(name):
    solution, lab = _read(SOLUTIONS_DIR / name), _read(LABS_DIR / name)
    ids = cell_ids(solution, name)  # raises on a missing, invalid or repeated id
    assert len(set(ids)) == len(ids)
    assert [c.id for c in lab.cells] == ids
    assert [c.cell_type for c in lab.cells] == [c.cell_type for c in solution.cells]


def test_labgen_refuses_missing_or_repeated_cell_ids():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell("y = 2")]
    nb.cells[0].id = nb.cells[1].id = "same"
    with pytest.raises(ValueError, match="'same' is used twice"):
        make_lab(nb, name="nb.ipynb")
    nb.cells[1].id = "has space"
    with pytest.raises(ValueError, match="missing or invalid"):
        make_lab(nb, name="nb.ipynb")
    nb.cells[1].id = "fine_id-2"
    assert [c.id for c in make_lab(nb).cells] == ["same", "fine_id-2"]


# --- the metadata in labs/ ---------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_lab_cells_carry_nbgrader_metadata(name):
    solution, lab = _read(SOLUTIONS_DIR / name), _read(LABS_DIR / name)
    _assert_nbgrader_valid(lab, name)
    for source_cell, cell in zip(solution.cells, lab.cells, strict=True):
        meta = cell.metadata["nbgrader"]
        assert meta["schema_version"] == 3 and meta["task"] is False
        assert meta["grade_id"] == cell.id
        _, exercise = strip_solution(source_cell.source, source_cell.cell_type)
        checks = checked_exercises(cell)
        if exercise:  # the learner's cell
            assert (meta["solution"], meta["locked"]) == (True, False), cell.id
            assert meta["grade"] is (cell.cell_type == "markdown"), cell.id
        elif checks:  # autograded: a point per check of the exercise
            assert (meta["grade"], meta["locked"], meta["solution"]) == (True, True, False)
            assert meta["points"] == sum(len(get_exercise(e).checks) for e in checks), cell.id
        else:  # given code and text: read-only
            assert (meta["grade"], meta["locked"], meta["solution"]) == (False, True, False)
            assert "points" not in meta, cell.id


def test_every_exercise_is_graded_for_its_checks():
    for name, solution, lab in _pairs():
        solution_cells = [c.id for c in lab.cells if c.metadata["nbgrader"]["solution"]]
        exercise_cells = [c.id for c in solution.cells if BEGIN in c.source]
        assert solution_cells == exercise_cells, name
        graded = {
            e for c in lab.cells if c.metadata["nbgrader"]["grade"] for e in checked_exercises(c)
        }
        assert graded == {e for c in solution.cells for e in checked_exercises(c)}, name
        total = sum(c.metadata["nbgrader"].get("points", 0) for c in lab.cells)
        assert total == sum(len(get_exercise(e).checks) for e in graded), name


def test_the_solution_notebooks_stay_free_of_derived_metadata():
    for path in SOLUTIONS:
        assert not any("nbgrader" in c.metadata for c in _read(path).cells), path.name


# --- the nbgrader source notebooks -------------------------------------------------------------


def test_export_writes_an_nbgrader_course(tmp_path):
    written = export_nbgrader(tmp_path)
    assert tmp_path / "nbgrader_config.py" in written
    for path in SOLUTIONS:
        target = tmp_path / "source" / path.stem / path.name
        assert target in written
        nb, solution, lab = _read(target), _read(path), _read(LABS_DIR / path.name)
        nbformat.validate(nb)
        _assert_nbgrader_valid(nb, path.name)
        assert nb.metadata == lab.metadata
        for cell, source_cell, lab_cell in zip(nb.cells, solution.cells, lab.cells, strict=True):
            assert cell.id == source_cell.id
            assert cell.metadata == lab_cell.metadata  # the same tags and nbgrader metadata
            if checked_exercises(cell):  # nbgrader's partial credit: the checks passed
                assert cell.source == source_cell.source + NBGRADER_SCORE
            else:  # the solutions themselves, for nbgrader to strip
                assert cell.source == source_cell.source
            assert cell.get("outputs", []) == []
    config = tmp_path / "nbgrader_config.py"
    config.write_text("c = get_config()\n")
    assert config not in export_nbgrader(tmp_path), "an instructor's config is kept"
    assert config.read_text() == "c = get_config()\n"


def test_the_labs_command_exports_without_touching_labs(tmp_path):
    before = {p.name: p.read_bytes() for p in LABS_DIR.glob("*.ipynb")}
    done = cpu_limit.run(
        [sys.executable, "-m", "kvlab", "labs", "--nbgrader", str(tmp_path)],
        cpu=300,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.parent.name for p in tmp_path.glob("source/*/*.ipynb")) == [
        p.stem for p in SOLUTIONS
    ]
    assert "nbgrader_config.py" in done.stdout
    assert {p.name: p.read_bytes() for p in LABS_DIR.glob("*.ipynb")} == before


def test_export_refuses_check_cells_nbgrader_would_misgrade():
    def notebook(check_source):
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(f"def f():\n    {BEGIN}\n    return 1\n    {END}")]
        nb.cells.append(nbformat.v4.new_code_cell(check_source))
        return nb

    points = {"00.x": 3}.__getitem__
    good = nbgrader_source(notebook('check("00.x", f)  # see above'), points=points)
    assert good.cells[1].source == 'check("00.x", f).passed  # see above'
    assert good.cells[1].metadata["nbgrader"]["points"] == 3
    for bad, match in [
        ('check("00.x", f)\nprint("done")', "must end with"),
        ('r = check("00.x", f)', "must end with"),
        ('check("00.x", f); x = 1', "must end with"),
        ('check("00.x", f);', "nothing may follow"),
    ]:
        with pytest.raises(ValueError, match=match):
            nbgrader_source(notebook(bad), points=points)
    with pytest.raises(ValueError, match="unknown exercise"):
        make_lab(notebook('check("00.nope", f)'))


# --- nbgrader itself ---------------------------------------------------------------------------


def _nbgrader() -> list[str] | None:
    found = os.environ.get("KVLAB_NBGRADER") or shutil.which("nbgrader")
    if found:
        return [found]
    try:
        import nbgrader  # noqa: F401
    except ImportError:
        return None
    return [sys.executable, "-m", "nbgrader"]


NBGRADER = _nbgrader()
needs_nbgrader = pytest.mark.skipif(
    NBGRADER is None,
    reason="nbgrader is not installed (not a kvlab dependency; to run: `python3 -m venv /tmp/nbg && "
    "/tmp/nbg/bin/pip install nbgrader`, then KVLAB_NBGRADER=/tmp/nbg/bin/nbgrader)",
)
LABS = ["00_why_kv_cache", "03_paged_allocator"]


def _run_nbgrader(course: Path, *args: str, env: dict | None = None) -> str:
    env = {**os.environ, **(env or {})}
    # nbgrader runs `alembic` from PATH: put its own environment's scripts first
    env["PATH"] = os.pathsep.join([str(Path(NBGRADER[0]).parent), env.get("PATH", "")])
    done = cpu_limit.run(
        [*NBGRADER, *args], cpu=300, cwd=course, env=env, capture_output=True, text=True
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    assert "[ERROR]" not in log and "| ERROR]" not in log, log
    return log


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    course = tmp_path_factory.mktemp("nbgrader-course")
    export_nbgrader(course)
    for lab in LABS:
        _run_nbgrader(course, "generate_assignment", lab)
    return course


@needs_nbgrader
@pytest.mark.parametrize("lab", LABS)
def test_nbgrader_generate_assignment_releases_the_lab(course, lab):
    """nbgrader's student version of the exported source is kvlab's lab: same cells, ids, stubs
    and nbgrader metadata; only the check cells end with the score nbgrader reads."""
    release, ours = (
        _read(course / "release" / lab / f"{lab}.ipynb"),
        _read(LABS_DIR / f"{lab}.ipynb"),
    )
    assert [c.id for c in release.cells] == [c.id for c in ours.cells]
    for cell, lab_cell in zip(release.cells, ours.cells, strict=True):
        if checked_exercises(lab_cell):
            assert cell.source == lab_cell.source + NBGRADER_SCORE
        else:
            assert cell.source == lab_cell.source, cell.id
        theirs = dict(cell.metadata["nbgrader"])
        assert theirs.pop("cell_type") == cell.cell_type and len(theirs.pop("checksum")) == 32
        assert theirs == lab_cell.metadata["nbgrader"], cell.id
        if theirs["locked"]:  # nbgrader makes read-only and test cells uneditable
            assert cell.metadata["editable"] is False, cell.id
        else:
            assert "editable" not in cell.metadata, cell.id


def _submit(course: Path, student: str, lab: str, solved: set[str], wrong: dict[str, str]):
    """A learner's hand-in: the lab from labs/ with some exercises solved (kvlab's solution)
    and some answered wrongly."""
    solution = {c.id: c.source for c in _read(SOLUTIONS_DIR / f"{lab}.ipynb").cells}
    nb = _read(LABS_DIR / f"{lab}.ipynb")
    for cell in nb.cells:
        if cell.id in solved:
            lines = solution[cell.id].split("\n")
            cell.source = "\n".join(x for x in lines if x.strip() not in (BEGIN, END))
        cell.source = wrong.get(cell.id, cell.source)
    folder = course / "submitted" / student / lab
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / f"{lab}.ipynb")


@needs_nbgrader
@pytest.mark.slow
def test_nbgrader_autograde_scores_the_checks(course, tmp_path):
    """nbgrader's autograder, on submitted labs, gives a point per check passed."""
    lab = "00_why_kv_cache"
    forgot_v = "def kv_bytes_per_token(spec):\n    return spec.num_layers * spec.num_kv_heads * spec.head_dim * spec.dtype_bytes"
    _submit(course, "solved", lab, {"lab00-07", "lab00-14"}, {})
    _submit(course, "half", lab, {"lab00-07"}, {"lab00-14": forgot_v})
    _submit(course, "blank", lab, set(), {})
    # the kvlab kernel the notebooks ask for, started with this interpreter (kvlab is importable)
    write_kernelspec(tmp_path / "jupyter" / "kernels" / "kvlab", python=sys.executable)
    _run_nbgrader(course, "autograde", lab, env={"JUPYTER_PATH": str(tmp_path / "jupyter")})
    _run_nbgrader(course, "export")
    with open(course / "grades.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["assignment"] == lab]
    scores = {r["student_id"]: (float(r["score"]), float(r["max_score"])) for r in rows}
    points = len(get_exercise("00.decode_step").checks) + len(get_exercise("00.kv_bytes").checks)
    decode = len(get_exercise("00.decode_step").checks)
    assert scores == {"solved": (points, points), "half": (decode, points), "blank": (0, points)}
    graded = _read(course / "autograded" / "half" / lab / f"{lab}.ipynb")
    reports = "".join(o.get("text", "") for c in graded.cells for o in c.get("outputs", []))
    assert re.search(r"00\.kv_bytes .*0/\d+ checks passed", reports), reports
