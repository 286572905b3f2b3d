"""Lab 09's chunk launchers in the learner's process under ``kvlab grade`` (the checks, in
:mod:`kvlab.grading.lab09.chunk`, are hidden there; both take these from one module)."""

from kvlab.grading.launchers import BLOCK_Q, launch_chunk_kernel, make_chunk_case
from kvlab.grading.launchers import launch_chunk_isolated as launch_isolated

__all__ = ["BLOCK_Q", "launch_chunk_kernel", "launch_isolated", "make_chunk_case"]
