"""`kvlab grade`, as instructors run it: the judge gives every solution full marks and the unsolved
Lab 01 exactly zero. Nothing here sets TRITON_INTERPRET: the kernel decides.

Where the rest of the course is checked: every unsolved lab runs top to bottom with only its
`raises-exception` cells raising and every exercise "not implemented", in a plain python3 kernel
from the installed wheel (tests/course/test_wheel.py, test_every_lab_runs_in_a_plain_python3_kernel);
nbval executes the solution notebooks through the `kvlab` kernel (see `make test-notebooks`).
"""

import json

import cpu_limit
import nbformat
import pytest
from conftest import LEARNER_ENV, ROOT, kvlab_cli

pytestmark = pytest.mark.slow

ARTIFACTS = ROOT / "tests" / "artifacts"


def grade(*paths, env=None, kernel=None, jobs=1, cpu=900, cell_timeout=None):
    """``kvlab grade --json``, its whole process tree held to ``cpu`` CPU-seconds per job."""
    options = (["--kernel", kernel] if kernel else []) + ["--jobs", str(jobs)]
    options += ["--cell-timeout", str(cell_timeout)] if cell_timeout else []
    out = cpu_limit.run(
        [*kvlab_cli(), "grade", "--json", *options, *map(str, paths)],
        cpu=cpu * jobs,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**LEARNER_ENV, **(env or {})},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return {g["path"]: g for g in json.loads(out.stdout)["notebooks"]}


def record_times(name: str, grades: dict) -> None:
    """Seconds per notebook (kernel start included), for the closing notes: never asserted."""
    ARTIFACTS.mkdir(exist_ok=True)
    times = {path: g["seconds"] for path, g in grades.items()}
    (ARTIFACTS / f"notebook_times_{name}.json").write_text(json.dumps(times, indent=1) + "\n")
    print(f"\n{name}: " + ", ".join(f"{p} {t:.0f} s" for p, t in times.items()))


# the unsolved lab graded by the judge here (its exact zero figures are asserted, and
# tests/grading/test_judge.py's cheats score no more than it); every unsolved lab is run by the
# wheel's test (tests/course/test_wheel.py), which asserts the same of each
JUDGED_LAB = "labs/01_contiguous_cache.ipynb"


@pytest.fixture(scope="module")
def course():
    """Every solution and the unsolved Lab 01, graded by the judge (the default), two at a
    time: each notebook once, for every test here that reads a course notebook's grade."""
    # The judge's checks count CPU time (and are tried twice); a cell's own limit
    # (--cell-timeout, 300 s by default) is still wall time: given its 10 x backstop here, so a
    # busy machine cannot cost a solution's cell (a cell that never ends still fails)
    return grade(JUDGED_LAB, "solutions", jobs=2, cell_timeout=3000)


def test_the_self_reported_way_still_runs_a_lab_in_the_kvlab_kernel(tmp_path):
    """`--kernel` runs the whole notebook in a Jupyter kernel, scored as its check cells say
    (for self-study: a submission can forge that). Lab 01's solution cut to what its scores
    need: the set-up cell, both exercise cells and their check cells (the whole solution runs
    in the kvlab kernel under nbval, `make test-notebooks`)."""
    nb = nbformat.read(ROOT / "solutions" / "01_contiguous_cache.ipynb", as_version=4)
    keep = ["lab01-01", "lab01-07", "lab01-08", "lab01-10", "lab01-11"]
    nb.cells = [c for c in nb.cells if c.get("id") in keep]
    assert [c.id for c in nb.cells] == keep
    path = tmp_path / "01_contiguous_cache.ipynb"
    nbformat.write(nb, path)
    (g,) = grade(path, kernel="kvlab").values()
    assert g["error"] is None and g["error_cells"] == [] and g["passed"] == g["total"] == 16, g
    assert {e["status"] for e in g["exercises"]} == {"passed"}, g


# notebooks with nothing to grade (Lab 08 is a leader's brief: no code to write)
NO_EXERCISES = {"08_leaders_brief.ipynb"}


def in_folder(grades: dict, folder: str) -> dict:
    return {path: g for path, g in grades.items() if path.startswith(f"{folder}/")}


