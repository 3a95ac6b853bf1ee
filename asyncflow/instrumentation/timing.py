"""Timing plain and async functions and blocks: ``@measure`` and ``measure_block(name)``.

The mechanism only: each measured call reads the clock on entry and exit, keeps the nesting of
measured calls per thread of control, and hands the finished span to the recording interface
(:mod:`asyncflow.instrumentation.recording`), whose collector implementation aggregates it.

What is measured, and how it is attributed:

- **Total time** is wall time from entry to return (or raise). For an ``async`` function that is
  from the start of the call to its completion, awaits included: the time a caller waits for it,
  not the CPU it used (the ``futures`` document has busy time per poll).
- **Self time** is total time minus the total time of the measured calls and blocks nested in
  it *in the same thread of control*: the same task for code running in a task, the same thread
  otherwise. Work a measured coroutine hands to another task or to an executor thread runs
  beside it, not inside it, and is not subtracted.
- **Recursion** is counted once per outermost call: a call of a function (or block name) that is
  already open in the same thread of control is part of the outer call and is not counted again.
- **Errors**: a call that raised counts once in ``errors``, by exception type (including
  ``CancelledError``); it is still a call, with its time.

With no profiler running (and no recorder of the user's, see
:mod:`asyncflow.instrumentation.recording`), a measured function costs one function call and one
check; calls started while one runs are recorded as soon as it starts. Names are bounded: past
``MAX_NAMES`` distinct labels, new ones are counted together under ``"(other names)"``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import sys
import threading
import types
import weakref
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, overload

from asyncflow import clock as _clock
from asyncflow import config as _config
from asyncflow import stats as _stats
from asyncflow.instrumentation import _session
from asyncflow.instrumentation import recording as _recording
from asyncflow.instrumentation.recording import Site

__all__ = [
    "MAX_NAMES",
    "OTHER_NAMES",
    "MeasuredCoroutineFunction",
    "Site",
    "measure",
    "measure_block",
    "running_now",
    "sites",
]

_P = ParamSpec("_P")
_T = TypeVar("_T")

#: Distinct measured labels kept; past it, new labels are counted under OTHER_NAMES.
MAX_NAMES = 1024
OTHER_NAMES = "(other names)"

#: per thread: ``.stack`` (timing's) and ``.shard`` (the recording interface's)
_LOCAL = _recording.LOCAL


_sites_lock = threading.Lock()
_sites: dict[str, Site] = {}
_other: Site | None = None


def _site(name: str, kind: str, source: str, file: str, line: int, is_async: bool) -> Site:
    site = _sites.get(name)
    if site is not None:
        return site
    global _other
    with _sites_lock:
        site = _sites.get(name)
        if site is not None:
            return site
        if len(_sites) < MAX_NAMES:
            site = _sites[name] = Site(name, kind, source, file, line, is_async)
            return site
        if _other is None:
            _other = Site(OTHER_NAMES, "other", "?", "?", 0, False)
        _other.folded += 1
        return _other


def sites() -> list[Site]:
    """Every measured label, oldest first, then the one that counts labels past MAX_NAMES."""
    with _sites_lock:
        out = list(_sites.values())
        if _other is not None:
            out.append(_other)
        return out


# -- threads of control ---------------------------------------------------------------------------

_get_running_loop = asyncio._get_running_loop


def _task_lookup(tasks: object, accelerator: object) -> Callable[[Any], Any]:
    """How to find the task a loop runs now: a C dict lookup where asyncio's tasks note it in
    ``asyncio.tasks._current_tasks`` (3.11 to 3.13, where that is ``_asyncio``'s own dict),
    else ``asyncio.current_task``. On 3.14 the C tasks keep the running task on the thread's
    state and never write that dict: reading it, every call would look like the same task's."""
    if not isinstance(tasks, dict):
        return asyncio.current_task
    if accelerator is not None and getattr(accelerator, "_current_tasks", None) is not tasks:
        return asyncio.current_task
    return tasks.get


#: the task running on a loop now, or None
_current_task: Callable[[Any], Any] = _task_lookup(
    getattr(asyncio.tasks, "_current_tasks", None), sys.modules.get("_asyncio")
)


#: task -> its open measured calls, outermost first (frames: see _enter). An entry is removed
#: when its last call ends, so a finished task is not kept alive. Outside a task, a thread's
#: open calls are on its own stack (``_LOCAL.stack``, kept for the thread's life, and listed
#: in ``_thread_stacks`` for the cold side), with ``None`` as the frame's key.
_open: dict[object, list[list[Any]]] = {}
_thread_stacks_lock = threading.Lock()
_thread_stacks: list[tuple[weakref.ref[threading.Thread], list[list[Any]]]] = []


def _thread_stack() -> list[list[Any]]:
    """The calling thread's stack of open measured calls, made on its first measured call."""
    stack: list[list[Any]] = []
    _LOCAL.stack = stack
    with _thread_stacks_lock:
        # Forget the stacks of threads that ended (their calls can no longer be open).
        _thread_stacks[:] = [(t, s) for t, s in _thread_stacks if _alive(t)]
        _thread_stacks.append((weakref.ref(threading.current_thread()), stack))
    return stack


def _alive(ref: weakref.ref[threading.Thread]) -> bool:
    thread = ref()
    return thread is not None and thread.is_alive()


def _enter(site: Site) -> list[Any] | None:
    """Open a measured call of ``site`` and start its clock; None when it is a recursive call
    (not counted). The frame is ``[site, child_ns, flow key, the flow's stack, start_ns]``."""
    loop = _get_running_loop()
    key: object = None if loop is None else _current_task(loop)
    if key is None:  # outside a task: the thread's own stack, kept
        try:
            stack = _LOCAL.stack
        except AttributeError:
            stack = _thread_stack()
    else:
        stack = _open.get(key)
        if stack is None:
            stack = _open[key] = []
    for frame in stack:
        if frame[0] is site:
            return None
    frame = [site, 0, key, stack, 0]
    stack.append(frame)
    frame[4] = _clock.now_ns()
    return frame


def _exit(frame: list[Any], error: type[BaseException] | None) -> None:
    """Close a measured call: attribute its time to the call it is nested in, fold it into the
    calling thread's shard (the collector's share, inline: no lock, no call through a
    recorder), hand it to the users' recorders if there are any. (The sync wrapper and
    ``measure_block`` do the same inline, on their way out without an exception.)"""
    end = _clock.now_ns()
    try:
        site, child, key, stack, start = frame
        if stack and stack[-1] is frame:
            stack.pop()
            if stack:
                stack[-1][1] += end - start
            elif key is not None and _open.get(key) is stack:
                del _open[key]
        else:
            _close(frame, key, stack, end - start)
        session = _session.active
        if session is not None:
            try:
                shard = _LOCAL.shard
            except AttributeError:
                shard = None
            if shard is None or shard.session is not session:
                shard = _recording.new_shard(session)
            _recording.fold_span(shard, site, start, end, child, error)
        if _recording.users:
            _recording.to_users_span(site, start, end, child, error)
    except Exception as exc:  # observing never breaks the program
        _session.internal_error("measuring a call", exc)


def _close(frame: list[Any], key: object, stack: list[Any], total: int) -> None:
    """Take ``frame`` off its stack (also when closed out of order: a generator finished
    elsewhere) and add its time to the call it was nested in."""
    at = next((i for i, f in enumerate(stack) if f is frame), -1)
    if at >= 0:
        del stack[at]
    if at > 0:
        stack[at - 1][1] += total
    elif not stack and key is not None and _open.get(key) is stack:
        del _open[key]


_FunctionStats = _recording.FunctionStats
_SMALL_BUCKET = _stats.SMALL_BUCKET
_SMALL_LIMIT = _stats.SMALL_LIMIT
_bucket_of = _stats.bucket_of


# -- @measure --------------------------------------------------------------------------------------


def _wrap_sync(fn: Callable[_P, _T], site: Site) -> Callable[_P, _T]:
    @functools.wraps(fn)
    def measured(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        if _session.active is None and not _recording.users:
            return fn(*args, **kwargs)  # nobody listens
        # _enter(site), inline: a Python call less on every measured call
        loop = _get_running_loop()
        key: object = None if loop is None else _current_task(loop)
        if key is None:  # outside a task: the thread's own stack, kept
            try:
                stack = _LOCAL.stack
            except AttributeError:
                stack = _thread_stack()
        else:
            stack = _open.get(key)
            if stack is None:
                stack = _open[key] = []
        for frame in stack:
            if frame[0] is site:
                return fn(*args, **kwargs)  # recursive: part of the outer call
        frame = [site, 0, key, stack, 0]
        stack.append(frame)
        frame[4] = start = _clock.now_ns()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            _exit(frame, type(exc))
            raise
        # _exit(frame, None), inline: a Python call less on every measured call
        end = _clock.now_ns()
        try:
            total = end - start
            if stack and stack[-1] is frame:
                stack.pop()
                if stack:
                    stack[-1][1] += total
                elif key is not None and _open.get(key) is stack:
                    del _open[key]
            else:
                _close(frame, key, stack, total)
            session = _session.active
            if session is not None:
                try:
                    shard = _LOCAL.shard
                except AttributeError:
                    shard = None
                if shard is None or shard.session is not session:
                    shard = _recording.new_shard(session)
                st = shard.functions.get(site)
                if st is None:
                    st = shard.functions[site] = _FunctionStats()
                st.total_ns += total
                child = frame[1]
                if child:
                    st.child_ns += child
                if total > st.max_ns:
                    st.max_ns = total
                st.hist[
                    _SMALL_BUCKET[total] if 0 <= total < _SMALL_LIMIT else _bucket_of(total)
                ] += 1
            if _recording.users:
                _recording.to_users_span(site, start, end, frame[1], None)
        except Exception as exc:  # observing never breaks the program
            _session.internal_error("measuring a call", exc)
        return result

    return measured


class MeasuredCoroutineFunction:
    """What ``@measure`` makes of an ``async`` function: each call reads the clock and returns
    a coroutine that times the original's from that moment to its completion.

    A plain ``async def`` wrapper would start timing at its first step, later than the call
    when the coroutine is given to a task. Like ``@asyncflow.future``'s wrapper, it looks like a
    coroutine function to ``inspect.iscoroutinefunction`` (also on 3.11, where there is no
    marker) and binds as a method.
    """

    __wrapped__: Callable[..., Any]

    def __init__(self, fn: Callable[..., Any], site: Site) -> None:
        functools.update_wrapper(self, fn)
        inner = fn.func if isinstance(fn, functools.partial) else fn
        # What inspect reads to take us for a function (and CO_COROUTINE from).
        self.__code__ = inner.__code__
        self.__defaults__ = getattr(inner, "__defaults__", None)
        self.__kwdefaults__ = getattr(inner, "__kwdefaults__", None)
        self.measure_site = site
        self._timed = _timed_for(fn, site)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _session.active is None and not _recording.users:
            return self.__wrapped__(*args, **kwargs)  # nobody listens: the coroutine itself
        start = _clock.now_ns()
        return self._timed(self.__wrapped__(*args, **kwargs), start)

    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        return types.MethodType(self, obj)

    def __repr__(self) -> str:
        return f"<asyncflow.measure {self.__module__}.{self.__dict__.get('__qualname__', '?')}>"


def _timed_for(fn: Any, site: Site) -> Callable[[Awaitable[Any], int], Awaitable[Any]]:
    async def timed(coro: Awaitable[Any], start: int) -> Any:
        # Opened at the first step, in the task that runs it (not the one that called).
        # _enter(site), inline; timed from the call, not from the first step.
        loop = _get_running_loop()
        key: object = None if loop is None else _current_task(loop)
        if key is None:  # outside a task: the thread's own stack, kept
            try:
                stack = _LOCAL.stack
            except AttributeError:
                stack = _thread_stack()
        else:
            stack = _open.get(key)
            if stack is None:
                stack = _open[key] = []
        for frame in stack:
            if frame[0] is site:
                return await coro  # recursive: part of the outer call
        frame = [site, 0, key, stack, start]
        stack.append(frame)
        try:
            result = await coro
        except BaseException as exc:
            _exit(frame, type(exc))
            raise
        _exit(frame, None)
        return result

    # Its own code object, named as the function: whole-program task tracking groups tasks by
    # their coroutine's code, and must not lump every measured coroutine together.
    code = timed.__code__
    timed.__code__ = code.replace(
        co_name=getattr(fn, "__name__", code.co_name),
        co_qualname=getattr(fn, "__qualname__", code.co_qualname),
    )
    return timed


def _location(fn: Any) -> tuple[str, str, int]:
    inner = inspect.unwrap(fn)
    code = getattr(inner, "__code__", None)
    qualname = getattr(fn, "__qualname__", None) or getattr(code, "co_qualname", "?")
    source = f"{getattr(fn, '__module__', None) or '?'}:{qualname}"
    if code is None:
        return source, "?", 0
    return source, code.co_filename, code.co_firstlineno


def _decorate(fn: Any, name: str | None) -> Any:
    if isinstance(fn, (staticmethod, classmethod)):
        return type(fn)(_decorate(fn.__func__, name))
    if getattr(fn, "__asyncflow_measured__", False):
        return fn  # measured already: measuring twice must not count every call twice
    if not callable(fn):
        raise TypeError(f"@asyncflow.measure needs a function, got {type(fn).__qualname__}: {fn!r}")
    if isinstance(fn, type):
        # Wrapped, the class would become a function: isinstance, subclassing and its
        # attributes would break.
        raise TypeError(
            f"@asyncflow.measure times function calls, but {fn.__qualname__} is a class: "
            "measure its methods (or __init__) instead"
        )
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(
            f"@asyncflow.measure times calls, but a call of the generator function {fn!r} only "
            "makes a generator: its work happens as it is iterated; use asyncflow.measure_block "
            "inside it (or asyncflow.stream for an async generator)"
        )
    if _config.disabled():
        return fn
    future_record = getattr(fn, "future_record", None)
    if future_record is not None and hasattr(fn, "__wrapped__"):
        # @measure over @asyncflow.future: put the future outermost, so that a task made of a
        # call is tracked once (as the future), not once more as a task of our wrapper.
        from asyncflow.instrumentation.futures import FutureFunction

        inner = _decorate(fn.__wrapped__, name or getattr(fn, "__qualname__", None))
        tracked = FutureFunction(inner, future_record)
        tracked._anchor = fn._anchor  # the future lives while this function does too
        return tracked
    is_async = inspect.iscoroutinefunction(fn)
    label = name or getattr(fn, "__qualname__", None) or repr(fn)
    source, file, line = _location(fn)
    site = _site(label, "function", source, file, line, is_async)
    wrapped: Any = MeasuredCoroutineFunction(fn, site) if is_async else _wrap_sync(fn, site)
    wrapped.__asyncflow_measured__ = True
    wrapped.measure_site = site
    return wrapped


@overload
def measure(fn: Callable[_P, _T], /) -> Callable[_P, _T]: ...
@overload
def measure(*, name: str | None = None) -> Callable[[Callable[_P, _T]], Callable[_P, _T]]: ...
def measure(fn: Any = None, /, *, name: str | None = None) -> Any:
    """Time every call of a function: plain or ``async``, a method, a staticmethod or a
    classmethod. Use bare (``@asyncflow.measure``) or as ``@asyncflow.measure(name="...")``.

    The function keeps its name, signature, docstring and ``__wrapped__``, and an ``async``
    function is still one for ``inspect.iscoroutinefunction``. Return values and exceptions
    pass through untouched. Figures (calls, total/self/mean/max time, percentiles, share of the
    profile's wall time, errors by type) are in the ``functions`` document.

    Args:
        fn: the function (when used bare).
        name: the label; defaults to the function's qualified name. Functions (and blocks)
            given the same label are counted together.

    Returns:
        The measured function; with ``ASYNCFLOW_DISABLE=1``, ``fn`` itself.

    Raises:
        TypeError: ``fn`` is not callable, is a class or a generator function, or ``name``
            is not a string.
        ValueError: ``name`` is empty or not printable (a newline, a tab, a control
            character).
    """
    _config.check_type("measure", "name", name, str, optional=True)
    if name is not None and not name.strip():
        raise ValueError("asyncflow.measure(name=...) must not be empty")
    if name is not None and not name.isprintable():
        raise ValueError(f"asyncflow.measure(name={name!r}): {_UNPRINTABLE}")
    if fn is None:
        return functools.partial(_decorate, name=name)
    return _decorate(fn, name)


# -- measure_block ---------------------------------------------------------------------------------


class measure_block:  # used as a function: ``with asyncflow.measure_block("x")``
    """Time a block: ``with asyncflow.measure_block("parse"): ...`` (or ``async with``).

    Counted like a measured function of that label (calls, times, errors by the type of the
    exception that left the block, which is never suppressed). Use one ``measure_block(...)``
    per ``with``: an object entered again while open measures only its outer use.

    Args:
        name: the block's label.

    Returns:
        A context manager for ``with`` and ``async with``.

    Raises:
        TypeError: ``name`` is not a string.
        ValueError: ``name`` is empty or not printable (a newline, a tab, a control
            character).
    """

    __slots__ = ("_depth", "_name", "_opened")

    def __init__(self, name: str) -> None:
        # A class rather than a function returning one: a call less on every block.
        if name.__class__ is not str or not name or name.isspace() or not name.isprintable():
            _bad_block_name(name)
        self._name = name
        self._opened: list[Any] | None = None
        self._depth = 0

    def __enter__(self) -> measure_block:
        if self._opened is not None or self._depth:
            self._depth += 1  # re-entered while open: only the outer use is measured
            return self
        if _session.active is None and not _recording.users:
            return self
        try:
            site = _sites.get(self._name)
            if site is None:
                site = self._new_site(2)
            # _enter(site), inline: a Python call less on every block
            loop = _get_running_loop()
            key: object = None if loop is None else _current_task(loop)
            if key is None:  # outside a task: the thread's own stack, kept
                try:
                    stack = _LOCAL.stack
                except AttributeError:
                    stack = _thread_stack()
            else:
                stack = _open.get(key)
                if stack is None:
                    stack = _open[key] = []
            for frame in stack:
                if frame[0] is site:
                    return self  # recursive: part of the outer use
            frame = [site, 0, key, stack, 0]
            stack.append(frame)
            self._opened = frame
            frame[4] = _clock.now_ns()
        except Exception as exc:  # observing never breaks the program
            _session.internal_error("measuring a block", exc)
        return self

    def _open(self, depth: int) -> measure_block:
        if self._opened is not None or self._depth:
            self._depth += 1  # re-entered while open: only the outer use is measured
            return self
        if _session.active is None and not _recording.users:
            return self
        try:
            site = _sites.get(self._name)
            if site is None:
                site = self._new_site(depth + 1)
            self._opened = _enter(site)
        except Exception as exc:  # observing never breaks the program
            _session.internal_error("measuring a block", exc)
            return self
        return self

    def _new_site(self, depth: int) -> Site:
        caller = sys._getframe(depth)
        module = caller.f_globals.get("__name__", "?")
        return _site(
            self._name,
            "block",
            f"{module}:{caller.f_code.co_qualname}",
            caller.f_code.co_filename,
            caller.f_lineno,
            False,
        )

    def __exit__(
        self,
        typ: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._depth:
            self._depth -= 1
            return
        frame = self._opened
        if frame is None:
            return
        self._opened = None
        if typ is not None:
            _exit(frame, typ)
            return
        # _exit(frame, None), inline: a Python call less on every block
        end = _clock.now_ns()
        try:
            site, child, key, stack, start = frame
            total = end - start
            if stack and stack[-1] is frame:
                stack.pop()
                if stack:
                    stack[-1][1] += total
                elif key is not None and _open.get(key) is stack:
                    del _open[key]
            else:
                _close(frame, key, stack, total)
            session = _session.active
            if session is not None:
                try:
                    shard = _LOCAL.shard
                except AttributeError:
                    shard = None
                if shard is None or shard.session is not session:
                    shard = _recording.new_shard(session)
                st = shard.functions.get(site)
                if st is None:
                    st = shard.functions[site] = _FunctionStats()
                st.total_ns += total
                if child:
                    st.child_ns += child
                if total > st.max_ns:
                    st.max_ns = total
                st.hist[
                    _SMALL_BUCKET[total] if 0 <= total < _SMALL_LIMIT else _bucket_of(total)
                ] += 1
            if _recording.users:
                _recording.to_users_span(site, start, end, child, None)
        except Exception as exc:  # observing never breaks the program
            _session.internal_error("measuring a block", exc)

    async def __aenter__(self) -> measure_block:
        return self._open(2)

    async def __aexit__(
        self,
        typ: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(typ, exc, tb)

    def __repr__(self) -> str:
        return f"<asyncflow.measure_block {self._name!r}>"


def _bad_block_name(name: object) -> None:
    if not isinstance(name, str):
        raise TypeError(
            f"asyncflow.measure_block(name) needs a string, got {type(name).__qualname__}: {name!r}"
        )
    if not name.strip():
        raise ValueError("asyncflow.measure_block(name) must not be empty")
    if not name.isprintable():
        raise ValueError(f"asyncflow.measure_block({name!r}): {_UNPRINTABLE}")


#: why a label with a newline, a tab or an escape sequence is refused
_UNPRINTABLE = (
    "a label must be printable (no newlines, tabs or control characters): the report and "
    "top print it as it is"
)


def running_now() -> dict[Site, tuple[int, int]]:
    """Cold side: site -> (calls of it entered and not left now, the earliest start among
    them), read from the open calls of every thread of control (recursive calls are not
    opened, so each outermost call counts once)."""
    out: dict[Site, tuple[int, int]] = {}
    with _thread_stacks_lock:
        stacks = [s for _, s in _thread_stacks]
    for stack in stacks + list(_open.values()):  # copies in C: safe while others record
        for frame in list(stack):
            site, start = frame[0], frame[4]
            if not start:
                continue  # opened, its clock not read yet
            seen = out.get(site)
            out[site] = (1, start) if seen is None else (seen[0] + 1, min(seen[1], start))
    return out


def reset_for_tests() -> None:
    """Forget every label (tests only: real programs keep them for the process's life)."""
    global _other
    with _sites_lock:
        _sites.clear()
        _other = None
    _open.clear()
    with _thread_stacks_lock:
        for _, stack in _thread_stacks:
            stack.clear()
