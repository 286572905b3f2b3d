"""Every lab runs top to bottom; `kvlab grade` scores labs 0 and solutions full, as instructors run it.

(nbval executes the solution notebooks themselves: see `make test`.)
"""

import json
import os
import subprocess

import nbformat
import pytest
from conftest import ROOT, kvlab_cli

pytestmark = pytest.mark.slow


def grade(*paths, env=None, timeout=600):
    out = subprocess.run(
        [*kvlab_cli(), "grade", "--json", *map(str, paths)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return {g["path"]: g for g in json.loads(out.stdout)["notebooks"]}


def test_labs_run_top_to_bottom_and_score_zero():
    grades = grade("labs")
    assert len(grades) == len(list((ROOT / "labs").glob("*.ipynb")))
    for path, g in grades.items():
        assert g["error"] is None, path
        lab = nbformat.read(ROOT / path, as_version=4)
        for index in g["error_cells"]:
            tags = lab.cells[index].metadata.get("tags", [])
            assert "raises-exception" in tags, f"{path}: untagged cell {index} raised"
        assert g["total"] > 0 and g["passed"] == 0, path
        assert {e["status"] for e in g["exercises"]} == {"not implemented"}, path


def test_solutions_get_full_marks():
    for path, g in grade("solutions").items():
        assert g["error"] is None and g["error_cells"] == [], path
        assert g["passed"] == g["total"] > 0, path
        assert {e["status"] for e in g["exercises"]} == {"passed"}, path


HOSTILE = [
    "from kvlab.grading import check",
    "def kv_bytes_per_token(spec):\n    while True:\n        pass",
    'check("00.kv_bytes", kv_bytes_per_token)',
    "def decode_step(layer, x_t, k, v):\n    print('spam ' * 200_000)\n    return 42",
    'check("00.decode_step", decode_step)',
    "1 / 0",
    "print('still running after the error')",
]


def _notebook(tmp_path, sources, name="00_submission.ipynb"):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    path = tmp_path / name
    nbformat.write(nb, path)
    return path


def test_grader_survives_a_hostile_submission(tmp_path):
    path = _notebook(tmp_path, HOSTILE)
    g = grade(path, env={"KVLAB_CHECK_TIMEOUT": "1"})[str(path)]
    assert g["error"] is None
    scores = {e["id"]: (e["passed"], e["total"], e["status"]) for e in g["exercises"]}
    assert scores == {"00.kv_bytes": (0, 5, "failed"), "00.decode_step": (0, 5, "failed")}
    assert g["error_cells"] == [5]


def test_a_deleted_check_cell_scores_zero(tmp_path):
    sources = [
        "from kvlab.grading import check",
        "def kv_bytes_per_token(s):\n    return 2 * s.num_layers * s.num_kv_heads * s.head_dim * s.dtype_bytes",
        'check("00.kv_bytes", kv_bytes_per_token)',
    ]
    g = grade(_notebook(tmp_path, sources))
    (g,) = g.values()
    scores = {e["id"]: (e["passed"], e["status"]) for e in g["exercises"]}
    assert scores == {"00.kv_bytes": (5, "passed"), "00.decode_step": (0, "not run")}
    assert (g["passed"], g["total"]) == (5, 10)


def test_grade_text_report_and_bad_paths(tmp_path):
    path = _notebook(tmp_path, ["x = 1"], name="notes.ipynb")
    out = subprocess.run([*kvlab_cli(), "grade", str(path)], capture_output=True, text=True)
    assert out.returncode == 0 and "total" in out.stdout and "0/0" in out.stdout
    missing = subprocess.run(
        [*kvlab_cli(), "grade", str(tmp_path / "nope.ipynb")], capture_output=True, text=True
    )
    assert missing.returncode == 2 and "no such notebook" in missing.stdout
