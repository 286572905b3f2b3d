"""09.almost_free (the prefill tokens a decode step carries before it turns compute-bound, as
kvlab's StepTime counts a mixed step) and 09.choose_chunk (the largest budget whose p99 gap
between two tokens is under a target). Wrong answers are matched against the usual slips'
answers on the same input; a hint is given only when one slip explains it."""

from __future__ import annotations

import functools
import itertools
import operator

from kvlab.grading import slips
from kvlab.grading.expect import CheckFailed, as_int, int_slip, short
from kvlab.grading.lab09 import hints
from kvlab.grading.registry import exercise
from kvlab.grading.slips import Slip
from kvlab.models import LLAMA_3_8B, preset
from kvlab.perf.roofline import A100_80GB, GPU, H100_SXM, H200
from kvlab.serving import simulate
from kvlab.serving.workload import documents_among_chats

almost_free_ex = exercise("09.almost_free", "the prefill tokens a decode step carries for free")
choose_ex = exercise("09.choose_chunk", "the largest chunk that keeps p99 under a target")


def _times(
    spec, gpu: GPU, batch: int, context: int, k: int, kv=True, attention=True, decodes=True, own=1
):
    """(compute seconds, memory seconds) of a step decoding ``batch`` guests that hold
    ``context`` tokens each, carrying the first ``k`` tokens of a new prompt (StepTime's sums;
    ``decodes=False``: the decodes' own 2 × params FLOPs left out, ``own=0``: a decode's own new
    token left out of what it attends to and reads, both slips)."""
    new = batch + k if decodes else k
    decoded = batch * (context + own)
    attended = decoded + k * (k + 1) / 2
    flops = 2 * spec.num_params * new
    if attention:
        flops += 4 * spec.num_layers * spec.num_q_heads * spec.head_dim * attended
    moved = spec.num_params * spec.dtype_bytes
    if kv:
        moved += (decoded + k) * spec.kv_bytes_per_token
    return flops / gpu.peak_flops, moved / gpu.hbm_bytes_per_s


def almost_free_tokens(spec, gpu: GPU, batch: int, context: int, **options) -> int:
    """The largest chunk k >= 0 with compute time <= memory time (0 when even the decodes alone
    are compute-bound)."""
    low, high = 0, 1

    def fits(k):
        compute, memory = _times(spec, gpu, batch, context, k, **options)
        return compute <= memory

    if not fits(0):
        return 0
    while fits(high):
        high *= 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


ALMOST_FREE_SLIPS = (
    slips.changed(almost_free_tokens, hints.WEIGHTS_ONLY, kv=False, attention=False),
    slips.changed(almost_free_tokens, hints.NO_ATTENTION, attention=False),
    Slip(hints.TOTAL_TOKENS, lambda spec, gpu, b, c: almost_free_tokens(spec, gpu, b, c) + b),
    # answers as the one above on every input (batch more): the same hint names both ways
    slips.changed(almost_free_tokens, hints.TOTAL_TOKENS, decodes=False),
    Slip(hints.ONE_PAST, lambda spec, gpu, b, c: almost_free_tokens(spec, gpu, b, c) + 1),
    slips.changed(almost_free_tokens, hints.DECODE_OWN_TOKEN, own=0),
)

# every input the checks ask about: a slip found on one is confirmed on all of them (a slip that
# answers one token too many on one input need not be the one past the last that fits)
FREE_INPUTS = (
    (LLAMA_3_8B, H100_SXM, 32, 1000),
    (LLAMA_3_8B, A100_80GB, 32, 1000),
    (LLAMA_3_8B, H200, 8, 4000),
    (preset("Llama-3-70B"), H100_SXM, 64, 8000),
    # batch × context instead of batch × (context + 1) answers one token fewer on these two (and
    # as the right rule on the four above)
    (LLAMA_3_8B, H100_SXM, 64, 1000),
    (preset("Llama-3-70B"), H100_SXM, 32, 1000),
)


def _whole_number(answer) -> bool:
    return isinstance(answer, int | float) and not isinstance(answer, bool)


def _expect_free(fn, spec, gpu: GPU, batch: int, context: int) -> None:
    what = f"{spec.name} on an {gpu.name}, {batch} guests decoding with {context} tokens each"
    want = almost_free_tokens(spec, gpu, batch, context)
    got = as_int(fn(spec, gpu, batch, context))
    if not isinstance(got, int) or isinstance(got, bool):
        raise CheckFailed(
            "almost_free_tokens must return an int (a number of tokens)",
            input=what,
            expected=str(want),
            got=short(got, typed=True),
            hint=int_slip(got, want, hints.TOKENS_TYPE),
        )
    if got != want:
        found = slips.matching(ALMOST_FREE_SLIPS, got, (spec, gpu, batch, context), want)
        found = slips.told_apart(
            found, fn, FREE_INPUTS, almost_free_tokens, always=True, readable=_whole_number
        )
        raise CheckFailed(
            "a different chunk",
            input=what,
            expected=f"{want:,} tokens",
            got=f"{got:,} tokens",
            hint=slips.hint(slips.only(found)),
        )


def _expect_frees(fn, inputs) -> None:
    for args in inputs:
        _expect_free(fn, *args)


# each check asks about some of FREE_INPUTS, in order
FREE_CHECKS = {
    "Llama-3-8B on an H100: 32 guests of 1,000 tokens": FREE_INPUTS[:1],
    "Llama-3-8B on an A100-80GB and an H200: other ridge points": FREE_INPUTS[1:3],
    "a batch whose K and V reads alone keep the step memory-bound longer": FREE_INPUTS[3:4],
    "64 guests of 1,000 tokens, and Llama-3-70B: each decode reads its own token": FREE_INPUTS[4:],
}
for name, inputs in FREE_CHECKS.items():
    almost_free_ex.check(name)(functools.partial(_expect_frees, inputs=inputs))


