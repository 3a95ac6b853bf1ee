"""What the raising path keeps: each future's exception types counted by name over the run
(``count_type``, bounded), and the tasks whose coroutine raised, remembered weakly so the cold
path can tell which of them nobody retrieved: asyncio logs "Task exception was never
retrieved" only when such a task is garbage-collected (at exit, or never while something
keeps it), silent while the program runs.

Noted where a tracked task's own call raises (``futures._finish_poll``, not a hot path);
read by the collector's thread. Holds a weak reference to each task and never reads its
exception (``exception()`` would mark it retrieved): only ``done()``, ``cancelled()`` and
asyncio's own ``_log_traceback`` flag (the C and the Python Task keep it, 3.11 to 3.14).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from asyncflow.instrumentation import _session
from asyncflow.instrumentation.recording import ERROR_TYPES_KEPT

__all__ = [
    "ERROR_TYPES_KEPT",
    "MAX_RAISED",
    "OTHER_TYPES",
    "Unretrieved",
    "count_type",
    "dropped",
    "merge_types",
    "note",
    "unretrieved",
]

#: the name the exception types past ``ERROR_TYPES_KEPT`` are counted under together (no
#: qualified name has parentheses), as a function's are (``recording.count_error``)
OTHER_TYPES = "(other)"


def count_type(types: dict[str, int], name: str, n: int = 1) -> None:
    """Count ``n`` calls that raised the exception type ``name`` into a future's ``types``
    (``FutureStats.error_types``): at most ``ERROR_TYPES_KEPT`` names, the rest together
    under ``OTHER_TYPES``. On the raising path only: a call that returns pays nothing."""
    if name not in types and len(types) >= ERROR_TYPES_KEPT:
        name = OTHER_TYPES
    types[name] = types.get(name, 0) + n


def merge_types(into: dict[str, int], other: Mapping[str, int]) -> None:
    """Add a gone future's exception types to its aggregate's, within the same bound."""
    for name, n in list(other.items()):
        count_type(into, name, n)


#: tasks that raised remembered at once, at most: past it, those settled (retrieved, cancelled,
#: gone) are forgotten first, then the oldest (counted: ``dropped``)
MAX_RAISED = 1000


class Unretrieved:
    """One task whose coroutine raised (the call's figures, never the exception)."""

    __slots__ = ("call_id", "exc_message", "exc_type", "future_id", "raised_ns", "task")

    def __init__(
        self,
        task: weakref.ref[asyncio.Task[Any]],
        future_id: int,
        call_id: int,
        exc_type: str,
        exc_message: str,
        raised_ns: int,
    ) -> None:
        self.task = task
        self.future_id = future_id
        self.call_id = call_id
        self.exc_type = exc_type
        self.exc_message = exc_message
        self.raised_ns = raised_ns


_lock = threading.Lock()
#: by the task's id(), oldest first: one entry a task (a dead task's id may be a new task's:
#: the new one's entry replaces the dead one's, which was settled)
_raised: dict[int, Unretrieved] = {}
#: tasks forgotten unjudged, and the epoch of the profile (session) they were counted in
_dropped: list[Any] = [0, None]
#: notes that find the table full before it is swept again for settled tasks: a sweep reads
#: every entry, so a table full of unsettled ones is swept once per MAX_RAISED // 2 notes
_until_sweep = [0]


def note(
    task: asyncio.Task[Any],
    future_id: int,
    call_id: int,
    exc_type: str,
    exc_message: str,
    raised_ns: int,
) -> None:
    """Remember ``task``, in which the tracked call ``call_id`` just raised; a task noted
    again (an outer call raised on, or a later call) keeps its place and takes its latest,
    outermost, call's figures: no new entry, no lock (a worker that catches and goes on
    raises often in one task)."""
    key = id(task)
    entry = _raised.get(key)
    if entry is not None and entry.task() is task:
        entry.future_id, entry.call_id, entry.raised_ns = future_id, call_id, raised_ns
        entry.exc_type, entry.exc_message = exc_type, exc_message
        return
    entry = Unretrieved(weakref.ref(task), future_id, call_id, exc_type, exc_message, raised_ns)
    with _lock:
        _raised.pop(key, None)  # a dead task's, whose id this one has now: settled
        _raised[key] = entry
        if len(_raised) > MAX_RAISED:
            _make_room()


def _make_room() -> None:
    """Under ``_lock``, the table one past full: forget the settled tasks (swept at most once
    per ``MAX_RAISED // 2`` full notes), then, if it is still full, the oldest, counted."""
    if _until_sweep[0] <= 0:
        _until_sweep[0] = MAX_RAISED // 2
        for key in [key for key, e in _raised.items() if _settled(e.task())]:
            del _raised[key]
    else:
        _until_sweep[0] -= 1
    while len(_raised) > MAX_RAISED:
        del _raised[next(iter(_raised))]
        session = _session.active
        epoch = session.epoch if session is not None else None
        if _dropped[1] != epoch:
            _dropped[0], _dropped[1] = 0, epoch
        _dropped[0] += 1


def dropped(epoch: int | None = None) -> int:
    """How many tasks that raised were forgotten, unjudged, to keep the memory bounded, in the
    profile of ``epoch`` (``Session.epoch``; None: the running one's)."""
    if epoch is None and _session.active is not None:
        epoch = _session.active.epoch
    count, counted_in = _dropped
    return int(count) if counted_in == epoch else 0


def _settled(task: asyncio.Task[Any] | None) -> bool:
    """Gone (asyncio logged it if it had to), cancelled, or its exception read: done with."""
    if task is None:
        return True
    if not task.done():
        return False  # its exception is being set now
    return task.cancelled() or not getattr(task, "_log_traceback", False)


def unretrieved() -> list[Unretrieved]:
    """The tasks that raised and whose exception nobody has retrieved yet, oldest first;
    those settled since are forgotten (a retrieved exception stays retrieved)."""
    with _lock:
        entries = list(_raised.items())
    out, settled = [], []
    for key, entry in entries:
        task = entry.task()
        if _settled(task):
            settled.append((key, entry))
        elif task is not None and task.done():
            out.append(entry)
        del task  # never keep it alive
    if settled:
        with _lock:
            for key, entry in settled:
                if _raised.get(key) is entry:  # not a later note of the same task
                    del _raised[key]
    return out
