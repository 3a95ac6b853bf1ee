"""Transparency: every scenario observes the same things with and without instrumentation.

Each scenario takes ``track`` (identity, or ``asyncflow.future``) and returns what it observed:
results, exceptions with the user frames of their tracebacks, cancellation counts, context
variables, task identity and names, ordering. It runs three ways: plain, with every coroutine
decorated, and in whole-program mode (``instrument_tasks``), and the observations must be equal.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import sys
import traceback
import warnings
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Generator
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import pytest

import asyncflow

_F = TypeVar("_F", bound=Callable[..., Coroutine[Any, Any, Any]])


class Track(Protocol):
    """Identity, or asyncflow.future: applied to every coroutine function of a scenario."""

    def __call__(self, fn: _F, /) -> _F: ...


Scenario = Callable[[Track], Awaitable[list[Any]]]

_PACKAGE = str(Path(asyncflow.__file__).parent)
SCENARIOS: list[Scenario] = []


def scenario(fn: Scenario) -> Scenario:
    SCENARIOS.append(fn)
    return fn


def user_frames(exc: BaseException) -> list[str]:
    """The traceback's frames outside asyncflow (its wrappers add frames of their own)."""
    return [f.name for f in traceback.extract_tb(exc.__traceback__) if _PACKAGE not in f.filename]


def described(exc: BaseException) -> tuple[str, str, list[str]]:
    return (type(exc).__name__, str(exc), user_frames(exc))


@scenario
async def returns_and_raises(track: Track) -> list[Any]:
    @track
    async def inner(x: int) -> int:
        await asyncio.sleep(0)
        if x:
            raise KeyError(x)
        return x + 40

    @track
    async def outer(x: int) -> int:
        return await inner(x) + 2

    seen: list[Any] = [await outer(0)]
    try:
        await outer(5)
    except KeyError as exc:
        seen.append(described(exc))
    return seen


@scenario
async def cancel_before_first_poll(track: Track) -> list[Any]:
    started: list[bool] = []

    @track
    async def never() -> None:
        started.append(True)

    task = asyncio.create_task(never())
    task.cancel("early")
    try:
        await task
    except asyncio.CancelledError as exc:
        return [started, task.cancelled(), exc.args]
    return ["not cancelled"]


@scenario
async def cancel_while_suspended_twice_with_message(track: Track) -> list[Any]:
    cleanup: list[str] = []

    @track
    async def sleeper() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            cleanup.append("finally ran")

    task = asyncio.create_task(sleeper())
    await asyncio.sleep(0)
    first = task.cancel("first")
    second = task.cancel("second")
    cancelling = task.cancelling()
    try:
        await task
    except asyncio.CancelledError as exc:
        return [first, second, cancelling, exc.args, cleanup, task.cancelled()]
    return ["not cancelled"]


@scenario
async def catches_cancellation_and_continues(track: Track) -> list[Any]:
    @track
    async def stubborn() -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            me = asyncio.current_task()
            assert me is not None
            left = me.uncancel()
            await asyncio.sleep(0)
            return f"survived, {left} left"
        return "slept"

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    task.cancel()
    result = await task
    return [result, task.cancelled(), task.cancelling()]


@scenario
async def timeout_and_wait_for(track: Track) -> list[Any]:
    @track
    async def slow() -> str:
        await asyncio.sleep(3600)
        return "done"

    @track
    async def quick() -> str:
        await asyncio.sleep(0)
        return "quick"

    seen: list[Any] = []
    try:
        async with asyncio.timeout(0):
            await slow()
    except TimeoutError as exc:
        seen.append(("timeout", type(exc).__name__))
    me = asyncio.current_task()
    assert me is not None
    seen.append(me.cancelling())
    try:
        await asyncio.wait_for(slow(), timeout=0)
    except TimeoutError:
        seen.append("wait_for timed out")
    seen.append(await asyncio.wait_for(quick(), timeout=10))
    seen.append(me.cancelling())
    return seen


@scenario
async def task_group_with_failing_children(track: Track) -> list[Any]:
    order: list[str] = []

    @track
    async def child(i: int) -> None:
        order.append(f"start {i}")
        await asyncio.sleep(0)
        if i == 1:
            raise ValueError("child 1 failed")
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            order.append(f"cancelled {i}")
            raise

    try:
        async with asyncio.TaskGroup() as tg:
            for i in range(3):
                tg.create_task(child(i), name=f"child-{i}")
    except* ValueError as group:
        order.append(repr(group.exceptions))
    # TaskGroup cancels its children in the order of a set of tasks: by address, not by creation
    cancelled = sorted(o for o in order if o.startswith("cancelled"))
    return [[o for o in order if not o.startswith("cancelled")], cancelled]


@scenario
async def context_variables_and_current_task(track: Track) -> list[Any]:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    @track
    async def reader() -> tuple[str, str | None]:
        seen = var.get()
        var.set("set by reader")
        me = asyncio.current_task()
        return seen, me.get_name() if me else None

    var.set("outer")
    direct = await reader()
    after_direct = var.get()  # same task: the reader's set is visible
    var.set("outer again")
    task = asyncio.create_task(reader(), name="reader-task")
    in_task = await task
    return [direct, after_direct, in_task, var.get(), asyncio.current_task() is not task]


