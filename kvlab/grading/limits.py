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
