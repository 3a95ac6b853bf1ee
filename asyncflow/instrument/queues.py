"""Recording asyncio queues in place: ``instrument_queue(q)``, and ``instrument_queues()``.

The queue stays the user's object, of its own class: asyncflow sets per-instance ``_put``/``_get``
(the overridable hooks ``asyncio.Queue`` designates) and ``put``/``get`` (to time waits on a full
or empty queue). Items and the internal storage are never wrapped or touched. Each put gets a
``msg_id``; each get is paired with the put of the item it returns: by position for FIFO and LIFO
queues, by identity for priority queues and subclasses with their own storage. If the storage is
changed behind the queue's back (``q._queue.clear()``), the pairing notices the mismatch, starts
afresh, and counts the receives it cannot pair as ``unpaired``.
"""

from __future__ import annotations

import asyncio
import math
import sys
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from asyncflow import config as _config
from asyncflow.instrument import _session
from asyncflow.instrument.channels import (
    ChannelRecord,
    Message,
    msg_ids,
    register,
    timed_wait,
)

__all__ = ["QueueInstrumentation", "instrument_queue", "instrument_queues"]

_Q = TypeVar("_Q", bound="asyncio.Queue[Any]")
_MARK = "_asyncflow_channel"


class _Pairing:
    """Keeps one message record per item in the queue, in step with the queue's storage."""

    __slots__ = ("by_id", "kind", "order", "storage")

    def __init__(self, queue: asyncio.Queue[Any]) -> None:
        self.storage: Any = getattr(queue, "_queue", None)
        cls = type(queue)
        if cls._get is asyncio.Queue._get and isinstance(self.storage, deque):
            self.kind = "fifo"
        elif cls._get is asyncio.LifoQueue._get and isinstance(self.storage, list):
            self.kind = "lifo"
        else:
            self.kind = "identity"
        self.order: deque[Message] = deque()
        self.by_id: dict[int, deque[Message]] = {}

    def _count(self) -> int:
        if self.kind == "identity":
            return sum(len(d) for d in self.by_id.values())
        return len(self.order)

    def put(self, item: Any, msg: Message) -> None:
        if self.kind == "identity":
            self.by_id.setdefault(id(item), deque()).append(msg)
        else:
            self.order.append(msg)

    def in_step(self, size: int) -> bool:
        """Whether every item in storage has exactly one record; if not, start afresh."""
        if self._count() == size:
            return True
        self.order.clear()
        self.by_id.clear()
        return False

    def get(self, item: Any) -> Message | None:
        if self.kind == "fifo":
            return self.order.popleft() if self.order else None
        if self.kind == "lifo":
            return self.order.pop() if self.order else None
        msgs = self.by_id.get(id(item))
        if not msgs:
            return None
        msg = msgs.popleft()
        if not msgs:
            del self.by_id[id(item)]
        return msg


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
        log_messages: keep a truncated ``repr()`` of each message in the channel's logs.

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
    existing: ChannelRecord | None = vars(queue).get(_MARK)
    if existing is not None:
        # Instrumented already (e.g. by instrument_queues() under `asyncflow run`): the
        # program's own name and logging choice win over the file:line label.
        if name is not None:
            existing.label = name
        existing.log_messages = existing.log_messages or log_messages
        return queue
    _instrument(queue, name or f"{type(queue).__name__}@{id(queue):x}", log_messages)
    return queue


