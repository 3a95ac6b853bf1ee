"""The per-poll probe seam: one opt-in observer called around every poll of every tracked call.

A probe is what the trace recorder and the CPU-time and allocation figures build on. It sees
every poll (one ``send``/``throw`` into a tracked coroutine) on both hot paths, the compiled one
and the pure-Python reference, with the same arguments; when no probe is set a poll pays one
pointer check (C) or one global ``None`` check (Python) for the seam, nothing else.

Contract:

- ``probe.begin(record) -> token`` runs on the polling thread just before the poll's clock is
  read; ``probe.end(record, token, t0_ns, dt_ns, outcome)`` just after the poll is recorded. The
  probe's own cost is therefore outside the poll's recorded duration. ``token`` is whatever
  ``begin`` returned (a start reading of a CPU clock, say); it is kept for the duration of the
  poll only.
- ``record`` is the call's record (``futures.CallRecord`` or its compiled twin): ``call_id``,
  ``future`` (a ``FutureRecord``: ``id``, ``label``, ``source``), ``polls``, ``busy``... and
  ``probe_data``, a slot asyncflow never touches, free for the probe (unset until it sets it:
  read it with ``getattr(record, "probe_data", None)``).
- ``t0_ns`` is the poll's start on asyncflow's clock (``asyncflow.clock.now_ns``, fake in tests),
  ``dt_ns`` its duration exactly as recorded (``record.last``). ``outcome`` is ``"suspended"``
  (the call yielded, it will be polled again), ``"returned"``, ``"raised"`` or ``"cancelled"``
  (a CancelledError left it); on those three the call has ended and its record is already final
  (``record.finished`` set, handed to the collector).
- The thread is the caller's (``threading.get_ident()``), the loop is
  ``asyncio.get_running_loop()`` (None when a call is driven by hand) and the task is
  :func:`current_task`. Polls nest: a tracked call awaiting another tracked call runs the inner
  ``begin``/``end`` inside the outer pair; ``dt_ns`` of the outer poll includes the inner one.
- A probe that raises (an ``Exception``) is removed at once, and the error is counted in
  ``/profiler_status`` and logged once to the ``asyncflow`` logger; the program never sees it.
  ``begin``/``end`` must not await, block, or poll tracked calls themselves.
"""

from __future__ import annotations

from typing import Any, Protocol

from asyncflow.instrumentation import futures

__all__ = [
    "CANCELLED",
    "RAISED",
    "RETURNED",
    "SUSPENDED",
    "PollProbe",
    "current_task",
    "poll_probe",
    "set_poll_probe",
]

#: the outcomes ``end`` is given
SUSPENDED = futures.SUSPENDED
RETURNED = futures.RETURNED
RAISED = futures.RAISED
CANCELLED = futures.OUTCOME_CANCELLED

#: the task running on this thread's loop now (None outside one), as cheaply as asyncflow reads it
current_task = futures.current_task


class PollProbe(Protocol):
    """What :func:`set_poll_probe` takes: any object with these two methods."""

    def begin(self, record: Any) -> Any:
        """Called on the polling thread before the poll; returns the token given to ``end``."""

    def end(self, record: Any, token: Any, t0_ns: int, dt_ns: int, outcome: str) -> None:
        """Called on the polling thread after the poll has been recorded."""


def set_poll_probe(probe: PollProbe | None) -> PollProbe | None:
    """Set the observer of every poll of every tracked call (None removes it).

    Args:
        probe: an object with ``begin(record) -> token`` and
            ``end(record, token, t0_ns, dt_ns, outcome)`` methods, or None.

    Returns:
        The probe that was set before (None if none was), so that the caller can put it back.

    Raises:
        TypeError: ``probe`` lacks a callable ``begin`` or ``end``.
    """
    if probe is not None:
        for name in ("begin", "end"):
            if not callable(getattr(probe, name, None)):
                raise TypeError(
                    f"set_poll_probe(probe=...) needs an object with begin(record) and "
                    f"end(record, token, t0_ns, dt_ns, outcome) methods; {probe!r} has no "
                    f"callable {name}"
                )
    previous: PollProbe | None = futures.set_poll_probe(probe)
    return previous


def poll_probe() -> PollProbe | None:
    """The probe set now, or None."""
    probe = futures._poll_probe
    return probe[0] if probe is not None else None
