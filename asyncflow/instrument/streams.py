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
import linecache
import threading
import tokenize
import types
import warnings
import weakref
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from asyncflow import clock as _clock
from asyncflow import config as _config
from asyncflow.instrument import _session
from asyncflow.instrument.channels import _message_repr
from asyncflow.instrument.futures import _normalize_throw
from asyncflow.instrument.futures import _speedups as _compiled_path
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
COMPILED = "compiled"  # a decorated function compiled again, counting inside its generators
WRAPPED = "wrapped"  # each generator (or iterable) wrapped by an InstrumentedAsyncIterator


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
    """A tracked stream definition.

    ``mode`` is how a decorated function runs: ``compiled`` (compiled again with counting
    inside) or ``wrapped`` (each generator wrapped, as iterables are); ``fallback_reason`` says
    why a decorated function is wrapped (None when it is compiled, or for wrapped iterables).
    """

    __slots__ = (
        "fallback_reason",
        "file",
        "id",
        "label",
        "line",
        "log_items",
        "mode",
        "source",
        "stats",
    )

    def __init__(self, label: str, source: str, file: str, line: int, log_items: bool) -> None:
        self.id = next(_stream_ids)
        self.label = label
        self.source = source
        self.file = file
        self.line = line
        self.log_items = log_items
        self.stats = _new_stats()
        self.mode = WRAPPED
        self.fallback_reason: str | None = None


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
            record.stats = _new_stats()


def _record_for(key: Any, make: Callable[[], StreamRecord], name: str | None) -> StreamRecord:
    with _lock:
        record = _by_key.get((key, name))
        if record is None:
            record = _by_key[(key, name)] = make()
            _registry.append(record)
        return record


class _IteratorMethods(Generic[_T]):
    """What both implementations of the wrapped iterator share: everything but ``__aiter__``
    and ``__anext__`` (the hot part), which the compiled one has in C."""

    __slots__ = ()

    _it: AsyncIterator[_T]
    _iteration: _Iteration

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


class InstrumentedAsyncIterator(_IteratorMethods[_T]):
    """Iterates the wrapped async iterator, counting every item and timing a sample of them;
    ``asend``/``athrow``/``aclose`` are the wrapped async generator's.

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


# -- @stream on an async generator function: counting compiled into the generator ----------
#
# A wrapper object around each generator costs more than the budget on its own (a Python-level
# ``__anext__`` adds ~350 ns per item on 3.11, measured), so the decorator compiles the function
# again from its source with two integer operations at each ``yield`` and a try/except around
# the body: the result is a real async generator function, and its generators are real async
# generators. The timed path (``_timed_item``) runs for the item before a timed one and for the
# timed one.
#
# It must run exactly the code that was loaded. The source can lie (a file edited after import,
# a stale ``linecache`` entry for an ``exec``'d cell), and compiling a function outside its
# class or module can change it (name mangling), so the source, parsed at its own columns, is
# first compiled untransformed in the same enclosing scopes as the counting version, and that
# code object must be identical to the loaded one (bytecode, constants, names, flags, line and
# column table, nested code objects). Only then is the counting version used; otherwise, or
# when the source cannot be had (REPL, ``exec``), the wrapper above is used, and the stream
# entry says which (``mode``) and why (``fallback_reason``). Both outcomes are kept per code
# object, so decorating the same nested generator on every call compiles it once.

_NO_SOURCE = "its source is not available"
_NOT_ONE_FUNCTION = "its source is not one async generator function"
_SOURCE_DIFFERS = "its source does not compile to the loaded code"
_RESERVED = "it uses names that start with _asyncflow_"
_NOT_A_FUNCTION = "it is not a plain function"
_FAILED = "compiling it again failed"

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
# ``yield x``: counted once ``x`` has been evaluated (an expression that raises yields nothing).
# A constant or a name is substituted as it is (a name is read once by itself first, so that an
# unbound one raises before the count). Anything else is evaluated into ``_asyncflow_item``
# first, and taken out of it as it is yielded, so that the generator does not keep the item
# alive while it waits: ``(_asyncflow_item, (_asyncflow_item := None))[0]`` (cheaper than
# counting it in a call: 20 to 35 ns an item here, measured).
_YIELD = """
_asyncflow_stats.items += 1
if _asyncflow_stats.items >= _asyncflow_stats.arm:
    _asyncflow_target = yield _asyncflow_timed(_asyncflow_it, _asyncflow_value)
    _asyncflow_it.resumed()
