"""Recording calls: exact figures on a fake clock, states, outcomes, logs and misuse errors."""

from __future__ import annotations

import asyncio
import functools
import gc
import inspect
import pickle
import threading
import types
import warnings
from collections.abc import Generator
from typing import Any

import pytest

import asyncflow
from asyncflow.clock import FakeClock
from asyncflow.instrumentation import _session
from asyncflow.schema import Snapshot
from tests.support.snapshots import future_calls, future_entry

_future, _calls = future_entry, future_calls


async def test_exact_poll_busy_and_idle_figures(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    go = asyncio.Event()

    @asyncflow.future(name="work", log_result=True)
    async def work() -> int:
        fake_clock.advance(100)
        await go.wait()
        fake_clock.advance(250)
        return 7

    task = asyncio.create_task(work())
    await asyncio.sleep(0)
    fake_clock.advance(1_000)  # suspended: idle time
    go.set()
    assert await task == 7

    snap = prof.snapshot()
    entry = _future(snap, "work")
    assert (entry.call_count, entry.total_polls) == (1, 2)
    assert (entry.busy_ns, entry.idle_ns, entry.max_poll_duration_ns) == (350, 1_000, 250)
    assert entry.calls.ready == 1 and entry.outcomes.returned == 1
    # percentiles are histogram buckets: within 1/64 of the truth (durations above are exact)
    assert abs(entry.poll_duration_ns["p50"] - 100) <= 100 / 64
    assert abs(entry.call_duration_ns["p99"] - 1_350) <= 1_350 / 64
    (call,) = _calls(snap, "work")
    assert call.state == "ready" and call.outcome == "returned" and call.result == "7"
    assert (call.poll_count, call.total_poll_duration_ns, call.last_poll_duration_ns) == (
        2,
        350,
        250,
    )
    assert (call.busy_ns, call.idle_ns, call.max_poll_duration_ns) == (350, 1_000, 250)
    assert call.finished_ns is not None and call.first_poll_ns is not None
    assert call.finished_ns - call.created_ns == 1_350
    assert call.task == task.get_name()


async def test_pending_running_and_suspended_are_visible_live(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    release = asyncio.Event()
    seen: list[Snapshot] = []

    @asyncflow.future
    async def observed() -> None:
        fake_clock.advance(40)
        seen.append(prof.snapshot())  # taken while this very poll is running
        await release.wait()

    pending = observed()
    task = asyncio.create_task(observed())
    await asyncio.sleep(0)
    running_view = seen[0]
    label = "test_pending_running_and_suspended_are_visible_live.<locals>.observed"
    states = sorted(c.state for c in _calls(running_view, label))
    assert states == ["pending", "running"]
    running = next(c for c in _calls(running_view, label) if c.state == "running")
    assert running.current_elapsed_ns == 40
    entry = _future(prof.snapshot(), label)
    assert (entry.calls.pending, entry.calls.running, entry.calls.suspended) == (1, 0, 1)
    release.set()
    await task
    pending.close()
    entry = _future(prof.snapshot(), label)
    assert (entry.calls.ready, entry.calls.cancelled, entry.outcomes.closed) == (1, 1, 1)


async def test_outcomes_raised_cancelled_closed_and_never_awaited(
    prof: asyncflow.Profiler,
) -> None:
    @asyncflow.future(name="f")
    async def f(mode: str) -> None:
        await asyncio.sleep(0)
        if mode == "raise":
            raise LookupError("no such key")
        if mode == "hang":
            await asyncio.Event().wait()

    with pytest.raises(LookupError):
        await f("raise")
    task = asyncio.create_task(f("hang"))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    started = f("hang")
    started.send(None)  # one poll by hand, then close it
    started.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "never awaited", as without asyncflow
        forgotten = f("x")
        del forgotten
        gc.collect()

    snap = prof.snapshot()
    o = _future(snap, "f").outcomes
    assert (o.returned, o.raised, o.cancelled, o.closed, o.never_awaited) == (0, 1, 1, 1, 1)
    raised = next(c for c in _calls(snap, "f") if c.outcome == "raised")
    assert raised.exception is not None
    assert (raised.exception.type, raised.exception.message) == ("LookupError", "no such key")
    assert raised.result is None  # results are only kept with log_result=True


async def test_result_repr_is_truncated_and_a_failing_repr_is_survived(
    prof: asyncflow.Profiler,
) -> None:
    class Nasty:
        def __repr__(self) -> str:
            raise RuntimeError("repr exploded")

    @asyncflow.future(name="long", log_result=True)
    async def long() -> str:
        return "x" * 10_000

    @asyncflow.future(name="nasty", log_result=True)
    async def nasty() -> Nasty:
        return Nasty()

    assert await long() == "x" * 10_000
    assert isinstance(await nasty(), Nasty)
    snap = prof.snapshot()
    (long_call,) = _calls(snap, "long")
    assert long_call.result is not None and len(long_call.result) == 200
    (nasty_call,) = _calls(snap, "nasty")
    assert nasty_call.result == "<repr() failed: RuntimeError>"


async def test_recent_logs_keep_unfinished_calls_and_the_last_n_finished() -> None:
    @asyncflow.future(name="n")
    async def n(i: int) -> int:
        return i

    hold = asyncio.Event()

    @asyncflow.future(name="held")
    async def held() -> None:
        await hold.wait()

    with asyncflow.profile("logs", format="none", recent_logs=3) as p:
        for i in range(10):
            await n(i)
        waiting = [asyncio.create_task(held()) for _ in range(5)]
        await asyncio.sleep(0)
        snap = p.snapshot()
        hold.set()
        await asyncio.gather(*waiting)
    assert [c.call_id for c in _calls(snap, "n")] == sorted(
        (c.call_id for c in _calls(snap, "n")), reverse=True
    )
    assert len(_calls(snap, "n")) == 3  # finished: only the last three, newest first
    assert len(_calls(snap, "held")) == 5  # unfinished: always all of them


async def test_no_profiler_means_no_wrapping_and_stop_leaves_calls_working() -> None:
    @asyncflow.future
    async def f() -> int:
        await asyncio.sleep(0)
        return 1

    coro = f()
    assert type(coro).__name__ == "coroutine"  # not running: the plain coroutine, no cost
    coro.close()
    with asyncflow.profile("p", format="none"):
        tracked = f()
        assert type(tracked).__name__ == "InstrumentedCoroutine"
    assert await tracked == 1  # stopping the profiler leaves instrumented objects working


def test_decorated_functions_still_look_like_coroutine_functions() -> None:
    class Service:
        @asyncflow.future
        async def method(self, x: int) -> int:
            return x

    @asyncflow.future
    async def plain(a: int, b: str = "b") -> str:
        """Doc."""
        return b * a

    for fn in (plain, Service.method, Service().method):
        assert inspect.iscoroutinefunction(fn)
        assert asyncio.iscoroutinefunction(fn)
    assert plain.__name__ == "plain" and plain.__doc__ == "Doc."
    assert inspect.signature(plain) == inspect.signature(inspect.unwrap(plain))
    assert list(inspect.signature(Service().method).parameters) == ["x"]
    assert asyncio.run(Service().method(3)) == 3
    assert pickle.loads(pickle.dumps(_module_level)) is _module_level


@asyncflow.future
async def _module_level() -> None:
    pass


def test_misuse_raises_type_errors_that_name_the_culprit() -> None:
    def not_async() -> None:
        pass

    with pytest.raises(TypeError, match="not_async"):
        asyncflow.future(not_async)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="needs a coroutine object, got int"):
        asyncflow.instrument(42)  # type: ignore[arg-type, unused-coroutine]
    with pytest.raises(TypeError, match="name"):
        asyncflow.future(name=3)  # type: ignore[call-overload]
    with pytest.raises(RuntimeError, match="no running event loop"):
        asyncflow.instrument_tasks()
    with pytest.raises(TypeError, match="needs an event loop"):
        asyncflow.instrument_tasks(loop="main")  # type: ignore[arg-type]


def test_disable_returns_the_original_function(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCFLOW_DISABLE", "1")

    async def original() -> None:
        pass

    assert asyncflow.future(original) is original
    assert asyncflow.future(name="x")(original) is original


async def test_a_decorator_groups_by_definition(prof: asyncflow.Profiler) -> None:
    """A closure decorated each time its factory runs is one future; the same code under
    another name, or with its results logged, is another; so is a tracked wrapper of a tracked
    function, though its location is the wrapped one's."""

    def make(name: str = "handle", log_result: bool = False) -> Any:
        @asyncflow.future(name=name, log_result=log_result)
        async def handle(i: int) -> int:
            await asyncio.sleep(0)
            return i

        return handle

    @asyncflow.future(name="lookup")
    async def lookup() -> int:
        return 1

    @asyncflow.future(name="lookup")
    @functools.wraps(lookup)
    async def lookup_twice() -> int:
        return await lookup() + await lookup()

    assert [await make()(i) for i in range(3)] == [0, 1, 2]
    assert await make("handle_other")(3) == 3
    assert await make(log_result=True)(4) == 4
    assert await lookup_twice() == 2
    snap = prof.snapshot()
    handles = [f for f in snap.futures.futures if f.label == "handle" and f.call_count]
    assert sorted((f.call_count, f.total_polls) for f in handles) == [(1, 2), (3, 6)]
    assert _future(snap, "handle_other").call_count == 1
    logged = [e for e in snap.futures.futures if e.label == "lookup" and e.call_count]
    assert sorted(e.call_count for e in logged) == [1, 2]  # the wrapper's, the wrapped one's
    assert len({(e.location.file, e.location.line) for e in logged}) == 1


class _Client:
    @asyncflow.future
    async def fetch(self, x: int) -> int:
        await asyncio.sleep(0)
        return x


async def test_a_tracked_method_bound_and_tracked_again_is_a_future_of_its_own(
    prof: asyncflow.Profiler,
) -> None:
    client = _Client()
    again = asyncflow.future(client.fetch)  # a wrapper of the bound, tracked method
    for i in range(5):
        assert await again(i) == i
    snap = prof.snapshot()
    fetches = [e for e in snap.futures.futures if e.label.endswith("_Client.fetch")]
    assert sorted(e.call_count for e in fetches) == [5, 5]  # not one future with every call twice


async def test_instrument_one_coroutine_groups_by_code_and_name(prof: asyncflow.Profiler) -> None:
    async def job(i: int) -> int:
        await asyncio.sleep(0)
        return i

    results = await asyncio.gather(*(asyncflow.instrument(job(i), name="jobs") for i in range(4)))
    assert results == [0, 1, 2, 3]
    entry = _future(prof.snapshot(), "jobs")
    assert (entry.call_count, entry.total_polls, entry.tracked_by) == (4, 8, "instrument")
    wrapped = asyncflow.instrument(job(0), name="jobs")
    assert asyncflow.instrument(wrapped) is wrapped  # a tracked call is not wrapped twice
    assert await wrapped == 0
    assert _future(prof.snapshot(), "jobs").call_count == 5


async def test_instrument_tasks_tracks_every_task_and_undo_restores(
    prof: asyncflow.Profiler,
) -> None:
    loop = asyncio.get_running_loop()
    created: list[Any] = []

    def user_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
        created.append(coro)
        return asyncio.Task(coro, loop=loop, **kw)

    loop.set_task_factory(user_factory)
    try:

        async def step(n: int) -> int:
            for _ in range(n):
                await asyncio.sleep(0)
            return n

        with asyncflow.instrument_tasks() as handle:
            assert handle.active
            again = asyncflow.instrument_tasks()  # second install: harmless, counts nothing twice
            assert not again.active
            assert (
                await asyncio.gather(*(asyncio.create_task(step(3)) for _ in range(5))) == [3] * 5
            )
            named = asyncio.create_task(step(1), name="named-task")
            await named
        assert loop.get_task_factory() is user_factory
        assert len(created) == 6  # the user's factory saw every task, wrapped
        await asyncio.create_task(step(1))  # after undo: not tracked
    finally:
        loop.set_task_factory(None)
    snap = prof.snapshot()
    entry = _future(snap, "test_instrument_tasks_tracks_every_task_and_undo_restores.<locals>.step")
    assert (entry.call_count, entry.total_polls, entry.tracked_by) == (6, 5 * 4 + 2, "task")
    assert "named-task" in {c.task for c in _calls(snap, entry.label)}


async def test_undo_under_a_factory_installed_later_passes_tasks_through(
    prof: asyncflow.Profiler,
) -> None:
    loop = asyncio.get_running_loop()
    handle = asyncflow.instrument_tasks()
    ours = loop.get_task_factory()
    assert ours is not None

    def on_top(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Future[Any]:
        return ours(loop, coro, **kw)

    loop.set_task_factory(on_top)
    handle.undo()
    handle.undo()  # idempotent
    assert loop.get_task_factory() is on_top  # not ours to remove

    async def untracked() -> None:
        pass

    await asyncio.create_task(untracked())
    loop.set_task_factory(None)
    assert not [f for f in prof.snapshot().futures.futures if "untracked" in f.label]


def test_calls_from_several_threads_and_loops_are_counted_exactly() -> None:
    @asyncflow.future(name="threaded")
    async def threaded() -> None:
        for _ in range(5):
            await asyncio.sleep(0)

    async def many() -> None:
        await asyncio.gather(*(threaded() for _ in range(200)))

    with asyncflow.profile("threads", format="none") as p:
        threads = [threading.Thread(target=asyncio.run, args=(many(),)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        entry = _future(p.snapshot(), "threaded")
    assert (entry.call_count, entry.total_polls, entry.calls.ready) == (800, 800 * 6, 800)


def test_internal_errors_are_counted_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    class Broken:
        def report(self, snapshot: Snapshot) -> None:
            raise OSError("disk full")

    before = _session.errors.count
    with asyncflow.profile("broken", reporter=Broken()):
        pass
    assert _session.errors.count == before + 1
    assert "disk full" in (_session.errors.last or "")


async def test_instrument_accepts_every_coroutine_asyncio_accepts(prof: asyncflow.Profiler) -> None:
    """Generator-based coroutines (``@types.coroutine``) and objects registered as Coroutine are
    coroutines to asyncio; a task factory that instruments every task must not break them."""

    @types.coroutine
    def legacy(x: int) -> Generator[Any, None, int]:
        yield  # one suspension, like asyncio.sleep(0)
        return x * 2

    class Awaitable:
        def __await__(self) -> Generator[Any, None, str]:
            yield
            return "awaited"

    loop = asyncio.get_running_loop()

    def instrumenting(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
        return asyncio.Task(asyncflow.instrument(coro), loop=loop, **kw)

    # asyncio takes generator-based coroutines as tasks up to 3.11, and refuses them after
    legacy_tasks = asyncio.iscoroutine(legacy(1))
    loop.set_task_factory(instrumenting)
    try:
        # ensure_future/gather wrap a plain awaitable in a coroutine (a generator one on 3.11)
        assert await asyncio.ensure_future(Awaitable()) == "awaited"
        assert list(await asyncio.gather(Awaitable(), Awaitable())) == ["awaited", "awaited"]
        if legacy_tasks:
            assert await asyncio.create_task(legacy(21)) == 42
            assert list(await asyncio.gather(legacy(1), Awaitable())) == [2, "awaited"]
    finally:
        loop.set_task_factory(None)
    # what asyncio refuses, instrument refuses too, with the same kind of error
    if not legacy_tasks:
        with pytest.raises(TypeError, match="needs a coroutine object"):
            asyncflow.instrument(legacy(1))  # type: ignore[unused-coroutine]
    tracked = {f.label: f for f in prof.snapshot().futures.futures}
    # every task was tracked: 1 + 2 wrapped awaitables, and 1 + 2 more tasks where legacy ones run
    assert sum(f.call_count for f in tracked.values()) == 3 + 3 * legacy_tasks
    if legacy_tasks:
        entry = tracked[legacy.__qualname__]
        assert (entry.call_count, entry.total_polls, entry.outcomes.returned) == (2, 4, 2)


def test_instrument_tasks_refuses_a_closed_loop() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    with pytest.raises(RuntimeError, match="closed"):
        asyncflow.instrument_tasks(loop)


def test_a_keyboard_interrupt_in_the_repr_of_a_logged_result_reaches_the_program() -> None:
    # Ctrl-C while asyncflow ran the program's repr() is the program's: it is raised once the
    # call is recorded (issue 24, item 10; it was once swallowed). Driven by a loop of its own:
    # a KeyboardInterrupt leaves the loop it is raised in, as it would leave the program's.
    class Hostile:
        def __repr__(self) -> str:
            raise KeyboardInterrupt

    @asyncflow.future(name="hostile", log_result=True)
    async def hostile() -> Hostile:
        return Hostile()

    loop = asyncio.new_event_loop()
    try:
        with asyncflow.profile("test", format="none") as prof:
            with pytest.raises(KeyboardInterrupt):
                loop.run_until_complete(hostile())
            (call,) = _calls(prof.snapshot(), "hostile")
    finally:
        loop.close()
    assert call.outcome == "returned" and call.result == "<repr() failed: KeyboardInterrupt>"


async def test_cancellation_requests_and_what_came_of_them(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    never = asyncio.Event()

    @asyncflow.future(name="obedient")
    async def obedient() -> None:
        await never.wait()

    @asyncflow.future(name="stubborn")
    async def stubborn() -> str:
        try:
            await never.wait()
        except asyncio.CancelledError:
            fake_clock.advance(700)  # tidies up, then carries on as if nothing happened
        return "done anyway"

    @asyncflow.future(name="timed")
    async def timed() -> str:
        try:
            async with asyncio.timeout(0):
                await never.wait()
        except TimeoutError:
            return "gave up"  # the timeout withdrew its own cancellation: not swallowed
        return "unreachable"

    @asyncflow.future(name="strict")
    async def strict() -> None:
        async with asyncio.timeout(0):
            await never.wait()

    calls = {
        name: asyncio.create_task(fn())
        for name, fn in (
            ("obedient", obedient),
            ("stubborn", stubborn),
            ("timed", timed),
            ("strict", strict),
        )
    }
    await asyncio.sleep(0)
    calls["obedient"].cancel()
    calls["stubborn"].cancel()
    results = await asyncio.gather(*calls.values(), return_exceptions=True)
    assert [type(r).__name__ if isinstance(r, BaseException) else r for r in results] == [
        "CancelledError",
        "done anyway",
        "gave up",
        "TimeoutError",
    ]
    snap = prof.snapshot()
    outcomes = {}
    for name in calls:
        (call,) = _calls(snap, name)
        entry = _future(snap, name)
        outcomes[name] = (call.cancel_requests, call.cancel_outcome, entry.cancellations.requested)
    assert outcomes == {
        "obedient": (1, "cancelled", 1),
        "stubborn": (1, "swallowed", 1),
        "timed": (1, "withdrawn", 1),
        "strict": (1, "raised", 1),
    }
    stubborn_entry = _future(snap, "stubborn")
    assert stubborn_entry.cancellations.swallowed == 1
    assert stubborn_entry.cancellations.max_to_end_ns == 700
    assert _future(snap, "strict").cancellations.raised == 1
