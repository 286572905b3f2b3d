"""One driver for the class exercises (Lab 01's cache, Lab 03's block manager).

A check makes calls on an object of the learner's class through a :class:`ClassDriver`: each call
goes into a transcript that a failure shows (the call that failed marked with →), runs under the
guard that refuses a hand-over to kvlab's own class, and, when the check runs kvlab's reference
beside it, is made on the reference too so that the lab can compare the two. A call that must be
refused has to raise the right error and change nothing. What the messages say (why a call should
work, which fix a wrong refusal needs, what a change means) is each lab's, in the hooks
:meth:`~ClassDriver.explain_error`, :meth:`~ClassDriver.not_refused`, :meth:`~ClassDriver.state`
and :meth:`~ClassDriver.changed`.
"""

from __future__ import annotations

from collections.abc import Callable

from kvlab.grading.blame import explain_exception
from kvlab.grading.expect import CheckFailed, plural
from kvlab.grading.own_code import refuse_reference


def _runs(calls: list[str]) -> list[str]:
    """Repeated calls in a row shown once, with a count."""
    out: list[str] = []
    count = 0
    for i, call in enumerate(calls):
        count += 1
        if i + 1 == len(calls) or calls[i + 1] != call:
            out.append(call if count == 1 else f"{call} ×{count}")
            count = 0
    return out


class Transcript:
    """The calls made so far, the last one (where the check failed) marked with →. Past ``shown``
    entries it is cut to the first two and the last ``shown - 3``; ``replay``, given the number of
    calls made, then says how to see them all. With ``runs``, repeated calls in a row are shown
    once with a count (×3) and the cut says how many entries it hides; with ``echo`` every call is
    printed as it is made."""

    def __init__(self, *, shown: int, runs: bool = False, echo: bool = False):
        self.calls: list[str] = []
        self.shown, self.runs, self.echo = shown, runs, echo
        self.replay: Callable[[int], str] | None = None

    def add(self, call: str) -> None:
        self.calls.append(call)
        if self.echo:
            print(call)

    def raised(self, error: BaseException) -> None:
        self.calls[-1] += f" raised {type(error).__name__}"
        if self.echo:
            print(f"  raised {type(error).__name__}")

    def _entries(self) -> list[str]:
        before = _runs(self.calls[:-1]) if self.runs else self.calls[:-1]
        return [*before, f"→ {self.calls[-1]}"]

    def where(self) -> str:
        entries = self._entries()
        if len(entries) > self.shown:
            hidden = len(entries) - self.shown + 1
            gap = f"… {plural(hidden, 'call')} …" if self.runs else "…"
            entries = [*entries[:2], gap, *entries[-(self.shown - 3) :]]
        return "; ".join(entries)

    def replay_text(self) -> str | None:
        if self.replay is None or len(self._entries()) <= self.shown:
            return None
        return self.replay(len(self.calls) - 1)


class ClassDriver:
    """An object of the learner's class, built with ``args`` and driven by a check (see the
    module's docstring). ``name`` is the class as the transcript shows it (its own name by
    default); ``reference``, when given, is kvlab's object that :meth:`twin` makes the same calls
    on."""

    guarded: tuple = ()  # kvlab's functions and methods: calling one is handing the work over
    task = "the exercise"  # what the learner does themselves, for the hand-over message
    shown = 6  # transcript entries shown before it is cut
    runs = False  # show repeated calls in a row once, with a count

    def __init__(self, cls, *args, name: str | None = None, reference=None, echo: bool = False):
        self.cls = cls
        self.name = name or cls.__name__
        self.reference = reference
        self.transcript = Transcript(shown=self.shown, runs=self.runs, echo=echo)
        self.obj = self.call(None, *args)

    # --- failing, with the transcript --------------------------------------------------------
    def fail(self, message: str, hint: str | None = None, **details):
        raise CheckFailed(
            message,
            input=self.transcript.where(),
            replay=self.transcript.replay_text(),
            hint=hint,
            **details,
        )

    # --- calls -------------------------------------------------------------------------------
    def _shown(self, method: str | None, args) -> str:
        call = f"({', '.join(map(repr, args))})"
        return f"{self.name}{call}" if method is None else f".{method}{call}"

    def _guarded(self, method: str | None, args):
        """The learner's ``method(*args)`` (their constructor for None); a hand-over to kvlab's
        class fails the check. The method is looked up inside the guard, so an inherited one is
        the guard."""
        try:
            with refuse_reference(*self.guarded, learner=self.cls, task=self.task):
                return self.cls(*args) if method is None else getattr(self.obj, method)(*args)
        except CheckFailed as handover:
            self.fail(handover.message, hint=handover.hint, cause=handover.cause)

    def attempt(self, method: str | None, *args, log: bool = True):
        """Make one call on the learner's object: ``(value, None)``, or ``(None, error)`` when
        their code raised (marked in the transcript). A method not written yet
        (NotImplementedError) and a failed check pass through. With ``log=False`` the call shows
        in the transcript only when it raises (the check's own look at the object)."""
        if log:
            self.transcript.add(self._shown(method, args))
        try:
            return self._guarded(method, args), None
        except (NotImplementedError, CheckFailed):
            raise
        except Exception as error:
            if not log:
                self.transcript.add(self._shown(method, args))
            self.transcript.raised(error)
            return None, error

    def call(self, method: str | None, *args, log: bool = True, **context):
        """A call that should work: its value. An error fails the check, with what
        :meth:`explain_error` makes of it (``context`` is for that hook)."""
        value, error = self.attempt(method, *args, log=log)
        if error is None:
            return value
        message, hint = self.explain_error(error, method, args, **context)
        lines = explain_exception(error)
        self.fail(
            message,
            expected="no error",
            got=lines[0] + (f" ({lines[1]})" if len(lines) > 1 else ""),
            hint=hint,
            cause=hint or f"{type(error).__name__} {lines[-1]}",
        )

    def twin(self, method: str, *args, **context):
        """:meth:`call` on the learner's object, then the same call on kvlab's reference."""
        value = self.call(method, *args, **context)
        getattr(self.reference, method)(*args)
        return value

    def refused(self, errors, method: str, *args, **context) -> None:
        """A call that must raise one of ``errors`` (an exception class or a tuple of them) and
        change nothing: what :meth:`state` reads is the same before and after. The reference is
        not called. ``context`` is for :meth:`not_refused`."""
        before = self.state()
        _, error = self.attempt(method, *args)
        if not isinstance(error, errors):
            self.not_refused(error, errors, **context)
        after = self.state()
        if after != before:
            self.changed(before, after, errors)

    # --- what each lab says ------------------------------------------------------------------
    def explain_error(self, error: Exception, method: str | None, args, **context):
        """(message, hint) for an error raised by a call that should work."""
        return "this call should work", None

    def not_refused(self, error: Exception | None, errors, **context) -> None:
        """Fail the check: a call that must raise one of ``errors`` raised ``error`` instead (None:
        it raised nothing)."""
        names = (
            errors.__name__ if isinstance(errors, type) else " or ".join(e.__name__ for e in errors)
        )
        got = "no error" if error is None else explain_exception(error)[0]
        self.fail("this call should be refused", expected=names, got=got)

    def state(self):
        """What a refused call must leave unchanged (None: nothing is compared)."""
        return None

    def changed(self, before, after, errors) -> None:
        """Fail the check: a refused call changed ``before`` into ``after``."""
        self.fail("a refused call must change nothing", expected=str(before), got=str(after))
