"""``kvlab doctor``: is this environment ready for the course? One line per finding, a fix per problem."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import sys
from dataclasses import dataclass

from kvlab.core import files
from kvlab.ops import runtime
from kvlab.ops.runtime import INTERPRET_VAR, cuda_available, kernel_mode

MIN_TRITON = (3, 6)


@dataclass
class Finding:
    ok: bool
    what: str
    fix: str | None = None


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _major_minor(version: str) -> tuple[int, int]:
    parts = version.split("+")[0].split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def _or_make(fix: str, target: str) -> str:
    """A fix, with the Makefile's way beside it in a git checkout (a wheel has no Makefile)."""
    return f"{fix}  (or: make {target})" if files.checkout_root() else fix


def check_python() -> Finding:
    v = sys.version_info
    text = f"Python {platform.python_version()} ({sys.executable})"
    if v < (3, 10):
        return Finding(False, text, _or_make("use Python 3.11", "lab PYTHON=python3.11"))
    return Finding(True, text)


def check_course_files() -> Finding:
    """The labs, traces and tiny model: a checkout's folders, or the bundle a wheel carries."""
    where = files.course_root()
    try:
        labs = files.lab_notebooks()
        traces = sorted(files.traces_dir().glob("*.csv"))
        weights = files.tiny_model_dir() / "weights.pt"
        if not weights.is_file():
            raise FileNotFoundError(f"{weights} is missing")
    except FileNotFoundError as e:
        fix = (
            "git checkout -- labs assets"
            if files.checkout_root()
            else "pip install --force-reinstall kvlab-*.whl"
        )
        return Finding(False, f"course files: {e}", fix)
    how = "this checkout" if where[0] == "checkout" else "bundled in the package"
    return Finding(
        True,
        f"course files: {len(labs)} labs, {len(traces)} traces, the tiny model ({how}: {where[1]})",
    )


def check_torch() -> Finding:
    try:
        import torch
    except ImportError:
        return Finding(
            False, "torch is not installed", _or_make("pip install torch==2.13.0", "install")
        )
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
    return Finding(True, f"torch {torch.__version__} ({build})")


def check_triton() -> Finding:
    version = _version("triton")
    if version is None:
        if platform.system() != "Linux":
            return Finding(True, "triton: no wheels for this OS; Lab 05's kernels need Linux")
        return Finding(False, "triton is not installed", "pip install 'triton>=3.6'")
    if _major_minor(version) < MIN_TRITON:
        return Finding(False, f"triton {version} is too old", "pip install 'triton>=3.6'")
    return Finding(True, f"triton {version}")


def check_kernel_mode(has_cuda: bool | None = None) -> Finding:
    has_cuda = cuda_available() if has_cuda is None else has_cuda
    mode = kernel_mode()
    setting = os.environ.get(INTERPRET_VAR)
    if mode == "compiled" and not has_cuda:
        return Finding(
            False,
            f"kernels: {INTERPRET_VAR}={setting!r} asks for compiled kernels, but no CUDA GPU is visible",
            f"unset {INTERPRET_VAR} (kvlab then picks the interpreter) or set {INTERPRET_VAR}=1",
        )
    if mode == "compiled":
        import torch

        return Finding(True, f"kernels: compiled on {torch.cuda.get_device_name(0)}")
    where = "GPU tensors" if has_cuda else "CPU, no CUDA GPU visible"
    return Finding(True, f"kernels: Triton interpreter ({INTERPRET_VAR}={setting}; {where})")


def check_import_order() -> Finding:
    """In this process (a notebook calling ``kvlab.course.doctor.main()``, a script): was Triton imported
    before kvlab could choose the interpreter?"""
    if runtime.TRITON_TOO_EARLY:
        return Finding(
            False,
            "Triton was imported before kvlab in this Python: its kernels cannot run in the interpreter",
            runtime.TRITON_TOO_EARLY_FIX,
        )
    return Finding(True, "import order: Triton was not imported before kvlab chose where it runs")


