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
import warnings
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
from kvlab.runtime import TRITON_TOO_EARLY_DETAILS, TRITON_TOO_EARLY_MARK

DEFAULT_TIMEOUT = float(os.environ.get("KVLAB_CHECK_TIMEOUT", "10"))
GRADE_LOG_VAR = "KVLAB_GRADE_LOG"  # set by `kvlab grade`: results are appended there as JSON lines
_KVLAB_DIR = str(Path(__file__).resolve().parent.parent)
_GRADING_DIR = str(Path(__file__).resolve().parent) + os.sep
_LIBRARY_DIRS = tuple(
    str(Path(p).resolve()) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix} if p
)


class CheckFailed(AssertionError):
    """A wrong answer: what went in, what should have come out, what came out.

    ``hint`` is advice for a *diagnosed* mistake only (the check recognised what went wrong); a
    check that does not know the cause leaves it out and the report says so neutrally. ``cause``
    names the diagnosed mistake (by default the hint itself): a later check that fails for the
    same cause is reported as "probably the same problem as above". ``replay`` says how to
    reproduce an input too long to show (a seed, a call).
    """

    def __init__(
        self,
        message="",
        *,
        input=None,
        expected=None,
        got=None,
        hint=None,
        cause=None,
        replay=None,
    ):
        super().__init__(message)
        self.message = message
        self.input = input
        self.expected = expected
        self.got = got
        self.hint = hint
        self.cause = cause if cause is not None else hint
        self.replay = replay


@dataclass
class Check:
    name: str
    func: object


@dataclass
class Exercise:
    id: str
    title: str
    expects: str = "function"  # "function" or "class": what the learner hands to check()
    checks: list[Check] = field(default_factory=list)
    # run each check in a forked child where possible, so code that crashes the process (Triton's
    # interpreter writing outside a tensor) fails one check instead of killing the kernel
    isolate: bool = False

    def check(self, name: str):
        """Decorator: register ``func(learner_obj)`` as one named check of this exercise.

        A check has no hint of its own: hints come with the mistake a check diagnoses
        (``CheckFailed(hint=...)``), so a learner is never told about a bug they did not make.
        """

        def register(func):
            self.checks.append(Check(name, func))
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
    """Import ``kvlab.grading.labNN`` (which registers its exercises) and list them.

    A module that fails to import takes back what it registered, so a second attempt reports the
    same error instead of "defined twice".
    """
    before = set(EXERCISES)
    try:
        importlib.import_module(f"kvlab.grading.lab{lab}")
    except ModuleNotFoundError as e:
        if e.name != f"kvlab.grading.lab{lab}":
            _forget(set(EXERCISES) - before)
            raise
    except BaseException:
        _forget(set(EXERCISES) - before)
        raise
    return [ex for ex in EXERCISES.values() if lab_of(ex.id) == lab]


def _forget(exercise_ids: set[str]) -> None:
    for exercise_id in exercise_ids:
        del EXERCISES[exercise_id]


def get_exercise(exercise_id: str) -> Exercise:
    if not isinstance(exercise_id, str):
        raise TypeError(f"exercise_id must be a str like '00.kv_bytes', got {exercise_id!r}")
    load_lab(lab_of(exercise_id))
    if exercise_id not in EXERCISES:
        known = ", ".join(sorted(EXERCISES)) or "none"
        raise KeyError(f"unknown exercise {exercise_id!r}; known exercises: {known}")
    return EXERCISES[exercise_id]


# --- outcomes and results --------------------------------------------------------------------

PASS_MARK = "✔"  # text glyphs (DejaVu has them): legible where no colour-emoji font is installed
FAIL_MARK = "✘"
NO_DIAGNOSIS = "the checks do not recognise this mistake"
SAME_PROBLEM = "probably the same problem as above"
# causes the harness itself gives; a check's own causes are its hints or its `cause=` keys
TIMEOUT_CAUSE = "kvlab: time limit"


