"""Where each task waits: its await chain, and what it waits on, in words a person recognises.

Cold path only: nothing here runs until a document asks. A task's chain is walked from its
coroutine through ``cr_await`` (``gi_yieldfrom`` for generator-based coroutines), unwrapping
asyncflow's own wrappers, down to the innermost suspended coroutine; what it waits on is read
from the innermost library frames (``Queue.get``'s queue, ``Lock.acquire``'s lock, ``sleep``'s
timer...) and from the task's ``_fut_waiter`` (another task, a gather, an executor job).

The walk reads objects that belong to the loop's thread. It is consistent when that thread is
parked (its loop waits in ``select()`` or runs the callback that asked), so the profiler asks the
loop to run it (:func:`walk_on_loop`); a blocked loop cannot, and is then read from outside, with
the document saying so. From outside, ``asyncio.all_tasks(loop)`` lists the loop's tasks (on
3.14 it walks every thread's task list) and the task the loop is stuck in is found where asyncio
notes it: a dict up to 3.13, each thread's state on 3.14 (:func:`tasks_by_loop`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dis
import functools
import gc
import importlib.util
import os
import sys
import sysconfig
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from types import CodeType, FrameType, MethodType
from typing import Any, cast

from asyncflow import clock, schema
from asyncflow.instrumentation import _session
from asyncflow.instrumentation.futures import InstrumentedCoroutine
from asyncflow.instrumentation.loops import LoopRecord
from asyncflow.instrumentation.resources import resource_of

__all__ = [
    "MAX_CHAIN",
    "SLICE_NS",
    "SLICE_TASKS",
    "SlicedWalk",
    "TaskWalk",
    "describe_future",
    "holders",
    "is_asyncflow_file",
    "is_library_file",
    "loop_tasks",
    "read_on_loop",
    "summarise",
    "tasks_by_loop",
    "walk_loop",
    "walk_on_loop",
    "walk_task",
]

#: Coroutines followed down one task's await chain, at most (a cycle guard, too).
MAX_CHAIN = 64
#: Characters of an unknown future's repr kept.
_REPR_LIMIT = 120

_ASYNCIO_DIR = os.path.dirname(asyncio.__file__) + os.sep
#: asyncflow's own package (this module is in its ``model`` layer)
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
#: anyio's package, found without importing it (a program that never uses anyio never loads
#: it because asyncflow watches it)
_ANYIO_SPEC = importlib.util.find_spec("anyio")
_ANYIO_DIR = (
    os.path.dirname(_ANYIO_SPEC.origin) + os.sep
    if _ANYIO_SPEC is not None and _ANYIO_SPEC.origin
    else _OURS
)
#: Python's own library, installed packages (asyncio, anyio, aiohttp...) and asyncflow itself:
#: not where a person looks for the line their program waits at.
_LIBRARY_DIRS = tuple(
    {
        os.path.normpath(path) + os.sep
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (path := sysconfig.get_paths().get(key))
    }
    | {_ANYIO_DIR, _OURS}
)


#: where installers put console scripts: ``asyncflow:8`` (``sys.exit(main())``) launches a
#: program, it is no line of it
_SCRIPTS_DIR = os.path.normpath(sysconfig.get_paths().get("scripts") or os.sep) + os.sep


def is_library_file(path: str) -> bool:
    """Whether a frame's file is Python's, an installed package's or asyncflow's own (or a
    console script that launched the program)."""
    return path.startswith("<") or path.startswith(_LIBRARY_DIRS) or is_asyncflow_file(path)


def is_asyncflow_file(path: str) -> bool:
    """Whether a file is asyncflow's own, or a console script (``asyncflow``, wherever it was
    installed; any script in the interpreter's scripts directory): no warning's site."""
    return (
        path.startswith(_OURS)
        or path.startswith(_SCRIPTS_DIR)
        or os.path.basename(path) == "asyncflow"
    )


#: file name -> is_library_file(name): a walk asks it of every frame of every task (bounded)
_LIBRARY_FILES: dict[str, bool] = {}
_LIBRARY_FILES_LIMIT = 4096


def _is_library(code: CodeType) -> bool:
    path = code.co_filename
    known = _LIBRARY_FILES.get(path)
    if known is None:
        known = is_library_file(path)
        if len(_LIBRARY_FILES) >= _LIBRARY_FILES_LIMIT:
            _LIBRARY_FILES.clear()
        _LIBRARY_FILES[path] = known
    return known


class TaskWalk:
    """One task as read now: the wire entry plus what the summary groups it by."""

    __slots__ = ("entry", "parent_call", "wait_key", "where")

    def __init__(
        self,
        entry: schema.TaskEntry,
        where: schema.AwaitFrame | None,
        wait_key: str,
        parent_call: int = 0,
    ) -> None:
        self.entry = entry
        #: the innermost frame of the program's own code in the chain
        self.where = where
        self.wait_key = wait_key
        #: the call of the task that made this one (0: unknown): the parent is the live task
        #: with that call in its chain
        self.parent_call = parent_call


def _chain(task: asyncio.Task[Any]) -> tuple[list[FrameType], list[Any], Any, Any]:
    """The task's suspended frames, outermost first, and the coroutine (generator, async
    generator) each belongs to; its coroutine; and the innermost awaitable that is not a
    coroutine (a future's iterator, an async generator step), if any."""
    coro: Any = task.get_coro()
    top = coro
    frames: list[FrameType] = []
    owners: list[Any] = []
    obj = coro
    for _ in range(MAX_CHAIN):
        if obj is None:
            break
        if type(obj) is InstrumentedCoroutine:
            obj = obj._coro
            continue
        frame = getattr(obj, "cr_frame", None)
        if frame is not None:
            # a coroutine in the middle of a step (the running task's, read from outside):
            # what it awaits is read off its frame's stack, which that step is changing, and
            # may be freed memory; its frame is the innermost to follow
            nxt = None if getattr(obj, "cr_running", False) else obj.cr_await
        else:
            frame = getattr(obj, "gi_frame", None)
            if frame is not None:
                nxt = None if getattr(obj, "gi_running", False) else obj.gi_yieldfrom
            else:
                frame = getattr(obj, "ag_frame", None)
                running = getattr(obj, "ag_running", False)
                nxt = getattr(obj, "ag_await", None) if frame is not None and not running else None
        if frame is None:
            break  # a future's iterator, an async generator's step, or a finished coroutine
        frames.append(frame)
        owners.append(obj)
        obj = nxt
    return frames, owners, top, obj


# What a waiting frame holds is read from its coroutine's references (gc.get_referents: its
# locals and the values on its stack, beside its code and names), never through f_locals: on
# 3.11 and 3.12 reading those stores a snapshot of the locals on the frame, which keeps alive
# what the code then deletes (the queue a get waited on, anyio's `del self`), until it ends.


def _all_held(owner: Any) -> list[Any]:
    """What the suspended coroutine ``owner`` holds (its locals among them)."""
    try:
        return gc.get_referents(owner)
    except Exception:  # something that cannot list what it holds: say nothing about it
        return []


def _held(owner: Any, kind: type[Any] | tuple[type[Any], ...]) -> Any:
    """The first object of ``kind`` that the suspended ``owner`` holds, or None."""
    return next((obj for obj in _all_held(owner) if isinstance(obj, kind)), None)


def _self_of(owner: Any, code: CodeType) -> Any:
    """The ``self`` of a suspended method: what ``owner`` holds whose class defines ``code``."""
    for obj in _all_held(owner):
        if _defines(type(obj), code):
            return obj
    return None


#: (class, code) -> whether the class (or a base) defines the method whose code that is; a walk
#: of 100,000 tasks asks the same few pairs again and again (bounded, cleared when full)
_DEFINES: dict[tuple[type[Any], CodeType], bool] = {}
_DEFINES_LIMIT = 4096


def _defines(kind: type[Any], code: CodeType) -> bool:
    key = (kind, code)
    known = _DEFINES.get(key)
    if known is not None:
        return known
    name = code.co_name
    found = False
    for cls in kind.__mro__:
        method = cls.__dict__.get(name)
        # (asyncflow's class-level hooks, whole-program mode: asyncio's own is __wrapped__)
        for func in (method, getattr(method, "__wrapped__", None)):
            if getattr(func, "__code__", None) is code:
                found = True
    if len(_DEFINES) >= _DEFINES_LIMIT:
        _DEFINES.clear()
    _DEFINES[key] = found
    return found


def _thread_call(call: Any) -> bool:
    """Whether ``call`` is to_thread's ``functools.partial(ctx.run, func, ...)``."""
    run = getattr(call, "func", None)
    return isinstance(call, functools.partial) and isinstance(
        getattr(run, "__self__", None), contextvars.Context
    )


def _label_of_channel(obj: Any) -> tuple[str | None, str | None]:
    record = getattr(obj, "_asyncflow_channel", None)  # an instrumented asyncio queue
    if record is None:  # an anyio memory stream: its shared state's buffer holds the record
        buffer = getattr(getattr(obj, "_state", None), "buffer", None)
        record = getattr(buffer, "record", None)
    if record is None:
        return None, None
    return f"channel:{record.id}", str(record.label)


def _label_of_resource(obj: Any) -> tuple[str | None, str | None]:
    record = resource_of(obj)
    if record is None:
        return None, None
    return f"resource:{record.id}", str(record.label)


def _target(
    kind: str,
    description: str,
    ref: str | None = None,
    label: str | None = None,
    remaining_ns: int | None = None,
    children: int | None = None,
) -> schema.WaitTarget:
    return schema.WaitTarget(kind, description, ref, label, remaining_ns, children)


#: asyncio's (and anyio's) waiting functions: co_qualname -> (kind, what a person calls it)
_SITES: dict[str, tuple[str, str]] = {
    "Queue.get": ("queue_get", "get from queue"),
    "Queue.put": ("queue_put", "put into full queue"),
    "Queue.join": ("queue_join", "join of queue"),
    "Lock.acquire": ("lock", "acquire lock"),
    "Semaphore.acquire": ("semaphore", "acquire semaphore"),
    "BoundedSemaphore.acquire": ("semaphore", "acquire semaphore"),
    "Condition.wait": ("condition", "wait on condition"),
    "Condition.wait_for": ("condition", "wait on condition"),
    "Event.wait": ("event", "wait for event"),
    "Barrier.wait": ("barrier", "wait at barrier"),
    "Barrier._block": ("barrier", "wait at barrier"),
    "Barrier._wait": ("barrier", "wait at barrier"),
    "StreamReader._wait_for_data": ("io", "read from stream"),
    "FlowControlMixin._drain_helper": ("io", "drain stream writer"),
    "StreamWriter.drain": ("io", "drain stream writer"),
    "CapacityLimiter.acquire_on_behalf_of": ("semaphore", "acquire capacity limiter"),
    "MemoryObjectReceiveStream.receive": ("queue_get", "receive from memory stream"),
    "MemoryObjectSendStream.send": ("queue_put", "send into full memory stream"),
}
_IO_FUNCTIONS = frozenset(
    {
        "sock_recv",
        "sock_recv_into",
        "sock_recvfrom",
        "sock_recvfrom_into",
        "sock_sendall",
        "sock_sendto",
        "sock_connect",
        "sock_accept",
        "sock_sendfile",
        "create_connection",
        "getaddrinfo",
    }
)


def _site(frame: FrameType, owner: Any, loop_time: float) -> schema.WaitTarget | None:
    """What a library frame in the chain (of the coroutine ``owner``) waits on, when its
    function is a known waiting site."""
    code = frame.f_code
    qualname = code.co_qualname
    name = code.co_name
    if qualname == "sleep" and code.co_filename.startswith(_ASYNCIO_DIR):
        handle = _held(owner, asyncio.TimerHandle)
        when = getattr(handle, "when", None)
        left = None
        if callable(when):
            left = max(0, round((when() - loop_time) * 1e9))
        words = "sleep" if left is None else f"sleep ({_seconds(left)} left)"
        return _target("sleep", words, remaining_ns=left)
    if qualname == "to_thread" and code.co_filename.startswith(_ASYNCIO_DIR):
        call = next((c for c in _all_held(owner) if _thread_call(c)), None)
        args = getattr(call, "args", ())
        fn = args[0] if args else None
        what = getattr(fn, "__qualname__", None) or "a function"
        return _target("executor", f"to_thread({what})", label=what)
    if qualname == "wait_for" and code.co_filename.startswith(_ASYNCIO_DIR):
        inner = _held(owner, asyncio.Task)
        if isinstance(inner, asyncio.Task):
            return _target("task", f"wait_for task {inner.get_name()}", label=inner.get_name())
        return None
    if qualname in ("_wait", "wait") and code.co_filename.startswith(_ASYNCIO_DIR):
        fs = _held(owner, (set, frozenset))  # wait() makes it a set: the only one held
        if isinstance(fs, (set, frozenset)):
            pending = sum(1 for f in fs if not f.done())
            return _target("wait", f"asyncio.wait on {pending} of {len(fs)}", children=pending)
        return None
    if qualname in ("TaskGroup.__aexit__", "TaskGroup._aexit"):
        tasks = getattr(_self_of(owner, code), "_tasks", None)
        n = len(tasks) if tasks is not None else None
        words = "task group" if n is None else f"task group of {n} tasks"
        return _target("taskgroup", words, children=n)
    if name in _IO_FUNCTIONS and code.co_filename.startswith(_ASYNCIO_DIR):
        return _target("io", f"socket {name.removeprefix('sock_')}")
    site = _SITES.get(qualname)
    if site is None:
        return None
    kind, words = site
    waited = _self_of(owner, code)
    ref, label = _label_of_channel(waited)
    if ref is None:
        ref, label = _label_of_resource(waited)
    if label is not None:
        words = f"{words} {label}"
    elif waited is not None and kind != "io":
        words = f"{words} {type(waited).__qualname__} at 0x{id(waited):x}"
    return _target(kind, words, ref, label)


def _seconds(ns: int) -> str:
    return f"{ns / 1e9:.3g} s" if ns >= 1_000_000_000 else f"{ns / 1e6:.3g} ms"


def _short(text: str) -> str:
    return text if len(text) <= _REPR_LIMIT else text[: _REPR_LIMIT - 1] + "…"


def describe_future(fut: Any) -> schema.WaitTarget:
    """What a task waits on when only its awaited future says it: a task, a gather, a job."""
    if isinstance(fut, asyncio.Task):
        name = fut.get_name()
        return _target("task", f"task {name}", f"task:{name}", name)
    children = getattr(fut, "_children", None)
    if isinstance(children, list):  # asyncio.gather's _GatheringFuture
        pending = sum(1 for c in children if not c.done())
        return _target("gather", f"gather of {len(children)} ({pending} pending)", children=pending)
    for callback in _callbacks(fut):
        source = _closure_value(callback, "source")
        if isinstance(source, concurrent.futures.Future):  # run_in_executor, wrap_future
            return _target("executor", "executor job")
    try:
        text = repr(fut)
    except BaseException:  # a hostile repr must not break a document
        text = f"<{type(fut).__qualname__}>"
    return _target("future", _short(text))


def _callbacks(fut: Any) -> Iterable[Any]:
    try:
        callbacks = fut._callbacks or ()
    except Exception:
        return ()
    return [entry[0] if isinstance(entry, tuple) else entry for entry in callbacks]


def _closure_value(fn: Any, name: str) -> Any:
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None)
    if code is None or not cells or name not in code.co_freevars:
        return None
    try:
        return cells[code.co_freevars.index(name)].cell_contents
    except ValueError:  # an empty cell
        return None


