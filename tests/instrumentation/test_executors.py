"""Executors: jobs counted and timed per executor, per function and per submitting future."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import math
import pickle
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

import asyncflow
from asyncflow.clock import FakeClock
from asyncflow.instrumentation import executors
from asyncflow.instrumentation.executors import ExecutorRecord


@pytest.fixture
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="db") as p:
        yield p


def _record(executor: object) -> ExecutorRecord:
    (record,) = [r for r in executors.executor_registry() if r.executor() is executor]
    return record


def resize(n: int) -> int:
    return n * 2


async def test_a_saturated_pool_shows_queued_and_run_time(
    fake_clock: FakeClock, prof: asyncflow.Profiler, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    loop = asyncio.get_running_loop()
    started = [threading.Event(), threading.Event()]
    release = threading.Event()

    def slow(i: int) -> int:
        started[i].set()
        release.wait(5)
        return i

    with asyncflow.instrument_executors():
        busy = [loop.run_in_executor(pool, slow, i) for i in range(2)]
        for event in started:  # both workers are taken before anything else is submitted
            assert event.wait(5)
        waiting = [loop.run_in_executor(pool, resize, n) for n in (3, 4)]
        record = _record(pool)
        assert (record.stats.submitted, record.stats.running, record.stats.queued) == (4, 2, 2)
        fake_clock.advance(5_000)  # the two slow jobs run, the two others wait for a thread
        release.set()
        with anyio.fail_after(5):
            assert await asyncio.gather(*busy, *waiting) == [0, 1, 6, 8]
    st = record.stats
    assert (st.submitted, st.completed, st.raised, st.running, st.queued) == (4, 4, 0, 0, 0)
    assert (st.queued_ns, st.max_queued_ns, st.run_ns, st.max_run_ns) == (
        10_000,
        5_000,
        10_000,
        5_000,
    )
    assert record.workers() == (2, 2)
    assert record.label == "ThreadPoolExecutor db"
    functions = {name: f.jobs for name, f in st.by_function.items()}
    assert functions == {f"{__name__}.resize": 2, f"{__name__}.{slow.__qualname__}": 2}
    snap = prof.snapshot()
    assert snap.executors is not None
    (entry,) = [e for e in snap.executors.executors if e.label == "ThreadPoolExecutor db"]
    # 5,000 ns lies in a bucket whose value is 5,056: percentiles never pass the max
    assert entry.run_ns["p99"] == entry.max_run_ns == 5_000
    assert entry.queued_ns["p99"] == entry.max_queued_ns == 5_000


async def test_to_thread_counts_the_function_and_the_future_that_submitted_it(
    prof: asyncflow.Profiler,
) -> None:
    @asyncflow.future(name="handler")
    async def handler() -> int:
        return await asyncio.to_thread(resize, 21)

    with asyncflow.instrument_executors():
        assert await asyncio.create_task(handler()) == 42  # attributed to the task's call
    (record,) = [r for r in executors.executor_registry() if r.label.startswith("default")]
    st = record.stats
    assert (st.submitted, st.completed) == (1, 1)
    assert list(st.by_function) == [f"{__name__}.resize"]
    handler_id = next(f.id for f in prof.snapshot().futures.futures if f.label == "handler")
    assert list(st.by_future) == [handler_id]


async def test_jobs_raise_exactly_as_before_and_undo_restores(
    prof: asyncflow.Profiler, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    loop = asyncio.get_running_loop()

    def broken() -> None:
        raise LookupError("no such row")

    async def outcome() -> BaseException:
        try:
            await loop.run_in_executor(pool, broken)
        except LookupError as exc:
            return exc
        raise AssertionError("the job did not raise")

    plain = await outcome()
    handle = asyncflow.instrument_executors()
    assert asyncflow.instrument_executors().active is False  # once per loop
    tracked = await outcome()
    handle.undo()
    handle.undo()  # idempotent
    assert "run_in_executor" not in vars(loop)
    assert (type(tracked), tracked.args) == (type(plain), plain.args)
    assert _record(pool).stats.raised == 1


async def test_a_job_cancelled_before_a_thread_took_it_never_ran(
    prof: asyncflow.Profiler,
) -> None:
    loop = asyncio.get_running_loop()
    release = threading.Event()
    ran: list[int] = []
    with (
        concurrent.futures.ThreadPoolExecutor(max_workers=1) as one,
        asyncflow.instrument_executors(),
    ):
        first = loop.run_in_executor(one, release.wait, 5)
        second = loop.run_in_executor(one, ran.append, 1)
        second.cancel()
        await asyncio.sleep(0)  # asyncio passes the cancellation on to the pool's future
        release.set()
        with anyio.fail_after(5):
            await first
    st = _record(one).stats
    assert ran == []
    assert (st.submitted, st.completed, st.cancelled, st.queued) == (2, 1, 1, 0)


class _TakenAtOnce(concurrent.futures.Executor):
    """A pool whose worker takes each job the moment it is submitted (so that it can no longer
    be cancelled), and runs it when told."""

    def __init__(self) -> None:
        self.taken: list[tuple[concurrent.futures.Future[Any], Any, tuple[Any, ...]]] = []

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        assert future.set_running_or_notify_cancel()
        self.taken.append((future, fn, args))
        return future

    def run(self) -> None:
        for future, fn, args in self.taken:
            future.set_result(fn(*args))


async def test_a_job_cancelled_as_a_worker_takes_it_runs_and_is_counted_once(
    prof: asyncflow.Profiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """asyncio cancels its future, the pool's cannot be (a worker has it): the job runs. The
    loop saw it cancelled before it marked itself started, and counted it as never started."""
    loop = asyncio.get_running_loop()
    pool = _TakenAtOnce()
    # taken for a thread pool of this process (its jobs wrapped), as the stdlib's would be
    monkeypatch.setattr(executors, "_runs_jobs_here", lambda executor: True)
    with asyncflow.instrument_executors():
        job = loop.run_in_executor(pool, sum, [1, 2])
        job.cancel()
        await asyncio.sleep(0)  # the job's done callbacks run, before its worker starts it
        pool.run()
    assert job.cancelled()
    st = _record(pool).stats
    assert (st.submitted, st.started, st.completed, st.cancelled, st.queued) == (1, 1, 1, 0, 0)


async def test_a_gone_executor_is_folded_once_its_last_job_has_ended(
    prof: asyncflow.Profiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(executors._history, "kept", 0)  # every gone executor is folded at once
    loop = asyncio.get_running_loop()
    release = threading.Event()
    with asyncflow.instrument_executors():
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="brief")
        running = loop.run_in_executor(pool, release.wait, 5)
        queued = loop.run_in_executor(pool, resize, 2)
        pool.shutdown(wait=False)  # its worker runs what it was given, the pool goes
        del pool
        gc.collect()
        (record,) = [
            r for r in executors.executor_registry() if r.label == "ThreadPoolExecutor brief"
        ]
        assert not record.alive and not record.folded  # gone, but its jobs are not done
        release.set()
        with anyio.fail_after(5):
            assert list(await asyncio.gather(running, queued)) == [True, 4]
    prof.snapshot()  # the collector reaps what is gone
    (aggregate,) = [r for r in executors.executor_registry() if r.label == record.label]
    assert aggregate.folded == 1 and aggregate is not record
    st = aggregate.stats
    assert (st.submitted, st.started, st.completed, st.running, st.queued) == (2, 2, 2, 0, 0)
    assert {name: f.jobs for name, f in st.by_function.items()} == {
        "threading.Event.wait": 1,
        f"{__name__}.resize": 1,
    }


async def test_a_job_a_shut_down_pool_refuses_was_never_submitted(
    prof: asyncflow.Profiler,
) -> None:
    loop = asyncio.get_running_loop()
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="closed")
    pool.shutdown()
    with pytest.raises(RuntimeError) as plain:
        await loop.run_in_executor(pool, resize, 1)
    with asyncflow.instrument_executors(), pytest.raises(RuntimeError) as tracked:
        await loop.run_in_executor(pool, resize, 1)
    assert tracked.value.args == plain.value.args
    record = _record(pool)
    st = record.stats
    assert (st.submitted, st.queued, st.cancelled) == (0, 0, 0)
    del pool, plain, tracked  # (the tracebacks hold it)
    gc.collect()
    prof.snapshot()  # the collector reaps what is gone
    assert record.id not in executors._registry  # nothing left to wait for: it went at once


def test_misuse() -> None:
    with pytest.raises(RuntimeError, match="no running event loop"):
        asyncflow.instrument_executors()
    with pytest.raises(TypeError, match="needs an event loop"):
        asyncflow.instrument_executors(loop="main")  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()
    loop.close()
    with pytest.raises(RuntimeError, match="closed"):
        asyncflow.instrument_executors(loop)


async def test_anyio_worker_threads_wait_for_the_limiter(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    from anyio._backends._asyncio import AsyncIOBackend

    anyio_own = vars(AsyncIOBackend)["run_sync_in_worker_thread"]
    limiter = anyio.CapacityLimiter(1)
    submitted = threading.Event()

    def scan(n: int) -> int:
        submitted.wait(5)
        fake_clock.advance(1_000)
        return n

    async def one(n: int, results: list[int]) -> None:
        results.append(await anyio.to_thread.run_sync(scan, n, limiter=limiter))

    with asyncflow.instrument_executors():
        results: list[int] = []
        async with anyio.create_task_group() as group:
            for n in range(3):
                group.start_soon(one, n, results)
            await asyncio.sleep(0)
            submitted.set()
    assert sorted(results) == [0, 1, 2]
    record = _record(limiter)
    st = record.stats
    assert (st.submitted, st.completed, st.raised) == (3, 3, 0)
    assert st.run_ns == 3_000 and st.queued_ns == 3_000  # 0 + 1000 + 2000: one token
    assert record.workers() == (1, 0)
    assert list(st.by_function) == [f"{__name__}.{scan.__qualname__}"]
    assert vars(AsyncIOBackend)["run_sync_in_worker_thread"] is anyio_own  # undone


def test_anyio_is_never_imported_on_the_loop_and_hooked_once_the_program_loads_it() -> None:
    """instrument_executors() inside a running loop imports nothing of anyio (an import there
    blocks the program's loop: 100 ms and more on a loaded machine); anyio's worker threads are
    still followed once the program itself loads anyio, and given back after."""
    program = """if True:
        import asyncio, sys
        import asyncflow
        from asyncflow.instrumentation import _imports, executors

        async def main() -> None:
            before = set(sys.modules)
            with asyncflow.instrument_executors():
                assert not {m for m in set(sys.modules) - before if m.startswith("anyio")}
                import anyio.to_thread

                assert await anyio.to_thread.run_sync(sum, [1, 2]) == 3
            from anyio._backends._asyncio import AsyncIOBackend

            own = vars(AsyncIOBackend)["run_sync_in_worker_thread"]
            assert own.__func__.__module__ == "anyio._backends._asyncio"  # given back
            assert _imports._watch not in sys.meta_path

        with asyncflow.profile("anyio-late", format="none", port=None) as prof:
            asyncio.run(main())
            labels = [r.label for r in executors.executor_registry()]
        assert "anyio worker threads" in labels, labels
        print("ok")
    """
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr


def _dict_materialized(obj: object) -> bool:
    """Whether the object's instance dict exists as a dict (3.11, 3.12: the collector then
    sees it among the object's referents; before, it sees the inline values themselves)."""
    return any(type(r) is dict and "_ready" in r for r in gc.get_referents(obj))


@pytest.mark.skipif(
    sys.version_info >= (3, 13), reason="3.13's collector does not show the dict as a referent"
)
async def test_instrumenting_leaves_the_loops_attributes_inline(prof: asyncflow.Profiler) -> None:
    """Reading ``vars(loop)`` would turn the loop's inline attribute values into a dict, and on
    3.11 no method call on the loop in asyncio's Python code is specialized after that."""
    loop = asyncio.get_running_loop()
    before = _dict_materialized(loop)
    with asyncflow.instrument_executors() as handle:
        assert not asyncflow.instrument_executors().active  # the second finds the first
        assert await loop.run_in_executor(None, sum, [1, 2]) == 3
    assert not handle.active
    assert _dict_materialized(loop) == before
    assert not isinstance(loop.run_in_executor, executors._RunInExecutor)


# -- another library's pool: what it receives is never changed (issue 24, item 1) ---------------

_RELEASE = threading.Event()


def _held(n: int) -> int:
    """A job that pickles (by name) and waits until the test lets it end."""
    _RELEASE.wait(5)
    return n * 3


def _run_pickled(blob: bytes) -> Any:
    fn, args, kwargs = pickle.loads(blob)
    return fn(*args, **kwargs)


class _PicklingPool(concurrent.futures.Executor):
    """A pool of another library (as loky's, which joblib uses): each job is pickled, as for
    another process, and run from its pickle (here on a thread)."""

    def __init__(self) -> None:
        # named as a stdlib pool's set of threads: the record must not take it for one
        self._threads = concurrent.futures.ThreadPoolExecutor(1)

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        return self._threads.submit(_run_pickled, pickle.dumps((fn, args, kwargs)))

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._threads.shutdown(wait, cancel_futures=cancel_futures)


async def test_another_librarys_pool_gets_the_job_as_it_is_and_is_timed_from_outside(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    loop = asyncio.get_running_loop()
    with _PicklingPool() as pool:
        plain = await loop.run_in_executor(pool, math.factorial, 20)
        with asyncflow.instrument_executors():
            assert await loop.run_in_executor(pool, math.factorial, 20) == plain
            _RELEASE.clear()
            job = loop.run_in_executor(pool, _held, 7)
            record = _record(pool)
            assert (record.stats.submitted, record.stats.running) == (2, 1)
            fake_clock.advance(7_000)  # from submission to its end, seen from the loop
            _RELEASE.set()
            with anyio.fail_after(5):
                assert await job == 21
        assert record.workers() == (None, 0)
    st = record.stats
    assert (st.submitted, st.completed, st.raised, st.running, st.queued) == (2, 2, 0, 0, 0)
    assert (st.queued_ns, st.run_ns, st.max_run_ns) == (0, 7_000, 7_000)
    assert {name: f.jobs for name, f in st.by_function.items()} == {
        "math.factorial": 1,
        f"{__name__}._held": 1,
    }


class _LoggingThreads(concurrent.futures.ThreadPoolExecutor):
    """A thread pool whose own ``submit`` could do anything with the job: here it notes it."""

    def __init__(self) -> None:
        super().__init__(1)
        self.received: list[Any] = []

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        self.received.append(fn)
        return super().submit(fn, *args, **kwargs)


class _NamedThreads(concurrent.futures.ThreadPoolExecutor):
    """A thread pool that only names its threads: it submits as the stdlib's does."""

    def __init__(self) -> None:
        super().__init__(1, thread_name_prefix="named")


async def test_only_a_thread_pool_that_submits_as_the_stdlibs_has_its_jobs_wrapped(
    prof: asyncflow.Profiler,
) -> None:
    loop = asyncio.get_running_loop()
    seen: list[str] = []

    def where() -> str:
        seen.append(threading.current_thread().name)
        return "ran"

    with _LoggingThreads() as logging_pool, _NamedThreads() as named_pool:
        with asyncflow.instrument_executors():
            assert await loop.run_in_executor(logging_pool, resize, 2) == 4
            assert await loop.run_in_executor(named_pool, where) == "ran"
        assert logging_pool.received == [resize]  # the function itself, not a wrapper
        assert seen[0].startswith("named")
        assert executors._runs_jobs_here(named_pool)
        assert not executors._runs_jobs_here(logging_pool)
        assert not executors._runs_jobs_here(_PicklingPool())
        assert not executors._runs_jobs_here(concurrent.futures.ProcessPoolExecutor(1))
        assert _record(logging_pool).stats.completed == _record(named_pool).stats.completed == 1


# -- asyncio's own checks of run_in_executor's arguments (issue 24, item 22) --------------------


async def _a_coroutine_function() -> None:
    pass


@pytest.mark.filterwarnings("ignore:coroutine '_a_coroutine_function' was never awaited")
async def test_asyncio_refuses_a_coroutine_or_a_non_callable_at_the_call_as_before(
    prof: asyncflow.Profiler,
) -> None:
    loop = asyncio.get_running_loop()
    assert loop.get_debug()  # (the tests run asyncio in debug mode, where it checks them)

    def refusals() -> list[tuple[str, str]]:
        seen = []
        coro = _a_coroutine_function()
        for bad in (_a_coroutine_function, coro, None, 42):
            with pytest.raises(TypeError) as refused:
                loop.run_in_executor(None, bad)  # type: ignore[arg-type]
            seen.append((str(refused.value), refused.traceback[-1].name))
        coro.close()
        return seen

    plain = refusals()
    assert plain[0] == ("coroutines cannot be used with run_in_executor()", "_check_callback")
    with asyncflow.instrument_executors():
        assert refusals() == plain
    records = [r for r in executors.executor_registry() if r.label.startswith("default")]
    assert all(r.stats.submitted == 0 for r in records)