# --- 09.choose_chunk --------------------------------------------------------------------------

CHOOSE_BUDGETS = (256, 512, 1024, 2048, 4096)
# the days swept (in steps of the roofline: Llama-3-8B on an H100): their guests, and the report's
# words for them
SWEEPS = {
    # a small day of chats with documents
    "documents": (
        documents_among_chats(60, seed=2, rate=40.0, document_share=0.1),
        "60 chats with documents (kvlab.grading.lab09.roofline.choose_sweep())",
    ),
    # a day of chats alone: no long prompt to chunk, so the p99 does not grow with the budget
    # (512's is over 1,024's, 2,048's and 4,096's)
    "chats": (
        documents_among_chats(60, seed=3, rate=40.0, document_share=0.0),
        "60 chats and no documents, where the p99 does not grow with the budget "
        "(kvlab.grading.lab09.roofline.choose_sweep('chats'))",
    ),
}
SWEEP_SETUP = dict(
    cache="paged", kv_capacity_tokens=200_000, max_seq_len=8192, chunked_prefill=True
)


@functools.cache
def choose_sweep(day: str = "documents") -> dict:
    """budget -> the day's SimResult with chunked prefill under that budget."""
    from kvlab.perf.roofline import StepTime

    step_time, guests = StepTime(LLAMA_3_8B, H100_SXM), SWEEPS[day][0]
    return {
        b: simulate(guests, step_time=step_time, max_num_batched_tokens=b, **SWEEP_SETUP)
        for b in CHOOSE_BUDGETS
    }


def largest_chunk(
    results: dict,
    target: float,
    measure=lambda r: r.itl(99),
    largest=True,
    strict=False,
    walk=False,
):
    """The largest (or, slipped, smallest) budget whose measure is under the target, or None;
    slipped too: ``strict`` (a measure at the target does not meet it), ``walk`` (the budgets in
    order, stopping at the first over the target)."""
    meets = operator.lt if strict else operator.le
    under = [b for b, r in results.items() if meets(measure(r), target)]
    if walk:
        under = list(itertools.takewhile(lambda b: measure(results[b]) <= target, sorted(results)))
    if not under:
        return None
    return max(under) if largest else min(under)


MEASURES = {
    hints.MEDIAN: lambda r: r.itl(50),
    hints.PERCENT_AS_FRACTION: lambda r: r.itl(0.99),
    hints.TTFT: lambda r: r.ttft(99),
}
CHOOSE_SLIPS = (
    *(slips.changed(largest_chunk, hint, measure=m) for hint, m in MEASURES.items()),
    slips.changed(largest_chunk, hints.SMALLEST, largest=False),
    slips.changed(largest_chunk, hints.AT_TARGET, strict=True),
    slips.changed(largest_chunk, hints.FIRST_OVER, walk=True),
)


@functools.cache
def probe_targets(day: str = "documents") -> tuple[float, ...]:
    """Targets between every two values that the right rule and the slips compare (on the
    day's sweep), and each of those values itself (where at the target and under it part): a
    slip found at one target is confirmed at all of them (many wrong measures pick the largest
    budget at a loose target, as the median does)."""
    results = choose_sweep(day)
    measures = (lambda r: r.itl(99), *MEASURES.values())
    values = sorted({m(r) for m in measures for r in results.values()})
    between = tuple((a + b) / 2 for a, b in zip(values, values[1:], strict=False))
    return between + tuple(values)


def _expect_choice(fn, target_of, day: str) -> None:
    """``fn`` on the day's sweep and the target ``target_of`` it."""
    results = choose_sweep(day)
    target = target_of(results)
    what = (
        f"a sweep of budgets {', '.join(map(str, CHOOSE_BUDGETS))} over {SWEEPS[day][1]}, "
        f"target {target * 1e3:g} ms"
    )
    want = largest_chunk(results, target)
    got = fn(dict(results), target)
    if got != want:
        found = slips.matching(CHOOSE_SLIPS, got, (results, target), want)
        probes = [(dict(choose_sweep(d)), t) for d in SWEEPS for t in probe_targets(d)]
        found = slips.told_apart(found, fn, probes, largest_chunk, always=True)
        raise CheckFailed(
            "a different budget",
            input=what,
            expected=short(want),
            got=short(got),
            hint=slips.hint(slips.only(found)),
        )


def _between(results: dict, a: int, b: int) -> float:
    """A target between the p99 gaps of budgets a and b."""
    return (results[a].itl(99) + results[b].itl(99)) / 2


# the checks as data: the name the learner reads -> (its target, from the day's sweep; the day)
CHOICES = {
    "the target of the lab's sweep: 30 ms": (lambda results: 0.030, "documents"),
    "a target between two budgets' p99 gaps": (lambda r: _between(r, 512, 1024), "documents"),
    "a target exactly at 1,024's p99: a p99 at the target meets it": (
        lambda results: results[1024].itl(99),
        "documents",
    ),
    "a sweep whose p99 does not grow with the budget: 512's over, 4,096's under": (
        lambda results: _between(results, 512, 1024),
        "chats",
    ),
    "a target that no budget meets: None": (
        lambda results: min(r.itl(99) for r in results.values()) / 2,
        "documents",
    ),
}
for _name, (_target, _day) in CHOICES.items():
    choose_ex.check(_name)(functools.partial(_expect_choice, target_of=_target, day=_day))
