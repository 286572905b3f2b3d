"""The check harness: run an exercise's checks against a learner's object and report briefly.

An exercise is a list of named checks. A check is a plain function that receives the learner's
object and raises :class:`CheckFailed` (input, expected, got, hint) when the answer is wrong.
Anything else it raises is blamed on the learner's code when a frame of the learner's code is in
the traceback, and reported as one line pointing at that line.
"""

from __future__ import annotations

import copy
import importlib
import json
import linecache
import numbers
import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from kvlab.grading.limits import (
    BoundedBuffer,
    CheckTimeout,
    ChildCrashed,
    can_fork,
    captured_output,
    in_child_process,
    time_limit,
)

DEFAULT_TIMEOUT = float(os.environ.get("KVLAB_CHECK_TIMEOUT", "10"))
GRADE_LOG_VAR = "KVLAB_GRADE_LOG"  # set by `kvlab grade`: results are appended there as JSON lines
_KVLAB_DIR = str(Path(__file__).resolve().parent.parent)
_LIBRARY_DIRS = tuple(
    str(Path(p).resolve()) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix} if p
)


class CheckFailed(AssertionError):
    """A wrong answer: what went in, what should have come out, what came out, and a hint."""

    def __init__(self, message="", *, input=None, expected=None, got=None, hint=None):
        super().__init__(message)
        self.message = message
        self.input = input
        self.expected = expected
        self.got = got
        self.hint = hint


@dataclass
class Check:
    name: str
    func: object
    hint: str | None = None


@dataclass
class Exercise:
    id: str
    title: str
    expects: str = "function"  # "function" or "class": what the learner hands to check()
    checks: list[Check] = field(default_factory=list)
    # run each check in a forked child where possible, so code that crashes the process (Triton's
    # interpreter writing outside a tensor) fails one check instead of killing the kernel
    isolate: bool = False

    def check(self, name: str, hint: str | None = None):
        """Decorator: register ``func(learner_obj)`` as one named check of this exercise."""

        def register(func):
            self.checks.append(Check(name, func, hint))
            return func

        return register


EXERCISES: dict[str, Exercise] = {}


def exercise(
    exercise_id: str, title: str, expects: str = "function", isolate: bool = False
) -> Exercise:
    if exercise_id in EXERCISES:
        raise ValueError(f"exercise {exercise_id!r} is defined twice")
    EXERCISES[exercise_id] = ex = Exercise(exercise_id, title, expects, isolate=isolate)
    return ex


def lab_of(exercise_id: str) -> str:
    return str(exercise_id).split(".", 1)[0]


def load_lab(lab: str) -> list[Exercise]:
    """Import ``kvlab.grading.labNN`` (which registers its exercises) and list them."""
    try:
        importlib.import_module(f"kvlab.grading.lab{lab}")
    except ModuleNotFoundError as e:
        if e.name != f"kvlab.grading.lab{lab}":
            raise
    return [ex for ex in EXERCISES.values() if lab_of(ex.id) == lab]


def get_exercise(exercise_id: str) -> Exercise:
    if not isinstance(exercise_id, str):
        raise TypeError(f"exercise_id must be a str like '00.kv_bytes', got {exercise_id!r}")
    load_lab(lab_of(exercise_id))
    if exercise_id not in EXERCISES:
        known = ", ".join(sorted(EXERCISES)) or "none"
        raise KeyError(f"unknown exercise {exercise_id!r}; known exercises: {known}")
    return EXERCISES[exercise_id]


# --- outcomes and results --------------------------------------------------------------------


@dataclass
class Outcome:
    name: str
    passed: bool
    details: list[str] = field(default_factory=list)


