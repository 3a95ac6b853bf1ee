"""Event-loop health: blocked-loop episodes point at the code that blocked, and only at code.

The programs observed here block their loop on purpose (``time.sleep`` on the loop's thread is
the planted problem, not a way to wait for something); each block is short and bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import importlib
import logging
import selectors
import socket
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import anyio
import pytest

import asyncflow
from asyncflow import clock
from asyncflow.clock import FakeClock
from asyncflow.instrumentation import futures, loops, probes
from asyncflow.instrumentation.futures import call_field
from asyncflow.model import monitor
from asyncflow.model.monitor import MAX_EPISODES, MAX_WORST, LoopMonitor, LoopState, Sample
from asyncflow.render import report
from asyncflow.schema import LoopEntry, Snapshot
from asyncflow.views import documents as views
from tests.support.commands import run_example

THRESHOLD = 0.1
MS = 1_000_000
THRESHOLD_NS = 100 * MS


def loop_entry(snap: Snapshot, loop_id: int) -> LoopEntry:
    assert snap.loop is not None
    (entry,) = [e for e in snap.loop.loops if e.id == loop_id]
    return entry


def record_of(loop: asyncio.AbstractEventLoop) -> loops.LoopRecord:
    (record,) = [r for r in loops.loop_registry() if r.loop() is loop]
    return record


@pytest.fixture
def profiled() -> Iterator[asyncflow.Profiler]:
    with asyncflow.profile("loops", format="none", port=None, block_threshold=THRESHOLD) as p:
        # The programs here block as soon as they start: once the monitor ticks, not before
        # (on a loaded machine the profiler's thread can start ticking 250 ms late).
        assert p._collector is not None and p._collector.monitor.ticking.wait(10)
        yield p


# -- 1. a block before the first heartbeat ------------------------------------------------------

EARLY_LINE = "time.sleep(0.5)  # blocks before any heartbeat could run"


async def sleepy_main() -> None:
    time.sleep(0.5)  # blocks before any heartbeat could run
    await asyncio.sleep(0)


def test_a_loop_tracked_before_it_runs_names_a_block_at_its_very_start(
    profiled: asyncflow.Profiler,
) -> None:
    # As `asyncflow run` does: the loop is instrumented where it is created, before it runs.
    loop = asyncio.new_event_loop()
    try:
        handle = asyncflow.instrument_tasks(loop=loop)
        try:
            loop.run_until_complete(sleepy_main())
        finally:
            handle.undo()
        loop_id = record_of(loop).id
        entry = loop_entry(profiled.snapshot(), loop_id)
    finally:
        loop.close()
    (episode,) = entry.episodes
    # The monitor knew the loop's thread while it was blocked: it read the stack and the call.
    assert episode.call is not None and episode.call.label.endswith("sleepy_main")
    assert episode.stack and episode.stack[0].function == "sleepy_main"
    assert episode.stack[0].code == EARLY_LINE
    # Measured from when the poll began, not from the monitor's first look.
    assert episode.blocked_ns >= 500 * MS
    assert entry.thread == threading.current_thread().name


UNTRACKED_LINE = "time.sleep(0.5)  # blocks right after the loop is registered"


async def untracked_main() -> None:
    with anyio.fail_after(10), asyncflow.instrument_tasks():
        time.sleep(0.5)  # blocks right after the loop is registered
        await asyncio.sleep(0)


def test_a_block_right_after_registration_is_measured_whole(
    profiled: asyncflow.Profiler,
) -> None:
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(untracked_main())
        entry = loop_entry(profiled.snapshot(), record_of(loop).id)
    finally:
        loop.close()
    (episode,) = entry.episodes
    assert episode.call is None  # main itself is not tracked: the stack says where it blocked
    assert episode.stack and episode.stack[0].code == UNTRACKED_LINE
    # The heartbeat was posted when the loop was registered, before the block began.
    assert episode.blocked_ns >= 500 * MS


# -- 2. back-to-back blocks are separate episodes -----------------------------------------------


@asyncflow.future(name="handle_request")
async def handle_request() -> None:
    await asyncio.sleep(0)
    time.sleep(0.3)  # each request blocks on its own


def test_two_calls_blocking_back_to_back_are_two_episodes(profiled: asyncflow.Profiler) -> None:
    async def main() -> None:
        with anyio.fail_after(10):
            # Both second steps are queued before the heartbeat posted during the first block:
            # the loop runs them back to back, 600 ms without a turn.
            await asyncio.gather(handle_request(), handle_request())

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(main())
        entry = loop_entry(profiled.snapshot(), record_of(loop).id)
    finally:
        loop.close()
    second, first = entry.episodes  # newest first
    assert entry.blocked_count == 2
    assert first.call is not None and second.call is not None
    assert first.call.label == second.call.label == "handle_request"
    assert first.call.call_id != second.call.call_id
    for episode in (first, second):
        assert 300 * MS <= episode.blocked_ns < 600 * MS  # each its own, never the sum
        assert not episode.ongoing
    # The first ended where its poll did, as measured, before the second call's poll began.
    assert first.started_ns + first.blocked_ns <= second.started_ns


def legacy_a() -> None:
    time.sleep(0.3)  # legacy client a


def legacy_b() -> None:
    time.sleep(0.3)  # legacy client b


@asyncflow.future(name="two_clients")
async def two_clients() -> None:
    legacy_a()
    legacy_b()


def test_one_call_blocking_on_two_lines_is_two_episodes(profiled: asyncflow.Profiler) -> None:
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(two_clients())
        entry = loop_entry(profiled.snapshot(), record_of(loop).id)
    finally:
        loop.close()
    second, first = entry.episodes
    assert [e.stack[0].code for e in (first, second)] == [
        "time.sleep(0.3)  # legacy client a",
        "time.sleep(0.3)  # legacy client b",
    ]
    assert first.call is not None and second.call is not None
    assert first.call.call_id == second.call.call_id  # one call, two blocking lines
    for episode in (first, second):
        assert THRESHOLD * 1e9 <= episode.blocked_ns < 600 * MS
    assert first.started_ns + first.blocked_ns <= second.started_ns


# -- 3. a loop waiting in its selector is late, not blocked ---------------------------------------


@pytest.fixture
def loop_thread() -> Iterator[tuple[asyncio.AbstractEventLoop, threading.Thread]]:
    """A loop running in its own thread, with nothing to do: it waits in its selector."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="watched-loop", daemon=True)
    thread.start()
    try:
        yield loop, thread
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


