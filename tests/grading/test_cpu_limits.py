"""A check's time limit counts CPU time, not wall time: a busy machine (a process waiting for a
core) costs no check, an endless loop is stopped at its limit (a status of its own, tried twice),
and code that only waits meets a far wall-time backstop. The clocks are injected: nothing here
asserts how long anything took."""

import subprocess
import sys
import threading
import time

import cpu_limit as child_limit
import pytest

from kvlab.grading import Status, run_checks
from kvlab.grading.limits import (
    WALL_BACKSTOP,
    CheckTimeout,
    LearnerClock,
    counting,
    cpu_limit,
    process_tree_cpu,
)


class FakeClocks:
    """A CPU clock and a wall clock that move only when the test says so."""

    def __init__(self):
        self.cpu = 0.0
        self.wall = 0.0
        self.reads = threading.Event()

    def read_cpu(self):
        return self.cpu

    def read_wall(self):
        self.reads.set()
        return self.wall


def run_with(clocks: FakeClocks, seconds: float, steps):
    """Inside ``cpu_limit(seconds)`` on the fake clocks, apply each (cpu, wall) step and give the
    watcher time to read it; returns the limit's kind if it fired (None if not)."""
    try:
        with cpu_limit(seconds, clock=clocks.read_cpu, wall=clocks.read_wall):
            for cpu, wall in steps:
                clocks.cpu, clocks.wall = cpu, wall
                for _ in range(3):  # the watcher reads at least every second: wait for reads
                    clocks.reads.clear()
                    clocks.reads.wait(5)
    except CheckTimeout as stopped:
        return stopped.kind
    return None


def test_a_busy_machine_wall_time_passing_without_cpu_stops_nothing():
    """A process that gets no core for eight limits' worth of wall time is not stopped."""
    steps = [(0.5, 8.0), (0.9, 9.5)]
    assert run_with(FakeClocks(), 1.0, steps) is None


def test_cpu_time_past_the_limit_stops_the_check():
    assert run_with(FakeClocks(), 1.0, [(0.5, 0.6), (1.2, 1.3)]) == "cpu"


def test_many_cores_never_get_less_time_than_the_wall_clock_gives():
    """Four threads use 4 CPU-s in one second: not stopped until a second of the limit passed."""
    assert run_with(FakeClocks(), 2.0, [(4.0, 1.0), (6.0, 1.9)]) is None
    assert run_with(FakeClocks(), 2.0, [(4.0, 1.0), (8.0, 2.1)]) == "cpu"


def test_code_that_only_waits_meets_the_wall_backstop():
    assert run_with(FakeClocks(), 1.0, [(0.0, WALL_BACKSTOP + 0.1)]) == "wall"


def test_counting_sets_the_clock_the_limit_reads():
    clocks = FakeClocks()
    with counting(clocks.read_cpu):
        with pytest.raises(CheckTimeout):
            with cpu_limit(0.5, wall=clocks.read_wall):
                clocks.cpu, clocks.wall = 1.0, 1.0
                time.sleep(30)  # interrupted: the signal breaks the sleep


def test_the_learner_clock_counts_the_learners_process_tree_and_no_restart(tmp_path):
    """The learner's process (and what it starts) counts; a new process's start does not."""
    burn = "import subprocess, sys, time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\nsys.stdin.read()"
    first = child_limit.popen([sys.executable, "-c", burn], cpu=60, stdin=subprocess.PIPE)
    clock = LearnerClock()
    clock.follow(first.pid)  # what it used before this (its start) is not counted
    before = clock()
    while process_tree_cpu(first.pid) < 0.3 + clock.base and first.poll() is None:
        time.sleep(0.05)
    used = clock() - before
    assert used > 0.1
    clock.ended()
    child_limit.communicate(first, b"")
    second = child_limit.popen([sys.executable, "-c", burn], cpu=60, stdin=subprocess.PIPE)
    time.sleep(0.5)  # its start and its burn happen before it is followed
    clock.follow(second.pid)
    after_restart = clock()
    assert after_restart >= before + used  # never decreasing, the ended process kept
    assert after_restart - (before + used) < 0.25  # the new process's start is not counted
    child_limit.communicate(second, b"")


def kv_bytes(spec):
    return 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * spec.dtype_bytes


def test_a_check_that_waits_longer_than_its_limit_without_computing_passes():
    """OPT-13B's check sleeps past the limit (a stalled process looks like this): full marks."""

    def slow(spec):
        if spec.num_layers == 40:
            time.sleep(0.8)  # wall time past the 0.5 limit; almost no CPU
        return kv_bytes(spec)

    result = run_checks("00.kv_bytes", slow, timeout=0.5)
    assert result.status is Status.PASSED and result.timed_out == 0, result.report()


def test_a_check_stopped_at_its_limit_is_tried_once_more_and_the_second_try_counts():
    calls = []

    def stalls_once(spec):
        calls.append(spec.num_layers)
        if len(calls) == 1:
            while True:
                pass
        return kv_bytes(spec)

    result = run_checks("00.kv_bytes", stalls_once, timeout=0.3)
    assert result.status is Status.PASSED and result.passed == result.total
    first = result.outcomes[0]
    assert any(
        d.startswith("note:     its first try was stopped at its limit of 0.3 CPU-s")
        for d in first.details
    )


def test_an_endless_loop_is_a_status_of_its_own_in_the_result():
    def spins(spec):
        while True:
            pass

    result = run_checks("00.kv_bytes", spins, timeout=0.2)
    assert result.status is Status.TIMED_OUT and result.timed_out == 1
    assert result.to_dict()["timed_out"] == 1 and result.to_dict()["status"] == "stopped at limit"
    assert result.outcomes[0].details == [
        "stopped at its limit of 0.2 CPU-s (CPU time your code and the check used); tried twice"
    ]
