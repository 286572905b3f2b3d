"""Typed errors shared by every allocator. Each is raised with the allocator's state unchanged."""

from __future__ import annotations


class OutOfMemory(MemoryError):
    """The hotel cannot take this booking now (nothing was changed).

    ``needed`` is how many ``unit`` (beds or rooms) the refused call asked for, when known.
    ``impossible`` is True when enough was free in total, only not in one piece.
    """

    unit = "beds"
    impossible = False

    def __init__(self, message: str = "", *, needed: int | None = None):
        super().__init__(message)
        self.needed = needed


class OutOfSpace(OutOfMemory):
    """No single free extent of a contiguous arena is large enough.

    ``impossible`` is True when the free space *in total* would have been enough: the request was
    refused only because that space is scattered (external fragmentation).
    """

    def __init__(self, message: str, *, needed: int, total_free: int, largest_free: int):
        super().__init__(message, needed=needed)
        self.total_free = total_free
        self.largest_free = largest_free

    def __reduce__(self):  # keyword-only arguments: copy and pickle need to be told them
        return _out_of_space, (str(self), self.needed, self.total_free, self.largest_free)

    @property
    def impossible(self) -> bool:
        return self.total_free >= self.needed


def _out_of_space(message: str, needed: int, total_free: int, largest_free: int) -> OutOfSpace:
    return OutOfSpace(message, needed=needed, total_free=total_free, largest_free=largest_free)


class ReservationFull(OutOfMemory):
    """A guest tried to use one more bed than its booking holds."""
