"""State shared by every recorder: whether a profiler listens, the bounded event buffer, errors."""

from __future__ import annotations

import sys
import traceback
from collections import deque
from typing import Any

__all__ = ["Session", "active", "internal_error"]

#: Finished-call records waiting for the collector; bounded so a stalled collector costs no memory.
FINISHED_BUFFER_SIZE = 65_536


class Session:
    """One profiling session: what the recorders write into while a profiler runs.

    Recorders hold no reference to the profiler itself; the collector reads this object.
    """

    __slots__ = ("appended", "epoch", "finished", "start_ns")

    def __init__(self, epoch: int, start_ns: int) -> None:
        self.epoch = epoch
        self.start_ns = start_ns
        #: records of finished calls, in finishing order; the oldest are dropped when full
        self.finished: deque[Any] = deque(maxlen=FINISHED_BUFFER_SIZE)
        #: how many records were ever appended to ``finished`` (exact; drops are derived from it)
        self.appended = 0


#: The session recorders write into, or None when no profiler runs (then they record nothing).
active: Session | None = None


class _Errors:
    __slots__ = ("count", "last")

    def __init__(self) -> None:
        self.count = 0
        self.last: str | None = None


errors = _Errors()


def internal_error(where: str, exc: BaseException) -> None:
    """Count an error inside asyncflow itself; never lets it reach user code."""
    errors.count += 1
    errors.last = f"{where}: {''.join(traceback.format_exception_only(exc)).strip()}"
    if errors.count <= 3:  # say it once or thrice, never flood the user's stderr
        print(f"asyncflow: internal error in {errors.last}", file=sys.stderr)
