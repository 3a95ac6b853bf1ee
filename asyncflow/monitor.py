"""Event-loop health, watched from the profiler's thread: lag, the running call, blocked loops.

Every ``tick`` the monitor posts a heartbeat callback to each instrumented loop that is running
(``call_soon_threadsafe``: one callback per tick, the only work it adds to a loop). The delay
between posting and running is the loop's lag. While a heartbeat is overdue by more than the
block threshold (a poll running longer than that keeps it waiting), the loop is blocked: the
monitor takes the loop thread's stack *while it is still blocked* (``sys._current_frames()``)
and names the tracked call found on it. The episode ends when the heartbeat finally runs.

Nothing here runs on the hot path; the heartbeat is the only code that runs on the user's loop.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import traceback
from collections import deque
from types import FrameType
from typing import Any

from asyncflow import clock, stats
from asyncflow.instrument import _session
from asyncflow.instrument.futures import CallRecord, InstrumentedCoroutine
from asyncflow.instrument.loops import LoopRecord, loop_registry

__all__ = ["MAX_EPISODES", "Episode", "LoopMonitor", "LoopState", "running_calls"]

#: Blocked-loop episodes kept per loop (the newest); older ones are only counted.
MAX_EPISODES = 32
#: Frames kept of a blocked loop's stack, innermost first.
STACK_LIMIT = 40
#: States of loops that are gone (garbage collected) still listed, the most recent.
MAX_GONE = 16

_POLL_CODES = frozenset({InstrumentedCoroutine.send.__code__, InstrumentedCoroutine.throw.__code__})


def running_calls(thread: int) -> tuple[FrameType | None, CallRecord | None, CallRecord | None]:
    """The thread's innermost frame, and the innermost and outermost tracked calls running on it.

    Reads another thread's stack: asyncflow's own ``send``/``throw`` frames name the call they
    are polling, so this costs the recorders nothing.
    """
    top = sys._current_frames().get(thread) if thread else None
    inner = outer = None
    frame = top
    while frame is not None:
        if frame.f_code in _POLL_CODES:
            wrapper = frame.f_locals.get("self")
            r = getattr(wrapper, "_r", None)
            if isinstance(r, CallRecord) and r.start:
                if inner is None:
                    inner = r
                outer = r
        frame = frame.f_back
    return top, inner, outer


def extract_stack(top: FrameType | None) -> list[tuple[str, int, str, str | None]]:
    """``(file, line, function, source line)`` for each frame from ``top`` outwards."""
    if top is None:
        return []
    summary = traceback.StackSummary.extract(traceback.walk_stack(top), limit=STACK_LIMIT)
    return [(f.filename, f.lineno or 0, f.name, f.line or None) for f in summary]


class Episode:
    """One blocked-loop episode; ``blocked_ns`` grows while it is ``ongoing``."""

    __slots__ = ("blocked_ns", "call", "id", "ongoing", "since", "stack", "task")

    def __init__(
        self, number: int, since: int, now: int, call: CallRecord | None, task: str | None
    ) -> None:
        self.id = number
        self.since = since
        self.blocked_ns = max(0, now - since)
        self.ongoing = True
        self.call = call
        self.task = task
        self.stack: list[tuple[str, int, str, str | None]] = []


class LoopState:
    """What the monitor knows of one loop in this session. Shared by two threads: the heartbeat
    runs on the loop's thread, ticks on the profiler's, so every change is made under ``lock``."""

    def __init__(self, record: LoopRecord) -> None:
        self.record = record
        self.lock = threading.Lock()
        self.lag_hist = stats.new_histogram()
        self.lag_max = 0
        self.lag_last = 0
        self.heartbeats = 0
        self.pending = 0  # when the heartbeat in flight was posted; 0 when none is
        self.token = 0  # the heartbeat in flight; a stale one (loop stopped meanwhile) is ignored
        self.episodes: deque[Episode] = deque(maxlen=MAX_EPISODES)
        self.episode_count = 0
        self.ongoing: Episode | None = None
        self.closed = False

    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self.record.loop()

    def lag_now(self, now: int) -> int:
        """The lag of the heartbeat in flight if it is late already, else the last measured."""
        pending = self.pending
        return max(self.lag_last, now - pending) if pending else self.lag_last

    def beat(self, token: int) -> None:
        """The heartbeat: runs on the loop's own thread."""
        now = clock.now_ns()
        with self.lock:
            if token != self.token or not self.pending:
                return
            lag = max(0, now - self.pending)
            self.pending = 0
            self.heartbeats += 1
            self.lag_last = lag
            if lag > self.lag_max:
                self.lag_max = lag
            stats.record(self.lag_hist, lag)
            self.end_episode(now)
        self.record.on_thread()

    def end_episode(self, now: int) -> None:
        episode, self.ongoing = self.ongoing, None
        if episode is not None:
            episode.blocked_ns = max(episode.blocked_ns, now - episode.since)
            episode.ongoing = False


