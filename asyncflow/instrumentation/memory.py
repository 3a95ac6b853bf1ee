"""Recording anyio memory object streams: ``instrument_memory_stream(send, receive)``.

The streams the user holds are left as they are. asyncflow instruments the state they (and all
their clones) share: its buffer becomes a ``deque`` subclass that pairs messages in FIFO order,
and its maps of waiting senders and receivers note when a blocked send is taken, when it is
withdrawn (a cancelled or broken send is never counted), and when an item is handed straight to
a waiting receiver. Such a hand-off is sent by the sender's call when it happens, and received
by the consumer's call when its ``receive()`` wakes up and takes the item out of its slot (anyio
then takes its entry out of the map once more, in the consumer's task): the receive is the
consumer's, and the time in channel is the time the item waited for it. Waits are timed there
too. The waiting maps are
wrappers over the real ones rather than subclasses, so that no anyio version can take an entry
out by a path asyncflow does not see (tested on the lowest and the newest anyio allowed).
"""

from __future__ import annotations

import sys
import threading
import typing
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, MutableMapping
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from asyncflow import clock as _clock
from asyncflow import config as _config
from asyncflow.instrumentation import _imports, _session
from asyncflow.instrumentation._nested import Nested, NestedHandle
from asyncflow.instrumentation._sites import site_label
from asyncflow.instrumentation.channels import ChannelRecord, caller, register

if TYPE_CHECKING:  # anyio is imported on first use: `import asyncflow` stays light
    from anyio.streams.memory import (
        MemoryObjectReceiveStream,
        MemoryObjectSendStream,
        _MemoryObjectStreamState,
    )

__all__ = ["MemoryStreamInstrumentation", "instrument_memory_stream", "instrument_memory_streams"]

_S = TypeVar("_S", bound="MemoryObjectSendStream[Any]")
_R = TypeVar("_R", bound="MemoryObjectReceiveStream[Any]")
#: two threads instrumenting one stream at once must register it once
_instrument_lock = threading.Lock()


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


class _WaitingMap(MutableMapping[Any, Any]):
    """A map of waiting senders or receivers that sees every way an entry leaves it.

    anyio keeps the tasks waiting on a stream in an ``OrderedDict`` and, depending on its
    version, takes entries out with ``popitem``, ``pop``, ``del`` or ``clear``. A subclass of
    ``OrderedDict`` only sees the methods it overrides (4.12's ``pop`` went past one), so this
    wraps the real map instead: every mutator is one of the methods below, and each entry that
    leaves is either *taken* (``popitem``: a receive took a blocked send, or a send handed its
    item to a waiting receiver) or *withdrawn* (anything else: cancelled, closed).
    """

    __slots__ = ("__weakref__", "_map", "record", "since")

    def __init__(self, items: Any, record: ChannelRecord) -> None:
        self._map: OrderedDict[Any, Any] = OrderedDict()
        self.record = record
        #: key -> what was noted when it started waiting
        self.since: dict[Any, Any] = {}
        for key, value in dict(items).items():
            self._map[key] = self._wrap(key, value, adopted=True)
            self.since[key] = self._started()
        record.watch_waits(self)

    def ongoing(self, now: int) -> tuple[int, int]:
        """(blocked, starved) time of the waits in progress so far."""
        raise NotImplementedError

    # -- reads: straight to the real map ---------------------------------------------------------

    def __getitem__(self, key: Any) -> Any:
        return self._map[key]

    def __contains__(self, key: object) -> bool:
        return key in self._map

    def __iter__(self) -> Iterator[Any]:
        return iter(self._map)

    def __len__(self) -> int:
        return len(self._map)

    def __bool__(self) -> bool:
        return bool(self._map)

    def __repr__(self) -> str:
        return repr(self._map)

    # -- every mutator -----------------------------------------------------------------------

    def __setitem__(self, key: Any, value: Any) -> None:
        self._map[key] = self._wrap(key, value, adopted=False)
        try:
            self.since[key] = self._started()
        except Exception as err:  # observing never breaks the program
            _session.internal_error("timing a memory stream wait", err)

    def __delitem__(self, key: Any) -> None:
        value = self._map.pop(key)
        self._left(key, value, taken=False)

    def pop(self, key: Any, *default: Any) -> Any:
        if key not in self._map:
            if default:
                return default[0]
            raise KeyError(key)
        value = self._map.pop(key)
        self._left(key, value, taken=False)
        return value

    def popitem(self, last: bool = True) -> tuple[Any, Any]:
        key, value = self._map.popitem(last)
        self._left(key, value, taken=True)
        return key, value

    def clear(self) -> None:
        items = list(self._map.items())
        self._map.clear()
        for key, value in items:
            self._left(key, value, taken=False)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self._map:
            self[key] = default
        return self._map[key]

    def move_to_end(self, key: Any, last: bool = True) -> None:
        self._map.move_to_end(key, last)

    def _left(self, key: Any, value: Any, taken: bool) -> None:
        started = self.since.pop(key, None)
        if started is not None:
            try:
                self._ended(started, value, taken)
            except Exception as err:  # observing never breaks the program
                _session.internal_error("timing a memory stream wait", err)

    # -- what each kind of map notes ---------------------------------------------------------

    def _wrap(self, key: Any, value: Any, adopted: bool) -> Any:
        """What the map holds for ``value``; ``adopted``: it was waiting before instrumenting."""
        return value

    def _started(self) -> Any:
        return _clock.now_ns()

    def _ended(self, started: Any, value: Any, taken: bool) -> None:
        raise NotImplementedError