@dataclass
class Outcome:
    name: str
    passed: bool
    details: list[str] = field(default_factory=list)
    cause: str | None = None  # the diagnosed mistake, to fold later failures with the same cause
    unimplemented: str | None = None  # the learner's function that still raises NotImplementedError
    warnings: list[str] = field(default_factory=list)  # warnings raised while it ran (hidden)


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

    @property
    def unwritten(self) -> list[str]:
        """The learner's methods (or function) that still raise NotImplementedError."""
        names = [o.unimplemented for o in self.outcomes if o.unimplemented]
        return list(dict.fromkeys(names))

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

    @property
    def warnings(self) -> list[str]:
        """Distinct warnings raised during the checks (by the learner's code or the libraries
        it calls, e.g. NumPy inside Triton's interpreter)."""
        return list(dict.fromkeys(w for o in self.outcomes for w in o.warnings))

    def report(self) -> str:
        head = f"{self.exercise} · {self.title}"
        unwritten = [n for n in self.unwritten if n != "?"]
        names = ", ".join(f"`{n}`" for n in unwritten)
        if self.status == "not implemented":
            verb = "raise" if len(unwritten) > 1 else "raises"
            where = f" ({names} still {verb} NotImplementedError)" if names else ""
            return (
                f"{head}: not implemented yet (0/{self.total}){where}\n"
                "→ Replace `raise NotImplementedError` in the exercise cell above with your code,\n"
                "  run that cell, then run this one again."
            )
        lines = [f"{head}: {self.passed}/{plural(self.total, 'check')} passed"]
        if unwritten:
            lines[0] += f" (still to write: {names})"
        for o in self.outcomes:
            lines.append(f"{PASS_MARK if o.passed else FAIL_MARK} {o.name}")
            lines.extend(f"   {d}" for d in o.details)
        if self.printed_chars:
            lines.append(
                f"note: your code printed {plural(self.printed_chars, 'character')} during the checks (hidden)"
            )
        if self.warnings:
            first = (
                self.warnings[0] if len(self.warnings[0]) <= 120 else self.warnings[0][:119] + "…"
            )
            lines.append(
                f"note: {plural(len(self.warnings), 'warning')} during the checks (hidden), "
                f"e.g. {first}"
            )
        if self.status == "passed":
            lines.append("All checks passed. Well done!")
        return "\n".join(lines)


# --- explaining failures ---------------------------------------------------------------------