class LoopMonitor:
    """Owns the loops' states; everything but the heartbeat runs on the profiler's thread."""

    def __init__(self, threshold_ns: int) -> None:
        self.threshold_ns = threshold_ns
        #: seconds between ticks: fine enough to catch a block soon after the threshold
        self.interval = min(0.05, max(0.005, threshold_ns / 4e9))
        self.states: dict[int, LoopState] = {}

    def tick(self) -> None:
        """Post heartbeats, and detect blocked loops; called every ``interval``."""
        alive = set()
        for record in loop_registry():
            alive.add(record.id)
            state = self.states.get(record.id)
            if state is None:
                state = self.states[record.id] = LoopState(record)
            self._check(state)
        gone = [s for i, s in self.states.items() if i not in alive]
        for state in gone:
            state.closed = True
            with state.lock:
                state.end_episode(clock.now_ns())
        for state in gone[:-MAX_GONE] if len(gone) > MAX_GONE else ():
            del self.states[state.record.id]

    def _check(self, state: LoopState) -> None:
        loop = state.loop()
        now = clock.now_ns()
        if loop is None or loop.is_closed() or not loop.is_running():
            with state.lock:
                state.closed = loop is None or loop.is_closed()
                if state.pending:  # its heartbeat will run whenever the loop runs again: not lag
                    state.token += 1
                    state.pending = 0
                state.end_episode(now)
            return
        state.closed = False
        with state.lock:
            post = not state.pending
            if post:
                state.token += 1
                state.pending = now
            token, pending = state.token, state.pending
        if post:
            try:
                loop.call_soon_threadsafe(state.beat, token)
            except RuntimeError:  # closed between the check and the call
                with state.lock:
                    state.pending = 0
                return
        late = now - pending
        if state.ongoing is not None:
            with state.lock:
                episode = state.ongoing
                if episode is not None:
                    episode.blocked_ns = max(episode.blocked_ns, now - episode.since)
            return
        if late < self.threshold_ns:
            return  # a poll longer than the threshold keeps the heartbeat waiting: that is late
        # Blocked: read the loop thread's stack now, while it is still blocked. The block began
        # when the running tracked poll did, if there is one; else no later than the heartbeat.
        top, inner, outer = running_calls(state.record.thread)
        since = min(outer.start, pending) if outer is not None and outer.start else pending
        task = _task_name(loop)
        stack = extract_stack(top)
        with state.lock:
            if state.pending != pending or state.ongoing is not None:
                return  # the loop answered meanwhile: it was slow, but is not blocked now
            state.episode_count += 1
            episode = Episode(state.episode_count, since, now, inner, task)
            episode.stack = stack
            state.episodes.appendleft(episode)
            state.ongoing = episode

    async def run(self) -> None:
        """Tick forever; cancelled when the profiler stops."""
        while True:
            try:
                self.tick()
            except Exception as exc:  # observing never breaks the program, nor the profiler
                _session.internal_error("watching event loops", exc)
            await asyncio.sleep(self.interval)

    def stop(self) -> None:
        """Disown heartbeats still in flight; end ongoing episodes at their current length."""
        for state in self.states.values():
            with state.lock:
                state.token += 1
                state.pending = 0
                episode, state.ongoing = state.ongoing, None
                if episode is not None:
                    episode.ongoing = False


def _task_name(loop: asyncio.AbstractEventLoop) -> str | None:
    try:
        task: Any = asyncio.current_task(loop)
    except Exception:
        return None
    return task.get_name() if task is not None else None
