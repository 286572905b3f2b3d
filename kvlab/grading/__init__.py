"""Autograder: ``check("00.kv_bytes", kv_bytes_per_token)`` in a notebook, ``kvlab grade`` outside."""

from kvlab.grading.core import EXERCISES, CheckFailed, CheckResult, check, get_exercise, run_checks

__all__ = ["EXERCISES", "CheckFailed", "CheckResult", "check", "get_exercise", "run_checks"]