else:
    _asyncflow_target = yield _asyncflow_value
"""
_EVALUATE = "_asyncflow_item = _asyncflow_value"
_TAKE = "(_asyncflow_item, (_asyncflow_item := None))[0]"
_FACTORY = "_asyncflow_factory"
_FUTURE_FLAGS = 0
for _feature in __future__.all_feature_names:
    _FUTURE_FLAGS |= getattr(__future__, _feature).compiler_flag
_CO_NESTED = inspect.CO_NESTED


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
_HELPER_CELLS = {name: types.CellType(value) for name, value in _HELPERS.items()}


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
        first: list[ast.stmt] = []
        if isinstance(value, ast.Name):
            first = [ast.copy_location(ast.Expr(copy.deepcopy(value)), value)]
        elif not isinstance(value, ast.Constant):
            first = [_Substitute({"_asyncflow_value": value}).visit(_template(_EVALUATE, stmt)[0])]
            value = ast.parse(_TAKE, mode="eval").body
            for node in ast.walk(value):
                ast.copy_location(node, stmt)
        body = _template(_YIELD, stmt)
        if target is None:  # a plain ``yield x`` statement: no assignment
            for branch in (body[1].body, body[1].orelse):  # type: ignore[attr-defined]
                assign = branch[0]
                branch[0] = ast.copy_location(ast.Expr(assign.value), assign)
        names = {"_asyncflow_value": value, "_asyncflow_target": target or value}
        return first + [_Substitute(names).visit(s) for s in body]

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


def _source_tree(fn: types.FunctionType, code: types.CodeType) -> ast.AsyncFunctionDef | str:
    """The function's definition parsed from its source at its own lines and columns."""
    lines = linecache.getlines(code.co_filename, fn.__globals__)
    first = code.co_firstlineno  # its first decorator's line, if it has any
    if not 0 < first <= len(lines):
        return _NO_SOURCE
    try:
        block = inspect.getblock(lines[first - 1 :])
    except (SyntaxError, tokenize.TokenError):
        return _NOT_ONE_FUNCTION
    # Parsed where it stands, never dedented: an indented definition goes inside an ``if``
    # block, so that string contents and column offsets stay exactly those of the file.
    indented = block[0][:1].isspace()
    text = "".join(["if 1:\n", *block] if indented else block)
    try:
        with warnings.catch_warnings():  # the user saw the source's warnings once already
            warnings.simplefilter("ignore")
            tree = ast.parse(text, code.co_filename)
    except (SyntaxError, ValueError):
        return _NOT_ONE_FUNCTION
    body = tree.body
    if indented:
        if len(body) != 1 or not isinstance(body[0], ast.If):
            return _NOT_ONE_FUNCTION
        body = body[0].body
    if len(body) != 1:
        return _NOT_ONE_FUNCTION
    node = body[0]
    if not isinstance(node, ast.AsyncFunctionDef) or node.name != code.co_name:
        return _NOT_ONE_FUNCTION
    ast.increment_lineno(node, first - (2 if indented else 1))
    return node


def _enclosing_class(qualname: str) -> str | None:
    """The class whose name private names are mangled with: the innermost class in
    ``co_qualname`` (a function there is followed by ``<locals>``, a class is not)."""
    parts = qualname.split(".")
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] != "<locals>" and parts[i + 1] != "<locals>":
            return parts[i] if parts[i].isidentifier() else None
    return None


def _imported_names(node: ast.AsyncFunctionDef, fn: types.FunctionType) -> tuple[str, ...]:
    """The names ``node`` calls methods on that its module most likely bound by ``import``.

    The compiler calls ``name.attr()`` without ``LOAD_METHOD`` when the module has an
    ``import`` of ``name``; a module, or a class or function defined in another module, bound
    at the module's top level is taken for one (the identity check then proves it or not).
    """
    names: set[str] = set()
    for call in ast.walk(node):
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and isinstance(call.func.value, ast.Name)
        ):
            value = fn.__globals__.get(call.func.value.id, names)
            if isinstance(value, types.ModuleType) or (
                isinstance(value, type | types.FunctionType | types.BuiltinFunctionType)
                and value.__module__ != fn.__module__
            ):
                names.add(call.func.value.id)
    return tuple(sorted(names))


