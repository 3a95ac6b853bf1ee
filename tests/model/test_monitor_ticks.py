"""When the loop monitor ticks: only to post a heartbeat that is due, or to look at one in flight
(each tick takes the GIL from the program, so ticks that would do nothing are not made)."""

from __future__ import annotations

from types import SimpleNamespace

from asyncflow.clock import FakeClock
from asyncflow.model import monitor as monitor_module
from asyncflow.model.monitor import LoopMonitor

MS = 1_000_000


def test_the_monitor_sleeps_until_a_heartbeat_is_due_unless_one_is_in_flight(
    fake_clock: FakeClock,
) -> None:
    monitor = LoopMonitor(100 * MS, 20 * MS)  # ticks of 10 ms, a heartbeat every 50 ms at most
    try:
        assert (monitor.interval, monitor.post_calm_ns, monitor.post_every_ns) == (
            0.01,
            50 * MS,
            25 * MS,
        )
        assert abs(monitor.pause() - 0.051) < 1e-9  # no loop: the next tick posts to any that comes
        fake_clock.advance(1_000 * MS)
        now = fake_clock()
        state = SimpleNamespace(closed=False, pending=0, posted_at=now - 5 * MS, watchful_until=0)
        monitor.states[1] = state  # type: ignore[assignment]
        assert abs(monitor.pause() - 0.046) < 1e-9  # its next heartbeat is due in 45 ms
        state.pending = now  # posted, not run yet: looked at a tick later, while late
        assert monitor.pause() == monitor.interval
        # ... unless it has run by then: the wait goes on to its next heartbeat, 45 ms
        pause, then = monitor.plan()
        assert pause == monitor.interval and then is not None and abs(then - 0.046) < 1e-9
        state.pending = 0
        assert monitor.plan()[1] is None  # none in flight: no look, the tick is the posting
        state.pending, state.posted_at = 0, now - 60 * MS  # due already
        assert monitor.pause() == monitor.interval
        # a closed loop is never posted to: it makes no tick sooner
        monitor.states[1] = SimpleNamespace(  # type: ignore[assignment]
            closed=True, pending=now, posted_at=0, watchful_until=0
        )
        assert abs(monitor.pause() - 0.051) < 1e-9
    finally:
        monitor.states.clear()  # (stand-ins: nothing of them to end)
        monitor.stop()


def test_a_loop_late_lately_gets_a_heartbeat_every_quarter_of_the_threshold(
    fake_clock: FakeClock,
) -> None:
    # A loop whose short blocks repeat (a 40 ms synchronous call in every request) must have
    # each of them seen: a heartbeat every 50 ms would miss one block in five of a loop blocked
    # most of the time. A healthy loop is posted to half as often: each posting wakes the
    # profiler's thread, and each wake costs the program far more than its own work.
    monitor = LoopMonitor(100 * MS, 20 * MS)
    try:
        fake_clock.advance(1_000 * MS)
        now = fake_clock()
        state = SimpleNamespace(closed=False, pending=0, posted_at=now - 5 * MS, watchful_until=0)
        monitor.states[1] = state  # type: ignore[assignment]
        assert monitor.every(state, now) == 50 * MS  # type: ignore[arg-type]
        state.watchful_until = now + monitor_module.WATCHFUL_NS  # a block was counted just now
        assert monitor.every(state, now) == 25 * MS  # type: ignore[arg-type]
        assert abs(monitor.pause() - 0.021) < 1e-9  # its next heartbeat is due in 20 ms
        fake_clock.advance(monitor_module.WATCHFUL_NS)  # and never since
        assert monitor.every(state, fake_clock()) == 50 * MS  # type: ignore[arg-type]
    finally:
        monitor.states.clear()
        monitor.stop()
