"""Serving: the engine loop, and a simulator that runs it on the four caches of Lab 06."""

from kvlab.cache_kinds import CACHES, PAPER_NAMES
from kvlab.serve.engine import Engine, new_positions
from kvlab.serve.simulate import SimResult, make_cache, percentile, simulate

__all__ = [
    "CACHES",
    "PAPER_NAMES",
    "Engine",
    "SimResult",
    "make_cache",
    "new_positions",
    "percentile",
    "simulate",
]
