"""Recording async iterators and generators: ``@stream`` and ``stream(async_iterable)``.

A stream record stands for a definition: a decorated async generator function, or the code (or
type) of the iterables wrapped with the same name. Each iteration of it is an instance with a
state (``active``, ``exhausted``, ``closed``, ``cancelled``, ``failed``). Per item, asyncflow
times the wait inside ``__anext__`` (how long the consumer waited for the producer) and the time
the consumer spent between items, and keeps a bounded log of recent items.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import threading
import types
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any, Generic, ParamSpec, TypeVar, overload

from asyncflow import clock as _clock
from asyncflow import config as _config
from asyncflow.instrument import _session
from asyncflow.instrument.channels import _message_repr
from asyncflow.instrument.futures import _normalize_throw
from asyncflow.stats import SMALL_BUCKET, SMALL_LIMIT, bucket_of, new_histogram

__all__ = ["InstrumentedAsyncIterator", "StreamRecord", "stream", "stream_registry"]

_P = ParamSpec("_P")
_T = TypeVar("_T")

ACTIVE = "active"
EXHAUSTED = "exhausted"
CLOSED = "closed"
CANCELLED = "cancelled"
FAILED = "failed"
STATES = (ACTIVE, EXHAUSTED, CLOSED, CANCELLED, FAILED)
STREAM_LOG_SIZE = 100


class StreamStats:
    """One session's figures for one stream definition."""

    __slots__ = ("between_ns", "instances", "items", "log", "wait_hist", "wait_max", "wait_ns")

    def __init__(self) -> None:
        self.items = 0
        self.wait_ns = 0
        self.wait_max = 0
        self.between_ns = 0
        self.wait_hist = new_histogram()
        self.instances = dict.fromkeys(STATES, 0)
        # (index, timestamp, wait ns, item repr)
        self.log: deque[tuple[int, int, int, str | None]] = deque(maxlen=STREAM_LOG_SIZE)


class StreamRecord:
    """A tracked stream definition."""

    __slots__ = ("file", "id", "label", "line", "log_items", "source", "stats")

    def __init__(self, label: str, source: str, file: str, line: int, log_items: bool) -> None:
        self.id = next(_stream_ids)
        self.label = label
        self.source = source
        self.file = file
        self.line = line
        self.log_items = log_items
        self.stats = StreamStats()


_stream_ids = itertools.count(1)
_lock = threading.Lock()
_registry: list[StreamRecord] = []
_by_key: dict[tuple[Any, str | None], StreamRecord] = {}


def stream_registry() -> list[StreamRecord]:
    """Every stream defined so far (a copy), oldest first."""
    with _lock:
        return list(_registry)


def reset_for_session() -> None:
    """Give every stream fresh figures: a new profiler starts from zero."""
    with _lock:
        for record in _registry:
            record.stats = StreamStats()


def _record_for(key: Any, make: Callable[[], StreamRecord], name: str | None) -> StreamRecord:
    with _lock:
        record = _by_key.get((key, name))
        if record is None:
            record = _by_key[(key, name)] = make()
            _registry.append(record)
        return record


class InstrumentedAsyncIterator(Generic[_T]):
    """Iterates the wrapped async iterator, timing every item; ``asend``/``athrow``/``aclose``
    are the wrapped async generator's."""

    __slots__ = ("_it", "_last", "_record", "_state", "_stats")

    def __init__(self, it: AsyncIterator[_T], record: StreamRecord) -> None:
        self._it = it
        self._record = record
        self._stats = record.stats
        self._last = 0  # when the previous item was handed to the consumer
        self._state = ACTIVE
        self._stats.instances[ACTIVE] += 1

    def __aiter__(self) -> InstrumentedAsyncIterator[_T]:
        return self

    # Each step asks the wrapped iterator for its awaitable only once the step runs: a step
    # cancelled before it starts then leaves no never-awaited ``asend`` behind (3.13 warns).
    def __anext__(self) -> Awaitable[_T]:
        return self._step(self._it.__anext__)

    def asend(self, value: Any) -> Awaitable[_T]:
        return self._step(lambda: self._it.asend(value))  # type: ignore[attr-defined]

    def athrow(self, typ: Any, val: Any = None, tb: Any = None) -> Awaitable[_T]:
        if val is None and tb is None:
            return self._step(lambda: self._it.athrow(typ))  # type: ignore[attr-defined]
        exc = _normalize_throw(typ, val, tb)
        return self._step(lambda: self._it.athrow(exc))  # type: ignore[attr-defined]

    async def aclose(self) -> None:
        try:
            await self._it.aclose()  # type: ignore[attr-defined]
        finally:
            self._end(CLOSED)

    async def _step(self, next_awaitable: Callable[[], Awaitable[_T]]) -> _T:
        start = _clock.now_ns()
        st = self._stats
        if self._last:
            st.between_ns += start - self._last
        try:
            item = await next_awaitable()
        except StopAsyncIteration:
            self._end(EXHAUSTED)
            raise
        except asyncio.CancelledError:
            self._end(CANCELLED)
            raise
        except GeneratorExit:
            self._end(CLOSED)
            raise
        except BaseException:
            self._end(FAILED)
            raise
        now = _clock.now_ns()
        wait = now - start
        self._last = now
        st.items += 1
        st.wait_ns += wait
        if wait > st.wait_max:
            st.wait_max = wait
        st.wait_hist[SMALL_BUCKET[wait] if 0 <= wait < SMALL_LIMIT else bucket_of(wait)] += 1
        text = _message_repr(item) if self._record.log_items else None
        st.log.append((st.items - 1, now, wait, text))
        return item

    def _end(self, state: str) -> None:
        if self._state is ACTIVE:
            self._state = state
            instances = self._stats.instances
            instances[ACTIVE] -= 1
            instances[state] += 1

    def __del__(self) -> None:
        try:
            self._end(CLOSED)  # abandoned mid-iteration: its generator is finalized too
        except Exception as err:  # never raise from a finalizer; at shutdown globals may be gone
            if _session is not None:
                _session.internal_error("finalizing a stream", err)

    def __getattr__(self, name: str) -> Any:
        # ag_frame, ag_code, ag_running, __name__... of the real iterator
        return getattr(self._it, name)

    def __repr__(self) -> str:
        return repr(self._it)


