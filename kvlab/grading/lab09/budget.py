"""09.budget_step: the learner's ``budget_step(scheduler, now)`` serves short scripted days under
a token budget (``max_num_batched_tokens``, chunked prefill) in an Engine beside an engine running
kvlab's own budgeted step, compared after every step on Lab 06's state-diff table plus the tokens
each guest computes (:data:`TABLE`). The lockstep, the replay and the slip matching are shared
with 06.step (:mod:`kvlab.grading.lockstep`, run with :data:`RULES`); only the slips, the days and
the table are this lab's.

kvlab's step is vLLM v1's: retire, then the running guests in check-in order (a decode costs one
token, a prompt still being read its next chunk, min(what is left of it, what is left of the
budget)), preempting when a bed is missing, then, in a step that preempted nobody, the queue
first come first served while budget is left: each newcomer is asked of the cache for its whole
prompt and first token, checked in, and given its first chunk (its first token too when the chunk
ends the prompt). The usual slips (:data:`SLIPS`) are kvlab's scheduler with one decision
changed (a subclass overriding one hook), as Lab 06's are.
"""

from __future__ import annotations

import functools

from kvlab.grading import lockstep as lockstep_
from kvlab.grading.lab09 import hints
from kvlab.grading.registry import exercise
from kvlab.grading.scheduler_days import FULL_HOTEL, Day, paged, same_figures, simulated_day
from kvlab.grading.scheduler_days import figures as day_figures
from kvlab.grading.scheduler_views import STEP, show
from kvlab.grading.state_diff import Field, each
from kvlab.grading.step_rules import (
    QUEUE_SLIPS,
    ROOM_SLIPS,
    STEP_REFERENCE,
    UNSLIPPED,
    AdmitFirst,
    step_rules,
    step_slip,
)
from kvlab.grading.step_rules import direct as step_direct
from kvlab.serving import simulate
from kvlab.serving.scheduler import Scheduler
from kvlab.serving.workload import Request, documents_among_chats

budget_ex = exercise("09.budget_step", "one step under a token budget: decodes first, then chunks")


def _serves_once(self, seq, step) -> bool:  # a newcomer already scheduled is skipped after
    return Scheduler.serves(self, seq, step) and seq not in step.scheduled


def _ask_unless_chunked(self, seq, left):  # does not ask when the prompt is chunked
    return None if seq.num_uncomputed > left else Scheduler.refusal(self, seq, left)


slipped_budget_step = UNSLIPPED  # kvlab's budgeted step as the slips' table serves it

# the usual slips: kvlab's budgeted step with one decision changed (Lab 06's for the queue and
# for making room)
SLIPS = (
    step_slip(hints.PREFILL_FIRST, type("PrefillFirst", (AdmitFirst,), {"serves": _serves_once})),
    # every guest up to the whole budget; a newcomer's prompt read whole; a prompt's rest at once
    step_slip(hints.OVER_BUDGET, "WholeBudget", budget_left=lambda s, step: s.token_budget),
    step_slip(
        hints.OVER_BUDGET, "WholeNewcomer", start=lambda s, q, left, step: s._decode(q, step)
    ),
    step_slip(hints.OVER_BUDGET, "WholePartial", running_chunk=lambda s, q, left: q.num_uncomputed),
    # forgets the guests whose prompt is partly read
    step_slip(
        hints.FORGOTTEN,
        "SkipPartial",
        serves=lambda s, q, step: Scheduler.serves(s, q, step) and q.num_uncomputed <= 1,
    ),
    # asks the cache for the first chunk only; does not ask when the prompt is chunked
    step_slip(
        hints.MEMORY_CHUNK,
        "AskChunk",
        refusal=lambda s, q, left: s.cache.refusal(min(left, q.num_tokens), q.remaining),
    ),
    step_slip(hints.MEMORY_CHUNK, "AskNoneWhenChunked", refusal=_ask_unless_chunked),
    # chunks of 0 tokens, a newcomer checked in with one
    step_slip(hints.BUDGET_SPENT, "GoOn", budget_spent=lambda s, left: False),
    *QUEUE_SLIPS,
    *ROOM_SLIPS,
)


def _tokens(out, s, guests):
    """What each scheduled guest computes in the step: its tokens, and + when it samples."""
    scheduled = out.scheduled if isinstance(out.scheduled, list) else []
    return [
        f"{q.seq_id}:{q.num_scheduled}{'+' if q.samples else ''}"
        for q in scheduled
        if hasattr(q, "num_scheduled")
    ]


# Lab 06's table, with the tokens computed in the step after the guests scheduled
TABLE = (
    *STEP[:6],
    Field("out.num_batched_tokens", lambda out, s, g: out.num_batched_tokens, show=each(str)),
    Field("tokens computed (guest:tokens, + where a token is produced)", _tokens, show=each(show)),
    *STEP[6:],
)

# 06.step's, but for retire (given in the lab), and the steps of a budget
GUARD = (
    *(f for f in STEP_REFERENCE if f is not Scheduler.retire),
    Scheduler._chunk,
    Scheduler._decode,
)


