"""Recording what a cache does, from the outside.

A :class:`Recorder` belongs to whoever drives a cache (the replay, a notebook cell): after each
event it reads the cache's :meth:`state` into a :class:`~kvlab.trace.Trace`. Caches keep no clock
and no trace of their own. :func:`recorded` wraps a cache for cells that call it by hand: every
call that changes the cache, or is refused, leaves a frame.

With prefix caching, a check-in says how many rooms it found cached, and a call that hands out
cached rooms (overwriting the tokens they kept) leaves an extra "eviction" frame naming them.
"""

from __future__ import annotations

import inspect

from kvlab.errors import OutOfMemory
from kvlab.trace import Trace


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


_EVENTS = {"allocate": "check-in", "admit": "check-in", "free": "check-out", "release": "check-out"}
_CHECK_IN = ("allocate", "admit")
_RECORDED = (*_EVENTS, "append", "append_slot", "fork")


class Recording:
    """A cache whose changes are recorded: use it as the cache itself, and read ``.trace``."""

    def __init__(self, cache):
        self.cache = cache
        self.recorder = Recorder(cache)

    @property
    def trace(self) -> Trace:
        return self.recorder.trace

    def record(self, event: str = "step", seq_id=None, note: str = "") -> None:
        """A frame of the cache now, for an event the cache's own calls do not show."""
        self.recorder.record(event, seq_id, note)

    def __getattr__(self, name):
        attribute = getattr(self.cache, name)
        if name not in _RECORDED:
            return attribute

        def call(*args, **kwargs):
            named = list(inspect.signature(attribute).bind(*args, **kwargs).arguments.values())
            watch = self._eviction_watch()
            try:
                result = attribute(*args, **kwargs)
            except OutOfMemory as refusal:
                self.recorder.refused(named[-1] if name == "fork" else named[0], refusal)
                raise
            frames = len(self.trace)
            self._after(name, named, result)
            if watch is not None:
                # a frame just recorded holds the key cards now: no second read of the state
                fresh = len(self.trace) > frames
                self._evictions(name, named[0], *watch, fresh)
            return result

        return call

    def _eviction_watch(self) -> tuple | None:
        """What the eviction check after a call needs: the rooms cached before it and the cache's
        eviction count, if it keeps one. None when nothing was cached, so nothing can be evicted.

        The last frame knows the cached rooms: only a change of them that leaves no frame (a
        plain append) could evict, and an eviction leaves a frame.
        """
        cached = self.trace.frames[-1].cached
        if not cached:
            return None
        stats = getattr(self.cache, "prefix_cache_stats", None)
        return cached, None if stats is None else stats.evictions

    def _evictions(self, name: str, seq_id, cached: tuple, count: int | None, fresh: bool) -> None:
        """An "eviction" frame when the call put rooms that were cached on the guest's key card,
        other than the prefix it found cached: their old tokens are overwritten. ``fresh``: the
        call left a frame, so the last frame's key cards are the cache's now."""
        if count is not None and self.cache.prefix_cache_stats.evictions == count:
            return
        tables = self.trace.frames[-1].tables if fresh else self.cache.state().block_tables
        table = tables.get(seq_id, ())
        found = self._cached_tokens(seq_id) // self.trace.block_size if name in _CHECK_IN else 0
        before = set(cached)
        rooms = [room for room in table[found:] if room in before]
        if rooms:
            what, whose = ("rooms", "their") if len(rooms) > 1 else ("room", "its")
            listed = ", ".join(map(str, rooms))
            note = f"{seq_id} took cached {what} {listed}: {whose} old tokens are overwritten"
            self.recorder.record("eviction", seq_id, note=note)

    def _cached_tokens(self, seq_id) -> int:
        """Prompt tokens the sequence found cached at check-in (0 without prefix caching)."""
        count = getattr(self.cache, "num_cached_tokens", None)
        return 0 if count is None else count(seq_id)

    def _after(self, name: str, args: list, result) -> None:
        if name == "append_slot" and result is not None:
            src, dst = result
            self.recorder.record("copy-on-write", args[0], note=f"room {src} -> room {dst}")
        elif name == "fork":
            parent, child = args[:2]
            rooms = len(self.cache.block_table(child))
            self.recorder.record("fork", child, note=f"{child} shares {parent}'s {rooms} rooms")
        elif name in _CHECK_IN:
            self.recorder.record("check-in", args[0], note=self._check_in_note(args[0]))
        elif name in _EVENTS:
            self.recorder.record(_EVENTS[name], args[0])

    def _check_in_note(self, seq_id) -> str:
        tokens = self._cached_tokens(seq_id)
        if not tokens:
            return ""
        rooms = tokens // self.trace.block_size
        return f"{seq_id} found {rooms} room{'s' if rooms != 1 else ''} cached: {tokens} tokens"


def recorded(cache) -> Recording:
    """``cache`` with every change recorded: ``arena = recorded(ArenaAllocator(64))``, call it as
    usual, then draw ``arena.trace``."""
    return Recording(cache)
