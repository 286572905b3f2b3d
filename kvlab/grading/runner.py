"""Run an exercise's checks against a learner's object and print the report.

Each check runs under a time limit with its output captured (in a forked child for exercises that
ask for isolation), and what happened becomes an :class:`Outcome`: a wrong answer is reported as
the check described it; anything else the check raises is blamed on the learner's code when a
frame of it is in the traceback (``blame``). A later failure with the cause of an earlier one is
folded into "probably the same problem as above".
"""

from __future__ import annotations

import json
import os
import warnings

from kvlab.grading.blame import (
    exception_cause,
    explain_exception,
    learner_frames,
    triton_too_early,
    unwritten,
)
from kvlab.grading.expect import CheckFailed, short
from kvlab.grading.limits import (
    WALL_BACKSTOP,
    BoundedBuffer,
    CheckTimeout,
    ChildCrashed,
    can_fork,
    captured_output,
    cpu_limit,
    in_child_process,
)
from kvlab.grading.own_code import HANDOVER
from kvlab.grading.registry import Check, get_exercise
from kvlab.grading.remote import LearnerExit, Remote, RemoteDied, is_remote, origin
from kvlab.grading.report import SAME_PROBLEM, CheckResult, Outcome, Status, failure_details
from kvlab.ops.runtime import TRITON_TOO_EARLY_DETAILS

DEFAULT_TIMEOUT = float(os.environ.get("KVLAB_CHECK_TIMEOUT", "10"))
GRADE_LOG_VAR = "KVLAB_GRADE_LOG"  # set by `kvlab grade`: results are appended there as JSON lines
# causes the harness itself gives; a check's own causes are its hints or its `cause=` keys
TIMEOUT_CAUSE = "kvlab: time limit"
TIMED_OUT_SKIP = "skipped: your code was stopped at its limit in an earlier check"
CRASH_HINT = (
    "a load or store outside a tensor? mask every tl.load / tl.store (tokens past seq_len, "
    "lanes past HEAD_DIM, heads past GROUP) and stop at the key card's last room"
)


def check(exercise_id: str, obj, timeout: float | None = None) -> CheckResult:
    """Grade ``obj`` (the learner's function or class) on an exercise and print a short report."""
    result = run_checks(exercise_id, obj, timeout)
    report = result.report()
    print(report)
    log = os.environ.get(GRADE_LOG_VAR)
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({**result.to_dict(), "report": report}) + "\n")
    return result


def run_checks(exercise_id: str, obj, timeout: float | None = None) -> CheckResult:
    """Run every check of an exercise against ``obj``; never raises for learner mistakes.

    A function that is not written yet stops at its first check (unless what raised is another
    function of the learner's, named in the report). A class is judged method by method: every
    check runs, so the methods already written get their marks.
    """
    ex = get_exercise(exercise_id)
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    total = len(ex.checks)
    wanted_class = ex.expects == "class"
    remote = is_remote(obj)  # the learner's object in its own process (kvlab grade's judge)
    if not _callable(obj) or (wanted_class and not isinstance(obj, type)):
        kind = "a class" if wanted_class else "a function"
        details = [
            f"expected {kind}, got {short(obj)}",
            f"pass the {ex.expects} itself, without calling it",
        ]
        outcome = Outcome("hand in the right kind of object", Status.FAILED, details)
        return CheckResult(ex.id, ex.title, Status.WRONG_KIND, [outcome], total)
    reference = _kvlab_reference(obj)
    if reference:
        details = [f"{reference} is kvlab's reference, not your exercise"]
        outcome = Outcome("hand in your own code", Status.FAILED, details, handover=True)
        return CheckResult(ex.id, ex.title, Status.WRONG_KIND, [outcome], total)
    out = BoundedBuffer()
    outcomes: list[Outcome] = []
    causes: dict[str, str] = {}
    timed_out = False
    for check_ in ex.checks:
        if timed_out:  # one endless loop is enough to wait for
            outcomes.append(Outcome(check_.name, Status.SKIPPED, [TIMED_OUT_SKIP]))
            continue
        # the judge's learner process is the isolation: a crash there costs this check only
        run = _run_isolated if ex.isolate and can_fork() and not remote else _run_one
        outcome = run(check_, obj, timeout, out, ex.isolate)
        if outcome.status is Status.TIMED_OUT:  # tried once more before it counts
            outcome = _second_try(run(check_, obj, timeout, out, ex.isolate), outcome)
        unwritten_ = outcome.status is Status.NOT_IMPLEMENTED
        itself = outcome.unimplemented in ("?", getattr(obj, "__name__", None))
        if unwritten_ and itself and not outcomes and not wanted_class:
            return CheckResult(ex.id, ex.title, Status.NOT_IMPLEMENTED, [outcome], total)
        timed_out = outcome.status is Status.TIMED_OUT
        _fold(outcome, causes)
        outcomes.append(outcome)
    if all(o.status is Status.NOT_IMPLEMENTED for o in outcomes):
        return CheckResult(ex.id, ex.title, Status.NOT_IMPLEMENTED, outcomes, total)
    if all(o.passed for o in outcomes):
        status = Status.PASSED
    elif any(o.status is Status.TIMED_OUT for o in outcomes):
        status = Status.TIMED_OUT  # a status of its own: the gradebook tells it from a wrong answer
    else:
        status = Status.FAILED
    return CheckResult(ex.id, ex.title, status, outcomes, total, out.total)


