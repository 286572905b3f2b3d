"""Lab 06's hints: each one belongs to a usual slip, given only where the checks recognise it
(those Lab 09's step shares are :mod:`kvlab.grading.step_hints`, here by name too)."""

from kvlab.grading.step_hints import *  # noqa: F403

# --- 06.preempt ------------------------------------------------------------------------------

OLDEST = (
    "that is the guest who checked in first (running[0]): ask the one who checked in last "
    "(running[-1], what running.pop() takes). It has done the least work, so the least is lost, "
    "and the guests who came first keep being served first"
)
LAST_ARRIVED = (
    "that is the guest who arrived last, not the one who checked in last: a guest back after a "
    "preemption checks in late although it arrived early. scheduler.running is in check-in "
    "order: take running[-1]"
)
MOST_ROOMS = (
    "that is the guest holding the most rooms: ask the guest checked in last (running[-1]). It "
    "has done the least work, and the guests who came first keep being served first"
)
NOT_REMOVED = (
    "take the guest out of scheduler.running: a guest who left is not running "
    "(running.pop() picks the last guest and removes it)"
)
LEAK = (
    "free the guest's rooms with scheduler.cache.release(victim.seq_id): otherwise they stay "
    "booked with nobody using them (the rooms leak)"
)
NOT_QUEUED = (
    "put the guest back in scheduler.waiting, at the front (waiting.appendleft(victim)), so "
    "they come back when rooms are free"
)
BACK_OF_QUEUE = (
    "the guest goes to the front of the queue (waiting.appendleft), not the back: they came "
    "before everyone waiting now and keep their place (first come, first served)"
)
NOT_A_DEQUE = (
    "change the queue in place with scheduler.waiting.appendleft(victim): the scheduler keeps "
    "using its own deque"
)
NOT_A_LIST = (
    "change scheduler.running in place (running.pop()): the scheduler keeps using its own list"
)
STATUS_UNSET = (
    "set the guest's status: SequenceStatus.PREEMPTED by recompute, SequenceStatus.SWAPPED by "
    "swap (a running status would say they are still in the hotel)"
)
STATUS_WAITING = (
    "WAITING is for a guest who never ran: set SequenceStatus.PREEMPTED by recompute, "
    "SequenceStatus.SWAPPED by swap (check-in brings a swapped guest's K and V back)"
)
STATUS_FOR_MODE = {
    "recompute": (
        "scheduler.preemption is 'recompute': the guest's status is SequenceStatus.PREEMPTED "
        "(its K and V will be computed again); SWAPPED is for swap"
    ),
    "swap": (
        "scheduler.preemption is 'swap': the guest's status is SequenceStatus.SWAPPED (its K and "
        "V wait in CPU memory); PREEMPTED is for recompute"
    ),
}
KEEPS_COMPUTED = (
    "by recompute the guest's K and V are dropped: set victim.num_computed = 0, or the engine "
    "would skip recomputing its prompt and answer so far when it comes back"
)
ZEROES_COMPUTED = (
    "by swap the K and V are copied to CPU memory and kept: leave num_computed as it is (only "
    "recompute sets it to 0)"
)
ZEROES_GENERATED = (
    "leave num_generated alone: the answer so far is kept (by recompute it is read again with "
    "the prompt, not generated again)"
)
RETURN_NONE = (
    "return the guest you asked to leave (the Sequence): the scheduler's step lists it in "
    "ScheduledStep.preempted"
)
RETURN_ID = "return the Sequence itself, not its seq_id"
COUNTS = (
    "kvlab counts preemptions for you: do not change num_preemptions (the scheduler's or the "
    "guest's), nor recompute_tokens or swapped_out_tokens; the scheduler adds this preemption "
    "up once your preempt returns"
)
SENT_AWAY = (
    "send the guest away completely: out of scheduler.running (running.pop()), its rooms "
    "released (cache.release(victim.seq_id)), status PREEMPTED by recompute or SWAPPED by swap"
)
SERVED = (
    "the guest checked in last leaves (running[-1]): a guest earlier in scheduler.running may "
    "already have its token for this step"
)

# --- 06.step ---------------------------------------------------------------------------------

RETIRE_AT_START = (
    "retire at the start of the step, before decoding: a guest whose last token is decoded in "
    "this step checks out at the start of the next one (and is listed in out.finished then)"
)
RETIRE_EARLY = (
    "a guest retires when num_generated == output_len, after its last token: retired at "
    "output_len - 1, its answer is one token short"
)
NO_RETIRE = (
    "retire first: every running guest with num_generated == output_len checks out "
    "(scheduler.finish(seq)) and goes in out.finished; a guest never retired keeps decoding "
    "past its answer"
)
RETIRE_COPY = (
    "iterate over a copy (for seq in list(scheduler.running)): scheduler.finish removes the "
    "guest from the list you are walking through, so the guest after it is skipped"
)
ADMIT_FIRST = (
    "the guests in the hotel go first: decode every running guest (making room with "
    "scheduler.preempt()), then admit into what is left. A guest admitted before the decoding "
    "takes beds a running guest needs, and may be asked to leave in its own step"
)
TWICE = (
    "admit after the decode loop: a guest admitted before it gets its first token from "
    "decode(seq) and a second one from the loop (the guests in the hotel go first)"
)
FIRST_TOKEN = (
    "a guest checked in computes its first token in the same step: call decode(seq) right after "
    "scheduler.admit(seq) (cache.refusal counted a bed for that token)"
)
REFUSAL_TOKENS = (
    "a guest back after a preemption holds its prompt and the tokens generated so far: ask "
    "scheduler.cache.refusal(seq.num_tokens, seq.remaining), not seq.prompt_len"
)
ASK_ADMIT = (
    "ask before checking in: scheduler.cache.refusal(seq.num_tokens, seq.remaining) is None when "
    "the guest fits; when it is not, the guest waits (out.refused, out.refusal) and so does "
    "everyone behind"
)
COUNT = "count the new token: seq.num_generated += 1 after cache.append, or no guest ever finishes"