def _chain_calls(coro: Any) -> list[int]:
    """The ids of the tracked calls down a task's await chain, outermost first."""
    calls: list[int] = []
    obj = coro
    for _ in range(MAX_CHAIN):
        if type(obj) is InstrumentedCoroutine:
            calls.append(obj._r.call_id)
            obj = obj._coro
            continue
        if getattr(obj, "cr_running", False) or getattr(obj, "gi_running", False):
            break  # in the middle of a step: what it awaits is not to be read (see _chain)
        nxt = getattr(obj, "cr_await", None)
        if nxt is None:
            nxt = getattr(obj, "gi_yieldfrom", None)
        if nxt is None:
            break
        obj = nxt
    return calls


#: what a task waits on when it waits for other tasks
_AWAITS_TASKS = frozenset({"task", "gather", "wait", "taskgroup", "future"})
#: waits that end by themselves: no deadlock goes through them
_NEVER_STUCK = frozenset({"sleep", "io", "executor"})


def _awaited(frames: list[FrameType], owners: list[Any], waiter: Any) -> list[str]:
    """The unfinished tasks a waiting task waits for: the task it awaits, a gather's children,
    ``asyncio.wait``'s or ``wait_for``'s tasks, a task group's tasks."""
    found: Iterable[Any] = ()
    if isinstance(waiter, asyncio.Task):
        found = (waiter,)
    elif isinstance(getattr(waiter, "_children", None), list):  # asyncio.gather's
        found = waiter._children
    else:
        for frame, owner in zip(reversed(frames), reversed(owners), strict=True):
            code = frame.f_code
            if not _is_library(code):
                break
            qualname = code.co_qualname
            if qualname in ("TaskGroup.__aexit__", "TaskGroup._aexit"):
                found = getattr(_self_of(owner, code), "_tasks", None) or ()
                break
            if code.co_filename.startswith(_ASYNCIO_DIR):
                if qualname in ("_wait", "wait"):
                    found = _held(owner, (set, frozenset)) or ()
                    break
                if qualname == "wait_for":
                    inner = _held(owner, asyncio.Task)
                    found = (inner,) if inner is not None else ()
                    break
    return sorted(
        {t.get_name() for t in list(found) if isinstance(t, asyncio.Task) and not t.done()}
    )


