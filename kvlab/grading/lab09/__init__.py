"""Checks for Lab 09: a token budget.

:mod:`.budget` is ``09.budget_step`` (one scheduler step under ``max_num_batched_tokens``, judged
in lockstep against kvlab's scheduler with 06.step's machinery), :mod:`.roofline` the roofline's
"almost free" chunk and the chosen chunk (``09.almost_free``, ``09.choose_chunk``), :mod:`.chunk`
attention for a prompt's chunk through the block table, in torch and in Triton
(``09.chunk_attention``, ``09.chunk_kernel``), :mod:`.hints` the hints.
"""
# ruff: noqa: F401 (the names the lab and the tests use, re-exported)

from kvlab.grading.lab09 import budget, chunk, roofline
from kvlab.grading.lab09.budget import DAYS, RULES, SLIPS, show_day, slipped_budget_step
from kvlab.grading.lab09.hints import *  # noqa: F403 (the hints, by name, for the tests)
