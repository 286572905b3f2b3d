"""Checks for Lab 10: beyond one GPU.

:mod:`.radix` is ``10.match_prefix`` (the radix tree's walk, page by page, with a split, judged
against kvlab's tree with a shadow of the tokens each room holds), :mod:`.fleet`
``10.prefix_score`` (the prefix-aware router on replicas of the checks' making, then in
simulate_fleet), :mod:`.tiers` ``10.fetch_or_recompute``
(the rule behind a CPU tier, on model and GPU cards), :mod:`.hints` the hints.
"""

# the exercises register in the lab's order
from kvlab.grading.lab10 import radix, tiers, fleet  # isort: skip
from kvlab.grading.lab10.hints import *  # noqa: F403 (the hints, by name, for the tests)

__all__ = ["fleet", "radix", "tiers"]