class _Senders(_WaitingMap):
    """Blocked senders: a send counts when a receiver takes it, not when it starts waiting."""

    __slots__ = ("buffer",)

    def __init__(self, items: Any, record: ChannelRecord, buffer: _Buffer) -> None:
        self.buffer = buffer
        super().__init__(items, record)

    def _started(self) -> tuple[int, tuple[int | None, int | None]]:
        return _clock.now_ns(), caller()  # when, and which call sends

    def ongoing(self, now: int) -> tuple[int, int]:
        return sum(now - start for start, _ in list(self.since.values())), 0

    def _ended(self, started: Any, item: Any, taken: bool) -> None:
        start, sender = started
        self.record.waited(True, start)
        if taken:  # moved into the buffer by a receive: counted now, as of when it was sent
            self.buffer.moving = self.record.send(item, at=start, by=sender)


class _Receiver:
    """Stands in for a waiting receiver in the shared map, to see items handed to it directly."""

    __slots__ = ("_key", "_real", "_receivers", "_waiter")

    def __init__(self, real: Any, receivers: _Receivers, key: Any, waiter: Any) -> None:
        self._real = real
        self._receivers = receivers
        self._key = key
        #: caller() of the task that waits, or _ANYONE when it was waiting before instrumenting
        self._waiter = waiter

    @property
    def task_info(self) -> Any:
        return self._real.task_info

    @property
    def item(self) -> Any:
        return self._real.item

    @item.setter
    def item(self, item: Any) -> None:
        self._real.item = item
        try:  # a hand-off, in the sender's task: sent now, received when the consumer wakes
            receivers = self._receivers
            msg_id = receivers.record.send(item)
            receivers.handed[self._key] = (msg_id, self._real, self._waiter)
        except Exception as err:
            _session.internal_error("recording a memory stream hand-off", err)


#: the waiter of a receiver that was waiting before the stream was instrumented: any task's
#: pop of its entry after the hand-off is taken to be its own
_ANYONE = object()


class _Receivers(_WaitingMap):
    """Waiting receivers: times how long consumers starve, and receives what was handed over.

    ``handed``: event -> (msg_id, anyio's receiver, waiter) of each item handed to a receiver
    that has not woken up yet. anyio's ``receive()``, once woken, takes its event out of the map
    again (``pop(event, None)``, a no-op for anyio since the sender took it already), in the
    consumer's own task, just before it returns the item: that is when the item is received.
    Another task's pop of the same event (a ``close()`` of the receive stream meanwhile) is not
    the consumer's and is passed over.
    """

    __slots__ = ("handed",)

    def __init__(self, items: Any, record: ChannelRecord) -> None:
        self.handed: dict[Any, tuple[int, Any, Any]] = {}
        super().__init__(items, record)

    def _wrap(self, key: Any, receiver: Any, adopted: bool) -> Any:
        if isinstance(receiver, _Receiver):
            return receiver
        return _Receiver(receiver, self, key, _ANYONE if adopted else caller())

    def pop(self, key: Any, *default: Any) -> Any:
        if self.handed and key not in self._map:
            self._received(key)
        return super().pop(key, *default)

    def _received(self, key: Any) -> None:
        try:
            handed = self.handed.get(key)
            if handed is None:
                return
            msg_id, receiver, waiter = handed
            if waiter is not _ANYONE and caller() != waiter:
                return  # not the consumer's own task: it takes the item when it wakes
            del self.handed[key]
            self.record.receive(msg_id, receiver.item)
        except Exception as err:  # observing never breaks the program
            _session.internal_error("recording a memory stream receive", err)

    def ongoing(self, now: int) -> tuple[int, int]:
        return 0, sum(now - start for start in list(self.since.values()))

    def _ended(self, started: Any, receiver: Any, taken: bool) -> None:
        self.record.waited(False, started)


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
        Instrumenting the stream again changes nothing, but for a ``name`` given then (the
        channel is relabelled) and ``log_messages=True`` (turned on).

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
    if _config.disabled():
        return send, receive
    _instrument_state(state, name, log_messages)
    return send, receive


