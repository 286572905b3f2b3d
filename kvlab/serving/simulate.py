"""Serve a workload on a simulated GPU: the equal-memory comparison of Lab 06.

:func:`simulate` runs the shared :class:`~kvlab.serving.engine.Engine` with an executor that only
costs each step (one unit, or the roofline's seconds from :class:`kvlab.perf.roofline.StepTime`), over
one of four caches of the same size: the PagedAttention paper's three contiguous baselines
(Orca-Max, Orca-Pow2, Orca-Oracle) and the paged cache. It measures what the paper measures: how
many requests run at once, how much of the memory they hold is token states, throughput, and the
latency each request sees.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field

from kvlab.core.block_manager import PagedCache
from kvlab.core.cache_kinds import CACHES
from kvlab.core.contiguous import ContiguousKVCache, booking_size
from kvlab.core.prefix_cache import PREFIX_CACHES as PREFIX_CACHE_KINDS
from kvlab.core.recorder import Recorder
from kvlab.core.trace import Trace
from kvlab.core.validate import positive_int
from kvlab.serving.engine import Engine
from kvlab.serving.scheduler import (
    BATCHING_MODES,
    PREEMPTION_MODES,
    Sequence,
    most_computed_at_once,
)
from kvlab.serving.workload import Request

PREFIX_CACHES = tuple(PREFIX_CACHE_KINDS)  # "hash", "radix"


class CostedSteps:
    """The simulator's executor: computes nothing, costs each step with ``step_time`` (a mixed
    step of prompt chunks and decodes costs its FLOPs and its bytes together). With a CPU tier,
    ``copied_up()`` is how many prompt tokens have been copied up from it so far: a step pays
    for the K/V of the ones its admissions copied, over PCIe (``step_time``'s
    ``swapped_tokens``, at its ``pcie_bytes_per_s``), before it computes. A
    :class:`kvlab.serving.interfaces.DecodeRunExecutor`: a decode step's cost depends only on its batch
    and the K/V it reads, so a run of them is costed without seeing them."""

    can_swap = False

    def __init__(self, step_time=None, copied_up=None):
        if step_time is not None and not callable(getattr(step_time, "seconds", None)):
            raise TypeError(
                "step_time must be None or a cost model with a seconds(new_tokens, attended, "
                f"kv_tokens, swapped_tokens) method such as kvlab.perf.roofline.StepTime, got {step_time!r}"
            )
        self.step_time = step_time
        self.timed = step_time is not None
        # with a CPU tier: tokens copied up so far (a function); a step pays for its new ones
        self.copied_up = copied_up
        self._copied_up = 0

    def execute(self, step) -> float | None:
        if self.step_time is None:
            return None
        new = kv = 0
        attended = 0.0
        for seq in step.scheduled:
            start = seq.num_computed
            stop = start + seq.num_scheduled
            new += stop - start
            attended += (stop * (stop + 1) - start * (start + 1)) / 2
            kv += stop
        moved = step.swapped_tokens
        if self.copied_up is not None:  # copies up for this step's admissions: over PCIe too
            copied = self.copied_up()
            moved += copied - self._copied_up
            self._copied_up = copied
        return self.step_time.seconds(new, attended, kv, moved)

    def decode_run_seconds(self, batch: int, kv_tokens: int, steps: int) -> list[float] | None:
        """What :meth:`execute` returns for each of ``steps`` decode steps of ``batch``
        sequences, the first reading ``kv_tokens`` tokens of K/V (one token each attends to its
        sequence's K/V: attended == kv_tokens, summed exactly as execute sums it)."""
        if self.step_time is None:
            return None
        seconds = self.step_time.seconds
        stop = kv_tokens + steps * batch
        return [seconds(batch, float(kv), kv, 0) for kv in range(kv_tokens, stop, batch)]


def weighted_percentile(pairs: list[tuple[float, int]], p: float) -> float:
    """:func:`percentile` of the list holding each ``value`` ``count`` times, for ``(value,
    count)`` pairs, without building that list (a day of a million tokens has a million gaps)."""
    if not 0 <= p <= 100:
        raise ValueError(f"p must be in [0, 100], got {p}")
    pairs = sorted((v, c) for v, c in pairs if c > 0)
    total = sum(c for _, c in pairs)
    if not total:
        raise ValueError("no values to take a percentile of")
    rank = p / 100 * (total - 1)
    low = int(rank)
    frac = rank - low

    def nth(k: int) -> float:
        seen = 0
        for value, count in pairs:
            seen += count
            if k < seen:
                return value
        return pairs[-1][0]

    a, b = nth(low), nth(min(low + 1, total - 1))
    return a + (b - a) * frac if frac < 0.5 else b - (b - a) * (1 - frac)


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile (0-100), interpolated linearly (numpy's default)."""
    import numpy as np

    if not values:
        raise ValueError("no values to take a percentile of")
    if not 0 <= p <= 100:
        raise ValueError(f"p must be in [0, 100], got {p}")
    return float(np.percentile(values, p))


@dataclass
class SimResult:
    """What a simulated day measured. Times are in steps, or seconds with a step-time model."""

    cache: str
    capacity_tokens: int
    sequences: list[Sequence]  # one per request, in request order, with its timings
    timed: bool
    times: list[float] = field(default_factory=list)  # each step's start
    batch: list[int] = field(default_factory=list)  # sequences running in each step
    utilization: list[float] = field(default_factory=list)  # token states / memory handed out
    occupancy: list[float] = field(default_factory=list)  # memory handed out / capacity
    waiting: list[int] = field(default_factory=list)  # arrived and not running, per step
    preemptions: int = 0
    recompute_tokens: int = 0  # K/V dropped by preemption and computed again
    swapped_tokens: int = 0  # K/V moved out to CPU memory (and as many back in)
    end_time: float = 0.0
    trace: Trace | None = None
    scheduled_tokens: list[int] = field(default_factory=list)  # tokens computed in each step
    # gaps between consecutive tokens of a sequence: (seconds or steps, how many such gaps)
    token_gaps: list[tuple[float, int]] = field(default_factory=list)
    max_num_batched_tokens: int | None = None
    chunked_prefill: bool = False
    prefix_caching: bool = False
    prefix_cache: str | None = None  # "hash" or "radix", with prefix caching
    prefix_query_tokens: int = 0  # prompt tokens looked up in the prefix cache (recomputes too)
    prefix_hit_tokens: int = 0  # of those, found cached (not computed again): HBM and tier
    evictions: int = 0  # cached blocks handed out again
    cpu_cache_blocks: int | None = None  # the CPU tier's blocks, with one
    prefix_tier_hit_tokens: int = 0  # of the hits, copied up from the CPU tier
    copied_up_bytes: float | None = None  # their K/V over PCIe (with a step-time model's spec)
    demoted_blocks: int = 0  # evicted blocks copied down to the CPU tier
    tier_evictions: int = 0  # blocks the CPU tier dropped (their prefix lost)
    fast_forward_steps: int = 0  # of the steps, those run at once (kvlab.serving.fast_forward)
    fast_forward_runs: int = 0  # in how many runs

    @property
    def prefix_hit_rate(self) -> float:
        """Share of the prompt tokens looked up that were found cached."""
        return (
            self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0
        )

    @property
    def prefix_hbm_hit_tokens(self) -> int:
        """Of the hits, the tokens found in HBM (shared in place, nothing moved)."""
        return self.prefix_hit_tokens - self.prefix_tier_hit_tokens

    @property
    def completed(self) -> int:
        return sum(seq.finish_time is not None for seq in self.sequences)

    @property
    def tokens_generated(self) -> int:
        return sum(seq.num_generated for seq in self.sequences)

    @property
    def steps(self) -> int:
        return len(self.times)

    @property
    def throughput(self) -> float:
        """Generated tokens per step."""
        return self.tokens_generated / self.steps

    @property
    def mean_batch(self) -> float:
        """Requests running at once, averaged over the steps (the paper's Fig. 13)."""
        return sum(self.batch) / self.steps

    @property
    def peak_batch(self) -> int:
        return max(self.batch)

    @property
    def mean_utilization(self) -> float:
        """Share of the memory handed out (blocks, or booked beds) that holds token states,
        averaged over the steps: the paper's measure of waste. Shared blocks count once per
        sequence that reads them, so with prefix caching it can exceed 1."""
        return sum(self.utilization) / self.steps

    @property
    def mean_occupancy(self) -> float:
        """Share of the whole cache handed out, averaged over the steps."""
        return sum(self.occupancy) / self.steps

    @property
    def seconds(self) -> float:
        """From the first arrival to the last token (steps, without a step-time model)."""
        return self.end_time - min(seq.arrival for seq in self.sequences)

    @property
    def tokens_per_second(self) -> float:
        if not self.timed:
            raise ValueError("tokens_per_second needs a step_time model; use throughput (per step)")
        return self.tokens_generated / self.seconds

    def swapped_bytes(self, spec) -> int:
        """Bytes moved between GPU and CPU memory by swapping, for a model ``spec``."""
        return 2 * self.swapped_tokens * spec.kv_bytes_per_token

    def latencies(self) -> list[float]:
        """Arrival to last token, per request."""
        return [seq.finish_time - seq.arrival for seq in self.sequences]

    def ttfts(self) -> list[float]:
        """Arrival to first token (time to first token), per request."""
        return [seq.first_token_time - seq.arrival for seq in self.sequences]

    def tpots(self) -> list[float]:
        """Time per output token after the first, per request with more than one."""
        return [
            (seq.finish_time - seq.first_token_time) / (seq.output_len - 1)
            for seq in self.sequences
            if seq.output_len > 1
        ]

    def itls(self) -> list[float]:
        """Every gap between two consecutive tokens of a request (inter-token latency), over
        all requests: a prompt read in one go stalls every decode of its step."""
        return [gap for gap, count in self.token_gaps for _ in range(count)]

    def itl(self, p: float = 50) -> float:
        return weighted_percentile(self.token_gaps, p)

    def latency(self, p: float = 50) -> float:
        return percentile(self.latencies(), p)

    def ttft(self, p: float = 50) -> float:
        return percentile(self.ttfts(), p)

    def tpot(self, p: float = 50) -> float:
        return percentile(self.tpots(), p)

    def summary(self) -> dict:
        """The headline figures, for a table row."""
        row = {
            "cache": self.cache,
            "completed": self.completed,
            "steps": self.steps,
            "throughput": self.throughput,
            "mean_batch": self.mean_batch,
            "peak_batch": self.peak_batch,
            "mean_utilization": self.mean_utilization,
            "preemptions": self.preemptions,
            "recompute_tokens": self.recompute_tokens,
            "swapped_tokens": self.swapped_tokens,
            "latency_p50": self.latency(50),
            "latency_p99": self.latency(99),
        }
        if self.prefix_caching:
            row.update(prefix_hit_rate=self.prefix_hit_rate, evictions=self.evictions)
        if self.cpu_cache_blocks is not None:
            row.update(
                cpu_cache_blocks=self.cpu_cache_blocks,
                prefix_hbm_hit_tokens=self.prefix_hbm_hit_tokens,
                prefix_tier_hit_tokens=self.prefix_tier_hit_tokens,
                copied_up_bytes=self.copied_up_bytes,
            )
        if self.max_num_batched_tokens is not None:
            gaps = any(count for _, count in self.token_gaps)
            row.update(
                max_num_batched_tokens=self.max_num_batched_tokens,
                chunked_prefill=self.chunked_prefill,
                itl_p50=self.itl(50) if gaps else None,  # None: one-token answers
                itl_p99=self.itl(99) if gaps else None,
            )
        if self.timed:
            tpots = self.tpots()
            row.update(
                seconds=self.seconds,
                tokens_per_second=self.tokens_per_second,
                ttft_p50=self.ttft(50),
                ttft_p99=self.ttft(99),
                tpot_p50=percentile(tpots, 50) if tpots else None,  # None: one-token answers
                tpot_p99=percentile(tpots, 99) if tpots else None,
            )
        return row


def make_cache(
    cache: str,
    kv_capacity_tokens: int,
    max_seq_len: int,
    block_size: int = 16,
    prefix_caching: bool | str = False,
    cpu_cache_blocks: int | None = None,
):
    """One of the four caches over ``kv_capacity_tokens`` token slots of memory (the paged one
    with prefix caching if asked: True or ``"hash"`` for the hash chain, ``"radix"`` for the
    radix tree; ``cpu_cache_blocks``: a CPU tier of that many blocks below it)."""
    prefix_cache = _prefix_cache(prefix_caching)
    if cpu_cache_blocks is not None:
        positive_int("cpu_cache_blocks", cpu_cache_blocks)
        if prefix_cache is None:
            raise ValueError("cpu_cache_blocks is a tier of the prefix cache: set prefix_caching")
    if cache not in CACHES:
        raise ValueError(f"cache must be one of {tuple(CACHES)}, got {cache!r}")
    positive_int("kv_capacity_tokens", kv_capacity_tokens)
    positive_int("max_seq_len", max_seq_len)
    positive_int("block_size", block_size)
    policy = CACHES[cache]
    if policy is None:
        if kv_capacity_tokens < block_size:
            raise ValueError(
                f"kv_capacity_tokens ({kv_capacity_tokens}) holds no whole block of "
                f"block_size={block_size}"
            )
        if prefix_cache is None:
            return PagedCache(kv_capacity_tokens // block_size, block_size)
        return PagedCache(
            kv_capacity_tokens // block_size,
            block_size,
            enable_prefix_caching=True,
            prefix_cache=prefix_cache,
            cpu_cache_blocks=cpu_cache_blocks,
        )
    if prefix_cache is not None:
        raise ValueError(f"prefix_caching needs the paged cache, not cache={cache!r}")
    num_slots = max(1, kv_capacity_tokens // max_seq_len)
    return ContiguousKVCache(
        num_slots, max_seq_len, policy=policy, capacity_tokens=kv_capacity_tokens
    )


def _prefix_cache(prefix_caching) -> str | None:
    """The prefix cache asked for: None (off), "hash" (also for True) or "radix"."""
    if prefix_caching is False:
        return None
    if prefix_caching is True:
        return "hash"
    if not isinstance(prefix_caching, str):
        raise TypeError(
            f"prefix_caching must be a bool or one of {PREFIX_CACHES}, got {prefix_caching!r}"
        )
    if prefix_caching in PREFIX_CACHES:
        return prefix_caching
    raise ValueError(
        f"prefix_caching must be False, True or one of {PREFIX_CACHES}, got {prefix_caching!r}"
    )


def _check_budget(requests, budget: int | None, chunked: bool, preemption: str) -> None:
    """Without chunked prefill a prompt is read in one step, so it must fit the token budget
    (after a preemption by recompute, with what it had generated)."""
    if budget is None:
        return
    positive_int("max_num_batched_tokens", budget)
    if chunked:
        return
    for i, r in enumerate(requests):
        need = most_computed_at_once(r.prompt_len, r.output_len, preemption)
        if need > budget:
            raise ValueError(
                f"requests[{i}] may need {need} tokens computed in one step, more than "
                f"max_num_batched_tokens={budget}: raise the budget or use chunked_prefill=True"
            )


def _check_fits(requests, cache: str, capacity: int, max_seq_len: int, block_size: int) -> None:
    """Reject up front any request that could never run, naming it (never an endless loop)."""
    policy = CACHES[cache]
    for i, r in enumerate(requests):
        if not isinstance(r, Request):
            raise TypeError(f"requests[{i}] must be a kvlab.serving.workload.Request, got {r!r}")
        total = r.total_len
        if total > max_seq_len:
            raise ValueError(
                f"requests[{i}] needs {total} tokens (prompt {r.prompt_len} + output "
                f"{r.output_len}), more than max_seq_len={max_seq_len}"
            )
        if policy is None:
            need = -(-total // block_size) * block_size
            have = capacity // block_size * block_size
        else:
            need, have = booking_size(policy, r.prompt_len, r.output_len, max_seq_len), capacity
        if need > have:
            raise ValueError(
                f"requests[{i}] needs {need} token slots in the {cache} cache, which holds only "
                f"{have}: it cannot run even in an empty cache"
            )


def simulate(
    requests: list[Request],
    *,
    cache: str,
    kv_capacity_tokens: int,
    max_seq_len: int,
    block_size: int = 16,
    max_batch: int | None = None,
    preemption: str = "recompute",
    step_time=None,
    seed: int = 0,
    batching: str = "continuous",
    record: bool = False,
    schedule=None,
    preempt=None,
    progress: bool = False,
    prefix_caching: bool | str = False,
    max_num_batched_tokens: int | None = None,
    chunked_prefill: bool = False,
    fast_forward: bool = True,
    cpu_cache_blocks: int | None = None,
) -> SimResult:
    """Serve ``requests`` to completion on one cache; return a :class:`SimResult`.

    ``cache``: ``"contiguous"`` (every request books ``max_seq_len`` slots: Orca-Max),
    ``"contiguous-pow2"``, ``"contiguous-oracle"`` or ``"paged"`` (blocks of ``block_size`` on
    demand), each over ``kv_capacity_tokens`` token slots. Arrivals are in steps, or in seconds
    with a ``step_time`` model (:class:`kvlab.perf.roofline.StepTime`). ``batching="static"`` runs
    each batch until its longest member is done. Requests arriving at the same time are served in
    the given order; ``seed`` other than 0 shuffles such ties (a seeded, reproducible order).
    ``record=True`` keeps a frame per event in ``result.trace`` (small days only).
    ``schedule`` and ``preempt`` replace the scheduler's own (Lab 06's exercises; with a token
    budget, a schedule sets each scheduled sequence's ``num_scheduled`` and ``samples``: Lab 09).
    ``prefix_caching=True`` (paged only) shares cached prompt prefixes: requests with
    ``prompt_ids`` are compared by token; the others, and every generated token, get ids of
    their own that nobody else has (a preempted request may still find its own blocks).
    ``prefix_caching="radix"`` keeps them in a radix tree instead of the hash chain (``"hash"``,
    the same as True). ``max_num_batched_tokens`` caps the tokens computed in a step (vLLM's
    token budget); with ``chunked_prefill=True`` long prompts are read in chunks over several
    steps (``result.scheduled_tokens``, ``result.itls()``). Stretches of steps that only decode
    run at once (:mod:`kvlab.serving.fast_forward`; never with ``record``, ``schedule``,
    ``preempt`` or prefix caching), with results identical to stepping: ``fast_forward=False``
    steps one at a time. ``cpu_cache_blocks`` (with prefix caching) puts a CPU tier of that
    many blocks below HBM (:class:`kvlab.core.prefix_cache.TieredPrefixCache`): evicted cached
    blocks go down to it, and a prompt whose prefix continues there copies those blocks up
    instead of computing them; a step then also pays their K/V over PCIe (``step_time``'s
    ``pcie_bytes_per_s``, 25 GB/s by default: PCIe 4.0 x16 in practice), while a miss pays its
    prefill FLOPs as always (``result.prefix_tier_hit_tokens``, ``result.copied_up_bytes``).
    Deterministic.
    """
    if not isinstance(requests, list | tuple):
        raise TypeError(
            f"requests must be a list of kvlab.serving.workload.Request, got {requests!r}"
        )
    if not requests:
        raise ValueError("requests must not be empty")
    if preemption not in PREEMPTION_MODES:
        raise ValueError(f"preemption must be one of {PREEMPTION_MODES}, got {preemption!r}")
    if batching not in BATCHING_MODES:
        raise ValueError(f"batching must be one of {BATCHING_MODES}, got {batching!r}")
    if schedule is not None and batching != "continuous":
        raise ValueError("a custom schedule decides admission itself: use batching='continuous'")
    if not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    prefix_cache = _prefix_cache(prefix_caching)
    if not isinstance(chunked_prefill, bool):
        raise TypeError(f"chunked_prefill must be a bool, got {chunked_prefill!r}")
    if chunked_prefill and max_num_batched_tokens is None:
        raise ValueError("chunked_prefill needs a token budget: give max_num_batched_tokens")
    kv_cache = make_cache(
        cache, kv_capacity_tokens, max_seq_len, block_size, prefix_caching, cpu_cache_blocks
    )
    _check_fits(requests, cache, kv_capacity_tokens, max_seq_len, block_size)
    _check_budget(requests, max_num_batched_tokens, chunked_prefill, preemption)
    executor = costed_steps(step_time, kv_cache, cpu_cache_blocks)
    recorder = Recorder(kv_cache) if record else None
    sequences = [
        Sequence(f"r{i}", r.prompt_len, r.output_len, r.arrival) for i, r in enumerate(requests)
    ]
    result = SimResult(cache, kv_cache.capacity, sequences, executor.timed)
    result.prefix_caching, result.prefix_cache = prefix_cache is not None, prefix_cache
    result.max_num_batched_tokens, result.chunked_prefill = max_num_batched_tokens, chunked_prefill
    result.trace = recorder and recorder.trace
    measure = _Measure(result, progress)
    engine = Engine(
        kv_cache,
        executor,
        max_batch=max_batch,
        preemption=preemption,
        batching=batching,
        recorder=recorder,
        schedule=schedule,
        preempt=preempt,
        max_num_batched_tokens=max_num_batched_tokens,
        chunked_prefill=chunked_prefill,
        observer=measure,
        fast_forward=fast_forward,
    )
    tie = random.Random(seed).random if seed else (lambda: 0.0)
    order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival, tie()))
    if prefix_cache is not None:
        for i, (seq, r) in enumerate(zip(sequences, requests, strict=True)):
            seq.token_ids = _token_ids(i, r)
    for i in order:
        engine.add(sequences[i])
    try:
        engine.run()
    finally:
        measure.close()
    result.token_gaps = engine.token_gaps
    scheduler = engine.scheduler
    result.preemptions = scheduler.num_preemptions
    result.recompute_tokens = scheduler.recompute_tokens
    result.swapped_tokens = scheduler.swapped_out_tokens
    result.end_time = engine.clock
    result.fast_forward_steps = engine.fast_forward_steps
    result.fast_forward_runs = engine.fast_forward_runs
    if prefix_cache is not None:
        record_prefix_stats(result, kv_cache, cpu_cache_blocks, step_time)
    return result


def costed_steps(step_time, kv_cache, cpu_cache_blocks: int | None) -> CostedSteps:
    """The executor that costs each step, copies up from a CPU tier included."""
    copied_up = None
    if cpu_cache_blocks is not None:
        tier = kv_cache.manager.prefix_cache
        copied_up = lambda: tier.tier_hits  # noqa: E731
    return CostedSteps(step_time, copied_up)


def record_prefix_stats(result, kv_cache, cpu_cache_blocks: int | None, step_time) -> None:
    """A day's prefix-cache figures into its result: hits, evictions, the tier's traffic."""
    stats = kv_cache.prefix_cache_stats
    result.prefix_query_tokens, result.prefix_hit_tokens = stats.queries, stats.hits
    result.evictions = stats.evictions
    if cpu_cache_blocks is not None:
        result.cpu_cache_blocks = cpu_cache_blocks
        result.prefix_tier_hit_tokens = stats.tier_hits
        result.demoted_blocks, result.tier_evictions = stats.demotions, stats.tier_evictions
        spec = getattr(step_time, "spec", None)
        if spec is not None:
            result.copied_up_bytes = float(stats.tier_hits * spec.kv_bytes_per_token)


def _token_ids(index: int, request: Request) -> list[int]:
    """A request's prompt ids (its own, or ids nobody else has) and ids for its answer: its
    ``output_ids`` when given (a recorded conversation, whose next prompt carries the answer),
    else ids no other request shares (beyond any vocabulary: such answers are never compared)."""
    own = (index + 1) << 32
    prompt = request.prompt_ids
    if prompt is None:
        prompt = range(own, own + request.prompt_len)
    if request.output_ids is not None:  # a replayed answer: a later prompt may carry it
        return [*prompt, *request.output_ids]
    start = own + (1 << 31)
    return [*prompt, *range(start, start + request.output_len)]


class _Measure:
    """The simulator's observer: the memory and the batch after each step's scheduling (a
    :class:`kvlab.serving.interfaces.DecodeRunObserver`: a run of decode steps is measured at once)."""

    def __init__(self, result: SimResult, progress: bool):
        self.result = result
        self.arrivals = sorted(seq.arrival for seq in result.sequences)
        self.bar = None
        if progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=len(self.arrivals), unit="request", desc=result.cache, mininterval=0.5
            )

    def after_step(self, engine: Engine, step) -> None:
        result, cache, scheduler = self.result, engine.cache, engine.scheduler
        now = engine.step_start
        allocated = cache.allocated_tokens
        result.times.append(now)
        result.batch.append(len(step.scheduled))
        result.scheduled_tokens.append(step.num_batched_tokens)
        result.utilization.append(cache.held_tokens / allocated)
        result.occupancy.append(allocated / cache.capacity)
        arrived = bisect.bisect_right(self.arrivals, now)
        result.waiting.append(arrived - scheduler.num_finished - len(scheduler.running))
        if self.bar is not None and step.finished:
            self.bar.update(scheduler.num_finished - self.bar.n)

    def after_decode_run(self, engine: Engine, run) -> None:
        """What :meth:`after_step` would record after each step of a
        :class:`~kvlab.serving.fast_forward.DecodeRun`."""
        result, scheduler = self.result, engine.scheduler
        steps, batch, capacity = run.steps, len(run.sequences), engine.cache.capacity
        result.times += run.starts
        result.batch += [batch] * steps
        result.scheduled_tokens += [batch] * steps  # one token each
        held = run.held
        result.utilization += [(held + j * batch) / a for j, a in enumerate(run.allocated)]
        result.occupancy += [a / capacity for a in run.allocated]
        present = scheduler.num_finished + len(scheduler.running)
        arrivals, starts = self.arrivals, run.starts
        first = bisect.bisect_right(arrivals, starts[0])
        if first == bisect.bisect_right(arrivals, starts[-1]):  # nobody arrived during the run
            result.waiting += [first - present] * steps
        else:
            result.waiting += [bisect.bisect_right(arrivals, t) - present for t in starts]

    def close(self) -> None:
        if self.bar is not None:
            self.bar.update(self.bar.total - self.bar.n)
            self.bar.close()
