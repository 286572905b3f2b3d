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

from kvlab.core.cache_kinds import CACHES  # noqa: F401  (the simulator's caches, named once)
from kvlab.core.recorder import Recorder
from kvlab.core.trace import Trace
from kvlab.serving.config import (
    PREFIX_CACHES,  # noqa: F401  (importable from here, as always)
    EngineConfig,
    check_cost_model,
    resolve,
)
from kvlab.serving.engine import Engine
from kvlab.serving.scheduler import Sequence
from kvlab.serving.workload import Request


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
        check_cost_model(step_time)
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
    cache: str | EngineConfig,
    kv_capacity_tokens: int | None = None,
    max_seq_len: int | None = None,
    block_size: int = 16,
    prefix_caching: bool | str = False,
    cpu_cache_blocks: int | None = None,
):
    """One of the four caches over ``kv_capacity_tokens`` token slots of memory (the paged one
    with prefix caching if asked: True or ``"hash"`` for the hash chain, ``"radix"`` for the
    radix tree; ``cpu_cache_blocks``: a CPU tier of that many blocks below it), or the cache an
    :class:`~kvlab.serving.config.EngineConfig` given alone describes: what
    :meth:`EngineConfig.make_cache <kvlab.serving.config.EngineConfig.make_cache>` builds."""
    if isinstance(cache, EngineConfig):
        return cache.make_cache()
    return EngineConfig(
        cache=cache,
        kv_capacity_tokens=kv_capacity_tokens,
        max_seq_len=max_seq_len,
        block_size=block_size,
        prefix_caching=prefix_caching,
        cpu_cache_blocks=cpu_cache_blocks,
    ).make_cache()


def check_seed(seed) -> None:
    """A seed is an int (not a bool): it shuffles ties between arrivals, reproducibly."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {seed!r}")


def simulate(
    requests: list[Request],
    config: EngineConfig | None = None,
    *,
    seed: int = 0,
    progress: bool = False,
    **settings,
) -> SimResult:
    """Serve ``requests`` to completion on one cache; return a :class:`SimResult`.

    The server is ``config`` (a :class:`kvlab.serving.config.EngineConfig`), or the settings
    given as keywords (with ``config``, they change it), as always: ``cache``:
    ``"contiguous"`` (every request books ``max_seq_len`` slots: Orca-Max),
    ``"contiguous-pow2"``, ``"contiguous-oracle"`` or ``"paged"`` (blocks of ``block_size`` on
    demand, the default), each over ``kv_capacity_tokens`` token slots. Arrivals are in steps,
    or in seconds with a ``step_time`` model (:class:`kvlab.perf.roofline.StepTime`).
    ``batching="static"`` runs each batch until its longest member is done. Requests arriving at
    the same time are served in the given order; ``seed`` other than 0 shuffles such ties (a
    seeded, reproducible order). ``record=True`` keeps a frame per event in ``result.trace``
    (small days only). ``schedule`` and ``preempt`` replace the scheduler's own (Lab 06's
    exercises; with a token budget, a schedule sets each scheduled sequence's ``num_scheduled``
    and ``samples``: Lab 09). ``prefix_caching=True`` (paged only) shares cached prompt
    prefixes: requests with ``prompt_ids`` are compared by token; the others, and every
    generated token, get ids of their own that nobody else has (a preempted request may still
    find its own blocks). ``prefix_caching="radix"`` keeps them in a radix tree instead of the
    hash chain (``"hash"``, the same as True). ``max_num_batched_tokens`` caps the tokens
    computed in a step (vLLM's token budget); with ``chunked_prefill=True`` long prompts are
    read in chunks over several steps (``result.scheduled_tokens``, ``result.itls()``).
    Stretches of steps that only decode run at once (:mod:`kvlab.serving.fast_forward`; never
    with ``record``, ``schedule``, ``preempt`` or prefix caching), with results identical to
    stepping: ``fast_forward=False`` steps one at a time. ``cpu_cache_blocks`` (with prefix
    caching) puts a CPU tier of that many blocks below HBM
    (:class:`kvlab.core.prefix_cache.TieredPrefixCache`): evicted cached blocks go down to it,
    and a prompt whose prefix continues there copies those blocks up instead of computing them;
    a step then also pays their K/V over PCIe (``step_time``'s ``pcie_bytes_per_s``, 25 GB/s by
    default: PCIe 4.0 x16 in practice), while a miss pays its prefill FLOPs as always
    (``result.prefix_tier_hit_tokens``, ``result.copied_up_bytes``). Deterministic.
    """
    config = resolve(config, settings, caller="simulate")
    config.check_requests(requests)
    check_seed(seed)
    sequences = [
        Sequence(f"r{i}", r.prompt_len, r.output_len, r.arrival) for i, r in enumerate(requests)
    ]
    if config.prefix_cache is not None:
        for i, (seq, r) in enumerate(zip(sequences, requests, strict=True)):
            seq.token_ids = _token_ids(i, r)
    replica = Replica(config, sequences, progress=progress)
    tie = random.Random(seed).random if seed else (lambda: 0.0)
    order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival, tie()))
    for i in order:
        replica.engine.add(sequences[i])
    return replica.finish()


class Replica:
    """One simulated server built from a config: its cache, costed executor, recorder, engine
    and the :class:`SimResult` its observer fills (:func:`simulate` runs one, the fleet many)."""

    def __init__(
        self,
        config: EngineConfig,
        sequences: list[Sequence],
        *,
        progress: bool = False,
        measure: type | None = None,
    ):
        self.config = config
        kv_cache = make_cache(config)
        executor = costed_steps(config.step_time, kv_cache, config.cpu_cache_blocks)
        recorder = Recorder(kv_cache) if config.record else None
        result = SimResult(config.cache, kv_cache.capacity, sequences, executor.timed)
        result.prefix_caching = config.prefix_cache is not None
        result.prefix_cache = config.prefix_cache
        result.max_num_batched_tokens = config.max_num_batched_tokens
        result.chunked_prefill = config.chunked_prefill
        result.trace = recorder and recorder.trace
        self.result = result
        self.measure = (measure or _Measure)(result, progress)
        self.engine = Engine(
            kv_cache, executor, config=config, recorder=recorder, observer=self.measure
        )

    def finish(self) -> SimResult:
        """Run to the end; the engine's counters into the result."""
        engine, result = self.engine, self.result
        try:
            engine.run()
        finally:
            self.measure.close()
        scheduler = engine.scheduler
        result.token_gaps = engine.token_gaps
        result.preemptions = scheduler.num_preemptions
        result.recompute_tokens = scheduler.recompute_tokens
        result.swapped_tokens = scheduler.swapped_out_tokens
        result.end_time = engine.clock
        result.fast_forward_steps = engine.fast_forward_steps
        result.fast_forward_runs = engine.fast_forward_runs
        config = self.config
        if config.prefix_cache is not None:
            record_prefix_stats(result, engine.cache, config.cpu_cache_blocks, config.step_time)
        return result


def costed_steps(step_time, kv_cache, cpu_cache_blocks: int | None) -> CostedSteps:
    """The executor that costs each step, copies up from a CPU tier included."""
    copied_up = None
    if cpu_cache_blocks is not None:
        copied_up = lambda: kv_cache.tier_hit_tokens  # noqa: E731
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
