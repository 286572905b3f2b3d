import os
import subprocess
import sys

from conftest import ROOT, kvlab_cli


def run(*args, env=None):
    return subprocess.run(
        [*kvlab_cli(), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


def test_doctor_passes_here_and_reports_versions():
    out = run("doctor")
    assert out.returncode == 0, out.stdout
    for word in (
        "Python 3.",
        "torch 2.",
        "triton 3.",
        "kernels:",
        "test kernel ran",
        "JupyterLab 4",
    ):
        assert word in out.stdout
    assert "widget extensions: ipywidgets" in out.stdout
    assert "Jupyter kernel 'kvlab'" in out.stdout
    assert out.stdout.rstrip().endswith("all good")


def test_doctor_fails_with_a_fix_when_compiled_kernels_cannot_run():
    out = run("doctor", env={"TRITON_INTERPRET": "0", "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 1
    assert "❌ kernels: TRITON_INTERPRET='0'" in out.stdout
    assert "fix: unset TRITON_INTERPRET" in out.stdout
    assert "1 problem(s) found" in out.stdout


def test_python_dash_m_works_too():
    out = subprocess.run(
        [sys.executable, "-m", "kvlab", "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert out.returncode == 0 and "doctor" in out.stdout and "grade" in out.stdout


def test_labs_command_writes_and_checks(tmp_path):
    assert run("labs", "--check").returncode == 0
    stale = run("labs", "--check", "--out", str(tmp_path))
    assert stale.returncode == 1 and "is missing" in stale.stdout
    written = run("labs", "--out", str(tmp_path))
    assert written.returncode == 0
    for lab in (ROOT / "labs").glob("*.ipynb"):
        assert (tmp_path / lab.name).read_bytes() == lab.read_bytes()
