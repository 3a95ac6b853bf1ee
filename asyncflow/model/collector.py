"""The cold path: folds what the recorders leave for it into aggregates, and reaps what is gone.

Runs as a task on the profiler's own event loop, in the profiler's thread, every
``DRAIN_INTERVAL`` seconds and before every snapshot. Per-poll figures need no folding: the
recorders aggregate them in place, so the collector's share per poll is nil; finished calls are
folded where they finish too, unless a live reporter or a user's recorder is handed every call
(``fold_where``): then they wait in the session's buffer and each drain folds them. Each drain
also reaps the futures, channels, resources and streams that are gone (their function, code,
queue or primitive freed) into a bounded history, so memory follows what is alive, not what
ever existed.
"""

from __future__ import annotations

import asyncio
from array import array
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from asyncflow import clock
from asyncflow.config import Options
from asyncflow.instrumentation import _session
from asyncflow.instrumentation import channels as _channels
from asyncflow.instrumentation import executors as _executors
from asyncflow.instrumentation import futures as _futures
from asyncflow.instrumentation import gathers as _gathers
from asyncflow.instrumentation import lineage as _lineage
from asyncflow.instrumentation import recording as _recording
from asyncflow.instrumentation import resources as _resources
from asyncflow.instrumentation import streams as _streams
from asyncflow.instrumentation._nested import NestedHandle
from asyncflow.instrumentation.futures import CallRecord, FutureRecord, call_field, registry
from asyncflow.instrumentation.recording import FinishedCall
from asyncflow.model.monitor import LoopMonitor
from asyncflow.model.threads import ThreadSampler, loop_threads
from asyncflow.schema import Location

if TYPE_CHECKING:
    from asyncflow.instrumentation.cpu import PollFigures

__all__ = ["DRAIN_INTERVAL", "SERIES_INTERVAL_NS", "Collector", "LiveSeries", "live_calls"]

DRAIN_INTERVAL = 0.05
#: How often each future's live calls are sampled at first; the interval doubles as the
#: series fills up, so it always spans the whole profile in at most ``LiveSeries.SIZE`` samples
#: (every 0.25 s for the first 8 s, every 0.5 s up to 16 s, and so on).
SERIES_INTERVAL_NS = 250_000_000


class LiveSeries:
    """A future's live calls over the whole profile, in a fixed number of samples.

    Each sample is (time, live calls, calls created so far). When full, every other sample is
    dropped and the interval doubles: memory stays fixed however long the program runs.
    """

    __slots__ = ("interval", "next_at", "samples")

    SIZE = 32

    def __init__(self, now: int, interval: int) -> None:
        self.samples = array("q")  # flat: time, live, created, time, live, created...
        self.interval = interval
        self.next_at = now

    def add(self, now: int, live: int, created: int) -> None:
        if now < self.next_at:
            return
        samples = self.samples
        if len(samples) >= 3 * self.SIZE:
            kept = array("q")
            for i in range(0, len(samples), 6):  # keep every other sample, the first included
                kept.extend(samples[i : i + 3])
            self.samples = samples = kept
            self.interval *= 2
        samples.extend((now, live, created))
        self.next_at = now + self.interval

    def points(self) -> list[tuple[int, int, int]]:
        s = self.samples
        return [(s[i], s[i + 1], s[i + 2]) for i in range(0, len(s), 3)]


class CallSink(Protocol):
    """What is handed every folded call, on the collector's thread (the live reporters)."""

    def add(self, record: CallRecord, /) -> None: ...