def plural(n: int, word: str, many: str | None = None) -> str:
    """``plural(1, "room")`` is "1 room", ``plural(3, "room")`` "3 rooms"."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


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


def preview(vector, n: int = 4) -> str:
    """The first values of a tensor: enough to compare by eye."""
    values = ", ".join(f"{x:.4g}" for x in vector.reshape(-1)[:n].tolist())
    return f"[{values}{', …' if vector.numel() > n else ''}] ({plural(vector.numel(), 'value')})"


def _learner_frames(exc: BaseException) -> list:
    return [f for f in traceback.extract_tb(exc.__traceback__) if _is_learner_frame(f.filename)]


def explain_exception(exc: BaseException) -> list[str]:
    """One or two lines: the exception and, when it came from learner code, that line."""
    message = " ".join(str(exc).split())
    if len(message) > 200:
        message = message[:199] + "…"
    lines = [f"{type(exc).__name__}: {message}" if message else type(exc).__name__]
    learner = _learner_frames(exc)
    if learner:
        frame = learner[-1]
        code = (frame.line or linecache.getline(frame.filename, frame.lineno)).strip()
        where = f"line {frame.lineno} of your code" + (f" ({frame.name})" if frame.name else "")
        lines.append(f"at {where}: {code}" if code else f"at {where}")
    return lines


def _exception_cause(exc: BaseException) -> str:
    """Two failures with the same exception raised at the same line share a cause."""
    learner = _learner_frames(exc)
    where = f"{learner[-1].filename}:{learner[-1].lineno}" if learner else str(exc)
    return f"{type(exc).__name__}@{where}"


def failure_details(failure: CheckFailed) -> list[str]:
    details = [failure.message] if failure.message else []
    if failure.input is not None:
        details.append(f"input:    {failure.input}")
    if failure.replay is not None:
        details.append(f"replay:   {failure.replay}")
    if failure.expected is not None:
        details.append(f"expected: {failure.expected}")
    if failure.got is not None:
        details.append(f"got:      {failure.got}")
    if failure.hint:
        details.append(f"hint:     {failure.hint}")
    elif failure.expected is not None and failure.got is not None:
        details.append(f"note:     {NO_DIAGNOSIS}: compare expected with got")
    else:
        details.append(f"note:     {NO_DIAGNOSIS}")
    return details


def _unwritten(exc: NotImplementedError) -> str | None:
    """The learner's function still to write when ``exc`` is its ``raise NotImplementedError``
    (or a check's deliberate report of it), else None: torch, Triton and other libraries raise
    NotImplementedError for their own reasons, which are ordinary errors.

    Returns the function's name (a method's for class exercises), or "?" when it has none.
    """
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return None
    raiser = frames[-1].filename
    deliberate = str(Path(raiser).resolve()).startswith(_GRADING_DIR) if raiser else False
    if not (_is_learner_frame(raiser) or deliberate):
        return None
    named = [f.name for f in frames if _is_learner_frame(f.filename) and not f.name.startswith("<")]
    return named[-1] if named else "?"


def exception_chain(exc: BaseException | None):
    """``exc``, then what it was raised from or during, outermost first (Triton wraps errors)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _triton_too_early(exc: BaseException) -> bool:
    """Triton was imported before the interpreter was chosen (its message, anywhere in the chain)."""
    return any(TRITON_TOO_EARLY_MARK in str(e) for e in exception_chain(exc))


# --- running ---------------------------------------------------------------------------------