#: code object -> the lines of the ``async with`` / ``with`` blocks around each of its offsets
#: (read from the exception table: a with block's cleanup is its handler, on its line); bounded
_WITH_CACHE: dict[CodeType, list[tuple[int, int, int, int | None]]] = {}
_WITH_CACHE_LIMIT = 512


def _handlers(code: CodeType) -> list[tuple[int, int, int, int | None]]:
    """The code's exception table as (start, end, target, the target's with-line or None)."""
    table = _WITH_CACHE.get(code)
    if table is not None:
        return table
    table = []
    parse = getattr(dis, "_parse_exception_table", None)
    if parse is not None:
        try:
            instructions = list(dis.get_instructions(code))
            at = {ins.offset: k for k, ins in enumerate(instructions)}
            for entry in parse(code):
                k = at.get(entry.target)
                line = None
                if k is not None:
                    names = [ins.opname for ins in instructions[k : k + 3]]
                    if "WITH_EXCEPT_START" in names:
                        line = instructions[k].positions.lineno  # type: ignore[union-attr]
                table.append((entry.start, entry.end, entry.target, line))
        except Exception:  # an unreadable table: no lines, never a failed document
            table = []
    if len(_WITH_CACHE) >= _WITH_CACHE_LIMIT:
        _WITH_CACHE.clear()
    _WITH_CACHE[code] = table
    return table


