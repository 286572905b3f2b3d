"""Recording what a cache does, from the outside.

A :class:`Recorder` belongs to whoever drives a cache (the replay, a notebook cell): after each
event it reads the cache's :meth:`state` into a :class:`~kvlab.core.trace.Trace`. Caches keep no clock
and no trace of their own. :func:`recorded` wraps a cache for cells that call it by hand: every
call that changes the cache, or is refused, leaves a frame.

With prefix caching, a check-in says how many rooms it found cached, and a call that hands out
cached rooms (overwriting the tokens they kept) leaves an extra "eviction" frame naming them.
"""

from __future__ import annotations

from kvlab.core.errors import OutOfMemory
from kvlab.core.trace import Trace


class Recorder:
    """Frames of one cache's state; ``clock`` is the time stamped on the next frame."""

    def __init__(self, cache, clock: float = 0.0):
        state = cache.state()
        self.cache = cache
        self.clock = clock
        self.trace = Trace(state.kind, state.num_blocks, state.block_size)
        self.record("start")

    def record(self, event: str, seq_id=None, note: str = "") -> None:
        self.trace.record(event, seq_id, self.clock, self.cache.state(), note)

    def refused(self, seq_id, refusal: OutOfMemory) -> None:
        """A frame for a refused request: an impossible allocation (enough space in total, only
        scattered) or plain out of memory."""
        event = "impossible allocation" if refusal.impossible else "out of memory"
        n, unit = refusal.needed, refusal.unit
        note = "" if n is None else f"{seq_id} needs {n} {unit if n != 1 else unit[:-1]}"
        self.record(event, seq_id, note=note)


# how the course's caches name a call's sequence: the block manager, the contiguous caches
_SEQ_KEYWORDS = ("seq_id", "request_id")


def _seq_id(call: str, args: tuple, kwargs: dict):
    """The sequence a recorded call is about: its first argument, by position or by name."""
    if args:
        return args[0]
    for name in _SEQ_KEYWORDS:
        if name in kwargs:
            return kwargs[name]
    raise TypeError(
        f"{call}() of a recorded cache takes the sequence first, by position or as "
        f"{' or '.join(name + '=' for name in _SEQ_KEYWORDS)}"
    )


def _fork_ids(args: tuple, kwargs: dict) -> tuple:
    """(parent, child) of a fork, by position or as ``parent_id=`` / ``child_id=``."""
    ids = list(args[:2])
    for name in ("parent_id", "child_id")[len(ids) :]:
        if name not in kwargs:
            raise TypeError("fork() of a recorded cache takes parent_id and child_id")
        ids.append(kwargs[name])
    return tuple(ids)


def _declares_prefix_caching(cache) -> bool:
    """Whether the cache finds prompt prefixes cached, as it declares it: ``prefix_caching`` (the
    scheduler's caches, :class:`kvlab.serving.interfaces.KVCache`) or ``enable_prefix_caching`` (a block
    manager's setting). A cache that declares neither (a learner's own) does not."""
    declared = getattr(cache, "prefix_caching", None)
    if declared is None:
        declared = getattr(cache, "enable_prefix_caching", False)
    return bool(declared)


def _copy_on_write(moved) -> tuple[str, str] | None:
    """The frame of an ``append_slot`` that moved the sequence to a copy of a shared block (it
    returns ``(src, dst)`` then, else None)."""
    if moved is None:
        return None
    src, dst = moved
    return "copy-on-write", f"room {src} -> room {dst}"


def _check_out(_) -> tuple[str, str]:
    return "check-out", ""