def test_the_unsolved_lab_01_runs_top_to_bottom_and_scores_zero(course):
    """The judge runs the unsolved Lab 01 with only its exercise cells raising, every exercise
    "not implemented". (Every other unsolved lab: tests/course/test_wheel.py's
    test_every_lab_runs_in_a_plain_python3_kernel asserts the same in a plain python3 kernel.)"""
    grades = in_folder(course, "labs")
    record_times("labs", grades)
    assert sorted(grades) == [JUDGED_LAB]
    g = grades[JUDGED_LAB]
    assert g["error"] is None, g
    lab = nbformat.read(ROOT / JUDGED_LAB, as_version=4)
    for index in g["error_cells"]:
        tags = lab.cells[index].metadata.get("tags", [])
        assert "raises-exception" in tags, f"{JUDGED_LAB}: untagged cell {index} raised"
    assert {e["status"] for e in g["exercises"]} == {"not implemented"}, g["exercises"]
    # the unsolved lab that tests/test_judge.py hands in with cheats: none scores more than this
    assert scores(g) == {"01.waste_split": (0, 6), "01.max_length_cache": (0, 10)}


def scores(g: dict) -> dict:
    return {e["id"]: (e["passed"], e["total"]) for e in g["exercises"]}


def test_solutions_get_full_marks(course):
    grades = in_folder(course, "solutions")
    record_times("solutions", grades)
    assert len(grades) == len(list((ROOT / "solutions").glob("*.ipynb")))
    for path, g in grades.items():
        assert g["error"] is None and g["error_cells"] == [], path
        if path.rsplit("/", 1)[-1] in NO_EXERCISES:
            assert g["exercises"] == [], path
            continue
        assert g["passed"] == g["total"] > 0, path
        assert {e["status"] for e in g["exercises"]} == {"passed"}, path
        # every given cell is the judge's (Lab 03's reference block manager, Lab 10's tiers):
        # a solution that uses them is not flagged as handing its work to kvlab
        assert not any(e["handover"] for e in g["exercises"]), path
    # a solution is judged as the lab with the solution's exercise cells handed in (the honest
    # code of tests/test_judge.py's cheats), and the report says what the sandbox did
    assert scores(grades["solutions/01_contiguous_cache.ipynb"]) == {
        "01.waste_split": (6, 6),
        "01.max_length_cache": (10, 10),
    }
    notes = "\n".join(grades["solutions/00_why_kv_cache.ipynb"]["notes"])
    assert "network:" in notes and "limits:" in notes, notes


def _notebook(tmp_path, sources, name="00_submission.ipynb"):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    path = tmp_path / name
    nbformat.write(nb, path)
    return path


def _handed_in(tmp_path, cells: dict, name="00_submission.ipynb"):
    """Lab 00 as a learner hands it in, ``cells`` (id -> source) in place of the lab's."""
    nb = nbformat.read(ROOT / "labs" / "00_why_kv_cache.ipynb", as_version=4)
    for cell in nb.cells:
        cell.source = cells.get(cell.get("id"), cell.source)
    path = tmp_path / name
    nbformat.write(nb, path)
    return path


HOSTILE = {
    "lab00-14": "def kv_bytes_per_token(spec):\n    while True:\n        pass",
    "lab00-07": "def decode_step(layer, x_t, k, v):\n    print('spam ' * 200_000)\n    return 42\n\n1 / 0",
}


def test_grader_survives_a_hostile_submission(tmp_path):
    path = _handed_in(tmp_path, HOSTILE)
    g = grade(path, env={"KVLAB_CHECK_TIMEOUT": "1"})[str(path)]
    assert g["error"] is None
    scores = {e["id"]: (e["passed"], e["total"], e["status"]) for e in g["exercises"]}
    # the endless loop is stopped at its CPU limit, a status of its own (not a wrong answer)
    assert scores == {
        "00.kv_bytes": (0, 5, "stopped at limit"),
        "00.decode_step": (0, 6, "failed"),
    }
    lab = nbformat.read(path, as_version=4)
    assert [lab.cells[i].id for i in g["error_cells"]] == ["lab00-07"]


def test_a_deleted_check_cell_changes_nothing(tmp_path):
    """The judge runs the lab's own check cells: deleting one (or all) scores the same."""
    nb = nbformat.read(ROOT / "solutions" / "00_why_kv_cache.ipynb", as_version=4)
    nb.cells = [c for c in nb.cells if not c.source.startswith("check(")]
    path = tmp_path / "00_no_checks.ipynb"
    nbformat.write(nb, path)
    (g,) = grade(path).values()
    scores = {e["id"]: (e["passed"], e["status"]) for e in g["exercises"]}
    assert scores == {"00.decode_step": (6, "passed"), "00.kv_bytes": (5, "passed")}


