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

    A BaseException, so a learner's ``except Exception`` cannot swallow it. ``seconds`` is the
    limit; ``kind`` says which: ``"cpu"`` (CPU-seconds, :func:`cpu_limit`), ``"wall"`` (the far
    backstop of :func:`cpu_limit`, or :func:`time_limit`).
    """

    def __init__(self, seconds=None, kind: str = "wall"):
        super().__init__(seconds)
        self.seconds = seconds
        self.kind = kind


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
            raise CheckTimeout(seconds, "wall")

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


# --- CPU time ---------------------------------------------------------------------------------

WALL_BACKSTOP = (
    10.0  # a CPU-time limit of N also stops code that has waited N * this, computing nothing
)
_clock: list = [time.process_time]  # the CPU-seconds clock cpu_limit reads (the judge sets its own)
_INTERRUPT = getattr(signal, "SIGUSR2", None)


def cpu_seconds() -> float:
    """The CPU-seconds :func:`cpu_limit` counts now: this process's own by default; under
    ``kvlab grade``'s judge, the judge's and the learner's process tree's (see :func:`counting`)."""
    return _clock[-1]()


@contextlib.contextmanager
def counting(clock):
    """Within the block, :func:`cpu_limit` reads ``clock()`` (CPU-seconds, never decreasing)."""
    _clock.append(clock)
    try:
        yield
    finally:
        _clock.remove(clock)


class _Limit:
    def __init__(self, seconds: float, backstop: float):
        self.seconds = seconds
        self.backstop = backstop
        self.kind: str | None = None  # set when it fires
        self.done = threading.Event()


_active: list[_Limit] = []


def _on_interrupt(signum, frame):
    for limit in _active:
        if limit.kind is not None and not limit.done.is_set():
            raise CheckTimeout(limit.seconds, limit.kind)


@contextlib.contextmanager
def cpu_limit(seconds: float | None, clock=None, backstop: float = WALL_BACKSTOP, wall=None):
    """Interrupt the block with :class:`CheckTimeout` once it has used ``seconds`` CPU-seconds
    (``clock``, by default :func:`cpu_seconds`) and ``seconds`` of wall time have passed, or
    (``kind="wall"``) once ``backstop * seconds`` of wall time have passed whatever it used.

    CPU time, not wall time, so that a busy machine (where a process waits for a core) costs no
    check: the same code uses the same CPU-seconds on an idle machine and on one running ten
    other jobs. The wall time must pass too, so that code using many cores at once is never held
    to less time than a wall-clock limit gave it. The backstop is for code that waits without
    computing (``time.sleep``, a lock, ``input()``). ``wall`` (seconds, monotonic) is for tests.

    A watcher thread reads the clock, more often as the limit nears, and interrupts the thread
    that runs the block: by a signal in the main thread (which breaks a blocking read of the
    judge's pipe as SIGALRM does, without taking SIGALRM's one timer from :func:`time_limit`),
    elsewhere by an exception set asynchronously (pure-Python loops only).
    """
    if seconds is None or seconds <= 0:
        yield
        return
    read = clock or cpu_seconds
    now = wall or time.monotonic
    limit = _Limit(seconds, backstop * seconds)
    target = threading.get_ident()
    main = threading.current_thread() is threading.main_thread() and _INTERRUPT is not None
    start_cpu, start_wall = read(), now()

    def watch():
        while not limit.done.is_set():
            used, waited = read() - start_cpu, now() - start_wall
            if waited >= limit.backstop:
                limit.kind = "wall"
            elif used >= seconds and waited >= seconds:
                limit.kind = "cpu"
            if limit.kind is not None:
                if main:
                    signal.pthread_kill(target, _INTERRUPT)
                else:
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(
                        ctypes.c_ulong(target), ctypes.py_object(CheckTimeout)
                    )
                return
            left = min(seconds - used, limit.backstop - waited, seconds - waited)
            limit.done.wait(min(1.0, max(0.02, left / 4)))

    previous = signal.signal(_INTERRUPT, _on_interrupt) if main else None
    _active.append(limit)
    watcher = threading.Thread(target=watch, name="kvlab-cpu-limit", daemon=True)
    watcher.start()
    try:
        yield limit
    finally:
        limit.done.set()
        watcher.join()
        _active.remove(limit)
        if main:
            signal.signal(_INTERRUPT, previous)
        elif limit.kind is not None:  # not delivered yet: withdraw it
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(target), None)


def process_tree_cpu(pid: int) -> float:
    """CPU-seconds used by a process and everything it started (those still running, and those
    that ended and were waited for); 0.0 once it is gone."""
    try:
        import psutil

        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except Exception:
        return 0.0
    total = 0.0
    for p in tree:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except Exception:
            pass
    return total


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


class LearnerClock:
    """The CPU-seconds a judged check uses: the judge's own (this process: kvlab's reference
    and the check's work) and the learner's process tree's (their code, across the channel).

    Never decreasing, across restarts of the learner's process: what an ended process used is
    kept, and what a new one uses before :meth:`follow` (its start, the cells replayed into it)
    is not counted, so a crash in one check does not eat the next one's time.
    """

    def __init__(self):
        self.spent = 0.0  # counted CPU-seconds of the learner's processes that have ended
        self.pid: int | None = None
        self.base = self.seen = 0.0
        self.last = 0.0

    def follow(self, pid: int) -> None:
        """Count the learner's process ``pid`` from now on."""
        self.ended()
        self.base = self.seen = process_tree_cpu(pid)
        self.pid = pid

    def _used(self) -> float:
        """CPU-seconds of the followed process since :meth:`follow` (the last reading once it is
        gone: a process that died reads as 0)."""
        pid = self.pid  # read once: the watcher thread reads while the judge may switch it
        if pid is not None:
            self.seen = max(self.seen, process_tree_cpu(pid))
        return self.seen - self.base

    def ended(self) -> None:
        """The followed process is about to end (or has): keep what it used."""
        if self.pid is not None:
            used = self._used()
            self.pid, self.base, self.seen = None, 0.0, 0.0
            self.spent += used

    def __call__(self) -> float:
        learner = self.spent + self._used()
        self.last = max(self.last, time.process_time() + learner)
        return self.last
