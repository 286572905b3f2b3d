"""The exercises: each lab's module (``kvlab.grading.labNN``) registers its exercises and their
named checks here when it is imported; ``get_exercise("03.block_manager")`` imports it on demand."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field


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


# kvlab's own answer to each exercise: the functions, classes and methods ("module:qualname") the
# exercise asks the learner to write, declared beside its checks (``own_answers``). The judge
# refuses them to the learner's code under that exercise's checks, on its side of the channel,
# and (a module-level name) puts a stand-in in their place in the learner's process
# (docs/grading-judge.md)
OWN_ANSWERS: dict[str, tuple[str, ...]] = {}


def own_answers(exercise_id: str, *names: str) -> None:
    """Declare what ``exercise_id`` asks for, as ``"kvlab.perf.tiers:fetch_seconds"``."""
    for name in names:
        module, sep, qualname = name.partition(":")
        if not sep or not module.startswith("kvlab.") or not qualname:
            raise ValueError(f"names must read 'kvlab.module:qualname', got {name!r}")
    OWN_ANSWERS[exercise_id] = (*OWN_ANSWERS.get(exercise_id, ()), *names)


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
