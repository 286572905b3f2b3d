"""Checks for Lab 11: rooms of many shapes.

:mod:`.window` is ``11.window`` (a sliding-window key card's hand-back step, played on days
against a shadow of every room), :mod:`.latent` ``11.latent`` (attention over an MLA latent
cache with the up-projections absorbed, against the expanded per-head K/V), :mod:`.quantize`
``11.quantize`` (K and V stored in fp8 or int8 with a scale per token and KV head),
:mod:`.dequant` ``11.dequant`` (Lab 05's kernel reading those labels beside its beds),
:mod:`.hybrid` ``11.hybrid`` (a hybrid model's layers grouped and paged as vLLM v1 does, and
what one request reserves), :mod:`.hints` the hints.
"""

# the exercises register in the lab's order
from kvlab.grading.lab11 import window, latent, quantize, dequant, hybrid  # isort: skip
from kvlab.grading.lab11.hints import *  # noqa: F403 (the hints, by name, for the tests)

__all__ = ["dequant", "hybrid", "latent", "quantize", "window"]
