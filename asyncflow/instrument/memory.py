"""Recording anyio memory object streams: ``instrument_memory_stream(send, receive)``.

The streams the user holds are left as they are. asyncflow instruments the state they (and all
their clones) share: its buffer becomes a ``deque`` subclass that pairs messages in FIFO order,
and its maps of waiting senders and receivers note when a blocked send is taken, when it is
withdrawn (a cancelled or broken send is never counted), and when an item is handed straight to
a waiting receiver (a rendezvous, delay 0). Waits are timed there too.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Any, TypeVar

from asyncflow import clock as _clock
from asyncflow import config as _config
from asyncflow.instrument import _session
from asyncflow.instrument.channels import ChannelRecord, caller, register

if TYPE_CHECKING:  # anyio is imported on first use: `import asyncflow` stays light
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

__all__ = ["instrument_memory_stream"]

_S = TypeVar("_S", bound="MemoryObjectSendStream[Any]")
_R = TypeVar("_R", bound="MemoryObjectReceiveStream[Any]")


class _Buffer(deque[Any]):
    """The shared buffer: every item in it has its ``msg_id`` beside it (0: put not seen)."""

    def __init__(self, items: Any, record: ChannelRecord) -> None:
        super().__init__(items)
        self.record = record
        self.msgs: deque[int] = deque(0 for _ in items)
        self.moving = 0  # the msg_id of a blocked send being moved in by a receive

    def append(self, item: Any) -> None:
        super().append(item)
        msg_id, self.moving = self.moving, 0
        try:
            if not msg_id:  # a fresh send (a blocked one moved in by a receive is not:
                msg_id = self.record.send(item)  # it leaves again at once)
                self.record.depth(len(self))
            self.msgs.append(msg_id)
        except Exception as err:  # observing never breaks the program
            _session.internal_error("recording a memory stream send", err)

    def popleft(self) -> Any:
        item = super().popleft()
        try:
            if len(self.msgs) != len(self) + 1:  # changed behind our back: start afresh
                self.msgs = deque(0 for _ in self)
                self.record.forget_pending()
                msg_id = 0
            else:
                msg_id = self.msgs.popleft()
            self.record.receive(msg_id, item)
        except Exception as err:
            _session.internal_error("recording a memory stream receive", err)
        return item


class _Senders(OrderedDict[Any, Any]):
    """Blocked senders: a send counts when a receiver takes it, not when it starts waiting."""

    def __init__(self, items: Any, record: ChannelRecord, buffer: _Buffer) -> None:
        super().__init__(items)
        self.record = record
        self.buffer = buffer
        # event -> (when the send started waiting, the sending call)
        self.since: dict[Any, tuple[int, tuple[int | None, int | None]]] = {}

    def __setitem__(self, event: Any, item: Any) -> None:
        super().__setitem__(event, item)
        self.since[event] = (_clock.now_ns(), caller())

    def popitem(self, last: bool = True) -> tuple[Any, Any]:
        event, item = super().popitem(last)
        started = self.since.pop(event, None)
        if started is not None:
            try:
                start, sender = started
                self.record.waited(True, start)
                self.buffer.moving = self.record.send(item, at=start, by=sender)
            except Exception as err:
                _session.internal_error("recording a memory stream send", err)
        return event, item

    def __delitem__(self, event: Any) -> None:
        super().__delitem__(event)  # withdrawn: cancelled, or the stream broke; never sent
        started = self.since.pop(event, None)
        if started is not None:
            self.record.waited(True, started[0])


class _Receiver:
    """Stands in for a waiting receiver in the shared map, to see items handed to it directly."""

    __slots__ = ("_real", "_record")

    def __init__(self, real: Any, record: ChannelRecord) -> None:
        self._real = real
        self._record = record

    @property
    def task_info(self) -> Any:
        return self._real.task_info

    @property
    def item(self) -> Any:
        return self._real.item

    @item.setter
    def item(self, item: Any) -> None:
        self._real.item = item
        try:  # a rendezvous: sent and received at the same instant
            now = _clock.now_ns()
            self._record.receive(self._record.send(item, at=now), item, at=now)
        except Exception as err:
            _session.internal_error("recording a memory stream hand-off", err)


class _Receivers(OrderedDict[Any, Any]):
    """Waiting receivers: times how long consumers starve."""

    def __init__(self, items: Any, record: ChannelRecord) -> None:
        super().__init__(items)
        self.record = record
        self.since: dict[Any, int] = {}

    def __setitem__(self, event: Any, receiver: Any) -> None:
        super().__setitem__(event, _Receiver(receiver, self.record))
        self.since[event] = _clock.now_ns()

    def _starved(self, event: Any) -> None:
        start = self.since.pop(event, None)
        if start is not None:
            self.record.waited(False, start)

    def popitem(self, last: bool = True) -> tuple[Any, Any]:
        event, receiver = super().popitem(last)
        self._starved(event)
        return event, receiver

    def pop(self, event: Any, *default: Any) -> Any:
        self._starved(event)
        return super().pop(event, *default)

    def clear(self) -> None:
        for event in list(self.since):
            self._starved(event)
        super().clear()


def _size(state: Any) -> int:
    return len(state.buffer)  # as anyio's own statistics().current_buffer_used


def instrument_memory_stream(
    send: _S, receive: _R, *, name: str | None = None, log_messages: bool = False
) -> tuple[_S, _R]:
    """Record every message through an anyio memory object stream pair.

    Args:
        send: the send side from ``anyio.create_memory_object_stream()``.
        receive: its receive side (the same stream).
        name: the channel's label.
        log_messages: keep a truncated ``repr()`` of each message in the channel's logs.

    Returns:
        ``(send, receive)``, the very same objects; their clones share the channel's record.

    Raises:
        TypeError: the arguments are not the two sides of one memory object stream.
    """
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

    if not isinstance(send, MemoryObjectSendStream) or not isinstance(
        receive, MemoryObjectReceiveStream
    ):
        raise TypeError(
            "asyncflow.instrument_memory_stream() needs the (send, receive) pair from "
            f"anyio.create_memory_object_stream(), got {type(send).__qualname__} and "
            f"{type(receive).__qualname__}"
        )
    state = send._state
    if receive._state is not state:
        raise TypeError("instrument_memory_stream(): send and receive belong to different streams")
    _config.check_type("instrument_memory_stream", "name", name, str, optional=True)
    _config.check_type("instrument_memory_stream", "log_messages", log_messages, bool)
    if _config.disabled() or isinstance(state.buffer, _Buffer):
        return send, receive
    record = register(
        _StreamRecord(
            name or f"memory-stream@{id(state):x}",
            "anyio.MemoryObjectStream",
            state.max_buffer_size,
            log_messages,
            state,
            _size,
        )
    )
    buffer = _Buffer(state.buffer, record)
    state.buffer = buffer
    state.waiting_senders = _Senders(state.waiting_senders, record, buffer)
    state.waiting_receivers = _Receivers(state.waiting_receivers, record)
    return send, receive


class _StreamRecord(ChannelRecord):
    """A memory stream's record: closed once every send or every receive side is closed."""

    __slots__ = ()

    @property
    def alive(self) -> bool:
        state = self._target()
        if state is None:
            return False
        if state.open_send_channels == 0 or state.open_receive_channels == 0:
            self.closed = True
        return True
