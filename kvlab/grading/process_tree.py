"""Stop a process and everything it started: the one way the judge, the class grader and the
sandbox end a run.

What a grading process starts may run in sessions of its own (a Jupyter kernel, the sandbox's
shim), so the tree is found by parentage as well as by process group. It is read before
anything dies (a dead parent's children are re-parented and found no more) and frozen
(SIGSTOP) while it is read again, so that nothing forks past it; then it is killed with
SIGKILL, which no process can ignore, and what is this process's to reap is reaped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable

import psutil

FREEZE_ROUNDS = 50  # re-reads of a frozen tree: a fork bomb is stopped a generation at a time


def kill_tree(process, *, grace: float = 0.0, timeout: float = 10.0) -> None:
    """Stop ``process`` (a ``subprocess.Popen`` or ``multiprocessing.Process`` this process
    started), its process group and all its descendants, and reap it.

    grace: seconds the process has after SIGTERM to end its own tree and itself (the sandbox's
        shim reports how the run ended); then whatever is left is killed. 0: SIGKILL at once.
    timeout: seconds to wait for the process and its descendants to end after SIGKILL.
    """
    tree = _descendants(process)
    if grace > 0 and not _ended(process, 0):
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
        _ended(process, grace)
    frozen = _freeze([*_root(process), *tree])
    if hasattr(os, "killpg"):
        with contextlib.suppress(OSError):  # its group: a shim and its command, a setsid worker
            os.killpg(process.pid, signal.SIGKILL)
    for p in frozen:
        with contextlib.suppress(psutil.Error):
            p.kill()  # psutil checks it is still the same process, not a reused pid
    _ended(process, timeout)
    others = [p for p in frozen if p.pid != process.pid]
    _wait_ended(others, {p.pid for p in frozen}, timeout)


def how_it_ended(returncode: int | None) -> str:
    """A process's end in words: the signal that killed it (a negative return code), else its
    exit status."""
    if returncode is None or returncode >= 0:
        return f"exit status {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


def _ended(process, timeout: float) -> bool:
    """Whether ``process`` has ended, waiting up to ``timeout`` seconds; it is reaped if so."""
    if isinstance(process, subprocess.Popen):
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    process.join(timeout)  # multiprocessing.Process
    return process.exitcode is not None


def _root(process) -> list[psutil.Process]:
    """The process itself while it runs (or is a zombie not yet reaped: its pid is still its)."""
    if _ended(process, 0):
        return []
    with contextlib.suppress(psutil.Error):
        return [psutil.Process(process.pid)]
    return []


def _descendants(process) -> list[psutil.Process]:
    """The process's descendants now, or none once it has ended (its pid may be reused)."""
    if _ended(process, 0):
        return []
    try:
        return psutil.Process(process.pid).children(recursive=True)
    except psutil.Error:
        return []


def _freeze(found: Iterable[psutil.Process]) -> list[psutil.Process]:
    """Stop every process in ``found`` and every child they started meanwhile, until a read
    of the process table finds no new one; returns them all."""
    known = {p.pid: p for p in found}
    for _ in range(FREEZE_ROUNDS):
        for p in known.values():
            with contextlib.suppress(psutil.Error):
                p.suspend()
        new = [
            c
            for c in psutil.process_iter(["ppid"])
            if c.info["ppid"] in known and c.pid not in known
        ]
        if not new:
            break
        known.update((c.pid, c) for c in new)
    return list(known.values())


def _wait_ended(processes: list[psutil.Process], killed: set[int], timeout: float) -> None:
    """Wait until each killed process is gone, reaping those whose parent is this process (a
    subreaper's), or a zombie that a live parent outside the tree will reap: on a busy
    machine a signalled process can take a while to be scheduled and die."""
    deadline = time.monotonic() + timeout
    while processes:
        processes = [p for p in processes if not _gone(p, killed)]
        if not processes or time.monotonic() >= deadline:
            return
        time.sleep(0.01)


def _gone(p: psutil.Process, killed: set[int]) -> bool:
    try:
        if not p.is_running():
            return True
        if p.status() != psutil.STATUS_ZOMBIE:
            return False
        parent = p.ppid()
    except psutil.NoSuchProcess:
        return True
    if parent == os.getpid():
        with contextlib.suppress(ChildProcessError):
            os.waitpid(p.pid, os.WNOHANG)
        return False  # the next look finds it gone
    return parent not in killed  # a dying parent's zombie is re-parented, then reaped


__all__ = ["kill_tree"]
