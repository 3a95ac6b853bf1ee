"""Channel records shared by every kind of instrumented channel (asyncio queues, anyio streams).

A channel keeps, in place, exact counts of messages sent and received, the depth high-water mark,
a histogram of time in channel, time producers spent blocked and consumers starved, per-future
edge counts for the flow graph, and bounded logs of recent sends and receives. Nothing here holds
a user item; only its ``repr()`` when message logging was asked for.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from asyncflow import clock as _clock
from asyncflow.instrument import _session
from asyncflow.instrument.futures import InstrumentedCoroutine, _current_tasks, _get_running_loop
from asyncflow.stats import SMALL_BUCKET, SMALL_LIMIT, bucket_of, new_histogram

__all__ = [
    "CHANNEL_LOG_SIZE",
    "ChannelRecord",
    "ChannelStats",
    "Edge",
    "Message",
    "channel_registry",
]

#: recent sends and receives kept per channel
CHANNEL_LOG_SIZE = 100
_MESSAGE_REPR_LIMIT = 200

#: (msg_id, sent at, sending call id, sending future id)
Message = tuple[int, int, int | None, int | None]


class Edge:
    """Messages one future sent into (or took from) one channel, with their time in channel."""

    __slots__ = ("count", "delay_hist", "delay_max", "delay_sum")

    def __init__(self) -> None:
        self.count = 0
        self.delay_sum = 0
        self.delay_max = 0
        self.delay_hist = new_histogram()


class ChannelStats:
    """One session's figures for one channel; replaced when a new profiler starts."""

    __slots__ = (
        "blocked_ns",
        "delay_hist",
        "delay_max",
        "first_ns",
        "last_received_ns",
        "last_sent_ns",
        "max_size",
        "received",
        "received_log",
        "receivers",
        "senders",
        "sent",
        "sent_log",
        "starved_ns",
        "unpaired",
    )

    def __init__(self) -> None:
        self.sent = 0
        self.received = 0
        self.unpaired = 0  # receives whose send was not seen (storage changed behind our back)
        self.max_size = 0
        self.delay_hist = new_histogram()
        self.delay_max = 0
        self.blocked_ns = 0
        self.starved_ns = 0
        self.first_ns = 0
        self.last_sent_ns = 0
        self.last_received_ns = 0
        # future id (or None: not inside a tracked call) -> Edge
        self.senders: dict[int | None, Edge] = {}
        self.receivers: dict[int | None, Edge] = {}
        # (index, msg_id, timestamp, call_id, future_id, message repr)
        self.sent_log: deque[tuple[Any, ...]] = deque(maxlen=CHANNEL_LOG_SIZE)
        # (index, msg_id, timestamp, call_id, future_id, delay, message repr)
        self.received_log: deque[tuple[Any, ...]] = deque(maxlen=CHANNEL_LOG_SIZE)


