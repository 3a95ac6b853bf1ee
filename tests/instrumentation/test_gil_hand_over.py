"""The GIL's hand-over to the profiler's thread (``_speedups.wait_events``, ``hand_over`` in
asyncflow/instrumentation/_speedups.c): the profiler's loop waits for events there, and a tracked
call's poll on another thread lets the GIL go while that thread, woken, has work to do. What it
is for, an endpoint that answers a program busy on its loop, is tested end to end in
tests/serve/test_server_start.py."""

from __future__ import annotations

import asyncio
import select
import socket
import threading
import time

import pytest

import asyncflow
from asyncflow.instrumentation import futures
from tests.support.compiled_path import compiled

pytestmark = [
    compiled,
    pytest.mark.skipif(not hasattr(select, "epoll"), reason="epoll: Linux only"),
]


def _speedups() -> object:
    module = futures._speedups
    if not hasattr(module, "wait_events"):
        pytest.skip("no hand-over on this platform")
    return module


def test_wait_events_reports_what_epoll_reports() -> None:
    speedups: object = _speedups()
    wait = speedups.wait_events  # type: ignore[attr-defined]
    ours, theirs = socket.socketpair()
    epoll = select.epoll()
    try:
        epoll.register(ours.fileno(), select.EPOLLIN | select.EPOLLOUT)
        wakes = speedups.wakes()  # type: ignore[attr-defined]
        assert wait(epoll.fileno(), 0, -1) == epoll.poll(0) == [(ours.fileno(), select.EPOLLOUT)]
        # A look with no wait (asyncio's, between two steps of one batch of work) keeps the GIL
        # and the hand-over: it is not a wake, or the program would take the GIL back half-way.
        assert speedups.wakes() == wakes  # type: ignore[attr-defined]
        theirs.send(b"x")
        both = [(ours.fileno(), select.EPOLLIN | select.EPOLLOUT)]
        assert wait(epoll.fileno(), None, 1) == epoll.poll(0) == both  # None: until one is ready
        epoll.modify(ours.fileno(), 0)
        assert wait(epoll.fileno(), 0.001, -1) == []  # nothing asked for: the timeout runs out
        assert speedups.wakes() == wakes + 2  # type: ignore[attr-defined]  # two waits, two wakes
        with pytest.raises(OSError):
            wait(theirs.fileno(), 0, -1)  # not an epoll descriptor
    finally:
        epoll.close()
        ours.close()
        theirs.close()
    speedups.wait_events_done()  # type: ignore[attr-defined]


def test_polls_back_off_while_the_profilers_thread_is_blocked_elsewhere() -> None:
    # Woken, the profiler's thread blocks on something else (the GIL let go): a poll waits for
    # it at most a moment, then polls hand nothing over for a while, longer each time; without
    # that, every poll of a busy program would wait that moment.
    speedups: object = _speedups()
    release = threading.Event()

    @asyncflow.future
    async def busy() -> int:
        polls = 0
        while polls < 2000:
            sum(range(2000))
            polls += 1
            await asyncio.sleep(0)
        release.set()
        return polls

    async def main(prof: asyncflow.Profiler) -> tuple[int, int]:
        assert prof._loop is not None
        blocked = threading.Event()

        def block() -> None:
            blocked.set()
            release.wait(30)

        before = speedups.hand_overs()  # type: ignore[attr-defined]
        prof._loop.call_soon_threadsafe(block)
        blocked.wait(30)
        await busy()
        after = speedups.hand_overs()  # type: ignore[attr-defined]
        return after[0] - before[0], after[2] - before[2]

    with asyncflow.profile("blocked", format="none") as prof:
        handed, ran_out = asyncio.run(main(prof))
    assert 1 <= ran_out <= 10, (handed, ran_out)


