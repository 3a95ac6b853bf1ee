"""Recording asyncio queues in place: ``instrument_queue(q)``, and ``instrument_queues()``.

The queue stays the user's object, of its own class: asyncflow sets per-instance ``_put`` and
``_get`` (the overridable hooks ``asyncio.Queue`` designates), and replaces the deques of waiting
putters and getters with deques that time each wait. Items and the item storage are never
wrapped or touched.

A put's ``msg_id`` is its number on the channel; a get is paired with the put of the item it
returns: by position for FIFO queues (the n-th item taken out is the n-th put, once losses are
accounted for), by a stack of numbers for LIFO queues, and by identity for priority queues and
subclasses with their own storage. If the storage is changed behind the queue's back, the
pairing notices it at the next timed get: items that vanished are taken to be the oldest (as
with ``q._queue.clear()``), and items it never saw put are counted as ``unpaired``. The hooks
put into and take from the queue's ``_queue`` of the moment, as asyncio's own do, so a storage
replaced (``q._queue = collections.deque()``) is followed at once.
"""

from __future__ import annotations

import asyncio
import math
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from asyncflow import clock as _clock
from asyncflow import config as _config
from asyncflow.instrumentation import _session
from asyncflow.instrumentation._nested import Nested, NestedHandle
from asyncflow.instrumentation._sites import creation_frame, site_label
from asyncflow.instrumentation.channels import ChannelRecord, ChannelStats, register
from asyncflow.instrumentation.futures import _speedups

__all__ = ["QueueInstrumentation", "instrument_queue", "instrument_queues"]

_Q = TypeVar("_Q", bound="asyncio.Queue[Any]")
_MARK = "_asyncflow_channel"
#: two threads instrumenting one queue at once must register it once
_instrument_lock = threading.Lock()


class _Pairing:
    """Keeps the ``msg_id`` of every item in a LIFO or priority queue, in step with its storage.

    0 stands for an item whose put was not seen.
    """

    __slots__ = ("by_id", "count", "lifo", "stack")

    def __init__(self, lifo: bool) -> None:
        self.lifo = lifo
        self.stack: list[int] = []
        self.by_id: dict[int, deque[int]] = {}
        self.count = 0

    def put(self, item: Any, msg_id: int) -> None:
        if self.lifo:
            self.stack.append(msg_id)
        else:
            self.by_id.setdefault(id(item), deque()).append(msg_id)
            self.count += 1

    def get(self, item: Any, size_before: int, record: ChannelRecord) -> int:
        """The ``msg_id`` of ``item``, just taken out of a storage that held ``size_before``."""
        if (len(self.stack) if self.lifo else self.count) != size_before:
            # changed behind the queue's back: nothing in the storage can be paired any more
            self.stack = [0] * size_before
            self.by_id.clear()
            self.count = 0
            record.forget_pending()
        if self.lifo:
            return self.stack.pop() if self.stack else 0
        msgs = self.by_id.get(id(item))
        if not msgs:
            return 0
        self.count -= 1
        msg_id = msgs.popleft()
        if not msgs:
            del self.by_id[id(item)]
        return msg_id


class _Waiters(deque[Any]):
    """A queue's waiting putters (or getters). Each wait is timed from when it starts to when
    the queue wakes it (room was made, or an item came) or it withdraws (cancelled)."""

    __slots__ = ("blocked", "record", "since")

    def __init__(self, waiting: Iterable[Any], record: ChannelRecord, blocked: bool) -> None:
        super().__init__(waiting)
        self.record = record
        self.blocked = blocked
        self.since: dict[Any, int] = {}
        record.watch_waits(self)

    def ongoing(self, now: int) -> tuple[int, int]:
        """(blocked, starved) time of the waits in progress so far."""
        spent = sum(now - start for start in list(self.since.values()))
        return (spent, 0) if self.blocked else (0, spent)

    def append(self, waiter: Any) -> None:
        super().append(waiter)
        self.since[waiter] = _clock.now_ns()

    def popleft(self) -> Any:
        waiter = super().popleft()
        self._done(waiter)
        return waiter

    def remove(self, waiter: Any) -> None:
        super().remove(waiter)
        self._done(waiter)

    def clear(self) -> None:
        for waiter in list(self):
            self._done(waiter)
        super().clear()

    def _done(self, waiter: Any) -> None:
        start = self.since.pop(waiter, None)
        if start is not None:
            try:
                self.record.waited(self.blocked, start)
            except Exception as err:  # observing never breaks the program
                _session.internal_error("timing a queue wait", err)


