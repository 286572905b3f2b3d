"""kvlab's own answer to an exercise, kept from the learner's code by the judge.

Each lab declares, beside its checks, what an exercise asks the learner to write
(``registry.own_answers("10.match_prefix", "kvlab.core.prefix_cache.radix_tree:RadixTreeCache.match")``).
The judge keeps those names from the learner's code in two places the learner's process cannot
reach:

- **its own side** (:class:`Refusing`): while the exercise's checks run, each request the
  learner's process makes of the judge is served with those names swapped for refusals, so
  ``tree.match()`` on the judge's tree inside ``match_prefix`` is refused and flagged;
- **the learner's files** (:func:`stand_in_source`): a module-level name (a function, a class)
  is replaced, in the copy of its module the learner's process imports, by a stand-in that asks
  the judge, which computes it for the lab's given cells and refuses it under the exercise's
  checks. kvlab's code for it is not in that process, so no patch there brings it back.
"""

from __future__ import annotations

import ast
import importlib
import types


def split_name(name: str) -> tuple[str, str]:
    module, _, qualname = name.partition(":")
    return module, qualname


def dotted(name: str) -> str:
    """``module.qualname``, as the judge's notes and the gradebook name it."""
    return ".".join(split_name(name))


def _targets(name: str) -> list[tuple[object, str, str]]:
    """(owner, attribute, dotted name) of each function a name stands for: a function or a
    method itself, a class's own methods and properties."""
    module, qualname = split_name(name)
    owner = importlib.import_module(module)
    *path, last = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    value = vars(owner)[last] if isinstance(owner, type) else getattr(owner, last)
    if not isinstance(value, type):
        return [(owner, last, f"{module}.{qualname}")]
    found = []
    for attribute, member in vars(value).items():
        if attribute.startswith("__") and attribute != "__init__":
            continue
        if isinstance(member, (types.FunctionType, property, staticmethod, classmethod)):
            found.append((value, attribute, f"{module}.{qualname}.{attribute}"))
    return found


class Refusing:
    """Around one request the judge serves for the learner's code: the exercise's own answers
    swapped for refusals that note the hand-over on ``session.handovers``, then put back."""

    def __init__(self, session, exercise_id: str, names):
        self.session, self.exercise_id, self.names = session, exercise_id, names
        self._undo: list = []

    def _refusal(self, original, name: str):
        session, exercise_id = self.session, self.exercise_id

        def refused(*args, **kwargs):
            session.handovers = [*session.handovers, name]
            raise PermissionError(
                f"`{name}` is kvlab's own answer to {exercise_id}: your code may not call it "
                "while its checks run (write it yourself)"
            )

        if isinstance(original, property):
            return property(refused)
        if isinstance(original, (staticmethod, classmethod)):
            return type(original)(refused)
        return refused

    def __enter__(self):
        for name in self.names:
            for owner, attribute, full in _targets(name):
                original = vars(owner)[attribute] if isinstance(owner, type) else None
                original = original if original is not None else getattr(owner, attribute)
                setattr(owner, attribute, self._refusal(original, full))
                self._undo.append((owner, attribute, original))
        return self

    def __exit__(self, *exc):
        for owner, attribute, original in reversed(self._undo):
            setattr(owner, attribute, original)
        self._undo.clear()
        return False


STAND_IN_FUNCTION = '''def {name}(*args, **kwargs):
    """kvlab's own answer to {exercise}: computed by kvlab grade's judge for the lab's given
    cells, refused to your code while {exercise} is checked."""
    from kvlab.grading.judge_child import served

    return served({full!r}, *args, **kwargs)
'''

STAND_IN_CLASS = '''class {name}:
    """kvlab's own answer to {exercise}: the grader's, which makes it for the lab's given cells
    and refuses it to your code while {exercise} is checked; it is no base class here."""

    def __new__(cls, *args, **kwargs):
        from kvlab.grading.judge_child import served

        return served({full!r}, *args, **kwargs)

    def __init_subclass__(cls, **kwargs):
        raise TypeError(
            "{name} is kvlab's own answer to {exercise} and is no base class under kvlab grade: "
            "write your own"
        )
'''


def stand_in_source(source: str, module: str, names: dict[str, str]) -> str:
    """``source`` of ``module`` with each top-level function or class in ``names`` (qualname ->
    exercise id) replaced by a stand-in that asks the judge."""
    lines = source.splitlines(keepends=True)
    spans = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            template = STAND_IN_CLASS if isinstance(node, ast.ClassDef) else STAND_IN_FUNCTION
            text = template.format(
                name=node.name, exercise=names[node.name], full=f"{module}.{node.name}"
            )
            spans.append((first - 1, node.end_lineno, text))
    if len(spans) != len(names):
        raise ValueError(f"{module} lacks a top-level definition of one of {sorted(names)}")
    for start, end, text in sorted(spans, reverse=True):
        lines[start:end] = [text]
    return "".join(lines)


def learner_stand_ins(exercise_ids) -> dict[str, dict[str, str]]:
    """module -> {top-level name: exercise id}: what the learner's process gets stand-ins for
    (methods are refused on the judge's side only: kvlab's own classes need them)."""
    from kvlab.grading.registry import OWN_ANSWERS

    found: dict[str, dict[str, str]] = {}
    for exercise_id in exercise_ids:
        for name in OWN_ANSWERS.get(exercise_id, ()):
            module, qualname = split_name(name)
            if "." not in qualname:
                found.setdefault(module, {})[qualname] = exercise_id
    return found
