"""Pure functions from the collector's state to the documents of :mod:`asyncflow.schema`."""

from __future__ import annotations

import os
import platform

from asyncflow import clock, stats
from asyncflow._version import __version__
from asyncflow.collector import Collector, live_calls
from asyncflow.instrument import _session
from asyncflow.instrument.futures import RUNNING, CallRecord, FutureRecord, call_field, call_state
from asyncflow.schema import (
    SCHEMA,
    CallEntry,
    CallStates,
    ExceptionInfo,
    FutureEntry,
    FutureLogs,
    FuturesDocument,
    Location,
    Outcomes,
    ProfilerStatus,
    Snapshot,
)

__all__ = ["future_entry", "future_logs", "futures_document", "snapshot", "status"]


def _running_for(r: CallRecord, now: int) -> int:
    start = r.start
    return max(0, now - start) if start else 0


def _idle(r: CallRecord, now: int) -> int:
    if not r.first:
        return 0
    end = r.finished or now
    running = 0 if r.finished else _running_for(r, now)
    return max(0, end - r.first - r.busy - running)


def _at_most(percentiles: dict[str, int], ceiling: int) -> dict[str, int]:
    # A bucket's midpoint can lie above the largest sample in it; never report more than the max.
    return {key: min(value, ceiling) for key, value in percentiles.items()}


def future_entry(record: FutureRecord, now: int, percentiles: tuple[float, ...]) -> FutureEntry:
    """One future's totals over the session, live calls included up to ``now``."""
    st = record.stats
    live = live_calls(record)
    pending = running = 0
    polls, busy, idle, max_poll = st.polls_done, st.busy_done, st.idle_done, st.max_poll_done
    for r in live:
        elapsed = _running_for(r, now)
        if elapsed:
            running += 1
        elif not r.first:
            pending += 1
        polls += r.polls
        busy += r.busy + elapsed
        idle += _idle(r, now)
        max_poll = max(max_poll, r.max, elapsed)
    ready, cancelled = st.returned + st.raised, st.cancelled + st.closed + st.never_awaited
    return FutureEntry(
        id=record.id,
        label=record.label,
        source=record.source,
        location=Location(record.file, record.line),
        tracked_by=record.tracked_by,
        call_count=st.created,
        calls=CallStates(
            pending=pending,
            running=running,
            suspended=len(live) - pending - running,
            ready=ready,
            cancelled=cancelled,
        ),
        outcomes=Outcomes(
            returned=st.returned,
            raised=st.raised,
            cancelled=st.cancelled,
            closed=st.closed,
            never_awaited=st.never_awaited,
        ),
        total_polls=polls,
        busy_ns=busy,
        idle_ns=idle,
        max_poll_duration_ns=max_poll,
        poll_duration_ns=_at_most(stats.percentiles(st.poll_hist, percentiles), max_poll),
        call_duration_ns=stats.percentiles(st.call_hist, percentiles),
    )


def call_entry(r: CallRecord, now: int, origin: int) -> CallEntry:
    """One call as its log lists it; timestamps relative to ``origin``."""
    elapsed = 0 if r.finished else _running_for(r, now)
    state = RUNNING if elapsed else call_state(r)
    exception = None
    exc_type = call_field(r, "exc_type")
    if exc_type is not None:
        exception = ExceptionInfo(exc_type, call_field(r, "exc_message") or "")
    return CallEntry(
        call_id=r.call_id,
        future_id=r.future.id,
        state=state,
        poll_count=r.polls,
        total_poll_duration_ns=r.busy,
        max_poll_duration_ns=r.max,
        last_poll_duration_ns=r.last,
        busy_ns=r.busy + elapsed,
        idle_ns=_idle(r, now),
        created_ns=r.created - origin,
        first_poll_ns=r.first - origin if r.first else None,
        finished_ns=r.finished - origin if r.finished else None,
        current_elapsed_ns=elapsed if state == RUNNING else None,
        task=call_field(r, "task"),
        outcome=call_field(r, "outcome"),
        exception=exception,
        result=call_field(r, "result"),
    )


def future_logs(
    record: FutureRecord, now: int, origin: int, limit: int | None = None
) -> FutureLogs:
    """Every unfinished call (oldest first), then recent finished calls (newest first)."""
    live = sorted(live_calls(record), key=lambda r: r.call_id)
    recent = list(record.stats.recent or ())
    recent.reverse()
    calls = live + recent
    if limit is not None:
        calls = calls[:limit]
    return FutureLogs(
        schema=SCHEMA,
        future_id=record.id,
        label=record.label,
        calls=[call_entry(r, now, origin) for r in calls],
    )


def futures_document(
    collector: Collector, now: int, offset: int = 0, limit: int | None = None
) -> FuturesDocument:
    """Every future, most busy first, paged by ``offset``/``limit``."""
    entries = [future_entry(f, now, collector.options.percentiles) for f in collector.futures()]
    entries.sort(key=lambda e: (-e.busy_ns, -e.call_count, e.id))
    page = entries[offset : None if limit is None else offset + limit]
    return FuturesDocument(
        schema=SCHEMA,
        total=len(entries),
        offset=offset,
        limit=len(page) if limit is None else limit,
        futures=page,
    )


def status(collector: Collector, now: int, running: bool) -> ProfilerStatus:
    """The profiler's own health and counts."""
    futures = collector.futures()
    live = 0
    polls = calls_ended = 0
    for f in futures:
        st = f.stats
        n = len(st.live)
        live += n
        calls_ended += st.created - n
        polls += st.polls_done + sum(r.polls for r in live_calls(f))
    return ProfilerStatus(
        schema=SCHEMA,
        name=collector.options.name,
        version=__version__,
        pid=os.getpid(),
        python=platform.python_version(),
        uptime_ns=max(0, now - collector.session.start_ns),
        running=running,
        events_recorded=polls + calls_ended,
        events_dropped=collector.dropped,
        internal_errors=_session.errors.count,
        last_internal_error=_session.errors.last,
        futures=len(futures),
        calls_live=live,
    )


def snapshot(collector: Collector, running: bool = True) -> Snapshot:
    """Every document at once, as of now (drain first for an up-to-date picture)."""
    now = clock.now_ns()
    origin = collector.session.start_ns
    futures = futures_document(collector, now)
    by_id = {f.id: f for f in collector.futures()}
    return Snapshot(
        schema=SCHEMA,
        status=status(collector, now, running),
        futures=futures,
        future_logs=[future_logs(by_id[e.id], now, origin) for e in futures.futures],
    )
