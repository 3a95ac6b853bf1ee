"""Nested handles: a change the first handle makes and the last one undone takes back."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, Self, TypeVar

__all__ = ["Nested", "NestedHandle"]

_T = TypeVar("_T")


class Nested(Generic[_T]):
    """A change shared by nested handles, in whatever order they are undone.

    ``enter()`` makes it (``apply()``) when the count of handles goes from 0 to 1, ``leave()``
    takes it back (``revert(saved)``, with what ``apply()`` returned: the setting it replaced,
    say) when the count returns to 0. A handle calls ``leave()`` once for each ``enter()``: its
    own ``undo()`` is what keeps that idempotent (:class:`NestedHandle` does).
    """

    __slots__ = ("_apply", "_lock", "_revert", "_saved", "logs", "users")

    def __init__(self, apply: Callable[[], _T], revert: Callable[[_T], None]) -> None:
        self._apply = apply
        self._revert = revert
        self._lock = threading.Lock()
        self._saved: list[_T] = []  # what apply() returned, while the change is made
        #: handles that hold the change now
        self.users = 0
        #: of those, the handles that asked for message logs (``log_messages=True``)
        self.logs = 0

    def enter(self, logs: bool = False) -> None:
        """One more handle holds the change (one that asked for logs if ``logs``): the first
        makes it."""
        with self._lock:
            if self.users == 0:
                self._saved = [self._apply()]  # (if it raises, no handle holds it)
            self.users += 1
            self.logs += logs

    def leave(self, logs: bool = False) -> None:
        """A handle gives the change back (with the ``logs`` it entered with): the last takes
        it back."""
        with self._lock:
            if self.users == 0:
                raise RuntimeError("Nested.leave() without a matching enter()")
            self.users -= 1
            self.logs -= logs
            if self.users == 0:
                (saved,) = self._saved
                self._saved = []
                self._revert(saved)


#: makes a handle's undo() take its hold back once, whichever threads undo it
_undo_lock = threading.Lock()


class NestedHandle:
    """A handle on a :class:`Nested` change (a whole-program mode): made holding it, its
    ``undo()`` (or leaving ``with``) gives the hold back once; the change itself is taken back
    when every handle in use has been undone. A handle made on ``None`` holds nothing (the mode
    was not turned on: asyncflow is disabled).

    The handles the public functions return (``QueueInstrumentation``,
    ``MemoryStreamInstrumentation``) are this class, named for what they instrument.
    """

    __slots__ = ("_logs", "_nested")

    def __init__(self, nested: Nested[Any] | None, logs: bool = False) -> None:
        if nested is not None:
            nested.enter(logs)
        self._nested = nested
        self._logs = logs

    @property
    def active(self) -> bool:
        """Whether this handle still holds the mode: what is created now is instrumented."""
        return self._nested is not None

    def undo(self) -> None:
        """Give this handle's hold back: the mode ends once every handle in use has been
        undone; what was instrumented already keeps recording. Idempotent."""
        with _undo_lock:
            nested, self._nested = self._nested, None
        if nested is not None:
            nested.leave(self._logs)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.undo()
