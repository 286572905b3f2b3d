"""The days Lab 06's checks serve: the lab's simulated day, shrunk, and the scripted days of the
06.step checks (each named, with its guests as a report writes them, a cache and the engine's
options; :class:`Day` and the rest in :mod:`kvlab.grading.scheduler_days`)."""

from __future__ import annotations

import functools

from kvlab.grading.scheduler_days import FULL_HOTEL, Day, paged, simulated_day
from kvlab.serving import make_cache
from kvlab.serving.workload import Request, sharegpt_like

# the lab's day, shrunk: 40 ShareGPT-like guests at an eighth of their length, 2 a step, in a
# hotel of 32 rooms of 8 beds, which asks guests to leave often
DAY = [
    Request(max(1, r.prompt_len // 8), max(1, r.output_len // 8), r.arrival)
    for r in sharegpt_like(40, seed=3, rate=2.0)
]
DAY_SETUP = dict(cache="paged", kv_capacity_tokens=256, max_seq_len=256, block_size=8)
DAY_TEXT = (
    "a day of 40 ShareGPT-like guests at an eighth of their length, 2 arriving a step "
    "(kvlab.grading.lab06.DAY), served by simulate(DAY, cache='paged', kv_capacity_tokens=256, "
    "max_seq_len=256, block_size=8)"
)
# fay's prompt fits in the 6 beds left, her booking does not
CONTIGUOUS = functools.partial(make_cache, "contiguous-oracle", 64, 32)

DAYS = {
    day.name: day
    for day in (
        Day("arrivals", paged(16, 4), "ann 6+3@0, ben 5+2@0, cat 9+2@2, dan 3+4@3.5, eve 4+2@10"),
        Day("full batch", paged(32, 4), "ann 4+2@0, ben 4+2@0, cat 4+5@0, dan 4+1@0, eve 4+2@0", 3),
        Day("queue", paged(8, 4), "ann 9+6@0, ben 5+3@0, cat 14+2@1, dan 2+2@1"),
        # step 2: eve, new, is refused (a step that forgets out.refused fails here, not at step
        # 4, where it would look like a step that never readmits). Step 3: ben needs a room and
        # dan (checked in last) leaves; cat needs one and, last now, leaves itself; nobody
        # checks in. Step 4: cat, first in line, holds 8 tokens and does not fit yet. Step 5:
        # cat is back and dan waits (admitted before the decoding, dan would take a room a
        # guest in the hotel needs, and leave again at once)
        Day("preemption", paged(6, 4), FULL_HOTEL),
        # the full hotel's day by swap: in step 3 dan, asked to leave while ben is decoded, is
        # SWAPPED, not PREEMPTED, when the walk reaches him (a step that skips only PREEMPTED
        # guests asks the cache about a guest it no longer knows). By swap, skipping nobody and
        # skipping only the PREEMPTED guests are the same step; the recompute day tells them apart
        Day("swap", paged(6, 4), FULL_HOTEL, preemption="swap", second="preemption"),
        Day(
            "contiguous",
            CONTIGUOUS,
            "ann 10+6@0, ben 20+10@0, cat 8+4@0, fay 5+4@1, dan 30+2@1, eve 2+2@1",
        ),
        simulated_day("simulate", DAY, DAY_SETUP, DAY_TEXT),  # DAY as simulate() serves it
    )
}