def _kind(queue: asyncio.Queue[Any]) -> str:
    cls = type(queue)
    if cls.__module__ == "asyncio.queues":
        return f"asyncio.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def instrument_queue(queue: _Q, *, name: str | None = None, log_messages: bool = False) -> _Q:
    """Record every message through an asyncio queue; returns the very same queue.

    Args:
        queue: an ``asyncio.Queue``, ``PriorityQueue``, ``LifoQueue`` or a subclass.
        name: the channel's label; defaults to the queue's class and id.
        log_messages: keep a truncated ``repr()`` of each timed message in the channel's logs.

    Returns:
        ``queue`` itself. Instrumenting it again changes nothing.

    Raises:
        TypeError: ``queue`` is not an asyncio queue, or an option has the wrong type.
    """
    if not isinstance(queue, asyncio.Queue):
        raise TypeError(
            f"asyncflow.instrument_queue() needs an asyncio.Queue (or PriorityQueue, "
            f"LifoQueue, subclass), got {type(queue).__qualname__}: {queue!r}"
        )
    _config.check_type("instrument_queue", "name", name, str, optional=True)
    _config.check_type("instrument_queue", "log_messages", log_messages, bool)
    if _config.disabled():
        return queue
    capacity = _capacity(queue)
    if capacity is None:
        raise TypeError(
            f"asyncflow.instrument_queue() needs a queue whose maxsize is a number, got "
            f"maxsize={queue.maxsize!r} ({type(queue.maxsize).__qualname__}); asyncio would "
            "fail on its first put: create it as asyncio.Queue(maxsize=<int>)"
        )
    with _instrument_lock:
        existing = _record_of(queue)
        if existing is not None:
            # Instrumented already (e.g. by instrument_queues() under `asyncflow run`): the
            # program's own name and logging choice win over the file:line label.
            if name is not None:
                existing.label = name
            existing.log_messages = existing.log_messages or log_messages
            return queue
        _instrument(queue, name or f"{type(queue).__name__}@{id(queue):x}", log_messages, capacity)
    return queue


def _capacity(queue: asyncio.Queue[Any]) -> float | None:
    """How many items the queue holds (``math.inf``: unbounded); None for a maxsize asyncio
    cannot compare (``asyncio.Queue("x")`` is accepted, and fails at its first put)."""
    maxsize = queue.maxsize
    if isinstance(maxsize, bool) or not isinstance(maxsize, int | float) or maxsize != maxsize:
        return None
    return maxsize if maxsize > 0 else math.inf


def _instrument(
    queue: asyncio.Queue[Any], label: str, log_messages: bool, capacity: float
) -> ChannelRecord:
    """Instrument a queue nobody instrumented yet (the caller holds _instrument_lock)."""
    record = register(
        ChannelRecord(label, _kind(queue), capacity, log_messages, queue, asyncio.Queue.qsize)
    )
    cls = type(queue)
    storage = getattr(queue, "_queue", None)
    plain_storage = cls._put is asyncio.Queue._put and isinstance(storage, deque | list)
    if plain_storage and cls._get is asyncio.Queue._get and isinstance(storage, deque):
        # the record's own weak reference to the queue: no second one per queue
        put, get = _fifo_hooks(record, record._target, storage)
    else:
        lifo = plain_storage and cls._get is asyncio.LifoQueue._get and isinstance(storage, list)
        put, get = _paired_hooks(record, queue, _Pairing(lifo))
    # Set as attributes, never through vars(queue)[...]: a key stored in the instance dict that
    # way turns its shared-key table into a plain one, and on 3.11 every attribute read of the
    # queue then costs about twice as much (+500 ns per put/get pair, measured).
    setattr_ = object.__setattr__
    setattr_(queue, "_put", put)
    setattr_(queue, "_get", get)
    for attr, blocked in (("_putters", True), ("_getters", False)):
        waiting = getattr(queue, attr, None)
        if type(waiting) is deque:
            setattr_(queue, attr, _Waiters(waiting, record, blocked))
    setattr_(queue, _MARK, record)
    return record


def _record_of(queue: asyncio.Queue[Any]) -> ChannelRecord | None:
    record = getattr(queue, _MARK, None)
    return record if isinstance(record, ChannelRecord) else None


def _fifo_hooks(
    record: ChannelRecord, queue: Callable[[], Any], storage: deque[Any]
) -> tuple[Callable[[Any], None], Callable[[], Any]]:
    """``_put``/``_get`` for a plain FIFO queue: the message path asyncflow must keep cheapest.

    Per message, a few integer updates on the channel's figures (reset in place, never
    replaced, so the hooks hold them directly). Only the timed messages go further: their
    receive also checks that the numbering is in step with the storage.

    The storage is the queue's ``_queue`` at each call, as asyncio's own hooks read it: a
    program may replace it (``q._queue = collections.deque()`` empties a queue), and the puts
    then go where ``get()`` looks. The queue is held weakly (its hooks must not keep it alive);
    ``storage`` is used only by a hook kept and called after the queue is gone.
    """
    st = record.stats
    sample_send = record.sample_send

    def _put(item: Any) -> None:
        q = queue()
        current = storage if q is None else q._queue
        current.append(item)  # first: if the storage refuses the item, nothing was sent
        try:  # free in 3.11+ unless something raises; observing never breaks the program
            st.sent = msg_id = st.sent + 1
            size = len(current)
            if size > st.max_size:
                st.max_size = size
            if msg_id >= st.next_send:
                sample_send(msg_id, item)
        except Exception as err:
            _session.internal_error("recording a queue put", err)

    def _get() -> Any:
        msg_id = st.taken + 1
        if msg_id >= st.next_recv:
            return _timed_get()
        q = queue()
        current = storage if q is None else q._queue
        st.taken = msg_id
        return current.popleft()

    def _timed_get() -> Any:
        q = queue()
        current = storage if q is None else q._queue
        try:
            size = len(current)
            if size != st.sent - st.taken:
                _resync(record, st, size)
        except Exception as err:
            _session.internal_error("recording a queue get", err)
        item = current.popleft()
        st.taken = msg_id = st.taken + 1
        if msg_id >= st.next_recv:
            record.sample_receive(msg_id, item, None, True)
        return item

    if _FifoHook is not None:
        # The compiled path: the same steps in C, calling back into sample_send and _timed_get
        # above for the timed messages. The two Python calls were most of what a put/get pair
        # added: 1,850 instructions, 800 in C (callgrind, profiler off, no timed message).
        return (
            _FifoHook("put", queue, storage, st, sample_send),
            _FifoHook("get", queue, storage, st, _timed_get),
        )
    return _put, _get


