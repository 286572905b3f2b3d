"""Serving: sequences and the scheduler, the engine loop, replays, the simulator of Lab 06, the
sharing measurements of Lab 07, the fleet of Lab 10 and the workloads they run.

The engine's and simulator's main names are importable from here: ``from kvlab.serving import
simulate`` is the function, whose module is :mod:`kvlab.serving.simulation`. The module's old path
``kvlab.serving.simulate`` still imports it (``from kvlab.serving.simulate import SimResult``), as
every old path does (:mod:`kvlab._moved`), while the package's attribute stays the function.
"""

from kvlab import _moved
from kvlab.core.cache_kinds import CACHES, PAPER_NAMES
from kvlab.serving import simulation
from kvlab.serving.config import EngineConfig
from kvlab.serving.engine import Engine, new_positions
from kvlab.serving.fleet import FleetResult, ReplicaView, simulate_fleet
from kvlab.serving.simulation import SimResult, make_cache, percentile, simulate

_moved.keep_old_path("kvlab.serving.simulate", simulation)

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
