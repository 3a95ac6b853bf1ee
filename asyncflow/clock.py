"""Monotonic nanoseconds for every timestamp asyncflow records; replaceable for fake time."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["FakeClock", "now_ns", "set_clock"]

#: The clock every recorder reads. Hot paths call ``clock.now_ns()`` through the module so that
#: :func:`set_clock` takes effect everywhere at once.
now_ns: Callable[[], int] = time.perf_counter_ns


def set_clock(fn: Callable[[], int]) -> Callable[[], int]:
    """Replace the clock; returns the previous one so the caller can put it back.

    Args:
        fn: a callable returning monotonic nanoseconds as an ``int``.

    Returns:
        The clock that was in use before.
    """
    global now_ns
    if not callable(fn):
        raise TypeError(f"set_clock() needs a callable returning nanoseconds, got {fn!r}")
    previous = now_ns
    now_ns = fn
    return previous


class FakeClock:
    """A clock that moves only when told to: ``advance(ns)``. For tests with exact durations."""

    __slots__ = ("_now",)

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self._now = start_ns

    def __call__(self) -> int:
        return self._now

    def advance(self, ns: int) -> None:
        """Move time forward by ``ns`` nanoseconds (never backwards)."""
        if ns < 0:
            raise ValueError(f"a monotonic clock cannot go back: advance({ns})")
        self._now += ns
