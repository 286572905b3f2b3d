"""Autograder: ``check("00.kv_bytes", kv_bytes_per_token)`` in a notebook, ``kvlab grade`` outside.

Layout: ``registry`` (exercises and their checks), ``runner`` (running them: time limits, isolation,
folding), ``report`` (outcomes, statuses and the printed report), ``blame`` (whose code raised),
``expect`` (helpers for writing checks), ``class_driver`` (calls on a learner's class, beside
kvlab's reference), ``own_code`` (hand-overs to kvlab), ``limits`` and ``notebook`` (``kvlab grade``).
"""

from kvlab.grading.expect import CheckFailed
from kvlab.grading.registry import EXERCISES, get_exercise
from kvlab.grading.report import CheckResult, Status
from kvlab.grading.runner import check, run_checks

__all__ = [
    "EXERCISES",
    "CheckFailed",
    "CheckResult",
    "Status",
    "check",
    "get_exercise",
    "run_checks",
]