async def until_frame(thread: threading.Thread, function: str, caller: str) -> None:
    """Until the thread's innermost frame is ``function``, called from ``caller``."""
    with anyio.fail_after(10):
        while True:
            frame = sys._current_frames().get(thread.ident or 0)
            back = frame.f_back if frame is not None else None
            if (
                frame is not None
                and back is not None
                and (frame.f_code.co_name, back.f_code.co_name) == (function, caller)
            ):
                return
            del frame, back
            await asyncio.sleep(0.001)


def late_look(loop: asyncio.AbstractEventLoop) -> LoopState:
    """One look by a monitor at ``loop`` whose heartbeat, posted twice the threshold ago, has
    not run: what a loop whose thread gets no CPU looks like."""
    watcher = LoopMonitor(THRESHOLD_NS)
    try:
        state = watcher.state_of(loops.see(loop, on_its_thread=False))
        state.token, state.pending = 1, clock.now_ns() - 2 * THRESHOLD_NS
        watcher._check(state)
        return state
    finally:
        watcher.stop()


async def test_a_loop_waiting_in_its_selector_is_late_not_blocked(
    loop_thread: tuple[asyncio.AbstractEventLoop, threading.Thread],
) -> None:
    loop, thread = loop_thread
    await until_frame(thread, "select", "_run_once")
    state = late_look(loop)
    # No code held the loop: it was woken and waited for the CPU or the GIL. Nobody is blamed.
    assert state.episode_count == 0 and not state.episodes and state.ongoing is None
    assert state.late_wakeups == 1


