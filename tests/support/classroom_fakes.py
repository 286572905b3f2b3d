"""A stand-in for ``grade_notebook`` in the class-grading tests: it does what the staged notebook's
first cell says, without a kernel. The spawned grading process imports it by name, so it imports
nothing from conftest (which must run before kvlab is imported)."""

import os
import signal
import subprocess
import sys
import time

from kvlab.course.nbformat_quick import nbformat
from kvlab.grading.notebook import ExerciseScore, NotebookGrade


def by_first_cell(path, cell_timeout=300, kernel_name=None):
    """``ok P/T``: a grade of P of T checks; ``mention``: one whose error names the file;
    ``raise``, ``exit``, ``kill``: a grader that raises, exits or is killed; ``hang``: one that
    never returns; ``hang-with-child PIDFILE``: one that starts a process (its pid written to
    PIDFILE) and never returns."""
    command, *args = nbformat.read(path, as_version=4).cells[0].source.split()
    if command == "ok":
        passed, total = map(int, args[0].split("/"))
        status = "passed" if passed == total else "failed"
        report = f"00.kv_bytes · KV bytes per token: {passed}/{total} checks passed"
        score = ExerciseScore("00.kv_bytes", "KV bytes per token", passed, total, status, report)
        return NotebookGrade(str(path), [score], seconds=0.1)
    if command == "mention":  # a grade that names the file it graded
        return NotebookGrade(str(path), [], error=f"cannot read {path}")
    if command == "raise":
        raise RuntimeError("a bug in the grader")
    if command == "exit":
        os._exit(3)
    if command == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if command == "hang-with-child":
        # a session of its own, as jupyter_client starts a kernel: out of reach of killpg
        sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
        child = subprocess.Popen(sleep, start_new_session=True)
        with open(args[0], "w") as f:
            f.write(str(child.pid))
    time.sleep(600)
    raise AssertionError("not reached")