def _with_lines(frame: FrameType) -> list[int]:
    """The lines of the ``with`` blocks open at the frame's current instruction, outermost
    first: follow the handler of the current offset, then the handler of that handler..."""
    table = _handlers(frame.f_code)
    lines: list[int] = []
    offset = frame.f_lasti
    for _ in range(MAX_CHAIN):
        entry = next((e for e in table if e[0] <= offset < e[1]), None)
        if entry is None:
            break
        if entry[3] is not None and entry[3] not in lines:
            lines.append(entry[3])
        if entry[2] == offset:
            break
        offset = entry[2]
    return lines[::-1]


def _held_at(frames: list[FrameType]) -> list[schema.AwaitFrame]:
    """The ``with`` blocks open in the program's own frames of a chain, outermost first."""
    out = []
    for frame in frames:
        code = frame.f_code
        if _is_library(code):
            continue
        for line in _with_lines(frame):
            out.append(schema.AwaitFrame(code.co_filename, line, code.co_qualname))
    return out


def _done(fut: Any) -> bool:
    try:
        return bool(fut.done())
    except Exception:  # a foreign future that cannot say: waiting, as it looks
        return False


#: (code, line) -> its AwaitFrame, shared by every task waiting there: a reading of 20,000 tasks
#: makes a few of them, not 100,000 objects for the garbage collector to count (bounded)
_FRAMES: dict[tuple[CodeType, int], schema.AwaitFrame] = {}
_FRAMES_LIMIT = 4096