def _instrument_state(
    state: _MemoryObjectStreamState[Any],
    name: str | None,
    log_messages: bool,
    site: str | None = None,
) -> None:
    """Instrument a stream's shared state; ``site``: the label of a stream whole-program mode
    found, which never replaces a name given."""
    with _instrument_lock:
        existing = state.buffer
        if isinstance(existing, _Buffer):
            # Instrumented already: the program's own name and logging choice win, as for
            # queues and locks.
            if name is not None:
                existing.record.label = name
            existing.record.log_messages = existing.record.log_messages or log_messages
            return
        record = register(
            _StreamRecord(
                name or site or f"memory-stream@{id(state):x}",
                "anyio.MemoryObjectStream",
                state.max_buffer_size,
                log_messages,
                state,
                _size,
            )
        )
        buffer = _Buffer(state.buffer, record)
        # Not OrderedDicts, but every method anyio calls on them (see _WaitingMap).
        state.waiting_senders = _Senders(state.waiting_senders, record, buffer)  # type: ignore[assignment]
        state.waiting_receivers = _Receivers(state.waiting_receivers, record)  # type: ignore[assignment]
        state.buffer = buffer  # last: what the check above reads


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

    def lost_count(self) -> int:
        """Also the messages left in the buffer once every receive side is closed."""
        state = self._target()
        if state is not None and state.open_receive_channels == 0:
            return len(state.buffer)
        return super().lost_count()


class MemoryStreamInstrumentation(NestedHandle):
    """Handle returned by :func:`instrument_memory_streams`; ``undo()`` (or leaving ``with``)
    stops instrumenting new streams once every handle in use has been undone; streams
    instrumented already keep recording. Idempotent."""

    __slots__ = ()


def instrument_memory_streams(*, log_messages: bool = False) -> MemoryStreamInstrumentation:
    """Whole-program mode for anyio memory object streams: every stream pair created from now
    on (``anyio.create_memory_object_stream()``) is instrumented, labelled by where it was
    created (``file:line``), as :func:`~asyncflow.instrumentation.queues.instrument_queues`
    does for queues. anyio is not imported for it: the hook waits for the program's import.

    Args:
        log_messages: keep a truncated ``repr()`` of each message in the channels' logs.

    Returns:
        A handle whose ``undo()`` stops instrumenting new streams (calls nest).
    """
    _config.check_type("instrument_memory_streams", "log_messages", log_messages, bool)
    if _config.disabled():
        return MemoryStreamInstrumentation(None)
    return MemoryStreamInstrumentation(_whole_program, log_messages)


#: the module that defines ``create_memory_object_stream`` (anyio 4.x)
_STREAMS_MODULE = "anyio._core._streams"
#: what made a stream on the way from the program's line: a subscripted generic's __call__
_TYPING_FILE = typing.__file__


def _hook_creation() -> Callable[[], None]:
    """Hook ``create_memory_object_stream`` once anyio's streams module is imported; returns
    what takes the hook (or the wait for the import) back."""
    undo: list[Callable[[], None]] = []

    def hooked(module: ModuleType) -> None:
        cls = module.create_memory_object_stream
        original = cls.__dict__["__new__"]
        make = original.__func__ if isinstance(original, staticmethod) else original

        def __new__(cls: Any, *args: Any, **kwargs: Any) -> Any:
            pair = make(cls, *args, **kwargs)
            try:
                frame: FrameType | None = sys._getframe(1)
                while frame is not None and frame.f_code.co_filename == _TYPING_FILE:
                    frame = frame.f_back  # create_memory_object_stream[int](...)
                site = site_label(frame) if frame is not None else None
                _instrument_state(pair[0]._state, None, _whole_program.logs > 0, site)
            except Exception as err:  # observing never breaks the program
                _session.internal_error("instrumenting a new memory stream", err)
            return pair

        cls.__new__ = staticmethod(__new__)

        def restore() -> None:
            if (
                cls.__dict__.get("__new__") is not None
                and cls.__dict__["__new__"].__func__ is __new__
            ):
                cls.__new__ = original

        undo.append(restore)

    cancel = _imports.after_import(_STREAMS_MODULE, hooked)

    def revert() -> None:
        cancel()
        while undo:
            undo.pop()()

    return revert


def _unhook_creation(revert: Callable[[], None]) -> None:
    revert()


#: whole-program mode: on while any handle of instrument_memory_streams() is not undone
_whole_program: Nested[Callable[[], None]] = Nested(_hook_creation, _unhook_creation)
