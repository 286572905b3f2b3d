"""Where kernels run: compiled on a CUDA GPU, or in Triton's interpreter on the CPU.

Triton reads ``TRITON_INTERPRET`` when a ``@triton.jit`` function is defined, so the choice must be
made before any kernel exists. ``import kvlab`` makes it; a user's explicit setting always wins.
"""

from __future__ import annotations

import glob
import os
import sys

INTERPRET_VAR = "TRITON_INTERPRET"


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

    Returns how kernels will run: ``"compiled"`` or ``"interpreter"``.
    """
    env = os.environ if environ is None else environ
    if INTERPRET_VAR not in env:
        if has_cuda is None:
            has_cuda = cuda_available()
        if not has_cuda:
            env[INTERPRET_VAR] = "1"
    return kernel_mode(env)


def kernel_mode(environ: dict | None = None) -> str:
    env = os.environ if environ is None else environ
    return "interpreter" if env.get(INTERPRET_VAR, "0") not in ("", "0") else "compiled"