TRITON_FIRST = [
    "import torch, triton, triton.language as tl",
    "@triton.jit\n"
    "def double_sum(x_ptr, BLOCK: tl.constexpr):\n"
    "    offs = tl.arange(0, BLOCK)\n"
    "    x = tl.load(x_ptr + offs)\n"
    "    tl.store(x_ptr + offs, x * 0 + tl.sum(x, axis=0) + tl.zeros([BLOCK], tl.float32))",
    "x = torch.ones(4); double_sum[(1,)](x, BLOCK=4); assert x.tolist() == [4.0] * 4",
]


def test_grading_runs_in_the_learners_kernel_not_in_its_own_environment(tmp_path):
    """`kvlab grade` imports kvlab (which sets TRITON_INTERPRET in its own process); the notebook
    must still start as in JupyterLab: through the kvlab kernel, which decides for itself."""
    path = _notebook(tmp_path, TRITON_FIRST, name="triton_first.ipynb")
    env = {"CUDA_VISIBLE_DEVICES": ""}
    learner = {k: v for k, v in LEARNER_ENV.items() if k != "TRITON_INTERPRET"}
    (ours,) = grade(path, env={**learner, **env}).values()
    assert ours["error"] is None and ours["error_cells"] == [], ours
    # a plain Python kernel gets the user's environment too, not kvlab's setting: Triton first breaks
    out = cpu_limit.run(
        [*kvlab_cli(), "grade", "--json", "--kernel", "python3", str(path)],
        cpu=300,
        capture_output=True,
        text=True,
        env={**learner, **env},
    )
    (plain,) = json.loads(out.stdout)["notebooks"]
    assert plain["error_cells"] == [2], plain


def test_grading_survives_a_looping_cell_a_dead_kernel_and_a_missing_kernel(tmp_path):
    """The judge stops a cell that runs past --cell-timeout and starts a process that died
    again; the self-reported way (a Jupyter kernel) has nbclient's timeout and dead-kernel
    checks, which need the async kernel manager."""
    loop = _notebook(
        tmp_path, ["import time", "while True:\n    time.sleep(0.1)", "x = 1"], name="loop.ipynb"
    )
    crash = _notebook(
        tmp_path,
        ["import os, signal", "os.kill(os.getpid(), signal.SIGSEGV)", "x = 1"],
        name="crash.ipynb",
    )
    out = cpu_limit.run(
        [*kvlab_cli(), "grade", "--json", "--cell-timeout", "3", str(loop), str(crash)],
        cpu=120,
        capture_output=True,
        text=True,
        env=LEARNER_ENV,
    )
    grades = {g["path"]: g for g in json.loads(out.stdout)["notebooks"]}
    for path in (loop, crash):
        assert grades[str(path)]["error"] is None and grades[str(path)]["error_cells"] == [1]
    kernel = cpu_limit.run(
        [
            *kvlab_cli(),
            "grade",
            "--json",
            "--kernel",
            "kvlab",
            "--cell-timeout",
            "3",
            str(loop),
            str(crash),
        ],
        capture_output=True,
        text=True,
        env=LEARNER_ENV,
        cpu=120,
    )
    grades = {g["path"]: g for g in json.loads(kernel.stdout)["notebooks"]}
    assert grades[str(loop)]["error"].startswith("CellTimeoutError"), grades
    assert grades[str(crash)]["error"].startswith("DeadKernelError"), grades
    missing = cpu_limit.run(
        [*kvlab_cli(), "grade", "--kernel", "no-such-kernel", str(loop)],
        cpu=60,
        capture_output=True,
        text=True,
        env=LEARNER_ENV,
    )
    assert missing.returncode == 0 and "NoSuchKernel" in missing.stdout


def test_grade_text_report_and_bad_paths(tmp_path):
    path = _notebook(tmp_path, ["x = 1"], name="notes.ipynb")
    out = cpu_limit.run(
        [*kvlab_cli(), "grade", str(path)], cpu=300, capture_output=True, text=True, env=LEARNER_ENV
    )
    assert out.returncode == 0 and "no exercises to grade; ran in" in out.stdout
    missing = cpu_limit.run(
        [*kvlab_cli(), "grade", str(tmp_path / "nope.ipynb")],
        cpu=120,
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2 and "no such notebook" in missing.stdout
    no_jobs = cpu_limit.run(
        [*kvlab_cli(), "grade", "--jobs", "0", str(path)], cpu=120, capture_output=True, text=True
    )
    assert no_jobs.returncode == 2 and "--jobs must be at least 1" in no_jobs.stdout
