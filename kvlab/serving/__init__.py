"""Serving: sequences and the scheduler, the engine loop, replays, the simulator of Lab 06, the
sharing measurements of Lab 07, the fleet of Lab 10 and the workloads they run.

The engine's and simulator's main names are importable from here (``from kvlab.serving import
simulate`` is the function; its module is ``kvlab.serving.simulate``).
"""

from kvlab.core.cache_kinds import CACHES, PAPER_NAMES
from kvlab.serving.config import EngineConfig
from kvlab.serving.engine import Engine, new_positions
from kvlab.serving.fleet import FleetResult, ReplicaView, simulate_fleet
from kvlab.serving.simulate import SimResult, make_cache, percentile, simulate

__all__ = [
    "CACHES",
    "PAPER_NAMES",
    "Engine",
    "EngineConfig",
    "FleetResult",
    "ReplicaView",
    "SimResult",
    "make_cache",
    "new_positions",
    "percentile",
    "simulate",
    "simulate_fleet",
]