class ChannelRecord:
    """An instrumented channel: identity, labels, and the current session's figures."""

    __slots__ = (
        "__weakref__",
        "_measure",
        "_target",
        "capacity",
        "closed",
        "id",
        "kind",
        "label",
        "log_messages",
        "stats",
    )

    def __init__(
        self,
        label: str,
        kind: str,
        capacity: float,
        log_messages: bool,
        target: Any,
        measure: Callable[[Any], int],
    ) -> None:
        self.id = next(_channel_ids)
        self.label = label
        self.kind = kind
        #: 0 for a rendezvous stream; ``math.inf`` when unbounded
        self.capacity = capacity
        self.log_messages = log_messages
        # Weak: observing a channel must not keep it (or its items) alive.
        self._target = weakref.ref(target)
        self._measure = measure
        self.closed = False
        self.stats = ChannelStats()

    @property
    def alive(self) -> bool:
        """Whether the channel object still exists."""
        return self._target() is not None

    def size(self) -> int:
        """Messages in the channel now (0 once it is gone)."""
        target = self._target()
        return 0 if target is None else self._measure(target)

    @property
    def channel_type(self) -> str:
        """``bounded[N]`` or ``unbounded``, as hotpath names it."""
        if self.capacity == float("inf"):
            return "unbounded"
        return f"bounded[{int(self.capacity)}]"

    def sent(
        self,
        msg_id: int,
        item: Any,
        at: int | None = None,
        by: tuple[int | None, int | None] | None = None,
    ) -> Message:
        """Record one message entering the channel; returns what its receive is paired with.

        ``at`` and ``by`` say when and by whom, for a send that waited before it was taken.
        """
        st = self.stats
        now = _clock.now_ns() if at is None else at
        call_id, future_id = caller() if by is None else by
        st.sent = sent = st.sent + 1
        if not st.first_ns:
            st.first_ns = now
        st.last_sent_ns = now
        edge = st.senders.get(future_id)
        if edge is None:
            edge = st.senders[future_id] = Edge()
        edge.count += 1
        text = _message_repr(item) if self.log_messages else None
        st.sent_log.append((sent - 1, msg_id, now, call_id, future_id, text))
        return (msg_id, now, call_id, future_id)

    def received(self, msg: Message | None, item: Any, at: int | None = None) -> None:
        """Record one message leaving the channel, paired with its send (None: unpaired)."""
        st = self.stats
        now = _clock.now_ns() if at is None else at
        call_id, future_id = caller()
        st.received = received = st.received + 1
        st.last_received_ns = now
        receiver = st.receivers.get(future_id)
        if receiver is None:
            receiver = st.receivers[future_id] = Edge()
        receiver.count += 1
        if msg is None:
            st.unpaired += 1
            msg_id = delay = None
        else:
            # Edge.delayed(), inlined for the channel and both its edges (one bucket for all)
            msg_id, sent_at, _, sender_id = msg
            delay = now - sent_at
            bucket = SMALL_BUCKET[delay] if 0 <= delay < SMALL_LIMIT else bucket_of(delay)
            st.delay_hist[bucket] += 1
            if delay > st.delay_max:
                st.delay_max = delay
            receiver.delay_sum += delay
            if delay > receiver.delay_max:
                receiver.delay_max = delay
            receiver.delay_hist[bucket] += 1
            sender = st.senders.get(sender_id)
            if sender is not None:
                sender.delay_sum += delay
                if delay > sender.delay_max:
                    sender.delay_max = delay
                sender.delay_hist[bucket] += 1
        text = _message_repr(item) if self.log_messages else None
        st.received_log.append((received - 1, msg_id, now, call_id, future_id, delay, text))

    def depth(self, size: int) -> None:
        """Note the number of messages in the channel after a send."""
        if size > self.stats.max_size:
            self.stats.max_size = size


def caller() -> tuple[int | None, int | None]:
    """(call id, future id) of the tracked call whose task is running now, if any.

    Messages are attributed to the task's own call: the coroutine the task drives, when it is
    tracked (decorated, or whole-program mode).
    """
    loop = _get_running_loop()  # current_task(), inlined: this runs twice per message
    if loop is None:
        return _NOBODY
    task = _current_tasks.get(loop) if _current_tasks is not None else _current_task(loop)
    if task is None:
        return _NOBODY
    coro = task.get_coro()
    if type(coro) is InstrumentedCoroutine:  # not isinstance: an ABC check costs ~0.5 µs
        r = coro._r
        return r.call_id, r.future.id
    return _NOBODY


_NOBODY: tuple[int | None, int | None] = (None, None)
_current_task = asyncio.current_task


def _message_repr(item: Any) -> str:
    try:
        text = repr(item)
    except Exception as exc:
        return f"<repr() failed: {type(exc).__name__}>"
    return text if len(text) <= _MESSAGE_REPR_LIMIT else text[: _MESSAGE_REPR_LIMIT - 1] + "…"


_channel_ids = itertools.count(1)
msg_ids = itertools.count(1)
_lock = threading.Lock()
_registry: list[ChannelRecord] = []


def register(record: ChannelRecord) -> ChannelRecord:
    """Add a channel to the registry the collector reads."""
    with _lock:
        _registry.append(record)
    return record


def channel_registry() -> list[ChannelRecord]:
    """Every channel instrumented so far (a copy), oldest first."""
    with _lock:
        return list(_registry)


def reset_for_session() -> None:
    """Give every channel fresh figures and forget channels that are gone: a new profiler
    starts from zero."""
    with _lock:
        _registry[:] = [r for r in _registry if r.alive]
        for record in _registry:
            record.stats = ChannelStats()


async def timed_wait(coro: Any, record: ChannelRecord, blocked: bool) -> Any:
    """Await ``coro`` (a put on a full channel, or a get on an empty one), timing the wait."""
    start = _clock.now_ns()
    try:
        return await coro
    finally:
        spent = _clock.now_ns() - start
        st = record.stats
        if blocked:
            st.blocked_ns += spent
        else:
            st.starved_ns += spent


def recording() -> bool:
    """Whether a profiler listens now."""
    return _session.active is not None