async def test_a_loop_blocked_in_a_callback_is_blocked(
    loop_thread: tuple[asyncio.AbstractEventLoop, threading.Thread],
) -> None:
    loop, thread = loop_thread
    release = threading.Event()
    loop.call_soon_threadsafe(release.wait, 10)
    try:
        await until_frame(thread, "wait", "wait")  # threading.Event.wait -> Condition.wait
        state = late_look(loop)
    finally:
        release.set()
    assert state.late_wakeups == 0 and state.episode_count == 1
    (episode,) = state.episodes
    assert episode.call is None and episode.stack[0][0] == threading.__file__


def sync_client(selector: selectors.BaseSelector, returned: threading.Event) -> None:
    selector.select(timeout=10)  # a synchronous client waiting for its own socket
    returned.set()


async def test_code_waiting_in_a_selector_of_its_own_is_blocking_the_loop(
    loop_thread: tuple[asyncio.AbstractEventLoop, threading.Thread],
) -> None:
    loop, thread = loop_thread
    left, right = socket.socketpair()
    returned = threading.Event()
    with left, right, selectors.DefaultSelector() as selector:
        selector.register(left, selectors.EVENT_READ)
        loop.call_soon_threadsafe(sync_client, selector, returned)
        try:
            await until_frame(thread, "select", "sync_client")
            state = late_look(loop)
        finally:
            right.send(b"x")
            # Close nothing before the client has woken: closing its socket first takes it out
            # of the selector, the wake-up is lost, and the loop's thread sleeps the whole 10 s
            # (under load, past the fixture's join: the loop is then left running, unclosed).
            await asyncio.to_thread(returned.wait, 10)
    assert state.late_wakeups == 0 and state.episode_count == 1
    (episode,) = state.episodes
    assert [frame[2] for frame in episode.stack[:2]] == ["select", "sync_client"]


# -- the monitor's bookkeeping, on fake time and fake looks ------------------------------------


class FakeLoop:
    """Just enough of a running loop for the monitor; the test runs the heartbeats it posts."""

    def __init__(self) -> None:
        self.posted: list[Callable[[], None]] = []

    def is_running(self) -> bool:
        return True

    def is_closed(self) -> bool:
        return False

    def call_soon_threadsafe(self, callback: Callable[..., None], *args: object) -> None:
        self.posted.append(functools.partial(callback, *args))


