"""The event loops asyncflow instruments: loops that tracked calls ran on, or that track tasks.

Recorders call :func:`see` at most once per call (on its first poll), and only pay a comparison
when the loop is the one seen last. Records hold their loop weakly: a loop that is garbage
collected drops out of the registry, so asyncflow never keeps a closed loop alive.

The loop monitor (cold path) asks to hear of each loop as soon as it is registered, or as soon
as its thread is known, through :data:`on_register`: it then starts watching the loop at once,
so that a block at the very start of a loop is measured whole and its stack can be read.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import weakref
from collections.abc import Callable
from types import CodeType, FrameType

from asyncflow.instrumentation import _session

__all__ = ["LoopRecord", "in_compiled_loop", "loop_registry", "on_register", "see"]

_ids = itertools.count(1)
_lock = threading.RLock()  # a loop may die (and be forgotten) inside see()
_by_key: dict[int, LoopRecord] = {}

#: ``id()`` of the loop seen last, so that seeing it again costs one comparison; 0 for none.
#: Cleared when that loop dies, before its id can be reused by another object.
last_key = 0

#: Called with a record when its loop is registered, and again when the loop's thread becomes
#: known (its first tracked poll on that thread); set by the loop monitor while a profiler runs.
#: Called outside the registry's lock, on the registering thread; its errors are counted.
on_register: Callable[[LoopRecord], None] | None = None


class LoopRecord:
    """One instrumented event loop: a weak reference to it, and the thread that runs it."""

    __slots__ = ("id", "label", "loop", "thread", "thread_name")

    def __init__(self, loop: asyncio.AbstractEventLoop, key: int) -> None:
        self.id = next(_ids)
        self.loop = weakref.ref(loop, lambda _: _forget(key))
        # a loop that is not a class of its own (a trio run) names itself
        own = getattr(loop, "_asyncflow_label", None)
        self.label = own or f"{type(loop).__module__}.{type(loop).__qualname__}"
        self.thread = 0
        self.thread_name = ""
        self.on_thread()

    def on_thread(self) -> None:
        """Note the calling thread as the loop's (call it from code running on the loop)."""
        thread = threading.current_thread()
        self.thread = thread.ident or 0
        self.thread_name = thread.name


def see(loop: asyncio.AbstractEventLoop, on_its_thread: bool = True) -> LoopRecord:
    """Register ``loop`` (idempotent); ``on_its_thread`` says the caller runs on the loop.

    A loop registered from elsewhere (``instrument_tasks(loop=...)`` before it runs) is not
    made the loop seen last, so that its first tracked poll comes back here and records the
    loop's thread.
    """
    global last_key
    key = id(loop)
    with _lock:
        record = _by_key.get(key)
        news = True
        if record is None or record.loop() is not loop:
            record = _by_key[key] = LoopRecord(loop, key)
            if not on_its_thread:
                record.thread, record.thread_name = 0, ""
        elif on_its_thread and not record.thread:
            record.on_thread()
        else:
            news = False
        if on_its_thread:
            last_key = key
    hook = on_register
    if news and hook is not None:
        try:
            hook(record)
        except Exception as exc:  # observing never breaks the program
            _session.internal_error("watching a new event loop", exc)
    return record


def _forget(key: int) -> None:
    global last_key
    with _lock:
        record = _by_key.get(key)
        if record is not None and record.loop() is None:
            del _by_key[key]
        if last_key == key:
            last_key = 0


def loop_registry() -> list[LoopRecord]:
    """The instrumented loops still alive, oldest first (a copy)."""
    with _lock:
        return sorted(_by_key.values(), key=lambda r: r.id)


#: thread id -> (code, instruction offset) of the Python frame that called a compiled loop's
#: run (uvloop's ``run_forever``), while that loop runs there: set by whole-program mode
#: (``every_loop``), which hears of it through ``asyncio.events._set_running_loop``
_compiled_runs: dict[int, tuple[CodeType, int]] = {}


def entered_compiled_loop(thread: int, caller: FrameType | None) -> None:
    """A compiled loop starts running on ``thread``, called from ``caller`` (None: it stops)."""
    if caller is None:
        _compiled_runs.pop(thread, None)
    else:
        _compiled_runs[thread] = (caller.f_code, caller.f_lasti)


def in_compiled_loop(top: FrameType, thread: int) -> bool:
    """Whether ``top``, the innermost frame of ``thread``, is the frame that called a compiled
    loop's run, still in that call: no Python code of the program (nor any callback) runs on
    the thread, the loop is in its own compiled code (waiting for I/O, the CPU or the GIL).
    uvloop has no frame of its own there, unlike asyncio's ``_run_once`` and selector."""
    site = _compiled_runs.get(thread)
    return site is not None and top.f_code is site[0] and top.f_lasti == site[1]
