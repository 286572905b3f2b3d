"""Structures the checks hand to the learner's code as inputs.

The judge sends a check's inputs to the learner's process by value, naming each object's class by
its module; the graders are hidden in that process, so a class the inputs are made of lives here,
among the few modules of ``kvlab.grading`` that process keeps (``judge.CHILD_RUNTIME``).
"""

from __future__ import annotations

from typing import NamedTuple


class CachedBlock(NamedTuple):
    """Lab 07: a cached room, as the lab's cell defines it: what the checks put in ``cached``."""

    block_id: int
    parent_hash: int
    token_ids: tuple
