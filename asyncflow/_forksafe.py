"""Locks that a forked child finds free: every lock asyncflow makes is renewed after ``fork()``.

Only the forking thread lives on in a child. A lock that another thread (the profiler's, a
worker's) held at the fork stays held for ever there, and the child's next update under it (a
gauge's ``set()``, an executor job's end, a loop's heartbeat) would never return. So, in the
child, each lock is re-initialised in place (``_at_fork_reinit``, as ``threading`` and
``logging`` do for their own): in place, because objects keep references to one another's
locks (a history of gone records keeps its family's module lock).

Two kinds are found without a list kept by hand: module-level locks, by looking through every
``asyncflow.*`` module's globals; and per-object locks, made with :func:`lock` or :func:`rlock`,
which remember their owner weakly (a lock itself cannot be weakly referenced).

asyncflow never forks while it holds one of its locks (only the program forks), so a lock
renewed here is one that no thread of the child holds.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from typing import Any

__all__ = ["lock", "renew", "rlock"]

_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))
#: owner -> the locks made for it; weak keys, so an owner's locks go with it
_owned: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()


def lock(owner: object) -> threading.Lock:
    """A new ``threading.Lock`` for ``owner``, free again in a forked child.

    ``owner`` (the object whose attribute the lock is) must be weakly referenceable.
    """
    made = threading.Lock()
    _owned.setdefault(owner, []).append(made)
    return made


def rlock(owner: object) -> threading.RLock:
    """A new ``threading.RLock`` for ``owner``, free again in a forked child."""
    made = threading.RLock()
    _owned.setdefault(owner, []).append(made)
    return made


def renew() -> None:
    """In a forked child: free every lock asyncflow made, wherever it was held at the fork."""
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "asyncflow" or name.startswith("asyncflow.")):
            continue
        for value in list(vars(module).values()):
            if type(value) in _LOCK_TYPES:
                value._at_fork_reinit()
    for locks in list(_owned.values()):
        for made in locks:
            made._at_fork_reinit()


if hasattr(os, "register_at_fork"):
    # Registered on first import, before any module that makes a lock: the child's other
    # hooks (the profiler's, the endpoint's) run after this one and may take these locks.
    os.register_at_fork(after_in_child=renew)
