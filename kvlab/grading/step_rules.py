"""What Lab 06's and Lab 09's step checks share besides the lockstep: kvlab's functions a step
must not hand its work to, the hints of errors whose message names the mistake, the mistakes seen
in a step's outcome itself, how a slip of a step is written (:func:`step_slip`: kvlab's Scheduler
with one hook changed) and the usual slips of the queue (:data:`QUEUE_SLIPS`)."""

from __future__ import annotations

from kvlab.core.block_manager import PagedCache
from kvlab.core.contiguous import ContiguousKVCache
from kvlab.grading import step_hints as hints
from kvlab.grading.blame import learner_frames
from kvlab.grading.lockstep import Captured, StepHints, slipped
from kvlab.grading.scheduler_days import Day
from kvlab.grading.scheduler_views import REPORT_KEYS
from kvlab.grading.slips import Slip
from kvlab.grading.state_diff import moved
from kvlab.serving.scheduler import Scheduler

STEP_REFERENCE = (
    Scheduler.step,
    Scheduler.schedule,
    Scheduler._run,
    Scheduler.retire,
    Scheduler._serve_running,
    Scheduler._serve,
    Scheduler._admit_arrived,
    Scheduler._make_room,
)


def error_slip(error: Exception, step: bool = False) -> str | None:
    """The hint for an error whose message names its mistake (``step``: raised in a step)."""
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


def direct(day: Day, mine: Captured, expected: dict, queue: list) -> str | None:
    """Mistakes seen in the step's outcome itself, when no single slip explains it (``queue``:
    the waiting guests before the step)."""
    got = mine.view
    arrivals = {g[0]: g[3] for g in day.guests}
    if any(arrivals.get(g, 0) > mine.now for g in got["out.admitted"]):
        return hints.ARRIVAL
    head, refused = expected["out.refused"], got["out.refused"]
    if refused in queue and any(
        g in queue and queue.index(g) > queue.index(refused) for g in got["out.admitted"]
    ):
        return hints.FCFS  # checked in a guest standing behind one the cache refused in this step
    differ = moved(expected, got)
    if set(differ) <= {"out.refused", "out.refusal"} and head in queue and refused in queue:
        # all else as kvlab's, yet asked the cache for a guest behind the head
        if queue.index(refused) > queue.index(head):
            return hints.FCFS
    if day.max_batch is not None and len(got["scheduler.running"]) > day.max_batch:
        return hints.MAX_BATCH
    if differ == ["scheduler.num_preemptions"]:
        more = got["scheduler.num_preemptions"] > expected["scheduler.num_preemptions"]
        return hints.COUNTED_TWICE if more else hints.USE_PREEMPT
    if differ and all(k in REPORT_KEYS for k in differ) and got[differ[0]] in ([], None):
        return hints.REPORTED[differ[0]]  # done, not reported
    return None


# the hints of a step function's own mistakes
STEP_HINTS = StepHints(
    unsized=hints.REFUSAL_REMAINING,
    memory=hints.MEMORY,
    returned_none=hints.RETURN_STEP,
    step_type=hints.STEP_TYPE,
    ids=hints.SEQ_NOT_ID,
    error=lambda error: error_slip(error, step=True),
)

# --- the slips of a step: kvlab's Scheduler with one decision changed ----------------------


def variant(name: str, **hook) -> type[Scheduler]:
    """kvlab's Scheduler with one hook (a method, or PHASES: the order of a step) changed."""
    return type(name, (Scheduler,), hook)


def step_slip(mistake: str, answer: str | type, any_refused: bool = False, **hook) -> Slip:
    """A slip of a step: ``answer``, or the variant of that name with ``hook`` changed, served
    as a step function (:class:`~kvlab.grading.lockstep.slipped`), as the learner's is."""
    answer = variant(answer, **hook) if isinstance(answer, str) else answer
    return Slip(mistake, slipped(answer, any_refused=any_refused))


# kvlab's step as the slips' tables serve it (no decision changed): what the checks compare with
UNSLIPPED = slipped(Scheduler)

# the slips of the queue both labs try
AdmitFirst = variant("AdmitFirst", PHASES=("_retire_done", "_admit_arrived", "_serve_running"))
NoHold = variant("NoHold", admits=lambda s, step: s.batching == "continuous" or not s.running)
PastRefused = variant("PastRefused", stops_queue=lambda s, seq: False)
AnyArrival = variant("AnyArrival", arrived=lambda s, seq, now: True)
QUEUE_SLIPS = (
    step_slip(hints.HOLD, NoHold),
    step_slip(hints.FCFS, PastRefused, any_refused=True),
    step_slip(hints.ARRIVAL, AnyArrival),
)
