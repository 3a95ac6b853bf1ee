"""Handing the GIL over to the profiler's thread, on the pure-Python path.

A program busy on its loop lets the GIL go at every turn (``select`` with no wait) and takes it
back a microsecond later. CPython asks the GIL's holder to let go only when a thread has waited a
whole switch interval (5 ms) with no switch in between, and each of those releases wakes the
waiting thread and starts its wait over: the profiler's thread, woken by a timer or a request,
could wait seconds for the GIL, and an endpoint request was not answered in 30 s (the wake-up
storm of ``examples/stuck``). The compiled path hands the GIL over from C (``wait_events`` and
``hand_over`` in ``_speedups.c``), where the profiler's thread says it wants the GIL before it
waits for it; this is the same for the pure-Python path, which cannot say so without the GIL:

- the profiler's thread says when its wait for events ends at the latest (:func:`waiting`),
  and that it is at work once it has the GIL (:func:`woke`);
- a tracked call's poll on any other thread compares its clock reading with :data:`due` (one
  attribute read): from then on it lets the GIL go, and waits until the profiler's thread is
  back waiting for events, for ``HAND_OVER_S`` at most (:func:`hand_over`);
- when that time runs out (the thread computes a large document, or is blocked on something
  else), no poll hands over for a while, twice as long each time for the same work, as the
  compiled path does: the program never pays more than a small share of its time.

A thread woken by a request, not its timer, is seen at its timer's time: the loop monitor's
looks keep that within tens of milliseconds while a loop is busy. A loop that runs no tracked
call hands nothing over (the compiled path asks the main thread with a pending call, which
Python code cannot).
"""

from __future__ import annotations

import os
import threading

from asyncflow import clock as _clock

__all__ = ["NEVER", "due", "forget", "hand_over", "hand_overs", "waiting", "woke"]

#: a clock reading no poll reaches
NEVER = 1 << 62
#: the longest a poll waits for the profiler's thread (seconds)
HAND_OVER_S = 0.002
#: then no hand-over for this long at first, doubled each time the same work runs one out (ns)
GAP_NS = 5_000_000
GAP_MAX_NS = 100_000_000
#: how late a timer may wake the profiler's thread before polls hand over to it (ns)
SLACK_NS = 500_000

#: from this clock reading (``asyncflow.clock``), a tracked call's poll hands the GIL over:
#: NEVER while nobody waits for events here, the end of the wait while one does, 0 at work
due = NEVER

_thread = 0  # the profiler's thread: it never hands over to itself
_rounds = 0  # its waits for events so far: each wake is a new round of work
_back = threading.Condition(threading.Lock())  # notified as it goes back to waiting
_sleepers = 0  # polls waiting on _back
_gap_round = -1  # the round a hand-over ran out for, and no hand-over before _after then
_after = 0
_gap = 0
_handed = _handed_ns = _ran_out = 0


def waiting(timeout: float | None) -> None:
    """The profiler's thread is about to wait for events, ``timeout`` seconds at most (None:
    until one comes). A wait of no time (asyncio's look between two steps of one batch of
    work) is not a wake: the work goes on."""
    global due, _thread, _rounds
    if timeout is not None and timeout <= 0:
        return
    _thread = threading.get_ident()
    due = NEVER if timeout is None else _clock.now_ns() + int(timeout * 1e9) + SLACK_NS
    _rounds += 1
    if _sleepers:
        with _back:
            _back.notify_all()


def woke() -> None:
    """The profiler's thread woke and has the GIL: until it waits again, polls hand over."""
    global due
    due = 0


def forget() -> None:
    """The profiler's thread waits here no more (its loop closed): nobody is handed anything."""
    global due, _rounds
    due = NEVER
    _rounds += 1
    with _back:
        _back.notify_all()


def hand_over() -> None:
    """On a thread other than the profiler's, past :data:`due`: let the GIL go until the
    profiler's thread is back waiting for events, ``HAND_OVER_S`` at most."""
    global _sleepers, _gap_round, _after, _gap, _handed, _handed_ns, _ran_out
    if threading.get_ident() == _thread or due == NEVER:
        return
    now = _clock.now_ns()
    round_ = _rounds
    if round_ == _gap_round and now < _after:
        return  # still the work that ran out a hand-over: its gap
    with _back:
        _sleepers += 1
        try:
            back = _back.wait_for(lambda: _rounds != round_, HAND_OVER_S)
        finally:
            _sleepers -= 1
    _handed += 1
    _handed_ns += max(0, _clock.now_ns() - now)
    if not back:  # still at that work: leave it the GIL's own turns for a while
        _ran_out += 1
        _gap = min(_gap * 2 if round_ == _gap_round and _gap else GAP_NS, GAP_MAX_NS)
        _gap_round = round_
        _after = _clock.now_ns() + _gap


def hand_overs() -> tuple[int, int, int]:
    """Hand-overs so far, the nanoseconds they took, and how many ran out."""
    return _handed, _handed_ns, _ran_out


def _forked() -> None:
    # the child has no profiler's thread yet: nothing is due, and nobody waits on a lock that a
    # thread of the parent's may have held
    global due, _back, _sleepers, _thread
    due = NEVER
    _thread = 0
    _sleepers = 0
    _back = threading.Condition(threading.Lock())


os.register_at_fork(after_in_child=_forked)
