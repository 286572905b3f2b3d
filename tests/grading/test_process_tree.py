"""kvlab.grading.process_tree: the one way a run is stopped with everything it started. Each
test starts real processes (they sleep: no CPU to speak of) and looks at /proc afterwards."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap

import cpu_limit
import psutil
import pytest
from conftest import ROOT

from kvlab.grading.process_tree import how_it_ended, kill_tree

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's /proc")

# A process that ignores SIGTERM, starts two more that ignore it too (one in its own session,
# beyond the reach of its group, one in its group), says their pids and sleeps.
STUBBORN = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    SLEEPER = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(600)"
    kids = [subprocess.Popen([sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=s) for s in (True, False)]
    for k in kids:
        k.stdout.readline()
    print(" ".join(str(k.pid) for k in kids), flush=True)
    time.sleep(600)
    """
)

# Run as a child subreaper (prctl PR_SET_CHILD_SUBREAPER): orphans come to this process, so a
# zombie left behind would be its own, and kill_tree must reap it.
AS_SUBREAPER = textwrap.dedent(
    """
    import ctypes, json, os, subprocess, sys
    assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    from kvlab.grading.process_tree import kill_tree
    root = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True, start_new_session=True)
    grandchildren = [int(p) for p in root.stdout.readline().split()]
    kill_tree(root, grace=float(sys.argv[2]))
    left = [p for p in (root.pid, *grandchildren) if os.path.exists(f"/proc/{p}")]
    for p in left:  # a failed kill_tree leaves nothing behind
        os.kill(p, 9)
    print(json.dumps({"returncode": root.returncode, "left": left}))
    """
)


def _as_subreaper(code: str, grace: float) -> dict:
    out = cpu_limit.run(
        [sys.executable, "-c", AS_SUBREAPER, code, str(grace)],
        cpu=60,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return json.loads(out.stdout)


@pytest.mark.parametrize("grace", [0.0, 0.5])
def test_a_child_and_grandchildren_that_ignore_sigterm_die_and_leave_no_zombie(grace):
    seen = _as_subreaper(STUBBORN, grace)
    assert seen == {"returncode": -9, "left": []}


def test_within_its_grace_a_process_ends_itself_and_what_it_left_is_killed():
    polite = STUBBORN.replace(
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nSLEEPER",
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))\nSLEEPER",
    )
    assert polite != STUBBORN
    assert _as_subreaper(polite, 30.0) == {"returncode": 3, "left": []}


def _sleep_with_a_child():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    import time

    time.sleep(600)


def test_a_multiprocessing_worker_and_its_child_are_stopped():
    worker = multiprocessing.get_context("fork").Process(target=_sleep_with_a_child)
    worker.start()
    parent = psutil.Process(worker.pid)
    for _ in range(500):
        if parent.children():
            break
        psutil.wait_procs([], timeout=0.01)
    (child,) = parent.children()
    kill_tree(worker)
    assert worker.exitcode == -9
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE


def test_a_process_already_reaped_is_left_alone():
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    kill_tree(done)
    assert done.returncode == 0


def test_how_a_process_ended_is_said_in_words():
    assert how_it_ended(0) == "exit status 0" and how_it_ended(3) == "exit status 3"
    assert how_it_ended(-9) == "killed by SIGKILL"
    assert how_it_ended(-200) == "killed by signal 200"  # no such signal: its number
    assert how_it_ended(None) == "exit status None"  # not reaped: said as it is