#: the compiled _put/_get of plain FIFO queues (asyncflow/instrumentation/_speedups.c), where it is
#: built and not turned off (ASYNCFLOW_NO_EXTENSIONS=1); the Python hooks above are the reference
_FifoHook: Any = None if _speedups is None else getattr(_speedups, "FifoHook", None)


def _resync(record: ChannelRecord, st: ChannelStats, size: int) -> None:
    """Bring a FIFO queue's numbering back in step with a storage changed behind its back."""
    outstanding = st.sent - st.taken
    if size > outstanding:  # items whose put was never seen: pair nothing stored now
        st.unpaired += size
        record.forget_pending()
    st.skew += outstanding - size  # vanished items (the oldest) were never received
    st.taken = st.sent - size


def _paired_hooks(
    record: ChannelRecord, queue: asyncio.Queue[Any], pairing: _Pairing
) -> tuple[Callable[[Any], None], Callable[[], Any]]:
    """``_put``/``_get`` for LIFO and priority queues and subclasses with their own storage."""
    original_put: Callable[[Any], None] = queue._put
    original_get: Callable[[], Any] = queue._get
    size: Callable[[], int] = queue.qsize

    def _put(item: Any) -> None:
        original_put(item)
        try:
            pairing.put(item, record.send(item))
            record.depth(size())
        except Exception as err:  # observing never breaks the program
            _session.internal_error("recording a queue put", err)

    def _get() -> Any:
        before = size()
        item = original_get()
        try:
            record.receive(pairing.get(item, before, record), item)
        except Exception as err:
            _session.internal_error("recording a queue get", err)
        return item

    return _put, _get


class QueueInstrumentation(NestedHandle):
    """Handle returned by :func:`instrument_queues`; ``undo()`` (or leaving ``with``) stops
    instrumenting new queues, once every handle in use has been undone (whole-program mode
    nests: a program that calls ``instrument_queues()`` itself under ``asyncflow run`` shares
    the mode ``run`` turned on); queues already instrumented keep recording. Idempotent."""

    __slots__ = ()


def instrument_queues(*, log_messages: bool = False) -> QueueInstrumentation:
    """Whole-program mode for queues: every asyncio queue created from now on is instrumented,
    labelled by where it was created (``file:line``).

    Calls nest: while one handle is in use, another call (the program's own, under
    ``asyncflow run``) shares the same mode, and queues log their messages while any handle in
    use asked for it. New queues are left alone again once every handle is undone.

    Returns:
        A handle whose ``undo()`` stops instrumenting new queues.
    """
    _config.check_type("instrument_queues", "log_messages", log_messages, bool)
    if _config.disabled():
        return QueueInstrumentation(None)
    return QueueInstrumentation(_whole_program, log_messages)


def _hook_queues() -> Callable[..., None]:
    """Instrument every queue created from now on; returns asyncio.Queue's own __init__."""
    original = asyncio.Queue.__init__

    def __init__(self: asyncio.Queue[Any], *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            capacity = _capacity(self)
            if capacity is None:
                return  # a maxsize asyncio cannot use: the program finds out at its first put
            # the line that made it: in a class's __init__ (a Pipeline's queues), that line;
            # past the queue's own constructor chain (a subclass's super().__init__())
            frame = creation_frame(self, sys._getframe(1))
            if frame is None:
                return
            label = site_label(frame)
            with _instrument_lock:
                if _record_of(self) is None:
                    _instrument(self, label, _whole_program.logs > 0, capacity)
        except Exception as err:
            _session.internal_error("instrumenting a new queue", err)

    asyncio.Queue.__init__ = __init__  # type: ignore[method-assign]
    return original


def _unhook_queues(original: Callable[..., None]) -> None:
    asyncio.Queue.__init__ = original  # type: ignore[method-assign]


#: whole-program mode: on while any handle of instrument_queues() is not undone
_whole_program: Nested[Callable[..., None]] = Nested(_hook_queues, _unhook_queues)
