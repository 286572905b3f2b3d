"""``kvlab doctor``: is this environment ready for the course? One line per finding, a fix per problem."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import sys
from dataclasses import dataclass

from kvlab.runtime import INTERPRET_VAR, cuda_available, kernel_mode

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


def check_python() -> Finding:
    v = sys.version_info
    text = f"Python {platform.python_version()} ({sys.executable})"
    if v < (3, 10):
        return Finding(False, text, "use Python 3.11 (make lab PYTHON=python3.11)")
    return Finding(True, text)


def check_torch() -> Finding:
    try:
        import torch
    except ImportError:
        return Finding(
            False, "torch is not installed", "pip install torch==2.13.0  (or: make install)"
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
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)

    device = "cpu" if kernel_mode() == "interpreter" else "cuda"
    try:
        x = torch.arange(5, dtype=torch.float32, device=device)
        add_one[(1,)](x, 5, BLOCK=8)
        ok = x.cpu().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    except Exception as e:
        message = " ".join(str(e).split())[:160]
        return Finding(
            False,
            f"test kernel failed: {type(e).__name__}: {message}",
            "reinstall triton to match torch (pip install --force-reinstall 'triton>=3.6')",
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
            False, "JupyterLab is not installed", "pip install 'jupyterlab>=4'  (or: make lab)"
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


def check_kernel_spec() -> Finding:
    try:
        from jupyter_client.kernelspec import KernelSpecManager

        specs = KernelSpecManager().find_kernel_specs()
    except ImportError:
        specs = {}
    fix = 'python -m ipykernel install --sys-prefix --name kvlab --display-name "kvlab (Python 3)"'
    if "kvlab" not in specs:
        return Finding(False, "Jupyter kernel 'kvlab' is not registered", fix)
    return Finding(True, f"Jupyter kernel 'kvlab' ({specs['kvlab']})")


def diagnose() -> list[Finding]:
    has_cuda = cuda_available()
    return [
        check_python(),
        check_torch(),
        check_triton(),
        check_kernel_mode(has_cuda),
        check_test_kernel(has_cuda),
        *check_jupyter(),
        check_kernel_spec(),
    ]


def main() -> int:
    import kvlab  # noqa: F401  (chooses the kernel mode before the test kernel is defined)

    findings = diagnose()
    print(f"kvlab doctor (kvlab {kvlab.__version__})")
    for f in findings:
        print(f"  {'✅' if f.ok else '❌'} {f.what}")
        if f.fix:
            print(f"     fix: {f.fix}")
    problems = sum(not f.ok for f in findings)
    print("all good" if not problems else f"{problems} problem(s) found")
    return 1 if problems else 0
