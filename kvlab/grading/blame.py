"""Whose code raised: an exception is blamed on the learner's code when a frame of the learner's
code (outside kvlab and outside installed libraries: a notebook cell) is in its traceback, and
explained in one or two lines that point at that line."""

from __future__ import annotations

import linecache
import os
import sys
import traceback
from pathlib import Path

from kvlab.grading.expect import CheckFailed
from kvlab.ops.runtime import TRITON_TOO_EARLY_MARK

_KVLAB_DIR = str(Path(__file__).resolve().parent.parent)
_GRADING_DIR = str(Path(__file__).resolve().parent) + os.sep
_LIBRARY_DIRS = tuple(
    str(Path(p).resolve()) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix} if p
)


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


def _remote(exc: BaseException):
    """What the learner's process said of an error raised there (``kvlab grade``'s judge)."""
    info = getattr(exc, "__kvlab_remote__", None)
    return info if isinstance(info, dict) else None


def learner_frames(exc: BaseException) -> list:
    remote = _remote(exc)
    if remote is not None:
        return ["<your code>"] if remote.get("learner") else []
    return [f for f in traceback.extract_tb(exc.__traceback__) if _is_learner_frame(f.filename)]


def explain_exception(exc: BaseException) -> list[str]:
    """One or two lines: the exception and, when it came from learner code, that line."""
    remote = _remote(exc)
    if remote is not None and isinstance(remote.get("lines"), list):
        return [str(line) for line in remote["lines"][:3]]
    # KeyError's str() is its key's repr: a sentence (kvlab's messages) would show in quotes
    sentence = isinstance(exc, KeyError) and len(exc.args) == 1 and " " in str(exc.args[0])
    text = exc.args[0] if sentence else exc
    message = " ".join(str(text).split())
    if len(message) > 200:
        message = message[:199] + "…"
    lines = [f"{type(exc).__name__}: {message}" if message else type(exc).__name__]
    learner = learner_frames(exc)
    if learner:
        frame = learner[-1]
        code = (frame.line or linecache.getline(frame.filename, frame.lineno)).strip()
        where = f"line {frame.lineno} of your code" + (f" ({frame.name})" if frame.name else "")
        lines.append(f"at {where}: {code}" if code else f"at {where}")
    return lines


def raised(error: BaseException, hint: str | None = None, **details):
    """The failure an error of the learner's code becomes: the error and its line, the hint of
    the slip it shows (that slip is its cause; else the error at that line)."""
    lines = "\n   ".join(explain_exception(error))
    return CheckFailed(lines, hint=hint, cause=hint or exception_cause(error), **details)


def exception_cause(exc: BaseException) -> str:
    """Two failures with the same exception raised at the same line share a cause."""
    remote = _remote(exc)
    if remote is not None:
        return str(remote.get("cause"))
    learner = learner_frames(exc)
    where = f"{learner[-1].filename}:{learner[-1].lineno}" if learner else str(exc)
    return f"{type(exc).__name__}@{where}"


def unwritten(exc: NotImplementedError) -> str | None:
    """The learner's function still to write when ``exc`` is its ``raise NotImplementedError``
    (or a check's deliberate report of it), else None: torch, Triton and other libraries raise
    NotImplementedError for their own reasons, which are ordinary errors.

    Returns the function's name (a method's for class exercises), or "?" when it has none.
    """
    remote = _remote(exc)
    if remote is not None:
        name = remote.get("unwritten")
        return name if isinstance(name, str) else None
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


def triton_too_early(exc: BaseException) -> bool:
    """Triton was imported before the interpreter was chosen (its message, anywhere in the chain)."""
    remote = _remote(exc)
    if remote is not None:
        return bool(remote.get("too_early"))
    return any(TRITON_TOO_EARLY_MARK in str(e) for e in exception_chain(exc))
