"""Nested handles: a change the first handle makes and the last one undone takes back."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Nested"]

_T = TypeVar("_T")


class Nested(Generic[_T]):
    """A change shared by nested handles, in whatever order they are undone.

    ``enter()`` makes it (``apply()``) when the count of handles goes from 0 to 1, ``leave()``
    takes it back (``revert(saved)``, with what ``apply()`` returned: the setting it replaced,
    say) when the count returns to 0. A handle calls ``leave()`` once for each ``enter()``: its
    own ``undo()`` is what keeps that idempotent.
    """

    __slots__ = ("_apply", "_lock", "_revert", "_saved", "users")

    def __init__(self, apply: Callable[[], _T], revert: Callable[[_T], None]) -> None:
        self._apply = apply
        self._revert = revert
        self._lock = threading.Lock()
        self._saved: list[_T] = []  # what apply() returned, while the change is made
        #: handles that hold the change now
        self.users = 0

    def enter(self) -> None:
        """One more handle holds the change: the first makes it."""
        with self._lock:
            if self.users == 0:
                self._saved = [self._apply()]  # (if it raises, no handle holds it)
            self.users += 1

    def leave(self) -> None:
        """A handle gives the change back: the last takes it back."""
        with self._lock:
            if self.users == 0:
                raise RuntimeError("Nested.leave() without a matching enter()")
            self.users -= 1
            if self.users == 0:
                (saved,) = self._saved
                self._saved = []
                self._revert(saved)
