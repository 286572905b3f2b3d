import json
import sys

import cpu_limit
import pytest
from conftest import LEARNER_ENV, ROOT, kvlab_cli


def run(*args, env=None):
    return cpu_limit.run(
        [*kvlab_cli(), *args],
        cpu=300,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**LEARNER_ENV, **(env or {})},
    )


def test_doctor_passes_here_and_reports_versions():
    out = run("doctor")
    assert out.returncode == 0, out.stdout
    for word in (
        "Python 3.",
        f"course files: {len(list((ROOT / 'labs').glob('*.ipynb')))} labs, 2 traces, the tiny model (this checkout",
        "torch 2.",
        "triton 3.",
        "kernels:",
        "test kernel ran",
        "JupyterLab 4",
    ):
        assert word in out.stdout
    assert "widget extensions: ipywidgets" in out.stdout
    assert "Jupyter kernel 'kvlab'" in out.stdout
    assert "kvlab kernel: starts, runs Triton" in out.stdout  # with Triton imported first
    quick = run("doctor", "--quick")
    assert quick.returncode == 0 and "kvlab kernel: starts" not in quick.stdout
    assert out.stdout.rstrip().endswith("all good")


def test_doctor_fails_with_a_fix_when_compiled_kernels_cannot_run():
    out = run("doctor", env={"TRITON_INTERPRET": "0", "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 1
    assert "✘ kernels: TRITON_INTERPRET='0'" in out.stdout
    assert "fix: unset TRITON_INTERPRET" in out.stdout
    assert "1 problem(s) found" in out.stdout


def test_kernel_command_registers_the_launcher(tmp_path):
    out = run("kernel", "--prefix", str(tmp_path))
    assert out.returncode == 0, out.stderr
    spec = json.loads((tmp_path / "share/jupyter/kernels/kvlab/kernel.json").read_text())
    assert spec["argv"][1:] == ["-m", "kvlab.course.jupyter_kernel", "-f", "{connection_file}"]
    assert spec["display_name"] == "kvlab (Python 3)"


def test_doctor_flags_a_plain_kernelspec(tmp_path):
    """A 'kvlab' kernel registered the old way (plain ipykernel) lets Lab 05's import order break."""
    plain = tmp_path / "share/jupyter/kernels/kvlab"
    plain.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (plain / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "kvlab", "language": "python"})
    )
    out = run("doctor", env={"JUPYTER_PATH": str(tmp_path / "share/jupyter")})
    assert out.returncode == 1
    assert "starts plain ipykernel" in out.stdout and "fix: kvlab kernel" in out.stdout
    # and the kernel start shows the failure a learner would meet, with the fix for it
    assert (
        "kvlab kernel: a Triton test failed" in out.stdout and "outside of the scope" in out.stdout
    )
    assert "fix: restart with the “kvlab (Python 3)” kernel" in out.stdout


def test_python_dash_m_works_too():
    out = cpu_limit.run(
        [sys.executable, "-m", "kvlab", "--help"], cpu=120, capture_output=True, text=True, cwd=ROOT
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


def test_grade_help_says_what_kernel_defaults_to_as_the_code_does(capsys):
    """No --kernel: the sandboxed judge grades (kernel_name None means judged), as the README
    says; the help once said "kvlab's kernel on this Python"."""
    import inspect

    from kvlab.cli import build_parser
    from kvlab.grading import notebook

    with pytest.raises(SystemExit):
        build_parser().parse_args(["grade", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default: none: the sandboxed judge" in text
    assert "kvlab's kernel on this Python" not in text
    assert build_parser().parse_args(["grade", "x.ipynb"]).kernel is None
    assert "judged = kernel_name is None" in inspect.getsource(notebook)
