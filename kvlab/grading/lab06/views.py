"""The hints of errors in Lab 06's exercises whose message names the mistake (what the checks read
of a scheduler and show of it is :mod:`kvlab.grading.scheduler_views`)."""

from __future__ import annotations

from kvlab.core.block_manager import PagedCache
from kvlab.core.contiguous import ContiguousKVCache
from kvlab.grading.blame import learner_frames
from kvlab.grading.lab06 import hints
from kvlab.grading.scheduler_views import STEP  # noqa: F401 (by its old path)

# --- errors that name their mistake ----------------------------------------------------------


def error_slip(error: Exception, step: bool = False) -> str | None:
    """The hint for an error whose message names its mistake (``step``: raised in 06.step)."""
    text = str(error)
    if isinstance(error, KeyError) and "Sequence(seq_id=" in text:
        return hints.PASS_ID
    if isinstance(error, TypeError) and "must be a kvlab.serving.scheduler.Sequence" in text:
        return hints.SEQ_TO_SCHEDULER
    if isinstance(error, AttributeError) and error.name == "free":
        if isinstance(error.obj, PagedCache | ContiguousKVCache):
            return hints.FREE_STEP if step else hints.FREE
    if isinstance(error, ValueError) and "is not in the queue (status" in text:
        return hints.POPLEFT  # Scheduler.admit of a guest the learner took off the queue
    frames = learner_frames(error)
    line = (frames[-1].line or "") if frames else ""
    if isinstance(error, TypeError) and "NoneType" in text and "not supported between" in text:
        if "max_batch" in line:
            return hints.MAX_BATCH_NONE
    if isinstance(error, RuntimeError) and text == "deque mutated during iteration":
        if step and "waiting" in line and line.lstrip().startswith("for "):
            return hints.WALK_QUEUE
    return None
