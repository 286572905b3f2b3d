"""Keep learner code from taking the check cell down: time limits and captured output."""

from __future__ import annotations

import contextlib
import ctypes
import io
import signal
import threading


class CheckTimeout(BaseException):
    """Raised inside learner code that runs past its time limit.

    A BaseException, so a learner's ``except Exception`` cannot swallow it.
    """


@contextlib.contextmanager
def time_limit(seconds: float):
    """Interrupt the block after ``seconds`` with :class:`CheckTimeout`.

    In the main thread a SIGALRM timer interrupts even sleeping code. Elsewhere (or where SIGALRM
    does not exist) a timer thread raises the exception asynchronously in the running thread, which
    stops pure-Python loops.
    """
    if seconds is None or seconds <= 0:
        yield
        return
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):

        def on_alarm(signum, frame):
            raise CheckTimeout(seconds)

        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        return

    target = threading.get_ident()
    fired = threading.Event()
    done = threading.Event()

    def interrupt():
        if not done.is_set():
            fired.set()
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(target), ctypes.py_object(CheckTimeout)
            )

    timer = threading.Timer(seconds, interrupt)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        done.set()
        timer.cancel()
        if fired.is_set():  # the exception may not have been delivered yet: withdraw it
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(target), None)


class BoundedBuffer(io.TextIOBase):
    """A text sink that keeps the first ``keep`` characters and counts the rest."""

    def __init__(self, keep: int = 2000):
        self.keep = keep
        self.parts: list[str] = []
        self.kept = 0
        self.total = 0

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        s = str(s)
        self.total += len(s)
        if self.kept < self.keep:
            piece = s[: self.keep - self.kept]
            self.parts.append(piece)
            self.kept += len(piece)
        return len(s)

    def text(self) -> str:
        return "".join(self.parts)


@contextlib.contextmanager
def captured_output(buffer: BoundedBuffer):
    """Send everything printed (stdout and stderr) to ``buffer``."""
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        yield buffer


class ChildCrashed(Exception):
    """The child process running a check died without reporting (a segfault, an abort)."""

    def __init__(self, how: str):
        super().__init__(how)
        self.how = how


def can_fork() -> bool:
    """Forking is safe on Linux while no GPU context exists (the interpreter runs on the CPU)."""
    import os
    import sys

    if not (sys.platform.startswith("linux") and hasattr(os, "fork")):
        return False
    torch = sys.modules.get("torch")
    return not (torch is not None and torch.cuda.is_initialized())


def in_child_process(func, deadline: float):
    """Run ``func()`` in a forked child and return its (picklable) result.

    Code that corrupts memory (an unmasked load or store in Triton's interpreter writes outside a
    tensor) then kills only the child: :class:`ChildCrashed` says how. A child still running
    after ``deadline`` seconds is killed (:class:`CheckTimeout`).
    """
    import faulthandler
    import os
    import pickle
    import select
    import time

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, send the pickled result, leave without cleanup
        status = 1
        try:
            os.close(read_end)
            quiet = os.open(os.devnull, os.O_WRONLY)  # a crash report would land on the
            os.dup2(quiet, 1)  # server's terminal; what the code prints is captured anyway
            os.dup2(quiet, 2)
            faulthandler.disable()
            try:
                import torch

                torch.set_num_threads(1)  # OpenMP's pool does not survive a fork
            except ImportError:
                pass
            payload = pickle.dumps(func())
            with os.fdopen(write_end, "wb") as pipe:
                pipe.write(payload)
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    chunks, end = [], time.monotonic() + deadline
    try:
        while True:
            left = end - time.monotonic()
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                raise CheckTimeout(deadline)
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        raise ChildCrashed(signal.Signals(sig).name if sig in signal.valid_signals() else str(sig))
    if os.WEXITSTATUS(status) != 0 or not chunks:
        raise ChildCrashed(f"exit status {os.WEXITSTATUS(status)}")
    return pickle.loads(b"".join(chunks))
