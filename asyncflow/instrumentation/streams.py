"""Recording async iterators and generators: ``@stream`` and ``stream(async_iterable)``.

A stream record stands for a definition: a decorated async generator function, or the code (or
type) of the iterables wrapped with the same name. Each iteration of it is an instance with a
state (``active``, ``exhausted``, ``closed``, ``cancelled``, ``failed``). Per item, asyncflow
times the wait inside ``__anext__`` (how long the consumer waited for the producer) and each
iteration's whole time (the consumer's is the rest), and keeps a bounded log of recent items.

A record watches its code object (or type) weakly. When that is freed, the record leaves the
registry for the bounded history of gone streams (see ``_gone``): memory follows the
definitions alive, not every ``exec``'d generator function ever iterated.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import threading
import types
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from asyncflow import clock as _clock
from asyncflow import config as _config
from asyncflow.instrumentation import _session
from asyncflow.instrumentation import lineage as _lineage
from asyncflow.instrumentation._gone import AGGREGATES_KEPT, GONE_KEPT, Fold, GoneHistory, Watch
from asyncflow.instrumentation.channels import _message_repr
from asyncflow.instrumentation.futures import _normalize_throw
from asyncflow.instrumentation.futures import _speedups as _compiled_path
from asyncflow.stats import SMALL_BUCKET, SMALL_LIMIT, bucket_of, new_histogram

__all__ = [
    "AGGREGATES_KEPT",
    "GONE_KEPT",
    "InstrumentedAsyncIterator",
    "StreamRecord",
    "consumer_ns",
    "reap",
    "recent_items",
    "stream",
    "stream_registry",
]

_P = ParamSpec("_P")
_T = TypeVar("_T")

ACTIVE = "active"
EXHAUSTED = "exhausted"
CLOSED = "closed"
CANCELLED = "cancelled"
FAILED = "failed"
STATES = (ACTIVE, EXHAUSTED, CLOSED, CANCELLED, FAILED)
STREAM_LOG_SIZE = 100
#: recent items an aggregate of gone streams keeps in its log
AGGREGATE_LOG = 10


class StreamStats:
    """One session's figures for one stream definition.

    ``items`` is counted at every item by the wrapper's step (a C integer on the compiled
    path, see ``_load_compiled_stats``); ``arm`` is the item number from which the next items
    take the timed path (see ``_timed_item``).
    """

    __slots__ = (
        "arm",
        "instances",
        "interval",
        "items",
        "last_ns",
        "log",
        "running",
        "sampled",
        "spent_ns",
        "timed",
        "wait_hist",
        "wait_max",
        "wait_ns",
    )

    def __init__(self) -> None:
        self.items = 0
        self.arm = 0
        self.interval = 1
        self.sampled = 0  # item number of the last timed item
        self.last_ns = 0  # when it was timed
        self.timed = 0
        self.wait_ns = 0
        self.wait_max = 0
        #: the time of the iterations that ended, start to end; and those active, with the sum
        #: of their starts (one tuple: a reader on another thread sees both of one moment). The
        #: consumer's time is what the waits inside ``__anext__`` leave of it, measured whole
        #: rather than from timed items (its time between items varies too much: one timed
        #: gap standing for a hundred read it 30 times off)
        self.spent_ns = 0
        self.running: tuple[int, int] = (0, 0)
        self.wait_hist = new_histogram()
        self.instances = dict.fromkeys(STATES, 0)
        #: the recent timed items, oldest first: (index, timestamp, wait ns, item repr). A list
        #: (56 B empty, 88 B with one item), not a deque with a maxlen (760 B, empty or not):
        #: most definitions keep a few items, and a gone one keeps them in the history. Trimmed
        #: after each append, so it may be a little longer meanwhile: read it with
        #: ``recent_items``.
        self.log: list[tuple[int, int, int, str | None]] = []


#: how a gone stream's figures add into its aggregate (every other int field is summed); the
#: compiled StreamStats has the same fields
_FOLD = Fold(
    StreamStats,
    maximum=("interval", "wait_max"),
    histogram=("instances", "wait_hist"),  # instances: a count per state
    left=("arm", "last_ns", "log", "running", "sampled"),  # sampling state, the iterations
    # running (none, once gone); _merge keeps the last items
)


class _Iteration:
    """One iteration of a stream: its state, and the times its next timed item needs."""

    __slots__ = ("arming", "began", "record", "resumed_at", "state", "stats")

    def __init__(self, record: StreamRecord) -> None:
        self.record = record
        self.stats = st = record.stats
        self.state = ACTIVE
        st.instances[ACTIVE] += 1
        self.arming = False  # the next item is timed: note when the consumer asks for it
        self.began = now = _clock.now_ns()
        active, began = st.running
        st.running = (active + 1, began + now)
        # the first item is timed from the start when it is due
        self.resumed_at = now if st.items >= st.arm else 0

    def resumed(self) -> None:
        """The consumer asks for the item that is timed next."""
        if self.arming:
            self.resumed_at = _clock.now_ns()
            self.arming = False

    def end(self, exc: BaseException | None) -> None:
        """The iteration ended: exhausted (``exc`` None), closed, cancelled or failed."""
        if self.state is not ACTIVE:
            return
        if exc is None:
            state = EXHAUSTED
        elif isinstance(exc, GeneratorExit):
            state = CLOSED
        elif isinstance(exc, asyncio.CancelledError):
            state = CANCELLED
        else:
            state = FAILED
        self.state = state
        st = self.stats
        st.spent_ns += _clock.now_ns() - self.began
        active, began = st.running
        st.running = (active - 1, began - self.began)
        instances = st.instances
        # The end counted before the iteration leaves ACTIVE: a reap that sees none active
        # (on the collector's thread) may fold the record at once.
        instances[state] += 1
        instances[ACTIVE] -= 1


def _timed_item(it: _Iteration, item: Any) -> Any:
    """The slow path of an item (already counted): the one before a timed item, or a timed one.

    Returns ``item``. A timed item stands for the items since the previous timed one; its wait
    is measured from when the consumer asked for it, so the item before it arms the timing.
    """
    try:
        st = it.stats
        n = st.items
        if n <= st.arm or not it.resumed_at:  # the item before a timed one (or not armed)
            st.arm = n
            it.arming = True
            return item
        now = _clock.now_ns()
        wait = now - it.resumed_at
        it.resumed_at = 0
        weight = n - st.sampled
        st.sampled = n
        st.interval = interval = _session.next_interval(st.interval, now - st.last_ns)
        st.last_ns = now
        st.arm = n + interval - 1
        it.arming = interval == 1
        st.timed += 1
        st.wait_ns += wait * weight
        if wait > st.wait_max:
            st.wait_max = wait
        bucket = SMALL_BUCKET[wait] if 0 <= wait < SMALL_LIMIT else bucket_of(wait)
        st.wait_hist[bucket] += weight
        if _session.active is not None:
            _lineage.item(it.record.id, item, now - wait, now)
        text = _message_repr(item) if it.record.log_items else None
        log = st.log
        log.append((n - 1, now, wait, text))
        if len(log) > STREAM_LOG_SIZE:
            # Appending and trimming are each one step under the GIL: an item that another
            # thread times in between is kept, and the log is too long only until it trims.
            del log[0]
    except Exception as err:  # observing never breaks the program
        _session.internal_error("timing a stream item", err)
    return item


def consumer_ns(st: StreamStats, now: int) -> int:
    """The time the consumers spent outside ``__anext__`` (between items), up to ``now``: the
    iterations' time, start to end (or to now), less the waits for items (an estimate from
    the timed items while sampling)."""
    active, began = st.running
    return max(0, st.spent_ns + active * now - began - st.wait_ns)


def recent_items(st: StreamStats) -> list[tuple[int, int, int, str | None]]:
    """The last ``STREAM_LOG_SIZE`` timed items of a stream (an aggregate keeps fewer), oldest
    first: (index, timestamp, wait ns, item repr). A copy, made in one step: ``st.log`` is
    longer for a moment whenever a thread appends to a full log."""
    return st.log[-STREAM_LOG_SIZE:]


def _count(it: _Iteration, item: Any) -> Any:
    """Count an item of a wrapped iterator (and time it when due)."""
    st = it.stats
    st.items = n = st.items + 1
    if n >= st.arm:
        _timed_item(it, item)
    return item


class StreamRecord:
    """A tracked stream definition."""

    __slots__ = ("file", "folded", "id", "label", "line", "log_items", "owner", "source", "stats")

    def __init__(self, label: str, source: str, file: str, line: int, log_items: bool) -> None:
        self.id = next(_stream_ids)
        self.label = label
        self.source = source
        self.file = file
        self.line = line
        self.log_items = log_items
        self.stats = _new_stats()
        #: what the stream stands for (its code object or iterator type), weakly; None for an
        #: aggregate of gone streams
        self.owner: Watch | None = None
        #: gone streams whose figures are summed here (an aggregate); 0 for a real definition
        self.folded = 0

    @property
    def alive(self) -> bool:
        """Whether what the stream stands for still exists (never, for an aggregate)."""
        owner = self.owner
        return owner is not None and owner() is not None


_stream_ids = itertools.count(1)
_lock = threading.Lock()
#: streams whose code or type may still be iterated, by id, oldest first
_registry: dict[int, StreamRecord] = {}
#: (id of the code object or iterator type, name) -> stream. Keyed by id, not by the object: a
#: code object in a key would never be freed. The owner's weak reference removes the entry when
#: it dies, before the id can be reused (see ``_gone.GoneHistory.watch``).
_by_key: dict[tuple[int, str | None], StreamRecord] = {}
#: Gone streams: the last GONE_KEPT as they were, older ones folded into one aggregate per
#: label, at most AGGREGATES_KEPT (then one "(other gone streams)").
OTHER_GONE = "(other gone streams)"


def stream_registry() -> list[StreamRecord]:
    """Every stream of the session (a copy): live ones oldest first, then the last gone ones,
    then the aggregates of older gone ones."""
    return _history.listing()


def reap(*, collecting: bool = False) -> int:
    """Move the streams whose code or type is gone out of the registry, into the bounded
    history of gone streams (see ``_gone.GoneHistory.reap``); returns how many moved."""
    return _history.reap(collecting)


def reset_for_session() -> None:
    """Give every stream fresh figures and forget the gone ones: a new profiler starts from
    zero."""
    with _lock:
        _history.forget(_fresh_stats)


def _fresh_stats(record: StreamRecord) -> None:
    record.stats = _new_stats()


def _record_for(owner: object, make: Callable[[], StreamRecord], name: str | None) -> StreamRecord:
    key = (id(owner), name)
    record = _by_key.get(key)  # the caller holds ``owner``: its entry cannot go meanwhile
    if record is None:
        if _history.dying:
            _history.reap()  # nobody collects: keep the registry to what is alive as it grows
        with _lock:
            record = _by_key.get(key)
            if record is None:
                record = _by_key[key] = make()
                record.owner = _history.watch(record, owner, key)
                _registry[record.id] = record
    return record


def _final(record: StreamRecord) -> bool:
    """Whether no iteration of a gone stream is active (the cyclic GC clears a dying type's
    weak references before it runs its iterators' finalizers, which end their iterations)."""
    return not record.stats.instances[ACTIVE]


def _aggregate(record: StreamRecord, label: str) -> StreamRecord:
    same = label == record.label
    return StreamRecord(
        label,
        record.source if same else "?",
        record.file if same else "?",
        record.line if same else 0,
        False,
    )


def _merge(agg: StreamRecord, record: StreamRecord) -> None:
    """Add a gone stream's figures to its aggregate (under _lock)."""
    a, s = agg.stats, record.stats
    _FOLD(a, s)
    if s.log:
        # a new list, set in one step: a reader never sees more than AGGREGATE_LOG items
        a.log = [*a.log, *s.log[-AGGREGATE_LOG:]][-AGGREGATE_LOG:]


_history: GoneHistory[StreamRecord] = GoneHistory(
    _lock,
    _registry,
    other=OTHER_GONE,
    kind=lambda record: "",
    aggregate=_aggregate,
    merge=_merge,
    final=_final,
    index=_by_key,
)


class _IteratorMethods(Generic[_T]):
    """What both implementations of the wrapped iterator share: everything but ``__aiter__``
    and ``__anext__`` (the hot part), which the compiled one has in C, and the generator
    methods, which only the wrappers of iterators that have them have (see ``_shaped``)."""

    __slots__ = ()

    _it: AsyncIterator[_T]
    _iteration: _Iteration

    async def _step(self, next_awaitable: Callable[[], Awaitable[_T]]) -> _T:
        it = self._iteration
        it.resumed()
        try:
            item = await next_awaitable()
        except StopAsyncIteration:
            it.end(None)
            raise
        except BaseException as exc:
            it.end(exc)
            raise
        _count(it, item)
        return item

    def __del__(self) -> None:
        try:
            self._iteration.end(GeneratorExit())  # abandoned: its generator is finalized too
        except Exception as err:  # never raise from a finalizer; at shutdown globals may be gone
            if _session is not None:
                _session.internal_error("finalizing a stream", err)

    def __getattr__(self, name: str) -> Any:
        # ag_frame, ag_code, ag_running, __name__... of the real iterator
        return getattr(self._it, name)

    def __repr__(self) -> str:
        return repr(self._it)


class _Asend(_IteratorMethods[_T]):
    __slots__ = ()

    def asend(self, value: Any) -> Awaitable[_T]:
        return self._step(lambda: self._it.asend(value))  # type: ignore[attr-defined]


class _Athrow(_IteratorMethods[_T]):
    __slots__ = ()

    def athrow(self, typ: Any, val: Any = None, tb: Any = None) -> Awaitable[_T]:
        if val is None and tb is None:
            return self._step(lambda: self._it.athrow(typ))  # type: ignore[attr-defined]
        exc = _normalize_throw(typ, val, tb)
        return self._step(lambda: self._it.athrow(exc))  # type: ignore[attr-defined]


class _Aclose(_IteratorMethods[_T]):
    __slots__ = ()

    async def aclose(self) -> None:
        try:
            await self._it.aclose()  # type: ignore[attr-defined]
        finally:
            self._iteration.end(GeneratorExit())


#: (implementation, has asend, has athrow, has aclose) -> its class with those methods
_shapes: dict[tuple[type, bool, bool, bool], type] = {}


def _wrap(it: AsyncIterator[_T], record: StreamRecord) -> AsyncIterator[_T]:
    """``it`` wrapped by the implementation in use (``InstrumentedAsyncIterator``: the compiled
    one where it is built, else the reference), in its subclass with exactly the generator
    methods that ``it`` has: a generic helper's ``if hasattr(it, "aclose"): await it.aclose()``
    must not fail on the wrapper of an iterator that has none, and ``isinstance(w,
    AsyncGenerator)`` is what it is for ``it``."""
    base = InstrumentedAsyncIterator
    if type(it) is types.AsyncGeneratorType:
        cls = _generators.get(base) or _shaped((base, True, True, True))
    else:
        cls = _shaped((base, hasattr(it, "asend"), hasattr(it, "athrow"), hasattr(it, "aclose")))
    wrapper: AsyncIterator[_T] = cls(it, record)
    return wrapper


#: each implementation's class for async generators: with every generator method
_generators: dict[type, type] = {}


def _wrapped_class(wrapper: Any) -> type:
    """A wrapper's ``__class__``: its iterator's, so that ``isinstance()`` and ``inspect`` say of
    the wrapper what they say of the iterator (``inspect.isasyncgen()`` is true of an async
    generator's). ``type()`` still tells the wrapper, as ``unittest.mock``'s ``spec`` does."""
    return type(wrapper._it)


def _shaped(key: tuple[type, bool, bool, bool]) -> type:
    """The class of implementation ``key[0]`` with the generator methods ``key[1:]`` says it
    has (``asend``, ``athrow``, ``aclose``): at most eight per implementation, made once."""
    cls = _shapes.get(key)
    if cls is None:
        base = key[0]
        mixins = tuple(
            mixin
            for mixin, present in zip((_Asend, _Athrow, _Aclose), key[1:], strict=True)
            if present
        )
        cls = base
        if mixins:
            namespace = {
                "__slots__": (),
                "__module__": base.__module__,
                "__qualname__": base.__qualname__,
                "__doc__": base.__doc__,
                "__class__": property(_wrapped_class),
            }
            cls = type(base.__name__, (*mixins, base), namespace)
        cls = _shapes.setdefault(key, cls)
        if all(key[1:]):
            _generators[base] = cls
    return cls


class InstrumentedAsyncIterator(_IteratorMethods[_T]):
    """Iterates the wrapped async iterator, counting every item and timing a sample of them;
    ``asend``/``athrow``/``aclose`` are the wrapped async generator's, and a wrapper has those
    of them that the iterator it wraps has (its class is a subclass of this one with them).

    The pure-Python reference; where the compiled hot path is built, the class of that name is
    its twin (``__anext__`` in C, these same Python methods for the rest)."""

    __slots__ = ("_it", "_iteration")

    def __init__(self, it: AsyncIterator[_T], record: StreamRecord) -> None:
        self._it = it
        self._iteration = _Iteration(record)

    def __aiter__(self) -> InstrumentedAsyncIterator[_T]:
        return self

    # Each step asks the wrapped iterator for its awaitable only once the step runs: a step
    # cancelled before it starts then leaves no never-awaited ``asend`` behind (3.13 warns).
    def __anext__(self) -> Awaitable[_T]:
        return self._step(self._it.__anext__)


class StreamFunction(Generic[_P, _T]):
    """What ``@asyncflow.stream`` returns: still an async generator function for ``inspect``."""

    __wrapped__: Callable[_P, AsyncIterator[_T]]

    def __init__(
        self, fn: Callable[_P, AsyncIterator[_T]], record: StreamRecord, code: types.CodeType
    ) -> None:
        functools.update_wrapper(self, fn)
        self.__code__ = code
        self.__defaults__ = getattr(fn, "__defaults__", None)
        self.__kwdefaults__ = getattr(fn, "__kwdefaults__", None)
        self.stream_record = record

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> AsyncIterator[_T]:
        it = self.__wrapped__(*args, **kwargs)
        if _session.active is None:
            return it
        cls = _generators.get(InstrumentedAsyncIterator)  # _wrap's common case, inline
        if cls is None or type(it) is not types.AsyncGeneratorType:
            return _wrap(it, self.stream_record)
        wrapper: AsyncIterator[_T] = cls(it, self.stream_record)
        return wrapper

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
        inner = f  # a partial's or bound method's function: what it runs, where it is defined
        while isinstance(inner, functools.partial | types.MethodType):
            inner = inner.func if isinstance(inner, functools.partial) else inner.__func__
        code = inner.__code__
        record = _record_for(
            code,
            lambda: StreamRecord(
                name or inner.__qualname__,
                f"{inner.__module__}:{inner.__qualname__}",
                code.co_filename,
                code.co_firstlineno,
                log_items,
            ),
            name,
        )
        return StreamFunction(f, record, code)

    if fn is None:
        return decorate
    if callable(fn) and not isinstance(fn, AsyncIterable):
        return decorate(fn)
    if not isinstance(fn, AsyncIterable):
        raise TypeError(
            f"asyncflow.stream() needs an async iterable or an async generator function, "
            f"got {type(fn).__qualname__}: {fn!r}"
        )
    if isinstance(fn, _WRAPPERS) or _config.disabled():
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
    return _wrap(it, record)


# The compiled hot path (asyncflow/instrumentation/_speedups.c), where it is built and not
# turned off (ASYNCFLOW_NO_EXTENSIONS=1), gives the wrapped iterator a compiled __anext__: the
# same records and semantics as the reference above, which stays, and the test suite runs on
# both.
InstrumentedAsyncIteratorPy = InstrumentedAsyncIterator
_WRAPPERS: tuple[type, ...] = (InstrumentedAsyncIteratorPy,)


StreamStatsPy = StreamStats


def _new_stats() -> StreamStats:
    """A stream's fresh figures: ``items`` and ``arm`` counted in C while the compiled wrapper
    counts (the others stay Python objects), in Python ints while the reference does."""
    if InstrumentedAsyncIterator is InstrumentedAsyncIteratorPy or StreamStatsC is None:
        return StreamStatsPy()
    return StreamStatsC()  # type: ignore[no-any-return]


def _load_compiled_stats() -> type | None:
    if _compiled_path is None or not hasattr(_compiled_path, "StreamCounter"):
        return None
    counted_in_c = ("items", "arm")
    # The reference's attributes but the two the C base keeps, set up by the same __init__.
    namespace = {
        "__slots__": tuple(n for n in StreamStatsPy.__slots__ if n not in counted_in_c),
        "__init__": StreamStatsPy.__init__,
        "__doc__": StreamStatsPy.__doc__,
        "__module__": __name__,
        "__qualname__": "StreamStats",
    }
    return type("StreamStats", (_compiled_path.StreamCounter,), namespace)


def _load_compiled() -> type | None:
    if _compiled_path is None or not hasattr(_compiled_path, "AsyncIteratorBase"):
        return None
    try:
        _compiled_path.setup_streams(globals())
    except (RuntimeError, TypeError) as err:  # out of step with this module: use the reference
        _session.internal_error("loading the compiled streams", err)
        return None
    Coroutine.register(_compiled_path.StreamStep)

    class _Compiled(_compiled_path.AsyncIteratorBase, _IteratorMethods[Any]):  # type: ignore[misc, name-defined]
        __slots__ = ()

    _Compiled.__name__ = _Compiled.__qualname__ = "InstrumentedAsyncIterator"
    _Compiled.__module__ = __name__
    _Compiled.__doc__ = InstrumentedAsyncIteratorPy.__doc__
    return _Compiled


InstrumentedAsyncIteratorC = _load_compiled()
StreamStatsC = _load_compiled_stats() if InstrumentedAsyncIteratorC is not None else None
if InstrumentedAsyncIteratorC is not None:
    _WRAPPERS = (InstrumentedAsyncIteratorPy, InstrumentedAsyncIteratorC)
    if not TYPE_CHECKING:
        InstrumentedAsyncIterator = InstrumentedAsyncIteratorC
