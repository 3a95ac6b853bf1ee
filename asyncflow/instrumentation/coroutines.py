"""Coroutines that were created and never awaited, counted by function, in the whole program.

CPython reports such a coroutine, when it is finalised, by calling
``warnings._warn_unawaited_coroutine(coro)``. :func:`track_never_awaited` puts a function of
its own in that place: it counts the coroutine by function (and by the line that created it when
origin tracking is on), then issues the very warning CPython would have, from the same frame.
So the count holds even when the program filters the ``RuntimeWarning`` away, and nothing on any
hot path pays for it: it runs only when a coroutine dies unawaited.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
from typing import Any

from asyncflow.instrumentation._nested import Nested

__all__ = [
    "MAX_SITES",
    "NeverAwaitedTracking",
    "Site",
    "never_awaited",
    "track_never_awaited",
]

#: Distinct (function, creation site) pairs counted; the rest are counted together as one.
MAX_SITES = 1000
#: The frames CPython records at each coroutine's creation when origin tracking is asked for.
ORIGIN_DEPTH = 1

_OTHER = ("(other functions)", "?", 0, None)

#: (qualname, file, first line, creation site or None) -> count. Written from finalisers, which
#: may run on any thread at any moment (inside asyncflow too): no lock, so none can deadlock.
_counts: dict[tuple[str, str, int, tuple[str, int, str] | None], int] = {}
_state_lock = threading.Lock()
_original: Any = None
_handles = 0


class Site:
    """How often one function's coroutines were never awaited (from one creation site)."""

    __slots__ = ("count", "created_at", "file", "function", "line")

    def __init__(
        self,
        function: str,
        file: str,
        line: int,
        created_at: tuple[str, int, str] | None,
        count: int,
    ) -> None:
        self.function = function
        self.file = file
        self.line = line
        #: (file, line, function) that created them, when origin tracking was on
        self.created_at = created_at
        self.count = count


def _record(coro: Any) -> None:
    code = getattr(coro, "cr_code", None)
    origin = getattr(coro, "cr_origin", None)
    site = tuple(origin[0]) if origin else None
    if code is not None:
        key: Any = (code.co_qualname, code.co_filename, code.co_firstlineno, site)
    else:
        key = (getattr(coro, "__qualname__", type(coro).__qualname__), "?", 0, site)
    if key not in _counts and len(_counts) >= MAX_SITES:
        key = _OTHER
    _counts[key] = _counts.get(key, 0) + 1


def _warn_unawaited_coroutine(coro: Any) -> None:
    """What CPython calls for a coroutine finalised unawaited: count it, then warn as it would."""
    with contextlib.suppress(BaseException):  # a finaliser must never fail, whatever it holds
        _record(coro)
    chained = _original
    if chained is not None and getattr(chained, "__module__", None) != "warnings":
        chained(coro)  # someone else's reporter was there first: it reports, as before
        return
    # CPython's own body (Lib/warnings.py), run from this frame in its place: the warning names
    # the same line (stacklevel=2: the frame the coroutine died in) as it would without us.
    msg_lines = [f"coroutine '{coro.__qualname__}' was never awaited\n"]
    if coro.cr_origin is not None:
        import linecache
        import traceback

        def extract() -> Any:
            for filename, lineno, funcname in reversed(coro.cr_origin):
                line = linecache.getline(filename, lineno)
                yield (filename, lineno, funcname, line)

        msg_lines.append("Coroutine created at (most recent call last)\n")
        msg_lines += traceback.format_list(list(extract()))
    msg = "".join(msg_lines).rstrip("\n")
    warnings.warn(msg, category=RuntimeWarning, stacklevel=2, source=coro)


def _origin_on() -> int | None:
    """Turn CPython's origin tracking on; returns the depth it replaced (None: deep enough)."""
    before = sys.get_coroutine_origin_tracking_depth()
    if before >= ORIGIN_DEPTH:
        return None
    sys.set_coroutine_origin_tracking_depth(ORIGIN_DEPTH)
    return before


def _origin_off(before: int | None) -> None:
    """Put back the depth origin tracking replaced, unless the program set one since."""
    if before is not None and sys.get_coroutine_origin_tracking_depth() == ORIGIN_DEPTH:
        sys.set_coroutine_origin_tracking_depth(before)


#: Origin tracking, on while any handle that asked for it is active.
_origin: Nested[int | None] = Nested(_origin_on, _origin_off)


class NeverAwaitedTracking:
    """Handle returned by :func:`track_never_awaited`; ``undo()`` (or leaving ``with``) restores
    CPython's own reporting once every handle is undone, and origin tracking once every handle
    that asked for it is."""

    __slots__ = ("_active", "_origin")

    def __init__(self, origin: bool) -> None:
        self._active = True
        self._origin = origin

    @property
    def active(self) -> bool:
        """Whether this handle still keeps the counting installed."""
        return self._active

    def undo(self) -> None:
        """Stop counting (when no other handle keeps it); idempotent."""
        global _original, _handles
        with _state_lock:
            if not self._active:
                return
            self._active = False
            _handles -= 1
            if self._origin:
                _origin.leave()
            if _handles == 0 and _original is not None:
                if warnings._warn_unawaited_coroutine is _warn_unawaited_coroutine:  # type: ignore[attr-defined]
                    warnings._warn_unawaited_coroutine = _original  # type: ignore[attr-defined]
                _original = None

    def __enter__(self) -> NeverAwaitedTracking:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.undo()


def track_never_awaited(*, origin: bool = False) -> NeverAwaitedTracking:
    """Count every coroutine of the program that is finalised without having been awaited.

    Counting costs nothing until such a coroutine dies. The ``RuntimeWarning`` Python issues for
    it is issued exactly as before (filters included); the count holds even when it is filtered.

    Args:
        origin: also record the line that created each such coroutine. This turns on CPython's
            coroutine origin tracking (``sys.set_coroutine_origin_tracking_depth(1)``), which
            costs a frame read at every coroutine's creation, so it is off by default.

    Returns:
        A handle whose ``undo()`` puts CPython's reporting back.

    Raises:
        TypeError: ``origin`` is not a bool.
    """
    if not isinstance(origin, bool):
        raise TypeError(f"asyncflow.track_never_awaited(origin=...) must be a bool, got {origin!r}")
    global _original, _handles
    with _state_lock:
        current = getattr(warnings, "_warn_unawaited_coroutine", None)
        if current is not _warn_unawaited_coroutine:
            _original = current
            warnings._warn_unawaited_coroutine = _warn_unawaited_coroutine  # type: ignore[attr-defined]
        _handles += 1
        if origin:
            _origin.enter()
    return NeverAwaitedTracking(origin)


def never_awaited() -> list[Site]:
    """Every function whose coroutines were never awaited so far, most often first."""
    for _ in range(100):
        try:
            items = list(_counts.items())
            break
        except RuntimeError:  # a finaliser added a key mid-copy: copy again
            continue
    else:
        items = []
    sites = [Site(q, f, line, site, n) for (q, f, line, site), n in items]
    sites.sort(key=lambda s: (-s.count, s.function))
    return sites


def reset_for_session() -> None:
    """A new profiler counts from zero."""
    _counts.clear()
