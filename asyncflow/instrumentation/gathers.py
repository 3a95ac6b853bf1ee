"""Which tracked call each ``asyncio.gather`` waited for: per future, the gathers a call of it
took part in and those whose last call to end was one of its (the slow-tail finding's proof).

While a profiler runs, ``asyncio.gather`` is a thin wrapper of itself: it calls the real one,
reads the call records of the child tasks still running (never on a poll's path) and adds one
done-callback to the outer future it returns (one per gather, never per child). When the outer
future ends with every child done and none cancelled, the callback compares the records' end
stamps and credits the future of the call that ended last. A gather with a child it waits for
that is no task running a tracked call (an untracked task, a plain future, another gather) is
not counted: who ended last among them cannot be told. The program sees the same outer
future, results, exceptions and cancellation as without it.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Awaitable
from typing import Any

from asyncflow.instrumentation import _session
from asyncflow.instrumentation._nested import Nested, NestedHandle
from asyncflow.instrumentation.futures import OUTCOME_CANCELLED as _CANCELLED

__all__ = ["MAX_FUTURES", "GatherCounts", "counts", "dropped", "install"]

#: futures counted at once, at most: past it a new future's gathers are not counted (counted
#: in dropped()); a future's counts are two integers
MAX_FUTURES = 10_000

_lock = threading.Lock()
#: by future id: [gathers a call of it took part in, of those the ones it ended last in]
_counts: dict[int, list[int]] = {}
_dropped = [0]

#: the callbacks' context: one empty context, shared (the program's own is never copied, and
#: the callback reads no context variable)
_CONTEXT = contextvars.Context()


class GatherCounts:
    """One future's gathers: how many a call of it took part in, and how many of those
    ended with one of its calls (the one the gather waited for)."""

    __slots__ = ("gathers", "last")

    def __init__(self, gathers: int, last: int) -> None:
        self.gathers = gathers
        self.last = last


def counts(future_id: int) -> GatherCounts:
    """The gathers counted for ``future_id`` in this session (0 and 0 when none)."""
    c = _counts.get(future_id)
    return GatherCounts(c[0], c[1]) if c is not None else GatherCounts(0, 0)


def dropped() -> int:
    """How many gathers left a future uncounted because MAX_FUTURES were counted already."""
    return _dropped[0]


def _credit(records: list[Any], outer: asyncio.Future[Any]) -> None:
    """The outer future of a gather ended: credit the future of its last call. ``records``
    are the call records of the children that were still running when it was made."""
    try:
        if outer.cancelled():
            return  # nobody waited for the children to end
        last_end, last = -1, None
        futures = set()
        for r in records:
            end = r.finished
            if not end or r.outcome == _CANCELLED:
                return  # it failed early (a child raised and others run), or was cancelled
            future = r.future
            futures.add(future)
            if end > last_end:
                last_end, last = end, future
        with _lock:
            for future in futures:
                c = _counts.get(future.id)
                if c is None:
                    if len(_counts) >= MAX_FUTURES:
                        _dropped[0] += 1
                        continue
                    c = _counts[future.id] = [0, 0]
                c[0] += 1
                if future is last:
                    c[1] += 1
    except Exception as err:  # observing never breaks the program
        _session.internal_error("crediting a gather's last call", err)


def _watch(outer: asyncio.Future[Any]) -> None:
    """Credit ``outer``'s last call once it ends, if each of its children still running is a
    task running a tracked call (a child done already, an eager task's, was not waited for).
    The records are read now, while the tasks run: ``Task.get_coro()`` of an eager task that
    ended crashes CPython 3.12.0 and 3.12.1."""
    children = getattr(outer, "_children", None)
    if not isinstance(children, list):
        return  # not asyncio's _GatheringFuture: nothing to read
    records = []
    try:
        for child in children:
            if not child.done():
                records.append(child.get_coro()._r)
    except AttributeError:
        return  # a plain future, another gather, an untracked task: its end is unknown
    if records:
        outer.add_done_callback(functools.partial(_credit, records), context=_CONTEXT)


#: the gather that _gather calls: asyncio's, or what stood in its place when it was installed
_wrapped: Any = asyncio.gather


@functools.wraps(asyncio.gather)
def _gather(*aws: Awaitable[Any], return_exceptions: bool = False) -> asyncio.Future[Any]:
    outer: asyncio.Future[Any] = _wrapped(*aws, return_exceptions=return_exceptions)
    if len(aws) > 1 and _session.active is not None:
        try:
            _watch(outer)
        except Exception as err:  # observing never breaks the program
            _session.internal_error("watching a gather", err)
    return outer


def _apply() -> tuple[Any, Any]:
    """Stand ``_gather`` in for ``asyncio.gather``; this session's counts start from zero."""
    global _wrapped
    with _lock:
        _counts.clear()
        _dropped[0] = 0
    saved = (asyncio.gather, asyncio.tasks.gather)
    _wrapped = saved[0]
    asyncio.gather = asyncio.tasks.gather = _gather  # type: ignore[assignment]
    return saved


def _revert(saved: tuple[Any, Any]) -> None:
    """Put back what ``asyncio.gather`` was, unless the program has set its own since; the
    counts stay, for the final snapshot."""
    if asyncio.gather is _gather:
        asyncio.gather = saved[0]
    if asyncio.tasks.gather is _gather:
        asyncio.tasks.gather = saved[1]


_nested: Nested[tuple[Any, Any]] = Nested(_apply, _revert)


def install() -> NestedHandle:
    """Count gathers until the returned handle is undone (nested handles share one wrapper)."""
    return NestedHandle(_nested)
