"""The GIL's hand-over to the profiler's thread on the pure-Python path
(asyncflow/instrumentation/_handing.py): the profiler's thread says when its wait for events
ends and when it is at work, and a poll on another thread past that lets the GIL go until the
thread waits again. What it is for, an endpoint that answers a program busy on its loop, is
tested end to end in tests/serve/test_server_start.py and tests/views/test_findings_live.py."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

import pytest

import asyncflow
from asyncflow import clock
from asyncflow.instrumentation import _handing, futures


@pytest.fixture
def fake() -> Iterator[clock.FakeClock]:
    """A clock that moves when told to, for the hand-over's deadlines and gaps; the hand-over
    forgotten after (as the profiler's loop does when it closes)."""
    now = clock.FakeClock()
    previous = clock.set_clock(now)
    try:
        yield now
    finally:
        clock.set_clock(previous)
        _handing.forget()


def _as_profilers_thread(*steps: Callable[[], object]) -> None:
    """Run ``steps`` on a thread of their own, as the profiler's thread would, to the end."""
    thread = threading.Thread(target=lambda: [step() for step in steps])
    thread.start()
    thread.join(30)
    assert not thread.is_alive()


def _at_work() -> None:
    _handing.waiting(None)  # (the thread is the one that waits for events)
    _handing.woke()


def test_a_poll_hands_over_until_the_profilers_thread_waits_again(
    fake: clock.FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_handing, "HAND_OVER_S", 30.0)  # never runs out here: it is handed back
    at_work = threading.Event()

    def profilers_thread() -> None:
        _at_work()
        at_work.set()
        waits = threading.Event()
        while not _handing._sleepers:  # until the poll lets the GIL go and waits for it
            waits.wait(0.001)
        _handing.waiting(1.0)  # its work done: it waits for events again, for a second

    thread = threading.Thread(target=profilers_thread)
    thread.start()
    at_work.wait(30)
    assert _handing.due == 0  # at work: any poll hands over
    before = _handing.hand_overs()
    _handing.hand_over()
    thread.join(30)
    handed, _, ran_out = (a - b for a, b in zip(_handing.hand_overs(), before, strict=True))
    assert (handed, ran_out) == (1, 0)
    # waiting for events, it is due at the end of its wait (and a timer's lateness)
    assert _handing.due == fake() + 1_000_000_000 + _handing.SLACK_NS


def test_a_wait_of_no_time_is_no_wake_and_a_wait_without_end_is_never_due(
    fake: clock.FakeClock,
) -> None:
    _as_profilers_thread(_at_work, lambda: _handing.waiting(0))
    assert _handing.due == 0  # asyncio's look between two steps of one batch: still at work
    _as_profilers_thread(lambda: _handing.waiting(None))
    assert _handing.due == _handing.NEVER
    _as_profilers_thread(_at_work, _handing.forget)
    assert _handing.due == _handing.NEVER  # its loop closed: nobody is handed anything


def test_polls_back_off_while_the_profilers_thread_stays_at_the_same_work(
    fake: clock.FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Woken, the profiler's thread computes a large document or blocks on something else: a
    # poll waits for it a moment, then polls hand nothing over for a while, twice as long each
    # time for the same work; without that, every poll of a busy program would wait.
    monkeypatch.setattr(_handing, "HAND_OVER_S", 0.0001)
    _as_profilers_thread(_at_work)  # at work, and it never waits again
    start = _handing.hand_overs()

    def handed_since() -> tuple[int, int]:
        handed, _, ran_out = (a - b for a, b in zip(_handing.hand_overs(), start, strict=True))
        return handed, ran_out

    _handing.hand_over()
    assert handed_since() == (1, 1)
    for gap_ns in (_handing.GAP_NS, 2 * _handing.GAP_NS, 4 * _handing.GAP_NS):
        fake.advance(gap_ns - 1_000)
        _handing.hand_over()  # within the gap: nothing handed over
        handed = handed_since()[0]
        fake.advance(1_000)
        _handing.hand_over()
        assert handed_since()[0] == handed + 1
    # new work (a new wake of the thread) is handed the GIL at once
    _as_profilers_thread(_at_work)
    _handing.hand_over()
    assert handed_since() == (5, 5)


def test_the_profilers_own_thread_never_hands_over_to_itself(fake: clock.FakeClock) -> None:
    before = _handing.hand_overs()
    _as_profilers_thread(_at_work, _handing.hand_over)
    assert _handing.hand_overs() == before


@pytest.mark.skipif(futures._speedups is not None, reason="the compiled path hands over in C")
def test_a_tracked_poll_hands_over_once_the_profilers_thread_is_due(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_handing, "HAND_OVER_S", 0.0001)
    # (a gap no loaded machine outlasts between two polls of one run: one hand-over a run)
    monkeypatch.setattr(_handing, "GAP_NS", 3600 * 10**9)
    monkeypatch.setattr(_handing, "GAP_MAX_NS", 3600 * 10**9)
    # (a profiler whose own thread hands nothing over: this test plays that thread)
    monkeypatch.setenv("ASYNCFLOW_GIL_HAND_OVER", "0")

    @asyncflow.future
    async def polled(times: int) -> None:
        for _ in range(times):
            await asyncio.sleep(0)

    def handed_during(polls: int) -> int:
        before = _handing.hand_overs()[0]
        asyncio.run(polled(polls))
        return _handing.hand_overs()[0] - before

    try:
        with asyncflow.profile("handing", format="none", port=None):
            _as_profilers_thread(lambda: _handing.waiting(60.0))  # waiting, due in a minute
            assert handed_during(5) == 0
            _as_profilers_thread(_at_work)  # woken, at work
            assert handed_during(5) == 1  # (then the gap: it never got to wait again)
            _as_profilers_thread(_handing.forget)
            assert handed_during(5) == 0
    finally:
        _handing.forget()


@pytest.mark.skipif(futures._speedups is not None, reason="the compiled path hands over in C")
def test_the_profilers_loop_says_when_it_waits_and_leaves_nothing_due_once_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ASYNCFLOW_GIL_HAND_OVER", "1")
    rounds = _handing._rounds
    with asyncflow.profile("handing", format="none", port=None) as prof:
        assert prof._loop is not None
        ran = threading.Event()
        prof._loop.call_soon_threadsafe(ran.set)  # a wake of its thread, for work
        assert ran.wait(30)
    assert _handing._rounds > rounds + 1  # it said so each time it went back to waiting
    assert _handing._thread != threading.get_ident()
    assert _handing.due == _handing.NEVER  # gone: no poll of the program hands anything over
