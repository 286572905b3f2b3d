"""Where kernels run: compiled on a CUDA GPU, or in Triton's interpreter on the CPU.

Triton reads ``TRITON_INTERPRET`` when it is imported (Triton 3.9 builds ``tl.zeros``, ``tl.sum``,
... as JIT functions then), so the choice must be made before anything imports Triton. The
``kvlab`` Jupyter kernel (:mod:`kvlab.course.jupyter_kernel`) makes it when the kernel starts, before any
cell runs; ``import kvlab`` makes it for scripts, and warns when Triton came first. A user's
explicit setting always wins.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
import warnings

INTERPRET_VAR = "TRITON_INTERPRET"
# Exported beside the variable when kvlab set it, so that every descendant process (a notebook
# kernel's `!kvlab grade`, a test's subprocess) can still tell kvlab's choice from the user's.
SET_BY_KVLAB_VAR = "KVLAB_SET_TRITON_INTERPRET"

# Triton's message when a kernel built for the GPU meets its interpreter (imported too early)
TRITON_TOO_EARLY_MARK = "outside of the scope of a kernel"
TRITON_TOO_EARLY_FIX = (
    "restart with the “kvlab (Python 3)” kernel (Kernel ▸ Change Kernel…), which chooses the "
    "interpreter before any cell runs; in a plain Python, `import kvlab` before `import triton`, "
    "or start Python with TRITON_INTERPRET=1 set"
)
TRITON_TOO_EARLY_DETAILS = (
    "Triton was imported before kvlab chose its interpreter, so kernels that use tl.zeros, tl.sum, "
    "… fail in this Python process (Triton says “Cannot call @triton.jit'd outside of the scope "
    "of a kernel”). This is not a mistake in your code.",
    f"fix:      {TRITON_TOO_EARLY_FIX}",
)


class TritonImportedTooEarly(RuntimeWarning):
    """Triton was imported before the interpreter was chosen on a machine without a GPU."""


# Set by configure_triton: how the choice was made in this process.
SET_BY_KVLAB = False  # kvlab set TRITON_INTERPRET itself (a child process should decide afresh)
TRITON_TOO_EARLY = False  # Triton was already imported when kvlab chose the interpreter


def _no_gpu_driver() -> bool:
    """On Linux, no NVIDIA or AMD (ROCm) driver means torch cannot see a GPU: skip importing it."""
    if not sys.platform.startswith("linux") or "torch" in sys.modules:
        return False
    return not (
        os.path.exists("/proc/driver/nvidia")
        or glob.glob("/dev/nvidia*")
        or os.path.exists("/dev/kfd")
    )


def cuda_available() -> bool:
    """True when torch sees a CUDA (or ROCm) GPU; False when torch is missing or CPU-only."""
    if _no_gpu_driver():
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def configure_triton(environ: dict | None = None, has_cuda: bool | None = None) -> str:
    """Set ``TRITON_INTERPRET=1`` when no CUDA GPU is visible, unless the user already chose.

    Returns how kernels will run: ``"compiled"`` or ``"interpreter"``. When this process has
    already imported Triton without the variable, its kernels cannot run in the interpreter any
    more: warn with the fix (once) instead of failing later with Triton's puzzling message.
    """
    global SET_BY_KVLAB, TRITON_TOO_EARLY
    env = os.environ if environ is None else environ
    if INTERPRET_VAR in env:
        inherited = env.get(SET_BY_KVLAB_VAR) == "1" and env[INTERPRET_VAR] == "1"
        if environ is None and inherited:
            SET_BY_KVLAB = True  # an ancestor's kvlab chose it, not the user
    else:
        if has_cuda is None:
            has_cuda = cuda_available()
        if not has_cuda:
            env[INTERPRET_VAR] = "1"
            env[SET_BY_KVLAB_VAR] = "1"
            if environ is None:
                SET_BY_KVLAB = True
                if "triton" in sys.modules and not TRITON_TOO_EARLY:
                    TRITON_TOO_EARLY = True
                    warnings.warn(
                        "kvlab: Triton was imported before kvlab, so on this machine (no CUDA GPU) "
                        "kernels that use tl.zeros, tl.sum, … will fail in Triton's interpreter "
                        "with “Cannot call @triton.jit'd outside of the scope of a kernel”. "
                        f"Fix: {TRITON_TOO_EARLY_FIX}.",
                        TritonImportedTooEarly,
                        stacklevel=3,
                    )
    return kernel_mode(env)


def kernel_mode(environ: dict | None = None) -> str:
    env = os.environ if environ is None else environ
    return "interpreter" if env.get(INTERPRET_VAR, "0") not in ("", "0") else "compiled"


def where_kernels_run(
    environ: dict | None = None, has_cuda: bool | None = None, device: str | None = None
) -> str:
    """Where Triton's kernels run in this process, in words: each lab's first cell prints it, so
    a learner in any kernel (Colab, a hub, VS Code) sees at once what to expect."""
    env = os.environ if environ is None else environ
    if environ is None and TRITON_TOO_EARLY:
        return (
            "kernels cannot run: Triton was imported before kvlab (restart, `import kvlab` first)"
        )
    if environ is None and importlib.util.find_spec("triton") is None:
        return "Triton is not installed (Linux only): Lab 05's kernels cannot run here"
    has_cuda = cuda_available() if has_cuda is None else has_cuda
    setting = f"{INTERPRET_VAR}={env.get(INTERPRET_VAR)}"
    if kernel_mode(env) == "interpreter":
        if has_cuda:
            return f"kernels run in Triton's interpreter ({setting} was set), not on the GPU"
        return "kernels run in Triton's interpreter on the CPU (no CUDA GPU visible)"
    if not has_cuda:
        return (
            f"kernels cannot run: {setting} asks for compiled kernels, but no CUDA GPU is visible"
        )
    if device is None:
        import torch

        device = torch.cuda.get_device_name(0)
    return f"kernels are compiled and run on {device}"


def describe() -> str:
    """One line: kvlab's and torch's versions, and where kernels run (the labs' first cells)."""
    from kvlab._version import __version__

    line = f"kvlab {__version__}"
    try:
        import torch

        line += f", torch {torch.__version__}"
    except ImportError:
        pass
    return f"{line}: {where_kernels_run()}"


def child_environ() -> dict[str, str]:
    """This process's environment as its user set it, for a child (a notebook kernel) that
    must decide where kernels run for itself: without the variable kvlab set here."""
    env = dict(os.environ)
    if SET_BY_KVLAB:
        env.pop(INTERPRET_VAR, None)
        env.pop(SET_BY_KVLAB_VAR, None)
    return env
