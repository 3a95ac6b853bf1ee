"""When the loop monitor ticks: only to post a heartbeat that is due, or to look at one in flight
(each tick takes the GIL from the program, so ticks that would do nothing are not made)."""

from __future__ import annotations

from types import SimpleNamespace

from asyncflow.clock import FakeClock
from asyncflow.model.monitor import LoopMonitor

MS = 1_000_000


def test_the_monitor_sleeps_until_a_heartbeat_is_due_unless_one_is_in_flight(
    fake_clock: FakeClock,
) -> None:
    monitor = LoopMonitor(100 * MS, 20 * MS)  # ticks of 10 ms, a heartbeat every 25 ms at most
    try:
        assert (monitor.interval, monitor.post_every_ns) == (0.01, 25 * MS)
        assert abs(monitor.pause() - 0.026) < 1e-9  # no loop: the next tick posts to any that comes
        fake_clock.advance(1_000 * MS)
        now = fake_clock()
        state = SimpleNamespace(closed=False, pending=0, posted_at=now - 5 * MS)
        monitor.states[1] = state  # type: ignore[assignment]
        assert abs(monitor.pause() - 0.021) < 1e-9  # its next heartbeat is due in 20 ms
        state.pending = now  # posted, not run yet: looked at a tick later, while late
        assert monitor.pause() == monitor.interval
        # ... unless it has run by then: the wait goes on to its next heartbeat, 20 ms
        pause, then = monitor.plan()
        assert pause == monitor.interval and then is not None and abs(then - 0.021) < 1e-9
        state.pending = 0
        assert monitor.plan()[1] is None  # none in flight: no look, the tick is the posting
        state.pending, state.posted_at = 0, now - 30 * MS  # due already
        assert monitor.pause() == monitor.interval
        # a closed loop is never posted to: it makes no tick sooner
        monitor.states[1] = SimpleNamespace(closed=True, pending=now, posted_at=0)  # type: ignore[assignment]
        assert abs(monitor.pause() - 0.026) < 1e-9
    finally:
        monitor.states.clear()  # (stand-ins: nothing of them to end)
        monitor.stop()
