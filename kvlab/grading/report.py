"""What a run of an exercise's checks found, and the short text report a check cell prints."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

from kvlab.grading.expect import CheckFailed, plural

PASS_MARK = "✔"  # text glyphs (DejaVu has them): legible where no colour-emoji font is installed
FAIL_MARK = "✘"
NO_DIAGNOSIS = "the checks do not recognise this mistake"
SAME_PROBLEM = "probably the same problem as above"
# Reports are wrapped here, on words: JupyterLab wraps long output lines anywhere, mid-word.
REPORT_WIDTH = 96
_WORD = re.compile(r"(?:`[^`]*`|[^\s`])+|`")  # code in backticks is never cut
_LABEL = re.compile(r"(input|replay|expected|got|hint|note|at line \d+[^:]*):\s+")


def wrap(line: str, indent: str = "", width: int = REPORT_WIDTH) -> list[str]:
    """``indent + line`` cut on spaces to ``width`` columns; continuations line up after a
    leading label (``hint:     ``) or two spaces in. Lines that fit stay as they are; code in
    backticks and a word longer than a line stay whole (the browser may cut that one)."""
    out = []
    for part in line.split("\n"):
        if len(indent) + len(part) <= width:
            out.append(indent + part)
            continue
        label = _LABEL.match(part)
        head, rest = (part[: label.end()], part[label.end() :]) if label else ("", part)
        hang = indent + " " * (len(head) or 2)
        current, empty = indent + head, True
        for word in _WORD.findall(rest):
            if not empty and len(current) + 1 + len(word) > width:
                out.append(current)
                current, empty = hang + word, False
            else:
                current += word if empty else " " + word
                empty = False
        out.append(current)
    return out


class Status(Enum):
    """How one check, or a whole exercise, came out. A check is passed, failed (a wrong answer),
    error (the learner's code raised or exited), not implemented, stopped at its time limit
    (``TIMED_OUT``, tried twice), crashed (an isolated check's process died) or skipped (after
    a time-out); an exercise is passed, failed, stopped at limit (a check of it was), not
    implemented or wrong kind (not a function/class of the learner's), and ``kvlab grade`` says
    not run for one whose check cell never ran."""

    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    NOT_IMPLEMENTED = "not implemented"
    TIMED_OUT = "stopped at limit"
    CRASHED = "crashed"
    SKIPPED = "skipped"
    WRONG_KIND = "wrong kind"
    NOT_RUN = "not run"


@dataclass
class Outcome:
    name: str
    status: Status
    details: list[str] = field(default_factory=list)
    cause: str | None = None  # the diagnosed mistake, to fold later failures with the same cause
    unimplemented: str | None = None  # the learner's function that still raises NotImplementedError
    warnings: list[str] = field(default_factory=list)  # warnings raised while it ran (hidden)
    # the learner's code handed the work to kvlab's own (a guard refused it): the gradebook's
    # hand-over flag. Set by the runner for kvlab's cause, by a guard that sets it on its failure.
    handover: bool = False

    @property
    def passed(self) -> bool:
        return self.status is Status.PASSED


@dataclass
class CheckResult:
    """What ``check`` returns. It shows nothing when it is a cell's last value: the report was
    already printed."""

    exercise: str
    title: str
    status: Status  # PASSED, FAILED, NOT_IMPLEMENTED or WRONG_KIND
    outcomes: list[Outcome]
    total: int
    printed_chars: int = 0
    handed_over: str | None = None  # what of kvlab's the judge refused to the learner's code

    @property
    def passed(self) -> int:
        return sum(o.passed for o in self.outcomes)

    @property
    def score(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def ok(self) -> bool:
        return self.status is Status.PASSED

    @property
    def unwritten(self) -> list[str]:
        """The learner's methods (or function) that still raise NotImplementedError."""
        names = [o.unimplemented for o in self.outcomes if o.unimplemented]
        return list(dict.fromkeys(names))

    def __repr__(self):
        return f"<CheckResult {self.exercise}: {self.passed}/{self.total} {self.status.value}>"

    def _ipython_display_(self):
        pass

    @property
    def timed_out(self) -> int:
        """Checks stopped at their time limit (after their second try)."""
        return sum(o.status is Status.TIMED_OUT for o in self.outcomes)

    @property
    def handover(self) -> bool:
        """A check found the learner's code handing the work to kvlab's own, or the judge
        refused it kvlab's answer (``handed_over`` names it)."""
        return self.handed_over is not None or any(o.handover for o in self.outcomes)

    def to_dict(self) -> dict:
        return {
            "exercise": self.exercise,
            "title": self.title,
            "status": self.status.value,
            "passed": self.passed,
            "total": self.total,
            "timed_out": self.timed_out,
            "handover": self.handover,
            "handed_over": self.handed_over,
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
        if self.status is Status.NOT_IMPLEMENTED:
            verb = "raise" if len(unwritten) > 1 else "raises"
            where = f" ({names} still {verb} NotImplementedError)" if names else ""
            lines = wrap(f"{head}: not implemented yet (0/{self.total}){where}")
            lines.append(
                "→ Replace `raise NotImplementedError` in the exercise cell above with your code,\n"
                "  run that cell, then run this one again."
            )
            return "\n".join(lines)
        first = f"{head}: {self.passed}/{plural(self.total, 'check')} passed"
        if unwritten:
            first += f" (still to write: {names})"
        lines = wrap(first)
        for o in self.outcomes:
            lines += wrap(f"{PASS_MARK if o.passed else FAIL_MARK} {o.name}")
            lines.extend(w for d in o.details for w in wrap(d, "   "))
        if self.printed_chars:
            lines += wrap(
                f"note: your code printed {plural(self.printed_chars, 'character')} during the checks (hidden)"
            )
        if self.warnings:
            example = (
                self.warnings[0] if len(self.warnings[0]) <= 120 else self.warnings[0][:119] + "…"
            )
            lines += wrap(
                f"note: {plural(len(self.warnings), 'warning')} during the checks (hidden), "
                f"e.g. {example}"
            )
        if self.status is Status.PASSED:
            lines.append("All checks passed. Well done!")
        return "\n".join(lines)


def failure_details(failure: CheckFailed) -> list[str]:
    """The report's lines for a wrong answer: message, input, replay, expected, got, then the
    hint, or the neutral note when the mistake was not recognised."""
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