def check_test_kernel(has_cuda: bool) -> Finding:
    """Run a tiny Triton kernel the way the labs will."""
    if kernel_mode() == "compiled" and not has_cuda:
        return Finding(True, "test kernel: skipped (no device to compile for)")
    try:
        import torch
        import triton
        import triton.language as tl
    except ImportError:
        return Finding(True, "test kernel: skipped (torch or triton missing)")

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0) + tl.zeros([BLOCK], tl.float32)
        # tl.zeros and tl.sum are what an early `import triton` breaks in the interpreter
        tl.store(x_ptr + offs, x + 1.0 + tl.sum(x, axis=0) * 0.0, mask=mask)

    device = "cpu" if kernel_mode() == "interpreter" else "cuda"
    try:
        x = torch.arange(5, dtype=torch.float32, device=device)
        add_one[(1,)](x, 5, BLOCK=8)
        ok = x.cpu().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    except Exception as e:
        message = " ".join(str(e).split())[:160]
        too_early = runtime.TRITON_TOO_EARLY_MARK in str(e)
        return Finding(
            False,
            f"test kernel failed: {type(e).__name__}: {message}",
            runtime.TRITON_TOO_EARLY_FIX
            if too_early
            else "reinstall triton to match torch (pip install --force-reinstall 'triton>=3.6')",
        )
    if not ok:
        return Finding(
            False,
            "test kernel ran but gave a wrong answer",
            "report this with `kvlab doctor` output",
        )
    return Finding(True, f"test kernel ran on {device}")


def _labextension(name: str) -> bool:
    try:
        from jupyter_core.paths import jupyter_path
    except ImportError:
        return False
    return any(os.path.isdir(os.path.join(p, name)) for p in jupyter_path("labextensions"))


def check_jupyter() -> list[Finding]:
    lab = _version("jupyterlab")
    findings = [
        Finding(True, f"JupyterLab {lab}")
        if lab
        else Finding(
            False, "JupyterLab is not installed", _or_make("pip install 'jupyterlab>=4'", "lab")
        )
    ]
    missing = [
        dist
        for dist, ext in (
            ("ipywidgets", "@jupyter-widgets/jupyterlab-manager"),
            ("anywidget", "anywidget"),
        )
        if not (_version(dist) and _labextension(ext))
    ]
    if missing:
        findings.append(
            Finding(
                False,
                f"widget extension missing: {', '.join(missing)}",
                "pip install ipywidgets anywidget  (in the environment that runs JupyterLab)",
            )
        )
    else:
        findings.append(
            Finding(
                True,
                f"widget extensions: ipywidgets {_version('ipywidgets')}, anywidget {_version('anywidget')}",
            )
        )
    return findings


KERNEL_FIX = "kvlab kernel  (registers it for this environment; `kvlab start` does it too)"

# Run in a fresh `kvlab` kernel: Triton imported before kvlab, as Lab 05 once did, then a launch.
KERNEL_PROBE = """
import os, triton, triton.language as tl, torch
import kvlab
@triton.jit
def _add_one(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs) + tl.zeros([BLOCK], tl.float32) + 1.0
    tl.store(x_ptr + offs, x + tl.sum(x, axis=0) - BLOCK)  # tl.zeros, tl.sum: built at import
interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
x = torch.zeros(4, device="cpu" if interpret else "cuda")
_add_one[(1,)](x, BLOCK=4)
print("kvlab-probe", "interpreter" if interpret else "compiled", x.sum().item())
"""


