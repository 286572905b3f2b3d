"""What Lab 06's and Lab 09's step checks share besides the lockstep: kvlab's functions a step
must not hand its work to, the hints of errors whose message names the mistake, the mistakes seen
in a step's outcome itself, how a slip of a step is written (:func:`step_slip`: kvlab's Scheduler
with one hook changed) and the usual slips of the queue and of making room (:data:`QUEUE_SLIPS`,
:data:`ROOM_SLIPS`), which both labs' steps write the same way."""

from __future__ import annotations

from kvlab.core.block_manager import PagedCache
from kvlab.core.contiguous import ContiguousKVCache
from kvlab.grading import step_hints as hints
from kvlab.grading.blame import learner_frames
from kvlab.grading.lockstep import Captured, Rules, StepHints, slipped
from kvlab.grading.scheduler_days import Day
from kvlab.grading.scheduler_views import REPORT_KEYS, STEP
from kvlab.grading.slips import Slip
from kvlab.grading.state_diff import moved
from kvlab.serving.scheduler import Scheduler, SequenceStatus

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


def step_rules(slips: tuple, days: dict, **options) -> Rules:
    """The lockstep :class:`~kvlab.grading.lockstep.Rules` of a step of kvlab's Scheduler: its
    step, guard, table and the hints and mistakes both labs see, but for what ``options`` say
    (Lab 09's budgeted step: its guard, task, table and mistakes seen directly)."""
    shared = dict(reference=Scheduler.step, guard=STEP_REFERENCE, task="scheduling the step")
    shared |= dict(table=STEP, hints=STEP_HINTS, direct=direct)
    return Rules(slips=slips, days=days, **{**shared, **options})


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


def _cap_past_full(s, seq, step) -> bool:
    return s.max_batch is not None and len(s.running) > s.max_batch


def _full_refuses(s, seq, step) -> bool:
    if full := Scheduler.batch_full(s, seq, step):
        step.refused = seq
    return full


def _only_new(s, seq, now) -> bool:  # a guest back after a preemption stops the queue
    return Scheduler.arrived(s, seq, now) and seq.status is SequenceStatus.WAITING


QUEUE_SLIPS = (
    step_slip(hints.HOLD, NoHold),
    step_slip(hints.FCFS, PastRefused, any_refused=True),
    step_slip(hints.ARRIVAL, AnyArrival),
    step_slip(hints.ARRIVAL_STRICT, "StrictArrival", arrived=lambda s, q, now: q.arrival < now),
    step_slip(hints.MAX_BATCH, "NoCap", batch_full=lambda s, q, step: False),
    step_slip(hints.MAX_BATCH_OFF, "CapPastFull", batch_full=_cap_past_full),
    step_slip(hints.FULL_NOT_REFUSED, "FullRefuses", any_refused=True, batch_full=_full_refuses),
    step_slip(hints.READMIT, "NoReadmit", arrived=_only_new),
)

# --- the slips of making room both labs try --------------------------------------------------


def _note_past_self(s, victim, seq, step) -> bool:  # goes on for a guest that left
    step.preempted.append(victim)
    return False


def _by_hand(s):  # as recompute does, whatever scheduler.preemption says
    victim = s.running.pop()
    s.cache.release(victim.seq_id)
    victim.num_computed, victim.status = 0, SequenceStatus.PREEMPTED
    s.waiting.appendleft(victim)
    return victim


def _by_hand_counted(s):
    victim = _by_hand(s)
    s.num_preemptions += 1
    return victim


ByHand = variant("ByHand", preempt=_by_hand)
SkipNobody = variant("SkipNobody", serves=lambda s, seq, step: True)
SkipPreemptedOnly = variant(
    "SkipPreemptedOnly", serves=lambda s, q, step: q.status is not SequenceStatus.PREEMPTED
)
ROOM_SLIPS = (
    step_slip(hints.ASK_APPEND, "AppendBlind", _make_room=lambda s, q, step: s._decode(q, step)),
    step_slip(hints.SKIP, SkipNobody),
    step_slip(hints.SKIP_SWAPPED, SkipPreemptedOnly),
    step_slip(hints.SELF, "MakeRoomPastSelf", note_preempted=_note_past_self),
    step_slip(hints.USE_PREEMPT, ByHand),
    step_slip(hints.USE_PREEMPT, type("ByHandCounted", (ByHand,), {"preempt": _by_hand_counted})),
    step_slip(hints.NOT_NOTED, "NotNoted", note_preempted=lambda s, victim, q, step: victim is q),
)
