"""The hints of a scheduler step's usual mistakes that Lab 06's and Lab 09's step checks share
(and of errors whose message names the mistake), each given only where a check recognises it."""

# --- errors whose message names the mistake ------------------------------------------------

PASS_ID = (
    "the cache knows guests by their seq_id: pass seq.seq_id to its calls (release, "
    "can_append, append), not the Sequence"
)
SEQ_TO_SCHEDULER = (
    "scheduler.admit takes the Sequence itself, not its seq_id (the cache's calls take the seq_id)"
)
FREE = (
    "the cache's check-out is release(seq_id) (free was the block manager's word in Lab 03): "
    "scheduler.cache.release(victim.seq_id)"
)
FREE_STEP = (
    "the cache's check-out is release(seq_id) (free was the block manager's word in Lab 03); "
    "to retire a guest, scheduler.finish(seq) checks it out of the cache and the batch"
)
POPLEFT = "scheduler.admit(seq) takes the guest off the queue itself: do not popleft() first"
WALK_QUEUE = (
    "scheduler.admit(seq) takes the guest off scheduler.waiting, the queue your for loop walks "
    "through: look at the head each time (while scheduler.waiting: seq = scheduler.waiting[0]) "
    "or walk a copy (for seq in list(scheduler.waiting))"
)
MAX_BATCH_NONE = (
    "max_batch None means no cap: test scheduler.max_batch is not None first (if "
    "scheduler.max_batch is not None and len(scheduler.running) >= scheduler.max_batch)"
)

# --- a step's own mistakes, and the queue's ----------------------------------------------------

REFUSAL_REMAINING = (
    "tell the cache the tokens still to generate too: scheduler.cache.refusal(seq.num_tokens, "
    "seq.remaining) (a paged cache counts a bed for the first of them, a contiguous one books "
    "them all up front)"
)
MEMORY = (
    "a cache call ran out of memory: ask first (cache.refusal before scheduler.admit, "
    "cache.can_append before cache.append) and act only when the answer allows it"
)
RETURN_STEP = "return the ScheduledStep you filled (out)"
STEP_TYPE = "step returns a ScheduledStep (from kvlab.serving.scheduler), filled with what it did"
SEQ_NOT_ID = "list the Sequence objects in the ScheduledStep, not their seq_ids"
ARRIVAL = "a guest checks in only once arrived: stop at the first waiting guest with arrival > now"
FCFS = (
    "first come, first served: stop at the first waiting guest who does not fit (break), even "
    "if a guest behind would fit; otherwise a long prompt could wait forever"
)
HOLD = (
    "admit nobody in a step that had to preempt (while not out.preempted and ...): memory ran "
    "short, and the guest just asked to leave waits first in line"
)
MAX_BATCH = (
    "stop admitting when the batch is full: len(scheduler.running) >= scheduler.max_batch "
    "(None means no cap)"
)
ARRIVAL_STRICT = "a guest arriving exactly at now may check in: admit while arrival <= now"
MAX_BATCH_OFF = "the batch is full when len(scheduler.running) == max_batch: stop at >=, not >"
FULL_NOT_REFUSED = (
    "out.refused is for a guest the cache refused; stopping at max_batch refuses nobody: just "
    "stop, and leave out.refused as it is"
)
READMIT = (
    "a guest back after a preemption (status PREEMPTED or SWAPPED) waits first in line and checks "
    "in like any other: ask scheduler.cache.refusal(seq.num_tokens, seq.remaining), then "
    "scheduler.admit(seq)"
)
COUNTED_TWICE = (
    "scheduler.preempt() counts the preemption itself: do not change "
    "scheduler.num_preemptions in step"
)
USE_PREEMPT = (
    "preempt with scheduler.preempt(): it sends the guest away and keeps the scheduler's counts "
    "(num_preemptions, tokens to recompute or swap) that the day's figures report"
)
ASK_APPEND = (
    "ask before taking a bed: while not scheduler.cache.can_append(seq.seq_id), call "
    "scheduler.preempt(); append only once there is room"
)
SKIP = (
    "skip the guests asked to leave earlier in this step (seq.status is not "
    "SequenceStatus.RUNNING): their rooms are released, so the cache no longer knows them"
)
SKIP_SWAPPED = (
    "skip every guest that is not running (if seq.status is not SequenceStatus.RUNNING: "
    "continue), not only the PREEMPTED ones: by swap a guest asked to leave is SWAPPED, its rooms "
    "released, so the cache no longer knows it"
)
SELF = (
    "when scheduler.preempt() returns the guest you are making room for, that guest has left: "
    "stop (break) without appending for it; it gets no token this step"
)
NOT_NOTED = (
    "note every guest scheduler.preempt() sends away in out.preempted (out.preempted.append("
    "victim)): the step reports them, and the admitting reads it (in a step that preempted, "
    "nobody checks in, so nobody is refused either)"
)
REPORTED = {
    "out.finished": "list every guest retired in this step in out.finished",
    "out.admitted": "list every guest checked in in this step in out.admitted",
    "out.refused": (
        "when the guest at the head of the queue does not fit, report it: out.refused = seq, "
        "out.refusal = the cache's answer"
    ),
    "out.refusal": "out.refusal is what scheduler.cache.refusal(...) returned for out.refused",
    "out.preempted": "list every guest scheduler.preempt() sent away in out.preempted",
    "out.scheduled": "list every guest that got a bed for its next token in out.scheduled",
}