class StreamFunction(Generic[_P, _T]):
    """What ``@asyncflow.stream`` returns: still an async generator function for ``inspect``."""

    __wrapped__: Callable[_P, AsyncIterator[_T]]

    def __init__(self, fn: Callable[_P, AsyncIterator[_T]], record: StreamRecord) -> None:
        functools.update_wrapper(self, fn)
        self.__code__ = fn.__code__
        self.__defaults__ = getattr(fn, "__defaults__", None)
        self.__kwdefaults__ = getattr(fn, "__kwdefaults__", None)
        self.stream_record = record

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> AsyncIterator[_T]:
        it = self.__wrapped__(*args, **kwargs)
        if _session.active is None:
            return it
        return InstrumentedAsyncIterator(it, self.stream_record)

    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        return self if obj is None else types.MethodType(self, obj)

    def __reduce__(self) -> str:
        return str(self.__dict__["__qualname__"])


@overload
def stream(fn: Callable[_P, AsyncIterator[_T]], /) -> Callable[_P, AsyncIterator[_T]]: ...
@overload
def stream(fn: AsyncIterable[_T], /, *, name: str | None = None) -> AsyncIterator[_T]: ...
@overload
def stream(
    *, name: str | None = None, log_items: bool = False
) -> Callable[[Callable[_P, AsyncIterator[_T]]], Callable[_P, AsyncIterator[_T]]]: ...
def stream(fn: Any = None, /, *, name: str | None = None, log_items: bool = False) -> Any:
    """Track an async generator function (as a decorator) or one async iterable.

    Args:
        fn: an async generator function, or an async iterable (then it is iterated, tracked).
        name: the stream's label; iterables wrapped with the same name and code share a record.
        log_items: keep a truncated ``repr()`` of each item in the stream's log.

    Returns:
        For a function: a function that is still an async generator function for ``inspect``.
        For an iterable: an async iterator over it. With ``ASYNCFLOW_DISABLE=1``, or (for an
        iterable) no profiler running, what was given.

    Raises:
        TypeError: ``fn`` is neither an async generator function nor an async iterable.
    """
    _config.check_type("stream", "name", name, str, optional=True)
    _config.check_type("stream", "log_items", log_items, bool)

    def decorate(f: Any) -> Any:
        if isinstance(f, StreamFunction):
            return f
        if not inspect.isasyncgenfunction(f):
            raise TypeError(
                f"@asyncflow.stream needs an async generator function ('async def' with "
                f"'yield'), got {f!r}; wrap an async iterable with asyncflow.stream(iterable)"
            )
        if _config.disabled():
            return f
        code = f.__code__
        record = _record_for(
            code,
            lambda: StreamRecord(
                name or f.__qualname__,
                f"{f.__module__}:{f.__qualname__}",
                code.co_filename,
                code.co_firstlineno,
                log_items,
            ),
            name,
        )
        return StreamFunction(f, record)

    if fn is None:
        return decorate
    if callable(fn) and not isinstance(fn, AsyncIterable):
        return decorate(fn)
    if not isinstance(fn, AsyncIterable):
        raise TypeError(
            f"asyncflow.stream() needs an async iterable or an async generator function, "
            f"got {type(fn).__qualname__}: {fn!r}"
        )
    if isinstance(fn, InstrumentedAsyncIterator) or _config.disabled():
        return fn
    if _session.active is None:
        return fn
    it = fn.__aiter__()
    code = getattr(it, "ag_code", None)
    if code is not None:
        key: Any = code
        label, file, line = code.co_qualname, code.co_filename, code.co_firstlineno
    else:
        key = type(it)
        label, file, line = type(it).__qualname__, "?", 0
    record = _record_for(
        key,
        lambda: StreamRecord(
            name or label, f"{type(it).__module__}:{label}", file, line, log_items
        ),
        name,
    )
    return InstrumentedAsyncIterator(it, record)
