"""Tell the learner's own code from a hand-over to kvlab's reference of the same exercise.

A wrapper such as ``lambda spec: spec.kv_bytes_per_token`` or ``lambda b, t, f: split_waste(b, t,
f)`` computes the right answer with kvlab's code, so no comparison of answers can catch it. While a
check calls the learner's code, :class:`refuse_reference` puts a guard in place of each reference
function (on its class or module, and wherever the learner's globals name it); the guard notes the
call, then does the reference's work as usual. Inside the ``with`` block only the learner's code
runs, so every call noted is a hand-over (a method inherited from kvlab's class included); on the
way out the check fails with a message that says what was handed over. The checks' own calls to
the reference, outside the block, are not affected.

(A profile hook would see every path, but it cannot be used here: after the time limit stops code
in a worker thread, CPython 3.11 spins on the next profiled call.)
"""

from __future__ import annotations

import functools
import inspect
import sys

from kvlab.grading.expect import CheckFailed

HANDOVER = "kvlab reference"  # the cause of every hand-over failure: later ones are folded


def methods_of(*classes) -> tuple:
    """Every method kvlab's classes define (not the dunders), to refuse as a whole: read from the
    classes, so methods kvlab adds are refused too."""
    return tuple(
        value
        for cls in classes
        for name, value in vars(cls).items()
        if inspect.isfunction(value) and not name.startswith("__")
    )


def _home(reference):
    """Where ``reference`` (a function, a method or a property) lives: (owner, attribute name)."""
    function = getattr(reference, "fget", reference)
    owner = sys.modules[function.__module__]
    *path, name = function.__qualname__.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, name


def _globals_of(learner) -> list[dict]:
    """The global namespaces the learner's function, class or instance runs in."""
    if not isinstance(learner, type) and not callable(learner):
        learner = type(learner)
    functions = vars(learner).values() if isinstance(learner, type) else [learner]
    spaces = {}
    for f in functions:
        f = getattr(f, "__func__", getattr(f, "fget", f))
        space = getattr(f, "__globals__", None)
        if isinstance(space, dict):
            spaces[id(space)] = space
    return list(spaces.values())


class refuse_reference:  # noqa: N801 (a context manager, named like contextlib's)
    """``with refuse_reference(split_waste, learner=fn, task="splitting the booking"): fn(...)``
    fails the check when ``fn`` called one of the given kvlab functions, methods or properties."""

    def __init__(self, *references, learner, task: str):
        self.references = references
        self.learner = learner
        self.task = task
        self.seen: list[str] = []
        self._undo: list = []

    def _guard(self, reference):
        function = getattr(reference, "fget", reference)
        name = f"{function.__module__}.{function.__qualname__}"  # not the learner's own class

        @functools.wraps(function)
        def guard(*args, **kwargs):
            self.seen.append(name)
            return function(*args, **kwargs)

        return property(guard) if isinstance(reference, property) else guard

    def _swap(self, space, key, original, guard, setter) -> None:
        setter(space, key, guard)
        self._undo.append((space, key, original, guard, setter))

    def __enter__(self):
        from kvlab.grading.remote import connection_of, is_remote

        self._remote = None
        originals = {}
        if is_remote(self.learner):  # kvlab grade's judge: the learner's code runs elsewhere,
            # and is guarded there; here, kvlab's objects it holds may be asked to do the work
            # (a scheduler's own step): the references are guarded in this process too
            self._remote = connection_of(self.learner) or _rooted_connection(self.learner)
            names = [_name(r) for r in self.references]
            self._remote.request("guard", names, self.learner, self.task)
        for reference in self.references:
            owner, name = _home(reference)
            guard = self._guard(reference)
            self._swap(owner, name, reference, guard, setattr)
            originals[id(reference)] = guard
        if self._remote is not None:
            return self
        for space in _globals_of(self.learner):
            for key, value in list(space.items()):
                if id(value) in originals:
                    self._swap(space, key, value, originals[id(value)], dict.__setitem__)
        return self

    def _restore(self) -> None:
        for space, key, original, guard, setter in reversed(self._undo):
            current = space.get(key) if isinstance(space, dict) else vars(space).get(key)
            if current is guard:
                setter(space, key, original)
        self._undo.clear()

    def __exit__(self, kind, error, traceback):
        if self._remote is not None:
            from kvlab.grading.remote import RemoteDied

            try:
                self.seen = list(self._remote.request("unguard")) + self.seen
            except RemoteDied:
                pass
            if kind is not None and issubclass(kind, RemoteDied):
                self._restore()
                return False
        self._restore()
        if self.seen and (kind is None or issubclass(kind, Exception)):
            name = self.seen[0]
            raise CheckFailed(
                f"your code hands the work to kvlab's `{name}`",
                hint=f"{self.task} yourself is the exercise: `{name}` is the reference your "
                "code is checked against, so calling it proves nothing",
                cause=HANDOVER,
            ) from None
        return False


def call_own(fn, *args, guard: tuple, task: str, where=None, replay=None, run=None):
    """``(fn(*args), None)``, or ``(None, error)`` when the learner's code raised (``run(fn,
    *args)`` makes the call, by default ``fn`` itself). A hand-over to one of ``guard`` fails the
    check (at ``where``, ``replay``); a function not written yet (NotImplementedError) passes
    through, for the runner to report."""
    try:
        with refuse_reference(*guard, learner=fn, task=task):
            return (run or (lambda f, *a: f(*a)))(fn, *args), None
    except CheckFailed as failure:
        failure.input = failure.input or where
        failure.replay = failure.replay or replay
        raise
    except NotImplementedError:
        raise
    except Exception as error:
        return None, error


def _name(reference) -> tuple[str, str]:
    """(module, qualname) of a reference function, method or property."""
    function = getattr(reference, "fget", reference)
    return function.__module__, function.__qualname__


def _rooted_connection(learner):
    session = getattr(learner, "_session", None) or getattr(learner, "_kvlab_session", None)
    return session.live() if session is not None else None
