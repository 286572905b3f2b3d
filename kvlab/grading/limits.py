"""Keep learner code from taking the check cell down: time limits, captured output, and (for code
that can crash the process) a forked child per check."""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import io
import os
import pickle
import selectors
import signal
import sys
import threading
import time
import warnings


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

    def __init__(self, how: str, signalled: bool):
        super().__init__(how)
        self.how = how
        self.signalled = signalled


def can_fork() -> bool:
    """Forking is safe on Linux while no GPU context exists (the interpreter runs on the CPU)."""
    if not (sys.platform.startswith("linux") and hasattr(os, "fork")):
        return False
    torch = sys.modules.get("torch")
    return not (torch is not None and torch.cuda.is_initialized())


def in_child_process(func, deadline: float):
    """Run ``func()`` in a forked child and return its (picklable) result.

    Code that corrupts memory (an unmasked load or store in Triton's interpreter writes outside a
    tensor) then kills only the child: :class:`ChildCrashed` says how. A child still running
    after ``deadline`` seconds is killed (:class:`CheckTimeout`), and so is one whose parent stops
    waiting for any other reason (an interrupt), so no child outlives the call.
    """
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12 warns about forking a threaded process (Jupyter's kernel is one); the child
        # only runs the check and leaves with os._exit, touching none of the other threads' state.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        _child(func, read_end, write_end)
    os.close(write_end)
    chunks, finished = [], False
    end = time.monotonic() + deadline
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(read_end, selectors.EVENT_READ)
            while True:
                left = end - time.monotonic()
                if left <= 0 or not selector.select(left):
                    raise CheckTimeout(deadline)
                chunk = os.read(read_end, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        finished = True
    finally:
        os.close(read_end)
        if not finished:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        status = _reap(pid)
    if status is not None and os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.valid_signals() else f"signal {sig}"
        raise ChildCrashed(name, signalled=True)
    if not chunks:
        code = os.WEXITSTATUS(status) if status is not None else "unknown"
        raise ChildCrashed(f"exit status {code}", signalled=False)
    return pickle.loads(b"".join(chunks))


def _child(func, read_end: int, write_end: int):
    """In the forked child: run, send the pickled result, leave without any cleanup."""
    status = 1
    try:
        os.close(read_end)
        quiet = os.open(os.devnull, os.O_WRONLY)  # a crash report would land on the server's
        os.dup2(quiet, 1)  # terminal; what the code prints is captured by the check anyway
        os.dup2(quiet, 2)
        faulthandler.disable()
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(1)  # OpenMP's pool does not survive a fork
        payload = pickle.dumps(func())
        with os.fdopen(write_end, "wb") as pipe:
            pipe.write(payload)
        status = 0
    finally:
        os._exit(status)


def _reap(pid: int):
    """The child's wait status, or None where SIGCHLD is ignored and the system reaped it."""
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return None
