import subprocess
import sys

import cpu_limit
import nbformat
import pytest
from conftest import LEARNER_ENV, ROOT

from kvlab.ops.runtime import configure_triton, describe, kernel_mode, where_kernels_run


def test_interpreter_is_chosen_without_a_gpu():
    env = {}
    assert configure_triton(env, has_cuda=False) == "interpreter"
    assert env == {"TRITON_INTERPRET": "1", "KVLAB_SET_TRITON_INTERPRET": "1"}


def test_gpu_means_compiled():
    env = {}
    assert configure_triton(env, has_cuda=True) == "compiled"
    assert "TRITON_INTERPRET" not in env


def test_an_explicit_user_setting_wins():
    env = {"TRITON_INTERPRET": "0"}
    assert configure_triton(env, has_cuda=False) == "compiled"
    assert env == {"TRITON_INTERPRET": "0"}
    assert kernel_mode({"TRITON_INTERPRET": "1"}) == "interpreter"


def test_import_kvlab_sets_the_variable_before_any_kernel_exists():
    env = {k: v for k, v in LEARNER_ENV.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU visible, even on a GPU machine
    code = "import os, kvlab; print(os.environ.get('TRITON_INTERPRET'), kvlab.KERNEL_MODE)"
    out = cpu_limit.run(
        [sys.executable, "-c", code], cpu=120, env=env, capture_output=True, text=True
    )
    assert out.stdout.split() == ["1", "interpreter"], out.stderr


def _python(code: str, **extra) -> subprocess.CompletedProcess:
    env = {k: v for k, v in LEARNER_ENV.items() if k != "TRITON_INTERPRET"}
    env.update(CUDA_VISIBLE_DEVICES="", **extra)
    return cpu_limit.run(
        [sys.executable, "-c", code], cpu=120, env=env, capture_output=True, text=True
    )


def test_triton_imported_before_kvlab_warns_with_the_fix():
    code = (
        "import triton, kvlab, kvlab.ops.runtime as r\n"
        "print(r.TRITON_TOO_EARLY, r.SET_BY_KVLAB)\n"
        "from kvlab.course.doctor import check_import_order\n"
        "f = check_import_order(); print(f.ok, f.fix)"
    )
    out = _python(code)
    assert out.stdout.splitlines()[0] == "True True", out.stderr
    assert (
        "TritonImportedTooEarly" in out.stderr and "Triton was imported before kvlab" in out.stderr
    )
    assert "kvlab (Python 3)" in out.stderr  # the warning says how to fix it
    assert out.stdout.splitlines()[1].startswith("False restart with the")


def test_kvlab_first_is_quiet_and_a_user_setting_is_never_blamed():
    assert _python("import kvlab, triton").stderr == ""
    out = _python(
        "import triton, kvlab, kvlab.ops.runtime as r; print(r.TRITON_TOO_EARLY)",
        TRITON_INTERPRET="1",
    )
    assert out.stdout.strip() == "False" and out.stderr == ""


def test_child_environ_drops_only_what_kvlab_set():
    code = "import os, kvlab.ops.runtime as r; print(os.environ.get('TRITON_INTERPRET'), r.child_environ().get('TRITON_INTERPRET'))"
    assert _python(code).stdout.split() == ["1", "None"]
    assert _python(code, TRITON_INTERPRET="1").stdout.split() == ["1", "1"]


def test_a_grandchild_still_knows_kvlab_chose_the_interpreter():
    """`!kvlab grade` in a notebook: the kernel's kvlab set the variable, the grader inherits it,
    and must still hand the notebooks it runs the user's environment."""
    grandchild = (
        "import kvlab.ops.runtime as r; e = r.child_environ(); "
        "print(r.SET_BY_KVLAB, e.get('TRITON_INTERPRET'), e.get('KVLAB_SET_TRITON_INTERPRET'))"
    )
    code = f"import kvlab, subprocess, sys; subprocess.run([sys.executable, '-c', {grandchild!r}])"
    assert _python(code).stdout.split() == ["True", "None", "None"]


def test_kernels_are_described_in_words():
    assert where_kernels_run({"TRITON_INTERPRET": "1"}, has_cuda=False) == (
        "kernels run in Triton's interpreter on the CPU (no CUDA GPU visible)"
    )
    assert where_kernels_run({}, has_cuda=True, device="NVIDIA H200") == (
        "kernels are compiled and run on NVIDIA H200"
    )
    interpreted_on_gpu = where_kernels_run({"TRITON_INTERPRET": "1"}, has_cuda=True)
    assert "interpreter (TRITON_INTERPRET=1 was set), not on the GPU" in interpreted_on_gpu
    cannot = where_kernels_run({"TRITON_INTERPRET": "0"}, has_cuda=False)
    assert cannot.startswith("kernels cannot run: TRITON_INTERPRET=0 asks for compiled kernels")


def test_describe_is_one_line_with_the_versions():
    import torch

    import kvlab

    line = describe()
    assert "\n" not in line
    assert line.startswith(f"kvlab {kvlab.__version__}, torch {torch.__version__}: kernels ")


def _first_code_cell(path):
    return next(c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")


@pytest.mark.parametrize("path", sorted((ROOT / "solutions").glob("*.ipynb")), ids=lambda p: p.stem)
def test_every_lab_imports_kvlab_first_and_says_where_kernels_run(path):
    """In a plain `python3` kernel kvlab must choose Triton's interpreter before Triton loads."""
    lines = [line for line in _first_code_cell(path).source.splitlines() if line.strip()]
    assert lines[0].startswith("import kvlab  # first"), path.name
    assert lines[-1].startswith("print(kvlab.ops.runtime.describe())"), path.name
