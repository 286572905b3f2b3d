"""`make test-notebooks` (nbval over these notebooks, ``pytest -n 2``): kernels start in turn.

jupyter_client chooses a kernel's five ports by binding to port 0 and letting go, and the kernel
binds them a second later; two kernels started at once by two test processes can choose the same
port, and the one that loses never answers ("Kernel didn't respond in 60 seconds"; a known race,
jupyter/jupyter_client#487). A lock file held from the start until the kernel answers makes the
starts take turns; the kernels then run side by side as before. A port taken meanwhile by any
other process is the one case left: that start is tried once more, with new ports.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import nbval.kernel

try:
    import fcntl
except ImportError:  # not POSIX: the starts are not serialised (the retry still holds)
    fcntl = None

LOCK = Path(tempfile.gettempdir()) / f"kvlab-kernel-start-{os.getuid() if fcntl else 0}.lock"
TRIES = 2
_start_new_kernel = nbval.kernel.start_new_kernel


@contextlib.contextmanager
def _in_turn():
    if fcntl is None:
        yield
        return
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process ends
        yield


def start_in_turn(*args, **kwargs):
    """nbval's ``start_new_kernel``, one start at a time across processes, tried twice."""
    for attempt in range(1, TRIES + 1):
        try:
            with _in_turn():
                return _start_new_kernel(*args, **kwargs)
        except RuntimeError:  # it never answered (nbval has shut it down)
            if attempt == TRIES:
                raise


nbval.kernel.start_new_kernel = start_in_turn