@scenario
async def generator_awaitables_and_plain_futures(track: Track) -> list[Any]:
    class Legacy:
        def __await__(self) -> Generator[Any, None, str]:
            yield from asyncio.sleep(0).__await__()
            return "legacy"

    @track
    async def waits() -> list[Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        loop.call_soon(fut.set_result, 42)
        failing: asyncio.Future[int] = loop.create_future()
        loop.call_soon(failing.set_exception, OSError("io"))
        out: list[Any] = [await fut, await Legacy()]
        try:
            await failing
        except OSError as exc:
            out.append(str(exc))
        return out

    return [await waits()]


@scenario
async def ordering_across_tasks(track: Track) -> list[Any]:
    order: list[tuple[int, int]] = []

    @track
    async def worker(i: int) -> None:
        for step in range(3):
            order.append((i, step))
            await asyncio.sleep(0)

    await asyncio.gather(*(worker(i) for i in range(4)))
    return order


@scenario
async def awaiting_twice_is_an_error(track: Track) -> list[Any]:
    @track
    async def once() -> int:
        return 1

    coro = once()
    seen: list[Any] = [await coro]
    try:
        await coro
    except RuntimeError as exc:
        seen.append(str(exc))
    return seen


@scenario
async def no_reference_cycles_on_the_error_path(track: Track) -> list[Any]:
    class Marker:
        pass

    refs: list[weakref.ref[Marker]] = []

    @track
    async def victim() -> None:
        marker = Marker()
        refs.append(weakref.ref(marker))
        await asyncio.sleep(3600)

    gc.collect()
    gc.disable()
    try:
        task = asyncio.create_task(victim())
        await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        del task
        return [refs[0]() is None]  # freed by reference counting alone
    finally:
        gc.enable()


def _identity(fn: _F, /) -> _F:
    return fn


async def _run(scenario: Scenario, mode: str) -> list[Any]:
    if mode == "plain":
        return await scenario(_identity)
    if mode == "decorated":
        return await scenario(cast(Track, asyncflow.future))
    with asyncflow.instrument_tasks():
        return await scenario(_identity)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
async def test_same_observations_with_and_without_instrumentation(scenario: Scenario) -> None:
    plain = await _run(scenario, "plain")
    with asyncflow.profile("transparency", format="none") as prof:
        decorated = await _run(scenario, "decorated")
        tasks = await _run(scenario, "tasks")
        snap = prof.snapshot()
    assert decorated == plain
    assert tasks == plain
    assert sum(f.call_count for f in snap.futures.futures) > 0  # it really was instrumented


async def test_never_awaited_warning_is_the_same() -> None:
    async def forgotten() -> None:
        pass

    def messages(track: Any) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            track(forgotten)()
            gc.collect()
        return [str(w.message).split("'")[0] for w in caught]

    plain = messages(_identity)
    with asyncflow.profile("warn", format="none"):
        tracked = messages(asyncflow.future)
    assert plain == tracked == ["coroutine "]


def test_task_introspection_still_works() -> None:
    async def main() -> list[Any]:
        with asyncflow.instrument_tasks():

            async def sleeper() -> None:
                await asyncio.sleep(3600)

            task = asyncio.create_task(sleeper(), name="introspected")
            await asyncio.sleep(0)
            stack = task.get_stack()
            text = repr(task)
            coro = task.get_coro()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return [
                [f.f_code.co_name for f in stack],
                "sleeper" in text,
                asyncio.iscoroutine(coro),
                getattr(coro, "__qualname__", None),
            ]

    with asyncflow.profile("introspect", format="none"):
        seen = asyncio.run(main())
    assert seen == [
        ["sleeper"],
        True,
        True,
        "test_task_introspection_still_works.<locals>.main.<locals>.sleeper",
    ]


@pytest.mark.skipif(sys.version_info < (3, 12), reason="eager tasks arrived in Python 3.12")
def test_instrument_tasks_chains_to_eager_task_factory() -> None:
    async def main() -> list[Any]:
        loop = asyncio.get_running_loop()
        loop.set_task_factory(asyncio.eager_task_factory)  # type: ignore[attr-defined]
        order: list[str] = []

        async def eager() -> str:
            order.append("ran eagerly")
            return "eager"

        with asyncflow.instrument_tasks():
            task = asyncio.create_task(eager())
            order.append("after create_task")
            result = await task
        assert loop.get_task_factory() is asyncio.eager_task_factory  # type: ignore[attr-defined]
        return [order, result]

    with asyncflow.profile("eager", format="none"):
        assert asyncio.run(main()) == [["ran eagerly", "after create_task"], "eager"]


def _user_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future[Any]:
    return asyncio.Task(coro, loop=loop, **kwargs)


def _task_names(tracked: bool, factory: Any) -> list[Any]:
    """The names of tasks made every way asyncio offers, read at once and from inside each, with
    each ``Task-N`` counted from the main task's number (the counter is process-wide); then
    where each was created, as debug mode records it."""

    async def own_name() -> str:
        await asyncio.sleep(0)
        me = asyncio.current_task()
        return me.get_name() if me else "?"

    async def main() -> list[Any]:
        loop = asyncio.get_running_loop()
        loop.set_task_factory(factory)
        with asyncflow.instrument_tasks() if tracked else contextlib.nullcontext():
            tasks = [
                asyncio.create_task(own_name()),
                loop.create_task(own_name()),
                asyncio.ensure_future(own_name()),
                asyncio.create_task(own_name(), name="None"),
                asyncio.create_task(own_name(), name="given"),
                loop.create_task(own_name(), name="given too", context=contextvars.Context()),
                asyncio.create_task(own_name(), context=contextvars.Context()),
            ]
            async with asyncio.TaskGroup() as group:
                tasks.append(group.create_task(own_name()))
            names = [t.get_name() for t in tasks] + list(await asyncio.gather(*tasks))
            # (debug mode) the creation traceback's last frame: asyncio leaves its own out
            created_at = [getattr(t, "_source_traceback", [None])[-1] for t in tasks]
        assert loop.create_task.__func__ is type(loop).create_task  # type: ignore[attr-defined]
        me = asyncio.current_task()
        first = int(me.get_name().removeprefix("Task-")) if me else 0
        return [
            f"Task-+{int(n.removeprefix('Task-')) - first}" if n.startswith("Task-") else n
            for n in names
        ] + [(frame.filename, frame.name) if frame else None for frame in created_at]

    if not tracked:
        return asyncio.run(main(), debug=True)
    with asyncflow.profile("names", format="none"):
        return asyncio.run(main(), debug=True)


_FACTORIES: list[Any] = [None, _user_factory]
if sys.version_info >= (3, 12):
    _FACTORIES.append(asyncio.eager_task_factory)  # type: ignore[attr-defined]


def _shifted(name: Any, by: int) -> Any:
    return f"Task-+{int(name.removeprefix('Task-+')) + by}"


@pytest.mark.parametrize("factory", _FACTORIES, ids=["none", "user's", "eager"][: len(_FACTORIES)])
def test_tasks_are_named_as_without_asyncflow(factory: Any) -> None:
    """3.13.0 to 3.13.2's ``create_task()`` names a task made by a task factory ``str(name)``,
    "None" when it was given no name (python/cpython#130033): with asyncflow's factory alone,
    every unnamed task of the program was "None". With a factory of the program's own, the
    program's names are what that Python gives it."""
    plain = _task_names(False, factory)
    tracked = _task_names(True, factory)
    if factory is None:
        assert plain[:6] == ["Task-+1", "Task-+2", "Task-+3", "None", "given", "given too"]
        assert plain[8:16] == plain[:8]  # each task reads the name it was given
    if factory is None and sys.version_info < (3, 13):
        # 3.11 and 3.12 name a factory's task after making it, and asyncflow leaves them that
        # way (see _names_unnamed_tasks_none): the task named by loop.create_task(name=) drew a
        # number first (asyncio.create_task names its tasks after making them anyway), so the two
        # unnamed tasks made after it read one more (docs/transparency.md says so).
        # The names given are the program's.
        plain = [_shifted(n, 1) if i < 16 and i % 8 >= 6 else n for i, n in enumerate(plain)]
        # Debug mode's creation traceback ends in asyncio's own create_task there, a frame
        # asyncio leaves out only when it makes the task itself (docs/transparency.md).
        made_by_asyncio = (asyncio.base_events.__file__, "create_task")
        assert all(t in (p, made_by_asyncio) for t, p in zip(tracked[16:], plain[16:], strict=True))
        tracked[16:] = plain[16:]
    assert tracked == plain


def test_asyncio_is_asked_whether_it_names_an_unnamed_factory_task_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stand-in is taken only where asyncio names a factory's unnamed task "None"
    (3.13.0 to 3.13.2); a create_task that names only what it was given (3.11, 3.12) or hands
    the factory the name (3.13.3, 3.14) is left alone."""
    from asyncflow.instrumentation import futures

    def create_task_as_in_3_13_0(self: Any, coro: Any, *, name: Any = None) -> Any:
        self._check_closed()
        task = self._task_factory(self, coro)
        task.set_name(name)
        return task

    asked = futures._names_unnamed_tasks_none()
    assert asked is ((3, 13, 0) <= sys.version_info < (3, 13, 3))
    monkeypatch.setattr(futures, "_NAMES_UNNAMED_TASKS_NONE", None)
    monkeypatch.setattr(asyncio.BaseEventLoop, "create_task", create_task_as_in_3_13_0)
    assert futures._names_unnamed_tasks_none() is True
    monkeypatch.setattr(futures, "_NAMES_UNNAMED_TASKS_NONE", None)
    monkeypatch.undo()
    assert futures._names_unnamed_tasks_none() is asked