def _await_frame(code: CodeType, line: int) -> schema.AwaitFrame:
    key = (code, line)
    frame = _FRAMES.get(key)
    if frame is None:
        frame = schema.AwaitFrame(code.co_filename, line, code.co_qualname)
        if len(_FRAMES) >= _FRAMES_LIMIT:
            _FRAMES.clear()
        _FRAMES[key] = frame
    return frame


def _frame_entry(frame: FrameType) -> schema.AwaitFrame:
    return _await_frame(frame.f_code, frame.f_lineno or 0)


def walk_task(
    task: asyncio.Task[Any],
    loop_id: int,
    running: asyncio.Task[Any] | None,
    now_ns: int,
    loop_time: float,
) -> TaskWalk:
    """Read one task's await chain and what it waits on (see the module's docstring)."""
    frames, owners, coro, innermost = _chain(task)
    # asyncflow's own wrappers (a lock's acquire hook...) are no part of the program's chain
    chain = [_frame_entry(f) for f in frames if not f.f_code.co_filename.startswith(_OURS)]
    mine = [frame for frame in frames if not _is_library(frame.f_code)]
    where = _frame_entry(mine[-1]) if mine else None
    waits_on: schema.WaitTarget | None = None
    if task.done():
        state = "done"
    elif task is running:
        state = "running"
    else:
        waiter = getattr(task, "_fut_waiter", None)
        # a waiter already done has woken the task: it runs at the loop's next turn
        state = "waiting" if waiter is not None and not _done(waiter) else "scheduled"
        for frame, owner in zip(reversed(frames), reversed(owners), strict=True):
            if not _is_library(frame.f_code):
                break
            waits_on = _site(frame, owner, loop_time)
            if waits_on is not None:
                break
        if waits_on is None and waiter is not None:
            waits_on = describe_future(waiter)
        if waits_on is None and innermost is not None and state == "waiting":
            waits_on = _target("future", _short(type(innermost).__qualname__))
    awaits: list[str] = []
    held_at: list[schema.AwaitFrame] = []
    holds: list[str] = []
    if state == "waiting" and waits_on is not None:
        if waits_on.kind in _AWAITS_TASKS:
            awaits = _awaited(frames, owners, getattr(task, "_fut_waiter", None))
        if waits_on.kind not in _NEVER_STUCK:  # a task that may be stuck: what it holds
            held_at = _held_at(frames)
            if held_at:  # (an open block in its own code: else it holds none found so)
                holds = _untracked_locks(frames, owners)
    future_id = future_label = call_id = age = None
    if type(coro) is InstrumentedCoroutine:
        r = coro._r
        future_id, future_label, call_id = r.future.id, r.future.label, r.call_id
        age = max(0, now_ns - r.created)
    code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None)
    if type(coro) is InstrumentedCoroutine:
        code = getattr(coro._coro, "cr_code", None) or getattr(coro._coro, "gi_code", None)
    coro_name = code.co_qualname if code is not None else type(coro).__qualname__
    entry = schema.TaskEntry(
        name=task.get_name(),
        loop_id=loop_id,
        state=state,
        coroutine=coro_name,
        future_id=future_id,
        future_label=future_label,
        call_id=call_id,
        age_ns=age,
        chain=chain,
        waits_on=waits_on,
        where=where,
        chain_calls=_chain_calls(coro),
        held_at=held_at,
        awaits=awaits,
        created_at=_created_at(coro),
        holds=holds,
    )
    key = (
        f"{waits_on.kind}:{waits_on.ref or waits_on.label or waits_on.description}"
        if (waits_on is not None)
        else state
    )
    parent_call = 0
    if type(coro) is InstrumentedCoroutine:
        parent_call = getattr(coro._r, "parent_call", 0) or 0
    return TaskWalk(entry, where, key, parent_call)