def _run_one(check_: Check, obj, timeout: float, out: BoundedBuffer) -> Outcome:
    """Run one check and say what happened, blaming the learner's code only when it is at fault."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # once per place: a warning in a loop is one entry
        outcome = _run_caught(check_, obj, timeout, out)
    outcome.warnings = list(
        dict.fromkeys(f"{w.category.__name__}: {' '.join(str(w.message).split())}" for w in caught)
    )[:5]
    return outcome


def _run_caught(check_: Check, obj, timeout: float, out: BoundedBuffer) -> Outcome:
    name = check_.name
    try:
        with captured_output(out), time_limit(timeout):
            check_.func(obj)
    except CheckFailed as f:
        return Outcome(name, False, failure_details(f), cause=f.cause)
    except CheckTimeout:
        return _timed_out(name, timeout)
    except SystemExit as e:
        details = [f"your code called exit({e.code!r}); return a value instead"]
        return Outcome(name, False, details + explain_exception(e)[1:], cause="kvlab: exit")
    except Exception as e:  # RecursionError included
        method = _unwritten(e) if isinstance(e, NotImplementedError) else None
        if method is not None:
            what = "your code" if method == "?" else f"`{method}`"
            details = [f"not implemented yet: {what} still raises NotImplementedError"]
            return Outcome(
                name, False, details, cause=f"kvlab: unwritten {method}", unimplemented=method
            )
        if _triton_too_early(e):
            return Outcome(
                name, False, list(TRITON_TOO_EARLY_DETAILS), cause="kvlab: triton too early"
            )
        details = explain_exception(e)
        if not _learner_frames(e):
            details.insert(0, "calling your code failed:")
        return Outcome(name, False, details, cause=_exception_cause(e))
    return Outcome(name, True)


def _timed_out(name: str, timeout: float) -> Outcome:
    details = [f"your code did not finish within {timeout:g} s (an endless loop?)"]
    return Outcome(name, False, details, cause=TIMEOUT_CAUSE)


CRASH_HINT = (
    "a load or store outside a tensor? mask every tl.load / tl.store (tokens past seq_len, "
    "lanes past HEAD_DIM, heads past GROUP) and stop at the key card's last room"
)


def _run_isolated(check_: Check, obj, timeout: float, out: BoundedBuffer) -> Outcome:
    """``_run_one`` in a forked child; a crash or a hang costs this check only."""

    def child():
        buffer = BoundedBuffer()
        outcome = _run_one(check_, obj, timeout, buffer)
        return outcome, buffer.text(), buffer.total

    try:
        outcome, text, total = in_child_process(child, timeout + 5)
    except CheckTimeout:
        return _timed_out(check_.name, timeout)
    except ChildCrashed as crash:
        if crash.signalled:
            details = [f"your code crashed the process ({crash.how})", f"hint:     {CRASH_HINT}"]
        else:
            details = [f"the check's process ended without a result ({crash.how})"]
        return Outcome(check_.name, False, details, cause=f"kvlab: crash {crash.how}")
    out.write(text)
    out.total += total - len(text)
    return outcome


TIMED_OUT_SKIP = "skipped: your code timed out in an earlier check"


def _fold(outcome: Outcome, earlier: dict[str, str]) -> None:
    """Shorten a failure whose cause an earlier check already explained."""
    if outcome.passed or outcome.cause is None:
        return
    if outcome.cause in earlier:
        if outcome.unimplemented:
            what = "your code" if outcome.unimplemented == "?" else f"`{outcome.unimplemented}`"
            outcome.details = [f"needs {what}, which is not written yet"]
        else:
            inputs = [d for d in outcome.details if d.startswith(("input:", "replay:"))]
            outcome.details = [f"{SAME_PROBLEM} (“{earlier[outcome.cause]}”)", *inputs]
    else:
        earlier[outcome.cause] = outcome.name


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
    reference = _kvlab_reference(obj)
    if reference:
        outcome = Outcome(
            "hand in your own code", False, [f"{reference} is kvlab's reference, not your exercise"]
        )
        return CheckResult(ex.id, ex.title, "wrong kind", [outcome], total)
    out = BoundedBuffer()
    outcomes: list[Outcome] = []
    causes: dict[str, str] = {}
    timed_out = False
    for check_ in ex.checks:
        if timed_out:  # one endless loop is enough to wait for
            outcomes.append(Outcome(check_.name, False, [TIMED_OUT_SKIP]))
            continue
        run = _run_isolated if ex.isolate and can_fork() else _run_one
        outcome = run(check_, obj, timeout, out)
        itself = outcome.unimplemented in ("?", getattr(obj, "__name__", None))
        if outcome.unimplemented and itself and not outcomes and not wanted_class:
            return CheckResult(ex.id, ex.title, "not implemented", [outcome], total)
        timed_out = outcome.cause == TIMEOUT_CAUSE
        _fold(outcome, causes)
        outcomes.append(outcome)
    if all(o.unimplemented for o in outcomes):
        return CheckResult(ex.id, ex.title, "not implemented", outcomes, total)
    status = "passed" if all(o.passed for o in outcomes) else "failed"
    return CheckResult(ex.id, ex.title, status, outcomes, total, out.total)


def _kvlab_reference(obj) -> str | None:
    """The name of kvlab's own function or class when ``obj`` is one, else None. (Wrappers that
    hand over to kvlab are caught by each lab's checks, e.g. ``own_code.refuse_reference``.)"""
    inner = getattr(obj, "fn", obj)  # a @triton.jit kernel wraps the Python function in .fn
    if str(getattr(inner, "__module__", "")).startswith("kvlab."):
        return getattr(inner, "__qualname__", repr(obj))
    return None


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


def tensor_bits(t):
    """A tensor's bytes, so that equality is bit for bit: NaN equals the same NaN, and a room
    full of NaN left alone counts as unchanged."""
    import torch

    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def same(a, b) -> bool:
    """Deep equality that understands tensors, containers and dataclasses."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and torch.equal(tensor_bits(a), tensor_bits(b))
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
                hint=f"leave `{name}` as it came in: build new values instead of modifying it",
            )
    return result