@dataclass
class CheckResult:
    """What ``check`` returns. It shows nothing when it is a cell's last value: the report was
    already printed."""

    exercise: str
    title: str
    status: str  # "passed", "failed", "not implemented", "wrong kind"
    outcomes: list[Outcome]
    total: int
    printed_chars: int = 0

    @property
    def passed(self) -> int:
        return sum(o.passed for o in self.outcomes)

    @property
    def score(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def ok(self) -> bool:
        return self.status == "passed"

    def __repr__(self):
        return f"<CheckResult {self.exercise}: {self.passed}/{self.total} {self.status}>"

    def _ipython_display_(self):
        pass

    def to_dict(self) -> dict:
        return {
            "exercise": self.exercise,
            "title": self.title,
            "status": self.status,
            "passed": self.passed,
            "total": self.total,
        }

    def report(self) -> str:
        head = f"{self.exercise} · {self.title}"
        if self.status == "not implemented":
            return (
                f"{head}: not implemented yet (0/{self.total})\n"
                "⏳ Replace `raise NotImplementedError` in the exercise cell above with your code,\n"
                "   run that cell, then run this one again."
            )
        lines = [f"{head}: {self.passed}/{self.total} checks passed"]
        for o in self.outcomes:
            lines.append(f"{'✅' if o.passed else '❌'} {o.name}")
            lines.extend(f"   {d}" for d in o.details)
        if self.printed_chars:
            lines.append(
                f"ℹ️  your code printed {self.printed_chars:,} characters during the checks (hidden)"
            )
        if self.status == "passed":
            lines.append("🎉 All checks passed.")
        return "\n".join(lines)


# --- explaining failures ---------------------------------------------------------------------


def short(value, limit: int = 160) -> str:
    """A one-line, length-limited description of a value (tensors by shape and dtype)."""
    try:
        import torch

        if isinstance(value, torch.Tensor):
            if value.numel() <= 8:
                text = f"tensor({value.tolist()}, dtype={value.dtype})"
            else:
                text = f"tensor of shape {tuple(value.shape)}, dtype {value.dtype}"
            return text if len(text) <= limit else text[: limit - 1] + "…"
    except ImportError:
        pass
    try:
        text = repr(value)
    except Exception as e:  # a learner's __repr__ may itself be broken
        text = f"<{type(value).__name__} whose repr raised {type(e).__name__}>"
    text = " ".join(text.split())
    if isinstance(value, (str, bytes, int, float, bool, type(None))):
        pass
    elif not text.startswith(type(value).__name__):
        text = f"{type(value).__name__} {text}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _is_learner_frame(filename: str) -> bool:
    """Frames outside kvlab and outside installed libraries are the learner's (notebook cells)."""
    if not filename or filename.startswith("<frozen"):
        return False
    path = filename if filename.startswith("<") else str(Path(filename).resolve())
    if path.startswith(_KVLAB_DIR + os.sep):
        return False
    installed = path.startswith(_LIBRARY_DIRS) and (
        "site-packages" in path or "/lib/python" in path
    )
    return not installed


def explain_exception(exc: BaseException) -> list[str]:
    """One or two lines: the exception and, when it came from learner code, that line."""
    message = " ".join(str(exc).split())
    if len(message) > 200:
        message = message[:199] + "…"
    lines = [f"{type(exc).__name__}: {message}" if message else type(exc).__name__]
    learner = [f for f in traceback.extract_tb(exc.__traceback__) if _is_learner_frame(f.filename)]
    if learner:
        frame = learner[-1]
        code = (frame.line or linecache.getline(frame.filename, frame.lineno)).strip()
        where = f"line {frame.lineno} of your code" + (f" ({frame.name})" if frame.name else "")
        lines.append(f"at {where}: {code}" if code else f"at {where}")
    return lines


def failure_details(failure: CheckFailed, hint: str | None) -> list[str]:
    details = [failure.message] if failure.message else []
    if failure.input is not None:
        details.append(f"input:    {failure.input}")
    if failure.expected is not None:
        details.append(f"expected: {failure.expected}")
    if failure.got is not None:
        details.append(f"got:      {failure.got}")
    hint = failure.hint or hint
    if hint:
        details.append(f"hint:     {hint}")
    return details


# --- running ---------------------------------------------------------------------------------


def _run_one(check_: Check, obj, timeout: float, out: BoundedBuffer) -> tuple[Outcome, bool]:
    """Run one check. Returns the outcome and whether the learner's code is unimplemented."""
    try:
        with captured_output(out), time_limit(timeout):
            check_.func(obj)
    except CheckFailed as f:
        return Outcome(check_.name, False, failure_details(f, check_.hint)), False
    except NotImplementedError:
        return Outcome(check_.name, False, ["not implemented yet"]), True
    except CheckTimeout:
        details = [f"your code did not finish within {timeout:g} s (an endless loop?)"]
        return Outcome(check_.name, False, details + _hint(check_)), False
    except RecursionError as e:
        return Outcome(check_.name, False, explain_exception(e) + _hint(check_)), False
    except SystemExit as e:
        details = [f"your code called exit({e.code!r}); return a value instead"]
        return Outcome(check_.name, False, details + explain_exception(e)[1:]), False
    except Exception as e:
        details = explain_exception(e)
        if not _from_learner(e) and "your code" not in " ".join(details):
            details.insert(0, "calling your code failed:")
        return Outcome(check_.name, False, details + _hint(check_)), False
    return Outcome(check_.name, True), False


CRASH_HINT = (
    "a load or store outside a tensor? mask every tl.load / tl.store (tokens past seq_len, "
    "lanes past HEAD_DIM, heads past GROUP) and stop at the key card's last room"
)


def _run_isolated(check_: Check, obj, timeout: float, out: BoundedBuffer) -> tuple[Outcome, bool]:
    """``_run_one`` in a forked child; a crash or a hang costs this check only."""

    def child():
        buffer = BoundedBuffer()
        outcome, unimplemented = _run_one(check_, obj, timeout, buffer)
        return outcome, unimplemented, buffer.text(), buffer.total

    try:
        outcome, unimplemented, text, total = in_child_process(child, timeout + 5)
    except CheckTimeout:
        details = [f"your code did not finish within {timeout:g} s (an endless loop?)"]
        return Outcome(check_.name, False, details + _hint(check_)), False
    except ChildCrashed as crash:
        if crash.signalled:
            details = [f"your code crashed the process ({crash.how})", f"hint:     {CRASH_HINT}"]
        else:
            details = [f"the check's process ended without a result ({crash.how})", *_hint(check_)]
        return Outcome(check_.name, False, details), False
    out.write(text)
    out.total += total - len(text)
    return outcome, unimplemented


def _hint(check_: Check) -> list[str]:
    return [f"hint:     {check_.hint}"] if check_.hint else []


def _from_learner(exc: BaseException) -> bool:
    return any(_is_learner_frame(f.filename) for f in traceback.extract_tb(exc.__traceback__))


TIMED_OUT_SKIP = "skipped: your code timed out in an earlier check"


def run_checks(exercise_id: str, obj, timeout: float | None = None) -> CheckResult:
    """Run every check of an exercise against ``obj``; never raises for learner mistakes."""
    ex = get_exercise(exercise_id)
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    total = len(ex.checks)
    wanted_class = ex.expects == "class"
    if not callable(obj) or (wanted_class and not isinstance(obj, type)):
        kind = "a class" if wanted_class else "a function"
        outcome = Outcome(
            "hand in the right kind of object",
            False,
            [
                f"expected {kind}, got {short(obj)}",
                f"pass the {ex.expects} itself, without calling it",
            ],
        )
        return CheckResult(ex.id, ex.title, "wrong kind", [outcome], total)
    inner = getattr(obj, "fn", obj)  # a @triton.jit kernel wraps the Python function in .fn
    if str(getattr(inner, "__module__", "")).startswith("kvlab."):
        outcome = Outcome(
            "hand in your own code",
            False,
            [f"{getattr(inner, '__qualname__', obj)} is kvlab's reference, not your exercise"],
        )
        return CheckResult(ex.id, ex.title, "wrong kind", [outcome], total)
    out = BoundedBuffer()
    outcomes: list[Outcome] = []
    last_failure: list[str] | None = None
    timed_out = False
    for check_ in ex.checks:
        if timed_out:  # one endless loop is enough to wait for
            outcomes.append(Outcome(check_.name, False, [TIMED_OUT_SKIP]))
            continue
        run = _run_isolated if ex.isolate and can_fork() else _run_one
        outcome, unimplemented = run(check_, obj, timeout, out)
        if unimplemented and not outcomes:
            return CheckResult(ex.id, ex.title, "not implemented", [], total)
        if outcome.passed:
            last_failure = None
        else:
            timed_out = outcome.details[0].startswith("your code did not finish")
            first = outcome.details[0]
            if first == last_failure:
                inputs = [d for d in outcome.details if d.startswith("input:")]
                outcome.details = ["the same problem as above", *inputs]
            last_failure = first
        outcomes.append(outcome)
    status = "passed" if all(o.passed for o in outcomes) else "failed"
    return CheckResult(ex.id, ex.title, status, outcomes, total, out.total)


def check(exercise_id: str, obj, timeout: float | None = None) -> CheckResult:
    """Grade ``obj`` (the learner's function or class) on an exercise and print a short report."""
    result = run_checks(exercise_id, obj, timeout)
    print(result.report())
    log = os.environ.get(GRADE_LOG_VAR)
    if log:
        with open(log, "a") as f:
            f.write(json.dumps(result.to_dict()) + "\n")
    return result


# --- helpers for writing checks --------------------------------------------------------------


def expect_type(got, kind, what: str, input=None, hint=None):
    """Fail unless ``got`` is a ``kind`` (numpy integers count as int; bools never do)."""
    accepted = numbers.Integral if kind is int else kind
    if isinstance(got, bool) and kind in (int, float) or not isinstance(got, accepted):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise CheckFailed(
            f"{what} should be of type {names}",
            input=input,
            expected=names,
            got=f"{type(got).__name__} {short(got)}",
            hint=hint,
        )


def expect_equal(got, expected, what: str, input=None, hint=None):
    if got != expected:
        raise CheckFailed(what, input=input, expected=short(expected), got=short(got), hint=hint)


def same(a, b) -> bool:
    """Deep equality that understands tensors, containers and dataclasses."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and torch.equal(a, b)
        )
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if type(a) is type(b) and hasattr(a, "__dict__") and type(a).__eq__ is object.__eq__:
        return same(vars(a), vars(b))
    try:
        return bool(a == b)
    except Exception:
        return a is b


def call_without_mutation(fn, *args, names: tuple[str, ...] = ()):
    """Call ``fn(*args)``; fail the check if it changed any argument in place."""
    before = copy.deepcopy(args)
    result = fn(*args)
    for i, (old, new) in enumerate(zip(before, args, strict=True)):
        if not same(old, new):
            name = names[i] if i < len(names) else f"argument {i + 1}"
            raise CheckFailed(
                f"your code changed its input `{name}` in place",
                hint="build new values (e.g. torch.cat) instead of modifying the inputs",
            )
    return result
