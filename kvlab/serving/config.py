"""One frozen engine configuration, checked once, for the scheduler, the engine and the simulator.

:class:`EngineConfig` holds every setting of a served day: how the scheduler admits and preempts
(vLLM's ``SchedulerConfig``: ``max_num_seqs`` is ``max_batch`` here, ``max_num_batched_tokens``,
chunked prefill, the preemption mode), how the engine keeps time, and, for
:func:`~kvlab.serving.simulate` and :func:`~kvlab.serving.simulate_fleet`, which simulated cache
and cost model the server has (vLLM's ``CacheConfig``: block size, prefix caching, a CPU tier).
Each argument is checked in ``__post_init__``, with an error that names it, so that
:class:`~kvlab.serving.scheduler.Scheduler`, :class:`~kvlab.serving.engine.Engine`,
``simulate`` and ``simulate_fleet`` share one set of checks instead of copies. Each of them
still takes the settings as keywords (:func:`resolve` builds the config from them, or changes
the given ``config=`` with them), so ``simulate(day, cache="paged", ...)`` is as it always was;
a part reads only the settings it needs (the scheduler ignores the cache's, an engine built over
a cache it is given ignores the simulated cache's).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from kvlab.core.cache_kinds import CACHES
from kvlab.core.prefix_cache import PREFIX_CACHES as PREFIX_CACHE_KINDS
from kvlab.core.validate import positive_int

PREEMPTION_MODES = ("recompute", "swap")
BATCHING_MODES = ("continuous", "static")
PREFIX_CACHES = tuple(PREFIX_CACHE_KINDS)  # "hash", "radix"


def most_computed_at_once(prompt_len: int, output_len: int, preemption: str) -> int:
    """The most tokens a request may compute in one step when its prompt is read whole: the
    prompt, or by recompute all it holds but its last token (readmitted after a preemption)."""
    return prompt_len + output_len - 1 if preemption == "recompute" else prompt_len


def check_read_whole(who: str, prompt_len: int, output_len: int, preemption: str, budget: int):
    """Reject a request (``who`` in the error) whose prompt, read whole (no chunked prefill), may
    not fit the token budget ``budget`` in one step."""
    need = most_computed_at_once(prompt_len, output_len, preemption)
    if need > budget:
        raise ValueError(
            f"{who} may need {need} tokens computed in one step, more than "
            f"max_num_batched_tokens={budget}: raise the budget or use chunked_prefill=True"
        )


def check_cost_model(step_time) -> None:
    """A step-time model is None or has ``seconds(new_tokens, attended, kv_tokens,
    swapped_tokens)``."""
    if step_time is not None and not callable(getattr(step_time, "seconds", None)):
        raise TypeError(
            "step_time must be None or a cost model with a seconds(new_tokens, attended, "
            f"kv_tokens, swapped_tokens) method such as kvlab.perf.roofline.StepTime, got {step_time!r}"
        )


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """The settings of a served day (the module says who reads which); frozen and checked once.

    Scheduler: ``max_batch`` caps the sequences running at once; ``preemption`` is
    ``"recompute"`` or ``"swap"``; ``batching="static"`` admits only into an empty cache;
    ``max_num_batched_tokens`` is a step's token budget (None: unlimited) and
    ``chunked_prefill=True`` reads a prompt over several steps; ``schedule`` (a function
    ``(scheduler, now) -> ScheduledStep``) and ``preempt`` (a function of the scheduler) replace
    the scheduler's own (Labs 06 and 09). Engine: ``step_seconds`` is a step's length without a
    timed executor; ``fast_forward=False`` steps one at a time where a stretch of decode steps
    could run at once (:mod:`kvlab.serving.fast_forward`). The simulated server: ``cache`` (one
    of :data:`kvlab.core.cache_kinds.CACHES`) over ``kv_capacity_tokens`` token slots for
    requests of at most ``max_seq_len`` tokens, in blocks of ``block_size``;
    ``prefix_caching`` (True or ``"hash"``, ``"radix"``; paged only) with a CPU tier of
    ``cpu_cache_blocks``; ``step_time`` (a cost model such as
    :class:`kvlab.perf.roofline.StepTime`; None: steps are counted); ``record=True`` keeps a
    frame per event. :meth:`replace` gives a copy with some settings changed (checked again).
    """

    # the scheduler
    max_batch: int | None = None
    preemption: str = "recompute"
    batching: str = "continuous"
    max_num_batched_tokens: int | None = None
    chunked_prefill: bool = False
    schedule: Callable | None = None
    preempt: Callable | None = None
    # the engine
    step_seconds: float = 1.0
    fast_forward: bool = True
    # the simulated server: its cache and its cost model
    cache: str = "paged"
    kv_capacity_tokens: int | None = None
    max_seq_len: int | None = None
    block_size: int = 16
    prefix_caching: bool | str = False
    cpu_cache_blocks: int | None = None
    step_time: object = None
    record: bool = False

    def __post_init__(self):
        def count(name: str, optional: bool) -> None:
            value = getattr(self, name)
            if value is not None or not optional:
                object.__setattr__(self, name, positive_int(name, value))

        count("max_batch", optional=True)
        if self.preemption not in PREEMPTION_MODES:
            raise ValueError(
                f"preemption must be one of {PREEMPTION_MODES}, got {self.preemption!r}"
            )
        if self.batching not in BATCHING_MODES:
            raise ValueError(f"batching must be one of {BATCHING_MODES}, got {self.batching!r}")
        count("max_num_batched_tokens", optional=True)
        if not isinstance(self.chunked_prefill, bool):
            raise TypeError(f"chunked_prefill must be a bool, got {self.chunked_prefill!r}")
        if self.chunked_prefill and self.max_num_batched_tokens is None:
            raise ValueError("chunked_prefill needs a token budget: give max_num_batched_tokens")
        if self.schedule is not None and not callable(self.schedule):
            raise TypeError(
                f"schedule must be a function (scheduler, now) or None, got {self.schedule!r}"
            )
        if self.schedule is not None and self.batching != "continuous":
            raise ValueError(
                "a custom schedule decides admission itself: use batching='continuous'"
            )
        if self.preempt is not None and not callable(self.preempt):
            raise TypeError(
                f"preempt must be a function of the scheduler or None, got {self.preempt!r}"
            )
        seconds = self.step_seconds
        if isinstance(seconds, bool) or not (isinstance(seconds, int | float) and seconds > 0):
            raise ValueError(f"step_seconds must be a number > 0, got {seconds!r}")
        if not isinstance(self.fast_forward, bool):
            raise TypeError(f"fast_forward must be a bool, got {self.fast_forward!r}")
        self._check_server()
        check_cost_model(self.step_time)
        if not isinstance(self.record, bool):
            raise TypeError(f"record must be a bool, got {self.record!r}")

    def _check_server(self) -> None:
        """The simulated cache's settings, in the order make_cache always checked them."""
        prefix_cache = _prefix_cache(self.prefix_caching)
        if self.cpu_cache_blocks is not None:
            positive_int("cpu_cache_blocks", self.cpu_cache_blocks)
            if prefix_cache is None:
                raise ValueError(
                    "cpu_cache_blocks is a tier of the prefix cache: set prefix_caching"
                )
        if not isinstance(self.cache, str) or self.cache not in CACHES:
            raise ValueError(f"cache must be one of {tuple(CACHES)}, got {self.cache!r}")
        for name in ("kv_capacity_tokens", "max_seq_len"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, positive_int(name, getattr(self, name)))
        object.__setattr__(self, "block_size", positive_int("block_size", self.block_size))
        paged = CACHES[self.cache] is None
        capacity = self.kv_capacity_tokens
        if paged and capacity is not None and capacity < self.block_size:
            raise ValueError(
                f"kv_capacity_tokens ({capacity}) holds no whole block of "
                f"block_size={self.block_size}"
            )
        if prefix_cache is not None and not paged:
            raise ValueError(f"prefix_caching needs the paged cache, not cache={self.cache!r}")

    # --- what the settings mean --------------------------------------------------------------
    @property
    def prefix_cache(self) -> str | None:
        """The prefix cache asked for: None (off), "hash" (also for True) or "radix"."""
        return _prefix_cache(self.prefix_caching)

    @property
    def token_budget(self) -> float:
        """A step's token budget: ``max_num_batched_tokens``, or ``math.inf`` without one (no
        budget is an unlimited budget: one scheduling path serves both)."""
        budget = self.max_num_batched_tokens
        return math.inf if budget is None else budget

    def replace(self, **changes) -> EngineConfig:
        """A copy with ``changes`` (checked as a new config is)."""
        return dataclasses.replace(self, **changes)

    # --- the simulated server ----------------------------------------------------------------
    def make_cache(self):
        """The simulated cache these settings describe, empty (the paged one with prefix
        caching and its CPU tier if asked; a contiguous one books ``max_seq_len`` at most)."""
        from kvlab.core.block_manager import PagedCache
        from kvlab.core.contiguous import ContiguousKVCache

        capacity, max_seq_len = self._sizes()
        if CACHES[self.cache] is None:
            prefix_cache = self.prefix_cache
            if prefix_cache is None:
                return PagedCache(capacity // self.block_size, self.block_size)
            return PagedCache(
                capacity // self.block_size,
                self.block_size,
                enable_prefix_caching=True,
                prefix_cache=prefix_cache,
                cpu_cache_blocks=self.cpu_cache_blocks,
            )
        num_slots = max(1, capacity // max_seq_len)
        return ContiguousKVCache(
            num_slots, max_seq_len, policy=CACHES[self.cache], capacity_tokens=capacity
        )

    def _sizes(self) -> tuple[int, int]:
        for name in ("kv_capacity_tokens", "max_seq_len"):
            if getattr(self, name) is None:
                raise TypeError(f"a simulated server needs {name} (an int >= 1): give {name}=")
        return self.kv_capacity_tokens, self.max_seq_len

    def check_requests(self, requests) -> None:
        """Reject up front a list of requests that could never be served on this server, naming
        the first that could not (never an endless loop): each must fit ``max_seq_len``, the
        empty cache and, read whole, the token budget."""
        from kvlab.core.contiguous import booking_size
        from kvlab.serving.workload import Request

        if not isinstance(requests, list | tuple):
            raise TypeError(
                f"requests must be a list of kvlab.serving.workload.Request, got {requests!r}"
            )
        if not requests:
            raise ValueError("requests must not be empty")
        capacity, max_seq_len = self._sizes()
        policy, size, cache = CACHES[self.cache], self.block_size, self.cache
        budget = None if self.chunked_prefill else self.max_num_batched_tokens
        for i, r in enumerate(requests):
            if not isinstance(r, Request):
                raise TypeError(
                    f"requests[{i}] must be a kvlab.serving.workload.Request, got {r!r}"
                )
            total = r.total_len
            if total > max_seq_len:
                raise ValueError(
                    f"requests[{i}] needs {total} tokens (prompt {r.prompt_len} + output "
                    f"{r.output_len}), more than max_seq_len={max_seq_len}"
                )
            if policy is None:
                need, have = -(-total // size) * size, capacity // size * size
            else:
                need = booking_size(policy, r.prompt_len, r.output_len, max_seq_len)
                have = capacity
            if need > have:
                raise ValueError(
                    f"requests[{i}] needs {need} token slots in the {cache} cache, which holds "
                    f"only {have}: it cannot run even in an empty cache"
                )
        if budget is not None:  # a prompt read whole fits the budget, with what it made
            for i, r in enumerate(requests):
                check_read_whole(
                    f"requests[{i}]", r.prompt_len, r.output_len, self.preemption, budget
                )


FIELDS = tuple(f.name for f in dataclasses.fields(EngineConfig))
# what each part reads: the scheduler, the engine (its scheduler's too), the simulated server
SCHEDULER_FIELDS = (
    "max_batch",
    "preemption",
    "batching",
    "max_num_batched_tokens",
    "chunked_prefill",
    "preempt",
)
ENGINE_FIELDS = (*SCHEDULER_FIELDS, "schedule", "step_seconds", "fast_forward")


def resolve(
    config: EngineConfig | None, settings: dict, *, caller: str, fields=FIELDS
) -> EngineConfig:
    """The config a call runs with: ``config`` (default: all defaults) with the keyword
    ``settings`` the caller was given (each must be one of ``fields``, the settings ``caller``
    reads); a call with neither gets the defaults."""
    if config is not None and not isinstance(config, EngineConfig):
        raise TypeError(
            f"config must be a kvlab.serving.config.EngineConfig or None, got {config!r}"
        )
    for name in settings:
        if name not in fields:
            raise TypeError(
                f"{caller}() got an unexpected keyword argument {name!r} (its settings: "
                f"{', '.join(fields)})"
            )
    if config is None:
        return EngineConfig(**settings)
    return dataclasses.replace(config, **settings) if settings else config


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


__all__ = [
    "BATCHING_MODES",
    "PREEMPTION_MODES",
    "PREFIX_CACHES",
    "EngineConfig",
    "check_read_whole",
    "most_computed_at_once",
    "resolve",
]