class Harness:
    """A monitor watching a fake loop; ``look`` shows it what the loop's thread runs now."""

    def __init__(self, fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
        self.clock = fake_clock
        self.loop = FakeLoop()
        self.monitor = LoopMonitor(THRESHOLD_NS)
        self.state = self.monitor.state_of(loops.LoopRecord(self.loop, id(self.loop)))  # type: ignore[arg-type]
        self.now: Sample = Sample(None, None, None, False)
        monkeypatch.setattr(monitor, "sample_loop", lambda thread, loop: self.now)

    def look(self, after_ms: int, where: str | None, line: int = 1) -> None:
        """``after_ms`` later, the loop runs untracked code: a line of the file ``where``, one
        function per file (None: it waits in its selector)."""
        self.clock.advance(after_ms * MS)
        self.now = Sample(None, None, None, where is None)
        self.now.key = (0, 0, where or "selectors.py", 1, line)
        self.monitor._check(self.state)

    def beat(self, after_ms: int = 0) -> None:
        """``after_ms`` later, the loop runs its heartbeat: it is not late any more."""
        self.clock.advance(after_ms * MS)
        (heartbeat,) = self.loop.posted
        self.loop.posted.clear()
        heartbeat()
        self.monitor._check(self.state)  # and the monitor posts the next one


@pytest.fixture
def harness(fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    h = Harness(fake_clock, monkeypatch)
    h.monitor._check(h.state)  # posts the first heartbeat
    yield h
    h.monitor.stop()


def blocks(state: LoopState) -> list[tuple[str, int, int]]:
    """Episodes oldest first: (line, started, blocked ms)."""
    start = min(e.since for e in state.episodes)
    return [
        (e.key[2], (e.since - start) // MS, e.blocked_ns // MS) for e in reversed(state.episodes)
    ]


def test_a_change_shorter_than_the_threshold_stays_in_its_episode(harness: Harness) -> None:
    harness.look(150, "a.py")  # late: a.py blocks the loop
    harness.look(25, "b.py")
    harness.look(25, "a.py")  # b.py was a moment of a loop that keeps coming back to a.py
    harness.look(25, "c.py")
    harness.look(25, "c.py")
    harness.beat(10)
    assert blocks(harness.state) == [("a.py", 0, 260)]


def test_a_change_that_lasts_the_threshold_is_an_episode_of_its_own(harness: Harness) -> None:
    harness.look(150, "a.py")
    harness.look(25, "a.py")
    harness.look(25, "b.py")  # b.py began after the last look at a.py
    harness.look(50, "b.py")
    # Not yet: b.py has not blocked for the threshold, and a.py's episode goes on meanwhile.
    assert blocks(harness.state) == [("a.py", 0, 250)] and harness.state.episode_count == 1
    harness.look(25, "b.py")
    assert blocks(harness.state) == [("a.py", 0, 175), ("b.py", 175, 100)]
    harness.beat(30)
    assert blocks(harness.state) == [("a.py", 0, 175), ("b.py", 175, 130)]
    assert [e.ongoing for e in harness.state.episodes] == [False, False]


def test_waiting_in_the_selector_ends_an_episode_and_counts_late_wakeups(
    harness: Harness,
) -> None:
    harness.look(150, "a.py")
    harness.look(25, None)  # a.py returned; the loop waits for its thread to run again
    harness.look(25, None)
    harness.beat()
    harness.look(120, None)  # another late heartbeat, with the loop idle all along
    harness.beat()
    assert blocks(harness.state) == [("a.py", 0, 150)]
    assert harness.state.late_wakeups == 2 and harness.state.episode_count == 1


def one_long_block_then_many_short(harness: Harness) -> LoopState:
    harness.look(2_000, "early.py")
    harness.beat()
    for i in range(MAX_EPISODES + 3):
        harness.look(100 + i, f"later{i}.py")
        harness.beat()
    return harness.state


def test_the_longest_episodes_are_kept_beside_the_newest(harness: Harness) -> None:
    state = one_long_block_then_many_short(harness)
    assert state.episode_count == MAX_EPISODES + 4
    assert len(state.episodes) == MAX_EPISODES
    assert "early.py" not in [e.key[2] for e in state.episodes]  # pushed out of the newest
    assert [e.blocked_ns // MS for e in state.worst] == [
        2_000,
        *range(134, 134 - MAX_WORST + 1, -1),
    ]
    entry = views.loop_entry(state, clock.now_ns(), 0, (50.0, 99.0))
    assert [e.blocked_ns for e in entry.worst_episodes] == [e.blocked_ns for e in state.worst]


def test_a_passing_line_seen_once_does_not_split_its_episode(harness: Harness) -> None:
    harness.look(150, "f.py", line=1)  # the first look catches the block at a passing line
    harness.look(25, "f.py", line=2)  # the same function: its steadier line names the episode
    harness.look(150, "f.py", line=2)
    harness.beat()
    assert blocks(harness.state) == [("f.py", 0, 325)]
    assert harness.state.episodes[0].key[-1] == 2


def test_a_change_seen_once_after_a_long_gap_must_be_seen_again_to_split(
    harness: Harness,
) -> None:
    harness.look(150, "a.py")
    harness.look(25, "a.py")
    harness.look(200, "b.py", line=1)  # the monitor's thread was held up: b began meanwhile
    harness.look(25, "b.py", line=2)
    assert harness.state.episode_count == 1  # not yet: a change is seen twice before it splits
    harness.look(25, "b.py", line=2)
    harness.beat(10)
    assert blocks(harness.state) == [("a.py", 0, 175), ("b.py", 175, 260)]


def test_a_block_whose_line_keeps_changing_is_one_episode(harness: Harness) -> None:
    # A CPU-bound loop of untracked code: every look catches another line, none twice.
    harness.look(50, "f.py")
    harness.look(25, "g.py")
    harness.look(25, "h.py")  # late by the threshold: one episode since the heartbeat
    for i in range(8):
        harness.look(25, f"{'fgh'[i % 3]}.py", line=2)
    harness.beat(5)
    assert blocks(harness.state) == [("h.py", 0, 305)]


def test_the_report_lists_the_longest_episodes_and_counts_the_rest(harness: Harness) -> None:
    entry = views.loop_entry(one_long_block_then_many_short(harness), clock.now_ns(), 0, (50.0,))
    assert report._episodes(entry) == [
        f"  loop {entry.id} blocked 2 s by untracked code",
        f"  loop {entry.id} blocked 134 ms by untracked code",
        f"  loop {entry.id} blocked 133 ms by untracked code",
        f"  … 33 more episodes of loop {entry.id} (the 3 longest of 36 are shown)",
    ]


def test_the_report_says_a_loop_woke_up_late_and_blames_no_code(harness: Harness) -> None:
    harness.look(150, None)
    harness.beat()
    entry = views.loop_entry(harness.state, clock.now_ns(), 0, (50.0,))
    assert entry.late_wakeups == 1 and entry.blocked_count == 0
    assert report._episodes(entry) == [
        f"  loop {entry.id} woke up late 1x: idle in its selector, its thread waited for the CPU"
        " or the GIL (no code held it)"
    ]


def test_loop_episodes_example_lists_the_longest_and_counts_the_rest() -> None:
    done = run_example("loop_episodes.py", "--stalls", "3")
    assert "parsed 11 bytes" in done.stdout
    report_lines = done.stderr.splitlines()
    # First the lines that cost the loop the most in all (blocks short of an episode too)...
    lost = [line for line in report_lines if line.startswith("  loop 1 lost ")]
    assert "(warm_cache) 1x, longest" in lost[0] and lost[0].endswith("time.sleep(0.5)")
    assert "(parse) 2x, longest" in lost[1] and lost[1].endswith("time.sleep(0.2)")
    # ... then the longest episodes, each with its stack's line.
    lines = [
        line
        for line in report_lines
        if line.startswith(("  loop ", "  … ")) and line not in lost and " more lost " not in line
    ]
    assert " blocked " in lines[0] and "by main at" in lines[0]
    assert lines[0].endswith("(warm_cache): time.sleep(0.5)")
    for line in lines[1:3]:  # two requests, back to back: two episodes
        assert " blocked " in line and "by handle_request at" in line
        assert line.endswith("(parse): time.sleep(0.2)")
    if len(lines) > 3:  # the short stalls, when they reach the threshold, are counted
        assert lines[3].startswith("  … ") and " (the 3 longest of " in lines[3]


# -- the slot where polls name the calls they run (both paths) -----------------------------------


async def test_the_running_slot_names_the_calls_being_polled(prof: asyncflow.Profiler) -> None:
    me = threading.get_ident()
    seen: list[tuple[Any, Any]] = []

    here: list[Any] = []  # running_call(): this thread's innermost, without the lookups

    @asyncflow.future
    async def inner() -> None:
        seen.append(futures.running_on_thread(me))
        here.append(futures.running_call_here())

    @asyncflow.future
    async def outer() -> None:
        await inner()
        seen.append(futures.running_on_thread(me))
        here.append(futures.running_call_here())

    task = asyncio.create_task(outer())
    await task
    (inner_now, outer_now), (alone, also_alone) = seen
    assert outer_now is alone is also_alone and inner_now is not alone
    assert here == [inner_now, alone]
    assert futures.running_call_here() is None  # nothing polled now
    assert call_field(inner_now, "outcome") == "returned"
    assert "outer" in alone.future.label and "inner" in inner_now.future.label
    assert futures.running_on_thread(me) == (None, None)  # nothing polled now (no call runs us)
    assert futures.running_on_thread(0) == (None, None)


def test_the_running_slot_of_another_thread(prof: asyncflow.Profiler) -> None:
    entered, release = threading.Event(), threading.Event()

    @asyncflow.future(name="blocker")
    async def blocker() -> None:
        entered.set()
        release.wait(30)  # blocks its loop: what the monitor looks for

    thread = threading.Thread(target=asyncio.run, args=(blocker(),))
    thread.start()
    try:
        assert entered.wait(30)
        assert thread.ident is not None
        inner, outer = futures.running_on_thread(thread.ident)
        assert inner is outer and inner.future.label == "blocker" and inner.start
        _, m_inner, m_outer = monitor.running_calls(thread.ident)
        assert m_inner is inner and m_outer is outer
    finally:
        release.set()
        thread.join(30)
    assert futures.running_on_thread(thread.ident) == (None, None)  # the thread is gone


def test_a_look_while_a_call_passes_its_exception_on_keeps_nothing_alive(
    prof: asyncflow.Profiler,
) -> None:
    """The monitor looks at a late loop's stack at any moment. A look taken while a tracked
    call's exception leaves it once read the poll's frame locals, whose snapshot (3.11, 3.12)
    then made a cycle with the exception's traceback: the coroutine, its code and its caller's
    locals outlived the call until the cyclic GC ran."""
    me = threading.get_ident()
    looks: list[tuple[Any, Any]] = []

    async def job() -> None:
        try:
            await asyncio.sleep(0)
        except ValueError:
            looks.append(monitor.running_calls(me)[1:])  # the monitor looks now
            raise

    gc.disable()
    try:
        coro = job()
        gone = weakref.ref(coro)
        call = asyncflow.instrument(coro)
        del coro
        call.send(None)
        with contextlib.suppress(ValueError):
            call.throw(ValueError("stop"))
        ((inner, outer),) = looks
        assert inner is outer and "job" in inner.future.label
        assert call_field(inner, "outcome") == "raised"
        del call
        assert gone() is None  # freed with its wrapper, without the cyclic GC
    finally:
        gc.enable()


class _Reentrant(Coroutine[Any, Any, str]):
    """A coroutine (not a native one) that sends into its own tracked wrapper from its send."""

    def __init__(self) -> None:
        self.wrapper: Any = None
        self.depth = 0
        self.looks: list[tuple[Any, Any]] = []

    def send(self, value: Any) -> str:
        self.depth += 1
        try:
            if self.depth == 1:
                return str(self.wrapper.send(None))
            self.looks.append(futures.running_on_thread(threading.get_ident()))
            return "yielded"
        finally:
            self.depth -= 1

    def throw(self, *args: Any) -> str:
        raise args[0]

    def close(self) -> None:
        pass

    def __await__(self) -> Any:
        return self


def test_a_send_into_a_call_during_its_own_poll_is_no_poll_of_its_own(
    prof: asyncflow.Profiler,
) -> None:
    inner = _Reentrant()
    call = inner.wrapper = asyncflow.instrument(inner)
    assert call.send(None) == "yielded"
    ((innermost, outermost),) = inner.looks  # the look came back (it once went round for ever)
    assert innermost is outermost and "_Reentrant" in innermost.future.label
    assert innermost.polls == 1  # one poll, not two
    assert futures.running_call_here() is None
    call.close()


def test_a_send_from_another_thread_during_a_poll_leaves_its_slot_alone(
    prof: asyncflow.Profiler,
) -> None:
    """asyncio forbids it (the coroutine is already executing), and the poll running goes on
    as if it had not been tried: same calls in the slot, the call not ended by the attempt."""
    holder: list[Any] = []
    entered, tried = threading.Event(), threading.Event()
    seen: dict[str, Any] = {}

    def labels() -> list[str]:
        return [c.future.label for c in futures.running_on_thread(threading.get_ident())]

    @asyncflow.future(name="mid")
    async def mid() -> None:
        seen["before"] = labels()
        entered.set()
        assert tried.wait(30)  # the other thread tries to send into us meanwhile
        seen["after"] = labels()

    @asyncflow.future(name="top")
    async def top() -> None:
        holder.append(mid())
        await holder[0]
        r = futures.running_call_here()
        seen["top"] = r.future.label if r is not None else None

    def intrude() -> None:
        assert entered.wait(30)
        for attempt in (lambda: holder[0].send(None), holder[0].close):
            try:
                attempt()
            except ValueError as err:
                seen.setdefault("errors", []).append(str(err))
        tried.set()

    thread = threading.Thread(target=intrude)
    thread.start()
    asyncio.run(top())
    thread.join(30)
    assert seen["before"] == seen["after"] == ["mid", "top"]
    assert seen["top"] == "top"
    assert len(seen["errors"]) == 2 and all("already executing" in e for e in seen["errors"])
    (mid_entry,) = [f for f in prof.snapshot().futures.futures if f.label == "mid"]
    outcomes = mid_entry.outcomes
    assert (outcomes.returned, outcomes.raised, outcomes.closed) == (1, 0, 0)


def test_a_send_while_a_probe_begins_a_poll_is_no_poll_of_its_own(
    prof: asyncflow.Profiler,
) -> None:
    """A poll is claimed before any of asyncflow's Python code runs for it (a probe's begin()
    here, where another thread can take the GIL). A send from that thread meanwhile goes to the
    coroutine unrecorded: it once made a second poll of the same call, which overwrote the
    first one's links (on the compiled path, a thread's slot then pointed at a freed call)."""
    in_begin, inside, first_done = threading.Event(), threading.Event(), threading.Event()
    ends: list[tuple[str, str]] = []
    seen: dict[str, str] = {}

    class Probe:
        def begin(self, r: Any) -> None:
            if threading.current_thread().name == "first" and not in_begin.is_set():
                in_begin.set()
                assert inside.wait(30)  # the other thread's send runs the coroutine meanwhile

        def end(self, r: Any, token: Any, t0: int, dt: int, outcome: str) -> None:
            ends.append((threading.current_thread().name, outcome))

    async def body() -> str:
        inside.set()
        assert first_done.wait(30)
        return "done"

    call = asyncflow.instrument(body())

    def first() -> None:
        try:
            call.send(None)
        except ValueError as err:  # the other thread is running it: as without asyncflow
            seen["first"] = str(err)
        first_done.set()

    def second() -> None:
        assert in_begin.wait(30)
        try:
            call.send(None)
        except StopIteration as stop:
            seen["second"] = stop.value

    previous = probes.set_poll_probe(Probe())
    try:
        threads = [threading.Thread(target=f, name=f.__name__) for f in (first, second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        probes.set_poll_probe(previous)
    assert "already executing" in seen["first"] and seen["second"] == "done"
    assert [name for name, _ in ends] == ["first"]  # one poll, the claimed one; ended once
    # (its own body: the future of another test's, whose code lives on, is listed too)
    (entry,) = [f for f in prof.snapshot().futures.futures if f.label == body.__qualname__]
    assert entry.outcomes.returned + entry.outcomes.raised == 1


def test_greenlets_switching_mid_poll_leave_the_slot_empty(prof: asyncflow.Profiler) -> None:
    """Two greenlets on one thread each poll a tracked call and switch to each other in the
    middle: the polls end in the order they began. Each call still leaves the slot, and a
    call gone is named by nothing (the compiled slot's pointer to it would dangle)."""
    greenlet = pytest.importorskip("greenlet")
    switch_to: dict[str, Any] = {}

    @types.coroutine
    def suspend() -> Any:
        yield

    async def body(other: str) -> None:
        switch_to[other].switch()  # to the other greenlet, in the middle of this poll
        await suspend()

    first = body("second")
    gone = weakref.ref(first)
    calls: list[Any] = [asyncflow.instrument(first), asyncflow.instrument(body("first"))]
    del first
    main = greenlet.getcurrent()
    switch_to["first"] = greenlet.greenlet(lambda: (calls[0].send(None), main.switch()))
    switch_to["second"] = greenlet.greenlet(lambda: (calls[1].send(None), main.switch()))
    switch_to["first"].switch()  # the first poll starts, then the second; the first ends first
    switch_to["second"].switch()  # then the second
    assert futures.running_call_here() is None
    assert futures.running_on_thread(threading.get_ident()) == (None, None)
    calls[0].close()
    calls[0] = None
    switch_to.clear()
    gc.collect()
    assert gone() is None
    assert futures.running_call_here() is None
    calls[1].close()


def test_each_heartbeat_is_in_flight_until_it_runs_or_is_given_up(harness: Harness) -> None:
    # The profiler's thread skips a look at heartbeats in flight when the count of them (read
    # in C, without the GIL) is 0: a heartbeat posted by another thread (a loop registering)
    # must count until it runs, or a blocked loop's look would be skipped.
    count = getattr(futures._speedups, "heartbeats_in_flight", None)
    if count is None:
        pytest.skip("the count is kept in the compiled path only")
    monitor, now = harness.monitor, harness.clock()
    assert count() == 1  # a new monitor's count is 0; its first tick posted one
    other = FakeLoop()  # a loop registered on a thread of its own, posted to at once
    other_state = monitor.state_of(loops.LoopRecord(other, id(other)))  # type: ignore[arg-type]
    monitor._post(other_state, other, now, at_once=True)  # type: ignore[arg-type]
    assert count() == 2
    harness.beat(1)  # the first runs (and the next is not due yet)
    assert count() == 1 and not harness.loop.posted
    (heartbeat,) = other.posted
    other.posted.clear()
    heartbeat()
    assert count() == 0
    harness.clock.advance(monitor.post_calm_ns + 5 * MS)  # (the harness's loop is due again)
    monitor._post(other_state, other, harness.clock(), at_once=True)  # type: ignore[arg-type]
    assert count() == 1
    other.is_running = lambda: False  # type: ignore[method-assign]
    monitor._check(other_state)  # stopped: its heartbeat is given up
    assert count() == 0 and other_state.pending == 0
    monitor._check(harness.state)  # due again: posted
    assert count() == 1
    monitor.stop()  # gives it up
    assert count() == 0
    heartbeat = harness.loop.posted[0]
    heartbeat()  # runs after all: disowned, it takes nothing off again
    assert count() == 0


def test_a_loop_passing_through_its_selector_to_its_heartbeat_ends_the_episode_there(
    harness: Harness,
) -> None:
    # A block that ends just before a look: the look can catch the loop in its selector on
    # the way to the callbacks it has ready (the heartbeat among them, posted before the block
    # began). That is not where the block ended: the heartbeat, which runs next, says so. Seen
    # there at the next look too, the loop waits for a core: the episode ended where last seen.
    harness.loop._ready = [object()]  # type: ignore[attr-defined]
    harness.look(150, "a.py")
    harness.look(10, None)  # 160 ms: a.py returned a moment ago, its heartbeat is next
    assert harness.state.ongoing is not None
    harness.beat(1)
    assert blocks(harness.state) == [("a.py", 0, 161)]
    harness.look(150, "b.py")
    harness.look(10, None)
    harness.look(10, None)  # still in its selector: its thread waits for a core
    assert harness.state.ongoing is None
    harness.beat(30)
    assert blocks(harness.state) == [("a.py", 0, 161), ("b.py", 161, 150)]


def test_a_block_inside_an_import_from_library_code_is_named_by_the_importing_line(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server (a library) imports the application module from its loop, and nothing of the
    program's is on the stack yet (its module is being compiled): the line named is the
    server's that imports, not the import system's frozen frames; and the stack is seen as
    inside an import."""
    (tmp_path / "af_server.py").write_text(
        "import importlib\n\n\ndef load(name):\n    return importlib.import_module(name)\n"
    )
    (tmp_path / "af_app.py").write_text("import sys\n\nFRAME = sys._getframe()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(monitor, "is_library_file", lambda path: True)  # all a library's
    try:
        server: Any = importlib.import_module("af_server")  # (made a library above)
        app = server.load("af_app")
        assert monitor.importing(app.FRAME) and not monitor.importing(sys._getframe())
        file, line, function = monitor.own_line(app.FRAME) or ("", 0, "")
        assert (file.endswith("af_server.py"), line, function) == (True, 5, "load")
    finally:
        for name in ("af_server", "af_app"):
            sys.modules.pop(name, None)


def test_a_block_is_named_by_the_programs_line_though_a_librarys_was_seen_more() -> None:
    """One poll: the handler computed at its own line, then the server wrote its access log
    (a library's line, where the looks happened to land more often): the block is the
    handler's line; with no line of the program's seen, the library's most seen."""
    logging_line = (logging.__file__, 1113, "emit")
    handler = ("/srv/app.py", 75, "crunch")
    block = monitor._Block(Sample(None, None, None, False), 0, None, 0)
    for key in (logging_line, handler, logging_line, logging_line):
        block.saw(key, None, None)
    assert block.line() == handler
    library_only = monitor._Block(Sample(None, None, None, False), 0, None, 0)
    for key in (logging_line, (asyncio.__file__, 3, "run"), logging_line):
        library_only.saw(key, None, None)
    assert library_only.line() == logging_line
