"""The kinds of KV cache the course compares, named once.

Lab 01's booking policies, Lab 06's simulator, the planner and the tiny model all speak of the
same four caches: the PagedAttention paper's three contiguous baselines (Orca-Max, Orca-Pow2,
Orca-Oracle) and the paged cache. Their names, the booking policy behind each contiguous one and
the paper's name for each live here, so that no module keeps a table of its own that could drift.
"""

from __future__ import annotations

# contiguous booking policies: the whole max length, a power of two, exactly the final length
POLICIES = ("max", "pow2", "oracle")
# older names still accepted (normalized by booking_policy); "exact" was Lab 01's first name
POLICY_ALIASES = {"exact": "oracle"}

# cache name -> the contiguous booking policy behind it (None: the paged cache)
CACHES = {
    "contiguous": "max",
    "contiguous-pow2": "pow2",
    "contiguous-oracle": "oracle",
    "paged": None,
}
# cache name -> the name the PagedAttention paper (Kwon et al. 2023) gives that system
PAPER_NAMES = {
    "contiguous": "Orca (Max)",
    "contiguous-pow2": "Orca (Pow2)",
    "contiguous-oracle": "Orca (Oracle)",
    "paged": "vLLM (paged)",
}
# booking policy -> the paper's name (what Lab 01 prints next to its measurements)
POLICY_PAPER_NAMES = {policy: PAPER_NAMES[cache] for cache, policy in CACHES.items() if policy}

# the caches the tiny model generates with (it books whole max-length slots when contiguous)
TINY_CACHES = ("contiguous", "paged")


def booking_policy(policy: str) -> str:
    """``policy`` as one of :data:`POLICIES` (an alias such as ``"exact"`` becomes ``"oracle"``);
    ValueError for anything else."""
    if isinstance(policy, str):
        policy = POLICY_ALIASES.get(policy, policy)
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    return policy


__all__ = [
    "CACHES",
    "PAPER_NAMES",
    "POLICIES",
    "POLICY_ALIASES",
    "POLICY_PAPER_NAMES",
    "TINY_CACHES",
    "booking_policy",
]
