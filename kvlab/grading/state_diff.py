"""State diffs as tables: one row per field, compared in the order the report names a difference.

A :class:`Field` says what the report calls a field, how to read it (from the learner's object and
from kvlab's reference alike), how a difference is shown and phrased, and which hint it gets (a
hint only for the slip a difference shows). :func:`first_difference` compares two states read
with :func:`read`; :func:`changes` says in words what a call changed that had to change nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


def as_text(value) -> str:
    return str(value)


def each(show: Callable[[Any], str]) -> Callable[[Any, Any], tuple[str, str]]:
    """A pair shown value by value."""
    return lambda expected, got: (show(expected), show(got))


@dataclass(frozen=True)
class Field:
    """``read(*objects)`` is the field's value; ``show(expected, got)`` the two texts a report
    shows; ``says`` the report's message (a string formatted with the difference's context, or a
    function of the :class:`Difference`); ``hint(difference)`` the diagnosed slip, or None. With
    ``entries`` the value is a mapping compared entry by entry (``entry(key)`` names one)."""

    name: str
    read: Callable[..., Any]
    show: Callable[[Any, Any], tuple[str, str]] = each(as_text)
    says: str | Callable[[Difference], str] | None = None
    hint: Callable[[Difference], str | None] | None = None
    entries: bool = False
    entry: Callable[[Any], str] = as_text


@dataclass
class Difference:
    """A field (one entry of it, ``key``, for a field of entries) that differs, with what the
    lab knows around it (``context``: the guest who left, the mode, ...)."""

    field: Field
    expected: Any
    got: Any
    key: Any = None
    context: dict = field(default_factory=dict)

    def __getattr__(self, name):
        try:
            return self.__dict__["context"][name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def name(self) -> str:
        return self.field.entry(self.key) if self.field.entries else self.field.name

    @property
    def message(self) -> str:
        says = self.field.says
        if callable(says):
            return says(self)
        return (says or "{name} differs").format(name=self.name, **self.context)

    @property
    def shown(self) -> tuple[str, str]:
        return self.field.show(self.expected, self.got)

    @property
    def hint(self) -> str | None:
        return self.field.hint(self) if self.field.hint else None


def read(fields: Iterable[Field], *objects) -> dict:
    """A state: each field's value, read in the table's order."""
    return {f.name: f.read(*objects) for f in fields}


def first_difference(fields: Iterable[Field], expected: dict, got: dict, **context):
    """The first field (or entry, in ``expected``'s order) whose value in ``got`` differs from
    ``expected``'s, as a :class:`Difference`; None when the states agree on every field."""
    for f in fields:
        want, have = expected[f.name], got[f.name]
        if f.entries:
            for key in want:
                if have.get(key) != want[key]:
                    return Difference(f, want[key], have.get(key), key, context)
        elif have != want:
            return Difference(f, want, have, None, context)
    return None


def moved(before: dict, after: dict) -> list[str]:
    """The names of the fields whose values differ."""
    return [name for name in before if after[name] != before[name]]


def changes(fields: Iterable[Field], before: dict, after: dict) -> list[str]:
    """What changed, in words: each field that moved ("free rooms 3 → 2"), then each entry that
    did ("'a''s key card")."""
    fields = list(fields)
    said = [
        f"{f.name} {before[f.name]} → {after[f.name]}"
        for f in fields
        if not f.entries and after[f.name] != before[f.name]
    ]
    for f in fields:
        if f.entries:
            said += [
                f.entry(k) for k in before[f.name] if after[f.name].get(k) != before[f.name][k]
            ]
    return said