#: the primitives whose holder an ``async with`` block names (a condition holds its lock)
_HELD_WITH = (asyncio.Lock, asyncio.Semaphore, asyncio.Condition)


def holders(tasks: Iterable[asyncio.Task[Any]]) -> dict[str, list[tuple[str, schema.AwaitFrame]]]:
    """Who holds each asyncio lock, semaphore and condition taken with ``async with`` by a
    task now suspended inside the block, by the words a wait on it ends with when asyncflow
    does not instrument it (``Lock at 0x7f…``): [(the task's name, its frame in the block)].

    asyncio does not record a plain lock's holder; the block's bound ``__aexit__``, on the
    suspended frame's stack, names it (read from the coroutine's references, never its
    locals). A lock taken by ``await lock.acquire()`` is not found. Read it as
    :func:`walk_loop` is read: on the loop's thread, or a blocked loop's from outside.
    """
    found: dict[str, list[tuple[str, schema.AwaitFrame]]] = {}
    for task in tasks:
        if task.done():
            continue
        frames, owners, _, _ = _chain(task)
        for held, frame in _holding(frames, owners):
            words = f"{type(held).__qualname__} at 0x{id(held):x}"
            found.setdefault(words, []).append((task.get_name(), _frame_entry(frame)))
    return found


def _holding(frames: list[FrameType], owners: list[Any]) -> list[tuple[Any, FrameType]]:
    """The locks, semaphores and conditions a suspended chain holds in open ``async with``
    blocks (each block's bound ``__aexit__`` on its frame's stack), with the frame."""
    # (the block's __aexit__ is on the stack while its __aenter__ waits too: a task that
    # waits to take a primitive does not hold it)
    taking = {
        id(_self_of(owner, frame.f_code))
        for frame, owner in zip(frames, owners, strict=True)
        if frame.f_code.co_name in ("acquire", "__aenter__")
    }
    out = []
    for frame, owner in zip(frames, owners, strict=True):
        for obj in _all_held(owner):
            # (_HELD_WITH's classes are Python's: their bound __aexit__ is a method object, and
            # looking at its type first spares two getattr of all else a frame holds)
            if type(obj) is not MethodType:
                continue
            held = obj.__self__
            if id(held) in taking:
                continue
            if obj.__name__ == "__aexit__" and isinstance(held, _HELD_WITH):
                out.append((held, frame))
    return out


def _untracked_locks(frames: list[FrameType], owners: list[Any]) -> list[str]:
    """The plain locks asyncflow does not track (made before an attach) that a waiting chain
    holds, by the words a wait on one ends with: the wait-for graph's holders of them."""
    return [
        f"{type(held).__qualname__} at 0x{id(held):x}"
        for held, _ in _holding(frames, owners)
        if isinstance(held, asyncio.Lock) and resource_of(held) is None
    ]


def _created_at(coro: Any) -> schema.AwaitFrame | None:
    """Where a task was made, from what its factory kept on its call (the creating frame's
    code and instruction offset): the line is computed here, on the cold side, not at each
    create_task. None when it was not seen made."""
    if type(coro) is not InstrumentedCoroutine:
        return None
    code: CodeType | None = getattr(coro._r, "created_code", None)
    if code is None:
        return None
    lasti: int = coro._r.created_lasti
    line = code.co_firstlineno
    for start, end, at in code.co_lines():
        if start <= lasti < end:
            line = at if at is not None else line
            break
    return _await_frame(code, line)


def _all_tasks(loop: asyncio.AbstractEventLoop) -> list[asyncio.Task[Any]]:
    for _ in range(100):
        try:
            return list(asyncio.all_tasks(loop))
        except RuntimeError:  # the task set changed size under another thread: read it again
            continue
    return []


def loop_tasks(record: LoopRecord) -> list[asyncio.Task[Any]]:
    """The live tasks of one loop, listed from any thread (no frame is read)."""
    loop = record.loop()
    if loop is None or loop.is_closed():
        return []
    return _all_tasks(loop)


