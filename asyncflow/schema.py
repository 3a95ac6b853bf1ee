"""The documents asyncflow produces: one wire schema for snapshots, reports, the endpoint and CLI.

Every document is a frozen, slotted dataclass that orjson serialises as it is. Durations and
timestamps are integers in nanoseconds; timestamps count from the profiler's start. Percentile
maps are keyed ``"p50"``, ``"p99.9"``... and are empty when nothing was measured yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = [
    "SCHEMA",
    "CallEntry",
    "CallStates",
    "ExceptionInfo",
    "FutureEntry",
    "FutureLogs",
    "FuturesDocument",
    "Location",
    "Outcomes",
    "ProfilerStatus",
    "Snapshot",
    "dumps",
]

#: Bumped by any change that breaks a field of a document.
SCHEMA = 1


@dataclass(frozen=True, slots=True)
class Location:
    """Where a future is defined."""

    file: str
    line: int


@dataclass(frozen=True, slots=True)
class CallStates:
    """How many calls of a future are in each state now."""

    pending: int
    running: int
    suspended: int
    ready: int
    cancelled: int


@dataclass(frozen=True, slots=True)
class Outcomes:
    """How finished calls ended. ``ready`` = returned + raised; ``cancelled`` = the rest."""

    returned: int
    raised: int
    cancelled: int
    #: closed (``close()``, or garbage-collected) after it had started
    closed: int
    #: garbage-collected or closed without ever being polled
    never_awaited: int


@dataclass(frozen=True, slots=True)
class FutureEntry:
    """One tracked coroutine definition and the totals over its calls in this session."""

    id: int
    label: str
    #: ``module:qualname``
    source: str
    location: Location
    #: ``decorator``, ``task`` (whole-program mode) or ``instrument``
    tracked_by: str
    call_count: int
    calls: CallStates
    outcomes: Outcomes
    total_polls: int
    #: sum of poll durations over all calls, live ones included
    busy_ns: int
    #: time calls spent suspended between polls, live ones included
    idle_ns: int
    max_poll_duration_ns: int
    poll_duration_ns: dict[str, int]
    #: from a call's creation to its end, over finished calls
    call_duration_ns: dict[str, int]


@dataclass(frozen=True, slots=True)
class FuturesDocument:
    """``GET /futures``: futures sorted by busy time, most first."""

    schema: int
    total: int
    offset: int
    limit: int
    futures: list[FutureEntry]


@dataclass(frozen=True, slots=True)
class ExceptionInfo:
    """What a call raised: the exception's type and (truncated) message."""

    type: str
    message: str


@dataclass(frozen=True, slots=True)
class CallEntry:
    """One call of a future, as listed in its log."""

    call_id: int
    future_id: int
    state: str
    poll_count: int
    total_poll_duration_ns: int
    max_poll_duration_ns: int
    last_poll_duration_ns: int
    busy_ns: int
    idle_ns: int
    created_ns: int
    first_poll_ns: int | None
    finished_ns: int | None
    #: how long the poll in progress has been running (``running`` calls only)
    current_elapsed_ns: int | None
    #: the name of the task the call ran in, when it ran in one
    task: str | None
    #: ``returned``, ``raised``, ``cancelled``, ``closed``, ``never_awaited``; None while live
    outcome: str | None
    exception: ExceptionInfo | None
    #: truncated ``repr()`` of the return value, only with ``log_result=True``
    result: str | None


@dataclass(frozen=True, slots=True)
class FutureLogs:
    """``GET /futures/{id}/logs``: every unfinished call, then the most recent finished ones."""

    schema: int
    future_id: int
    label: str
    calls: list[CallEntry]


@dataclass(frozen=True, slots=True)
class ProfilerStatus:
    """``GET /profiler_status``: the profiler itself."""

    schema: int
    name: str
    version: str
    pid: int
    python: str
    uptime_ns: int
    running: bool
    #: polls and call ends recorded (exact)
    events_recorded: int
    #: finished-call log entries lost because the collector fell behind
    events_dropped: int
    internal_errors: int
    last_internal_error: str | None
    futures: int
    calls_live: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything at once: what ``prof.snapshot()`` returns and the ``json`` report contains."""

    schema: int
    status: ProfilerStatus
    futures: FuturesDocument
    future_logs: list[FutureLogs] = field(default_factory=list)


def dumps(document: Any, *, pretty: bool = False) -> bytes:
    """Serialise a document (or a list/dict of them) to JSON bytes."""
    option = orjson.OPT_INDENT_2 if pretty else 0
    return orjson.dumps(document, option=option | orjson.OPT_NON_STR_KEYS)
