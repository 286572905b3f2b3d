"""Lab 05's launcher in the learner's process under ``kvlab grade`` (the checks are the judge's)."""

from kvlab.grading.launchers import launch_decode_isolated as launch_isolated

__all__ = ["launch_isolated"]
