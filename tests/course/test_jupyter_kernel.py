"""The `kvlab` Jupyter kernel: what `make lab` registers and JupyterLab starts for every lab.

Lab 05 once broke for every CPU learner because its first cell imported Triton before kvlab
could choose the interpreter; these tests run that cell the way JupyterLab does.
"""

import subprocess
import sys

import pytest
from conftest import LEARNER_ENV, ROOT
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import start_new_kernel

from kvlab.course.doctor import KERNEL_PROBE
from kvlab.course.jupyter_kernel import launches_kvlab

pytestmark = pytest.mark.slow

# Lab 05's old first cell (Triton before kvlab), then a kernel launch: what failed for learners.
# The doctor runs the same probe; it prints "kvlab-probe interpreter 4.0" when it works.
TRITON_FIRST = KERNEL_PROBE + "print('TRITON_INTERPRET', os.environ.get('TRITON_INTERPRET'))\n"


def run_in_kernel(kernel_name: str, code: str, env=None) -> str:
    """Start a kernel as JupyterLab does, run one cell, return what it printed and raised."""
    printed: list[str] = []

    def collect(msg):
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            printed.append(f"{msg['content']['ename']}: {msg['content']['evalue']}")

    km, kc = start_new_kernel(
        kernel_name=kernel_name,
        env=dict(LEARNER_ENV if env is None else env),
        extra_arguments=["--IPKernelApp.log_level=ERROR"],
        startup_timeout=120,
    )
    try:
        kc.execute_interactive(code, timeout=120, output_hook=collect)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return "".join(printed)


def no_gpu_env() -> dict:
    env = {k: v for k, v in LEARNER_ENV.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU learner's case, even on a GPU machine
    return env


def test_the_registered_kernel_starts_through_kvlab():
    spec = KernelSpecManager().get_kernel_spec("kvlab")
    assert launches_kvlab(spec.argv), spec.argv
    assert spec.display_name == "kvlab (Python 3)"
    assert spec.resource_dir.startswith(sys.prefix), "registered for this environment"


def test_triton_imported_first_still_runs_in_the_kvlab_kernel():
    out = run_in_kernel("kvlab", TRITON_FIRST, env=no_gpu_env())
    assert "kvlab-probe interpreter 4.0" in out and "TRITON_INTERPRET 1" in out, out


def test_a_plain_python_kernel_breaks_and_kvlab_says_why():
    """Without kvlab's kernel the same cell fails: the bug is real, and kvlab explains it."""
    code = "import warnings; warnings.simplefilter('always')\n" + TRITON_FIRST
    out = run_in_kernel("python3", code, env=no_gpu_env())
    assert "outside of the scope of a kernel" in out, out
    assert "Triton was imported before kvlab" in out and "kvlab (Python 3)" in out, out


def _notebook_kernels():
    """solutions/conftest.py, the nbval plugin of `make test-notebooks`, as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "kvlab_notebook_kernels", ROOT / "solutions" / "conftest.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_notebook_kernel_that_never_answers_is_started_once_more(monkeypatch):
    import nbval.kernel

    before = nbval.kernel.start_new_kernel
    try:
        kernels = _notebook_kernels()
        assert nbval.kernel.start_new_kernel is kernels.start_in_turn
        tries = []

        def flaky(**kwargs):
            tries.append(kwargs)
            if len(tries) == 1:
                raise RuntimeError("Kernel didn't respond in 60 seconds")
            return "km", "kc"

        monkeypatch.setattr(kernels, "_start_new_kernel", flaky)
        assert kernels.start_in_turn(kernel_name="kvlab") == ("km", "kc") and len(tries) == 2

        def dead(**kwargs):
            tries.append(kwargs)
            raise RuntimeError("Kernel didn't respond in 60 seconds")

        monkeypatch.setattr(kernels, "_start_new_kernel", dead)
        tries.clear()
        with pytest.raises(RuntimeError, match="didn't respond"):
            kernels.start_in_turn(kernel_name="kvlab")
        assert len(tries) == kernels.TRIES
    finally:
        nbval.kernel.start_new_kernel = before


def test_notebook_kernels_start_in_turn_across_processes(tmp_path, monkeypatch):
    """While one process holds the start lock, a start in another waits for it."""
    kernels = _notebook_kernels()
    import nbval.kernel

    nbval.kernel.start_new_kernel = kernels._start_new_kernel  # as it was
    monkeypatch.setattr(kernels, "LOCK", tmp_path / "start.lock")
    released = tmp_path / "released"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, pathlib, sys, time\n"
            "f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True)\n"
            "time.sleep(1); pathlib.Path(sys.argv[2]).touch(); fcntl.flock(f, fcntl.LOCK_UN)\n"
            "time.sleep(30)",
            str(kernels.LOCK),
            str(released),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        monkeypatch.setattr(kernels, "_start_new_kernel", lambda **kw: released.exists())
        assert kernels.start_in_turn(kernel_name="kvlab")  # it waited for the lock
    finally:
        holder.kill()
        holder.wait()
