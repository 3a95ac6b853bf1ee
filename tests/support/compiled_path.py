"""What the tests of the compiled hot path share: the mark that skips them where it is not
built, and the counters a future's figures hold on both paths."""

from __future__ import annotations

import pytest

from asyncflow.instrumentation import futures

compiled = pytest.mark.skipif(
    futures._speedups is None,
    reason="the compiled hot path is not built here, or ASYNCFLOW_NO_EXTENSIONS=1",
)

#: the integer figures of a future (FutureStats), in the order both implementations list them
STATS_COUNTERS = (
    "created",
    "returned",
    "raised",
    "cancelled",
    "closed",
    "never_awaited",
    "dropped",
    "cancel_requested",
    "cancel_swallowed",
    "cancel_raised",
    "max_cancel_to_end",
    "polls_done",
    "busy_done",
    "idle_done",
    "max_poll_done",
    "sched_total",
    "max_sched",
    "first_call",
    "first_caller",
)
