"""Argument checks that name the argument and what was expected."""

from __future__ import annotations

import numbers


def positive_int(name: str, value, minimum: int = 1) -> int:
    """Return ``value`` as an int, or raise naming ``name`` (bools are not counts)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def non_negative_number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if value < 0 or value != value:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return float(value)


def num_computed_of(num_computed, num_tokens: int) -> int | None:
    """``num_computed`` of a prompt being checked in (chunked prefill: how much of it has K/V so
    far), checked to be in 0..num_tokens; None stays None (all of it)."""
    if num_computed is None:
        return None
    positive_int("num_computed", num_computed, minimum=0)
    if num_computed > num_tokens:
        raise ValueError(
            f"num_computed must be in 0..{num_tokens} (the prompt's tokens), got {num_computed}"
        )
    return num_computed
