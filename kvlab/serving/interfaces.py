"""The interfaces where the core's pieces meet, declared so that a new piece knows what to offer.

The scheduler drives a :class:`KVCache` (contiguous or paged); a cache that can share prompt
prefixes says so with ``prefix_caching = True`` and offers :class:`PrefixCachingKVCache`'s calls
too. The engine hands each step to an :class:`Executor` (the simulator's costs it, the tiny model's
computes it); one that keeps K/V of preempted sequences declares ``can_swap = True`` and is the
scheduler's :class:`Swapper`. An :class:`EngineObserver` is told about every step (the replay of
Labs 01-03 measures with one). Capabilities are attributes every implementation declares, never
probed with ``hasattr``. Two optional ones let the engine run a stretch of pure decode steps at
once (:mod:`kvlab.serving.fast_forward`): an executor that is a :class:`DecodeRunExecutor` costs
them without seeing them, an observer that is a :class:`DecodeRunObserver` measures them all at
once; an engine whose executor or observer is not one steps one at a time.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from kvlab.core.accounting import CacheState, Usage
    from kvlab.core.errors import OutOfMemory
    from kvlab.serving.scheduler import ScheduledStep, Sequence


@runtime_checkable
class KVCache(Protocol):
    """What the scheduler drives: book memory for a sequence, make room for its next token, let
    it go. ``refusal`` and ``can_append`` answer before anything changes, so scheduling never
    needs an exception for the normal "not now"."""

    prefix_caching: bool  # True: also a PrefixCachingKVCache

    @property
    def capacity(self) -> int: ...  # token slots in all

    @property
    def allocated_tokens(self) -> int: ...  # slots handed out now, filled or not

    @property
    def held_tokens(self) -> int: ...  # tokens whose K/V the sequences hold

    def __contains__(self, seq_id: Hashable) -> bool: ...

    def refusal(self, prompt_len: int, output_len: int | None = None) -> OutOfMemory | None: ...

    def admit(self, seq_id: Hashable, prompt_len: int, output_len: int | None = None) -> object: ...

    def can_append(self, seq_id: Hashable) -> bool: ...

    def append(self, seq_id: Hashable) -> object: ...

    def release(self, seq_id: Hashable) -> None: ...

    def memory_report(self) -> Usage: ...

    def state(self) -> CacheState: ...


@runtime_checkable
class PrefixCachingKVCache(KVCache, Protocol):
    """A cache that finds the longest cached prefix of a prompt given as token ids (and says how
    long it is without changing anything: :meth:`cached_prefix_tokens`). Admitting
    with ``num_computed`` (chunked prefill) makes only the first ``num_computed`` tokens findable
    (besides the cached prefix); :meth:`cache_computed` makes the rest findable as their K/V are
    written."""

    def refusal(
        self, prompt_len: int, output_len: int | None = None, token_ids=None
    ) -> OutOfMemory | None: ...

    def admit(
        self,
        seq_id: Hashable,
        prompt_len: int,
        output_len: int | None = None,
        token_ids=None,
        *,
        num_computed: int | None = None,
    ) -> object: ...

    def num_cached_tokens(self, seq_id: Hashable) -> int: ...

    def cache_computed(self, seq_id: Hashable, token_ids, num_computed: int) -> None: ...

    def cached_prefix_tokens(self, token_ids) -> int:
        """Tokens of a prompt found cached now (whole blocks, never its last token): a lookup
        that changes nothing, what a router asks of each replica."""
        ...

    @property
    def tier_hit_tokens(self) -> int: ...  # prompt tokens copied up from a CPU tier so far

    @property
    def prefix_cache_stats(self): ...  # a kvlab.core.prefix_cache.PrefixCacheStats


@runtime_checkable
class Swapper(Protocol):
    """Keeps the K/V of a sequence preempted by swapping: told before its slots are released and
    after it is readmitted."""

    def swap_out(self, seq: Sequence) -> None: ...

    def swap_in(self, seq: Sequence) -> None: ...


@runtime_checkable
class Executor(Protocol):
    """Runs one scheduled step. For each sequence in ``step.scheduled`` it computes positions
    ``[seq.num_computed, seq.num_computed + seq.num_scheduled)``; when ``seq.samples`` it also
    produces the token at ``seq.num_tokens - 1``. ``execute`` returns the step's seconds
    (``timed = True``) or None (the clock then counts steps)."""

    timed: bool
    # True: also a Swapper. False: it holds no K/V to lose (a cost model), so a swap is bookkeeping;
    # an executor that keeps K/V must swap, or "swap" preemption silently drops what it computed
    can_swap: bool

    def execute(self, step: ScheduledStep) -> float | None: ...


@runtime_checkable
class DecodeRunExecutor(Executor, Protocol):
    """An executor that computes nothing and costs a decode step by its batch and K/V alone, so
    the engine may run many such steps without handing it each one. ``decode_run_seconds(batch,
    kv_tokens, steps)`` is what ``execute`` would return for each of ``steps`` steps in which the
    same ``batch`` sequences each compute one token: the first reads and writes ``kv_tokens``
    tokens of K/V in all (the sequences' ``num_computed + 1``, summed), each later one ``batch``
    more. A list of ``steps`` seconds, or None when untimed. (The tiny model's executor computes
    real tokens, so it is not one.)"""

    def decode_run_seconds(self, batch: int, kv_tokens: int, steps: int) -> list[float] | None: ...


@runtime_checkable
class EngineObserver(Protocol):
    """Told after every step that ran a batch (``engine.step_start`` is when it began)."""

    def after_step(self, engine, step: ScheduledStep) -> None: ...


@runtime_checkable
class DecodeRunObserver(EngineObserver, Protocol):
    """An observer that can be told about a run of decode steps at once:
    ``after_decode_run(engine, run)`` with a :class:`kvlab.serving.fast_forward.DecodeRun` (each
    step's start, the memory after each, the batch), instead of ``after_step`` for each."""

    def after_decode_run(self, engine, run) -> None: ...


@runtime_checkable
class DecodeRunCache(Protocol):
    """A cache that can take a run of decode steps at once (the simulator's fast path): a round
    is one more token for every sequence, in turn, exactly as ``append`` one at a time."""

    def decode_room(self, seq_ids: list, max_rounds: int) -> int: ...

    def append_rounds(self, seq_ids: list, rounds: int) -> list[int]: ...