def walk_loop(record: LoopRecord, tasks: list[asyncio.Task[Any]] | None = None) -> list[TaskWalk]:
    """Every live task of one loop (or those of ``tasks`` still live), read now on whatever
    thread calls this."""
    loop = record.loop()
    if loop is None or loop.is_closed():
        return []
    # The task in the middle of a step now: the one that asked, or the one a blocked loop runs.
    running = _running_task(loop) if loop.is_running() else None
    now_ns = clock.now_ns()
    loop_time = loop.time()
    walks = []
    for task in _all_tasks(loop) if tasks is None else tasks:
        if tasks is not None and task.done():
            continue
        try:
            walks.append(walk_task(task, record.id, running, now_ns, loop_time))
        except Exception as err:  # a task we cannot read is left out, never a failed document
            _session.internal_error("reading a task's await chain", err)
    return walks


def tasks_by_loop() -> dict[Any, Any] | None:
    """The dict in which asyncio's own tasks note the task each loop runs now, if they keep one.

    On 3.11 to 3.13 ``asyncio.tasks._current_tasks`` is the C accelerator's dict
    (``_asyncio._current_tasks``), written by every step of a task and readable from any
    thread. 3.14 keeps the running task on each thread's state instead: ``_asyncio`` has no
    ``_current_tasks``, and ``asyncio.tasks._current_tasks`` is a dict only pure-Python tasks
    write, empty under the C ones; ``asyncio.current_task(loop)`` then finds a loop's task by
    searching the threads' states, from any thread. Returns None when that is the way.
    """
    tasks = getattr(asyncio.tasks, "_current_tasks", None)
    if not isinstance(tasks, dict):
        return None
    accelerator = sys.modules.get("_asyncio")
    if accelerator is None:  # pure-Python asyncio: its own _enter_task writes this dict
        return tasks
    return tasks if getattr(accelerator, "_current_tasks", None) is tasks else None


def _running_task(loop: asyncio.AbstractEventLoop) -> asyncio.Task[Any] | None:
    current = tasks_by_loop()
    if current is not None:
        task = current.get(loop)
        return task if isinstance(task, asyncio.Task) else None
    try:
        return asyncio.current_task(loop)
    except RuntimeError:
        return None


#: The most one slice of a walk on the program's loop takes: the loop runs its other callbacks
#: between slices, so that reading 20,000 tasks never stalls it for longer than about this.
SLICE_NS = 2_000_000
#: Tasks one slice reads at the most (whatever the clock says).
SLICE_TASKS = 256


def walk_on_loop(
    record: LoopRecord,
    timeout: float,
    responsive: bool,
    outside: bool = True,
    slice_tasks: int = SLICE_TASKS,
    tasks: list[asyncio.Task[Any]] | None = None,
) -> tuple[list[TaskWalk], bool]:
    """Walk the loop's tasks (or those of ``tasks`` still live) on its own thread, in slices
    of at most ``slice_tasks`` tasks and about ``SLICE_NS`` each (the loop runs its other
    callbacks between them), when it answers within ``timeout`` and keeps making progress;
    otherwise (blocked, stopped, or the caller is that thread) read them from here, unless
    ``outside`` is False: then a running loop that does not answer is left out (no walks).

    Returns the walks and whether they were read on the loop's thread (consistent).
    """
    walks, consistent, _ = read_on_loop(record, timeout, responsive, outside, slice_tasks, tasks)
    return cast(list[TaskWalk], walks), consistent


def read_on_loop(
    record: LoopRecord,
    timeout: float,
    responsive: bool,
    outside: bool = True,
    slice_tasks: int = SLICE_TASKS,
    tasks: list[asyncio.Task[Any]] | None = None,
    keep: Callable[[TaskWalk], Any] | None = None,
    deadline_ns: int | None = None,
) -> tuple[list[Any], bool, int]:
    """:func:`walk_on_loop`, and the time the walk took from the program: its slices on the
    loop, or this thread's CPU when it read them from here (holding the GIL). With ``keep``,
    what it makes of each walk is kept instead, as soon as the walk is made: a reading of
    thousands of tasks then holds no object per task that outlives its slice. With
    ``deadline_ns`` (the clock's), the slices stop walking when it has passed: the tasks
    walked by then are the reading."""
    loop = record.loop()
    if loop is None or loop.is_closed():
        return [], True, 0
    began = time.thread_time_ns()
    kept = keep or _itself
    if record.thread == threading.get_ident() or not loop.is_running():
        # we are the loop's thread, or it is parked between runs: nothing else changes them
        walks = [kept(w) for w in walk_loop(record, tasks)]
        return walks, True, time.thread_time_ns() - began
    if not responsive:
        walks = [kept(w) for w in walk_loop(record, tasks)] if outside else []
        return walks, False, time.thread_time_ns() - began
    reading = SlicedWalk(record, loop, slice_tasks, tasks, keep, deadline_ns)
    try:
        loop.call_soon_threadsafe(reading.step)
        return reading.result(timeout), True, reading.spent_ns
    except (concurrent.futures.TimeoutError, RuntimeError):
        reading.done.cancel()
        began = time.thread_time_ns()
        walks = [kept(w) for w in walk_loop(record, tasks)] if outside else []
        return walks, False, reading.spent_ns + time.thread_time_ns() - began