def _compile_in_scope(
    node: ast.AsyncFunctionDef, code: types.CodeType, cls: str | None, imported: tuple[str, ...]
) -> types.CodeType | None:
    """``node`` compiled inside a function whose parameters are the original's free variables
    and the helpers (they become the new code's closure), inside a class of the enclosing
    class's name (private names are mangled alike), in a module that imports ``imported``.
    Nothing here is executed."""
    params = [*code.co_freevars, *_HELPERS, "_asyncflow_record"]
    factory = ast.parse(f"def {_FACTORY}({', '.join(params)}):\n    pass\n").body[0]
    factory.body = [node]  # type: ignore[attr-defined]
    outer: ast.stmt = factory
    if cls is not None:
        outer = ast.parse(f"class {cls}:\n    pass\n").body[0]
        outer.body = [factory]  # type: ignore[attr-defined]
    imports = [ast.Import([ast.alias(name)]) for name in imported]
    module = ast.Module(body=[*imports, outer], type_ignores=[])
    ast.fix_missing_locations(module)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = compile(
            module,
            code.co_filename,
            "exec",
            flags=code.co_flags & _FUTURE_FLAGS,
            dont_inherit=True,
        )
    for name in (cls, _FACTORY, code.co_name):
        if name is not None:
            found = [c for c in compiled.co_consts if type(c) is types.CodeType]
            found = [c for c in found if c.co_name == name]
            if len(found) != 1:
                return None
            compiled = found[0]
    return compiled if type(compiled) is types.CodeType else None


_CODE_FIELDS = (
    "co_argcount",
    "co_posonlyargcount",
    "co_kwonlyargcount",
    "co_nlocals",
    "co_stacksize",
    "co_code",
    "co_names",
    "co_varnames",
    "co_freevars",
    "co_cellvars",
    "co_filename",
    "co_name",
    "co_firstlineno",
    "co_linetable",
    "co_exceptiontable",
)


class _Requalify:
    """Maps the qualified names of the compiled-again code to those of the original."""

    def __init__(self, compiled: str, original: str) -> None:
        self.compiled = compiled
        self.original = original

    def __call__(self, qualname: str) -> str:
        if qualname == self.compiled or qualname.startswith(self.compiled + "."):
            return self.original + qualname[len(self.compiled) :]
        return qualname

    def code(self, code: types.CodeType) -> types.CodeType:
        consts = tuple(self.code(c) if type(c) is types.CodeType else c for c in code.co_consts)
        return code.replace(co_qualname=self(code.co_qualname), co_consts=consts)


def _same_code(new: types.CodeType, old: types.CodeType, requalify: _Requalify) -> bool:
    """Whether ``new`` is ``old`` compiled again: everything that runs or is shown alike (only
    the qualified name's prefix and the informational ``CO_NESTED`` flag may differ)."""
    return (
        all(getattr(new, f) == getattr(old, f) for f in _CODE_FIELDS)
        and not (new.co_flags ^ old.co_flags) & ~_CO_NESTED
        and requalify(new.co_qualname) == old.co_qualname
        and _same_const(new.co_consts, old.co_consts, requalify)
    )


def _same_const(new: Any, old: Any, requalify: _Requalify) -> bool:
    if type(new) is not type(old):
        return False
    if type(new) is types.CodeType:
        return _same_code(new, old, requalify)
    if type(new) is tuple:
        return len(new) == len(old) and all(
            _same_const(a, b, requalify) for a, b in zip(new, old, strict=True)
        )
    if type(new) is frozenset:
        return {_const_key(c) for c in new} == {_const_key(c) for c in old}
    return bool(_const_key(new) == _const_key(old))


def _const_key(const: Any) -> Any:
    # 0 == 0.0 == False and -0.0 == 0.0, but they are different constants; nan is itself
    if isinstance(const, float | complex):
        return type(const), repr(const)
    if isinstance(const, tuple | frozenset):
        return type(const), tuple(_const_key(c) for c in const)
    return type(const), const


def _uses_reserved_names(code: types.CodeType) -> bool:
    names = (*code.co_names, *code.co_varnames, *code.co_freevars, *code.co_cellvars)
    return any(n.startswith("_asyncflow_") for n in names) or any(
        _uses_reserved_names(c) for c in code.co_consts if type(c) is types.CodeType
    )


class _Counting:
    """A generator's code compiled again with counting: the new code object, and where each
    of its free variables comes from (an index into the original's closure, a helper's cell,
    or None for the stream record)."""

    __slots__ = ("code", "layout")

    def __init__(self, code: types.CodeType, layout: tuple[int | types.CellType | None, ...]):
        self.code = code
        self.layout = layout


