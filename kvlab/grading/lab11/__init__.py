"""Checks for Lab 11: rooms of many shapes.

:mod:`.window` is ``11.window`` (a sliding-window key card's hand-back step, played on days
against a shadow of every room), :mod:`.hybrid` ``11.hybrid`` (a hybrid model's layers grouped
and paged as vLLM v1 does, and what one request reserves), :mod:`.hints` the hints.
"""

from kvlab.grading.lab11 import window  # the exercises register in the lab's order

# isort: split
from kvlab.grading.lab11 import hybrid
from kvlab.grading.lab11.hints import *  # noqa: F403 (the hints, by name, for the tests)

__all__ = ["hybrid", "window"]