def _itself(walk: TaskWalk) -> TaskWalk:
    return walk


class SlicedWalk:
    """One walk of a loop's tasks on that loop, a slice per callback (:meth:`step`, which the
    loop is asked to run): the task list, unless given, is read in the first, each slice walks
    the next tasks, and a task that ended meanwhile is left out. :meth:`result` waits while
    slices keep coming; ``done`` holds the walks once the last slice ran."""

    def __init__(
        self,
        record: LoopRecord,
        loop: asyncio.AbstractEventLoop,
        size: int = SLICE_TASKS,
        tasks: list[asyncio.Task[Any]] | None = None,
        keep: Callable[[TaskWalk], Any] | None = None,
        deadline_ns: int | None = None,
    ) -> None:
        self.record = record
        #: when (the clock's) the slices stop walking, whatever is left: None, never
        self.deadline_ns = deadline_ns
        self.loop = loop
        self.size = max(1, size)
        self.done: concurrent.futures.Future[list[Any]] = concurrent.futures.Future()
        #: the tasks to walk (None: the loop's, listed in the first slice)
        self.tasks = tasks
        #: what is kept of each walk (the walk itself by default)
        self.keep = keep or _itself
        self.walks: list[Any] = []
        self.index = 0
        #: the time the tasks are read at (their ages count to it, whatever their slice)
        self.now_ns = clock.now_ns()
        #: slices run (each one callback of the loop), and the loop's time they took in all
        self.slices = 0
        self.spent_ns = 0
        self._progress = threading.Event()

    def step(self) -> None:
        """One slice, on the loop's thread."""
        if self.done.done():  # the reader gave up (or a slice failed): no more slices
            return
        try:
            began = clock.now_ns()
            if self.tasks is None:
                self.tasks = _all_tasks(self.loop)
            tasks, end = self.tasks, min(len(self.tasks), self.index + self.size)
            now_ns, loop_time, record_id = self.now_ns, self.loop.time(), self.record.id
            keep = self.keep
            while self.index < end:
                task = tasks[self.index]
                self.index += 1
                if task.done():
                    continue
                try:  # no task runs now: this callback is what the loop runs
                    self.walks.append(keep(walk_task(task, record_id, None, now_ns, loop_time)))
                except Exception as err:  # a task we cannot read is left out
                    _session.internal_error("reading a task's await chain", err)
                now = clock.now_ns()
                if now - began >= SLICE_NS:
                    break
                if self.deadline_ns is not None and now >= self.deadline_ns:
                    self.index = len(tasks)  # its time is up: what was walked is the reading
                    break
            self.slices += 1
            self.spent_ns += clock.now_ns() - began
            if self.index < len(tasks):
                self.loop.call_soon(self.step)  # the loop's other callbacks run first
            elif self.done.set_running_or_notify_cancel():
                self.tasks = None
                self.done.set_result(self.walks)
        except BaseException as exc:
            if self.done.set_running_or_notify_cancel():
                self.done.set_exception(exc)
        finally:
            self._progress.set()

    def result(self, timeout: float) -> list[Any]:
        """The walks, once every slice ran; ``TimeoutError`` when ``timeout`` passes with no
        slice run (a loop busy elsewhere: it does not answer)."""
        while True:
            try:
                return self.done.result(timeout)
            except concurrent.futures.TimeoutError:
                if not self._progress.is_set():
                    raise
                self._progress.clear()  # slices keep coming: wait for the next ones


def summarise(walks: Iterable[TaskWalk]) -> list[schema.WaitSummary]:
    """Waiting tasks counted by future, by the program's line they wait at, and by what they
    wait on: "50 calls of ``worker`` wait at app.py:5 on lock app.py:19", most first."""
    counts: Counter[tuple[Any, ...]] = Counter()
    samples: dict[tuple[Any, ...], TaskWalk] = {}
    for walk in walks:
        entry = walk.entry
        if entry.state != "waiting":
            continue
        where = walk.where
        key = (
            entry.future_id,
            entry.future_label or entry.coroutine,
            (where.file, where.line) if where is not None else None,
            walk.wait_key,
        )
        counts[key] += 1
        samples.setdefault(key, walk)
    out = []
    for key, count in counts.most_common():
        walk = samples[key]
        out.append(
            schema.WaitSummary(
                future_id=walk.entry.future_id,
                label=walk.entry.future_label or walk.entry.coroutine,
                where=walk.where,
                waits_on=walk.entry.waits_on,
                tasks=count,
            )
        )
    return out