def test_the_profilers_wakes_never_fill_the_interpreters_pending_calls() -> None:
    # Each wake of the profiler's thread asks the main thread to hand over with a pending call
    # (Py_AddPendingCall); the interpreter's queue has 32 places, shared with the program's
    # extensions. While the main thread runs no Python (blocked in a C call here), the wakes
    # must not fill it: one of ours at most is queued.
    testcapi = pytest.importorskip("_testcapi")
    _speedups()
    gate = threading.Lock()
    gate.acquire()
    queued: list[object] = []

    def wake_often_then_queue(prof: asyncflow.Profiler) -> None:
        assert prof._loop is not None
        for _ in range(40):  # 40 separate wakes: each waits for the one before to have run
            ran = threading.Event()
            prof._loop.call_soon_threadsafe(ran.set)
            ran.wait(30)
        queued.append(testcapi._pending_threadfunc(lambda: None))
        gate.release()

    with asyncflow.profile("pending", format="none") as prof:
        other = threading.Thread(target=wake_often_then_queue, args=(prof,))
        other.start()
        gate.acquire(timeout=60)  # the main thread runs no Python meanwhile
        other.join(30)
    assert queued and queued[0] not in (False, 0)  # the program's own call found a place


def test_a_look_at_heartbeats_that_all_ran_waits_on_without_waking() -> None:
    # The loop monitor looks at a heartbeat in flight a while after posting it; when every
    # heartbeat has run by then, the thread waits on ("then") and does not wake for nothing.
    speedups: object = _speedups()
    wait = speedups.wait_events  # type: ignore[attr-defined]
    in_flight = speedups.heartbeats_in_flight  # type: ignore[attr-defined]
    epoll = select.epoll()
    try:
        in_flight(1)  # a heartbeat still in flight: the look is due
        wakes = speedups.wakes()  # type: ignore[attr-defined]
        start = time.perf_counter()
        assert wait(epoll.fileno(), 0.01, -1, 5.0) == []
        assert time.perf_counter() - start < 2.5
        assert speedups.wakes() == wakes + 1  # type: ignore[attr-defined]
        speedups.heartbeat_landed()  # type: ignore[attr-defined]  # it ran: none in flight
        start = time.perf_counter()
        assert wait(epoll.fileno(), 0.01, -1, 0.3) == []
        assert time.perf_counter() - start >= 0.29  # waited on to "then", in one wake
        assert speedups.wakes() == wakes + 2  # type: ignore[attr-defined]
        speedups.heartbeat_landed()  # type: ignore[attr-defined]  # never below none
        start = time.perf_counter()
        assert wait(epoll.fileno(), 0.01, -1, None) == []  # no "then": the timeout
        assert time.perf_counter() - start < 0.29
    finally:
        in_flight(0)
        epoll.close()
        speedups.wait_events_done()  # type: ignore[attr-defined]


def test_an_idle_watched_loop_wakes_the_profilers_thread_about_once_a_heartbeat() -> None:
    # Each wake of the profiler's thread takes the GIL from the program. The monitor posts a
    # heartbeat every 25 ms; its look 10 ms later, and the collector's drain, used to wake the
    # thread on their own (two and a half wakes a heartbeat): now they ride on the posting's.
    speedups: object = _speedups()

    async def main(prof: asyncflow.Profiler) -> tuple[int, int]:
        assert prof._collector is not None
        monitor = prof._collector.monitor
        with asyncflow.instrument_tasks():
            here = asyncio.get_running_loop()
            while not [s for s in monitor.states.values() if s.loop() is here and s.heartbeats]:
                await asyncio.sleep(0.005)
            (state,) = [s for s in monitor.states.values() if s.loop() is here]
            beats, wakes = state.heartbeats, speedups.wakes()  # type: ignore[attr-defined]
            while state.heartbeats < beats + 20:
                await asyncio.sleep(0.005)
            return state.heartbeats - beats, speedups.wakes() - wakes  # type: ignore[attr-defined]

    with asyncflow.profile("wakes", format="none", port=None) as prof:
        beats, wakes = asyncio.run(main(prof))
    assert wakes <= 1.5 * beats, (beats, wakes)
