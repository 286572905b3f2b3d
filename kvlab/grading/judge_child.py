"""The learner's process under ``kvlab grade``: runs the lab's cells and answers the judge.

The judge sends each cell to run (the instructor's given cells, the submission's exercise
cells), then, where the lab has a check cell, asks for the object it names and calls it from
its own process. Nothing here is trusted: scores are the judge's. What this side computes for
the judge is only what must be read where the learner's code ran (which line of it raised,
what it printed).

    python -m kvlab.grading.judge_child READ_FD WRITE_FD
"""

from __future__ import annotations

import importlib
import keyword
import os
import pickle
import sys

from kvlab.grading.limits import BoundedBuffer
from kvlab.grading.remote import LEARNER, MUTABLE, Connection, code_shape

KEEP = 2000  # characters of what the learner's code prints kept for the report
CONNECTION: Connection | None = None  # the channel to the judge, for what the judge serves


def served(name: str, *args, **kwargs):
    """kvlab's ``name`` computed by the judge (Lab 09's ``almost_free_tokens`` for its given
    cells): the graders are hidden from this process, and the judge refuses them to the
    learner's code while it is checked."""
    if CONNECTION is None:
        raise RuntimeError(f"`{name}` is computed by kvlab grade's judge, which is not here")
    return CONNECTION.request("kvlab", name, args, kwargs)


class _Quiet:
    """Where a cell's own output goes: counted, not kept (the judge needs none of it)."""

    def write(self, s):
        return len(s)

    def flush(self):
        pass

    def isatty(self):
        return False


def _captured(func, *args, **kwargs):
    """Run ``func`` with stdout and stderr sent to a bounded buffer: (value, printed)."""
    buffer = BoundedBuffer(KEEP)
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = buffer
    try:
        return func(*args, **kwargs), (buffer.text(), buffer.total)
    finally:
        sys.stdout, sys.stderr = saved


def learner_call(conn: Connection, target, args, kwargs):
    """One call of the learner's code for the judge: its value, what it printed, and what
    became of the by-value arguments (the storages of its tensors, its lists and dicts)."""
    built = conn.storages[-1] if conn.storages else {}
    given = [*args, *kwargs.values()]
    before = [_snapshot(v) for v in given]
    printed = ("", 0)
    try:
        value, printed = _captured(target, *args, **kwargs)
    except BaseException:
        conn.pending_back = _back(built, given, before)
        raise
    return value, True, printed, _back(built, given, before)


def _snapshot(value):
    """A by-value argument as bytes, to tell afterwards whether the call changed it."""
    if type(value) not in MUTABLE:
        return None
    try:
        return pickle.dumps(value)
    except Exception:
        return None


def _back(built: dict, given: list, before: list):
    """What goes back after a call: the storages of its tensors, and the by-value arguments
    it changed (None for the others, which the judge then leaves as they are)."""
    table = {key: (str(t.device), _bytes(t)) for key, t in built.items()}
    values = [
        v if was is not None and _snapshot(v) != was else None
        for v, was in zip(given, before, strict=True)
    ]
    return table, values


def _bytes(flat) -> bytes:
    return bytes(flat.cpu().numpy().tobytes()) if flat.numel() else b""


class Learner:
    """The notebook's namespace and the judge's operations on it."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.shell = None
        self.guards: list = []
        conn.handlers.update(
            {
                "run_cell": self.run_cell,
                "resolve": self.resolve,
                "guard": self.guard,
                "unguard": self.unguard,
                "release": self.release,
                "code": self.code,
            }
        )

    def _shell(self):
        if self.shell is None:
            from IPython.core.interactiveshell import InteractiveShell

            self.shell = InteractiveShell.instance()
            self.shell.user_ns["__name__"] = "__main__"
        return self.shell

    def run_cell(self, conn, source):
        """Run one cell as a notebook would; returns None, or the name of the error it raised."""
        if not isinstance(source, str):
            raise TypeError("a cell's source is text")
        shell = self._shell()
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = _Quiet()
        try:
            result = shell.run_cell(source, store_history=False, silent=False)
        finally:
            sys.stdout, sys.stderr = saved
        error = result.error_in_exec or result.error_before_exec
        return (None if error is None else type(error).__name__), False, None, None

    def resolve(self, conn, name):
        """The object a check cell names (a plain name: the judge reads the lab's own cell)."""
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise ValueError(f"{name!r} is not a name")
        namespace = self._shell().user_ns
        if name not in namespace:
            raise NameError(f"name {name!r} is not defined")
        return namespace[name], True, None, None

    def guard(self, conn, references, learner, task):
        """kvlab's reference functions guarded while the judge calls the learner's code."""
        from kvlab.grading.own_code import refuse_reference

        found = []
        for module, qualname in references:
            try:
                found.append(_find(module, qualname))
            except AttributeError:  # kvlab's own answer, stood in for here: nothing to guard
                pass
        guard = refuse_reference(*found, learner=learner, task=task)
        guard.__enter__()
        self.guards.append(guard)
        return None, False, None, None

    def unguard(self, conn):
        """Lift the last guard; returns the hand-overs it saw."""
        from kvlab.grading.expect import CheckFailed

        guard = self.guards.pop()
        seen = list(guard.seen)
        try:
            guard.__exit__(None, None, None)
        except CheckFailed:
            pass
        return seen, False, None, None

    def release(self, conn):
        conn.release_all()
        return None, False, None, None

    def code(self, conn, handle):
        """What the judge's hints read of one of the learner's functions (``remote.code_shape``):
        its arguments and its instructions as names and values, never a code object. Served
        here only: the judge's own functions are not the learner's to read."""
        code = getattr(conn.exported(handle), "__code__", None)
        return (None if code is None else code_shape(code)), False, None, None


def _find(module: str, qualname: str):
    owner = importlib.import_module(module)
    for part in qualname.split("."):
        owner = getattr(owner, part)
    return owner


def main(argv: list[str]) -> int:
    read_fd, write_fd = int(argv[0]), int(argv[1])
    os.set_inheritable(read_fd, False)
    os.set_inheritable(write_fd, False)
    global CONNECTION
    conn = CONNECTION = Connection(read_fd, write_fd, LEARNER)
    conn.call_learner = learner_call
    if __name__ == "__main__":  # run with -m: what the lab imports is another copy of this module
        importlib.import_module("kvlab.grading.judge_child").CONNECTION = conn
    Learner(conn)
    conn.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
