""".ci/gpu-check's dry run (KVLAB_GPU_CHECK_ALLOW_CPU=1) on its cheapest settings: every step's
code path runs on CPU (kernels in Triton's interpreter, one cheap test of each kernel test file,
one tiny notebook through nbval in the registered kvlab kernel, the grid on its tiny shapes), so
a step broken in the script or in the grid's code is found here, not on a lent GPU."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.perf.attention_grid import ROW_FIELDS, TARGET_FIELDS, TINY, grid_shapes

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "gpu-check"
STEPS = "abcdefg"
# one cheap test from each kernel test file: the step's command line, not the kernels' coverage
KERNEL_TESTS = (
    "tests/ops/test_kernels.py::test_split_choice_and_tile_size "
    "tests/ops/test_paged_attention.py::test_head_dim_mismatch "
    "tests/ops/test_prefill.py::test_no_queries_at_all"
)


def _tiny_notebook(path: Path) -> None:
    cell = {
        "cell_type": "code",
        "execution_count": None,
        "id": "dry-run",
        "metadata": {},
        "outputs": [],
        "source": ["import kvlab\n", "print(kvlab.ops.runtime.kernel_mode())"],
    }
    path.write_text(
        json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    )


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    if shutil.which("bash") is None or shutil.which("timeout") is None:
        pytest.skip("the GPU check is a bash script that needs timeout (coreutils)")
    pytest.importorskip("nbval")
    tmp = tmp_path_factory.mktemp("gpu-check")
    notebook = tmp / "dry_run.ipynb"
    _tiny_notebook(notebook)
    out = tmp / "out"
    env = {
        **os.environ,
        # `python3` in the script is this interpreter (its environment's nbval, ipykernel, ...)
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "KVLAB_GPU_CHECK_ALLOW_CPU": "1",
        "KVLAB_GPU_CHECK_KERNEL_TESTS": KERNEL_TESTS,
        "KVLAB_GPU_CHECK_NOTEBOOKS": str(notebook),
        "KVLAB_GPU_JUPYTER": str(tmp / "jupyter"),
        "KVLAB_GPU_SITE": str(tmp / "site"),
        "NBVAL_JOBS": "1",
        "OUT": str(out),
        "T_TOTAL": "900",
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "IPYTHONDIR": str(tmp / "ipython"),
    }
    for var in ("TRITON_INTERPRET", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS"):
        env.pop(var, None)
    done = subprocess.run(
        ["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    return done, out


def _summary(out: Path) -> dict:
    lines = (out / "summary.txt").read_text().splitlines()
    steps = {}
    for line in lines:
        m = re.match(r"([a-z])  (ok|FAILED|skipped)(?: \((.*)\))?\s+\d+s$", line)
        if m:
            steps[m.group(1)] = (m.group(2), m.group(3))
    return steps


def test_every_step_ran_ok_or_skipped_with_a_reason(dry_run):
    done, out = dry_run
    assert (out / "summary.txt").exists(), done.stdout[-3000:] + done.stderr[-2000:]
    steps = _summary(out)
    assert sorted(steps) == list(STEPS), steps
    for name, (status, why) in steps.items():
        assert status == "ok" or (status == "skipped" and why), (
            name,
            status,
            why,
            done.stdout[-4000:],
        )
    # the steps that have a CPU path ran it: only the machine's wheels and the GPU timings skip
    assert all(steps[s][0] == "ok" for s in "acdf"), steps
    assert done.returncode == 0, done.stdout[-4000:]


def test_the_grid_rows_have_every_field(dry_run):
    _, out = dry_run
    grid = json.loads((out / "attention.json").read_text())["grid"]
    rows = grid["rows"]
    assert len(rows) == len(grid_shapes(TINY))
    for row in rows:
        assert set(ROW_FIELDS) <= set(row), row
        assert "error" not in row and row["max_error_vs_sdpa"] < 0.02  # bf16, the same tokens
    assert {t["status"] for t in grid["targets"]} <= {"pass", "miss", "not measured"}
    for target in grid["targets"]:
        assert set(TARGET_FIELDS) <= set(target)
    assert len(grid["targets"]) == 3 * len(TINY.heads)


def test_what_comes_back_fits_the_device(dry_run):
    """The device returns at most 8 files from $OUT."""
    _, out = dry_run
    files = [p for p in out.rglob("*") if p.is_file()]
    assert 0 < len(files) <= 8, sorted(p.name for p in files)
    nbval_log = (out / "nbval.log").read_text()
    assert "1 passed" in nbval_log and "--nbval-kernel-name kvlab" in nbval_log