def _instrument(queue: asyncio.Queue[Any], label: str, log_messages: bool) -> ChannelRecord:
    maxsize = queue.maxsize
    record = register(
        ChannelRecord(
            label,
            _kind(queue),
            maxsize if maxsize > 0 else math.inf,
            log_messages,
            queue,
            asyncio.Queue.qsize,
        )
    )
    pairing = _Pairing(queue)
    original_put: Callable[[Any], None] = queue._put
    original_get: Callable[[], Any] = queue._get
    put_coro = queue.put
    get_coro = queue.get
    size: Callable[[], int] = queue.qsize
    storage = pairing.storage
    if pairing.kind != "identity":
        size = storage.__len__  # a deque's or list's len(): a third of qsize()'s cost
    order = pairing.order
    in_order = pairing.kind != "identity"
    fifo = pairing.kind == "fifo"
    sent = record.sent
    received = record.received
    stats_of = record  # stats are replaced per session: read them through the record

    def _put(item: Any) -> None:
        original_put(item)  # first: if the storage refuses the item, nothing was sent
        if _session.active is None:
            return
        try:
            msg = sent(next(msg_ids), item)
            if in_order:
                order.append(msg)
            else:
                pairing.put(item, msg)
            n = size()
            st = stats_of.stats
            if n > st.max_size:
                st.max_size = n
        except Exception as err:  # observing never breaks the program
            _session.internal_error("recording a queue put", err)

    def _get() -> Any:
        before = size()
        item = original_get()
        if _session.active is None:
            return item
        try:
            msg: Message | None
            if in_order and len(order) == before:  # in step with the storage: the fast path
                msg = order.popleft() if fifo else order.pop()
            else:
                msg = pairing.get(item) if pairing.in_step(before) else None
            received(msg, item)
        except Exception as err:
            _session.internal_error("recording a queue get", err)
        return item

    # Plain functions returning the original coroutine: when the queue will not make the caller
    # wait, nothing is added; otherwise the wait is timed around the very same coroutine.
    def put(item: Any) -> Any:
        if _session.active is not None and queue.full():
            return timed_wait(put_coro(item), record, blocked=True)
        return put_coro(item)

    def get() -> Any:
        if _session.active is not None and queue.empty():
            return timed_wait(get_coro(), record, blocked=False)
        return get_coro()

    state = vars(queue)
    state["_put"] = _put
    state["_get"] = _get
    state["put"] = put
    state["get"] = get
    state[_MARK] = record
    return record


class QueueInstrumentation:
    """Handle returned by :func:`instrument_queues`; ``undo()`` (or leaving ``with``) restores."""

    __slots__ = ("_originals",)

    def __init__(self, originals: dict[type[Any], Any]) -> None:
        self._originals = originals

    @property
    def active(self) -> bool:
        """Whether queues created now are instrumented through this handle."""
        return bool(self._originals)

    def undo(self) -> None:
        """Stop instrumenting new queues; queues already instrumented keep recording."""
        global _patched
        originals, self._originals = self._originals, {}
        for cls, init in originals.items():
            cls.__init__ = init
        if originals:
            _patched = False

    def __enter__(self) -> QueueInstrumentation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.undo()


_patched = False


def instrument_queues(*, log_messages: bool = False) -> QueueInstrumentation:
    """Whole-program mode for queues: every asyncio queue created from now on is instrumented,
    labelled by where it was created (``file:line``).

    Returns:
        A handle whose ``undo()`` stops instrumenting new queues.

    Raises:
        RuntimeError: whole-program queue mode is already on.
    """
    global _patched
    _config.check_type("instrument_queues", "log_messages", log_messages, bool)
    if _config.disabled():
        return QueueInstrumentation({})
    if _patched:
        raise RuntimeError("asyncflow.instrument_queues() is already active; undo() it first")
    original = asyncio.Queue.__init__

    def __init__(self: asyncio.Queue[Any], *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            frame = sys._getframe(1)
            while frame.f_code.co_filename == __file__ or frame.f_code.co_name == "__init__":
                if frame.f_back is None:
                    break
                frame = frame.f_back
            label = f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}"
            if _MARK not in vars(self):
                _instrument(self, label, log_messages)
        except Exception as err:
            _session.internal_error("instrumenting a new queue", err)

    asyncio.Queue.__init__ = __init__  # type: ignore[method-assign]
    _patched = True
    return QueueInstrumentation({asyncio.Queue: original})