def check_kernel_spec(has_cuda: bool) -> tuple[Finding, bool]:
    """The registered `kvlab` kernel, and whether there is one to start."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

        spec = KernelSpecManager().get_kernel_spec("kvlab")
    except ImportError:
        return Finding(
            False,
            "Jupyter kernel 'kvlab': Jupyter is not installed",
            _or_make("pip install jupyterlab ipykernel", "install"),
        ), False
    except NoSuchKernel:
        return Finding(False, "Jupyter kernel 'kvlab' is not registered", KERNEL_FIX), False
    from kvlab.course.jupyter_kernel import launches_kvlab

    if not launches_kvlab(spec.argv):
        plain = f"Jupyter kernel 'kvlab' ({spec.resource_dir}) starts plain ipykernel"
        if has_cuda:  # kernels compile whatever the import order: harmless here
            return Finding(True, f"{plain} (fine with a GPU; `kvlab kernel` updates it)"), True
        return Finding(
            False,
            f"{plain}, so a notebook that imports Triton before kvlab cannot use the interpreter",
            KERNEL_FIX,
        ), True
    return Finding(True, f"Jupyter kernel 'kvlab' ({spec.resource_dir})"), True


def check_kernel_start(timeout: float = 120) -> Finding:
    """Start the registered `kvlab` kernel as JupyterLab does and run a Triton kernel in it, with
    Triton imported before anything else."""
    try:
        from jupyter_client.manager import start_new_kernel
    except ImportError:
        return Finding(True, "kernel start: skipped (Jupyter is not installed)")
    printed: list[str] = []
    errors: list[str] = []

    def collect(msg):
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            errors.append(f"{msg['content']['ename']}: {msg['content']['evalue']}")

    try:
        km, kc = start_new_kernel(
            kernel_name="kvlab",
            env=runtime.child_environ(),
            startup_timeout=timeout,
            extra_arguments=["--IPKernelApp.log_level=ERROR"],
        )
    except Exception as e:
        return Finding(
            False, f"the kvlab kernel does not start: {type(e).__name__}: {e}", KERNEL_FIX
        )
    try:
        kc.execute_interactive(KERNEL_PROBE, timeout=timeout, output_hook=collect)
    except Exception as e:
        errors.append(f"{type(e).__name__}: {e}")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    words = " ".join(printed).split()
    if len(words) >= 3 and words[0] == "kvlab-probe" and words[2] == "4.0":
        return Finding(
            True, f"kvlab kernel: starts, runs Triton ({words[1]}) even when imported first"
        )
    text = " ".join(" ".join(errors or printed).split())
    fix = runtime.TRITON_TOO_EARLY_FIX if runtime.TRITON_TOO_EARLY_MARK in text else KERNEL_FIX
    return Finding(False, f"kvlab kernel: a Triton test failed: {text[:240]}", fix)


def diagnose(start_kernel: bool = True) -> list[Finding]:
    """Every finding; ``start_kernel=False`` skips starting the `kvlab` kernel (a few seconds)."""
    has_cuda = cuda_available()
    mode = check_kernel_mode(has_cuda)
    findings = [check_python(), check_course_files(), check_torch(), check_triton(), mode]
    if runtime.TRITON_TOO_EARLY:  # only ever in a notebook or script that imported Triton first
        findings.append(check_import_order())
    findings += [check_test_kernel(has_cuda), *check_jupyter()]
    spec, registered = check_kernel_spec(has_cuda)
    findings.append(spec)
    # the probe needs Triton, and would only repeat a kernel-mode problem already reported
    if start_kernel and registered and mode.ok and _version("triton") is not None:
        findings.append(check_kernel_start())
    return findings


def main(start_kernel: bool = True) -> int:
    """Print the findings; exit status 1 when any is a problem. Also callable in a notebook
    (``kvlab.course.doctor.main()``), where it checks that notebook's own Python too."""
    from kvlab._version import __version__

    findings = diagnose(start_kernel)
    print(f"kvlab doctor (kvlab {__version__})")
    for f in findings:
        print(f"  {'✔' if f.ok else '✘'} {f.what}")
        if f.fix:
            print(f"     fix: {f.fix}")
    problems = sum(not f.ok for f in findings)
    print("all good" if not problems else f"{problems} problem(s) found")
    return 1 if problems else 0
