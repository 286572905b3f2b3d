"""Every process the suite starts, limited in CPU time, not in wall time.

A busy machine (CI runners, a learner's laptop, a grading server: all shared) makes a child wait
for a core, so its wall time grows with the machine's load while its CPU time does not. A child
is therefore stopped when it (with everything it started) has used ``cpu`` CPU-seconds; a
wall-clock limit of ``BACKSTOP * cpu`` seconds is kept only for a child that hangs without
computing. Either way the test fails with a message that says which limit was hit.

Two guards, both set by :func:`popen`:

- ``RLIMIT_CPU`` (soft, per process, inherited across fork and exec): the kernel sends SIGXCPU
  to any one process of the tree past ``cpu`` CPU-seconds. Only the soft limit is set, so a
  process below (kvlab's sandbox) may still set its own.
- :func:`wait` and :func:`communicate` read the whole tree's CPU time (psutil) while they wait
  and kill the tree once it has used ``cpu`` CPU-seconds together.
"""

from __future__ import annotations

import contextlib
import resource
import signal
import subprocess
import threading
import time

BACKSTOP = 10  # the wall-clock limit, as a multiple of the CPU-seconds limit
_POLL = 0.5  # seconds between readings of the tree's CPU time


class CPULimitExceeded(AssertionError):
    """A child used more than its CPU-seconds (or, hanging, more than the wall backstop)."""


def _limit_self(cpu: float, then=None):
    def preexec():
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        soft = int(cpu) + 1
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
        if then is not None:
            then()

    return preexec


def popen(args, *, cpu: float, **kwargs) -> subprocess.Popen:
    """``subprocess.Popen(args, **kwargs)``, each process of the child's tree held to ``cpu``
    CPU-seconds by RLIMIT_CPU. Wait for it with :func:`wait` or :func:`communicate`."""
    if cpu is None or cpu <= 0:
        raise ValueError(f"cpu must be a number of CPU-seconds > 0, got {cpu!r}")
    kwargs["preexec_fn"] = _limit_self(cpu, kwargs.get("preexec_fn"))
    proc = subprocess.Popen(args, **kwargs)
    proc.cpu_limit = cpu
    proc.cpu_used = 0.0
    return proc


def tree_cpu(pid: int) -> float:
    """CPU-seconds used by ``pid`` and its descendants (live ones, and ended ones they reaped)."""
    import psutil

    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for p in tree:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the child and every descendant still running."""
    import psutil

    with contextlib.suppress(psutil.Error):
        for p in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                p.kill()
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def communicate(proc: subprocess.Popen, input=None, what: str | None = None):
    """``proc.communicate(input)`` under the child's CPU limit; (stdout, stderr).

    Raises :class:`CPULimitExceeded` (the tree killed) once the tree has used its CPU-seconds,
    once the wall backstop has passed, or when a process of the tree died of SIGXCPU."""
    cpu = proc.cpu_limit
    name = what or " ".join(map(str, proc.args))[:200]
    hit: list[str] = []
    done = threading.Event()

    def watch():
        while not done.wait(_POLL):
            used = tree_cpu(proc.pid)
            proc.cpu_used = max(proc.cpu_used, used)
            if proc.cpu_used >= cpu:
                hit.append(f"used more than its {cpu:g} CPU-seconds")
                kill_tree(proc)
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.monotonic()
    try:
        out, err = proc.communicate(input, timeout=BACKSTOP * cpu)
    except subprocess.TimeoutExpired:
        hit.append(
            f"still running after {BACKSTOP * cpu:g} s of wall time (the backstop of "
            f"{BACKSTOP} x its {cpu:g} CPU-seconds), having used {proc.cpu_used:.1f}"
        )
        kill_tree(proc)
        out, err = proc.communicate()
    finally:
        done.set()
        watcher.join()
    if not hit and proc.returncode == -signal.SIGXCPU:
        hit.append(f"a process of it passed its {cpu:g} CPU-seconds (RLIMIT_CPU, SIGXCPU)")
    if hit:
        tail = err or out or ""
        tail = (tail if isinstance(tail, str) else tail.decode(errors="replace"))[-2000:]
        raise CPULimitExceeded(
            f"{name}: {hit[0]} ({time.monotonic() - started:.0f} s of wall time)\n{tail}"
        )
    return out, err


def wait(proc: subprocess.Popen, what: str | None = None) -> int:
    """``proc.wait()`` under the child's CPU limit (see :func:`communicate`); the return code."""
    communicate(proc, what=what)
    return proc.returncode


def run(args, *, cpu: float, check: bool = False, input=None, what=None, **kwargs):
    """``subprocess.run(args, ...)`` held to ``cpu`` CPU-seconds for the child's whole tree
    (the wall-clock limit is ``BACKSTOP * cpu``). ``capture_output``, ``text``, ``cwd``, ``env``
    and the rest are passed on; ``timeout`` is refused (the limit is in CPU time)."""
    if "timeout" in kwargs:
        raise TypeError("run() takes cpu=CPU-seconds, not a wall-clock timeout")
    if kwargs.pop("capture_output", False):
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    proc = popen(args, cpu=cpu, **kwargs)
    with proc:
        out, err = communicate(proc, input, what)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


def call(args, *, cpu: float, **kwargs) -> int:
    """``subprocess.call``: the return code of :func:`run`."""
    return run(args, cpu=cpu, **kwargs).returncode


def until(proc: subprocess.Popen, ready, what: str, cpu: float, poll: float = 0.3) -> None:
    """Wait until ``ready()`` is true for a server ``proc`` (from :func:`popen`) that keeps
    running: fails if it ends first, once its tree has used ``cpu`` CPU-seconds, or after the
    wall backstop (``BACKSTOP * cpu``), saying which."""
    started = time.monotonic()
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"{what}: it ended (status {proc.returncode}) before it was ready")
        proc.cpu_used = max(proc.cpu_used, tree_cpu(proc.pid))
        waited = time.monotonic() - started
        if proc.cpu_used >= cpu or waited >= BACKSTOP * cpu:
            raise CPULimitExceeded(
                f"{what}: not ready after {proc.cpu_used:.1f} CPU-seconds (its limit {cpu:g})"
                f" and {waited:.0f} s of wall time (backstop {BACKSTOP * cpu:g} s)"
            )
        time.sleep(poll)


def backstop(seconds: float) -> float:
    """A wall-clock wait for what a child does (a server coming up) that takes ``seconds`` on
    an idle machine, stretched to the backstop: such a wait ends on the event, not the clock."""
    return BACKSTOP * seconds


__all__ = [
    "BACKSTOP",
    "CPULimitExceeded",
    "backstop",
    "call",
    "until",
    "communicate",
    "popen",
    "run",
    "wait",
]