class Collector:
    """Owns the session's folded state; everything here runs on the profiler's thread."""

    def __init__(self, session: _session.Session, options: Options) -> None:
        self.session = session
        self.options = options
        #: records taken out of the buffer so far (folded or, from an older session, skipped)
        self.taken = 0
        #: the instrumented loops' health; ticks as its own task beside the collector's
        self.monitor = LoopMonitor(
            round(options.block_threshold * 1e9),
            round(min(options.block_min, options.block_threshold) * 1e9),
        )
        self.series_interval = SERIES_INTERVAL_NS
        self._next_sample = 0
        #: handed every folded call (the live reporters set themselves here); None when none
        self.live: CallSink | None = None
        #: called after each drain with the clock (the live reporters, the trace recorder):
        #: higher layers register here with ``on_tick``, so that the collector imports none
        self._tick_hooks: list[tuple[str, Callable[[int], None]]] = []
        #: every thread of the process, sampled on this tick (``GET /threads``)
        self.threads = ThreadSampler(loops=lambda: loop_threads(self.monitor))
        #: CPU time and allocations per poll (``cpu=``, ``allocations=``); None when off
        self.poll_figures: PollFigures | None = None
        #: whole-program mode's include/exclude patterns, while they apply
        self.target_filter: Callable[[Any], bool] | None = None
        #: asyncio.gather's stand-in, counting which tracked call each gather waited for
        self.gathers: NestedHandle | None = None

    def attach_polls(self) -> None:
        """The profiler starts: filter tasks, and measure polls, as the options ask."""
        from asyncflow.instrumentation import cpu

        options = self.options
        try:
            self.target_filter = _futures.install_filter(options.include, options.exclude)
            _futures.hook_wakes()  # scheduled time: tasks' wake-ups are stamped
            self.poll_figures = cpu.attach(options.cpu, options.allocations)
        except Exception as exc:  # observing never breaks the program
            _session.internal_error("measuring polls", exc)
        try:
            self.gathers = _gathers.install()
        except Exception as exc:
            _session.internal_error("counting gathers", exc)

    def detach_polls(self) -> None:
        """The profiler stops (idempotent): the figures stay for the final snapshot."""
        from asyncflow.instrumentation import cpu

        try:
            cpu.detach(self.poll_figures)
            _futures.uninstall_filter(self.target_filter)
            _futures.unhook_wakes()
        except Exception as exc:
            _session.internal_error("measuring polls", exc)
        if self.gathers is not None:
            self.gathers.undo()  # (idempotent)
        self.target_filter = None

    def drain(self) -> int:
        """Fold every finished call waiting in the buffer, then reap what is gone; returns how
        many calls were folded."""
        folded = self._fold_finished()
        _futures.reap(self._fold_finished)
        _channels.reap(collecting=True)
        _resources.reap(collecting=True)
        _streams.reap(collecting=True)
        _executors.reap(collecting=True)
        _lineage.fold()  # the messages' ways that ended, into their paths
        return folded

    def _fold_finished(self) -> int:
        finished = self.session.finished
        if not finished:
            return 0  # an idle tick: nothing to set up, no IndexError to raise and catch
        fold = _futures.fold_finished  # the loop below, compiled (~4x cheaper a call)
        if fold is not None:
            users = _to_users_call if _recording.users else None
            return fold(self, finished, self.options.recent_logs, self.live, users)  # type: ignore[no-any-return]
        return self._fold_finished_py(finished)

    def _fold_finished_py(self, finished: deque[CallRecord]) -> int:
        """The reference fold. Once per finished call, on this thread while the program runs."""
        take = finished.popleft
        keep = self.options.recent_logs
        live = self.live
        users = _recording.users
        fold_call = _futures.fold_call
        folded = 0
        while True:
            try:
                r: CallRecord = take()
            except IndexError:
                break
            self.taken += 1  # before anything that may fail: ``dropped`` counts on it
            if not fold_call(r, keep):
                continue  # a call from an earlier session finished late: not ours to count
            folded += 1
            if live is not None:
                live.add(r)
            if users:
                _to_users_call(r)
        return folded

    def fold_where(self) -> None:
        """Say where finished calls are folded: where they finish (``keep_in_place``), unless a
        live reporter or a user's recorder is handed every call, which this thread does after
        taking it from the buffer. At the start and every tick (``add_recorder`` turns the
        in-place fold off at once, under the same lock)."""
        with _recording._lock:  # a recorder added meanwhile must not be undone
            wants_every_call = self.live is not None or any(
                type(user).call is not _recording.Recorder.call for user in _recording.users
            )
            self.session.keep_in_place = None if wants_every_call else self.options.recent_logs

    def sample_live(self, now: int) -> None:
        """Note each future's live calls, once per ``series_interval`` at most (and at each
        drain until a future is first called: a short program's first calls are followed from
        the drain after them, not from an interval after the profiler started)."""
        interval = self.series_interval
        if now < self._next_sample:
            return
        for record in registry():
            st = record.stats
            if not st.created:
                continue  # never called: nothing to follow
            self._next_sample = now + interval
            series = st.series
            if series is None:
                series = st.series = LiveSeries(now, interval)
            series.add(now, len(st.live), st.created)

    @property
    def dropped(self) -> int:
        """Finished-call records the buffer lost because it was full (exact once drained)."""
        s = self.session
        return max(0, s.appended - self.taken - len(s.finished))

    def on_tick(self, what: str, hook: Callable[[int], None]) -> None:
        """Call ``hook(now_ns)`` after each drain, on this thread, until the collector stops;
        an exception it raises is counted as an internal error while ``what``."""
        self._tick_hooks.append((what, hook))

    def futures(self) -> list[FutureRecord]:
        """The futures known now."""
        return registry()

    async def run(self) -> None:
        """Drain forever; cancelled when the profiler stops (the live reporters are open).

        Between two drains the collector naps where its loop can (the profiler's): it drains at
        the loop's first wake ``DRAIN_INTERVAL`` after the last drain, for the loop monitor's
        tick, or half an interval later if none comes, rather than waking the thread itself."""
        nap = getattr(asyncio.get_running_loop(), "nap", None)
        while True:
            now = clock.now_ns()
            self.session.tick = now
            try:
                self.fold_where()
                self.drain()
            except Exception as exc:  # counted, and tried again next time: never the end of it
                _session.internal_error("collecting", exc)
            self.sample_live(now)
            self.threads.tick(now)
            for what, hook in self._tick_hooks:
                try:
                    hook(now)
                except Exception as exc:  # observing never breaks the program
                    _session.internal_error(what, exc)
            if nap is None:
                await asyncio.sleep(DRAIN_INTERVAL)
            else:
                await nap(DRAIN_INTERVAL, DRAIN_INTERVAL * 1.5)


def _to_users_call(r: CallRecord) -> None:
    """Hand one folded call to each user's recorder (``Recorder.call``) that has one."""
    call = None
    for user in _recording.users:
        if type(user).call is _recording.Recorder.call:
            continue  # it keeps the default: no need to build the call for it
        try:
            if call is None:
                call = finished_call(r)
            user.call(call)
        except Exception as exc:  # the recorder is removed; the program never sees it
            _recording._failed(user, exc)


def finished_call(r: CallRecord) -> FinishedCall:
    """The public view of one finished call's record."""
    future = r.future
    return FinishedCall(
        future_id=future.id,
        label=future.label,
        location=Location(future.file, future.line),
        outcome=call_field(r, "outcome") or "returned",
        duration_ns=max(0, r.finished - r.created),
        busy_ns=r.busy,
        polls=r.polls,
        start_ns=r.created,
        end_ns=r.finished,
        error=call_field(r, "exc_type"),
    )


def live_calls(record: FutureRecord) -> list[CallRecord]:
    """A consistent copy of a future's unfinished calls, taken while other threads add to it."""
    live = record.stats.live
    for _ in range(100):
        try:
            return list(live.values())
        except RuntimeError:  # resized by another thread mid-copy: take it again
            continue
    return []