def direct(day: Day, mine, expected: dict, queue: list) -> str | None:
    """Mistakes seen in the step's outcome itself: more tokens than the budget, then 06.step's."""
    got = mine.view
    if isinstance(got["out.num_batched_tokens"], int) and day.budget is not None:
        if got["out.num_batched_tokens"] > day.budget:
            return hints.OVER_BUDGET
    if any(entry.endswith(":0") for entry in got[TABLE[7].name]):
        return hints.BUDGET_SPENT
    return step_direct(day, mine, expected, queue)


# the lab's day, shrunk: chats with long documents among them, at a tenth of their length
SIM_DAY = [
    Request(max(1, r.prompt_len // 10), max(1, r.output_len // 10), r.arrival)
    for r in documents_among_chats(40, seed=4, rate=40.0, document_share=0.15)
]
SIM_SETUP = dict(
    cache="paged",
    kv_capacity_tokens=1024,
    max_seq_len=1024,
    block_size=8,
    max_num_batched_tokens=48,
    chunked_prefill=True,
)
SIM_TEXT = (
    "40 chats with long documents among them at a tenth of their length "
    "(kvlab.grading.lab09.budget.SIM_DAY), simulate(SIM_DAY, "
    f"{', '.join(f'{key}={value!r}' for key, value in SIM_SETUP.items())})"
)


def _simulated_day() -> Day:
    budget = SIM_SETUP["max_num_batched_tokens"]
    return simulated_day("simulate", SIM_DAY, SIM_SETUP, SIM_TEXT, budget=budget, second="chunks")


DAYS = {
    day.name: day
    for day in (
        # step 1: ann (3) and ben's first chunk of 5; steps 2-3: ann decodes, ben's chunks of 7;
        # step 4: ben's last 2 with its first token, cat checks in with a chunk of 6 ...
        Day(
            "chunks",
            paged(32, 4),
            "ann 3+5@0, ben 19+3@0, cat 10+2@2, dan 2+3@2",
            budget=8,
            second="decodes first",
        ),
        # one long prompt among decoders: the budget is shared, decodes first; step 1 leaves a
        # token of the budget, but dan has not arrived yet
        Day(
            "decodes first",
            paged(32, 4),
            "ann 2+6@0, ben 2+6@0, cat 3+6@0, dan 25+2@1",
            budget=8,
            second="chunks",
        ),
        # ben's prompt fits a chunk of the budget, not the rooms left: refused, not checked in
        Day("memory", paged(8, 4), "ann 6+6@0, ben 23+2@0, cat 2+2@0", budget=4, second="chunks"),
        Day("preemption", paged(6, 4), FULL_HOTEL, budget=6, second="chunks"),
        Day("swap", paged(6, 4), FULL_HOTEL, preemption="swap", budget=6, second="preemption"),
        Day(
            "full batch",
            paged(32, 4),
            "ann 9+2@0, ben 4+3@0, cat 12+2@0, dan 4+1@0",
            max_batch=2,
            budget=5,
            second="wide budget",
        ),
        # max_batch=3 with budget for all five: no cap checks in five, stopping at > four
        Day(
            "wide budget",
            paged(32, 4),
            "ann 4+2@0, ben 4+2@0, cat 4+5@0, dan 4+1@0, eve 4+2@0",
            max_batch=3,
            budget=32,
            second="chunks",
        ),
        _simulated_day(),
    )
}

RULES = step_rules(
    SLIPS,
    DAYS,
    guard=GUARD,
    task="scheduling the step under its budget",
    table=TABLE,
    direct=direct,
    module="kvlab.grading.lab09",
    name="budget_step",
)


def show_day(budget_step, day: str = "chunks", steps: int | None = None) -> None:
    """Print a day of the 09.budget_step checks step by step, kvlab's step beside yours."""
    lockstep_.show_day(budget_step, day, RULES, steps)


def lockstep(fn, name: str) -> None:
    lockstep_.lockstep(fn, DAYS[name], RULES)


# each check serves one day (DAYS), in the order of the lab
CHECKS = {
    "chunks": "a long prompt is read in chunks that fill what the budget leaves",
    "decodes first": "decodes first: a long prompt takes only what the running guests leave",
    "memory": "a guest whose prompt fits the budget but not the rooms left is refused",
    "preemption": "a full hotel: the guest checked in last leaves, and comes back first",
    "swap": "the full hotel by swap",
    "full batch": "max_batch=2 caps the guests, the budget caps the tokens",
}
for day, title in CHECKS.items():
    budget_ex.check(title)(functools.partial(lockstep, name=day))


@budget_ex.check("the lab's way: simulate(..., schedule=budget_step) serves a day as kvlab does")
def _simulate(fn):
    lockstep(fn, "simulate")
    got, want = simulate(SIM_DAY, schedule=fn, **SIM_SETUP), simulate(SIM_DAY, **SIM_SETUP)
    same_figures(day_figures(got), day_figures(want), SIM_TEXT + ", schedule=budget_step")
