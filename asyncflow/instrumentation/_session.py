"""State shared by every recorder: whether a profiler listens, the bounded event buffer, errors."""

from __future__ import annotations

import logging
import traceback
from collections import deque
from typing import Any

__all__ = ["MAX_INTERVAL", "SAMPLE_GAP_NS", "Session", "active", "internal_error", "next_interval"]

#: Finished-call records waiting for the collector; bounded so a stalled collector costs no memory.
FINISHED_BUFFER_SIZE = 65_536


class Session:
    """One profiling session: what the recorders write into while a profiler runs.

    Recorders hold no reference to the profiler itself; the collector reads this object.
    """

    __slots__ = (
        "adopted",
        "appended",
        "epoch",
        "finished",
        "keep_in_place",
        "sampling",
        "start_ns",
        "tick",
    )

    def __init__(self, epoch: int, start_ns: int, sampling: int = 0) -> None:
        self.epoch = epoch
        self.start_ns = start_ns
        #: the clock as the collector last read it (every ~50 ms): a when that need not be exact
        #: (the start of a hold that will not be timed) is read here, not from the clock
        self.tick = start_ns
        #: time one message (or stream item) in this many; 0: adapt to the rate (see below)
        self.sampling = sampling
        #: records of finished calls, in finishing order; the oldest are dropped when full
        self.finished: deque[Any] = deque(maxlen=FINISHED_BUFFER_SIZE)
        #: how many records were ever appended to ``finished`` (exact; drops are derived from it)
        self.appended = 0
        #: the length of a future's log of recent calls, when finished calls are folded where
        #: they finish (futures.fold_call); None while the collector wants each of them in
        #: ``finished`` (a live reporter or a user's recorder is handed every call)
        self.keep_in_place: int | None = None
        #: attached to a running program (``asyncflow attach``): the live tasks it adopted,
        #: made before it (what they run is not timed); None: started with the program
        self.adopted: int | None = None


#: With adaptive sampling, channels and streams aim at one timed event per this many ns each.
SAMPLE_GAP_NS = 1_000_000
#: the widest sampling interval: at least one event in this many is timed
MAX_INTERVAL = 4096


def next_interval(interval: int, gap_ns: int) -> int:
    """The sampling interval to use after a timed event that came ``gap_ns`` after the last one.

    Counts are always exact; only timings, attributions and logs are sampled. With adaptive
    sampling (the default) every event is timed while a channel or stream is quiet, and the
    interval doubles while timed events come closer than ``SAMPLE_GAP_NS`` apart, so a hot
    channel pays for about a thousand timed events a second, whatever its rate.
    """
    session = active
    if session is None:
        return MAX_INTERVAL  # nobody listens: time (almost) nothing
    if session.sampling:
        return session.sampling
    if gap_ns < SAMPLE_GAP_NS:
        return interval * 2 if interval < MAX_INTERVAL else interval
    if gap_ns > 4 * SAMPLE_GAP_NS and interval > 1:
        return interval // 2
    return interval


#: The session recorders write into, or None when no profiler runs (then they record nothing).
active: Session | None = None


class _Errors:
    __slots__ = ("count", "last", "logged")

    def __init__(self) -> None:
        self.count = 0
        self.last: str | None = None
        #: the places whose first error was logged (each is logged once)
        self.logged: set[str] = set()


errors = _Errors()
#: Places logged at most; past them, errors are only counted.
_LOGGED_PLACES = 64
_logger = logging.getLogger("asyncflow")


def internal_error(where: str, exc: BaseException) -> None:
    """Count an error inside asyncflow itself; never lets it reach user code.

    The first error of each place goes to the ``asyncflow`` logger (which, where the program
    configured no logging, Python prints once to stderr), so a failing observer never floods
    the program's output; every error is counted in ``/profiler_status``.
    """
    errors.count += 1
    try:
        _note(where, exc)
    except BaseException:  # (the program is at its recursion limit, or out of memory)
        errors.last = where


def _note(where: str, exc: BaseException) -> None:
    if isinstance(exc, RecursionError):  # the program recursed to its limit, not asyncflow
        errors.last = f"{where}: RecursionError (the program was at its recursion limit)"
        return
    errors.last = f"{where}: {''.join(traceback.format_exception_only(exc)).strip()}"
    if where not in errors.logged and len(errors.logged) < _LOGGED_PLACES:
        errors.logged.add(where)
        _logger.error(
            "asyncflow: internal error in %s (counted in /profiler_status; further errors "
            "there are only counted)",
            errors.last,
        )
