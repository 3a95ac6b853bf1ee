"""Recording async iterators and generators: ``@stream`` and ``stream(async_iterable)``.

A stream record stands for a definition: a decorated async generator function, or the code (or
type) of the iterables wrapped with the same name. Each iteration of it is an instance with a
state (``active``, ``exhausted``, ``closed``, ``cancelled``, ``failed``). Per item, asyncflow
times the wait inside ``__anext__`` (how long the consumer waited for the producer) and the time
the consumer spent between items, and keeps a bounded log of recent items.
"""

from __future__ import annotations
import __future__

import ast
import asyncio
import copy
import functools
import inspect
import itertools
import textwrap
import threading
import types
import warnings
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
    """One session's figures for one stream definition.

    ``items`` is bumped inline at every item; ``arm`` is the item number from which the next
    items take the timed path (see ``_timed_item``).
    """

    __slots__ = (
        "arm",
        "between_ns",
        "instances",
        "interval",
        "items",
        "last_ns",
        "log",
        "sampled",
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
        self.between_ns = 0
        self.wait_hist = new_histogram()
        self.instances = dict.fromkeys(STATES, 0)
        # (index, timestamp, wait ns, item repr)
        self.log: deque[tuple[int, int, int, str | None]] = deque(maxlen=STREAM_LOG_SIZE)


class _Iteration:
    """One iteration of a stream: its state, and the times its next timed item needs."""

    __slots__ = ("arming", "record", "resumed_at", "state", "stats", "weight", "yielded_at")

    def __init__(self, record: StreamRecord) -> None:
        self.record = record
        self.stats = st = record.stats
        self.state = ACTIVE
        st.instances[ACTIVE] += 1
        self.yielded_at = 0  # when the last timed item was handed over
        self.weight = 0  # the items it stands for
        self.arming = False  # the next item is timed: note when the consumer asks for it
        # the first item is timed from the start when it is due
        self.resumed_at = _clock.now_ns() if st.items >= st.arm else 0

    def resumed(self) -> None:
        """The consumer asks for the next item, after a timed item or before one."""
        now = 0
        if self.yielded_at:
            now = _clock.now_ns()
            self.stats.between_ns += (now - self.yielded_at) * self.weight
            self.yielded_at = 0
        if self.arming:
            self.resumed_at = now or _clock.now_ns()
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
        instances = self.stats.instances
        instances[ACTIVE] -= 1
        instances[state] += 1


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
        it.yielded_at = now
        it.weight = weight
        st.timed += 1
        st.wait_ns += wait * weight
        if wait > st.wait_max:
            st.wait_max = wait
        bucket = SMALL_BUCKET[wait] if 0 <= wait < SMALL_LIMIT else bucket_of(wait)
        st.wait_hist[bucket] += weight
        text = _message_repr(item) if it.record.log_items else None
        st.log.append((n - 1, now, wait, text))
    except Exception as err:  # observing never breaks the program
        _session.internal_error("timing a stream item", err)
    return item


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
    """Iterates the wrapped async iterator, counting every item and timing a sample of them;
    ``asend``/``athrow``/``aclose`` are the wrapped async generator's."""

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
            self._iteration.end(GeneratorExit())

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


# -- @stream on an async generator function: counting compiled into the generator ----------
#
# A wrapper object around each generator costs more than the budget on its own (a Python-level
# ``__anext__`` adds ~350 ns per item on 3.11, measured), so the decorator compiles the function
# again from its source with two integer operations at each ``yield`` and a try/except around
# the body: the result is a real async generator function, and its generators are real async
# generators. The timed path (``_timed_item``) runs for the item before a timed one and for the
# timed one. Line numbers, column offsets, the file name, closures, defaults and name mangling
# are those of the original; when the source cannot be had (REPL, ``exec``) or anything does
# not match, the wrapper above is used instead.

_PROLOGUE = """
_asyncflow_it = _asyncflow_begin(_asyncflow_record)
_asyncflow_stats = _asyncflow_it.stats
"""
_BODY = """
try:
    pass
except BaseException as _asyncflow_exc:
    _asyncflow_it.end(_asyncflow_exc)
    raise
finally:
    _asyncflow_it.end(None)
"""
_YIELD = """
_asyncflow_stats.items += 1
if _asyncflow_stats.items >= _asyncflow_stats.arm:
    _asyncflow_target = yield _asyncflow_timed(_asyncflow_it, _asyncflow_value)
    _asyncflow_it.resumed()
else:
    _asyncflow_target = yield _asyncflow_value
"""
_FUTURE_FLAGS = 0
for _feature in __future__.all_feature_names:
    _FUTURE_FLAGS |= getattr(__future__, _feature).compiler_flag


def _count(it: _Iteration, item: Any) -> Any:
    """Count an item (and time it when due): a wrapped iterator's, or a ``yield`` inside an
    expression of a decorated generator (a ``yield`` statement has this inlined)."""
    st = it.stats
    st.items = n = st.items + 1
    if n >= st.arm:
        _timed_item(it, item)
    return item


def _resumed(it: _Iteration, value: Any) -> Any:
    it.resumed()
    return value


#: what the compiled-again generator refers to, by the names it uses for them
_HELPERS: dict[str, Any] = {
    "_asyncflow_begin": _Iteration,
    "_asyncflow_count": _count,
    "_asyncflow_timed": _timed_item,
    "_asyncflow_resumed": _resumed,
}


def _template(text: str, like: ast.AST) -> list[ast.stmt]:
    body = ast.parse(text).body
    for stmt in body:
        for node in ast.walk(stmt):
            if "lineno" in node._attributes:
                ast.copy_location(node, like)
    return body


class _Substitute(ast.NodeTransformer):
    def __init__(self, names: dict[str, ast.expr]) -> None:
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.expr:
        found = self.names.get(node.id)
        return node if found is None else copy.deepcopy(found)


class _Yields(ast.NodeTransformer):
    """Counts every ``yield`` of one function body; nested scopes keep their own."""

    def _skip(self, node: ast.AST) -> ast.AST:
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = _skip

    def _statement(self, stmt: ast.stmt, yielded: ast.Yield, target: ast.expr | None) -> Any:
        value = self.visit(yielded.value) if yielded.value else ast.Constant(None)
        body = _template(_YIELD, stmt)
        if target is None:  # a plain ``yield x`` statement: no assignment
            for branch in (body[1].body, body[1].orelse):  # type: ignore[attr-defined]
                assign = branch[0]
                branch[0] = ast.copy_location(ast.Expr(assign.value), assign)
        return [
            _Substitute({"_asyncflow_value": value, "_asyncflow_target": target or value}).visit(s)
            for s in body
        ]

    def visit_Expr(self, node: ast.Expr) -> Any:
        if isinstance(node.value, ast.Yield):
            return self._statement(node, node.value, None)
        return self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> Any:
        if isinstance(node.value, ast.Yield) and len(node.targets) == 1:
            return self._statement(node, node.value, node.targets[0])
        return self.generic_visit(node)

    def visit_Yield(self, node: ast.Yield) -> ast.expr:
        value = self.visit(node.value) if node.value else ast.Constant(None)
        call = ast.Call(ast.Name("_asyncflow_count", ast.Load()), [_it(), value], [])
        inner = ast.Yield(call)
        outer = ast.Call(ast.Name("_asyncflow_resumed", ast.Load()), [_it(), inner], [])
        for n in (call, call.func, call.args[0], inner, outer, outer.func, outer.args[0]):
            ast.copy_location(n, node)
        return outer


def _it() -> ast.expr:
    return ast.Name("_asyncflow_it", ast.Load())


def _shift_columns(tree: ast.AST, by: int) -> None:
    for node in ast.walk(tree):
        if isinstance(getattr(node, "col_offset", None), int):
            node.col_offset += by  # type: ignore[attr-defined]
        if isinstance(getattr(node, "end_col_offset", None), int):
            node.end_col_offset += by  # type: ignore[attr-defined]


def _find_code(code: types.CodeType, name: str) -> types.CodeType | None:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_name == name and const.co_flags & inspect.CO_ASYNC_GENERATOR:
                return const
            found = _find_code(const, name)
            if found is not None:
                return found
    return None


def _rewrite(fn: Any, record: StreamRecord) -> Any:
    """``fn`` compiled again with its items counted in place; None when that cannot be done."""
    if type(fn) is not types.FunctionType:
        return None
    original = fn.__code__
    try:
        lines, first = inspect.getsourcelines(fn)
        source = "".join(lines)
        text = textwrap.dedent(source)
        indent = len(source) - len(source.lstrip()) - (len(text) - len(text.lstrip()))
        with warnings.catch_warnings():  # the user saw the source's warnings once already
            warnings.simplefilter("ignore")
            tree = ast.parse(text)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.AsyncFunctionDef):
        return None
    node = tree.body[0]
    if node.name != original.co_name:
        return None
    ast.increment_lineno(tree, first - 1)
    _shift_columns(tree, indent)
    # The body: counting at each yield, the iteration's end seen by a try around it all.
    body: list[ast.stmt] = [_Yields().visit(stmt) for stmt in node.body]
    flat: list[ast.stmt] = []
    for stmt in body:
        flat.extend(stmt if isinstance(stmt, list) else [stmt])
    like = node.body[0]
    guard = _template(_BODY, like)[0]
    guard.body = flat  # type: ignore[attr-defined]
    node.body = [*_template(_PROLOGUE, like), guard]
    # Compiled inside a function whose parameters are the original's free variables and the
    # helpers (so they become the new code's closure), inside a class of the same name when the
    # original is a method (so that private names are mangled alike). Nothing here is executed.
    params = [*original.co_freevars, *_HELPERS, "_asyncflow_record"]
    factory = ast.parse(f"def _asyncflow_factory({', '.join(params)}):\n    pass\n").body[0]
    factory.body = [node]  # type: ignore[attr-defined]
    outer: ast.stmt = factory
    scope = fn.__qualname__.split(".")
    if len(scope) > 1 and scope[-2] != "<locals>":
        outer = ast.parse(f"class {scope[-2]}:\n    pass\n").body[0]
        outer.body = [factory]  # type: ignore[attr-defined]
    module = ast.Module(body=[outer], type_ignores=[])
    ast.fix_missing_locations(module)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = compile(
                module,
                original.co_filename,
                "exec",
                flags=original.co_flags & _FUTURE_FLAGS,
                dont_inherit=True,
            )
    except (SyntaxError, ValueError, TypeError):
        return None
    code = _find_code(compiled, original.co_name)
    if (
        code is None
        or code.co_argcount != original.co_argcount
        or code.co_kwonlyargcount != original.co_kwonlyargcount
        or code.co_posonlyargcount != original.co_posonlyargcount
        or code.co_varnames[: original.co_argcount] != original.co_varnames[: original.co_argcount]
        or code.co_firstlineno != original.co_firstlineno
    ):
        return None
    code = code.replace(co_qualname=original.co_qualname)
    cells = dict(zip(original.co_freevars, fn.__closure__ or (), strict=True))
    for name, value in {**_HELPERS, "_asyncflow_record": record}.items():
        cells[name] = types.CellType(value)
    if any(name not in cells for name in code.co_freevars):
        return None
    rewritten = types.FunctionType(
        code,
        fn.__globals__,
        fn.__name__,
        fn.__defaults__,
        tuple(cells[name] for name in code.co_freevars),
    )
    rewritten.__kwdefaults__ = fn.__kwdefaults__
    functools.update_wrapper(rewritten, fn)
    rewritten.stream_record = record  # type: ignore[attr-defined]
    return rewritten


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
        return _rewrite(f, record) or StreamFunction(f, record)

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