def _compile_counting(fn: types.FunctionType) -> _Counting | str:
    """``fn``'s code compiled again with its items counted in place, or why it is not."""
    original = fn.__code__
    if _uses_reserved_names(original):
        return _RESERVED
    node = _source_tree(fn, original)
    if isinstance(node, str):
        return node
    cls = _enclosing_class(original.co_qualname)
    imported = _imported_names(node, fn)
    for attempt in dict.fromkeys([imported, ()]):  # none: names imported by an earlier cell
        untransformed = _compile_in_scope(copy.deepcopy(node), original, cls, attempt)
        if untransformed is None:
            return _FAILED
        requalify = _Requalify(untransformed.co_qualname, original.co_qualname)
        if _same_code(untransformed, original, requalify):
            imported = attempt
            break
    else:
        return _SOURCE_DIFFERS
    # The body: counting at each yield, the iteration's end seen by a try around it all.
    flat: list[ast.stmt] = []
    for stmt in node.body:
        done = _Yields().visit(stmt)
        flat.extend(done if isinstance(done, list) else [done])
    like = node.body[0]
    guard = _template(_BODY, like)[0]
    guard.body = flat  # type: ignore[attr-defined]
    node.body = [*_template(_PROLOGUE, like), guard]
    counting = _compile_in_scope(node, original, cls, imported)
    if counting is None:
        return _FAILED
    code = requalify.code(counting)
    code = code.replace(co_flags=code.co_flags & ~_CO_NESTED | original.co_flags & _CO_NESTED)
    layout: list[int | types.CellType | None] = []
    for name in code.co_freevars:
        if name in _HELPER_CELLS:
            layout.append(_HELPER_CELLS[name])
        elif name == "_asyncflow_record":
            layout.append(None)
        elif name in original.co_freevars:
            layout.append(original.co_freevars.index(name))
        else:
            return _FAILED
    return _Counting(code, tuple(layout))


# One outcome per code object, by identity (equal code objects from two files compare equal),
# forgotten with the code object: an ``exec``'d cell run again does not pile up entries.
_compiled: dict[int, tuple[weakref.ref[types.CodeType], _Counting | str]] = {}


def _counting_for(fn: types.FunctionType) -> _Counting | str:
    code = fn.__code__
    key = id(code)
    cached = _compiled.get(key)
    if cached is not None and cached[0]() is code:
        return cached[1]
    try:
        outcome = _compile_counting(fn)
    except Exception as err:  # observing never breaks the program: wrap it instead
        _session.internal_error("compiling a stream again", err)
        outcome = _FAILED

    def forget(ref: weakref.ref[types.CodeType]) -> None:
        if _compiled.get(key, (None,))[0] is ref:
            del _compiled[key]

    _compiled[key] = (weakref.ref(code, forget), outcome)
    return outcome


def _rewrite(fn: Any, record: StreamRecord) -> tuple[Any, str | None]:
    """``fn`` compiled again with its items counted in place, or (None, why not)."""
    if type(fn) is not types.FunctionType:
        return None, _NOT_A_FUNCTION
    counting = _counting_for(fn)
    if isinstance(counting, str):
        return None, counting
    closure = fn.__closure__ or ()
    record_cell = types.CellType(record)
    cells = tuple(
        record_cell if c is None else closure[c] if type(c) is int else c for c in counting.layout
    )
    rewritten = types.FunctionType(
        counting.code,
        fn.__globals__,
        fn.__name__,
        fn.__defaults__,
        cells,  # type: ignore[arg-type]
    )
    rewritten.__kwdefaults__ = fn.__kwdefaults__
    functools.update_wrapper(rewritten, fn)
    rewritten.stream_record = record  # type: ignore[attr-defined]
    return rewritten, None


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
        rewritten, why = _rewrite(f, record)
        record.mode, record.fallback_reason = (COMPILED, None) if why is None else (WRAPPED, why)
        return rewritten or StreamFunction(f, record, code)

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
    return InstrumentedAsyncIterator(it, record)


# The compiled hot path (asyncflow/instrument/_speedups.c), where it is built and not turned off
# (ASYNCFLOW_NO_EXTENSIONS=1), gives the wrapped iterator a compiled __anext__: the same records
# and semantics as the reference above, which stays, and the test suite runs on both.
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