class Recording:
    """A cache whose changes are recorded: use it as the cache itself, and read ``.trace``.

    The calls that change a cache (check-in: ``allocate`` / ``admit``; check-out: ``free`` /
    ``release``; ``append`` / ``append_slot``; ``fork``) go to the cache and leave a frame when
    they change what a picture shows or are refused; every other attribute is the cache's own.
    Learners' caches name their arguments their own way, so the sequence is read from the first
    argument (or ``seq_id=`` / ``request_id=``) and the call is passed on as given."""

    def __init__(self, cache):
        self.cache = cache
        self.recorder = Recorder(cache)
        self.prefix_caching = _declares_prefix_caching(cache)

    @property
    def trace(self) -> Trace:
        return self.recorder.trace

    def record(self, event: str = "step", seq_id=None, note: str = "") -> None:
        """A frame of the cache now, for an event the cache's own calls do not show."""
        self.recorder.record(event, seq_id, note)

    def __getattr__(self, name):
        return getattr(self.cache, name)

    def __contains__(self, seq_id) -> bool:
        return seq_id in self.cache

    # --- the recorded calls ----------------------------------------------------------------------
    def allocate(self, *args, **kwargs):
        seq_id = _seq_id("allocate", args, kwargs)
        return self._call(self.cache.allocate, seq_id, args, kwargs, self._check_in, True)

    def admit(self, *args, **kwargs):
        seq_id = _seq_id("admit", args, kwargs)
        return self._call(self.cache.admit, seq_id, args, kwargs, self._check_in, True)

    def free(self, *args, **kwargs):
        seq_id = _seq_id("free", args, kwargs)
        return self._call(self.cache.free, seq_id, args, kwargs, _check_out)

    def release(self, *args, **kwargs):
        seq_id = _seq_id("release", args, kwargs)
        return self._call(self.cache.release, seq_id, args, kwargs, _check_out)

    def append(self, *args, **kwargs):
        """One more token: no frame of its own (a plain append changes no picture)."""
        seq_id = _seq_id("append", args, kwargs)
        return self._call(self.cache.append, seq_id, args, kwargs)

    def append_slot(self, *args, **kwargs):
        seq_id = _seq_id("append_slot", args, kwargs)
        return self._call(self.cache.append_slot, seq_id, args, kwargs, _copy_on_write)

    def fork(self, *args, **kwargs):
        parent, child = _fork_ids(args, kwargs)

        def fork_frame(_) -> tuple[str, str]:
            blocks = len(self.cache.block_table(child))
            return "fork", f"{child} shares {parent}'s {blocks} rooms"

        return self._call(self.cache.fork, child, args, kwargs, fork_frame)

    def _check_in(self, seq_id) -> tuple[str, str]:
        tokens = self._cached_tokens(seq_id)
        if not tokens:
            return "check-in", ""
        blocks = tokens // self.trace.block_size
        note = f"{seq_id} found {blocks} room{'s' if blocks != 1 else ''} cached: {tokens} tokens"
        return "check-in", note

    def _call(self, method, seq_id, args, kwargs, frame=None, check_in: bool = False):
        """Call the cache about ``seq_id``. A refusal leaves its frame; otherwise ``frame``
        says what to record ((event, note), or None: nothing), and an eviction the call caused
        leaves one more frame. ``frame`` of a check-in takes the sequence, any other the result."""
        watch = self._eviction_watch()
        try:
            result = method(*args, **kwargs)
        except OutOfMemory as refusal:
            self.recorder.refused(seq_id, refusal)
            raise
        told = None if frame is None else frame(seq_id if check_in else result)
        if told is not None:
            self.recorder.record(told[0], seq_id, note=told[1])
        if watch is not None:
            # a frame just recorded holds the block tables now: no second read of the state
            self._evictions(seq_id, check_in, *watch, fresh=told is not None)
        return result

    # --- prefix caching ----------------------------------------------------------------------------
    def _eviction_watch(self) -> tuple | None:
        """What the eviction check after a call needs: the blocks cached before it and the
        cache's eviction count, if it keeps one. None when nothing was cached, so nothing can be
        evicted.

        The last frame knows the cached blocks: only a change of them that leaves no frame (a
        plain append) could evict, and an eviction leaves a frame.
        """
        if not self.prefix_caching:
            return None
        cached = self.trace.frames[-1].cached
        if not cached:
            return None
        stats = self._stats()
        return cached, None if stats is None else stats.evictions

    def _stats(self):
        """The cache's :class:`~kvlab.core.block_manager.PrefixCacheStats` (``prefix_cache_stats``). A
        learner's prefix cache may keep none: every call that could evict then compares block
        tables instead."""
        return getattr(self.cache, "prefix_cache_stats", None)

    def _evictions(self, seq_id, check_in: bool, cached: tuple, count, fresh: bool) -> None:
        """An "eviction" frame when the call put blocks that were cached on the sequence's block
        table, other than the prefix it found cached: their old tokens are overwritten.
        ``fresh``: the call left a frame, so the last frame's block tables are the cache's now."""
        if count is not None and self._stats().evictions == count:
            return
        tables = self.trace.frames[-1].tables if fresh else self.cache.state().block_tables
        table = tables.get(seq_id, ())
        found = self._cached_tokens(seq_id) // self.trace.block_size if check_in else 0
        before = set(cached)
        blocks = [block for block in table[found:] if block in before]
        if blocks:
            what, whose = ("rooms", "their") if len(blocks) > 1 else ("room", "its")
            listed = ", ".join(map(str, blocks))
            note = f"{seq_id} took cached {what} {listed}: {whose} old tokens are overwritten"
            self.recorder.record("eviction", seq_id, note=note)

    def _cached_tokens(self, seq_id) -> int:
        """Prompt tokens the sequence found cached at check-in (0 without prefix caching)."""
        return self.cache.num_cached_tokens(seq_id) if self.prefix_caching else 0


def recorded(cache) -> Recording:
    """``cache`` with every change recorded: ``arena = recorded(ArenaAllocator(64))``, call it as
    usual, then draw ``arena.trace``."""
    return Recording(cache)