def _second_try(second: Outcome, first: Outcome) -> Outcome:
    """A check stopped at its limit is run once more; the second try counts. Stopped again, it
    says so; finished, it says the first try was stopped (a machine can stall a process for a
    moment even when CPU time is what counts)."""
    if second.status is Status.TIMED_OUT:
        second.details = [f"{second.details[0]}; tried twice", *second.details[1:]]
        return second
    second.details = [*second.details, f"note:     its first try was {first.details[0]}"]
    return second


def _kvlab_reference(obj) -> str | None:
    """The name of kvlab's own function or class when ``obj`` is one, else None. (Wrappers that
    hand over to kvlab are caught by each lab's checks, e.g. ``own_code.refuse_reference``.)"""
    if is_remote(obj):
        where = origin(obj) or ""
        return where if where.startswith("kvlab.") else None
    inner = getattr(obj, "fn", obj)  # a @triton.jit kernel wraps the Python function in .fn
    if str(getattr(inner, "__module__", "")).startswith("kvlab."):
        return getattr(inner, "__qualname__", repr(obj))
    return None


def _callable(obj) -> bool:
    if isinstance(obj, Remote):
        return bool(obj._info.get("callable"))
    return callable(obj)


# --- one check -------------------------------------------------------------------------------


def _run_one(
    check_: Check, obj, timeout: float, out: BoundedBuffer, kernel: bool = False
) -> Outcome:
    """Run one check and say what happened, blaming the learner's code only when it is at fault."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # once per place: a warning in a loop is one entry
        outcome = _run_caught(check_, obj, timeout, out, kernel)
    outcome.warnings = list(
        dict.fromkeys(f"{w.category.__name__}: {' '.join(str(w.message).split())}" for w in caught)
    )[:5]
    return outcome


def _run_caught(
    check_: Check, obj, timeout: float, out: BoundedBuffer, kernel: bool = False
) -> Outcome:
    name = check_.name
    limit = None
    try:
        with captured_output(out), cpu_limit(timeout) as limit:
            check_.func(obj)
    except CheckFailed as f:
        handover = bool(getattr(f, "handover", False)) or f.cause == HANDOVER
        return Outcome(name, Status.FAILED, failure_details(f), cause=f.cause, handover=handover)
    except CheckTimeout as stopped:
        kind = getattr(limit, "kind", None) or getattr(stopped, "kind", "cpu")
        return _timed_out(name, timeout, kind)
    except RemoteDied as died:
        how = getattr(died, "how", str(died))
        if getattr(died, "broke_protocol", False):
            details = [f"your notebook's process was stopped: {how}"]
        elif how.startswith("SIG"):  # killed by a signal (a kernel: memory it must not touch)
            details = [f"your code crashed the process ({how})"]
            details += [f"hint:     {CRASH_HINT}"] if kernel else []
        else:
            details = [f"your code ended its process ({how})"]
        return Outcome(name, Status.CRASHED, details, cause=f"kvlab: crash {how}")
    except (SystemExit, LearnerExit) as e:  # the judge's learner process: LearnerExit
        details = [f"your code called exit({e.code!r}); return a value instead"]
        return Outcome(name, Status.ERROR, details + explain_exception(e)[1:], cause="kvlab: exit")
    except Exception as e:  # RecursionError included
        method = unwritten(e) if isinstance(e, NotImplementedError) else None
        if method is not None:
            what = "your code" if method == "?" else f"`{method}`"
            details = [f"not implemented yet: {what} still raises NotImplementedError"]
            cause = f"kvlab: unwritten {method}"
            return Outcome(name, Status.NOT_IMPLEMENTED, details, cause, unimplemented=method)
        if triton_too_early(e):
            details = list(TRITON_TOO_EARLY_DETAILS)
            return Outcome(name, Status.ERROR, details, cause="kvlab: triton too early")
        details = explain_exception(e)
        if not learner_frames(e):
            details.insert(0, "calling your code failed:")
        return Outcome(name, Status.ERROR, details, cause=exception_cause(e))
    return Outcome(name, Status.PASSED)


def stopped_at_limit(timeout: float, kind: str = "cpu") -> str:
    """What a report says of a check stopped at its time limit (CPU time, or the far backstop
    on wall time for code that waits without computing)."""
    if kind == "wall":
        return (
            f"stopped at its limit: {WALL_BACKSTOP * timeout:g} s passed while your code "
            f"used less than {timeout:g} CPU-s (waiting on something: sleep, input, a lock?)"
        )
    return f"stopped at its limit of {timeout:g} CPU-s (CPU time your code and the check used)"


def _timed_out(name: str, timeout: float, kind: str = "cpu") -> Outcome:
    details = [stopped_at_limit(timeout, kind)]
    return Outcome(name, Status.TIMED_OUT, details, cause=TIMEOUT_CAUSE)


def _run_isolated(
    check_: Check, obj, timeout: float, out: BoundedBuffer, kernel: bool = True
) -> Outcome:
    """``_run_one`` in a forked child; a crash or a hang costs this check only."""

    def child():
        buffer = BoundedBuffer()
        outcome = _run_one(check_, obj, timeout, buffer, kernel)
        return outcome, buffer.text(), buffer.total

    try:
        outcome, text, total = in_child_process(child, WALL_BACKSTOP * timeout + 5)
    except CheckTimeout:
        return _timed_out(check_.name, timeout, "wall")
    except ChildCrashed as crash:
        if crash.signalled:
            details = [f"your code crashed the process ({crash.how})", f"hint:     {CRASH_HINT}"]
        else:
            details = [f"the check's process ended without a result ({crash.how})"]
        return Outcome(check_.name, Status.CRASHED, details, cause=f"kvlab: crash {crash.how}")
    out.write(text)
    out.total += total - len(text)
    return outcome


def _fold(outcome: Outcome, earlier: dict[str, str]) -> None:
    """Shorten a failure whose cause an earlier check already explained."""
    if outcome.passed or outcome.cause is None:
        return
    if outcome.cause in earlier:
        if outcome.status is Status.NOT_IMPLEMENTED:
            what = "your code" if outcome.unimplemented == "?" else f"`{outcome.unimplemented}`"
            outcome.details = [f"needs {what}, which is not written yet"]
        else:
            inputs = [d for d in outcome.details if d.startswith(("input:", "replay:"))]
            outcome.details = [f"{SAME_PROBLEM} (“{earlier[outcome.cause]}”)", *inputs]
    else:
        earlier[outcome.cause] = outcome.name
